//! `ralph-flow serve` in a real browser: headless Chromium driven through WebDriver
//! (Debian's chromium and chromium-driver). A real run of the SPIDER preset, replayed from
//! its recording, shows up live, waits on its gates, and is approved by clicking; the page
//! follows it to its end without reloading. Without the browser the test says SKIPPED
//! (CI installs it and sets RALPH_FLOW_REQUIRE_BROWSER=1, which makes a missing browser fail).
#![allow(clippy::unwrap_used)]

mod browser;
mod common;
mod monitor_support;

use std::process::Stdio;
use std::time::Duration;

use monitor_support::{Checkout, Server, screenshot_dir};
use serde_json::json;

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_show_up_live_and_a_gate_is_approved_by_clicking() {
    let Some(b) = browser::Browser::start().await else {
        return;
    };
    let c = Checkout::new();
    let wiggum = c.wiggum();
    let s = Server::start(c.path(), &[]);
    let shots = screenshot_dir(c.path());

    // The URL with the token opens the runs page (the token becomes a cookie).
    b.goto(&s.url).await;
    let wiggum_row = format!("tr[data-run=\"{wiggum}\"]");
    b.wait_for_text(&wiggum_row, "finished: clean (0)", T).await;
    assert!(
        !b.current_url().await.contains("token="),
        "the token leaves the address bar"
    );
    // A request without the token is refused, even from the page.
    let status = b
        .execute(
            "return fetch('/api/runs', {credentials: 'omit'}).then(r => r.status);",
            vec![],
        )
        .await;
    assert_eq!(status, json!(401));

    // SPIDER starts in another terminal and shows up without a reload.
    b.execute("window.kept = 'yes'; return 1;", vec![]).await;
    let mut spider = c
        .command(&Checkout::spider_args(&[]))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let id = tokio::task::block_in_place(|| c.new_run(&[&wiggum]));
    let spider_row = format!("tr[data-run=\"{id}\"]");
    b.wait_for_text(&spider_row, "waiting on 1 gate", T).await;
    let kept = async || b.execute("return window.kept || null;", vec![]).await;
    assert_eq!(kept().await, json!("yes"), "updated in place, not reloaded");
    // The filter hides what does not match, as one types.
    b.fill("#filter", "spider").await;
    let hidden =
        |run: &str| format!("return document.querySelector('tr[data-run=\"{run}\"]').hidden;");
    assert_eq!(b.execute(&hidden(&wiggum), vec![]).await, json!(true));
    assert_eq!(b.execute(&hidden(&id), vec![]).await, json!(false));
    b.fill("#filter", "").await;
    assert_eq!(b.execute(&hidden(&wiggum), vec![]).await, json!(false));
    b.client().set_window_size(1280, 720).await.unwrap();
    b.screenshot_png(shots.join("monitor-runs.png")).await;

    // The run page: the plan coloured by live state, and the gate with its buttons.
    b.client().set_window_size(1280, 1000).await.unwrap();
    b.click(&format!("{spider_row} a")).await;
    let spec_gate = "form.gate[data-gate=\"specify_loop#1/approve_spec\"]";
    b.wait_until("the spec gate's form", T, async || {
        b.exists(spec_gate).await
    })
    .await;
    let state = async |node: &str| {
        b.attr(&format!("g[data-node=\"{node}\"]"), "data-state")
            .await
            .unwrap_or_default()
    };
    assert_eq!(state("specify").await, "done");
    assert_eq!(state("approve_spec").await, "waiting");
    assert_eq!(state("plan").await, "pending");
    assert!(
        b.text(spec_gate)
            .await
            .contains("Approve the spec in docs/spec.md")
    );
    b.screenshot_png(shots.join("monitor-gate.png")).await;

    // A rejection needs a comment: refused, and it says why.
    b.click(&format!("{spec_gate} button.reject")).await;
    b.wait_for_text("#flash", "needs a comment", T).await;
    // Approve by clicking; the run, polling its gate, picks the answer up.
    b.click(&format!("{spec_gate} button.approve")).await;
    b.wait_for_text("#flash", "Approved gate specify_loop#1/approve_spec", T)
        .await;
    b.execute("window.kept = 'yes'; return 1;", vec![]).await;
    let plan_gate = "form.gate[data-gate=\"plan_loop#1/approve_plan\"]";
    // First in the store (the run picked the answer up and went on to the next gate), then
    // on the page: a timeout then tells a run that did not go on from a page that did not
    // follow it.
    tokio::task::block_in_place(|| waits_on(&c, &id, "plan_loop#1/approve_plan"));
    b.wait_until("the plan gate's form, live", T, async || {
        b.exists(plan_gate).await
    })
    .await;
    assert_eq!(
        kept().await,
        json!("yes"),
        "the gate appeared without a reload"
    );
    assert_eq!(state("approve_spec").await, "done");
    assert_eq!(state("plan").await, "done");
    assert_eq!(state("approve_plan").await, "waiting");
    b.fill(&format!("{plan_gate} textarea"), "One phase is enough.")
        .await;
    b.click(&format!("{plan_gate} button.approve")).await;
    b.wait_for_text("#flash", "Approved gate plan_loop#1/approve_plan", T)
        .await;
    b.execute("window.kept = 'yes'; return 1;", vec![]).await;
    b.wait_for_text("#run-state", "finished: success (0)", T)
        .await;
    assert_eq!(kept().await, json!("yes"), "followed to the end in place");
    assert_eq!(state("review").await, "done");
    assert_eq!(state("implement").await, "done");
    assert!(!b.exists("form.gate").await, "no gate waits any more");
    let code = tokio::task::block_in_place(|| spider.wait().unwrap());
    assert_eq!(code.code(), Some(0));
    let (_, logs, _) = c.run(&["logs", &id]);
    assert!(
        logs.contains("approved by") && logs.contains("One phase is enough."),
        "the answers are the run's records: {logs}"
    );

    // An answer holding a <script> shows as text and runs nothing.
    b.goto(&format!("{}/runs/{id}/stage?node=review", s.base))
        .await;
    let answer = b.text("[data-file=\"answer.md\"] pre").await;
    assert!(answer.contains("<script>alert(1)</script>"), "{answer}");
    assert_eq!(
        b.execute(
            "return document.querySelectorAll('main script').length;",
            vec![]
        )
        .await,
        json!(0)
    );

    // The Wiggum review replay's run page.
    b.client().set_window_size(1280, 1100).await.unwrap();
    b.goto(&format!("{}/runs/{wiggum}", s.base)).await;
    b.wait_for_text("#run-state", "finished: clean (0)", T)
        .await;
    assert_eq!(state("review").await, "done");
    assert_eq!(state("report").await, "skipped");
    b.screenshot_png(shots.join("monitor-run.png")).await;
    for shot in ["monitor-runs.png", "monitor-gate.png", "monitor-run.png"] {
        let png = std::fs::read(shots.join(shot)).unwrap();
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{shot}");
    }
}

