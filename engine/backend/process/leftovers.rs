//! What a running program leaves on record (a pid file, lines in a process log) and
//! [`stop_leftovers`], which reads those records on resume to stop what a killed executor
//! left running.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::KILL_GRACE;
use super::group::processes_with_env;
use super::limit::LimitHit;

/// When a process started, in clock ticks after boot (`/proc/PID/stat`, field 22): with the
/// pid, it names one process, even after the pid is reused.
pub fn start_ticks(pid: i32) -> Option<u64> {
    use std::io::Read;
    // One read into a buffer (the line is well under 1 KiB), not `read_to_string`'s growing
    // reads: this runs for every program started.
    let mut buf = [0u8; 1024];
    let mut file = std::fs::File::open(format!("/proc/{pid}/stat")).ok()?;
    let mut len = 0;
    while len < buf.len() {
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    let stat = std::str::from_utf8(&buf[..len]).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from its end.
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The boot clock now, in the clock ticks of `/proc/PID/stat` (USER_HZ, 100 a second on
/// Linux): read from the vDSO, no system call.
pub(super) fn boot_ticks() -> u64 {
    /// USER_HZ: the unit of the start time in `/proc/PID/stat`, fixed by the kernel's ABI.
    const TICKS_PER_SECOND: u64 = 100;
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).map_or(0, |t| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * TICKS_PER_SECOND
            + u64::try_from(t.tv_nsec()).unwrap_or(0) / (1_000_000_000 / TICKS_PER_SECOND)
    })
}

/// When a program started, as the boot-clock ticks read just before and just after its
/// spawn: the kernel's start time of the process (`/proc/PID/stat`, which counts from boot
/// too) lies between them. Recording this window instead of reading `/proc/PID/stat` after
/// every spawn (an open, two reads and a close: about a tenth of a command stage's cost)
/// still names one process: a pid reused later started after the window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct StartWindow {
    pub from: u64,
    pub to: u64,
}

impl StartWindow {
    /// Tells whether the process `pid` is the one that started in this window.
    fn matches(self, pid: i32) -> bool {
        start_ticks(pid).is_some_and(|t| self.from <= t && t <= self.to)
    }

    /// The window as recorded: `FROM TO`, or one number when both are the same (as the
    /// start time alone was recorded before).
    fn record(self) -> String {
        if self.from == self.to {
            self.from.to_string()
        } else {
            format!("{} {}", self.from, self.to)
        }
    }

    /// Reads a recorded window (`FROM [TO]`) from the parts of a line.
    fn parse<'a>(mut parts: impl Iterator<Item = &'a str>) -> Option<StartWindow> {
        let from = parts.next()?.parse().ok()?;
        let to = match parts.next() {
            Some(t) => t.parse().ok()?,
            None => from,
        };
        Some(StartWindow { from, to })
    }
}

/// Tells whether a process is alive (a zombie is not).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next().map(|st| st != "Z" && st != "X"))
        })
        .unwrap_or(false)
}

/// The file that records a running program's group, removed when it ends.
pub(super) struct PidFile(PathBuf);

impl PidFile {
    /// Fails only when a limit of the machine (open files, disk space, file size) keeps it
    /// from being written; another failure is logged.
    pub(super) fn write(path: &Path, pid: i32, started: StartWindow) -> Result<PidFile, LimitHit> {
        if let Err(e) = std::fs::write(path, format!("{pid} {}\n", started.record())) {
            match LimitHit::of(|| format!("cannot write {}", path.display()), e) {
                Ok(hit) => return Err(hit),
                Err(e) => tracing::warn!("cannot write {}: {e}", path.display()),
            }
        }
        Ok(PidFile(path.to_path_buf()))
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The process logs open for appending, most recent last: a run starts thousands of
/// programs, and each would otherwise open and close its log twice. A few are kept (a run
/// and its subflows share one); the oldest is closed when another is opened.
static OPEN_LOGS: std::sync::Mutex<Vec<(PathBuf, std::fs::File)>> =
    std::sync::Mutex::new(Vec::new());

/// How many process logs stay open.
const OPEN_LOGS_KEPT: usize = 4;

/// Appends a line to a process log in one `write` (an append of a few bytes is atomic), the
/// file kept open.
fn append_to_log(path: &Path, line: &[u8]) -> std::io::Result<()> {
    let mut logs = OPEN_LOGS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let i = match logs.iter().position(|(p, _)| p == path) {
        Some(i) => i,
        None => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?;
            if logs.len() >= OPEN_LOGS_KEPT {
                logs.remove(0);
            }
            logs.push((path.to_path_buf(), file));
            logs.len() - 1
        }
    };
    logs[i].1.write_all(line)
}

/// A program's lines in a process log: `start` now, `end` when dropped.
pub(super) struct ProcessLogEntry {
    path: PathBuf,
    line: String,
}

impl ProcessLogEntry {
    /// Fails only when a limit of the machine (open files, disk space, file size) keeps the
    /// line from being written; another failure is logged.
    pub(super) fn start(
        path: &Path,
        pid: i32,
        started: StartWindow,
    ) -> Result<ProcessLogEntry, LimitHit> {
        let entry = ProcessLogEntry {
            path: path.to_path_buf(),
            line: format!("{pid} {}", started.record()),
        };
        entry.append("start")?;
        Ok(entry)
    }

