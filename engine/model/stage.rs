//! Stages: their kind, the keys every stage has, the keys of each kind (`StageBody`), and
//! commands and routes.

use super::{Action, Aggregate, Budget, Count, Dur, Escalation, OutputSpec, Stuck, Text, Worktree};
use crate::source::{Span, Spanned};

/// The kind of a stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StageKind {
    Agent,
    Command,
    Gate,
    Check,
    Subflow,
    Loop,
    ForEach,
    Group,
}

impl StageKind {
    /// Parses the name written in files.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "agent" => StageKind::Agent,
            "command" => StageKind::Command,
            "gate" => StageKind::Gate,
            "check" => StageKind::Check,
            "subflow" => StageKind::Subflow,
            "loop" => StageKind::Loop,
            "for_each" => StageKind::ForEach,
            "group" => StageKind::Group,
            _ => return None,
        })
    }

    /// Returns the name as written in files.
    pub fn as_str(self) -> &'static str {
        match self {
            StageKind::Agent => "agent",
            StageKind::Command => "command",
            StageKind::Gate => "gate",
            StageKind::Check => "check",
            StageKind::Subflow => "subflow",
            StageKind::Loop => "loop",
            StageKind::ForEach => "for_each",
            StageKind::Group => "group",
        }
    }

    /// Tells whether the kind has a body of stages.
    pub fn is_region(self) -> bool {
        matches!(
            self,
            StageKind::Loop | StageKind::ForEach | StageKind::Group
        )
    }
}

/// A step of the workflow.
#[derive(Clone, Debug)]
pub struct Stage {
    pub id: Text,
    pub kind: Spanned<StageKind>,
    pub span: Span,
    pub description: Option<Text>,
    pub needs: Vec<Text>,
    pub when: Option<Text>,
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
    // Rare keys are boxed: a stage without them costs a pointer each, not the table.
    pub budget: Option<Box<Budget>>,
    pub output: Option<Box<OutputSpec>>,
    pub body: StageBody,
}

/// The keys of a stage that depend on its kind.
#[derive(Clone, Debug)]
pub enum StageBody {
    Agent {
        agent: Option<Text>,
        prompt: Option<Text>,
        prompt_file: Option<Text>,
    },
    Command(CommandSpec),
    Check {
        command: Option<CommandSpec>,
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
    Loop {
        max_iterations: Option<Spanned<Count>>,
        until: Option<Text>,
        on_exhausted: Option<Spanned<Action>>,
        stuck: Option<Box<Stuck>>,
        escalation: Vec<Escalation>,
        worktree: Option<Box<Worktree>>,
        stages: Vec<Stage>,
    },
    ForEach {
        over: Option<Text>,
        as_name: Option<Text>,
        key: Option<Text>,
        max_concurrency: Option<Spanned<Count>>,
        aggregate: Option<Box<Aggregate>>,
        result: Option<Text>,
        worktree: Option<Box<Worktree>>,
        stages: Vec<Stage>,
    },
    Group {
        max_concurrency: Option<Spanned<Count>>,
        aggregate: Option<Box<Aggregate>>,
        result: Option<Text>,
        stages: Vec<Stage>,
    },
}

impl Stage {
    /// Returns the body stages of a loop, for_each or group.
    pub fn children(&self) -> &[Stage] {
        match &self.body {
            StageBody::Loop { stages, .. }
            | StageBody::ForEach { stages, .. }
            | StageBody::Group { stages, .. } => stages,
            _ => &[],
        }
    }

    /// Returns the body stages mutably.
    pub fn children_mut(&mut self) -> Option<&mut Vec<Stage>> {
        match &mut self.body {
            StageBody::Loop { stages, .. }
            | StageBody::ForEach { stages, .. }
            | StageBody::Group { stages, .. } => Some(stages),
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
            StageBody::Loop {
                on_exhausted,
                stuck,
                ..
            } => {
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
