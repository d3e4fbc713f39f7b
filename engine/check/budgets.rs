//! `tokens` budgets over agents whose calls cannot, or may not, report what they used
//! (RF062): such a call is recorded with its usage unknown and is not counted, so the budget
//! may be passed without being seen.
//!
//! A `command` agent never reports usage. An `openai` agent reports what its server sends:
//! OpenAI's API sends usage on a streamed answer when asked (`stream_options`), but other
//! servers may not (llama-cpp-python's ignores the request), and which server answers cannot
//! be known before the run, so it is a warning that says "may". An `anthropic` agent is the
//! same: Anthropic's API sends usage, a compatible server at another `base_url` may not. The
//! CLI agents and `replay` report usage.

use std::collections::HashSet;

use super::{Checked, StageId};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::{Agent, AgentKind, Budget, StageKind};
use crate::source::Span;

/// Why an agent's calls may go uncounted.
enum Unreported {
    /// A `command` agent: a program's answer is its stdout, with no usage.
    Command,
    /// An `acp` agent: the protocol leaves usage to the agent (qwen reports none).
    Acp,
    /// An `openai` or `anthropic` agent on another server than its vendor's: where its
    /// `base_url` is written, and the URL rendered.
    Server(Vendor, Span, String),
}

/// Whose API an agent's kind speaks.
#[derive(Clone, Copy)]
enum Vendor {
    OpenAi,
    Anthropic,
}

impl Vendor {
    fn name(self) -> &'static str {
        match self {
            Vendor::OpenAi => "OpenAI",
            Vendor::Anthropic => "Anthropic",
        }
    }

    /// Whether a rendered `base_url` is the vendor's own API, which reports usage.
    fn serves(self, url: &str) -> bool {
        match self {
            Vendor::OpenAi => crate::model::is_openai_itself(Some(url)),
            Vendor::Anthropic => {
                let url = url.trim();
                let rest = url
                    .strip_prefix("https://")
                    .or_else(|| url.strip_prefix("http://"))
                    .unwrap_or(url);
                let host = rest.split(['/', ':']).next().unwrap_or("");
                host.eq_ignore_ascii_case("api.anthropic.com")
            }
        }
    }
}

/// Reports each tokens budget over an agent of [`Unreported`], once per budget and agent.
pub(super) fn check(c: &Checked<'_>, diags: &mut Diagnostics) {
    let mut seen: HashSet<(Span, String)> = HashSet::new();
    let every: Vec<StageId> = (0..c.stages.len()).map(StageId).collect();
    if let Some(b) = &c.workflow.budget {
        budget(c, b, "the run's", &every, &mut seen, diags);
    }
    for &id in &every {
        let stage = c.info(id).stage;
        let Some(b) = stage.keys().budget.as_deref() else {
            continue;
        };
        // A stage's budget counts its own calls; a loop's, those of every stage in it.
        let (whose, covered) = match stage.kind().value {
            StageKind::Agent => (format!("stage `{}`'s", stage.id.value), vec![id]),
            StageKind::Loop => (format!("loop `{}`'s", stage.id.value), below(c, id)),
            _ => continue,
        };
        budget(c, b, &whose, &covered, &mut seen, diags);
    }
}

/// The stages inside a region, at any depth.
fn below(c: &Checked<'_>, region: StageId) -> Vec<StageId> {
    let mut out = Vec::new();
    let mut todo = c.info(region).children.clone();
    while let Some(id) = todo.pop() {
        todo.extend(c.info(id).children.iter().copied());
        out.push(id);
    }
    out.sort_unstable();
    out
}

fn budget(
    c: &Checked<'_>,
    b: &Budget,
    whose: &str,
    covered: &[StageId],
    seen: &mut HashSet<(Span, String)>,
    diags: &mut Diagnostics,
) {
    let Some(tokens) = &b.tokens else {
        return;
    };
    for &id in covered {
        let stage = c.info(id).stage;
        for (agent, called_at) in c.stage_agents(stage) {
            let Some(why) = unreported(c, agent) else {
                continue;
            };
            if !seen.insert((tokens.span, agent.name.value.clone())) {
                continue;
            }
            let name = &agent.name.value;
            let calls = format!("stage `{}` calls agent `{name}`", stage.id.value);
            diags.push(match why {
                Unreported::Command => Diagnostic::new(
                    Code::UsageUnreported,
                    tokens.span,
                    format!(
                        "{whose} tokens budget cannot count the calls of agent `{name}`: a \
                         `command` agent reports no token usage"
                    ),
                )
                .label(format!("does not see what agent `{name}` uses"))
                .related(agent.kind.span, format!("agent `{name}` is a command"))
                .related(called_at, calls)
                .help(
                    "its calls are recorded with their usage unknown; bound the work with \
                     `max_iterations` or a `timeout`, or give these stages an agent that \
                     reports usage (an agent CLI such as claude, codex, gemini or qwen, or openai or anthropic)",
                ),
                Unreported::Acp => Diagnostic::new(
                    Code::UsageUnreported,
                    tokens.span,
                    format!(
                        "{whose} tokens budget may not count the calls of agent `{name}`: an \
                         `acp` agent reports usage only where its program does \
                         (claude-agent-acp, gemini and opencode do; qwen does not)"
                    ),
                )
                .label(format!("may not see what agent `{name}` uses"))
                .related(agent.kind.span, format!("agent `{name}` is an ACP agent"))
                .related(called_at, calls)
                .help(
                    "a call that reports none is recorded with its usage unknown, and the run \
                     says so once per agent; with an agent that reports none, bound the work \
                     with `max_iterations` or a `timeout` instead",
                ),
                Unreported::Server(vendor, at, url) => Diagnostic::new(
                    Code::UsageUnreported,
                    tokens.span,
                    format!(
                        "{whose} tokens budget may not count the calls of agent `{name}`: its \
                         server ({url}) is not {}'s, and some such servers send no token \
                         usage{}",
                        vendor.name(),
                        match vendor {
                            Vendor::OpenAi => " (llama-cpp-python's does not)",
                            Vendor::Anthropic => "",
                        }
                    ),
                )
                .label(format!("may not see what agent `{name}` uses"))
                .related(at, format!("not {}'s API", vendor.name()))
                .related(called_at, calls)
                .help(match vendor {
                    Vendor::OpenAi => {
                        "vLLM, llama.cpp's llama-server, LM Studio and Ollama send usage; a \
                         call that reports none is recorded with its usage unknown, and the run \
                         says so once per agent. Against a server that sends none, bound the \
                         work with `max_iterations` or a `timeout` instead"
                    }
                    Vendor::Anthropic => {
                        "a call that reports none is recorded with its usage unknown, and the \
                         run says so once per agent. Against a server that sends none, bound \
                         the work with `max_iterations` or a `timeout` instead"
                    }
                }),
            });
        }
    }
}

/// Why an agent's calls may go uncounted, if they may.
fn unreported(c: &Checked<'_>, a: &Agent) -> Option<Unreported> {
    let vendor = match a.kind.value {
        AgentKind::Command => return Some(Unreported::Command),
        AgentKind::Acp => return Some(Unreported::Acp),
        AgentKind::OpenAi => Vendor::OpenAi,
        AgentKind::Anthropic => Vendor::Anthropic,
        _ => return None,
    };
    let (at, url) = super::outputs::dialects::base_url(c, a)?;
    (!vendor.serves(&url)).then_some(Unreported::Server(vendor, at, url))
}
