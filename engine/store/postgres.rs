//! The PostgreSQL store: the same records as the SQLite store, in a server that many
//! processes (and, later, many machines) share. `--store postgres://...` or
//! `RALPH_FLOW_STORE` selects it.
//!
//! The client is the synchronous `postgres` crate. It runs its own small tokio runtime, which
//! cannot be entered from the executor's, so the connection lives on a thread of its own and
//! each [`Store`] call is a job sent to it, waited for like a SQLite call. Every write is one
//! transaction, which also draws from the `changes` sequence: [`Store::changes`] reads it,
//! so a monitor sees every commit of every process without reading anything else.
//!
//! The schema is versioned (`ralph_flow_schema`); migrations run in a transaction under an
//! advisory lock, so that processes starting together do not race.

mod prune;
mod queue;
mod records;
mod units;
mod workers;

pub use crate::store::shared::{Accept, AcceptUnit, Unit, UnitState};
pub use queue::listen;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use ::postgres::{Client, GenericClient, NoTls, Row};

use super::{
    Approval, ArtifactRecord, AttemptRecord, AttemptState, Cancellation, Event, GateRequest,
    LockOwner, NodeRecord, NodeState, Removed, Result, RunRecord, RunStatus, Store, StoreError,
    StoredSize, Usage, Write,
};
use crate::store::location::{OpenOptions, Opened, Registration};
use crate::store::shared::SharedStore;

/// The PostgreSQL store as [`crate::store::Location`] finds it: by `postgres://` or
/// `postgresql://`; shared by many processes and machines.
pub(crate) const REGISTRATION: Registration = Registration {
    schemes: &["postgres://", "postgresql://"],
    shared: true,
    open: open_url,
    shown,
};

/// Connects: a call that waits for a lost connection says so on stderr, or in the log for a
/// store opened to be read.
fn open_url(url: &str, options: &OpenOptions) -> Result<Opened> {
    let report: WaitReport = if options.read_only {
        Box::new(|m| tracing::warn!("{m}"))
    } else {
        Box::new(crate::store::location::report_wait)
    };
    Ok(Opened::Shared(Box::new(PgStore::connect_reporting(
        url, report,
    )?)))
}

/// The schema this version reads and writes.
pub const SCHEMA_VERSION: i32 = 9;

/// How long a lost connection is retried before the call fails (a restart of the server, a
/// failover, a network cut).
const RECONNECT_FOR: Duration = Duration::from_secs(10 * 60);

/// The longest pause between two attempts to reconnect.
const RECONNECT_MAX_DELAY: Duration = Duration::from_secs(5);

/// The migrations, in order: migration N brings the schema from version N-1 to N.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE SEQUENCE changes;
CREATE TABLE runs (
    id            TEXT PRIMARY KEY,
    seq           BIGSERIAL,
    workflow      TEXT NOT NULL,
    file          TEXT NOT NULL,
    workflow_hash TEXT NOT NULL,
    params        TEXT NOT NULL,
    status        TEXT NOT NULL,
    exit_name     TEXT,
    exit_code     BIGINT,
    started_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL,
    dir           TEXT NOT NULL,
    options       TEXT NOT NULL
);
CREATE INDEX runs_started ON runs (started_at DESC, seq DESC);
CREATE INDEX runs_workflow ON runs (workflow, started_at);
CREATE TABLE nodes (
    run           TEXT NOT NULL,
    scope         TEXT NOT NULL,
    node          TEXT NOT NULL,
    seq           BIGSERIAL,
    state         TEXT NOT NULL,
    output        TEXT NOT NULL,
    action        TEXT,
    feedback      TEXT,
    attempts      BIGINT NOT NULL,
    input_tokens  BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    cached_tokens BIGINT NOT NULL,
    cost_usd      DOUBLE PRECISION,
    started_at    BIGINT NOT NULL,
    finished_at   BIGINT NOT NULL,
    PRIMARY KEY (run, scope, node)
);
CREATE INDEX nodes_order ON nodes (run, seq);
CREATE INDEX nodes_by_name ON nodes (node);
CREATE TABLE attempts (
    run           TEXT NOT NULL,
    scope         TEXT NOT NULL,
    node          TEXT NOT NULL,
    attempt       BIGINT NOT NULL,
    state         TEXT NOT NULL,
    agent         TEXT,
    dir           TEXT NOT NULL,
    error         TEXT,
    input_tokens  BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    cached_tokens BIGINT NOT NULL,
    cost_usd      DOUBLE PRECISION,
    started_at    BIGINT NOT NULL,
    finished_at   BIGINT,
    PRIMARY KEY (run, scope, node, attempt)
);
CREATE TABLE events (
    seq     BIGSERIAL PRIMARY KEY,
    run     TEXT NOT NULL,
    at      BIGINT NOT NULL,
    scope   TEXT NOT NULL,
    node    TEXT NOT NULL,
    kind    TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX events_run ON events (run, seq);
CREATE TABLE gates (
    run          TEXT NOT NULL,
    scope        TEXT NOT NULL,
    gate         TEXT NOT NULL,
    seq          BIGSERIAL,
    message      TEXT NOT NULL,
    show         TEXT NOT NULL,
    requested_at BIGINT NOT NULL,
    deadline     BIGINT,
    PRIMARY KEY (run, scope, gate)
);
CREATE TABLE approvals (
    run      TEXT NOT NULL,
    scope    TEXT NOT NULL,
    gate     TEXT NOT NULL,
    approved BOOLEAN NOT NULL,
    comment  TEXT,
    by_whom  TEXT NOT NULL,
    at       BIGINT NOT NULL,
    PRIMARY KEY (run, scope, gate)
);
CREATE TABLE locks (
    run   TEXT PRIMARY KEY,
    pid   BIGINT NOT NULL,
    host  TEXT NOT NULL,
    since BIGINT NOT NULL
);
"#,
    r#"
-- The writes applied, by the key their caller drew: a write retried after a lost connection
-- (which may or may not have committed) is applied once.
CREATE TABLE applied (
    key BIGINT PRIMARY KEY,
    at  BIGINT NOT NULL
);
"#,
    r#"
-- Leases: the holder's unique id and when its lease ends (see store::LockOwner).
ALTER TABLE locks ADD COLUMN holder TEXT NOT NULL DEFAULT '';
ALTER TABLE locks ADD COLUMN expires BIGINT;
-- The queue: a detached run (`run --detach`) is run by workers, which claim only runs whose
-- labels are a subset of their own; its workflow's files are kept with it.
ALTER TABLE runs ADD COLUMN detached BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE runs ADD COLUMN labels TEXT[] NOT NULL DEFAULT '{}';
CREATE INDEX runs_claimable ON runs (seq) WHERE detached AND status IN ('queued', 'running');
CREATE TABLE run_sources (
    run  TEXT NOT NULL,
    seq  INTEGER NOT NULL,
    path TEXT NOT NULL,
    text TEXT NOT NULL,
    PRIMARY KEY (run, seq)
);
"#,
    r#"
-- Units of work: the agent calls and programs of runs on workers, which any worker whose
-- labels suffice may carry out (see postgres/units.rs).
CREATE TABLE units (
    id         BIGSERIAL PRIMARY KEY,
    run        TEXT NOT NULL,
    key        TEXT NOT NULL,
    kind       TEXT NOT NULL,
    payload    TEXT NOT NULL,
    labels     TEXT[] NOT NULL DEFAULT '{}',
    place      TEXT NOT NULL,
    state      TEXT NOT NULL,
    holder     TEXT,
    host       TEXT,
    pid        BIGINT,
    expires    BIGINT,
    result     TEXT,
    resource   TEXT,
    capacity   BIGINT,
    stage      TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    UNIQUE (run, key)
);
CREATE INDEX units_claimable ON units (id) WHERE state IN ('queued', 'running');
"#,
    r#"
-- The calls that reported no usage (a server that streams none): their tokens are not in the
-- counts, which are then a lower bound. (A long output is stored out of line by TOAST, so a
-- column added after it costs nothing to reach, unlike in SQLite.)
ALTER TABLE nodes ADD COLUMN unreported BIGINT NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN unreported BIGINT NOT NULL DEFAULT 0;
"#,
    r#"
-- Who a lock's holder process is (its start time in clock ticks after boot, the boot id, its
-- PID namespace): a holder provably gone is taken over before its lease ends (see
-- store::LockOwner::lapsed). NULL in older locks: unknown, and the lease alone decides.
ALTER TABLE locks ADD COLUMN started BIGINT;
ALTER TABLE locks ADD COLUMN boot TEXT;
ALTER TABLE locks ADD COLUMN pidns BIGINT;
"#,
    r#"
