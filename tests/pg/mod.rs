//! A real PostgreSQL server for the tests: started once per test binary with the machine's
//! `initdb` and `pg_ctl` on a temporary directory and a free loopback port (as the
//! `postgres` user when the tests run as root, which PostgreSQL refuses), and stopped when
//! the test process ends. Each test gets a database of its own.
//!
//! Without the binaries the tests that need it print SKIPPED and pass, unless
//! RALPH_FLOW_REQUIRE_POSTGRES=1 (CI sets it once it has installed the server).
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

struct Server {
    port: u16,
    pg_ctl: PathBuf,
    data: PathBuf,
    log: PathBuf,
    /// The server's options (`pg_ctl -o`), to start it again after [`stop`].
    opts: String,
}

static SERVER: OnceLock<Option<Server>> = OnceLock::new();
static NEXT_DB: AtomicUsize = AtomicUsize::new(0);

fn find(tool: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<PathBuf> = entries.flatten().map(|e| e.path().join("bin")).collect();
        versions.sort();
        dirs.extend(versions.into_iter().rev());
    }
    dirs.into_iter().map(|d| d.join(tool)).find(|p| p.is_file())
}

fn is_root() -> bool {
    // The effective uid, the second number of the `Uid:` line.
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
        .unwrap_or(false)
}

/// A command that runs as the `postgres` user when this process is root.
fn as_server_user(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start() -> Option<Server> {
    let (Some(initdb), Some(pg_ctl)) = (find("initdb"), find("pg_ctl")) else {
        let why = "SKIPPED: no initdb/pg_ctl (install Debian's postgresql)";
        if std::env::var_os("RALPH_FLOW_REQUIRE_POSTGRES").is_some_and(|v| v == "1") {
            panic!("{why}");
        }
        eprintln!("{why}");
        return None;
    };
    let dir = tempfile::Builder::new()
        .prefix("rf-pg-")
        .tempdir()
        .unwrap()
        .keep();
    if is_root() {
        let ok = Command::new("chown")
            .args(["-R", "postgres"])
            .arg(&dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "chown {}", dir.display());
    }
    let data = dir.join("data");
    let out = as_server_user(&initdb)
        .arg("-D")
        .arg(&data)
        .args(["-A", "trust", "-U", "rf", "-E", "UTF8", "--no-sync"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "initdb: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for attempt in 0..3 {
        let port = free_port();
        let opts = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            dir.display()
        );
        let ok = as_server_user(&pg_ctl)
            .arg("-D")
            .arg(&data)
            .args(["-o", &opts, "-l"])
            .arg(dir.join("log"))
            .args(["-w", "start"])
            .output()
            .unwrap()
            .status
            .success();
        if ok {
            // Stop the server when this test process ends, however it ends.
            let watcher = format!(
                "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; \
                 {stop} -D '{data}' -m immediate stop >/dev/null 2>&1; rm -rf '{dir}'",
                pid = std::process::id(),
                stop = if is_root() {
                    format!("runuser -u postgres -- '{}'", pg_ctl.display())
                } else {
                    format!("'{}'", pg_ctl.display())
                },
                data = data.display(),
                dir = dir.display(),
            );
            // It outlives this process on purpose: it stops the server once we are gone.
            #[allow(clippy::zombie_processes)]
            Command::new("sh")
                .args(["-c", &watcher])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            return Some(Server {
                port,
                pg_ctl: pg_ctl.clone(),
                data: data.clone(),
                log: dir.join("log"),
                opts,
            });
        }
        assert!(
            attempt < 2,
            "pg_ctl start failed: {}",
            std::fs::read_to_string(dir.join("log")).unwrap_or_default()
        );
    }
    None
}

/// The URL of a new, empty database on the shared server; `None` when there is no server.
pub(crate) fn database() -> Option<String> {
    let server = SERVER.get_or_init(start).as_ref()?;
    let name = format!(
        "t{}_{}",
        std::process::id(),
        NEXT_DB.fetch_add(1, Ordering::SeqCst)
    );
    let admin = format!("postgres://rf@127.0.0.1:{}/postgres", server.port);
    let mut c = postgres::Client::connect(&admin, postgres::NoTls).unwrap();
    c.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
    Some(format!("postgres://rf@127.0.0.1:{}/{name}", server.port))
}

/// Restarts the server (every connection is cut; the port stays), as a failover or an
/// upgrade would. Only for a test binary whose tests all expect it.
pub(crate) fn restart() {
    pg_ctl("restart", &["-l", LOG, "-m", "fast", "-w", "restart"]);
}

/// Stops the server (every connection is cut, new ones refused) until [`start_again`]: an
/// outage. Only for a test binary whose tests all expect it.
pub(crate) fn stop() {
    pg_ctl("stop", &["-m", "fast", "-w", "stop"]);
}

/// Starts the server again after [`stop`], on the same port.
pub(crate) fn start_again() {
    pg_ctl("start", &["-o", OPTS, "-l", LOG, "-w", "start"]);
}

/// Stands for the server's log file in [`pg_ctl`]'s arguments.
const LOG: &str = "{log}";
/// Stands for the server's options in [`pg_ctl`]'s arguments.
const OPTS: &str = "{opts}";

/// Runs `pg_ctl -D DATA ARGS` on the running server ([`LOG`] and [`OPTS`] replaced by its
/// log file and options) and fails the test, with the server's log, unless it succeeds.
/// The server's output goes to its log: a pipe it held would never close.
fn pg_ctl(what: &str, args: &[&str]) {
    let server = SERVER
        .get()
        .and_then(Option::as_ref)
        .expect("a server is running");
    let mut command = as_server_user(&server.pg_ctl);
    command.arg("-D").arg(&server.data);
    for &arg in args {
        match arg {
            LOG => command.arg(&server.log),
            OPTS => command.arg(&server.opts),
            other => command.arg(other),
        };
    }
    let ok = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(
        ok,
        "pg_ctl {what}: {}",
        std::fs::read_to_string(&server.log).unwrap_or_default()
    );
}
