//! Whole commands on the PostgreSQL store, against a real server (tests/pg): `run`,
//! `resume`, `approve`, `runs`, `status`, `logs` and `serve` with `--store` or
//! RALPH_FLOW_STORE, and no SQLite file made.
#![allow(clippy::unwrap_used)]

mod common;
mod monitor_support;
mod pg;

use monitor_support::{Checkout, Server};

#[test]
fn every_command_works_on_a_postgres_store() {
    let Some(url) = pg::database() else {
        return;
    };
    let c = Checkout::new();
    // The Wiggum review replay, with --store.
    let wiggum = c.wiggum_with(&["--store", &url]);
    assert!(
        !c.path().join(".ralph-flow/state.db").exists(),
        "no SQLite store was made"
    );
    assert!(
        c.path()
            .join(format!(".ralph-flow/runs/{wiggum}/artifacts.jsonl"))
            .exists(),
        "the artifacts stay in the state directory"
    );
    let (code, out, err) = c.run(&["runs", "--json", "--store", &url]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&wiggum), "{out}");
    let (code, out, _) = c.run(&["status", &wiggum, "--store", &url]);
    assert_eq!(code, 0);
    assert!(out.contains("exit clean (0)"), "{out}");
    // Without the store, the state directory has no runs.
    let (code, out, _) = c.run(&["runs"]);
    assert_eq!(code, 0);
    assert!(out.contains("no runs"), "{out}");

    // SPIDER through RALPH_FLOW_STORE: it waits, is approved from "another terminal", and
    // resumes to its end.
    let with_env = |args: &[&str]| {
        let out = c
            .command(args)
            .env("RALPH_FLOW_STORE", &url)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = with_env(&Checkout::spider_args(&["--no-wait"]));
    assert_eq!(code, 75, "{err}");
    let (_, out, _) = c.run(&["runs", "--json", "--store", &url]);
    let runs: serde_json::Value = serde_json::from_str(&out).unwrap();
    let spider = runs[0]["id"].as_str().unwrap().to_string();
    assert_ne!(spider, wiggum);
    for gate in ["approve_spec", "approve_plan"] {
        let (code, err) = with_env(&["approve", &spider, gate, "--by", "ana"]);
        assert_eq!(code, 0, "{err}");
        let (code, err) = with_env(&["resume", &spider, "--no-wait"]);
        assert!(code == 75 || code == 0, "{err}");
    }
    let (code, out, _) = c.run(&["logs", &spider, "--store", &url]);
    assert_eq!(code, 0);
    assert!(out.contains("approved by ana"), "{out}");
    assert!(out.contains("exit success (0)"), "{out}");

    // The monitor reads the same store.
    let s = Server::start(c.path(), &[("RALPH_FLOW_STORE", &url)]);
    let listed = s.json("/api/runs");
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["id"].as_str())
        .collect();
    assert_eq!(ids, [spider.as_str(), wiggum.as_str()]);
    assert_eq!(listed[0]["exit"], "success");

    // A store that is not a URL is refused, saying what to give.
    let (code, _, err) = c.run(&["runs", "--store", "mysql://x"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("postgres:// URL"), "{err}");
}
