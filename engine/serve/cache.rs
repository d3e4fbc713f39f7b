//! The monitor's copy of the runs it shows, kept up to date with what changed: a refresh
//! reads a run's nodes, attempts and events written since its last one
//! ([`Store::nodes_since`], [`Store::attempts_since`], [`Store::events_since`]) and applies
//! them, instead of reading the whole run again (O(size) per change). The run's row, its
//! waiting gates and its lock are read afresh each time (a row each). What it holds equals a
//! fresh read of the run: `tests` below compare the two after random changes.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::store::{AttemptRecord, Event, NodeRecord, Since, Store, StoreError};

/// A run's records, in the order a full read gives them: nodes by their number (a run's write
/// order; a node settled again moves last), attempts by start, scope, stage and attempt,
/// events by their number. Shared with the pages being rendered ([`Arc`]): a refresh changes
/// it in place unless a page still reads the last one.
#[derive(Clone, Debug, Default)]
pub(super) struct Records {
    /// Every settled node, the executor's own (`@...`) too.
    pub nodes: Vec<NodeRecord>,
    /// The number of each node, in `nodes`' order (rising).
    node_seq: Vec<i64>,
    pub attempts: Vec<AttemptRecord>,
    pub events: Vec<Event>,
    /// The number of each event, in `events`' order (rising).
    event_seq: Vec<i64>,
}

/// Where a full read puts an attempt.
fn attempt_order(a: &AttemptRecord) -> (i64, &str, &str, u32) {
    (a.started_at, &a.scope, &a.node, a.attempt)
}

impl Records {
    /// The records of a full read ([`Store::nodes`], [`Store::attempts`], [`Store::events`]),
    /// numbered by their place: what the copy must equal.
    #[cfg(test)]
    pub(super) fn read(store: &dyn Store, run: &str) -> Result<Records, StoreError> {
        let nodes = store.nodes(run)?;
        let events = store.events(run, None)?;
        Ok(Records {
            node_seq: (0..).take(nodes.len()).collect(),
            nodes,
            attempts: store.attempts(run, None)?,
            event_seq: (0..).take(events.len()).collect(),
            events,
        })
    }

    /// Applies nodes written since: each replaces the node of the same scope and name, at
    /// its new number.
    fn apply_nodes(&mut self, index: &mut HashMap<(String, String), i64>, new: Since<NodeRecord>) {
        for (seq, n) in new.records {
            let key = (n.scope.clone(), n.node.clone());
            if let Some(old) = index.insert(key, seq)
                && let Ok(at) = self.node_seq.binary_search(&old)
            {
                self.node_seq.remove(at);
                self.nodes.remove(at);
            }
            let at = self.node_seq.partition_point(|s| *s < seq);
            self.node_seq.insert(at, seq);
            self.nodes.insert(at, n);
        }
    }

    /// Applies attempts written since: each replaces the attempt of the same key.
    fn apply_attempts(
        &mut self,
        index: &mut HashMap<(String, String, u32), i64>,
        new: Since<AttemptRecord>,
    ) {
        for (_, a) in new.records {
            let key = (a.scope.clone(), a.node.clone(), a.attempt);
            if let Some(started) = index.insert(key, a.started_at) {
                let old = (started, a.scope.as_str(), a.node.as_str(), a.attempt);
                if let Ok(at) = self
                    .attempts
                    .binary_search_by(|x| attempt_order(x).cmp(&old))
                {
                    self.attempts.remove(at);
                }
            }
            let at = self
                .attempts
                .partition_point(|x| attempt_order(x) < attempt_order(&a));
            self.attempts.insert(at, a);
        }
    }

    /// Applies events written since, each at its number (after the others but for a store
    /// whose concurrent writers commit out of order).
    fn apply_events(&mut self, new: Since<Event>) {
        for (seq, e) in new.records {
            match self.event_seq.binary_search(&seq) {
                Ok(at) => self.events[at] = e,
                Err(at) => {
                    self.event_seq.insert(at, seq);
                    self.events.insert(at, e);
                }
            }
        }
    }
}

