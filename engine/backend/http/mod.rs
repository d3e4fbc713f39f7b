//! Backends for HTTP APIs: `openai` (Chat Completions or Responses, and any compatible server
//! through `base_url`: vLLM, llama.cpp, llama-cpp-python, Ollama, LM Studio, LiteLLM...) and
//! `anthropic` (Messages).
//!
//! Each call is one streamed request with the prompt as the single user message.
//!
//! - **Streaming**: requests ask for server-sent events, so `idle_timeout` measures the
//!   model's silence, not its generation time; a server that answers with one JSON body
//!   anyway is read as such. Dropping a call drops the connection, so the server stops
//!   generating.
//! - **Structured output**: a stage's output schema reaches the model as the agent's
//!   `structured_output` says: `json_schema` (OpenAI's `response_format`), `json_object`
//!   (`response_format: {type: json_object, schema}`, llama-cpp-python and llama.cpp),
//!   `guided_json` (vLLM's field), `prompt` (written into the prompt) or `off`. `auto` (the
//!   default) starts with `json_schema` and, when a server rejects it (HTTP 400, 422 or 500
//!   to a request that carries it), steps down to the next mode (`json_object`, then
//!   `prompt`) once for the rest of the run, with a warning that names the setting; the
//!   rejected request is not retried as if the failure were transient.
//! - **Keys** are read from the environment at call time, from the variable `api_key_env`
//!   names (default `OPENAI_API_KEY` or `ANTHROPIC_API_KEY`). A variable named explicitly must
//!   be set, and so must the default one for the default `base_url`; without either the call
//!   is [`CallError::Missing`]. A custom `base_url` without `api_key_env` is called without a
//!   key when the default variable is unset (local servers need none). Keys are never logged,
//!   written or put in a message.
//! - **Timeouts**: `timeout` bounds the whole request, from sending to the last event;
//!   `idle_timeout` bounds the wait for the response headers and then every silence
//!   between two chunks of the stream.
//! - **Artifacts**: the request body goes to `request.json` and the response (the event
//!   stream as received, or the body) to `response.json` in the call's directory.
//! - **Errors**: 429 is [`CallError::RateLimited`] (OpenAI's `insufficient_quota` too); 408,
//!   409, 5xx (Anthropic's 529 "overloaded" among them), an `error` event in the stream,
//!   connection failures and a 200 whose body cannot be read are [`CallError::Transient`];
//!   401/403 and other 4xx are [`CallError::Failed`]. `Retry-After` (seconds or an HTTP
//!   date) and `retry-after-ms` are passed on.

use std::future::Future;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::{
    AgentCall, AgentConfig, AgentReply, Backend, CallError, CallFuture, Capabilities, Usage,
    prompt_with_schema,
};
use crate::model::{AgentKind, StructuredOutput};

const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
const OPENAI_KEY_ENV: &str = "OPENAI_API_KEY";
const ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com/v1";
const ANTHROPIC_KEY_ENV: &str = "ANTHROPIC_API_KEY";
const ANTHROPIC_VERSION: &str = "2023-06-01";
/// Anthropic requires `max_tokens`; this is asked for when the agent and stage set none.
const ANTHROPIC_MAX_TOKENS: u64 = 8192;
/// The name given to the output schema in OpenAI requests.
const SCHEMA_NAME: &str = "output";
/// How many characters of a body go into an error message.
const EXCERPT_CHARS: usize = 300;
/// How many characters of a partly received body go into a timeout's tail.
const TAIL_CHARS: usize = 2000;
/// The largest response body read; a longer one is cut there and the call fails.
const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// Tells whether an `openai` or `anthropic` agent can be called: its settings are valid and
/// its key variable is set where one is needed.
pub fn preflight(config: &AgentConfig) -> Result<(), String> {
    let (_, _, key) = settings(config)?;
    match key.resolve() {
        Err(_) => Err(format!(
            "the API key variable `{}` is not set; export it, or name another variable with \
             `api_key_env`",
            key.var
        )),
        Ok(_) => Ok(()),
    }
}

/// The environment variable an `openai` or `anthropic` agent's key comes from (named by
/// `api_key_env`, else the kind's default), for the run to keep its value secret.
pub fn key_variable(config: &AgentConfig) -> Option<String> {
    settings(config).ok().map(|(_, _, key)| key.var)
}

