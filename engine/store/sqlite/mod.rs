//! The default store: one SQLite file in WAL mode.
//!
//! Every [`Store::commit`] is one `BEGIN IMMEDIATE` transaction, so a group of writes lands
//! whole or not at all. Outputs whose JSON text exceeds [`SPILL_BYTES`] are written to
//! `<db dir>/blobs/<sha256>.json` (synced and renamed into place before the commit that refers
//! to them) and read back transparently. Other processes (`ralph-flow approve` from another
//! terminal) write the same file; a busy file is waited on for up to five seconds.
//!
//! The schema is versioned with `PRAGMA user_version`; [`SCHEMA_VERSION`] is the version this
//! build writes, and opening a store brings an older file up to it.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};
use sha2::{Digest, Sha256};

use super::Usage;
use super::{
    Approval, AttemptRecord, AttemptState, Event, GateRequest, LockOwner, NodeRecord, NodeState,
    Result, RunRecord, RunStatus, Store, StoreError, Write, now_ms, rfc3339,
};

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = 2;

/// Outputs whose JSON text is longer than this many bytes are kept in a file beside the store.
pub const SPILL_BYTES: usize = 64 * 1024;

/// How long a write waits for another process that holds the file.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one try of a commit waits for a lock before it reports busy; a commit then
/// tries again, up to [`BUSY_WAIT`], saying so.
const COMMIT_BUSY_TIMEOUT: Duration = Duration::from_millis(250);

/// How long a commit waits, in all, for another process that holds the file
/// (`RALPH_FLOW_STORE_BUSY_WAIT`, in seconds, changes it).
pub const BUSY_WAIT: Duration = Duration::from_secs(120);

/// The busy wait in force: [`BUSY_WAIT`], or `RALPH_FLOW_STORE_BUSY_WAIT` seconds.
fn busy_wait() -> Duration {
    std::env::var("RALPH_FLOW_STORE_BUSY_WAIT")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .unwrap_or(BUSY_WAIT)
}

/// The error of a store whose write-ahead log was deleted after a crash.
fn lost_log(path: &Path) -> StoreError {
    let wal = wal_path(path);
    StoreError::State(format!(
        "{} lost its write-ahead log: a process that had it open was killed, and {} was \
         deleted since, so the commits it held are gone. Keep the file as it is and restore {} \
         from a backup if you have one; to start over, move the state directory aside",
        path.display(),
        wal.display(),
        wal.display()
    ))
}

/// A file's device and inode.
fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The write-ahead log of a store file.
fn wal_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

