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

/// A command or check stage's attempts (see [`Attempt`]): its program (if a check has
/// one), its exit code, its output, and a check's `expect`; a failed attempt is tried
/// again after a backoff while the stage has retries left.
struct CommandAttempt<'x, 'p, 'f> {
    ex: &'x Exec<'p>,
    frame: &'x Frame<'f>,
    n: NodeId,
    started: i64,
    /// The program (a check may have none), the exit codes that pass, a check's `expect`.
    cmd: Option<&'x crate::model::CommandSpec>,
    codes: Vec<i64>,
    expect: Option<&'x crate::model::Text>,
    is_check: bool,
    /// Whether the stage declares an `output` (read by its extractor, kept).
    has_output: bool,
    retries: u64,
    max_attempts: u32,
    timeout: Option<Duration>,
    idle: Option<Duration>,
    /// Why the last attempt failed, and its output.
    last_msg: String,
    last_output: Json,
}

/// What a program run by an attempt gave: how it was started and how it ended.
struct Ran {
    spec: ProcSpec,
    out: process::ProcOutput,
}

/// A command's answer: its output, and whether it passes.
struct CommandAnswer {
    value: Json,
    ok: bool,
}

impl<'x, 'p, 'f> CommandAttempt<'x, 'p, 'f> {
    fn new(ex: &'x Exec<'p>, frame: &'x Frame<'f>, n: NodeId, started: i64) -> Option<Self> {
        let plan = ex.plan;
        let st = plan.stage(n);
        let (cmd, codes, expect) = match &st.body {
            StageBody::Command(c) => (
                Some(&**c),
                c.ok_codes.iter().map(|c| c.value).collect::<Vec<_>>(),
                None,
            ),
            StageBody::Check {
                command,
                pass_codes,
                expect,
            } => (
                command.as_deref(),
                pass_codes.iter().map(|c| c.value).collect(),
                expect.as_ref(),
            ),
            _ => return None,
        };
        let retries = st
            .keys()
            .retries
            .as_ref()
            .and_then(|r| resolve_count(&r.value, &plan.params).ok())
            .unwrap_or(0);
        let duration = |d: Option<&crate::source::Spanned<crate::model::Dur>>| {
            d.and_then(|d| resolve_duration(&d.value, &plan.params).ok())
        };
        Some(CommandAttempt {
            ex,
            frame,
            n,
            started,
            cmd,
            codes: if codes.is_empty() { vec![0] } else { codes },
            expect,
            is_check: plan.node(n).kind == StageKind::Check,
            has_output: st.keys().output.is_some(),
            retries,
            max_attempts: u32::try_from(retries).unwrap_or(u32::MAX).saturating_add(1),
            timeout: duration(st.keys().timeout.as_ref()),
            idle: duration(st.keys().idle_timeout.as_ref()),
            last_msg: String::new(),
            last_output: Json::Null,
        })
    }

    /// The program of an attempt: its argv (never a shell), environment, working
    /// directory, stdin, limits and files, rendered over the attempt's context.
    fn spec(
        &self,
        cmd: &crate::model::CommandSpec,
        ctx: &Value,
        dir: &std::path::Path,
    ) -> Result<ProcSpec, StageError> {
        let ex = self.ex;
        let node = ex.plan.node(self.n);
        let name = &node.name;
        let mut argv = Vec::new();
        for i in 0..cmd.argv.len() {
            let item = ex
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
            ("RALPH_FLOW_RUN".to_string(), ex.shared.run.id.clone()),
            ("RALPH_FLOW_STAGE".to_string(), name.clone()),
        ];
        if node.uses_stage_dir {
            env.push((
                "RALPH_FLOW_STAGE_DIR".to_string(),
                dir.to_string_lossy().into_owned(),
            ));
        }
        for (k, _) in &cmd.env {
            env.push((
                k.value.clone(),
                ex.render(&format!("{name}/env/{}", k.value), ctx)?,
            ));
        }
        let cwd = match &cmd.cwd {
            Some(_) => {
                let c = ex.render(&format!("{name}/cwd"), ctx)?;
                self.frame.cwd.join(c.trim())
            }
            None => self.frame.cwd.clone(),
        };
        let stdin = match &cmd.stdin {
            Some(_) => Some(ex.render(&format!("{name}/stdin"), ctx)?.into_bytes()),
            None => None,
        };
        Ok(ProcSpec {
            argv,
            cwd,
            env,
            stdin,
            timeout: self.timeout,
            idle_timeout: self.idle,
            stdout_path: Some(dir.join("stdout")),
            stderr_path: Some(dir.join("stderr")),
            pid_file: None,
            process_log: Some(PathBuf::from(&ex.shared.run.dir).join(PROCESS_LOG)),
            result_done: None,
        })
    }

