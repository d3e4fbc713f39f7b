//! Git workspaces that travel between machines.
//!
//! A run that a worker carries out (`run --detach`) in a git repository publishes every git
//! workspace it works in (its checkout, and the worktrees of its loops and items) to the
//! run's repository after each agent, command and check stage, before the stage's
//! settlement is committed:
//! - the branch checked out there, as it is, to `refs/heads/BRANCH` (a push that fails
//!   when the branch moved on the remote since this run last saw it);
//! - what is not committed (changed, new and deleted files, as `git add -A` sees them;
//!   ignored files stay behind) as one commit on top of it, `refs/ralph-flow/wip/BRANCH`,
//!   which the next publish replaces or deletes.
//!
//! A worker that takes the run over [`restore`]s both, so that its checkout is what the
//! last settled stage left, committed or not, and the stage that was running runs again
//! on it. Every git command is an argv list; refs come from templates only as whole
//! arguments, and a branch or URL that git could read as an option is refused.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::WorktreeError;
use super::worktree::{git, git_with};

/// The namespace of the uncommitted changes' commits on the remote.
pub(super) const WIP_REFS: &str = "refs/ralph-flow/wip";

/// Who the commits of uncommitted changes are by (a worker may have no git identity), and
/// when: a fixed date, so that the same changes on the same commit make the same commit
/// wherever they are snapshot (a workspace restored and unchanged is not pushed again).
const IDENTITY: [(&str, &str); 6] = [
    ("GIT_AUTHOR_NAME", "ralph-flow"),
    ("GIT_AUTHOR_EMAIL", "ralph-flow@localhost"),
    ("GIT_AUTHOR_DATE", "2000-01-01T00:00:00Z"),
    ("GIT_COMMITTER_NAME", "ralph-flow"),
    ("GIT_COMMITTER_EMAIL", "ralph-flow@localhost"),
    ("GIT_COMMITTER_DATE", "2000-01-01T00:00:00Z"),
];

/// What a workspace holds: its branch, the branch's commit, and the commit of what is not
/// committed (`None` when the tree is clean).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Snapshot {
    pub branch: String,
    pub head: String,
    pub wip: Option<String>,
}

/// What the remote holds of a branch: its commit and its uncommitted changes' commit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Remote {
    pub head: Option<String>,
    pub wip: Option<String>,
}

/// Publishes a run's workspaces to its repository (one per run).
pub(crate) struct Publisher {
    url: String,
    /// One publish at a time: two stages of one workspace may settle together.
    turn: tokio::sync::Mutex<()>,
    /// What the remote holds, by workspace top, as this run last pushed or restored it.
    known: RefCell<HashMap<PathBuf, Remote>>,
    /// The top of the git worktree a directory is in (`None`: not in one).
    tops: RefCell<HashMap<PathBuf, Option<PathBuf>>>,
}

/// Why a workspace could not be published or restored.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error(transparent)]
    Git(#[from] WorktreeError),
    #[error(
        "HEAD is detached in {}: a stage of a run on workers must leave a branch checked out, \
         so that the next machine can go on from it",
        .0.display()
    )]
    Detached(PathBuf),
    #[error("the repository URL `{0}` reads as an option of git")]
    BadUrl(String),
    #[error("the branch `{0}` is not a valid git name (empty, or starting with `-`)")]
    BadBranch(String),
}

fn checked(url: &str, branch: &str) -> Result<(), PublishError> {
    if url.starts_with('-') {
        return Err(PublishError::BadUrl(url.to_string()));
    }
    if branch.is_empty() || branch.starts_with('-') {
        return Err(PublishError::BadBranch(branch.to_string()));
    }
    Ok(())
}

impl Publisher {
    pub(super) fn new(url: String) -> Publisher {
        Publisher {
            url,
            turn: tokio::sync::Mutex::new(()),
            known: RefCell::default(),
            tops: RefCell::default(),
        }
    }

    /// The repository the run publishes to.
    pub(super) fn url(&self) -> &str {
        &self.url
    }

