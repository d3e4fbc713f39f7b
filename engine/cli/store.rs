//! `--state-dir` and `--store`: where runs are kept, as every command that reads or writes
//! runs takes it. One [`StoreArgs`], flattened into each of them; a command whose words
//! differ (`serve`, `worker`) says so with `mut_arg`.

use std::path::{Path, PathBuf};

use ralph_flow::store::{Location, StoreError};

/// The state directory's default name.
pub(super) const DEFAULT_STATE_DIR: &str = ".ralph-flow";

/// Where runs are kept.
#[derive(clap::Args, Clone, Debug)]
pub(super) struct StoreArgs {
    /// The state directory.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// A PostgreSQL store (`postgres://...`) instead of the state directory's SQLite file
    /// (also RALPH_FLOW_STORE).
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
}

impl StoreArgs {
    /// The store these name (`--store`, else RALPH_FLOW_STORE, else the state directory's
    /// SQLite file), its state directory as given.
    pub(super) fn location(&self) -> Result<Location, StoreError> {
        Location::new(self.store.as_deref(), &self.state_dir)
    }

    /// The state directory, under `cwd` when it is relative.
    pub(super) fn state_dir_in(&self, cwd: &Path) -> PathBuf {
        if self.state_dir.is_absolute() {
            self.state_dir.clone()
        } else {
            cwd.join(&self.state_dir)
        }
    }

    /// [`StoreArgs::location`], with the state directory under `cwd` when it is relative.
    pub(super) fn location_in(&self, cwd: &Path) -> Result<Location, StoreError> {
        Location::new(self.store.as_deref(), &self.state_dir_in(cwd))
    }
}