/// One run's copy: its records and where each kind was read up to.
#[derive(Default)]
struct RunCopy {
    records: Arc<Records>,
    /// The run's start: a run of the same id started again (a store replaced) is read anew.
    started_at: i64,
    nodes_at: i64,
    attempts_at: i64,
    events_at: i64,
    node_index: HashMap<(String, String), i64>,
    attempt_index: HashMap<(String, String, u32), i64>,
}

/// The copies of the runs last shown, the least recently shown dropped first.
#[derive(Default)]
pub(super) struct Copies {
    runs: HashMap<String, RunCopy>,
    /// Run ids, most recently shown last.
    order: VecDeque<String>,
}

/// How many runs are kept (the pages people have open, give or take).
const KEPT: usize = 16;

/// Which kinds of records a refresh reads.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kinds {
    All,
    Events,
}

impl Copies {
    /// The run's records brought up to date with what the store wrote since the last
    /// refresh (all of them the first time). `started_at` is the run's, from its row.
    pub(super) fn refresh(
        &mut self,
        store: &dyn Store,
        run: &str,
        started_at: i64,
        kinds: Kinds,
    ) -> Result<Arc<Records>, StoreError> {
        self.order.retain(|r| r != run);
        self.order.push_back(run.to_string());
        while self.order.len() > KEPT {
            if let Some(old) = self.order.pop_front() {
                self.runs.remove(&old);
            }
        }
        let copy = self.runs.entry(run.to_string()).or_default();
        if copy.started_at != started_at {
            *copy = RunCopy {
                started_at,
                ..RunCopy::default()
            };
        }
        let events = store.events_since(run, copy.events_at)?;
        let (nodes, attempts) = if kinds == Kinds::All {
            (
                Some(store.nodes_since(run, copy.nodes_at)?),
                Some(store.attempts_since(run, copy.attempts_at)?),
            )
        } else {
            (None, None)
        };
        let records = Arc::make_mut(&mut copy.records);
        copy.events_at = events.next;
        records.apply_events(events);
        if let Some(nodes) = nodes {
            copy.nodes_at = nodes.next;
            records.apply_nodes(&mut copy.node_index, nodes);
        }
        if let Some(attempts) = attempts {
            copy.attempts_at = attempts.next;
            records.apply_attempts(&mut copy.attempt_index, attempts);
        }
        Ok(copy.records.clone())
    }

