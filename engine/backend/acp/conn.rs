//! The connection to one ACP agent: its program started, the client's requests sent and
//! their answers awaited, while every request of the agent's is answered at once and every
//! update taken in. The timeouts, the end of the agent's output and a cancel are seen here.

use std::time::Duration;

use agent_client_protocol_schema::v1::{AgentNotification, AgentRequest};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::time::Instant;

use super::client::{self, Files};
use super::rpc::{self, Incoming, RpcError, code};
use super::turn::Turn;
use crate::backend::Activity;
use crate::backend::process::Session;
use crate::permit::Rules;

/// How long an agent has to end its turn after `session/cancel`, and to exit after its
/// stdin is closed, before its group is killed.
pub(super) const CANCEL_GRACE: Duration = Duration::from_secs(3);

/// Why the conversation stopped before an answer came.
#[derive(Debug)]
pub(super) enum Stop {
    /// The call's timeout (`idle`: its idle timeout) passed.
    Timeout { idle: bool },
    /// The agent closed its stdout (it exited, or crashed).
    Closed,
    /// The agent wrote a line that is not a JSON-RPC message.
    Garbage { line: String, why: String },
    /// Its stdin could not be written (it is gone).
    Io(String),
}

/// An agent talked to.
pub(super) struct Conn {
    pub(super) session: Option<Session>,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
    pub(super) log: rpc::Log,
    next_id: u64,
    deadline: Option<Instant>,
    idle: Option<Duration>,
    last_output: Instant,
    /// Set once `session/cancel` is sent: permission requests are answered `cancelled`.
    cancelled: bool,
    /// Set while a `session/prompt` is unanswered: dropping the connection cancels it.
    pub(super) prompting: Option<String>,
    pub(super) policy: Rules,
    pub(super) workspace: std::path::PathBuf,
    pub(super) roots: std::sync::Arc<[std::path::PathBuf]>,
    pub(super) turn: Turn,
    /// The permission decisions that denied something, with what was asked.
    pub(super) denied: Vec<String>,
    /// The files written through the client (relative to the workspace).
    pub(super) written: Vec<String>,
}

/// What a connection starts from.
pub(super) struct Setup {
    pub(super) session: Session,
    pub(super) log: rpc::Log,
    pub(super) timeout: Option<Duration>,
    pub(super) idle: Option<Duration>,
    pub(super) policy: Rules,
    pub(super) workspace: std::path::PathBuf,
    pub(super) roots: std::sync::Arc<[std::path::PathBuf]>,
    pub(super) turn: Turn,
}

impl Conn {
    pub(super) fn new(mut s: Setup) -> Option<Conn> {
        let stdin = s.session.stdin.take()?;
        let stdout = s.session.stdout.take()?;
        let now = Instant::now();
        Some(Conn {
            session: Some(s.session),
            stdin: Some(stdin),
            lines: BufReader::new(stdout).lines(),
            log: s.log,
            next_id: 0,
            deadline: s.timeout.and_then(|t| now.checked_add(t)),
            idle: s.idle,
            last_output: now,
            cancelled: false,
            prompting: None,
            policy: s.policy,
            workspace: s.workspace,
            roots: s.roots,
            turn: s.turn,
            denied: Vec::new(),
            written: Vec::new(),
        })
    }

    /// Sends a message.
    async fn send(&mut self, msg: Value) -> Result<(), Stop> {
        self.log.message("client", &msg);
        let Some(stdin) = &mut self.stdin else {
            return Err(Stop::Io("its stdin is closed".into()));
        };
        let mut line = msg.to_string();
        line.push('\n');
        stdin
            .write_all(line.as_bytes())
            .await
            .map_err(|e| Stop::Io(e.to_string()))?;
        stdin.flush().await.map_err(|e| Stop::Io(e.to_string()))
    }

    /// Sends a notification.
    pub(super) async fn notify(&mut self, method: &str, params: Value) -> Result<(), Stop> {
        self.send(rpc::notification(method, params)).await
    }

