//! Command and check stages: argv (never a shell), streams, exit codes, `expect`.

use std::path::PathBuf;
use std::time::Duration;

use minijinja::Value;
use serde_json::{Value as Json, json};

use super::attempt::*;
use super::context::*;
use super::exec::*;
use super::frame::*;
use super::now_ms;
use crate::backend::Usage;
use crate::backend::process::{self, Ended, ProcSpec};
use crate::compile::NodeId;
use crate::model::{StageBody, StageKind};
use crate::params::{resolve_count, resolve_duration};
use crate::store::{AttemptState, NodeState};

/// The run's log of the programs its commands started and ended (see
/// [`process::stop_leftovers`]), in the run's directory.
pub(super) const PROCESS_LOG: &str = "processes";

impl Exec<'_> {
    pub(super) async fn run_command(&self, frame: &Frame<'_>, n: NodeId) -> Outcome {
        let started = now_ms();
        let st = self.plan.stage(n);
        let node = self.plan.node(n);
        let scope = self.scope(frame);
        let (cmd, codes, expect) = match &st.body {
            StageBody::Command(c) => (
                Some(c),
                c.ok_codes.iter().map(|c| c.value).collect::<Vec<_>>(),
                None,
            ),
            StageBody::Check {
                command,
                pass_codes,
                expect,
            } => (
                command.as_ref(),
                pass_codes.iter().map(|c| c.value).collect(),
                expect.as_ref(),
            ),
            _ => return self.fail_now(started, "not a command".into()),
        };
        let codes = if codes.is_empty() { vec![0] } else { codes };
        let retries = st
            .keys()
            .retries
            .as_ref()
            .and_then(|r| resolve_count(&r.value, &self.plan.params).ok())
            .unwrap_or(0);
        let max_attempts = u32::try_from(retries).unwrap_or(u32::MAX).saturating_add(1);
        let timeout = st
            .keys()
            .timeout
            .as_ref()
            .and_then(|d| resolve_duration(&d.value, &self.plan.params).ok());
        let idle = st
            .keys()
            .idle_timeout
            .as_ref()
            .and_then(|d| resolve_duration(&d.value, &self.plan.params).ok());
        let is_check = node.kind == StageKind::Check;
        let mut last_msg = String::new();
        let mut last_output = Json::Null;
        for attempt in 1..=max_attempts {
            let (at, ctx) = match self.begin_attempt(frame, n, &scope, attempt, started) {
                Ok(x) => x,
                // The state directory cannot be written: like a store failure, the run
                // stops and stays resumable.
                Err(e) => return self.shared.io_failed(e),
            };
            let dir = &at.dir;
            let mut base = json!({"exit_code": 0, "stdout": "", "stderr": ""});
            let mut ok = true;
            let mut stdout_text = String::new();
            if let Some(cmd) = cmd {
                let spec = match self.command_spec(frame, n, cmd, &ctx, dir, timeout, idle) {
                    Ok(s) => s,
                    Err(e) => return self.fail_now(started, e.message()),
                };
                self.attempt_record(&at, AttemptState::Running, None, None, &Usage::default());
                self.shared.durable().await;
                if self.halted() {
                    return Outcome::Stopped;
                }
                // The program finds the records of the stages before it on disk, and its
                // attempt's directory when its stage names `run.stage_dir` (otherwise the
                // directory is made with the first byte of output, if any).
                let writes_there = self.plan.node(n).uses_stage_dir;
                if !self.ready_to_start(writes_there.then_some(dir.as_path())) {
                    return Outcome::Stopped;
                }
                self.shared.progress.started(
                    &scope,
                    &node.name,
                    attempt,
                    &format!("$ {}", shown_argv(&spec.argv)),
                );
                let out = match self.run_program(n, &scope, attempt, &spec).await {
                    Ok(o) => o,
                    Err(NotRun::Limit { limit, message }) => {
                        return self.limit_met(&at, None, limit, message, &Usage::default());
                    }
                    Err(NotRun::Failed(msg)) => {
                        self.attempt_record(
                            &at,
                            AttemptState::Failed,
                            None,
                            Some(msg.clone()),
                            &Usage::default(),
                        );
                        return Outcome::Settled(
                            Settled::error(NodeState::Failed, msg, node.on_error.clone(), started)
                                .spent(attempt, Usage::default()),
                        );
                    }
                };
                self.artifact(
                    dir,
                    "command.json",
                    &serde_json::to_string_pretty(&json!({
                        "argv": spec.argv,
                        "cwd": spec.cwd,
                        "exit_code": out.code,
                        "signal": out.signal,
                        "elapsed_ms": u64::try_from(out.elapsed.as_millis()).unwrap_or(u64::MAX),
                    }))
                    .unwrap_or_default(),
                );
                stdout_text = String::from_utf8_lossy(&out.stdout).into_owned();
                let code = out.code.map_or(-1, i64::from);
                base = json!({
                    "exit_code": code,
                    "stdout": text_of(&out.stdout, out.stdout_cut, MAX_STREAM_IN_OUTPUT),
                    "stderr": text_of(&out.stderr, out.stderr_cut, MAX_STREAM_IN_OUTPUT),
                });
                if matches!(out.ended, Ended::Timeout | Ended::Idle) {
                    let what = if out.ended == Ended::Idle {
                        "produced no output for"
                    } else {
                        "ran longer than"
                    };
                    let lim = if out.ended == Ended::Idle {
                        idle
                    } else {
                        timeout
                    }
                    .unwrap_or_default();
                    let msg = format!(
                        "`{}` {what} {} and was stopped (its whole process group)\n{}",
                        shown_argv(&spec.argv),
                        crate::text::duration(lim),
                        tail(&String::from_utf8_lossy(&out.stderr), 2000)
                    );
                    return self.fail_attempt(
                        &at,
                        NodeState::TimedOut,
                        None,
                        msg,
                        Usage::default(),
                    );
                }
                ok = codes.contains(&code);
                if !ok {
                    last_msg = format!(
                        "`{}` exited with {}{}",
                        shown_argv(&spec.argv),
                        match (out.code, out.signal) {
                            (Some(c), _) => format!("code {c}"),
                            (None, Some(s)) => format!("signal {s}"),
                            _ => "an unknown status".to_string(),
                        },
                        feedback_streams(&out.stdout, &out.stderr)
                    );
                }
            } else {
                self.shared
                    .progress
                    .started(&scope, &node.name, attempt, "check");
            }
            let mut value = match self.extractors.get(&n) {
                Some(e) if st.keys().output.is_some() => {
                    match e.extract(&stdout_text, Some(base.clone())) {
                        Ok(v) => v,
                        Err(problems) => {
                            ok = false;
                            last_msg =
                                format!("its output could not be read:\n{}", problems.join("\n"));
                            base.clone()
                        }
                    }
                }
                _ => base.clone(),
            };
            if is_check {
                let mut passed = ok;
                if let (true, Some(x)) = (ok, expect) {
                    let ctx = self.context(frame, &[("output", to_value(&value))]);
                    match self.eval(&x.value, &ctx) {
                        Ok(v) => {
                            passed = v.is_true();
                            if !passed {
                                last_msg = format!(
                                    "`{}` does not hold{}",
                                    x.value,
                                    feedback_streams(
                                        value
                                            .get("stdout")
                                            .and_then(Json::as_str)
                                            .unwrap_or("")
                                            .as_bytes(),
                                        value
                                            .get("stderr")
                                            .and_then(Json::as_str)
                                            .unwrap_or("")
                                            .as_bytes()
                                    )
                                );
                            }
                        }
                        Err(e) => {
                            passed = false;
                            last_msg = format!("its `expect` failed: {e}");
                        }
                    }
                }
                if let Some(obj) = value.as_object_mut() {
                    obj.insert("passed".into(), Json::Bool(passed));
                }
                ok = passed;
            }
            if is_check || st.keys().output.is_some() {
                self.artifact(
                    dir,
                    "output.json",
                    &serde_json::to_string_pretty(&value).unwrap_or_default(),
                );
            }
            if ok {
                self.attempt_record(&at, AttemptState::Ok, None, None, &Usage::default());
                return self.done(frame, n, started, value, Usage::default(), attempt);
            }
            self.artifact(dir, "feedback.md", &last_msg);
            self.attempt_record(
                &at,
                AttemptState::Failed,
                None,
                Some(tail(&last_msg, 4000)),
                &Usage::default(),
            );
            last_output = value;
            if attempt < max_attempts {
                let wait = super::policy::backoff_delay(self.shared.opts.backoff, attempt);
                self.shared.progress.note(&format!(
                    "↺ {} failed; retry {attempt} of {retries} in {}",
                    node.name,
                    crate::text::duration(wait)
                ));
                tokio::time::sleep(wait).await;
            }
        }
        let feedback = self
            .feedback_template(frame, n, &last_output)
            .unwrap_or_else(|| tail(&last_msg, MAX_FEEDBACK));
        Outcome::Settled(
            Settled::failed(last_output, last_msg, node.on_fail.clone(), started)
                .with_feedback(Some(feedback))
                .spent(max_attempts, Usage::default()),
        )
    }

    /// Runs a stage's program: here, or as a unit of work that any worker may take (a run
    /// on workers, unless the stage names its attempt's directory, which is here). Fails
    /// with why it could not run.
    async fn run_program(
        &self,
        n: NodeId,
        scope: &str,
        attempt: u32,
        spec: &ProcSpec,
    ) -> Result<process::ProcOutput, NotRun> {
        if let Some(units) = self
            .shared
            .units
            .as_ref()
            .filter(|_| !self.plan.node(n).uses_stage_dir)
        {
            let name = &self.plan.node(n).name;
            let stage_key = format!("{scope}/{name}#");
            let call = units.next_call(&format!("{stage_key}{attempt}"));
            let payload =
                serde_json::to_value(super::units::CommandWork::of(spec)).unwrap_or(Json::Null);
            let done = units
                .work(super::units::UnitAsk {
                    publisher: self.shared.publisher.as_ref(),
                    cwd: &spec.cwd,
                    stage_key: &stage_key,
                    call_key: &format!("{attempt}.{call}"),
                    kind: "command",
                    payload,
                    labels: &self.stage_labels(n),
                    hold: self
                        .held_resource(n)
                        .as_ref()
                        .map(|(r, c)| (r.as_str(), *c)),
                })
                .await
                .map_err(|e| NotRun::Failed(e.to_string()))?;
            return match done {
                super::units::UnitResult::Program(p) => {
                    // The attempt's files here, as a program run here leaves them (what the
                    // worker kept of each stream: its end).
                    let out = p.output();
                    for (path, bytes) in [
                        (&spec.stdout_path, &out.stdout),
                        (&spec.stderr_path, &out.stderr),
                    ] {
                        if let Some(path) = path.as_ref().filter(|_| !bytes.is_empty()) {
                            self.shared
                                .artifacts
                                .file(path, &String::from_utf8_lossy(bytes));
                        }
                    }
                    Ok(out)
                }
                super::units::UnitResult::Failed(why) => Err(NotRun::Failed(why)),
                // A limit of the worker's machine: the run stops as for one met here.
                super::units::UnitResult::Limit { limit, message } => {
                    Err(NotRun::Limit { limit, message })
                }
                super::units::UnitResult::Agent(_) => Err(NotRun::Failed(
                    "a worker answered a program with an agent's reply".into(),
                )),
            };
        }
        // A program kept here in a run on workers takes its workspace's turn too.
        let _turn = match &self.shared.units {
            Some(units) => {
                units
                    .turn(self.shared.publisher.as_ref(), &spec.cwd)
                    .await
                    .1
            }
            None => None,
        };
        process::run(spec).await.map_err(|e| match e {
            process::SpawnError::Limit(hit) => NotRun::Limit {
                limit: hit.limit,
                message: hit.to_string(),
            },
            e => NotRun::Failed(e.message(spec.argv.first().map_or("", String::as_str))),
        })
    }

    /// A limit of the machine met by an attempt (too many open files, a full disk, the file
    /// size limit, where its program or agent started or its output was written): the
    /// machine's problem, not the stage's. The attempt is recorded as interrupted (with
    /// `message`, and the agent that met it), no stage settles, and the run stops as
    /// resumable (see [`Shared::limit_reached`]); the stage runs again on `resume`.
    pub(super) fn limit_met(
        &self,
        at: &AttemptAt<'_>,
        agent: Option<&str>,
        limit: process::Limit,
        message: String,
        usage: &Usage,
    ) -> Outcome {
        self.attempt_record(
            at,
            AttemptState::Interrupted,
            agent,
            Some(message.clone()),
            usage,
        );
        self.shared
            .limit_reached(Some(qualified(at.scope, at.stage)), limit, message)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn command_spec(
        &self,
        frame: &Frame<'_>,
        n: NodeId,
        cmd: &crate::model::CommandSpec,
        ctx: &Value,
        dir: &std::path::Path,
        timeout: Option<Duration>,
        idle: Option<Duration>,
    ) -> Result<ProcSpec, StageError> {
        let name = &self.plan.node(n).name;
        let mut argv = Vec::new();
        for i in 0..cmd.argv.len() {
            let item = self
                .render(&format!("{name}/argv/{i}"), ctx)
                .map_err(|source| StageError::Argv { index: i, source })?;
            match crate::template::spread_items(&item) {
                Some(items) => {
                    argv.extend(items.map_err(|source| StageError::Spread { index: i, source })?)
                }
                None => argv.push(item),
            }
        }
        let mut env = vec![
            ("RALPH_FLOW_RUN".to_string(), self.shared.run.id.clone()),
            ("RALPH_FLOW_STAGE".to_string(), name.clone()),
        ];
        if self.plan.node(n).uses_stage_dir {
            env.push((
                "RALPH_FLOW_STAGE_DIR".to_string(),
                dir.to_string_lossy().into_owned(),
            ));
        }
        for (k, _) in &cmd.env {
            env.push((
                k.value.clone(),
                self.render(&format!("{name}/env/{}", k.value), ctx)?,
            ));
        }
        let cwd = match &cmd.cwd {
            Some(_) => {
                let c = self.render(&format!("{name}/cwd"), ctx)?;
                frame.cwd.join(c.trim())
            }
            None => frame.cwd.clone(),
        };
        let stdin = match &cmd.stdin {
            Some(_) => Some(self.render(&format!("{name}/stdin"), ctx)?.into_bytes()),
            None => None,
        };
        Ok(ProcSpec {
            argv,
            cwd,
            env,
            stdin,
            timeout,
            idle_timeout: idle,
            stdout_path: Some(dir.join("stdout")),
            stderr_path: Some(dir.join("stderr")),
            pid_file: None,
            process_log: Some(PathBuf::from(&self.shared.run.dir).join(PROCESS_LOG)),
            result_done: None,
        })
    }
}

