//! The exit codes ralph-flow itself uses, defined once. A workflow's own exits take any other
//! code; declaring one of these is a warning of the checker (RF055).

/// A configuration error: the workflow, its params or the command line (and a run that
/// could not start).
pub const CONFIG: i32 = 3;
/// A run stopped to wait on a gate (EX_TEMPFAIL); `resume` goes on once it is answered.
pub const WAITING: i32 = 75;
/// A run was interrupted (128 + SIGINT); it can be resumed.
pub const INTERRUPTED: i32 = 130;

/// A run was stopped by SIGTERM (128 + 15), as Ctrl-C stops it; it can be resumed.
pub const TERMINATED: i32 = 143;
/// A run was stopped by SIGHUP (128 + 1), as Ctrl-C stops it; it can be resumed.
pub const HUNG_UP: i32 = 129;

/// A run was cancelled (`ralph-flow cancel`, the monitor's button): its stages were
/// stopped and it cannot be resumed. Below the codes shells give to commands that cannot
/// run (126, 127) and to signals (128 + N), and apart from the sysexits range (64-78).
pub const CANCELLED: i32 = 125;

/// Each code of ralph-flow's own, with what it means.
pub const ENGINE: &[(i32, &str)] = &[
    (CONFIG, "configuration error"),
    (WAITING, "waiting on a gate"),
    (INTERRUPTED, "interrupted"),
    (TERMINATED, "run stopped by SIGTERM"),
    (HUNG_UP, "run stopped by SIGHUP"),
    (CANCELLED, "run cancelled"),
];

/// The exits every workflow has, with their codes, unless it declares them itself.
pub const IMPLICIT: &[(&str, i64)] = &[("success", 0), ("failed", 1)];

/// What ralph-flow's own codes mean, in one line: "3 configuration error, 75 ...".
pub fn engine_codes_text() -> String {
    ENGINE
        .iter()
        .map(|(code, what)| format!("{code} {what}"))
        .collect::<Vec<_>>()
        .join(", ")
}
