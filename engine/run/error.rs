//! The run side's errors. Each says its own part and keeps what caused it as its `source`;
//! the whole message is built once, where it is shown or stored
//! ([`crate::diag::error_chain`]). [`RunError`] stops a run before or while it goes;
//! [`StageError`] fails one stage, which then takes its `on_error`.

use std::path::PathBuf;

pub use crate::fs::IoFailure;
use crate::params::ParamError;
use crate::store::StoreError;
use crate::template::SpreadError;

/// A boxed error of another layer (a backend's), kept as the source.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// A template that does not render, or an expression that does not evaluate. Its message
/// carries minijinja's whole chain (minijinja's own errors say little without their causes).
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The plan has no template of that name (a bug of the compiler, said plainly).
    #[error("template `{0}` does not exist")]
    Missing(String),
    /// `spread` outside a command's argv.
    #[error(
        "`spread` makes one argument per item and works only as a whole argv item of a command or check"
    )]
    SpreadOutsideArgv,
    /// minijinja refused to render or compile it.
    #[error("{}", crate::diag::error_chain(.0))]
    Render(minijinja::Error),
    /// An expression that failed when evaluated.
    #[error("`{expr}`: {}", crate::diag::error_chain(error))]
    Eval {
        expr: String,
        error: minijinja::Error,
    },
}

/// Why a stage could not do its work: the stage fails and takes its `on_error`; nothing of
/// it is handed on as feedback.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// An item of a command's argv.
    #[error("argv item {index}")]
    Argv {
        index: usize,
        #[source]
        source: TemplateError,
    },
    /// A `spread` item of a command's argv.
    #[error("argv item {index}")]
    Spread {
        index: usize,
        #[source]
        source: SpreadError,
    },
    /// A `when` or an escalation rule that could not be evaluated.
    #[error("{what} could not be evaluated")]
    Condition {
        what: &'static str,
        #[source]
        source: TemplateError,
    },
    /// A route with no case for the output's value.
    #[error("its route on `{on}` has no case for `{value}` and no default")]
    NoRouteCase { on: String, value: String },
    /// A worktree that could not be made.
    #[error("cannot create the worktree for `{stage}`")]
    Worktree {
        stage: String,
        #[source]
        source: WorktreeError,
    },
    /// A worktree of a run on workers that could not be brought to what the run's
    /// repository holds of its branch.
    #[error("cannot restore the worktree for `{stage}` from the run's repository")]
    Publish {
        stage: String,
        #[source]
        source: super::publish::PublishError,
    },
}

/// Why a git worktree could not be made or removed.
#[derive(Debug, thiserror::Error)]
pub enum WorktreeError {
    /// A branch or base that git would read as an option.
    #[error(
        "the worktree's {what} `{value}` is not a valid git name (empty, or starting with `-`)"
    )]
    BadName { what: &'static str, value: String },
    /// A base that names no commit in the repository.
    #[error(
        "the worktree's base `{0}` names no commit in the repository (a branch, a tag or a \
         commit; a remote's branch as `origin/NAME`)"
    )]
    NoBase(String),
    /// git could not be started.
    #[error("cannot run git")]
    Spawn(#[source] std::io::Error),
    /// git ran past its time.
    #[error("git {command} took more than {secs}s and was stopped")]
    TimedOut { command: String, secs: u64 },
    /// git failed.
    #[error("git {command} failed: {stderr}")]
    Git { command: String, stderr: String },
    /// A file or directory of the worktree or its lock.
    #[error(transparent)]
    Io(#[from] IoFailure),
    /// The branch is checked out in another worktree, which may not be taken (see
    /// `worktree::Claim`): `why` says why not and what to do.
    #[error(
        "the branch `{branch}` is checked out in the worktree {}, which ralph-flow leaves \
         alone: {why}",
        path.display()
    )]
    Held {
        branch: String,
        path: PathBuf,
        why: String,
    },
    /// The lock that serializes worktree changes could not be taken.
    #[error("cannot lock {}", path.display())]
    Lock {
        path: PathBuf,
        #[source]
        source: Cause,
    },
}

