//! Backends that run an agent's command-line program: `claude`, `codex`, `gemini`, or any
//! `command`.
//!
//! Each call runs the program once, in its own process group (see [`process`]), with the
//! prompt on stdin (or, for `command` agents, in a file or an argument): never through a
//! shell. Its stdout and stderr stream to `stdout` and `stderr` in the call's directory.
//! The agents' JSON output is parsed into the reply text, the usage and the session id,
//! and their errors are classified for the executor ([`CallError`]).
//!
//! Token counts mean the same for every agent: `input_tokens` counts the whole prompt,
//! cached part included, and `cached_tokens` is that cached part.

#[cfg(test)]
#[macro_use]
mod test_support;

mod classify;
mod claude;
mod codex;
mod command;
mod gemini;
mod invocation;
mod output;

use super::process::{self, Ended, ProcSpec, SpawnError};
use super::{AgentCall, AgentConfig, AgentReply, Backend, CallError, CallFuture, Capabilities};
use crate::model::{AgentKind, Permissions, PromptVia};
use output::output_tail;

/// Why a CLI agent's settings cannot make a backend.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("a command agent needs a `command`")]
    NoCommand,
    #[error("the {0} backend does not run a program")]
    NotAProgram(&'static str),
}

/// Builds the backend of a `claude`, `codex`, `gemini` or `command` agent.
///
/// The program of the first three is the agent's `program`, else the one named by
/// `RALPH_FLOW_CLAUDE` (`RALPH_FLOW_CODEX`, `RALPH_FLOW_GEMINI`), else `claude` (`codex`,
/// `gemini`) looked up on PATH when called.
pub fn build(config: &AgentConfig) -> Result<Box<dyn Backend>, BuildError> {
    let flavor = match config.kind {
        AgentKind::Claude => Flavor::Claude,
        AgentKind::Codex => Flavor::Codex,
        AgentKind::Gemini => Flavor::Gemini,
        AgentKind::Command => {
            if config.command.is_empty() {
                return Err(BuildError::NoCommand);
            }
            Flavor::Command(config.prompt_via)
        }
        other => return Err(BuildError::NotAProgram(other.as_str())),
    };
    let program = match flavor {
        Flavor::Command(_) => String::new(),
        _ => program(config),
    };
    Ok(Box::new(CliBackend {
        config: config.clone(),
        flavor,
        program,
    }))
}

/// The program of a `claude`, `codex` or `gemini` agent: its `program`, else the one named
/// by `RALPH_FLOW_CLAUDE` (`RALPH_FLOW_CODEX`, `RALPH_FLOW_GEMINI`), else the kind's name.
pub fn program(config: &AgentConfig) -> String {
    let name = config.kind.as_str();
    config
        .program
        .clone()
        .or_else(|| std::env::var(format!("RALPH_FLOW_{}", name.to_uppercase())).ok())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| name.to_string())
}

/// Which program a backend runs, and so how it talks to it.
#[derive(Clone, Copy, Debug)]
enum Flavor {
    Claude,
    Codex,
    Gemini,
    Command(PromptVia),
}

/// A backend that runs a program per call.
struct CliBackend {
    config: AgentConfig,
    flavor: Flavor,
    /// The program of the `claude`, `codex` and `gemini` flavors.
    program: String,
}

impl Backend for CliBackend {
    fn capabilities(&self) -> Capabilities {
        match self.flavor {
            // claude reports its cost; codex and gemini their tokens only.
            Flavor::Claude => Capabilities {
                cost: true,
                usage: true,
            },
            Flavor::Codex | Flavor::Gemini => Capabilities {
                cost: false,
                usage: true,
            },
            Flavor::Command(_) => Capabilities::default(),
        }
    }

    fn call<'a>(&'a self, call: &'a AgentCall) -> CallFuture<'a> {
        Box::pin(self.run(call))
    }
}

