//! What a hostile world does to a run: a kill -9 in the middle of a stage, another process
//! holding the store, output too long to keep, terminal escapes in what agents write, agent
//! programs that fail.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::Project;

/// A stage that forks a grandchild which leaves its process group (`setsid`) and outlives
/// the stage's own shell unless something kills it. Every line names the shell's pid.
const WORK: &str = r#"#!/bin/sh
me=$$
echo "start $me" >> log.txt
setsid sh -c "sleep 2; echo alive $me >> log.txt" &
sleep 2
echo "end $me" >> log.txt
echo "done $me"
"#;

#[test]
fn a_stage_never_runs_beside_an_earlier_copy_of_itself_after_kill_9() {
    let p = Project::new();
    p.write("work.sh", WORK);
    p.workflow(
        "w.toml",
        "name = \"k9\"\n[stages.work]\nkind = \"command\"\nargv = [\"sh\", \"work.sh\"]\n",
    );
    let child = p.spawn(&["run", "w.toml"]);
    let run = p.wait_for_run();
    p.wait_for(|| p.read("log.txt").contains("start"));
    child.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = child.finish();
    let first = p.read("log.txt");
    let pid1 = first.split_whitespace().nth(1).unwrap().to_string();

    let out = p.run(&["resume", &run, "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("that the run's previous executor left running"),
        "{}",
        out.stderr
    );
    // Long enough for anything of the first copy that survived to write.
    std::thread::sleep(Duration::from_millis(2500));
    let log = p.read("log.txt");
    let of_first: Vec<&str> = log.lines().filter(|l| l.ends_with(&pid1)).collect();
    assert_eq!(
        of_first,
        [format!("start {pid1}")],
        "the first copy (and its setsid grandchild) went on beside the second:\n{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.starts_with("end ") && !l.ends_with(&pid1)),
        "{log}"
    );
}

/// Two command stages, `b` after `a`; `a` takes a second.
const CHAIN: &str = r#"name = "chain"
[stages.a]
kind = "command"
argv = ["sh", "-c", "sleep 1; echo a-out"]
[stages.b]
kind = "command"
needs = ["a"]
argv = ["sh", "-c", "echo ran >> b.txt; echo b-saw-{{ stages.a.output.stdout | trim }}"]
"#;

/// Holds the store's write lock from another connection, from the moment `a` is running
/// and for `hold`.
fn hold_the_store_while_a_runs(p: &Project, hold: Duration) {
    p.wait_for(|| {
        p.store_text()
            .contains("\"node\":\"a\",\"attempt\":1,\"state\":\"running\"")
    });
    let db = p.dir().join(".ralph-flow/state.db");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    std::thread::sleep(hold);
    conn.execute_batch("ROLLBACK").unwrap();
}

#[test]
fn nothing_starts_on_a_store_that_cannot_commit() {
    let p = Project::new();
    p.workflow("w.toml", CHAIN);
    let child = p.spawn_env(
        &["run", "w.toml", "--json"],
        &[("RALPH_FLOW_STORE_BUSY_WAIT", "1")],
    );
    let run = p.wait_for_run();
    hold_the_store_while_a_runs(&p, Duration::from_secs(4));
    let out = child.finish();
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(
        out.stderr.contains("kept it locked for more than 1s"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("is locked by another process; waited"),
        "the wait is reported: {}",
        out.stderr
    );
    assert!(
        !p.dir().join("b.txt").exists(),
        "b started after a's commit failed"
    );
    // Once the store is free, resume runs what was not committed, and the outputs agree.
    let out = p.run(&["resume", &run, "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json["outputs"]["b"]["stdout"], "b-saw-a-out\n");
    assert_eq!(p.read("b.txt"), "ran\n");
}

#[test]
fn a_busy_store_is_waited_for_and_the_wait_reported() {
    let p = Project::new();
    p.workflow("w.toml", CHAIN);
    let child = p.spawn_env(
        &["run", "w.toml", "--json"],
        &[("RALPH_FLOW_STORE_BUSY_WAIT", "30")],
    );
    hold_the_store_while_a_runs(&p, Duration::from_millis(2500));
    let out = child.finish();
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains("is locked by another process; waited"),
        "{}",
        out.stderr
    );
    assert_eq!(out.json["outputs"]["b"]["stdout"], "b-saw-a-out\n");
}

#[test]
fn long_output_is_cut_with_true_counts_and_capped_on_disk() {
    let p = Project::new();
    // 70,000,000 bytes of `a`, then a newline and `END`.
    p.workflow(
        "w.toml",
        r#"name = "big"
[stages.big]
kind = "command"
argv = ["sh", "-c", "head -c 70000000 /dev/zero | tr '\\0' a; printf '\\nEND\\n'"]

[agents.loud]
kind = "command"
command = ["sh", "-c", "cat > /dev/null; head -c 20000000 /dev/zero | tr '\\0' b; printf '\\nANSWER\\n'"]

[stages.ask]
kind = "agent"
agent = "loud"
prompt = "Say a lot."
"#,
    );
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let total: u64 = 70_000_000 + 5;
    let stdout = out.json["outputs"]["big"]["stdout"].as_str().unwrap();
    let kept = 256 * 1024;
    assert!(
        stdout.starts_with(&format!("[... {} bytes cut ...]\n", total - kept)),
        "{}",
        &stdout[..80]
    );
    assert!(stdout.ends_with("aaa\nEND\n"));
    // The artifact keeps the first 64 MiB and says how much more there was.
    let run = out.json["run"].as_str().unwrap();
    let file = p
        .dir()
        .join(format!(".ralph-flow/runs/{run}/big/attempt-1/stdout"));
    let size = std::fs::metadata(&file).unwrap().len();
    let cap = 64 * 1024 * 1024;
    assert!(size > cap && size < cap + 200, "{size}");
    let bytes = std::fs::read(&file).unwrap();
    let tail = String::from_utf8_lossy(&bytes[bytes.len() - 150..]).into_owned();
    assert!(
        tail.contains(&format!(
            "keeps the first {cap} bytes of the stream; {} more bytes were not written",
            total - cap
        )),
        "{tail}"
    );
    // A command agent's answer beyond what is kept in memory is marked, with the count.
    let answer = out.json["outputs"]["ask"]["text"].as_str().unwrap();
    let answer_total: u64 = 20_000_000 + 8;
    let marker = answer.lines().next().unwrap();
    let cut: u64 = marker
        .strip_prefix("[... ")
        .and_then(|m| m.strip_suffix(" bytes cut ...]"))
        .unwrap_or_else(|| panic!("{marker}"))
        .parse()
        .unwrap();
    let rest = answer.len() as u64 - marker.len() as u64 - 1;
    assert_eq!(cut + rest, answer_total, "{marker}");
    assert!(answer.ends_with("bbb\nANSWER\n"));
}

#[test]
fn terminal_escapes_in_outputs_are_shown_not_interpreted() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        r#"name = "esc"
[stages.a]
kind = "command"
argv = ["printf", "\u001b]0;pwned\u0007\u001b[2J"]
[stages.b]
kind = "command"
needs = ["a"]
argv = ["echo", "{{ stages.a.output.stdout }}"]
"#,
    );
    let out = p.run(&["run", "w.toml"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(!out.stderr.contains('\u{1b}'), "{:?}", out.stderr);
    assert!(!out.stderr.contains('\u{7}'), "{:?}", out.stderr);
    assert!(
        out.stderr.contains("\\u{1b}]0;pwned\\u{7}"),
        "{}",
        out.stderr
    );
    let run = p.run(&["runs", "--json"]).json[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let logs = p.run(&["logs", &run]);
    assert!(!logs.stdout.contains('\u{1b}'), "{:?}", logs.stdout);
}

#[test]
fn a_command_agent_that_exits_non_zero_fails_its_attempt_at_once() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        r#"name = "exit1"
[agents.bot]
kind = "command"
command = ["scripted"]
[stages.ask]
kind = "agent"
agent = "bot"
prompt = "Answer."
"#,
    );
    p.answer("ask", 1, "#exit 1\nsegmentation fault in the model loader");
    let started = Instant::now();
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert_eq!(
        p.calls("ask"),
        1,
        "not retried as transient: {}",
        out.stderr
    );
    let message = out.json["message"].as_str().unwrap();
    assert!(
        message.contains("exited with code 1") && message.contains("segmentation fault"),
        "{message}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));

    // One that says it is overloaded is retried.
    let p = Project::new();
    p.workflow(
        "w.toml",
        "name = \"exit2\"\n[agents.bot]\nkind = \"command\"\ncommand = [\"scripted\"]\n[stages.ask]\nkind = \"agent\"\nagent = \"bot\"\nprompt = \"Answer.\"\n",
    );
    p.answer(
        "ask",
        1,
        "#exit 1\nerror: the model is overloaded, try later",
    );
    p.answer("ask", 2, "fine");
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(p.calls("ask"), 2);
}
