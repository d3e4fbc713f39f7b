//! Agent backends: one trait, one call per fresh context.
//!
//! A backend turns an [`AgentCall`] (a rendered prompt and settings) into an [`AgentReply`]
//! (the final text and the usage) or a classified [`CallError`]. The executor decides what
//! an error means: transient errors retry with backoff, rate limits pause without using up an
//! attempt (or hand over to a fallback agent), a missing backend hands over to a fallback.
//! Cancellation is by dropping the future: every backend kills what it started when dropped.

pub mod acp;
pub mod cli;
mod de;
pub mod http;
pub mod process;
pub mod replay;
mod setup;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::store::Usage;
pub use setup::{BuildError, PreflightError, build, find_program, key_variables, preflight};

/// What a backend can do natively.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// The backend reports cost in dollars.
    pub cost: bool,
    /// The backend reports token usage.
    pub usage: bool,
}

/// One call to an agent with a fresh context. Serialized (without its directories, which
/// are the machine's own) as a unit of work hands it to a worker (`run::units::AgentWork`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AgentCall {
    /// The stage id (for logs and record/replay keys).
    pub stage: String,
    /// Where in the run the stage is (`""` at the top level, `attempts#3`, `tickets#T-1`...).
    pub scope: String,
    /// The attempt number, from 1.
    pub attempt: u32,
    pub prompt: String,
    pub model: Option<String>,
    /// Extra arguments (CLI backends).
    pub args: Vec<String>,
    /// Extra environment variables (CLI backends).
    pub env: Vec<(String, String)>,
    /// The working directory (the run's, or the frame's worktree).
    #[serde(skip)]
    pub cwd: PathBuf,
    /// This attempt's artifact directory; it exists. Backends may write files there
    /// (`stdout`, `stderr`, `response.json`); the executor writes the prompt and output.
    #[serde(skip)]
    pub dir: PathBuf,
    #[serde(rename = "timeout_ms", with = "millis", default)]
    pub timeout: Option<Duration>,
    #[serde(rename = "idle_ms", with = "millis", default)]
    pub idle_timeout: Option<Duration>,
    /// The output schema, for backends with native JSON-schema output.
    pub schema: Option<serde_json::Value>,
    pub max_tokens: Option<u64>,
    /// Where a backend that sees the agent work (ACP) reports what it does while it works:
    /// the executor shows it in the progress and keeps it as events. `None`: nobody listens.
    #[serde(skip)]
    pub watch: Option<Watch>,
    /// The permission policy of this call when the stage names one of its own (else the
    /// agent's, [`AgentConfig::policy`]). It travels to a worker with the call; a call
    /// without one is written as before.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "shared_rules"
    )]
    pub policy: Option<std::sync::Arc<crate::permit::Rules>>,
    /// The directories besides `cwd` an agent may read through the client (ACP's
    /// `fs/read_text_file`), canonical: those the template helpers read (the run's
    /// directory, its state directory, the workflow's `file_roots`). Empty on a worker,
    /// where only `cwd` is served.
    #[serde(skip)]
    pub roots: std::sync::Arc<[PathBuf]>,
}

impl AgentCall {
    /// The policy this call's permission requests are decided by.
    pub fn policy<'a>(&'a self, config: &'a AgentConfig) -> &'a crate::permit::Rules {
        self.policy.as_deref().unwrap_or(&config.policy)
    }
}

/// What a backend reports while its agent works, in order.
pub type Watch = tokio::sync::mpsc::UnboundedSender<Activity>;

/// One step of an agent's turn, as a backend that sees it reports it.
#[derive(Clone, Debug, PartialEq)]
pub enum Activity {
    /// A tool call started, or changed status: `id` is the agent's, `title` what it says it
    /// does (`Edit src/lib.rs`, `git commit -m ...`), `kind` the protocol's (`edit`,
    /// `execute`, `read`, ...), `status` `pending`, `in_progress`, `completed` or `failed`.
    Tool {
        id: String,
        title: String,
        kind: String,
        status: String,
    },
    /// The agent's plan, whole, as it stands: each entry's text and status (`pending`,
    /// `in_progress`, `completed`).
    Plan(Vec<(String, String)>),
    /// A permission the agent asked for, and the policy's answer.
    Permission {
        /// What was asked, for people: the tool call's title or its command.
        asked: String,
        decision: crate::permit::Decision,
    },
    /// A file the agent wrote through the client (`fs/write_text_file`), relative to the
    /// working directory when inside it.
    Wrote(String),
}

/// A shared policy, written as the policy itself.
mod shared_rules {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::permit::Rules;

