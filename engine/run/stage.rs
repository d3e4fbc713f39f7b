//! Leaf stages: agents (with schema repair, retries, rate limits, fallbacks, budgets),
//! commands and checks (argv, never a shell), gates and subflows.

use std::path::PathBuf;
use std::time::Duration;

use minijinja::Value;
use serde_json::{Value as Json, json};

use super::exec::{BodyEnd, Exec, Frame, Outcome, Settled, jv, limit, sanitize};
use super::now_ms;
use crate::backend::process::{self, Ended, ProcSpec};
use crate::backend::{AgentCall, AgentReply, CallError, Usage};
use crate::check::StageId as NodeId;
use crate::compile::{Target, resolve_count, resolve_duration};
use crate::model::{StageBody, StageKind};
use crate::store::{AttemptRecord, GateRequest, NodeState, Write, rfc3339};

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
    use crate::secrets::redact_in_place;
    match &mut e {
        CallError::RateLimited { message, .. }
        | CallError::Transient { message, .. }
        | CallError::Missing { message }
        | CallError::Failed { message } => redact_in_place(message),
        CallError::Timeout { tail, .. } => redact_in_place(tail),
    }
    e
}

/// Which attempt a record is about: stage, scope, number, artifact directory, start.
struct AttemptAt<'a> {
    node: NodeId,
    scope: &'a str,
    stage: &'a str,
    attempt: u32,
    dir: PathBuf,
    /// When this attempt started.
    started: i64,
    /// When the stage's first attempt started.
    stage_started: i64,
}

/// The most bytes of a command's stdout or stderr kept in its output (the files keep all).
const MAX_STREAM_IN_OUTPUT: usize = 256 * 1024;
/// The most bytes of feedback handed to the next iteration.
const MAX_FEEDBACK: usize = 16 * 1024;

/// The end of a text of which `cut` bytes before `bytes` are already gone, in at most
/// `max` bytes, with a marker that says how many bytes in all were cut.
fn text_of(bytes: &[u8], cut: u64, max: usize) -> String {
    let s = String::from_utf8_lossy(bytes);
    if s.len() <= max && cut == 0 {
        return s.into_owned();
    }
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!(
        "[... {} bytes cut ...]\n{}",
        cut + start as u64,
        &s[start..]
    )
}

fn tail(s: &str, max: usize) -> String {
    text_of(s.as_bytes(), 0, max)
}

fn write_file(dir: &std::path::Path, name: &str, text: &str) {
    if let Err(e) = std::fs::write(dir.join(name), crate::secrets::redact(text).as_bytes()) {
        tracing::warn!("cannot write {}: {e}", dir.join(name).display());
    }
}

