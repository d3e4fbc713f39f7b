//! The `acp` agent kind: a program that speaks the Agent Client Protocol (ACP v1: JSON-RPC
//! 2.0, one message per line over its stdin and stdout), with ralph-flow as the client.
//!
//! Each call starts the agent's `command` in the stage's workspace, in its own process group
//! ([`process::start`]), then `initialize` (protocol 1; ralph-flow reads and writes text
//! files, and offers no terminal), `session/new` in the workspace, the session's mode set
//! to the one that asks before acting (`default`, where the agent offers it and starts in
//! another: claude-agent-acp and qwen start where they decide alone), the model set when
//! the agent has `model`, and `session/prompt` with the rendered prompt. While the turn runs:
//! - `session/update`s become the answer (the agent's last message), [`Activity`] for the
//!   progress line and the events, and `transcript.md` ([`turn`]);
//! - `session/request_permission` is decided by the call's policy and answered at once,
//!   every denial kept with its rule for `denied.txt` ([`client`]);
//! - `fs/read_text_file` and `fs/write_text_file` are served inside the workspace only (and,
//!   for reading, the directories the template helpers read), writes decided by the policy
//!   and listed in `written.txt`;
//! - anything else is refused with -32601.
//!
//! A timeout sends `session/cancel`, answers what the agent still asks `cancelled`, gives it
//! a few seconds to end its turn, then kills its group; dropping the call does the same on a
//! task of its own. The wire is kept, both ways and masked, in `acp.jsonl` ([`rpc`]).
//!
//! ralph-flow speaks the protocol with the schema crate's types
//! (`agent-client-protocol-schema`), not the SDK's connection: that one brings a runtime of
//! its own for what [`conn`] does in a few hundred lines on tokio.

mod client;
mod conn;
mod rpc;
mod turn;

use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Value, json};

use super::process::{self, ProcSpec, SpawnError};
use super::{AgentCall, AgentConfig, AgentReply, Backend, CallError, CallFuture, Capabilities};
use conn::{Conn, Setup, Stop};
use rpc::RpcError;

/// The agent of an `acp` agent config.
pub(super) fn build(config: &AgentConfig) -> Result<Box<dyn Backend>, super::cli::BuildError> {
    if config.command.is_empty() {
        return Err(super::cli::BuildError::NoCommand);
    }
    Ok(Box::new(AcpBackend {
        config: config.clone(),
    }))
}

/// A backend that talks to an ACP agent, one process per call.
struct AcpBackend {
    config: AgentConfig,
}

impl Backend for AcpBackend {
    fn capabilities(&self) -> Capabilities {
        // Usage where the agent reports it (claude-agent-acp, gemini, opencode), cost where
        // it says (claude-agent-acp's `usage_update`).
        Capabilities {
            cost: false,
            usage: true,
        }
    }

    fn call<'a>(&'a self, call: &'a AgentCall) -> CallFuture<'a> {
        Box::pin(self.run(call))
    }

    fn watches(&self) -> bool {
        true
    }
}

/// Rate limits and quotas, in an agent's error.
static RATE_LIMITED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)rate[ _-]?limit|\b429\b|too many requests|quota|resource_exhausted|overloaded_error",
    )
    .expect("the rate-limit pattern is valid")
});

/// Missing or refused authentication, in an agent's error.
static UNAUTHENTICATED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\b401\b|unauthori[sz]ed|authenticat|invalid api key|api key not valid|not logged in|/login|auth_required")
        .expect("the authentication pattern is valid")
});

