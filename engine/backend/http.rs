//! Backends for HTTP APIs: `openai` (Chat Completions or Responses, and any compatible server
//! through `base_url`: vLLM, llama.cpp, Ollama, LiteLLM...) and `anthropic` (Messages).
//!
//! Each call is one request with the prompt as the single user message, and no streaming.
//!
//! - **Keys** are read from the environment at call time, from the variable `api_key_env`
//!   names (default `OPENAI_API_KEY` or `ANTHROPIC_API_KEY`). A variable named explicitly must
//!   be set, and so must the default one for the default `base_url`; without either the call
//!   is [`CallError::Missing`]. A custom `base_url` without `api_key_env` is called without a
//!   key when the default variable is unset (local servers need none). Keys are never logged,
//!   written or put in a message.
//! - **Timeouts**: `timeout` bounds the whole request, from sending to the last byte of the
//!   body. Since the reply is not streamed, `idle_timeout` bounds the wait for the response
//!   headers (which most servers send only once the model has finished) and then every stall
//!   while the body is read.
//! - **Artifacts**: the request body goes to `request.json` and the response body to
//!   `response.json` in the call's directory.
//! - **Errors**: 429 is [`CallError::RateLimited`] (OpenAI's `insufficient_quota` too); 408,
//!   409, 5xx (Anthropic's 529 "overloaded" among them), connection failures and a 200 whose
//!   body cannot be read are [`CallError::Transient`]; 401/403 and other 4xx are
//!   [`CallError::Failed`]. `Retry-After` (seconds or an HTTP date) and `retry-after-ms` are
//!   passed on.

use std::future::Future;
use std::path::Path;
use std::time::{Duration, SystemTime};

use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::{
    AgentCall, AgentConfig, AgentReply, Backend, CallError, CallFuture, Capabilities, Usage,
};
use crate::model::AgentKind;

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

/// Builds an `openai` or `anthropic` backend. Fails on an unknown `api` or a `base_url` that
/// is not an http(s) URL.
pub fn build(config: &AgentConfig) -> Result<Box<dyn Backend>, String> {
    let name = &config.name;
    let (api, default_base_url, default_key_env) = match config.kind {
        AgentKind::OpenAi => {
            let api = match config.api.as_deref() {
                None | Some("chat") => Api::Chat,
                Some("responses") => Api::Responses,
                Some(other) => {
                    return Err(format!(
                        "agent `{name}`: unknown api `{other}` (expected `chat` or `responses`)"
                    ));
                }
            };
            (api, OPENAI_BASE_URL, OPENAI_KEY_ENV)
        }
        AgentKind::Anthropic => (Api::Messages, ANTHROPIC_BASE_URL, ANTHROPIC_KEY_ENV),
        other => {
            return Err(format!(
                "agent `{name}`: kind {} is not an HTTP backend",
                other.as_str()
            ));
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
            return Err(format!(
                "agent `{name}`: base_url `{base_url}` is not an http(s) URL"
            ));
        }
    }
    let key = ApiKey {
        var: config
            .api_key_env
            .clone()
            .unwrap_or_else(|| default_key_env.to_owned()),
        required: config.api_key_env.is_some() || base_url == default_base_url,
    };
    let client = reqwest::Client::builder()
        .build()
        .map_err(|e| format!("agent `{name}`: cannot set up an HTTP client: {e}"))?;
    Ok(Box::new(HttpBackend {
        agent: name.clone(),
        api,
        url: format!("{base_url}{}", api.path()),
        key,
        model: config.model.clone(),
        max_tokens: config.max_tokens,
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

    /// Builds the request body. The schema is sent only to the OpenAI APIs.
    fn request_body(
        self,
        model: &str,
        prompt: &str,
        max_tokens: Option<u64>,
        schema: Option<&Value>,
    ) -> Value {
        match self {
            Api::Chat => {
                let mut body = json!({
                    "model": model,
                    "messages": [{"role": "user", "content": prompt}],
                });
                if let Some(n) = max_tokens {
                    body["max_tokens"] = n.into();
                }
                if let Some(schema) = schema {
                    body["response_format"] = json!({
                        "type": "json_schema",
                        "json_schema": {"name": SCHEMA_NAME, "schema": schema, "strict": false},
                    });
                }
                body
            }
            Api::Responses => {
                let mut body = json!({"model": model, "input": prompt});
                if let Some(n) = max_tokens {
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
                "model": model,
                "max_tokens": max_tokens.unwrap_or(ANTHROPIC_MAX_TOKENS),
                "messages": [{"role": "user", "content": prompt}],
            }),
        }
    }

    /// Finds the answer's text in a successful response, or `None` when it is not where
    /// this API puts it.
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

    /// Reads the token counts of a successful response (zero where absent).
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
    fn resolve(&self, agent: &str) -> Result<Option<String>, CallError> {
        match std::env::var(&self.var) {
            Ok(key) if !key.is_empty() => Ok(Some(key)),
            _ if self.required => Err(CallError::Missing {
                message: format!(
                    "agent `{agent}`: the API key variable `{}` is not set",
                    self.var
                ),
            }),
            _ => Ok(None),
        }
    }
}

/// A backend for one HTTP API, with its client (and so its connections) kept across calls.
struct HttpBackend {
    agent: String,
    api: Api,
    /// The endpoint: the base URL and the API's path.
    url: String,
    key: ApiKey,
    model: Option<String>,
    max_tokens: Option<u64>,
    client: reqwest::Client,
}

impl Backend for HttpBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            json_schema: self.api != Api::Messages,
            cost: false,
            usage: true,
        }
    }

    fn call<'a>(&'a self, call: &'a AgentCall) -> CallFuture<'a> {
        Box::pin(self.run(call))
    }
}

