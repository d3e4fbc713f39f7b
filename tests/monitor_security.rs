//! `ralph-flow serve`'s own defences, over HTTP as tests/monitor.rs talks to it: the access
//! token a user gives must be strong, a request must name the monitor in its `Host`
//! (DNS-rebinding protection), and `--addr` takes a host name.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_ralph-flow")
}

fn command(dir: &Path, args: &[&str], token: Option<&str>) -> Command {
    let mut c = Command::new(bin());
    c.arg("serve")
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .env_remove("RALPH_FLOW_TOKEN")
        .env("NO_COLOR", "1");
    if let Some(t) = token {
        c.env("RALPH_FLOW_TOKEN", t);
    }
    c
}

/// Starts `serve`, expecting it to refuse: (exit code, stderr). A server that starts instead
/// is stopped and fails the test.
fn refused(dir: &Path, args: &[&str], token: Option<&str>) -> (i32, String) {
    let mut child = command(dir, args, token)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status.code().unwrap_or(-1), err);
        }
        if t.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("serve {args:?} with token {token:?} started instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A running `serve`, stopped on drop.
struct Server {
    child: Child,
    /// The URL it printed, with its token.
    url: String,
    port: u16,
    token: String,
}

impl Server {
    fn start(dir: &Path, args: &[&str], token: Option<&str>) -> Server {
        let mut child = command(dir, args, token)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line.trim().to_string();
        let (base, token) = url
            .split_once("/?token=")
            .unwrap_or_else(|| panic!("serve {args:?} printed {url:?}"));
        let port = base.rsplit_once(':').unwrap().1.parse().unwrap();
        Server {
            token: token.to_string(),
            url,
            port,
            child,
        }
    }

    /// A GET of `path` on 127.0.0.1 with the bearer token and this `Host`: (status, body).
    fn get_as(&self, host: &str, path: &str) -> (u16, String) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
            self.token
        );
        s.write_all(req.as_bytes()).unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let text = String::from_utf8_lossy(&raw).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text
            .split_once("\r\n\r\n")
            .map_or("", |(_, b)| b)
            .to_string();
        (status, body)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_weak_token_is_refused_saying_what_is_wrong_and_how_to_make_one() {
    let dir = tempfile::tempdir().unwrap();
    let remote = ["--addr", "127.0.0.1:0", "--allow-remote"];
    let spaces = " ".repeat(16);
    for (token, why) in [
        (spaces.as_str(), "is only whitespace"),
        ("0123456789 abcdef", "holds whitespace"),
        ("0123456789abcde", "15 characters long, fewer than 16"),
        ("short", "5 characters long"),
        ("xxxxxxxxxxxxxxxxxxxxxxxx", "one character repeated"),
        ("0123456789abcdef;x", "holds ';'"),
    ] {
        let (code, err) = refused(dir.path(), &remote, Some(token));
        assert_eq!(code, 3, "{token:?}: {err}");
        assert!(err.contains(why), "{token:?}: {err}");
        assert!(
            err.contains("RALPH_FLOW_TOKEN") && err.contains("openssl rand -hex 16"),
            "{token:?}: {err}"
        );
    }
    // A token given is checked on loopback too (not silently replaced by a random one);
    // there, unsetting it is the other way out.
    let (code, err) = refused(dir.path(), &["--addr", "127.0.0.1:0"], Some(&spaces));
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("unset RALPH_FLOW_TOKEN"), "{err}");
    let (code, err) = refused(dir.path(), &remote, None);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("openssl rand -hex 16"), "{err}");

    let good = "4f1c2a9e07b3d58c6e2f91a0b7c4d3e5";
    let s = Server::start(dir.path(), &remote, Some(good));
    assert_eq!(s.token, good, "{}", s.url);
    let (status, body) = s.get_as(&format!("127.0.0.1:{}", s.port), "/api/runs");
    assert_eq!((status, body.as_str()), (200, "[]"));
}

#[test]
fn a_request_for_another_host_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &["--addr", "127.0.0.1:0"], None);
    let port = s.port;
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "127.0.0.1".to_string(),
        "localhost".to_string(),
    ] {
        let (status, body) = s.get_as(&host, "/api/runs");
        assert_eq!(status, 200, "Host: {host}: {body}");
    }
    for host in [
        "evil.example".to_string(),
        format!("evil.example:{port}"),
        format!("localhost:{}", port.wrapping_add(1)),
        format!("localhost.evil.example:{port}"),
    ] {
        let (status, body) = s.get_as(&host, "/api/runs");
        assert_eq!(status, 421, "Host: {host}: {body}");
        assert!(
            body.contains("DNS rebinding") && body.contains("--allow-host"),
            "{body}"
        );
        // Refused before the token is even looked at.
        let (status, _) = s.get_as(&host, "/");
        assert_eq!(status, 421, "Host: {host}");
    }

    // A name the user vouches for is answered to.
    let named = Server::start(
        dir.path(),
        &["--addr", "127.0.0.1:0", "--allow-host", "monitor.test"],
        None,
    );
    let (status, body) = named.get_as(&format!("monitor.test:{}", named.port), "/api/runs");
    assert_eq!(status, 200, "{body}");
    let (status, _) = named.get_as(&format!("other.test:{}", named.port), "/api/runs");
    assert_eq!(status, 421);
    let (code, err) = refused(
        dir.path(),
        &[
            "--addr",
            "127.0.0.1:0",
            "--allow-host",
            "http://monitor.test:80",
        ],
        None,
    );
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("--allow-host"), "{err}");
}

#[test]
fn addr_takes_a_host_name() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &["--addr", "localhost:0"], None);
    assert!(
        s.url
            .starts_with(&format!("http://localhost:{}/?token=", s.port)),
        "{}",
        s.url
    );
    let (status, body) = s.get_as(&format!("localhost:{}", s.port), "/api/runs");
    assert_eq!((status, body.as_str()), (200, "[]"));

    for (addr, why) in [
        ("localhost", "is not HOST:PORT"),
        ("::1:7700", "is not HOST:PORT"),
        ("no-such-host.invalid:0", "cannot find the addresses of"),
    ] {
        let (code, err) = refused(dir.path(), &["--addr", addr], None);
        assert_eq!(code, 3, "{addr}: {err}");
        assert!(err.contains(why), "{addr}: {err}");
    }
}
