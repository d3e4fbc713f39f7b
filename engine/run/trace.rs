//! OpenTelemetry traces of runs, exported over OTLP/HTTP with protobuf when the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; nothing
//! at all otherwise.
//!
//! **Where spans come from.** Spans are made after the fact, from what the executor records
//! anyway, each with its own start and end: a stage's when it settles
//! (`schedule.rs`), an attempt's when its record ends (`attempt.rs`), an agent call's when
//! the call returns (`agent.rs`), a gate's wait when it is answered (`gate.rs`), and the
//! run's own when it finishes or is cancelled (`lifecycle.rs`). Nothing is held open across
//! awaits, so the executor's single thread carries no context around.
//!
//! **One trace across processes.** A run's trace id and its run span's id are drawn when
//! the run is created and kept in its record's options (`"trace"`), so `resume`, and a
//! worker on another machine that claims a queued run, export into the same trace: every
//! process makes its spans children of that remote parent, and the process that ends the run
//! (finished, failed or cancelled) exports the run span itself, under the stored id, from
//! the run's start. A stage's span id is derived from the trace, its scope and its name (a
//! stage settles once per scope), so a stage inside a loop or a fan-out names its
//! container's span as its parent before that container settles, in whichever process it
//! does. An attempt's id adds a number drawn by each process (an attempt a killed process
//! left is run again under the same number).
//!
//! **What is exported.** Names, ids, states, counts, times, the agent's kind and model and
//! usage (GenAI semantic conventions: `gen_ai.*`), and the cost (`ralph_flow.cost_usd`). No
//! prompt, answer, output, feedback or message is; every text attribute passes the secrets
//! masker.
//!
//! **Never in the way.** The SDK's batch processor exports on a thread of its own; an
//! export that fails says so once on stderr and the run goes on. When a run ends (finished,
//! waiting, interrupted by Ctrl-C, cancelled, or stopped by an error) what is queued is
//! flushed, for at most [`FLUSH_TIMEOUT`].

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{
    Span as _, SpanBuilder, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _,
    TraceFlags, TraceId, TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider, SpanData, SpanExporter,
};
use sha2::{Digest as _, Sha256};

use crate::backend::{AgentCall, AgentConfig, AgentReply, CallError, Usage};
use crate::model::AgentKind;
use crate::store::{AttemptRecord, AttemptState, NodeState, RunRecord, RunStatus};

/// The key of a run's options that holds its trace (`{"trace_id": HEX, "span_id": HEX}`).
pub const OPTIONS_KEY: &str = "trace";

/// The longest a run's end waits for its spans to be sent.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// How many spans may wait to be sent (unless `OTEL_BSP_MAX_QUEUE_SIZE` says): the SDK's
/// 2,048 is less than a fast run of a few thousand stages makes between two exports.
const QUEUE: usize = 16_384;

/// A run's trace: its id, and the id of the run's own span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceIds {
    pub trace: TraceId,
    pub run_span: SpanId,
}

impl TraceIds {
    /// New random ids, as the options of a new run keep them.
    pub fn new_json() -> serde_json::Value {
        let mut bytes = [0u8; 24];
        if getrandom::fill(&mut bytes).is_err() {
            // No randomness: the time, hashed, still makes ids that differ between runs.
            bytes.copy_from_slice(&digest(&[b"ralph-flow trace", &nanos().to_le_bytes()])[..24]);
        }
        let ids = Self::from_bytes(&bytes);
        serde_json::json!({"trace_id": ids.trace.to_string(), "span_id": ids.run_span.to_string()})
    }

    /// The ids a run's options keep; for a run created before they were kept, ids derived
    /// from its id and start (the same in every process).
    pub fn of(run: &RunRecord) -> Self {
        let kept = run.options.get(OPTIONS_KEY).and_then(|t| {
            let trace = TraceId::from_hex(t.get("trace_id")?.as_str()?).ok()?;
            let span = SpanId::from_hex(t.get("span_id")?.as_str()?).ok()?;
            (trace != TraceId::INVALID && span != SpanId::INVALID).then_some(TraceIds {
                trace,
                run_span: span,
            })
        });
        kept.unwrap_or_else(|| {
            let d = digest(&[
                b"ralph-flow trace",
                run.id.as_bytes(),
                &run.started_at.to_le_bytes(),
            ]);
            Self::from_bytes(&d[..24])
        })
    }

