//! OpenTelemetry traces: runs export their spans over OTLP/HTTP with protobuf to a receiver
//! that decodes them with the official protobuf definitions (tests/otel/receiver.py, PyPI
//! `opentelemetry-proto`), and the test checks what arrived: the span tree, the attributes,
//! the trace id `status --json` gives, a resumed run's spans in the same trace, and that no
//! secret, prompt or answer was sent. Also: nothing is sent when no endpoint is set, and a
//! collector that refuses or is absent does not fail the run.
//!
//! Without python3 and `opentelemetry-proto` the tests say SKIPPED (CI installs the package
//! and sets RALPH_FLOW_REQUIRE_OTLP=1, which makes its absence fail).
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const REQUIRE: &str = "RALPH_FLOW_REQUIRE_OTLP";

/// A secret the runs know (`secrets = [...]`, or an agent's key variable): it must never be
/// sent.
const SECRET: &str = "otel-test-secret-7f3a9c1e5b2d4068";

/// The receiver, killed when dropped.
struct Receiver {
    child: Child,
    port: u16,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Receiver {
    /// Starts the receiver (`mode`: `ok`, or `fail` to answer 500); `None` (after saying
    /// SKIPPED) when python3 or `opentelemetry-proto` is missing and not required.
    fn start(mode: &str) -> Option<Receiver> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/otel/receiver.py");
        let spawned = Command::new("python3")
            .arg(&script)
            .arg(mode)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => return skip(&format!("python3 cannot start: {e}")),
        };
        let mut line = String::new();
        let _ = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
        match line.trim().parse::<u16>() {
            Ok(port) => Some(Receiver { child, port }),
            Err(_) => {
                let _ = child.wait();
                let mut err = String::new();
                let _ = child.stderr.take().unwrap().read_to_string(&mut err);
                skip(err.trim())
            }
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request the receiver took, as it decoded them.
    fn requests(&self) -> Vec<Value> {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            stream,
            "GET /dump HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).unwrap();
        let body = text.split_once("\r\n\r\n").unwrap().1;
        let dump: Value = serde_json::from_str(body).unwrap();
        dump["requests"].as_array().unwrap().clone()
    }

    /// Every span received.
    fn spans(&self) -> Vec<Value> {
        let requests = self.requests();
        for r in &requests {
            assert_eq!(r["path"], "/v1/traces");
            assert_eq!(r["headers"]["content-type"], "application/x-protobuf");
            assert!(r["error"].is_null(), "undecodable export: {}", r["error"]);
        }
        requests
            .iter()
            .flat_map(|r| r["spans"].as_array().unwrap().clone())
            .collect()
    }

    /// Everything sent, raw (each body as latin-1 text).
    fn raw(&self) -> String {
        self.requests()
            .iter()
            .map(|r| r["raw"].as_str().unwrap().to_string())
            .collect()
    }
}

/// A missing receiver: a visible skip, or an error under RALPH_FLOW_REQUIRE_OTLP=1.
fn skip<T>(why: &str) -> Option<T> {
    let message =
        format!("SKIPPED: the OTLP receiver cannot run: {why} (pip install opentelemetry-proto)");
    assert!(
        !std::env::var(REQUIRE).is_ok_and(|v| v == "1"),
        "{message} [{REQUIRE}=1]"
    );
    let _ = writeln!(std::io::stderr(), "{message}");
    None
}

/// ralph-flow in `dir`, with none of the environment's OpenTelemetry settings and `env`.
fn ralph(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> common::Out {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ralph-flow"));
    c.args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env_remove("RUST_LOG");
    for (k, _) in std::env::vars() {
        if k.starts_with("OTEL_") {
            c.env_remove(k);
        }
    }
    for (k, v) in env {
        c.env(k, v);
    }
    common::Out::of(&c.output().unwrap())
}

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

fn one<'a>(spans: &'a [Value], name: &str) -> &'a Value {
    let found = named(spans, name);
    assert_eq!(
        found.len(),
        1,
        "one span `{name}`, in: {:#?}",
        spans.iter().map(|s| &s["name"]).collect::<Vec<_>>()
    );
    found[0]
}

