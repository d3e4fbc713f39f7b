//! The default store: one SQLite file in WAL mode (being built).

use std::path::Path;

use super::{Result, StoreError};

/// A store in one SQLite file.
pub struct SqliteStore {
    _conn: rusqlite::Connection,
}

impl SqliteStore {
    /// Opens (creating if needed) the store at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let conn = rusqlite::Connection::open(path)
            .map_err(|e| StoreError(format!("cannot open {}: {e}", path.display())))?;
        Ok(SqliteStore { _conn: conn })
    }
}

/// How durable commits are (stub until the store lands).
#[derive(Clone, Copy, Debug)]
pub enum Durability {
    Normal,
    Full,
}

/// The store file in a state directory.
pub fn default_path(state_dir: &Path) -> std::path::PathBuf {
    state_dir.join("state.db")
}

impl SqliteStore {
    /// Opens with a durability.
    pub fn open_with(path: &Path, _d: Durability) -> Result<Self> {
        Self::open(path)
    }
}

fn stub<T>() -> Result<T> {
    Err(StoreError("the store is not built yet".into()))
}

impl super::Store for SqliteStore {
    fn create_run(&mut self, _: &super::RunRecord) -> Result<()> {
        stub()
    }
    fn run(&self, _: &str) -> Result<Option<super::RunRecord>> {
        stub()
    }
    fn runs(&self, _: usize) -> Result<Vec<super::RunRecord>> {
        stub()
    }
    fn set_status(&mut self, _: &str, _: super::RunStatus, _: Option<(&str, i64)>) -> Result<()> {
        stub()
    }
    fn commit(&mut self, _: &[super::Write]) -> Result<()> {
        stub()
    }
    fn nodes(&self, _: &str) -> Result<Vec<super::NodeRecord>> {
        stub()
    }
    fn attempts(&self, _: &str, _: Option<&str>) -> Result<Vec<super::AttemptRecord>> {
        stub()
    }
    fn events(&self, _: &str, _: Option<&str>) -> Result<Vec<super::Event>> {
        stub()
    }
    fn pending_gates(&self, _: &str) -> Result<Vec<super::GateRequest>> {
        stub()
    }
    fn approval(&self, _: &str, _: &str, _: &str) -> Result<Option<super::Approval>> {
        stub()
    }
    fn answer(&mut self, _: &super::Approval) -> Result<()> {
        stub()
    }
    fn lock(&mut self, _: &str, _: &super::LockOwner) -> Result<()> {
        stub()
    }
    fn unlock(&mut self, _: &str, _: u32) -> Result<()> {
        stub()
    }
    fn history(&self, _: &str, _: &str, _: usize) -> Result<Vec<(String, super::NodeRecord)>> {
        stub()
    }
}
