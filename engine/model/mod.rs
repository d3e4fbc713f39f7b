//! The workflow model shared by both syntaxes: what a file says, with names not yet resolved.
//!
//! Here: the workflow and its workflow-level definitions (params, resources, exits, budgets,
//! sources, overrides). `stage.rs` holds stages and their bodies, `regions.rs` what loops and
//! fan-outs hold besides stages (and worktrees), `output.rs` output specs, `agent.rs` agents,
//! `values.rs` counts, durations, actions and ids. All are re-exported here.

mod agent;
pub mod jsonschema;
pub mod lower;
mod notify;
mod output;
pub mod policy;
mod regions;
pub mod shape;
mod stage;
mod values;

pub use agent::{
    Agent, AgentKind, OpenAiApi, Permissions, PromptVia, SchemaDelivery, StructuredOutput,
    is_openai_itself, schema_delivery,
};
pub use notify::{Notify, NotifyEvent, NotifyKind};
pub use output::{ExtractMode, Marker, OutputSpec, SchemaRef, walk_schema};
pub use policy::{Policy, PolicyEdit};
pub use regions::{Aggregate, AggregateMode, Cleanup, Escalation, Stuck, Worktree};
pub use stage::{
    BodyText, CommandSpec, ForEachBody, LoopBody, Route, Stage, StageBody, StageKeys, StageKind,
};
pub use values::{
    ACTION_WORDS, Action, Count, Dur, MAX_DURATION, RESERVED, is_ident, parse_duration,
};

pub use crate::spec::{ACTION, WellKnown, well_known};

use crate::source::{FileId, Span, Spanned};
use crate::syntax::tree::Value;

/// A template or expression string, with where it was written.
pub type Text = Spanned<String>;

/// Identifies a stage of a checked workflow (its index in `check::Checked::stages`) and so a
/// node of its plan (`compile::NodeId`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StageId(pub usize);

/// A workflow file as written, after its shape was checked.
#[derive(Clone, Debug)]
pub struct Workflow {
    pub file: FileId,
    pub name: Text,
    pub version: Option<Text>,
    pub description: Option<Text>,
    pub extends: Option<Extends>,
    pub include: Vec<Text>,
    /// Directories searched for prompt files, extending files' first.
    pub prompt_path: Vec<Text>,
    /// Directories outside the workspace that template helpers may read.
    pub file_roots: Vec<Text>,
    /// Names of environment variables whose values are secrets (masked in everything written
    /// or printed), this file's and those of the files it extends and includes.
    pub secrets: Vec<Text>,
    /// The git worktree the whole run works in, if any.
    pub worktree: Option<Worktree>,
    /// Git repositories of presets declared by this file (not merged across files).
    pub sources: Vec<Source>,
    pub max_concurrency: Option<Spanned<Count>>,
    pub budget: Option<Budget>,
    pub params: Vec<Param>,
    pub agents: Vec<Agent>,
    pub resources: Vec<Resource>,
    pub exits: Vec<Exit>,
    pub stages: Vec<Stage>,
    pub overrides: Vec<Override>,
    /// Notifiers (`[notify.NAME]`).
    pub notify: Vec<Notify>,
    /// Permission policies (`[policy.NAME]`).
    pub policies: Vec<Policy>,
    /// Names of params, agents, resources, exits and stages that are defined but could not be
    /// lowered (an error was reported there); references to them are not reported again.
    pub broken: Vec<String>,
}

impl Workflow {
    /// An agent (by index) and its fallbacks (and theirs), each once, in the order they take
    /// over.
    pub fn fallback_chain(&self, agent: usize) -> Vec<usize> {
        let agents = &self.agents;
        let mut out = vec![agent];
        let mut i = 0;
        while i < out.len() {
            for f in &agents[out[i]].fallbacks {
                if let Some(j) = agents.iter().position(|a| a.name.value == f.value) {
                    if !out.contains(&j) {
                        out.push(j);
                    }
                }
            }
            i += 1;
        }
        out
    }