    fn append(&self, what: &str) -> Result<(), LimitHit> {
        let line = format!("{what} {}\n", self.line);
        if let Err(e) = append_to_log(&self.path, line.as_bytes()) {
            match LimitHit::of(|| format!("cannot write {}", self.path.display()), e) {
                Ok(hit) => return Err(hit),
                Err(e) => tracing::warn!("cannot write {}: {e}", self.path.display()),
            }
        }
        Ok(())
    }
}

impl Drop for ProcessLogEntry {
    fn drop(&mut self) {
        if let Err(hit) = self.append("end") {
            tracing::warn!("{hit}");
        }
    }
}

/// The groups a process log says were started and have not ended (`PGID FROM [TO]` each:
/// the pid and the [`StartWindow`]).
fn unended(log: &Path) -> Vec<(i32, StartWindow)> {
    let Ok(text) = std::fs::read_to_string(log) else {
        return Vec::new();
    };
    let mut open: Vec<(i32, StartWindow)> = Vec::new();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let (Some(what), Some(pid)) = (
            parts.next(),
            parts.next().and_then(|p| p.parse::<i32>().ok()),
        ) else {
            continue;
        };
        let Some(window) = StartWindow::parse(parts) else {
            continue;
        };
        match what {
            "start" => open.push((pid, window)),
            "end" => open.retain(|g| *g != (pid, window)),
            _ => {}
        }
    }
    open
}