    /// The run's trace id as its spans carry it (32 hexadecimal digits).
    pub fn trace_id(run: &RunRecord) -> String {
        Self::of(run).trace.to_string()
    }

    fn from_bytes(b: &[u8]) -> Self {
        let mut t = [0u8; 16];
        let mut s = [0u8; 8];
        t.copy_from_slice(&b[..16]);
        s.copy_from_slice(&b[16..24]);
        // An all-zero id is invalid: never drawn in practice, but never made either.
        t[15] |= 1;
        s[7] |= 1;
        TraceIds {
            trace: TraceId::from_bytes(t),
            run_span: SpanId::from_bytes(s),
        }
    }
}

fn digest(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    h.finalize().into()
}

fn nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// The exporter and its tracer, made once per process when traces are configured.
struct Telemetry {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    /// Drawn by this process: part of its attempts' span ids.
    salt: [u8; 8],
}

static TELEMETRY: OnceLock<Option<Telemetry>> = OnceLock::new();

/// The endpoint traces go to, as the OTLP exporter resolves it from the environment, when
/// traces are configured (and not disabled by `OTEL_SDK_DISABLED=true` or
/// `OTEL_TRACES_EXPORTER=none`).
pub fn endpoint() -> Option<String> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none"))
    {
        return None;
    }
    var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| {
        var("OTEL_EXPORTER_OTLP_ENDPOINT").map(|e| format!("{}/v1/traces", e.trim_end_matches('/')))
    })
}

/// Tells whether this process exports traces (set up on first use).
pub fn enabled() -> bool {
    telemetry().is_some()
}

fn telemetry() -> Option<&'static Telemetry> {
    TELEMETRY.get_or_init(start).as_ref()
}

/// Prints a warning about traces on stderr, masked (the progress may be quiet, and the
/// default log level hides warnings).
fn warn(text: &str) {
    eprintln!("! traces: {}", crate::secrets::redact(text));
}

fn start() -> Option<Telemetry> {
    use opentelemetry_otlp::{Protocol, WithExportConfig as _};
    let endpoint = endpoint()?;
    if let Ok(p) = std::env::var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        && !p.trim().is_empty()
        && p.trim() != "http/protobuf"
    {
        warn(&format!(
            "OTEL_EXPORTER_OTLP_PROTOCOL is `{}`, but ralph-flow exports OTLP over HTTP with protobuf only; it sends `http/protobuf` to {endpoint} (point it at the collector's HTTP port, 4318 by default)",
            p.trim()
        ));
    }
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .build()
    {
        Ok(e) => e,
        Err(e) => {
            warn(&format!(
                "cannot export to {endpoint}: {e}; the run goes on without traces (check OTEL_EXPORTER_OTLP_ENDPOINT and OTEL_EXPORTER_OTLP_HEADERS)"
            ));
            return None;
        }
    };
    let mut batch = BatchConfigBuilder::default();
    if std::env::var_os("OTEL_BSP_MAX_QUEUE_SIZE").is_none() {
        batch = batch.with_max_queue_size(QUEUE);
    }
    let processor = BatchSpanProcessor::builder(WarnOnce {
        inner: exporter,
        endpoint,
        warned: AtomicBool::new(false),
    })
    .with_batch_config(batch.build())
    .build();
    let mut resource = opentelemetry_sdk::Resource::builder();
    // `OTEL_SERVICE_NAME` (or `service.name` in `OTEL_RESOURCE_ATTRIBUTES`) names the
    // service; else it is `ralph-flow`.
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.trim().is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| {
            v.split(',')
                .any(|kv| kv.trim().starts_with("service.name="))
        });
    if !named {
        resource = resource.with_service_name("ralph-flow");
    }
    let resource = resource
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("ralph-flow");
    let mut salt = [0u8; 8];
    if getrandom::fill(&mut salt).is_err() {
        salt = (nanos() as u64 ^ u64::from(std::process::id())).to_le_bytes();
    }
    Some(Telemetry {
        provider,
        tracer,
        salt,
    })
}

