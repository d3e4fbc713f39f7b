//! Agent backends: one trait, one call per fresh context.
//!
//! A backend turns an [`AgentCall`] (a rendered prompt and settings) into an [`AgentReply`]
//! (the final text and the usage) or a classified [`CallError`]. The executor decides what
//! an error means: transient errors retry with backoff, rate limits pause without using up an
//! attempt (or hand over to a fallback agent), a missing backend hands over to a fallback.
//! Cancellation is by dropping the future: every backend kills what it started when dropped.

pub mod cli;
mod de;
pub mod http;
pub mod process;
pub mod replay;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Tokens and cost of one call, or summed over many.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Input tokens served from a prompt cache (part of, not added to, `input_tokens`
    /// where the backend reports them that way; as reported otherwise).
    pub cached_tokens: u64,
    /// The cost in US dollars, when the backend reports it.
    pub cost_usd: Option<f64>,
}

impl Usage {
    /// Adds another usage to this one.
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cached_tokens += other.cached_tokens;
        self.cost_usd = match (self.cost_usd, other.cost_usd) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
        };
    }

    /// Returns input plus output tokens.
    pub fn tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }
}

/// What a backend can do natively.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// The backend constrains its output to a JSON Schema given in [`AgentCall::schema`].
    pub json_schema: bool,
    /// The backend reports cost in dollars.
    pub cost: bool,
    /// The backend reports token usage.
    pub usage: bool,
}

/// One call to an agent with a fresh context.
#[derive(Clone, Debug)]
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
    pub cwd: PathBuf,
    /// This attempt's artifact directory; it exists. Backends may write files there
    /// (`stdout`, `stderr`, `response.json`); the executor writes the prompt and output.
    pub dir: PathBuf,
    pub timeout: Option<Duration>,
    pub idle_timeout: Option<Duration>,
    /// The output schema, for backends with native JSON-schema output.
    pub schema: Option<serde_json::Value>,
    pub max_tokens: Option<u64>,
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
}

/// Why a call did not produce a reply, classified for the executor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum CallError {
    /// A rate limit or quota: wait (or hand over to a fallback); never uses up an attempt.
    RateLimited {
        message: String,
        retry_after: Option<Duration>,
    },
    /// Worth retrying with backoff: a non-zero exit, HTTP 5xx or 429 without quota words,
    /// a dropped connection.
    Transient {
        message: String,
        retry_after: Option<Duration>,
    },
    /// The backend is not there: an executable not found, an API key variable not set.
    Missing { message: String },
    /// The stage's timeout or idle timeout ended the call; the process group was killed.
    Timeout {
        after: Duration,
        idle: bool,
        /// The last lines of output, for the feedback and the logs.
        tail: String,
    },
    /// A permanent failure: the agent reported an error that retrying will not fix.
    Failed { message: String },
}

impl CallError {
    /// The text the failure carries: its message, or a timeout's last output.
    pub fn text(&self) -> &str {
        match self {
            CallError::RateLimited { message, .. }
            | CallError::Transient { message, .. }
            | CallError::Missing { message }
            | CallError::Failed { message } => message,
            CallError::Timeout { tail, .. } => tail,
        }
    }

    /// The same, to change (to mask secrets in it).
    pub fn text_mut(&mut self) -> &mut String {
        match self {
            CallError::RateLimited { message, .. }
            | CallError::Transient { message, .. }
            | CallError::Missing { message }
            | CallError::Failed { message } => message,
            CallError::Timeout { tail, .. } => tail,
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::RateLimited {
                message,
                retry_after,
            } => {
                write!(f, "rate limited: {message}")?;
                if let Some(d) = retry_after {
                    write!(f, " (retry after {}s)", d.as_secs_f64())?;
                }
                Ok(())
            }
            CallError::Transient { message, .. } => write!(f, "transient failure: {message}"),
            CallError::Missing { message } => write!(f, "backend unavailable: {message}"),
            CallError::Timeout { after, idle, .. } => {
                if *idle {
                    write!(f, "no output for {}s (idle timeout)", after.as_secs())
                } else {
                    write!(f, "timed out after {}s", after.as_secs())
                }
            }
            CallError::Failed { message } => f.write_str(message),
        }
    }
}

