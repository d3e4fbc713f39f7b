//! What people read of each attempt travels through a shared store (tests/pg): a run that a
//! worker in state directory A coordinated is exported, listed by `logs` and shown by the
//! monitor from state directory B (another machine: A's run directory is gone by then), the
//! same records as A's `artifacts.jsonl`, with the run's secret masked in the store. On
//! SQLite, and for a run whose records the store does not have (written before it kept
//! them), `export` reads `artifacts.jsonl`.
#![allow(clippy::unwrap_used)]

mod pg;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ralph_flow::store::postgres::PgStore;
use ralph_flow::store::{RunStatus, Store};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_ralph-flow")
}

const SECRET: &str = "art-s3cret-4f9a17c2";

/// An agent (a command answering JSON) whose reply holds the run's secret, on a worker with
/// its label; then a command stage, whose stdout the unit answers.
const WORKFLOW: &str = r#"name = "ask"
secrets = ["ART_SECRET"]

[agents.echo]
kind = "command"
command = ["sh", "-c", 'read -r prompt; printf "{\"said\": \"%s\", \"key\": \"%s\"}" "$prompt" "$ART_SECRET"']

[stages.ask]
kind = "agent"
agent = "echo"
labels = ["llm"]
prompt = "hello {{ run.id }}"
output = { extract = "json", schema = { type = "object", required = ["said"] } }

[stages.after]
kind = "command"
needs = ["ask"]
argv = ["sh", "-c", "echo \"$1\"; echo to-stderr >&2", "sh", "{{ stages.ask.output.said }}"]
"#;

/// A command in `dir` (a machine's state directory and working directory) on the store.
fn command(dir: &Path, url: &str, args: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.args(args)
        .current_dir(dir)
        .env("RALPH_FLOW_STORE", url)
        .env("NO_COLOR", "1")
        .env_remove("RALPH_FLOW_LEASE")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    c
}

fn output(mut c: Command) -> (i32, String, String) {
    let out = c.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A run's records as `artifacts.jsonl` holds them (a later line of a path replacing an
/// earlier one).
fn jsonl(path: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut records = BTreeMap::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        records.insert(
            v["path"].as_str().unwrap().to_string(),
            v["text"].as_str().unwrap().to_string(),
        );
    }
    records
}