-- The workers, as each last said it was there (`ralph-flow worker` writes its row whenever it
-- looks for work): which labels live workers have, so that `status`, `runs` and the monitor
-- can say why queued work is not taken (see postgres/workers.rs). Times by the server's
-- clock; `until` is when the worker counts as gone unless it looks again.
CREATE TABLE workers (
    id     TEXT PRIMARY KEY,
    host   TEXT NOT NULL,
    pid    BIGINT NOT NULL,
    labels TEXT[] NOT NULL DEFAULT '{}',
    seen   BIGINT NOT NULL,
    until  BIGINT NOT NULL
);
"#,
    r#"
-- What people read of each attempt (prompts, raw answers, outputs, feedback, a unit's stdout
-- and stderr tails), written with the commit that settles it, so that any machine shows them
-- (see postgres/records.rs). The path in the C collation: an attempt's records are one range
-- of the key. BYTEA: a program's output may hold a NUL.
CREATE TABLE artifacts (
    run  TEXT NOT NULL,
    path TEXT COLLATE "C" NOT NULL,
    text BYTEA NOT NULL,
    PRIMARY KEY (run, path)
);
"#,
    r#"
-- What changed since a position (Store::events_since, nodes_since, attempts_since): each row
-- of nodes, attempts and events keeps the 64-bit id of the transaction that last wrote it
-- (`tx`, set by a trigger, whichever statement writes it), indexed by run. A reader takes the
-- oldest transaction still going on (`pg_snapshot_xmin`) as its horizon: every transaction
-- below it has ended, so the rows below it are all there, and it reads them from the last
-- horizon to this one (postgres.rs, `since`). Rows of older versions have 0.
ALTER TABLE nodes ADD COLUMN tx BIGINT NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN tx BIGINT NOT NULL DEFAULT 0;
ALTER TABLE events ADD COLUMN tx BIGINT NOT NULL DEFAULT 0;
CREATE FUNCTION ralph_flow_written_by() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.tx := pg_current_xact_id()::text::bigint;
    RETURN NEW;
END
$$;
CREATE TRIGGER nodes_tx BEFORE INSERT OR UPDATE ON nodes
    FOR EACH ROW EXECUTE FUNCTION ralph_flow_written_by();
CREATE TRIGGER attempts_tx BEFORE INSERT OR UPDATE ON attempts
    FOR EACH ROW EXECUTE FUNCTION ralph_flow_written_by();
CREATE TRIGGER events_tx BEFORE INSERT OR UPDATE ON events
    FOR EACH ROW EXECUTE FUNCTION ralph_flow_written_by();
CREATE INDEX nodes_tx ON nodes (run, tx);
CREATE INDEX attempts_tx ON attempts (run, tx);
CREATE INDEX events_tx ON events (run, tx);
"#,
];

/// The horizon of a `*_since` read: the oldest transaction still going on when it is asked.
/// Every transaction below it has committed or rolled back, so what a query made after it
/// sees of them is final; a transaction at or above it may still commit, and its rows are
/// read by a later call (a transaction left open elsewhere on the server holds the horizon
/// back until it ends).
const HORIZON: &str = "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint";

/// Reads the rows of one kind that transactions from `after` up to the horizon wrote: the
/// horizon first, then the rows (in a later snapshot, which has all of them).
fn since<T>(
    c: &mut Client,
    what: &'static str,
    sql: &str,
    run: &str,
    after: i64,
    row: impl Fn(&Row) -> Result<(i64, T)>,
) -> Result<super::Since<T>> {
    let fail = |e| pg(format!("cannot read {what}"), e);
    let horizon: i64 = c.query_one(HORIZON, &[]).map_err(fail)?.get(0);
    if horizon <= after {
        return Ok(super::Since {
            records: Vec::new(),
            next: after,
        });
    }
    let records = c
        .query(sql, &[&run, &after, &horizon])
        .map_err(fail)?
        .iter()
        .map(row)
        .collect::<Result<Vec<_>>>()?;
    Ok(super::Since {
        records,
        next: horizon,
    })
}

/// The channel workers listen on: a run queued, a gate of a detached run answered, a lease
/// released (the payload is the run's id).
pub const CHANNEL: &str = "ralph_flow";

/// A key of the advisory lock that migrations take ("ralph" in ASCII).
const MIGRATION_LOCK: i64 = 0x0072_616c_7068;

/// A call on the connection's thread: given the connection it runs and answers (`true`), or
/// finds the connection lost (`false`, and it is run again once reconnected); given `None`
/// (no connection for [`RECONNECT_FOR`]) it answers with an error.
type Job = Box<dyn FnMut(Option<&mut Client>) -> bool + Send>;

/// Told when a call waits for a lost connection.
pub type WaitReport = Box<dyn Fn(&str) + Send>;

/// A run store in a PostgreSQL database.
pub struct PgStore {
    jobs: Option<mpsc::Sender<Job>>,
    /// The connection's thread, shared by the handles of [`PgStore::share`]: the last one
    /// dropped joins it.
    thread: std::sync::Arc<std::sync::Mutex<Option<std::thread::JoinHandle<()>>>>,
    /// The server, as messages name it (no password).
    shown: String,
    /// The server's URL, for a listening connection of its own.
    url: std::sync::Arc<str>,
    /// The run this store took with a lease, and by whom: its writes to the store are
    /// fenced by that lease (see [`Store::lock`]).
    fence: Option<Fence>,
}

/// A lease that fences a store's writes: the run, the holder, the lease's length (ms).
#[derive(Clone, Debug)]
struct Fence {
    run: String,
    holder: String,
    lease: i64,
}

