//! Agent stages: the prompt, the call (with the retry, rate-limit and fallback policy), schema
//! repair, and the attempt's artifacts.

use serde_json::{Value as Json, json};

use super::attempt::{Attempt, AttemptAt, Ends, Judged, Launch};
use super::exec::*;
use super::frame::*;
use super::now_ms;
use super::policy::{Next, Policy};
use crate::backend::{AgentCall, AgentReply, CallError, Usage};
use crate::compile::NodeId;
use crate::compile::Target;
use crate::params::resolve_count;
use crate::store::{AttemptState, NodeState};

/// A reply with the registered secrets masked, before anything reads it.
fn redact_reply(mut r: AgentReply) -> AgentReply {
    use crate::secrets::redact_in_place;
    redact_in_place(&mut r.text);
    redact_in_place(&mut r.raw);
    r.denied.iter_mut().for_each(redact_in_place);
    r.warnings.iter_mut().for_each(redact_in_place);
    r
}

/// An error with the registered secrets masked.
fn redact_error(mut e: CallError) -> CallError {
    crate::secrets::redact_in_place(e.text_mut());
    e
}

/// An agent stage's attempts (see [`Attempt`]): the prompt, the call with the retry,
/// rate-limit and fallback policy, and schema repair (an answer that does not validate is
/// asked again, with what was wrong with it).
struct AgentAttempt<'x, 'p, 'f> {
    ex: &'x Exec<'p>,
    frame: &'x Frame<'f>,
    n: NodeId,
    started: i64,
    /// The agent, and the chain of it and its fallbacks.
    agent: &'x crate::model::Agent,
    chain: Vec<usize>,
    max_attempts: u32,
    timeout: Option<std::time::Duration>,
    idle: Option<std::time::Duration>,
    window: Option<u64>,
    extractor: Option<&'x super::extract::Extractor>,
    /// Whether the stage's `output` declares a schema (sent to a backend that takes one).
    declares_schema: bool,
    /// What the stage's calls spent so far.
    usage: Usage,
    /// What was wrong with the last answer (handed to the next attempt).
    repair: Option<Vec<String>>,
    /// The stage's own `permissions`, resolved: its calls are decided by it instead of
    /// their agent's.
    policy: Option<std::sync::Arc<crate::permit::Rules>>,
}

/// An agent's answer: its output or what is wrong with it, the agent that gave it, and
/// what the call spent.
struct AgentAnswer {
    output: Result<Json, Vec<String>>,
    agent: String,
    usage: Usage,
}

impl<'x, 'p, 'f> AgentAttempt<'x, 'p, 'f> {
    fn new(
        ex: &'x Exec<'p>,
        frame: &'x Frame<'f>,
        n: NodeId,
        started: i64,
    ) -> Result<Self, String> {
        let plan = ex.plan;
        let st = plan.stage(n);
        let agent = plan.agent_of(n).map_err(|e| e.to_string())?;
        let retries = st
            .keys()
            .retries
            .as_ref()
            .and_then(|r| resolve_count(&r.value, &plan.params).ok())
            .unwrap_or(2);
        let a = &plan.workflow.agents[agent];
        let policy = st.keys().permissions.as_ref().map(|p| {
            crate::model::policy::resolve_shared(Some(&p.value), &plan.workflow.policies, &|span| {
                ex.sources.locate(span)
            })
        });
        Ok(AgentAttempt {
            policy,
            ex,
            frame,
            n,
            started,
            agent: a,
            chain: plan.fallback_chain(agent),
            max_attempts: u32::try_from(retries).unwrap_or(u32::MAX).saturating_add(1),
            timeout: timeout_of(st.keys().timeout.as_ref(), a.timeout.as_ref(), plan),
            idle: timeout_of(
                st.keys().idle_timeout.as_ref(),
                a.idle_timeout.as_ref(),
                plan,
            ),
            window: a
                .context_window
                .as_ref()
                .and_then(|w| resolve_count(&w.value, &plan.params).ok()),
            extractor: ex.extractors.get(&n),
            declares_schema: st
                .keys()
                .output
                .as_ref()
                .is_some_and(|o| o.schema.is_some()),
            usage: Usage::default(),
            repair: None,
        })
    }

