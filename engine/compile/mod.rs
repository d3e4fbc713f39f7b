//! Compilation of a checked workflow into an execution plan: per-body petgraph DAGs with
//! every name resolved to an id, and every template compiled once.

pub mod explain;
mod prepared;
pub mod render;

use std::collections::HashMap;

use petgraph::graph::{DiGraph, NodeIndex};

use crate::check::scope::{conditional, skips_with_needs};
use crate::check::{Checked, StageId};
use crate::model::{Action, Stage, StageKind, Workflow};

pub use prepared::{
    Ahead, Later, PrepareError, PrepareFn, Prepared, SubflowKey, Subflows, subflow_path,
};

/// Identifies a node of a plan: the same index as the checked stage.
pub use crate::model::StageId as NodeId;

/// Where control goes after a route case, a failure, a rejection or a limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Continue,
    Break,
    Fail,
    Approve,
    Reject,
    /// An index into [`Plan::exits`].
    Exit(usize),
    Stage(NodeId),
}

/// An edge of a body's graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Edge {
    /// The target needs the source.
    Needs,
    /// The source's route goes to the target for these values (`*` for the default).
    Route(Vec<String>),
}

/// The DAG of one body (the top level, or a loop's, for_each's or group's body).
#[derive(Debug)]
pub struct Body {
    /// The graph; a node's index in it is [`Node::local`].
    pub graph: DiGraph<NodeId, Edge>,
    /// The body's nodes in a topological order.
    pub order: Vec<NodeId>,
    /// Each graph node's place in `order` (indexed by `NodeIndex::index()`): the executor
    /// starts nodes that become ready together in this order.
    pub rank: Vec<usize>,
}

/// One stage of the plan.
#[derive(Debug)]
pub struct Node {
    pub name: String,
    pub kind: StageKind,
    pub parent: Option<NodeId>,
    pub needs: Vec<NodeId>,
    /// The body, for loops, for_each and groups.
    pub body: Option<Box<Body>>,
    /// The resolved agent, when it is not chosen by a param.
    pub agent: Option<usize>,
    pub resource: Option<usize>,
    /// Routes, give-up stages and escalations: absent for most stages (see [`Routing`]).
    pub routing: Option<Box<Routing>>,
    /// What happens when the stage fails (the declared action, or the default for its place).
    pub on_fail: Target,
    /// What happens when the stage cannot run for reasons outside the work (an agent that
    /// cannot be reached, a timeout, a program that cannot start): `on_error`, else `fail`.
    pub on_error: Target,
    /// What happens when the stage completes and no route took an action (`then`).
    pub then: Option<Target>,
    /// Whether the stage may be skipped (a condition, a route or an escalation decides).
    pub conditional: bool,
    /// Whether the stage is skipped when every stage it needs is, and only then (no reason
    /// of its own): `explain` and the graphs show the skip spreading to it.
    pub skips_with_needs: bool,
    /// Whether one of the stage's templates names `stage_dir`: its program may write in its
    /// attempt's directory, which is then made before it starts.
    pub uses_stage_dir: bool,
    /// Where the stage's model is in the workflow's stage tree: the index at each level.
    pub path: Vec<usize>,
    /// The node's index in the graph of the body it belongs to.
    pub local: NodeIndex,
}

/// The rarer parts of a node, boxed together and absent when all are empty: a plan node is
/// 192 bytes instead of 272 (a plan of 10,000 stages holds every node for the whole run).
#[derive(Debug, Default)]
pub struct Routing {
    /// `route`'s cases: the value and where it goes.
    pub routes: Vec<(String, Target)>,
    /// `route`'s default.
    pub route_default: Option<Target>,
    /// The stages a loop or gate runs instead of giving up (`on_exhausted`, `stuck.then`,
    /// `on_timeout`), with the key's name: edges of the body like routes.
    pub give_up: Vec<(String, Target)>,
    /// Escalation rules of a loop: the condition (an expression) and the nodes it runs.
    pub escalations: Vec<(String, Vec<NodeId>)>,
}

