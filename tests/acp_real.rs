//! The real ACP agents (claude-agent-acp, gemini --acp, qwen --acp, opencode acp, installed
//! by tests/realcli/install.sh, against tests/realcli/mock_api.py) and the fake ACP agent
//! (tests/fakes/acp/agent.py) replaying their captured sessions (tests/fakes/captures/acp,
//! tests/realcli/acp_capture.py), driven by a small ACP client here that answers as
//! ralph-flow's policy would: the commit allowed, the push rejected. Checks the answer, the
//! permission requests, the side effects done only when allowed (a denied `git push` never
//! reaches the bare remote) and the contract the fake holds a client to. Needs python3
//! (skipped without it); the real agents are skipped unless installed (in target/realcli or
//! RALPH_FLOW_REAL_CLI_DIR), and required with RALPH_FLOW_REQUIRE_REAL_CLI.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use common::Project;
use serde_json::{Value, json};

fn fake() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fakes/acp/agent.py")
}

fn have_python() -> bool {
    let ok = Command::new("python3")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: no python3 for the fake ACP agent"
        );
    }
    ok
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A git repository with README.md committed and a bare `origin` next to it, as the
/// captures had: (the case directory, the workspace).
fn workspace() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let cwd = d.path().join("cwd");
    let origin = d.path().join("origin.git");
    std::fs::create_dir(&cwd).unwrap();
    git(
        d.path(),
        &["init", "-q", "--bare", origin.to_str().unwrap()],
    );
    git(&cwd, &["init", "-q"]);
    git(&cwd, &["config", "user.email", "t@t"]);
    git(&cwd, &["config", "user.name", "t"]);
    std::fs::write(cwd.join("README.md"), "# Mock project\n").unwrap();
    git(&cwd, &["add", "-A"]);
    git(&cwd, &["commit", "-q", "-m", "init"]);
    git(&cwd, &["remote", "add", "origin", origin.to_str().unwrap()]);
    git(&cwd, &["push", "-q", "origin", "HEAD"]);
    (d, cwd)
}

/// How the client decides a permission request: from its tool call, "allow", "reject" or
/// an optionId to send as it is.
type Decide = dyn Fn(&Value) -> String;

struct Client {
    child: Child,
    stdin: ChildStdin,
    rx: Receiver<Value>,
    cwd: PathBuf,
    next: u64,
    /// Every message the fake sent.
    seen: Vec<Value>,
    /// The permission requests' tool calls and the decisions.
    permissions: Vec<(Value, String)>,
}

impl Client {
    fn start(cwd: &Path, case: &str, env: &[(&str, &str)]) -> Client {
        let mut cmd = Command::new("python3");
        cmd.arg(fake())
            .env("FAKE_ACP_CASE", case)
            .env_remove("FAKE_MODE");
        for (k, v) in env {
            cmd.env(k, v);
        }
        Client::spawn(cmd, cwd)
    }

    fn spawn(mut cmd: Command, cwd: &Path) -> Client {
        cmd.current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let v = serde_json::from_str(&line).unwrap_or(json!({ "raw": line }));
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        Client {
            child,
            stdin,
            rx,
            cwd: cwd.to_path_buf(),
            next: 0,
            seen: vec![],
            permissions: vec![],
        }
    }

    fn send(&mut self, v: &Value) {
        // The fake may have exited (a contract it enforces): its exit code tells.
        let _ = writeln!(self.stdin, "{v}");
        let _ = self.stdin.flush();
    }

