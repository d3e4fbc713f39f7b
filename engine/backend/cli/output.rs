//! Reading a program's output: its JSON objects, and its last lines for messages.

use std::borrow::Cow;

use serde::de::DeserializeOwned;

use crate::backend::process::ProcOutput;

/// How much of the end of stdout the result detectors look at.
const DETECT_WINDOW: usize = 1 << 20;

/// How many lines of output a timeout or a failure reports.
const TAIL_LINES: usize = 20;

/// The most characters a tail holds.
const TAIL_CHARS: usize = 4000;

/// The end of stdout that the result detectors look at, as text.
pub(super) fn detect_window(stdout: &[u8]) -> Cow<'_, str> {
    String::from_utf8_lossy(&stdout[stdout.len().saturating_sub(DETECT_WINDOW)..])
}

/// Reads a text that is one JSON object (it starts with `{` and ends with `}`).
pub(super) fn json_object<T: DeserializeOwned>(text: &str) -> Option<T> {
    if !text.starts_with('{') || !text.ends_with('}') {
        return None;
    }
    serde_json::from_str(text).ok()
}

/// The last lines of a text, at most [`TAIL_CHARS`] characters.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    let tail = lines[lines.len().saturating_sub(n)..].join("\n");
    let skip = tail.chars().count().saturating_sub(TAIL_CHARS);
    tail.chars().skip(skip).collect()
}

/// The last lines of stdout and of stderr.
pub(super) fn output_tail(out: &ProcOutput) -> String {
    let stdout = last_lines(&String::from_utf8_lossy(&out.stdout), TAIL_LINES);
    let stderr = last_lines(&String::from_utf8_lossy(&out.stderr), TAIL_LINES);
    match (stdout.is_empty(), stderr.is_empty()) {
        (_, true) => stdout,
        (true, false) => stderr,
        (false, false) => format!("{stdout}\n--- stderr ---\n{stderr}"),
    }
}

/// The same entries once each, in the order of their first occurrence, with how many times
/// a repeated one occurred: "apply_patch: ... (2 times)".
pub(super) fn collapse(entries: Vec<String>) -> Vec<String> {
    let mut counted: Vec<(String, usize)> = Vec::new();
    for e in entries {
        match counted.iter_mut().find(|(seen, _)| *seen == e) {
            Some((_, n)) => *n += 1,
            None => counted.push((e, 1)),
        }
    }
    counted
        .into_iter()
        .map(|(e, n)| {
            if n == 1 {
                e
            } else {
                format!("{e} ({n} times)")
            }
        })
        .collect()
}