impl AcpBackend {
    async fn run(&self, call: &AgentCall) -> Result<AgentReply, CallError> {
        let program = self.config.command.first().cloned().unwrap_or_default();
        let argv: Vec<String> = self
            .config
            .command
            .iter()
            .chain(&self.config.args)
            .chain(&call.args)
            .cloned()
            .collect();
        let env: Vec<(String, String)> = self.config.env.iter().chain(&call.env).cloned().collect();
        for name in ["acp.jsonl", "stderr", "transcript.md", "written.txt"] {
            let _ = std::fs::remove_file(call.dir.join(name));
        }
        let spec = ProcSpec {
            argv,
            cwd: call.cwd.clone(),
            env,
            stderr_path: Some(call.dir.join("stderr")),
            pid_file: Some(call.dir.join("process")),
            ..ProcSpec::default()
        };
        let session = process::start(&spec).await.map_err(|e| match e {
            SpawnError::NotFound { .. } => CallError::Missing {
                message: format!(
                    "{e} (the `acp` agent's `command` names it; install the agent, or fix \
                     `command`)"
                ),
            },
            SpawnError::Limit(hit) => CallError::Limit {
                limit: hit.limit,
                message: hit.to_string(),
            },
            SpawnError::Other(_) => CallError::Failed {
                message: e.message(&program),
            },
        })?;
        let workspace = call.cwd.canonicalize().unwrap_or_else(|_| call.cwd.clone());
        let setup = Setup {
            session,
            log: rpc::Log::create(&call.dir.join("acp.jsonl")),
            timeout: call.timeout,
            idle: call.idle_timeout,
            policy: call.policy(&self.config).clone(),
            workspace,
            roots: call.roots.clone(),
            turn: turn::Turn::new(&call.dir.join("transcript.md"), call.watch.clone()),
        };
        let Some(mut conn) = Conn::new(setup) else {
            return Err(CallError::Failed {
                message: format!("`{program}` started without its pipes"),
            });
        };
        let result = self.converse(&mut conn, call, &program).await;
        let stderr = conn.end().await;
        if !conn.written.is_empty() {
            let _ = std::fs::write(call.dir.join("written.txt"), conn.written.join("\n") + "\n");
        }
        let result = result.map_err(|f| f.into_error(call, &program, &stderr));
        conn.turn.finish(&match &result {
            Ok(_) => "\n_the turn ended_".to_string(),
            Err(e) => format!("\n_the call failed: {e}_"),
        });
        let mut reply = result?;
        reply.denied = std::mem::take(&mut conn.denied);
        Ok(reply)
    }

    /// The conversation: the handshake, the session, the prompt and its turn.
    async fn converse(
        &self,
        conn: &mut Conn,
        call: &AgentCall,
        program: &str,
    ) -> Result<AgentReply, Failure> {
        let init = json!({
            "protocolVersion": 1,
            "clientCapabilities": {
                "fs": {"readTextFile": true, "writeTextFile": true},
                "terminal": false,
            },
            "clientInfo": {"name": "ralph-flow", "version": env!("CARGO_PKG_VERSION")},
        });
        let init = typed::<agent_client_protocol_schema::v1::InitializeRequest>(init);
        let answered = conn.call("initialize", init).await?.map_err(Failure::Rpc)?;
        if let Some(v) = answered.get("protocolVersion").and_then(Value::as_u64) {
            if v != 1 {
                return Err(Failure::Refused(format!(
                    "`{program}` speaks ACP version {v}; ralph-flow speaks version 1"
                )));
            }
        }
        let new = typed::<agent_client_protocol_schema::v1::NewSessionRequest>(json!({
            "cwd": call.cwd,
            "mcpServers": [],
        }));
        let session = conn.call("session/new", new).await?.map_err(Failure::Rpc)?;
        let Some(session_id) = session
            .get("sessionId")
            .and_then(Value::as_str)
            .map(str::to_string)
        else {
            return Err(Failure::Protocol(
                "its answer to `session/new` has no `sessionId`".into(),
            ));
        };
        let mut warnings = Vec::new();
        self.set_mode(conn, &session, &session_id, &mut warnings)
            .await?;
        let model = call.model.as_ref().or(self.config.model.as_ref());
        if let Some(model) = model {
            self.set_model(conn, &session, &session_id, model, &mut warnings)
                .await?;
        }
        let text = match &call.schema {
            Some(schema) => super::prompt_with_schema(&call.prompt, schema),
            None => call.prompt.clone(),
        };
        let prompt = typed::<agent_client_protocol_schema::v1::PromptRequest>(json!({
            "sessionId": session_id,
            "prompt": [{"type": "text", "text": text}],
        }));
        let id = conn.start("session/prompt", prompt).await?;
        conn.prompting = Some(session_id.clone());
        let answered = match conn.answer_of(id).await {
            Ok(a) => a,
            Err(stop @ Stop::Timeout { .. }) => {
                conn.turn
                    .note("- ralph-flow: timed out; `session/cancel` sent");
                conn.cancel(id).await;
                return Err(Failure::Stop(stop));
            }
            Err(stop) => return Err(Failure::Stop(stop)),
        };
        conn.prompting = None;
        let result = answered.map_err(Failure::Rpc)?;
        let stop = result
            .get("stopReason")
            .and_then(Value::as_str)
            .unwrap_or("end_turn");
        match stop {
            "end_turn" => {}
            "refusal" => {
                return Err(Failure::Failed(format!(
                    "the agent refused to answer the prompt (stopReason `refusal`){}",
                    said(&conn.turn.answer())
                )));
            }
            "max_tokens" => {
                return Err(Failure::Failed(
                    "the agent's turn reached its model's output token limit (stopReason \
                     `max_tokens`) before it answered; shorten the work the prompt asks for, \
                     or raise the agent's own limit"
                        .into(),
                ));
            }
            "max_turn_requests" => {
                return Err(Failure::Failed(
                    "the agent's turn reached its limit of model requests (stopReason \
                     `max_turn_requests`) before it answered; split the stage's work, or raise \
                     the agent's own limit"
                        .into(),
                ));
            }
            "cancelled" => {
                return Err(Failure::Failed(
                    "the agent cancelled its turn (stopReason `cancelled`) though ralph-flow \
                     did not ask it to"
                        .into(),
                ));
            }
            other => warnings.push(format!(
                "the agent ended its turn with stopReason `{other}`"
            )),
        }
        let mut usage = turn::prompt_usage(&result)
            .or_else(|| conn.turn.meta_usage())
            .unwrap_or_else(super::Usage::unreported_call);
        if usage.unreported == 0 {
            usage.cost_usd = conn.turn.cost_usd;
        }
        let text = conn.turn.answer();
        Ok(AgentReply {
            raw: text.clone(),
            text,
            usage,
            session_id: Some(session_id),
            model: conn.turn.model.clone().or_else(|| model.cloned()),
            denied: Vec::new(),
            warnings,
            structured_output: None,
        })
    }

