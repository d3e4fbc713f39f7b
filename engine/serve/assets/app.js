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

  function place(el, html, first) {
    if (typeof html !== "string") return;
    // A part that keeps its state (a gate's comment box) is only replaced when it changed
    // since it was last fetched.
    if (first && el.hasAttribute("data-keep")) { el.dataset.html = html; return; }
    if (html !== el.dataset.html) {
      el.innerHTML = html;
      el.dataset.html = html;
    }
  }

  var busy = false, again = false, first = true;
  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    var wasFirst = first;
    var jobs = urls.map(function (url) {
      return fetch(url, { credentials: "same-origin", cache: "no-store" }).then(function (r) {
        if (!r.ok) return;
        var json = (r.headers.get("content-type") || "").indexOf("application/json") === 0;
        return (json ? r.json() : r.text()).then(function (body) {
          parts.forEach(function (el) {
            if (el.dataset.live !== url) return;
            place(el, json ? body[el.dataset.part] : body, wasFirst);
          });
        });
      });
    });
    Promise.all(jobs).catch(function () {}).then(function () {
      first = false;
      busy = false;
      applyFilter();
      document.body.dataset.refreshed = String(Date.now());
      if (again) { again = false; refresh(); }
    });
  }
  if (parts.length && window.EventSource) {
    var es = new EventSource("/api/changes");
    // A change made before the stream was open (or while it reconnected) sends no event:
    // the parts are fetched again each time it opens.
    es.addEventListener("open", function () {
      if (dot) dot.classList.add("on");
      refresh();
    });
    es.addEventListener("error", function () { if (dot) dot.classList.remove("on"); });
    es.addEventListener("change", refresh);
    refresh();
  }
})();