    pub(super) fn serialize<S: Serializer>(
        r: &Option<Arc<Rules>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        r.as_deref().serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Arc<Rules>>, D::Error> {
        Ok(Option::<Rules>::deserialize(d)?.map(Arc::new))
    }
}

/// An optional duration as whole milliseconds (`null` for none).
mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

/// What an agent answered.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentReply {
    /// The final text of the agent: what outputs are extracted from.
    pub text: String,
    /// The raw output (stdout or response body), kept as an artifact.
    pub raw: String,
    pub usage: Usage,
    pub session_id: Option<String>,
    /// The model that answered, when the backend says.
    pub model: Option<String>,
    /// Actions the agent reported as denied (a write without permission, say).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denied: Vec<String>,
    /// Things the user should know about this call (a structured-output mode a server
    /// rejected, and the one used instead); shown in the progress and kept as events.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The structured-output mode an `auto` agent stepped down to in this call (a server
    /// rejected the one before): the run keeps it, so that a resume starts there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_output: Option<String>,
}

/// Why a call did not produce a reply, classified for the executor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, thiserror::Error)]
pub enum CallError {
    /// A rate limit or quota: wait (or hand over to a fallback); never uses up an attempt.
    #[error("rate limited: {message}{}", wait_text(.retry_after))]
    RateLimited {
        message: String,
        retry_after: Option<Duration>,
    },
    /// Worth retrying with backoff: a non-zero exit, HTTP 5xx or 429 without quota words,
    /// a dropped connection.
    #[error("transient failure: {message}")]
    Transient {
        message: String,
        retry_after: Option<Duration>,
    },
    /// The backend is not there: an executable not found, an API key variable not set.
    #[error("backend unavailable: {message}")]
    Missing { message: String },
    /// The stage's timeout or idle timeout ended the call; the process group was killed.
    #[error("{}", timeout_text(.after, .idle))]
    Timeout {
        after: Duration,
        idle: bool,
        /// The last lines of output, for the feedback and the logs.
        tail: String,
    },
    /// The agent refused its configuration (an output schema its validator or its service
    /// refuses, a flag it does not take): it can never succeed, so it is not retried; a
    /// fallback agent takes over, else the run stops as a configuration error.
    #[error("the agent refused its configuration: {message}")]
    Refused { message: String },
    /// A permanent failure: the agent reported an error that retrying will not fix.
    #[error("{message}")]
    Failed { message: String },
    /// A limit of the machine was reached (open files, disk space, file size) when the
    /// agent's program started or its output was written: not the agent's failure nor the
    /// stage's, so it is neither retried nor handed over; the run stops as resumable.
    #[error("{message}")]
    Limit {
        limit: process::Limit,
        message: String,
    },
}

impl CallError {
    /// The text the failure carries: its message, or a timeout's last output.
    pub fn text(&self) -> &str {
        match self {
            CallError::RateLimited { message, .. }
            | CallError::Transient { message, .. }
            | CallError::Missing { message }
            | CallError::Refused { message }
            | CallError::Failed { message }
            | CallError::Limit { message, .. } => message,
            CallError::Timeout { tail, .. } => tail,
        }
    }

    /// The same, to change (to mask secrets in it).
    pub fn text_mut(&mut self) -> &mut String {
        match self {
            CallError::RateLimited { message, .. }
            | CallError::Transient { message, .. }
            | CallError::Missing { message }
            | CallError::Refused { message }
            | CallError::Failed { message }
            | CallError::Limit { message, .. } => message,
            CallError::Timeout { tail, .. } => tail,
        }
    }
}

/// A rate limit's wait, for its message.
fn wait_text(retry_after: &Option<Duration>) -> String {
    retry_after
        .map(|d| format!(" (retry after {}s)", d.as_secs_f64()))
        .unwrap_or_default()
}

/// A timeout's message.
fn timeout_text(after: &Duration, idle: &bool) -> String {
    if *idle {
        format!("no output for {}s (idle timeout)", after.as_secs())
    } else {
        format!("timed out after {}s", after.as_secs())
    }
}

pub use crate::diag::error_chain;

/// The future a backend returns.
pub type CallFuture<'a> = Pin<Box<dyn Future<Output = Result<AgentReply, CallError>> + Send + 'a>>;

/// An agent backend.
pub trait Backend: Send + Sync {
    /// What the backend can do natively.
    fn capabilities(&self) -> Capabilities;

    /// Makes one call with a fresh context. Dropping the future cancels the call and kills
    /// whatever it started.
    fn call<'a>(&'a self, call: &'a AgentCall) -> CallFuture<'a>;

