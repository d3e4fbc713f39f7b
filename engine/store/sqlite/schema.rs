//! The schema: its tables, and the migrations that bring an older file up to
//! [`SCHEMA_VERSION`] (versioned with `PRAGMA user_version`).

use rusqlite::TransactionBehavior;

use super::{SqliteStore, sql_error};
use crate::store::{Result, StoreError};

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = 8;

/// The oldest schema version a read-only store of this build reads as it is (without
/// bringing it up to date, which needs a store that can be written): version 5 lacks the
/// count of calls that reported no usage, read as 0, and versions 5 and 6 the identity of a
/// lock's holder, read as unknown.
pub(super) const OLDEST_READABLE: i64 = 5;

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

-- Version 3 replaces it (NODES_V3).
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

/// Version 3: `nodes` without a rowid, its write order in `seq` (the old rowid). Version 5
/// rebuilds it again (NODE_EVENTS_V5).
const NODES_V3: &str = "
CREATE TABLE nodes_v3 (
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
    seq           INTEGER NOT NULL, -- write order within the run; a re-settled node moves last
    PRIMARY KEY (run, scope, node)
) WITHOUT ROWID;
INSERT INTO nodes_v3 SELECT run, scope, node, state, output, output_blob, action, feedback,
    attempts, input_tokens, output_tokens, cached_tokens, cost_usd, started_at, finished_at,
    rowid FROM nodes;
DROP TABLE nodes;
ALTER TABLE nodes_v3 RENAME TO nodes;
";

/// Version 5: a stage's settlement event kept in its node row. `event` is the event's
/// message, or NULL when the row holds none; the event's number is the row's `seq` (nodes and
/// events are numbered by one count from now on), its time `finished_at` and its kind
/// `state`. The table is rebuilt so that the columns a read of events needs come before the
/// output: a column after a long output is reached only through the output's overflow pages.
/// Its triggers are [`NODE_EVENT_TRIGGERS`]. Version 6 rebuilds the table again (NODES_V6).
const NODE_EVENTS_V5: &str = "
CREATE TABLE nodes_v5 (
    run           TEXT NOT NULL,
    scope         TEXT NOT NULL,
    node          TEXT NOT NULL,
    seq           INTEGER NOT NULL, -- its number in the run (events and nodes share the count)
    state         TEXT NOT NULL,
    finished_at   INTEGER NOT NULL,
    event         TEXT,             -- the message of its settlement event, if the row has it
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
    PRIMARY KEY (run, scope, node)
) WITHOUT ROWID;
INSERT INTO nodes_v5 (run, scope, node, seq, state, finished_at, output, output_blob, action,
    feedback, attempts, input_tokens, output_tokens, cached_tokens, cost_usd, started_at)
SELECT run, scope, node, seq, state, finished_at, output, output_blob, action, feedback,
    attempts, input_tokens, output_tokens, cached_tokens, cost_usd, started_at FROM nodes;
DROP TABLE nodes;
ALTER TABLE nodes_v5 RENAME TO nodes;
";

/// Version 6: the count of calls that reported no usage (`unreported`), in `nodes` and in
/// `attempts`. An added column goes at the end of a row, which in `nodes` is after the
/// output: reached only through a long output's overflow pages. So `nodes` is rebuilt (as
/// version 5 did) with every column but the texts before the output: its number and event,
/// then the attempts and the usage, then the output, the action and the feedback. The
/// triggers of version 5 go with the old table ([`NODE_EVENT_TRIGGERS`] makes them again). In
/// `attempts` the column joins the usage at the end (`error`, the one long text there, is
/// already before it).
const NODES_V6: &str = "
CREATE TABLE nodes_v6 (
    run           TEXT NOT NULL,
    scope         TEXT NOT NULL,
    node          TEXT NOT NULL,
    seq           INTEGER NOT NULL, -- its number in the run (events and nodes share the count)
    state         TEXT NOT NULL,
    finished_at   INTEGER NOT NULL,
    event         TEXT,             -- the message of its settlement event, if the row has it
    attempts      INTEGER NOT NULL,
    input_tokens  INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    cost_usd      REAL,
    unreported    INTEGER NOT NULL DEFAULT 0, -- calls that reported no usage
    started_at    INTEGER NOT NULL,
    output        TEXT,             -- JSON text, or NULL when spilled
    output_blob   TEXT,             -- SHA-256 of the spilled JSON text
    action        TEXT,
    feedback      TEXT,
    PRIMARY KEY (run, scope, node)
) WITHOUT ROWID;
INSERT INTO nodes_v6 (run, scope, node, seq, state, finished_at, event, attempts,
    input_tokens, output_tokens, cached_tokens, cost_usd, started_at, output, output_blob,
    action, feedback)
SELECT run, scope, node, seq, state, finished_at, event, attempts, input_tokens,
    output_tokens, cached_tokens, cost_usd, started_at, output, output_blob, action,
    feedback FROM nodes;
DROP TABLE nodes;
ALTER TABLE nodes_v6 RENAME TO nodes;
ALTER TABLE attempts ADD COLUMN unreported INTEGER NOT NULL DEFAULT 0;
";

