//! The README's first set-up command (the offline demo) works: it is read from the README
//! and run, as written, in a clean git checkout of the files it needs.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn the_readme_demo_runs_offline_and_ends_clean() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let line = readme
        .lines()
        .find(|l| l.starts_with("cargo run -- run "))
        .expect("the README's set-up block starts with the demo command");
    let args: Vec<&str> = line
        .trim_start_matches("cargo run -- ")
        .split_whitespace()
        .collect();
    let dir = common::demo_checkout();
    let out = Command::new(env!("CARGO_BIN_EXE_ralph-flow"))
        .args(&args)
        .args(["--json", "--progress", "plain"])
        .current_dir(dir.path())
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["exit"], "clean");
    assert_eq!(json["outputs"]["review_loop"]["iterations"], 3);
    assert!(stderr.contains("iteration 1: 2 issue(s)"), "{stderr}");
}
