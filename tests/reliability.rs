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

/// A server that echoes the API key it is sent: in an error body, in an answer, and in a
/// 401.
struct Echo {
    calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl wiremock::Respond for Echo {
    fn respond(&self, request: &wiremock::Request) -> wiremock::ResponseTemplate {
        use std::sync::atomic::Ordering;
        let auth = request
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap();
        let prompt = body["messages"][0]["content"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if prompt.starts_with("Check") {
            return wiremock::ResponseTemplate::new(401).set_body_string(format!(
                "<html><body>Proxy login failed for {auth}</body></html>"
            ));
        }
        if n == 0 {
            return wiremock::ResponseTemplate::new(500).set_body_json(serde_json::json!({
                "error": {"message": format!("upstream rejected {auth}")}
            }));
        }
        wiremock::ResponseTemplate::new(200).set_body_json(serde_json::json!({
            "id": "x", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": format!("I was called with {auth}")}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1}
        }))
    }
}

#[test]
fn an_echoed_api_key_is_never_written_or_printed() {
    const KEY: &str = "sk-leak-test-5f0c1d2e3a4b";
    let uri = common::serve_posts(Echo {
        calls: std::sync::Arc::default(),
    });
    let p = Project::new();
    p.workflow(
        "w.toml",
        &format!(
            r#"name = "leak"
[agents.echo]
kind = "openai"
model = "m"
base_url = "{uri}/v1"
api_key_env = "LEAK_KEY"

[stages.a]
kind = "agent"
agent = "echo"
prompt = "Hello."

[stages.b]
kind = "command"
needs = ["a"]
argv = ["sh", "-c", "echo \"$1\"; echo \"key=$LEAK_KEY\" >&2", "b", "{{{{ stages.a.output.text }}}}"]

[stages.c]
kind = "agent"
agent = "echo"
needs = ["b"]
prompt = "Check {{{{ stages.b.output.stdout }}}} {{{{ stages.b.output.stderr }}}}"
"#
        ),
    );
    let env = [
        ("LEAK_KEY", KEY),
        ("RUST_LOG", "ralph_flow=debug,reqwest=debug,hyper=debug"),
    ];
    let out = p.run_env(&["run", "w.toml", "--record", "rec.jsonl", "--json"], &env);
    assert_eq!(out.code, 1, "c fails on its 401: {}", out.stderr);
    assert!(
        out.stderr.contains("[REDACTED]"),
        "the echo was seen: {}",
        out.stderr
    );
    let run = out.json["run"].as_str().unwrap().to_string();
    let mut streams = vec![("run stdout", out.stdout), ("run stderr", out.stderr)];
    for args in [
        vec!["status", run.as_str(), "--json"],
        vec!["status", run.as_str()],
        vec!["logs", run.as_str()],
        vec!["logs", run.as_str(), "--json"],
        vec!["logs", run.as_str(), "--stage", "c"],
        vec!["runs", "--json"],
    ] {
        let o = p.run_env(&args, &env);
        streams.push(("a later command", format!("{}{}", o.stdout, o.stderr)));
    }
    for (what, text) in &streams {
        assert!(!text.contains(KEY), "{what} holds the key:\n{text}");
    }
    // Every file the run wrote: the store (and its log), artifacts (the records, and the
    // files `export` writes from them), the recording.
    let exported = p.run_env(&["export", run.as_str()], &env);
    assert_eq!(exported.code, 0, "{}", exported.stderr);
    fn walk(dir: &std::path::Path, files: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let path = e.path();
            if path.is_dir() {
                walk(&path, files);
            } else {
                files.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&p.dir().join(".ralph-flow"), &mut files);
    files.push(p.dir().join("rec.jsonl"));
    assert!(files.len() > 10, "{files:?}");
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        let found = bytes.windows(KEY.len()).any(|w| w == KEY.as_bytes());
        assert!(!found, "{} holds the key", f.display());
    }
}

/// `a` takes a second, then `b`; a gate after `b` keeps the run waiting.
const SLOW_THEN_GATE: &str = r#"name = "slow"
[stages.a]
kind = "command"
argv = ["sh", "-c", "sleep 1; echo a-out"]
[stages.b]
kind = "command"
needs = ["a"]
argv = ["echo", "b"]
[stages.ok]
kind = "gate"
needs = ["b"]
message = "Go on?"
"#;

#[test]
fn a_store_deleted_mid_run_fails_loudly() {
    let p = Project::new();
    p.workflow("w.toml", SLOW_THEN_GATE);
    let child = p.spawn(&["run", "w.toml", "--no-wait"]);
    p.wait_for(|| {
        p.store_text()
            .contains("\"node\":\"a\",\"attempt\":1,\"state\":\"running\"")
    });
    std::fs::remove_dir_all(p.dir().join(".ralph-flow")).unwrap();
    let out = child.finish();
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("was deleted while the run was going on"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_state_directory_that_cannot_be_written_leaves_the_run_resumable() {
    let p = Project::new();
    p.workflow("w.toml", SLOW_THEN_GATE);
    let child = p.spawn(&["run", "w.toml", "--no-wait", "--json"]);
    let run = p.wait_for_run();
    p.wait_for(|| {
        p.store_text()
            .contains("\"node\":\"a\",\"attempt\":1,\"state\":\"running\"")
    });
    // The run's records of `a` cannot be written: a directory stands where they go.
    let records = p
        .dir()
        .join(format!(".ralph-flow/runs/{run}/artifacts.jsonl"));
    std::fs::create_dir_all(&records).unwrap();
    let out = child.finish();
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(out.stderr.contains("cannot be written"), "{}", out.stderr);
    std::fs::remove_dir(&records).unwrap();
    let out = p.run(&["resume", &run, "--no-wait", "--json"]);
    assert_eq!(out.code, 75, "resumed up to the gate: {}", out.stderr);
}

/// Every file under a directory with its size and modification time.
fn listing(dir: &std::path::Path) -> Vec<(std::path::PathBuf, u64, std::time::SystemTime)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let m = e.metadata().unwrap();
        if m.is_dir() {
            out.extend(listing(&e.path()));
        } else {
            out.push((e.path(), m.len(), m.modified().unwrap()));
        }
    }
    out.sort();
    out
}

#[test]
fn reading_a_store_changes_nothing() {
    let p = Project::new();
    p.workflow("w.toml", SLOW_THEN_GATE);
    let out = p.run(&["run", "w.toml", "--no-wait", "--json"]);
    assert_eq!(out.code, 75, "{}", out.stderr);
    let run = out.json["run"].as_str().unwrap().to_string();
    let state = p.dir().join(".ralph-flow");
    let before = listing(&state);
    std::thread::sleep(Duration::from_millis(20));
    for args in [
        vec!["runs"],
        vec!["status", run.as_str()],
        vec!["logs", run.as_str()],
    ] {
        let o = p.run(&args);
        assert_eq!(o.code, 0, "{args:?}: {}", o.stderr);
    }
    assert_eq!(
        listing(&state),
        before,
        "a read wrote to the state directory"
    );
}

#[test]
fn a_store_that_lost_its_log_after_a_crash_says_so_and_one_checkpointed_does_not() {
    let p = Project::new();
    p.workflow("w.toml", SLOW_THEN_GATE);
    let child = p.spawn(&["run", "w.toml"]);
    p.wait_for(|| p.store_text().contains("waiting"));
    child.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = child.finish();
    std::fs::remove_file(p.dir().join(".ralph-flow/state.db-wal")).unwrap();
    for args in [vec!["runs"], vec!["run", "w.toml", "--no-wait"]] {
        let out = p.run(&args);
        assert_ne!(out.code, 0, "{args:?}: {}{}", out.stdout, out.stderr);
        assert!(
            out.stderr.contains("lost its write-ahead log"),
            "{}",
            out.stderr
        );
        assert!(!out.stdout.contains("no runs"), "{}", out.stdout);
    }

    // Another program that checkpoints and closes the store after the crash removes the
    // log legitimately: nothing is lost, and nothing is reported.
    let p = Project::new();
    p.workflow("w.toml", SLOW_THEN_GATE);
    let child = p.spawn(&["run", "w.toml"]);
    let run = p.wait_for_run();
    p.wait_for(|| p.store_text().contains("waiting"));
    child.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = child.finish();
    {
        let conn = rusqlite::Connection::open(p.dir().join(".ralph-flow/state.db")).unwrap();
        conn.pragma_update(None, "wal_checkpoint", "TRUNCATE")
            .unwrap();
    }
    assert!(!p.dir().join(".ralph-flow/state.db-wal").exists());
    let out = p.run(&["status", &run]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = p.run(&["resume", &run, "--no-wait"]);
    assert_eq!(out.code, 75, "{}", out.stderr);
}

#[test]
fn a_damaged_store_is_found_before_anything_is_written_to_it() {
    let p = Project::new();
    p.workflow("w.toml", SLOW_THEN_GATE);
    let child = p.spawn(&["run", "w.toml"]);
    p.wait_for(|| p.store_text().contains("waiting"));
    child.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = child.finish();
    // Damage an index's page: the cells, not the page header.
    common::damage_root_page(
        &p.dir().join(".ralph-flow/state.db"),
        "runs_started",
        common::Damage::Cells,
    );
    let out = p.run(&["run", "w.toml", "--no-wait"]);
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(out.stderr.contains("is damaged"), "{}", out.stderr);
    assert!(out.stderr.contains(".recover"), "{}", out.stderr);
}

#[test]
fn template_file_helpers_read_only_the_workspace_unless_told() {
    let p = Project::new();
    p.write("notes.txt", "inside\n");
    std::fs::create_dir_all(p.dir().join("sub")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", p.dir().join("sub/link")).unwrap();
    let flow = |extra: &str| {
        format!(
            r#"name = "helpers"
{extra}
[stages.show]
kind = "command"
argv = ["echo", "{{{{ read_file('notes.txt') | trim }}}} {{{{ file_exists('../../../../etc/passwd') }}}} {{{{ file_exists('/etc/hostname') }}}} {{{{ glob('sub/*') | length }}}}"]
[stages.outside]
kind = "command"
needs = ["show"]
argv = ["echo", "{{{{ read_file('/etc/hostname') | length > 0 }}}}"]
"#
        )
    };
    p.workflow("w.toml", &flow(""));
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert_eq!(
        out.json["outputs"]["show"]["stdout"],
        "inside False False 0\n"
    );
    let message = out.json["message"].as_str().unwrap();
    assert!(
        message.contains("/etc/hostname is outside the workspace")
            && message.contains("file_roots"),
        "{message}"
    );
    // Named roots are readable, symbolic links into them too.
    p.workflow("w.toml", &flow("file_roots = [\"/etc\"]"));
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.json["outputs"]["show"]["stdout"],
        "inside True True 1\n"
    );
    assert_eq!(out.json["outputs"]["outside"]["stdout"], "True\n");
}

#[test]
fn an_endless_prompt_file_is_refused_without_reading_it_all() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        "name = \"zero\"\n[agents.a]\nkind = \"command\"\ncommand = [\"cat\"]\n[stages.s]\nkind = \"agent\"\nagent = \"a\"\nprompt_file = \"/dev/zero\"\n",
    );
    let out = p.run(&["check", "w.toml"]);
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(out.stderr.contains("larger than 16 MiB"), "{}", out.stderr);
}

#[test]
fn a_subflows_agent_keys_are_masked_too() {
    const KEY: &str = "sk-subflow-key-9a8b7c6d5e4f";
    let p = Project::new();
    // The subflow declares an HTTP agent with its own key variable; one of its commands
    // prints the key.
    p.write(
        "sub.toml",
        r#"name = "sub"
[agents.api]
kind = "openai"
base_url = "http://127.0.0.1:9/v1"
model = "m"
api_key_env = "SUB_KEY"

[stages.leak]
kind = "command"
argv = ["sh", "-c", "echo key=$SUB_KEY"]
"#,
    );
    p.workflow(
        "w.toml",
        "name = \"main\"\n[stages.sub]\nkind = \"subflow\"\nworkflow = \"sub.toml\"\n",
    );
    let out = p.run_env(&["run", "w.toml", "--json"], &[("SUB_KEY", KEY)]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let status = p.run_env(&["status", "--json"], &[("SUB_KEY", KEY)]);
    for (what, text) in [
        ("the run's output", format!("{}{}", out.stdout, out.stderr)),
        ("status", status.stdout.clone()),
        ("the store", p.store_text()),
    ] {
        assert!(
            !text.contains(KEY),
            "{what} holds the subflow's key:\n{text}"
        );
    }
    assert!(
        p.store_text().contains("key=[REDACTED]"),
        "the command ran and its output was masked"
    );
}
