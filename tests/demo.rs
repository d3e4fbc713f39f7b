//! The README's first set-up command (the offline demo) works: it is read from the README
//! and run, as written, in a clean git checkout of the files it needs.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let p = e.path();
        let dest = to.join(e.file_name());
        if p.is_dir() {
            copy_dir(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).unwrap();
        }
    }
}

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
    let dir = tempfile::tempdir().unwrap();
    for d in ["workflows", "prompts", "schemas", "examples"] {
        copy_dir(&root.join(d), &dir.path().join(d));
    }
    std::fs::write(dir.path().join(".gitignore"), ".ralph-flow/\n").unwrap();
    let git = |a: &[&str]| {
        let ok = Command::new("git")
            .args(a)
            .current_dir(dir.path())
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {a:?}");
    };
    git(&["init", "-q", "-b", "main"]);
    git(&["add", "-A"]);
    git(&[
        "-c",
        "user.email=demo@example.com",
        "-c",
        "user.name=demo",
        "commit",
        "-qm",
        "demo",
    ]);
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
