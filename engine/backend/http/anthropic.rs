//! Anthropic Messages: the request, the whole response and the streamed events.

use serde::Deserialize;
use serde_json::{Value, json};

use super::sse::Streamed;
use super::{ANTHROPIC_MAX_TOKENS, Answer, Request};
use crate::backend::Usage;
use crate::backend::de::lenient;

/// A message: whole, or as the stream starts it.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Message {
    #[serde(deserialize_with = "lenient")]
    id: Option<String>,
    #[serde(deserialize_with = "lenient")]
    model: Option<String>,
    #[serde(deserialize_with = "lenient")]
    content: Option<Vec<Block>>,
    /// `None` when the message carries no usage (a compatible server may send none).
    #[serde(deserialize_with = "lenient")]
    usage: Option<TokenUsage>,
}

/// A content block: text, thinking, a tool use...
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Block {
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
    cache_read_input_tokens: u64,
}

impl From<TokenUsage> for Usage {
    fn from(u: TokenUsage) -> Self {
        Usage {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            cached_tokens: u.cache_read_input_tokens,
            ..Usage::default()
        }
    }
}

/// An event of the stream. Others (`content_block_start`, `ping`...) are ignored; errors
/// are read before ([`super::sse`]).
#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
enum Event {
    #[serde(rename = "message_start")]
    MessageStart {
        #[serde(default, deserialize_with = "lenient")]
        message: Option<Message>,
    },
    #[serde(rename = "content_block_delta")]
    ContentBlockDelta {
        #[serde(default, deserialize_with = "lenient")]
        delta: Block,
    },
    /// The final output count.
    #[serde(rename = "message_delta")]
    MessageDelta {
        #[serde(default, deserialize_with = "lenient")]
        usage: OutputCount,
    },
    #[serde(rename = "message_stop")]
    MessageStop,
    #[serde(other)]
    Other,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct OutputCount {
    #[serde(deserialize_with = "lenient")]
    output_tokens: Option<u64>,
}

/// The streamed request (`max_tokens` is required).
pub(super) fn body(req: &Request<'_>, prompt: String) -> Value {
    json!({
        "model": req.model,
        "max_tokens": req.max_tokens.unwrap_or(ANTHROPIC_MAX_TOKENS),
        "messages": [{"role": "user", "content": prompt}],
        "stream": true,
    })
}

/// Reads a whole response: its text blocks.
pub(super) fn answer(raw: &str) -> serde_json::Result<Answer> {
    let message: Message = serde_json::from_str(raw)?;
    Ok(Answer {
        text: message.content.map(|blocks| {
            blocks
                .into_iter()
                .filter(|block| block.kind.as_deref() == Some("text"))
                .filter_map(|block| block.text)
                .collect()
        }),
        usage: message
            .usage
            .map_or_else(Usage::unreported_call, Usage::from),
        id: message.id,
        model: message.model,
    })
}

/// Reads an event of the stream.
pub(super) fn read_event(out: &mut Streamed, data: &str) {
    match serde_json::from_str::<Event>(data) {
        Ok(Event::MessageStart {
            message: Some(message),
        }) => {
            out.id = message.id;
            out.model = message.model;
            if let Some(usage) = message.usage {
                out.usage = Some(usage.into());
            }
        }
        Ok(Event::ContentBlockDelta {
            delta: Block {
                text: Some(text), ..
            },
        }) => out.text.push_str(&text),
        Ok(Event::MessageDelta {
            usage: OutputCount {
                output_tokens: Some(n),
            },
        }) => out.usage.get_or_insert_with(Usage::default).output_tokens = n,
        Ok(Event::MessageStop) => out.done = true,
        _ => {}
    }
}