    /// Forgets a run (it is not in the store).
    pub(super) fn forget(&mut self, run: &str) {
        self.runs.remove(run);
        self.order.retain(|r| r != run);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::view;
    use crate::store::{
        AttemptState, Location, NodeState, OpenOptions, RunRecord, RunStatus, Usage, Write,
    };

    fn run_record(id: &str) -> RunRecord {
        RunRecord {
            id: id.into(),
            workflow: "w".into(),
            file: "w.toml".into(),
            workflow_hash: String::new(),
            params: serde_json::json!({}),
            status: RunStatus::Running,
            exit: None,
            started_at: 1,
            updated_at: 1,
            dir: "/nonexistent".into(),
            options: serde_json::json!({}),
        }
    }

    /// A small deterministic generator (xorshift), so a failure can be replayed.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// Random writes of the kinds an executor and `approve` make: attempts started and
    /// ended (written twice), nodes settled and settled again (a loop's stage in the same
    /// scope on a resume), settlement events that the node's row keeps, other events.
    fn random_writes(rng: &mut Rng, run: &str, clock: &mut i64) -> Vec<Write> {
        let mut writes = Vec::new();
        for _ in 0..=rng.below(4) {
            *clock += 1 + i64::try_from(rng.below(3)).unwrap_or(0);
            let scope = format!("loop#{}", rng.below(4));
            let node = format!("s{}", rng.below(3));
            let attempt = u32::try_from(rng.below(3)).unwrap_or(0) + 1;
            match rng.below(4) {
                0 | 1 => {
                    let ended = rng.below(2) == 0;
                    writes.push(Write::Attempt(AttemptRecord {
                        run: run.into(),
                        scope,
                        node,
                        attempt,
                        state: if ended {
                            AttemptState::Ok
                        } else {
                            AttemptState::Running
                        },
                        agent: None,
                        dir: String::new(),
                        error: None,
                        usage: Usage {
                            input_tokens: rng.below(100),
                            ..Usage::default()
                        },
                        started_at: *clock - i64::try_from(rng.below(2)).unwrap_or(0),
                        finished_at: ended.then_some(*clock),
                    }));
                }
                2 => {
                    let state = if rng.below(3) == 0 {
                        NodeState::Failed
                    } else {
                        NodeState::Done
                    };
                    // Its settlement event first: the row keeps it.
                    writes.push(Write::Event(Event {
                        run: run.into(),
                        at: *clock,
                        scope: scope.clone(),
                        node: node.clone(),
                        kind: state.as_str().into(),
                        message: format!("settled at {clock}"),
                    }));
                    writes.push(Write::Node(NodeRecord {
                        run: run.into(),
                        scope,
                        node,
                        state,
                        output: serde_json::json!({ "at": *clock }),
                        action: None,
                        feedback: None,
                        attempts: attempt,
                        usage: Usage::default(),
                        started_at: *clock - 1,
                        finished_at: *clock,
                    }));
                }
                _ => writes.push(Write::Event(Event {
                    run: run.into(),
                    at: *clock,
                    scope,
                    node,
                    kind: "retry".into(),
                    message: format!("event at {clock}"),
                })),
            }
        }
        writes
    }

    fn same(copy: &Records, fresh: &Records) {
        assert_eq!(copy.nodes, fresh.nodes);
        assert_eq!(copy.attempts, fresh.attempts);
        assert_eq!(copy.events, fresh.events);
    }

    #[test]
    fn a_copy_kept_up_to_date_equals_a_fresh_read_after_random_changes() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        // The state directory's store, as the monitor opens it.
        let location = Location::StateDir(dir.path().to_path_buf());
        let open = || {
            location
                .open(&OpenOptions::default())
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let mut store = open();
        // Another connection writes too (an `approve` from another terminal).
        let mut other = open();
        for id in ["r", "s"] {
            store
                .create_run(&run_record(id))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let mut copies = Copies::default();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut clock = 10;
        for round in 0..300 {
            let run = if rng.below(5) == 0 { "s" } else { "r" };
            let writes = random_writes(&mut rng, run, &mut clock);
            let writer = if rng.below(4) == 0 {
                &mut other
            } else {
                &mut store
            };
            writer.commit(&writes).unwrap_or_else(|e| panic!("{e}"));
            if rng.below(3) == 0 {
                continue;
            }
            let copy = copies
                .refresh(store.as_ref(), "r", 1, Kinds::All)
                .unwrap_or_else(|e| panic!("{e}"));
            let fresh = Records::read(store.as_ref(), "r").unwrap_or_else(|e| panic!("{e}"));
            same(&copy, &fresh);
            assert!(
                round < 20 || !copy.nodes.is_empty(),
                "the test writes nodes"
            );
            if round % 10 == 0 {
                // The page made from the copy is the page made from a fresh read.
                let page = |d: Option<view::RunDetail>| {
                    let mut v = serde_json::to_value(d.unwrap_or_else(|| panic!("no run")))
                        .unwrap_or_else(|e| panic!("{e}"));
                    // Counted to now: not the same twice.
                    v["summary"]["duration"] = serde_json::Value::Null;
                    v["summary"]["duration_ms"] = serde_json::Value::Null;
                    v
                };
                let fresh = view::run(store.as_mut(), "r");
                let kept = view::run_from(store.as_mut(), &mut copies, "r");
                assert_eq!(
                    page(fresh.unwrap_or_else(|e| panic!("{e}"))),
                    page(kept.unwrap_or_else(|e| panic!("{e}")))
                );
            }
        }
        let copy = copies
            .refresh(store.as_ref(), "s", 1, Kinds::All)
            .unwrap_or_else(|e| panic!("{e}"));
        same(
            &copy,
            &Records::read(store.as_ref(), "s").unwrap_or_else(|e| panic!("{e}")),
        );
    }
}
