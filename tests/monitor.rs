//! `ralph-flow serve` over HTTP: the token, CSRF, the JSON API, metrics, escaping and
//! secrets; stage pages paged and filtered, and live; the store's reads of what changed
//! (`*_since`) against full reads, in SQLite and PostgreSQL. The browser tests are in
//! tests/monitor_browser.rs.
#![allow(clippy::unwrap_used)]

mod common;
mod monitor_support;
mod pg;

use monitor_support::{Checkout, Server};

#[test]
fn every_request_needs_the_token_which_the_first_visit_trades_for_a_cookie() {
    let c = Checkout::new();
    let s = Server::start(c.path(), &[]);
    assert_eq!(s.token.len(), 48, "a random token of 24 bytes");
    for path in [
        "/",
        "/api/runs",
        "/metrics",
        "/api/changes",
        "/assets/app.js",
        "/runs/x",
    ] {
        let r = s.request("GET", path, &[], "");
        assert_eq!(r.status, 401, "{path} without the token");
        assert!(r.body.contains("access token"), "{}", r.body);
    }
    let wrong = s.request("GET", "/?token=0123456789abcdef", &[], "");
    assert_eq!(wrong.status, 401);
    let wrong_cookie = s.request("GET", "/", &[("Cookie", "ralph_flow_token=nope")], "");
    assert_eq!(wrong_cookie.status, 401);
    let first = s.request(
        "GET",
        &format!("/runs/abc?token={}&msg=hi", s.token),
        &[],
        "",
    );
    assert_eq!(first.status, 303);
    assert_eq!(first.header("location"), Some("/runs/abc?msg=hi"));
    let cookie = first.header("set-cookie").unwrap();
    assert!(cookie.starts_with(&format!("ralph_flow_token={};", s.token)));
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
    let page = s.get_with_cookie("/");
    assert_eq!(page.status, 200);
    assert!(page.body.contains("No runs yet"), "{}", page.body);
    let csp = page.header("content-security-policy").unwrap();
    assert!(csp.contains("script-src 'self'"), "{csp}");
    assert_eq!(s.get("/api/runs").body, "[]");
}

#[test]
fn binding_beyond_loopback_needs_the_flag_and_a_token() {
    let c = Checkout::new();
    let (code, _, err) = c.run(&["serve", "--addr", "0.0.0.0:0"]);
    assert_eq!(code, 3);
    assert!(err.contains("--allow-remote"), "{err}");
    let out = c
        .command(&["serve", "--addr", "0.0.0.0:0", "--allow-remote"])
        .env_remove("RALPH_FLOW_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("RALPH_FLOW_TOKEN"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = c
        .command(&["serve", "--addr", "0.0.0.0:0", "--allow-remote"])
        .env("RALPH_FLOW_TOKEN", "short")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "a short token is refused");
}

