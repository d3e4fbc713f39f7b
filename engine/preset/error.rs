//! What can go wrong fetching and pinning git presets. Each error says its own part and keeps
//! its cause as its `source` ([`crate::diag::error_chain`] joins them).

use std::ops::Range;
use std::path::PathBuf;

use super::lock::{Locked, VERSION};

/// Why a git source could not be fetched or pinned.
#[derive(Debug, thiserror::Error)]
pub enum PresetError {
    /// A URL git would read as an option.
    #[error("`{0}` is not a repository URL or path (it must not start with `-`)")]
    NotAUrl(String),
    /// A lockfile commit that is not a commit id.
    #[error(
        "the lockfile's commit for {url} is `{commit}`, not a commit id; run `ralph-flow presets update`"
    )]
    NotACommit { url: String, commit: String },
    /// A file or directory of the cache or of a lockfile.
    #[error(transparent)]
    Io(#[from] crate::fs::IoFailure),
    /// git or tar could not be started.
    #[error("cannot run {0}")]
    Spawn(&'static str, #[source] std::io::Error),
    /// A git command that ran past its time limit (it was killed).
    #[error(
        "`git {command}` did not finish within {secs} s, so it was stopped; check that the repository can be reached"
    )]
    TimedOut { command: String, secs: u64 },
    /// git failed; what it said.
    #[error("{0}")]
    Git(String),
    /// Extracting a commit failed.
    #[error("{program} failed extracting commit {commit}: {stderr}")]
    Extract {
        program: &'static str,
        commit: String,
        stderr: String,
    },
    /// Fetching a repository failed.
    #[error("cannot fetch {url}")]
    Fetch {
        url: String,
        #[source]
        source: Box<PresetError>,
    },
    /// The repository no longer has the commit the lockfile pins.
    #[error("{url} no longer has the locked commit {commit}")]
    LockedCommitGone {
        url: String,
        commit: String,
        #[source]
        source: Box<PresetError>,
    },
    /// No branch, tag or commit of that name.
    #[error("{url} has no branch, tag or commit `{rev}`")]
    NoSuchRev { url: String, rev: String },
    /// A lockfile that cannot be used.
    #[error("{}", path.display())]
    Lockfile {
        path: PathBuf,
        #[source]
        source: LockError,
    },
}

/// What is wrong with a lockfile's text.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// It is not the TOML of a lockfile.
    #[error("{}", .0.message())]
    Syntax(toml::de::Error),
    /// A version this ralph-flow does not read.
    #[error("lockfile version {0} is not supported (this ralph-flow writes version {VERSION})")]
    Version(u32),
    /// A commit that is not a 40-digit id.
    #[error("source `{name}`: commit `{commit}` is not a 40-digit commit id")]
    NotACommit { name: String, commit: String },
    /// Two entries pin the same repository and revision.
    #[error("{0}")]
    Duplicate(Box<Duplicate>),
    /// It could not be written as TOML.
    #[error("cannot write the lockfile")]
    Render(#[source] toml::ser::Error),
}

/// Two entries of a lockfile that pin the same repository and revision.
#[derive(Debug, thiserror::Error)]
#[error("line {}: {}; {}", self.line, self.what(), Duplicate::ADVICE)]
pub struct Duplicate {
    /// The second entry's bytes in the lockfile's text, and its first line (from 1).
    pub at: Range<usize>,
    pub line: usize,
    /// The first entry's bytes, and its first line.
    pub first: Range<usize>,
    pub first_line: usize,
    pub name: String,
    pub git: String,
    pub rev: String,
}

impl Duplicate {
    /// What to do about it.
    pub const ADVICE: &str = "keep one of the two `[[source]]` entries (the right commit), \
         or delete both and run `ralph-flow presets fetch WORKFLOW` to pin it again";

    /// The entry at `at` of a lockfile's `text`, which pins what the entry at `first` pins.
    pub fn new(text: &str, at: Range<usize>, first: Range<usize>, entry: &Locked) -> Self {
        let line = |r: &Range<usize>| {
            text.get(..r.start)
                .map_or(0, |before| before.matches('\n').count())
                + 1
        };
        Duplicate {
            line: line(&at),
            first_line: line(&first),
            at,
            first,
            name: entry.name.clone(),
            git: entry.git.clone(),
            rev: entry.rev.clone(),
        }
    }

    /// What is wrong, where the second entry is shown: "source `team` (`../presets` at
    /// `v1`) is pinned twice (also at line 2)".
    pub fn what(&self) -> String {
        format!(
            "source `{}` (`{}` at `{}`) is pinned twice (also at line {})",
            self.name, self.git, self.rev, self.first_line
        )
    }
}