    /// Sends a request and serves the fake's requests until its answer; None when the fake
    /// ends first.
    fn request(&mut self, method: &str, params: Value, decide: &Decide) -> Option<Value> {
        let id = self.next;
        self.next += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            // A real agent's turn takes seconds (opencode's about 25).
            let msg = self.rx.recv_timeout(Duration::from_secs(120)).ok()?;
            self.seen.push(msg.clone());
            if msg.get("method").is_none() && msg["id"] == json!(id) {
                return Some(msg);
            }
            if let (Some(m), Some(rid)) = (msg["method"].as_str(), msg.get("id")) {
                let answer = match self.serve(m, &msg["params"], decide) {
                    Some(result) => json!({"jsonrpc": "2.0", "id": rid, "result": result}),
                    // As ralph-flow answers what it does not serve (qwen's craft/drainMidTurnQueue).
                    None => {
                        json!({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": format!("Method not found: {m}")}})
                    }
                };
                self.send(&answer);
            }
        }
    }

    fn serve(&mut self, method: &str, params: &Value, decide: &Decide) -> Option<Value> {
        Some(match method {
            "session/request_permission" => {
                let d = decide(&params["toolCall"]);
                let kinds: &[&str] = match d.as_str() {
                    "allow" => &["allow_once", "allow_always"],
                    "reject" => &["reject_once", "reject_always"],
                    _ => &[],
                };
                let options = params["options"].as_array().cloned().unwrap_or_default();
                let id = kinds
                    .iter()
                    .find_map(|k| options.iter().find(|o| o["kind"] == *k))
                    .map(|o| o["optionId"].clone())
                    .unwrap_or(json!(d));
                self.permissions.push((params["toolCall"].clone(), d));
                json!({"outcome": {"outcome": "selected", "optionId": id}})
            }
            "fs/read_text_file" => {
                let path = PathBuf::from(params["path"].as_str().unwrap());
                assert!(
                    path.starts_with(&self.cwd),
                    "read outside the workspace: {path:?}"
                );
                json!({"content": std::fs::read_to_string(path).unwrap_or_default()})
            }
            "fs/write_text_file" => {
                let path = PathBuf::from(params["path"].as_str().unwrap());
                assert!(
                    path.starts_with(&self.cwd),
                    "write outside the workspace: {path:?}"
                );
                std::fs::write(path, params["content"].as_str().unwrap()).unwrap();
                Value::Null
            }
            _ => return None,
        })
    }

    fn initialize(&mut self) {
        let init = self.request(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": true, "writeTextFile": true}, "terminal": false}}),
            &|_| "allow".into(),
        );
        assert_eq!(init.unwrap()["result"]["protocolVersion"], 1);
    }

    fn session(&mut self) -> String {
        self.initialize();
        let cwd = self.cwd.to_str().unwrap().to_string();
        let new = self.request(
            "session/new",
            json!({"cwd": cwd, "mcpServers": []}),
            &|_| "allow".into(),
        );
        let new = new.expect("an answer to session/new");
        new["result"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("session/new: {new}"))
            .to_string()
    }

    fn prompt(&mut self, sid: &str, decide: &Decide) -> Option<Value> {
        self.request(
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": "Write notes.txt, commit, push."}]}),
            decide,
        )
    }

    /// The text of the agent_message_chunk notifications, joined.
    fn text(&self) -> String {
        self.seen
            .iter()
            .filter(|m| m["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
            .filter_map(|m| m["params"]["update"]["content"]["text"].as_str())
            .collect()
    }

    /// Closes the fake's input; its exit code and stderr.
    fn finish(mut self) -> (i32, String) {
        drop(self.stdin);
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        let status = self.child.wait().unwrap();
        (status.code().unwrap_or(-1), err)
    }
}

fn policy(tool_call: &Value) -> String {
    if tool_call.to_string().contains("git push") {
        "reject"
    } else {
        "allow"
    }
    .into()
}

/// The agents the captures hold, and whether a rejected permission lets the turn go on to
/// its answer (claude, gemini) or ends it without one (qwen, opencode).
const AGENTS: [(&str, bool); 4] = [
    ("claude", true),
    ("gemini", true),
    ("qwen", false),
    ("opencode", false),
];

/// claude-agent-acp and qwen ask the client only in their `default` mode.
fn set_mode(c: &mut Client, agent: &str, sid: &str) {
    if matches!(agent, "claude" | "qwen") {
        let r = c.request(
            "session/set_mode",
            json!({"sessionId": sid, "modeId": "default"}),
            &|_| "allow".into(),
        );
        assert_eq!(r.unwrap()["result"], json!({}), "{agent}");
    }
}

/// Every agent (claude runs commands and writes itself, the others write through
/// fs/write_text_file): the commit allowed is made, the push rejected never reaches origin.
#[test]
fn commit_allowed_push_denied() {
    if !have_python() {
        return;
    }
    for (agent, goes_on) in AGENTS {
        let (d, cwd) = workspace();
        let reply = r#"{"verdict":"done"}"#;
        let mut c = Client::start(
            &cwd,
            &format!("{agent}/edit_commit_push"),
            &[("FAKE_REPLY", reply)],
        );
        let sid = c.session();
        set_mode(&mut c, agent, &sid);
        let r = c.prompt(&sid, &policy).expect("the prompt's answer");
        assert_eq!(r["result"]["stopReason"], "end_turn", "{agent}: {r}");
        assert_eq!(c.text().contains(reply), goes_on, "{agent}: {}", c.text());
        let decided: Vec<(String, String)> = c
            .permissions
            .iter()
            .map(|(tc, d)| (tc["kind"].as_str().unwrap_or("").to_string(), d.clone()))
            .collect();
        assert_eq!(
            decided,
            [
                ("edit", "allow"),
                ("execute", "allow"),
                ("execute", "reject")
            ]
            .map(|(k, d)| (k.to_string(), d.to_string())),
            "{agent}"
        );
        assert!(
            c.permissions[2]
                .0
                .to_string()
                .contains("git push origin HEAD"),
            "{agent}"
        );
        let (code, err) = c.finish();
        assert_eq!(code, 0, "{agent}: {err}");
        assert_eq!(
            std::fs::read_to_string(cwd.join("notes.txt")).unwrap(),
            "written by the mock model\n"
        );
        assert_eq!(
            git(&cwd, &["log", "--format=%s"]),
            "add notes\ninit\n",
            "{agent}"
        );
        assert_eq!(
            git(&d.path().join("origin.git"), &["log", "--format=%s"]),
            "init\n",
            "{agent}: the denied push ran"
        );
    }
}

/// Allowed, the push does reach origin: the check above can fail.
#[test]
fn push_allowed_reaches_origin() {
    if !have_python() {
        return;
    }
    for (agent, _) in AGENTS {
        let (d, cwd) = workspace();
        let mut c = Client::start(&cwd, &format!("{agent}/edit_commit_push"), &[]);
        let sid = c.session();
        set_mode(&mut c, agent, &sid);
        let r = c.prompt(&sid, &|_| "allow".into()).unwrap();
        assert_eq!(r["result"]["stopReason"], "end_turn");
        assert_eq!(c.finish().0, 0);
        assert_eq!(
            git(&d.path().join("origin.git"), &["log", "--format=%s"]),
            "add notes\ninit\n",
            "{agent}"
        );
    }
}

/// A decision no capture has: the fake stops, exit 3, and runs nothing.
#[test]
fn decision_without_capture_fails() {
    if !have_python() {
        return;
    }
    let caps = tempfile::tempdir().unwrap();
    std::fs::create_dir(caps.path().join("claude")).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fakes/captures/acp/claude/edit_commit_push.jsonl");
    std::fs::copy(src, caps.path().join("claude/edit_commit_push.jsonl")).unwrap();
    let (_d, cwd) = workspace();
    let mut c = Client::start(
        &cwd,
        "claude/edit_commit_push",
        &[("FAKE_ACP_CAPTURES", caps.path().to_str().unwrap())],
    );
    let sid = c.session();
    c.request(
        "session/set_mode",
        json!({"sessionId": sid, "modeId": "default"}),
        &|_| "allow".into(),
    );
    assert!(c.prompt(&sid, &|_| "reject".into()).is_none());
    let (code, err) = c.finish();
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("rejected the permission request 1"), "{err}");
    assert!(!cwd.join("notes.txt").exists());
}

/// An optionId that was not offered: exit 2.
#[test]
fn unknown_option_fails() {
    if !have_python() {
        return;
    }
    let (_d, cwd) = workspace();
    let mut c = Client::start(&cwd, "gemini/edit_commit_push", &[]);
    let sid = c.session();
    assert!(c.prompt(&sid, &|_| "yes-please".into()).is_none());
    let (code, err) = c.finish();
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("none of the options offered"), "{err}");
}

/// session/prompt before session/new gets the real agent's error; `hang` ends a turn only
/// on session/cancel, with stopReason `cancelled`.
#[test]
fn unknown_session_and_hang() {
    if !have_python() {
        return;
    }
    let (_d, cwd) = workspace();
    let mut c = Client::start(&cwd, "claude/ok", &[("FAKE_MODE", "hang")]);
    c.initialize();
    let r = c.prompt("nope", &policy).unwrap();
    assert!(r["error"]["code"].is_i64(), "{r}");
    let cwd_s = cwd.to_str().unwrap().to_string();
    let sid = c
        .request(
            "session/new",
            json!({"cwd": cwd_s, "mcpServers": []}),
            &policy,
        )
        .unwrap()["result"]["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    let id = c.next;
    c.next += 1;
    c.send(&json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt", "params": {"sessionId": sid, "prompt": []}}));
    assert!(
        c.rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "hang answered"
    );
    c.send(&json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}}));
    let r = c.rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(
        r,
        json!({"jsonrpc": "2.0", "id": id, "result": {"stopReason": "cancelled"}})
    );
    assert_eq!(c.finish().0, 0);
}