    /// Sends a request and waits for its answer, serving the agent meanwhile.
    pub(super) async fn call(
        &mut self,
        method: &str,
        params: Value,
    ) -> Result<Result<Value, RpcError>, Stop> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(rpc::request(id, method, params)).await?;
        self.answer_of(id).await
    }

    /// Waits for the answer to request `id`, serving the agent meanwhile.
    pub(super) async fn answer_of(&mut self, id: u64) -> Result<Result<Value, RpcError>, Stop> {
        loop {
            match self.next().await? {
                Incoming::Response { id: got, result } if got.as_u64() == Some(id) => {
                    return Ok(result);
                }
                Incoming::Response { .. } => {}
                Incoming::Request { id, method, params } => {
                    self.serve(&id, &method, params).await?
                }
                Incoming::Notification { method, params } => self.take(&method, params),
            }
        }
    }

    /// Sends a request without waiting for its answer; returns its id.
    pub(super) async fn start(&mut self, method: &str, params: Value) -> Result<u64, Stop> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(rpc::request(id, method, params)).await?;
        Ok(id)
    }

    /// The next message, or why none will come.
    async fn next(&mut self) -> Result<Incoming, Stop> {
        loop {
            let idle_at = self.idle.and_then(|d| self.last_output.checked_add(d));
            let line = tokio::select! {
                line = self.lines.next_line() => line,
                () = sleep_until_opt(self.deadline) => return Err(Stop::Timeout { idle: false }),
                () = sleep_until_opt(idle_at) => return Err(Stop::Timeout { idle: true }),
            };
            let line = match line {
                Ok(Some(l)) => l,
                Ok(None) | Err(_) => return Err(Stop::Closed),
            };
            self.last_output = Instant::now();
            if line.trim().is_empty() {
                continue;
            }
            match rpc::parse(&line) {
                Ok(m) => {
                    if let Ok(v) = serde_json::from_str::<Value>(&line) {
                        self.log.message("agent", &v);
                    }
                    return Ok(m);
                }
                Err(why) => {
                    self.log.text(&line);
                    return Err(Stop::Garbage { line, why });
                }
            }
        }
    }

    /// Takes in a notification.
    fn take(&mut self, method: &str, params: Value) {
        if method != "session/update" {
            return;
        }
        match AgentNotification::from_method_and_params(method, &params) {
            Ok(AgentNotification::SessionNotification(n)) => self.turn.update(n.update),
            Ok(_) => {}
            Err(e) => tracing::debug!("an ACP update ralph-flow does not read: {e}"),
        }
    }

    /// Answers a request of the agent's, at once.
    async fn serve(&mut self, id: &Value, method: &str, params: Value) -> Result<(), Stop> {
        let result = match AgentRequest::from_method_and_params(method, &params) {
            Ok(AgentRequest::RequestPermissionRequest(req)) => {
                if self.cancelled {
                    Ok(client::cancelled())
                } else {
                    let seen = self.turn.tools.get(&req.tool_call.tool_call_id.to_string());
                    let a = client::permission(&req, seen, &self.policy, &self.workspace);
                    if !a.decision.allowed {
                        self.denied.push(format!("{}: {}", a.asked, a.decision));
                    }
                    self.turn.report(client::reported(a.asked, a.decision));
                    Ok(a.result)
                }
            }
            Ok(AgentRequest::ReadTextFileRequest(req)) => {
                let files = Files {
                    workspace: &self.workspace,
                    roots: &self.roots,
                };
                let r = client::read(&files, &req);
                if let Err((_, why)) = &r {
                    self.turn
                        .note(&format!("- read `{}` refused: {why}", req.path.display()));
                }
                r
            }
            Ok(AgentRequest::WriteTextFileRequest(req)) => {
                let files = Files {
                    workspace: &self.workspace,
                    roots: &self.roots,
                };
                let w = client::write(&files, &req, &self.policy);
                if !w.decision.allowed {
                    self.denied
                        .push(format!("write {}: {}", w.path, w.decision));
                }
                self.turn.report(client::reported(
                    format!("write {}", w.path),
                    w.decision.clone(),
                ));
                if w.result.is_ok() {
                    if !self.written.contains(&w.path) {
                        self.written.push(w.path.clone());
                    }
                    self.turn.report(Activity::Wrote(w.path));
                }
                w.result
            }
            Ok(other) => Err((
                code::METHOD_NOT_FOUND,
                format!(
                    "Method not found: ralph-flow does not serve `{}` (it offers no terminal)",
                    other.method()
                ),
            )),
            Err(agent_client_protocol_schema::MethodDispatchError::UnknownMethod { .. }) => Err((
                code::METHOD_NOT_FOUND,
                format!("Method not found: {method}"),
            )),
            Err(e) => Err((code::INVALID_PARAMS, format!("Invalid params: {e}"))),
        };
        self.send(rpc::response(id, result)).await
    }

    /// Cancels the turn in flight (`session/cancel`), then serves the agent for up to
    /// [`CANCEL_GRACE`] while it ends the turn, answering its permission requests
    /// `cancelled`. Returns the turn's answer if it came.
    pub(super) async fn cancel(&mut self, prompt_id: u64) -> Option<Result<Value, RpcError>> {
        let session_id = self.prompting.take()?;
        self.cancelled = true;
        self.deadline = Some(Instant::now() + CANCEL_GRACE);
        self.idle = None;
        if self
            .notify(
                "session/cancel",
                serde_json::json!({"sessionId": session_id}),
            )
            .await
            .is_err()
        {
            return None;
        }
        self.answer_of(prompt_id).await.ok()
    }

    /// Ends the agent: stdin closed, a short grace to exit, then its group killed. Returns
    /// its stderr's end.
    pub(super) async fn end(&mut self) -> String {
        drop(self.stdin.take());
        match self.session.take() {
            Some(s) => String::from_utf8_lossy(&s.end(CANCEL_GRACE).await.stderr).into_owned(),
            None => String::new(),
        }
    }
}

impl Drop for Conn {
    /// A call dropped while its turn runs (Ctrl-C, SIGTERM, the run stopping): the turn is
    /// cancelled (`session/cancel`) and the agent given [`CANCEL_GRACE`] to end before its
    /// group is killed, on a task of its own. Without a runtime, or past it, the session's
    /// own drop kills the group.
    fn drop(&mut self) {
        let (Some(session_id), Some(mut stdin), Some(session)) = (
            self.prompting.take(),
            self.stdin.take(),
            self.session.take(),
        ) else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let cancel = rpc::notification(
            "session/cancel",
            serde_json::json!({"sessionId": session_id}),
        );
        self.log.message("client", &cancel);
        // Written here and now: the run may end (and stop the agent) before a task runs. A
        // line this short fits in the pipe unless the agent stopped reading altogether.
        let line = format!("{cancel}\n");
        let _ = nix::unistd::write(&stdin, line.as_bytes());
        rt.spawn(async move {
            let _ = stdin.flush().await;
            drop(stdin);
            session.end(CANCEL_GRACE).await;
        });
    }
}

/// Sleeps until the instant, or forever without one.
async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
