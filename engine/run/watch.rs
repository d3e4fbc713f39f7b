//! What an agent does while it works, as a backend that sees it reports it ([`Activity`]):
//! its tool calls and plan steps on the stage's progress line, and every step worth keeping
//! as an event of the stage (`tool`, `plan`, `permission`, `wrote`), written at once so that
//! the monitor shows it live.

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
    mut rx: UnboundedReceiver<Activity>,
) -> T {
    let mut seen = Seen::default();
    tokio::pin!(work);
    let out = loop {
        tokio::select! {
            out = &mut work => break out,
            Some(a) = rx.recv() => seen.show(shared, call, a),
        }
    };
    while let Ok(a) = rx.try_recv() {
        seen.show(shared, call, a);
    }
    out
}

/// What has been shown of one call: the tool calls' last statuses.
#[derive(Default)]
struct Seen {
    tools: HashMap<String, (String, String)>,
}

impl Seen {
    fn show(&mut self, shared: &Shared, call: &AgentCall, a: Activity) {
        let (scope, stage) = (call.scope.as_str(), call.stage.as_str());
        let (kind, text) = match a {
            Activity::Tool {
                id,
                title,
                kind,
                status,
            } => {
                let entry = self.tools.entry(id).or_default();
                let new = entry.1.is_empty();
                // A later update may leave the title out: keep the first one.
                if !title.is_empty() {
                    entry.0 = title;
                }
                if entry.1 == status {
                    return;
                }
                entry.1 = status.clone();
                let title = entry.0.clone();
                let ends = matches!(status.as_str(), "completed" | "failed");
                if !ends {
                    shared.progress.doing(scope, stage, &format!("⚙ {title}"));
                }
                // Its start and its end are kept; `pending` to `in_progress` is not news.
                if !new && !ends {
                    return;
                }
                ("tool", format!("{kind}: {title} ({status})"))
            }
            Activity::Plan(entries) => {
                let done = entries.iter().filter(|(_, s)| s == "completed").count();
                if let Some((step, _)) = entries
                    .iter()
                    .find(|(_, s)| s == "in_progress")
                    .or_else(|| entries.iter().find(|(_, s)| s != "completed"))
                {
                    shared.progress.doing(
                        scope,
                        stage,
                        &format!("plan {}/{}: {step}", done + 1, entries.len()),
                    );
                }
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
                ("plan", text)
            }
            Activity::Permission { asked, decision } => {
                if !decision.allowed {
                    shared
                        .progress
                        .note(&format!("⛔ {stage}: {asked}: {decision}"));
                }
                ("permission", format!("{asked}: {decision}"))
            }
            Activity::Wrote(path) => ("wrote", path),
        };
        shared.event(scope, stage, kind, text);
        shared.flush();
    }
}
