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

mod anthropic;
mod call;
mod openai;
mod responses;
mod sse;
mod status;

/// How long an HTTP server asks to wait before a retry (`retry-after-ms`, `Retry-After`): for
/// the notifiers too.
pub(crate) use status::retry_after;

use std::sync::Mutex;

use serde_json::Value;

use super::{AgentConfig, Backend, CallError, Usage, prompt_with_schema};
use crate::model::{AgentKind, OpenAiApi, StructuredOutput};

const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
const OPENAI_KEY_ENV: &str = "OPENAI_API_KEY";
const ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com/v1";
const ANTHROPIC_KEY_ENV: &str = "ANTHROPIC_API_KEY";
const ANTHROPIC_VERSION: &str = "2023-06-01";
/// Anthropic requires `max_tokens`; this is asked for when the agent and stage set none.
const ANTHROPIC_MAX_TOKENS: u64 = 8192;
/// The name given to the output schema in OpenAI requests.
const SCHEMA_NAME: &str = "output";
/// The largest response body read; a longer one is cut there and the call fails.
const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// Why an `openai` or `anthropic` agent cannot be set up, or called here.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("kind {0} is not an HTTP backend")]
    NotHttp(&'static str),
    #[error("base_url `{0}` is not an http(s) URL")]
    BaseUrl(String),
    #[error("cannot set up an HTTP client")]
    Client(#[source] reqwest::Error),
    #[error(
        "the API key variable `{0}` is not set; export it, or name another variable with \
         `api_key_env`"
    )]
    KeyNotSet(String),
}

/// Tells whether an `openai` or `anthropic` agent can be called: its settings are valid and
/// its key variable is set where one is needed.
pub fn preflight(config: &AgentConfig) -> Result<(), SetupError> {
    let (_, _, key) = settings(config)?;
    match key.resolve() {
        Err(_) => Err(SetupError::KeyNotSet(key.var)),
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
fn settings(config: &AgentConfig) -> Result<(Api, String, ApiKey), SetupError> {
    let (api, default_base_url, default_key_env) = match config.kind {
        AgentKind::OpenAi => {
            let api = match config.api {
                OpenAiApi::Chat => Api::Chat,
                OpenAiApi::Responses => Api::Responses,
            };
            (api, OPENAI_BASE_URL, OPENAI_KEY_ENV)
        }
        AgentKind::Anthropic => (Api::Messages, ANTHROPIC_BASE_URL, ANTHROPIC_KEY_ENV),
        other => return Err(SetupError::NotHttp(other.as_str())),
    };
    let base_url = config
        .base_url
        .as_deref()
        .unwrap_or(default_base_url)
        .trim_end_matches('/');
    match reqwest::Url::parse(base_url) {
        Ok(url) if matches!(url.scheme(), "http" | "https") => {}
        _ => return Err(SetupError::BaseUrl(base_url.to_owned())),
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
pub fn build(config: &AgentConfig) -> Result<Box<dyn Backend>, SetupError> {
    let (api, base_url, key) = settings(config)?;
    let client = reqwest::Client::builder()
        .build()
        .map_err(SetupError::Client)?;
    let mode = match (api, config.structured_output) {
        // The Messages API has no schema mode: `auto` leaves the prompt as written, and
        // the native modes fall back to writing the schema into the prompt.
        (Api::Messages, StructuredOutput::Auto | StructuredOutput::Off) => StructuredOutput::Off,
        (Api::Messages, _) => StructuredOutput::Prompt,
        (Api::Responses, StructuredOutput::JsonObject | StructuredOutput::GuidedJson) => {
            StructuredOutput::Prompt
        }
        (_, StructuredOutput::Auto) => config.resumed_mode.unwrap_or(StructuredOutput::JsonSchema),
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
        // OpenAI's own API gets the schema in strict mode, lowered to what strict mode
        // accepts; compatible servers get it as written, not strict.
        strict: api != Api::Messages && crate::model::is_openai_itself(Some(&base_url)),
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
            Api::Chat => openai::body(req, prompt, schema),
            Api::Responses => responses::body(req, prompt, schema),
            Api::Messages => anthropic::body(req, prompt),
        }
    }

    /// Reads a whole (not streamed) response; an error when it is not a JSON object (a
    /// data error when it is JSON of another kind).
    fn answer(self, raw: &str) -> serde_json::Result<Answer> {
        match self {
            Api::Chat => openai::answer(raw),
            Api::Responses => responses::answer(raw),
            Api::Messages => anthropic::answer(raw),
        }
    }

    /// Reads an event of a stream into what it said so far; an event that is not this
    /// API's is ignored.
    fn read_event(self, out: &mut sse::Streamed, data: &str) {
        match self {
            Api::Chat => openai::read_event(out, data),
            Api::Responses => responses::read_event(out, data),
            Api::Messages => anthropic::read_event(out, data),
        }
    }
}

/// What a whole (not streamed) response says; `text` is `None` when the answer is not
/// where the API puts it.
struct Answer {
    text: Option<String>,
    usage: Usage,
    id: Option<String>,
    model: Option<String>,
}

/// One request's settings.
struct Request<'a> {
    model: &'a str,
    prompt: &'a str,
    max_tokens: Option<u64>,
    completion_tokens: bool,
    schema: Option<&'a Value>,
    mode: StructuredOutput,
    /// Whether `json_schema` is sent with `strict: true` (then `schema` is lowered).
    strict: bool,
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
    /// Whether `json_schema` is sent in strict mode (OpenAI's own API), lowered to
    /// [`crate::dialect::Dialect::OpenAiStrict`].
    strict: bool,
    /// The structured-output mode in use: the configured one, or where `auto` stepped
    /// down to in this run.
    mode: Mutex<StructuredOutput>,
    client: reqwest::Client,
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
            strict: false,
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
}
