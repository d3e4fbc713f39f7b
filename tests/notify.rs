//! Gate notifications end to end: `ralph-flow run` announces a waiting gate (and the run's
//! end, when asked) to a local HTTP receiver, a command, Slack and ntfy as they answer, and
//! records each delivery's outcome as an event of the run.
//!
//! The receiver is a small axum server on its own thread that records every request and
//! answers from a script. Slack has no local server: the Slack receiver answers as Slack's
//! incoming webhooks do, per Slack's documentation of their errors ("Handling errors" in
//! "Sending messages using incoming webhooks", docs.slack.dev): 200 with the body `ok`; 400
//! `invalid_payload` or `invalid_blocks`; 403 `invalid_token`; 404 `no_service`; 410
//! `channel_is_archived`, each a `text/plain` body. Debian (bookworm) ships no ntfy server,
//! so the ntfy receiver checks what ntfy's publishing API documents (docs.ntfy.sh/publish):
//! a POST of the message as the body to the topic's URL, with the headers `Title`, `Tags`,
//! `Priority`, `Click` and `Actions` (`view, LABEL, URL`); ntfy answers 200 with the message
//! as JSON.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Project;
use serde_json::Value;

/// One request the receiver got.
#[derive(Clone, Debug)]
struct Got {
    path: String,
    headers: BTreeMap<String, String>,
    body: String,
}

impl Got {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// How the receiver answers one request: status, body, headers, and how long it waits first.
#[derive(Clone)]
struct Answer {
    status: u16,
    body: &'static str,
    headers: Vec<(&'static str, &'static str)>,
    delay: Duration,
}

fn ok() -> Answer {
    answer(200, "ok")
}

fn answer(status: u16, body: &'static str) -> Answer {
    Answer {
        status,
        body,
        headers: Vec::new(),
        delay: Duration::ZERO,
    }
}

type Script = dyn Fn(&str, usize, &str) -> Answer + Send + Sync;

struct Receiver {
    url: String,
    got: Arc<Mutex<Vec<Got>>>,
}

impl Receiver {
    /// Starts a receiver that answers the `n`th request (from 0) to `path` with
    /// `script(path, n)`.
    fn new(script: impl Fn(&str, usize) -> Answer + Send + Sync + 'static) -> Receiver {
        Receiver::reading(move |path, n, _| script(path, n))
    }

    /// Starts a Slack incoming webhook: what Slack refuses it refuses as Slack does
    /// ([`slack_refusal`]), anything else it answers with `script(path, n)`.
    fn slack(script: impl Fn(&str, usize) -> Answer + Send + Sync + 'static) -> Receiver {
        Receiver::reading(move |path, n, body| {
            slack_refusal(body).unwrap_or_else(|| script(path, n))
        })
    }

