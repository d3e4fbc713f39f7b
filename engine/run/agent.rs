//! Agent stages: the prompt, the call (with the retry, rate-limit and fallback policy), schema
//! repair, and the attempt's artifacts.

use serde_json::{Value as Json, json};

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

impl Exec<'_> {
    pub(super) async fn run_agent(&self, frame: &Frame<'_>, n: NodeId) -> Outcome {
        let started = now_ms();
        let st = self.plan.stage(n);
        let node = self.plan.node(n);
        let scope = self.scope(frame);
        let agent = match self.plan.agent_of(n) {
            Ok(a) => a,
            Err(e) => return self.fail_now(started, e.to_string()),
        };
        let chain = self.plan.fallback_chain(agent);
        let retries = st
            .keys()
            .retries
            .as_ref()
            .and_then(|r| resolve_count(&r.value, &self.plan.params).ok())
            .unwrap_or(2);
        let max_attempts = u32::try_from(retries).unwrap_or(u32::MAX).saturating_add(1);
        let a = &self.plan.workflow.agents[agent];
        let timeout = timeout_of(st.keys().timeout.as_ref(), a.timeout.as_ref(), self.plan);
        let idle = timeout_of(
            st.keys().idle_timeout.as_ref(),
            a.idle_timeout.as_ref(),
            self.plan,
        );
        let window = a
            .context_window
            .as_ref()
            .and_then(|w| resolve_count(&w.value, &self.plan.params).ok());
        let extractor = self.extractors.get(&n);
        let mut usage = Usage::default();
        let mut repair: Option<Vec<String>> = None;
        for attempt in 1..=max_attempts {
            let (at, ctx) = match self.begin_attempt(frame, n, &scope, attempt, started) {
                Ok(x) => x,
                // The state directory cannot be written: like a store failure, the run
                // stops and stays resumable.
                Err(e) => return self.shared.io_failed(e),
            };
            let dir = &at.dir;
            let mut prompt = match self.render(&format!("{}/prompt", node.name), &ctx) {
                Ok(p) => p,
                Err(e) => {
                    return self
                        .fail_now(started, format!("its prompt could not be rendered: {e}"));
                }
            };
            if let Some(problems) = &repair {
                prompt.push_str("\n\n---\nYour previous answer could not be used:\n");
                for p in problems {
                    prompt.push_str(&format!("- {p}\n"));
                }
                prompt.push_str("Answer again, in exactly the required format.\n");
            }
            self.artifact(dir, "prompt.md", &prompt);
            if let Some(w) = window {
                if let Some(msg) = too_big(&prompt, w) {
                    self.attempt_record(
                        &at,
                        AttemptState::Failed,
                        Some(&a.name.value),
                        Some(msg.clone()),
                        &Usage::default(),
                    );
                    return Outcome::Settled(
                        Settled::failed(Json::Null, msg, Target::Fail, started)
                            .spent(attempt, Usage::default()),
                    );
                }
            }
            if let Some((t, msg)) = self.over_budget(frame, n, &usage) {
                return self.budget_outcome(started, t, msg, usage, attempt - 1);
            }
            self.attempt_record(
                &at,
                AttemptState::Running,
                Some(&a.name.value),
                None,
                &Usage::default(),
            );
            self.shared.durable().await;
            if self.halted() {
                // The attempt could not be recorded (or the run is stopping): nothing starts.
                return Outcome::Stopped;
            }
            // An agent (a CLI, an HTTP backend) writes in the attempt's directory; a replayed
            // one writes nothing.
            if !self.ready_to_start(self.shared.replay.is_none().then_some(dir)) {
                return Outcome::Stopped;
            }
            self.shared.progress.started(
                &scope,
                &node.name,
                attempt,
                &format!("agent {}", a.name.value),
            );
            let call = AgentCall {
                stage: node.name.clone(),
                scope: scope.clone(),
                attempt,
                prompt,
                model: None,
                args: Vec::new(),
                env: vec![
                    ("RALPH_FLOW_RUN".into(), self.shared.run.id.clone()),
                    ("RALPH_FLOW_STAGE".into(), node.name.clone()),
                    (
                        "RALPH_FLOW_STAGE_DIR".into(),
                        dir.to_string_lossy().into_owned(),
                    ),
                ],
                cwd: frame.cwd.clone(),
                dir: dir.clone(),
                timeout,
                idle_timeout: idle,
                schema: extractor
                    .filter(|e| e.wants_json())
                    .and_then(|_| self.plan.schemas.get(&n).map(|s| Json::clone(s)))
                    .filter(|_| {
                        st.keys()
                            .output
                            .as_ref()
                            .is_some_and(|o| o.schema.is_some())
                    }),
                max_tokens: None,
            };
            let result = self.call_with_policy(frame, n, &chain, call).await;
            let (mut reply, agent_name) = match result {
                Ok(r) => r,
                Err((CallError::Refused { message }, agent_name, _)) => {
                    // Not the work's failure but the workflow's: the run stops as a
                    // configuration error, and the stage runs again on `resume`.
                    let detail = format!(
                        "agent `{agent_name}`: the agent refused its configuration: {message}"
                    );
                    self.artifact(dir, "error.txt", &detail);
                    self.attempt_record(
                        &at,
                        AttemptState::ended(NodeState::Failed),
                        Some(&agent_name),
                        Some(detail),
                        &usage,
                    );
                    return self.shared.halt(crate::run::error::Halt::Refused {
                        stage: node.name.clone(),
                        agent: agent_name,
                        message: format!("refused its configuration: {message}"),
                    });
                }
                Err((CallError::Limit { limit, message }, agent_name, spent)) => {
                    // Too many open files, a full disk, the file size limit: the machine's
                    // problem, not the stage's. The run stops as resumable and the stage
                    // runs again on `resume`.
                    usage.add(&spent);
                    let detail = format!("agent `{agent_name}`: {message}");
                    return self.limit_met(&at, Some(&agent_name), limit, detail, &usage);
                }
                Err((e, agent_name, spent)) => {
                    usage.add(&spent);
                    let state = if matches!(e, CallError::Timeout { .. }) {
                        NodeState::TimedOut
                    } else {
                        NodeState::Failed
                    };
                    let msg = format!("agent `{agent_name}`: {e}");
                    let detail = match &e {
                        CallError::Timeout { tail: t, .. } if !t.is_empty() => {
                            format!("{msg}\nlast output:\n{t}")
                        }
                        _ => msg.clone(),
                    };
                    self.artifact(dir, "error.txt", &detail);
                    // The agent gave no answer: not a verdict on the work, so nothing
                    // of it reaches an agent as feedback, and `on_error` decides.
                    self.attempt_record(
                        &at,
                        AttemptState::ended(state),
                        Some(&agent_name),
                        Some(detail.clone()),
                        &usage,
                    );
                    return Outcome::Settled(
                        Settled::error(state, detail, node.on_error.clone(), started)
                            .spent(attempt, usage),
                    );
                }
            };
            usage.add(&reply.usage);
            for w in &reply.warnings {
                self.shared.event(&scope, &node.name, "warning", w.clone());
                self.shared
                    .progress
                    .note(&format!("! {}: agent `{agent_name}`: {w}", node.name));
            }
            if let Some(mode) = &reply.structured_output {
                self.shared.event(
                    "",
                    "",
                    super::exec::STEPPED_DOWN,
                    format!("{agent_name}: {mode}"),
                );
            }
            if !reply.denied.is_empty() {
                // What the denials left behind: changes that never reached a commit (a
                // sandbox that refused the commit rarely says it was `git commit`).
                if let Some(n) = uncommitted(&frame.cwd).await {
                    reply.denied.push(format!(
                        "git: {n} changed file{} left uncommitted",
                        if n == 1 { "" } else { "s" }
                    ));
                }
                let text = format!(
                    "agent `{agent_name}` was denied {} action{} (its `permissions` is `{}`): {}",
                    reply.denied.len(),
                    if reply.denied.len() == 1 { "" } else { "s" },
                    self.agents
                        .iter()
                        .find(|c| c.name == agent_name)
                        .map_or("read-only", |c| c.permissions.as_str()),
                    reply.denied.join("; ")
                );
                self.artifact(dir, "denied.txt", &reply.denied.join("\n"));
                self.shared
                    .event(&scope, &node.name, "denied", text.clone());
                self.shared
                    .progress
                    .note(&format!("! {}: {text}", node.name));
                self.note_denied(frame, &node.name, &text);
            }
            self.artifact(dir, "raw.txt", &reply.raw);
            if reply.text != reply.raw {
                self.artifact(dir, "answer.md", &reply.text);
            }
            let extracted = match extractor {
                Some(e) => e.extract(&reply.text, None),
                None => Ok(json!({ "text": reply.text })),
            };
            match extracted {
                Ok(v) => {
                    self.artifact(
                        dir,
                        "output.json",
                        &serde_json::to_string_pretty(&v).unwrap_or_default(),
                    );
                    self.attempt_record(
                        &at,
                        AttemptState::Ok,
                        Some(&agent_name),
                        None,
                        &reply.usage,
                    );
                    if let Some((t, msg)) = self.over_budget(frame, n, &usage) {
                        // The output is kept; the budget's action decides what follows.
                        let mut s = Settled::done(v, started)
                            .spent(attempt, usage)
                            .with_verdict(msg);
                        if t == Target::Fail {
                            s.state = NodeState::Failed;
                        }
                        return Outcome::Settled(s.with_action(t));
                    }
                    return self.done(frame, n, started, v, usage, attempt);
                }
                Err(problems) => {
                    let text = problems.join("\n");
                    self.artifact(dir, "feedback.md", &text);
                    self.attempt_record(
                        &at,
                        AttemptState::Invalid,
                        Some(&agent_name),
                        Some(text.clone()),
                        &reply.usage,
                    );
                    self.shared.event(&scope, &node.name, "invalid", text);
                    if attempt < max_attempts {
                        let more = match problems.len() {
                            1 => String::new(),
                            n => format!(" (and {} more)", n - 1),
                        };
                        self.shared.progress.note(&format!(
                            "↺ {} answer {attempt} did not validate: {}{more}; asking again",
                            node.name,
                            super::progress::one_line(&problems[0], 200),
                        ));
                    }
                    if let Some((t, msg)) = self.over_budget(frame, n, &usage) {
                        return self.budget_outcome(started, t, msg, usage, attempt);
                    }
                    repair = Some(problems);
                }
            }
        }
        let problems = repair.unwrap_or_default();
        let msg = format!(
            "its output did not validate after {max_attempts} attempt{}:\n{}",
            if max_attempts == 1 { "" } else { "s" },
            problems
                .iter()
                .map(|p| format!("  - {p}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        self.failed(n, started, NodeState::Failed, msg, usage, max_attempts)
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
            if self.spreads_agents() {
                let result = self.call_elsewhere(n, cfg, call).await;
                if let Ok(reply) = &result {
                    self.add_usage(frame, n, &cfg.name, &reply.usage);
                }
                return result;
            }
            let backend = self.backend(chain[i]).map_err(|e| CallError::Missing {
                message: crate::diag::error_chain(&e),
            })?;
            let mut this = call.clone();
            this.model = cfg.model.clone();
            this.max_tokens = cfg.max_tokens;
            tracing::debug!(stage = %call.stage, scope = %call.scope, attempt = call.attempt, agent = %cfg.name, "calling agent");
            let result = backend
                .call(&this)
                .await
                .map(redact_reply)
                .map_err(redact_error);
            match &result {
                Ok(reply) => self.add_usage(frame, n, &cfg.name, &reply.usage),
                Err(e) => {
                    tracing::debug!(stage = %call.stage, agent = %cfg.name, error = %e, "agent call failed");
                }
            }
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
