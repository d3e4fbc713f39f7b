//! The golden path in CI: the shipped presets wiggum-review, spider and cairo-driver-reviewer
//! run through the REAL claude, codex and gemini CLIs, each from `ralph-flow init PRESET` in
//! a fresh git repository, against tests/realcli/scripted_mock.py, a local mock of their model
//! APIs that plays a script of real tool calls: the CLIs really write files, run the tests and
//! commit, and every run must reach its preset's success exit (code 0). The presets' agents
//! are claude and codex: for gemini, golden.sh replaces them in the init'd workflow with
//! gemini agents of the same names (`--model` given, the preset's permissions), which are
//! sent no output schema and answer JSON as text, as the prompts ask.
//!
//! Each run is tests/realcli/golden.sh, offline: in a network namespace with only loopback
//! (and a pid namespace, so that killing it kills everything it started). The test then checks
//! what the run left: the files the script wrote, the commits it made, the gates it answered,
//! and that the usage ralph-flow recorded (`ralph-flow status RUN --json`) is the sum of what
//! the mock reported, in total and per stage.
//!
//! The ACP forms of the presets (`ralph-flow init wiggum-review-acp`) run the same way through
//! the REAL claude-agent-acp (`golden.sh acp ...`), ralph-flow answering each of its
//! permission requests from the preset's policy, which allows commits and denies pushes. The
//! mock plays the script's ACP variant, in which the agent also asks to `git push` to the
//! repository's remote: the push must be denied, recorded with the rule that denied it (a
//! `permission` event of the stage, the attempt's denied.txt), the remote must not move, and
//! the run must still reach the preset's success exit.
//!
//! Skipped (saying SKIPPED, passing) when the real CLIs are not installed
//! (tests/realcli/install.sh), python3 is missing, or no network namespace can be made
//! (`unshare --net`, as root or with `--map-root-user`); failed instead when
//! RALPH_FLOW_REQUIRE_GOLDEN is set. A failed run's directory is kept and named in the
//! message: the repository, run.err, script.log (what the mock answered), mock.log (every
//! request), status.json and the run's artifacts under repo/.ralph-flow/runs/.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long one preset's run may take (golden.sh stops the run after this): on two cores they
/// take 3 to 17 seconds through claude and codex, 10 to 45 through gemini (about 3 seconds
/// an agent call, most of it gemini starting up).
const RUN_LIMIT: Duration = Duration::from_secs(120);
/// And the whole script, with its set-up and tear-down; past it everything is killed.
const SCRIPT_LIMIT: Duration = Duration::from_secs(150);

/// One run at a time: the runs are timed and the CI machine has two cores.
static SERIAL: Mutex<()> = Mutex::new(());

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Says why the test did nothing, on stderr past the harness's capture; with
/// RALPH_FLOW_REQUIRE_GOLDEN set (CI, once the CLIs are installed) it fails instead.
fn skipped(why: &str) {
    if std::env::var_os("RALPH_FLOW_REQUIRE_GOLDEN").is_some() {
        panic!("RALPH_FLOW_REQUIRE_GOLDEN is set, but: {why}");
    }
    let _ = writeln!(std::io::stderr(), "SKIPPED: {why}");
}

fn real_cli_bin() -> Option<PathBuf> {
    let dir = std::env::var_os("RALPH_FLOW_REAL_CLI_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/realcli"));
    let bin = dir.join("node_modules/.bin");
    ["claude", "codex", "gemini"]
        .iter()
        .all(|c| bin.join(c).exists())
        .then_some(bin)
}

/// The `unshare` arguments that make a network namespace with only loopback (and a pid
/// namespace), or why none can be made here.
fn offline_prefix() -> Result<Vec<&'static str>, String> {
    let base = ["--net", "--pid", "--fork", "--kill-child", "--mount-proc"];
    let mut last = String::from("unshare not found");
    for extra in [&[][..], &["--map-root-user"][..]] {
        let args: Vec<&'static str> = extra.iter().chain(base.iter()).copied().collect();
        let out = Command::new("unshare")
            .args(&args)
            .args(["sh", "-c", "ip link set lo up"])
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => return Ok(args),
            Ok(o) => last = String::from_utf8_lossy(&o.stderr).trim().to_string(),
            Err(e) => last = format!("unshare: {e}"),
        }
    }
    Err(last)
}