/// Sends what is queued, waiting at most [`FLUSH_TIMEOUT`] (on tokio's blocking pool, so the
/// executor's thread is not held). Nothing when traces are not configured.
pub async fn flush() {
    let Some(t) = TELEMETRY.get().and_then(Option::as_ref) else {
        return;
    };
    let provider = t.provider.clone();
    let flushed = tokio::task::spawn_blocking(move || provider.force_flush());
    match tokio::time::timeout(FLUSH_TIMEOUT + Duration::from_millis(500), flushed).await {
        Ok(Ok(Ok(()))) => {}
        // A failed export said so already (once); a flush that times out leaves its spans.
        Ok(Ok(Err(e))) => tracing::debug!("traces: flush: {e}"),
        Ok(Err(_)) | Err(_) => tracing::debug!("traces: the flush did not finish in time"),
    }
}

/// The OTLP exporter, saying once on stderr that it could not send (a collector that is
/// down or refuses): the run goes on, and its spans are dropped.
#[derive(Debug)]
struct WarnOnce {
    inner: opentelemetry_otlp::SpanExporter,
    endpoint: String,
    warned: AtomicBool,
}

impl SpanExporter for WarnOnce {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let result = self.inner.export(batch).await;
        if let Err(e) = &result
            && !self.warned.swap(true, Ordering::Relaxed)
        {
            warn(&format!(
                "cannot send spans to {}: {e}; the run goes on, and spans that cannot be sent are dropped (is the collector up, and does it take OTLP over HTTP there?)",
                self.endpoint
            ));
        }
        result
    }

    fn shutdown_with_timeout(&mut self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&mut self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

/// A text attribute, masked.
fn text(key: &'static str, value: &str) -> KeyValue {
    KeyValue::new(key, crate::secrets::redact(value).into_owned())
}

fn int(key: &'static str, value: u64) -> KeyValue {
    KeyValue::new(key, i64::try_from(value).unwrap_or(i64::MAX))
}

fn time_of(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// The GenAI attributes of usage: the tokens when some were counted, or when `calls` (the
/// span is an agent's) and every call reported them; the cost when reported.
fn usage_attributes(usage: &Usage, calls: bool, attrs: &mut Vec<KeyValue>) {
    let counted = usage.input_tokens + usage.output_tokens + usage.cached_tokens > 0;
    if counted || (calls && usage.unreported == 0) {
        attrs.push(int("gen_ai.usage.input_tokens", usage.input_tokens));
        attrs.push(int("gen_ai.usage.output_tokens", usage.output_tokens));
        attrs.push(int(
            "gen_ai.usage.cache_read.input_tokens",
            usage.cached_tokens,
        ));
    }
    if let Some(c) = usage.cost_usd {
        attrs.push(KeyValue::new("ralph_flow.cost_usd", c));
    }
}

/// The GenAI provider of an agent kind (the semantic conventions' well-known values where
/// one fits, else the kind).
fn provider_of(kind: AgentKind) -> &'static str {
    match kind {
        AgentKind::Claude | AgentKind::Anthropic => "anthropic",
        AgentKind::Codex | AgentKind::OpenAi => "openai",
        AgentKind::Gemini => "gcp.gemini",
        other => other.as_str(),
    }
}

/// The GenAI operation of an agent kind: an agent's CLI is an agent invoked, an HTTP API a
/// chat.
fn operation_of(kind: AgentKind) -> &'static str {
    match kind {
        AgentKind::OpenAi | AgentKind::Anthropic => "chat",
        _ => "invoke_agent",
    }
}

/// The container stage of a scope, as (its scope, its name): `a#1/b#2` is inside `b` of
/// `a#1`, a subflow's `outer/sub>` inside `sub` of `outer`; `None` at the top level.
fn container(scope: &str) -> Option<(&str, &str)> {
    if scope.is_empty() {
        return None;
    }
    let (outer, last) = scope.rsplit_once('/').unwrap_or(("", scope));
    let name = last.split('#').next().unwrap_or(last).trim_end_matches('>');
    Some((outer, name))
}