/// An agent's API, base URL (without a trailing slash) and key variable. Fails on an
/// unknown `api` or a `base_url` that is not an http(s) URL.
fn settings(config: &AgentConfig) -> Result<(Api, String, ApiKey), String> {
    let (api, default_base_url, default_key_env) = match config.kind {
        AgentKind::OpenAi => {
            let api = match config.api.as_deref() {
                None | Some("chat") => Api::Chat,
                Some("responses") => Api::Responses,
                Some(other) => {
                    return Err(format!(
                        "unknown api `{other}` (expected `chat` or `responses`)"
                    ));
                }
            };
            (api, OPENAI_BASE_URL, OPENAI_KEY_ENV)
        }
        AgentKind::Anthropic => (Api::Messages, ANTHROPIC_BASE_URL, ANTHROPIC_KEY_ENV),
        other => {
            return Err(format!("kind {} is not an HTTP backend", other.as_str()));
        }
    };
    let base_url = config
        .base_url
        .as_deref()
        .unwrap_or(default_base_url)
        .trim_end_matches('/');
    match reqwest::Url::parse(base_url) {
        Ok(url) if matches!(url.scheme(), "http" | "https") => {}
        _ => {
            return Err(format!("base_url `{base_url}` is not an http(s) URL"));
        }
    }
    let key = ApiKey {
        var: config
            .api_key_env
            .clone()
            .unwrap_or_else(|| default_key_env.to_owned()),
        required: config.api_key_env.is_some() || base_url == default_base_url,
    };
    Ok((api, base_url.to_owned(), key))
}

/// Builds an `openai` or `anthropic` backend.
pub fn build(config: &AgentConfig) -> Result<Box<dyn Backend>, String> {
    let (api, base_url, key) = settings(config)?;
    let client = reqwest::Client::builder()
        .build()
        .map_err(|e| format!("cannot set up an HTTP client: {e}"))?;
    let mode = match (api, config.structured_output) {
        // The Messages API has no schema mode: `auto` leaves the prompt as written, and
        // the native modes fall back to writing the schema into the prompt.
        (Api::Messages, StructuredOutput::Auto | StructuredOutput::Off) => StructuredOutput::Off,
        (Api::Messages, _) => StructuredOutput::Prompt,
        (Api::Responses, StructuredOutput::JsonObject | StructuredOutput::GuidedJson) => {
            StructuredOutput::Prompt
        }
        (_, StructuredOutput::Auto) => StructuredOutput::JsonSchema,
        (_, mode) => mode,
    };
    Ok(Box::new(HttpBackend {
        api,
        url: format!("{base_url}{}", api.path()),
        // OpenAI's own API wants `max_completion_tokens` (its reasoning models refuse
        // `max_tokens`); compatible servers know `max_tokens`.
        completion_tokens: base_url == OPENAI_BASE_URL,
        key,
        model: config.model.clone(),
        max_tokens: config.max_tokens,
        auto: config.structured_output == StructuredOutput::Auto,
        mode: Mutex::new(mode),
        client,
    }))
}

/// Which API a backend calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    /// OpenAI Chat Completions.
    Chat,
    /// OpenAI Responses.
    Responses,
    /// Anthropic Messages.
    Messages,
}

