//! Stages: their kind, the keys every stage has, the keys of each kind (`StageBody`), and
//! commands and routes.

use super::{Action, Aggregate, Budget, Count, Dur, Escalation, OutputSpec, Stuck, Text, Worktree};
use serde_json::json;

use crate::source::{Span, Spanned};

pub use crate::spec::StageKind;

/// A step of the workflow.
#[derive(Clone, Debug)]
pub struct Stage {
    pub id: Text,
    /// Where `kind` is written: the kind itself is the body's ([`Stage::kind`]).
    kind_span: Span,
    pub span: Span,
    pub needs: Vec<Text>,
    pub body: StageBody,
    /// The keys any stage may have besides `id`, `kind` and `needs`; `None` when it has none
    /// (read them with [`Stage::keys`]). Out of line because most stages of a long workflow
    /// have few of them: a stage without them costs a pointer, not about 500 bytes.
    keys: Option<Box<StageKeys>>,
}

/// The keys any stage may have besides `id`, `kind` and `needs` (see [`Stage::keys`]).
#[derive(Clone, Debug, Default)]
pub struct StageKeys {
    pub description: Option<Text>,
    pub when: Option<Text>,
    /// `optional = true`: when the stage is skipped, the stages that need it run as if it had
    /// run (its skip does not spread to them).
    pub optional: Option<Spanned<bool>>,
    /// What a worker must have to carry out the stage's work (a run on workers).
    pub labels: Vec<Text>,
    pub route: Option<Box<Route>>,
    pub on_fail: Option<Spanned<Action>>,
    pub on_error: Option<Spanned<Action>>,
    pub then: Option<Spanned<Action>>,
    pub feedback: Option<Text>,
    pub timeout: Option<Spanned<Dur>>,
    pub idle_timeout: Option<Spanned<Dur>>,
    pub retries: Option<Spanned<Count>>,
    pub resource: Option<Text>,
    pub priority: Option<Text>,
    pub budget: Option<Box<Budget>>,
    pub output: Option<Box<OutputSpec>>,
    /// An agent stage's own `permissions` (a level or a policy), instead of its agent's.
    pub permissions: Option<Text>,
}

/// What [`Stage::keys`] gives for a stage without any.
static NO_KEYS: StageKeys = StageKeys {
    description: None,
    when: None,
    optional: None,
    labels: Vec::new(),
    route: None,
    on_fail: None,
    on_error: None,
    then: None,
    feedback: None,
    timeout: None,
    idle_timeout: None,
    retries: None,
    resource: None,
    priority: None,
    budget: None,
    output: None,
    permissions: None,
};

impl StageKeys {
    /// Tells whether the stage's skip counts as done for the stages that need it.
    pub fn is_optional(&self) -> bool {
        self.optional.as_ref().is_some_and(|o| o.value)
    }

    /// Tells whether no key is set.
    pub fn is_empty(&self) -> bool {
        let StageKeys {
            description,
            when,
            optional,
            labels,
            route,
            on_fail,
            on_error,
            then,
            feedback,
            timeout,
            idle_timeout,
            retries,
            resource,
            priority,
            budget,
            output,
            permissions,
        } = self;
        description.is_none()
            && when.is_none()
            && optional.is_none()
            && labels.is_empty()
            && route.is_none()
            && on_fail.is_none()
            && on_error.is_none()
            && then.is_none()
            && feedback.is_none()
            && timeout.is_none()
            && idle_timeout.is_none()
            && retries.is_none()
            && resource.is_none()
            && priority.is_none()
            && budget.is_none()
            && output.is_none()
            && permissions.is_none()
    }
}

impl Stage {
    /// Makes a stage; `keys` are kept only when one is set. `kind_span` is where its kind is
    /// written (the body says which kind it is).
    pub fn new(
        id: Text,
        kind_span: Span,
        span: Span,
        needs: Vec<Text>,
        body: StageBody,
        keys: StageKeys,
    ) -> Stage {
        Stage {
            id,
            kind_span,
            span,
            needs,
            body,
            keys: (!keys.is_empty()).then(|| Box::new(keys)),
        }
    }

    /// The stage's kind (its body's), with where it is written.
    pub fn kind(&self) -> Spanned<StageKind> {
        Spanned {
            value: self.body.kind(),
            span: self.kind_span,
        }
    }

    /// The keys any stage may have besides `id`, `kind` and `needs`.
    pub fn keys(&self) -> &StageKeys {
        self.keys.as_deref().unwrap_or(&NO_KEYS)
    }

    /// The keys, to change.
    pub fn keys_mut(&mut self) -> &mut StageKeys {
        self.keys.get_or_insert_with(Box::default)
    }
}

