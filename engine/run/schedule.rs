//! The scheduler of a body: starts each node once what it needs has settled, decides
//! whether it runs or is skipped, and records each settlement.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::LocalBoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use petgraph::Direction;
use petgraph::graph::NodeIndex;
use petgraph::visit::EdgeRef;
use serde_json::Value as Json;

use super::exec::*;
use super::frame::*;
use super::now_ms;
use crate::compile::NodeId;
use crate::compile::{Body, Edge, Target};
use crate::model::StageKind;
use crate::store::{NodeRecord, NodeState, Write};

/// Where a node of a body's graph is, for its scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Pending,
    Running,
    Ran,
    Failed,
    Skipped,
    Waiting,
}

/// The countdown of a body's graph: each node's state, how many nodes it still waits on
/// (its incoming edges not settled yet), and the nodes ready to start, by topological rank.
struct Countdown<'b> {
    body: &'b Body,
    state: Vec<Slot>,
    waits: Vec<usize>,
    ready: BinaryHeap<Reverse<(usize, NodeIndex)>>,
}

impl<'b> Countdown<'b> {
    fn new(body: &'b Body) -> Self {
        let g = &body.graph;
        let waits: Vec<usize> = g
            .node_indices()
            .map(|ix| g.edges_directed(ix, Direction::Incoming).count())
            .collect();
        let ready = g
            .node_indices()
            .filter(|ix| waits[ix.index()] == 0)
            .map(|ix| Reverse((body.rank[ix.index()], ix)))
            .collect();
        Countdown {
            body,
            state: vec![Slot::Pending; g.node_count()],
            waits,
            ready,
        }
    }

    /// The ready node of lowest rank.
    fn next_ready(&mut self) -> Option<NodeIndex> {
        self.ready.pop().map(|Reverse((_, ix))| ix)
    }

    fn state(&self, ix: NodeIndex) -> Slot {
        self.state[ix.index()]
    }

    /// Sets a state that settles nothing (running, waiting, stopped).
    fn set(&mut self, ix: NodeIndex, ns: Slot) {
        self.state[ix.index()] = ns;
    }

    /// Marks a node settled and makes ready the successors that waited only on it.
    fn settle(&mut self, ix: NodeIndex, ns: Slot) {
        self.state[ix.index()] = ns;
        for e in self.body.graph.edges_directed(ix, Direction::Outgoing) {
            let t = e.target();
            self.waits[t.index()] -= 1;
            if self.waits[t.index()] == 0 {
                self.ready.push(Reverse((self.body.rank[t.index()], t)));
            }
        }
    }
}

