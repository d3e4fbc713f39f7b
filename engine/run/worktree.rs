//! Isolated git worktrees for loops and for_each items.
//!
//! Worktree changes of one repository are serialized: `git worktree prune` run while another
//! `git worktree add` is half done removes the new worktree's administrative files, and two
//! `add`s race on the repository's lock files. Items of a fan-out start together, so
//! without this their worktrees fail under load. Within a process a mutex serializes them;
//! across processes (two runs in one repository) a lock on the file
//! `ralph-flow-worktrees.lock` in the repository's git directory does.
//!
//! A branch can be checked out in one worktree only. When the branch a new worktree needs is
//! checked out in another, [`ensure`] asks its [`Claim`] whether that one may be taken (a
//! worktree an earlier run left in the state directory, that run not running any more) and
//! then moves it where the new one goes (`git worktree move`: nothing in it is lost, the
//! files git ignores such as build output included). It never takes one with uncommitted
//! changes other than those its run recorded leaving there ([`WorkState`]), and asks the
//! claim again just before the move: a resume of that run finds its worktree under the same
//! lock, so one that started meanwhile holds its run's lock by then and keeps its worktree.

use std::path::{Path, PathBuf};

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

/// Who left a worktree that has a branch checked out, as the [`Claim`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Leftover {
    /// The run that made it.
    pub run: String,
    /// That run can still be resumed (it was stopped before its end): the message for changes
    /// it did not record tells how to go on with them.
    pub resumable: bool,
    /// [`WorkState::digest`] of the worktree as the run recorded leaving it, if it did.
    pub left: Option<String>,
}

/// Decides whether a worktree that has the branch another worktree needs may be taken.
pub(super) trait Claim {
    /// Who left the worktree at `path`, when it may be taken (it is in the state directory,
    /// left by another run that is not running and will not go on by itself), else why not.
    /// [`ensure`] then checks that it has no changes but those its run recorded leaving
    /// there, and asks again just before it moves it.
    fn leftover(&self, path: &Path) -> Result<Leftover, String>;
}

/// What a worktree holds beside its commits, to tell whether anyone changed it since a run
/// left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct WorkState {
    /// Nothing differs from HEAD: no change to a tracked file, staged or not, and no new file
    /// (files git ignores do not count).
    pub clean: bool,
    /// A digest of HEAD, the index's changes and every file's content that git does not
    /// ignore: equal digests, the same uncommitted work.
    pub digest: String,
}