impl Routing {
    fn boxed(self) -> Option<Box<Routing>> {
        let empty = self.routes.is_empty()
            && self.route_default.is_none()
            && self.give_up.is_empty()
            && self.escalations.is_empty();
        (!empty).then(|| Box::new(self))
    }
}

impl Node {
    /// `route`'s cases.
    pub fn routes(&self) -> &[(String, Target)] {
        self.routing.as_ref().map_or(&[], |r| &r.routes)
    }

    /// `route`'s default.
    pub fn route_default(&self) -> Option<&Target> {
        self.routing.as_ref().and_then(|r| r.route_default.as_ref())
    }

    /// The stages run instead of giving up, with the key's name.
    pub fn give_up(&self) -> &[(String, Target)] {
        self.routing.as_ref().map_or(&[], |r| &r.give_up)
    }

    /// A loop's escalation rules.
    pub fn escalations(&self) -> &[(String, Vec<NodeId>)] {
        self.routing.as_ref().map_or(&[], |r| &r.escalations)
    }
}

/// The templates of a workflow by name, sorted: for thousands of stages, a third of the
/// memory of a hash map of `String`s.
#[derive(Debug, Default)]
pub struct Templates(Vec<(Box<str>, Box<str>)>);

impl Templates {
    /// Builds the map; of two templates with the same name, the later one is kept.
    fn new(mut all: Vec<(Box<str>, Box<str>)>) -> Templates {
        // Reversed, then a stable sort: the later of two equal names comes first and stays.
        all.reverse();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all.dedup_by(|later, first| later.0 == first.0);
        all.shrink_to_fit();
        Templates(all)
    }

    /// The source of a template.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| (**k).cmp(name))
            .ok()
            .map(|i| &*self.0[i].1)
    }

    /// Tells whether there is a template of this name.
    pub fn contains_key(&self, name: &str) -> bool {
        self.get(name).is_some()
    }
}

/// A named outcome with its exit code.
#[derive(Clone, Debug)]
pub struct ExitDef {
    pub name: String,
    pub code: i64,
    pub message: Option<String>,
}

/// A compiled workflow, ready for the executor.
#[derive(Debug)]
pub struct Plan {
    pub workflow: Workflow,
    pub nodes: Vec<Node>,
    pub top: Body,
    pub exits: Vec<ExitDef>,
    pub params: crate::params::ParamValues,
    pub schemas: HashMap<NodeId, std::sync::Arc<serde_json::Value>>,
    /// Every template of the workflow, by name (`STAGE/prompt`, `STAGE/argv/0`,
    /// `STAGE/env/KEY`, `STAGE/message`, `STAGE/feedback`, ...). The checker has compiled
    /// each; the executor compiles one where it renders it, so that a run of thousands of
    /// stages does not hold thousands of compiled templates (about 12 KB each).
    /// Expressions (`when`, `until`, `expect`, `over`, escalation conditions, ...) are kept
    /// as source and compiled with `compile_expression` where they are evaluated, so that
    /// their values keep their types.
    pub templates: Templates,
    /// Every node, sorted by its stage id (ids are unique in a workflow), for
    /// [`Plan::find`]: no second copy of the names.
    pub by_name: Vec<NodeId>,
    /// The loops whose output's `history` something reads (a stage after it, an exit
    /// message, `earlier_runs`): their output carries it however they ended. Few loops, so
    /// a set beside the nodes rather than a flag in each (a node stays 192 bytes).
    pub history_read: std::collections::HashSet<NodeId>,
}

/// An agent stage whose agent, rendered over the params, names no agent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("there is no agent `{0}`")]
pub struct UnknownAgent(pub String);