/// The triggers of `nodes` since version 5: they move a row's settlement event into
/// `events`, number and all, before the row is updated (a stage settled again in the same
/// scope) or deleted, so that no event is lost. A table's triggers go when it is dropped, so
/// they are made once the table is in its last shape: after the last version that rebuilds
/// it ([`NODES_REBUILT`]).
const NODE_EVENT_TRIGGERS: &str = "
CREATE TRIGGER nodes_keep_event_on_update BEFORE UPDATE ON nodes WHEN OLD.event IS NOT NULL
BEGIN
    INSERT INTO events (run, seq, at, scope, node, kind, message)
    VALUES (OLD.run, OLD.seq, OLD.finished_at, OLD.scope, OLD.node, OLD.state, OLD.event);
END;
CREATE TRIGGER nodes_keep_event_on_delete BEFORE DELETE ON nodes WHEN OLD.event IS NOT NULL
BEGIN
    INSERT INTO events (run, seq, at, scope, node, kind, message)
    VALUES (OLD.run, OLD.seq, OLD.finished_at, OLD.scope, OLD.node, OLD.state, OLD.event);
END;
";

/// Version 8: each attempt's last write numbered (`seq`, from the count that numbers the
/// run's events and nodes, so one write lock orders them all), and `nodes` and `attempts`
/// indexed by their number: [`Store::nodes_since`](crate::store::Store::nodes_since) and
/// [`Store::attempts_since`](crate::store::Store::attempts_since) read only what changed. An
/// attempt of an older version reads as number 0, written before any position.
const ATTEMPT_SEQ_V8: &str = "
ALTER TABLE attempts ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
CREATE INDEX attempts_seq ON attempts (run, seq);
CREATE INDEX nodes_seq ON nodes (run, seq);
";

/// The schema version that numbered attempts ([`ATTEMPT_SEQ_V8`]): a store of an older
/// version opened read-only gives every attempt to each `attempts_since`.
pub(super) const ATTEMPT_SEQ_SINCE: i64 = 8;

/// The last schema version that rebuilds `nodes` (and so drops its triggers).
const NODES_REBUILT: i64 = 6;

/// The schema version that added the count of calls that reported no usage (`unreported`,
/// in `nodes` and `attempts`): a store of an older version opened read-only reads it as 0.
pub(super) const UNREPORTED_SINCE: i64 = 6;

/// The schema version that added the identity of a lock's holder (`started`, `boot`,
/// `pidns` in `locks`): a store of an older version opened read-only reads it as unknown.
pub(super) const IDENTITY_SINCE: i64 = 7;

impl SqliteStore {
    /// Brings the schema up to [`SCHEMA_VERSION`], one version at a time, in one transaction
    /// (so two processes opening a new file at once do not both create it).
    pub(super) fn migrate(&mut self) -> Result<()> {
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
            return Err(StoreError::Version(format!(
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
        if version < 3 {
            // Nodes in one B-tree keyed by (run, scope, node), without a rowid and so without
            // the separate key index: a settlement writes one page less. Their write order,
            // which was the rowid, is `seq`.
            tx.execute_batch(NODES_V3).map_err(fail)?;
        }
        if version < 4 {
            // Leases: the holder's unique id and when its lease ends (see store::LockOwner).
            tx.execute_batch(
                "ALTER TABLE locks ADD COLUMN holder TEXT NOT NULL DEFAULT '';
                 ALTER TABLE locks ADD COLUMN expires INTEGER;",
            )
            .map_err(fail)?;
        }
        if version < 5 {
            // A settlement's event in its node row: one B-tree leaf less per settlement; the
            // table rebuilt with the columns of events before the output (NODE_EVENTS_V5).
            tx.execute_batch(NODE_EVENTS_V5).map_err(fail)?;
        }
        if version < 6 {
            // The calls that reported no usage, counted in nodes and attempts; `nodes`
            // rebuilt so that the column is not behind the output (NODES_V6).
            tx.execute_batch(NODES_V6).map_err(fail)?;
        }
        if version < 7 {
            // Who a lock's holder process is (its start time, the boot id, its PID
            // namespace): a holder provably gone is taken over before its lease ends (see
            // store::LockOwner::lapsed). NULL in the locks of older versions: unknown.
            tx.execute_batch(
                "ALTER TABLE locks ADD COLUMN started INTEGER;
                 ALTER TABLE locks ADD COLUMN boot TEXT;
                 ALTER TABLE locks ADD COLUMN pidns INTEGER;",
            )
            .map_err(fail)?;
        }
        if version < ATTEMPT_SEQ_SINCE {
            // What changed since a position (Store::nodes_since, attempts_since): an
            // attempt's last write numbered by the run's count of events and nodes, and both
            // tables indexed by that number (a monitor reads what changed, not the run).
            tx.execute_batch(ATTEMPT_SEQ_V8).map_err(fail)?;
        }
        // A later version adds `if version < 9 { ... }` here (and, if it rebuilds `nodes`,
        // moves NODES_REBUILT to it).
        if version < NODES_REBUILT {
            // Made once `nodes` has its last shape: on a store at version 4 or older, after
            // both rebuilds above; on a store at version 5, again after version 6 dropped
            // them with the old table. Either way the store ends as a new one.
            tx.execute_batch(NODE_EVENT_TRIGGERS).map_err(fail)?;
        }
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(fail)?;
        tx.commit().map_err(fail)
    }
}