/// A run's spans, for the process that executes it (see the module's text).
pub(crate) struct RunTrace {
    tel: &'static Telemetry,
    ids: TraceIds,
}

impl RunTrace {
    /// The run's trace when this process exports traces.
    pub(crate) fn of(run: &RunRecord) -> Option<Self> {
        Some(RunTrace {
            tel: telemetry()?,
            ids: TraceIds::of(run),
        })
    }

    fn span_id(&self, parts: &[&[u8]]) -> SpanId {
        let trace = self.ids.trace.to_bytes();
        let mut all: Vec<&[u8]> = Vec::with_capacity(parts.len() + 1);
        all.push(&trace);
        all.extend_from_slice(parts);
        let d = digest(&all);
        let mut s = [0u8; 8];
        s.copy_from_slice(&d[..8]);
        s[7] |= 1;
        SpanId::from_bytes(s)
    }

    fn stage_span(&self, scope: &str, stage: &str) -> SpanId {
        self.span_id(&[b"stage", scope.as_bytes(), stage.as_bytes()])
    }

    fn attempt_span(&self, scope: &str, stage: &str, attempt: u32) -> SpanId {
        self.span_id(&[
            b"attempt",
            &self.tel.salt,
            scope.as_bytes(),
            stage.as_bytes(),
            &attempt.to_le_bytes(),
        ])
    }

    /// The span a stage of `scope` is a child of: its container's, or the run's.
    fn parent_of_scope(&self, scope: &str) -> SpanId {
        match container(scope) {
            Some((outer, name)) => self.stage_span(outer, name),
            None => self.ids.run_span,
        }
    }

    /// Exports one finished span.
    #[allow(clippy::too_many_arguments)]
    fn emit(
        &self,
        name: String,
        kind: SpanKind,
        parent: Option<SpanId>,
        id: Option<SpanId>,
        (start, end): (SystemTime, SystemTime),
        attributes: Vec<KeyValue>,
        status: Status,
    ) {
        let cx = match parent {
            Some(p) => Context::new().with_remote_span_context(SpanContext::new(
                self.ids.trace,
                p,
                TraceFlags::SAMPLED,
                true,
                TraceState::default(),
            )),
            None => Context::new(),
        };
        let mut builder = SpanBuilder::from_name(crate::secrets::redact(&name).into_owned())
            .with_kind(kind)
            .with_start_time(start)
            .with_attributes(attributes)
            .with_status(status);
        builder.span_id = id;
        builder.trace_id = Some(self.ids.trace);
        let mut span = self.tel.tracer.build_with_context(builder, &cx);
        span.end_with_timestamp(end.max(start));
    }

