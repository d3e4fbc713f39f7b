//! Fan-out and fan-in: `for_each` (a body per item) and `group` (a body of parallel stages),
//! with their aggregation.

use std::collections::HashSet;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use futures_util::FutureExt;
use futures_util::future::LocalBoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use minijinja::Value;
use serde_json::{Value as Json, json};

use super::context::*;
use super::exec::*;
use super::frame::*;
use super::now_ms;
use crate::backend::Usage;
use crate::compile::NodeId;
use crate::compile::Target;
use crate::model::{AggregateMode, ForEachBody, StageBody};
use crate::params::resolve_count;
use crate::store::{NodeRecord, NodeState, Write};

/// A for_each being run: what each item's body shares.
struct ForEach<'x> {
    n: NodeId,
    name: &'x str,
    /// The item's variable (`as`), and whether each item has its worktree.
    var: String,
    worktree: bool,
    result_stage: Option<NodeId>,
    /// The items' concurrency limit.
    sem: tokio::sync::Semaphore,
    /// The items settled so far (`stages.FOR_EACH.settled`).
    siblings: Arc<Mutex<Vec<Value>>>,
}

impl Exec<'_> {
    pub(super) async fn run_for_each(&self, frame: &Frame<'_>, n: NodeId) -> Outcome {
        let started = now_ms();
        let st = self.plan.stage(n);
        let node = self.plan.node(n);
        let Some(ForEachBody {
            over,
            as_name,
            key,
            max_concurrency,
            aggregate,
            result,
            worktree,
            ..
        }) = st.body.as_for_each()
        else {
            return Outcome::Stopped;
        };
        let items = match self.for_each_items(frame, n, over.as_ref(), started) {
            Ok(items) => items,
            Err(o) => return *o,
        };
        let var = as_name
            .as_ref()
            .map(|a| a.value.clone())
            .unwrap_or_else(|| "item".to_string());
        let limit = match max_concurrency
            .as_ref()
            .map(|m| resolve_count(&m.value, &self.plan.params))
        {
            Some(Ok(m)) => usize::try_from(m).unwrap_or(usize::MAX).max(1),
            Some(Err(e)) => return self.fail_now(started, format!("max_concurrency: {e}")),
            None => items.len().max(1),
        };
        let fe = ForEach {
            n,
            name: &node.name,
            worktree: worktree.is_some(),
            result_stage: self.result_stage(st, result.as_ref()),
            sem: super::resource::limit(limit),
            siblings: Arc::default(),
            var,
        };
        let keys = match self.item_keys(frame, key.as_ref(), &fe.var, &items) {
            Ok(keys) => keys,
            Err(e) => return self.fail_now(started, e),
        };
        let mut running: FuturesUnordered<LocalBoxFuture<'_, (usize, BodyEnd, Option<Json>)>> =
            items
                .iter()
                .enumerate()
                .map(|(i, item)| self.run_item(frame, &fe, i, item, &keys[i]).boxed_local())
                .collect();
        let mut results: Vec<Option<Json>> = vec![None; items.len()];
        let mut failures = Vec::new();
        let mut infra = false;
        let mut waiting = false;
        let mut stopped = false;
        let mut exit = None;
        while let Some((i, end, result)) = running.next().await {
            results[i] = result;
            match end {
                BodyEnd::Completed | BodyEnd::Break | BodyEnd::Continue(_) => {}
                BodyEnd::Failed {
                    node: f,
                    message,
                    infra: item_infra,
                    ..
                } => {
                    infra |= item_infra;
                    failures.push(format!("item `{}`: `{f}` failed: {message}", keys[i]));
                }
                BodyEnd::Waiting => waiting = true,
                BodyEnd::Stopped => stopped = true,
                BodyEnd::Exit(x) => exit = Some(x),
            }
        }
        if let Some(x) = exit {
            return Outcome::Settled(
                Settled::done(Json::Null, started).with_action(Target::Exit(x)),
            );
        }
        if stopped {
            return Outcome::Stopped;
        }
        if waiting {
            return Outcome::Waiting;
        }
        let results: Vec<Json> = results
            .into_iter()
            .map(|r| r.unwrap_or(Json::Null))
            .collect();
        let value = self.aggregate(aggregate.as_deref(), fe.result_stage, &results);
        let output = json!({"results": results, "value": value});
        if failures.is_empty() {
            Outcome::Settled(Settled::done(output, started))
        } else {
            let msg = format!(
                "{} of {} items failed: {}",
                failures.len(),
                items.len(),
                failures.join("; ")
            );
            Outcome::Settled(self.region_failed(n, output, started, msg.clone(), Some(msg), infra))
        }
    }

    /// A for_each's items: those a resume finds recorded, else its `over` evaluated (and
    /// recorded, so that a resume runs the same items).
    fn for_each_items(
        &self,
        frame: &Frame<'_>,
        n: NodeId,
        over: Option<&crate::model::Text>,
        started: i64,
    ) -> Result<Vec<Json>, Box<Outcome>> {
        let scope = self.scope(frame);
        let items_key = (scope, format!("@items:{}", self.plan.node(n).name));
        let recorded = self
            .shared
            .resumed
            .borrow()
            .get(&items_key)
            .map(|rec| match rec.output() {
                Json::Array(items) => items,
                _ => Vec::new(),
            });
        if let Some(items) = recorded {
            return Ok(items);
        }
        let ctx = self.context(frame, &[]);
        let src = over.map(|o| o.value.as_str()).unwrap_or("[]");
        let v = self
            .eval(src, &ctx)
            .map_err(|e| Box::new(self.fail_now(started, format!("its `over` failed: {e}"))))?;
        let j: Json = serde_json::to_value(&v).unwrap_or(Json::Null);
        let Some(list) = j.as_array().cloned() else {
            return Err(Box::new(self.fail_now(
                started,
                format!("its `over` must give a list, but gave {}", short_json(&j)),
            )));
        };
        self.record_decision(&items_key.0, &items_key.1, Json::Array(list.clone()));
        Ok(list)
    }

    /// The items' keys (`key`, else the index), made safe for a path; they must be unique.
    fn item_keys(
        &self,
        frame: &Frame<'_>,
        key: Option<&crate::model::Text>,
        var: &str,
        items: &[Json],
    ) -> Result<Vec<String>, String> {
        let mut keys = Vec::new();
        let mut seen = HashSet::new();
        for (i, item) in items.iter().enumerate() {
            let k = match key {
                Some(k) => {
                    let ctx =
                        self.context(frame, &[(var, to_value(item)), ("index", Value::from(i))]);
                    match self.eval(&k.value, &ctx) {
                        Ok(v) => v
                            .as_str()
                            .map(str::to_string)
                            .unwrap_or_else(|| v.to_string()),
                        Err(e) => return Err(format!("its `key` failed: {e}")),
                    }
                }
                None => i.to_string(),
            };
            let k = sanitize(&k);
            if !seen.insert(k.clone()) {
                return Err(format!("two items have the key `{k}`; keys must be unique"));
            }
            keys.push(k);
        }
        Ok(keys)
    }

    /// Runs one item of a for_each (in its worktree, if it has one): how its body ended,
    /// and its result.
    async fn run_item<'s>(
        &'s self,
        frame: &'s Frame<'s>,
        fe: &'s ForEach<'_>,
        i: usize,
        item: &'s Json,
        k: &'s str,
    ) -> (usize, BodyEnd, Option<Json>) {
        let n = fe.n;
        let _permit = fe.sem.acquire().await.ok();
        let scope = frame.child_scope(&format!("{}#{k}", fe.name));
        let cwd = match fe.worktree {
            true => match self
                .enter_worktree_item(frame, n, &scope, &fe.var, item, i)
                .await
            {
                Ok(p) => p,
                Err(e) => return (i, self.item_not_entered(&scope, fe.name, &e), None),
            },
            false => frame.cwd.clone(),
        };
        let iframe = Frame {
            parent: Some(frame),
            region: Some(n),
            scope,
            cwd: cwd.clone(),
            vars: vec![
                (fe.var.clone(), to_value(item)),
                ("index".to_string(), Value::from(i)),
            ],
            siblings: Some(fe.siblings.clone()),
            ..Frame::default()
        };
        let end = self.run_body(&iframe).await;
        let ok = matches!(
            end,
            BodyEnd::Completed | BodyEnd::Break | BodyEnd::Continue(_)
        );
        if fe.worktree {
            self.leave_worktree_at(n, &cwd, ok).await;
        }
        let result = fe.result_stage.and_then(|r| {
            iframe
                .outputs
                .borrow()
                .get(&self.plan.node(r).name)
                .filter(|v| v.state == NodeState::Done)
                .map(|v| v.output())
        });
        // The items that start from now on see this one.
        if !matches!(end, BodyEnd::Waiting | BodyEnd::Stopped) {
            let mut settled = fe
                .siblings
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            settled.push(to_value(&json!({
                "key": k,
                "index": i,
                "item": item,
                "ok": ok,
                "result": result.clone().unwrap_or(Json::Null),
            })));
        }
        (i, end, result)
    }

    /// How an item ends whose worktree could not be made: at a limit of the machine the run
    /// stops as resumable; otherwise the item fails, and says why here (none of its stages
    /// ran).
    fn item_not_entered(&self, scope: &str, name: &str, e: &StageError) -> BodyEnd {
        if let Some(limit) = e.limit() {
            self.shared
                .limit_reached(Some(scope.to_string()), limit, e.message());
            return BodyEnd::Stopped;
        }
        let e = e.message();
        self.shared.event(scope, name, "failed", e.clone());
        self.shared.progress.note(&format!("✗ {scope}: {e}"));
        BodyEnd::Failed {
            node: name.to_string(),
            message: e,
            feedback: None,
            infra: true,
        }
    }

    pub(super) async fn run_group(&self, frame: &Frame<'_>, n: NodeId) -> Outcome {
        let started = now_ms();
        let st = self.plan.stage(n);
        let node = self.plan.node(n);
        let StageBody::Group {
            max_concurrency,
            aggregate,
            result,
            ..
        } = &st.body
        else {
            return Outcome::Stopped;
        };
        let limit = match max_concurrency
            .as_ref()
            .map(|m| resolve_count(&m.value, &self.plan.params))
        {
            Some(Ok(m)) => Some(Rc::new(super::resource::limit(
                usize::try_from(m).unwrap_or(usize::MAX),
            ))),
            Some(Err(e)) => return self.fail_now(started, format!("max_concurrency: {e}")),
            None => None,
        };
        let gframe = Frame {
            parent: Some(frame),
            region: Some(n),
            scope: frame.child_scope(&node.name),
            cwd: frame.cwd.clone(),
            vars: Vec::new(),
            loop_vars: None,
            earlier: Arc::default(),
            usage_key: None,
            outputs: Arc::default(),
            limit,
            siblings: None,
        };
        let end = self.run_body(&gframe).await;
        let outs = gframe.outputs.take();
        let mut results = Vec::new();
        for c in st.children() {
            if let Some(v) = outs.get(&c.id.value) {
                if v.state == NodeState::Done {
                    results.push(v.output());
                }
            }
        }
        for (k, v) in outs {
            frame.outputs.borrow().insert(k, v);
        }
        let result_stage = self.result_stage(st, result.as_ref());
        let value = self.aggregate(aggregate.as_deref(), result_stage, &results);
        let output = json!({"results": results, "value": value});
        match end {
            BodyEnd::Stopped => Outcome::Stopped,
            BodyEnd::Waiting => Outcome::Waiting,
            BodyEnd::Exit(i) => {
                Outcome::Settled(Settled::done(output, started).with_action(Target::Exit(i)))
            }
            BodyEnd::Continue(f) => Outcome::Settled(
                Settled::done(output, started)
                    .with_action(Target::Continue)
                    .with_feedback(f),
            ),
            BodyEnd::Break => {
                Outcome::Settled(Settled::done(output, started).with_action(Target::Break))
            }
            BodyEnd::Completed => Outcome::Settled(Settled::done(output, started)),
            BodyEnd::Failed {
                node: f,
                message,
                feedback,
                infra,
            } => Outcome::Settled(self.region_failed(
                n,
                output,
                started,
                format!("`{f}` failed: {message}"),
                feedback,
                infra,
            )),
        }
    }

    /// Records a decision of the executor (a for_each's items, a worktree) under a node
    /// name starting with `@`, so that a resume makes the same one; committed at once.
    pub(super) fn record_decision(&self, scope: &str, node: &str, output: Json) {
        let now = now_ms();
        self.shared.write(Write::Node(NodeRecord {
            run: self.shared.run.id.clone(),
            scope: scope.to_string(),
            node: node.to_string(),
            state: NodeState::Done,
            output,
            action: None,
            feedback: None,
            attempts: 1,
            usage: Usage::default(),
            started_at: now,
            finished_at: now,
        }));
        self.shared.flush();
    }

    /// The stage whose output is a fan-out's result: `result`, else the body's last stage.
    pub(super) fn result_stage(
        &self,
        st: &crate::model::Stage,
        result: Option<&crate::model::Text>,
    ) -> Option<NodeId> {
        let name = result.or_else(|| st.children().last().map(|c| &c.id))?;
        self.plan.find(&name.value)
    }

    /// Combines fan-out results.
    pub(super) fn aggregate(
        &self,
        agg: Option<&crate::model::Aggregate>,
        result_stage: Option<NodeId>,
        results: &[Json],
    ) -> Json {
        let Some(agg) = agg else {
            return Json::Array(results.to_vec());
        };
        let field = agg.field.as_ref().map(|f| f.value.as_str()).unwrap_or("");
        let get = |r: &Json| -> Json {
            field
                .split('.')
                .filter(|p| !p.is_empty())
                .fold(r.clone(), |cur, p| {
                    cur.get(p).cloned().unwrap_or(Json::Null)
                })
        };
        let present: Vec<&Json> = results.iter().filter(|r| !r.is_null()).collect();
        match agg.mode.value {
            AggregateMode::All => Json::Bool(
                !present.is_empty() && present.iter().all(|r| get(r) == Json::Bool(true)),
            ),
            AggregateMode::Any => Json::Bool(present.iter().any(|r| get(r) == Json::Bool(true))),
            AggregateMode::Worst | AggregateMode::Best => {
                let order: Vec<String> = if agg.order.is_empty() {
                    result_stage
                        .and_then(|r| self.plan.schemas.get(&r))
                        .and_then(|s| {
                            let path: Vec<&str> = field.split('.').collect();
                            crate::model::walk_schema(s, &path).ok().cloned()
                        })
                        .and_then(|f| f.get("enum").cloned())
                        .and_then(|e| serde_json::from_value(e).ok())
                        .unwrap_or_default()
                } else {
                    agg.order.iter().map(|o| o.value.clone()).collect()
                };
                let rank = |r: &Json| {
                    let v = get(r);
                    let s = v
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| v.to_string());
                    order.iter().position(|o| *o == s)
                };
                let ranked = present.iter().filter_map(|r| rank(r).map(|i| (i, get(r))));
                let pick = if agg.mode.value == AggregateMode::Worst {
                    ranked.max_by_key(|(i, _)| *i)
                } else {
                    ranked.min_by_key(|(i, _)| *i)
                };
                pick.map(|(_, v)| v).unwrap_or(Json::Null)
            }
            AggregateMode::Highest | AggregateMode::Lowest => {
                let num = |r: &Json| get(r).as_f64();
                let mut best: Option<(&Json, f64)> = None;
                for r in &present {
                    if let Some(x) = num(r) {
                        let better = match best {
                            None => true,
                            Some((_, b)) => {
                                if agg.mode.value == AggregateMode::Highest {
                                    x > b
                                } else {
                                    x < b
                                }
                            }
                        };
                        if better {
                            best = Some((r, x));
                        }
                    }
                }
                best.map(|(r, _)| r.clone()).unwrap_or(Json::Null)
            }
            AggregateMode::Collect => Json::Array(results.to_vec()),
        }
    }
}