/// Stops what an earlier executor of a run left running, before the run goes on: the
/// process groups recorded in `pid_files` and in the process logs `logs` (when the
/// recorded start time still matches; the logs are emptied), and
/// every process whose environment has the variable `tag` names with its value (the run's
/// `RALPH_FLOW_RUN=RUN`, a unit's `RALPH_FLOW_UNIT=ID`), which catches descendants that
/// left their group. SIGTERM, then SIGKILL after [`KILL_GRACE`]; it
/// returns once they are gone (or after a few seconds more), with how many there were.
pub fn stop_leftovers(tag: Option<(&str, &str)>, pid_files: &[PathBuf], logs: &[PathBuf]) -> usize {
    let tagged_now = || tag.map_or_else(Vec::new, |(k, v)| processes_with_env(k, v));
    let mut groups = Vec::new();
    for log in logs {
        for (pid, window) in unended(log) {
            if window.matches(pid) {
                groups.push(pid);
            }
        }
        let _ = std::fs::remove_file(log);
    }
    for file in pid_files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        let mut parts = text.split_whitespace();
        let (Some(pid), Some(window)) = (
            parts.next().and_then(|p| p.parse::<i32>().ok()),
            StartWindow::parse(&mut parts),
        ) else {
            continue;
        };
        // Only the process that was recorded: a pid reused since then is someone else's.
        if window.matches(pid) {
            groups.push(pid);
        }
        let _ = std::fs::remove_file(file);
    }
    let tagged = tagged_now();
    let mut all: Vec<i32> = groups.clone();
    all.extend(&tagged);
    all.sort_unstable();
    all.dedup();
    if all.is_empty() {
        return 0;
    }
    for &g in &groups {
        let _ = killpg(Pid::from_raw(g), Signal::SIGTERM);
    }
    for &p in &tagged {
        let _ = nix::sys::signal::kill(Pid::from_raw(p), Signal::SIGTERM);
    }
    let wait = |limit: Duration| {
        let start = std::time::Instant::now();
        while start.elapsed() < limit {
            let left = all.iter().any(|&p| alive(p)) || !tagged_now().is_empty();
            if !left {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    };
    if !wait(KILL_GRACE) {
        for &g in &groups {
            let _ = killpg(Pid::from_raw(g), Signal::SIGKILL);
        }
        for p in tagged_now().into_iter().chain(all.iter().copied()) {
            let _ = nix::sys::signal::kill(Pid::from_raw(p), Signal::SIGKILL);
        }
        wait(Duration::from_secs(5));
    }
    all.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::process::{ProcSpec, run};

    #[test]
    fn a_process_log_gives_the_groups_that_started_and_did_not_end() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let log = tmp.path().join("processes");
        std::fs::write(
            &log,
            "start 10 100\nstart 11 110\nend 10 100\nstart 10 200\ngarbage\nstart 12",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        // Group 10 ended once and started again (a reused pid, another start time).
        let at = |t| StartWindow { from: t, to: t };
        assert_eq!(unended(&log), vec![(11, at(110)), (10, at(200))]);
        // A window of two numbers, as recorded now.
        std::fs::write(&log, "start 13 5 7\nstart 14 9 9\nend 14 9\n")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(unended(&log), vec![(13, StartWindow { from: 5, to: 7 })]);
        assert!(unended(&tmp.path().join("none")).is_empty());
    }

    #[test]
    fn the_start_time_is_read_from_proc() {
        let pid = i32::try_from(std::process::id()).unwrap_or(0);
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let expected: Option<u64> = text
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(19)?.parse().ok());
        assert!(expected.is_some(), "{text}");
        assert_eq!(start_ticks(pid), expected);
        assert_eq!(start_ticks(-1), None);
    }

    #[test]
    fn a_program_started_inside_its_window_and_another_moment_is_not_it() {
        let from = boot_ticks();
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap_or_else(|e| panic!("{e}"));
        let to = boot_ticks();
        let pid = i32::try_from(child.id()).unwrap_or(0);
        let window = StartWindow { from, to };
        let started = start_ticks(pid);
        assert!(window.matches(pid), "{window:?} against {started:?}");
        // The same pid recorded as started a second later (a reused pid) is someone else.
        let later = StartWindow {
            from: to + 100,
            to: to + 101,
        };
        assert!(!later.matches(pid));
        assert!(!window.matches(-1));
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn a_log_kept_open_gets_every_line_of_every_run() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        // More logs than are kept open: the oldest is closed and opened again.
        let logs: Vec<PathBuf> = (0..OPEN_LOGS_KEPT + 2)
            .map(|i| tmp.path().join(format!("p{i}")))
            .collect();
        for round in 0..3 {
            for log in &logs {
                append_to_log(log, format!("start {round} 1\n").as_bytes())
                    .unwrap_or_else(|e| panic!("{e}"));
            }
        }
        for log in &logs {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            assert_eq!(text, "start 0 1\nstart 1 1\nstart 2 1\n");
        }
    }

    #[tokio::test]
    async fn a_program_is_logged_while_it_runs_and_not_after() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let log = tmp.path().join("processes");
        let spec = ProcSpec {
            argv: vec![
                "sh".into(),
                "-c".into(),
                // The line is written once the program's pid is known, just after it starts:
                // wait for it (up to 5 s), then show the log.
                "for i in $(seq 100); do grep -q '^start ' \"$0\" && break; sleep 0.05; done; cat \"$0\"".into(),
                log.to_string_lossy().into_owned(),
            ],
            process_log: Some(log.clone()),
            ..ProcSpec::default()
        };
        let out = run(&spec).await.unwrap_or_else(|e| panic!("{e}"));
        let seen = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            seen.starts_with("start "),
            "the program saw its own line: {seen}"
        );
        assert!(
            unended(&log).is_empty(),
            "{:?}",
            std::fs::read_to_string(&log)
        );
    }
}