impl Plan {
    /// The agent an agent stage calls: the one resolved at compile time, else the one its
    /// `agent` template names with the params in force. `Err` holds the name that matched no
    /// agent.
    pub fn agent_of(&self, n: NodeId) -> Result<usize, UnknownAgent> {
        if let Some(a) = self.node(n).agent {
            return Ok(a);
        }
        let written = match &self.stage(n).body {
            crate::model::StageBody::Agent { agent: Some(a), .. } => a.value.clone(),
            _ => String::new(),
        };
        let name = crate::params::render_params(&written, &self.params).unwrap_or(written);
        self.workflow
            .agents
            .iter()
            .position(|a| a.name.value == name)
            .ok_or(UnknownAgent(name))
    }

    /// An agent and its fallbacks (and theirs), each once, in the order they take over.
    pub fn fallback_chain(&self, agent: usize) -> Vec<usize> {
        self.workflow.fallback_chain(agent)
    }

    /// Returns a node.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.0]
    }

    /// Returns the model of a node's stage.
    pub fn stage(&self, id: NodeId) -> &Stage {
        let path = &self.nodes[id.0].path;
        let mut level: &[Stage] = &self.workflow.stages;
        let mut found = None;
        for &i in path {
            let s = &level[i];
            found = Some(s);
            level = s.children();
        }
        found.unwrap_or_else(|| unreachable!("every node comes from a stage"))
    }

    /// Returns the body of a region, or the top level for `None`.
    pub fn body(&self, region: Option<NodeId>) -> &Body {
        match region {
            Some(r) => self.nodes[r.0].body.as_deref().unwrap_or(&self.top),
            None => &self.top,
        }
    }

    /// Shows a count as a number when the params in force resolve it, else as written.
    pub fn count_text(&self, c: &crate::model::Count) -> String {
        match (c, crate::params::resolve_count(c, &self.params)) {
            (_, Ok(n)) => n.to_string(),
            (crate::model::Count::Template(t), Err(_)) => t.clone(),
            (crate::model::Count::Literal(n), Err(_)) => n.to_string(),
        }
    }

    /// Returns the node of a stage by id.
    pub fn find(&self, name: &str) -> Option<NodeId> {
        self.by_name
            .binary_search_by(|id| self.nodes[id.0].name.as_str().cmp(name))
            .ok()
            .map(|i| self.by_name[i])
    }

    /// Resolves an action (as written, or as stored by a run) to where control goes.
    pub fn target(&self, a: &Action) -> Option<Target> {
        resolve_action(a, |n| self.exit(n), |s| self.find(s))
    }

    /// Returns the id of an exit by name.
    pub fn exit(&self, name: &str) -> Option<usize> {
        self.exits.iter().position(|e| e.name == name)
    }
}

/// Resolves an action with lookups of exits and stages; `None` when a name is unknown.
fn resolve_action(
    a: &Action,
    exit: impl Fn(&str) -> Option<usize>,
    stage: impl Fn(&str) -> Option<NodeId>,
) -> Option<Target> {
    Some(match a {
        Action::Continue => Target::Continue,
        Action::Break => Target::Break,
        Action::Fail => Target::Fail,
        Action::Approve => Target::Approve,
        Action::Reject => Target::Reject,
        Action::Exit(n) => Target::Exit(exit(n)?),
        Action::Goto(s) => Target::Stage(stage(s)?),
    })
}

/// Compiles a checked workflow into a plan.
/// The template name of the branch of the run's own worktree.
pub const RUN_WORKTREE_BRANCH: &str = "@run/worktree/branch";
/// The template name of the base of the run's own worktree.
pub const RUN_WORKTREE_BASE: &str = "@run/worktree/base";

pub fn compile(checked: &Checked<'_>) -> Plan {
    compile_parts(checked).with_workflow(checked.workflow.clone())
}

