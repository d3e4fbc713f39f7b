//! Notifiers (`[notify.NAME]`): where a waiting gate, and the run's end when asked, is
//! announced. Declared by a workflow or by the user's config file; delivered by
//! `run/notify.rs`.

use super::{Count, Dur, Text};
use crate::source::{Span, Spanned};

keywords! {
    /// How a notifier delivers (`kind`).
    pub enum NotifyKind {
        Webhook = "webhook",
        Slack = "slack",
        Ntfy = "ntfy",
        Command = "command",
    }
}

keywords! {
    /// What a notifier announces (`on`).
    pub enum NotifyEvent {
        Gate = "gate",
        Finished = "finished",
        Failed = "failed",
        Cancelled = "cancelled",
    }
}

/// A notifier as written.
#[derive(Clone, Debug)]
pub struct Notify {
    pub name: Text,
    pub kind: Spanned<NotifyKind>,
    pub url: Option<Text>,
    pub url_env: Option<Text>,
    /// HTTP headers, each with the environment variable that holds its value.
    pub headers_env: Vec<(Text, Text)>,
    pub argv: Option<Vec<Text>>,
    /// The span of `argv` as written (an empty list has no item to point at).
    pub argv_span: Option<Span>,
    /// What it announces; `None`: `on` not written (gates only).
    pub on: Option<Vec<Spanned<NotifyEvent>>>,
    pub retries: Option<Spanned<Count>>,
    pub timeout: Option<Spanned<Dur>>,
    pub monitor_url: Option<Text>,
    pub span: Span,
}

impl Notify {
    /// Whether it announces `event` (gates when `on` is not written).
    pub fn announces(&self, event: NotifyEvent) -> bool {
        match &self.on {
            Some(on) => on.iter().any(|e| e.value == event),
            None => event == NotifyEvent::Gate,
        }
    }
}
