//! The minijinja environment prompts and commands are rendered with, and its helper
//! functions. The helpers are evaluated at run time, in the frame's working directory
//! (`run.cwd`: the run's directory, or the loop's or item's worktree); the checker builds the
//! same environment to tell which filters and tests exist, and never renders with it.

use std::path::{Path, PathBuf};

use minijinja::value::Value;
use minijinja::{Error, ErrorKind, State};

/// The most bytes a helper returns; more is cut with a note, to keep prompts bounded.
const MAX_HELPER_BYTES: usize = 1 << 20;

/// The directories the file helpers may read (canonical paths): the workspace, the state
/// directory (worktrees, artifacts) and the workflow's `file_roots`. A path that leads
/// elsewhere, by `..`, by being absolute or through a symbolic link, is refused.
#[derive(Clone, Debug, Default)]
pub struct Roots(Vec<PathBuf>);

impl Roots {
    /// The roots, made canonical; those that do not exist are left out.
    pub fn new(dirs: impl IntoIterator<Item = PathBuf>) -> Roots {
        Roots(
            dirs.into_iter()
                .filter_map(|d| d.canonicalize().ok())
                .collect(),
        )
    }

    /// The canonical path, when it exists and lies under a root.
    fn confine(&self, path: &Path, helper: &str, written: &str) -> Result<PathBuf, Error> {
        let real = path.canonicalize().map_err(|e| {
            Error::new(
                ErrorKind::InvalidOperation,
                format!("{helper}(\"{written}\"): {e}"),
            )
        })?;
        if self.0.iter().any(|r| real.starts_with(r)) {
            return Ok(real);
        }
        Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "{helper}(\"{written}\"): {} is outside the workspace and the state directory; \
                 name its directory in the workflow's `file_roots` to let templates read it",
                real.display()
            ),
        ))
    }
}

/// The environment templates render with: minijinja's defaults and the helpers (see
/// [`register`]). A stage that has not run (yet) is undefined, and so are its attributes
/// (`stages.review.last` in the first iteration): templates guard with `is defined`.
pub fn environment(
    roots: Roots,
    settle: impl Fn() + Send + Sync + 'static,
) -> minijinja::Environment<'static> {
    let mut env = minijinja::Environment::new();
    register(&mut env, roots, settle);
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Chainable);
    env
}

/// Adds the helpers to an environment; the file helpers read only under `roots`, and call
/// `settle` first (the run's artifact writer: files of earlier stages are on disk).
pub fn register(
    env: &mut minijinja::Environment<'static>,
    roots: Roots,
    settle: impl Fn() + Send + Sync + 'static,
) {
    let roots = std::sync::Arc::new(roots);
    let settle = std::sync::Arc::new(settle);
    let (r, w) = (roots.clone(), settle.clone());
    env.add_function("read_file", move |state: &State, path: String| {
        w();
        read_file(&r, state, &path)
    });
    let (r, w) = (roots.clone(), settle.clone());
    env.add_function("file_exists", move |state: &State, path: String| {
        w();
        r.confine(&resolve(state, &path), "file_exists", &path)
            .is_ok()
    });
    let (r, w) = (roots.clone(), settle.clone());
    env.add_function("glob", move |state: &State, pattern: String| {
        w();
        glob_fn(&r, state, &pattern)
    });
    let (r, w) = (roots, settle);
    env.add_function(
        "tail",
        move |state: &State, path: String, n: Option<usize>| {
            w();
            tail(&r, state, &path, n)
        },
    );
    env.add_function("git_diff", git_diff);
    env.add_function("git_status", git_status);
    env.add_filter("spread", spread);
}

/// What `spread` renders to: a mark no text has, then the list as JSON.
const SPREAD_MARK: &str = "\u{1}ralph-flow-spread\u{1}";

/// `{{ list | spread }}`, as a whole argv item: one argument per item of the list (strings
/// as they are, other values as JSON). Never through a shell, like every argument.
fn spread(value: Value) -> Result<String, Error> {
    let items: Vec<String> = match value.try_iter() {
        Ok(iter) if !matches!(value.kind(), minijinja::value::ValueKind::String) => iter
            .map(|v| match v.as_str() {
                Some(s) => s.to_owned(),
                None => v.to_string(),
            })
            .collect(),
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("`spread` takes a list, not {}", value.kind()),
            ));
        }
    };
    let json = serde_json::to_string(&items)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    Ok(format!("{SPREAD_MARK}{json}"))
}

/// The arguments of a rendered argv item that is a `spread`: `None` for an ordinary item,
/// an error for a `spread` that is not the whole item.
pub fn spread_items(rendered: &str) -> Option<Result<Vec<String>, SpreadError>> {
    let at = rendered.find(SPREAD_MARK)?;
    if at != 0 {
        return Some(Err(SpreadError));
    }
    Some(serde_json::from_str(&rendered[SPREAD_MARK.len()..]).map_err(|_| SpreadError))
}

/// A `spread` that is not a whole argv item.
#[derive(Debug, thiserror::Error)]
#[error("`spread` must be the whole argv item, as in \"{{{{ params.paths | spread }}}}\"")]
pub struct SpreadError;

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

fn read_file(roots: &Roots, state: &State, path: &str) -> Result<String, Error> {
    let full = roots.confine(&resolve(state, path), "read_file", path)?;
    read_bounded(&full).map(bound).map_err(|e| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("read_file(\"{path}\"): {e}"),
        )
    })
}

/// Reads at most a little more than [`MAX_HELPER_BYTES`] of a file (a device or a huge file
/// cannot exhaust memory).
fn read_bounded(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_HELPER_BYTES as u64 + 4)
        .read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn glob_fn(roots: &Roots, state: &State, pattern: &str) -> Result<Vec<String>, Error> {
    let base = cwd(state);
    let full = resolve(state, pattern);
    let paths = glob::glob(&full.to_string_lossy()).map_err(|e| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("glob(\"{pattern}\"): {e}"),
        )
    })?;
    let mut out: Vec<String> = paths
        .filter_map(Result::ok)
        .filter(|p| roots.confine(p, "glob", pattern).is_ok())
        .map(|p| {
            p.strip_prefix(&base)
                .map(|r| r.to_string_lossy().into_owned())
                .unwrap_or_else(|_| p.to_string_lossy().into_owned())
        })
        .collect();
    out.sort();
    Ok(out)
}

fn tail(roots: &Roots, state: &State, path: &str, n: Option<usize>) -> Result<String, Error> {
    let text = read_file(roots, state, path)?;
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
    let base = base.unwrap_or_else(|| "HEAD".to_string());
    // The base may come from an agent's output: it never reads as an option of git
    // (`--output=FILE` would write a file).
    if base.starts_with('-') {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("git_diff(\"{base}\"): a base must be a commit, branch or tag, not an option"),
        ));
    }
    git(state, &["diff", "--no-color", "--end-of-options", &base])
}

fn git_status(state: &State) -> Result<String, Error> {
    git(state, &["status", "--porcelain"])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_diff_refuses_a_base_that_reads_as_an_option() {
        let mut env = minijinja::Environment::new();
        register(&mut env, Roots::default(), || {});
        let err = env
            .render_str("{{ git_diff('--output=/tmp/x') }}", ())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("not an option"), "{err}");
    }
}