    /// A stage that settled (not one replayed from an earlier process of the run).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn stage(
        &self,
        scope: &str,
        stage: &str,
        kind: &str,
        state: NodeState,
        (started, finished): (i64, i64),
        attempts: u32,
        usage: &Usage,
        action: Option<&str>,
    ) {
        let mut attrs = vec![
            text("ralph_flow.stage", stage),
            text("ralph_flow.scope", scope),
            text("ralph_flow.stage.kind", kind),
            text("ralph_flow.stage.outcome", state.as_str()),
            int("ralph_flow.stage.attempts", u64::from(attempts)),
        ];
        if let Some(a) = action {
            attrs.push(text("ralph_flow.stage.action", a));
        }
        usage_attributes(usage, kind == "agent", &mut attrs);
        let status = match state {
            NodeState::Failed | NodeState::TimedOut => Status::error(state.as_str()),
            _ => Status::Unset,
        };
        let name = if scope.is_empty() {
            format!("stage {stage}")
        } else {
            format!("stage {scope}/{stage}")
        };
        self.emit(
            name,
            SpanKind::Internal,
            Some(self.parent_of_scope(scope)),
            Some(self.stage_span(scope, stage)),
            (time_of(started), time_of(finished)),
            attrs,
            status,
        );
    }

    /// An attempt whose record ended.
    pub(crate) fn attempt(&self, a: &AttemptRecord) {
        let Some(finished) = a.finished_at else {
            return;
        };
        let mut attrs = vec![
            text("ralph_flow.stage", &a.node),
            text("ralph_flow.scope", &a.scope),
            int("ralph_flow.attempt", u64::from(a.attempt)),
            text("ralph_flow.attempt.outcome", a.state.as_str()),
        ];
        if let Some(agent) = &a.agent {
            attrs.push(text("gen_ai.agent.name", agent));
        }
        usage_attributes(&a.usage, a.agent.is_some(), &mut attrs);
        let status = match a.state {
            AttemptState::Ok => Status::Unset,
            other => Status::error(other.as_str()),
        };
        self.emit(
            format!("attempt {}", a.attempt),
            SpanKind::Internal,
            Some(self.stage_span(&a.scope, &a.node)),
            Some(self.attempt_span(&a.scope, &a.node, a.attempt)),
            (time_of(a.started_at), time_of(finished)),
            attrs,
            status,
        );
    }

    /// An agent call (one try of an attempt: a retry, a hand-over to a fallback, a call a
    /// worker made are each one), from `started` to now.
    pub(crate) fn agent_call(
        &self,
        call: &AgentCall,
        agent: &AgentConfig,
        started: SystemTime,
        result: Result<&AgentReply, &CallError>,
    ) {
        let operation = operation_of(agent.kind);
        let provider = provider_of(agent.kind);
        let mut attrs = vec![
            text("gen_ai.operation.name", operation),
            text("gen_ai.provider.name", provider),
            text("gen_ai.system", provider),
            text("gen_ai.agent.name", &agent.name),
            text("ralph_flow.agent.kind", agent.kind.as_str()),
            text("ralph_flow.stage", &call.stage),
            text("ralph_flow.scope", &call.scope),
            int("ralph_flow.attempt", u64::from(call.attempt)),
        ];
        if let Some(m) = &agent.model {
            attrs.push(text("gen_ai.request.model", m));
        }
        let status = match result {
            Ok(reply) => {
                if let Some(m) = &reply.model {
                    attrs.push(text("gen_ai.response.model", m));
                }
                usage_attributes(&reply.usage, true, &mut attrs);
                Status::Unset
            }
            Err(e) => {
                let kind = error_type(e);
                attrs.push(text("error.type", kind));
                Status::error(kind)
            }
        };
        let name = match (operation, &agent.model) {
            ("chat", Some(m)) => format!("chat {m}"),
            (op, _) => format!("{op} {}", agent.name),
        };
        self.emit(
            name,
            SpanKind::Client,
            Some(self.attempt_span(&call.scope, &call.stage, call.attempt)),
            None,
            (started, SystemTime::now()),
            attrs,
            status,
        );
    }

    /// A gate's wait, from its request to its answer.
    pub(crate) fn gate_wait(
        &self,
        scope: &str,
        gate: &str,
        (requested, answered): (i64, i64),
        approved: bool,
        by_timeout: bool,
    ) {
        let attrs = vec![
            text("ralph_flow.stage", gate),
            text("ralph_flow.scope", scope),
            text(
                "ralph_flow.gate.answer",
                if approved { "approved" } else { "rejected" },
            ),
            KeyValue::new("ralph_flow.gate.timed_out", by_timeout),
            int(
                "ralph_flow.gate.wait_ms",
                u64::try_from(answered - requested).unwrap_or(0),
            ),
        ];
        self.emit(
            format!("gate wait {gate}"),
            SpanKind::Internal,
            Some(self.stage_span(scope, gate)),
            None,
            (time_of(requested), time_of(answered)),
            attrs,
            Status::Unset,
        );
    }

    /// The run's own span, once the run is over for good (finished or cancelled): from its
    /// start to now, under the id its record keeps.
    pub(crate) fn run_end(&self, run: &RunRecord, status: RunStatus, exit: Option<(&str, i64)>) {
        let mut attrs = vec![
            text("ralph_flow.run.id", &run.id),
            text("ralph_flow.workflow", &run.workflow),
            text("ralph_flow.run.status", status.as_str()),
        ];
        let mut failed = status == RunStatus::Cancelled;
        if let Some((name, code)) = exit {
            attrs.push(text("ralph_flow.run.exit", name));
            attrs.push(KeyValue::new("ralph_flow.run.exit_code", code));
            failed |= code != 0;
        }
        let outcome = exit.map_or(status.as_str(), |(n, _)| n);
        self.emit(
            format!("run {}", run.workflow),
            SpanKind::Internal,
            None,
            Some(self.ids.run_span),
            (time_of(run.started_at), SystemTime::now()),
            attrs,
            if failed {
                Status::error(outcome.to_string())
            } else {
                Status::Ok
            },
        );
    }
}