/// How much of a command's argv a progress line or a message shows, in bytes as quoted.
const SHOWN_ARGV: usize = 400;

/// A command as people read it: each word quoted for a POSIX shell, cut after
/// [`SHOWN_ARGV`] bytes (see [`crate::shell::join_shown`]).
fn shown_argv(argv: &[String]) -> String {
    crate::shell::join_shown(argv, SHOWN_ARGV)
}

/// Why a stage's program did not run to its end.
enum NotRun {
    /// It could not start or be carried out (the stage fails and takes its `on_error`).
    Failed(String),
    /// A limit of the machine (here or a worker's) was reached: what could not be done, with
    /// the system's error (the run stops; see [`Exec::limit_met`]).
    Limit {
        limit: process::Limit,
        message: String,
    },
}

/// A stage as the run's messages name it: `SCOPE/STAGE`, or `STAGE` at the top level.
fn qualified(scope: &str, stage: &str) -> String {
    if scope.is_empty() {
        stage.to_string()
    } else {
        format!("{scope}/{stage}")
    }
}

fn feedback_streams(stdout: &[u8], stderr: &[u8]) -> String {
    let mut s = String::new();
    let out = String::from_utf8_lossy(stdout);
    let err = String::from_utf8_lossy(stderr);
    if !out.trim().is_empty() {
        s.push_str(&format!(
            "\n--- stdout (end) ---\n{}",
            tail(out.trim_end(), 6000)
        ));
    }
    if !err.trim().is_empty() {
        s.push_str(&format!(
            "\n--- stderr (end) ---\n{}",
            tail(err.trim_end(), 6000)
        ));
    }
    s
}
