//! A program talked to while it runs: its stdin and stdout are the caller's (an ACP agent's
//! JSON-RPC), its stderr is captured as [`run`](super::run) captures it, and it lives in a
//! process group of its own, killed with whatever it started when the [`Session`] ends or is
//! dropped.

use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::group::{GroupGuard, kill_tagged, new_tag};
use super::leftovers::{PidFile, StartWindow, boot_ticks};
use super::sink::Sink;
use super::spawn::{mask_streamed, start_error};
use super::{EOF_GRACE, KILL_GRACE, ProcSpec, SpawnError, SpawnFailure, TAG_ENV};

/// A running program and its pipes. Dropping it kills its group (SIGTERM, then SIGKILL after
/// [`KILL_GRACE`]).
pub struct Session {
    /// Its stdin, for the caller to write to (`None` once taken).
    pub stdin: Option<ChildStdin>,
    /// Its stdout, for the caller to read (`None` once taken).
    pub stdout: Option<ChildStdout>,
    child: Child,
    group: GroupGuard,
    stderr: Arc<Mutex<Sink>>,
    reader: Option<tokio::task::JoinHandle<()>>,
    stderr_path: Option<std::path::PathBuf>,
    _pid_file: Option<PidFile>,
}

/// How a session's program ended.
#[derive(Clone, Debug, Default)]
pub struct SessionEnd {
    /// The exit code, when it exited normally.
    pub code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// The end of its stderr (at most [`MEMORY_CAP`](super::MEMORY_CAP) bytes).
    pub stderr: Vec<u8>,
}

/// Starts a program with piped stdin and stdout, in a new process group; stderr streams to
/// `spec.stderr_path`. `spec.stdin`, `stdout_path`, the timeouts and `result_done` are the
/// caller's business here and are not used.
pub async fn start(spec: &ProcSpec) -> Result<Session, SpawnError> {
    let Some((program, args)) = spec.argv.split_first() else {
        return Err(SpawnFailure::EmptyCommand.into());
    };
    let tag = new_tag();
    let mut command = Command::new(program);
    command
        .args(args)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .env(TAG_ENV, &tag)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if !spec.cwd.as_os_str().is_empty() {
        command.current_dir(&spec.cwd);
    }
    let before = boot_ticks();
    let spawned = command.spawn();
    let started = StartWindow {
        from: before,
        to: boot_ticks(),
    };
    let mut child = spawned.map_err(|e| start_error(spec, program, e))?;
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .ok_or_else(|| SpawnFailure::NoProcessId(program.clone()))?;
    let group = GroupGuard {
        pgid: Pid::from_raw(pid),
        tag,
    };
    let pid_file = spec
        .pid_file
        .as_deref()
        .map(|path| PidFile::write(path, pid, started))
        .transpose()?;
    let stderr = Arc::new(Mutex::new(Sink::new(spec.stderr_path.as_deref())));
    let reader = child.stderr.take().map(|mut pipe| {
        let sink = Arc::clone(&stderr);
        tokio::spawn(async move {
            let mut buf = [0u8; 8192];
            while let Ok(n) = pipe.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                if let Ok(mut sink) = sink.lock() {
                    sink.push(&buf[..n]);
                }
            }
        })
    });
    Ok(Session {
        stdin: child.stdin.take(),
        stdout: child.stdout.take(),
        child,
        group,
        stderr,
        reader,
        stderr_path: spec.stderr_path.clone(),
        _pid_file: pid_file,
    })
}

impl Session {
    /// The last bytes of stderr so far, as text.
    pub fn stderr_text(&self) -> String {
        self.stderr
            .lock()
            .map(|s| String::from_utf8_lossy(&s.kept).into_owned())
            .unwrap_or_default()
    }

    /// Waits for the program to exit by itself (cancel-safe).
    pub async fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.wait().await.ok()
    }

    /// Ends the program: its stdin closed, up to `grace` for it to exit by itself, then
    /// SIGTERM to its group, [`KILL_GRACE`] more, then SIGKILL (and its tagged descendants).
    /// Its stderr is then read to its end (at most [`EOF_GRACE`] more), its file finished and
    /// masked of secrets.
    pub async fn end(mut self, grace: std::time::Duration) -> SessionEnd {
        drop(self.stdin.take());
        let mut status = tokio::time::timeout(grace, self.child.wait())
            .await
            .ok()
            .and_then(Result::ok);
        if status.is_none() {
            self.group.signal(Signal::SIGTERM);
            status = tokio::time::timeout(KILL_GRACE, self.child.wait())
                .await
                .ok()
                .and_then(Result::ok);
        }
        // What is left of its group, and descendants that left it, get no more time.
        self.group.signal(Signal::SIGKILL);
        kill_tagged(&self.group.tag);
        if status.is_none() {
            status = self.child.wait().await.ok();
        }
        if let Some(reader) = self.reader.take() {
            let _ = tokio::time::timeout(EOF_GRACE, reader).await;
        }
        let kept = match self.stderr.lock() {
            Ok(mut sink) => {
                sink.finish();
                mask_streamed(&sink, self.stderr_path.as_deref());
                sink.kept.clone()
            }
            Err(_) => Vec::new(),
        };
        SessionEnd {
            code: status.and_then(|s| s.code()),
            signal: status.and_then(|s| s.signal()),
            stderr: kept,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    #[tokio::test]
    async fn a_session_talks_and_ends() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let spec = ProcSpec {
            argv: vec![
                "sh".into(),
                "-c".into(),
                "read line; echo \"got $line\"; echo oops >&2; exec sleep 30".into(),
            ],
            stderr_path: Some(dir.path().join("stderr")),
            ..ProcSpec::default()
        };
        let mut s = start(&spec).await.expect("started");
        let mut stdin = s.stdin.take().expect("stdin");
        stdin.write_all(b"hello\n").await.expect("written");
        let mut lines = BufReader::new(s.stdout.take().expect("stdout")).lines();
        let line = lines.next_line().await.expect("read");
        assert_eq!(line.as_deref(), Some("got hello"));
        drop(stdin);
        let end = s.end(std::time::Duration::from_millis(100)).await;
        assert_eq!(end.signal, Some(15), "{end:?}");
        assert_eq!(String::from_utf8_lossy(&end.stderr), "oops\n");
        let file = std::fs::read_to_string(dir.path().join("stderr")).expect("stderr file");
        assert_eq!(file, "oops\n");
    }

    #[tokio::test]
    async fn a_missing_program_is_not_found() {
        let spec = ProcSpec {
            argv: vec!["surely-not-a-program-8d1e".into()],
            ..ProcSpec::default()
        };
        let e = start(&spec).await.err().expect("not found");
        assert!(matches!(e, SpawnError::NotFound { .. }), "{e:?}");
    }
}