/// The loops whose output's `history` the workflow may read: named as `stages.NAME.output`
/// other than for its `iterations` or `outcome`; every loop when `earlier_runs` (which reads
/// outputs of earlier runs) is used.
struct HistoryRead<'c> {
    names: std::collections::HashSet<&'c str>,
    all: bool,
}

impl<'c> HistoryRead<'c> {
    fn of(c: &'c Checked<'_>) -> Self {
        use crate::check::skips::{stage_mentions, texts_of};
        let mut read = HistoryRead {
            names: std::collections::HashSet::new(),
            all: false,
        };
        // Most workflows have no loop: nothing to look for in their texts.
        if !c
            .stages
            .iter()
            .any(|s| s.stage.kind().value == StageKind::Loop)
        {
            return read;
        }
        let texts = c.top.iter().flat_map(|id| texts_of(c, *id)).chain(
            c.workflow
                .exits
                .iter()
                .filter_map(|e| e.message.as_ref().map(|m| m.value.as_str())),
        );
        for t in texts {
            read.all |= t.contains("earlier_runs");
            for (name, rest) in stage_mentions(t) {
                let Some(field) = rest.strip_prefix(".output") else {
                    continue;
                };
                if !(field.starts_with(".iterations") || field.starts_with(".outcome")) {
                    read.names.insert(name);
                }
            }
        }
        read
    }
}

/// A plan without its workflow model: see [`compile_parts`].
pub struct PlanParts(Plan);

impl PlanParts {
    /// The plan, with the model it was compiled from (moved in, not copied: a workflow of
    /// thousands of stages is megabytes).
    pub fn with_workflow(mut self, workflow: Workflow) -> Plan {
        self.0.workflow = workflow;
        self.0
    }
}