    /// An empty workflow, held while the real one is still borrowed (see
    /// `compile::compile_parts`).
    pub fn placeholder() -> Workflow {
        Workflow {
            file: crate::source::FileId::default(),
            name: Spanned {
                value: String::new(),
                span: crate::source::Span::default(),
            },
            version: None,
            description: None,
            extends: None,
            include: Vec::new(),
            prompt_path: Vec::new(),
            file_roots: Vec::new(),
            secrets: Vec::new(),
            worktree: None,
            sources: Vec::new(),
            max_concurrency: None,
            budget: None,
            params: Vec::new(),
            agents: Vec::new(),
            resources: Vec::new(),
            exits: Vec::new(),
            stages: Vec::new(),
            overrides: Vec::new(),
            notify: Vec::new(),
            policies: Vec::new(),
            broken: Vec::new(),
        }
    }

    /// Tells whether a name was defined with an error already reported.
    pub fn is_broken(&self, name: &str) -> bool {
        self.broken.iter().any(|b| b == name)
    }
}

/// A definition with a name: params, agents, resources, exits and stages.
pub trait Named {
    /// Returns the name (a stage's id).
    fn name(&self) -> &Text;
}

macro_rules! named {
    ($($t:ty => $field:ident),*) => {
        $(impl Named for $t {
            fn name(&self) -> &Text {
                &self.$field
            }
        })*
    };
}

named!(Param => name, Agent => name, Resource => name, Exit => name, Stage => id, Source => name, Notify => name, Policy => name);

/// The base workflow a file extends.
#[derive(Clone, Debug)]
pub struct Extends {
    pub workflow: Text,
    pub params: Vec<(Text, Value)>,
    pub span: Span,
}

/// A git repository of presets, pinned to a revision.
#[derive(Clone, Debug)]
pub struct Source {
    pub name: Text,
    pub git: Text,
    pub rev: Text,
    pub path: Option<Text>,
    pub span: Span,
}

/// Token and cost limits.
#[derive(Clone, Debug)]
pub struct Budget {
    pub tokens: Option<Spanned<Count>>,
    pub cost_usd: Option<Spanned<f64>>,
    pub on_exceeded: Option<Spanned<Action>>,
    pub span: Span,
}

/// The type of a param.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamType {
    String,
    Int,
    Float,
    Bool,
    List,
}

impl ParamType {
    /// Returns the name as written in files.
    pub fn as_str(self) -> &'static str {
        match self {
            ParamType::String => "string",
            ParamType::Int => "int",
            ParamType::Float => "float",
            ParamType::Bool => "bool",
            ParamType::List => "list",
        }
    }
}

/// A typed input of the workflow.
#[derive(Clone, Debug)]
pub struct Param {
    pub name: Text,
    pub ty: Spanned<ParamType>,
    /// For a list: the type of its items (strings when not said).
    pub items: ParamType,
    pub default: Option<Value>,
    pub description: Option<Text>,
    pub choices: Vec<Value>,
    pub span: Span,
}

/// A named resource with a capacity.
#[derive(Clone, Debug)]
pub struct Resource {
    pub name: Text,
    pub capacity: Spanned<Count>,
    pub order: Vec<Text>,
    pub span: Span,
}

/// A named outcome of a run.
#[derive(Clone, Debug)]
pub struct Exit {
    pub name: Text,
    pub code: Spanned<i64>,
    pub message: Option<Text>,
    pub span: Span,
}

/// Changes to a stage of an extended workflow.
#[derive(Clone, Debug)]
pub struct Override {
    pub stage: Text,
    pub prompt: Option<Text>,
    pub prompt_file: Option<Text>,
    pub agent: Option<Text>,
    pub timeout: Option<Spanned<Dur>>,
    pub idle_timeout: Option<Spanned<Dur>>,
    pub retries: Option<Spanned<Count>>,
    pub max_iterations: Option<Spanned<Count>>,
    pub max_concurrency: Option<Spanned<Count>>,
    pub when: Option<Text>,
    pub optional: Option<Spanned<bool>>,
    pub budget: Option<Budget>,
    pub span: Span,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyword_enums_name_what_the_spec_accepts() {
        use crate::spec;
        assert_eq!(ExtractMode::NAMES, spec::EXTRACT_MODES);
        assert_eq!(AggregateMode::NAMES, spec::AGGREGATE_MODES);
        assert_eq!(Cleanup::NAMES, spec::CLEANUPS);
        assert_eq!(PromptVia::NAMES, spec::PROMPT_VIA);
        assert_eq!(OpenAiApi::NAMES, spec::OPENAI_APIS);
        assert_eq!(NotifyKind::NAMES, spec::NOTIFY_KINDS);
        assert_eq!(NotifyEvent::NAMES, spec::NOTIFY_EVENTS);
    }
}