/// Why a run could not start, or stopped before its end.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The state directory, a run directory, a file of the run.
    #[error(transparent)]
    Io(#[from] IoFailure),
    #[error("there is no run `{0}`; `ralph-flow runs` lists them")]
    NoSuchRun(String),
    #[error("run `{id}` has finished (exit {exit}); start a new one with `ralph-flow run`")]
    Finished { id: String, exit: String },
    /// A cancelled run cannot go on: `how` says by whom, when and why.
    #[error(
        "run `{id}` was cancelled {how}, so it cannot go on; start a new one with `ralph-flow run`"
    )]
    Cancelled { id: String, how: String },
    /// Agents that cannot run here: each `file:line:col: agent ...: why`.
    #[error(
        "{} agent{} of this workflow cannot run here, so nothing was started:\n  {}\nInstall or set what is named, give the agent a `fallbacks` entry that can run, or point it at another backend with `--set` or an override.",
        .0.len(),
        if .0.len() == 1 { "" } else { "s" },
        .0.join("\n  ")
    )]
    AgentsUnusable(Vec<String>),
    /// An agent's settings or backend.
    #[error("agent `{agent}`")]
    Agent {
        agent: String,
        #[source]
        source: Cause,
    },
    /// A stage that cannot be prepared (its output spec).
    #[error("stage `{stage}`")]
    Stage {
        stage: String,
        #[source]
        source: super::extract::OutputSpecError,
    },
    /// A resource whose capacity does not resolve.
    #[error("resource `{resource}`")]
    Resource {
        resource: String,
        #[source]
        source: ParamError,
    },
    /// A subflow's workflow that does not check (its diagnostics, rendered).
    #[error("its workflow {} is not valid:\n{diagnostics}", path.display())]
    InvalidSubflow { path: PathBuf, diagnostics: String },
    /// A subflow that cannot be prepared.
    #[error("subflow `{stage}`")]
    Subflow {
        stage: String,
        #[source]
        source: Box<RunError>,
    },
    /// The recording to replay or to write (the error names it).
    #[error(transparent)]
    Recording(Cause),
    /// The run's own worktree.
    #[error("cannot create the run's worktree")]
    RunWorktree(#[source] WorktreeError),
    /// A template of the run's own (its worktree's branch).
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// A commit failed, the state directory could not be written, or a limit of the machine
    /// was reached, while the run went on.
    #[error("{}", halted_text(.0))]
    Halted(#[source] Halt),
}

/// What stopped a run in the middle: the first failed commit or artifact write.
#[derive(Debug, thiserror::Error)]
pub enum Halt {
    #[error(transparent)]
    Store(StoreError),
    #[error("the state directory cannot be written")]
    Artifacts(#[source] std::sync::Arc<IoFailure>),
    /// An agent refused its configuration (an output schema its validator or service
    /// refuses) and no fallback agent could take over: no retry can fix it, so the run
    /// stops as a configuration error; `resume` continues once the workflow is fixed.
    #[error(
        "stage `{stage}`: agent `{agent}` {message}; fix the workflow, then `ralph-flow resume \
         RUN --allow-changed` continues the run"
    )]
    Refused {
        stage: String,
        agent: String,
        message: String,
    },
    /// A limit of the machine was reached (open files, disk space, file size): not a
    /// stage's failure, so none is recorded; the stage that met it runs again on `resume`,
    /// which continues the run once the limit is lifted.
    #[error(
        "{}{message}; {}, then `ralph-flow resume {run}` continues the run (this is the \
         machine's limit, not a failure of the stage)",
        stage.as_ref().map(|s| format!("stage `{s}`: ")).unwrap_or_default(),
        limit.advice()
    )]
    Limit {
        run: String,
        /// The stage that met it (its scope), when one did.
        stage: Option<String>,
        limit: crate::backend::process::Limit,
        /// What could not be done, with the system's error.
        message: String,
    },
    /// A run on workers could not publish a workspace (see `publish`).
    #[error("cannot publish the workspace {} to {url}", path.display())]
    Publish {
        path: PathBuf,
        url: String,
        #[source]
        source: super::publish::PublishError,
    },
}