    /// The top of the git worktree `dir` is in (`None`: it is in none).
    pub(super) async fn top(&self, dir: &Path) -> Option<PathBuf> {
        if let Some(t) = self.tops.borrow().get(dir) {
            return t.clone();
        }
        let top = git(dir, &["rev-parse", "--show-toplevel"])
            .await
            .ok()
            .map(|s| PathBuf::from(s.trim()))
            .filter(|p| !p.as_os_str().is_empty());
        self.tops
            .borrow_mut()
            .insert(dir.to_path_buf(), top.clone());
        top
    }

    /// Publishes the git workspace `dir` is in (nothing when it is in none, or when
    /// nothing changed since the last publish). Returns the workspace's top and branch.
    pub(super) async fn publish(
        &self,
        dir: &Path,
    ) -> Result<Option<(PathBuf, String)>, PublishError> {
        let _turn = self.turn.lock().await;
        let Some(top) = self.top(dir).await else {
            return Ok(None);
        };
        let snap = snapshot(&top).await?;
        tracing::debug!(dir = %dir.display(), top = %top.display(), ?snap, "publish");
        checked(&self.url, &snap.branch)?;
        let known = self.known.borrow().get(&top).cloned();
        let known = match known {
            Some(k) => k,
            None => ls_remote(&top, &self.url, &snap.branch).await?,
        };
        if known.head.as_deref() == Some(snap.head.as_str()) && known.wip == snap.wip {
            return Ok(Some((top, snap.branch)));
        }
        let branch_ref = format!("refs/heads/{}", snap.branch);
        let wip_ref = format!("{WIP_REFS}/{}", snap.branch);
        let lease = format!(
            "--force-with-lease={branch_ref}:{}",
            known.head.as_deref().unwrap_or("")
        );
        let mut args: Vec<String> = vec![
            "push".into(),
            "--quiet".into(),
            "--atomic".into(),
            "--no-verify".into(),
            lease,
            self.url.clone(),
            format!("{}:{branch_ref}", snap.head),
        ];
        match (&snap.wip, &known.wip) {
            (Some(w), _) => args.push(format!("+{w}:{wip_ref}")),
            (None, Some(_)) => args.push(format!(":{wip_ref}")),
            (None, None) => {}
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        git(&top, &args).await?;
        self.known.borrow_mut().insert(
            top.clone(),
            Remote {
                head: Some(snap.head),
                wip: snap.wip,
            },
        );
        Ok(Some((top, snap.branch)))
    }

    /// [`restore`]s a worktree of the run on `branch` from the remote, and remembers what
    /// the remote holds.
    pub(super) async fn restore(&self, dir: &Path, branch: &str) -> Result<bool, PublishError> {
        let _turn = self.turn.lock().await;
        let remote = restore(dir, &self.url, branch).await?;
        let found = remote.head.is_some();
        if let Some(top) = self.top(dir).await {
            self.known.borrow_mut().insert(top, remote);
        }
        Ok(found)
    }
}

/// What the workspace at `top` holds: its branch, HEAD, and a commit of its uncommitted
/// changes (made with an index of its own: the workspace's index is not touched).
pub(super) async fn snapshot(top: &Path) -> Result<Snapshot, PublishError> {
    let branch = git(top, &["symbolic-ref", "--quiet", "--short", "HEAD"])
        .await
        .map_err(|_| PublishError::Detached(top.to_path_buf()))?
        .trim()
        .to_string();
    let head = git(top, &["rev-parse", "--verify", "HEAD^{commit}"])
        .await?
        .trim()
        .to_string();
    static N: AtomicU64 = AtomicU64::new(0);
    let index = std::env::temp_dir().join(format!(
        "ralph-flow-{}-{}.index",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let env: [(&str, &OsStr); 1] = [("GIT_INDEX_FILE", index.as_os_str())];
    let tree = async {
        git_with(top, &["read-tree", &head], &env).await?;
        git_with(top, &["add", "--all"], &env).await?;
        git_with(top, &["write-tree"], &env).await
    }
    .await;
    let _ = std::fs::remove_file(&index);
    let tree = tree?.trim().to_string();
    let head_tree = git(top, &["rev-parse", &format!("{head}^{{tree}}")])
        .await?
        .trim()
        .to_string();
    let wip = if tree == head_tree {
        None
    } else {
        let identity: Vec<(&str, &OsStr)> =
            IDENTITY.iter().map(|(k, v)| (*k, OsStr::new(*v))).collect();
        let message = format!("ralph-flow: uncommitted changes on {branch}");
        Some(
            git_with(
                top,
                &["commit-tree", &tree, "-p", &head, "-m", &message],
                &identity,
            )
            .await?
            .trim()
            .to_string(),
        )
    };
    Ok(Snapshot { branch, head, wip })
}

/// What the remote at `url` holds of `branch`.
pub(super) async fn ls_remote(dir: &Path, url: &str, branch: &str) -> Result<Remote, PublishError> {
    checked(url, branch)?;
    let branch_ref = format!("refs/heads/{branch}");
    let wip_ref = format!("{WIP_REFS}/{branch}");
    let out = git(dir, &["ls-remote", url, &branch_ref, &wip_ref]).await?;
    let mut remote = Remote::default();
    for line in out.lines() {
        let mut parts = line.split_whitespace();
        let (Some(sha), Some(name)) = (parts.next(), parts.next()) else {
            continue;
        };
        if name == branch_ref {
            remote.head = Some(sha.to_string());
        } else if name == wip_ref {
            remote.wip = Some(sha.to_string());
        }
    }
    Ok(remote)
}

/// Makes the git worktree at `dir` what the remote at `url` holds of `branch`, when it
/// holds the branch: the branch checked out at the remote's commit, every local change and
/// untracked file dropped (ignored files stay), then the uncommitted changes put back as
/// changes (the index is the branch's commit; new files are untracked again). Returns what
/// the remote holds (`head` is `None` when it does not have the branch: then nothing is
/// touched).
pub(super) async fn restore(dir: &Path, url: &str, branch: &str) -> Result<Remote, PublishError> {
    let remote = ls_remote(dir, url, branch).await?;
    tracing::debug!(dir = %dir.display(), branch, ?remote, "restore");
    let Some(head) = &remote.head else {
        return Ok(remote);
    };
    let mut fetch = vec![
        "fetch".to_string(),
        "--quiet".into(),
        "--no-tags".into(),
        url.to_string(),
        format!("refs/heads/{branch}"),
    ];
    if remote.wip.is_some() {
        fetch.push(format!("{WIP_REFS}/{branch}"));
    }
    let fetch: Vec<&str> = fetch.iter().map(String::as_str).collect();
    git(dir, &fetch).await?;
    git(dir, &["checkout", "--quiet", "--force", "-B", branch, head]).await?;
    git(dir, &["clean", "--quiet", "--force", "-d"]).await?;
    if let Some(wip) = &remote.wip {
        git(dir, &["read-tree", "-u", "--reset", wip]).await?;
        git(dir, &["reset", "--quiet"]).await?;
    }
    Ok(remote)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(dir: &Path, args: &[&str]) -> String {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@t")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@t")
            .output()
            .unwrap_or_else(|e| panic!("git: {e}"));
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn write(p: &Path, text: &str) {
        std::fs::write(p, text).unwrap_or_else(|e| panic!("{e}"));
    }

    /// A workspace published on one machine and restored on another is the same, committed
    /// or not: a new commit, a changed, a new, a deleted and an ignored file; then a publish
    /// from the second with the tree clean deletes the changes' commit, and a push over a
    /// branch that moved meanwhile is refused.
    #[tokio::test(flavor = "current_thread")]
    async fn a_workspace_travels_with_its_uncommitted_changes() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let origin = tmp.path().join("origin.git");
        let a = tmp.path().join("a");
        let b = tmp.path().join("b");
        std::fs::create_dir_all(&a).unwrap_or_else(|e| panic!("{e}"));
        sh(
            tmp.path(),
            &["init", "--quiet", "--bare", &origin.to_string_lossy()],
        );
        sh(&a, &["init", "--quiet", "-b", "main"]);
        write(&a.join(".gitignore"), "target/\n");
        write(&a.join("kept.txt"), "one\n");
        write(&a.join("gone.txt"), "bye\n");
        sh(&a, &["add", "--all"]);
        sh(&a, &["commit", "--quiet", "-m", "base"]);
        let url = format!("file://{}", origin.display());
        sh(&a, &["push", "--quiet", &url, "main"]);
        sh(&a, &["checkout", "--quiet", "-b", "ralph-flow/r1"]);
        write(&a.join("committed.txt"), "c\n");
        sh(&a, &["add", "committed.txt"]);
        sh(&a, &["commit", "--quiet", "-m", "stage one"]);
        write(&a.join("kept.txt"), "one\ntwo\n");
        write(&a.join("new.txt"), "new\n");
        std::fs::remove_file(a.join("gone.txt")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir_all(a.join("target")).unwrap_or_else(|e| panic!("{e}"));
        write(&a.join("target/build.o"), "x");
        let status_a = sh(&a, &["status", "--porcelain"]);

        let p = Publisher::new(url.clone());
        let top = p.publish(&a).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            top.map(|(t, b)| (t.ends_with("a"), b)),
            Some((true, "ralph-flow/r1".to_string()))
        );
        assert_eq!(
            sh(&a, &["status", "--porcelain"]),
            status_a,
            "the workspace's index and files are untouched"
        );
        let remote = ls_remote(&a, &url, "ralph-flow/r1")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            remote.head.as_deref(),
            Some(sh(&a, &["rev-parse", "HEAD"]).trim())
        );
        assert!(remote.wip.is_some(), "{remote:?}");

        // Another machine: a clone of the base, restored to what the first left.
        sh(
            tmp.path(),
            &["clone", "--quiet", &url, &b.to_string_lossy()],
        );
        write(&b.join("stray.txt"), "a file a killed stage left\n");
        let q = Publisher::new(url.clone());
        assert!(
            q.restore(&b, "ralph-flow/r1")
                .await
                .unwrap_or_else(|e| panic!("{e}"))
        );
        assert_eq!(sh(&b, &["status", "--porcelain"]), status_a);
        assert_eq!(
            std::fs::read_to_string(b.join("kept.txt")).unwrap_or_default(),
            "one\ntwo\n"
        );
        assert!(b.join("committed.txt").exists() && b.join("new.txt").exists());
        assert!(!b.join("gone.txt").exists() && !b.join("stray.txt").exists());
        assert!(!b.join("target").exists(), "ignored files stay behind");

        // The second machine commits everything: the changes' commit goes.
        sh(&b, &["add", "--all"]);
        sh(&b, &["commit", "--quiet", "-m", "stage two"]);
        q.publish(&b).await.unwrap_or_else(|e| panic!("{e}"));
        let remote = ls_remote(&b, &url, "ralph-flow/r1")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            remote.head.as_deref(),
            Some(sh(&b, &["rev-parse", "HEAD"]).trim())
        );
        assert_eq!(remote.wip, None);

        // The first machine, which still believes its own push is the remote's, may not
        // overwrite the second's work.
        write(&a.join("kept.txt"), "stale\n");
        let err = p
            .publish(&a)
            .await
            .err()
            .map(|e| crate::diag::error_chain(&e));
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("stale info") || e.contains("rejected")),
            "{err:?}"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_detached_head_or_an_option_for_a_url_is_refused() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let a = tmp.path();
        sh(a, &["init", "--quiet", "-b", "main"]);
        write(&a.join("f"), "f");
        sh(a, &["add", "f"]);
        sh(a, &["commit", "--quiet", "-m", "f"]);
        let p = Publisher::new("--upload-pack=touch /tmp/x".into());
        let err = p.publish(a).await.err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("reads as an option")));
        sh(a, &["checkout", "--quiet", "--detach"]);
        let p = Publisher::new(format!("file://{}", a.display()));
        let err = p.publish(a).await.err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("HEAD is detached")));
    }
}
