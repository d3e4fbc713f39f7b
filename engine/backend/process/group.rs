//! Killing what a program started: its process group, and the processes that carry its tag
//! in their environment (descendants that left the group).
//!
//! Descendants that left the group (`setsid`: a daemon, a double fork) can only be found by
//! their tag, which takes reading every process's environment (`/proc/PID/environ`): 1.5 ms
//! for 80 processes on the project's 2-core VM, more than a whole command stage (0.8 ms). A
//! program that ends by itself with nothing left in its group (almost every program)
//! therefore hands its tag to the [sweeper](queue_sweep), a thread that looks for the tags
//! of every program that ended since its last look in one scan, at most once a
//! [`SWEEP_INTERVAL`]: the cost stays off the stage's path, and bounded however many
//! stages end. (A child subreaper, `PR_SET_CHILD_SUBREAPER`, would bring such orphans to
//! this process instead, but it changes the whole process: every orphan becomes a zombie of
//! ours that only a `waitpid` on all children would reap, which would take the exit
//! statuses that tokio and `std::process` wait for.) The end of a run stops whatever still
//! carries its id, and waits for it (`run::lifecycle`), so nothing of a run outlives it even
//! while a sweep is pending.

use std::collections::HashSet;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use super::leftovers::start_ticks;
use super::{KILL_GRACE, TAG_ENV};

/// Owns a process group: when dropped, signals whatever is left of it (SIGTERM at once,
/// then SIGKILL after [`KILL_GRACE`] from a detached thread, so that dropping never blocks).
/// A cancelled program's descendants that left the group are killed too (by their tag).
pub(super) struct GroupGuard {
    pub(super) pgid: Pid,
    pub(super) tag: String,
}

impl GroupGuard {
    /// Sends a signal to the group; a group already gone is not an error.
    pub(super) fn signal(&self, signal: Signal) {
        let _ = killpg(self.pgid, signal);
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        // Nothing left of the group: only descendants that left it may remain, which the
        // sweeper looks for (no scan here, no thread to start).
        if killpg(self.pgid, None).is_err() {
            queue_sweep(std::mem::take(&mut self.tag));
            return;
        }
        self.signal(Signal::SIGTERM);
        let pgid = self.pgid;
        let tag = std::mem::take(&mut self.tag);
        std::thread::spawn(move || {
            std::thread::sleep(KILL_GRACE);
            let _ = killpg(pgid, Signal::SIGKILL);
            kill_tagged(&tag);
        });
    }
}

/// A tag no other program of this machine carries: this process's id, a counter and the
/// time.
pub(super) fn new_tag() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!(
        "{}-{}-{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The processes whose environment holds `KEY=VALUE` (those this user may read), other
/// than this process.
pub fn processes_with_env(key: &str, value: &str) -> Vec<i32> {
    let wanted = format!("{key}={value}");
    processes_where(|var| var == wanted.as_bytes())
}

/// The processes (those this user may read, other than this process) with a variable in
/// their environment for which `wanted` holds: one read of `/proc` for any number of tags.
fn processes_where(mut wanted: impl FnMut(&[u8]) -> bool) -> Vec<i32> {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(&mut wanted))
        })
        .filter_map(|pid| i32::try_from(pid).ok())
        .collect()
}

/// The processes tagged with any of `tags` (the values of [`TAG_ENV`]).
fn processes_tagged(tags: &HashSet<String>) -> Vec<i32> {
    let prefix = format!("{TAG_ENV}=");
    processes_where(|var| {
        var.strip_prefix(prefix.as_bytes())
            .and_then(|v| std::str::from_utf8(v).ok())
            .is_some_and(|v| tags.contains(v))
    })
}

/// The least time between two sweeps: what bounds their cost when programs end by the
/// thousand (a chain of command stages), while a lone program's leftovers are looked for
/// at once.
pub(super) const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Hands the tag of a program that ended, its group empty, to the sweeper. Without a
/// sweeper (its thread could not start) the tag is looked for here and now.
pub(super) fn queue_sweep(tag: String) {
    static SWEEPER: std::sync::OnceLock<Option<mpsc::Sender<String>>> = std::sync::OnceLock::new();
    if tag.is_empty() {
        return;
    }
    let sender = SWEEPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("ralph-flow-sweeper".into())
            .spawn(move || sweep(&rx))
            .ok()
            .map(|_| tx)
    });
    match sender {
        Some(tx) => {
            if let Err(mpsc::SendError(tag)) = tx.send(tag) {
                stop_tagged(&HashSet::from([tag]));
            }
        }
        None => stop_tagged(&HashSet::from([tag])),
    }
}

/// The sweeper's loop: the tags that came since the last sweep, looked for in one scan.
fn sweep(rx: &mpsc::Receiver<String>) {
    let mut last: Option<Instant> = None;
    while let Ok(first) = rx.recv() {
        if let Some(next) = last.map(|l| l + SWEEP_INTERVAL) {
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        let tags: HashSet<String> = std::iter::once(first).chain(rx.try_iter()).collect();
        last = Some(Instant::now());
        stop_tagged(&tags);
    }
}

/// Stops the processes tagged with any of `tags`: SIGTERM now, SIGKILL after
/// [`KILL_GRACE`] (from a thread of its own, so that the caller goes on) to those still
/// there and to any they started meanwhile. A pid is killed only while it names the same
/// process (its start time): one reused in the meantime is left alone.
fn stop_tagged(tags: &HashSet<String>) {
    let found: Vec<(i32, Option<u64>)> = processes_tagged(tags)
        .into_iter()
        .map(|pid| (pid, start_ticks(pid)))
        .collect();
    if found.is_empty() {
        return;
    }
    tracing::debug!(
        "stopping {} process(es) that outlived their program",
        found.len()
    );
    for &(pid, _) in &found {
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
    let tags = tags.clone();
    let _ = std::thread::Builder::new()
        .name("ralph-flow-sweeper-kill".into())
        .spawn(move || {
            std::thread::sleep(KILL_GRACE);
            for (pid, started) in found {
                if started.is_some() && start_ticks(pid) == started {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
            for pid in processes_tagged(&tags) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        });
}

/// Kills (SIGKILL) every process tagged with one run of a program.
pub(super) fn kill_tagged(tag: &str) {
    if tag.is_empty() {
        return;
    }
    for pid in processes_with_env(TAG_ENV, tag) {
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}
