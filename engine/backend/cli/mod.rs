//! Backends that run an agent's command-line program: `claude`, `codex`, `gemini`, `qwen`,
//! `opencode`, or any `command`.
//!
//! Each agent CLI is one file implementing [`CliAgent`] (its argv, its environment, reading
//! its output, classifying its errors, what it reports, how to install it and which
//! variables hold its key), registered in [`AGENTS`]. This module runs them all the same
//! way: each call runs the program once, in its own process group (see [`process`]), with
//! the prompt on stdin (or, for `command` agents, in a file or an argument): never through
//! a shell. Its stdout and stderr stream to `stdout` and `stderr` in the call's directory.
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
mod opencode;
mod output;
mod qwen;

use super::process::{self, Ended, ProcOutput, ProcSpec, SpawnError};
use super::{AgentCall, AgentConfig, AgentReply, Backend, CallError, CallFuture, Capabilities};
use crate::model::{AgentKind, SchemaDelivery};
use invocation::{Launch, Request};
use output::output_tail;

/// The agents that run a program, by kind: one line each.
const AGENTS: &[(AgentKind, &dyn CliAgent)] = &[
    (AgentKind::Claude, &claude::Claude),
    (AgentKind::Codex, &codex::Codex),
    (AgentKind::Gemini, &gemini::Gemini),
    (AgentKind::Qwen, &qwen::Qwen),
    (AgentKind::Opencode, &opencode::Opencode),
    (AgentKind::Command, &command::Command),
];

/// The agent of a kind that runs a program, if the kind is one.
fn agent(kind: AgentKind) -> Option<&'static dyn CliAgent> {
    AGENTS.iter().find(|(k, _)| *k == kind).map(|(_, a)| *a)
}

/// What is an agent CLI's own: how it is called, what it prints, what it reports.
trait CliAgent: Sync {
    /// The program it runs by default; `None` for a `command` agent, which runs its
    /// `command`.
    fn program(&self) -> Option<Program>;

    /// The environment variables it reads its API key from (registered as secrets).
    fn key_variables(&self) -> &'static [&'static str] {
        &[]
    }

    /// What its replies report.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// Environment variables a call gets unless the agent's `env` (or ralph-flow's own
    /// environment, but for those of [`CliAgent::decided_env`]) sets them.
    fn default_env(&self, _config: &AgentConfig) -> Vec<(&'static str, &'static str)> {
        Vec::new()
    }

    /// The variables of [`CliAgent::default_env`] that ralph-flow's own environment does not
    /// set for the agent: only the agent's `env` changes them.
    fn decided_env(&self) -> &'static [&'static str] {
        &[]
    }

    /// The argv and the stdin of a call.
    fn launch(&self, request: &Request<'_>) -> Result<Launch, CallError>;

    /// Whether stdout already holds the program's result (the program may linger after
    /// printing it); `None` waits for it to exit.
    fn result_done(&self) -> Option<fn(&[u8]) -> bool> {
        None
    }

    /// Reads the reply, or the error, from what the program printed and how it ended.
    fn parse(&self, out: &ProcOutput) -> Result<AgentReply, CallError>;
}

/// The program an agent CLI runs: its name, the variable that names another, and the npm
/// package that installs it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Program {
    /// The program looked up on PATH by default (`claude`).
    pub(super) name: &'static str,
    /// The variable that names another program (`RALPH_FLOW_CLAUDE`).
    pub(super) variable: &'static str,
    /// The npm package that installs it (`@anthropic-ai/claude-code`).
    pub(super) package: &'static str,
}

/// Why a CLI agent's settings cannot make a backend.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("a command agent needs a `command`")]
    NoCommand,
    #[error("the {0} backend does not run a program")]
    NotAProgram(&'static str),
}

/// Builds the backend of an agent that runs a program (`claude`, `codex`, `gemini`,
/// `command`...).
///
/// The program of an agent CLI is the agent's `program`, else the one named by its
/// variable (`RALPH_FLOW_CLAUDE`...), else its name (`claude`...) looked up on PATH when
/// called.
pub fn build(config: &AgentConfig) -> Result<Box<dyn Backend>, BuildError> {
    let Some(agent) = agent(config.kind) else {
        return Err(BuildError::NotAProgram(config.kind.as_str()));
    };
    if config.kind == AgentKind::Command && config.command.is_empty() {
        return Err(BuildError::NoCommand);
    }
    Ok(Box::new(CliBackend {
        config: config.clone(),
        agent,
        program: program(config).unwrap_or_default(),
    }))
}

/// The program of an agent CLI and how to install it, `None` for a kind that has none.
pub(super) fn program_of(kind: AgentKind) -> Option<Program> {
    agent(kind)?.program()
}