/// Waits until the run waits on `gate` in the store (`status --json`), or panics with what
/// `status` says after [`T`].
fn waits_on(c: &Checkout, run: &str, gate: &str) {
    let deadline = std::time::Instant::now() + T;
    loop {
        let (_, out, err) = c.run(&["status", run, "--json"]);
        let status: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        let waiting = status["pending_gates"].as_array().is_some_and(|gates| {
            gates.iter().any(|g| {
                format!(
                    "{}/{}",
                    g["scope"].as_str().unwrap_or_default(),
                    g["gate"].as_str().unwrap_or_default()
                ) == gate
            })
        });
        if waiting {
            return;
        }
        if std::time::Instant::now() >= deadline {
            let (_, text, _) = c.run(&["status", run]);
            panic!("run {run} does not wait on {gate} after {T:?}:\n{text}\n{out}\n{err}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A comment being typed into a gate, and the focus, stay when the gates change under it (a
/// second gate starts waiting): the part is replaced, and what the person typed put back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_comment_being_typed_survives_a_new_gate() {
    let Some(b) = browser::Browser::start().await else {
        return;
    };
    let c = Checkout::new();
    std::fs::write(
        c.path().join("two-gates.toml"),
        r#"name = "two-gates"

[stages.first]
kind = "gate"
message = "First?"
timeout = "1h"
on_timeout = "reject"

[stages.slow]
kind = "command"
argv = ["sh", "-c", "while [ ! -f go ]; do sleep 0.1; done"]

[stages.second]
kind = "gate"
needs = ["slow"]
message = "Second?"
timeout = "1h"
on_timeout = "reject"
"#,
    )
    .unwrap();
    let s = Server::start(c.path(), &[]);
    let mut run = c
        .command(&["run", "two-gates.toml"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let id = tokio::task::block_in_place(|| c.newest_run());
    tokio::task::block_in_place(|| waits_on(&c, &id, "/first"));
    b.goto(&s.url).await;
    b.goto(&format!("{}/runs/{id}", s.base)).await;
    let first = "form.gate[data-gate=\"first\"]";
    let second = "form.gate[data-gate=\"second\"]";
    b.wait_until("the first gate's form", T, async || b.exists(first).await)
        .await;
    b.fill(&format!("{first} textarea"), "Half a thought").await;
    b.execute("window.kept = 'yes'; return 1;", vec![]).await;
    // The second gate starts waiting: the gates part changes.
    std::fs::write(c.path().join("go"), "").unwrap();
    b.wait_until("the second gate's form, live", T, async || {
        b.exists(second).await
    })
    .await;
    assert_eq!(
        b.execute("return window.kept || null;", vec![]).await,
        json!("yes"),
        "updated in place, not reloaded"
    );
    let typed = b
        .execute(
            &format!("return document.querySelector('{first} textarea').value;"),
            vec![],
        )
        .await;
    assert_eq!(
        typed,
        json!("Half a thought"),
        "the comment being typed is kept"
    );
    let focused = b
        .execute(
            &format!(
                "return document.activeElement === document.querySelector('{first} textarea');"
            ),
            vec![],
        )
        .await;
    assert_eq!(focused, json!(true), "and so is the focus");
    run.kill().unwrap();
    run.wait().unwrap();
}

/// The stage page of a 2,000-item fan-out: its first page of 100 items with the count of
/// each state, the next page and a state filter by their links (no script needed), and the
/// page follows its run live: an attempt another process writes shows up without a reload,
/// and the live dot is on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_thousand_item_fan_out_stage_page_pages_filters_and_follows_its_run() {
    let Some(b) = browser::Browser::start().await else {
        return;
    };
    let c = Checkout::new();
    let id = tokio::task::block_in_place(|| c.fanout(2000));
    let s = Server::start(c.path(), &[]);
    b.goto(&s.url).await;
    b.goto(&format!("{}/runs/{id}/stage?node=work", s.base))
        .await;
    let count = async || {
        b.execute(
            "return document.querySelectorAll('section.instance').length;",
            vec![],
        )
        .await
    };
    b.wait_for_text("#stage-range", "Instances 1–100 of 2000", T)
        .await;
    assert_eq!(count().await, json!(100));
    assert!(b.text("#stage-states").await.contains("failed 200"));
    assert!(b.text("#stage-states").await.contains("done 1800"));
    // The next page, by its link.
    b.click("#stage-pager a[rel=next]").await;
    b.wait_for_text("#stage-range", "Instances 101–200 of 2000", T)
        .await;
    assert!(b.current_url().await.ends_with("&page=2"));
    assert_eq!(count().await, json!(100));
    // The failed items only.
    b.click("#stage-states a[data-state=failed]").await;
    b.wait_for_text("#stage-range", "Instances 1–100 of 200 failed", T)
        .await;
    let states = b
        .execute(
            "return Array.from(document.querySelectorAll('section.instance'))\
             .map(s => s.dataset.state).filter(s => s !== 'failed').length;",
            vec![],
        )
        .await;
    assert_eq!(states, json!(0), "only failed items");
    // Live: the dot is on, and a change in the store shows up in place.
    b.wait_until("the live dot is on", T, async || {
        b.exists("#live-dot.on").await
    })
    .await;
    b.execute("window.kept = 'yes'; return 1;", vec![]).await;
    tokio::task::block_in_place(|| {
        monitor_support::write_running_attempt(c.path(), &id, "each#late", "work");
    });
    b.wait_for_text("#stage-states", "interrupted 1", T).await;
    assert_eq!(
        b.execute("return window.kept || null;", vec![]).await,
        json!("yes"),
        "updated in place, not reloaded"
    );
}
