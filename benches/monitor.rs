//! What the monitor (`ralph-flow serve`) costs at size: `cargo bench --bench monitor`.
//!
//! Two runs of the fan-out of `tests/monitor_support/fanout.toml` (one command stage per
//! item, one item in ten failing): a real one of 2,000 items (run by `ralph-flow run`), and
//! one of 10,000 items written straight into the store as a run of that workflow writes them
//! (a node with its settlement event and an attempt per item; running it for real would take
//! minutes). Over them, timed through HTTP as a browser asks:
//!
//! - the run page of the 10,000-stage run (`/runs/ID`), and its live parts (`/live/runs/ID`,
//!   what every refresh fetches);
//! - change to screen: from an event committed to the store by another process, through the
//!   monitor's poll (`--poll 20ms`), its `change` on `/api/changes`, to the live parts that
//!   show the event;
//! - the stage page of the 2,000-item fan-out's stage (`/runs/ID/stage?node=work`): time
//!   and size.
//!
//! With `RALPH_FLOW_MONITOR_BEFORE=PATH` (a `ralph-flow` binary of before the monitor's
//! incremental reads, schema version 7) the same is timed with it, side by side. Its copy of
//! the store is marked version 7 (the columns and indexes version 8 adds are extra to it).
//! `cargo test --all-targets` runs this too (without `--bench`): on small runs.