/// The server's clock in milliseconds since the Unix epoch: leases are timed by the
/// server, so that the clocks of the machines sharing it need not agree.
pub(crate) const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::BIGINT";

/// Renews the fencing lease ($3 ms from now), in the transaction of a write, if the lock is
/// still this tenure's ($2) and its lease has not lapsed: a lapsed lease is lost, taken
/// over or not (any worker may take it from then on).
const FENCE: &str = "UPDATE locks SET expires = \
     (extract(epoch from clock_timestamp()) * 1000)::BIGINT + $3 WHERE run = $1 AND holder = $2 \
     AND (expires IS NULL OR expires >= (extract(epoch from clock_timestamp()) * 1000)::BIGINT)";

/// Checks (and renews) the lease in a write's transaction; fails with
/// [`StoreError::LeaseLost`] when another tenure holds the run now, or this one's lease
/// lapsed (the transaction is then dropped: nothing of the write is applied).
fn fenced(c: &mut impl GenericClient, fence: Option<&Fence>) -> Result<()> {
    let Some(f) = fence else {
        return Ok(());
    };
    let fail = |e| pg("cannot check the run's lease", e);
    if c.execute(FENCE, &[&f.run, &f.holder, &f.lease])
        .map_err(fail)?
        == 1
    {
        return Ok(());
    }
    let held = c
        .query_opt(
            &format!("SELECT {LOCK_COLUMNS} FROM locks WHERE run = $1"),
            &[&f.run],
        )
        .map_err(fail)?
        .map(|r| lock_from_row(&r));
    Err(StoreError::LeaseLost {
        run: f.run.clone(),
        now: super::lost_to(held.as_ref(), &f.holder),
    })
}

impl Drop for PgStore {
    fn drop(&mut self) {
        // Closing the channel ends the connection's thread once every handle closed it.
        self.jobs.take();
        if std::sync::Arc::strong_count(&self.thread) == 1 {
            let t = self.thread.lock().ok().and_then(|mut t| t.take());
            if let Some(t) = t {
                let _ = t.join();
            }
        }
    }
}

/// The URL without its password, for messages.
pub fn shown(url: &str) -> String {
    match url.parse::<::postgres::Config>() {
        Ok(c) => {
            let hosts: Vec<String> = c
                .get_hosts()
                .iter()
                .map(|h| match h {
                    ::postgres::config::Host::Tcp(h) => h.clone(),
                    ::postgres::config::Host::Unix(p) => p.display().to_string(),
                })
                .collect();
            let port = c.get_ports().first().copied().unwrap_or(5432);
            format!(
                "postgres://{}@{}:{port}/{}",
                c.get_user().unwrap_or(""),
                hosts.join(","),
                c.get_dbname().unwrap_or("")
            )
        }
        Err(_) => "a postgres:// store".into(),
    }
}

fn pg(what: impl Into<String>, source: ::postgres::Error) -> StoreError {
    StoreError::Postgres {
        what: what.into(),
        source,
    }
}

fn json_text(v: &serde_json::Value) -> Result<String> {
    serde_json::to_string(v).map_err(|e| StoreError::json("cannot write JSON for the store", e))
}