    /// The call of an attempt, with its prompt.
    fn agent_call(&self, at: &AttemptAt<'_>, prompt: String) -> AgentCall {
        let (ex, n) = (self.ex, self.n);
        let name = &ex.plan.node(n).name;
        AgentCall {
            stage: name.clone(),
            scope: at.scope.to_string(),
            attempt: at.attempt,
            prompt,
            model: None,
            args: Vec::new(),
            env: vec![
                ("RALPH_FLOW_RUN".into(), ex.shared.run.id.clone()),
                ("RALPH_FLOW_STAGE".into(), name.clone()),
                (
                    "RALPH_FLOW_STAGE_DIR".into(),
                    at.dir.to_string_lossy().into_owned(),
                ),
            ],
            cwd: self.frame.cwd.clone(),
            dir: at.dir.clone(),
            timeout: self.timeout,
            idle_timeout: self.idle,
            schema: self
                .extractor
                .filter(|e| self.declares_schema && e.wants_json())
                .and_then(|_| ex.plan.schemas.get(&n).map(|s| Json::clone(s))),
            max_tokens: None,
            watch: None,
            policy: self.policy.clone(),
            roots: ex.roots.clone(),
        }
    }

    /// Settles a call that failed for good: a refusal of the agent's configuration stops
    /// the run, a limit of the machine stops it as resumable, and any other failure settles
    /// the stage by its `on_error`.
    fn call_failed(
        &mut self,
        at: &AttemptAt<'_>,
        e: CallError,
        agent: String,
        spent: Usage,
    ) -> Outcome {
        let ex = self.ex;
        let dir = &at.dir;
        let e = match e {
            CallError::Refused { message } => {
                // Not the work's failure but the workflow's: the run stops as a
                // configuration error, and the stage runs again on `resume`.
                let detail =
                    format!("agent `{agent}`: the agent refused its configuration: {message}");
                ex.artifact(dir, "error.txt", &detail);
                ex.attempt_record(
                    at,
                    AttemptState::ended(NodeState::Failed),
                    Some(&agent),
                    Some(detail),
                    &self.usage,
                );
                return ex.shared.halt(crate::run::error::Halt::Refused {
                    stage: at.stage.to_string(),
                    agent,
                    message: format!("refused its configuration: {message}"),
                });
            }
            CallError::Limit { limit, message } => {
                // Too many open files, a full disk, the file size limit: the machine's
                // problem, not the stage's. The run stops as resumable and the stage
                // runs again on `resume`.
                self.usage.add(&spent);
                let detail = format!("agent `{agent}`: {message}");
                return ex.limit_met(at, Some(&agent), limit, detail, &self.usage);
            }
            e => e,
        };
        self.usage.add(&spent);
        let state = if matches!(e, CallError::Timeout { .. }) {
            NodeState::TimedOut
        } else {
            NodeState::Failed
        };
        let msg = format!("agent `{agent}`: {e}");
        let detail = match &e {
            CallError::Timeout { tail: t, .. } if !t.is_empty() => {
                format!("{msg}\nlast output:\n{t}")
            }
            _ => msg.clone(),
        };
        ex.artifact(dir, "error.txt", &detail);
        // The agent gave no answer: not a verdict on the work, so nothing of it reaches an
        // agent as feedback, and `on_error` decides.
        ex.attempt_record(
            at,
            AttemptState::ended(state),
            Some(&agent),
            Some(detail.clone()),
            &self.usage,
        );
        let on_error = ex.plan.node(self.n).on_error.clone();
        Outcome::Settled(
            Settled::error(state, detail, on_error, self.started)
                .spent(at.attempt, std::mem::take(&mut self.usage)),
        )
    }