    /// Whether the backend reports what its agent does while it works, on the call's
    /// [`AgentCall::watch`] (the executor then listens).
    fn watches(&self) -> bool {
        false
    }
}

/// An agent's settings with every template rendered over the params.
#[derive(Clone, Debug, Default)]
pub struct AgentConfig {
    pub name: String,
    pub kind: crate::model::AgentKind,
    pub model: Option<String>,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// The argv of a `command` agent.
    pub command: Vec<String>,
    /// `stdin` (default), `file` (the prompt file's path replaces `{prompt_file}` in argv, or
    /// is appended) or `arg` (the prompt replaces `{prompt}` in argv, or is appended).
    pub prompt_via: crate::model::PromptVia,
    pub base_url: Option<String>,
    pub api_key_env: Option<String>,
    /// `chat` (default) or `responses`, for openai.
    pub api: crate::model::OpenAiApi,
    pub max_tokens: Option<u64>,
    /// The recording of a `replay` agent.
    pub file: Option<PathBuf>,
    /// Where a CLI backend finds its executable (default: the kind's program, `claude`,
    /// `codex`..., on PATH; `RALPH_FLOW_CLAUDE` and the like override it).
    pub program: Option<String>,
    /// What a CLI agent may do unattended.
    pub permissions: crate::model::Permissions,
    /// The permission policy an `acp` agent's requests are decided by (the level of
    /// `permissions`, or the workflow's `[policy.NAME]` it names).
    pub policy: std::sync::Arc<crate::permit::Rules>,
    /// How a stage's output schema reaches the model.
    pub structured_output: crate::model::StructuredOutput,
    /// Where an `auto` agent starts: the mode an earlier process of the same run stepped
    /// down to (a resume), instead of the first mode of `auto`.
    pub resumed_mode: Option<crate::model::StructuredOutput>,
}

/// The prompt with the output schema written into it, for backends (or modes) where the
/// server does not constrain the answer: the schema mode `prompt`.
pub fn prompt_with_schema(prompt: &str, schema: &serde_json::Value) -> String {
    let schema = serde_json::to_string_pretty(schema).unwrap_or_default();
    format!(
        "{prompt}\n\n---\nAnswer with a JSON document that matches this JSON Schema, on its own \
         or in a ```json block:\n```json\n{schema}\n```\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_carries_its_stage_policy_to_a_worker_and_none_as_before() {
        let mut call = AgentCall {
            stage: "s".into(),
            scope: String::new(),
            attempt: 1,
            prompt: "p".into(),
            model: None,
            args: Vec::new(),
            env: Vec::new(),
            cwd: PathBuf::new(),
            dir: PathBuf::new(),
            timeout: None,
            idle_timeout: None,
            schema: None,
            max_tokens: None,
            watch: None,
            policy: None,
            roots: Default::default(),
        };
        let json = serde_json::to_value(&call).expect("json");
        assert!(json.get("policy").is_none(), "{json}");
        let back: AgentCall = serde_json::from_value(json).expect("back");
        assert!(back.policy.is_none());
        let mut rules = crate::permit::Rules::level("commit").expect("level");
        rules.name = "wiggum".into();
        rules.origin = Some("workflow.toml:3:1".into());
        call.policy = Some(std::sync::Arc::new(rules.clone()));
        let json = serde_json::to_value(&call).expect("json");
        assert_eq!(json["policy"]["name"], "wiggum");
        let back: AgentCall = serde_json::from_value(json).expect("back");
        assert_eq!(back.policy.as_deref(), Some(&rules));
    }

    #[test]
    fn call_errors_say_what_they_said_before() {
        let rate = CallError::RateLimited {
            message: "slow down".into(),
            retry_after: Some(Duration::from_millis(1500)),
        };
        assert_eq!(
            rate.to_string(),
            "rate limited: slow down (retry after 1.5s)"
        );
        let idle = CallError::Timeout {
            after: Duration::from_secs(30),
            idle: true,
            tail: String::new(),
        };
        assert_eq!(idle.to_string(), "no output for 30s (idle timeout)");
        let missing = CallError::Missing {
            message: "no key".into(),
        };
        assert_eq!(missing.to_string(), "backend unavailable: no key");
    }

    #[test]
    fn an_error_chain_joins_the_sources() {
        let e = replay::ReplayBackend::open(std::path::Path::new("/surely/not/here.jsonl"))
            .err()
            .expect("an error");
        assert_eq!(
            error_chain(&e),
            "cannot read the recording /surely/not/here.jsonl: No such file or directory (os \
             error 2)"
        );
    }
}
