//! Whether the process that holds a run's lock is provably gone: the one shortcut to a
//! takeover before its lease ends (see [`LockOwner::lapsed`](super::LockOwner::lapsed)).
//!
//! A pid alone proves nothing: it may be reused by an unrelated process, belong to another
//! PID namespace (a container with the same host name) or to a zombie. So a lock records,
//! beside its pid, the process's start time (`/proc/PID/stat`, field 22), the boot id
//! (`/proc/sys/kernel/random/boot_id`) and the PID namespace (the inode of
//! `/proc/self/ns/pid`). Its holder is gone for sure only when the boot and the namespace are
//! ours (so the pid means the same process here) and that pid is free, a zombie, or a
//! process that started at another time. Anything else, unknown included, is left to the
//! lease.

use std::os::unix::fs::MetadataExt;

/// Who a process is on this machine: enough to tell later, from the same boot and PID
/// namespace, whether it still runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The process's start time in clock ticks after boot (`/proc/PID/stat`, field 22).
    pub start: u64,
    /// The boot id of the kernel it runs on.
    pub boot: String,
    /// The inode of its PID namespace.
    pub pidns: u64,
}

/// What `/proc/PID/stat` says of a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// No process has that pid (in our namespace).
    Absent,
    /// A zombie (`Z`) or a dead task (`X`): it exited and only waits to be reaped.
    Exited,
    /// A live process that started at this tick after boot.
    Running(u64),
    /// It could not be read (hidden `/proc`, no `/proc` at all): nothing is known.
    Unknown,
}

/// Reads the state and the start time of `pid` from `/proc/PID/stat`.
pub(crate) fn seen(pid: u32) -> Seen {
    if pid == 0 || i32::try_from(pid).is_err() {
        return Seen::Absent;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => parse_stat(&stat).unwrap_or(Seen::Unknown),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Seen::Absent,
        Err(_) => Seen::Unknown,
    }
}

/// The state (field 3) and start time (field 22) of a `/proc/PID/stat` line. The command
/// name (field 2) may hold spaces and parentheses: fields are counted from its last `)`.
fn parse_stat(stat: &str) -> Option<Seen> {
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return Some(Seen::Exited);
    }
    // The state is field 3; the start time is field 22, 19 fields after it.
    fields.nth(18)?.parse().ok().map(Seen::Running)
}

/// This machine's boot id, read once; `None` where the kernel does not say.
pub(crate) fn boot_id() -> Option<&'static str> {
    static BOOT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    BOOT.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    })
    .as_deref()
}

/// The inode of this process's PID namespace, read once; `None` where it cannot be read.
pub(crate) fn pid_namespace() -> Option<u64> {
    static NS: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *NS.get_or_init(|| std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino()))
}

/// This process's identity; `None` when any part of it cannot be read (then a lock it
/// takes is left to its lease alone).
pub(crate) fn this_process() -> Option<Identity> {
    static ME: std::sync::OnceLock<Option<Identity>> = std::sync::OnceLock::new();
    ME.get_or_init(|| {
        let start = match seen(std::process::id()) {
            Seen::Running(t) => t,
            _ => return None,
        };
        Some(Identity {
            start,
            boot: boot_id()?.to_string(),
            pidns: pid_namespace()?,
        })
    })
    .clone()
}

/// Whether the process `pid` that had `identity` is gone for sure, as seen from here (the
/// boot `here_boot` and PID namespace `here_ns`): only when both are the same as the
/// holder's, and the pid is free, a zombie, or a process that started at another time.
pub(crate) fn gone(
    pid: u32,
    identity: &Identity,
    here_boot: Option<&str>,
    here_ns: Option<u64>,
) -> bool {
    if here_boot != Some(identity.boot.as_str()) || here_ns != Some(identity.pidns) {
        return false;
    }
    match seen(pid) {
        Seen::Absent | Seen::Exited => true,
        Seen::Running(start) => start != identity.start,
        Seen::Unknown => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_read_from_the_end_of_the_command_name() {
        let line = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 \
                    123456 1000 10 18446744073709551615";
        assert_eq!(parse_stat(line), Some(Seen::Running(123_456)));
        let zombie = "7 (sh) Z 1 7 7 0 -1 4227084 0 0 0 0 0 0 0 0 20 0 1 0 99 0 0";
        assert_eq!(parse_stat(zombie), Some(Seen::Exited));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S 1 2"), None, "a short line is unknown");
    }

    #[test]
    fn this_process_is_known_and_alive() {
        let me = this_process().expect("Linux says who this process is");
        assert_eq!(seen(std::process::id()), Seen::Running(me.start));
        assert!(!gone(std::process::id(), &me, boot_id(), pid_namespace()));
        assert_eq!(seen(0), Seen::Absent);
    }
}