    /// Says what the agent reported (warnings, a structured-output mode it stepped down
    /// to, denied actions with the changes they left uncommitted) and keeps its raw output.
    async fn report(&self, at: &AttemptAt<'_>, reply: &mut AgentReply, agent: &str) {
        let (ex, stage) = (self.ex, at.stage);
        for w in &reply.warnings {
            ex.shared.event(at.scope, stage, "warning", w.clone());
            ex.shared
                .progress
                .note(&format!("! {stage}: agent `{agent}`: {w}"));
        }
        if let Some(mode) = &reply.structured_output {
            ex.shared.event(
                "",
                "",
                super::exec::STEPPED_DOWN,
                format!("{agent}: {mode}"),
            );
        }
        if !reply.denied.is_empty() {
            // What the denials left behind: changes that never reached a commit (a
            // sandbox that refused the commit rarely says it was `git commit`).
            if let Some(n) = uncommitted(&self.frame.cwd).await {
                reply.denied.push(format!(
                    "git: {n} changed file{} left uncommitted",
                    if n == 1 { "" } else { "s" }
                ));
            }
            let text = format!(
                "agent `{agent}` was denied {} action{} (its `permissions` is `{}`): {}",
                reply.denied.len(),
                if reply.denied.len() == 1 { "" } else { "s" },
                match &self.policy {
                    Some(p) => p.name.as_str(),
                    None => ex
                        .agents
                        .iter()
                        .find(|c| c.name == agent)
                        .map_or("read-only", |c| c.policy.name.as_str()),
                },
                reply.denied.join("; ")
            );
            ex.artifact(&at.dir, "denied.txt", &reply.denied.join("\n"));
            ex.shared.event(at.scope, stage, "denied", text.clone());
            ex.shared.progress.note(&format!("! {stage}: {text}"));
            ex.note_denied(self.frame, stage, &text);
        }
        ex.artifact(&at.dir, "raw.txt", &reply.raw);
        if reply.text != reply.raw {
            ex.artifact(&at.dir, "answer.md", &reply.text);
        }
    }
}

