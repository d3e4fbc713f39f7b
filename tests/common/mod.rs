//! A scratch project for end-to-end runs: a temp directory with workflows, scripted answers
//! and the fakes on PATH.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ralph_flow::store::Store;
use ralph_flow::store::sqlite::{SqliteStore, default_path};

/// The shipped Wiggum review preset, replayed offline on the demo (the README's main job):
/// the arguments of `ralph-flow run` in a checkout made by `demo_checkout`/`checkout_with`.
pub(crate) const WIGGUM_REPLAY: [&str; 8] = [
    "workflows/wiggum-review.toml",
    "--replay",
    "examples/wiggum-review.replay.jsonl",
    "--set",
    "criteria=examples/demo/criteria.md",
    "--set",
    "paths=examples/demo",
    "--json",
];

pub(crate) struct Project {
    dir: tempfile::TempDir,
}

/// What a run printed and how it ended.
pub(crate) struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    /// stdout as JSON, or null.
    pub json: serde_json::Value,
}

impl Out {
    /// What a finished process left: its exit code (-1 when a signal ended it), its output,
    /// and its stdout as JSON when it is JSON.
    pub(crate) fn of(out: &std::process::Output) -> Out {
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        Out {
            code: out.status.code().unwrap_or(-1),
            json: serde_json::from_str(&stdout).unwrap_or(serde_json::Value::Null),
            stdout,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

pub(crate) fn fakes() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fakes")
}

/// Makes sure that what the fakes need to check an output schema as the real CLIs do is
/// installed (tests/fakes/install-node-deps.sh: claude's Ajv, in target/schema-check): once
/// per test process, under a file lock shared by the test processes. Quick when installed.
/// An error (no node or npm, no registry) is reported once on stderr; the fakes then refuse
/// to decide a schema (exit 2) instead of accepting it.
pub(crate) fn node_deps() -> Result<(), String> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let result = install_node_deps(root);
        if let Err(e) = &result {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "node_deps: {e}");
        }
        result
    })
    .clone()
}

