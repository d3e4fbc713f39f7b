//! Failed responses: the error a body reports, what the status means for the executor,
//! and the wait the server asks for; and the excerpts of bodies that messages quote.

use std::time::{Duration, SystemTime};

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde::Deserialize;

use super::HttpBackend;
use crate::backend::de::lenient;
use crate::backend::{CallError, error_chain};

/// How many characters of a body go into an error message.
const EXCERPT_CHARS: usize = 300;
/// How many characters of a partly received body go into a timeout's tail.
const TAIL_CHARS: usize = 2000;

/// The body of a failed response, as OpenAI, Anthropic and compatible servers write it.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ErrorResponse {
    #[serde(deserialize_with = "lenient")]
    error: Option<ErrorValue>,
    #[serde(deserialize_with = "lenient")]
    message: Option<String>,
    /// FastAPI's (vLLM, llama-cpp-python...), when it is a text.
    #[serde(deserialize_with = "lenient")]
    detail: Option<String>,
}

/// `error`: an object (OpenAI, Anthropic) or a text (some compatible servers).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ErrorValue {
    Text(String),
    Body(ErrorBody),
}

/// An error object: in a failed response's body, or in an event of a stream.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct ErrorBody {
    #[serde(deserialize_with = "lenient")]
    pub(super) message: Option<String>,
    #[serde(rename = "type", deserialize_with = "lenient")]
    pub(super) kind: Option<String>,
    #[serde(deserialize_with = "lenient")]
    pub(super) code: Option<String>,
}

impl HttpBackend {
    /// Classifies a failure to send the request or to receive the response headers.
    pub(super) fn send_error(&self, error: reqwest::Error) -> CallError {
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
    pub(super) fn status_error(
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
}

/// The error an API reports in a failed response's body.
pub(super) struct ApiError {
    pub(super) message: String,
    code: Option<String>,
    kind: Option<String>,
}

impl ApiError {
    /// Reads `error.message` (OpenAI, Anthropic), `error` as a string or `detail`
    /// (compatible servers); anything else is an excerpt of the body.
    pub(super) fn parse(body: &str) -> Self {
        let response: ErrorResponse = serde_json::from_str(body).unwrap_or_default();
        let (text, error) = match response.error {
            Some(ErrorValue::Text(text)) => (Some(text), ErrorBody::default()),
            Some(ErrorValue::Body(error)) => (None, error),
            None => (None, ErrorBody::default()),
        };
        let message = error
            .message
            .or(text)
            .or(response.message)
            .or(response.detail)
            .unwrap_or_else(|| excerpt(body));
        ApiError {
            message,
            code: error.code,
            kind: error.kind,
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
pub(crate) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
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

/// Returns a status with its reason (`529 Overloaded` for Anthropic's overload).
pub(super) fn status_text(status: StatusCode) -> String {
    match (status.canonical_reason(), status.as_u16()) {
        (Some(reason), code) => format!("{code} {reason}"),
        (None, 529) => "529 Overloaded".to_owned(),
        (None, code) => code.to_string(),
    }
}

/// Returns the start of a body, for a message.
pub(super) fn excerpt(body: &str) -> String {
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
pub(super) fn tail(received: &[u8]) -> String {
    let text = String::from_utf8_lossy(received);
    let skip = text.chars().count().saturating_sub(TAIL_CHARS);
    text.chars().skip(skip).collect()
}

/// Hides the key, should a server echo it in a message.
pub(super) fn redact(message: &str, key: Option<&str>) -> String {
    match key {
        Some(key) if !key.is_empty() => message.replace(key, "***"),
        _ => message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;

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
