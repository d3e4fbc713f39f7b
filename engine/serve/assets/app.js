// The monitor's only script: live refresh of the parts of a page marked data-live, when the
// server's event stream (/api/changes) says that the store changed, and the runs filter.
"use strict";
(function () {
  var parts = Array.prototype.slice.call(document.querySelectorAll("[data-live]"));
  var filter = document.getElementById("filter");
  var stateFilter = document.getElementById("state-filter");
  var dot = document.getElementById("live-dot");

  function applyFilter() {
    if (!filter) return;
    var q = filter.value.trim().toLowerCase();
    var st = stateFilter ? stateFilter.value : "";
    document.querySelectorAll("tr[data-search]").forEach(function (tr) {
      var ok = (!q || tr.dataset.search.indexOf(q) >= 0) && (!st || tr.dataset.state === st);
      tr.hidden = !ok;
    });
  }
  if (filter) {
    filter.addEventListener("input", applyFilter);
    filter.addEventListener("change", applyFilter);
  }
  if (stateFilter) stateFilter.addEventListener("change", applyFilter);
  applyFilter();

  // Parts that share a URL are fetched once: a JSON object by part name (data-part), or
  // the HTML of the one part.
  var urls = [];
  parts.forEach(function (el) {
    if (urls.indexOf(el.dataset.live) < 0) urls.push(el.dataset.live);
  });

  // What a person is doing in a part that keeps its state (a gate's comment, the cancel
  // form's reason, an opened <details>), by form (its gate, else its class) and field.
  function formKey(form) {
    return form ? (form.dataset.gate ? "gate:" + form.dataset.gate : form.className) : "";
  }
  // A <details> by its own key (data-key: a stage page's output, file or diff), else by
  // its form.
  function detailsKey(d) {
    return d.dataset.key ? "key:" + d.dataset.key : formKey(d.closest("form"));
  }
  function keepState(el) {
    var state = { fields: {}, open: {}, focus: null };
    el.querySelectorAll("textarea, input[type=text]").forEach(function (f) {
      var key = formKey(f.form) + "/" + f.name;
      state.fields[key] = f.value;
      if (f === document.activeElement) {
        state.focus = { key: key, start: f.selectionStart, end: f.selectionEnd };
      }
    });
    el.querySelectorAll("details").forEach(function (d) {
      state.open[detailsKey(d)] = d.open;
    });
    return state;
  }
  function restoreState(el, state) {
    el.querySelectorAll("textarea, input[type=text]").forEach(function (f) {
      var key = formKey(f.form) + "/" + f.name;
      if (Object.prototype.hasOwnProperty.call(state.fields, key)) f.value = state.fields[key];
      if (state.focus && state.focus.key === key) {
        f.focus();
        try { f.setSelectionRange(state.focus.start, state.focus.end); } catch (e) { /* no selection */ }
      }
    });
    el.querySelectorAll("details").forEach(function (d) {
      var key = detailsKey(d);
      if (Object.prototype.hasOwnProperty.call(state.open, key)) d.open = state.open[key];
    });
  }

  // A part is replaced when its HTML changed since it was last fetched (always on the first
  // fetch: the page may have been rendered before a change the first fetch sees). A part
  // that keeps its state gets back what was typed and opened in it.
  function place(el, html) {
    if (typeof html !== "string" || html === el.dataset.html) return;
    var state = el.hasAttribute("data-keep") ? keepState(el) : null;
    el.innerHTML = html;
    el.dataset.html = html;
    if (state) restoreState(el, state);
  }

  var busy = false, again = false;
  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    var jobs = urls.map(function (url) {
      return fetch(url, { credentials: "same-origin", cache: "no-store" }).then(function (r) {
        if (!r.ok) return;
        var json = (r.headers.get("content-type") || "").indexOf("application/json") === 0;
        return (json ? r.json() : r.text()).then(function (body) {
          parts.forEach(function (el) {
            if (el.dataset.live !== url) return;
            place(el, json ? body[el.dataset.part] : body);
          });
        });
      });
    });
    Promise.all(jobs).catch(function () {}).then(function () {
      busy = false;
      applyFilter();
      document.body.dataset.refreshed = String(Date.now());
      if (again) { again = false; refresh(); }
    });
  }
  if (parts.length && window.EventSource) {
    var es = null;
    var connect = function () {
      es = new EventSource("/api/changes");
      // A change made before the stream was open (or while it reconnected) sends no event:
      // the parts are fetched again each time it opens.
      es.addEventListener("open", function () {
        if (dot) dot.classList.add("on");
        refresh();
      });
      es.addEventListener("error", function () { if (dot) dot.classList.remove("on"); });
      es.addEventListener("change", refresh);
    };
    // A page left for another is closed, stream and all: a page the browser keeps to go back
    // to would hold its connection, and a browser opens only six to one server.
    window.addEventListener("pagehide", function () {
      if (es) { es.close(); es = null; }
      if (dot) dot.classList.remove("on");
    });
    window.addEventListener("pageshow", function (e) {
      if (e.persisted && !es) connect();
    });
    connect();
    refresh();
  }
})();