/// Compiles a checked workflow into a plan whose model is given afterwards
/// ([`PlanParts::with_workflow`]), once the checked workflow is no longer borrowed.
pub fn compile_parts(checked: &Checked<'_>) -> PlanParts {
    let wf = checked.workflow;
    let mut exits: Vec<ExitDef> = wf
        .exits
        .iter()
        .map(|e| ExitDef {
            name: e.name.value.clone(),
            code: e.code.value,
            message: e.message.as_ref().map(|m| m.value.clone()),
        })
        .collect();
    for (name, code) in crate::exit::IMPLICIT {
        if !exits.iter().any(|e| e.name == *name) {
            exits.push(ExitDef {
                name: (*name).to_string(),
                code: *code,
                message: None,
            });
        }
    }
    let target = |a: &Action, exits: &[ExitDef]| {
        resolve_action(
            a,
            |n| exits.iter().position(|e| e.name == n),
            |s| checked.find(s),
        )
        .unwrap_or(Target::Fail)
    };
    let mut templates: Vec<(Box<str>, Box<str>)> = Vec::new();
    // The run's own worktree (no stage id starts with `@`).
    if let Some(w) = &wf.worktree {
        templates.push((RUN_WORKTREE_BRANCH.into(), w.branch.value.as_str().into()));
        if let Some(b) = &w.base {
            templates.push((RUN_WORKTREE_BASE.into(), b.value.as_str().into()));
        }
    }
    let read = HistoryRead::of(checked);
    let history_read: std::collections::HashSet<NodeId> = checked
        .stages
        .iter()
        .enumerate()
        .filter(|(_, info)| {
            info.stage.kind().value == StageKind::Loop
                && (read.all || read.names.contains(info.stage.id.value.as_str()))
        })
        .map(|(i, _)| NodeId(i))
        .collect();
    let mut nodes = Vec::with_capacity(checked.stages.len());
    for (i, info) in checked.stages.iter().enumerate() {
        let s = info.stage;
        let id = StageId(i);
        let in_loop = checked.enclosing_loop(id).is_some();
        let mut uses_stage_dir = false;
        let mut add = |field: &str, src: &str| {
            uses_stage_dir |= src.contains("stage_dir");
            templates.push((format!("{}/{field}", s.id.value).into(), src.into()));
        };
        if let crate::model::StageBody::Agent {
            prompt: Some(p), ..
        } = &s.body
        {
            add("prompt", &p.value);
        }
        if let Some((_, text)) = checked.prompt_files.get(&id) {
            add("prompt", text);
        }
        if let Some(f) = &s.keys().feedback {
            add("feedback", &f.value);
        }
        if let Some(o) = &s.keys().output {
            for (n, f) in o.files.iter().enumerate() {
                add(&format!("files/{n}"), &f.value);
            }
        }
        use crate::model::StageBody as B;
        match &s.body {
            B::Command(cmd)
            | B::Check {
                command: Some(cmd), ..
            } => {
                for (n, a) in cmd.argv.iter().enumerate() {
                    add(&format!("argv/{n}"), &a.value);
                }
                for (k, v) in &cmd.env {
                    add(&format!("env/{}", k.value), &v.value);
                }
                if let Some(c) = &cmd.cwd {
                    add("cwd", &c.value);
                }
                if let Some(i) = &cmd.stdin {
                    add("stdin", &i.value);
                }
            }
            B::Gate { message, show, .. } => {
                if let Some(m) = message {
                    add("message", &m.value);
                }
                for (n, x) in show.iter().enumerate() {
                    add(&format!("show/{n}"), &x.value);
                }
            }
            B::Subflow { params, .. } => {
                for (k, v) in params {
                    add(&format!("params/{}", k.value), &v.value);
                }
            }
            B::Loop(_) | B::ForEach(_) => {
                if let Some(w) = s.body.worktree() {
                    add("worktree/branch", &w.branch.value);
                    if let Some(b) = &w.base {
                        add("worktree/base", &b.value);
                    }
                }
            }
            _ => {}
        }
        let agent = match &s.body {
            crate::model::StageBody::Agent { agent: Some(a), .. } => {
                wf.agents.iter().position(|x| x.name.value == a.value)
            }
            _ => None,
        };
        let route = s.keys().route.as_ref();
        let escalations = match s.body.as_loop() {
            Some(l) => l
                .escalation
                .iter()
                .map(|r| {
                    let targets = r.run.iter().filter_map(|t| checked.find(&t.value));
                    (r.when.value.clone(), targets.collect())
                })
                .collect(),
            _ => Vec::new(),
        };
        nodes.push(Node {
            name: s.id.value.clone(),
            kind: s.kind().value,
            parent: info.parent,
            needs: info.needs.clone(),
            body: None,
            agent,
            resource: s
                .keys()
                .resource
                .as_ref()
                .and_then(|r| wf.resources.iter().position(|x| x.name.value == r.value)),
            routing: Routing {
                routes: route
                    .map(|r| {
                        r.cases
                            .iter()
                            .map(|(k, a)| (k.value.clone(), target(&a.value, &exits)))
                            .collect()
                    })
                    .unwrap_or_default(),
                route_default: route
                    .and_then(|r| r.default.as_ref())
                    .map(|a| target(&a.value, &exits)),
                give_up: s
                    .give_up_targets()
                    .into_iter()
                    .map(|(k, a)| (k.to_string(), target(&a.value, &exits)))
                    .collect(),
                escalations,
            }
            .boxed(),
            on_fail: s.keys().on_fail.as_ref().map_or(
                if in_loop {
                    Target::Continue
                } else {
                    Target::Fail
                },
                |a| target(&a.value, &exits),
            ),
            on_error: s
                .keys()
                .on_error
                .as_ref()
                .map_or(Target::Fail, |a| target(&a.value, &exits)),
            then: s.keys().then.as_ref().map(|a| target(&a.value, &exits)),
            conditional: conditional(checked, id),
            skips_with_needs: skips_with_needs(checked, id),
            uses_stage_dir,
            path: Vec::new(),
            local: NodeIndex::end(),
        });
    }
    let by_name: HashMap<String, NodeId> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.clone(), NodeId(i)))
        .collect();
    set_paths(&wf.stages, &mut Vec::new(), &by_name, &mut nodes);
    drop(by_name);
    let mut by_name: Vec<NodeId> = (0..nodes.len()).map(NodeId).collect();
    by_name.sort_unstable_by(|a, b| nodes[a.0].name.cmp(&nodes[b.0].name));
    for i in 0..nodes.len() {
        if checked.stages[i].stage.kind().value.is_region() {
            nodes[i].body = Some(Box::new(body(checked, Some(StageId(i)), &nodes)));
        }
    }
    let top = body(checked, None, &nodes);
    let locals: Vec<(usize, NodeIndex)> = std::iter::once(&top)
        .chain(nodes.iter().filter_map(|n| n.body.as_deref()))
        .flat_map(|b| b.graph.node_indices().map(|ix| (b.graph[ix].0, ix)))
        .collect();
    for (i, ix) in locals {
        nodes[i].local = ix;
    }
    PlanParts(Plan {
        workflow: Workflow::placeholder(),
        nodes,
        top,
        exits,
        params: checked.params.clone(),
        schemas: checked.schemas.clone(),
        templates: Templates::new(templates),
        by_name,
        history_read,
    })
}

