//! A run on the PostgreSQL store lives through a restart of the server: its executor, waiting
//! on a gate, loses its connection, says so, connects again and finishes once the gate is
//! answered. (Its own test binary: the restart cuts every connection to the shared server.)
#![allow(clippy::unwrap_used)]

mod common;
mod monitor_support;
mod pg;

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use monitor_support::Checkout;

#[test]
fn a_run_survives_a_restart_of_the_server() {
    let Some(url) = pg::database() else {
        return;
    };
    let c = Checkout::new();
    let mut spider = c
        .command(&Checkout::spider_args(&["--progress", "plain"]))
        .env("RALPH_FLOW_STORE", &url)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read what it prints as it goes, so that it never waits on a full pipe.
    let mut stderr = spider.stderr.take().unwrap();
    let printed = std::thread::spawn(move || {
        let mut err = String::new();
        let _ = stderr.read_to_string(&mut err);
        err
    });
    let runs = || {
        let (_, out, _) = c.run(&["runs", "--json", "--store", &url]);
        serde_json::from_str::<serde_json::Value>(&out).unwrap_or_default()
    };
    let waiting_on = |gate: &str| {
        let (_, out, _) = c.run(&["status", "--json", "--store", &url]);
        out.contains(gate)
    };
    let t = Instant::now();
    while !waiting_on("specify_loop#1/approve_spec") {
        assert!(t.elapsed() < Duration::from_secs(30), "no spec gate");
        std::thread::sleep(Duration::from_millis(100));
    }
    let id = runs()[0]["id"].as_str().unwrap().to_string();

    pg::restart();
    // Give the polling executor time to find its connection gone.
    std::thread::sleep(Duration::from_millis(1500));

    for (gate, next) in [
        ("approve_spec", Some("plan_loop#1/approve_plan")),
        ("approve_plan", None),
    ] {
        let (code, _, err) = c.run(&["approve", &id, gate, "--store", &url]);
        assert_eq!(code, 0, "{err}");
        if let Some(next) = next {
            let t = Instant::now();
            while !waiting_on(next) {
                assert!(
                    t.elapsed() < Duration::from_secs(60),
                    "never reached {next}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    let status = spider.wait().unwrap();
    let err = printed.join().unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(
        err.contains("lost the connection to postgres://rf@127.0.0.1"),
        "{err}"
    );
    assert_eq!(runs()[0]["exit"], serde_json::json!(["success", 0]));
    // Each stage settled once: no write was applied twice.
    let (_, logs, _) = c.run(&["logs", &id, "--store", &url, "--json"]);
    let logs: serde_json::Value = serde_json::from_str(&logs).unwrap();
    let done = |node: &str| {
        logs["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["node"] == node && e["kind"] == "done")
            .count()
    };
    assert_eq!(done("specify"), 1);
    assert_eq!(done("review"), 1);
}