impl Api {
    /// Returns the agent kind, as written in files.
    fn kind(self) -> &'static str {
        match self {
            Api::Chat | Api::Responses => AgentKind::OpenAi.as_str(),
            Api::Messages => AgentKind::Anthropic.as_str(),
        }
    }

    /// Returns the endpoint's path under the base URL.
    fn path(self) -> &'static str {
        match self {
            Api::Chat => "/chat/completions",
            Api::Responses => "/responses",
            Api::Messages => "/messages",
        }
    }

    /// The next structured-output mode to try when a server rejects `mode`, under `auto`.
    fn step_down(self, mode: StructuredOutput) -> Option<StructuredOutput> {
        match (self, mode) {
            (Api::Chat, StructuredOutput::JsonSchema) => Some(StructuredOutput::JsonObject),
            (_, StructuredOutput::JsonSchema | StructuredOutput::JsonObject) => {
                Some(StructuredOutput::Prompt)
            }
            _ => None,
        }
    }

    /// Builds the (streamed) request body; `schema` is the stage's output schema, sent in
    /// the structured-output `mode`.
    fn request_body(&self, req: &Request<'_>) -> Value {
        let prompt = match (req.schema, req.mode) {
            (Some(schema), StructuredOutput::Prompt) => prompt_with_schema(req.prompt, schema),
            _ => req.prompt.to_owned(),
        };
        let schema = req.schema.filter(|_| req.mode.is_native());
        match self {
            Api::Chat => {
                let mut body = json!({
                    "model": req.model,
                    "messages": [{"role": "user", "content": prompt}],
                    "stream": true,
                    "stream_options": {"include_usage": true},
                });
                if let Some(n) = req.max_tokens {
                    let key = if req.completion_tokens {
                        "max_completion_tokens"
                    } else {
                        "max_tokens"
                    };
                    body[key] = n.into();
                }
                match (schema, req.mode) {
                    (Some(schema), StructuredOutput::JsonSchema) => {
                        body["response_format"] = json!({
                            "type": "json_schema",
                            "json_schema": {"name": SCHEMA_NAME, "schema": schema, "strict": false},
                        });
                    }
                    (Some(schema), StructuredOutput::JsonObject) => {
                        body["response_format"] = json!({"type": "json_object", "schema": schema});
                    }
                    (Some(schema), StructuredOutput::GuidedJson) => {
                        body["guided_json"] = schema.clone();
                    }
                    _ => {}
                }
                body
            }
            Api::Responses => {
                let mut body = json!({"model": req.model, "input": prompt, "stream": true});
                if let Some(n) = req.max_tokens {
                    body["max_output_tokens"] = n.into();
                }
                if let Some(schema) = schema {
                    body["text"] = json!({
                        "format": {
                            "type": "json_schema",
                            "name": SCHEMA_NAME,
                            "schema": schema,
                            "strict": false,
                        },
                    });
                }
                body
            }
            Api::Messages => json!({
                "model": req.model,
                "max_tokens": req.max_tokens.unwrap_or(ANTHROPIC_MAX_TOKENS),
                "messages": [{"role": "user", "content": prompt}],
                "stream": true,
            }),
        }
    }

    /// Finds the answer's text in a whole (not streamed) response, or `None` when it is
    /// not where this API puts it.
    fn text(self, response: &Value) -> Option<String> {
        match self {
            Api::Chat => response
                .pointer("/choices/0/message/content")?
                .as_str()
                .map(str::to_owned),
            Api::Responses => {
                if let Some(text) = response.get("output_text").and_then(Value::as_str) {
                    return Some(text.to_owned());
                }
                let items = response.get("output")?.as_array()?;
                Some(
                    items
                        .iter()
                        .filter_map(|item| item.get("content")?.as_array())
                        .flatten()
                        .filter(|part| {
                            part.get("type").and_then(Value::as_str) == Some("output_text")
                        })
                        .filter_map(|part| part.get("text")?.as_str())
                        .collect(),
                )
            }
            Api::Messages => Some(
                response
                    .get("content")?
                    .as_array()?
                    .iter()
                    .filter(|block| block.get("type").and_then(Value::as_str) == Some("text"))
                    .filter_map(|block| block.get("text")?.as_str())
                    .collect(),
            ),
        }
    }

    /// Reads the token counts of a response, or of the part of a stream that carries them
    /// (zero where absent).
    fn usage(self, response: &Value) -> Usage {
        let (input, output, cached) = match self {
            Api::Chat => (
                "/usage/prompt_tokens",
                "/usage/completion_tokens",
                "/usage/prompt_tokens_details/cached_tokens",
            ),
            Api::Responses => (
                "/usage/input_tokens",
                "/usage/output_tokens",
                "/usage/input_tokens_details/cached_tokens",
            ),
            Api::Messages => (
                "/usage/input_tokens",
                "/usage/output_tokens",
                "/usage/cache_read_input_tokens",
            ),
        };
        let count = |pointer| {
            response
                .pointer(pointer)
                .and_then(Value::as_u64)
                .unwrap_or(0)
        };
        Usage {
            input_tokens: count(input),
            output_tokens: count(output),
            cached_tokens: count(cached),
            cost_usd: None,
        }
    }

    /// Reads a server-sent event stream: the text, the usage, the id and the model, or the
    /// error an `error` event carries.
    fn read_stream(self, raw: &str) -> Result<Streamed, String> {
        let mut out = Streamed::default();
        for data in sse_data(raw) {
            if data == "[DONE]" {
                out.done = true;
                continue;
            }
            let Ok(event) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            let kind = event.get("type").and_then(Value::as_str).unwrap_or("");
            if kind == "error"
                || kind == "response.failed"
                || event.get("error").is_some_and(|e| !e.is_null())
            {
                let error = event
                    .pointer("/error/message")
                    .or_else(|| event.pointer("/response/error/message"))
                    .or_else(|| event.get("message"))
                    .and_then(Value::as_str)
                    .map_or_else(|| excerpt(data), str::to_owned);
                let kind = event
                    .pointer("/error/type")
                    .or_else(|| event.pointer("/error/code"))
                    .and_then(Value::as_str)
                    .map(|k| format!(" ({k})"))
                    .unwrap_or_default();
                return Err(format!("{error}{kind}"));
            }
            let field = |pointer: &str| {
                event
                    .pointer(pointer)
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            };
            match self {
                Api::Chat => {
                    out.id = out.id.take().or_else(|| field("/id"));
                    out.model = out.model.take().or_else(|| field("/model"));
                    if let Some(t) = event
                        .pointer("/choices/0/delta/content")
                        .and_then(Value::as_str)
                    {
                        out.text.push_str(t);
                    }
                    if event
                        .pointer("/choices/0/finish_reason")
                        .is_some_and(|f| !f.is_null())
                    {
                        out.done = true;
                    }
                    if event.get("usage").is_some_and(|u| !u.is_null()) {
                        out.usage = self.usage(&event);
                    }
                }
                Api::Responses => match kind {
                    "response.output_text.delta" => {
                        if let Some(t) = event.get("delta").and_then(Value::as_str) {
                            out.text.push_str(t);
                        }
                    }
                    "response.completed" | "response.incomplete" => {
                        if let Some(r) = event.get("response") {
                            out.usage = self.usage(r);
                            out.id = r.get("id").and_then(Value::as_str).map(str::to_owned);
                            out.model = r.get("model").and_then(Value::as_str).map(str::to_owned);
                            if out.text.is_empty() {
                                out.text = self.text(r).unwrap_or_default();
                            }
                        }
                        out.done = true;
                    }
                    _ => {}
                },
                Api::Messages => match kind {
                    "message_start" => {
                        if let Some(m) = event.get("message") {
                            out.id = m.get("id").and_then(Value::as_str).map(str::to_owned);
                            out.model = m.get("model").and_then(Value::as_str).map(str::to_owned);
                            out.usage = self.usage(m);
                        }
                    }
                    "content_block_delta" => {
                        if let Some(t) = event.pointer("/delta/text").and_then(Value::as_str) {
                            out.text.push_str(t);
                        }
                    }
                    "message_delta" => {
                        if let Some(n) = event
                            .pointer("/usage/output_tokens")
                            .and_then(Value::as_u64)
                        {
                            out.usage.output_tokens = n;
                        }
                    }
                    "message_stop" => out.done = true,
                    _ => {}
                },
            }
        }
        Ok(out)
    }
}