// ---- the real agents ----------------------------------------------------------------------

fn real_cli_bin() -> Option<PathBuf> {
    let dir = std::env::var_os("RALPH_FLOW_REAL_CLI_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/realcli"));
    let bin = dir.join("node_modules/.bin");
    ["claude-agent-acp", "gemini", "qwen", "opencode"]
        .iter()
        .all(|c| bin.join(c).exists())
        .then_some(bin)
}

/// The real agent's argv and environment with `home` as its HOME, pointed at the mock
/// (`base`: its URL with the scenario), as tests/realcli/acp_capture.py runs it.
fn real_agent_setup(
    bin: &Path,
    agent: &str,
    home: &Path,
    base: &str,
) -> (Vec<String>, Vec<(String, String)>) {
    let node_dir = Command::new("sh")
        .args(["-c", "dirname \"$(command -v node)\""])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let exe = |name: &str| bin.join(name).display().to_string();
    let (argv, env): (Vec<String>, Vec<(&str, String)>) = match agent {
        "claude" => (
            vec![exe("claude-agent-acp")],
            vec![
                ("ANTHROPIC_BASE_URL", base.to_string()),
                ("ANTHROPIC_API_KEY", "sk-ant-mock-key".into()),
                ("CLAUDE_CODE_MAX_RETRIES", "0".into()),
                ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
                // With IS_SANDBOX set (but to 1), claude-agent-acp refuses session/new as
                // root ("bypass_root"); empty, it does not count.
                ("IS_SANDBOX", String::new()),
            ],
        ),
        "gemini" => {
            std::fs::create_dir_all(home.join(".gemini")).unwrap();
            std::fs::write(
                home.join(".gemini/settings.json"),
                r#"{"security":{"auth":{"selectedType":"gemini-api-key"}},"general":{"maxAttempts":1}}"#,
            )
            .unwrap();
            (
                vec![exe("gemini"), "--acp".into()],
                vec![
                    ("GEMINI_API_KEY", "mock-key".into()),
                    ("GOOGLE_GEMINI_BASE_URL", base.to_string()),
                    ("GEMINI_CLI_TRUST_WORKSPACE", "true".into()),
                ],
            )
        }
        "qwen" => {
            std::fs::create_dir_all(home.join(".qwen")).unwrap();
            std::fs::write(
                home.join(".qwen/settings.json"),
                r#"{"model":{"generationConfig":{"maxRetries":0}}}"#,
            )
            .unwrap();
            (
                vec![exe("qwen"), "--acp".into()],
                vec![
                    ("OPENAI_API_KEY", "mock-key".into()),
                    ("OPENAI_BASE_URL", format!("{base}/v1")),
                    ("OPENAI_MODEL", "qwen-mock".into()),
                ],
            )
        }
        _ => {
            std::fs::create_dir_all(home.join(".config/opencode")).unwrap();
            std::fs::write(
                home.join(".config/opencode/opencode.json"),
                format!(
                    r#"{{"provider":{{"mock":{{"npm":"@ai-sdk/openai-compatible","name":"Mock","options":{{"baseURL":"{base}/v1","apiKey":"mock-key"}},"models":{{"mock-model":{{"name":"Mock"}}}}}}}},"model":"mock/mock-model","autoupdate":false,"share":"disabled"}}"#
                ),
            )
            .unwrap();
            (
                vec![exe("opencode"), "acp".into()],
                // opencode's own default allows everything without asking.
                vec![(
                    "OPENCODE_PERMISSION",
                    r#"{"edit":"ask","bash":"ask","webfetch":"ask","external_directory":"ask"}"#
                        .into(),
                )],
            )
        }
    };
    let mut env: Vec<(String, String)> = env.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    env.push(("HOME".into(), home.display().to_string()));
    env.push((
        "PATH".into(),
        format!("{node_dir}:/usr/local/bin:/usr/bin:/bin"),
    ));
    (argv, env)
}