/// The program an agent CLI's agent runs: its `program`, else the one named by the kind's
/// variable (`RALPH_FLOW_CLAUDE`...), else the kind's program (`claude`...). `None` for a
/// kind that runs no program of its own.
pub fn program(config: &AgentConfig) -> Option<String> {
    let default = program_of(config.kind)?;
    Some(
        config
            .program
            .clone()
            .or_else(|| std::env::var(default.variable).ok())
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| default.name.to_string()),
    )
}

/// The environment variables the agents of a kind that runs a program read their key from.
pub(super) fn key_variables(kind: AgentKind) -> &'static [&'static str] {
    agent(kind).map_or(&[], |a| a.key_variables())
}

/// A backend that runs a program per call.
struct CliBackend {
    config: AgentConfig,
    agent: &'static dyn CliAgent,
    /// The program of an agent CLI (empty for a `command` agent).
    program: String,
}

impl Backend for CliBackend {
    fn capabilities(&self) -> Capabilities {
        self.agent.capabilities()
    }

    fn call<'a>(&'a self, call: &'a AgentCall) -> CallFuture<'a> {
        Box::pin(async move {
            match self.for_stage(call) {
                Some(backend) => backend.run(call).await,
                None => self.run(call).await,
            }
        })
    }
}

impl CliBackend {
    /// This backend told the level of a stage's own `permissions`, when the stage names one
    /// that differs from its agent's (the checker refuses a policy that is no level for an
    /// agent CLI; such a one runs as `read-only`).
    fn for_stage(&self, call: &AgentCall) -> Option<CliBackend> {
        let policy = call.policy.as_ref()?;
        let level = crate::model::policy::level_of(policy)
            .and_then(crate::model::Permissions::parse)
            .unwrap_or_default();
        (level != self.config.permissions).then(|| CliBackend {
            config: AgentConfig {
                permissions: level,
                policy: policy.clone(),
                ..self.config.clone()
            },
            agent: self.agent,
            program: self.program.clone(),
        })
    }

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
            // A variable the agent decides (`decided_env`) is changed by its own `env` only.
            let inherited =
                !self.agent.decided_env().contains(&key) && std::env::var_os(key).is_some();
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
            result_done: self.agent.result_done(),
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
        let reply = self.agent.parse(&out)?;
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

    /// The argv and the stdin of a call, and the schema it is sent by flag, lowered.
    fn invocation(&self, call: &AgentCall) -> Result<invocation::Invocation, CallError> {
        let lowered = self.lowered(call)?;
        let prompt = match (&call.schema, self.delivery()) {
            (Some(schema), SchemaDelivery::Prompt) => {
                crate::backend::prompt_with_schema(&call.prompt, schema).into_bytes()
            }
            _ => call.prompt.clone().into_bytes(),
        };
        let Launch {
            argv,
            stdin,
            prompt_file,
        } = self.agent.launch(&Request {
            program: &self.program,
            config: &self.config,
            call,
            model: call.model.as_ref().or(self.config.model.as_ref()),
            user_args: self.config.args.iter().chain(&call.args).cloned().collect(),
            native: lowered.as_ref().map(|l| &l.schema),
            prompt,
        })?;
        Ok(invocation::Invocation {
            argv,
            stdin,
            lowered,
            prompt_file,
        })
    }

    /// Environment variables a call gets unless the agent's `env` (or ralph-flow's own
    /// environment) sets them.
    fn default_env(&self) -> Vec<(&'static str, &'static str)> {
        self.agent.default_env(&self.config)
    }

    /// How a stage's output schema reaches this agent.
    fn delivery(&self) -> SchemaDelivery {
        crate::model::schema_delivery(self.config.kind, self.config.structured_output, false)
            .unwrap_or(SchemaDelivery::Not)
    }

    /// The schema sent natively (by flag), lowered to the CLI's dialect; `None` when the
    /// stage has none or it does not go by flag. A schema the dialect cannot express is a
    /// configuration error (the checker reports it before a run).
    fn lowered(&self, call: &AgentCall) -> Result<Option<crate::dialect::Lowered>, CallError> {
        let (Some(schema), SchemaDelivery::Lowered(dialect)) = (&call.schema, self.delivery())
        else {
            return Ok(None);
        };
        crate::dialect::lower(schema, dialect)
            .map(Some)
            .map_err(|refusals| CallError::Refused {
                message: crate::dialect::refusals_text(&refusals),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_agent_cli_kind_is_registered_once() {
        for kind in AgentKind::ALL {
            let n = AGENTS.iter().filter(|(k, _)| k == kind).count();
            let expected = usize::from(kind.is_agent_cli() || *kind == AgentKind::Command);
            assert_eq!(n, expected, "{kind}");
            if kind.is_agent_cli() {
                let program = program_of(*kind).expect("a program");
                assert_eq!(program.name, kind.as_str());
                assert_eq!(
                    program.variable,
                    format!("RALPH_FLOW_{}", kind.as_str().to_uppercase())
                );
            }
        }
        assert!(program_of(AgentKind::Command).is_none());
    }
}
