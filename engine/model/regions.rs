//! What loops and fan-outs hold besides their stages: stuck detection, escalation rules,
//! aggregates; and git worktrees (of a loop, a for_each or the whole run).

use super::{Action, Count, Text};
use crate::source::{Span, Spanned};

/// Stuck detection of a loop.
#[derive(Clone, Debug)]
pub struct Stuck {
    pub on: Text,
    pub repeats: Option<Spanned<Count>>,
    pub then: Option<Spanned<Action>>,
    pub span: Span,
}

/// An escalation rule of a loop.
#[derive(Clone, Debug)]
pub struct Escalation {
    pub when: Text,
    pub run: Vec<Text>,
    pub description: Option<Text>,
    pub span: Span,
}

keywords! {
    /// How a fan-out's results are combined (`aggregate.mode`).
    pub enum AggregateMode {
        Collect = "collect",
        All = "all",
        Any = "any",
        Worst = "worst",
        Best = "best",
        Highest = "highest",
        Lowest = "lowest",
    }
}

/// How fan-out results are combined.
#[derive(Clone, Debug)]
pub struct Aggregate {
    pub mode: Spanned<AggregateMode>,
    pub field: Option<Text>,
    pub order: Vec<Text>,
    pub span: Span,
}

keywords! {
    /// When a worktree is removed (`worktree.cleanup`).
    #[derive(Default)]
    pub enum Cleanup {
        #[default]
        OnSuccess = "on_success",
        Always = "always",
        Never = "never",
    }
}

/// An isolated git worktree.
#[derive(Clone, Debug)]
pub struct Worktree {
    pub branch: Text,
    pub base: Option<Text>,
    pub cleanup: Option<Spanned<Cleanup>>,
    pub span: Span,
}
