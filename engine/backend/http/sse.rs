//! Server-sent event streams: the `data:` of each event, and the error an event reports.

use serde::Deserialize;
use serde::de::IgnoredAny;

use super::Api;
use super::status::{ErrorBody, excerpt};
use crate::backend::Usage;
use crate::backend::de::lenient;

/// What a stream said.
#[derive(Debug, Default)]
pub(super) struct Streamed {
    pub(super) text: String,
    /// The usage, if an event carried one: `None` tells a stream that said nothing of usage
    /// (llama-cpp-python's, which ignores `stream_options.include_usage`) from one that
    /// reported 0.
    pub(super) usage: Option<Usage>,
    pub(super) id: Option<String>,
    pub(super) model: Option<String>,
    /// The stream said it was complete (`[DONE]`, a finish reason, `message_stop`...).
    pub(super) done: bool,
}

/// The error an event of the stream reported.
#[derive(Debug, thiserror::Error)]
#[error("{message}{}", kind.as_ref().map(|k| format!(" ({k})")).unwrap_or_default())]
pub(super) struct StreamError {
    message: String,
    /// The error's type or code.
    kind: Option<String>,
}

/// Reads a server-sent event stream: the text, the usage, the id and the model, or the
/// error an `error` event carries.
pub(super) fn read_stream(api: Api, raw: &str) -> Result<Streamed, StreamError> {
    let mut out = Streamed::default();
    for data in sse_data(raw) {
        if data == "[DONE]" {
            out.done = true;
            continue;
        }
        if let Some(error) = failure(data) {
            return Err(error);
        }
        api.read_event(&mut out, data);
    }
    Ok(out)
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

/// What an event of any API says about a failure: an `error` or `response.failed` event
/// (OpenAI, Anthropic), or an `error` field in a chunk (compatible servers).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Failure {
    #[serde(rename = "type", deserialize_with = "lenient")]
    kind: Option<String>,
    error: Option<ErrorField>,
    /// The failed response of `response.failed`, with its error.
    #[serde(deserialize_with = "lenient")]
    response: Option<FailedResponse>,
    #[serde(deserialize_with = "lenient")]
    message: Option<String>,
}

/// An `error` that is not `null`: an object with a message, or anything else.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ErrorField {
    Body(ErrorBody),
    Other(IgnoredAny),
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct FailedResponse {
    #[serde(deserialize_with = "lenient")]
    error: Option<ErrorBody>,
}

/// The error an event reports, if it reports one. `data` that is not a JSON object is no
/// error (and no event).
fn failure(data: &str) -> Option<StreamError> {
    let event: Failure = serde_json::from_str(data).ok()?;
    let failed = matches!(event.kind.as_deref(), Some("error" | "response.failed"));
    if !failed && event.error.is_none() {
        return None;
    }
    let body = match event.error {
        Some(ErrorField::Body(body)) => body,
        _ => ErrorBody::default(),
    };
    let message = body
        .message
        .or_else(|| event.response.and_then(|r| r.error)?.message)
        .or(event.message)
        .unwrap_or_else(|| excerpt(data));
    Some(StreamError {
        message,
        kind: body.kind.or(body.code),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_events_of_each_shape_are_read() {
        let error = |data: &str| failure(data).map(|e| e.to_string());
        assert_eq!(
            error(r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#)
                .as_deref(),
            Some("Overloaded (overloaded_error)")
        );
        assert_eq!(
            error(
                r#"{"type":"response.failed","response":{"error":{"code":"server_error","message":"boom"}}}"#
            )
            .as_deref(),
            Some("boom")
        );
        assert_eq!(
            error(r#"{"error":"bad things"}"#).as_deref(),
            Some(r#"{"error":"bad things"}"#)
        );
        assert_eq!(
            error(r#"{"type":"error","message":"stopped","code":7}"#).as_deref(),
            Some("stopped")
        );
        assert_eq!(error(r#"{"error":null,"choices":[]}"#), None);
        assert_eq!(error(r#"{"type":"message_start"}"#), None);
        assert_eq!(error("not json"), None);
    }

    #[test]
    fn unknown_events_are_skipped() {
        let raw = "event: ping\ndata: {\"type\":\"ping\"}\n\n\
                   data: {\"type\":\"some_new_event\",\"x\":[1]}\n\n\
                   data: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n\
                   data: {\"type\":\"message_stop\"}\n\n";
        let out = read_stream(Api::Messages, raw).expect("no error");
        assert_eq!(out.text, "Hi");
        assert!(out.done);
    }
}