fn json_value(text: &str) -> Result<serde_json::Value> {
    serde_json::from_str(text).map_err(|e| StoreError::json("cannot read JSON from the store", e))
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn uint(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl PgStore {
    /// Connects to the database at `url` and brings its schema up to [`SCHEMA_VERSION`].
    pub fn connect(url: &str) -> Result<PgStore> {
        Self::connect_reporting(url, Box::new(|m| tracing::warn!("{m}")))
    }

    /// [`PgStore::connect`], telling `report` when a call waits for a lost connection.
    pub fn connect_reporting(url: &str, report: WaitReport) -> Result<PgStore> {
        let shown = shown(url);
        let shared_url: std::sync::Arc<str> = url.into();
        let (jobs, inbox) = mpsc::channel::<Job>();
        let (ready, started) = mpsc::channel::<Result<()>>();
        let url = url.to_string();
        let name = shown.clone();
        let thread = std::thread::Builder::new()
            .name("ralph-flow-postgres".into())
            .spawn(move || {
                let mut client = match Client::connect(&url, NoTls) {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = ready.send(Err(pg(format!("cannot connect to {name}"), e)));
                        return;
                    }
                };
                if let Err(e) = migrate(&mut client, &name) {
                    let _ = ready.send(Err(e));
                    return;
                }
                let _ = ready.send(Ok(()));
                let mut client = Some(client);
                for mut job in inbox {
                    let started = Instant::now();
                    let mut delay = Duration::from_millis(100);
                    loop {
                        if let Some(c) = client.as_mut() {
                            if job(Some(c)) {
                                break;
                            }
                            client = None;
                        }
                        if started.elapsed() > RECONNECT_FOR {
                            job(None);
                            break;
                        }
                        report(&format!(
                            "lost the connection to {name}; connecting again in {}",
                            crate::text::duration(delay)
                        ));
                        std::thread::sleep(delay);
                        delay = (delay * 2).min(RECONNECT_MAX_DELAY);
                        client = Client::connect(&url, NoTls).ok();
                        PREPARED.with(|p| p.borrow_mut().clear());
                    }
                }
            })
            .map_err(|e| StoreError::Connection(format!("cannot start the store's thread: {e}")))?;
        match started.recv() {
            Ok(Ok(())) => Ok(PgStore {
                jobs: Some(jobs),
                thread: std::sync::Arc::new(std::sync::Mutex::new(Some(thread))),
                shown,
                url: shared_url,
                fence: None,
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(StoreError::Connection(format!(
                "the connection to {shown} ended before it was ready"
            ))),
        }
    }

    /// Another handle on the same connection (its calls are queued with this one's, each a
    /// transaction of its own): a run's lease renewals, `earlier_runs` and units of work need
    /// no connection of their own. The handle has no fencing lease.
    pub fn share(&self) -> PgStore {
        PgStore {
            jobs: self.jobs.clone(),
            thread: self.thread.clone(),
            shown: self.shown.clone(),
            url: self.url.clone(),
            fence: None,
        }
    }

    /// Another handle on the same connection whose writes to `run` are fenced by `owner`'s
    /// tenure, as if it had taken the run itself: for a worker that speaks for a run it
    /// claimed (it records why it could not carry it out), so that nothing it writes lands
    /// once another tenure holds the run.
    pub fn fenced(&self, run: &str, owner: &LockOwner) -> PgStore {
        let mut handle = self.share();
        handle.fence = Some(Fence {
            run: run.to_string(),
            holder: owner.holder.clone(),
            lease: owner.lease().unwrap_or(super::ms(super::LEASE)),
        });
        handle
    }

    /// Runs `f` on the connection's thread and waits for its result. When the connection is
    /// lost, `f` runs again once it is back (so a write must be safe to run twice: see
    /// [`applied_before`]), for up to [`RECONNECT_FOR`].
    fn call<T: Send + 'static>(
        &self,
        mut f: impl FnMut(&mut Client) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let gone = || StoreError::Connection(format!("the connection to {} is closed", self.shown));
        let lost = format!(
            "lost the connection to {} and could not connect again for {}",
            self.shown,
            crate::text::duration(RECONNECT_FOR)
        );
        let (tx, rx) = mpsc::sync_channel(1);
        self.jobs
            .as_ref()
            .ok_or_else(gone)?
            .send(Box::new(move |c: Option<&mut Client>| {
                let Some(c) = c else {
                    let _ = tx.send(Err(StoreError::Connection(lost.clone())));
                    return true;
                };
                let result = f(c);
                if result.is_err() && c.is_closed() {
                    return false;
                }
                let _ = tx.send(result);
                true
            }))
            .map_err(|_| gone())?;
        rx.recv().map_err(|_| gone())?
    }
}

fn migrate(client: &mut Client, shown: &str) -> Result<()> {
    let fail = |e| pg(format!("cannot set up the schema in {shown}"), e);
    let mut tx = client.transaction().map_err(fail)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .map_err(fail)?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS ralph_flow_schema (version INTEGER NOT NULL)")
        .map_err(fail)?;
    let version: i32 = tx
        .query_opt("SELECT version FROM ralph_flow_schema", &[])
        .map_err(fail)?
        .map_or(0, |r| r.get(0));
    if version > SCHEMA_VERSION {
        return Err(StoreError::Version(format!(
            "{shown} has schema version {version} and this ralph-flow knows {SCHEMA_VERSION}; \
             use a newer ralph-flow"
        )));
    }
    for (i, sql) in MIGRATIONS
        .iter()
        .enumerate()
        .skip(usize::try_from(version).unwrap_or(0))
    {
        tx.batch_execute(sql).map_err(fail)?;
        let v = i32::try_from(i + 1).unwrap_or(i32::MAX);
        tx.execute("DELETE FROM ralph_flow_schema", &[])
            .map_err(fail)?;
        tx.execute("INSERT INTO ralph_flow_schema (version) VALUES ($1)", &[&v])
            .map_err(fail)?;
    }
    tx.commit().map_err(fail)
}

/// A key for a write that may be retried after a lost connection.
fn write_key() -> i64 {
    let mut bytes = [0u8; 8];
    // Without the system's generator, the time and the pid make a key unique enough.
    if getrandom::fill(&mut bytes).is_err() {
        let mix = (super::now_ms() as u64) ^ (u64::from(std::process::id()) << 40);
        bytes = mix.to_le_bytes();
    }
    i64::from_le_bytes(bytes)
}

/// Records a write's key, and counts a change, in the write's own transaction.
const APPLY_KEY: &str = "INSERT INTO applied (key, at) SELECT $1, $2 \
     WHERE nextval('changes') IS NOT NULL ON CONFLICT (key) DO NOTHING";

/// Whether the write with this key was applied already (its first try committed, and only
/// its answer was lost); else records the key and counts the change, in the write's own
/// transaction. `apply` is [`APPLY_KEY`], as text or prepared.
fn applied_before(
    c: &mut impl GenericClient,
    apply: &(impl ::postgres::ToStatement + ?Sized),
    key: i64,
) -> std::result::Result<bool, ::postgres::Error> {
    let inserted = c.execute(apply, &[&key, &super::now_ms()])?;
    // Now and then, forget the keys of a day ago.
    if key % 1024 == 0 {
        c.execute(
            "DELETE FROM applied WHERE at < $1",
            &[&(super::now_ms() - 86_400_000)],
        )?;
    }
    Ok(inserted == 0)
}

/// Counts a change (in the transaction that makes it).
fn changed(c: &mut impl GenericClient) -> std::result::Result<(), ::postgres::Error> {
    c.execute("SELECT nextval('changes')", &[]).map(drop)
}

const RUN_COLUMNS: &str = "id, workflow, file, workflow_hash, params, status, exit_name, \
                           exit_code, started_at, updated_at, dir, options";

fn run_from_row(row: &Row) -> Result<RunRecord> {
    let status: String = row.get(5);
    let exit_name: Option<String> = row.get(6);
    let exit_code: Option<i64> = row.get(7);
    Ok(RunRecord {
        id: row.get(0),
        workflow: row.get(1),
        file: row.get(2),
        workflow_hash: row.get(3),
        params: json_value(row.get(4))?,
        status: RunStatus::parse(&status)
            .ok_or_else(|| StoreError::Version(format!("unknown run status `{status}`")))?,
        exit: exit_name.zip(exit_code),
        started_at: row.get(8),
        updated_at: row.get(9),
        dir: row.get(10),
        options: json_value(row.get(11))?,
    })
}

fn usage_from_row(row: &Row, first: usize) -> Usage {
    Usage {
        input_tokens: uint(row.get(first)),
        output_tokens: uint(row.get(first + 1)),
        cached_tokens: uint(row.get(first + 2)),
        cost_usd: row.get(first + 3),
        unreported: uint(row.get(first + 4)),
    }
}

const NODE_COLUMNS: &str = "n.run, n.scope, n.node, n.state, n.output, n.action, n.feedback, \
                            n.attempts, n.input_tokens, n.output_tokens, n.cached_tokens, \
                            n.cost_usd, n.unreported, n.started_at, n.finished_at";

fn node_from_row(row: &Row) -> Result<NodeRecord> {
    let state: String = row.get(3);
    Ok(NodeRecord {
        run: row.get(0),
        scope: row.get(1),
        node: row.get(2),
        state: NodeState::parse(&state)
            .ok_or_else(|| StoreError::Version(format!("unknown node state `{state}`")))?,
        output: json_value(row.get(4))?,
        action: row.get(5),
        feedback: row.get(6),
        attempts: u32::try_from(row.get::<_, i64>(7)).unwrap_or(u32::MAX),
        usage: usage_from_row(row, 8),
        started_at: row.get(13),
        finished_at: row.get(14),
    })
}

const ATTEMPT_COLUMNS: &str = "run, scope, node, attempt, state, agent, dir, error, \
                               input_tokens, output_tokens, cached_tokens, cost_usd, \
                               unreported, started_at, finished_at";

fn attempt_from_row(row: &Row) -> Result<AttemptRecord> {
    let state: String = row.get(4);
    Ok(AttemptRecord {
        run: row.get(0),
        scope: row.get(1),
        node: row.get(2),
        attempt: u32::try_from(row.get::<_, i64>(3)).unwrap_or(u32::MAX),
        state: AttemptState::parse(&state)
            .ok_or_else(|| StoreError::Version(format!("unknown attempt state `{state}`")))?,
        agent: row.get(5),
        dir: row.get(6),
        error: row.get(7),
        usage: usage_from_row(row, 8),
        started_at: row.get(13),
        finished_at: row.get(14),
    })
}

fn event_from_row(row: &Row) -> Event {
    Event {
        run: row.get(0),
        at: row.get(1),
        scope: row.get(2),
        node: row.get(3),
        kind: row.get(4),
        message: row.get(5),
    }
}

const GATE_COLUMNS: &str = "run, scope, gate, message, show, requested_at, deadline";

fn gate_from_row(row: &Row) -> Result<GateRequest> {
    let show: String = row.get(4);
    Ok(GateRequest {
        run: row.get(0),
        scope: row.get(1),
        gate: row.get(2),
        message: row.get(3),
        show: serde_json::from_str(&show)
            .map_err(|e| StoreError::json("cannot read a gate's files from the store", e))?,
        requested_at: row.get(5),
        deadline: row.get(6),
    })
}

fn pending(c: &mut impl GenericClient, run: &str, lock: bool) -> Result<Vec<GateRequest>> {
    let sql = format!(
        "SELECT {GATE_COLUMNS} FROM gates WHERE run = $1 ORDER BY seq{}",
        if lock { " FOR UPDATE" } else { "" }
    );
    c.query(&sql, &[&run])
        .map_err(|e| pg("cannot read gates", e))?
        .iter()
        .map(gate_from_row)
        .collect()
}

fn insert_approval(
    c: &mut impl GenericClient,
    a: &Approval,
) -> std::result::Result<(), ::postgres::Error> {
    c.execute(
        "INSERT INTO approvals (run, scope, gate, approved, comment, by_whom, at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) \
         ON CONFLICT (run, scope, gate) DO UPDATE SET approved = excluded.approved, \
         comment = excluded.comment, by_whom = excluded.by_whom, at = excluded.at",
        &[
            &a.run,
            &a.scope,
            &a.gate,
            &a.approved,
            &a.comment,
            &a.by,
            &a.at,
        ],
    )?;
    c.execute(
        "DELETE FROM gates WHERE run = $1 AND scope = $2 AND gate = $3",
        &[&a.run, &a.scope, &a.gate],
    )?;
    Ok(())
}

/// A settlement written again replaces the first and moves to the end of the write order.
const UPSERT_NODE: &str = "INSERT INTO nodes (run, scope, node, state, output, action, \
     feedback, attempts, input_tokens, output_tokens, cached_tokens, cost_usd, started_at, \
     finished_at, unreported) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) \
     ON CONFLICT (run, scope, node) DO UPDATE SET state = excluded.state, \
     output = excluded.output, action = excluded.action, feedback = excluded.feedback, \
     attempts = excluded.attempts, input_tokens = excluded.input_tokens, \
     output_tokens = excluded.output_tokens, cached_tokens = excluded.cached_tokens, \
     cost_usd = excluded.cost_usd, started_at = excluded.started_at, \
     finished_at = excluded.finished_at, unreported = excluded.unreported, \
     seq = nextval('nodes_seq_seq')";

const UPSERT_ATTEMPT: &str = "INSERT INTO attempts (run, scope, node, attempt, state, agent, \
     dir, error, input_tokens, output_tokens, cached_tokens, cost_usd, started_at, finished_at, \
     unreported) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) \
     ON CONFLICT (run, scope, node, attempt) DO UPDATE SET state = excluded.state, \
     agent = excluded.agent, dir = excluded.dir, error = excluded.error, \
     input_tokens = excluded.input_tokens, output_tokens = excluded.output_tokens, \
     cached_tokens = excluded.cached_tokens, cost_usd = excluded.cost_usd, \
     started_at = excluded.started_at, finished_at = excluded.finished_at, \
     unreported = excluded.unreported";

const INSERT_EVENT: &str = "INSERT INTO events (run, at, scope, node, kind, message) \
     VALUES ($1, $2, $3, $4, $5, $6)";

const UPSERT_GATE: &str = "INSERT INTO gates (run, scope, gate, message, show, requested_at, \
     deadline) VALUES ($1, $2, $3, $4, $5, $6, $7) \
     ON CONFLICT (run, scope, gate) DO UPDATE SET message = excluded.message, \
     show = excluded.show, requested_at = excluded.requested_at, \
     deadline = excluded.deadline, seq = nextval('gates_seq_seq')";

thread_local! {
    /// The statements prepared on this thread's connection (each store has a thread of its
    /// own); emptied when it connects again.
    static PREPARED: std::cell::RefCell<std::collections::HashMap<&'static str, ::postgres::Statement>> =
        std::cell::RefCell::default();
}

/// A statement of the commit's, prepared once per connection: one round trip a write
/// instead of two.
fn prepared(
    c: &mut Client,
    sql: &'static str,
) -> std::result::Result<::postgres::Statement, ::postgres::Error> {
    if let Some(st) = PREPARED.with(|p| p.borrow().get(sql).cloned()) {
        return Ok(st);
    }
    let st = c.prepare(sql)?;
    PREPARED.with(|p| p.borrow_mut().insert(sql, st.clone()));
    Ok(st)
}

/// Writes the records of a commit in one transaction: one round trip for the key and the
/// change count, then one a record.
fn write_all(
    c: &mut Client,
    writes: &[Write],
    records: &[ArtifactRecord],
    key: i64,
    fence: Option<&Fence>,
) -> Result<()> {
    let fail = |e| pg("cannot commit to the store", e);
    let record = prepared(c, records::INSERT).map_err(fail)?;
    let apply = prepared(c, APPLY_KEY).map_err(fail)?;
    let node = prepared(c, UPSERT_NODE).map_err(fail)?;
    let attempt = prepared(c, UPSERT_ATTEMPT).map_err(fail)?;
    let event = prepared(c, INSERT_EVENT).map_err(fail)?;
    let gate = prepared(c, UPSERT_GATE).map_err(fail)?;
    let mut tx = c.transaction().map_err(fail)?;
    if applied_before(&mut tx, &apply, key).map_err(fail)? {
        return Ok(());
    }
    fenced(&mut tx, fence)?;
    for w in writes {
        match w {
            Write::Node(n) => {
                let output = json_text(&n.output)?;
                tx.execute(
                    &node,
                    &[
                        &n.run,
                        &n.scope,
                        &n.node,
                        &n.state.as_str(),
                        &output,
                        &n.action,
                        &n.feedback,
                        &i64::from(n.attempts),
                        &int(n.usage.input_tokens),
                        &int(n.usage.output_tokens),
                        &int(n.usage.cached_tokens),
                        &n.usage.cost_usd,
                        &n.started_at,
                        &n.finished_at,
                        &int(n.usage.unreported),
                    ],
                )
                .map_err(fail)?;
            }
            Write::Attempt(a) => {
                tx.execute(
                    &attempt,
                    &[
                        &a.run,
                        &a.scope,
                        &a.node,
                        &i64::from(a.attempt),
                        &a.state.as_str(),
                        &a.agent,
                        &a.dir,
                        &a.error,
                        &int(a.usage.input_tokens),
                        &int(a.usage.output_tokens),
                        &int(a.usage.cached_tokens),
                        &a.usage.cost_usd,
                        &a.started_at,
                        &a.finished_at,
                        &int(a.usage.unreported),
                    ],
                )
                .map_err(fail)?;
            }
            Write::Event(e) => {
                tx.execute(
                    &event,
                    &[&e.run, &e.at, &e.scope, &e.node, &e.kind, &e.message],
                )
                .map_err(fail)?;
            }
            Write::Gate(g) => {
                let show = serde_json::to_string(&g.show)
                    .map_err(|e| StoreError::json("cannot write a gate's files", e))?;
                tx.execute(
                    &gate,
                    &[
                        &g.run,
                        &g.scope,
                        &g.gate,
                        &g.message,
                        &show,
                        &g.requested_at,
                        &g.deadline,
                    ],
                )
                .map_err(fail)?;
            }
            Write::Approval(a) => insert_approval(&mut tx, a).map_err(fail)?,
        }
    }
    records::write(&mut tx, &record, records).map_err(fail)?;
    tx.commit().map_err(fail)
}

fn answer_gate(c: &mut Client, approval: &Approval, key: i64, fence: Option<&Fence>) -> Result<()> {
    let fail = |e| pg("cannot answer a gate", e);
    let mut tx = c.transaction().map_err(fail)?;
    if applied_before(&mut tx, APPLY_KEY, key).map_err(fail)? {
        return Ok(());
    }
    // The executor's own answer (a gate's timeout) is fenced by its tenure, as its commits
    // are; another process's (`approve`) has no fence.
    fenced(&mut tx, fence)?;
    let waiting = pending(&mut tx, &approval.run, true)?;
    let target = super::answered_gate(approval, &waiting, || {
        tx.query_opt("SELECT 1 FROM runs WHERE id = $1", &[&approval.run])
            .map(|row| row.is_some())
            .map_err(fail)
    })?;
    let answer = Approval {
        scope: target.scope.clone(),
        ..approval.clone()
    };
    insert_approval(&mut tx, &answer).map_err(fail)?;
    // A detached run that waited on this gate is queued again: a worker carries it on.
    let requeued = tx
        .execute(
            "UPDATE runs SET status = 'queued', updated_at = $2 \
             WHERE id = $1 AND detached AND status = 'waiting'",
            &[&approval.run, &super::now_ms()],
        )
        .map_err(fail)?;
    if requeued > 0 {
        notify(&mut tx, &approval.run).map_err(fail)?;
    }
    tx.commit().map_err(fail)
}

/// Wakes the workers that listen on [`CHANNEL`] once the transaction commits.
/// Inserts a run, refused when one has its id; `queue` makes it a detached run, queued for
/// the workers that have all these labels (`run --detach`). `what` names the write in an
/// error (`cannot create a run`).
fn insert_run(
    c: &mut impl GenericClient,
    run: &RunRecord,
    queue: Option<&[String]>,
    what: &str,
) -> Result<()> {
    let params = json_text(&run.params)?;
    let options = json_text(&run.options)?;
    let (status, (exit_name, exit_code)) = match queue {
        Some(_) => (RunStatus::Queued, (None, None)),
        None => (run.status, run.exit.clone().unzip()),
    };
    let labels: Vec<String> = queue.map(<[String]>::to_vec).unwrap_or_default();
    let inserted = c
        .execute(
            &format!(
                "INSERT INTO runs ({RUN_COLUMNS}, detached, labels) VALUES ($1, $2, $3, $4, $5, \
                 $6, $7, $8, $9, $10, $11, $12, $13, $14) ON CONFLICT (id) DO NOTHING"
            ),
            &[
                &run.id,
                &run.workflow,
                &run.file,
                &run.workflow_hash,
                &params,
                &status.as_str(),
                &exit_name,
                &exit_code,
                &run.started_at,
                &run.updated_at,
                &run.dir,
                &options,
                &queue.is_some(),
                &labels,
            ],
        )
        .map_err(|e| pg(what, e))?;
    if inserted == 0 {
        return Err(StoreError::RunExists(run.id.clone()));
    }
    Ok(())
}

fn notify(c: &mut impl GenericClient, run: &str) -> std::result::Result<(), ::postgres::Error> {
    c.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &run])
        .map(drop)
}

