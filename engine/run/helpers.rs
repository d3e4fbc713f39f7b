//! The template helper functions, evaluated at run time in the frame's working directory
//! (`run.cwd`: the run's directory, or the loop's or item's worktree).

use std::path::{Path, PathBuf};

use minijinja::value::Value;
use minijinja::{Error, ErrorKind, State};

/// The most bytes a helper returns; more is cut with a note, to keep prompts bounded.
const MAX_HELPER_BYTES: usize = 1 << 20;

/// Adds the helpers to an environment.
pub fn register(env: &mut minijinja::Environment<'static>) {
    env.add_function("read_file", read_file);
    env.add_function("file_exists", file_exists);
    env.add_function("glob", glob_fn);
    env.add_function("tail", tail);
    env.add_function("git_diff", git_diff);
    env.add_function("git_status", git_status);
}

fn cwd(state: &State) -> PathBuf {
    state
        .lookup("run")
        .and_then(|r| r.get_attr("cwd").ok())
        .and_then(|c| c.as_str().map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("."))
}

fn resolve(state: &State, path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        cwd(state).join(p)
    }
}

fn bound(mut s: String) -> String {
    if s.len() > MAX_HELPER_BYTES {
        let mut cut = MAX_HELPER_BYTES;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("\n[... cut at 1 MiB by ralph-flow ...]\n");
    }
    s
}

fn read_file(state: &State, path: String) -> Result<String, Error> {
    let full = resolve(state, &path);
    std::fs::read_to_string(&full).map(bound).map_err(|e| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("read_file(\"{path}\"): {e}"),
        )
    })
}

fn file_exists(state: &State, path: String) -> bool {
    resolve(state, &path).exists()
}

fn glob_fn(state: &State, pattern: String) -> Result<Vec<String>, Error> {
    let base = cwd(state);
    let full = resolve(state, &pattern);
    let paths = glob::glob(&full.to_string_lossy()).map_err(|e| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("glob(\"{pattern}\"): {e}"),
        )
    })?;
    let mut out: Vec<String> = paths
        .filter_map(Result::ok)
        .map(|p| {
            p.strip_prefix(&base)
                .map(|r| r.to_string_lossy().into_owned())
                .unwrap_or_else(|_| p.to_string_lossy().into_owned())
        })
        .collect();
    out.sort();
    Ok(out)
}

fn tail(state: &State, path: String, n: Option<usize>) -> Result<String, Error> {
    let text = read_file(state, path)?;
    let n = n.unwrap_or(20);
    let lines: Vec<&str> = text.lines().collect();
    Ok(lines[lines.len().saturating_sub(n)..].join("\n"))
}

fn git(state: &State, args: &[&str]) -> Result<String, Error> {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(cwd(state))
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| {
            Error::new(
                ErrorKind::InvalidOperation,
                format!("git {}: {e}", args.join(" ")),
            )
        })?;
    if !out.status.success() {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "git {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(bound(String::from_utf8_lossy(&out.stdout).into_owned()))
}

fn git_diff(state: &State, base: Option<String>) -> Result<String, Error> {
    match base {
        Some(b) => git(state, &["diff", "--no-color", &b]),
        None => git(state, &["diff", "--no-color", "HEAD"]),
    }
}

fn git_status(state: &State) -> Result<String, Error> {
    git(state, &["status", "--porcelain"])
}

/// Adds `earlier_runs(stage, n=5)`: the stage's outputs in earlier runs of the same
/// workflow, newest first, each `{run, started_at, status, output}` (cross-run memory).
/// It reads the store through its own connection.
pub fn register_memory(
    env: &mut minijinja::Environment<'static>,
    store: std::sync::Arc<std::sync::Mutex<crate::store::sqlite::SqliteStore>>,
    workflow: String,
    current_run: String,
) {
    env.add_function(
        "earlier_runs",
        move |stage: String, n: Option<usize>| -> Result<Value, Error> {
            use crate::store::Store;
            let store = store
                .lock()
                .map_err(|_| Error::new(ErrorKind::InvalidOperation, "the store is unusable"))?;
            let rows = store
                .history(&workflow, &stage, &current_run, n.unwrap_or(5))
                .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
            let out: Vec<serde_json::Value> = rows
                .into_iter()
                .map(|(run, rec)| {
                    serde_json::json!({
                        "run": run,
                        "started_at": crate::store::rfc3339(rec.started_at),
                        "status": rec.state.as_str(),
                        "output": rec.output,
                    })
                })
                .collect();
            Ok(Value::from(minijinja::value::Serde(out)))
        },
    );
}