/// Joins an error and its sources, the way messages quote them (`error sending request:
/// connection refused`).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(e) = source {
        message.push_str(": ");
        message.push_str(&e.to_string());
        source = e.source();
    }
    message
}

/// The future a backend returns.
pub type CallFuture<'a> = Pin<Box<dyn Future<Output = Result<AgentReply, CallError>> + Send + 'a>>;

/// An agent backend.
pub trait Backend: Send + Sync {
    /// What the backend can do natively.
    fn capabilities(&self) -> Capabilities;

    /// Makes one call with a fresh context. Dropping the future cancels the call and kills
    /// whatever it started.
    fn call<'a>(&'a self, call: &'a AgentCall) -> CallFuture<'a>;
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
    pub prompt_via: Option<String>,
    pub base_url: Option<String>,
    pub api_key_env: Option<String>,
    /// `chat` (default) or `responses`, for openai.
    pub api: Option<String>,
    pub max_tokens: Option<u64>,
    /// The recording of a `replay` agent.
    pub file: Option<PathBuf>,
    /// Where a CLI backend finds its executable (default: `claude`, `codex`, `gemini` on
    /// PATH; `RALPH_FLOW_CLAUDE` and the like override it).
    pub program: Option<String>,
    /// What a CLI agent may do unattended.
    pub permissions: crate::model::Permissions,
    /// How a stage's output schema reaches the model.
    pub structured_output: crate::model::StructuredOutput,
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

/// Tells whether an agent can be called at all on this machine, before a run starts: its
/// program is installed, its API key variable is set, its recording exists. `cwd` is where
/// relative program paths start. The error says what to install or set.
pub fn preflight(config: &AgentConfig, cwd: &std::path::Path) -> Result<(), String> {
    use crate::model::AgentKind as K;
    match config.kind {
        K::Claude | K::Codex | K::Gemini => {
            let program = cli::program(config);
            if find_program(&program, cwd).is_none() {
                let package = match config.kind {
                    K::Claude => "@anthropic-ai/claude-code",
                    K::Codex => "@openai/codex",
                    _ => "@google/gemini-cli",
                };
                return Err(format!(
                    "`{program}` is not installed (not found on PATH); install it with `npm \
                     install -g {package}`, or point `RALPH_FLOW_{}` (or the agent's `program`) \
                     at it",
                    config.kind.as_str().to_uppercase()
                ));
            }
        }
        K::Command => {
            let Some(program) = config.command.first() else {
                return Err("a command agent needs a `command`".into());
            };
            if find_program(program, cwd).is_none() {
                return Err(format!(
                    "its command `{program}` is not installed (not found on PATH, nor as a \
                     path from {})",
                    cwd.display()
                ));
            }
        }
        K::OpenAi | K::Anthropic => http::preflight(config).map_err(|e| error_chain(&e))?,
        K::Replay => {
            if let Some(f) = &config.file {
                if !f.is_file() {
                    return Err(format!("its recording {} does not exist", f.display()));
                }
            }
        }
    }
    Ok(())
}

/// Finds a program as `Command` would: a name on PATH, or a path (relative to `cwd`).
pub fn find_program(program: &str, cwd: &std::path::Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &std::path::Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let path = cwd.join(program);
        return executable(&path).then_some(path);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| executable(p))
}

/// Builds the backend of an agent.
pub fn build(config: &AgentConfig) -> Result<Box<dyn Backend>, String> {
    use crate::model::AgentKind as K;
    match config.kind {
        K::Claude | K::Codex | K::Gemini | K::Command => {
            cli::build(config).map_err(|e| e.to_string())
        }
        K::OpenAi | K::Anthropic => http::build(config).map_err(|e| error_chain(&e)),
        K::Replay => replay::build(config),
    }
}