const LOCK_COLUMNS: &str = "pid, host, since, holder, expires, started, boot, pidns";

fn lock_from_row(r: &Row) -> LockOwner {
    LockOwner {
        pid: u32::try_from(r.get::<_, i64>(0)).unwrap_or(0),
        host: r.get(1),
        since: r.get(2),
        holder: r.get(3),
        expires: r.get(4),
        started: r
            .get::<_, Option<i64>>(5)
            .and_then(|s| u64::try_from(s).ok()),
        boot: r.get(6),
        pidns: r
            .get::<_, Option<i64>>(7)
            .and_then(|n| u64::try_from(n).ok()),
    }
}

/// Takes a run's lock for `owner` in a transaction, serialised with every other locker of
/// the run by an advisory lock (row or no row).
fn take_lock(tx: &mut ::postgres::Transaction<'_>, run: &str, owner: &LockOwner) -> Result<()> {
    let fail = |e| pg("cannot lock a run", e);
    tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&run])
        .map_err(fail)?;
    let holder = tx
        .query_opt(
            &format!("SELECT {LOCK_COLUMNS} FROM locks WHERE run = $1"),
            &[&run],
        )
        .map_err(fail)?
        .map(|r| lock_from_row(&r));
    let now: i64 = tx
        .query_one(&format!("SELECT {NOW_MS}"), &[])
        .map_err(fail)?
        .get(0);
    if let Some(holder) = holder {
        owner.may_take(&holder, run, now)?;
    }
    // The lease runs from now by the server's clock.
    let expires = owner.lease().map(|l| now.saturating_add(l));
    tx.execute(
        "INSERT INTO locks (run, pid, host, since, holder, expires, started, boot, pidns) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
         ON CONFLICT (run) DO UPDATE SET pid = excluded.pid, host = excluded.host, \
         since = excluded.since, holder = excluded.holder, expires = excluded.expires, \
         started = excluded.started, boot = excluded.boot, pidns = excluded.pidns",
        &[
            &run,
            &i64::from(owner.pid),
            &owner.host,
            &owner.since,
            &owner.holder,
            &expires,
            &owner.started.and_then(|s| i64::try_from(s).ok()),
            &owner.boot,
            &owner.pidns.and_then(|n| i64::try_from(n).ok()),
        ],
    )
    .map_err(fail)?;
    changed(tx).map_err(fail)
}