/// The marker a process keeps while it has a store open for writing (`.open-PID-N`: a
/// process may hold several connections).
fn marker_path(path: &Path, pid: u32) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut name = path.as_os_str().to_owned();
    name.push(format!(
        ".open-{pid}-{}",
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    PathBuf::from(name)
}

/// The markers of processes that had the store open and are gone without closing it, with
/// the last event each committed (run, number).
fn unclean_markers(path: &Path) -> Vec<(PathBuf, Option<(String, i64)>)> {
    let Some(dir) = path.parent() else {
        return Vec::new();
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let prefix = format!(
        "{}.open-",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    );
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(std::io::Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid: i32 = name
                .strip_prefix(&prefix)?
                .split('-')
                .next()?
                .parse()
                .ok()?;
            // A process that is still there has it open; one that is gone was killed.
            let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
            let last = fs::read_to_string(e.path()).ok().and_then(|t| {
                let (run, seq) = t.trim().rsplit_once(' ')?;
                Some((run.to_owned(), seq.parse().ok()?))
            });
            (!alive).then(|| (e.path(), last))
        })
        .collect()
}

/// Tells whether SQLite said the file is locked by another connection.
fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e,
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(f.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

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

impl Drop for SqliteStore {
    fn drop(&mut self) {
        if let Some((m, _)) = &self.marker {
            let _ = fs::remove_file(m);
        }
    }
}

/// What is told when a commit waits for another process.
type BusyReport = Box<dyn Fn(&str) + Send>;

/// A store in one SQLite file.
pub struct SqliteStore {
    conn: Connection,
    path: PathBuf,
    blobs: PathBuf,
    /// Told when a commit waits for another process.
    on_busy: Option<BusyReport>,
    /// The file's identity (device, inode) when it was opened: a commit refuses a store
    /// that was deleted or replaced since.
    identity: Option<(u64, u64)>,
    /// This process's open-marker (`state.db.open-PID-N`, holding the highest event row it
    /// committed), removed when the store is closed cleanly; `None` for a read-only store.
    marker: Option<(PathBuf, fs::File)>,
}

/// Returns the store file in a state directory (`STATE_DIR/state.db`).
pub fn default_path(state_dir: &Path) -> PathBuf {
    state_dir.join("state.db")
}

/// Opens (creating if needed) the store of a state directory.
pub fn open_default(state_dir: &Path) -> Result<SqliteStore> {
    SqliteStore::open(&default_path(state_dir))
}

const SCHEMA_V1: &str = "
CREATE TABLE runs (
    id            TEXT PRIMARY KEY,
    workflow      TEXT NOT NULL,
    file          TEXT NOT NULL,
    workflow_hash TEXT NOT NULL,
    params        TEXT NOT NULL,
    status        TEXT NOT NULL,
    exit_name     TEXT,
    exit_code     INTEGER,
    started_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    dir           TEXT NOT NULL
);
CREATE INDEX runs_started ON runs (started_at);
CREATE INDEX runs_workflow ON runs (workflow, started_at);

-- Write order is the rowid: INSERT OR REPLACE gives a re-settled node a new one.
CREATE TABLE nodes (
    run           TEXT NOT NULL,
    scope         TEXT NOT NULL,
    node          TEXT NOT NULL,
    state         TEXT NOT NULL,
    output        TEXT,             -- JSON text, or NULL when spilled
    output_blob   TEXT,             -- SHA-256 of the spilled JSON text
    action        TEXT,
    feedback      TEXT,
    attempts      INTEGER NOT NULL,
    input_tokens  INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    cost_usd      REAL,
    started_at    INTEGER NOT NULL,
    finished_at   INTEGER NOT NULL,
    PRIMARY KEY (run, scope, node)
);

-- An attempt is written when it starts and updated in place when it ends. Without a rowid
-- the table is one B-tree (no separate key index): one page less per commit.
CREATE TABLE attempts (
    run           TEXT NOT NULL,
    scope         TEXT NOT NULL,
    node          TEXT NOT NULL,
    attempt       INTEGER NOT NULL,
    state         TEXT NOT NULL,
    agent         TEXT,
    dir           TEXT NOT NULL,
    error         TEXT,
    input_tokens  INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    cost_usd      REAL,
    started_at    INTEGER NOT NULL,
    finished_at   INTEGER,
    PRIMARY KEY (run, scope, node, attempt)
) WITHOUT ROWID;

-- Events are numbered within their run (`seq`, the order of events), keyed by (run, seq)
-- without a rowid: one B-tree, and a run's events are next to each other.
CREATE TABLE events (
    run     TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    at      INTEGER NOT NULL,
    scope   TEXT NOT NULL,
    node    TEXT NOT NULL,
    kind    TEXT NOT NULL,
    message TEXT NOT NULL,
    PRIMARY KEY (run, seq)
) WITHOUT ROWID;

-- Gates waiting for an answer; answering removes the row.
CREATE TABLE gates (
    run          TEXT NOT NULL,
    scope        TEXT NOT NULL,
    gate         TEXT NOT NULL,
    message      TEXT NOT NULL,
    show         TEXT NOT NULL,     -- JSON array of paths
    requested_at INTEGER NOT NULL,
    deadline     INTEGER,
    PRIMARY KEY (run, scope, gate)
);

CREATE TABLE approvals (
    run      TEXT NOT NULL,
    scope    TEXT NOT NULL,
    gate     TEXT NOT NULL,
    approved INTEGER NOT NULL,
    comment  TEXT,
    by       TEXT NOT NULL,
    at       INTEGER NOT NULL,
    PRIMARY KEY (run, scope, gate)
);

CREATE TABLE locks (
    run   TEXT PRIMARY KEY,
    pid   INTEGER NOT NULL,
    host  TEXT NOT NULL,
    since INTEGER NOT NULL
);
";

const RUN_COLUMNS: &str = "id, workflow, file, workflow_hash, params, status, exit_name, \
                           exit_code, started_at, updated_at, dir, options";
/// The columns of `nodes n`, aliased so that joins can use them.
const NODE_COLUMNS: &str = "n.run, n.scope, n.node, n.state, n.output, n.output_blob, \
                            n.action, n.feedback, n.attempts, n.input_tokens, n.output_tokens, \
                            n.cached_tokens, n.cost_usd, n.started_at, n.finished_at";
const ATTEMPT_COLUMNS: &str = "run, scope, node, attempt, state, agent, dir, error, \
                               input_tokens, output_tokens, cached_tokens, cost_usd, \
                               started_at, finished_at";
const EVENT_COLUMNS: &str = "run, at, scope, node, kind, message";
const GATE_COLUMNS: &str = "run, scope, gate, message, show, requested_at, deadline";
const APPROVAL_COLUMNS: &str = "run, scope, gate, approved, comment, by, at";

const INSERT_NODE: &str = "INSERT OR REPLACE INTO nodes (run, scope, node, state, output, \
     output_blob, action, feedback, attempts, input_tokens, output_tokens, cached_tokens, \
     cost_usd, started_at, finished_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)";
const UPSERT_ATTEMPT: &str = "INSERT INTO attempts (run, scope, node, attempt, state, agent, \
     dir, error, input_tokens, output_tokens, cached_tokens, cost_usd, started_at, finished_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14) \
     ON CONFLICT (run, scope, node, attempt) DO UPDATE SET state = excluded.state, \
     agent = excluded.agent, dir = excluded.dir, error = excluded.error, \
     input_tokens = excluded.input_tokens, output_tokens = excluded.output_tokens, \
     cached_tokens = excluded.cached_tokens, cost_usd = excluded.cost_usd, \
     started_at = excluded.started_at, finished_at = excluded.finished_at";
const INSERT_EVENT: &str = "INSERT INTO events (run, seq, at, scope, node, kind, message) \
     VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE run = ?1), \
     ?2, ?3, ?4, ?5, ?6)";
const INSERT_GATE: &str = "INSERT OR REPLACE INTO gates (run, scope, gate, message, show, \
     requested_at, deadline) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";
const INSERT_APPROVAL: &str = "INSERT OR REPLACE INTO approvals (run, scope, gate, approved, \
     comment, by, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";
const DELETE_GATE: &str = "DELETE FROM gates WHERE run = ?1 AND scope = ?2 AND gate = ?3";

/// A node's output as stored: serialized once, inline or as the hash of a spilled file.
#[derive(Default)]
struct Output {
    inline: Option<String>,
    blob: Option<String>,
}

impl SqliteStore {
    /// Sets what is told when a commit has to wait for another process.
    pub fn on_busy(&mut self, report: impl Fn(&str) + Send + 'static) {
        self.on_busy = Some(Box::new(report));
    }

    /// Commits, trying again while another process holds the file, up to the busy wait.
    fn commit_retrying(
        &mut self,
        writes: &[Write],
        outputs: &[Output],
        shows: &[Option<String>],
    ) -> Result<()> {
        let started = std::time::Instant::now();
        let limit = busy_wait();
        let mut pause = Duration::from_millis(50);
        let mut reported: Option<Duration> = None;
        loop {
            match write_all(&mut self.conn, writes, outputs, shows) {
                Ok(()) => {
                    if let Some(run) = writes.iter().rev().find_map(|w| match w {
                        Write::Event(e) => Some(e.run.as_str()),
                        _ => None,
                    }) {
                        self.note_commit(run);
                    }
                    return Ok(());
                }
                Err(e) if is_busy(&e) && started.elapsed() < limit => {
                    let waited = started.elapsed();
                    // Said at once, then every five seconds or so.
                    let due =
                        reported.is_none_or(|at: Duration| waited >= at + Duration::from_secs(5));
                    if let (Some(report), true) = (&self.on_busy, due) {
                        reported = Some(waited);
                        report(&format!(
                            "{} is locked by another process; waited {}s, trying again",
                            self.path.display(),
                            waited.as_secs()
                        ));
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    let busy = is_busy(&e);
                    let error = sql_error(&self.path, "cannot commit to", e);
                    return Err(if busy {
                        StoreError::State(format!(
                            "cannot commit to {}: another process kept it locked for more than {}s; find it (`fuser {}`), then resume the run",
                            self.path.display(),
                            limit.as_secs_f64(),
                            self.path.display()
                        ))
                    } else {
                        error
                    });
                }
            }
        }
    }

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
        fs::create_dir_all(dir).map_err(|e| StoreError::io("cannot create", dir, e))?;
        let unclean = unclean_markers(path);
        let conn = Connection::open(path).map_err(|e| sql_error(path, "cannot open", e))?;
        let mut store = SqliteStore {
            on_busy: None,
            conn,
            path: path.to_path_buf(),
            blobs: dir.join("blobs"),
            identity: None,
            marker: None,
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
        let store = SqliteStore {
            on_busy: None,
            conn,
            path: path.to_path_buf(),
            blobs: path.parent().unwrap_or(Path::new(".")).join("blobs"),
            identity: identity(path),
            marker: None,
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
        if version != SCHEMA_VERSION {
            return Err(StoreError::State(format!(
                "{} has schema version {version} and this ralph-flow reads {SCHEMA_VERSION}; \
                 open it once with `ralph-flow run` or `resume` (which can write) to bring it \
                 up to date",
                path.display()
            )));
        }
        Ok(store)
    }

    /// The checks on a store that a killed process had open: its commits must all be
    /// there (a write-ahead log deleted after the crash loses them), and
    /// `PRAGMA quick_check` must pass.
    fn after_crash(&self, markers: &[(PathBuf, Option<(String, i64)>)]) -> Result<()> {
        self.check_log(markers)?;
        self.quick_check()
    }

    /// Each open-marker holds the last event its process committed; a store that lacks one
    /// of them lost its write-ahead log.
    fn check_log(&self, markers: &[(PathBuf, Option<(String, i64)>)]) -> Result<()> {
        let committed: Vec<&(String, i64)> =
            markers.iter().filter_map(|(_, c)| c.as_ref()).collect();
        if committed.is_empty() {
            return Ok(());
        }
        let version: i64 = self
            .conn
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .unwrap_or(-1);
        if version == 0 {
            // Commits were made, yet the file has not even its schema: all of it was in the
            // log.
            return Err(lost_log(&self.path));
        }
        for (run, seq) in committed {
            let present = self
                .conn
                .query_row(
                    "SELECT EXISTS (SELECT 1 FROM events WHERE run = ?1 AND seq >= ?2)",
                    params![run, seq],
                    |row| row.get::<_, bool>(0),
                )
                // A store too damaged to answer is reported by the quick check.
                .unwrap_or(true);
            if !present {
                return Err(lost_log(&self.path));
            }
        }
        Ok(())
    }

    /// Records, in this process's open-marker, the last event it committed: the run and the
    /// event's number in it.
    fn note_commit(&mut self, run: &str) {
        use std::os::unix::fs::FileExt;
        let Some((_, file)) = &self.marker else {
            return;
        };
        let Ok(seq) = self
            .conn
            .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM events WHERE run = ?1")
            .and_then(|mut stmt| stmt.query_row([run], |row| row.get::<_, i64>(0)))
        else {
            return;
        };
        // Fixed width, so that a shorter record overwrites a longer one whole.
        let _ = file.write_at(format!("{:<120}\n", format!("{run} {seq}")).as_bytes(), 0);
    }

    /// Fails when the store's file was deleted or replaced since it was opened (a
    /// `rm -rf .ralph-flow` in the middle of a run): nothing would be saved.
    fn check_file(&self) -> Result<()> {
        match (self.identity, identity(&self.path)) {
            (Some(was), Some(is)) if was == is => Ok(()),
            (None, _) => Ok(()),
            (Some(_), now) => Err(StoreError::State(format!(
                "{} was {} while the run was going on, so nothing more can be saved; the run's \
                 state is lost",
                self.path.display(),
                if now.is_none() { "deleted" } else { "replaced" }
            ))),
        }
    }

    /// `PRAGMA quick_check`: fails on a damaged store, before anything is written to it.
    fn quick_check(&self) -> Result<()> {
        let problems: Vec<String> = self
            .conn
            .prepare("PRAGMA quick_check")
            .and_then(|mut stmt| stmt.query_map([], |row| row.get(0))?.collect())
            .map_err(|e| self.error("cannot check", e))?;
        if problems.len() == 1 && problems[0] == "ok" {
            return Ok(());
        }
        Err(StoreError::State(format!(
            "{} is damaged ({}); nothing was written to it. Move it aside and recover what \
             can be recovered with `sqlite3 {} .recover`",
            self.path.display(),
            problems.join("; "),
            self.path.display()
        )))
    }

    fn configure(&self, durability: Durability) -> Result<()> {
        let fail = |e| self.error("cannot configure", e);
        self.conn.busy_timeout(BUSY_TIMEOUT).map_err(fail)?;
        self.conn.set_prepared_statement_cache_capacity(32);
        let mode: String = self
            .conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
            .map_err(fail)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::State(format!(
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

    /// Brings the schema up to [`SCHEMA_VERSION`], one version at a time, in one transaction
    /// (so two processes opening a new file at once do not both create it).
    fn migrate(&mut self) -> Result<()> {
        let path = self.path.clone();
        let fail = |e| sql_error(&path, "cannot set up the schema of", e);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(fail)?;
        let version: i64 = tx
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .map_err(fail)?;
        if version > SCHEMA_VERSION {
            return Err(StoreError::State(format!(
                "{} was written by a newer ralph-flow (schema version {version}, this one \
                 knows {SCHEMA_VERSION}); upgrade ralph-flow or use another --state-dir",
                path.display()
            )));
        }
        if version == SCHEMA_VERSION {
            return Ok(());
        }
        if version < 1 {
            tx.execute_batch(SCHEMA_V1).map_err(fail)?;
        }
        if version < 2 {
            // The run's own settings that resume must keep (`--replay`, `--record`).
            tx.execute_batch("ALTER TABLE runs ADD COLUMN options TEXT NOT NULL DEFAULT '{}';")
                .map_err(fail)?;
        }
        // A later version adds `if version < 3 { ... }` here.
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(fail)?;
        tx.commit().map_err(fail)
    }

    fn error(&self, what: &str, e: rusqlite::Error) -> StoreError {
        sql_error(&self.path, what, e)
    }

    /// Serializes an output, spilling it to a blob file when it is large. Returns the output
    /// and whether a new file was written.
    fn prepare_output(&self, output: &serde_json::Value) -> Result<(Output, bool)> {
        let text = serde_json::to_string(output)
            .map_err(|e| StoreError::json("cannot serialize an output", e))?;
        if text.len() <= SPILL_BYTES {
            return Ok((
                Output {
                    inline: Some(text),
                    blob: None,
                },
                false,
            ));
        }
        let hash = format!("{:x}", Sha256::digest(text.as_bytes()));
        let path = self.blob_path(&hash);
        let spilled = Output {
            inline: None,
            blob: Some(hash.clone()),
        };
        if path.exists() {
            return Ok((spilled, false));
        }
        let io = |e: std::io::Error| StoreError::io("cannot write", &path, e);
        fs::create_dir_all(&self.blobs).map_err(io)?;
        let tmp = self
            .blobs
            .join(format!(".{hash}.{}.tmp", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut file = fs::File::create(&tmp)?;
            file.write_all(text.as_bytes())?;
            file.sync_all()?;
            fs::rename(&tmp, &path)
        };
        if let Err(e) = write() {
            let _ = fs::remove_file(&tmp);
            return Err(io(e));
        }
        Ok((spilled, true))
    }

    fn blob_path(&self, hash: &str) -> PathBuf {
        self.blobs.join(format!("{hash}.json"))
    }

    fn load_output(
        &self,
        inline: Option<String>,
        blob: Option<String>,
    ) -> Result<serde_json::Value> {
        let text = match (inline, blob) {
            (_, Some(hash)) => {
                let path = self.blob_path(&hash);
                fs::read_to_string(&path)
                    .map_err(|e| StoreError::io("cannot read the output stored in", &path, e))?
            }
            (Some(text), None) => text,
            (None, None) => return Ok(serde_json::Value::Null),
        };
        serde_json::from_str(&text)
            .map_err(|e| StoreError::json("a stored output is not valid JSON", e))
    }

    fn node_from_row(
        &self,
        row: &Row<'_>,
    ) -> rusqlite::Result<(NodeRecord, Option<String>, Option<String>)> {
        let record = NodeRecord {
            run: row.get(0)?,
            scope: row.get(1)?,
            node: row.get(2)?,
            state: parse_col(row, 3, NodeState::parse)?,
            output: serde_json::Value::Null,
            action: row.get(6)?,
            feedback: row.get(7)?,
            attempts: row.get(8)?,
            usage: usage_from_row(row, 9)?,
            started_at: row.get(13)?,
            finished_at: row.get(14)?,
        };
        Ok((record, row.get(4)?, row.get(5)?))
    }

    fn query_nodes(&self, sql: &str, params: impl rusqlite::Params) -> Result<Vec<NodeRecord>> {
        let fail = |e| self.error("cannot read nodes from", e);
        let mut stmt = self.conn.prepare_cached(sql).map_err(fail)?;
        let rows = stmt
            .query_map(params, |row| self.node_from_row(row))
            .map_err(fail)?;
        let mut out = Vec::new();
        for row in rows {
            let (mut record, inline, blob) = row.map_err(fail)?;
            record.output = self.load_output(inline, blob)?;
            out.push(record);
        }
        Ok(out)
    }

    /// Returns the gates of a run named `gate` that wait for an answer, in any scope.
    pub fn find_pending(&self, run: &str, gate: &str) -> Result<Vec<GateRequest>> {
        Ok(self
            .pending_gates(run)?
            .into_iter()
            .filter(|g| g.gate == gate)
            .collect())
    }

    /// Returns who holds a run's lock, if anyone does.
    pub fn lock_holder(&self, run: &str) -> Result<Option<LockOwner>> {
        self.conn
            .prepare_cached("SELECT pid, host, since FROM locks WHERE run = ?1")
            .and_then(|mut stmt| stmt.query_row([run], lock_from_row).optional())
            .map_err(|e| self.error("cannot read locks from", e))
    }
}

impl Store for SqliteStore {
    fn create_run(&mut self, run: &RunRecord) -> Result<()> {
        let params_text = json_text(&run.params)?;
        let options_text = json_text(&run.options)?;
        let (exit_name, exit_code) = run.exit.clone().unzip();
        let sql = format!(
            "INSERT INTO runs ({RUN_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
        );
        let result = self.conn.prepare_cached(&sql).and_then(|mut stmt| {
            stmt.execute(params![
                run.id,
                run.workflow,
                run.file,
                run.workflow_hash,
                params_text,
                run.status.as_str(),
                exit_name,
                exit_code,
                run.started_at,
                run.updated_at,
                run.dir,
                options_text,
            ])
        });
        match result {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                Err(StoreError::Refused(format!(
                    "run {} already exists",
                    run.id
                )))
            }
            other => other
                .map(drop)
                .map_err(|e| self.error("cannot create a run in", e)),
        }
    }

    fn run(&self, id: &str) -> Result<Option<RunRecord>> {
        let sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1");
        self.conn
            .prepare_cached(&sql)
            .and_then(|mut stmt| stmt.query_row([id], run_from_row).optional())
            .map_err(|e| self.error("cannot read runs from", e))
    }

    fn runs(&self, limit: usize) -> Result<Vec<RunRecord>> {
        let sql =
            format!("SELECT {RUN_COLUMNS} FROM runs ORDER BY started_at DESC, rowid DESC LIMIT ?1");
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.conn
            .prepare_cached(&sql)
            .and_then(|mut stmt| stmt.query_map([limit], run_from_row)?.collect())
            .map_err(|e| self.error("cannot read runs from", e))
    }

    fn set_status(&mut self, id: &str, status: RunStatus, exit: Option<(&str, i64)>) -> Result<()> {
        let (exit_name, exit_code) = exit.unzip();
        let changed = self
            .conn
            .prepare_cached(
                "UPDATE runs SET status = ?2, exit_name = ?3, exit_code = ?4, updated_at = ?5 \
                 WHERE id = ?1",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![id, status.as_str(), exit_name, exit_code, now_ms()])
            })
            .map_err(|e| self.error("cannot update a run in", e))?;
        if changed == 0 {
            return Err(StoreError::Refused(format!(
                "no run {id} in {}",
                self.path.display()
            )));
        }
        Ok(())
    }

    fn commit(&mut self, writes: &[Write]) -> Result<()> {
        self.check_file()?;
        // Serialize and spill first, so the write lock is held only for the inserts.
        let mut outputs = Vec::with_capacity(writes.len());
        let mut spilled = false;
        for write in writes {
            outputs.push(match write {
                Write::Node(node) => {
                    let (output, new_file) = self.prepare_output(&node.output)?;
                    spilled |= new_file;
                    output
                }
                _ => Output::default(),
            });
        }
        if spilled {
            // The renames must be on the disk before the rows that refer to them.
            fs::File::open(&self.blobs)
                .and_then(|dir| dir.sync_all())
                .map_err(|e| StoreError::io("cannot sync", &self.blobs, e))?;
        }
        let shows: Vec<Option<String>> = writes
            .iter()
            .map(|w| match w {
                Write::Gate(g) => json_text(&g.show).map(Some),
                _ => Ok(None),
            })
            .collect::<Result<_>>()?;
        // Another process (an `approve`, a second reader) may hold the write lock: wait for
        // it with growing pauses, saying so, up to BUSY_WAIT in all.
        let _ = self.conn.busy_timeout(COMMIT_BUSY_TIMEOUT);
        let result = self.commit_retrying(writes, &outputs, &shows);
        let _ = self.conn.busy_timeout(BUSY_TIMEOUT);
        result
    }

    fn nodes(&self, run: &str) -> Result<Vec<NodeRecord>> {
        let sql = format!("SELECT {NODE_COLUMNS} FROM nodes n WHERE n.run = ?1 ORDER BY n.rowid");
        self.query_nodes(&sql, [run])
    }

    fn attempts(&self, run: &str, node: Option<&str>) -> Result<Vec<AttemptRecord>> {
        let sql = format!(
            "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE run = ?1 AND (?2 IS NULL OR node = ?2) \
             ORDER BY started_at, scope, node, attempt"
        );
        self.conn
            .prepare_cached(&sql)
            .and_then(|mut stmt| {
                stmt.query_map(params![run, node], attempt_from_row)?
                    .collect()
            })
            .map_err(|e| self.error("cannot read attempts from", e))
    }

    fn events(&self, run: &str, node: Option<&str>) -> Result<Vec<Event>> {
        let sql = format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE run = ?1 AND (?2 IS NULL OR node = ?2) \
             ORDER BY seq"
        );
        self.conn
            .prepare_cached(&sql)
            .and_then(|mut stmt| {
                stmt.query_map(params![run, node], event_from_row)?
                    .collect()
            })
            .map_err(|e| self.error("cannot read events from", e))
    }

    fn pending_gates(&self, run: &str) -> Result<Vec<GateRequest>> {
        pending(&self.conn, run).map_err(|e| self.error("cannot read gates from", e))
    }

    fn approval(&self, run: &str, scope: &str, gate: &str) -> Result<Option<Approval>> {
        let sql = format!(
            "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE run = ?1 AND scope = ?2 AND gate = ?3"
        );
        self.conn
            .prepare_cached(&sql)
            .and_then(|mut stmt| {
                stmt.query_row([run, scope, gate], approval_from_row)
                    .optional()
            })
            .map_err(|e| self.error("cannot read approvals from", e))
    }

    fn answer(&mut self, approval: &Approval) -> Result<()> {
        let path = self.path.clone();
        let fail = |e| sql_error(&path, "cannot answer a gate in", e);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(fail)?;
        let waiting = pending(&tx, &approval.run).map_err(fail)?;
        let named: Vec<&GateRequest> = waiting.iter().filter(|g| g.gate == approval.gate).collect();
        let target = if approval.scope.is_empty() {
            match named.as_slice() {
                [one] => Some(*one),
                [] => None,
                several => {
                    let scopes: Vec<String> =
                        several.iter().map(|g| describe_scope(&g.scope)).collect();
                    return Err(StoreError::Refused(format!(
                        "gate {} of run {} waits in {} scopes ({}); say which one",
                        approval.gate,
                        approval.run,
                        several.len(),
                        scopes.join(", ")
                    )));
                }
            }
        } else {
            named.iter().copied().find(|g| g.scope == approval.scope)
        };
        let Some(target) = target else {
            let exists: bool = tx
                .query_row("SELECT 1 FROM runs WHERE id = ?1", [&approval.run], |_| {
                    Ok(())
                })
                .optional()
                .map_err(fail)?
                .is_some();
            let at = if approval.scope.is_empty() {
                String::new()
            } else {
                format!(" in scope {}", approval.scope)
            };
            return Err(StoreError::State(if !exists {
                format!("no run {}", approval.run)
            } else if waiting.is_empty() {
                format!(
                    "gate {}{at} of run {} is not waiting for an answer; the run waits on no gate",
                    approval.gate, approval.run
                )
            } else {
                let list: Vec<String> = waiting
                    .iter()
                    .map(|g| format!("{} ({})", g.gate, describe_scope(&g.scope)))
                    .collect();
                format!(
                    "gate {}{at} of run {} is not waiting for an answer; waiting: {}",
                    approval.gate,
                    approval.run,
                    list.join(", ")
                )
            }));
        };
        let answer = Approval {
            scope: target.scope.clone(),
            ..approval.clone()
        };
        insert_approval(&tx, &answer).map_err(fail)?;
        tx.commit().map_err(fail)
    }

    fn lock(&mut self, run: &str, owner: &LockOwner) -> Result<()> {
        let path = self.path.clone();
        let fail = |e| sql_error(&path, "cannot lock a run in", e);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(fail)?;
        let holder = tx
            .prepare_cached("SELECT pid, host, since FROM locks WHERE run = ?1")
            .and_then(|mut stmt| stmt.query_row([run], lock_from_row).optional())
            .map_err(fail)?;
        if let Some(holder) = holder {
            let same_host = holder.host == owner.host;
            if same_host && holder.pid == owner.pid {
                return Ok(());
            }
            if !same_host || process_alive(holder.pid) {
                return Err(StoreError::Refused(format!(
                    "run {run} is held by pid {} on {} since {}; wait for it to end or stop it",
                    holder.pid,
                    holder.host,
                    rfc3339(holder.since)
                )));
            }
        }
        tx.prepare_cached(
            "INSERT OR REPLACE INTO locks (run, pid, host, since) VALUES (?1, ?2, ?3, ?4)",
        )
        .and_then(|mut stmt| stmt.execute(params![run, owner.pid, owner.host, owner.since]))
        .map_err(fail)?;
        tx.commit().map_err(fail)
    }

    fn unlock(&mut self, run: &str, pid: u32) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM locks WHERE run = ?1 AND pid = ?2")
            .and_then(|mut stmt| stmt.execute(params![run, pid]))
            .map(drop)
            .map_err(|e| self.error("cannot unlock a run in", e))
    }

    fn history(
        &self,
        workflow: &str,
        node: &str,
        except_run: &str,
        limit: usize,
    ) -> Result<Vec<(String, NodeRecord)>> {
        let sql = format!(
            "SELECT {NODE_COLUMNS} FROM nodes n JOIN runs r ON n.run = r.id \
             WHERE r.workflow = ?1 AND n.node = ?2 AND r.id != ?3 \
             ORDER BY r.started_at DESC, r.rowid DESC, n.rowid DESC LIMIT ?4"
        );
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let records = self.query_nodes(&sql, params![workflow, node, except_run, limit])?;
        Ok(records.into_iter().map(|n| (n.run.clone(), n)).collect())
    }
}

/// Inserts an answer and removes the gate it answers.
/// Writes everything in one transaction (raw errors, for the retry of a busy file).
fn write_all(
    conn: &mut Connection,
    writes: &[Write],
    outputs: &[Output],
    shows: &[Option<String>],
) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    for ((write, output), show) in writes.iter().zip(outputs).zip(shows) {
        match write {
            Write::Node(n) => {
                let Output { inline, blob } = output;
                let (inline, blob) = (inline.as_deref(), blob.as_deref());
                let u = UsageCols::from(&n.usage);
                tx.prepare_cached(INSERT_NODE).and_then(|mut stmt| {
                    stmt.execute(params![
                        n.run,
                        n.scope,
                        n.node,
                        n.state.as_str(),
                        inline,
                        blob,
                        n.action,
                        n.feedback,
                        n.attempts,
                        u.input,
                        u.output,
                        u.cached,
                        u.cost,
                        n.started_at,
                        n.finished_at,
                    ])
                })?;
            }
            Write::Attempt(a) => {
                let u = UsageCols::from(&a.usage);
                tx.prepare_cached(UPSERT_ATTEMPT).and_then(|mut stmt| {
                    stmt.execute(params![
                        a.run,
                        a.scope,
                        a.node,
                        a.attempt,
                        a.state.as_str(),
                        a.agent,
                        a.dir,
                        a.error,
                        u.input,
                        u.output,
                        u.cached,
                        u.cost,
                        a.started_at,
                        a.finished_at,
                    ])
                })?;
            }
            Write::Event(e) => {
                tx.prepare_cached(INSERT_EVENT).and_then(|mut stmt| {
                    stmt.execute(params![e.run, e.at, e.scope, e.node, e.kind, e.message])
                })?;
            }
            Write::Gate(g) => {
                tx.prepare_cached(INSERT_GATE).and_then(|mut stmt| {
                    stmt.execute(params![
                        g.run,
                        g.scope,
                        g.gate,
                        g.message,
                        show,
                        g.requested_at,
                        g.deadline,
                    ])
                })?;
            }
            Write::Approval(a) => {
                // An answer (a person's, or the timeout's) ends the wait.
                insert_approval(&tx, a)?;
            }
        }
    }
    tx.commit()
}

fn insert_approval(conn: &Connection, a: &Approval) -> rusqlite::Result<()> {
    conn.prepare_cached(INSERT_APPROVAL)?.execute(params![
        a.run, a.scope, a.gate, a.approved, a.comment, a.by, a.at
    ])?;
    conn.prepare_cached(DELETE_GATE)?
        .execute(params![a.run, a.scope, a.gate])?;
    Ok(())
}

fn pending(conn: &Connection, run: &str) -> rusqlite::Result<Vec<GateRequest>> {
    let sql = format!("SELECT {GATE_COLUMNS} FROM gates WHERE run = ?1 ORDER BY rowid");
    conn.prepare_cached(&sql)?
        .query_map([run], gate_from_row)?
        .collect()
}

fn describe_scope(scope: &str) -> String {
    if scope.is_empty() {
        String::from("top level")
    } else {
        format!("scope {scope}")
    }
}

/// Tells whether a process with this id exists on this host.
fn process_alive(pid: u32) -> bool {
    use nix::errno::Errno;
    use nix::sys::signal::kill;
    use nix::unistd::Pid;
    // 0 and ids beyond i32 name process groups or nothing: no process holds the lock.
    match i32::try_from(pid) {
        Ok(raw) if raw > 0 => !matches!(kill(Pid::from_raw(raw), None), Err(Errno::ESRCH)),
        _ => false,
    }
}

fn sql_error(path: &Path, what: &str, e: rusqlite::Error) -> StoreError {
    let busy = matches!(
        &e,
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(f.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    );
    if busy {
        StoreError::State(format!(
            "{what} {}: another process kept it busy for more than {} s; try again",
            path.display(),
            BUSY_TIMEOUT.as_secs()
        ))
    } else {
        StoreError::Sqlite {
            what: what.to_string(),
            path: path.to_path_buf(),
            source: e,
        }
    }
}

fn json_text<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|e| StoreError::json("cannot serialize a value", e))
}

/// Usage as stored: counts as SQLite integers (saturating), cost as a nullable real.
struct UsageCols {
    input: i64,
    output: i64,
    cached: i64,
    cost: Option<f64>,
}

impl From<&Usage> for UsageCols {
    fn from(u: &Usage) -> Self {
        let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        UsageCols {
            input: int(u.input_tokens),
            output: int(u.output_tokens),
            cached: int(u.cached_tokens),
            cost: u.cost_usd,
        }
    }
}

fn usage_from_row(row: &Row<'_>, first: usize) -> rusqlite::Result<Usage> {
    let count = |i: usize| -> rusqlite::Result<u64> {
        Ok(u64::try_from(row.get::<_, i64>(i)?).unwrap_or(0))
    };
    Ok(Usage {
        input_tokens: count(first)?,
        output_tokens: count(first + 1)?,
        cached_tokens: count(first + 2)?,
        cost_usd: row.get(first + 3)?,
    })
}

/// Reads a text column through a parser, failing on a value this build does not know.
fn parse_col<T>(row: &Row<'_>, i: usize, parse: fn(&str) -> Option<T>) -> rusqlite::Result<T> {
    let text: String = row.get(i)?;
    parse(&text).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            i,
            rusqlite::types::Type::Text,
            format!("unknown value {text:?}").into(),
        )
    })
}