/// Reads a worktree's [`WorkState`], changing nothing in it (its index included: the files
/// are hashed through an index of their own, and `git status` takes no optional lock). That
/// index starts as a copy of the worktree's own, its time kept, so that git hashes only the
/// files whose stat data changed (an index made from HEAD has none: every file would be
/// hashed, under the repository's worktree lock).
pub(super) async fn state(dir: &Path) -> Result<WorkState, WorktreeError> {
    use sha2::{Digest, Sha256};
    use std::sync::atomic::{AtomicU64, Ordering};
    let quiet: [(&str, &std::ffi::OsStr); 1] = [("GIT_OPTIONAL_LOCKS", std::ffi::OsStr::new("0"))];
    let head = git(dir, &["rev-parse", "--verify", "HEAD^{commit}"])
        .await?
        .trim()
        .to_string();
    let status = git_with(
        dir,
        &[
            "status",
            "--porcelain=v2",
            "-z",
            "--untracked-files=all",
            "--ignore-submodules=none",
        ],
        &quiet,
    )
    .await?;
    let clean = status.is_empty();
    let tree = if clean {
        String::new()
    } else {
        static N: AtomicU64 = AtomicU64::new(0);
        let index = std::env::temp_dir().join(format!(
            "ralph-flow-left-{}-{}.index",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let own = git(dir, &["rev-parse", "--git-path", "index"]).await?;
        let own = dir.join(own.trim_end_matches(['\n', '\r']));
        let env: [(&str, &std::ffi::OsStr); 2] = [("GIT_INDEX_FILE", index.as_os_str()), quiet[0]];
        let tree = async {
            if copy_index(&own, &index).is_err() {
                // No index of its own to start from: HEAD's tree (every file hashed).
                git_with(dir, &["read-tree", &head], &env).await?;
            }
            git_with(dir, &["add", "--all"], &env).await?;
            git_with(dir, &["write-tree"], &env).await
        }
        .await;
        let _ = std::fs::remove_file(&index);
        tree?.trim().to_string()
    };
    let mut h = Sha256::new();
    for part in [head.as_str(), tree.as_str(), status.as_str()] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    Ok(WorkState {
        clean,
        digest: format!("{:x}", h.finalize()),
    })
}

/// Copies an index with its modification time: git trusts an entry's stat data only when
/// it is older than the index file (a file changed in the same instant as the index was
/// written is hashed again), so a copy made later must not look newer.
fn copy_index(from: &Path, to: &Path) -> std::io::Result<()> {
    let modified = std::fs::metadata(from)?.modified()?;
    std::fs::copy(from, to)?;
    std::fs::File::options()
        .write(true)
        .open(to)?
        .set_modified(modified)
}

/// The worktree that has `branch` checked out (the main working tree included), with the
/// reason it is locked for when it is locked.
async fn holder_of(
    repo: &Path,
    branch: &str,
) -> Result<Option<(PathBuf, Option<String>)>, WorktreeError> {
    // Lines, not `-z` (git 2.36 and later only): the paths ralph-flow makes hold no line
    // break, and another path misread is only refused as not one of ralph-flow's.
    let list = git(repo, &["worktree", "list", "--porcelain"]).await?;
    let want = format!("branch refs/heads/{branch}");
    for entry in list.split("\n\n") {
        let mut path = None;
        let mut found = false;
        let mut locked = None;
        for line in entry.lines() {
            if let Some(p) = line.strip_prefix("worktree ") {
                path = Some(PathBuf::from(p));
            } else if line == want {
                found = true;
            } else if line == "locked" {
                locked = Some(String::new());
            } else if let Some(why) = line.strip_prefix("locked ") {
                locked = Some(why.to_string());
            }
        }
        if let (true, Some(path)) = (found, path) {
            return Ok(Some((path, locked)));
        }
    }
    Ok(None)
}

/// Tells whether the worktree at `other` may be taken for `branch`, by `claim`: who left it
/// when it may, else why not.
async fn may_take(
    other: &Path,
    locked: Option<&str>,
    branch: &str,
    claim: &dyn Claim,
) -> Result<Leftover, String> {
    let leftover = claim.leftover(other)?;
    let shown = other.display();
    if let Some(why) = locked {
        return Err(format!(
            "it is locked{}; unlock it (`git worktree unlock {shown}`) once nothing uses it, \
             then run again",
            if why.is_empty() {
                String::new()
            } else {
                format!(" ({why})")
            }
        ));
    }
    let now = state(other)
        .await
        .map_err(|e| format!("its state cannot be read: {}", crate::diag::error_chain(&e)))?;
    if !now.clean && leftover.left.as_deref() != Some(now.digest.as_str()) {
        let run = &leftover.run;
        let whose = match (&leftover.left, leftover.resumable) {
            (Some(_), _) => format!("they changed since run `{run}` left it"),
            (None, true) => format!(
                "run `{run}` stopped without recording what it left there; `ralph-flow resume \
                 {run}` continues that run in it"
            ),
            (None, false) => format!("run `{run}` did not record leaving them"),
        };
        return Err(format!(
            "it has uncommitted changes that ralph-flow did not leave there ({whose}); in it, \
             commit them on `{branch}`, stash them (`git stash -u`) or discard them, then run \
             again"
        ));
    }
    // Hashing its files took a while: the run that left it may have been resumed meanwhile.
    // Its resume holds the run's lock before it looks for its worktree (under the lock held
    // here), so asking again now is enough.
    if claim.leftover(other)? != leftover {
        return Err(format!(
            "run `{}`, which made it, changed while it was being looked at; run again",
            leftover.run
        ));
    }
    Ok(leftover)
}

/// Makes sure a worktree of `repo` exists at `path` on `branch` (created from `base` when
/// the branch does not exist yet). An existing worktree there is reused (resume), once the
/// lock is held: so a worktree is never found by a resume while another run moves it away.
/// When the branch is checked out in another worktree that `claim` lets it take (and that
/// holds no change but those its run left there), that worktree is moved to `path`: its
/// path before, and who left it, are returned.
pub(super) async fn ensure(
    repo: &Path,
    path: &Path,
    branch: &str,
    base: &str,
    claim: &dyn Claim,
) -> Result<Option<(PathBuf, Leftover)>, WorktreeError> {
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
    if path.join(".git").exists() {
        return Ok(None);
    }
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
        if let Some((other, locked)) = holder_of(repo, branch).await? {
            let leftover = may_take(&other, locked.as_deref(), branch, claim)
                .await
                .map_err(|why| WorktreeError::Held {
                    branch: branch.to_string(),
                    path: other.clone(),
                    why,
                })?;
            tracing::info!(
                "moving the worktree of `{branch}` that run {} left at {} to {p}",
                leftover.run,
                other.display()
            );
            git(
                repo,
                &[
                    "worktree",
                    "move",
                    "--end-of-options",
                    &other.to_string_lossy(),
                    &p,
                ],
            )
            .await?;
            return Ok(Some((other, leftover)));
        }
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
    Ok(None)
}

/// Removes a worktree (the branch stays).
pub(super) async fn remove(repo: &Path, path: &Path) -> Result<(), WorktreeError> {
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

/// Removes the git worktree at `path` from outside a run (`ralph-flow runs prune`), as a
/// run removes one ([`remove`]: under the worktree lock of its repository that every
/// ralph-flow process takes, so that it never races a run adding a worktree there). The
/// repository is the one the worktree's `.git` names; `Ok(None)` when none answers for it
/// (it is gone: the directory is an ordinary one, for the caller to delete). Else
/// `Ok(Some(repository))`, the git directory it was removed from.
pub fn remove_outside_run(path: &Path) -> Result<Option<PathBuf>, WorktreeError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(WorktreeError::Spawn)?;
    runtime.block_on(async {
        let common = match git(
            path,
            &["rev-parse", "--path-format=absolute", "--git-common-dir"],
        )
        .await
        {
            Ok(out) => PathBuf::from(out.trim()),
            Err(_) => return Ok(None),
        };
        if !common.is_dir() {
            return Ok(None);
        }
        remove(&common, path).await?;
        Ok(Some(common))
    })
}

#[cfg(test)]
mod tests {
    /// A claim that takes nothing: every worktree holding the branch is left alone.
    struct NoClaim;

    impl Claim for NoClaim {
        fn leftover(&self, _: &Path) -> Result<Leftover, String> {
            Err("ralph-flow leaves it alone".to_string())
        }
    }

    use super::*;

    #[tokio::test]
    async fn a_branch_or_base_that_reads_as_an_option_is_refused() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = tmp.path().join("wt");
        for (branch, base) in [("--orphan", "HEAD"), ("b", "--detach"), ("", "HEAD")] {
            let err = ensure(tmp.path(), &path, branch, base, &NoClaim)
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
        let err = ensure(&clone, &wt, "item/a", "main", &NoClaim)
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("names no commit"), "{err}");
        ensure(&clone, &wt, "item/a", "origin/main", &NoClaim)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(sh(&wt, &["symbolic-ref", "--short", "HEAD"]), "item/a");
        assert_eq!(sh(&clone, &["branch", "--list", "main"]), "");
    }

    /// A claim that lets every worktree be taken, as left by run `r1` with `left` recorded.
    struct Lets(Option<String>);

    impl Claim for Lets {
        fn leftover(&self, _: &Path) -> Result<Leftover, String> {
            Ok(Leftover {
                run: "r1".into(),
                resumable: false,
                left: self.0.clone(),
            })
        }
    }

    /// A repository with a worktree on branch `b` at `old`.
    fn repo_with_worktree(tmp: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
        let repo = tmp.join("repo");
        std::fs::create_dir_all(&repo).unwrap_or_else(|e| panic!("{e}"));
        sh(&repo, &["init", "--quiet", "-b", "main"]);
        std::fs::write(repo.join(".gitignore"), "target/\n").unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(repo.join("a.txt"), "a\n").unwrap_or_else(|e| panic!("{e}"));
        sh(&repo, &["add", "-A"]);
        sh(&repo, &["commit", "--quiet", "-m", "base"]);
        let old = tmp.join("old");
        sh(
            &repo,
            &[
                "worktree",
                "add",
                "--quiet",
                "-b",
                "b",
                &old.to_string_lossy(),
            ],
        );
        (repo, old)
    }

    async fn held(repo: &Path, new: &Path, claim: &dyn Claim) -> String {
        ensure(repo, new, "b", "HEAD", claim)
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    /// Without a claim, or with one that refuses, the worktree holding the branch is left as
    /// it is and the error names it; a claim that lets it be taken moves it, with what git
    /// ignores.
    #[tokio::test]
    async fn a_worktree_holding_the_branch_is_moved_only_when_the_claim_lets_it() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (repo, old) = repo_with_worktree(tmp.path());
        std::fs::create_dir_all(old.join("target")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(old.join("target/cache"), "c").unwrap_or_else(|e| panic!("{e}"));
        let new = tmp.path().join("runs/r2/item");
        let err = held(&repo, &new, &NoClaim).await;
        assert!(
            err.contains("`b` is checked out in the worktree") && err.contains("old"),
            "{err}"
        );
        struct No;
        impl Claim for No {
            fn leftover(&self, _: &Path) -> Result<Leftover, String> {
                Err("run r1 is running".into())
            }
        }
        let err = held(&repo, &new, &No).await;
        assert!(err.contains("run r1 is running"), "{err}");
        assert!(old.join(".git").exists() && !new.exists());
        let taken = ensure(&repo, &new, "b", "HEAD", &Lets(None))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            taken.map(|(from, l)| (from, l.run)),
            Some((old.clone(), "r1".into()))
        );
        assert!(!old.exists());
        assert_eq!(sh(&new, &["symbolic-ref", "--short", "HEAD"]), "b");
        assert_eq!(
            std::fs::read_to_string(new.join("target/cache"))
                .ok()
                .as_deref(),
            Some("c")
        );
        // Found again where it is now (a resume).
        assert!(ensure(&repo, &new, "b", "HEAD", &Lets(None)).await.ok() == Some(None));
    }

    /// A worktree with uncommitted changes is taken only when they are exactly those its run
    /// recorded leaving there; otherwise nothing in it is touched.
    #[tokio::test]
    async fn uncommitted_changes_are_taken_only_as_their_run_left_them() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (repo, old) = repo_with_worktree(tmp.path());
        let head = sh(&old, &["rev-parse", "HEAD"]);
        let clean = state(&old).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(clean.clean);
        // What git ignores is no change.
        std::fs::create_dir_all(old.join("target")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(old.join("target/x"), "x").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(state(&old).await.ok(), Some(clean.clone()));
        std::fs::write(old.join("a.txt"), "changed\n").unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(old.join("new.txt"), "new\n").unwrap_or_else(|e| panic!("{e}"));
        let left = state(&old).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(!left.clean && left.digest != clean.digest);
        assert_eq!(sh(&old, &["rev-parse", "HEAD"]), head);
        // The index is not touched.
        assert_eq!(sh(&old, &["diff", "--cached", "--name-only"]), "");
        let new = tmp.path().join("new");
        for recorded in [None, Some(clean.digest.clone())] {
            let err = held(&repo, &new, &Lets(recorded)).await;
            assert!(
                err.contains("uncommitted changes") && err.contains("stash"),
                "{err}"
            );
        }
        // Changed again after the run left it: still refused.
        std::fs::write(old.join("new.txt"), "newer\n").unwrap_or_else(|e| panic!("{e}"));
        let err = held(&repo, &new, &Lets(Some(left.digest.clone()))).await;
        assert!(err.contains("uncommitted changes"), "{err}");
        assert_eq!(
            std::fs::read_to_string(old.join("a.txt")).ok().as_deref(),
            Some("changed\n")
        );
        assert!(!new.exists());
        // As the run left it: taken, changes and all.
        std::fs::write(old.join("new.txt"), "new\n").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(state(&old).await.ok(), Some(left.clone()));
        let taken = ensure(&repo, &new, "b", "HEAD", &Lets(Some(left.digest)))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(taken.is_some());
        assert_eq!(
            std::fs::read_to_string(new.join("new.txt")).ok().as_deref(),
            Some("new\n")
        );
    }

    /// A locked worktree is not taken, whatever the claim says.
    #[tokio::test]
    async fn a_locked_worktree_is_not_taken() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (repo, old) = repo_with_worktree(tmp.path());
        sh(
            &repo,
            &[
                "worktree",
                "lock",
                "--reason",
                "on a stick",
                &old.to_string_lossy(),
            ],
        );
        let err = held(&repo, &tmp.path().join("new"), &Lets(None)).await;
        assert!(err.contains("locked (on a stick)"), "{err}");
        assert!(old.join(".git").exists());
    }
}
