//! A project with the presets and their recordings, a `ralph-flow serve` over it, and a
//! small HTTP client: what the monitor's tests share (with `mod common;` beside it).
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A checkout of the presets with the demo, the recordings and the files SPIDER reads.
pub(crate) struct Checkout {
    pub dir: tempfile::TempDir,
}

pub(crate) fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_ralph-flow")
}

impl Checkout {
    pub(crate) fn new() -> Checkout {
        Checkout {
            dir: crate::common::checkout_with(&[
                ("BRIEF.md", "A CLI that counts words in its input.\n"),
                ("docs/spec.md", "# Word count spec\n"),
                ("docs/plan.md", "# Plan\n"),
            ]),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin());
        c.args(args)
            .current_dir(self.path())
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1");
        c
    }

    /// Runs ralph-flow to its end: (exit code, stdout, stderr).
    pub(crate) fn run(&self, args: &[&str]) -> (i32, String, String) {
        let out = self.command(args).output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The shipped Wiggum review preset, replayed to its end; returns the run id.
    pub(crate) fn wiggum(&self) -> String {
        self.wiggum_with(&[])
    }

    /// [`Checkout::wiggum`] with more arguments (`--store URL`).
    pub(crate) fn wiggum_with(&self, more: &[&str]) -> String {
        let mut args = vec!["run"];
        args.extend(crate::common::WIGGUM_REPLAY);
        args.extend(more);
        let (code, out, err) = self.run(&args);
        assert_eq!(code, 0, "{err}");
        let json: serde_json::Value = serde_json::from_str(&out).unwrap();
        json["run"].as_str().unwrap().to_string()
    }

    /// The arguments of the SPIDER preset replayed from its recording.
    pub(crate) fn spider_args(extra: &[&'static str]) -> Vec<&'static str> {
        let mut args = vec![
            "run",
            "workflows/spider.toml",
            "--replay",
            "examples/spider.replay.jsonl",
            "--set",
            "test_command=true",
            "--set",
            "builder_backend=claude",
        ];
        args.extend_from_slice(extra);
        args
    }

    /// The fan-out of `fanout.toml` over `items` items (one command stage each, one in ten
    /// failing), run to its end; returns the run id.
    pub(crate) fn fanout(&self, items: usize) -> String {
        std::fs::write(self.path().join("fanout.toml"), include_str!("fanout.toml")).unwrap();
        let count = format!("count={items}");
        let (_, out, err) = self.run(&["run", "fanout.toml", "--json", "--set", &count]);
        let json: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out} {err}"));
        json["run"].as_str().unwrap().to_string()
    }

    /// The newest run's id, once there is one.
    pub(crate) fn newest_run(&self) -> String {
        self.new_run(&[])
    }

    /// The id of a run that is not one of `known`, once there is one.
    pub(crate) fn new_run(&self, known: &[&str]) -> String {
        let t = Instant::now();
        loop {
            let (_, out, _) = self.run(&["runs", "--json"]);
            if let Ok(serde_json::Value::Array(runs)) = serde_json::from_str(&out) {
                if let Some(id) = runs
                    .iter()
                    .filter_map(|r| r["id"].as_str())
                    .find(|id| !known.contains(id))
                {
                    return id.to_string();
                }
            }
            assert!(t.elapsed() < Duration::from_secs(30), "no run appeared");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A running `ralph-flow serve`, stopped on drop.
pub(crate) struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`
    pub base: String,
    pub token: String,
    /// The URL it printed (with the token).
    pub url: String,
}

impl Server {
    /// Serves the checkout's state directory on a free port.
    pub(crate) fn start(dir: &Path, env: &[(&str, &str)]) -> Server {
        let mut c = Command::new(bin());
        c.args(["serve", "--addr", "127.0.0.1:0", "--poll", "100ms"])
            .current_dir(dir)
            .env_remove("RUST_LOG")
            .env_remove("RALPH_FLOW_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c.spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line.trim().to_string();
        let (base, token) = url
            .split_once("/?token=")
            .unwrap_or_else(|| panic!("serve printed {url:?}"));
        Server {
            base: base.to_string(),
            token: token.to_string(),
            url: url.clone(),
            child,
        }
    }

    fn addr(&self) -> String {
        self.base.trim_start_matches("http://").to_string()
    }

    /// A request: (status, headers in lower case, body).
    pub(crate) fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Reply {
        let mut s = TcpStream::connect(self.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.addr(),
            body.len()
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        req.push_str(body);
        s.write_all(req.as_bytes()).unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let mut lines = head.lines();
        let status: u16 = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_lowercase(), v.trim().to_string()))
            .collect();
        let chunked = head.to_lowercase().contains("transfer-encoding: chunked");
        Reply {
            status,
            headers,
            body: if chunked {
                dechunk(body)
            } else {
                body.to_string()
            },
        }
    }

    /// Opens a stream (server-sent events) with the bearer token and reads its lines until
    /// `until` holds for one of them (panics after 30 s); returns the lines read.
    pub(crate) fn stream_until(
        &self,
        path: &str,
        mut started: impl FnMut(),
        until: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        let mut s = TcpStream::connect(self.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nAccept: text/event-stream\r\n\r\n",
            self.addr(),
            self.token
        );
        s.write_all(req.as_bytes()).unwrap();
        let mut reader = BufReader::new(s);
        let mut lines = Vec::new();
        let mut line = String::new();
        // The head of the reply, then what the caller does.
        loop {
            line.clear();
            reader.read_line(&mut line).unwrap();
            lines.push(line.trim_end().to_string());
            if line == "\r\n" {
                break;
            }
        }
        started();
        let t = Instant::now();
        loop {
            line.clear();
            let n = reader
                .read_line(&mut line)
                .unwrap_or_else(|e| panic!("{path}: {e}; read so far: {lines:?}"));
            assert!(n > 0, "{path} ended: {lines:?}");
            let l = line.trim_end().to_string();
            let done = until(&l);
            lines.push(l);
            if done {
                return lines;
            }
            assert!(t.elapsed() < Duration::from_secs(30), "{path}: {lines:?}");
        }
    }

    /// A GET with the bearer token.
    pub(crate) fn get(&self, path: &str) -> Reply {
        let auth = format!("Bearer {}", self.token);
        self.request("GET", path, &[("Authorization", &auth)], "")
    }

    /// A GET as the browser sends it after the first visit (the cookie).
    pub(crate) fn get_with_cookie(&self, path: &str) -> Reply {
        let cookie = format!("ralph_flow_token={}", self.token);
        self.request("GET", path, &[("Cookie", &cookie)], "")
    }

    pub(crate) fn json(&self, path: &str) -> serde_json::Value {
        let r = self.get(path);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{path}: {e}: {}", r.body))
    }
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP reply.
pub(crate) struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Where screenshots go: docs/ when RALPH_FLOW_SCREENSHOTS=1, else a temp dir.
pub(crate) fn screenshot_dir(tmp: &Path) -> PathBuf {
    if std::env::var_os("RALPH_FLOW_SCREENSHOTS").is_some_and(|v| v == "1") {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs")
    } else {
        tmp.to_path_buf()
    }
}

/// Writes, as another process would, a running attempt of stage `node` in a new scope
/// `scope` of run `id`, into the checkout's SQLite store: what a live page must show.
pub(crate) fn write_running_attempt(checkout: &Path, id: &str, scope: &str, node: &str) {
    use ralph_flow::store::{AttemptRecord, AttemptState, Store, Usage, Write};
    let mut store =
        ralph_flow::store::sqlite::SqliteStore::open(&checkout.join(".ralph-flow/state.db"))
            .unwrap();
    store
        .commit(&[Write::Attempt(AttemptRecord {
            run: id.to_string(),
            scope: scope.into(),
            node: node.into(),
            attempt: 1,
            state: AttemptState::Running,
            agent: None,
            dir: String::new(),
            error: None,
            usage: Usage::default(),
            started_at: ralph_flow::store::now_ms(),
            finished_at: None,
        })])
        .unwrap();
}

/// Writes events of a stage into a checkout's store, as `run::watch` does while an agent
/// works (kind, message), each a millisecond after the last, from now.
pub(crate) fn write_events(
    checkout: &Path,
    id: &str,
    scope: &str,
    node: &str,
    events: &[(&str, &str)],
) {
    use ralph_flow::store::{Event, Store, Write};
    let mut store =
        ralph_flow::store::sqlite::SqliteStore::open(&checkout.join(".ralph-flow/state.db"))
            .unwrap();
    let at = ralph_flow::store::now_ms();
    let writes: Vec<Write> = events
        .iter()
        .enumerate()
        .map(|(i, (kind, message))| {
            Write::Event(Event {
                run: id.to_string(),
                at: at + i as i64 + 1,
                scope: scope.into(),
                node: node.into(),
                kind: kind.to_string(),
                message: message.to_string(),
            })
        })
        .collect();
    store.commit(&writes).unwrap();
}
