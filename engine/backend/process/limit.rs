//! The limits of the machine a run can run into: open files (the process's `ulimit -n`, the
//! system's table), disk space and quota, and the file size limit (`ulimit -f`). Reaching
//! one is the machine's problem, not a stage's: the executor stops the run as resumable
//! (exit code 3), naming the limit, and `resume` continues once it is lifted. This module
//! tells such an error from others ([`Limit::of`], [`Limit::in_chain`]) and says what the
//! limit is and what to do ([`Limit::advice`]).

use std::io;

use nix::errno::Errno;
use nix::sys::resource::{RLIM_INFINITY, Resource, getrlimit};

/// A limit of the machine that an I/O error says was reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// `EMFILE`: this process has as many files open as it may (`ulimit -n`).
    OpenFiles,
    /// `ENFILE`: the system's table of open files is full.
    SystemFiles,
    /// `ENOSPC`: no space left on the device.
    DiskSpace,
    /// `EDQUOT`: the user's disk quota is used up.
    DiskQuota,
    /// `EFBIG`: a file reached the file size limit (`ulimit -f`).
    FileSize,
}

impl Limit {
    /// The limit an I/O error says was reached, if it says one was. An `EFBIG` takes the
    /// `SIGXFSZ` its write left pending in this thread (see [`file_size_exceeded`]), so that
    /// a later failed write that keeps no errno is not taken for the file size limit too.
    pub fn of(e: &io::Error) -> Option<Limit> {
        let errno = Errno::from_raw(e.raw_os_error()?);
        Some(match errno {
            Errno::EMFILE => Limit::OpenFiles,
            Errno::ENFILE => Limit::SystemFiles,
            Errno::ENOSPC => Limit::DiskSpace,
            Errno::EDQUOT => Limit::DiskQuota,
            Errno::EFBIG => {
                file_size_exceeded();
                Limit::FileSize
            }
            _ => return None,
        })
    }

    /// The limit a program's message names by the system's own words for it (`strerror`,
    /// as git quotes it: `fatal: ...: No space left on device`), for a program that reports
    /// an error in text only.
    pub fn in_message(text: &str) -> Option<Limit> {
        // The longer first: ENFILE's message contains EMFILE's.
        [
            ("Too many open files in system", Limit::SystemFiles),
            ("Too many open files", Limit::OpenFiles),
            ("No space left on device", Limit::DiskSpace),
            ("Disk quota exceeded", Limit::DiskQuota),
            ("File too large", Limit::FileSize),
        ]
        .into_iter()
        .find(|(said, _)| text.contains(said))
        .map(|(_, limit)| limit)
        .or_else(|| {
            // A write beyond `ulimit -f` kills the writer with SIGXFSZ before any message:
            // git says so of its child ("error: reset died of signal 25").
            let signal = format!(
                "died of signal {}",
                nix::sys::signal::Signal::SIGXFSZ as i32
            );
            text.contains(&signal).then_some(Limit::FileSize)
        })
    }