    /// Sets the session's mode to `default` (the agent asks before it acts) when the agent
    /// offers it and starts in another mode. A refusal is a warning: the policy still
    /// decides what the agent asks.
    async fn set_mode(
        &self,
        conn: &mut Conn,
        session: &Value,
        session_id: &str,
        warnings: &mut Vec<String>,
    ) -> Result<(), Failure> {
        let Some(modes) = session.get("modes") else {
            return Ok(());
        };
        let current = modes.get("currentModeId").and_then(Value::as_str);
        let offers = modes
            .get("availableModes")
            .and_then(Value::as_array)
            .is_some_and(|m| {
                m.iter()
                    .any(|m| m.get("id").and_then(Value::as_str) == Some(ASKING))
            });
        if !offers || current == Some(ASKING) {
            return Ok(());
        }
        let req = typed::<agent_client_protocol_schema::v1::SetSessionModeRequest>(json!({
            "sessionId": session_id,
            "modeId": ASKING,
        }));
        if let Err(e) = conn.call("session/set_mode", req).await? {
            warnings.push(format!(
                "the agent refused the session mode `{ASKING}` ({}); it may act without asking \
                 the workflow's policy",
                e.text()
            ));
        }
        Ok(())
    }

    /// Sets the session's model: by `session/set_model` when `session/new` listed `models`,
    /// else by the `model` config option (`session/set_config_option`). A model the agent
    /// does not offer is a refused configuration, naming those it offers.
    async fn set_model(
        &self,
        conn: &mut Conn,
        session: &Value,
        session_id: &str,
        model: &str,
        warnings: &mut Vec<String>,
    ) -> Result<(), Failure> {
        let listed = |items: Option<&Vec<Value>>, key: &str| -> Vec<String> {
            items
                .into_iter()
                .flatten()
                .filter_map(|m| m.get(key)?.as_str().map(str::to_string))
                .collect()
        };
        let (method, params, offered) = if let Some(models) = session.get("models") {
            let offered = listed(
                models.get("availableModels").and_then(Value::as_array),
                "modelId",
            );
            if models.get("currentModelId").and_then(Value::as_str) == Some(model) {
                return Ok(());
            }
            (
                "session/set_model",
                json!({"sessionId": session_id, "modelId": model}),
                offered,
            )
        } else if let Some(option) = session
            .get("configOptions")
            .and_then(Value::as_array)
            .and_then(|o| {
                o.iter()
                    .find(|o| o.get("category").and_then(Value::as_str) == Some("model"))
            })
        {
            let offered = listed(option.get("options").and_then(Value::as_array), "value");
            if option.get("currentValue").and_then(Value::as_str) == Some(model) {
                return Ok(());
            }
            let id = option.get("id").and_then(Value::as_str).unwrap_or("model");
            (
                "session/set_config_option",
                json!({"sessionId": session_id, "configId": id, "value": model}),
                offered,
            )
        } else {
            warnings.push(format!(
                "the agent lists no models, so `model = \"{model}\"` was not set; pass the \
                 model in its `command` the way the agent takes it"
            ));
            return Ok(());
        };
        if !offered.is_empty() && !offered.iter().any(|m| m == model) {
            return Err(Failure::Refused(format!(
                "the agent does not offer the model `{model}`; it offers {}",
                offered
                    .iter()
                    .map(|m| format!("`{m}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        if let Err(e) = conn.call(method, params).await? {
            return Err(Failure::Refused(format!(
                "the agent refused the model `{model}`: {}",
                e.text()
            )));
        }
        Ok(())
    }
}

/// The mode in which the agents that have modes ask the client before they act.
const ASKING: &str = "default";

/// A request's parameters checked against the protocol's type (and written as it writes
/// them); what does not fit is sent as built.
fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(params: Value) -> Value {
    serde_json::from_value::<T>(params.clone())
        .ok()
        .and_then(|t| serde_json::to_value(t).ok())
        .unwrap_or(params)
}

/// " (it said: ...)" when the agent said something.
fn said(text: &str) -> String {
    let text = text.trim();
    if text.is_empty() {
        String::new()
    } else {
        let cut: String = text.chars().take(500).collect();
        format!("; it said: {cut}")
    }
}

/// Why a conversation failed, before it is classified.
#[derive(Debug)]
enum Failure {
    Stop(Stop),
    /// A JSON-RPC error answered to one of the client's requests.
    Rpc(RpcError),
    /// The agent broke the protocol.
    Protocol(String),
    Refused(String),
    Failed(String),
}

impl From<Stop> for Failure {
    fn from(s: Stop) -> Failure {
        Failure::Stop(s)
    }
}

impl Failure {
    /// The error the executor acts on.
    fn into_error(self, call: &AgentCall, program: &str, stderr: &str) -> CallError {
        let tail = tail(stderr);
        let with_tail = |m: String| {
            if tail.is_empty() {
                m
            } else {
                format!("{m}; its stderr ends with:\n{tail}")
            }
        };
        match self {
            Failure::Stop(Stop::Timeout { idle }) => CallError::Timeout {
                after: if idle {
                    call.idle_timeout.unwrap_or_default()
                } else {
                    call.timeout.unwrap_or_default()
                },
                idle,
                tail,
            },
            Failure::Stop(stop @ (Stop::Closed | Stop::Io(_))) => {
                let how = match stop {
                    Stop::Io(e) => format!("its input could not be written: {e}"),
                    _ => "it closed its output".to_string(),
                };
                let m = with_tail(format!("`{program}` ended before it answered ({how})"));
                classify(&m).unwrap_or(CallError::Transient {
                    message: m,
                    retry_after: None,
                })
            }
            Failure::Stop(Stop::Garbage { line, why }) => {
                let shown: String = line.chars().take(200).collect();
                CallError::Failed {
                    message: with_tail(format!(
                        "`{program}` does not speak ACP: it wrote `{shown}` on its stdout, where \
                         a JSON-RPC message was expected ({why}); check the agent's `command` \
                         (gemini takes `--acp`, opencode `acp`)"
                    )),
                }
            }
            Failure::Rpc(e) => {
                let m = format!("the agent answered with an error: {}", e.text());
                classify(&m).unwrap_or(CallError::Failed {
                    message: with_tail(m),
                })
            }
            Failure::Protocol(m) => CallError::Failed {
                message: with_tail(format!("`{program}` broke the protocol: {m}")),
            },
            Failure::Refused(message) => CallError::Refused { message },
            Failure::Failed(message) => CallError::Failed { message },
        }
    }
}

/// A rate limit or an authentication failure, from what the agent said.
fn classify(message: &str) -> Option<CallError> {
    if RATE_LIMITED.is_match(message) {
        Some(CallError::RateLimited {
            message: message.to_string(),
            retry_after: None,
        })
    } else if UNAUTHENTICATED.is_match(message) {
        Some(CallError::Refused {
            message: format!(
                "{message} (the agent is not logged in to its service: set its API key in the \
                 agent's `env`, or log in with the agent's own command, then run again)"
            ),
        })
    } else {
        None
    }
}

/// The last lines of a text, for messages.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    let tail = lines[lines.len().saturating_sub(10)..].join("\n");
    let skip = tail.chars().count().saturating_sub(2000);
    tail.chars().skip(skip).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_classified_by_what_the_agent_said() {
        let call = AgentCall::default();
        let e = Failure::Rpc(RpcError {
            code: -32603,
            message: "Internal error".into(),
            data: Some(json!("API Error: 429 rate_limit_error")),
        })
        .into_error(&call, "a", "");
        assert!(matches!(e, CallError::RateLimited { .. }), "{e:?}");
        let e = Failure::Rpc(RpcError {
            code: -32000,
            message: "Authentication required".into(),
            data: None,
        })
        .into_error(&call, "a", "");
        let CallError::Refused { message } = e else {
            panic!("refused: {e:?}");
        };
        assert!(message.contains("set its API key"), "{message}");
        let e = Failure::Stop(Stop::Closed).into_error(&call, "agent", "boom\n");
        assert_eq!(
            e,
            CallError::Transient {
                message: "`agent` ended before it answered (it closed its output); its stderr \
                          ends with:\nboom"
                    .into(),
                retry_after: None
            }
        );
        let e = Failure::Stop(Stop::Garbage {
            line: "hello".into(),
            why: "it is not JSON".into(),
        })
        .into_error(&call, "agent", "");
        assert!(
            matches!(&e, CallError::Failed { message } if message.contains("does not speak ACP")),
            "{e:?}"
        );
    }
}
