//! Fetching git sources of presets into the cache, with the `git` program.
//!
//! Layout of the cache ([`super::cache_dir`]):
//! - `git/repos/HASH.git`: a bare repository per URL (HASH: the first 16 hex digits of the
//!   SHA-256 of the URL), holding every branch and tag fetched so far;
//! - `git/checkouts/COMMIT/`: the files of one commit, extracted with `git archive`, never
//!   changed afterwards. Every load re-hashes it against the lockfile.
//!
//! Only this module and the CLI commands that call it touch the network; `check` and the
//! loader only read what is already here.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::error::PresetError;
use super::{cache_dir, tree_hash};

/// A source fetched into the cache.
#[derive(Clone, Debug)]
pub struct Fetched {
    /// The commit the revision resolved to (or the locked one).
    pub commit: String,
    /// The content hash of the commit's files.
    pub hash: String,
    /// Where the commit's files are.
    pub dir: PathBuf,
}

/// Where fetched commits are extracted, one directory each.
pub fn checkouts_dir() -> PathBuf {
    cache_dir().join("git").join("checkouts")
}

/// The directory a commit's files are extracted to.
pub fn checkout_dir(commit: &str) -> PathBuf {
    checkouts_dir().join(commit)
}

/// Resolves the URL written in a workflow: URLs (`scheme://`, `user@host:path`) as they are,
/// anything else as a path relative to the directory of the file that declares the source.
pub fn resolve_url(git: &str, decl_dir: &Path) -> String {
    if is_url(git) {
        git.to_string()
    } else {
        crate::fs::normalize(&decl_dir.join(git))
            .to_string_lossy()
            .into_owned()
    }
}

/// Tells whether a repository is written as a URL (`scheme://...`, or scp-like
/// `user@host:path`) rather than as a path.
pub fn is_url(git: &str) -> bool {
    git.contains("://")
        || match (git.find(':'), git.find('/')) {
            (Some(c), Some(s)) => c < s && git[..c].contains('@'),
            (Some(c), None) => git[..c].contains('@'),
            _ => false,
        }
}

/// The longest a git command of a fetch may take before it is stopped (a fetch of a large
/// repository over a slow link included).
pub const GIT_TIMEOUT: Duration = Duration::from_secs(600);

/// Fetches `rev` of repository `url` into the cache and extracts its commit. With `locked`,
/// that exact commit is used (the lockfile's pin), whatever `rev` points to now.
pub fn fetch(url: &str, rev: &str, locked: Option<&str>) -> Result<Fetched, PresetError> {
    // A source may come from a preset someone else wrote: a URL that git would read as an
    // option (`--upload-pack=...` runs a program) is refused, and every URL and commit goes
    // after `--end-of-options` as well.
    if url.is_empty() || url.starts_with('-') {
        return Err(PresetError::NotAUrl(url.to_string()));
    }
    if let Some(c) = locked {
        if c.len() != 40 || !c.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(PresetError::NotACommit {
                url: url.to_string(),
                commit: c.to_string(),
            });
        }
    }
    let cache = cache_dir();
    let repos = cache.join("git").join("repos");
    std::fs::create_dir_all(&repos).map_err(|source| {
        PresetError::Io(crate::fs::IoFailure::new(
            "create the cache",
            &repos,
            source,
        ))
    })?;
    let key = format!("{:x}", Sha256::digest(url.as_bytes()))[..16].to_string();
    let bare = repos.join(format!("{key}.git"));
    if !bare.join("HEAD").exists() {
        git(
            None,
            &["init", "--quiet", "--bare", &bare.to_string_lossy()],
        )?;
    }
    let have = |c: &str| git(Some(&bare), &["cat-file", "-e", &format!("{c}^{{commit}}")]).is_ok();
    let commit = match locked {
        Some(c) if have(c) => c.to_string(),
        _ => {
            git(
                Some(&bare),
                &[
                    "fetch",
                    "--quiet",
                    "--force",
                    "--no-tags",
                    "--end-of-options",
                    url,
                    "+refs/heads/*:refs/remotes/src/*",
                    "+refs/tags/*:refs/tags/*",
                ],
            )
            .map_err(|e| PresetError::Fetch {
                url: url.to_string(),
                source: Box::new(e),
            })?;
            match locked {
                Some(c) => {
                    if !have(c) {
                        // A commit no branch or tag reaches any more: ask for it by id.
                        git(
                            Some(&bare),
                            &["fetch", "--quiet", "--end-of-options", url, c],
                        )
                        .map_err(|e| PresetError::LockedCommitGone {
                            url: url.to_string(),
                            commit: c.to_string(),
                            source: Box::new(e),
                        })?;
                    }
                    c.to_string()
                }
                None => resolve_rev(&bare, rev).ok_or_else(|| PresetError::NoSuchRev {
                    url: url.to_string(),
                    rev: rev.to_string(),
                })?,
            }
        }
    };
    let dir = checkout_dir(&commit);
    if !dir.exists() {
        extract(&bare, &commit, &dir)?;
    }
    let hash = tree_hash(&dir)
        .map_err(|source| PresetError::Io(crate::fs::IoFailure::new("read", &dir, source)))?;
    Ok(Fetched { commit, hash, dir })
}