impl Exec<'_> {
    /// Returns (and creates) the artifact directory of an attempt.
    /// Starts an attempt: its artifact directory, and the template context with `attempt`
    /// and `run.stage_dir`.
    fn begin_attempt<'a>(
        &'a self,
        frame: &Frame<'_>,
        n: NodeId,
        scope: &'a str,
        attempt: u32,
        stage_started: i64,
    ) -> Result<(AttemptAt<'a>, Value), String> {
        let stage = self.plan.node(n).name.as_str();
        let dir = self.attempt_dir(scope, stage, attempt)?;
        let ctx = self.context(
            frame,
            &[
                ("attempt", Value::from(attempt)),
                ("stage_dir", Value::from(dir.to_string_lossy().into_owned())),
            ],
        );
        let at = AttemptAt {
            node: n,
            scope,
            stage,
            attempt,
            dir,
            started: now_ms(),
            stage_started,
        };
        Ok((at, ctx))
    }

    fn attempt_dir(&self, scope: &str, stage: &str, attempt: u32) -> Result<PathBuf, String> {
        let mut dir = PathBuf::from(&self.shared.run.dir);
        for part in scope.split('/').filter(|p| !p.is_empty()) {
            dir.push(sanitize(part));
        }
        dir.push(sanitize(stage));
        dir.push(format!("attempt-{attempt}"));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        Ok(dir)
    }

    fn attempt_record(
        &self,
        at: &AttemptAt<'_>,
        state: &str,
        agent: Option<&str>,
        error: Option<String>,
        usage: &Usage,
    ) {
        self.shared.write(Write::Attempt(AttemptRecord {
            run: self.shared.run.id.clone(),
            scope: at.scope.to_string(),
            node: at.stage.to_string(),
            attempt: at.attempt,
            state: state.to_string(),
            agent: agent.map(str::to_string),
            dir: at.dir.to_string_lossy().into_owned(),
            error,
            usage: usage.clone(),
            started_at: at.started,
            finished_at: (state != "running").then(now_ms),
        }));
    }

    /// Ends a stage whose attempt failed for good: records the attempt, then settles the
    /// stage.
    fn fail_attempt(
        &self,
        at: &AttemptAt<'_>,
        state: NodeState,
        agent: Option<&str>,
        message: String,
        usage: Usage,
    ) -> Outcome {
        self.attempt_record(at, state.as_str(), agent, Some(message.clone()), &usage);
        self.failed(at.node, at.stage_started, state, message, usage, at.attempt)
    }

    /// Settles a stage as failed (or timed out); its `on_fail` is taken.
    fn failed(
        &self,
        n: NodeId,
        started: i64,
        state: NodeState,
        message: String,
        usage: Usage,
        attempts: u32,
    ) -> Outcome {
        let mut s = Settled::new(state, Json::Null, started);
        s.feedback = Some(tail(&message, MAX_FEEDBACK));
        s.message = Some(message);
        s.action = Some(self.plan.node(n).on_fail.clone());
        s.usage = usage;
        s.attempts = attempts;
        Outcome::Settled(s)
    }

    /// Settles a stage that produced its output: routes, feedback.
    fn done(
        &self,
        frame: &Frame<'_>,
        n: NodeId,
        started: i64,
        output: Json,
        usage: Usage,
        attempts: u32,
    ) -> Outcome {
        let mut s = Settled::new(NodeState::Done, output, started);
        s.usage = usage;
        s.attempts = attempts;
        match self.route(n, &s.output) {
            Ok(Some((Target::Fail, why))) => {
                s.state = NodeState::Failed;
                s.feedback = Some(why.clone());
                s.message = Some(why);
                s.action = Some(Target::Fail);
                return Outcome::Settled(s);
            }
            Ok(a) => s.action = a.map(|(t, _)| t).or_else(|| self.plan.node(n).then.clone()),
            Err(m) => {
                s.state = NodeState::Failed;
                s.feedback = Some(m.clone());
                s.message = Some(m);
                s.action = Some(self.plan.node(n).on_fail.clone());
                return Outcome::Settled(s);
            }
        }
        if let Some(f) = self.feedback_template(frame, n, &s.output) {
            s.feedback = Some(f);
        } else if matches!(s.action, Some(Target::Continue)) {
            let text = match s.output.get("text").and_then(Json::as_str) {
                Some(t) => t.to_string(),
                None => serde_json::to_string_pretty(&s.output).unwrap_or_default(),
            };
            s.feedback = Some(tail(&text, MAX_FEEDBACK));
        }
        Outcome::Settled(s)
    }

    /// Renders the stage's `feedback` template over its output, if it has one that gives
    /// something.
    fn feedback_template(&self, frame: &Frame<'_>, n: NodeId, output: &Json) -> Option<String> {
        let name = format!("{}/feedback", self.plan.node(n).name);
        self.env.get_template(&name).ok()?;
        let ctx = self.context(frame, &[("output", jv(output))]);
        match self.render(&name, &ctx) {
            Ok(f) if !f.trim().is_empty() => Some(tail(f.trim(), MAX_FEEDBACK)),
            Ok(_) => None,
            Err(e) => Some(format!("(its feedback template failed: {e})")),
        }
    }

    /// Chooses a route case by the output: the target, and a sentence saying why.
    fn route(&self, n: NodeId, output: &Json) -> Result<Option<(Target, String)>, String> {
        let node = self.plan.node(n);
        let Some(route) = &self.plan.stage(n).route else {
            return Ok(None);
        };
        let mut cur = output;
        for part in route.on.value.split('.') {
            cur = cur.get(part).unwrap_or(&Json::Null);
        }
        let value = match cur {
            Json::String(s) => s.clone(),
            other => other.to_string(),
        };
        let target = match node.routes.iter().find(|(k, _)| *k == value) {
            Some((_, t)) => t,
            None => node.route_default.as_ref().ok_or_else(|| {
                format!(
                    "its route on `{}` has no case for `{value}` and no default",
                    route.on.value
                )
            })?,
        };
        let why = format!(
            "its route on `{}` gave `{value}`, which leads to `{}`",
            route.on.value,
            self.action_text(target)
        );
        Ok(Some((target.clone(), why)))
    }

    // ----- agents -----

    pub(super) async fn run_agent(&self, frame: &Frame<'_>, n: NodeId) -> Outcome {
        let started = now_ms();
        let st = self.plan.stage(n);
        let node = self.plan.node(n);
        let scope = self.scope(frame);
        let agent = match self.plan.agent_of(n) {
            Ok(a) => a,
            Err(name) => return self.fail_now(started, format!("there is no agent `{name}`")),
        };
        let chain = self.plan.fallback_chain(agent);
        let retries = st
            .retries
            .as_ref()
            .and_then(|r| resolve_count(&r.value, &self.plan.params).ok())
            .unwrap_or(2);
        let max_attempts = u32::try_from(retries).unwrap_or(u32::MAX).saturating_add(1);
        let a = &self.plan.workflow.agents[agent];
        let timeout = limit(st.timeout.as_ref(), a.timeout.as_ref(), self.plan);
        let idle = limit(st.idle_timeout.as_ref(), a.idle_timeout.as_ref(), self.plan);
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
            write_file(dir, "prompt.md", &prompt);
            if let Some(w) = window {
                if let Some(msg) = too_big(&prompt, w) {
                    self.attempt_record(
                        &at,
                        "failed",
                        Some(&a.name.value),
                        Some(msg.clone()),
                        &Usage::default(),
                    );
                    let mut s = Settled::new(NodeState::Failed, Json::Null, started);
                    s.message = Some(msg.clone());
                    s.feedback = Some(msg);
                    s.action = Some(Target::Fail);
                    s.attempts = attempt;
                    return Outcome::Settled(s);
                }
            }
            if let Some((t, msg)) = self.over_budget(frame, n, &usage) {
                return self.budget_outcome(started, t, msg, usage, attempt - 1);
            }
            self.attempt_record(&at, "running", Some(&a.name.value), None, &Usage::default());
            self.shared.flush();
            if self.halted() {
                // The attempt could not be recorded (or the run is stopping): nothing starts.
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
                    .and_then(|_| self.plan.schemas.get(&n).cloned())
                    .filter(|_| st.output.as_ref().is_some_and(|o| o.schema.is_some())),
                max_tokens: None,
            };
            let result = self.call_with_policy(frame, &chain, call).await;
            let (reply, agent_name) = match result {
                Ok(r) => r,
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
                    write_file(dir, "error.txt", &detail);
                    // The agent gave no answer: not a verdict on the work, so nothing
                    // of it reaches an agent as feedback, and `on_error` decides.
                    self.attempt_record(
                        &at,
                        state.as_str(),
                        Some(&agent_name),
                        Some(detail.clone()),
                        &usage,
                    );
                    let mut s = Settled::error(state, detail, node.on_error.clone(), started);
                    s.usage = usage;
                    s.attempts = attempt;
                    return Outcome::Settled(s);
                }
            };
            usage.add(&reply.usage);
            for w in &reply.warnings {
                self.shared.event(&scope, &node.name, "warning", w.clone());
                self.shared
                    .progress
                    .note(&format!("! {}: agent `{agent_name}`: {w}", node.name));
            }
            if !reply.denied.is_empty() {
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
                write_file(dir, "denied.txt", &reply.denied.join("\n"));
                self.shared
                    .event(&scope, &node.name, "denied", text.clone());
                self.shared
                    .progress
                    .note(&format!("! {}: {text}", node.name));
            }
            write_file(dir, "raw.txt", &reply.raw);
            if reply.text != reply.raw {
                write_file(dir, "answer.md", &reply.text);
            }
            let extracted = match extractor {
                Some(e) => e.extract(&reply.text, None),
                None => Ok(json!({ "text": reply.text })),
            };
            match extracted {
                Ok(v) => {
                    write_file(
                        dir,
                        "output.json",
                        &serde_json::to_string_pretty(&v).unwrap_or_default(),
                    );
                    self.attempt_record(&at, "ok", Some(&agent_name), None, &reply.usage);
                    if let Some((t, msg)) = self.over_budget(frame, n, &usage) {
                        // The output is kept; the budget's action decides what follows.
                        let mut s = Settled::new(NodeState::Done, v, started);
                        s.usage = usage;
                        s.attempts = attempt;
                        s.message = Some(msg.clone());
                        s.feedback = Some(msg);
                        s.action = Some(t);
                        if s.action == Some(Target::Fail) {
                            s.state = NodeState::Failed;
                        }
                        return Outcome::Settled(s);
                    }
                    return self.done(frame, n, started, v, usage, attempt);
                }
                Err(problems) => {
                    let text = problems.join("\n");
                    write_file(dir, "feedback.md", &text);
                    self.attempt_record(
                        &at,
                        "invalid",
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

    fn budget_outcome(
        &self,
        started: i64,
        t: Target,
        msg: String,
        usage: Usage,
        attempts: u32,
    ) -> Outcome {
        let state = if t == Target::Fail {
            NodeState::Failed
        } else {
            NodeState::Done
        };
        let mut s = Settled::new(state, Json::Null, started);
        s.usage = usage;
        s.attempts = attempts;
        s.message = Some(msg.clone());
        s.feedback = Some(msg);
        s.action = Some(t);
        Outcome::Settled(s)
    }

    /// Calls an agent: transient failures retry with backoff, rate limits wait (or hand
    /// over to a fallback) without using up an attempt, a missing backend hands over.
    async fn call_with_policy(
        &self,
        frame: &Frame<'_>,
        chain: &[usize],
        mut call: AgentCall,
    ) -> Result<(AgentReply, String), (CallError, String, Usage)> {
        let opts = &self.shared.opts;
        let mut idx = 0;
        let mut transient = 0u32;
        let mut waited = Duration::ZERO;
        let mut rate_backoff = opts.backoff;
        loop {
            let agent = chain[idx];
            let cfg = &self.agents[agent];
            let name = cfg.name.clone();
            let backend = match self.backend(agent) {
                Ok(b) => b,
                Err(e) => {
                    let err = CallError::Missing { message: e };
                    if idx + 1 < chain.len() {
                        self.hand_over(&call, &name, chain[idx + 1], &err);
                        idx += 1;
                        continue;
                    }
                    return Err((err, name, Usage::default()));
                }
            };
            call.model = cfg.model.clone();
            call.max_tokens = cfg.max_tokens;
            let caps = backend.capabilities();
            let schema = call.schema.take();
            let mut this = call.clone();
            this.schema = if caps.json_schema {
                schema.clone()
            } else {
                None
            };
            call.schema = schema;
            tracing::debug!(stage = %call.stage, scope = %call.scope, attempt = call.attempt, agent = %name, "calling agent");
            let result = backend
                .call(&this)
                .await
                .map(redact_reply)
                .map_err(redact_error);
            if let Err(e) = &result {
                tracing::debug!(stage = %call.stage, agent = %name, error = %e, "agent call failed");
            }
            match result {
                Ok(reply) => {
                    self.add_usage(frame, &reply.usage);
                    return Ok((reply, name));
                }
                Err(err @ CallError::Missing { .. }) => {
                    if idx + 1 < chain.len() {
                        self.hand_over(&call, &name, chain[idx + 1], &err);
                        idx += 1;
                        continue;
                    }
                    return Err((err, name, Usage::default()));
                }
                Err(CallError::RateLimited {
                    message,
                    retry_after,
                }) => {
                    if idx + 1 < chain.len() {
                        let err = CallError::RateLimited {
                            message,
                            retry_after,
                        };
                        self.hand_over(&call, &name, chain[idx + 1], &err);
                        idx += 1;
                        continue;
                    }
                    let wait = retry_after.unwrap_or(rate_backoff);
                    rate_backoff = (rate_backoff * 2).min(Duration::from_secs(900));
                    waited += wait;
                    if waited > opts.rate_limit_wait {
                        return Err((
                            CallError::RateLimited {
                                message: format!(
                                    "{message}; gave up after waiting {}s in all",
                                    waited.as_secs()
                                ),
                                retry_after,
                            },
                            name,
                            Usage::default(),
                        ));
                    }
                    let text = format!(
                        "agent `{name}` is rate-limited ({message}); waiting {} before trying again",
                        super::progress::short_duration(wait)
                    );
                    self.shared
                        .event(&call.scope, &call.stage, "rate_limited", text.clone());
                    self.shared.flush();
                    self.shared
                        .progress
                        .note(&format!("⏳ {}: {text}", call.stage));
                    tokio::time::sleep(wait).await;
                }
                Err(CallError::Transient {
                    message,
                    retry_after,
                }) => {
                    transient += 1;
                    if transient > opts.transient_retries {
                        return Err((
                            CallError::Transient {
                                message: format!(
                                    "{message} (after {} retries)",
                                    opts.transient_retries
                                ),
                                retry_after,
                            },
                            name,
                            Usage::default(),
                        ));
                    }
                    let wait =
                        retry_after.unwrap_or(opts.backoff * 2u32.saturating_pow(transient - 1));
                    let text = format!(
                        "agent `{name}` failed ({message}); retry {transient} of {} in {}",
                        opts.transient_retries,
                        super::progress::short_duration(wait)
                    );
                    self.shared
                        .event(&call.scope, &call.stage, "retry", text.clone());
                    self.shared.flush();
                    self.shared
                        .progress
                        .note(&format!("↺ {}: {text}", call.stage));
                    tokio::time::sleep(wait).await;
                }
                Err(e) => return Err((e, name, Usage::default())),
            }
        }
    }

    fn hand_over(&self, call: &AgentCall, from: &str, to: usize, why: &CallError) {
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

    /// Adds a call's usage to the run's and the enclosing loops' sums.
    fn add_usage(&self, frame: &Frame<'_>, u: &Usage) {
        let mut all = self.shared.usage.borrow_mut();
        all.entry(String::new()).or_default().add(u);
        let mut cur = Some(frame);
        while let Some(f) = cur {
            if let Some((key, _)) = &f.usage_key {
                all.entry(key.clone()).or_default().add(u);
            }
            cur = f.parent;
        }
    }

    /// Tells whether a budget (the stage's, an enclosing loop's, the run's) is spent, with
    /// the action it declares.
    fn over_budget(
        &self,
        frame: &Frame<'_>,
        n: NodeId,
        stage_usage: &Usage,
    ) -> Option<(Target, String)> {
        let check =
            |b: &crate::model::Budget, u: &Usage, what: String| -> Option<(Target, String)> {
                let tokens = b
                    .tokens
                    .as_ref()
                    .and_then(|t| resolve_count(&t.value, &self.plan.params).ok());
                let over_tokens = tokens.is_some_and(|t| u.tokens() >= t);
                let over_cost = b
                    .cost_usd
                    .as_ref()
                    .is_some_and(|c| u.cost_usd.unwrap_or(0.0) >= c.value);
                if !(over_tokens || over_cost) {
                    return None;
                }
                let t = b
                    .on_exceeded
                    .as_ref()
                    .map(|a| self.target_of(&a.value))
                    .unwrap_or(Target::Fail);
                let spent = if over_tokens {
                    format!("{} tokens of {}", u.tokens(), tokens.unwrap_or(0))
                } else {
                    format!(
                        "${:.4} of ${:.4}",
                        u.cost_usd.unwrap_or(0.0),
                        b.cost_usd.as_ref().map_or(0.0, |c| c.value)
                    )
                };
                Some((t, format!("the budget of {what} is spent ({spent})")))
            };
        if let Some(b) = &self.plan.stage(n).budget {
            if let Some(r) = check(
                b,
                stage_usage,
                format!("stage `{}`", self.plan.node(n).name),
            ) {
                return Some(r);
            }
        }
        let all = self.shared.usage.borrow();
        let mut cur = Some(frame);
        while let Some(f) = cur {
            if let Some((key, l)) = &f.usage_key {
                if let Some(b) = &self.plan.stage(*l).budget {
                    let u = all.get(key).cloned().unwrap_or_default();
                    if let Some(r) = check(b, &u, format!("loop `{}`", self.plan.node(*l).name)) {
                        return Some(r);
                    }
                }
            }
            cur = f.parent;
        }
        if let Some(b) = &self.plan.workflow.budget {
            let u = all.get("").cloned().unwrap_or_default();
            if let Some(r) = check(b, &u, "the run".to_string()) {
                return Some(r);
            }
        }
        None
    }

    // ----- commands and checks -----

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
            .retries
            .as_ref()
            .and_then(|r| resolve_count(&r.value, &self.plan.params).ok())
            .unwrap_or(0);
        let max_attempts = u32::try_from(retries).unwrap_or(u32::MAX).saturating_add(1);
        let timeout = st
            .timeout
            .as_ref()
            .and_then(|d| resolve_duration(&d.value, &self.plan.params).ok());
        let idle = st
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
                    Err(e) => return self.fail_now(started, e),
                };
                self.attempt_record(&at, "running", None, None, &Usage::default());
                self.shared.flush();
                if self.halted() {
                    return Outcome::Stopped;
                }
                self.shared.progress.started(
                    &scope,
                    &node.name,
                    attempt,
                    &format!("$ {}", crate::shell::join(&spec.argv)),
                );
                let out = match process::run(&spec).await {
                    Ok(o) => o,
                    Err(e) => {
                        let msg = format!(
                            "`{}` could not start: {e}",
                            spec.argv.first().cloned().unwrap_or_default()
                        );
                        self.attempt_record(
                            &at,
                            NodeState::Failed.as_str(),
                            None,
                            Some(msg.clone()),
                            &Usage::default(),
                        );
                        let mut s =
                            Settled::error(NodeState::Failed, msg, node.on_error.clone(), started);
                        s.attempts = attempt;
                        return Outcome::Settled(s);
                    }
                };
                write_file(
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
                        crate::shell::join(&spec.argv),
                        super::progress::short_duration(lim),
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
                        crate::shell::join(&spec.argv),
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
                Some(e) if st.output.is_some() => match e.extract(&stdout_text, Some(base.clone()))
                {
                    Ok(v) => v,
                    Err(problems) => {
                        ok = false;
                        last_msg =
                            format!("its output could not be read:\n{}", problems.join("\n"));
                        base.clone()
                    }
                },
                _ => base.clone(),
            };
            if is_check {
                let mut passed = ok;
                if let (true, Some(x)) = (ok, expect) {
                    let ctx = self.context(frame, &[("output", jv(&value))]);
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
            if is_check || st.output.is_some() {
                write_file(
                    dir,
                    "output.json",
                    &serde_json::to_string_pretty(&value).unwrap_or_default(),
                );
            }
            if ok {
                self.attempt_record(&at, "ok", None, None, &Usage::default());
                return self.done(frame, n, started, value, Usage::default(), attempt);
            }
            write_file(dir, "feedback.md", &last_msg);
            self.attempt_record(
                &at,
                "failed",
                None,
                Some(tail(&last_msg, 4000)),
                &Usage::default(),
            );
            last_output = value;
            if attempt < max_attempts {
                let wait = self.shared.opts.backoff * 2u32.saturating_pow(attempt - 1);
                self.shared.progress.note(&format!(
                    "↺ {} failed; retry {attempt} of {retries} in {}",
                    node.name,
                    super::progress::short_duration(wait)
                ));
                tokio::time::sleep(wait).await;
            }
        }
        let feedback = self
            .feedback_template(frame, n, &last_output)
            .unwrap_or_else(|| tail(&last_msg, MAX_FEEDBACK));
        let mut s = Settled::new(NodeState::Failed, last_output, started);
        s.feedback = Some(feedback);
        s.message = Some(last_msg);
        s.action = Some(node.on_fail.clone());
        s.attempts = max_attempts;
        Outcome::Settled(s)
    }

    #[allow(clippy::too_many_arguments)]
    fn command_spec(
        &self,
        frame: &Frame<'_>,
        n: NodeId,
        cmd: &crate::model::CommandSpec,
        ctx: &Value,
        dir: &std::path::Path,
        timeout: Option<Duration>,
        idle: Option<Duration>,
    ) -> Result<ProcSpec, String> {
        let name = &self.plan.node(n).name;
        let mut argv = Vec::new();
        for i in 0..cmd.argv.len() {
            let item = self
                .render(&format!("{name}/argv/{i}"), ctx)
                .map_err(|e| format!("argv item {i}: {e}"))?;
            match super::helpers::spread_items(&item) {
                Some(items) => argv.extend(items.map_err(|e| format!("argv item {i}: {e}"))?),
                None => argv.push(item),
            }
        }
        let mut env = vec![
            ("RALPH_FLOW_RUN".to_string(), self.shared.run.id.clone()),
            ("RALPH_FLOW_STAGE".to_string(), name.clone()),
            (
                "RALPH_FLOW_STAGE_DIR".to_string(),
                dir.to_string_lossy().into_owned(),
            ),
        ];
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
            pid_file: Some(dir.join("process")),
            result_done: None,
        })
    }

    // ----- gates -----

    pub(super) async fn run_gate(&self, frame: &Frame<'_>, n: NodeId) -> Outcome {
        let started = now_ms();
        let st = self.plan.stage(n);
        let node = self.plan.node(n);
        let scope = self.scope(frame);
        let run = self.shared.run.id.clone();
        let StageBody::Gate {
            show,
            on_timeout,
            on_reject,
            ..
        } = &st.body
        else {
            return self.fail_now(started, "not a gate".into());
        };
        let timeout = st
            .timeout
            .as_ref()
            .and_then(|d| resolve_duration(&d.value, &self.plan.params).ok());
        let on_reject = on_reject
            .as_ref()
            .map(|a| self.target_of(&a.value))
            .unwrap_or_else(|| node.on_fail.clone());
        let pending = self
            .shared
            .store
            .borrow()
            .pending_gates(&run)
            .unwrap_or_default();
        let request = pending
            .into_iter()
            .find(|g| g.scope == scope && g.gate == node.name);
        let answered = self
            .shared
            .store
            .borrow()
            .approval(&run, &scope, &node.name)
            .ok()
            .flatten();
        let request = match (request, &answered) {
            (Some(r), _) => Some(r),
            (None, Some(_)) => None,
            (None, None) => {
                let ctx = self.context(frame, &[]);
                let message = match self.env.get_template(&format!("{}/message", node.name)) {
                    Ok(_) => match self.render(&format!("{}/message", node.name), &ctx) {
                        Ok(m) => m,
                        Err(e) => {
                            return self.fail_now(
                                started,
                                format!("its message could not be rendered: {e}"),
                            );
                        }
                    },
                    Err(_) => format!("Approve `{}`?", node.name),
                };
                let mut files = Vec::new();
                for i in 0..show.len() {
                    if let Ok(f) = self.render(&format!("{}/show/{i}", node.name), &ctx) {
                        files.push(f);
                    }
                }
                let now = now_ms();
                let req = GateRequest {
                    run: run.clone(),
                    scope: scope.clone(),
                    gate: node.name.clone(),
                    message,
                    show: files,
                    requested_at: now,
                    deadline: timeout
                        .map(|t| now + i64::try_from(t.as_millis()).unwrap_or(i64::MAX / 2)),
                };
                self.shared.write(Write::Gate(req.clone()));
                self.shared
                    .event(&scope, &node.name, "waiting", req.message.clone());
                self.shared.flush();
                Some(req)
            }
        };
        if let Some(req) = &request {
            let state_dir =
                if self.shared.opts.state_dir != self.shared.opts.cwd.join(".ralph-flow") {
                    format!(
                        " --state-dir {}",
                        crate::shell::quote(&self.shared.opts.state_dir.to_string_lossy())
                    )
                } else {
                    String::new()
                };
            let target = format!(
                "{} {}{state_dir}",
                crate::shell::quote(&run),
                crate::shell::quote(&req.qualified())
            );
            let mut text = format!(
                "⏸ gate `{}` waits: {}\n    approve: ralph-flow approve {target}\n    reject:  ralph-flow reject {target} --comment \"...\"",
                req.qualified(),
                req.message.trim(),
            );
            for f in &req.show {
                text.push_str(&format!("\n    see: {f}"));
            }
            self.shared.progress.note(&text);
        }
        let mut answer = answered;
        loop {
            if let Some(a) = answer.take() {
                let output = json!({
                    "approved": a.approved,
                    "comment": a.comment.clone().unwrap_or_default(),
                    "by": a.by,
                    "at": rfc3339(a.at),
                });
                let mut s = Settled::new(NodeState::Done, output, started);
                s.attempts = 1;
                if !a.approved {
                    s.feedback = Some(format!(
                        "The gate `{}` was rejected by {}: {}",
                        node.name,
                        a.by,
                        a.comment.clone().unwrap_or_else(|| "(no comment)".into())
                    ));
                    s.message = s.feedback.clone();
                    if on_reject == Target::Fail {
                        s.state = NodeState::Failed;
                    }
                    s.action = Some(on_reject.clone());
                }
                return Outcome::Settled(s);
            }
            let deadline = request.as_ref().and_then(|r| r.deadline);
            if deadline.is_some_and(|d| now_ms() >= d) {
                let action = on_timeout
                    .as_ref()
                    .map(|a| self.target_of(&a.value))
                    .unwrap_or(Target::Fail);
                let waited = timeout
                    .map(super::progress::short_duration)
                    .unwrap_or_default();
                match action {
                    Target::Approve | Target::Reject => {
                        let approval = crate::store::Approval {
                            run: run.clone(),
                            scope: scope.clone(),
                            gate: node.name.clone(),
                            approved: action == Target::Approve,
                            comment: Some(format!("no answer within {waited}")),
                            by: "timeout".into(),
                            at: now_ms(),
                        };
                        if let Err(e) = self.shared.store.borrow_mut().answer(&approval) {
                            tracing::warn!("gate timeout: {e}");
                        }
                        self.shared.event(
                            &scope,
                            &node.name,
                            "timeout",
                            format!("no answer within {waited}: {action:?}"),
                        );
                        answer = Some(approval);
                        continue;
                    }
                    other => {
                        let msg = format!("gate `{}` had no answer within {waited}", node.name);
                        let mut s = Settled::new(
                            if other == Target::Fail {
                                NodeState::Failed
                            } else {
                                NodeState::Done
                            },
                            json!({"approved": false, "comment": "", "by": "timeout", "at": rfc3339(now_ms())}),
                            started,
                        );
                        s.message = Some(msg.clone());
                        s.feedback = Some(msg);
                        s.action = Some(other);
                        return Outcome::Settled(s);
                    }
                }
            }
            if !self.shared.opts.wait {
                return Outcome::Waiting;
            }
            let mut sleep = self.shared.opts.gate_poll;
            if let Some(d) = deadline {
                let left = Duration::from_millis(u64::try_from(d - now_ms()).unwrap_or(0));
                sleep = sleep.min(left.max(Duration::from_millis(10)));
            }
            tokio::time::sleep(sleep).await;
            answer = self
                .shared
                .store
                .borrow()
                .approval(&run, &scope, &node.name)
                .ok()
                .flatten();
        }
    }

    // ----- subflows -----

    pub(super) async fn run_subflow(&self, frame: &Frame<'_>, n: NodeId) -> Outcome {
        let started = now_ms();
        let st = self.plan.stage(n);
        let node = self.plan.node(n);
        let StageBody::Subflow {
            workflow: Some(wf),
            params,
        } = &st.body
        else {
            return self.fail_now(started, "a subflow needs `workflow`".into());
        };
        let path = crate::check::base_dir(self.sources, wf.span).join(&wf.value);
        let ctx = self.context(frame, &[]);
        let mut sets = Vec::new();
        for (k, _) in params {
            match self.render(&format!("{}/params/{}", node.name, k.value), &ctx) {
                Ok(v) => sets.push((k.value.clone(), v)),
                Err(e) => return self.fail_now(started, format!("param `{}`: {e}", k.value)),
            }
        }
        let prepared = match super::prepare(&path, &sets) {
            Ok(p) => p,
            Err(e) => {
                return self.fail_now(
                    started,
                    format!(
                        "its workflow {} is not valid:\n{}",
                        path.display(),
                        e.render()
                    ),
                );
            }
        };
        let prefix = format!("{}>", frame.child_scope(&node.name));
        let prefix = if self.prefix.is_empty() {
            prefix
        } else {
            format!("{}/{prefix}", self.prefix)
        };
        let child = match Exec::new(self.shared, &prepared.plan, &prepared.sources, prefix) {
            Ok(c) => c,
            Err(e) => return self.fail_now(started, e),
        };
        let top = Frame {
            cwd: frame.cwd.clone(),
            ..Frame::default()
        };
        let end = child.run_body(&top).await;
        let end = match end {
            BodyEnd::Stopped if child.exit.get().is_none() => return Outcome::Stopped,
            BodyEnd::Waiting => return Outcome::Waiting,
            e => child.run_end(e),
        };
        let outputs: serde_json::Map<String, Json> = top
            .outputs
            .borrow()
            .iter()
            .filter(|(_, v)| v.state != NodeState::Skipped)
            .map(|(k, v)| (k.clone(), v.output.clone()))
            .collect();
        let super::RunEnd::Exit {
            name,
            code,
            message,
        } = end
        else {
            return Outcome::Stopped;
        };
        let output = json!({"exit": name, "code": code, "outputs": outputs});
        if code == 0 {
            self.done(frame, n, started, output, Usage::default(), 1)
        } else {
            let mut s = Settled::new(NodeState::Failed, output, started);
            let msg = format!(
                "its workflow ended with `{name}` ({code}){}",
                message.map(|m| format!(": {m}")).unwrap_or_default()
            );
            s.feedback = Some(msg.clone());
            s.message = Some(msg);
            s.action = Some(node.on_fail.clone());
            s.attempts = 1;
            Outcome::Settled(s)
        }
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