/// What a halted run says first: which limit stopped it, or that it could not keep its work.
fn halted_text(halt: &Halt) -> String {
    match halt {
        Halt::Limit { limit, .. } => format!("the run stopped: {} was reached", limit.name()),
        _ => "the run could not keep its work, so it stopped (resume it once the cause is fixed)"
            .to_string(),
    }
}

impl From<minijinja::Error> for TemplateError {
    fn from(e: minijinja::Error) -> Self {
        TemplateError::Render(e)
    }
}

impl RunError {
    /// A file operation that failed.
    pub fn io(
        what: &'static str,
        path: impl AsRef<std::path::Path>,
        source: std::io::Error,
    ) -> Self {
        RunError::Io(IoFailure::new(what, path, source))
    }

    /// The whole message, causes included.
    pub fn message(&self) -> String {
        crate::diag::error_chain(self)
    }
}

impl StageError {
    /// The whole message, causes included: what a failed stage says.
    pub fn message(&self) -> String {
        crate::diag::error_chain(self)
    }

    /// The limit of the machine this error met, if it met one (see [`WorktreeError::limit`]):
    /// then the run stops as resumable instead of the stage failing.
    pub fn limit(&self) -> Option<crate::backend::process::Limit> {
        match self {
            StageError::Worktree { source, .. } => source.limit(),
            _ => None,
        }
    }
}

impl WorktreeError {
    /// The limit of the machine that git, or a file of the worktree, met: from the errno
    /// where there is one, else from git's own words, which quote the system's message
    /// (`fatal: ...: No space left on device`), or the death of its child by SIGXFSZ (a
    /// write beyond the file size limit: "error: reset died of signal 25").
    pub fn limit(&self) -> Option<crate::backend::process::Limit> {
        use crate::backend::process::Limit;
        match self {
            WorktreeError::Spawn(e) => Limit::of(e),
            WorktreeError::Io(f) => Limit::of(&f.source),
            WorktreeError::Git { stderr, .. } => Limit::in_message(stderr),
            _ => None,
        }
    }
}

#[cfg(test)]
mod limit_tests {
    use super::*;
    use crate::backend::process::Limit;

    #[test]
    fn git_failures_under_a_limit_of_the_machine_are_that_limit() {
        let git = |stderr: &str| WorktreeError::Git {
            command: "worktree add".into(),
            stderr: stderr.into(),
        };
        // As git says them: the system's message at the end of its own.
        for (stderr, limit) in [
            (
                "fatal: could not open '.git/worktrees/w/HEAD.lock': Too many open files",
                Limit::OpenFiles,
            ),
            (
                "fatal: unable to create '.git/index.lock': Too many open files in system",
                Limit::SystemFiles,
            ),
            (
                "error: unable to write sha1 file: No space left on device",
                Limit::DiskSpace,
            ),
            ("fatal: write error: Disk quota exceeded", Limit::DiskQuota),
        ] {
            assert_eq!(git(stderr).limit(), Some(limit), "{stderr}");
        }
        // git's words without the system's: not told.
        assert_eq!(git("error: unable to write file big.bin").limit(), None);
        assert_eq!(git("fatal: invalid reference: main").limit(), None);
        let spawn = WorktreeError::Spawn(std::io::Error::from_raw_os_error(24));
        assert_eq!(spawn.limit(), Some(Limit::OpenFiles));
        let stage = StageError::Worktree {
            stage: "s".into(),
            source: git("fatal: No space left on device"),
        };
        assert_eq!(stage.limit(), Some(Limit::DiskSpace));
    }
}
