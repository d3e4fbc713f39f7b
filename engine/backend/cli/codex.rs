//! `codex exec --json`: its events (the current ones and the older `msg` ones), its errors
//! and the denials its log reports.

use std::sync::LazyLock;

use regex::Regex;
use serde::Deserialize;

use super::classify::{classify, no_result, retry_hint};
use super::output::{detect_window, json_object};
use crate::backend::de::lenient;
use crate::backend::process::ProcOutput;
use crate::backend::{AgentReply, CallError, Usage};

/// A line of `codex exec --json`: an event, or an event of the older format, wrapped in
/// `msg`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Line {
    Event(Event),
    Older { msg: OlderEvent },
}

/// An event of the current format. Others (`turn.started`, `item.started`...) are ignored.
#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
enum Event {
    #[serde(rename = "thread.started")]
    ThreadStarted {
        #[serde(default, deserialize_with = "lenient")]
        thread_id: Option<String>,
    },
    #[serde(rename = "item.completed")]
    ItemCompleted {
        #[serde(default, deserialize_with = "lenient")]
        item: Item,
    },
    #[serde(rename = "turn.completed")]
    TurnCompleted {
        #[serde(default, deserialize_with = "lenient")]
        usage: Option<TokenUsage>,
    },
    #[serde(rename = "turn.failed")]
    TurnFailed {
        #[serde(default, deserialize_with = "lenient")]
        error: Option<Failure>,
    },
    /// An error, or a notice the agent may recover from ("Reconnecting...").
    #[serde(rename = "error")]
    Error {
        #[serde(default, deserialize_with = "lenient")]
        message: Option<String>,
    },
    #[serde(other)]
    Other,
}

/// An event of the older format, in `msg`.
#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
enum OlderEvent {
    #[serde(rename = "session_configured")]
    SessionConfigured {
        #[serde(default, deserialize_with = "lenient")]
        session_id: Option<String>,
    },
    #[serde(rename = "agent_message")]
    AgentMessage {
        #[serde(default, deserialize_with = "lenient")]
        message: Option<String>,
    },
    /// The totals so far, in `info.total_token_usage` or in the event itself.
    #[serde(rename = "token_count")]
    TokenCount {
        #[serde(default, deserialize_with = "lenient")]
        info: Option<TokenInfo>,
        #[serde(flatten)]
        usage: TokenUsage,
    },
    #[serde(rename = "task_complete")]
    TaskComplete {
        #[serde(default, deserialize_with = "lenient")]
        last_agent_message: Option<String>,
    },
    #[serde(rename = "error")]
    Error {
        #[serde(default, deserialize_with = "lenient")]
        message: Option<String>,
    },
    #[serde(other)]
    Other,
}

/// A completed item: the agent's message is the answer; tool calls and the like are not.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Item {
    #[serde(rename = "type", deserialize_with = "lenient")]
    kind: Option<String>,
    /// The type, as some versions name it.
    #[serde(deserialize_with = "lenient")]
    item_type: Option<String>,
    #[serde(deserialize_with = "lenient")]
    text: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Failure {
    #[serde(deserialize_with = "lenient")]
    message: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TokenInfo {
    #[serde(deserialize_with = "lenient")]
    total_token_usage: Option<TokenUsage>,
}

/// OpenAI's token counts: `input_tokens` includes the cached ones.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TokenUsage {
    #[serde(deserialize_with = "lenient")]
    input_tokens: u64,
    #[serde(deserialize_with = "lenient")]
    output_tokens: u64,
    #[serde(deserialize_with = "lenient")]
    cached_input_tokens: u64,
}

impl From<TokenUsage> for Usage {
    fn from(u: TokenUsage) -> Self {
        Usage {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            cached_tokens: u.cached_input_tokens,
            cost_usd: None,
        }
    }
}

/// Whether stdout holds the end of codex's turn.
pub(super) fn done(stdout: &[u8]) -> bool {
    detect_window(stdout)
        .lines()
        .filter_map(|l| json_object::<Line>(l.trim()))
        .any(|line| {
            matches!(
                line,
                Line::Event(Event::TurnCompleted { .. } | Event::TurnFailed { .. })
                    | Line::Older {
                        msg: OlderEvent::TaskComplete { .. }
                    }
            )
        })
}