fn python3() -> bool {
    Command::new("python3")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// What the script leaves behind, from the script itself.
fn expected(preset: &str) -> Value {
    let out = Command::new("python3")
        .arg(root().join("tests/realcli/scripted_mock.py"))
        .args(["--expect", preset])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The last lines of a file, for failure messages.
fn tail(path: &Path, lines: usize) -> String {
    let text = read(path);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn git(repo: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Tokens summed the way ralph-flow records them.
#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
struct Tokens {
    input: u64,
    output: u64,
    cached: u64,
}

impl Tokens {
    fn of_status(usage: &Value) -> Tokens {
        Tokens {
            input: usage["input_tokens"].as_u64().unwrap_or(0),
            output: usage["output_tokens"].as_u64().unwrap_or(0),
            cached: usage["cached_tokens"].as_u64().unwrap_or(0),
        }
    }

    fn add(&mut self, o: Tokens) {
        self.input += o.input;
        self.output += o.output;
        self.cached += o.cached;
    }
}

/// One request the mock answered (a line of its SCRIPT_LOG).
struct Answered {
    api: String,
    stage: Option<String>,
    turn: Option<u64>,
    tools: bool,
    step: Option<u64>,
    did: String,
    last_result: Option<String>,
    last_ok: Option<bool>,
    /// The tool call whose result this request carries is one the script expects the
    /// agent's policy to deny.
    denied_expected: bool,
    violations: Vec<Value>,
    tokens: Tokens,
    line: String,
}

fn answered(work: &Path, cli: &str) -> Vec<Answered> {
    read(&work.join("script.log"))
        .lines()
        .map(|line| {
            let e: Value = serde_json::from_str(line).unwrap();
            // An error answer (a refused schema) reports no usage.
            let u = &e["usage"];
            let (input, output, cached) = (
                u["input"].as_u64().unwrap_or(0),
                u["output"].as_u64().unwrap_or(0),
                u["cached"].as_u64().unwrap_or(0),
            );
            Answered {
                api: e["api"].as_str().unwrap_or("").to_string(),
                stage: e["stage"].as_str().map(String::from),
                turn: e["turn"].as_u64(),
                tools: e["tools"].as_bool().unwrap_or(false),
                step: e["step"].as_u64(),
                did: e["did"].as_str().unwrap_or("").to_string(),
                last_result: e["last_result"].as_str().map(String::from),
                last_ok: e["last_ok"].as_bool(),
                denied_expected: e["denied_expected"].as_bool().unwrap_or(false),
                violations: e["schema_violations"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
                // ralph-flow's input tokens hold the cached ones: OpenAI's input_tokens and
                // Gemini's promptTokenCount (gemini's stats `prompt`) do, Anthropic's count
                // them apart (cache_read_input_tokens).
                // Through ACP, claude-agent-acp reports Anthropic's input_tokens with the cache
                // reads apart too (its `totalTokens` adds them): ralph-flow adds them in, as
                // for the claude CLI.
                tokens: Tokens {
                    input: if cli == "claude" || cli == "acp" {
                        input + cached
                    } else {
                        input
                    },
                    output,
                    cached,
                },
                line: line.to_string(),
            }
        })
        .collect()
}

fn golden(cli: &str, preset: &str) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(bin) = real_cli_bin() else {
        skipped("real claude, codex and gemini not installed (run tests/realcli/install.sh)");
        return;
    };
    if cli == "acp" && !bin.join("claude-agent-acp").exists() {
        skipped(&format!(
            "claude-agent-acp not installed in {} (run tests/realcli/install.sh)",
            bin.display()
        ));
        return;
    }
    if !python3() {
        skipped("python3 not found (the mock is a Python script)");
        return;
    }
    let unshare = match offline_prefix() {
        Ok(args) => args,
        Err(why) => {
            skipped(&format!("no network namespace for an offline run: {why}"));
            return;
        }
    };
    // Kept when the run fails, for a look; removed when it passes.
    let work = tempfile::Builder::new()
        .prefix(&format!("golden-{cli}-{preset}-"))
        .tempdir()
        .unwrap()
        .keep();
    let work = work.as_path();
    let started = Instant::now();
    let mut child = Command::new("unshare")
        .args(&unshare)
        .args(["sh", "-c", "ip link set lo up && sh \"$0\" \"$@\""])
        .arg(root().join("tests/realcli/golden.sh"))
        .args([cli, preset])
        .arg(work)
        .env("RALPH_FLOW", env!("CARGO_BIN_EXE_ralph-flow"))
        .env("REALCLI_BIN", &bin)
        .env("GOLDEN_TIMEOUT", RUN_LIMIT.as_secs().to_string())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(work.join("golden.out")).unwrap())
        .stderr(std::fs::File::create(work.join("golden.err")).unwrap())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > SCRIPT_LIMIT {
            // Killing unshare kills its child (--kill-child), pid 1 of the namespace, and so
            // everything in it.
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let took = started.elapsed();
    let _ = writeln!(std::io::stderr(), "golden path {cli} {preset}: {took:.1?}");
    let context = || {
        format!(
            "\n--- golden.sh (exit {:?}):\n{}{}\n--- ralph-flow run stderr (tail):\n{}\n--- run.out:\n{}\n--- mock answers (tail):\n{}\n--- mock stderr:\n{}\n--- work dir kept at {}",
            status.and_then(|s| s.code()),
            tail(&work.join("golden.out"), 20),
            tail(&work.join("golden.err"), 20),
            tail(&work.join("run.err"), 40),
            tail(&work.join("run.out"), 20),
            tail(&work.join("script.log"), 8)
                .lines()
                .map(|l| l.chars().take(600).collect::<String>())
                .collect::<Vec<_>>()
                .join("\n"),
            tail(&work.join("mock.err"), 20),
            work.display()
        )
    };
    let fail = |what: String| -> ! {
        let _ = std::fs::write(work.join("FAILED"), &what);
        panic!("{cli} {preset}: {what}{}", context());
    };
    match status {
        None => fail(format!("golden.sh took more than {SCRIPT_LIMIT:?}: killed")),
        Some(s) if !s.success() => fail("golden.sh failed".into()),
        Some(_) => {}
    }
    let code = read(&work.join("exit")).trim().to_string();
    if code != "0" {
        fail(format!(
            "`ralph-flow run` exited {code}, not 0 (the preset's success exit)"
        ));
    }
    if let Err(what) = check(cli, preset, work) {
        fail(what);
    }
    let _ = std::fs::remove_dir_all(work);
}

/// `Err(what differs)` unless `got == want`.
fn same<T: PartialEq + std::fmt::Debug>(got: T, want: T, what: &str) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}:\n   got: {got:?}\n  want: {want:?}"))
    }
}

fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(what()) }
}