    /// Starts a receiver that answers with `script(path, n, body)`.
    fn reading(script: impl Fn(&str, usize, &str) -> Answer + Send + Sync + 'static) -> Receiver {
        use axum::body::Body;
        use axum::extract::{Request, State};
        use axum::response::{IntoResponse, Response};
        type Shared = (Arc<Mutex<Vec<Got>>>, Arc<Script>);
        async fn handle(State((got, script)): State<Shared>, req: Request) -> Response {
            let path = req.uri().path().to_string();
            let headers = req
                .headers()
                .iter()
                .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
                .collect();
            let body = axum::body::to_bytes(req.into_body(), 1 << 20)
                .await
                .unwrap_or_default();
            let body = String::from_utf8_lossy(&body).into_owned();
            let n = {
                let mut got = got.lock().unwrap();
                let n = got.iter().filter(|g| g.path == path).count();
                got.push(Got {
                    path: path.clone(),
                    headers,
                    body: body.clone(),
                });
                n
            };
            let a = script(&path, n, &body);
            tokio::time::sleep(a.delay).await;
            let mut resp = Response::builder().status(a.status);
            for (k, v) in &a.headers {
                resp = resp.header(*k, *v);
            }
            resp.header("content-type", "text/plain")
                .body(Body::from(a.body))
                .unwrap()
                .into_response()
        }
        let got = Arc::new(Mutex::new(Vec::new()));
        let state: Shared = (got.clone(), Arc::new(script));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(listener.local_addr().unwrap()).unwrap();
                let app = axum::Router::new().fallback(handle).with_state(state);
                axum::serve(listener, app).await.unwrap();
            });
        });
        let addr = rx.recv().unwrap();
        Receiver {
            url: format!("http://{addr}"),
            got,
        }
    }

    fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    fn to(&self, path: &str) -> Vec<Got> {
        self.got().into_iter().filter(|g| g.path == path).collect()
    }

    /// Waits (up to 10 s) until `n` requests came to `path`.
    fn wait_for(&self, path: &str, n: usize) -> Vec<Got> {
        let t = Instant::now();
        loop {
            let got = self.to(path);
            if got.len() >= n {
                return got;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{n} requests to {path} did not come; got {:?}",
                self.got()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// What Slack's incoming webhooks refuse of a body, answered as they answer it: not JSON
/// (400 `invalid_payload`), neither `text` nor `blocks` (400 `no_text`), more than 50
/// blocks or a section whose text is empty or longer than 3,000 characters (400
/// `invalid_blocks`: Block Kit's reference, "Section block" and "Blocks").
fn slack_refusal(body: &str) -> Option<Answer> {
    let Ok(v) = serde_json::from_str::<Value>(body) else {
        return Some(answer(400, "invalid_payload"));
    };
    let blocks = v["blocks"].as_array();
    if v["text"].as_str().is_none_or(str::is_empty) && blocks.is_none() {
        return Some(answer(400, "no_text"));
    }
    let bad_section = |b: &Value| {
        b["type"] == "section"
            && b["text"]["text"]
                .as_str()
                .is_none_or(|t| t.is_empty() || t.chars().count() > 3000)
    };
    match blocks {
        Some(bs) if bs.len() > 50 || bs.iter().any(bad_section) => {
            Some(answer(400, "invalid_blocks"))
        }
        _ => None,
    }
}

/// A command stage, then a gate that shows a file.
fn gated(notify: &str) -> String {
    format!(
        r#"name = "gated"

[params.target]
type = "string"
default = "staging"

{notify}

[stages.build]
kind = "command"
argv = ["echo", "built"]

[stages.sign_off]
kind = "gate"
needs = ["build"]
message = "Deploy to {{{{ params.target }}}}? The build said {{{{ stages.build.output.stdout | trim }}}}."
show = ["docs/notes.md"]
"#
    )
}

/// The events of a run, as `logs --json` would give them: (kind, message).
fn events(p: &Project, run: &str) -> Vec<(String, String)> {
    let store = p.store().unwrap();
    use ralph_flow::store::Store;
    store
        .events(run, None)
        .unwrap()
        .into_iter()
        .map(|e| (e.kind, e.message))
        .collect()
}

fn notify_events(p: &Project, run: &str) -> Vec<(String, String)> {
    events(p, run)
        .into_iter()
        .filter(|(k, _)| k.starts_with("notif"))
        .collect()
}

#[test]
fn a_waiting_gate_is_announced_with_its_message_files_link_and_commands_that_answer_it() {
    let r = Receiver::new(|_, _| answer(202, ""));
    let p = Project::new();
    p.write("docs/notes.md", "notes\n");
    p.workflow(
        "w.toml",
        &gated(&format!(
            "[notify.ops]\nkind = \"webhook\"\nurl = \"{}/hook\"\non = [\"gate\", \"finished\"]\n",
            r.url
        )),
    );
    let env = [("RALPH_FLOW_MONITOR_URL", "http://monitor.example:8080/")];
    let out = p.run_env(&["run", "w.toml", "--no-wait", "--json"], &env);
    assert_eq!(out.code, 75, "waits: {}", out.stderr);
    let run = out.json["run"].as_str().unwrap().to_string();
    let got = r.wait_for("/hook", 1);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        got[0].headers.get("content-type").map(String::as_str),
        Some("application/json")
    );
    let body = got[0].json();
    assert_eq!(body["event"], "gate");
    assert_eq!(body["run"], run.as_str());
    assert_eq!(body["workflow"], "gated");
    assert_eq!(body["status"], "waiting");
    assert_eq!(body["exit"], Value::Null);
    assert_eq!(body["gate"]["name"], "sign_off");
    assert_eq!(body["gate"]["scope"], "");
    assert_eq!(
        body["gate"]["message"],
        "Deploy to staging? The build said built."
    );
    assert_eq!(body["gate"]["files"], serde_json::json!(["docs/notes.md"]));
    assert_eq!(
        body["monitor_url"],
        format!(
            "http://monitor.example:8080/runs/{}",
            run.replace('-', "%2D")
        )
        .as_str()
    );
    let approve = body["commands"]["approve"].as_str().unwrap();
    assert_eq!(approve, format!("ralph-flow approve {run} sign_off"));
    assert_eq!(
        body["commands"]["reject"],
        format!("ralph-flow reject {run} sign_off --comment '...'").as_str()
    );
    // The delivery is an event of the run.
    let ev = notify_events(&p, &run);
    assert_eq!(
        ev,
        vec![(
            "notified".to_string(),
            "webhook `ops` announced gate `sign_off` (1 attempt)".to_string()
        )],
    );
    let logs = p.run(&["logs", &run]);
    assert!(
        logs.stdout
            .contains("webhook `ops` announced gate `sign_off` (1 attempt)"),
        "{}",
        logs.stdout
    );

    // The command it sent answers the gate, as written (through a shell).
    let bin = env!("CARGO_BIN_EXE_ralph-flow");
    let answered = std::process::Command::new("sh")
        .arg("-c")
        .arg(approve.replacen("ralph-flow", bin, 1))
        .current_dir(p.dir())
        .output()
        .unwrap();
    assert!(answered.status.success(), "{answered:?}");
    // A resume does not announce the gate again; the run's end is announced.
    let out = p.run_env(&["resume", &run, "--no-wait", "--json"], &env);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let got = r.wait_for("/hook", 2);
    assert_eq!(got.len(), 2, "{got:?}");
    let end = got[1].json();
    assert_eq!(end["event"], "finished");
    assert_eq!(end["status"], "finished");
    assert_eq!(end["gate"], Value::Null);
    assert_eq!(end["commands"], Value::Null);
    assert_eq!(end["exit"]["name"], "success");
    assert_eq!(end["exit"]["code"], 0);
    let gates: Vec<_> = r
        .got()
        .iter()
        .filter(|g| g.json()["event"] == "gate")
        .cloned()
        .collect();
    assert_eq!(gates.len(), 1, "announced once: {gates:?}");
}

#[test]
fn a_delivery_is_retried_after_a_500_and_the_event_counts_the_attempts() {
    let r = Receiver::new(|_, n| if n == 0 { answer(500, "boom") } else { ok() });
    let p = Project::new();
    p.workflow(
        "w.toml",
        &gated(&format!(
            "[notify.ops]\nkind = \"webhook\"\nurl = \"{}/hook\"\nretries = 2\n",
            r.url
        )),
    );
    let out = p.run(&["run", "w.toml", "--no-wait", "--json"]);
    assert_eq!(out.code, 75, "{}", out.stderr);
    let run = out.json["run"].as_str().unwrap().to_string();
    assert_eq!(r.to("/hook").len(), 2);
    assert_eq!(
        notify_events(&p, &run),
        vec![(
            "notified".to_string(),
            "webhook `ops` announced gate `sign_off` (2 attempts)".to_string()
        )]
    );
}

#[test]
fn a_receiver_that_hangs_neither_holds_the_run_nor_goes_unrecorded() {
    // Both notifiers post to a receiver that never answers: one gives up after its own
    // timeout, the other (10 s by default) is abandoned at the run's end, after the grace.
    let r = Receiver::new(|_, _| Answer {
        delay: Duration::from_secs(120),
        ..ok()
    });
    let p = Project::new();
    p.workflow(
        "w.toml",
        &gated(&format!(
            "[notify.quick]\nkind = \"webhook\"\nurl = \"{0}/quick\"\ntimeout = \"1s\"\nretries = 0\n\n\
             [notify.slow]\nkind = \"webhook\"\nurl = \"{0}/slow\"\n",
            r.url
        )),
    );
    let t = Instant::now();
    let out = p.run(&["run", "w.toml", "--no-wait", "--json"]);
    let took = t.elapsed();
    assert_eq!(out.code, 75, "{}", out.stderr);
    assert!(took < Duration::from_secs(9), "the run took {took:?}");
    let run = out.json["run"].as_str().unwrap().to_string();
    let ev = notify_events(&p, &run);
    assert!(
        ev.contains(&(
            "notify-failed".to_string(),
            "webhook `quick` could not announce gate `sign_off` after 1 attempt: no answer within 1.0s"
                .to_string()
        )),
        "{ev:?}"
    );
    assert!(
        ev.iter().any(|(k, m)| k == "notify-failed"
            && m == "webhook `slow` did not announce gate `sign_off`: abandoned 5.0s after the run's end, in its attempt 1 (no answer yet)"),
        "{ev:?}"
    );
    assert!(
        out.stderr.contains("abandoned 5.0s after the run's end"),
        "{}",
        out.stderr
    );
}

#[test]
fn slack_errors_are_not_retried_and_its_body_is_text_and_blocks() {
    // Slack's answers to a webhook that cannot be posted to (see the module's comment).
    let r = Receiver::slack(|path, _| match path {
        "/payload" => answer(400, "invalid_payload"),
        "/token" => answer(403, "invalid_token"),
        "/service" => answer(404, "no_service"),
        "/archived" => answer(410, "channel_is_archived"),
        _ => ok(),
    });
    let p = Project::new();
    p.write("docs/notes.md", "notes\n");
    let mut notify = String::new();
    for name in ["payload", "token", "service", "archived", "good"] {
        notify.push_str(&format!(
            "[notify.{name}]\nkind = \"slack\"\nurl_env = \"SLACK_{}\"\nretries = 3\n\n",
            name.to_uppercase()
        ));
    }
    p.workflow("w.toml", &gated(&notify));
    let env: Vec<(String, String)> = ["payload", "token", "service", "archived", "good"]
        .iter()
        .map(|n| {
            (
                format!("SLACK_{}", n.to_uppercase()),
                format!("{}/{n}", r.url),
            )
        })
        .collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let out = p.run_env(&["run", "w.toml", "--no-wait", "--json"], &env);
    assert_eq!(out.code, 75, "{}", out.stderr);
    let run = out.json["run"].as_str().unwrap().to_string();
    for (path, said) in [
        ("/payload", "400 invalid_payload"),
        ("/token", "403 invalid_token"),
        ("/service", "404 no_service"),
        ("/archived", "410 channel_is_archived"),
    ] {
        assert_eq!(r.to(path).len(), 1, "{path} was tried once");
        let name = &path[1..];
        let want = format!(
            "slack `{name}` could not announce gate `sign_off` after 1 attempt: Slack answered {said} (not retried)"
        );
        assert!(
            notify_events(&p, &run).contains(&("notify-failed".to_string(), want.clone())),
            "{want}: {:?}",
            notify_events(&p, &run)
        );
    }
    let good = r.to("/good");
    assert_eq!(good.len(), 1);
    let body = good[0].json();
    let text = body["text"].as_str().unwrap();
    assert!(
        text.contains(&format!("Run {run} of gated waits on gate sign_off")),
        "{text}"
    );
    assert!(
        text.contains(&format!("approve: ralph-flow approve {run} sign_off")),
        "{text}"
    );
    let blocks = body["blocks"].as_array().unwrap();
    assert!(
        blocks
            .iter()
            .all(|b| b["type"] == "section" && b["text"]["type"] == "mrkdwn")
    );
    let all: String = blocks
        .iter()
        .map(|b| b["text"]["text"].as_str().unwrap())
        .collect();
    assert!(all.contains("• `docs/notes.md`"), "{all}");
    assert!(
        all.contains(&format!("```ralph-flow approve {run} sign_off\n")),
        "{all}"
    );
    assert!(
        notify_events(&p, &run).contains(&(
            "notified".to_string(),
            "slack `good` announced gate `sign_off` (1 attempt)".to_string()
        )),
        "{:?}",
        notify_events(&p, &run)
    );
}

#[test]
fn a_long_gate_message_reaches_slack_cut_to_what_slack_takes() {
    let r = Receiver::slack(|_, _| ok());
    let p = Project::new();
    p.write("docs/notes.md", "notes\n");
    p.workflow(
        "w.toml",
        &gated("[notify.team]\nkind = \"slack\"\nurl_env = \"SLACK_TEAM\"\n"),
    );
    let long = "x".repeat(5000);
    let url = format!("{}/team", r.url);
    let out = p.run_env(
        &[
            "run",
            "w.toml",
            "--no-wait",
            "--json",
            "--set",
            &format!("target={long}"),
        ],
        &[
            ("SLACK_TEAM", url.as_str()),
            ("RALPH_FLOW_MONITOR_URL", "http://127.0.0.1:7700"),
        ],
    );
    assert_eq!(out.code, 75, "{}", out.stderr);
    let run = out.json["run"].as_str().unwrap().to_string();
    let got = r.wait_for("/team", 1);
    assert_eq!(got.len(), 1, "delivered at once, not refused and retried");
    let body = got[0].json();
    let main = body["blocks"][0]["text"]["text"].as_str().unwrap();
    assert_eq!(main.chars().count(), 3000, "{main}");
    let (cut, link) = main
        .rsplit_once("…\n")
        .unwrap_or_else(|| panic!("not cut: {main}"));
    assert!(cut.ends_with("xxxx"), "cut inside the message: {cut}");
    assert!(
        link.starts_with("<http://127.0.0.1:7700/runs/")
            && link.ends_with("|Open the run in the monitor>"),
        "the link is kept whole: {link}"
    );
    assert!(
        body["text"].as_str().unwrap().contains(&long),
        "the fallback text is whole"
    );
    let t = Instant::now();
    while !notify_events(&p, &run)
        .iter()
        .any(|(k, m)| k == "notified" && m == "slack `team` announced gate `sign_off` (1 attempt)")
    {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{:?}",
            notify_events(&p, &run)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn ntfy_gets_the_text_with_its_title_tags_priority_click_and_action() {
    let r = Receiver::new(|_, _| answer(200, r#"{"id":"x","event":"message"}"#));
    let p = Project::new();
    p.workflow(
        "w.toml",
        &gated(&format!(
            "[notify.phone]\nkind = \"ntfy\"\nurl_env = \"NTFY_TOPIC\"\nmonitor_url = \"http://box:8080\"\n\n\
             [notify.quiet]\nkind = \"ntfy\"\nurl = \"{}/quiet\"\n",
            r.url
        )),
    );
    let topic = format!("{}/builds", r.url);
    let out = p.run_env(
        &["run", "w.toml", "--no-wait", "--json"],
        &[("NTFY_TOPIC", &topic), ("RALPH_FLOW_MONITOR_URL", "")],
    );
    assert_eq!(out.code, 75, "{}", out.stderr);
    let run = out.json["run"].as_str().unwrap().to_string();
    let got = r.to("/builds");
    assert_eq!(got.len(), 1);
    let h = &got[0].headers;
    let link = format!("http://box:8080/runs/{}", run.replace('-', "%2D"));
    assert_eq!(h["title"], "gated: gate sign_off waits");
    assert_eq!(h["tags"], "hourglass_flowing_sand");
    assert_eq!(h["priority"], "high");
    assert_eq!(h["click"], link);
    assert_eq!(h["actions"], format!("view, Open run, {link}"));
    assert!(h["content-type"].starts_with("text/plain"));
    assert!(
        got[0].body.starts_with(&format!(
            "Run {run} of gated waits on gate sign_off: Deploy to staging?"
        )),
        "{}",
        got[0].body
    );
    // Without a monitor URL there is no link to give.
    let quiet = r.to("/quiet");
    assert_eq!(quiet.len(), 1);
    assert!(
        !quiet[0].headers.contains_key("click"),
        "{:?}",
        quiet[0].headers
    );
    assert!(!quiet[0].headers.contains_key("actions"));
}

#[test]
fn a_command_notifier_reads_the_json_on_stdin_with_the_run_event_and_gate_in_its_environment() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        &gated(
            "[notify.desktop]\nkind = \"command\"\n\
             argv = [\"sh\", \"-c\", \"cat > notified.json; echo \\\"$RALPH_FLOW_RUN_ID $RALPH_FLOW_EVENT $RALPH_FLOW_GATE\\\" > env.txt\"]\n",
        ),
    );
    let out = p.run(&["run", "w.toml", "--no-wait", "--json"]);
    assert_eq!(out.code, 75, "{}", out.stderr);
    let run = out.json["run"].as_str().unwrap().to_string();
    let body: Value = serde_json::from_str(&p.read("notified.json")).unwrap();
    assert_eq!(body["event"], "gate");
    assert_eq!(body["run"], run.as_str());
    assert_eq!(body["gate"]["name"], "sign_off");
    assert_eq!(p.read("env.txt"), format!("{run} gate sign_off\n"));
    assert_eq!(
        notify_events(&p, &run),
        vec![(
            "notified".to_string(),
            "command `desktop` announced gate `sign_off` (1 attempt)".to_string()
        )]
    );
}

#[test]
fn a_command_notifier_that_fails_is_retried_and_its_stderr_recorded() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        &gated(
            "[notify.pager]\nkind = \"command\"\nretries = 1\n\
             argv = [\"sh\", \"-c\", \"echo try >> tries.txt; echo no pager here >&2; exit 3\"]\n",
        ),
    );
    let out = p.run(&["run", "w.toml", "--no-wait", "--json"]);
    assert_eq!(out.code, 75, "{}", out.stderr);
    let run = out.json["run"].as_str().unwrap().to_string();
    assert_eq!(p.read("tries.txt"), "try\ntry\n");
    assert_eq!(
        notify_events(&p, &run),
        vec![(
            "notify-failed".to_string(),
            "command `pager` could not announce gate `sign_off` after 2 attempts: sh exited with code 3: no pager here".to_string()
        )]
    );
}

#[test]
fn secrets_are_masked_in_what_is_sent_and_in_what_is_recorded() {
    let r = Receiver::new(|_, _| ok());
    let p = Project::new();
    let key = "sk-deploy-9f8e7d6c5b4a39281706";
    p.workflow(
        "w.toml",
        &format!(
            r#"name = "masked"
secrets = ["DEPLOY_KEY"]

[params.key]
type = "string"

[notify.ops]
kind = "webhook"
url = "{}/hook"

[notify.hidden]
kind = "webhook"
url_env = "HIDDEN_HOOK"
retries = 0

[stages.sign_off]
kind = "gate"
message = "Deploy with {{{{ params.key }}}} to staging?"
"#,
            r.url
        ),
    );
    // A URL held by `url_env` that nothing listens at: the error names the URL, masked.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let hidden = format!("http://{closed}/hook/tok-4b7c1d9e2f3a5b6c7d8e");
    let out = p.run_env(
        &[
            "run",
            "w.toml",
            "--no-wait",
            "--json",
            "--set",
            &format!("key={key}"),
        ],
        &[("DEPLOY_KEY", key), ("HIDDEN_HOOK", &hidden)],
    );
    assert_eq!(out.code, 75, "{}", out.stderr);
    let run = out.json["run"].as_str().unwrap().to_string();
    let got = r.wait_for("/hook", 1);
    let body = &got[0].body;
    assert!(!body.contains(key), "{body}");
    assert!(body.contains("Deploy with [REDACTED] to staging"), "{body}");
    let ev = notify_events(&p, &run);
    let failed: Vec<_> = ev.iter().filter(|(k, _)| k == "notify-failed").collect();
    assert_eq!(failed.len(), 1, "{ev:?}");
    assert!(failed[0].1.contains("cannot reach the receiver"), "{ev:?}");
    // (The run's record keeps its params as set, for a resume: that is not what is checked.)
    let recorded = format!("{:?}", events(&p, &run));
    assert!(
        !recorded.contains("tok-4b7c1d9e2f3a5b6c7d8e"),
        "the hook's URL is masked: {recorded}"
    );
    assert!(!recorded.contains(key), "{recorded}");
    assert!(recorded.contains("[REDACTED]"), "{recorded}");
    let logs = p.run(&["logs", &run]);
    assert!(
        !logs.stdout.contains("tok-4b7c1d9e2f3a5b6c7d8e"),
        "{}",
        logs.stdout
    );
    assert!(!logs.stdout.contains(key), "{}", logs.stdout);
    assert!(
        !out.stderr.contains("tok-4b7c1d9e2f3a5b6c7d8e"),
        "{}",
        out.stderr
    );
}

#[test]
fn on_says_what_is_announced() {
    let r = Receiver::new(|_, _| ok());
    let p = Project::new();
    p.workflow(
        "ok.toml",
        &format!(
            "name = \"ends\"\n\n[notify.gates]\nkind = \"webhook\"\nurl = \"{0}/gates\"\n\n\
             [notify.ends]\nkind = \"webhook\"\nurl = \"{0}/ends\"\non = [\"finished\", \"failed\"]\n\n\
             [notify.cancels]\nkind = \"webhook\"\nurl = \"{0}/cancels\"\non = [\"cancelled\"]\n\n\
             [stages.build]\nkind = \"command\"\nargv = [\"echo\", \"built\"]\n",
            r.url
        ),
    );
    let out = p.run(&["run", "ok.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    p.workflow(
        "bad.toml",
        &p.read("ok.toml")
            .replace("name = \"ends\"", "name = \"breaks\"")
            .replace("[\"echo\", \"built\"]", "[\"false\"]"),
    );
    let out = p.run(&["run", "bad.toml", "--json"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    let ends = r.to("/ends");
    assert_eq!(ends.len(), 2, "{ends:?}");
    assert_eq!(ends[0].json()["event"], "finished");
    assert_eq!(ends[0].json()["workflow"], "ends");
    let failed = ends[1].json();
    assert_eq!(failed["event"], "failed");
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["exit"]["name"], "failed");
    assert_eq!(failed["exit"]["code"], 1);
    assert!(
        failed["exit"]["message"]
            .as_str()
            .unwrap()
            .contains("stage `build`"),
        "{failed}"
    );
    assert!(r.to("/gates").is_empty(), "no gate waited");
    assert!(r.to("/cancels").is_empty(), "nothing was cancelled");
}

/// The user's config file, under `XDG_CONFIG_HOME`.
fn user_config(p: &Project, text: &str) -> Vec<(String, String)> {
    p.write("config/ralph-flow/config.toml", text);
    vec![(
        "XDG_CONFIG_HOME".to_string(),
        p.dir().join("config").to_string_lossy().into_owned(),
    )]
}

#[test]
fn the_users_config_announces_the_gates_of_a_shipped_preset() {
    // SPIDER, replayed from its recording, waits for a person to approve its spec; the
    // user's config (not the preset) says where that is announced.
    let r = Receiver::new(|_, _| ok());
    let checkout = common::checkout_with(&[
        ("BRIEF.md", "A CLI that counts words in its input.\n"),
        ("docs/spec.md", "# Word count spec\n"),
        ("docs/plan.md", "# Plan\n"),
    ]);
    let config = checkout.path().join("xdg");
    std::fs::create_dir_all(config.join("ralph-flow")).unwrap();
    std::fs::write(
        config.join("ralph-flow/config.toml"),
        format!(
            "# Mine, for every run.\n[notify.me]\nkind = \"webhook\"\nurl = \"{}/me\"\n",
            r.url
        ),
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ralph-flow"))
            .args(args)
            .current_dir(checkout.path())
            .env("XDG_CONFIG_HOME", &config)
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        common::Out::of(&out)
    };
    let out = run(&[
        "run",
        "workflows/spider.toml",
        "--replay",
        "examples/spider.replay.jsonl",
        "--set",
        "test_command=true",
        "--set",
        "builder_backend=claude",
        "--no-wait",
        "--json",
        "--progress",
        "plain",
    ]);
    assert_eq!(out.code, 75, "{}", out.stderr);
    let id = out.json["run"].as_str().unwrap().to_string();
    let got = r.wait_for("/me", 1);
    let body = got[0].json();
    assert_eq!(body["workflow"], "spider");
    assert_eq!(body["event"], "gate");
    let gate = body["gate"]["name"].as_str().unwrap();
    assert!(
        body["gate"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Approve the spec in docs/spec.md (draft 1)?"),
        "{body}"
    );
    assert_eq!(body["gate"]["files"], serde_json::json!(["docs/spec.md"]));
    let approve = body["commands"]["approve"].as_str().unwrap();
    assert_eq!(
        approve,
        format!("ralph-flow approve {id} {}", shell_word(gate))
    );
    let logs = run(&["logs", &id]);
    assert!(
        logs.stdout.contains(&format!(
            "webhook `me` (user config) announced gate `{gate}` (1 attempt)"
        )),
        "{}",
        logs.stdout
    );
}

/// A word as the shell needs it: quoted when it holds anything but letters, digits, `_`,
/// `-`, `.` and `/`.
fn shell_word(w: &str) -> String {
    if w.chars()
        .all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c))
    {
        w.to_string()
    } else {
        format!("'{w}'")
    }
}

#[test]
fn a_bad_user_config_stops_the_run_before_it_starts_naming_the_place() {
    let p = Project::new();
    p.workflow("w.toml", &gated(""));
    let env = user_config(
        &p,
        "[notify.me]\nkind = \"email\"\n\n[notify.hook]\nkind = \"webhook\"\nurl = \"hooks.example.com\"\n",
    );
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let out = p.run_env(&["run", "w.toml", "--no-wait", "--json"], &env);
    assert_ne!(out.code, 0);
    assert_ne!(out.code, 75);
    let config = p.dir().join("config/ralph-flow/config.toml");
    let config = config.to_string_lossy();
    assert!(
        out.stderr.contains(&format!(
            "{config}:2:8: error[RF005]: `email` is not a valid value for `kind`"
        )),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(&format!(
            "{config}:6:7: error[RF068]: the `url` of notifier `hook` is not a URL (write the full URL"
        )),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("move the file away"), "{}", out.stderr);
    assert!(p.store().is_none(), "no run was started");
    // `check --config` reports the same, on request.
    let check = p.run_env(&["check", "--config", "--format", "short"], &env);
    assert_eq!(check.code, 3, "{}", check.stderr);
    assert!(
        check
            .stderr
            .contains(&format!("{config}:2:8: error[RF005]")),
        "{}",
        check.stderr
    );
    assert!(
        check
            .stderr
            .contains(&format!("{config}:6:7: error[RF068]")),
        "{}",
        check.stderr
    );
}

#[test]
fn check_reports_notifier_problems_in_both_syntaxes() {
    let p = Project::new();
    p.workflow(
        "w.kdl",
        "name \"k\"\nnotifier \"team\" kind=\"slack\" url=\"https://hooks.slack.com/services/T1/B2/abcdefabcdefabcdefabcdef\"\nstage \"s\" kind=\"gate\" message=\"ok?\"\n",
    );
    let out = p.run(&["check", "--format", "short", "w.kdl"]);
    assert_eq!(out.code, 0, "a warning only: {}", out.stderr);
    assert!(out.stderr.contains("RF069"), "{}", out.stderr);
    assert!(
        out.stderr.contains("url_env \"SLACK_WEBHOOK_URL\""),
        "{}",
        out.stderr
    );
}

#[test]
fn resume_announces_a_waiting_gate_once_and_only_if_no_delivery_was_recorded() {
    let r = Receiver::new(|_, _| ok());
    let p = Project::new();
    p.workflow("w.toml", &gated(""));
    // No notifier yet: the gate waits unannounced.
    let out = p.run(&["run", "w.toml", "--no-wait", "--json"]);
    assert_eq!(out.code, 75, "{}", out.stderr);
    let run = out.json["run"].as_str().unwrap().to_string();
    assert!(notify_events(&p, &run).is_empty());
    // With one in the user's config, a resume announces the gate no delivery was recorded of.
    let env = user_config(
        &p,
        &format!("[notify.me]\nkind = \"webhook\"\nurl = \"{}/me\"\n", r.url),
    );
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let out = p.run_env(&["resume", &run, "--no-wait", "--json"], &env);
    assert_eq!(out.code, 75, "{}", out.stderr);
    assert_eq!(r.to("/me").len(), 1);
    // Then never again.
    let out = p.run_env(&["resume", &run, "--no-wait", "--json"], &env);
    assert_eq!(out.code, 75, "{}", out.stderr);
    assert_eq!(r.to("/me").len(), 1, "{:?}", r.got());
    assert_eq!(
        notify_events(&p, &run),
        vec![(
            "notified".to_string(),
            "webhook `me` (user config) announced gate `sign_off` (1 attempt)".to_string()
        )]
    );
}

#[test]
fn a_run_cancelled_while_it_waits_is_announced_and_its_deliveries_recorded_as_it_goes() {
    let r = Receiver::new(|_, _| ok());
    let p = Project::new();
    p.workflow(
        "w.toml",
        &gated(&format!(
            "[notify.ops]\nkind = \"webhook\"\nurl = \"{}/hook\"\non = [\"gate\", \"cancelled\"]\n",
            r.url
        )),
    );
    let child = p.spawn(&["run", "w.toml", "--json"]);
    let run = p.wait_for_run();
    r.wait_for("/hook", 1);
    // Recorded while the run still waits.
    p.wait_for(|| notify_events(&p, &run).len() == 1);
    let c = p.run(&["cancel", &run, "--reason", "not today", "--by", "ana"]);
    assert_eq!(c.code, 0, "{}", c.stderr);
    let out = child.finish();
    assert_eq!(out.code, 125, "{}", out.stderr);
    let got = r.wait_for("/hook", 2);
    let end = got[1].json();
    assert_eq!(end["event"], "cancelled");
    assert_eq!(end["status"], "cancelled");
    assert_eq!(end["exit"], Value::Null);
    assert_eq!(
        notify_events(&p, &run).len(),
        2,
        "{:?}",
        notify_events(&p, &run)
    );
}