/// What a stream said.
#[derive(Debug, Default)]
struct Streamed {
    text: String,
    usage: Usage,
    id: Option<String>,
    model: Option<String>,
    /// The stream said it was complete (`[DONE]`, a finish reason, `message_stop`...).
    done: bool,
}

/// The `data:` payloads of a server-sent event stream, one per event (multi-line data
/// joined with newlines).
fn sse_data(raw: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for block in raw.split("\n\n").flat_map(|b| b.split("\r\n\r\n")) {
        for line in block.lines() {
            if let Some(d) = line.strip_prefix("data:") {
                out.push(d.trim());
            }
        }
    }
    out
}

/// One request's settings.
struct Request<'a> {
    model: &'a str,
    prompt: &'a str,
    max_tokens: Option<u64>,
    completion_tokens: bool,
    schema: Option<&'a Value>,
    mode: StructuredOutput,
}

/// Where the API key comes from.
#[derive(Debug)]
struct ApiKey {
    /// The environment variable that holds it.
    var: String,
    /// Whether a call without it is [`CallError::Missing`] rather than sent without a key.
    required: bool,
}

impl ApiKey {
    /// Reads the key from the environment; an empty variable counts as unset.
    fn resolve(&self) -> Result<Option<String>, CallError> {
        match std::env::var(&self.var) {
            Ok(key) if !key.is_empty() => Ok(Some(key)),
            _ if self.required => Err(CallError::Missing {
                message: format!("the API key variable `{}` is not set", self.var),
            }),
            _ => Ok(None),
        }
    }
}

