//! Isolated git worktrees for loops and for_each items.
//!
//! Worktree changes of one repository are serialized: `git worktree prune` run while another
//! `git worktree add` is half done removes the new worktree's administrative files, and two
//! `add`s race on the repository's lock files. Items of a fan-out start together, so
//! without this their worktrees fail under load. Within a process a mutex serializes them;
//! across processes (two runs in one repository) a lock on the file
//! `ralph-flow-worktrees.lock` in the repository's git directory does.

use std::path::Path;

use tokio::process::Command;

use super::error::{Cause, WorktreeError};

/// Held while a worktree is added or removed.
static WORKTREES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The longest a git command of a worktree may take (a hook, a lock held elsewhere).
const GIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

pub(super) async fn git(repo: &Path, args: &[&str]) -> Result<String, WorktreeError> {
    git_with(repo, args, &[]).await
}

/// [`git`] with variables added to its environment.
pub(super) async fn git_with(
    repo: &Path,
    args: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
) -> Result<String, WorktreeError> {
    let run = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(GIT_TIMEOUT, run)
        .await
        .map_err(|_| WorktreeError::TimedOut {
            command: args.join(" "),
            secs: GIT_TIMEOUT.as_secs(),
        })?
        .map_err(WorktreeError::Spawn)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(WorktreeError::Git {
            command: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Takes the repository's worktree lock, shared by every ralph-flow process (released when
/// the returned file is dropped). Waiting for it does not block the executor's thread.
async fn repo_lock(repo: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, WorktreeError> {
    let common = git(repo, &["rev-parse", "--git-common-dir"]).await?;
    let common = Path::new(common.trim());
    let dir = if common.is_absolute() {
        common.to_path_buf()
    } else {
        repo.join(common)
    };
    let path = dir.join("ralph-flow-worktrees.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| WorktreeError::Io(crate::fs::IoFailure::new("open", &path, source)))?;
    let lock_failed = |source: Cause| WorktreeError::Lock {
        path: path.clone(),
        source,
    };
    tokio::task::spawn_blocking(move || {
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, errno)| errno)
    })
    .await
    .map_err(|e| lock_failed(Box::new(e)))?
    .map_err(|e| lock_failed(Box::new(e)))
}

/// Makes sure a worktree of `repo` exists at `path` on `branch` (created from `base` when
/// the branch does not exist yet). An existing worktree there is reused (resume).
pub async fn ensure(
    repo: &Path,
    path: &Path,
    branch: &str,
    base: &str,
) -> Result<(), WorktreeError> {
    if path.join(".git").exists() {
        return Ok(());
    }
    // Both come from templates (an item, an agent's output): never let one read as an
    // option of git. Git refuses such ref names anyway; say so plainly.
    for (what, value) in [("branch", branch), ("base", base)] {
        if value.is_empty() || value.starts_with('-') {
            return Err(WorktreeError::BadName {
                what,
                value: value.to_string(),
            });
        }
    }
    let _held = WORKTREES.lock().await;
    let _locked = repo_lock(repo).await?;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|source| {
            WorktreeError::Io(crate::fs::IoFailure::new("create", parent, source))
        })?;
    }
    // A worktree whose directory vanished is still registered: forget it first.
    let _ = git(repo, &["worktree", "prune"]).await;
    let p = path.to_string_lossy();
    let exists = git(
        repo,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            "--end-of-options",
            &format!("refs/heads/{branch}"),
        ],
    )
    .await
    .is_ok();
    if exists {
        git(repo, &["worktree", "add", "--end-of-options", &p, branch]).await?;
    } else {
        // The base as a commit: given a name that is only a remote's branch (`main` in a
        // fresh clone), `worktree add` would make and check out a local branch of that name
        // instead of the new branch, and the item's commits would land on it.
        let commit = git(
            repo,
            &[
                "rev-parse",
                "--verify",
                "--quiet",
                "--end-of-options",
                &format!("{base}^{{commit}}"),
            ],
        )
        .await
        .map_err(|_| WorktreeError::NoBase(base.to_string()))?;
        git(
            repo,
            &[
                "worktree",
                "add",
                "-b",
                branch,
                "--end-of-options",
                &p,
                commit.trim(),
            ],
        )
        .await?;
    }
    Ok(())
}

/// Removes a worktree (the branch stays).
pub async fn remove(repo: &Path, path: &Path) -> Result<(), WorktreeError> {
    if !path.exists() {
        return Ok(());
    }
    let _held = WORKTREES.lock().await;
    let _locked = repo_lock(repo).await?;
    git(
        repo,
        &[
            "worktree",
            "remove",
            "--force",
            "--end-of-options",
            &path.to_string_lossy(),
        ],
    )
    .await
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_branch_or_base_that_reads_as_an_option_is_refused() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = tmp.path().join("wt");
        for (branch, base) in [("--orphan", "HEAD"), ("b", "--detach"), ("", "HEAD")] {
            let err = ensure(tmp.path(), &path, branch, base)
                .await
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains("is not a valid git name"), "{err}");
        }
        assert!(!path.exists(), "nothing was made");
    }

    fn sh(dir: &Path, args: &[&str]) -> String {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// In a fresh clone `main` is only the remote's branch: the worktree is still made on
    /// its own branch from `origin/main` (git's `worktree add PATH main` would have made
    /// and checked out a local `main` instead), and a bare `main` is refused plainly.
    #[tokio::test]
    async fn the_worktree_is_on_its_branch_whatever_the_base_names() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let src = tmp.path().join("src");
        std::fs::create_dir_all(&src).unwrap_or_else(|e| panic!("{e}"));
        sh(&src, &["init", "--quiet", "-b", "main"]);
        sh(&src, &["commit", "--quiet", "--allow-empty", "-m", "base"]);
        // A remote whose HEAD names another branch: its clone has no local branch at all.
        let bare = tmp.path().join("bare.git");
        sh(
            tmp.path(),
            &[
                "init",
                "--quiet",
                "--bare",
                "-b",
                "trunk",
                &bare.to_string_lossy(),
            ],
        );
        sh(&src, &["push", "--quiet", &bare.to_string_lossy(), "main"]);
        let clone = tmp.path().join("clone");
        sh(
            tmp.path(),
            &[
                "clone",
                "--quiet",
                "--no-checkout",
                &bare.to_string_lossy(),
                "clone",
            ],
        );
        sh(
            &clone,
            &["checkout", "--quiet", "-B", "work", "origin/main"],
        );
        let wt = tmp.path().join("wt");
        let err = ensure(&clone, &wt, "item/a", "main")
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("names no commit"), "{err}");
        ensure(&clone, &wt, "item/a", "origin/main")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(sh(&wt, &["symbolic-ref", "--short", "HEAD"]), "item/a");
        assert_eq!(sh(&clone, &["branch", "--list", "main"]), "");
    }
}