/// Every file under `dir`, by path relative to it, with its text.
fn files(dir: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                out.insert(rel, std::fs::read_to_string(&p).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// A `ralph-flow serve` in `dir` on the store: its base URL and token.
struct Monitor {
    child: std::process::Child,
    addr: String,
    token: String,
}

impl Monitor {
    fn start(dir: &Path, url: &str) -> Monitor {
        use std::io::BufRead as _;
        let mut c = command(dir, url, &["serve", "--addr", "127.0.0.1:0"]);
        c.env_remove("RALPH_FLOW_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = c.spawn().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let (base, token) = line
            .trim()
            .split_once("/?token=")
            .unwrap_or_else(|| panic!("serve printed {line:?}"));
        Monitor {
            addr: base.trim_start_matches("http://").to_string(),
            token: token.to_string(),
            child,
        }
    }

    /// A GET with the token: (status line, body).
    fn get(&self, path: &str) -> (String, String) {
        use std::io::{Read as _, Write as _};
        let mut s = std::net::TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
            self.addr, self.token
        )
        .unwrap();
        let mut reply = Vec::new();
        s.read_to_end(&mut reply).unwrap();
        let reply = String::from_utf8_lossy(&reply).into_owned();
        let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
        (
            head.lines().next().unwrap_or_default().to_string(),
            body.to_string(),
        )
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_run_a_worker_coordinated_is_read_from_another_machine_through_the_store() {
    let Some(url) = pg::database() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    for d in [&a, &b] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(b.join("wf.toml"), WORKFLOW).unwrap();
    // Queued from B; carried out by a worker in A, which knows the secret.
    let (code, id, err) = output(command(&b, &url, &["run", "wf.toml", "--detach"]));
    assert_eq!(code, 0, "{err}");
    let id = id.trim().to_string();
    let log = std::fs::File::create(tmp.path().join("worker.log")).unwrap();
    let mut worker = command(&a, &url, &["worker", "--poll", "300ms", "--labels", "llm"]);
    worker
        .arg("--state-dir")
        .arg(&a)
        .env("ART_SECRET", SECRET)
        .stdout(Stdio::null())
        .stderr(log);
    let mut worker = worker.spawn().unwrap();
    let store = PgStore::connect(&url).unwrap();
    let t = Instant::now();
    while store.run(&id).unwrap().map(|r| r.status) != Some(RunStatus::Finished) {
        if t.elapsed() > Duration::from_secs(90) {
            let _ = worker.kill();
            panic!(
                "the run did not finish; the worker said:\n{}",
                std::fs::read_to_string(tmp.path().join("worker.log")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = worker.kill();
    let _ = worker.wait();
    let run = store.run(&id).unwrap().unwrap();
    assert_eq!(run.exit, Some(("success".into(), 0)));

    // A's records: in its run directory, and in the store, the same (the store read here
    // masks nothing: this process knows no secret).
    let run_dir = Path::new(&run.dir);
    assert!(run_dir.starts_with(&a), "{}", run.dir);
    let in_a = jsonl(&run_dir.join("artifacts.jsonl"));
    let stored: BTreeMap<String, String> = store
        .records(&id, "")
        .unwrap()
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(stored, in_a);
    for path in [
        "ask/attempt-1/prompt.md",
        "ask/attempt-1/raw.txt",
        "after/attempt-1/command.json",
        "after/attempt-1/stdout",
        "after/attempt-1/stderr",
    ] {
        assert!(stored.contains_key(path), "{path}: {:?}", stored.keys());
    }
    assert_eq!(stored["ask/attempt-1/prompt.md"], format!("hello {id}"));
    assert_eq!(stored["after/attempt-1/stdout"], format!("hello {id}\n"));
    assert_eq!(stored["after/attempt-1/stderr"], "to-stderr\n");
    assert!(
        stored["ask/attempt-1/raw.txt"].contains("\"key\": \"")
            && stored.values().all(|t| !t.contains(SECRET)),
        "the secret is masked in the store: {stored:?}"
    );
    // One attempt's records, by its key.
    let ask: Vec<String> = store
        .records(&id, "ask/attempt-1/")
        .unwrap()
        .unwrap()
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert!(
        !ask.is_empty() && ask.iter().all(|p| p.starts_with("ask/attempt-1/")),
        "{ask:?}"
    );

    // A is another machine: its run directory is not here.
    std::fs::remove_dir_all(run_dir).unwrap();

    // `export` from B writes the files A's records held.
    let out = tmp.path().join("exported");
    let (code, said, err) = output(command(
        &b,
        &url,
        &["export", &id, "--out", out.to_str().unwrap()],
    ));
    assert_eq!(code, 0, "{err}");
    assert!(
        said.contains(&format!("wrote {} files", in_a.len())),
        "{said}"
    );
    assert_eq!(files(&out), in_a);
    // Without `--out`, the run's directory (A's) is not on this machine: said, nothing written.
    let (code, _, err) = output(command(&b, &url, &["export", &id]));
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("not on this machine") && err.contains("--out DIR"),
        "{err}"
    );
    assert!(!run_dir.exists());

    // `logs --stage` from B lists the attempt's records, and shows them with `--text`.
    let (code, said, err) = output(command(&b, &url, &["logs", &id, "--stage", "ask"]));
    assert_eq!(code, 0, "{err}");
    assert!(said.contains("ask/attempt-1/prompt.md"), "{said}");
    let (code, said, err) = output(command(
        &b,
        &url,
        &["logs", &id, "--stage", "ask", "--text"],
    ));
    assert_eq!(code, 0, "{err}");
    assert!(said.contains(&format!("hello {id}")), "{said}");
    let (code, said, err) = output(command(
        &b,
        &url,
        &["logs", &id, "--stage", "after", "--json"],
    ));
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&said).unwrap();
    assert_eq!(
        v["records"]["after/attempt-1/stdout"],
        format!("hello {id}\n")
    );

    // The monitor served from B shows the attempt's prompt.
    let m = Monitor::start(&b, &url);
    let (status, page) = m.get(&format!("/runs/{id}/stage?node=ask"));
    assert!(status.contains("200"), "{status}: {page}");
    assert!(page.contains(&format!("hello {id}")), "{page}");
    let (status, text) = m.get(&format!("/api/runs/{id}/artifacts/ask/attempt-1/prompt.md"));
    assert!(status.contains("200"), "{status}: {text}");
    assert!(text.contains(&format!("hello {id}")), "{text}");
}

#[test]
fn a_run_whose_records_the_store_lacks_exports_from_its_artifacts_file() {
    let Some(url) = pg::database() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("wf.toml"),
        "name = \"one\"\n[stages.s]\nkind = \"command\"\nargv = [\"echo\", \"hi\"]\n",
    )
    .unwrap();
    let (code, _, err) = output(command(tmp.path(), &url, &["run", "wf.toml"]));
    assert_eq!(code, 0, "{err}");
    let store = PgStore::connect(&url).unwrap();
    let run = store.runs(1).unwrap().remove(0);
    assert!(store.records(&run.id, "").unwrap().is_some());
    // As a run written before the store kept records.
    let mut db = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    db.execute("DELETE FROM artifacts WHERE run = $1", &[&run.id])
        .unwrap();
    assert!(store.records(&run.id, "").unwrap().is_none());
    let out = tmp.path().join("out");
    let (code, _, err) = output(command(
        tmp.path(),
        &url,
        &["export", &run.id, "--out", out.to_str().unwrap()],
    ));
    assert_eq!(code, 0, "{err}");
    let written = files(&out);
    assert_eq!(written, jsonl(&Path::new(&run.dir).join("artifacts.jsonl")));
    assert!(
        written.contains_key("s/attempt-1/command.json"),
        "{written:?}"
    );
}

#[test]
fn on_sqlite_export_reads_the_artifacts_file() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("wf.toml"),
        "name = \"one\"\n[stages.s]\nkind = \"command\"\nargv = [\"sh\", \"-c\", \"echo hi; exit 1\"]\n",
    )
    .unwrap();
    let run = |args: &[&str]| {
        let mut c = Command::new(bin());
        c.args(args)
            .current_dir(tmp.path())
            .env_remove("RALPH_FLOW_STORE")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null());
        output(c)
    };
    let (code, _, err) = run(&["run", "wf.toml"]);
    assert_ne!(code, 0, "{err}");
    let (_, said, _) = run(&["runs", "--json"]);
    let runs: serde_json::Value = serde_json::from_str(&said).unwrap();
    let id = runs[0]["id"].as_str().unwrap().to_string();
    let dir = tmp.path().join(format!(".ralph-flow/runs/{id}"));
    let out = tmp.path().join("out");
    let (code, _, err) = run(&["export", &id, "--out", out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let written = files(&out);
    assert_eq!(written, jsonl(&dir.join("artifacts.jsonl")));
    assert!(
        written.contains_key("s/attempt-1/feedback.md"),
        "{written:?}"
    );
    let (code, said, err) = run(&["logs", &id, "--stage", "s", "--text"]);
    assert_eq!(code, 0, "{err}");
    assert!(said.contains("s/attempt-1/command.json"), "{said}");
    assert!(said.contains("\"exit_code\": 1"), "{said}");
}