fn status_json(dir: &Path, run: &str) -> Value {
    let out = ralph(dir, &["status", run, "--json"], &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    out.json
}

/// Whether spans came within a few seconds (a run flushes before it returns: this only
/// allows for the receiver's own pace).
fn settle(receiver: &Receiver, at_least: usize) -> Vec<Value> {
    let t = Instant::now();
    loop {
        let spans = receiver.spans();
        if spans.len() >= at_least || t.elapsed() > Duration::from_secs(5) {
            return spans;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_replayed_preset_run_exports_its_span_tree_with_genai_attributes_and_no_text() {
    let Some(receiver) = Receiver::start("ok") else {
        return;
    };
    // The criteria (read into the prompt) hold a marker and the secret.
    let criteria = format!("PROMPT-MARKER-31 Review with care. Token: {SECRET}\n");
    let dir = common::checkout_with(&[("examples/demo/otel-criteria.md", &criteria)]);
    let mut args = vec!["run"];
    args.extend(common::WIGGUM_REPLAY);
    args.extend(["--set", "criteria=examples/demo/otel-criteria.md"]);
    let endpoint = receiver.endpoint();
    let out = ralph(
        dir.path(),
        &args,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-otel-test=yes"),
            ("OTEL_SERVICE_NAME", "ralph-flow-otel-test"),
            ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test"),
            ("ANTHROPIC_API_KEY", SECRET),
        ],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        !out.stderr.contains("traces:"),
        "no warning: {}",
        out.stderr
    );
    let run = out.json["run"].as_str().unwrap().to_string();
    let trace_id = status_json(dir.path(), &run)["trace_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(trace_id.len(), 32);

    let spans = settle(&receiver, 1);
    assert!(
        receiver
            .requests()
            .iter()
            .all(|r| r["headers"]["x-otel-test"] == "yes"),
        "OTEL_EXPORTER_OTLP_HEADERS is sent"
    );
    for s in &spans {
        assert_eq!(s["trace_id"], trace_id.as_str(), "one trace: {s:#}");
        assert_eq!(s["resource"]["service.name"], "ralph-flow-otel-test");
        assert_eq!(s["resource"]["deployment.environment"], "test");
    }
    let ids: std::collections::HashSet<&str> = spans
        .iter()
        .map(|s| s["span_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), spans.len(), "span ids are unique");

    // The tree: run → review_loop → review (each iteration) → attempt → agent call.
    let root = one(&spans, "run wiggum-review");
    assert_eq!(root["parent_span_id"], "");
    assert_eq!(attr(root, "ralph_flow.run.id"), run.as_str());
    assert_eq!(attr(root, "ralph_flow.run.exit"), "clean");
    assert_eq!(attr(root, "ralph_flow.run.exit_code"), 0);
    assert_eq!(root["status_code"], 1, "ok");
    let lp = one(&spans, "stage review_loop");
    assert_eq!(lp["parent_span_id"], root["span_id"]);
    assert_eq!(attr(lp, "ralph_flow.stage.kind"), "loop");
    assert_eq!(attr(lp, "ralph_flow.stage.outcome"), "done");
    for i in 1..=3 {
        let review = one(&spans, &format!("stage review_loop#{i}/review"));
        assert_eq!(review["parent_span_id"], lp["span_id"]);
        assert_eq!(attr(review, "ralph_flow.stage.kind"), "agent");
        assert_eq!(attr(review, "ralph_flow.stage.outcome"), "done");
        assert_eq!(attr(review, "gen_ai.usage.input_tokens"), 4200);
        let check = one(&spans, &format!("stage review_loop#{i}/clean_tree"));
        assert_eq!(check["parent_span_id"], lp["span_id"]);
        assert_eq!(attr(check, "ralph_flow.stage.kind"), "check");
        let attempts: Vec<&Value> = spans
            .iter()
            .filter(|s| s["parent_span_id"] == review["span_id"])
            .collect();
        assert_eq!(attempts.len(), 1, "one attempt of review #{i}");
        let attempt = attempts[0];
        assert_eq!(attempt["name"], "attempt 1");
        assert_eq!(attr(attempt, "ralph_flow.attempt.outcome"), "ok");
        let calls: Vec<&Value> = spans
            .iter()
            .filter(|s| s["parent_span_id"] == attempt["span_id"])
            .collect();
        assert_eq!(calls.len(), 1, "one agent call in review #{i}");
        let call = calls[0];
        assert_eq!(call["name"], "invoke_agent reviewer");
        assert_eq!(call["kind"], 3, "a client span");
        assert_eq!(attr(call, "gen_ai.operation.name"), "invoke_agent");
        assert_eq!(attr(call, "gen_ai.provider.name"), "anthropic");
        assert_eq!(attr(call, "gen_ai.system"), "anthropic");
        assert_eq!(attr(call, "gen_ai.agent.name"), "reviewer");
        assert_eq!(attr(call, "gen_ai.request.model"), "claude-sonnet-4-5");
        assert_eq!(attr(call, "gen_ai.response.model"), "claude-sonnet-4-5");
        assert_eq!(attr(call, "gen_ai.usage.input_tokens"), 4200);
        assert_eq!(attr(call, "gen_ai.usage.output_tokens"), 310);
        assert_eq!(attr(call, "gen_ai.usage.cache_read.input_tokens"), 1800);
        assert_eq!(attr(call, "ralph_flow.cost_usd"), 0.0112);
        for (child, parent) in [(call, attempt), (attempt, review), (review, lp), (lp, root)] {
            let (cs, ce) = (
                child["start_ns"].as_u64().unwrap(),
                child["end_ns"].as_u64().unwrap(),
            );
            let (ps, pe) = (
                parent["start_ns"].as_u64().unwrap(),
                parent["end_ns"].as_u64().unwrap(),
            );
            // Times are kept to the millisecond.
            assert!(
                cs + 1_000_000 >= ps && ce <= pe + 1_000_000,
                "{child:#} within {parent:#}"
            );
            assert!(cs <= ce);
        }
    }
    // Nothing textual of the run but names: no prompt, no answer, no secret.
    let raw = receiver.raw();
    assert!(!raw.is_empty());
    for text in [
        SECRET,
        "PROMPT-MARKER-31",
        "I reviewed everything under examples/demo",
        "NO_ISSUES",
        "ISSUE:",
    ] {
        assert!(!raw.contains(text), "`{text}` was exported");
    }
}

/// Two commands around a gate, the first writing the secret to its output.
const GATED: &str = r#"
name = "gated"
secrets = ["OTEL_TEST_SECRET"]

[stages.build]
kind = "command"
argv = ["sh", "-c", "echo built with $OTEL_TEST_SECRET"]

[stages.ship_it]
kind = "gate"
needs = ["build"]
message = "GATE-MESSAGE-31: ship it?"

[stages.ship]
kind = "command"
needs = ["ship_it"]
argv = ["echo", "shipped"]
"#;

#[test]
fn a_resumed_run_continues_its_trace_and_a_gates_wait_is_a_span() {
    let Some(receiver) = Receiver::start("ok") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("w.toml"), GATED).unwrap();
    let endpoint = receiver.endpoint();
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_TEST_SECRET", SECRET),
    ];
    let out = ralph(dir.path(), &["run", "w.toml", "--no-wait", "--json"], &env);
    assert_eq!(out.code, 75, "waits on its gate: {}", out.stderr);
    let run = out.json["run"].as_str().unwrap().to_string();
    let trace_id = status_json(dir.path(), &run)["trace_id"]
        .as_str()
        .unwrap()
        .to_string();
    let first = settle(&receiver, 3);
    let build = one(&first, "stage build");
    assert_eq!(build["trace_id"], trace_id.as_str());
    assert_eq!(attr(build, "ralph_flow.stage.kind"), "command");
    assert!(
        named(&first, "run gated").is_empty(),
        "a waiting run's span comes when it ends"
    );
    assert_eq!(
        first
            .iter()
            .filter(|s| s["parent_span_id"] == build["span_id"])
            .count(),
        1,
        "build's attempt"
    );

    let a = ralph(dir.path(), &["approve", &run, "ship_it"], &[]);
    assert_eq!(a.code, 0, "{}", a.stderr);
    // The resume is another process; it exports into the same trace.
    let out = ralph(dir.path(), &["resume", &run, "--json"], &env);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let spans = settle(&receiver, first.len() + 4);
    for s in &spans {
        assert_eq!(s["trace_id"], trace_id.as_str(), "one trace: {s:#}");
    }
    let root = one(&spans, "run gated");
    assert_eq!(root["parent_span_id"], "");
    assert_eq!(
        build["parent_span_id"], root["span_id"],
        "the first process's stages are children of the run's span the last one sent"
    );
    let gate = one(&spans, "stage ship_it");
    assert_eq!(gate["parent_span_id"], root["span_id"]);
    assert_eq!(attr(gate, "ralph_flow.stage.kind"), "gate");
    let wait = one(&spans, "gate wait ship_it");
    assert_eq!(wait["parent_span_id"], gate["span_id"]);
    assert_eq!(attr(wait, "ralph_flow.gate.answer"), "approved");
    assert_eq!(attr(wait, "ralph_flow.gate.timed_out"), false);
    // The wait runs from the first process's request to the approval.
    assert!(
        wait["start_ns"].as_u64().unwrap() <= build["end_ns"].as_u64().unwrap() + 1_000_000_000
    );
    assert!(wait["end_ns"].as_u64().unwrap() >= wait["start_ns"].as_u64().unwrap());
    assert!(attr(wait, "ralph_flow.gate.wait_ms").as_i64().unwrap() >= 0);
    let ship = one(&spans, "stage ship");
    assert_eq!(ship["parent_span_id"], root["span_id"]);
    assert_eq!(status_json(dir.path(), &run)["trace_id"], trace_id.as_str());

    let raw = receiver.raw();
    for text in [SECRET, "GATE-MESSAGE-31", "built with"] {
        assert!(!raw.contains(text), "`{text}` was exported");
    }
}

/// A workflow of one command stage.
const ONE: &str = "name = \"one\"\n[stages.hello]\nkind = \"command\"\nargv = [\"echo\", \"hi\"]\n";

#[test]
fn nothing_is_sent_without_an_endpoint() {
    let Some(receiver) = Receiver::start("ok") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("w.toml"), ONE).unwrap();
    // Other OpenTelemetry settings, but no endpoint.
    let out = ralph(
        dir.path(),
        &["run", "w.toml", "--json"],
        &[("OTEL_SERVICE_NAME", "nothing")],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(!out.stderr.contains("traces"), "{}", out.stderr);
    // An endpoint with the SDK disabled sends nothing either.
    let endpoint = receiver.endpoint();
    let out = ralph(
        dir.path(),
        &["run", "w.toml", "--json"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_SDK_DISABLED", "true"),
        ],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(receiver.requests(), Vec::<Value>::new());
    // The run still has a trace id to give.
    let run = out.json["run"].as_str().unwrap();
    assert_eq!(
        status_json(dir.path(), run)["trace_id"]
            .as_str()
            .unwrap()
            .len(),
        32
    );
}

#[test]
fn a_collector_that_refuses_or_is_absent_warns_once_and_the_run_goes_on() {
    let Some(receiver) = Receiver::start("fail") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("w.toml"), ONE).unwrap();
    let endpoint = receiver.endpoint();
    let out = ralph(
        dir.path(),
        &["run", "w.toml", "--json"],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json["exit"], "success");
    assert!(!receiver.requests().is_empty(), "it tried");
    assert_eq!(
        out.stderr.matches("! traces:").count(),
        1,
        "one warning: {}",
        out.stderr
    );
    assert!(out.stderr.contains("500"), "{}", out.stderr);

    // Nobody listens on the port of a socket just closed.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let absent = format!("http://127.0.0.1:{port}");
    let t = Instant::now();
    let out = ralph(
        dir.path(),
        &["run", "w.toml", "--json"],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", absent.as_str())],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.stderr.matches("! traces:").count(),
        1,
        "one warning: {}",
        out.stderr
    );
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "bounded: {:?}",
        t.elapsed()
    );
}
