//! Opening a store: for writing (created if needed, configured for WAL and the chosen
//! [`Durability`], checked after a crash, migrated) or for reading only.

use std::fs;
use std::path::Path;

use rusqlite::Connection;

use super::integrity::{identity, marker_path, unclean_markers, wal_path};
use super::schema::{OLDEST_READABLE, SCHEMA_VERSION};
use super::{BUSY_TIMEOUT, SqliteStore, sql_error};
use crate::store::{Result, StoreError};

/// How a commit reaches the disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// `synchronous=NORMAL`: a commit survives a crash of the process; the last commits may
    /// be lost if the machine loses power.
    #[default]
    Normal,
    /// `synchronous=FULL`: every commit is on the disk before it returns.
    Full,
}

/// The page size of a new store, in bytes.
pub const PAGE_SIZE: i64 = 1024;

/// The page cache of a connection, in KiB (SQLite's `cache_size` with a minus sign). A
/// commit touches a few leaves of each table and the pages above them; stage names and loop
/// scopes do not sort in run order, so those leaves are spread over the tables and some of
/// them miss this cache (a chain of command stages reads about 2.4 pages a stage back from
/// the file, by strace). SQLite's default of 2 MiB filled up with the pages a resume's
/// single pass over the nodes read (2.45 MB of SQLite's heap in a resume of 10,000 settled
/// stages, by heaptrack, against 0.7 MB now), and cut those reads by little.
pub(super) const CACHE_KIB: i64 = 512;

impl SqliteStore {
    /// Opens (creating if needed) the store at `path` with [`Durability::Normal`].
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_with(path, Durability::Normal)
    }

    /// Opens (creating if needed, with its directory) the store at `path`, bringing its
    /// schema up to [`SCHEMA_VERSION`].
    ///
    /// A store that an earlier process did not close cleanly (it was killed) is checked
    /// first: a write-ahead log deleted since is reported ("the store lost its log") instead
    /// of showing runs as if they had never been, and `PRAGMA quick_check` must pass.
    pub fn open_with(path: &Path, durability: Durability) -> Result<Self> {
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        fs::create_dir_all(dir).map_err(|e| StoreError::io("create", dir, e))?;
        let unclean = unclean_markers(path);
        let conn = Connection::open(path).map_err(|e| sql_error(path, "cannot open", e))?;
        let mut store = SqliteStore {
            on_busy: None,
            conn,
            path: path.to_path_buf(),
            blobs: dir.join("blobs"),
            identity: None,
            marker: None,
            seqs: Default::default(),
            version: SCHEMA_VERSION,
            fence: None,
        };
        store.configure(durability)?;
        if !unclean.is_empty() {
            store.after_crash(&unclean)?;
        }
        store.migrate()?;
        for (m, _) in unclean {
            let _ = fs::remove_file(m);
        }
        let marker = marker_path(path, std::process::id());
        if let Ok(file) = fs::File::create(&marker) {
            store.marker = Some((marker, file));
        }
        store.identity = identity(path);
        Ok(store)
    }

    /// Opens an existing store for reading only: `status`, `runs` and `logs` work on a
    /// read-only state directory, and create or change nothing.
    pub fn open_read_only(path: &Path) -> Result<Self> {
        use rusqlite::OpenFlags;
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let immutable = || {
            let uri = format!("file:{}?immutable=1", path.display());
            Connection::open_with_flags(uri, flags | OpenFlags::SQLITE_OPEN_URI)
        };
        // Without a log no process has the store open for writing, and everything is in the
        // file itself: reading it as immutable creates no log or shared-memory file.
        let conn = if path.exists() && !wal_path(path).exists() {
            immutable()
        } else {
            Connection::open_with_flags(path, flags)
        }
        .map_err(|e| sql_error(path, "cannot open", e))?;
        let mut store = SqliteStore {
            on_busy: None,
            conn,
            path: path.to_path_buf(),
            blobs: path.parent().unwrap_or(Path::new(".")).join("blobs"),
            identity: identity(path),
            marker: None,
            seqs: Default::default(),
            version: SCHEMA_VERSION,
            fence: None,
        };
        store
            .conn
            .busy_timeout(BUSY_TIMEOUT)
            .map_err(|e| store.error("cannot configure", e))?;
        let unclean = unclean_markers(path);
        if !unclean.is_empty() {
            store.check_log(&unclean)?;
        }
        let version: i64 = store
            .conn
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .map_err(|e| store.error("cannot read", e))?;
        // A store one version behind is read as it is (what it lacks reads as "none"), so
        // that `status`, `runs` and `logs` still read a state directory they cannot write.
        if !(OLDEST_READABLE..=SCHEMA_VERSION).contains(&version) {
            return Err(StoreError::Version(format!(
                "{} has schema version {version} and this ralph-flow reads {SCHEMA_VERSION}; \
                 open it once with `ralph-flow run` or `resume` (which can write) to bring it \
                 up to date",
                path.display()
            )));
        }
        store.version = version;
        Ok(store)
    }

    fn configure(&self, durability: Durability) -> Result<()> {
        let fail = |e| self.error("cannot configure", e);
        self.conn.busy_timeout(BUSY_TIMEOUT).map_err(fail)?;
        self.conn.set_prepared_statement_cache_capacity(32);
        // A new store gets 1 KiB pages (an existing one keeps its own: the pragma does
        // nothing once the file has tables). A commit writes every page it touched to the log
        // whole, and a chain stage's commit touches four or five, each with one small row:
        // with 4 KiB pages that was 18 KiB written (and checksummed) a stage. 1 KiB pages made
        // a replayed chain stage 8% cheaper at NORMAL and 10% at FULL (BENCHMARKS.md); large
        // outputs go to files (`blobs/`), so rows stay small.
        self.conn
            .pragma_update(None, "page_size", PAGE_SIZE)
            .map_err(fail)?;
        self.conn
            .pragma_update(None, "cache_size", -CACHE_KIB)
            .map_err(fail)?;
        let mode: String = self
            .conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
            .map_err(fail)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Unsupported(format!(
                "{} cannot use write-ahead logging (journal mode is {mode}); \
                 put the state directory on a local file system",
                self.path.display()
            )));
        }
        let sync = match durability {
            Durability::Normal => "NORMAL",
            Durability::Full => "FULL",
        };
        self.conn
            .pragma_update(None, "synchronous", sync)
            .map_err(fail)?;
        self.conn
            .pragma_update(None, "foreign_keys", false)
            .map_err(fail)
    }
}
