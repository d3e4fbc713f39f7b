//! OpenAI Chat Completions, and the servers that speak it: the request, the whole response
//! and the streamed chunks.

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::{Value, json};

use super::sse::Streamed;
use super::{Answer, Request, SCHEMA_NAME};
use crate::backend::Usage;
use crate::backend::de::lenient;
use crate::model::StructuredOutput;

/// A completion, or one chunk of a streamed one.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Completion {
    #[serde(deserialize_with = "lenient")]
    id: Option<String>,
    #[serde(deserialize_with = "lenient")]
    model: Option<String>,
    #[serde(deserialize_with = "lenient")]
    choices: Vec<Choice>,
    /// In a stream, on the last chunk (`stream_options.include_usage`).
    #[serde(deserialize_with = "lenient")]
    usage: Option<TokenUsage>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Choice {
    /// The answer, in a whole response.
    #[serde(deserialize_with = "lenient")]
    message: Content,
    /// The next part of the answer, in a chunk.
    #[serde(deserialize_with = "lenient")]
    delta: Content,
    /// Set (to any value) on the chunk that ends the answer.
    finish_reason: Option<IgnoredAny>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Content {
    #[serde(deserialize_with = "lenient")]
    content: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TokenUsage {
    #[serde(deserialize_with = "lenient")]
    prompt_tokens: u64,
    #[serde(deserialize_with = "lenient")]
    completion_tokens: u64,
    #[serde(deserialize_with = "lenient")]
    prompt_tokens_details: PromptDetails,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PromptDetails {
    #[serde(deserialize_with = "lenient")]
    cached_tokens: u64,
}

impl From<TokenUsage> for Usage {
    fn from(u: TokenUsage) -> Self {
        Usage {
            input_tokens: u.prompt_tokens,
            output_tokens: u.completion_tokens,
            cached_tokens: u.prompt_tokens_details.cached_tokens,
            ..Usage::default()
        }
    }
}

/// The streamed request; `schema` goes in the structured-output mode of `req`.
pub(super) fn body(req: &Request<'_>, prompt: String, schema: Option<&Value>) -> Value {
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
                "json_schema": {"name": SCHEMA_NAME, "schema": schema, "strict": req.strict},
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

/// Reads a whole response: the first choice's message.
pub(super) fn answer(raw: &str) -> serde_json::Result<Answer> {
    let completion: Completion = serde_json::from_str(raw)?;
    Ok(Answer {
        text: completion
            .choices
            .into_iter()
            .next()
            .and_then(|c| c.message.content),
        // A completion without a `usage` object reported none: not 0 tokens.
        usage: completion
            .usage
            .map_or_else(Usage::unreported_call, Usage::from),
        id: completion.id,
        model: completion.model,
    })
}

/// Reads a chunk of the stream: the first choice's delta, and the usage when it comes.
pub(super) fn read_event(out: &mut Streamed, data: &str) {
    let Ok(chunk) = serde_json::from_str::<Completion>(data) else {
        return;
    };
    out.id = out.id.take().or(chunk.id);
    out.model = out.model.take().or(chunk.model);
    if let Some(choice) = chunk.choices.first() {
        if let Some(text) = &choice.delta.content {
            out.text.push_str(text);
        }
        if choice.finish_reason.is_some() {
            out.done = true;
        }
    }
    if let Some(usage) = chunk.usage {
        out.usage = Some(usage.into());
    }
}