/// Reads a JSON text column.
fn json_col<T: serde::de::DeserializeOwned>(row: &Row<'_>, i: usize) -> rusqlite::Result<T> {
    let text: String = row.get(i)?;
    serde_json::from_str(&text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e))
    })
}

fn run_from_row(row: &Row<'_>) -> rusqlite::Result<RunRecord> {
    let exit_name: Option<String> = row.get(6)?;
    let exit_code: Option<i64> = row.get(7)?;
    Ok(RunRecord {
        id: row.get(0)?,
        workflow: row.get(1)?,
        file: row.get(2)?,
        workflow_hash: row.get(3)?,
        params: json_col(row, 4)?,
        status: parse_col(row, 5, RunStatus::parse)?,
        exit: exit_name.zip(exit_code),
        started_at: row.get(8)?,
        updated_at: row.get(9)?,
        dir: row.get(10)?,
        options: json_col(row, 11)?,
    })
}

fn attempt_from_row(row: &Row<'_>) -> rusqlite::Result<AttemptRecord> {
    Ok(AttemptRecord {
        run: row.get(0)?,
        scope: row.get(1)?,
        node: row.get(2)?,
        attempt: row.get(3)?,
        state: parse_col(row, 4, AttemptState::parse)?,
        agent: row.get(5)?,
        dir: row.get(6)?,
        error: row.get(7)?,
        usage: usage_from_row(row, 8)?,
        started_at: row.get(12)?,
        finished_at: row.get(13)?,
    })
}

fn event_from_row(row: &Row<'_>) -> rusqlite::Result<Event> {
    Ok(Event {
        run: row.get(0)?,
        at: row.get(1)?,
        scope: row.get(2)?,
        node: row.get(3)?,
        kind: row.get(4)?,
        message: row.get(5)?,
    })
}

fn gate_from_row(row: &Row<'_>) -> rusqlite::Result<GateRequest> {
    Ok(GateRequest {
        run: row.get(0)?,
        scope: row.get(1)?,
        gate: row.get(2)?,
        message: row.get(3)?,
        show: json_col(row, 4)?,
        requested_at: row.get(5)?,
        deadline: row.get(6)?,
    })
}

fn approval_from_row(row: &Row<'_>) -> rusqlite::Result<Approval> {
    Ok(Approval {
        run: row.get(0)?,
        scope: row.get(1)?,
        gate: row.get(2)?,
        approved: row.get(3)?,
        comment: row.get(4)?,
        by: row.get(5)?,
        at: row.get(6)?,
    })
}

fn lock_from_row(row: &Row<'_>) -> rusqlite::Result<LockOwner> {
    Ok(LockOwner {
        pid: row.get(0)?,
        host: row.get(1)?,
        since: row.get(2)?,
    })
}
