//! Killing what a program started: its process group, and the processes that carry its tag
//! in their environment (descendants that left the group).

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

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
        // Nothing left of the group: nothing to do (and no thread to start).
        if killpg(self.pgid, None).is_err() {
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
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == wanted.as_bytes()))
        })
        .filter_map(|pid| i32::try_from(pid).ok())
        .collect()
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