/// Parses the events of `codex exec --json`: the current ones (`thread.started`,
/// `item.completed`, `turn.completed`, `turn.failed`, `error`) and the older
/// `{"msg": {...}}` ones (`session_configured`, `agent_message`, `token_count`,
/// `task_complete`, `error`).
pub(super) fn parse(out: &ProcOutput) -> Result<AgentReply, CallError> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut reply = AgentReply::default();
    let mut text = None;
    let mut completed = false;
    let mut failure = None;
    let mut last_error = None;
    for line in stdout.lines().filter_map(|l| json_object::<Line>(l.trim())) {
        match line {
            Line::Event(event) => match event {
                Event::ThreadStarted { thread_id } => reply.session_id = thread_id,
                Event::ItemCompleted { item } => {
                    if matches!(
                        item.kind.or(item.item_type).as_deref(),
                        Some("agent_message" | "assistant_message")
                    ) {
                        text = item.text;
                    }
                }
                Event::TurnCompleted { usage } => {
                    if let Some(u) = usage {
                        reply.usage.add(&u.into());
                    }
                    completed = true;
                }
                Event::TurnFailed { error } => {
                    failure = Some(
                        error
                            .and_then(|e| e.message)
                            .unwrap_or_else(|| "the turn failed".into()),
                    );
                }
                Event::Error { message } => last_error = message,
                Event::Other => {}
            },
            Line::Older { msg } => match msg {
                OlderEvent::SessionConfigured { session_id } => reply.session_id = session_id,
                OlderEvent::AgentMessage { message } => text = message,
                OlderEvent::TokenCount { info, usage } => {
                    // Totals so far: the last one counts.
                    reply.usage = info
                        .and_then(|i| i.total_token_usage)
                        .unwrap_or(usage)
                        .into();
                }
                OlderEvent::TaskComplete { last_agent_message } => {
                    if let Some(t) = last_agent_message {
                        text = Some(t);
                    }
                    completed = true;
                }
                OlderEvent::Error { message } => last_error = message,
                OlderEvent::Other => {}
            },
        }
    }
    // An `error` event alone may be a notice the agent recovered from ("Reconnecting...").
    let failure = failure.or_else(|| last_error.filter(|_| !completed));
    match failure {
        None if completed || (out.code == Some(0) && text.is_some()) => Ok(AgentReply {
            text: text.unwrap_or_default(),
            denied: denials(&String::from_utf8_lossy(&out.stderr)),
            ..reply
        }),
        None => {
            let all = format!("{}\n{}", stdout, String::from_utf8_lossy(&out.stderr));
            Err(no_result("codex", out, &all))
        }
        Some(message) => Err(classify(&message, retry_hint(&message), || {
            CallError::Failed {
                message: format!("codex: {message}"),
            }
        })),
    }
}