/// The keys of a stage that depend on its kind.
#[derive(Clone, Debug)]
pub enum StageBody {
    Agent {
        agent: Option<Text>,
        prompt: Option<Text>,
        prompt_file: Option<Text>,
    },
    Command(Box<CommandSpec>),
    Check {
        command: Option<Box<CommandSpec>>,
        pass_codes: Vec<Spanned<i64>>,
        expect: Option<Text>,
    },
    Gate {
        message: Option<Text>,
        show: Vec<Text>,
        on_timeout: Option<Spanned<Action>>,
        on_reject: Option<Spanned<Action>>,
    },
    Subflow {
        workflow: Option<Text>,
        params: Vec<(Text, Text)>,
    },
    /// Out of line (as `ForEach`): a loop's keys would make every stage's body twice as
    /// large.
    Loop(Box<LoopBody>),
    ForEach(Box<ForEachBody>),
    Group {
        max_concurrency: Option<Spanned<Count>>,
        aggregate: Option<Box<Aggregate>>,
        result: Option<Text>,
        stages: Vec<Stage>,
    },
}

/// A text of a stage's own body, as the checker reads it (see [`StageBody::texts`]).
#[derive(Clone, Copy, Debug)]
pub enum BodyText<'a> {
    /// A template rendered when the stage starts: it sees what the stage needs.
    Template(&'a Text),
    /// An argv item: a template whose value reaches the program as arguments (the only
    /// place `spread` may stand).
    Argv(&'a Text),
    /// An expression evaluated once the stage ran, over its own output too.
    Verdict(&'a Text),
    /// An agent's name: a template over params only, each choice of which must name an
    /// agent.
    AgentName(&'a Text),
}

impl StageBody {
    /// The texts of a stage's own body that are templates or expressions, each with how it
    /// is read: what the checker checks, for every kind but the regions (a region's texts
    /// are read at places in its body, which the checker knows). A new kind lists its texts
    /// here, and the checker needs no change.
    pub fn texts(&self) -> Vec<BodyText<'_>> {
        let mut out = Vec::new();
        match self {
            StageBody::Agent { agent, prompt, .. } => {
                out.extend(
                    agent
                        .iter()
                        .filter(|a| a.value.contains("{{"))
                        .map(BodyText::AgentName),
                );
                out.extend(prompt.iter().map(BodyText::Template));
            }
            StageBody::Command(cmd)
            | StageBody::Check {
                command: Some(cmd), ..
            } => {
                out.extend(cmd.argv.iter().map(BodyText::Argv));
                out.extend(
                    cmd.cwd
                        .iter()
                        .chain(&cmd.stdin)
                        .chain(cmd.env.iter().map(|(_, v)| v))
                        .map(BodyText::Template),
                );
            }
            _ => {}
        }
        match self {
            StageBody::Check {
                expect: Some(x), ..
            } => out.push(BodyText::Verdict(x)),
            StageBody::Gate { message, show, .. } => {
                out.extend(message.iter().chain(show).map(BodyText::Template));
            }
            StageBody::Subflow { params, .. } => {
                out.extend(params.iter().map(|(_, v)| BodyText::Template(v)));
            }
            _ => {}
        }
        out
    }

    /// The prompt file an agent stage names, read and checked whole.
    pub fn prompt_file(&self) -> Option<&Text> {
        match self {
            StageBody::Agent { prompt_file, .. } => prompt_file.as_ref(),
            _ => None,
        }
    }

    /// The kind of stage this body makes: one body per kind, so the two never disagree.
    pub fn kind(&self) -> StageKind {
        match self {
            StageBody::Agent { .. } => StageKind::Agent,
            StageBody::Command(_) => StageKind::Command,
            StageBody::Check { .. } => StageKind::Check,
            StageBody::Gate { .. } => StageKind::Gate,
            StageBody::Subflow { .. } => StageKind::Subflow,
            StageBody::Loop(_) => StageKind::Loop,
            StageBody::ForEach(_) => StageKind::ForEach,
            StageBody::Group { .. } => StageKind::Group,
        }
    }
}

/// The keys of a loop stage.
#[derive(Clone, Debug)]
pub struct LoopBody {
    pub max_iterations: Option<Spanned<Count>>,
    pub until: Option<Text>,
    pub on_exhausted: Option<Spanned<Action>>,
    pub stuck: Option<Box<Stuck>>,
    pub escalation: Vec<Escalation>,
    pub worktree: Option<Box<Worktree>>,
    pub stages: Vec<Stage>,
}

/// The keys of a for_each stage.
#[derive(Clone, Debug)]
pub struct ForEachBody {
    pub over: Option<Text>,
    pub as_name: Option<Text>,
    pub key: Option<Text>,
    pub max_concurrency: Option<Spanned<Count>>,
    pub aggregate: Option<Box<Aggregate>>,
    pub result: Option<Text>,
    pub worktree: Option<Box<Worktree>>,
    pub stages: Vec<Stage>,
}

impl StageBody {
    /// The keys of a loop.
    pub fn as_loop(&self) -> Option<&LoopBody> {
        match self {
            StageBody::Loop(l) => Some(l),
            _ => None,
        }
    }

    /// The keys of a for_each.
    pub fn as_for_each(&self) -> Option<&ForEachBody> {
        match self {
            StageBody::ForEach(f) => Some(f),
            _ => None,
        }
    }

    /// The `worktree` of a loop or for_each.
    pub fn worktree(&self) -> Option<&Worktree> {
        match self {
            StageBody::Loop(l) => l.worktree.as_deref(),
            StageBody::ForEach(f) => f.worktree.as_deref(),
            _ => None,
        }
    }
}

impl Stage {
    /// Returns the body stages of a loop, for_each or group.
    pub fn children(&self) -> &[Stage] {
        match &self.body {
            StageBody::Loop(l) => &l.stages,
            StageBody::ForEach(f) => &f.stages,
            StageBody::Group { stages, .. } => stages,
            _ => &[],
        }
    }

    /// Returns the body stages mutably.
    pub fn children_mut(&mut self) -> Option<&mut Vec<Stage>> {
        match &mut self.body {
            StageBody::Loop(l) => Some(&mut l.stages),
            StageBody::ForEach(f) => Some(&mut f.stages),
            StageBody::Group { stages, .. } => Some(stages),
            _ => None,
        }
    }
}

impl Stage {
    /// The stages this one runs instead of giving up: a loop's `on_exhausted` and
    /// `stuck.then`, a gate's `on_timeout`, when they name a stage (with the key's name).
    pub fn give_up_targets(&self) -> Vec<(&'static str, &Spanned<Action>)> {
        let mut out = Vec::new();
        match &self.body {
            StageBody::Loop(l) => {
                let LoopBody {
                    on_exhausted,
                    stuck,
                    ..
                } = &**l;
                out.extend(on_exhausted.iter().map(|a| ("exhausted", a)));
                out.extend(
                    stuck
                        .iter()
                        .filter_map(|s| s.then.as_ref())
                        .map(|a| ("stuck", a)),
                );
            }
            StageBody::Gate { on_timeout, .. } => {
                out.extend(on_timeout.iter().map(|a| ("timeout", a)));
            }
            _ => {}
        }
        out.retain(|(_, a)| matches!(a.value, Action::Goto(_)));
        out
    }
}

/// A command to run: never through a shell.
#[derive(Clone, Debug)]
pub struct CommandSpec {
    pub argv: Vec<Text>,
    pub cwd: Option<Text>,
    pub env: Vec<(Text, Text)>,
    pub stdin: Option<Text>,
    pub ok_codes: Vec<Spanned<i64>>,
}

impl CommandSpec {
    /// Shows the argv as written, separated by spaces (for people, not for a shell).
    pub fn display(&self) -> String {
        self.argv
            .iter()
            .map(|a| a.value.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Routing on a field of a stage's output.
#[derive(Clone, Debug)]
pub struct Route {
    pub on: Text,
    pub cases: Vec<(Text, Spanned<Action>)>,
    pub default: Option<Spanned<Action>>,
    pub span: Span,
}

impl StageKind {
    /// The schema of what a stage of this kind produces without an `output` of its own:
    /// what templates may read of it (`stages.NAME.output.FIELD`), checked statically.
    pub fn output_schema(self) -> serde_json::Value {
        match self {
            StageKind::Agent => {
                json!({"type": "object", "properties": {"text": {"type": "string"}}})
            }
            StageKind::Command => json!({"type": "object", "properties": {
                "exit_code": {"type": "integer"}, "stdout": {"type": "string"}, "stderr": {"type": "string"}
            }}),
            StageKind::Check => json!({"type": "object", "properties": {
                "passed": {"type": "boolean"}, "exit_code": {"type": "integer"},
                "stdout": {"type": "string"}, "stderr": {"type": "string"}
            }}),
            StageKind::Gate => json!({"type": "object", "properties": {
                "approved": {"type": "boolean"}, "comment": {"type": "string"}, "by": {"type": "string"}, "at": {"type": "string"}
            }}),
            StageKind::Subflow => json!({"type": "object", "properties": {
                "exit": {"type": "string"}, "code": {"type": "integer"}, "outputs": {"type": "object"}
            }}),
            StageKind::Loop => json!({"type": "object", "properties": {
                "iterations": {"type": "integer"}, "outcome": {"type": "string"},
                "history": {"type": "array", "items": {"type": "object", "properties": {
                    "iteration": {"type": "integer"}, "feedback": {"type": "string"}, "outputs": {"type": "object"}
                }}}
            }}),
            StageKind::ForEach | StageKind::Group => json!({"type": "object", "properties": {
                "results": {"type": "array"}, "value": {}
            }}),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A workflow of 10,000 stages holds 10,000 of these for the whole run: keys that most
    /// stages lack stay out of line (see [`StageKeys`], [`LoopBody`], [`ForEachBody`]).
    #[test]
    fn a_stage_stays_small() {
        let (stage, body) = (size_of::<Stage>(), size_of::<StageBody>());
        assert!(
            stage <= 264 && body <= 160,
            "Stage {stage} bytes, StageBody {body}"
        );
    }
}