impl Attempt for AgentAttempt<'_, '_, '_> {
    type Request = String;
    type Reply = (AgentReply, String);
    type Answer = AgentAnswer;

    fn attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The prompt (with what was wrong with the last answer), which must fit the agent's
    /// context window, and a budget that must not be spent.
    fn render(&mut self, at: &AttemptAt<'_>, ctx: &minijinja::Value) -> Result<String, Ends> {
        let ex = self.ex;
        let mut prompt = ex
            .render(&format!("{}/prompt", at.stage), ctx)
            .map_err(|e| {
                Ends::new(ex.fail_now(
                    self.started,
                    format!("its prompt could not be rendered: {e}"),
                ))
            })?;
        if let Some(problems) = &self.repair {
            prompt.push_str("\n\n---\nYour previous answer could not be used:\n");
            for p in problems {
                prompt.push_str(&format!("- {p}\n"));
            }
            prompt.push_str("Answer again, in exactly the required format.\n");
        }
        ex.artifact(&at.dir, "prompt.md", &prompt);
        if let Some(msg) = self.window.and_then(|w| too_big(&prompt, w)) {
            ex.attempt_record(
                at,
                AttemptState::Failed,
                Some(&self.agent.name.value),
                Some(msg.clone()),
                &Usage::default(),
            );
            return Err(Ends::new(Outcome::Settled(
                Settled::failed(Json::Null, msg, Target::Fail, self.started)
                    .spent(at.attempt, Usage::default()),
            )));
        }
        if let Some((t, msg)) = ex.over_budget(self.frame, self.n, &self.usage) {
            let usage = std::mem::take(&mut self.usage);
            return Err(Ends::new(ex.budget_outcome(
                self.started,
                t,
                msg,
                usage,
                at.attempt - 1,
            )));
        }
        Ok(prompt)
    }

    fn launch(&self, _prompt: &String) -> Launch<'_> {
        Launch {
            starts: true,
            agent: Some(&self.agent.name.value),
            // An agent (a CLI, an HTTP backend) writes in the attempt's directory; a
            // replayed one writes nothing.
            writes: self.ex.shared.replay.is_none(),
            label: format!("agent {}", self.agent.name.value),
        }
    }

    async fn call(
        &mut self,
        at: &AttemptAt<'_>,
        prompt: String,
    ) -> Result<(AgentReply, String), Ends> {
        let call = self.agent_call(at, prompt);
        match self
            .ex
            .call_with_policy(self.frame, self.n, &self.chain, call)
            .await
        {
            Ok(r) => Ok(r),
            Err((e, agent, spent)) => Err(Ends::new(self.call_failed(at, e, agent, spent))),
        }
    }

    async fn extract(
        &mut self,
        at: &AttemptAt<'_>,
        (mut reply, agent): (AgentReply, String),
    ) -> Result<AgentAnswer, Ends> {
        self.usage.add(&reply.usage);
        self.report(at, &mut reply, &agent).await;
        let output = match self.extractor {
            Some(e) => e.extract(&reply.text, None),
            None => Ok(json!({ "text": reply.text })),
        };
        Ok(AgentAnswer {
            output,
            agent,
            usage: reply.usage,
        })
    }

    /// An output that validates settles the stage (unless a budget is spent, whose action
    /// decides); one that does not is asked for again.
    fn commit(&mut self, at: &AttemptAt<'_>, answer: AgentAnswer) -> Judged {
        let (ex, n, started, attempt) = (self.ex, self.n, self.started, at.attempt);
        let agent = Some(answer.agent.as_str());
        match answer.output {
            Ok(v) => {
                ex.artifact(
                    &at.dir,
                    "output.json",
                    &serde_json::to_string_pretty(&v).unwrap_or_default(),
                );
                ex.attempt_record(at, AttemptState::Ok, agent, None, &answer.usage);
                let usage = std::mem::take(&mut self.usage);
                if let Some((t, msg)) = ex.over_budget(self.frame, n, &usage) {
                    // The output is kept; the budget's action decides what follows.
                    let mut s = Settled::done(v, started)
                        .spent(attempt, usage)
                        .with_verdict(msg);
                    if t == Target::Fail {
                        s.state = NodeState::Failed;
                    }
                    return Judged::Settle(Outcome::Settled(s.with_action(t)));
                }
                Judged::Settle(ex.done(self.frame, n, started, v, usage, attempt))
            }
            Err(problems) => {
                let text = problems.join("\n");
                ex.artifact(&at.dir, "feedback.md", &text);
                ex.attempt_record(
                    at,
                    AttemptState::Invalid,
                    agent,
                    Some(text.clone()),
                    &answer.usage,
                );
                ex.shared.event(at.scope, at.stage, "invalid", text);
                if attempt < self.max_attempts {
                    let more = match problems.len() {
                        1 => String::new(),
                        n => format!(" (and {} more)", n - 1),
                    };
                    ex.shared.progress.note(&format!(
                        "↺ {} answer {attempt} did not validate: {}{more}; asking again",
                        at.stage,
                        super::progress::one_line(&problems[0], 200),
                    ));
                }
                if let Some((t, msg)) = ex.over_budget(self.frame, n, &self.usage) {
                    let usage = std::mem::take(&mut self.usage);
                    return Judged::Settle(ex.budget_outcome(started, t, msg, usage, attempt));
                }
                self.repair = Some(problems);
                Judged::Again
            }
        }
    }

    fn exhausted(self, started: i64) -> Outcome {
        let max_attempts = self.max_attempts;
        let problems = self.repair.unwrap_or_default();
        let msg = format!(
            "its output did not validate after {max_attempts} attempt{}:\n{}",
            if max_attempts == 1 { "" } else { "s" },
            problems
                .iter()
                .map(|p| format!("  - {p}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        self.ex.failed(
            self.n,
            started,
            NodeState::Failed,
            msg,
            self.usage,
            max_attempts,
        )
    }
}

impl Exec<'_> {
    pub(super) async fn run_agent(&self, frame: &Frame<'_>, n: NodeId) -> Outcome {
        let started = now_ms();
        match AgentAttempt::new(self, frame, n, started) {
            Ok(agent) => self.drive(frame, n, started, agent).await,
            Err(e) => self.fail_now(started, e),
        }
    }

    /// Calls an agent: transient failures retry with backoff, rate limits wait (or hand
    /// over to a fallback) without using up an attempt, a missing backend hands over (see
    /// [`super::policy`]). On failure, returns the error, the agent and what it spent.
    pub(super) async fn call_with_policy(
        &self,
        frame: &Frame<'_>,
        n: NodeId,
        chain: &[usize],
        call: AgentCall,
    ) -> Result<(AgentReply, String), (CallError, String, Usage)> {
        let opts = &self.shared.opts;
        let policy = Policy {
            backoff: opts.backoff,
            transient_retries: opts.transient_retries,
            rate_limit_wait: opts.rate_limit_wait,
            chain: chain.len(),
        };
        let call = &call;
        let attempt = |i: usize| async move {
            let cfg = &self.agents[chain[i]];
            let began = self
                .shared
                .trace
                .as_ref()
                .map(|_| std::time::SystemTime::now());
            let traced = |result: &Result<AgentReply, CallError>| {
                if let (Some(t), Some(began)) = (&self.shared.trace, began) {
                    t.agent_call(call, cfg, began, result.as_ref());
                }
            };
            if self.spreads_agents() {
                let result = self.call_elsewhere(n, cfg, call).await;
                if let Ok(reply) = &result {
                    self.add_usage(frame, n, &cfg.name, &reply.usage);
                }
                traced(&result);
                return result;
            }
            let backend = self.backend(chain[i]).map_err(|e| CallError::Missing {
                message: crate::diag::error_chain(&e),
            })?;
            let mut this = call.clone();
            this.model = cfg.model.clone();
            this.max_tokens = cfg.max_tokens;
            tracing::debug!(stage = %call.stage, scope = %call.scope, attempt = call.attempt, agent = %cfg.name, "calling agent");
            let result = if backend.watches() {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                this.watch = Some(tx);
                super::watch::watching(self.shared, call, backend.call(&this), rx).await
            } else {
                backend.call(&this).await
            };
            let result = result.map(redact_reply).map_err(redact_error);
            match &result {
                Ok(reply) => self.add_usage(frame, n, &cfg.name, &reply.usage),
                Err(e) => {
                    tracing::debug!(stage = %call.stage, agent = %cfg.name, error = %e, "agent call failed");
                }
            }
            traced(&result);
            result
        };
        let tell = |i: usize, next: &Next| {
            let name = &self.agents[chain[i]].name;
            let (kind, text, mark) = match next {
                Next::HandOver { to, why } => {
                    self.hand_over(call, name, chain[*to], why);
                    return;
                }
                Next::GiveUp(_) => return,
                Next::Retry { wait, why, n, of } => (
                    "retry",
                    format!(
                        "agent `{name}` failed ({}); retry {n} of {of} in {}",
                        why.text(),
                        crate::text::duration(*wait)
                    ),
                    "↺",
                ),
                Next::WaitRateLimit { wait, why } => (
                    "rate_limited",
                    format!(
                        "agent `{name}` is rate-limited ({}); waiting {} before trying again",
                        why.text(),
                        crate::text::duration(*wait)
                    ),
                    "⏳",
                ),
            };
            self.shared
                .event(&call.scope, &call.stage, kind, text.clone());
            self.shared.flush();
            self.shared
                .progress
                .note(&format!("{mark} {}: {text}", call.stage));
        };
        let (result, i) = super::policy::call(&policy, attempt, tell).await;
        let name = self.agents[chain[i]].name.clone();
        match result {
            Ok(reply) => Ok((reply, name)),
            Err(e) => Err((e, name, Usage::default())),
        }
    }

    /// Whether agent calls are units of work for the workers (a run on workers that
    /// neither replays nor records: those backends are this process's).
    fn spreads_agents(&self) -> bool {
        self.shared.units.is_some()
            && self.shared.replay.is_none()
            && self.shared.recorder.is_none()
    }

    /// Has a worker make an agent call (see [`super::units`]); the worker builds the agent's
    /// backend from the run's workflow, and drops the schema where it has no native use.
    async fn call_elsewhere(
        &self,
        n: NodeId,
        cfg: &crate::backend::AgentConfig,
        call: &AgentCall,
    ) -> Result<AgentReply, CallError> {
        let Some(units) = &self.shared.units else {
            return Err(CallError::Missing {
                message: "no store to hand the call to".into(),
            });
        };
        let mut this = call.clone();
        this.model = cfg.model.clone();
        this.max_tokens = cfg.max_tokens;
        let stage_key = format!("{}/{}#", call.scope, call.stage);
        let nth = units.next_call(&format!("{stage_key}{}", call.attempt));
        let payload = serde_json::to_value(super::units::AgentWork::of(&cfg.name, &this))
            .unwrap_or(serde_json::Value::Null);
        tracing::debug!(stage = %call.stage, scope = %call.scope, attempt = call.attempt, agent = %cfg.name, "calling agent on a worker");
        let done = units
            .work(super::units::UnitAsk {
                publisher: self.shared.publisher.as_ref(),
                cwd: &call.cwd,
                stage_key: &stage_key,
                call_key: &format!("{}.{nth}", call.attempt),
                kind: "agent",
                payload,
                labels: &self.stage_labels(n),
                hold: self
                    .held_resource(n)
                    .as_ref()
                    .map(|(r, c)| (r.as_str(), *c)),
            })
            .await
            .map_err(|e| e.to_string());
        match done {
            Ok(super::units::UnitResult::Agent(r)) => r.map(redact_reply).map_err(redact_error),
            Ok(super::units::UnitResult::Failed(message)) | Err(message) => {
                Err(redact_error(CallError::Transient {
                    message,
                    retry_after: None,
                }))
            }
            // A limit of the worker's machine where it kept the call's files.
            Ok(super::units::UnitResult::Limit { limit, message }) => {
                Err(CallError::Limit { limit, message })
            }
            Ok(super::units::UnitResult::Program(_)) => Err(CallError::Failed {
                message: "a worker answered an agent call with a program's output".into(),
            }),
        }
    }

    pub(super) fn hand_over(&self, call: &AgentCall, from: &str, to: usize, why: &CallError) {
        let text = format!(
            "agent `{from}`: {why}; falling back to `{}`",
            self.agents[to].name
        );
        self.shared
            .event(&call.scope, &call.stage, "fallback", text.clone());
        self.shared
            .progress
            .note(&format!("⇢ {}: {text}", call.stage));
    }
}