fn lock_run(c: &mut Client, run: &str, owner: &LockOwner) -> Result<()> {
    let fail = |e| pg("cannot lock a run", e);
    let mut tx = c.transaction().map_err(fail)?;
    take_lock(&mut tx, run, owner)?;
    tx.commit().map_err(fail)
}

impl Store for PgStore {
    fn create_run(&mut self, run: &RunRecord) -> Result<()> {
        let run = run.clone();
        let key = write_key();
        self.call(move |c| {
            let fail = |e| pg("cannot create a run", e);
            let mut tx = c.transaction().map_err(fail)?;
            if applied_before(&mut tx, APPLY_KEY, key).map_err(fail)? {
                return Ok(());
            }
            insert_run(&mut tx, &run, None, "cannot create a run")?;
            tx.commit().map_err(fail)
        })
    }

    fn run(&self, id: &str) -> Result<Option<RunRecord>> {
        let id = id.to_string();
        self.call(move |c| {
            c.query_opt(
                &format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = $1"),
                &[&id],
            )
            .map_err(|e| pg("cannot read runs", e))?
            .map(|r| run_from_row(&r))
            .transpose()
        })
    }

    fn runs(&self, limit: usize) -> Result<Vec<RunRecord>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.call(move |c| {
            c.query(
                &format!(
                    "SELECT {RUN_COLUMNS} FROM runs ORDER BY started_at DESC, seq DESC LIMIT $1"
                ),
                &[&limit],
            )
            .map_err(|e| pg("cannot read runs", e))?
            .iter()
            .map(run_from_row)
            .collect()
        })
    }

    fn set_status(&mut self, id: &str, status: RunStatus, exit: Option<(&str, i64)>) -> Result<()> {
        let id = id.to_string();
        let (exit_name, exit_code) = exit.map(|(n, c)| (n.to_string(), c)).unzip();
        let fence = self.fence.clone().filter(|f| f.run == id);
        self.call(move |c| {
            let fail = |e| pg("cannot set a run's status", e);
            let mut tx = c.transaction().map_err(fail)?;
            fenced(&mut tx, fence.as_ref())?;
            // A cancelled run stays cancelled: an executor that has not yet seen the cancel
            // does not undo it (see `RunStatus::Cancelled`).
            let changed_rows = tx
                .execute(
                    "UPDATE runs SET status = $2, exit_name = $3, exit_code = $4, updated_at = $5 \
                     WHERE id = $1 AND (status <> 'cancelled' OR $2 = 'cancelled')",
                    &[
                        &id,
                        &status.as_str(),
                        &exit_name,
                        &exit_code,
                        &super::now_ms(),
                    ],
                )
                .map_err(fail)?;
            let cancelled = changed_rows == 0
                && tx
                    .query_opt(
                        "SELECT 1 FROM runs WHERE id = $1 AND status = 'cancelled'",
                        &[&id],
                    )
                    .map_err(fail)?
                    .is_some();
            if changed_rows == 0 && !cancelled {
                return Err(StoreError::Refused(format!("there is no run {id}")));
            }
            changed(&mut tx).map_err(fail)?;
            tx.commit().map_err(fail)
        })
    }

    fn unplaced(&self, run: &str) -> Result<Vec<super::Unplaced>> {
        self.unplaced_work(run)
    }

    fn cancel(&mut self, run: &str, cancellation: &Cancellation) -> Result<RunStatus> {
        let (run, cancellation) = (run.to_string(), cancellation.clone());
        let key = write_key();
        self.call(move |c| queue::cancel_run(c, &run, &cancellation, key))
    }

    fn commit(&mut self, writes: &[Write]) -> Result<()> {
        // Copied anyway (for the connection's thread): masked in place, whoever commits.
        let mut writes = writes.to_vec();
        writes.iter_mut().for_each(Write::redact);
        let key = write_key();
        let fence = self.fence.clone();
        self.call(move |c| write_all(c, &writes, &[], key, fence.as_ref()))
    }

    fn nodes(&self, run: &str) -> Result<Vec<NodeRecord>> {
        let run = run.to_string();
        self.call(move |c| {
            c.query(
                &format!("SELECT {NODE_COLUMNS} FROM nodes n WHERE n.run = $1 ORDER BY n.seq"),
                &[&run],
            )
            .map_err(|e| pg("cannot read nodes", e))?
            .iter()
            .map(node_from_row)
            .collect()
        })
    }

    fn output(&self, run: &str, scope: &str, node: &str) -> Result<Option<serde_json::Value>> {
        let (run, scope, node) = (run.to_string(), scope.to_string(), node.to_string());
        self.call(move |c| {
            c.query_opt(
                "SELECT output FROM nodes WHERE run = $1 AND scope = $2 AND node = $3",
                &[&run, &scope, &node],
            )
            .map_err(|e| pg("cannot read an output", e))?
            .map(|row| json_value(row.get(0)))
            .transpose()
        })
    }

    fn attempts(&self, run: &str, node: Option<&str>) -> Result<Vec<AttemptRecord>> {
        let run = run.to_string();
        let node = node.map(str::to_string);
        self.call(move |c| {
            c.query(
                &format!(
                    "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE run = $1 \
                     AND ($2::TEXT IS NULL OR node = $2) ORDER BY started_at, scope, node, attempt"
                ),
                &[&run, &node],
            )
            .map_err(|e| pg("cannot read attempts", e))?
            .iter()
            .map(attempt_from_row)
            .collect()
        })
    }

    fn running_attempts(&self, run: &str) -> Result<Vec<AttemptRecord>> {
        let run = run.to_string();
        self.call(move |c| {
            c.query(
                &format!(
                    "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE run = $1 AND state = $2 \
                     ORDER BY started_at, scope, node, attempt"
                ),
                &[&run, &AttemptState::Running.as_str()],
            )
            .map_err(|e| pg("cannot read attempts", e))?
            .iter()
            .map(attempt_from_row)
            .collect()
        })
    }

    fn events(&self, run: &str, node: Option<&str>) -> Result<Vec<Event>> {
        let run = run.to_string();
        let node = node.map(str::to_string);
        self.call(move |c| {
            Ok(c.query(
                "SELECT run, at, scope, node, kind, message FROM events WHERE run = $1 \
                     AND ($2::TEXT IS NULL OR node = $2) ORDER BY seq",
                &[&run, &node],
            )
            .map_err(|e| pg("cannot read events", e))?
            .iter()
            .map(event_from_row)
            .collect())
        })
    }

    fn pending_gates(&self, run: &str) -> Result<Vec<GateRequest>> {
        let run = run.to_string();
        self.call(move |c| pending(c, &run, false))
    }

    fn approval(&self, run: &str, scope: &str, gate: &str) -> Result<Option<Approval>> {
        let (run, scope, gate) = (run.to_string(), scope.to_string(), gate.to_string());
        self.call(move |c| {
            Ok(c.query_opt(
                "SELECT run, scope, gate, approved, comment, by_whom, at FROM approvals \
                 WHERE run = $1 AND scope = $2 AND gate = $3",
                &[&run, &scope, &gate],
            )
            .map_err(|e| pg("cannot read approvals", e))?
            .map(|r| Approval {
                run: r.get(0),
                scope: r.get(1),
                gate: r.get(2),
                approved: r.get(3),
                comment: r.get(4),
                by: r.get(5),
                at: r.get(6),
            }))
        })
    }

    fn answer(&mut self, approval: &Approval) -> Result<()> {
        let approval = approval.clone();
        let key = write_key();
        let fence = self.fence.clone().filter(|f| f.run == approval.run);
        self.call(move |c| answer_gate(c, &approval, key, fence.as_ref()))
    }

    fn lock(&mut self, run: &str, owner: &LockOwner) -> Result<()> {
        let fence = owner.lease().map(|lease| Fence {
            run: run.to_string(),
            holder: owner.holder.clone(),
            lease,
        });
        let (run, owner) = (run.to_string(), owner.clone());
        self.call(move |c| lock_run(c, &run, &owner))?;
        if fence.is_some() {
            self.fence = fence;
        }
        Ok(())
    }

    fn renew(&mut self, run: &str, owner: &LockOwner) -> Result<()> {
        let fence = Fence {
            run: run.to_string(),
            holder: owner.holder.clone(),
            lease: owner.lease().unwrap_or(0),
        };
        self.call(move |c| {
            let fail = |e| pg("cannot renew a run's lease", e);
            let mut tx = c.transaction().map_err(fail)?;
            fenced(&mut tx, Some(&fence))?;
            tx.commit().map_err(fail)
        })
    }

    fn unlock(&mut self, run: &str, owner: &LockOwner) -> Result<()> {
        let (run, owner) = (run.to_string(), owner.clone());
        if self.fence.as_ref().is_some_and(|f| f.run == run) {
            self.fence = None;
        }
        self.call(move |c| {
            let fail = |e| pg("cannot unlock a run", e);
            let mut tx = c.transaction().map_err(fail)?;
            let released = tx
                .execute(
                    "DELETE FROM locks WHERE run = $1 AND ((holder <> '' AND holder = $2) \
                     OR (holder = '' AND pid = $3 AND host = $4))",
                    &[&run, &owner.holder, &i64::from(owner.pid), &owner.host],
                )
                .map_err(fail)?;
            if released > 0 {
                notify(&mut tx, &run).map_err(fail)?;
            }
            changed(&mut tx).map_err(fail)?;
            tx.commit().map_err(fail)
        })
    }

    fn lock_holder(&self, run: &str) -> Result<Option<LockOwner>> {
        let run = run.to_string();
        self.call(move |c| {
            Ok(c.query_opt(
                &format!("SELECT {LOCK_COLUMNS} FROM locks WHERE run = $1"),
                &[&run],
            )
            .map_err(|e| pg("cannot read locks", e))?
            .map(|r| lock_from_row(&r)))
        })
    }

    fn share(&self) -> Option<Box<dyn Store + Send>> {
        Some(Box::new(PgStore::share(self)))
    }

    fn changes(&self) -> Result<u64> {
        self.call(|c| {
            let row = c
                .query_one("SELECT last_value, is_called FROM changes", &[])
                .map_err(|e| pg("cannot read the store's changes", e))?;
            let called: bool = row.get(1);
            Ok(if called { uint(row.get(0)) } else { 0 })
        })
    }

    fn history(
        &self,
        workflow: &str,
        node: &str,
        except_run: &str,
        limit: usize,
    ) -> Result<Vec<(String, NodeRecord)>> {
        let (workflow, node, except) = (
            workflow.to_string(),
            node.to_string(),
            except_run.to_string(),
        );
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.call(move |c| {
            c.query(
                &format!(
                    "SELECT {NODE_COLUMNS} FROM nodes n JOIN runs r ON n.run = r.id \
                     WHERE r.workflow = $1 AND n.node = $2 AND r.id <> $3 \
                     ORDER BY r.started_at DESC, r.seq DESC, n.seq DESC LIMIT $4"
                ),
                &[&workflow, &node, &except, &limit],
            )
            .map_err(|e| pg("cannot read the history", e))?
            .iter()
            .map(|r| node_from_row(r).map(|n| (n.run.clone(), n)))
            .collect()
        })
    }

    fn stored_sizes(&self, runs: &[&str]) -> Result<Vec<StoredSize>> {
        self.read_stored_sizes(runs)
    }

    fn delete_run(&mut self, run: &str) -> Result<Removed> {
        self.delete_run_rows(run)
    }

    fn keeps_records(&self) -> bool {
        true
    }

    fn commit_with_records(&mut self, writes: &[Write], records: &[ArtifactRecord]) -> Result<()> {
        // Copied anyway (for the connection's thread): masked in place, whoever commits.
        let mut writes = writes.to_vec();
        writes.iter_mut().for_each(Write::redact);
        let mut records = records.to_vec();
        for r in &mut records {
            crate::secrets::redact_in_place(&mut r.text);
        }
        let key = write_key();
        let fence = self.fence.clone();
        self.call(move |c| write_all(c, &writes, &records, key, fence.as_ref()))
    }

    fn records(&self, run: &str, under: &str) -> Result<Option<Vec<(String, String)>>> {
        self.read_records(run, under)
    }

    fn events_since(&self, run: &str, after: i64) -> Result<super::Since<Event>> {
        self.read_events_since(run, after)
    }

    fn nodes_since(&self, run: &str, after: i64) -> Result<super::Since<NodeRecord>> {
        self.read_nodes_since(run, after)
    }

    fn attempts_since(&self, run: &str, after: i64) -> Result<super::Since<AttemptRecord>> {
        self.read_attempts_since(run, after)
    }
}