/// The real agent's command, with nothing of this process's environment but its own, as
/// the captures ran.
fn real_agent(bin: &Path, agent: &str, d: &Path, base: &str) -> Command {
    let (argv, env) = real_agent_setup(bin, agent, &d.join("home"), base);
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).env_clear().envs(env);
    cmd
}

/// Each real agent, the commit allowed and the push rejected by the client: the commit is
/// made, the push never reaches origin, and the permission requests are those the fake
/// replays (same kinds and order). claude and gemini go on to the mock's answer.
#[test]
fn real_agents_commit_allowed_push_denied() {
    if !have_python() {
        return;
    }
    let Some(bin) = real_cli_bin() else {
        assert!(
            std::env::var_os("RALPH_FLOW_REQUIRE_REAL_CLI").is_none(),
            "the real ACP agents are required here: run tests/realcli/install.sh"
        );
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: the real ACP agents are not installed (tests/realcli/install.sh)"
        );
        return;
    };
    let mock = common::MockApi::start().expect("the mock API");
    for (agent, goes_on) in AGENTS {
        let (d, cwd) = workspace();
        std::fs::create_dir(d.path().join("home")).unwrap();
        let base = format!("http://127.0.0.1:{}/s/acp_edit", mock.port);
        let mut c = Client::spawn(real_agent(&bin, agent, d.path(), &base), &cwd);
        let sid = c.session();
        set_mode(&mut c, agent, &sid);
        let r = c
            .prompt(&sid, &policy)
            .unwrap_or_else(|| panic!("{agent}: no answer to session/prompt"));
        assert_eq!(r["result"]["stopReason"], "end_turn", "{agent}: {r}");
        assert_eq!(
            c.text().contains("MOCK-REPLY-4F7"),
            goes_on,
            "{agent}: {}",
            c.text()
        );
        let kinds: Vec<String> = c
            .permissions
            .iter()
            .map(|(tc, d)| format!("{} {d}", tc["kind"].as_str().unwrap_or("")))
            .collect();
        assert_eq!(
            kinds,
            ["edit allow", "execute allow", "execute reject"],
            "{agent}"
        );
        assert!(
            c.permissions[2]
                .0
                .to_string()
                .contains("git push origin HEAD"),
            "{agent}"
        );
        let (code, err) = c.finish();
        assert_eq!(code, 0, "{agent}: {err}");
        assert_eq!(
            std::fs::read_to_string(cwd.join("notes.txt")).unwrap(),
            "written by the mock model\n",
            "{agent}"
        );
        assert_eq!(
            git(&cwd, &["log", "--format=%s"]),
            "add notes\ninit\n",
            "{agent}"
        );
        assert_eq!(
            git(&d.path().join("origin.git"), &["log", "--format=%s"]),
            "init\n",
            "{agent}: the denied push ran"
        );
    }
}