#[test]
fn the_api_serves_runs_live_states_events_artifacts_and_metrics() {
    let c = Checkout::new();
    let id = c.wiggum();
    let s = Server::start(c.path(), &[]);
    let runs = s.json("/api/runs");
    let run = &runs[0];
    assert_eq!(run["id"], id.as_str());
    assert_eq!(run["workflow"], "wiggum-review");
    assert_eq!(run["state"], "finished");
    assert_eq!(run["exit"], "clean");
    assert_eq!(run["exit_code"], 0);
    assert_eq!(run["tokens"], 13530, "the recording's usage: {run}");
    let detail = s.json(&format!("/api/runs/{id}"));
    assert_eq!(detail["live"]["review"]["state"], "done");
    assert_eq!(detail["live"]["review"]["badge"], "×3");
    assert_eq!(detail["live"]["review_loop"]["badge"], "iteration 3");
    assert_eq!(detail["live"]["report"]["state"], "skipped");
    let events = s.json(&format!("/api/runs/{id}/events"));
    let (_, logs, _) = c.run(&["logs", &id, "--json"]);
    let logged: serde_json::Value = serde_json::from_str(&logs).unwrap();
    assert_eq!(
        events.as_array().unwrap().len(),
        logged["events"].as_array().map_or(0, Vec::len),
        "the same events as `logs`"
    );
    let later = s.json(&format!("/api/runs/{id}/events?since=3"));
    assert_eq!(
        later.as_array().unwrap().len() + 3,
        events.as_array().unwrap().len()
    );
    let paths = s.json(&format!("/api/runs/{id}/artifacts"));
    let prompt = "review_loop#1/review/attempt-1/prompt.md";
    assert!(
        paths.as_array().unwrap().iter().any(|p| p == prompt),
        "{paths}"
    );
    let text = s.get(&format!(
        "/api/runs/{id}/artifacts/review_loop%231/review/attempt-1/prompt.md"
    ));
    assert_eq!(text.status, 200);
    assert!(text.body.contains("fresh eyes"), "{}", text.body);
    assert_eq!(
        s.get(&format!("/api/runs/{id}/artifacts/nope.md")).status,
        404
    );
    assert_eq!(s.get("/api/runs/no-such-run").status, 404);

    let metrics = s.get("/metrics");
    assert_eq!(metrics.status, 200);
    assert!(
        metrics
            .header("content-type")
            .unwrap()
            .starts_with("text/plain; version=0.0.4")
    );
    for line in [
        "ralph_flow_runs{state=\"finished\"} 1",
        "ralph_flow_runs{state=\"running\"} 0",
        "ralph_flow_stages{state=\"done\"} 10",
        "ralph_flow_tokens_total{agent=\"reviewer\",direction=\"input\"} 12600",
        "ralph_flow_gates_waiting 0",
    ] {
        assert!(metrics.body.contains(line), "{line} in\n{}", metrics.body);
    }

    // The pages: the plan drawn with live states, and the stage's attempts with diffs.
    let page = s.get(&format!("/runs/{id}"));
    assert_eq!(page.status, 200);
    assert!(
        page.body
            .contains(r#"data-node="review" data-state="done""#)
    );
    assert!(page.body.contains("finished: clean (0)"));
    let stage = s.get(&format!("/runs/{id}/stage?node=review"));
    assert_eq!(stage.status, 200);
    assert!(stage.body.contains("Diff from attempt 1 in review_loop#1"));
    assert!(stage.body.contains(r#"class="d-del""#));
}

/// A run whose agent reported no usage (a server that streams none): the pages, the API and
/// the metrics say `unknown` and count the calls, and show no 0 tokens for them.
#[test]
fn usage_no_call_reported_is_unknown_in_pages_api_and_metrics() {
    let c = Checkout::new();
    // The Wiggum recording, its answers carrying no usage.
    let rec = tempfile::tempdir().unwrap();
    let recording = std::fs::read_to_string(c.path().join("examples/wiggum-review.replay.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["reply"]["usage"] = serde_json::json!({
                "input_tokens": 0, "output_tokens": 0, "cached_tokens": 0, "cost_usd": null,
                "unreported": 1
            });
            format!("{v}\n")
        })
        .collect::<String>();
    let replay = rec.path().join("unknown.replay.jsonl");
    std::fs::write(&replay, recording).unwrap();
    let mut args = common::WIGGUM_REPLAY.to_vec();
    args[2] = replay.to_str().unwrap();
    args.insert(0, "run");
    let (code, out, err) = c.run(&args);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("tokens unknown (3 calls reported no usage)"),
        "{err}"
    );
    assert!(
        !err.contains("reported no token usage"),
        "no budget, so no note: {err}"
    );
    let id = serde_json::from_str::<serde_json::Value>(&out).unwrap()["run"]
        .as_str()
        .unwrap()
        .to_string();
    let s = Server::start(c.path(), &[]);

    let run = &s.json("/api/runs")[0];
    assert_eq!(run["id"], id.as_str());
    assert!(run["tokens"].is_null(), "unknown, not 0: {run}");
    assert_eq!(run["tokens_text"], "unknown", "{run}");
    assert_eq!(run["usage_unknown_calls"], 3, "{run}");
    assert!(run["usage"]["input_tokens"].is_null(), "{run}");
    let detail = s.json(&format!("/api/runs/{id}"));
    let attempt = detail["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["node"] == "review")
        .unwrap();
    assert!(attempt["usage"]["input_tokens"].is_null(), "{attempt}");
    assert_eq!(attempt["usage"]["unreported"], 1, "{attempt}");

    let metrics = s.get("/metrics").body;
    assert!(
        metrics.contains("ralph_flow_usage_unreported_calls_total{agent=\"reviewer\"} 3"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("ralph_flow_tokens_total{agent=\"reviewer\""),
        "no 0 sample for an unknown: {metrics}"
    );
    assert!(
        !metrics.contains("ralph_flow_cost_usd_total{agent=\"reviewer\""),
        "{metrics}"
    );

    let runs = s.get("/").body;
    assert!(runs.contains(">unknown</td>"), "{runs}");
    let page = s.get(&format!("/runs/{id}")).body;
    assert!(page.contains("3 calls reported no usage"), "{page}");
    assert!(!page.contains("(0 in, 0 out)"), "{page}");
    assert!(page.contains("unknown tokens"), "the chart says so: {page}");
    let stage = s.get(&format!("/runs/{id}/stage?node=review")).body;
    assert!(
        stage.contains("usage unknown: the agent reported none"),
        "{stage}"
    );
    assert!(!stage.contains("0 tokens in"), "{stage}");
}

/// The CSRF token of a page.
fn csrf_of(page: &str) -> String {
    let at = page.find(r#"name="csrf" value=""#).expect("a gate form") + 19;
    page[at..].split('"').next().unwrap().to_string()
}

#[test]
fn answering_a_gate_needs_csrf_and_the_same_origin_and_writes_what_approve_writes() {
    let c = Checkout::new();
    let (code, _, err) = c.run(&Checkout::spider_args(&["--no-wait"]));
    assert_eq!(code, 75, "SPIDER waits on its spec gate: {err}");
    let id = c.newest_run();
    let s = Server::start(c.path(), &[]);
    let cookie = format!("ralph_flow_token={}", s.token);
    let page = s.get_with_cookie(&format!("/runs/{id}"));
    assert!(page.body.contains("specify_loop#1/approve_spec"));
    let csrf = csrf_of(&page.body);
    let form = "gate=specify_loop%231%2Fapprove_spec&decision=approve&comment=";
    let post = |body: &str, extra: &[(&str, &str)]| {
        let mut h = vec![
            ("Cookie", cookie.as_str()),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ];
        h.extend_from_slice(extra);
        s.request("POST", &format!("/runs/{id}/answer"), &h, body)
    };
    assert_eq!(post(form, &[]).status, 403, "no CSRF token");
    assert_eq!(
        post(&format!("{form}&csrf=0000"), &[]).status,
        403,
        "a wrong CSRF token"
    );
    let evil = post(
        &format!("{form}&csrf={csrf}"),
        &[("Origin", "http://evil.example")],
    );
    assert_eq!(evil.status, 403, "another site");
    let detail = s.json(&format!("/api/runs/{id}"));
    assert_eq!(
        detail["gates"].as_array().unwrap().len(),
        1,
        "still waiting"
    );

    let ok = post(
        &format!("{form}&csrf={csrf}"),
        &[("Origin", &s.base.clone())],
    );
    assert_eq!(ok.status, 303, "{}", ok.body);
    // The redirect names the message the monitor issued, not its text; the page shows it.
    let location = ok.header("location").unwrap().to_string();
    assert!(
        location.starts_with(&format!("/runs/{id}?msg=")),
        "{location}"
    );
    assert!(!location.contains("Approved"), "{location}");
    let shown = s.get_with_cookie(&location);
    assert!(
        shown
            .body
            .contains(r#"id="flash">Approved gate specify_loop#1"#),
        "{}",
        shown.body
    );
    // The message is this run's: another run's page does not show it under its number.
    let key = location.rsplit('=').next().unwrap_or_default();
    let (code, _, err) = c.run(&Checkout::spider_args(&["--no-wait"]));
    assert_eq!(code, 75, "{err}");
    let other_id = c.newest_run();
    assert_ne!(other_id, id);
    let other = s.get_with_cookie(&format!("/runs/{other_id}?msg={key}"));
    assert_eq!(other.status, 200);
    assert!(!other.body.contains(r#"id="flash""#), "{}", other.body);
    // Text written into the address never reaches the banner.
    for forged in ["Approved%20by%20the%20CEO", "1%3Cscript%3E", "99", "-1"] {
        let page = s.get_with_cookie(&format!("/runs/{id}?msg={forged}"));
        assert_eq!(page.status, 200);
        assert!(
            !page.body.contains(r#"id="flash""#),
            "msg={forged}: a banner shown"
        );
        assert!(!page.body.contains("CEO"), "msg={forged}");
    }
    // The same records as `ralph-flow approve`: resume goes on to the plan gate.
    let (_, logs, _) = c.run(&["logs", &id]);
    assert!(logs.contains("approved by"), "{logs}");
    assert!(logs.contains("@monitor"), "{logs}");
    let (code, _, err) = c.run(&["resume", &id, "--no-wait"]);
    assert_eq!(code, 75, "{err}");
    assert!(err.contains("plan_loop#1/approve_plan"), "{err}");

    // The JSON API: a rejection needs a comment; with the bearer token no CSRF is needed.
    let auth = format!("Bearer {}", s.token);
    let api = |body: &str| {
        s.request(
            "POST",
            &format!("/api/runs/{id}/gates/answer"),
            &[
                ("Authorization", auth.as_str()),
                ("Content-Type", "application/json"),
            ],
            body,
        )
    };
    let r = api(r#"{"gate": "approve_plan", "approve": false}"#);
    assert_eq!(r.status, 409);
    assert!(r.body.contains("needs a comment"), "{}", r.body);
    let r = api(r#"{"gate": "approve_spec", "approve": true}"#);
    assert_eq!(r.status, 409, "not waiting any more: {}", r.body);
    // With the cookie instead, the API needs the header.
    let r = s.request(
        "POST",
        &format!("/api/runs/{id}/gates/answer"),
        &[("Cookie", &cookie), ("Content-Type", "application/json")],
        r#"{"gate": "approve_plan", "approve": true}"#,
    );
    assert_eq!(r.status, 403);
    let r = api(r#"{"gate": "approve_plan", "approve": true, "by": "ana"}"#);
    assert_eq!(r.status, 200, "{}", r.body);
    let answered: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(answered["answered"], "plan_loop#1/approve_plan");
    let (code, _, err) = c.run(&["resume", &id]);
    assert_eq!(code, 0, "{err}");
    let runs = s.json("/api/runs");
    let run = runs
        .as_array()
        .and_then(|a| a.iter().find(|r| r["id"] == id.as_str()))
        .unwrap_or_else(|| panic!("run {id} is not listed: {runs}"));
    assert_eq!(run["exit"], "success");
}

#[test]
fn answers_are_escaped_and_keys_never_reach_a_page() {
    let c = Checkout::new();
    let (code, _, err) = c.run(&Checkout::spider_args(&["--no-wait"]));
    assert_eq!(code, 75, "{err}");
    let id = c.newest_run();
    for gate in ["approve_spec", "approve_plan"] {
        assert_eq!(c.run(&["approve", &id, gate]).0, 0);
        let (code, _, _) = c.run(&["resume", &id, "--no-wait"]);
        assert!(code == 75 || code == 0);
    }
    // A key the run did not know of (it was not set) that a stage printed: the monitor
    // knows the usual key variables and masks their values wherever they appear.
    let secret = "sk-monitor-test-0123456789";
    std::fs::write(
        c.path().join("leak.toml"),
        format!(
            "name = \"leak\"\n[stages.say]\nkind = \"command\"\nargv = [\"echo\", \"{secret}\"]\n"
        ),
    )
    .unwrap();
    let (code, _, err) = c.run(&["run", "leak.toml"]);
    assert_eq!(code, 0, "{err}");
    let leak = c.new_run(&[&id]);
    let s = Server::start(c.path(), &[("OPENAI_API_KEY", secret)]);
    let review = s.get(&format!("/runs/{id}/stage?node=review"));
    assert!(
        review
            .body
            .contains("&lt;script&gt;alert(1)&lt;&#x2f;script&gt;"),
        "escaped: {}",
        review.body
    );
    assert!(!review.body.contains("<script>alert(1)"));
    for path in [
        format!("/runs/{leak}"),
        format!("/runs/{leak}/stage?node=say"),
        format!("/api/runs/{leak}"),
        "/api/runs".to_string(),
        format!("/api/runs/{leak}/events"),
    ] {
        let r = s.get(&path);
        assert_eq!(r.status, 200, "{path}");
        assert!(!r.body.contains(secret), "{path} shows the key: {}", r.body);
    }
    let stage = s.get(&format!("/runs/{leak}/stage?node=say"));
    assert!(stage.body.contains("[REDACTED]"), "{}", stage.body);
}

#[test]
fn changes_and_events_stream_as_they_happen_and_pages_refresh_in_parts() {
    let c = Checkout::new();
    let id = c.wiggum();
    let s = Server::start(c.path(), &[]);
    // The run's events, from the first, each with its index as id.
    let lines = s.stream_until(
        &format!("/api/runs/{id}/events/stream"),
        || {},
        |l| l.contains("\"kind\":\"finished\""),
    );
    assert!(lines[0].contains("200"), "{lines:?}");
    assert!(lines.iter().any(|l| l == "id: 0"), "{lines:?}");
    assert!(lines.iter().any(|l| l == "event: event"), "{lines:?}");
    // A reconnecting client resumes after the last id it saw.
    let count = s
        .json(&format!("/api/runs/{id}/events"))
        .as_array()
        .unwrap()
        .len();
    let r = s.get(&format!("/api/runs/{id}/events?since={count}"));
    assert_eq!(r.body, "[]");
    // A run started elsewhere is a change.
    let lines = s.stream_until(
        "/api/changes",
        || {
            std::fs::write(
                c.path().join("one.toml"),
                "name = \"one\"\n[stages.a]\nkind = \"command\"\nargv = [\"true\"]\n",
            )
            .unwrap();
            assert_eq!(c.run(&["run", "one.toml"]).0, 0);
        },
        |l| l == "event: change",
    );
    assert!(lines.iter().any(|l| l == "event: change"));
    // Every part of the run page in one reply.
    let parts = s.json(&format!("/live/runs/{id}"));
    for part in ["summary", "gates", "graph", "timeline", "usage", "events"] {
        assert!(parts[part].is_string(), "{part}: {parts}");
    }
    assert!(
        parts["graph"]
            .as_str()
            .unwrap()
            .contains("data-node=\"review_loop\"")
    );
    assert!(
        parts["summary"]
            .as_str()
            .unwrap()
            .contains("finished: clean (0)")
    );
    let table = s.get("/live/runs?q=one");
    assert!(
        table.body.contains(">one<") || table.body.contains("one.toml"),
        "{}",
        table.body
    );
    assert!(
        !table.body.contains("wiggum-review"),
        "filtered: {}",
        table.body
    );
}

#[test]
fn graph_draws_the_same_plan_as_svg_without_graphviz() {
    let c = Checkout::new();
    let (code, svg, err) = c.run(&["graph", "workflows/spider.toml", "--format", "svg"]);
    assert_eq!(code, 0, "{err}");
    assert!(svg.starts_with("<svg"), "{svg}");
    assert!(svg.contains("<style>"), "a file that stands alone");
    for node in [
        "specify",
        "approve_spec",
        "plan_loop",
        "implement",
        "review",
    ] {
        assert!(
            svg.contains(&format!("data-node=\"{node}\"")),
            "{node} drawn"
        );
    }
    assert!(!svg.contains("<a href"), "no links outside the monitor");
}

#[test]
fn a_run_whose_process_is_gone_shows_as_orphaned_until_it_is_resumed() {
    let c = Checkout::new();
    let s = Server::start(c.path(), &[]);
    // SPIDER polls its spec gate: a live executor holds the run.
    let mut spider = c
        .command(&Checkout::spider_args(&[]))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let id = c.newest_run();
    let state = || {
        s.json("/api/runs")[0]["state"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let t = std::time::Instant::now();
    while state() != "waiting" {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "{}",
            state()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    spider.kill().unwrap();
    spider.wait().unwrap();
    let run = &s.json("/api/runs")[0];
    assert_eq!(run["state"], "orphaned", "{run}");
    assert!(
        run["state_text"]
            .as_str()
            .unwrap()
            .contains(&format!("ralph-flow resume {id}")),
        "{run}"
    );
    let metrics = s.get("/metrics").body;
    assert!(
        metrics.contains("ralph_flow_runs{state=\"orphaned\"} 1"),
        "{metrics}"
    );
    let (code, _, err) = c.run(&["resume", &id, "--no-wait"]);
    assert_eq!(code, 75, "{err}");
    assert_eq!(state(), "waiting");
}

/// A page's HTML with the escapes of `/` and `&` in attributes undone (minijinja escapes
/// both; a browser reads them back), so that links can be compared as written.
fn unescaped(html: &str) -> String {
    html.replace("&#x2f;", "/").replace("&amp;", "&")
}

/// How many `<section class="instance"` a stage page shows, and their states.
fn instances(page: &str) -> Vec<String> {
    page.split("<section class=\"instance\"")
        .skip(1)
        .map(|s| {
            s.split("data-state=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

#[test]
fn stage_pages_of_a_fan_out_are_paged_and_filtered_by_state_with_counts() {
    let c = Checkout::new();
    let id = c.fanout(250);
    let s = Server::start(c.path(), &[]);
    let base = format!("/runs/{id}/stage?node=work");
    let mut first = s.get(&base);
    first.body = unescaped(&first.body);
    assert_eq!(first.status, 200, "{}", first.body);
    let states = instances(&first.body);
    assert_eq!(states.len(), 100, "a page of 100");
    // In the order they started; every state counted, whatever the page shows.
    assert!(
        first.body.contains("Instances 1–100 of 250"),
        "{}",
        first.body
    );
    assert!(first.body.contains("page 1 of 3"), "{}", first.body);
    for (state, n) in [("done", 225), ("failed", 25)] {
        let link = format!(
            "href=\"/runs/{id}/stage?node=work&state={state}\" data-state=\"{state}\">{state} <span class=\"count\">{n}</span>"
        );
        assert!(first.body.contains(&link), "{link}: {}", first.body);
    }
    assert!(!first.body.contains("rel=\"prev\""));
    let next = format!("href=\"/runs/{id}/stage?node=work&page=2\"");
    assert!(first.body.contains(&next), "{}", first.body);
    // Its next page, by the link (no script needed), and its last.
    let mut second = s.get(&format!("{base}&page=2"));
    second.body = unescaped(&second.body);
    assert_eq!(instances(&second.body).len(), 100);
    assert!(second.body.contains("Instances 101–200 of 250"));
    assert!(second.body.contains("rel=\"prev\""));
    let mut last = s.get(&format!("{base}&page=3"));
    last.body = unescaped(&last.body);
    assert_eq!(instances(&last.body).len(), 50);
    assert!(!last.body.contains("rel=\"next\""));
    // No item is on two pages.
    let scopes = |p: &str| -> Vec<String> {
        p.split("data-scope=\"")
            .skip(1)
            .map(|r| r.split('"').next().unwrap().to_string())
            .collect()
    };
    let mut all: Vec<String> = [&first.body, &second.body, &last.body]
        .iter()
        .flat_map(|p| scopes(p))
        .collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 250);
    // A page past the last shows the last.
    assert_eq!(instances(&s.get(&format!("{base}&page=9")).body).len(), 50);
    // Filtered: the failed items only, on one page, their filter link marked.
    let mut failed = s.get(&format!("{base}&state=failed"));
    failed.body = unescaped(&failed.body);
    let states = instances(&failed.body);
    assert_eq!(states.len(), 25);
    assert!(states.iter().all(|s| s == "failed"), "{states:?}");
    assert!(failed.body.contains("of 25 failed"), "{}", failed.body);
    assert!(failed.body.contains("class=\"on\""));
    assert!(!failed.body.contains("rel=\"next\""));
    // A state nobody is in: none, said so.
    let none = s.get(&format!("{base}&state=running"));
    assert_eq!(instances(&none.body).len(), 0);
    assert!(
        none.body.contains("No instance is running"),
        "{}",
        none.body
    );
    // What is wrong, and what to give instead.
    let bad = s.get(&format!("{base}&state=nope"));
    assert_eq!(bad.status, 400);
    assert!(bad.body.contains("unknown state `nope`") && bad.body.contains("failed"));
    let bad = s.get(&format!("{base}&page=0"));
    assert_eq!(bad.status, 400);
    assert!(bad.body.contains("give 1 or more"), "{}", bad.body);
}

#[test]
fn a_stage_page_follows_its_run_live() {
    let c = Checkout::new();
    let id = c.fanout(12);
    let s = Server::start(c.path(), &[]);
    let page = unescaped(&s.get(&format!("/runs/{id}/stage?node=work")).body);
    // Its live part, as the run page's are, and the script that refreshes it.
    let live = format!("data-live=\"/live/runs/{id}/stage?node=work\" data-part=\"stage\"");
    assert!(page.contains(&live), "{page}");
    assert!(page.contains("/assets/app.js"));
    let parts = s.json(&format!("/live/runs/{id}/stage?node=work"));
    let before = parts["stage"].as_str().unwrap().to_string();
    assert_eq!(instances(&before).len(), 12);
    // Another process writes an attempt: the live part shows it.
    monitor_support::write_running_attempt(c.path(), &id, "each#late", "work");
    let parts = s.json(&format!("/live/runs/{id}/stage?node=work"));
    let after = parts["stage"].as_str().unwrap();
    assert_eq!(instances(after).len(), 13, "{after}");
    assert!(after.contains("data-scope=\"each#late\""), "{after}");
    // The run is not running, so the item that never settled is interrupted.
    assert!(
        after.contains("interrupted <span class=\"count\">1</span>"),
        "{after}"
    );
    // A run that is not there.
    assert_eq!(s.get("/live/runs/nope/stage?node=work").status, 404);
}

#[test]
fn a_running_attempt_shows_what_its_agent_does_live() {
    let c = Checkout::new();
    let id = c.fanout(2);
    let s = Server::start(c.path(), &[]);
    let live = format!("/live/runs/{id}/stage?node=work");
    let before = s.json(&live)["stage"].as_str().unwrap().to_string();
    assert!(!before.contains("class=\"activity\""), "{before}");
    // An agent starts on another item and works: a tool call, a plan, a permission allowed
    // and one denied, a file written (the events `run::watch` writes).
    monitor_support::write_running_attempt(c.path(), &id, "each#acp", "work");
    monitor_support::write_events(
        c.path(),
        &id,
        "each#acp",
        "work",
        &[
            ("tool", "edit: Write src/lib.rs (pending)"),
            ("plan", "[x] read the task\n[~] fix the loop"),
            (
                "permission",
                "git commit -m fix: allowed by policy `commit`: allow `git commit *`",
            ),
            (
                "permission",
                "git push origin HEAD: denied by policy `commit`: deny `git push *` (git push origin HEAD)",
            ),
            ("wrote", "src/lib.rs"),
            // Another stage's, and another kind: not its activity.
            ("iteration", "not an activity"),
        ],
    );
    monitor_support::write_events(c.path(), &id, "each#1", "work", &[("tool", "elsewhere")]);
    let after = unescaped(s.json(&live)["stage"].as_str().unwrap());
    let section = after
        .split("data-scope=\"each#acp\"")
        .nth(1)
        .and_then(|rest| rest.split("</section>").next())
        .unwrap_or_else(|| panic!("no instance each#acp in {after}"));
    assert!(section.contains("5 steps, 1 denied"), "{section}");
    assert!(
        section.contains("edit: Write src/lib.rs (pending)"),
        "{section}"
    );
    assert!(section.contains("[~] fix the loop"), "{section}");
    assert!(
        section.contains("<li class=\"a-permission denied\">")
            && section.contains("deny `git push *` (git push origin HEAD)"),
        "{section}"
    );
    assert!(!section.contains("not an activity"), "{section}");
    assert!(!after.contains("elsewhere"), "{after}");
}

/// Random writes to a run, of the kinds the executor and `approve` make.
/// Scopes start with `prefix` (two writers at once write different ones, as two processes
/// never settle the same stage of a run at once).
fn random_writes(
    seed: &mut u64,
    run: &str,
    prefix: &str,
    clock: &mut i64,
) -> Vec<ralph_flow::store::Write> {
    use ralph_flow::store::{
        AttemptRecord, AttemptState, Event, NodeRecord, NodeState, Usage, Write,
    };
    let mut below = |n: u64| {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed % n
    };
    let mut writes = Vec::new();
    for _ in 0..=below(4) {
        *clock += 1 + below(3) as i64;
        let scope = format!("{prefix}loop#{}", below(5));
        let node = format!("s{}", below(3));
        let attempt = below(3) as u32 + 1;
        match below(4) {
            0 | 1 => {
                let ended = below(2) == 0;
                writes.push(Write::Attempt(AttemptRecord {
                    run: run.into(),
                    scope,
                    node,
                    attempt,
                    state: if ended {
                        AttemptState::Failed
                    } else {
                        AttemptState::Running
                    },
                    agent: None,
                    dir: String::new(),
                    error: ended.then(|| format!("ended at {clock}")),
                    usage: Usage {
                        output_tokens: below(50),
                        ..Usage::default()
                    },
                    started_at: *clock - below(2) as i64,
                    finished_at: ended.then_some(*clock),
                }));
            }
            2 => {
                writes.push(Write::Event(Event {
                    run: run.into(),
                    at: *clock,
                    scope: scope.clone(),
                    node: node.clone(),
                    kind: "done".into(),
                    message: format!("settled at {clock}"),
                }));
                writes.push(Write::Node(NodeRecord {
                    run: run.into(),
                    scope,
                    node,
                    state: NodeState::Done,
                    output: serde_json::json!({ "at": *clock }),
                    action: None,
                    feedback: None,
                    attempts: attempt,
                    usage: Usage::default(),
                    started_at: *clock - 1,
                    finished_at: *clock,
                }));
            }
            _ => writes.push(Write::Event(Event {
                run: run.into(),
                at: *clock,
                scope,
                node,
                kind: "retry".into(),
                message: format!("event at {clock}"),
            })),
        }
    }
    writes
}

/// A reader's copy of a run, kept with the `*_since` reads as the monitor keeps its own.
#[derive(Default)]
struct Copy {
    at: [i64; 3],
    nodes: std::collections::HashMap<(String, String), (i64, ralph_flow::store::NodeRecord)>,
    attempts: std::collections::HashMap<(String, String, u32), ralph_flow::store::AttemptRecord>,
    events: std::collections::BTreeMap<i64, ralph_flow::store::Event>,
}

impl Copy {
    fn refresh(&mut self, s: &dyn ralph_flow::store::Store, run: &str) {
        let nodes = s.nodes_since(run, self.at[0]).unwrap();
        self.at[0] = nodes.next;
        for (n, r) in nodes.records {
            self.nodes.insert((r.scope.clone(), r.node.clone()), (n, r));
        }
        let attempts = s.attempts_since(run, self.at[1]).unwrap();
        assert!(attempts.next >= self.at[1], "a position never goes back");
        self.at[1] = attempts.next;
        for (_, a) in attempts.records {
            self.attempts
                .insert((a.scope.clone(), a.node.clone(), a.attempt), a);
        }
        let events = s.events_since(run, self.at[2]).unwrap();
        self.at[2] = events.next;
        for (n, e) in events.records {
            assert!(self.events.insert(n, e).is_none(), "an event read twice");
        }
    }

    /// The copy equals a full read.
    fn check(&self, s: &dyn ralph_flow::store::Store, run: &str) {
        let mut nodes: Vec<_> = self.nodes.values().collect();
        nodes.sort_by_key(|(n, _)| *n);
        let nodes: Vec<_> = nodes.into_iter().map(|(_, r)| r.clone()).collect();
        assert_eq!(nodes, s.nodes(run).unwrap());
        let mut attempts: Vec<_> = self.attempts.values().cloned().collect();
        attempts.sort_by(|a, b| {
            (a.started_at, &a.scope, &a.node, a.attempt).cmp(&(
                b.started_at,
                &b.scope,
                &b.node,
                b.attempt,
            ))
        });
        assert_eq!(attempts, s.attempts(run, None).unwrap());
        let events: Vec<_> = self.events.values().cloned().collect();
        assert_eq!(events, s.events(run, None).unwrap());
    }
}

fn run_record(id: &str) -> ralph_flow::store::RunRecord {
    ralph_flow::store::RunRecord {
        id: id.into(),
        workflow: "w".into(),
        file: "w.toml".into(),
        workflow_hash: String::new(),
        params: serde_json::json!({}),
        status: ralph_flow::store::RunStatus::Running,
        exit: None,
        started_at: 1,
        updated_at: 1,
        dir: "/nonexistent".into(),
        options: serde_json::json!({}),
    }
}

/// Random commits by two writers (an executor and an `approve`), read back with the
/// `*_since` reads after each: the copy equals a full read every time.
fn since_reads_equal_full_reads(
    mut writers: Vec<Box<dyn ralph_flow::store::Store + Send>>,
    reader: &dyn ralph_flow::store::Store,
) {
    for id in ["r", "other"] {
        writers[0].create_run(&run_record(id)).unwrap();
    }
    let mut copy = Copy::default();
    let (mut seed, mut clock) = (0x2545_f491_4f6c_dd1d_u64, 10);
    for round in 0..200 {
        let run = if round % 5 == 4 { "other" } else { "r" };
        let w = (seed % 2) as usize;
        let writes = random_writes(&mut seed, run, "", &mut clock);
        writers[w].commit(&writes).unwrap();
        copy.refresh(reader, "r");
        copy.check(reader, "r");
    }
    // Then both at once, from two threads: what a reader sees in the end is all of it.
    let mut threads = Vec::new();
    for (i, mut w) in writers.into_iter().enumerate() {
        threads.push(std::thread::spawn(move || {
            let (mut seed, mut clock) = (0x9e37_79b9 + i as u64, 100_000 * (i as i64 + 1));
            for _ in 0..60 {
                let writes = random_writes(&mut seed, "r", &format!("w{i}/"), &mut clock);
                w.commit(&writes).unwrap();
            }
        }));
    }
    while threads.iter().any(|t| !t.is_finished()) {
        copy.refresh(reader, "r");
    }
    for t in threads {
        t.join().unwrap();
    }
    copy.refresh(reader, "r");
    copy.check(reader, "r");
}

#[test]
fn since_reads_of_sqlite_equal_full_reads_after_random_changes() {
    use ralph_flow::store::sqlite::SqliteStore;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let writers: Vec<Box<dyn ralph_flow::store::Store + Send>> = vec![
        Box::new(SqliteStore::open(&path).unwrap()),
        Box::new(SqliteStore::open(&path).unwrap()),
    ];
    let reader = SqliteStore::open(&path).unwrap();
    since_reads_equal_full_reads(writers, &reader);
}

#[test]
fn since_reads_of_postgres_equal_full_reads_after_random_changes() {
    use ralph_flow::store::postgres::PgStore;
    let Some(url) = pg::database() else {
        return;
    };
    let writers: Vec<Box<dyn ralph_flow::store::Store + Send>> = vec![
        Box::new(PgStore::connect(&url).unwrap()),
        Box::new(PgStore::connect(&url).unwrap()),
    ];
    let reader = PgStore::connect(&url).unwrap();
    since_reads_equal_full_reads(writers, &reader);
}