/// Checks a prompt against a context window (about 4 bytes a token). Names the size and the
/// largest parts when it does not fit.
fn too_big(prompt: &str, window: u64) -> Option<String> {
    let tokens = (prompt.len() as u64).div_ceil(4);
    if tokens <= window {
        return None;
    }
    // Parts: runs of lines between headings or blank lines.
    let mut parts: Vec<(usize, usize, usize, String)> = Vec::new();
    let mut start = 1;
    let mut size = 0;
    let mut first = String::new();
    for (i, line) in prompt.lines().enumerate() {
        let ln = i + 1;
        if (line.starts_with('#') || line.trim().is_empty()) && size > 0 {
            parts.push((start, ln - 1, size, first.clone()));
            start = ln;
            size = 0;
            first.clear();
        }
        if first.is_empty() && !line.trim().is_empty() {
            first = line.chars().take(60).collect();
        }
        size += line.len() + 1;
    }
    if size > 0 {
        parts.push((start, prompt.lines().count(), size, first));
    }
    parts.sort_by_key(|p| std::cmp::Reverse(p.2));
    let largest: Vec<String> = parts
        .iter()
        .take(3)
        .map(|(a, b, s, f)| format!("lines {a}-{b} (~{} tokens, \"{f}\")", s.div_ceil(4)))
        .collect();
    Some(format!(
        "the prompt is ~{tokens} tokens ({} bytes), more than the agent's context window of {window}; nothing was sent. Largest parts: {}",
        prompt.len(),
        largest.join("; ")
    ))
}

/// How many files `git status` shows changed in a working directory, when it is a git
/// repository and some are (at most 10 seconds of git; `None` otherwise).
async fn uncommitted(cwd: &std::path::Path) -> Option<usize> {
    let status = tokio::process::Command::new("git")
        .args(["status", "--porcelain"])
        .current_dir(cwd)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(10), status)
        .await
        .ok()?
        .ok()?;
    let n = String::from_utf8_lossy(&out.stdout).lines().count();
    (out.status.success() && n > 0).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_too_big_names_its_largest_parts() {
        let prompt = format!("# Task\nsmall\n\n# Diff\n{}\n", "x".repeat(4000));
        let msg = too_big(&prompt, 100).expect("too big");
        assert!(
            msg.contains("more than the agent's context window of 100"),
            "{msg}"
        );
        assert!(msg.contains("lines 4-5"), "{msg}");
        assert!(too_big("short", 100).is_none());
    }
}