/// Actions codex reports it refused: its JSON events do not say (a refused patch, a
/// command failing on the read-only file system look like any tool output), but its log on
/// stderr does: `ERROR codex_core::tools::router: error=patch rejected: writing is blocked
/// by read-only sandbox; rejected by user approval settings`.
fn denials(stderr: &str) -> Vec<String> {
    static DENIED: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"(?m)ERROR codex_core::tools::router: error=(.*(?:rejected|blocked|denied).*)$")
            .expect("the denial pattern is valid")
    });
    DENIED
        .captures_iter(stderr)
        .map(|c| c[1].trim().to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::Value;

    use super::*;
    use crate::backend::cli::classify::clock_hint;
    use crate::backend::cli::test_support::{REPLY, argv_of};
    use crate::model::{AgentKind, Permissions};

    #[test]
    fn the_detector_sees_complete_results_only() {
        assert!(done(
            b"{\"type\":\"turn.started\"}\n{\"type\":\"turn.completed\"}\n"
        ));
        assert!(!done(b"{\"type\":\"turn.started\"}\n"));
    }

    #[test]
    fn real_successes_parse() {
        let codex = parse(&capture!("codex", "ok")).expect("a reply");
        assert_eq!(codex.text, REPLY);
        assert_eq!(
            (codex.usage.input_tokens, codex.usage.output_tokens),
            (4321, 765)
        );
        assert_eq!(codex.usage.cached_tokens, 98);
        let structured = parse(&capture!("codex", "structured")).expect("a reply");
        assert_eq!(
            serde_json::from_str::<Value>(&structured.text).expect("JSON"),
            serde_json::json!({"verdict": "MOCK-REPLY-4F7", "count": 3})
        );
    }

    #[test]
    fn codex_high_demand_is_transient() {
        let e = parse(&capture!("codex", "server_error")).expect_err("an error");
        assert!(matches!(e, CallError::Transient { .. }), "{e:?}");
        let e = parse(&capture!("codex", "overloaded")).expect_err("an error");
        assert!(matches!(e, CallError::Transient { .. }), "{e:?}");
        let e = parse(&capture!("codex", "rate_limit")).expect_err("an error");
        assert!(matches!(e, CallError::RateLimited { .. }), "{e:?}");
        let e = parse(&capture!("codex", "invalid_key")).expect_err("an error");
        assert!(matches!(e, CallError::Missing { .. }), "{e:?}");
    }

    #[test]
    fn codex_outside_a_git_repo_is_permanent_and_avoided() {
        let e = parse(&capture!("codex", "untrusted")).expect_err("an error");
        assert!(matches!(e, CallError::Failed { .. }), "{e:?}");
        assert!(
            argv_of(AgentKind::Codex, Permissions::ReadOnly)
                .contains(&"--skip-git-repo-check".to_string())
        );
    }

    #[test]
    fn codex_usage_limit_clock_time_gives_the_wait() {
        let e = parse(&capture!("codex", "usage_limit")).expect_err("an error");
        let CallError::RateLimited { retry_after, .. } = e else {
            panic!("a rate limit: {e:?}");
        };
        let wait = retry_after.expect("a wait");
        assert!(wait <= Duration::from_secs(86_400), "{wait:?}");
        // 2026-11-23 11:47:00 UTC.
        let now = 1_795_434_420;
        let msg = "You’ve hit your usage limit. Upgrade to Pro, visit https://chatgpt.com/settings/usage to purchase more credits or try again at 12:47 PM.";
        assert_eq!(clock_hint(msg, now, 0), Some(Duration::from_secs(3600)));
        assert_eq!(clock_hint(msg, now, 3600), Some(Duration::ZERO));
        assert_eq!(
            clock_hint("try again at 8:35 AM.", now, 0),
            Some(Duration::from_secs(
                86_400 - (11 * 3600 + 47 * 60) + 8 * 3600 + 35 * 60
            ))
        );
        assert_eq!(
            clock_hint("or try again at Nov 24th, 2026 12:05 AM.", now, 0),
            Some(Duration::from_secs(86_400 - (11 * 3600 + 47 * 60) + 5 * 60))
        );
    }

    #[test]
    fn codex_denials_come_from_its_log() {
        let reply = parse(&capture!("codex", "write_read_only")).expect("a reply");
        assert_eq!(reply.denied.len(), 1, "{:?}", reply.denied);
        assert!(
            reply.denied[0].starts_with("patch rejected"),
            "{:?}",
            reply.denied
        );
        let reply = parse(&capture!("codex", "write_workspace")).expect("a reply");
        assert!(reply.denied.is_empty());
    }

    #[test]
    fn unknown_events_and_fields_are_ignored() {
        let out = crate::backend::cli::test_support::captured(
            concat!(
                "{\"type\":\"thread.started\",\"thread_id\":\"t-1\"}\n",
                "{\"type\":\"some.new_event\",\"payload\":[1,2]}\n",
                "{\"type\":\"item.completed\",\"item\":{\"type\":\"agent_message\",\"text\":\"hi\",\"extra\":{}}}\n",
                "{\"type\":\"turn.completed\",\"usage\":{\"input_tokens\":5,\"output_tokens\":\"2\"}}\n",
            ),
            "",
            "0",
        );
        let reply = parse(&out).expect("a reply");
        assert_eq!(reply.text, "hi");
        assert_eq!(reply.session_id.as_deref(), Some("t-1"));
        assert_eq!(
            (reply.usage.input_tokens, reply.usage.output_tokens),
            (5, 0)
        );
    }
}