/// What a successful run must have left; `Err` says what is not so.
fn check(cli: &str, preset: &str, work: &Path) -> Result<(), String> {
    let repo = work.join("repo");
    let expect = expected(preset);

    // The files the script wrote (for cairo: ralph-flow's write_code, from the driver's answer).
    for (path, content) in expect["files"].as_object().unwrap() {
        let got = std::fs::read_to_string(repo.join(path))
            .map_err(|e| format!("{path} was not written: {e}"))?;
        same(
            got.as_str(),
            content.as_str().unwrap(),
            &format!("the content of {path}"),
        )?;
    }

    // The commits the script made, oldest first, after the test's own.
    let log = git(&repo, &["log", "--reverse", "--format=%s"]);
    let mut want = vec![format!("Start: {preset}")];
    want.extend(
        expect["commits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap().to_string()),
    );
    same(
        log.lines().map(String::from).collect(),
        want,
        "the commits (git log)",
    )?;

    // The mock: every request with tools belongs to a stage and turn of the script, every
    // command and patch the script ran succeeded, every structured answer fit the schema the
    // CLI sent, and every turn of the script reached its final answer.
    let answers = answered(work, cli);
    ensure(!answers.is_empty(), || "the mock answered nothing".into())?;
    // Only the CLI under test talked to the mock (spider's agents fall back to each other).
    let api = match cli {
        "claude" | "acp" => "anthropic",
        "codex" => "openai",
        _ => "gemini",
    };
    for a in &answers {
        ensure(a.api == api, || {
            format!(
                "a request of the other CLI ({}, a fallback?): {}",
                a.api, a.line
            )
        })?;
        // gemini's model router asks before the turn unless the agent gives `--model`; its
        // usage would belong to no stage of the script.
        ensure(a.did != "side-request", || {
            format!("a side request (gemini's model router?): {}", a.line)
        })?;
        ensure(
            !(a.tools && (a.stage.is_none() || a.turn.is_none())),
            || format!("a request the script does not know: {}", a.line),
        )?;
        if a.denied_expected {
            // The push the policy denies: the agent must have been told no.
            ensure(a.last_ok == Some(false), || {
                format!(
                    "a tool call the policy must deny was not refused: {}",
                    a.line
                )
            })?;
        } else {
            ensure(a.last_ok != Some(false), || {
                format!("a tool call of the script failed: {}", a.line)
            })?;
        }
        ensure(a.violations.is_empty(), || {
            format!("an answer does not fit the schema the CLI sent: {}", a.line)
        })?;
    }
    for t in expect["turns"].as_array().unwrap() {
        let (stage, turn) = (t[0].as_str().unwrap(), t[1].as_u64().unwrap());
        let finals = answers
            .iter()
            .filter(|a| a.stage.as_deref() == Some(stage) && a.turn == Some(turn))
            .filter(|a| !a.did.contains(':') || a.did == "text:after-structured")
            .count();
        ensure(finals >= 1, || {
            format!("turn {turn} of stage {stage} never gave its final answer")
        })?;
    }

    // Usage: what ralph-flow recorded is what the mock reported, in total and per stage.
    let status: Value = serde_json::from_str(&read(&work.join("status.json")))
        .map_err(|e| format!("status.json: {e}"))?;
    same(
        &status["status"],
        &Value::from("finished"),
        "the run's status",
    )?;
    same(
        &status["exit"][1],
        &Value::from(0),
        "the run's exit code in the store",
    )?;
    let mut reported = Tokens::default();
    let mut per_stage: BTreeMap<String, Tokens> = BTreeMap::new();
    let mut seen = std::collections::HashSet::new();
    for a in &answers {
        // claude-agent-acp reports its turn's usage (`session/prompt`'s `usage`) without the
        // requests the Agent SDK makes beside the turn: one without tools as a session
        // starts (its `_meta.quota.model_usage` holds it), and at times the turn's last
        // request made again (the same stage, turn, step and tool result).
        if cli == "acp"
            && ((a.stage.is_none() && !a.tools)
                || !seen.insert((
                    a.stage.clone(),
                    a.turn,
                    a.step,
                    a.did.clone(),
                    a.last_result.clone(),
                )))
        {
            continue;
        }
        reported.add(a.tokens);
        if let Some(s) = &a.stage {
            per_stage.entry(s.clone()).or_default().add(a.tokens);
        }
    }
    same(
        Tokens::of_status(&status["total"]),
        reported,
        "the run's usage against the mock's",
    )?;
    for (stage, tokens) in &per_stage {
        let mut recorded = Tokens::default();
        for n in status["nodes"].as_array().unwrap() {
            if n["node"] == stage.as_str() {
                recorded.add(Tokens::of_status(&n["usage"]));
            }
        }
        same(
            recorded,
            *tokens,
            &format!("the usage of stage {stage} against the mock's"),
        )?;
    }

    // The output ralph-flow settled for each stage that answers JSON is the script's answer,
    // as written: the nulls a strict schema made the mock add are gone again.
    for (stage, answers) in expect["json_answers"].as_object().unwrap() {
        let answers = answers.as_array().unwrap();
        let mut settled = 0;
        for n in status["nodes"].as_array().unwrap() {
            if n["node"] == stage.as_str() && n["state"] == "done" {
                settled += 1;
                ensure(answers.contains(&n["output"]), || {
                    format!(
                        "the output of {}/{stage} is not the script's answer: {}",
                        n["scope"], n["output"]
                    )
                })?;
            }
        }
        ensure(settled > 0, || {
            format!("no settled output of stage {stage}")
        })?;
    }

    // A fresh `init` runs without a warning.
    let warnings: Vec<String> = read(&work.join("run.err"))
        .lines()
        .filter(|l| l.contains('⚠'))
        .map(String::from)
        .collect();
    same(warnings, Vec::new(), "the warnings of `ralph-flow run`")?;

    if cli == "acp" {
        denied_push(preset, work, &repo, &answers, &status)?;
    }

    // What is particular to each preset.
    match preset {
        "spider" => same(
            read(&work.join("gates")).lines().collect::<Vec<_>>(),
            vec!["specify_loop#1/approve_spec", "plan_loop#1/approve_plan"],
            "the gates answered with `ralph-flow approve`",
        ),
        "cairo-driver-reviewer" => same(
            read(&work.join("scarb.log")).lines().collect::<Vec<_>>(),
            vec!["scarb fmt --check", "scarb build", "scarb test"],
            "the verify step's scarb calls",
        ),
        "wiggum-review" => same(
            git(&repo, &["status", "--porcelain", "--", "src"]),
            String::new(),
            "the reviewed tree (git status --porcelain -- src)",
        ),
        _ => Ok(()),
    }
}

/// Through ACP: the agent's `git push` was asked, denied by the policy's rule, recorded as a
/// `permission` event of its stage and in the attempt's denied.txt, and never ran (the
/// remote's main did not move).
fn denied_push(
    preset: &str,
    work: &Path,
    repo: &Path,
    answers: &[Answered],
    status: &Value,
) -> Result<(), String> {
    ensure(answers.iter().any(|a| a.denied_expected), || {
        "the script's push was never answered (did the agent ask for it?)".into()
    })?;
    let before = read(&work.join("remote_before"));
    ensure(!before.trim().is_empty(), || {
        "the remote's main before the run was not recorded".into()
    })?;
    same(
        read(&work.join("remote_after")).trim(),
        before.trim(),
        "the remote's main after the run (a denied push must not move it)",
    )?;
    let rule = "deny `git push *`";
    // The stage whose agent pushes, and the policy of the preset's ACP form.
    let (stage, policy) = match preset {
        "spider" => ("implement", "spider"),
        _ => ("review", "wiggum"),
    };
    // The event of the decision, with its rule.
    let id = status["id"].as_str().unwrap_or_default();
    let rf = env!("CARGO_BIN_EXE_ralph-flow");
    let out = Command::new(rf)
        .args(["logs", id, "--json"])
        .current_dir(repo)
        .output()
        .unwrap();
    let logs: Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "`ralph-flow logs {id} --json`: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let permissions: Vec<String> = logs["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["kind"] == "permission")
        .map(|e| {
            format!(
                "{}: {}",
                e["node"],
                e["message"].as_str().unwrap_or_default()
            )
        })
        .collect();
    ensure(
        permissions.iter().any(|m| {
            m.starts_with(&format!("{stage:?}"))
                && m.contains("git push origin main")
                && m.contains(&format!("denied by policy `{policy}`"))
                && m.contains(rule)
        }),
        || {
            format!(
                "no `permission` event of {stage} denies the push by the policy's rule {rule}; the permission events:\n{}",
                permissions.join("\n")
            )
        },
    )?;
    // denied.txt among the attempt's records.
    let out = Command::new(rf)
        .args(["logs", id, "--stage", stage, "--json"])
        .current_dir(repo)
        .output()
        .unwrap();
    let records: Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "`ralph-flow logs {id} --stage {stage} --json`: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let denied: Vec<(&String, &Value)> = records["records"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(path, _)| path.ends_with("/denied.txt"))
        .collect();
    ensure(
        denied.iter().any(|(_, text)| {
            let text = text.as_str().unwrap_or_default();
            text.contains("git push origin main") && text.contains(rule)
        }),
        || format!("no denied.txt of {stage} names the push and the rule {rule}: {denied:?}"),
    )
}

#[test]
fn wiggum_review_through_claude_agent_acp() {
    golden("acp", "wiggum-review");
}

#[test]
fn spider_through_claude_agent_acp() {
    golden("acp", "spider");
}

#[test]
fn wiggum_review_through_codex() {
    golden("codex", "wiggum-review");
}

#[test]
fn cairo_driver_reviewer_through_codex() {
    golden("codex", "cairo-driver-reviewer");
}

#[test]
fn spider_through_codex() {
    golden("codex", "spider");
}

#[test]
fn wiggum_review_through_claude() {
    golden("claude", "wiggum-review");
}

#[test]
fn cairo_driver_reviewer_through_claude() {
    golden("claude", "cairo-driver-reviewer");
}

#[test]
fn spider_through_claude() {
    golden("claude", "spider");
}

#[test]
fn wiggum_review_through_gemini() {
    golden("gemini", "wiggum-review");
}

#[test]
fn cairo_driver_reviewer_through_gemini() {
    golden("gemini", "cairo-driver-reviewer");
}

#[test]
fn spider_through_gemini() {
    golden("gemini", "spider");
}