/// The commit a revision names: a branch, a tag, or a commit id (full or abbreviated).
fn resolve_rev(bare: &Path, rev: &str) -> Option<String> {
    if rev.starts_with('-') {
        return None;
    }
    for candidate in [
        format!("refs/remotes/src/{rev}"),
        format!("refs/tags/{rev}"),
        rev.to_string(),
    ] {
        if let Ok(out) = git(
            Some(bare),
            &[
                "rev-parse",
                "--verify",
                "--quiet",
                &format!("{candidate}^{{commit}}"),
            ],
        ) {
            let id = out.trim().to_string();
            if id.len() == 40 {
                return Some(id);
            }
        }
    }
    None
}

/// Extracts a commit's files into `dir` (through a temporary directory renamed into place, so
/// that a half-written checkout is never used).
fn extract(bare: &Path, commit: &str, dir: &Path) -> Result<(), PresetError> {
    let io = |what: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| PresetError::Io(crate::fs::IoFailure::new(what, path, source))
    };
    let parent = dir.parent().unwrap_or(dir);
    std::fs::create_dir_all(parent).map_err(io("create", parent))?;
    let tmp = parent.join(format!(".{commit}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(io("create", &tmp))?;
    let result = (|| {
        let mut archive = Command::new("git");
        archive
            .arg("--git-dir")
            .arg(bare)
            .args(["archive", "--format=tar", commit])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut archive = archive.spawn().map_err(|e| PresetError::Spawn("git", e))?;
        let Some(stdout) = archive.stdout.take() else {
            let _ = archive.kill();
            let _ = archive.wait();
            return Err(PresetError::Spawn(
                "git",
                std::io::Error::other("no output pipe"),
            ));
        };
        let mut tar = Command::new("tar");
        tar.arg("-x").arg("-C").arg(&tmp).stdin(stdout);
        let tar = bounded(tar, "tar", "tar -x")?;
        let git_out = bounded_child(archive, "git archive", GIT_TIMEOUT)?;
        if !git_out.status.success() {
            return Err(PresetError::Extract {
                program: "git archive",
                commit: commit.to_string(),
                stderr: String::from_utf8_lossy(&git_out.stderr).trim().to_string(),
            });
        }
        if !tar.status.success() {
            return Err(PresetError::Extract {
                program: "tar",
                commit: commit.to_string(),
                stderr: String::from_utf8_lossy(&tar.stderr).trim().to_string(),
            });
        }
        std::fs::rename(&tmp, dir).or_else(|e| {
            // Another process extracted the same commit meanwhile: theirs is as good.
            if dir.exists() {
                let _ = std::fs::remove_dir_all(&tmp);
                Ok(())
            } else {
                Err(io("move the checkout into", dir)(e))
            }
        })
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

/// Runs git (in `git_dir` when given), never prompting for credentials and never for longer
/// than [`GIT_TIMEOUT`]; returns its stdout.
fn git(git_dir: Option<&Path>, args: &[&str]) -> Result<String, PresetError> {
    let mut cmd = Command::new("git");
    if let Some(d) = git_dir {
        cmd.arg("--git-dir").arg(d);
    }
    cmd.args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(Stdio::null());
    let out = bounded(cmd, "git", &args.join(" "))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(PresetError::Git(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ))
    }
}

/// Runs a program (its input as the caller set it), its output captured, for at most
/// [`GIT_TIMEOUT`].
fn bounded(mut cmd: Command, program: &'static str, shown: &str) -> Result<Output, PresetError> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().map_err(|e| PresetError::Spawn(program, e))?;
    bounded_child(child, shown, GIT_TIMEOUT)
}

/// Waits for a started program for at most `timeout`, reading its piped output on threads
/// (so that a full pipe never blocks it); kills it when the time is up.
fn bounded_child(mut child: Child, shown: &str, timeout: Duration) -> Result<Output, PresetError> {
    fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    }
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now()
        .checked_add(timeout)
        .unwrap_or_else(|| Instant::now() + GIT_TIMEOUT);
    let mut pause = Duration::from_millis(2);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(PresetError::TimedOut {
                    command: shown.to_string(),
                    secs: timeout.as_secs(),
                });
            }
            Ok(None) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            Err(e) => return Err(PresetError::Spawn("git", e)),
        }
    };
    Ok(Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_or_a_locked_commit_that_reads_as_an_option_is_refused_before_git_runs() {
        let err = fetch("--upload-pack=touch /tmp/x", "main", None)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("must not start with `-`"), "{err}");
        let err = fetch("https://example.invalid/r.git", "main", Some("--output=x"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("not a commit id"), "{err}");
    }

    #[test]
    fn a_program_past_its_time_is_stopped() {
        let child = Command::new("sleep")
            .arg("30")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sleep runs");
        let pid = child.id();
        let err = bounded_child(child, "fetch x", Duration::from_millis(100))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("`git fetch x` did not finish"), "{err}");
        // It was killed and reaped, not left behind.
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
        let out = bounded(Command::new("true"), "true", "true").expect("true runs");
        assert!(out.status.success());
    }

    #[test]
    fn urls_stay_and_paths_resolve_against_the_declaring_file() {
        let d = Path::new("/work/project/workflows");
        assert_eq!(resolve_url("https://h/x.git", d), "https://h/x.git");
        assert_eq!(resolve_url("git@host:team/x.git", d), "git@host:team/x.git");
        assert_eq!(resolve_url("../presets", d), "/work/project/presets");
        assert_eq!(resolve_url("/srv/presets", d), "/srv/presets");
    }
}