impl HttpBackend {
    /// Makes one call: builds and records the request, sends it within the call's time
    /// limits, records the response and classifies it.
    async fn run(&self, call: &AgentCall) -> Result<AgentReply, CallError> {
        let model = call
            .model
            .as_deref()
            .or(self.model.as_deref())
            .ok_or_else(|| CallError::Failed {
                message: format!(
                    "agent `{}`: kind {} needs a `model` (on the agent or the stage)",
                    self.agent,
                    self.api.kind()
                ),
            })?;
        let key = self.key.resolve(&self.agent)?;
        let body = self.api.request_body(
            model,
            &call.prompt,
            call.max_tokens.or(self.max_tokens),
            call.schema.as_ref(),
        );
        write_artifact(&call.dir.join("request.json"), format!("{body:#}")).await;
        let request = self.request(key.as_deref(), &body)?;

        let limits = Limits::start(call.timeout, call.idle_timeout);
        tracing::debug!(agent = %self.agent, url = %self.url, "sending request");
        let mut response = limits
            .bound(request.send(), &[])
            .await?
            .map_err(|e| self.send_error(e))?;
        let status = response.status();
        tracing::debug!(agent = %self.agent, url = %self.url, %status, "response headers");
        let retry_after = retry_after(response.headers(), SystemTime::now());
        let mut received = Vec::new();
        while let Some(chunk) = limits
            .bound(response.chunk(), &received)
            .await?
            .map_err(|e| CallError::Transient {
                message: format!(
                    "agent `{}`: the connection to {} dropped while reading the response: {}",
                    self.agent,
                    self.url,
                    error_chain(&e.without_url())
                ),
                retry_after: None,
            })?
        {
            received.extend_from_slice(&chunk);
        }
        let raw = String::from_utf8_lossy(&received).into_owned();
        write_artifact(&call.dir.join("response.json"), raw.clone()).await;

        if !status.is_success() {
            return Err(self.status_error(status, retry_after, &raw, key.as_deref()));
        }
        self.reply(raw, model)
    }

    /// Builds the request with its headers. The key's header value is marked sensitive so
    /// that it never shows in debug output.
    fn request(
        &self,
        key: Option<&str>,
        body: &Value,
    ) -> Result<reqwest::RequestBuilder, CallError> {
        let mut request = self.client.post(&self.url).json(body);
        if let Some(key) = key {
            let (name, value) = match self.api {
                Api::Chat | Api::Responses => ("authorization", format!("Bearer {key}")),
                Api::Messages => ("x-api-key", key.to_owned()),
            };
            let mut value = HeaderValue::from_str(&value).map_err(|_| CallError::Failed {
                message: format!(
                    "agent `{}`: the API key in `{}` is not a valid HTTP header value",
                    self.agent, self.key.var
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
            "agent `{}`: POST {} failed: {}",
            self.agent,
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
        let prefix = format!(
            "agent `{}`: HTTP {} from {}",
            self.agent,
            status_text(status),
            self.url
        );
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

    /// Reads the reply out of a successful response; a body that is not what the API sends
    /// is transient (a proxy's page, a truncated body).
    fn reply(&self, raw: String, model: &str) -> Result<AgentReply, CallError> {
        let unreadable = |why: &str| CallError::Transient {
            message: format!(
                "agent `{}`: the response from {} {why}: {}",
                self.agent,
                self.url,
                excerpt(&raw)
            ),
            retry_after: None,
        };
        let response: Value =
            serde_json::from_str(&raw).map_err(|e| unreadable(&format!("is not JSON ({e})")))?;
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
        Ok(AgentReply {
            text,
            usage: self.api.usage(&response),
            session_id: field("id"),
            model: field("model").or_else(|| Some(model.to_owned())),
            raw,
            denied: Vec::new(),
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