fn install_node_deps(root: &Path) -> Result<(), String> {
    let target = root.join("target");
    std::fs::create_dir_all(&target).map_err(|e| format!("{}: {e}", target.display()))?;
    let file =
        std::fs::File::create(target.join("schema-check.lock")).map_err(|e| e.to_string())?;
    // Held until the install is done (dropped at the end).
    let _lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| format!("locking target/schema-check.lock: {e}"))?;
    let out = Command::new("sh")
        .arg(root.join("tests/fakes/install-node-deps.sh"))
        .output()
        .map_err(|e| format!("running tests/fakes/install-node-deps.sh: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "tests/fakes/install-node-deps.sh failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// PATH with the fakes first (their schema checks installed: see [`node_deps`]).
fn path_env() -> String {
    let _ = node_deps();
    format!(
        "{}:{}",
        fakes().display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Tells whether a process is alive (a zombie counts as dead).
pub(crate) fn alive(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    if stat.is_empty() {
        return false;
    }
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or("");
    state != "Z" && state != "X"
}

impl Project {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("answers")).unwrap();
        Project { dir }
    }

    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn write(&self, rel: &str, text: &str) {
        let p = self.dir().join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(p, text).unwrap();
    }

    pub(crate) fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.dir().join(rel)).unwrap_or_default()
    }

    pub(crate) fn workflow(&self, rel: &str, text: &str) {
        self.write(rel, text);
    }

    /// Prepares the n-th answer of a scripted stage.
    pub(crate) fn answer(&self, stage: &str, n: u32, text: &str) {
        self.write(&format!("answers/{stage}/{n}"), text);
    }

    /// Returns the prompt of the n-th call of a scripted stage.
    pub(crate) fn prompt(&self, stage: &str, n: u32) -> String {
        self.read(&format!("answers/.prompt-{stage}-{n}"))
    }

    /// Counts the calls of a scripted stage.
    pub(crate) fn calls(&self, stage: &str) -> usize {
        self.read("answers/.calls")
            .lines()
            .filter(|l| l.split_whitespace().next() == Some(stage))
            .count()
    }

    pub(crate) fn probe_log(&self) -> String {
        self.read("probe.log")
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ralph-flow"));
        c.args(args)
            .current_dir(self.dir())
            .env("PATH", path_env())
            .env("SCRIPT_DIR", self.dir().join("answers"))
            .env("PROBE_LOG", self.dir().join("probe.log"))
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1");
        if matches!(args.first(), Some(&"run" | &"resume")) {
            c.args(["--progress", "plain", "--backoff", "10ms"]);
        }
        c
    }

    /// Runs ralph-flow to its end.
    pub(crate) fn run(&self, args: &[&str]) -> Out {
        let out = self.command(args).output().unwrap();
        Out::of(&out)
    }

    /// Runs ralph-flow to its end with extra environment variables.
    pub(crate) fn run_env(&self, args: &[&str], env: &[(&str, &str)]) -> Out {
        let mut c = self.command(args);
        for (k, v) in env {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        Out::of(&out)
    }

    /// Starts ralph-flow in the background.
    pub(crate) fn spawn(&self, args: &[&str]) -> Running {
        let child = self
            .command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Running { child }
    }

    /// Starts ralph-flow in the background with extra environment variables.
    pub(crate) fn spawn_env(&self, args: &[&str], env: &[(&str, &str)]) -> Running {
        let mut c = self.command(args);
        for (k, v) in env {
            c.env(k, v);
        }
        let child = c
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Running { child }
    }

    /// Waits (up to 30 s) until a condition holds.
    pub(crate) fn wait_for(&self, mut f: impl FnMut() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(30), "timed out waiting");
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    pub(crate) fn store(&self) -> Option<SqliteStore> {
        let path = default_path(&self.dir().join(".ralph-flow"));
        path.exists().then(|| SqliteStore::open(&path).unwrap())
    }

    /// Waits for the first run to exist and returns its id.
    pub(crate) fn wait_for_run(&self) -> String {
        let mut id = String::new();
        self.wait_for(|| {
            if let Some(s) = self.store() {
                if let Some(r) = s.runs(1).ok().and_then(|r| r.into_iter().next()) {
                    id = r.id;
                    return true;
                }
            }
            false
        });
        id
    }

    /// Everything the store holds, as text, for assertions.
    pub(crate) fn store_text(&self) -> String {
        let Some(s) = self.store() else {
            return String::new();
        };
        let mut out = String::new();
        for r in s.runs(100).unwrap() {
            out.push_str(&serde_json::to_string(&r).unwrap());
            out.push_str(&serde_json::to_string(&s.nodes(&r.id).unwrap()).unwrap());
            out.push_str(&serde_json::to_string(&s.events(&r.id, None).unwrap()).unwrap());
            out.push_str(&serde_json::to_string(&s.attempts(&r.id, None).unwrap()).unwrap());
        }
        out
    }

    pub(crate) fn git_init(&self) {
        self.git(&["init", "-q", "-b", "main"]);
        self.git(&["config", "user.email", "t@example.com"]);
        self.git(&["config", "user.name", "t"]);
        self.write(".gitignore", ".ralph-flow/\nanswers/\nprobe.log\n");
        self.git(&["add", ".gitignore"]);
        self.git(&["commit", "-qm", "init"]);
    }

    /// The last text named `name` that an attempt of the run left: a file of an attempt's
    /// directory (what a backend writes), else the executor's record of it in artifacts.jsonl.
    pub(crate) fn attempt_file(&self, name: &str) -> String {
        fn find(dir: &Path, name: &str) -> Option<PathBuf> {
            for e in std::fs::read_dir(dir).ok()?.flatten() {
                let path = e.path();
                if path.is_dir() {
                    if let Some(f) = find(&path, name) {
                        return Some(f);
                    }
                } else if path.file_name().is_some_and(|n| n == name) {
                    return Some(path);
                }
            }
            None
        }
        if let Some(text) = find(&self.dir().join(".ralph-flow"), name)
            .and_then(|f| std::fs::read_to_string(f).ok())
        {
            return text;
        }
        // What the executor writes is a record of the run's artifacts.jsonl.
        let records = find(&self.dir().join(".ralph-flow"), "artifacts.jsonl")
            .and_then(|f| std::fs::read_to_string(f).ok())
            .unwrap_or_default();
        records
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|r| {
                r["path"]
                    .as_str()
                    .is_some_and(|p| p.ends_with(&format!("/{name}")))
            })
            .filter_map(|r| r["text"].as_str().map(str::to_string))
            .next_back()
            .unwrap_or_default()
    }

    /// A project that is a git repository (`git_init`) pushed to a bare `origin` outside it,
    /// in the returned directory as `o.git`: a push that ran moves its `main`.
    pub(crate) fn with_origin() -> (Project, tempfile::TempDir) {
        let p = Project::new();
        p.git_init();
        let origin = tempfile::tempdir().unwrap();
        let o = origin.path().join("o.git");
        p.git(&["init", "-q", "--bare", o.to_str().unwrap()]);
        p.git(&["remote", "add", "origin", o.to_str().unwrap()]);
        p.git(&["push", "-q", "origin", "main"]);
        (p, origin)
    }

    pub(crate) fn git(&self, args: &[&str]) -> String {
        let out = Command::new("git")
            .args(args)
            .current_dir(self.dir())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// Starts a local HTTP server (wiremock) on a thread of its own, answering every POST with
/// `responder`, and returns its base URI. Runs of ralph-flow block the test's thread, so the
/// server needs its own runtime; it lives until the test process ends.
pub(crate) fn serve_posts(responder: impl wiremock::Respond + 'static) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let server = wiremock::MockServer::start().await;
            wiremock::Mock::given(wiremock::matchers::method("POST"))
                .respond_with(responder)
                .mount(&server)
                .await;
            tx.send(server.uri()).unwrap();
            std::future::pending::<()>().await;
        });
    });
    rx.recv().unwrap()
}

/// A ralph-flow process running in the background.
pub(crate) struct Running {
    child: Child,
}