impl Exec<'_> {
    /// Runs a body to its end.
    ///
    /// Each node counts the nodes it waits on (its incoming edges); a settlement counts down
    /// its successors, and those that reach zero become ready. Ready nodes start in the
    /// body's topological order. So the work per settlement is its out-degree, whatever the
    /// size of the body.
    pub(super) fn run_body<'s>(&'s self, frame: &'s Frame<'s>) -> LocalBoxFuture<'s, BodyEnd> {
        async move {
            let body = self.plan.body(frame.region);
            let g = &body.graph;
            let mut graph = Countdown::new(body);
            let mut chosen: HashSet<NodeId> = HashSet::new();
            let mut ending: Option<BodyEnd> = None;
            let mut waiting = false;
            let mut running: FuturesUnordered<LocalBoxFuture<'s, (NodeId, Outcome)>> =
                FuturesUnordered::new();
            loop {
                while ending.is_none() && !self.halted() {
                    let Some(ix) = graph.next_ready() else {
                        break;
                    };
                    let n = g[ix];
                    self.shared.count(|w| w.scheduled += 1);
                    let mut needs_ran = Vec::new();
                    let mut routed = false;
                    for e in g.edges_directed(ix, Direction::Incoming) {
                        match e.weight() {
                            Edge::Needs => needs_ran.push(match graph.state(e.source()) {
                                Slot::Ran => true,
                                // An optional stage's skip counts as done.
                                Slot::Skipped => {
                                    self.plan.stage(g[e.source()]).keys().is_optional()
                                }
                                _ => false,
                            }),
                            Edge::Route(_) => routed = true,
                        }
                    }
                    match self.decide(frame, n, &needs_ran, routed, &chosen) {
                        Ok(true) => {
                            graph.set(ix, Slot::Running);
                            running.push(self.run_node(frame, n));
                        }
                        Ok(false) => {
                            let s = Settled::new(NodeState::Skipped, Json::Null, now_ms());
                            self.settle(frame, n, &s);
                            graph.settle(ix, Slot::Skipped);
                        }
                        Err(e) => {
                            let node = self.plan.node(n).name.clone();
                            let s =
                                Settled::failed(Json::Null, e.message(), Target::Fail, now_ms());
                            self.settle(frame, n, &s);
                            graph.settle(ix, Slot::Failed);
                            ending.get_or_insert(BodyEnd::Failed {
                                node,
                                message: s.message.unwrap_or_default(),
                                feedback: s.feedback,
                                infra: true,
                            });
                        }
                    }
                }
                let Some((n, outcome)) = self.next_settled(&mut running).await else {
                    break;
                };
                let mut done = vec![(n, outcome)];
                while let Some(Some(more)) = running.next().now_or_never() {
                    done.push(more);
                }
                for (n, outcome) in done {
                    let ix = self.plan.node(n).local;
                    match outcome {
                        Outcome::Settled(s) => {
                            self.settle(frame, n, &s);
                            let ns = match s.state {
                                NodeState::Done => Slot::Ran,
                                NodeState::Skipped => Slot::Skipped,
                                NodeState::Failed | NodeState::TimedOut => Slot::Failed,
                            };
                            graph.settle(ix, ns);
                            let node = self.plan.node(n).name.clone();
                            match s.action {
                                None => {}
                                Some(Target::Stage(t)) => {
                                    chosen.insert(t);
                                }
                                Some(Target::Continue) => {
                                    ending.get_or_insert(BodyEnd::Continue(s.feedback));
                                }
                                Some(Target::Break) => {
                                    ending.get_or_insert(BodyEnd::Break);
                                }
                                Some(Target::Exit(i)) => {
                                    self.take_exit(i);
                                    ending.get_or_insert(BodyEnd::Exit(i));
                                }
                                Some(Target::Fail | Target::Reject) => {
                                    if frame.parent.is_none() && self.prefix.is_empty() {
                                        // A failure at the top level ends the run.
                                        let _ = self.stop.send(true);
                                    }
                                    ending.get_or_insert(BodyEnd::Failed {
                                        node,
                                        message: s.message.unwrap_or_else(|| "failed".into()),
                                        feedback: s.feedback,
                                        infra: s.infra,
                                    });
                                }
                                Some(Target::Approve) => {}
                            }
                        }
                        Outcome::Waiting => {
                            graph.set(ix, Slot::Waiting);
                            waiting = true;
                        }
                        Outcome::Stopped => {
                            graph.set(ix, Slot::Skipped);
                            ending.get_or_insert(BodyEnd::Stopped);
                        }
                    }
                }
            }
            // What the body settled last is durable before its end is reported (grouped
            // with what the bodies running beside it settle).
            self.shared.durable().await;
            if self.halted() && ending.is_none() {
                return match self.exit.get() {
                    Some(i) => BodyEnd::Exit(i),
                    None => BodyEnd::Stopped,
                };
            }
            match ending {
                Some(e) => e,
                None if waiting => BodyEnd::Waiting,
                None => BodyEnd::Completed,
            }
        }
        .boxed_local()
    }

    /// Waits for the next node of a body to settle. What the scheduler queued (settlements,
    /// skips) is committed before anything new starts: the nodes just started run up to
    /// their own commit (an attempt's start), and the first commit of the round takes every
    /// queued write, so a chain costs one commit per stage.
    async fn next_settled<'s>(
        &self,
        running: &mut FuturesUnordered<LocalBoxFuture<'s, (NodeId, Outcome)>>,
    ) -> Option<(NodeId, Outcome)> {
        if !self.shared.has_pending() {
            return running.next().await;
        }
        tokio::select! {
            biased;
            next = running.next() => next,
            () = self.shared.durable() => running.next().await,
        }
    }

    /// Decides whether a ready node runs (`true`) or is skipped.
    pub(super) fn decide(
        &self,
        frame: &Frame<'_>,
        n: NodeId,
        needs_ran: &[bool],
        routed: bool,
        chosen: &HashSet<NodeId>,
    ) -> Result<bool, StageError> {
        if let Some(rec) = self.shared.resumed.borrow().get(&self.key(frame, n)) {
            return Ok(rec.state != NodeState::Skipped);
        }
        if routed {
            if !chosen.contains(&n) {
                return Ok(false);
            }
        } else if !needs_ran.is_empty() && !needs_ran.iter().any(|r| *r) {
            return Ok(false);
        }
        // Escalation rules and `when` are expressions, evaluated like every other one; the
        // context is built once, and only when there is something to evaluate.
        let rules: Vec<&str> = match self.plan.node(n).parent {
            Some(p) => self
                .plan
                .node(p)
                .escalations()
                .iter()
                .filter(|(_, targets)| targets.contains(&n))
                .map(|(cond, _)| cond.as_str())
                .collect(),
            None => Vec::new(),
        };
        let when = self.plan.stage(n).keys().when.as_ref();
        if rules.is_empty() && when.is_none() {
            return Ok(true);
        }
        let ctx = self.context(frame, &[]);
        if !rules.is_empty() {
            let mut any = false;
            for r in rules {
                let v = self.eval(r, &ctx).map_err(|source| StageError::Condition {
                    what: "an escalation rule",
                    source,
                })?;
                if v.is_true() {
                    any = true;
                    break;
                }
            }
            if !any {
                return Ok(false);
            }
        }
        if let Some(w) = when {
            let v = self
                .eval(&w.value, &ctx)
                .map_err(|source| StageError::Condition {
                    what: "its `when`",
                    source,
                })?;
            if !v.is_true() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Records a settled node: in the frame (for templates) and in the store.
    pub(super) fn settle(&self, frame: &Frame<'_>, n: NodeId, s: &Settled) {
        self.shared.count(|w| w.settled += 1);
        let name = self.plan.node(n).name.clone();
        let scope = self.scope(frame);
        let mut view = View::new(
            &s.output,
            s.state,
            s.feedback.as_deref(),
            s.attempts,
            s.usage.clone(),
        );
        if view.is_long() {
            if s.resumed {
                // Committed by an earlier executor of the run.
                view.leave_to_store(&scope, &name, &self.shared.outputs);
                self.shared.count(|w| w.outputs_in_store += 1);
            } else {
                // Once its commit is done (`Shared::flush`).
                self.shared.to_store.borrow_mut().push((
                    Arc::downgrade(&frame.outputs),
                    scope.clone(),
                    name.clone(),
                ));
            }
        }
        frame.outputs.borrow().insert(name.clone(), view);
        if s.resumed {
            tracing::debug!(scope = %scope, stage = %name, state = s.state.as_str(), "settled earlier (resume)");
            return;
        }
        tracing::debug!(scope = %scope, stage = %name, state = s.state.as_str(), action = ?s.action, "settled");
        let finished = now_ms();
        self.shared.progress.settled(
            &scope,
            &name,
            s.state,
            Duration::from_millis(u64::try_from(finished - s.started_at).unwrap_or(0)),
            &s.usage,
            s.message.as_deref(),
        );
        let msg = match (&s.message, &s.action) {
            (Some(m), _) => m.clone(),
            (None, Some(a)) => format!("then {}", self.action_text(a)),
            (None, None) => String::new(),
        };
        self.shared
            .event_at(&scope, &name, s.state.as_str(), msg, finished);
        if let Some(t) = &self.shared.trace {
            t.stage(
                &scope,
                &name,
                self.plan.node(n).kind.as_str(),
                s.state,
                (s.started_at, finished),
                s.attempts,
                &s.usage,
                s.action.as_ref().map(|a| self.action_text(a)).as_deref(),
            );
        }
        self.shared.write(Write::Node(NodeRecord {
            run: self.shared.run.id.clone(),
            scope,
            node: name,
            state: s.state,
            output: s.output.clone(),
            action: s.action.as_ref().map(|a| self.action_text(a)),
            feedback: s.feedback.clone(),
            attempts: s.attempts,
            usage: s.usage.clone(),
            started_at: s.started_at,
            finished_at: finished,
        }));
    }

    /// The store key of a node in a frame: (scope, stage).
    pub(super) fn key(&self, frame: &Frame<'_>, n: NodeId) -> (String, String) {
        (self.scope(frame), self.plan.node(n).name.clone())
    }

    /// Returns a settled node from an earlier attempt at the run, if there is one. The
    /// record is taken: the node settles from it once, and its view holds it from then on
    /// (a resume of 10,000 settled stages held both).
    pub(super) fn resumed(&self, frame: &Frame<'_>, n: NodeId) -> Option<Settled> {
        let mut map = self.shared.resumed.borrow_mut();
        let rec = map.remove(&self.key(frame, n))?;
        // The table gives back its room as it empties (a quarter full: halved).
        if map.capacity() > 64 && map.len() * 4 < map.capacity() {
            map.shrink_to_fit();
        }
        drop(map);
        self.settled_from(&rec)
    }

    /// Turns a stored record into a settlement.
    pub(super) fn settled_from(&self, rec: &super::frame::Resumed) -> Option<Settled> {
        let action = match &rec.action {
            Some(a) => Some(self.parse_action(a)?),
            None => None,
        };
        Some(Settled {
            state: rec.state,
            output: rec.output(),
            action,
            feedback: rec.feedback.as_deref().map(String::from),
            message: None,
            attempts: rec.attempts,
            usage: rec.usage.clone(),
            started_at: rec.started_at,
            resumed: true,
            infra: false,
        })
    }

    /// Runs one node to its settlement.
    pub(super) fn run_node<'s>(
        &'s self,
        frame: &'s Frame<'s>,
        n: NodeId,
    ) -> LocalBoxFuture<'s, (NodeId, Outcome)> {
        async move {
            let kind = self.plan.node(n).kind;
            // A run that is stopping (a failed commit, Ctrl-C, an exit) starts nothing new.
            if self.halted() {
                return (n, Outcome::Stopped);
            }
            if !kind.is_region() {
                if let Some(s) = self.resumed(frame, n) {
                    return (n, Outcome::Settled(s));
                }
            }
            let work = async {
                match kind {
                    StageKind::Loop => self.run_loop(frame, n).await,
                    StageKind::ForEach => self.run_for_each(frame, n).await,
                    StageKind::Group => self.run_group(frame, n).await,
                    StageKind::Subflow => self.run_subflow(frame, n).await,
                    StageKind::Gate => self.run_gate(frame, n).await,
                    _ => self.run_leaf(frame, n).await,
                }
            };
            let outcome = if kind.is_region() {
                work.await
            } else {
                tokio::select! {
                    biased;
                    () = self.stopped() => Outcome::Stopped,
                    o = work => o,
                }
            };
            (n, outcome)
        }
        .boxed_local()
    }

    /// Takes the permits a leaf stage needs and runs it. The resource comes first, so a
    /// stage queued for it (a merge queue) holds no concurrency slot while it waits.
    pub(super) async fn run_leaf(&self, frame: &Frame<'_>, n: NodeId) -> Outcome {
        let _resource = match self.plan.node(n).resource {
            Some(r) => {
                let prio = self.priority(frame, n, r);
                Some(self.resources[r].acquire(prio).await)
            }
            None => None,
        };
        let mut _limits = Vec::new();
        let mut cur = Some(frame);
        while let Some(f) = cur {
            if let Some(l) = &f.limit {
                _limits.push(l.acquire().await.ok());
            }
            cur = f.parent;
        }
        let _global = match &self.shared.global {
            Some(s) => s.acquire().await.ok(),
            None => None,
        };
        if self.halted() {
            return Outcome::Stopped;
        }
        let outcome = match self.plan.node(n).kind {
            StageKind::Agent => self.run_agent(frame, n).await,
            StageKind::Command | StageKind::Check => self.run_command(frame, n).await,
            _ => return Outcome::Settled(Settled::new(NodeState::Done, Json::Null, now_ms())),
        };
        // A run on workers: what the stage left in its workspace goes to the run's
        // repository before its settlement is committed, so that whichever machine goes on
        // (after this one dies) starts from it. The resource (a merge queue) is still held.
        if let (Outcome::Settled(_), Some(p)) = (&outcome, &self.shared.publisher) {
            if let Err(source) = p.publish(&frame.cwd).await {
                return self.shared.halt(super::error::Halt::Publish {
                    path: frame.cwd.clone(),
                    url: p.url().to_string(),
                    source,
                });
            }
        }
        outcome
    }

    /// Ranks a stage waiting for a resource: by the resource's `order`, else higher first.
    pub(super) fn priority(&self, frame: &Frame<'_>, n: NodeId, r: usize) -> i64 {
        let Some(p) = &self.plan.stage(n).keys().priority else {
            return 0;
        };
        let ctx = self.context(frame, &[]);
        let Ok(v) = self.eval(&p.value, &ctx) else {
            return 0;
        };
        let order = &self.plan.workflow.resources[r].order;
        if !order.is_empty() {
            let s = v
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| v.to_string());
            return order
                .iter()
                .position(|o| o.value == s)
                .map_or(order.len() as i64, |i| i as i64);
        }
        match i64::try_from(v.clone()) {
            Ok(x) => -x,
            Err(_) => f64::try_from(v).map(|f| -(f as i64)).unwrap_or(0),
        }
    }
}
