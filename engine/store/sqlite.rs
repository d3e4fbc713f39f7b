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
