//! One call: the request sent within the call's time limits, its stream (or body) read,
//! and the structured-output mode stepped down when a server rejects it.

use std::future::Future;
use std::path::Path;
use std::time::{Duration, SystemTime};

use reqwest::header::HeaderValue;
use serde_json::Value;
use tokio::time::Instant;

use super::status::{ApiError, excerpt, redact, retry_after, status_text, tail};
use super::{ANTHROPIC_VERSION, Api, HttpBackend, MAX_RESPONSE_BYTES, Request, sse};
use crate::backend::{
    AgentCall, AgentReply, Backend, CallError, CallFuture, Capabilities, error_chain,
};
use crate::model::StructuredOutput;

impl Backend for HttpBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            cost: false,
            usage: true,
        }
    }

    fn call<'a>(&'a self, call: &'a AgentCall) -> CallFuture<'a> {
        Box::pin(self.run(call))
    }
}

/// How one request went.
enum Sent {
    Reply(AgentReply),
    /// The server rejected the structured-output mode: its status and message.
    Rejected(String),
}

impl HttpBackend {
    pub(super) fn current_mode(&self) -> StructuredOutput {
        *self
            .mode
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Makes one call; under `auto`, a structured-output mode the server rejects is
    /// replaced by the next one (for the rest of the run) and the call made again.
    async fn run(&self, call: &AgentCall) -> Result<AgentReply, CallError> {
        let model = call
            .model
            .as_deref()
            .or(self.model.as_deref())
            .ok_or_else(|| CallError::Failed {
                message: format!("kind {} needs a `model` on the agent", self.api.kind()),
            })?;
        let key = self.key.resolve()?;
        let mut warnings = Vec::new();
        loop {
            let mode = self.current_mode();
            let strict = self.strict && mode == StructuredOutput::JsonSchema;
            // Strict mode takes the schema lowered to what it accepts; the answer is mapped
            // back to the author's schema, which validates it.
            let lowered = match (&call.schema, strict) {
                (Some(schema), true) => Some(
                    crate::dialect::lower(schema, crate::dialect::Dialect::OpenAiStrict).map_err(
                        |r| CallError::Refused {
                            message: crate::dialect::refusals_text(&r),
                        },
                    )?,
                ),
                _ => None,
            };
            let req = Request {
                model,
                prompt: &call.prompt,
                max_tokens: call.max_tokens.or(self.max_tokens),
                completion_tokens: self.completion_tokens,
                schema: lowered.as_ref().map(|l| &l.schema).or(call.schema.as_ref()),
                mode,
                strict,
            };
            match self.send(call, &req, key.as_deref()).await? {
                Sent::Reply(mut reply) => {
                    if let Some(text) = lowered.as_ref().and_then(|l| l.restore_text(&reply.text)) {
                        reply.text = text;
                    }
                    if !warnings.is_empty() {
                        reply.structured_output = Some(mode.as_str().to_string());
                    }
                    reply.warnings = warnings;
                    return Ok(reply);
                }
                Sent::Rejected(why)
                    if strict
                        && (why.contains("invalid_json_schema")
                            || why.contains("Invalid schema for")) =>
                {
                    return Err(CallError::Refused {
                        message: format!(
                            "{why} (OpenAI's strict structured outputs refused the output \
                             schema: change it, or set `structured_output = \"prompt\"` on \
                             the agent)"
                        ),
                    });
                }
                Sent::Rejected(why) => {
                    let next = self.api.step_down(mode).filter(|_| self.auto);
                    let Some(next) = next else {
                        return Err(CallError::Failed {
                            message: format!(
                                "{why}: the server does not accept structured output `{}`; \
                                 set `structured_output` on the agent to a mode it accepts \
                                 (`json_object` for llama-cpp-python and llama.cpp, \
                                 `guided_json` for older vLLM, else `prompt`)",
                                mode.as_str()
                            ),
                        });
                    };
                    *self
                        .mode
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = next;
                    let text = format!(
                        "{why}: the server rejected structured output `{}`; using `{}` for \
                         the rest of the run (set `structured_output = \"{}\"` on the agent \
                         to choose it explicitly)",
                        mode.as_str(),
                        next.as_str(),
                        next.as_str()
                    );
                    tracing::warn!("{text}");
                    warnings.push(text);
                }
            }
        }
    }

    /// Sends one request and reads its stream (or body) within the call's time limits.
    async fn send(
        &self,
        call: &AgentCall,
        req: &Request<'_>,
        key: Option<&str>,
    ) -> Result<Sent, CallError> {
        let body = self.api.request_body(req);
        write_artifact(&call.dir.join("request.json"), format!("{body:#}")).await;
        let request = self.request(key, &body)?;

        let limits = Limits::start(call.timeout, call.idle_timeout);
        tracing::debug!(url = %self.url, "sending request");
        let mut response = limits.bound(request.send(), &[]).await?.map_err(|e| {
            // Too many open files for the connection's socket: the machine's limit, not
            // the server's; the run stops as resumable instead of retrying.
            let limit = crate::backend::process::Limit::in_chain(&e);
            let error = self.send_error(e);
            match limit {
                Some(limit) => CallError::Limit {
                    limit,
                    message: error.text().to_string(),
                },
                None => error,
            }
        })?;
        let status = response.status();
        tracing::debug!(url = %self.url, %status, "response headers");
        let retry_after = retry_after(response.headers(), SystemTime::now());
        let mut received = Vec::new();
        // The body is kept whole for the artifact and for a server that does not stream;
        // an event stream is read as it arrives.
        let mut stream = sse::StreamReader::new(self.api);
        while let Some(chunk) = limits
            .bound(response.chunk(), &received)
            .await?
            .map_err(|e| CallError::Transient {
                message: format!(
                    "the connection to {} dropped while reading the response: {}",
                    self.url,
                    error_chain(&e.without_url())
                ),
                retry_after: None,
            })?
        {
            received.extend_from_slice(&chunk);
            stream.feed(&chunk);
            if received.len() > MAX_RESPONSE_BYTES {
                return Err(CallError::Failed {
                    message: format!(
                        "the response from {} is longer than {} MiB; the call was stopped",
                        self.url,
                        MAX_RESPONSE_BYTES >> 20
                    ),
                });
            }
        }
        let raw = String::from_utf8_lossy(&received).into_owned();
        write_artifact(&call.dir.join("response.json"), raw.clone()).await;

        if !status.is_success() {
            let rejects_mode = req.schema.is_some()
                && req.mode.is_native()
                && matches!(status.as_u16(), 400 | 422 | 500);
            if rejects_mode {
                let error = ApiError::parse(&raw);
                return Ok(Sent::Rejected(format!(
                    "HTTP {} from {}: {}",
                    status_text(status),
                    self.url,
                    redact(&error.message, key)
                )));
            }
            return Err(self.status_error(status, retry_after, &raw, key));
        }
        self.reply(raw, stream, req.model).map(Sent::Reply)
    }

    /// Builds the request with its headers. The key's header value is marked sensitive so
    /// that it never shows in debug output.
    fn request(
        &self,
        key: Option<&str>,
        body: &Value,
    ) -> Result<reqwest::RequestBuilder, CallError> {
        let mut request = self
            .client
            .post(&self.url)
            .header("accept", "text/event-stream")
            .json(body);
        if let Some(key) = key {
            let (name, value) = match self.api {
                Api::Chat | Api::Responses => ("authorization", format!("Bearer {key}")),
                Api::Messages => ("x-api-key", key.to_owned()),
            };
            let mut value = HeaderValue::from_str(&value).map_err(|_| CallError::Failed {
                message: format!(
                    "the API key in `{}` is not a valid HTTP header value",
                    self.key.var
                ),
            })?;
            value.set_sensitive(true);
            request = request.header(name, value);
        }
        if self.api == Api::Messages {
            request = request.header("anthropic-version", ANTHROPIC_VERSION);
        }
        Ok(request)
    }

    /// Reads the reply out of a successful response (an event stream, read into `stream` as
    /// it arrived, or one JSON body from a server that does not stream); a body that is not
    /// what the API sends, or a stream that ends before the answer does, is transient (a
    /// proxy's page, a dropped stream).
    fn reply(
        &self,
        raw: String,
        stream: sse::StreamReader,
        model: &str,
    ) -> Result<AgentReply, CallError> {
        let unreadable = |why: &str| CallError::Transient {
            message: format!("the response from {} {why}: {}", self.url, excerpt(&raw)),
            retry_after: None,
        };
        match self.api.answer(&raw) {
            Ok(answer) => {
                let text = answer
                    .text
                    .ok_or_else(|| unreadable("has no text where the API puts it"))?;
                return Ok(AgentReply {
                    text,
                    usage: answer.usage,
                    session_id: answer.id,
                    model: answer.model.or_else(|| Some(model.to_owned())),
                    raw,
                    ..AgentReply::default()
                });
            }
            // JSON, but not an object.
            Err(e) if e.is_data() => return Err(unreadable("has no text where the API puts it")),
            Err(_) => {}
        }
        if !sse::looks_like_stream(&raw) {
            return Err(unreadable("is neither JSON nor an event stream"));
        }
        let streamed = stream.finish().map_err(|e| CallError::Transient {
            message: format!("the stream from {} reported an error: {e}", self.url),
            retry_after: None,
        })?;
        if !streamed.done {
            return Err(unreadable("ended before the answer was complete"));
        }
        Ok(AgentReply {
            text: streamed.text,
            // A stream without a usage event reported none (llama-cpp-python ignores
            // `stream_options.include_usage`): that call's usage is unknown, not 0 tokens.
            // It is not asked for another way: the server's non-streamed answer has it, but
            // asking again would be a second generation, and its `/extras/tokenize/count`
            // counts a text without the chat template and takes the model's lock, which cuts
            // short any other stream the server is sending (`interrupt_requests`).
            usage: streamed
                .usage
                .unwrap_or_else(crate::backend::Usage::unreported_call),
            session_id: streamed.id,
            model: streamed.model.or_else(|| Some(model.to_owned())),
            raw,
            ..AgentReply::default()
        })
    }
}

/// The time limits of one call.
struct Limits {
    /// When the whole call must be over, and the timeout that set it.
    deadline: Option<(Instant, Duration)>,
    idle: Option<Duration>,
}

impl Limits {
    /// Starts the clock of the call's timeout.
    fn start(timeout: Option<Duration>, idle: Option<Duration>) -> Self {
        Limits {
            deadline: timeout.and_then(|t| Some((Instant::now().checked_add(t)?, t))),
            idle,
        }
    }

    /// Awaits one step of the call (the headers, a chunk of the body) within the call's
    /// deadline and the idle timeout; `received` is the body so far, for the timeout's tail.
    async fn bound<T>(
        &self,
        step: impl Future<Output = T>,
        received: &[u8],
    ) -> Result<T, CallError> {
        let idle = self
            .idle
            .and_then(|d| Some((Instant::now().checked_add(d)?, d)));
        let (at, after, is_idle) = match (self.deadline, idle) {
            (None, None) => return Ok(step.await),
            (Some((at, after)), Some((idle_at, _))) if at <= idle_at => (at, after, false),
            (Some((at, after)), None) => (at, after, false),
            (_, Some((at, after))) => (at, after, true),
        };
        tokio::time::timeout_at(at, step)
            .await
            .map_err(|_| CallError::Timeout {
                after,
                idle: is_idle,
                tail: tail(received),
            })
    }
}

/// Writes an artifact; a failure is logged, not fatal (the executor keeps the raw reply).
async fn write_artifact(path: &Path, contents: String) {
    let contents = crate::secrets::redact(&contents).into_owned();
    if let Err(e) = tokio::fs::write(path, contents).await {
        tracing::warn!(path = %path.display(), error = %e, "cannot write an artifact");
    }
}