// ---- whole workflows ---------------------------------------------------------------------

/// A workflow whose one stage asks an `acp` agent (`argv`, `env`) to write, commit and push,
/// under `permissions = "edit"`: the write allowed, the commit and the push denied.
fn edit_workflow(argv: &[String], env: &[(String, String)]) -> String {
    let quote = |v: &str| format!("'{v}'");
    let command: Vec<String> = argv.iter().map(|a| quote(a)).collect();
    let env: Vec<String> = env
        .iter()
        .map(|(k, v)| format!("{k} = {}", quote(v)))
        .collect();
    format!(
        r#"name = "acp-real"

[agents.main]
kind = "acp"
command = [{}]
env = {{ {} }}
permissions = "edit"
timeout = "170s"

[stages.work]
kind = "agent"
agent = "main"
prompt = "Write notes.txt, commit it with git, then push to origin."
"#,
        command.join(", "),
        env.join(", ")
    )
}

/// Runs the edit workflow through one agent and checks what every agent must show: the write
/// allowed, the commit denied with its rule in denied.txt (and, for the agents that go on
/// after a denial, the push too), the tool calls and decisions as events, nothing pushed.
fn check_edit_run(agent: &str, goes_on: bool, p: &Project, origin: &Path, run: &common::Out) {
    let store = p.store_text();
    let denied = p.attempt_file("denied.txt");
    let all = format!(
        "{agent}: exit {}\n{}\n{}\n{denied}",
        run.code, run.stdout, run.stderr
    );
    assert!(store.contains(r#""kind":"tool""#), "{all}");
    assert!(store.contains(r#""kind":"permission""#), "{all}");
    assert!(
        denied.contains("git add -A && git commit -q -m 'add notes': denied by policy `edit`"),
        "{all}"
    );
    assert_eq!(
        denied.contains("git push origin HEAD: denied by policy `edit`"),
        goes_on,
        "{all}"
    );
    // gemini reads a file before it writes it and fails the write on any error answer: the
    // backend answers a missing file in the workspace as empty, so gemini creates it too.
    assert_eq!(p.read("notes.txt"), "written by the mock model\n", "{all}");
    assert_eq!(p.git(&["log", "--format=%s"]), "init\n", "{all}");
    assert_eq!(
        git(origin, &["log", "--format=%s", "main"]),
        "init\n",
        "{agent}: pushed"
    );
    if goes_on {
        assert_eq!(run.code, 0, "{all}");
        assert!(
            run.json["outputs"]["work"]
                .to_string()
                .contains("REPLY-4F7"),
            "{all}"
        );
    }
}

/// Each real agent in a workflow, against the mock: the answer, the tool and permission
/// events, the denied commit and push in denied.txt with their rule, and nothing pushed.
#[test]
fn real_agents_in_a_workflow() {
    if !have_python() {
        return;
    }
    let Some(bin) = real_cli_bin() else {
        assert!(
            std::env::var_os("RALPH_FLOW_REQUIRE_REAL_CLI").is_none(),
            "the real ACP agents are required here: run tests/realcli/install.sh"
        );
        return;
    };
    let mock = common::MockApi::start().expect("the mock API");
    for (agent, goes_on) in AGENTS {
        let (p, origin) = Project::with_origin();
        let home = tempfile::tempdir().unwrap();
        let base = format!("http://127.0.0.1:{}/s/acp_edit", mock.port);
        let (argv, mut env) = real_agent_setup(&bin, agent, home.path(), &base);
        // The backend itself asks opencode to ask (its default allows everything): the
        // workflow does not say it, and opencode's push must still be denied.
        env.retain(|(k, _)| k != "OPENCODE_PERMISSION");
        p.workflow("w.toml", &edit_workflow(&argv, &env));
        let run = p.run(&["run", "w.toml", "--json"]);
        check_edit_run(agent, goes_on, &p, &origin.path().join("o.git"), &run);
    }
}

/// The same through the fake replaying each agent's capture of those decisions.
#[test]
fn fake_agents_in_a_workflow() {
    if !have_python() {
        return;
    }
    for (agent, goes_on) in AGENTS {
        let (p, origin) = Project::with_origin();
        let env = vec![(
            "FAKE_ACP_CASE".to_string(),
            format!("{agent}/edit_commit_push"),
        )];
        p.workflow(
            "w.toml",
            &edit_workflow(&[fake().display().to_string()], &env),
        );
        let run = p.run(&["run", "w.toml", "--json"]);
        check_edit_run(agent, goes_on, &p, &origin.path().join("o.git"), &run);
    }
}