    /// The limit the first I/O error of an error's chain (the error and its sources) says
    /// was reached, if one does.
    pub fn in_chain(e: &(dyn std::error::Error + 'static)) -> Option<Limit> {
        let mut cur = Some(e);
        while let Some(err) = cur {
            if let Some(limit) = err.downcast_ref::<io::Error>().and_then(Limit::of) {
                return Some(limit);
            }
            cur = err.source();
        }
        None
    }

    /// The limit an error met: the one its chain's I/O error says (see [`Limit::in_chain`]),
    /// else, for SQLite's errors, which keep no errno, whether a write of this thread went
    /// beyond the file size limit ([`file_size_exceeded`]): then "database or disk is full"
    /// and "disk I/O error" are that limit; else the first is the disk space and the second
    /// no limit.
    pub fn met_by(e: &(dyn std::error::Error + 'static)) -> Option<Limit> {
        use rusqlite::ErrorCode::{DiskFull, SystemIoFailure};
        if let Some(limit) = Limit::in_chain(e) {
            return Some(limit);
        }
        let mut cur = Some(e);
        while let Some(err) = cur {
            if let Some(rusqlite::Error::SqliteFailure(f, _)) = err.downcast_ref() {
                return match f.code {
                    DiskFull => Some(if file_size_exceeded() {
                        Limit::FileSize
                    } else {
                        Limit::DiskSpace
                    }),
                    SystemIoFailure => file_size_exceeded().then_some(Limit::FileSize),
                    _ => None,
                };
            }
            cur = err.source();
        }
        None
    }

    /// The limit in a few words, as the run's stop names it.
    pub fn name(self) -> &'static str {
        match self {
            Limit::OpenFiles => "the limit of open files (`ulimit -n`)",
            Limit::SystemFiles => "the system's limit of open files",
            Limit::DiskSpace => "the disk space",
            Limit::DiskQuota => "the disk quota",
            Limit::FileSize => "the file size limit (`ulimit -f`)",
        }
    }

    /// What the limit is here and what to do about it: "ralph-flow may have at most 32
    /// files open at once (`ulimit -n` is 32); raise it (`ulimit -n 4096`) or run fewer
    /// stages at once (`--max-concurrency`)".
    pub fn advice(self) -> String {
        match self {
            Limit::OpenFiles => format!(
                "ralph-flow may have at most {} files open at once (`ulimit -n`): raise the \
                 limit (`ulimit -n 4096`) or run fewer stages at once (`--max-concurrency`)",
                soft_limit(Resource::RLIMIT_NOFILE)
                    .map_or("so many".to_string(), |n| n.to_string())
            ),
            Limit::SystemFiles => "the system's table of open files is full (`fs.file-max`): \
                 close programs or raise it"
                .to_string(),
            Limit::DiskSpace => "no space is left on the device (`df`): free some".to_string(),
            Limit::DiskQuota => "the disk quota is used up (`quota`): free some space or \
                 raise the quota"
                .to_string(),
            Limit::FileSize => match soft_limit(Resource::RLIMIT_FSIZE) {
                Some(n) => format!(
                    "no file may grow beyond {} (`ulimit -f`): raise the limit (`ulimit -f \
                     unlimited`)",
                    bytes_text(n)
                ),
                None => "a file is larger than its file system allows".to_string(),
            },
        }
    }
}

/// A resource's soft limit, `None` when there is none (or it cannot be read).
fn soft_limit(resource: Resource) -> Option<u64> {
    getrlimit(resource)
        .ok()
        .map(|(soft, _)| soft)
        .filter(|&soft| soft != RLIM_INFINITY)
}

/// A byte count as people read it: `512 KiB`, `3 MiB`, `1000 bytes`.
fn bytes_text(n: u64) -> String {
    const KIB: u64 = 1024;
    if n >= KIB * KIB && n % (KIB * KIB) == 0 {
        format!("{} MiB", n / (KIB * KIB))
    } else if n >= KIB && n % KIB == 0 {
        format!("{} KiB", n / KIB)
    } else {
        format!("{n} bytes")
    }
}

/// Something that could not be done because a limit of the machine was reached: what it
/// was and the I/O error.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct LimitHit {
    pub limit: Limit,
    /// What could not be done: "could not start `sh`", "cannot write /x/stdout".
    pub what: String,
    /// Not a `#[source]`: the message says it once, here.
    pub source: io::Error,
}

impl LimitHit {
    /// The error as a [`LimitHit`] when it says a limit was reached.
    pub fn of(what: impl FnOnce() -> String, source: io::Error) -> Result<LimitHit, io::Error> {
        match Limit::of(&source) {
            Some(limit) => Ok(LimitHit {
                limit,
                what: what(),
                source,
            }),
            None => Err(source),
        }
    }
}

/// An agent's call stopped by a limit of the machine: [`crate::backend::CallError::Limit`],
/// saying what could not be done.
impl From<LimitHit> for crate::backend::CallError {
    fn from(hit: LimitHit) -> Self {
        crate::backend::CallError::Limit {
            limit: hit.limit,
            message: hit.to_string(),
        }
    }
}