/// A backend for one HTTP API, with its client (and so its connections) kept across calls.
struct HttpBackend {
    api: Api,
    /// The endpoint: the base URL and the API's path.
    url: String,
    key: ApiKey,
    model: Option<String>,
    max_tokens: Option<u64>,
    /// Whether the output limit is sent as `max_completion_tokens`.
    completion_tokens: bool,
    /// Whether the structured-output mode may step down when a server rejects it.
    auto: bool,
    /// The structured-output mode in use: the configured one, or where `auto` stepped
    /// down to in this run.
    mode: Mutex<StructuredOutput>,
    client: reqwest::Client,
}

impl Backend for HttpBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            json_schema: self.current_mode() != StructuredOutput::Off,
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
    fn current_mode(&self) -> StructuredOutput {
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
            let req = Request {
                model,
                prompt: &call.prompt,
                max_tokens: call.max_tokens.or(self.max_tokens),
                completion_tokens: self.completion_tokens,
                schema: call.schema.as_ref(),
                mode,
            };
            match self.send(call, &req, key.as_deref()).await? {
                Sent::Reply(mut reply) => {
                    reply.warnings = warnings;
                    return Ok(reply);
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
        let mut response = limits
            .bound(request.send(), &[])
            .await?
            .map_err(|e| self.send_error(e))?;
        let status = response.status();
        tracing::debug!(url = %self.url, %status, "response headers");
        let retry_after = retry_after(response.headers(), SystemTime::now());
        let mut received = Vec::new();
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
        self.reply(raw, req.model).map(Sent::Reply)
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

    /// Classifies a failure to send the request or to receive the response headers.
    fn send_error(&self, error: reqwest::Error) -> CallError {
        let is_builder = error.is_builder();
        let message = format!(
            "POST {} failed: {}",
            self.url,
            error_chain(&error.without_url())
        );
        if is_builder {
            CallError::Failed { message }
        } else {
            CallError::Transient {
                message,
                retry_after: None,
            }
        }
    }

    /// Classifies a response whose status is not a success.
    fn status_error(
        &self,
        status: StatusCode,
        retry_after: Option<Duration>,
        body: &str,
        key: Option<&str>,
    ) -> CallError {
        let error = ApiError::parse(body);
        let detail = redact(&error.message, key);
        let prefix = format!("HTTP {} from {}", status_text(status), self.url);
        match status.as_u16() {
            429 if error.is_quota() => CallError::RateLimited {
                message: format!("{prefix}: quota exhausted (insufficient_quota): {detail}"),
                retry_after,
            },
            429 => CallError::RateLimited {
                message: format!("{prefix}: {detail}"),
                retry_after,
            },
            408 | 409 | 500..=599 => CallError::Transient {
                message: format!("{prefix}: {detail}"),
                retry_after,
            },
            401 | 403 => {
                let hint = match key {
                    Some(_) => format!("check the API key in `{}`", self.key.var),
                    None => format!(
                        "no API key was sent because `{}` is not set; set it, or name another \
                         variable with `api_key_env`",
                        self.key.var
                    ),
                };
                CallError::Failed {
                    message: format!("{prefix}: {detail}; {hint}"),
                }
            }
            _ => CallError::Failed {
                message: format!("{prefix}: {detail}"),
            },
        }
    }

    /// Reads the reply out of a successful response (an event stream, or one JSON body from
    /// a server that does not stream); a body that is not what the API sends, or a stream
    /// that ends before the answer does, is transient (a proxy's page, a dropped stream).
    fn reply(&self, raw: String, model: &str) -> Result<AgentReply, CallError> {
        let unreadable = |why: &str| CallError::Transient {
            message: format!("the response from {} {why}: {}", self.url, excerpt(&raw)),
            retry_after: None,
        };
        if let Ok(response) = serde_json::from_str::<Value>(&raw) {
            let text = self
                .api
                .text(&response)
                .ok_or_else(|| unreadable("has no text where the API puts it"))?;
            let field = |name: &str| {
                response
                    .get(name)
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            };
            return Ok(AgentReply {
                text,
                usage: self.api.usage(&response),
                session_id: field("id"),
                model: field("model").or_else(|| Some(model.to_owned())),
                raw,
                ..AgentReply::default()
            });
        }
        if !raw.trim_start().starts_with("data:") && !raw.trim_start().starts_with("event:") {
            return Err(unreadable("is neither JSON nor an event stream"));
        }
        let streamed = self
            .api
            .read_stream(&raw)
            .map_err(|e| CallError::Transient {
                message: format!("the stream from {} reported an error: {e}", self.url),
                retry_after: None,
            })?;
        if !streamed.done {
            return Err(unreadable("ended before the answer was complete"));
        }
        Ok(AgentReply {
            text: streamed.text,
            usage: streamed.usage,
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

/// The error an API reports in a failed response's body.
struct ApiError {
    message: String,
    code: Option<String>,
    kind: Option<String>,
}

impl ApiError {
    /// Reads `error.message` (OpenAI, Anthropic), `error` as a string or `detail`
    /// (compatible servers); anything else is an excerpt of the body.
    fn parse(body: &str) -> Self {
        let value: Value = serde_json::from_str(body).unwrap_or(Value::Null);
        let string = |pointer: &str| value.pointer(pointer).and_then(Value::as_str);
        let message = string("/error/message")
            .or_else(|| string("/error"))
            .or_else(|| string("/message"))
            .or_else(|| string("/detail"))
            .map_or_else(|| excerpt(body), str::to_owned);
        ApiError {
            message,
            code: string("/error/code").map(str::to_owned),
            kind: string("/error/type").map(str::to_owned),
        }
    }

    /// Tells whether the error is OpenAI's exhausted quota.
    fn is_quota(&self) -> bool {
        [&self.code, &self.kind]
            .into_iter()
            .any(|s| s.as_deref() == Some("insufficient_quota"))
    }
}

/// Reads how long the server asks to wait: `retry-after-ms`, else `Retry-After` in seconds
/// or as an HTTP date (relative to `now`; a date in the past is no wait).
fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let header = |name| headers.get(name)?.to_str().ok().map(str::trim);
    let milliseconds = header("retry-after-ms")
        .and_then(|v| v.parse::<f64>().ok())
        .and_then(|ms| Duration::try_from_secs_f64(ms / 1000.0).ok());
    if milliseconds.is_some() {
        return milliseconds;
    }
    let value = header("retry-after")?;
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Writes an artifact; a failure is logged, not fatal (the executor keeps the raw reply).
async fn write_artifact(path: &Path, contents: String) {
    let contents = crate::secrets::redact(&contents).into_owned();
    if let Err(e) = tokio::fs::write(path, contents).await {
        tracing::warn!(path = %path.display(), error = %e, "cannot write an artifact");
    }
}

/// Returns a status with its reason (`529 Overloaded` for Anthropic's overload).
fn status_text(status: StatusCode) -> String {
    match (status.canonical_reason(), status.as_u16()) {
        (Some(reason), code) => format!("{code} {reason}"),
        (None, 529) => "529 Overloaded".to_owned(),
        (None, code) => code.to_string(),
    }
}

/// Joins an error and its sources (`error sending request: connection refused`).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        message.push_str(": ");
        message.push_str(&e.to_string());
        source = e.source();
    }
    message
}

/// Returns the start of a body, for a message.
fn excerpt(body: &str) -> String {
    let body = body.trim();
    if body.is_empty() {
        return "(empty body)".to_owned();
    }
    match body.char_indices().nth(EXCERPT_CHARS) {
        Some((end, _)) => format!("{}...", &body[..end]),
        None => body.to_owned(),
    }
}

/// Returns the end of a partly received body, for a timeout.
fn tail(received: &[u8]) -> String {
    let text = String::from_utf8_lossy(received);
    let skip = text.chars().count().saturating_sub(TAIL_CHARS);
    text.chars().skip(skip).collect()
}

/// Hides the key, should a server echo it in a message.
fn redact(message: &str, key: Option<&str>) -> String {
    match key {
        Some(key) if !key.is_empty() => message.replace(key, "***"),
        _ => message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_limit_is_named_as_each_server_wants_it() {
        let req = |completion_tokens| Request {
            model: "m",
            prompt: "p",
            max_tokens: Some(50),
            completion_tokens,
            schema: None,
            mode: StructuredOutput::Off,
        };
        let openai = Api::Chat.request_body(&req(true));
        assert_eq!(openai["max_completion_tokens"], 50);
        assert!(openai.get("max_tokens").is_none());
        let local = Api::Chat.request_body(&req(false));
        assert_eq!(local["max_tokens"], 50);
        assert!(local.get("max_completion_tokens").is_none());
        // Which one a backend uses follows its base URL.
        let config = |base_url: Option<&str>| AgentConfig {
            kind: AgentKind::OpenAi,
            model: Some("m".into()),
            base_url: base_url.map(String::from),
            ..AgentConfig::default()
        };
        assert!(settings(&config(None)).expect("valid").1 == OPENAI_BASE_URL);
        assert!(
            settings(&config(Some("http://127.0.0.1:8080/v1/")))
                .expect("valid")
                .1
                == "http://127.0.0.1:8080/v1"
        );
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).expect("header value"));
        }
        map
    }

    #[test]
    fn retry_after_reads_seconds_milliseconds_and_dates() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").expect("date");
        let wait = |pairs: &[(&'static str, &str)]| retry_after(&headers(pairs), now);
        assert_eq!(wait(&[("retry-after", "7")]), Some(Duration::from_secs(7)));
        assert_eq!(
            wait(&[("retry-after", "Sun, 06 Nov 1994 08:50:07 GMT")]),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            wait(&[("retry-after", "Sun, 06 Nov 1994 08:00:00 GMT")]),
            Some(Duration::ZERO)
        );
        assert_eq!(
            wait(&[("retry-after-ms", "1500"), ("retry-after", "7")]),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            wait(&[("retry-after-ms", "soon"), ("retry-after", "7")]),
            Some(Duration::from_secs(7))
        );
        assert_eq!(wait(&[("retry-after", "later")]), None);
        assert_eq!(wait(&[]), None);
    }

    #[test]
    fn api_errors_are_read_from_each_shape() {
        let openai = ApiError::parse(
            r#"{"error":{"message":"You exceeded your quota","type":"insufficient_quota","code":null}}"#,
        );
        assert_eq!(openai.message, "You exceeded your quota");
        assert!(openai.is_quota());
        assert_eq!(
            ApiError::parse(r#"{"error":"bad model"}"#).message,
            "bad model"
        );
        assert_eq!(
            ApiError::parse(r#"{"detail":"Not Found"}"#).message,
            "Not Found"
        );
        assert_eq!(
            ApiError::parse("<html>oops</html>").message,
            "<html>oops</html>"
        );
        assert_eq!(ApiError::parse("").message, "(empty body)");
        assert!(!ApiError::parse(r#"{"error":{"message":"slow down"}}"#).is_quota());
    }

    #[test]
    fn excerpts_and_tails_are_cut_on_character_boundaries() {
        let long = "é".repeat(EXCERPT_CHARS + 10);
        assert_eq!(excerpt(&long).chars().count(), EXCERPT_CHARS + 3);
        let long = "ü".repeat(TAIL_CHARS + 10);
        assert_eq!(tail(long.as_bytes()).chars().count(), TAIL_CHARS);
    }

    #[test]
    fn keys_are_redacted() {
        assert_eq!(
            redact("Incorrect API key provided: sk-123", Some("sk-123")),
            "Incorrect API key provided: ***"
        );
        assert_eq!(redact("no key", None), "no key");
    }
}