impl PgStore {
    /// [`Store::events_since`].
    fn read_events_since(&self, run: &str, after: i64) -> Result<super::Since<Event>> {
        let run = run.to_string();
        self.call(move |c| {
            since(
                c,
                "events",
                "SELECT run, at, scope, node, kind, message, seq FROM events \
                 WHERE run = $1 AND tx >= $2 AND tx < $3 ORDER BY seq",
                &run,
                after,
                |r| Ok((r.get(6), event_from_row(r))),
            )
        })
    }

    /// [`Store::nodes_since`].
    fn read_nodes_since(&self, run: &str, after: i64) -> Result<super::Since<NodeRecord>> {
        let run = run.to_string();
        self.call(move |c| {
            since(
                c,
                "nodes",
                &format!(
                    "SELECT {NODE_COLUMNS}, n.seq FROM nodes n \
                     WHERE n.run = $1 AND n.tx >= $2 AND n.tx < $3 ORDER BY n.seq"
                ),
                &run,
                after,
                |r| Ok((r.get(15), node_from_row(r)?)),
            )
        })
    }

    /// [`Store::attempts_since`]: numbered by the transaction that last wrote each.
    fn read_attempts_since(&self, run: &str, after: i64) -> Result<super::Since<AttemptRecord>> {
        let run = run.to_string();
        self.call(move |c| {
            since(
                c,
                "attempts",
                &format!(
                    "SELECT {ATTEMPT_COLUMNS}, tx FROM attempts \
                     WHERE run = $1 AND tx >= $2 AND tx < $3 ORDER BY tx, started_at, scope, \
                     node, attempt"
                ),
                &run,
                after,
                |r| Ok((r.get(15), attempt_from_row(r)?)),
            )
        })
    }
}

impl SharedStore for PgStore {
    fn handle(&self) -> Box<dyn SharedStore> {
        Box::new(self.share())
    }

    fn fenced(&self, run: &str, owner: &LockOwner) -> Box<dyn Store + Send> {
        Box::new(PgStore::fenced(self, run, owner))
    }

    fn listen(
        &self,
        stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
        wake: crate::store::Wake,
    ) -> Result<std::thread::JoinHandle<()>> {
        queue::listen(&self.url, stop, wake)
    }

    fn into_store(self: Box<Self>) -> Box<dyn Store + Send> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_their_password() {
        let s = shown("postgres://ana:s3cret-pw@db.example:6543/runs");
        assert_eq!(s, "postgres://ana@db.example:6543/runs");
        assert!(!shown("host=/tmp user=x password=hunter22 dbname=d").contains("hunter22"));
    }
}