    /// Keeps how a program ran, and reads its streams and exit code into the stage's
    /// output (`Err`: it timed out, and the stage settles).
    fn ran(
        &mut self,
        at: &AttemptAt<'_>,
        Ran { spec, out }: Ran,
    ) -> Result<(Json, bool, String), Ends> {
        let ex = self.ex;
        ex.artifact(
            &at.dir,
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
        let stdout_text = String::from_utf8_lossy(&out.stdout).into_owned();
        let code = out.code.map_or(-1, i64::from);
        let base = json!({
            "exit_code": code,
            "stdout": text_of(&out.stdout, out.stdout_cut, MAX_STREAM_IN_OUTPUT),
            "stderr": text_of(&out.stderr, out.stderr_cut, MAX_STREAM_IN_OUTPUT),
        });
        if matches!(out.ended, Ended::Timeout | Ended::Idle) {
            let (what, lim) = if out.ended == Ended::Idle {
                ("produced no output for", self.idle)
            } else {
                ("ran longer than", self.timeout)
            };
            let msg = format!(
                "`{}` {what} {} and was stopped (its whole process group)\n{}",
                shown_argv(&spec.argv),
                crate::text::duration(lim.unwrap_or_default()),
                tail(&String::from_utf8_lossy(&out.stderr), 2000)
            );
            return Err(Ends::new(ex.fail_attempt(
                at,
                NodeState::TimedOut,
                None,
                msg,
                Usage::default(),
            )));
        }
        let ok = self.codes.contains(&code);
        if !ok {
            self.last_msg = format!(
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
        Ok((base, ok, stdout_text))
    }

    /// Whether a check passes: its program passed and its `expect` holds over its output
    /// (`passed` is added to the output).
    fn passes(&mut self, value: &mut Json, ok: bool) -> bool {
        let mut passed = ok;
        if let (true, Some(x)) = (ok, self.expect) {
            let ex = self.ex;
            let ctx = ex.context(self.frame, &[("output", to_value(value))]);
            match ex.eval(&x.value, &ctx) {
                Ok(v) => {
                    passed = v.is_true();
                    if !passed {
                        let stream =
                            |k: &str| value.get(k).and_then(Json::as_str).unwrap_or("").as_bytes();
                        self.last_msg = format!(
                            "`{}` does not hold{}",
                            x.value,
                            feedback_streams(stream("stdout"), stream("stderr"))
                        );
                    }
                }
                Err(e) => {
                    passed = false;
                    self.last_msg = format!("its `expect` failed: {e}");
                }
            }
        }
        if let Some(obj) = value.as_object_mut() {
            obj.insert("passed".into(), Json::Bool(passed));
        }
        passed
    }
}

impl Attempt for CommandAttempt<'_, '_, '_> {
    /// The program, if the stage has one.
    type Request = Option<ProcSpec>;
    type Reply = Option<Ran>;
    type Answer = CommandAnswer;

    fn attempts(&self) -> u32 {
        self.max_attempts
    }

    fn render(&mut self, at: &AttemptAt<'_>, ctx: &Value) -> Result<Option<ProcSpec>, Ends> {
        match self.cmd {
            Some(cmd) => match self.spec(cmd, ctx, &at.dir) {
                Ok(s) => Ok(Some(s)),
                Err(e) => Err(Ends::new(self.ex.fail_now(self.started, e.message()))),
            },
            None => Ok(None),
        }
    }

    fn launch(&self, spec: &Option<ProcSpec>) -> Launch<'_> {
        match spec {
            // The program finds the records of the stages before it on disk, and its
            // attempt's directory when its stage names `run.stage_dir` (otherwise the
            // directory is made with the first byte of output, if any).
            Some(spec) => Launch {
                starts: true,
                agent: None,
                writes: self.ex.plan.node(self.n).uses_stage_dir,
                label: format!("$ {}", shown_argv(&spec.argv)),
            },
            None => Launch {
                starts: false,
                agent: None,
                writes: false,
                label: "check".into(),
            },
        }
    }

    async fn call(
        &mut self,
        at: &AttemptAt<'_>,
        spec: Option<ProcSpec>,
    ) -> Result<Option<Ran>, Ends> {
        let Some(spec) = spec else {
            return Ok(None);
        };
        let ex = self.ex;
        match ex.run_program(self.n, at.scope, at.attempt, &spec).await {
            Ok(out) => Ok(Some(Ran { spec, out })),
            Err(NotRun::Limit { limit, message }) => Err(Ends::new(ex.limit_met(
                at,
                None,
                limit,
                message,
                &Usage::default(),
            ))),
            Err(NotRun::Failed(msg)) => {
                ex.attempt_record(
                    at,
                    AttemptState::Failed,
                    None,
                    Some(msg.clone()),
                    &Usage::default(),
                );
                let on_error = ex.plan.node(self.n).on_error.clone();
                Err(Ends::new(Outcome::Settled(
                    Settled::error(NodeState::Failed, msg, on_error, self.started)
                        .spent(at.attempt, Usage::default()),
                )))
            }
        }
    }

    async fn extract(
        &mut self,
        at: &AttemptAt<'_>,
        ran: Option<Ran>,
    ) -> Result<CommandAnswer, Ends> {
        let (base, mut ok, stdout_text) = match ran {
            Some(ran) => self.ran(at, ran)?,
            None => (
                json!({"exit_code": 0, "stdout": "", "stderr": ""}),
                true,
                String::new(),
            ),
        };
        let ex = self.ex;
        let has_output = self.has_output;
        let mut value = match ex.extractors.get(&self.n) {
            Some(e) if has_output => match e.extract(&stdout_text, Some(base.clone())) {
                Ok(v) => v,
                Err(problems) => {
                    ok = false;
                    self.last_msg =
                        format!("its output could not be read:\n{}", problems.join("\n"));
                    base
                }
            },
            _ => base,
        };
        if self.is_check {
            ok = self.passes(&mut value, ok);
        }
        if self.is_check || has_output {
            ex.artifact(
                &at.dir,
                "output.json",
                &serde_json::to_string_pretty(&value).unwrap_or_default(),
            );
        }
        Ok(CommandAnswer { value, ok })
    }

    fn commit(&mut self, at: &AttemptAt<'_>, CommandAnswer { value, ok }: CommandAnswer) -> Judged {
        let ex = self.ex;
        if ok {
            ex.attempt_record(at, AttemptState::Ok, None, None, &Usage::default());
            return Judged::Settle(ex.done(
                self.frame,
                self.n,
                self.started,
                value,
                Usage::default(),
                at.attempt,
            ));
        }
        ex.artifact(&at.dir, "feedback.md", &self.last_msg);
        ex.attempt_record(
            at,
            AttemptState::Failed,
            None,
            Some(tail(&self.last_msg, 4000)),
            &Usage::default(),
        );
        self.last_output = value;
        Judged::Again
    }

    async fn retry(&mut self, attempt: u32) {
        let wait = super::policy::backoff_delay(self.ex.shared.opts.backoff, attempt);
        self.ex.shared.progress.note(&format!(
            "↺ {} failed; retry {attempt} of {} in {}",
            self.ex.plan.node(self.n).name,
            self.retries,
            crate::text::duration(wait)
        ));
        tokio::time::sleep(wait).await;
    }

    fn exhausted(self, started: i64) -> Outcome {
        let ex = self.ex;
        let feedback = ex
            .feedback_template(self.frame, self.n, &self.last_output)
            .unwrap_or_else(|| tail(&self.last_msg, MAX_FEEDBACK));
        Outcome::Settled(
            Settled::failed(
                self.last_output,
                self.last_msg,
                ex.plan.node(self.n).on_fail.clone(),
                started,
            )
            .with_feedback(Some(feedback))
            .spent(self.max_attempts, Usage::default()),
        )
    }
}

impl Exec<'_> {
    pub(super) async fn run_command(&self, frame: &Frame<'_>, n: NodeId) -> Outcome {
        let started = now_ms();
        match CommandAttempt::new(self, frame, n, started) {
            Some(command) => self.drive(frame, n, started, command).await,
            None => self.fail_now(started, "not a command".into()),
        }
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
