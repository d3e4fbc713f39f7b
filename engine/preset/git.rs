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

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

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

/// Fetches `rev` of repository `url` into the cache and extracts its commit. With `locked`,
/// that exact commit is used (the lockfile's pin), whatever `rev` points to now.
pub fn fetch(url: &str, rev: &str, locked: Option<&str>) -> Result<Fetched, String> {
    // A source may come from a preset someone else wrote: a URL that git would read as an
    // option (`--upload-pack=...` runs a program) is refused, and every URL and commit goes
    // after `--end-of-options` as well.
    if url.is_empty() || url.starts_with('-') {
        return Err(format!(
            "`{url}` is not a repository URL or path (it must not start with `-`)"
        ));
    }
    if let Some(c) = locked {
        if c.len() != 40 || !c.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "the lockfile's commit for {url} is `{c}`, not a commit id; run `ralph-flow presets update`"
            ));
        }
    }
    let cache = cache_dir();
    let repos = cache.join("git").join("repos");
    std::fs::create_dir_all(&repos)
        .map_err(|e| format!("cannot create the cache {}: {e}", repos.display()))?;
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
            .map_err(|e| format!("cannot fetch {url}: {e}"))?;
            match locked {
                Some(c) => {
                    if !have(c) {
                        // A commit no branch or tag reaches any more: ask for it by id.
                        git(
                            Some(&bare),
                            &["fetch", "--quiet", "--end-of-options", url, c],
                        )
                        .map_err(|e| format!("{url} no longer has the locked commit {c}: {e}"))?;
                    }
                    c.to_string()
                }
                None => resolve_rev(&bare, rev)
                    .ok_or_else(|| format!("{url} has no branch, tag or commit `{rev}`"))?,
            }
        }
    };
    let dir = checkout_dir(&commit);
    if !dir.exists() {
        extract(&bare, &commit, &dir)?;
    }
    let hash = tree_hash(&dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
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
fn extract(bare: &Path, commit: &str, dir: &Path) -> Result<(), String> {
    let parent = dir.parent().unwrap_or(dir);
    std::fs::create_dir_all(parent)
        .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    let tmp = parent.join(format!(".{commit}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
    let result = (|| {
        let mut archive = Command::new("git")
            .arg("--git-dir")
            .arg(bare)
            .args(["archive", "--format=tar", commit])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run git: {e}"))?;
        let stdout = archive
            .stdout
            .take()
            .ok_or_else(|| "git archive gave no output".to_string())?;
        let tar = Command::new("tar")
            .arg("-x")
            .arg("-C")
            .arg(&tmp)
            .stdin(stdout)
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| format!("cannot run tar: {e}"))?;
        let git_out = archive
            .wait_with_output()
            .map_err(|e| format!("git archive: {e}"))?;
        if !git_out.status.success() {
            return Err(format!(
                "git archive {commit} failed: {}",
                String::from_utf8_lossy(&git_out.stderr).trim()
            ));
        }
        if !tar.status.success() {
            return Err(format!(
                "tar failed: {}",
                String::from_utf8_lossy(&tar.stderr).trim()
            ));
        }
        std::fs::rename(&tmp, dir).or_else(|e| {
            // Another process extracted the same commit meanwhile: theirs is as good.
            if dir.exists() {
                let _ = std::fs::remove_dir_all(&tmp);
                Ok(())
            } else {
                Err(format!(
                    "cannot move the checkout into {}: {e}",
                    dir.display()
                ))
            }
        })
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

/// Runs git (in `git_dir` when given), never prompting for credentials; returns its stdout.
fn git(git_dir: Option<&Path>, args: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new("git");
    if let Some(d) = git_dir {
        cmd.arg("--git-dir").arg(d);
    }
    let out = cmd
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_or_a_locked_commit_that_reads_as_an_option_is_refused_before_git_runs() {
        let err = fetch("--upload-pack=touch /tmp/x", "main", None)
            .err()
            .unwrap_or_default();
        assert!(err.contains("must not start with `-`"), "{err}");
        let err = fetch("https://example.invalid/r.git", "main", Some("--output=x"))
            .err()
            .unwrap_or_default();
        assert!(err.contains("not a commit id"), "{err}");
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
