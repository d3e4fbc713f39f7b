//! OpenAI Responses: the request, the whole response and the streamed events.

use serde::Deserialize;
use serde_json::{Value, json};

use super::sse::Streamed;
use super::{Answer, Request, SCHEMA_NAME};
use crate::backend::Usage;
use crate::backend::de::lenient;

/// A response: whole, or in the event that completes a stream.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Response {
    #[serde(deserialize_with = "lenient")]
    id: Option<String>,
    #[serde(deserialize_with = "lenient")]
    model: Option<String>,
    /// The answer's text, joined by the server (not every server sends it).
    #[serde(deserialize_with = "lenient")]
    output_text: Option<String>,
    #[serde(deserialize_with = "lenient")]
    output: Option<Vec<Item>>,
    /// `None` when the response carries no usage (not every server sends it).
    #[serde(deserialize_with = "lenient")]
    usage: Option<TokenUsage>,
}

/// An output item: a message (with text parts), a reasoning summary, a tool call...
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Item {
    #[serde(deserialize_with = "lenient")]
    content: Vec<Part>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Part {
    #[serde(rename = "type", deserialize_with = "lenient")]
    kind: Option<String>,
    #[serde(deserialize_with = "lenient")]
    text: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TokenUsage {
    #[serde(deserialize_with = "lenient")]
    input_tokens: u64,
    #[serde(deserialize_with = "lenient")]
    output_tokens: u64,
    #[serde(deserialize_with = "lenient")]
    input_tokens_details: InputDetails,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct InputDetails {
    #[serde(deserialize_with = "lenient")]
    cached_tokens: u64,
}

impl From<TokenUsage> for Usage {
    fn from(u: TokenUsage) -> Self {
        Usage {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            cached_tokens: u.input_tokens_details.cached_tokens,
            ..Usage::default()
        }
    }
}

impl Response {
    /// The answer: `output_text`, else the text parts of the output items; `None` when
    /// there is neither.
    fn text(&self) -> Option<String> {
        if let Some(text) = &self.output_text {
            return Some(text.clone());
        }
        let items = self.output.as_ref()?;
        Some(
            items
                .iter()
                .flat_map(|item| &item.content)
                .filter(|part| part.kind.as_deref() == Some("output_text"))
                .filter_map(|part| part.text.as_deref())
                .collect(),
        )
    }
}

/// An event of the stream. Others (`response.created`, `response.output_item.added`...)
/// are ignored; errors are read before ([`super::sse`]).
#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
enum Event {
    #[serde(rename = "response.output_text.delta")]
    TextDelta {
        #[serde(default, deserialize_with = "lenient")]
        delta: Option<String>,
    },
    #[serde(rename = "response.completed", alias = "response.incomplete")]
    Completed {
        #[serde(default, deserialize_with = "lenient")]
        response: Option<Response>,
    },
    #[serde(other)]
    Other,
}

/// The streamed request; `schema` goes in `text.format`.
pub(super) fn body(req: &Request<'_>, prompt: String, schema: Option<&Value>) -> Value {
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
                "strict": req.strict,
            },
        });
    }
    body
}

/// Reads a whole response.
pub(super) fn answer(raw: &str) -> serde_json::Result<Answer> {
    let response: Response = serde_json::from_str(raw)?;
    Ok(Answer {
        text: response.text(),
        usage: response
            .usage
            .map_or_else(Usage::unreported_call, Usage::from),
        id: response.id,
        model: response.model,
    })
}

/// Reads an event of the stream: the text deltas, then the completed response (its usage,
/// id and model, and its text should no delta have come).
pub(super) fn read_event(out: &mut Streamed, data: &str) {
    match serde_json::from_str::<Event>(data) {
        Ok(Event::TextDelta { delta: Some(text) }) => out.text.push_str(&text),
        Ok(Event::Completed { response }) => {
            if let Some(r) = response {
                if out.text.is_empty() {
                    out.text = r.text().unwrap_or_default();
                }
                if let Some(usage) = r.usage {
                    out.usage = Some(usage.into());
                }
                out.id = r.id;
                out.model = r.model;
            }
            out.done = true;
        }
        _ => {}
    }
}