impl Running {
    pub(crate) fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap()
    }

    pub(crate) fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig).unwrap();
    }

    pub(crate) fn finish(self) -> Out {
        let out = self.child.wait_with_output().unwrap();
        Out::of(&out)
    }
}

/// Copies a directory tree.
pub(crate) fn copy_dir(from: &Path, to: &Path) {
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

/// Makes `dir` a git repository (branch `main`) whose one commit holds everything in it.
pub(crate) fn commit_all(dir: &Path) {
    for args in [
        &["init", "-q", "-b", "main"][..],
        &["add", "-A"],
        &[
            "-c",
            "user.email=t@example.com",
            "-c",
            "user.name=t",
            "commit",
            "-qm",
            "scratch",
        ],
    ] {
        let ok = Command::new("git")
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    }
}

/// A clean git checkout of what the README's demo needs: the presets, their prompts and
/// schemas, and the examples (`.ralph-flow/` ignored).
pub(crate) fn demo_checkout() -> tempfile::TempDir {
    checkout_with(&[])
}

/// [`demo_checkout`] with more files (path, text), committed with the rest.
pub(crate) fn checkout_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    for d in ["workflows", "prompts", "schemas", "examples"] {
        copy_dir(&root.join(d), &dir.path().join(d));
    }
    std::fs::write(dir.path().join(".gitignore"), ".ralph-flow/\n").unwrap();
    for (path, text) in files {
        let path = dir.path().join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(path, text).unwrap();
    }
    commit_all(dir.path());
    dir
}

/// `c` under the shell's `ulimit` arguments (`-n 32`, `-f 4096`): the same program, arguments,
/// environment and directory, started by `sh -c 'ulimit ...; exec ...'`, so that a limit of
/// the machine is met for real (the shell exits 99 when it cannot set the limit).
pub(crate) fn under_ulimit(ulimit: &str, c: &Command) -> Command {
    let mut sh = Command::new("sh");
    sh.arg("-c")
        .arg(format!("ulimit {ulimit} || exit 99; exec \"$0\" \"$@\""))
        .arg(c.get_program())
        .args(c.get_args());
    for (key, value) in c.get_envs() {
        match value {
            Some(value) => sh.env(key, value),
            None => sh.env_remove(key),
        };
    }
    if let Some(dir) = c.get_current_dir() {
        sh.current_dir(dir);
    }
    sh
}

impl Project {
    /// Runs ralph-flow to its end under the shell's `ulimit` arguments (see
    /// [`under_ulimit`]).
    pub(crate) fn run_limited(&self, ulimit: &str, args: &[&str]) -> Out {
        let out = under_ulimit(ulimit, &self.command(args)).output().unwrap();
        Out::of(&out)
    }

    /// The newest run of the project's store: its id and status.
    pub(crate) fn last_run(&self) -> (String, ralph_flow::store::RunStatus) {
        let store = self.store().expect("a store");
        let run = store.runs(1).unwrap().into_iter().next().expect("a run");
        (run.id, run.status)
    }
}

/// What [`damage_root_page`] overwrites of a page.
pub(crate) enum Damage {
    /// Its header: `PRAGMA quick_check` itself then fails ("database disk image is
    /// malformed") instead of listing what it found.
    Header,
    /// Its cells: `PRAGMA quick_check` lists what it finds wrong.
    Cells,
}

/// Damages a SQLite store as a failing disk would: its log brought into the file (as a
/// checkpoint would), then the root page of the table or index `name` overwritten (0xA5).
pub(crate) fn damage_root_page(db: &Path, name: &str, damage: Damage) {
    let (page_size, root) = {
        let conn = rusqlite::Connection::open(db).unwrap();
        conn.pragma_update(None, "wal_checkpoint", "TRUNCATE")
            .unwrap();
        let page_size: usize = conn
            .pragma_query_value(None, "page_size", |r| r.get(0))
            .unwrap();
        let root: usize = conn
            .query_row(
                "SELECT rootpage FROM sqlite_master WHERE name = ?1",
                [name],
                |r| r.get(0),
            )
            .unwrap();
        (page_size, root)
    };
    let mut bytes = std::fs::read(db).unwrap();
    let start = (root - 1) * page_size;
    let range = match damage {
        Damage::Header => start..start + 8,
        Damage::Cells => start + 8..start + page_size,
    };
    for b in &mut bytes[range] {
        *b = 0xA5;
    }
    std::fs::write(db, bytes).unwrap();
}

/// The mock of the agents' APIs (`tests/realcli/mock_api.py`) that the real CLIs and ACP
/// agents are run against, killed when dropped.
pub(crate) struct MockApi {
    child: Child,
    pub(crate) port: u16,
}

impl MockApi {
    /// Starts `tests/realcli/mock_api.py` on a free port; `None` without python3.
    pub(crate) fn start() -> Option<MockApi> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/realcli/mock_api.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg("0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let mut line = String::new();
        BufReader::new(child.stdout.take()?)
            .read_line(&mut line)
            .ok()?;
        let port = line.trim().parse().ok()?;
        Some(MockApi { child, port })
    }
}

impl Drop for MockApi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
