//! What an agent does while it works, as a backend that sees it reports it ([`Activity`]):
//! its tool calls and plan steps on the stage's progress line, and every step worth keeping
//! as an event of the stage (`tool`, `plan`, `permission`, `wrote`), written at once so that
//! the monitor shows it live. A worker that makes a run's agent call writes the same events
//! itself ([`Seen::describe`]).

use std::collections::HashMap;
use std::future::Future;

use tokio::sync::mpsc::UnboundedReceiver;

use super::exec::Shared;
use crate::backend::{Activity, AgentCall};

/// Runs `call` while showing what its agent reports on `rx`; what is reported after the
/// call returns (still queued) is shown too.
pub(super) async fn watching<T>(
    shared: &Shared,
    call: &AgentCall,
    work: impl Future<Output = T>,
    rx: UnboundedReceiver<Activity>,
) -> T {
    watching_with(
        work,
        rx,
        |step| {
            let (scope, stage) = (call.scope.as_str(), call.stage.as_str());
            if let Some(doing) = &step.doing {
                shared.progress.doing(scope, stage, doing);
            }
            if let Some(note) = &step.note {
                shared.progress.note(note);
            }
            if let Some((kind, text)) = step.event {
                shared.event(scope, stage, kind, text);
                shared.flush();
            }
        },
        call,
    )
    .await
}

/// Runs `work` while each activity on `rx` is described ([`Seen::describe`]) and handed to
/// `show`.
pub(super) async fn watching_with<T>(
    work: impl Future<Output = T>,
    mut rx: UnboundedReceiver<Activity>,
    mut show: impl FnMut(Step),
    call: &AgentCall,
) -> T {
    let mut seen = Seen::default();
    tokio::pin!(work);
    let out = loop {
        tokio::select! {
            out = &mut work => break out,
            Some(a) = rx.recv() => {
                if let Some(step) = seen.describe(&call.stage, a) {
                    show(step);
                }
            }
        }
    };
    while let Ok(a) = rx.try_recv() {
        if let Some(step) = seen.describe(&call.stage, a) {
            show(step);
        }
    }
    out
}

/// What to show of one activity.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Step {
    /// What the agent does now, for the stage's progress line.
    pub doing: Option<String>,
    /// A line of its own in the progress (a denied permission).
    pub note: Option<String>,
    /// The event to keep: its kind and message.
    pub event: Option<(&'static str, String)>,
}

/// What has been shown of one call: the tool calls' titles and last statuses.
#[derive(Default)]
pub(super) struct Seen {
    tools: HashMap<String, (String, String)>,
}

impl Seen {
    /// What to show of an activity of `stage`'s agent; `None` when it is no news (a tool
    /// call's status repeated).
    pub(super) fn describe(&mut self, stage: &str, a: Activity) -> Option<Step> {
        Some(match a {
            Activity::Tool {
                id,
                title,
                kind,
                status,
            } => {
                let entry = self.tools.entry(id).or_default();
                let new = entry.1.is_empty();
                // A later update may leave the title out (keep the last one), or give a
                // better one (claude-agent-acp starts a write as `Preparing file…`, a command
                // as `Terminal`, and names them once their input is streamed).
                let retitled = !title.is_empty() && title != entry.0;
                if retitled {
                    entry.0 = title;
                }
                if entry.1 == status {
                    let ends = matches!(status.as_str(), "completed" | "failed");
                    return (retitled && !ends).then(|| Step {
                        doing: Some(format!("⚙ {}", entry.0)),
                        ..Step::default()
                    });
                }
                entry.1 = status.clone();
                let title = entry.0.clone();
                let ends = matches!(status.as_str(), "completed" | "failed");
                Step {
                    doing: (!ends).then(|| format!("⚙ {title}")),
                    note: None,
                    // Its start and its end are kept; `pending` to `in_progress` is not news.
                    event: (new || ends).then(|| ("tool", format!("{kind}: {title} ({status})"))),
                }
            }
            Activity::Plan(entries) => {
                let done = entries.iter().filter(|(_, s)| s == "completed").count();
                let doing = entries
                    .iter()
                    .find(|(_, s)| s == "in_progress")
                    .or_else(|| entries.iter().find(|(_, s)| s != "completed"))
                    .map(|(step, _)| format!("plan {}/{}: {step}", done + 1, entries.len()));
                let text = entries
                    .iter()
                    .map(|(t, s)| {
                        let mark = match s.as_str() {
                            "completed" => "[x]",
                            "in_progress" => "[~]",
                            _ => "[ ]",
                        };
                        format!("{mark} {t}")
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
                Step {
                    doing,
                    note: None,
                    event: Some(("plan", text)),
                }
            }
            Activity::Permission { asked, decision } => Step {
                doing: None,
                note: (!decision.allowed).then(|| format!("⛔ {stage}: {asked}: {decision}")),
                event: Some(("permission", format!("{asked}: {decision}"))),
            },
            Activity::Wrote(path) => Step {
                doing: Some(format!("wrote {path}")),
                note: None,
                event: Some(("wrote", path)),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(id: &str, title: &str, status: &str) -> Activity {
        Activity::Tool {
            id: id.into(),
            title: title.into(),
            kind: "execute".into(),
            status: status.into(),
        }
    }

    #[test]
    fn a_tool_call_is_kept_when_it_starts_and_when_it_ends() {
        let mut seen = Seen::default();
        let start = seen
            .describe("s", tool("t1", "cargo test", "pending"))
            .expect("news");
        assert_eq!(start.doing.as_deref(), Some("⚙ cargo test"));
        assert_eq!(
            start.event,
            Some(("tool", "execute: cargo test (pending)".to_string()))
        );
        // A better title, same status: the progress line only.
        let renamed = seen
            .describe("s", tool("t1", "cargo test --all", "pending"))
            .expect("news");
        assert_eq!(renamed.doing.as_deref(), Some("⚙ cargo test --all"));
        assert_eq!(renamed.event, None);
        // Running: on the progress line only; the title left out keeps the last.
        let running = seen
            .describe("s", tool("t1", "", "in_progress"))
            .expect("news");
        assert_eq!(running.doing.as_deref(), Some("⚙ cargo test --all"));
        assert_eq!(running.event, None);
        assert_eq!(seen.describe("s", tool("t1", "", "in_progress")), None);
        let end = seen
            .describe("s", tool("t1", "", "completed"))
            .expect("news");
        assert_eq!(end.doing, None);
        assert_eq!(
            end.event,
            Some(("tool", "execute: cargo test --all (completed)".to_string()))
        );
    }

    #[test]
    fn a_plan_shows_its_current_step_and_a_denial_its_rule() {
        let mut seen = Seen::default();
        let plan = seen
            .describe(
                "s",
                Activity::Plan(vec![
                    ("read".into(), "completed".into()),
                    ("fix".into(), "in_progress".into()),
                    ("test".into(), "pending".into()),
                ]),
            )
            .expect("news");
        assert_eq!(plan.doing.as_deref(), Some("plan 2/3: fix"));
        assert_eq!(
            plan.event,
            Some(("plan", "[x] read\n[~] fix\n[ ] test".to_string()))
        );
        let rules = crate::permit::Rules::level("commit").expect("level");
        let decision = rules.decide(
            &crate::permit::Action::Execute("git push".into()),
            std::path::Path::new("/"),
        );
        let denied = seen
            .describe(
                "review",
                Activity::Permission {
                    asked: "git push".into(),
                    decision,
                },
            )
            .expect("news");
        assert_eq!(
            denied.note.as_deref(),
            Some("⛔ review: git push: denied by policy `commit`: deny `git push *` (git push)")
        );
    }
}