use std::io::{BufRead, BufReader, Read, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ralph_flow::store::sqlite::SqliteStore;
use ralph_flow::store::{
    AttemptRecord, AttemptState, Event, NodeRecord, NodeState, RunRecord, RunStatus, Store, Usage,
    Write,
};

const FANOUT: &str = include_str!("../tests/monitor_support/fanout.toml");

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (stages, items, rounds) = if full {
        (10_000, 2_000, 15)
    } else {
        (300, 120, 3)
    };
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temporary directory");
    let project = dir.path().join("after");
    std::fs::create_dir_all(&project).expect("project");
    std::fs::write(project.join("fanout.toml"), FANOUT).expect("workflow");
    let t = Instant::now();
    let fan = run_fanout(env!("CARGO_BIN_EXE_ralph-flow"), &project, items);
    println!(
        "monitor benchmark: a real {items}-item fan-out ({:.1} s to run), a {stages}-stage run \
         written into the store",
        t.elapsed().as_secs_f64()
    );
    let big = write_big_run(&project, stages);
    let mut binaries = vec![(
        "after",
        PathBuf::from(env!("CARGO_BIN_EXE_ralph-flow")),
        project.clone(),
    )];
    if let Some(before) = std::env::var_os("RALPH_FLOW_MONITOR_BEFORE") {
        let copy = dir.path().join("before");
        copy_dir(&project, &copy);
        let db = rusqlite::Connection::open(copy.join(".ralph-flow/state.db")).expect("copy");
        db.pragma_update(None, "user_version", 7)
            .expect("version 7");
        drop(db);
        binaries.insert(0, ("before", PathBuf::from(before), copy));
    }
    println!();
    println!("| binary | measure | first | median | max | size |");
    println!("|---|---|---:|---:|---:|---:|");
    for (name, bin, project) in &binaries {
        let server = Server::start(bin, project);
        let row = |what: &str, times: &[Duration], size: usize| {
            let mut sorted = times.to_vec();
            sorted.sort();
            println!(
                "| {name} | {what} | {} | {} | {} | {} |",
                ms(times[0]),
                ms(sorted[sorted.len() / 2]),
                ms(sorted[sorted.len() - 1]),
                kib(size)
            );
        };
        let page = format!("/runs/{big}");
        let (times, size) = server.time(&page, rounds);
        row(&format!("run page, {stages} stages"), &times, size);
        let live = format!("/live/runs/{big}");
        let (times, size) = server.time(&live, rounds);
        row(&format!("live parts, {stages} stages"), &times, size);
        let times = change_to_screen(&server, project, &big, rounds);
        row(&format!("change to screen, {stages} stages"), &times, 0);
        let stage = format!("/runs/{fan}/stage?node=work");
        let (times, size) = server.time(&stage, rounds.min(5));
        row(&format!("stage page, {items}-item fan-out"), &times, size);
        let failed = format!("/runs/{fan}/stage?node=work&state=failed");
        let (times, size) = server.time(&failed, rounds.min(5));
        row(
            &format!("stage page, {items}-item fan-out, `state=failed`"),
            &times,
            size,
        );
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn kib(n: usize) -> String {
    if n == 0 {
        "-".into()
    } else if n >= 1024 * 1024 {
        format!("{:.1} MiB", n as f64 / 1024.0 / 1024.0)
    } else {
        format!("{:.0} KiB", n as f64 / 1024.0)
    }
}

/// Runs the fan-out of `items` items in `project`; returns the run's id.
fn run_fanout(bin: &str, project: &Path, items: usize) -> String {
    let out = Command::new(bin)
        .args(["run", "fanout.toml", "--json", "--set"])
        .arg(format!("count={items}"))
        .current_dir(project)
        .env("NO_COLOR", "1")
        .output()
        .expect("ralph-flow run");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "run printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    json["run"].as_str().expect("a run id").to_string()
}

/// Writes a run of `stages` items of the fan-out into the project's store, as running it
/// writes them; returns its id.
fn write_big_run(project: &Path, stages: usize) -> String {
    let id = "20260101-000000-big0".to_string();
    let mut store = SqliteStore::open(&project.join(".ralph-flow/state.db")).expect("store");
    let dir = project.join(".ralph-flow/runs").join(&id);
    let t0 = 1_767_225_600_000_i64;
    store
        .create_run(&RunRecord {
            id: id.clone(),
            workflow: "fanout".into(),
            file: "fanout.toml".into(),
            workflow_hash: String::new(),
            params: serde_json::json!({ "count": stages }),
            status: RunStatus::Running,
            exit: None,
            started_at: t0,
            updated_at: t0,
            dir: dir.display().to_string(),
            options: serde_json::json!({}),
        })
        .expect("run");
    let items: Vec<usize> = (0..stages).collect();
    let mut writes = vec![Write::Node(NodeRecord {
        run: id.clone(),
        scope: String::new(),
        node: "@items:each".into(),
        state: NodeState::Done,
        output: serde_json::json!(items),
        action: None,
        feedback: None,
        attempts: 1,
        usage: Usage::default(),
        started_at: t0,
        finished_at: t0,
    })];
    for i in 0..stages {
        let at = t0 + 1 + i64::try_from(i).unwrap_or(0);
        let scope = format!("each#{i}");
        let failed = i % 10 == 3;
        writes.push(Write::Attempt(AttemptRecord {
            run: id.clone(),
            scope: scope.clone(),
            node: "work".into(),
            attempt: 1,
            state: if failed {
                AttemptState::Failed
            } else {
                AttemptState::Ok
            },
            agent: None,
            dir: dir
                .join(&scope)
                .join("work/attempt-1")
                .display()
                .to_string(),
            error: failed.then(|| format!("exited with code 1: item {i}")),
            usage: Usage::default(),
            started_at: at,
            finished_at: Some(at),
        }));
        let state = if failed {
            NodeState::Failed
        } else {
            NodeState::Done
        };
        writes.push(Write::Event(Event {
            run: id.clone(),
            at,
            scope: scope.clone(),
            node: "work".into(),
            kind: state.as_str().into(),
            message: String::new(),
        }));
        writes.push(Write::Node(NodeRecord {
            run: id.clone(),
            scope,
            node: "work".into(),
            state,
            output: serde_json::json!({ "exit_code": i32::from(failed), "stdout": format!("item {i}\n"), "stderr": "" }),
            action: None,
            feedback: None,
            attempts: 1,
            usage: Usage::default(),
            started_at: at,
            finished_at: at,
        }));
        if writes.len() > 400 {
            store.commit(&writes).expect("commit");
            writes.clear();
        }
    }
    store.commit(&writes).expect("commit");
    store
        .set_status(&id, RunStatus::Interrupted, None)
        .expect("status");
    id
}

/// From an event committed by another process to the live parts that show it, `rounds`
/// times. The event is written with SQL of schema version 7 (which version 8 reads the same),
/// so that either binary's store takes it.
fn change_to_screen(server: &Server, project: &Path, run: &str, rounds: usize) -> Vec<Duration> {
    let db = rusqlite::Connection::open(project.join(".ralph-flow/state.db")).expect("store");
    let mut out = Vec::new();
    for round in 0..rounds {
        let mark = format!("bench change {round} {}", std::process::id());
        let mut changes = server.stream("/api/changes");
        let t = Instant::now();
        db.execute(
            "INSERT INTO events (run, seq, at, scope, node, kind, message) VALUES \
             (?1, 1000000000 + ?2, ?3, '', '', 'note', ?4)",
            rusqlite::params![
                run,
                i64::try_from(round).unwrap_or(0),
                1_767_225_700_000_i64,
                mark
            ],
        )
        .expect("insert");
        loop {
            let mut line = String::new();
            let n = changes.read_line(&mut line).expect("stream");
            assert!(n > 0, "the change stream ended");
            if line.trim_end() == "event: change" {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(60), "no change event");
        }
        // The browser's refresh: the live parts, until they show it (the first does).
        loop {
            let (_, body) = server.get(&format!("/live/runs/{run}"));
            if body.contains(&mark) {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "the change never showed"
            );
        }
        out.push(t.elapsed());
    }
    out
}

/// A running `ralph-flow serve`, stopped on drop.
struct Server {
    child: Child,
    addr: String,
    token: String,
}

impl Server {
    fn start(bin: &Path, project: &Path) -> Server {
        let mut child = Command::new(bin)
            .args(["serve", "--addr", "127.0.0.1:0", "--poll", "20ms"])
            .current_dir(project)
            .env_remove("RALPH_FLOW_TOKEN")
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("its URL");
        let (base, token) = line.trim().split_once("/?token=").expect("a URL");
        Server {
            addr: base.trim_start_matches("http://").to_string(),
            token: token.to_string(),
            child,
        }
    }

    fn connect(&self, path: &str) -> TcpStream {
        let mut s = TcpStream::connect(&self.addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(120)))
            .expect("timeout");
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
            self.addr, self.token
        )
        .expect("request");
        s
    }

    /// A GET: its status and body.
    fn get(&self, path: &str) -> (u16, String) {
        let mut raw = Vec::new();
        self.connect(path).read_to_end(&mut raw).expect("reply");
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = if head.to_lowercase().contains("transfer-encoding: chunked") {
            dechunk(body)
        } else {
            body.to_string()
        };
        (status, body)
    }

    /// Times `rounds` GETs of `path`; the body's size.
    fn time(&self, path: &str, rounds: usize) -> (Vec<Duration>, usize) {
        let mut times = Vec::new();
        let mut size = 0;
        for _ in 0..rounds {
            let t = Instant::now();
            let (status, body) = self.get(path);
            times.push(t.elapsed());
            assert_eq!(status, 200, "{path}: {body}");
            size = body.len();
        }
        (times, size)
    }

    /// A server-sent event stream, its head read.
    fn stream(&self, path: &str) -> BufReader<TcpStream> {
        let mut r = BufReader::new(self.connect(path));
        loop {
            let mut line = String::new();
            r.read_line(&mut line).expect("head");
            if line == "\r\n" || line.is_empty() {
                return r;
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("copy");
    for e in std::fs::read_dir(from).expect("copy") {
        let e = e.expect("copy");
        let target = to.join(e.file_name());
        if e.file_type().expect("copy").is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).expect("copy");
        }
    }
}