/// Records where each node's stage is in the stage tree.
fn set_paths(
    stages: &[Stage],
    prefix: &mut Vec<usize>,
    by_name: &HashMap<String, NodeId>,
    nodes: &mut [Node],
) {
    for (i, s) in stages.iter().enumerate() {
        prefix.push(i);
        if let Some(id) = by_name.get(&s.id.value) {
            nodes[id.0].path = prefix.clone();
        }
        set_paths(s.children(), prefix, by_name, nodes);
        prefix.pop();
    }
}

fn body(c: &Checked<'_>, region: Option<StageId>, nodes: &[Node]) -> Body {
    let members = c.body(region);
    let mut graph = DiGraph::new();
    let mut index = HashMap::new();
    for m in members {
        index.insert(*m, graph.add_node(*m));
    }
    for m in members {
        for need in &nodes[m.0].needs {
            if let (Some(a), Some(b)) = (index.get(need), index.get(m)) {
                graph.add_edge(*a, *b, Edge::Needs);
            }
        }
        let mut by_target: Vec<(NodeId, Vec<String>)> = Vec::new();
        let routes = nodes[m.0]
            .routes()
            .iter()
            .map(|(k, t)| (k.clone(), t))
            .chain(
                nodes[m.0]
                    .route_default()
                    .into_iter()
                    .map(|t| ("*".to_string(), t)),
            )
            .chain(nodes[m.0].give_up().iter().map(|(k, t)| (k.clone(), t)));
        for (label, t) in routes {
            if let Target::Stage(to) = t {
                match by_target.iter_mut().find(|(x, _)| x == to) {
                    Some((_, labels)) => labels.push(label),
                    None => by_target.push((*to, vec![label])),
                }
            }
        }
        for (to, labels) in by_target {
            if let (Some(a), Some(b)) = (index.get(m), index.get(&to)) {
                graph.add_edge(*a, *b, Edge::Route(labels));
            }
        }
    }
    let order: Vec<NodeId> = petgraph::algo::toposort(&graph, None)
        .map(|o| o.into_iter().map(|n| graph[n]).collect())
        .unwrap_or_else(|_| members.to_vec());
    let mut rank = vec![0; graph.node_count()];
    for (r, id) in order.iter().enumerate() {
        if let Some(ix) = index.get(id) {
            rank[ix.index()] = r;
        }
    }
    Body { graph, order, rank }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plan holds a node per stage for the whole run: its rare parts stay boxed.
    #[test]
    fn a_node_stays_small() {
        let node = size_of::<Node>();
        assert!(node <= 192, "a plan node is {node} bytes");
    }
}