/// The `error.type` of a failed call: its class, never its text.
fn error_type(e: &CallError) -> &'static str {
    match e {
        CallError::RateLimited { .. } => "rate_limited",
        CallError::Timeout { .. } => "timeout",
        CallError::Refused { .. } => "refused",
        CallError::Missing { .. } => "missing",
        CallError::Limit { .. } => "limit",
        _ => "failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(options: serde_json::Value) -> RunRecord {
        RunRecord {
            id: "20260101-000000-abcd".into(),
            workflow: "w".into(),
            file: "w.toml".into(),
            workflow_hash: String::new(),
            params: serde_json::json!({}),
            status: RunStatus::Running,
            exit: None,
            started_at: 1_700_000_000_000,
            updated_at: 1_700_000_000_000,
            dir: String::new(),
            options,
        }
    }

    #[test]
    fn kept_ids_are_read_back_and_old_runs_get_stable_derived_ones() {
        let kept = TraceIds::new_json();
        let r = run(serde_json::json!({ OPTIONS_KEY: kept.clone() }));
        let ids = TraceIds::of(&r);
        assert_eq!(
            Some(ids.trace.to_string().as_str()),
            kept["trace_id"].as_str()
        );
        assert_eq!(
            Some(ids.run_span.to_string().as_str()),
            kept["span_id"].as_str()
        );
        assert_ne!(
            TraceIds::of(&run(
                serde_json::json!({ OPTIONS_KEY: TraceIds::new_json() })
            )),
            ids,
            "each new run draws its own ids"
        );
        let old = run(serde_json::json!({}));
        let derived = TraceIds::of(&old);
        assert_eq!(derived, TraceIds::of(&old));
        assert_ne!(derived.trace, TraceId::INVALID);
        assert_eq!(TraceIds::trace_id(&old).len(), 32);
        // Ids that do not parse (or are zero) are not used.
        let bad = run(
            serde_json::json!({ OPTIONS_KEY: {"trace_id": "00000000000000000000000000000000", "span_id": "zz"} }),
        );
        assert_eq!(
            TraceIds::of(&bad),
            TraceIds::of(&run(serde_json::json!({})))
        );
    }

    #[test]
    fn a_scope_names_its_container() {
        assert_eq!(container(""), None);
        assert_eq!(container("lp#3"), Some(("", "lp")));
        assert_eq!(container("outer#1/inner#2"), Some(("outer#1", "inner")));
        assert_eq!(container("sub>"), Some(("", "sub")));
        assert_eq!(container("a/sub>"), Some(("a", "sub")));
        assert_eq!(container("sub>/lp#1"), Some(("sub>", "lp")));
        assert_eq!(container("group"), Some(("", "group")));
    }

    #[test]
    fn providers_follow_the_semantic_conventions() {
        assert_eq!(provider_of(AgentKind::Claude), "anthropic");
        assert_eq!(provider_of(AgentKind::Codex), "openai");
        assert_eq!(provider_of(AgentKind::Gemini), "gcp.gemini");
        assert_eq!(provider_of(AgentKind::Qwen), "qwen");
        assert_eq!(operation_of(AgentKind::OpenAi), "chat");
        assert_eq!(operation_of(AgentKind::Claude), "invoke_agent");
    }
}