/// Makes a write beyond the file size limit (`ulimit -f`) fail with `EFBIG`, which the
/// executor handles, instead of killing ralph-flow with `SIGXFSZ` and no word: the signal is
/// blocked in the calling thread, and the threads it starts later inherit the mask. (Setting
/// it to be ignored would take `unsafe`, which this crate forbids: nix's `signal` and
/// `sigaction` are unsafe functions; blocking it is safe.) Programs started afterwards get the
/// default mask back (the standard library's spawn empties it), so they still receive the
/// signal as usual. Call it at the start of `main`, before any thread is started.
pub fn block_file_size_signal() {
    use nix::sys::signal::{SigSet, Signal};
    if let Err(e) = SigSet::from(Signal::SIGXFSZ).thread_block() {
        tracing::warn!("cannot block SIGXFSZ: {e}");
    }
}

/// Tells whether a write of this thread went beyond the file size limit since the last
/// call: the kernel then raised `SIGXFSZ`, which [`block_file_size_signal`] keeps pending; it
/// is taken, so the next call says only what comes after. A library that reports a failed
/// write without its errno (SQLite's "disk I/O error", "database or disk is full") is so told
/// apart from one that met the limit.
///
/// The kernel sends `SIGXFSZ` to the thread that wrote (`send_sig`, thread-directed), where
/// it stays pending while blocked, so the calling thread's pending set is read
/// (`/proc/thread-self/status`: `/proc/self/status` shows the main thread's, and a signal
/// pending in a thread of tokio's blocking pool would never be seen, or be taken for the
/// caller's). The set shared by the process (`ShdPnd`) is read too, for a `SIGXFSZ` sent to
/// the process (`kill`); `sigwait` takes either.
pub fn file_size_exceeded() -> bool {
    use nix::sys::signal::{SigSet, Signal};
    let Ok(status) = std::fs::read_to_string("/proc/thread-self/status") else {
        return false;
    };
    let bit = 1u64 << (Signal::SIGXFSZ as u32 - 1);
    let pending = status
        .lines()
        .filter_map(|l| {
            l.strip_prefix("SigPnd:")
                .or_else(|| l.strip_prefix("ShdPnd:"))
        })
        .filter_map(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .any(|mask| mask & bit != 0);
    let blocked = SigSet::thread_get_mask().is_ok_and(|m| m.contains(Signal::SIGXFSZ));
    if pending && blocked {
        // Pending and blocked: `sigwait` takes it at once.
        let _ = SigSet::from(Signal::SIGXFSZ).wait();
    }
    pending
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_names_a_limit_in_the_systems_own_words() {
        // The words are the C library's (`strerror`, which std's I/O errors quote; nix's
        // `Errno::desc` has a table of its own), so a program quoting them is read.
        for (errno, limit) in [
            (Errno::ENFILE, Limit::SystemFiles),
            (Errno::EMFILE, Limit::OpenFiles),
            (Errno::ENOSPC, Limit::DiskSpace),
            (Errno::EDQUOT, Limit::DiskQuota),
            (Errno::EFBIG, Limit::FileSize),
        ] {
            let said = format!(
                "fatal: cannot write 'x': {}",
                io::Error::from_raw_os_error(errno as i32)
            );
            assert_eq!(Limit::in_message(&said), Some(limit), "{said}");
        }
        assert_eq!(Limit::in_message("fatal: not a git repository"), None);
        assert_eq!(Limit::in_message("error: reset died of signal 9"), None);
    }

    /// git under `ulimit -f`, as a worktree is made: its child dies of SIGXFSZ, and git says
    /// so in words of its own, which name no errno.
    #[test]
    fn git_beyond_the_file_size_limit_is_that_limit() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let script = "set -e; git init -q r; cd r; head -c 200000 /dev/zero > big; git add big; \
                      git -c user.email=a@b -c user.name=a commit -qm x; \
                      ulimit -f 50; git worktree add ../w 2>&1 || true";
        let out = std::process::Command::new("sh")
            .args(["-c", script])
            .current_dir(dir.path())
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", dir.path())
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let said = String::from_utf8_lossy(&out.stdout);
        assert_eq!(Limit::in_message(&said), Some(Limit::FileSize), "{said}");
    }

    #[test]
    fn the_limits_are_told_from_other_errors() {
        let e = |errno: Errno| io::Error::from_raw_os_error(errno as i32);
        assert_eq!(Limit::of(&e(Errno::EMFILE)), Some(Limit::OpenFiles));
        assert_eq!(Limit::of(&e(Errno::ENFILE)), Some(Limit::SystemFiles));
        assert_eq!(Limit::of(&e(Errno::ENOSPC)), Some(Limit::DiskSpace));
        assert_eq!(Limit::of(&e(Errno::EDQUOT)), Some(Limit::DiskQuota));
        assert_eq!(Limit::of(&e(Errno::EFBIG)), Some(Limit::FileSize));
        assert_eq!(Limit::of(&e(Errno::EACCES)), None);
        assert_eq!(Limit::of(&io::Error::other("no errno")), None);
        let chained = crate::fs::IoFailure::new("write", "/x", e(Errno::ENOSPC));
        assert_eq!(Limit::in_chain(&chained), Some(Limit::DiskSpace));
    }

    #[test]
    fn sqlites_errors_without_an_errno_are_told_too() {
        let sqlite =
            |code: i32| rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None);
        // SQLITE_FULL with no write beyond the file size limit: the disk, whatever the limit.
        assert_eq!(
            Limit::met_by(&sqlite(rusqlite::ffi::SQLITE_FULL)),
            Some(Limit::DiskSpace)
        );
        // SQLITE_IOERR_WRITE with no write beyond the file size limit: not a limit.
        assert_eq!(
            Limit::met_by(&sqlite(rusqlite::ffi::SQLITE_IOERR_WRITE)),
            None
        );
        assert_eq!(Limit::met_by(&sqlite(rusqlite::ffi::SQLITE_CORRUPT)), None);
    }

    #[test]
    fn a_pending_file_size_signal_is_read_once_and_in_this_thread_only() {
        use nix::sys::signal::{Signal, raise};
        let sqlite =
            |code: i32| rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None);
        let efbig = io::Error::from_raw_os_error(Errno::EFBIG as i32);
        // This test's thread, as every thread of ralph-flow, keeps the signal pending.
        block_file_size_signal();
        // A write beyond the limit, as the kernel reports it: EFBIG and the signal.
        raise(Signal::SIGXFSZ).expect("raised");
        // Another thread has none pending: the signal is this thread's.
        let elsewhere = std::thread::spawn(|| {
            block_file_size_signal();
            file_size_exceeded()
        });
        assert!(!elsewhere.join().expect("joined"));
        // The EFBIG takes it: a later failure that keeps no errno is not the limit.
        assert_eq!(Limit::of(&efbig), Some(Limit::FileSize));
        assert!(!file_size_exceeded());
        assert_eq!(
            Limit::met_by(&sqlite(rusqlite::ffi::SQLITE_IOERR_WRITE)),
            None
        );
        // SQLite's "database or disk is full" is the file size limit only after a write
        // beyond it, once.
        raise(Signal::SIGXFSZ).expect("raised");
        assert_eq!(
            Limit::met_by(&sqlite(rusqlite::ffi::SQLITE_FULL)),
            Some(Limit::FileSize)
        );
        assert_eq!(
            Limit::met_by(&sqlite(rusqlite::ffi::SQLITE_FULL)),
            Some(Limit::DiskSpace)
        );
        raise(Signal::SIGXFSZ).expect("raised");
        assert_eq!(
            Limit::met_by(&sqlite(rusqlite::ffi::SQLITE_IOERR_WRITE)),
            Some(Limit::FileSize)
        );
        assert!(!file_size_exceeded());
    }

    #[test]
    fn advice_names_the_limit_and_what_to_do() {
        assert!(Limit::OpenFiles.advice().contains("ulimit -n"));
        assert!(Limit::OpenFiles.advice().contains("--max-concurrency"));
        assert!(Limit::DiskSpace.advice().contains("no space"));
        assert_eq!(bytes_text(512 * 1024), "512 KiB");
        assert_eq!(bytes_text(3 * 1024 * 1024), "3 MiB");
        assert_eq!(bytes_text(1000), "1000 bytes");
    }
}