impl CliBackend {
    async fn run(&self, call: &AgentCall) -> Result<AgentReply, CallError> {
        let invocation::Invocation {
            argv,
            stdin,
            lowered,
            prompt_file,
        } = self.invocation(call)?;
        // A retried call starts fresh files; the earlier output stays as `stdout.1`...
        for name in ["stdout", "stderr"] {
            invocation::set_aside(&call.dir.join(name));
        }
        let mut env: Vec<(String, String)> =
            self.config.env.iter().chain(&call.env).cloned().collect();
        for (key, value) in self.default_env() {
            // `IS_SANDBOX` is `permissions = "full"`'s decision: only the agent's own `env`
            // changes it (claude takes only `1`, and a container may set `IS_SANDBOX=yes`).
            // `RUST_LOG` in ralph-flow's environment is ralph-flow's own log filter
            // (`ralph_flow=debug` would silence codex's log): only the agent's `env` sets
            // codex's.
            let inherited =
                !matches!(key, "IS_SANDBOX" | "RUST_LOG") && std::env::var_os(key).is_some();
            if !env.iter().any(|(k, _)| k == key) && !inherited {
                env.push((key.to_string(), value.to_string()));
            }
        }
        let spec = ProcSpec {
            argv,
            cwd: call.cwd.clone(),
            env,
            stdin,
            timeout: call.timeout,
            idle_timeout: call.idle_timeout,
            stdout_path: Some(call.dir.join("stdout")),
            stderr_path: Some(call.dir.join("stderr")),
            pid_file: Some(call.dir.join("process")),
            process_log: None,
            result_done: match self.flavor {
                Flavor::Claude => Some(claude::done),
                Flavor::Codex => Some(codex::done),
                Flavor::Gemini => Some(gemini::done),
                Flavor::Command(_) => None,
            },
        };
        let out = process::run(&spec).await;
        // The program is done with its prompt file: masked now (on every path: dropped).
        drop(prompt_file);
        let out = out.map_err(|e| match e {
            SpawnError::NotFound { .. } => CallError::Missing {
                message: e.to_string(),
            },
            SpawnError::Other(_) => CallError::Failed {
                message: super::error_chain(&e),
            },
            SpawnError::Limit(hit) => CallError::Limit {
                limit: hit.limit,
                message: hit.to_string(),
            },
        })?;
        match out.ended {
            Ended::Timeout => {
                return Err(CallError::Timeout {
                    after: call.timeout.unwrap_or_default(),
                    idle: false,
                    tail: output_tail(&out),
                });
            }
            Ended::Idle => {
                return Err(CallError::Timeout {
                    after: call.idle_timeout.unwrap_or_default(),
                    idle: true,
                    tail: output_tail(&out),
                });
            }
            Ended::Exited | Ended::AfterResult => {}
        }
        let reply = match self.flavor {
            Flavor::Claude => claude::parse(&out)?,
            Flavor::Codex => codex::parse(&out)?,
            Flavor::Gemini => gemini::parse(&out)?,
            Flavor::Command(_) => command::parse(&out)?,
        };
        let mut reply = AgentReply {
            raw: String::from_utf8_lossy(&out.stdout).into_owned(),
            ..reply
        };
        // An answer under a lowered schema is mapped back to the author's (a null that
        // stands for an absent optional field), which validates it.
        if let Some(text) = lowered.and_then(|l| l.restore_text(&reply.text)) {
            reply.text = text;
        }
        Ok(reply)
    }

    /// Environment variables a call gets unless the agent's `env` (or ralph-flow's own
    /// environment) sets them.
    fn default_env(&self) -> Vec<(&'static str, &'static str)> {
        match self.flavor {
            Flavor::Claude => {
                // claude retries API errors itself (10 times by default, silently): the
                // executor retries, with backoff and a visible status.
                let mut env = vec![("CLAUDE_CODE_MAX_RETRIES", CLAUDE_MAX_RETRIES)];
                if self.config.permissions == Permissions::Full {
                    // `bypassPermissions` refuses to run as root unless told it is sandboxed;
                    // `permissions = "full"` is that decision.
                    env.push(("IS_SANDBOX", "1"));
                }
                env
            }
            // Headless gemini refuses an untrusted directory (exit 55): ralph-flow chose the
            // cwd. (The variable, unlike `--skip-trust`, is ignored by older versions.)
            Flavor::Gemini => vec![("GEMINI_CLI_TRUST_WORKSPACE", "true")],
            // codex logs the commands its sandbox refused at WARN only (its default shows
            // errors): the denials are read from that log.
            Flavor::Codex => vec![("RUST_LOG", CODEX_RUST_LOG)],
            Flavor::Command(_) => Vec::new(),
        }
    }
}

/// The log filter of codex: its default (errors, among them the patches it rejects) and the
/// sandbox's refusals (`codex_sandboxing::violation: recorded sandbox violation: ...`).
const CODEX_RUST_LOG: &str = "error,codex_sandboxing::violation=warn";

/// The value of `CLAUDE_CODE_MAX_RETRIES` a call gets unless set: claude's own retries of
/// API errors (its default is 10, with backoff, and it prints nothing meanwhile).
const CLAUDE_MAX_RETRIES: &str = "2";

#[cfg(test)]
mod tests {
    use super::test_support::backend;
    use super::*;

    #[test]
    fn claude_gets_bounded_retries_and_the_sandbox_flag_for_full() {
        let env = backend(AgentKind::Claude, Permissions::ReadOnly).default_env();
        assert!(env.contains(&("CLAUDE_CODE_MAX_RETRIES", CLAUDE_MAX_RETRIES)));
        assert!(!env.iter().any(|(k, _)| *k == "IS_SANDBOX"));
        let env = backend(AgentKind::Claude, Permissions::Full).default_env();
        assert!(env.contains(&("IS_SANDBOX", "1")));
    }

    #[test]
    fn codex_logs_its_sandbox_refusals() {
        let env = backend(AgentKind::Codex, Permissions::Edit).default_env();
        assert_eq!(env, [("RUST_LOG", CODEX_RUST_LOG)]);
    }
}
