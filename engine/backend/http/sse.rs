//! Server-sent event streams, read as they arrive: the `data` of each event, and the error
//! an event reports.
//!
//! The framing follows the WHATWG rules for interpreting an event stream
//! (<https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation>):
//! lines end in CRLF, LF or CR (a chunk may end between the two of a CRLF); one byte
//! order mark at the start is skipped; a line that starts with `:` is a comment; a line
//! without a colon is a field with an empty value; one space after the colon is not part of
//! the value; the `data` lines of an event are joined with LF; an empty line dispatches
//! the event, unless its data is empty; an `id` that contains NUL is ignored, and so is a
//! `retry` that is not all digits; an event the stream ends in is discarded. Invalid UTF-8
//! becomes U+FFFD, as the spec's UTF-8 decode does.
//!
//! The parser is written here, not taken from a crate (ARCHITECTURE.md, Dependencies).

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

/// Reads a server-sent event stream as it arrives: the text, the usage, the id and the
/// model, or the error the first `error` event carries (the events after it are not read).
#[derive(Debug)]
pub(super) struct StreamReader {
    api: Api,
    events: EventParser,
    out: Streamed,
    error: Option<StreamError>,
    /// What the body is, once its first significant byte came: a JSON body (a server
    /// that does not stream) is not parsed as events, nor copied into the parser's line.
    body: Body,
}

/// What a response body is, from its first byte past a BOM and whitespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Body {
    /// Only a BOM and whitespace so far.
    Undecided,
    /// `{` or `[`: JSON, which [`looks_like_stream`] will not take for a stream either.
    Json,
    Events,
}

impl StreamReader {
    pub(super) fn new(api: Api) -> Self {
        StreamReader {
            api,
            events: EventParser::default(),
            out: Streamed::default(),
            error: None,
            body: Body::Undecided,
        }
    }

    /// Reads the next bytes of the stream, in whatever pieces they came.
    pub(super) fn feed(&mut self, chunk: &[u8]) {
        if self.body == Body::Undecided {
            // The BOM's bytes (EF BB BF) and whitespace, in any pieces, decide nothing.
            let first = chunk
                .iter()
                .find(|b| !b.is_ascii_whitespace() && ![0xEF, 0xBB, 0xBF].contains(*b));
            self.body = match first {
                None => Body::Undecided,
                Some(b'{' | b'[') => Body::Json,
                Some(_) => Body::Events,
            };
        }
        if self.body == Body::Json {
            return;
        }
        let StreamReader {
            api,
            events,
            out,
            error,
            body: _,
        } = self;
        events.feed(chunk, |event| {
            tracing::trace!(event = event.kind, id = event.id, "stream event");
            if error.is_some() {
                return;
            }
            // The sentinel of OpenAI's chat completions; spaces around it are forgiven.
            if event.data.trim() == "[DONE]" {
                out.done = true;
            } else if let Some(failure) = failure(event.data) {
                *error = Some(failure);
            } else {
                api.read_event(out, event.data);
            }
        });
    }

    /// What the stream said, once it has ended; an event it ended in is not read.
    pub(super) fn finish(self) -> Result<Streamed, StreamError> {
        match self.error {
            Some(error) => Err(error),
            None => Ok(self.out),
        }
    }
}

/// An event of a stream, as it is dispatched.
#[derive(Debug)]
struct Event<'a> {
    /// The event type: the last `event` field's value, `message` when there was none.
    kind: &'a str,
    /// The `data` fields' values joined with LF.
    data: &'a str,
    /// The last event ID: the last `id` field's value so far in the stream.
    id: &'a str,
}

/// An incremental parser of an event stream (the WHATWG rules in the module's doc): it
/// takes the bytes in any pieces and dispatches each event as its empty line arrives.
#[derive(Debug, Default)]
struct EventParser {
    /// The bytes of the line not ended yet.
    line: Vec<u8>,
    /// The last piece ended in a CR: an LF that starts the next one ends no line.
    after_cr: bool,
    /// A line has ended (the byte order mark is looked for in the first one only).
    started: bool,
    /// The event type buffer.
    kind: String,
    /// The data buffer.
    data: String,
    /// The last event ID buffer.
    id: String,
}

impl EventParser {
    /// Reads the next bytes; `dispatch` is called with each event they complete.
    fn feed(&mut self, mut bytes: &[u8], mut dispatch: impl FnMut(Event<'_>)) {
        if self.after_cr && !bytes.is_empty() {
            self.after_cr = false;
            if let Some(rest) = bytes.strip_prefix(b"\n") {
                bytes = rest;
            }
        }
        while let Some(end) = bytes.iter().position(|&b| b == b'\n' || b == b'\r') {
            let mut next = end + 1;
            if bytes[end] == b'\r' {
                match bytes.get(next) {
                    Some(b'\n') => next += 1,
                    None => self.after_cr = true,
                    Some(_) => {}
                }
            }
            if self.line.is_empty() {
                self.line_ended(&bytes[..end], &mut dispatch);
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(&bytes[..end]);
                self.line_ended(&line, &mut dispatch);
                line.clear();
                self.line = line;
            }
            bytes = &bytes[next..];
        }
        self.line.extend_from_slice(bytes);
    }

    /// Interprets one line, without its end.
    fn line_ended(&mut self, mut line: &[u8], dispatch: &mut impl FnMut(Event<'_>)) {
        if !self.started {
            self.started = true;
            line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
        }
        let line = String::from_utf8_lossy(line);
        if line.is_empty() {
            self.dispatch(dispatch);
            return;
        }
        let (name, value) = match line.split_once(':') {
            Some(("", _)) => return,
            Some((name, value)) => (name, value.strip_prefix(' ').unwrap_or(value)),
            None => (line.as_ref(), ""),
        };
        match name {
            "event" => value.clone_into(&mut self.kind),
            "data" => {
                self.data.push_str(value);
                self.data.push('\n');
            }
            "id" if !value.contains('\0') => value.clone_into(&mut self.id),
            "retry" => {
                // The reconnection time; this client does not reconnect (a dropped stream
                // is a transient error the stage's retry policy answers).
                if let Some(ms) = retry(value) {
                    tracing::trace!(retry_ms = ms, "the stream set a reconnection time");
                }
            }
            _ => {}
        }
    }

    /// Dispatches the event the buffers hold, unless its data is empty, and empties them
    /// (the last event ID stays).
    fn dispatch(&mut self, dispatch: &mut impl FnMut(Event<'_>)) {
        if !self.data.is_empty() {
            let data = self.data.strip_suffix('\n').unwrap_or(&self.data);
            let kind = if self.kind.is_empty() {
                "message"
            } else {
                &self.kind
            };
            dispatch(Event {
                kind,
                data,
                id: &self.id,
            });
        }
        self.data.clear();
        self.kind.clear();
    }
}

/// Whether a body that is not JSON is an event stream: after a byte order mark and
/// blank space, it starts with a field the API streams send, or with a comment (the
/// keep-alive some servers send first).
pub(super) fn looks_like_stream(raw: &str) -> bool {
    let start = raw.strip_prefix('\u{feff}').unwrap_or(raw).trim_start();
    ["data:", "event:", "id:", "retry:", ":"]
        .iter()
        .any(|field| start.starts_with(field))
}

/// A `retry` field's value, in milliseconds: only ASCII digits (a number too large for
/// 64 bits is ignored too).
fn retry(value: &str) -> Option<u64> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
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

    /// The events a stream's bytes make, given in these pieces: (type, data, last id).
    fn events(pieces: &[&[u8]]) -> Vec<(String, String, String)> {
        let mut parser = EventParser::default();
        let mut out = Vec::new();
        for piece in pieces {
            parser.feed(piece, |e| {
                out.push((e.kind.to_owned(), e.data.to_owned(), e.id.to_owned()));
            });
        }
        out
    }

    /// The data of the events a whole stream makes.
    fn data(stream: &str) -> Vec<String> {
        events(&[stream.as_bytes()])
            .into_iter()
            .map(|(_, data, _)| data)
            .collect()
    }

    /// The same events whatever the pieces: cut at every byte, and one byte at a time.
    fn same_in_any_pieces(stream: &[u8]) -> Vec<(String, String, String)> {
        let whole = events(&[stream]);
        for cut in 0..=stream.len() {
            let (a, b) = stream.split_at(cut);
            assert_eq!(events(&[a, b]), whole, "cut at byte {cut} of {stream:?}");
        }
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(events(&bytes), whole, "one byte at a time: {stream:?}");
        whole
    }

    #[test]
    fn lines_end_in_crlf_lf_or_cr() {
        for stream in [
            "data: a\ndata: b\n\ndata: c\n\n",
            "data: a\r\ndata: b\r\n\r\ndata: c\r\n\r\n",
            "data: a\rdata: b\r\rdata: c\r\r",
            "data: a\r\ndata: b\r\rdata: c\n\r\n",
        ] {
            assert_eq!(data(stream), ["a\nb", "c"], "{stream:?}");
        }
    }

    #[test]
    fn pieces_may_end_anywhere_even_between_cr_and_lf() {
        let stream = "\u{feff}event: add\r\ndata: fi\u{e9}rst \r\ndata:  second\r\n\r\n\
                      : comment\rid: 7\rdata: \u{1f600}\r\r\
                      data: third\n\ndata: cut";
        let whole = same_in_any_pieces(stream.as_bytes());
        assert_eq!(
            whole,
            [
                ("add".into(), "fi\u{e9}rst \n second".into(), String::new()),
                ("message".into(), "\u{1f600}".into(), "7".into()),
                ("message".into(), "third".into(), "7".into()),
            ]
        );
        // A CR that ends a piece, then an LF: one line end, not an empty line between.
        assert_eq!(
            events(&[b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]),
            [("message".into(), "a\nb".into(), String::new())]
        );
    }

    #[test]
    fn one_space_after_the_colon_is_stripped_and_no_more() {
        assert_eq!(data("data:x\n\n"), ["x"]);
        assert_eq!(data("data: x\n\n"), ["x"]);
        assert_eq!(data("data:  two spaces  \n\n"), [" two spaces  "]);
        assert_eq!(data("data:\tx\t\n\n"), ["\tx\t"]);
        assert_eq!(data("data: a: b\n\n"), ["a: b"]);
        assert_eq!(data("data: \n\n"), [""]);
    }

    #[test]
    fn a_field_without_a_colon_has_an_empty_value() {
        assert_eq!(data("data\n\n"), [""]);
        assert_eq!(data("data\ndata\n\n"), ["\n"]);
        assert_eq!(
            events(&[b"data: x\nevent\n\n"]),
            [("message".into(), "x".into(), String::new())]
        );
    }

    #[test]
    fn comments_and_unknown_fields_are_ignored() {
        assert_eq!(data(": hi\ndata: a\n:\nfoo: b\nData: c\n\n"), ["a"]);
    }

    #[test]
    fn an_event_without_data_is_not_dispatched_and_its_type_is_dropped() {
        assert_eq!(data("event: ping\n\n\n\n"), Vec::<String>::new());
        assert_eq!(data("data:\n\n"), [""]);
        assert_eq!(
            events(&[b"event: ping\n\ndata: x\n\n"]),
            [("message".into(), "x".into(), String::new())]
        );
    }

    #[test]
    fn the_last_event_id_stays_and_an_id_with_nul_is_ignored() {
        assert_eq!(
            events(&[b"id: 1\ndata: a\n\ndata: b\n\nid: 2\0\ndata: c\n\nid\ndata: d\n\n"]),
            [
                ("message".into(), "a".into(), "1".into()),
                ("message".into(), "b".into(), "1".into()),
                ("message".into(), "c".into(), "1".into()),
                ("message".into(), "d".into(), String::new()),
            ]
        );
    }

    #[test]
    fn retry_takes_ascii_digits_only() {
        assert_eq!(retry("1500"), Some(1500));
        assert_eq!(retry("0"), Some(0));
        for bad in [
            "",
            " 1",
            "1 ",
            "+1",
            "-1",
            "1.5",
            "1e3",
            "\u{661}",
            "99999999999999999999",
        ] {
            assert_eq!(retry(bad), None, "{bad:?}");
        }
        // A retry field is no data.
        assert_eq!(data("retry: 10\n\n"), Vec::<String>::new());
    }

    #[test]
    fn one_byte_order_mark_at_the_start_is_skipped() {
        let bom = "\u{feff}";
        assert_eq!(data(&format!("{bom}data: x\n\n")), ["x"]);
        assert_eq!(data(&format!("{bom}\ndata: x\n\n")), ["x"]);
        // A second one is part of the field's name, and one later is part of a value.
        assert_eq!(
            data(&format!("{bom}{bom}data: x\n\n")),
            Vec::<String>::new()
        );
        assert_eq!(data(&format!("data: {bom}x\n\n")), [format!("{bom}x")]);
        same_in_any_pieces(format!("{bom}data: x\n\n").as_bytes());
    }

    #[test]
    fn an_event_the_stream_ends_in_is_discarded() {
        assert_eq!(data("data: a\n\ndata: b\n"), ["a"]);
        assert_eq!(data("data: a\n\ndata: b"), ["a"]);
        assert_eq!(data("data: a\n\ndata: b\r"), ["a"]);
    }

    #[test]
    fn invalid_utf8_becomes_replacement_characters() {
        assert_eq!(
            events(&[b"data: a\xff", b"\xe2\x82\n", b"\n"]),
            [("message".into(), "a\u{fffd}\u{fffd}".into(), String::new())]
        );
    }

    #[test]
    fn a_body_is_a_stream_when_it_starts_with_a_field_or_a_comment() {
        for body in [
            "data: {}",
            "\n\r\nevent: x",
            "\u{feff}data: x",
            ": OPENROUTER PROCESSING\n\n",
            "id: 1",
            "retry: 1",
        ] {
            assert!(looks_like_stream(body), "{body:?}");
        }
        for body in ["{\"a\":1}", "<html>", "Bad Gateway", ""] {
            assert!(!looks_like_stream(body), "{body:?}");
        }
    }

    /// What a reader makes of a stream given in these pieces.
    fn read(api: Api, pieces: &[&[u8]]) -> Result<Streamed, StreamError> {
        let mut reader = StreamReader::new(api);
        for piece in pieces {
            reader.feed(piece);
        }
        reader.finish()
    }

    #[test]
    fn a_json_body_is_not_copied_into_the_event_parser() {
        let mut reader = StreamReader::new(Api::Chat);
        for piece in [
            "\u{feff}",
            "\n  ",
            "{\"choices\": [",
            "{\"text\": \"no newline at all\"}]}",
        ] {
            reader.feed(piece.as_bytes());
        }
        assert_eq!(reader.body, Body::Json);
        // Only the lead before the first `{` reached the parser.
        assert!(
            reader.events.line.iter().all(u8::is_ascii_whitespace),
            "{:?}",
            reader.events.line
        );
        // A stream after the same lead is read as one.
        let out =
            read(Api::Chat, &[b"\xEF\xBB", b"\xBF\n", b"data: [DONE]\n\n"]).expect("no error");
        assert!(out.done);
    }

    #[test]
    fn unknown_events_are_skipped() {
        let raw = "event: ping\ndata: {\"type\":\"ping\"}\n\n\
                   data: {\"type\":\"some_new_event\",\"x\":[1]}\n\n\
                   data: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n\
                   data: {\"type\":\"message_stop\"}\n\n";
        let out = read(Api::Messages, &[raw.as_bytes()]).expect("no error");
        assert_eq!(out.text, "Hi");
        assert!(out.done);
    }

    #[test]
    fn a_stream_in_cr_lines_and_odd_pieces_is_read_whole() {
        let raw = "event: content_block_delta\rdata: {\"type\":\"content_block_delta\",\r\
                   data: \"delta\":{\"type\":\"text_delta\",\"text\":\" Hi  \"}}\r\r\
                   event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n";
        let (a, b) = raw
            .as_bytes()
            .split_at(raw.find(" Hi").expect("in the stream") + 2);
        let out = read(Api::Messages, &[a, b]).expect("no error");
        assert_eq!(out.text, " Hi  ");
        assert!(out.done);
    }

    #[test]
    fn the_first_error_event_is_the_answer_and_a_cut_event_is_not_read() {
        let raw = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n\
                   data: {\"type\":\"error\",\"error\":{\"message\":\"first\"}}\n\n\
                   data: {\"type\":\"error\",\"error\":{\"message\":\"second\"}}\n\n";
        let error = read(Api::Chat, &[raw.as_bytes()]).expect_err("an error event");
        assert_eq!(error.to_string(), "first");
        // `[DONE]` without the empty line that ends its event: the stream is not complete.
        let cut = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n";
        let out = read(Api::Chat, &[cut.as_bytes()]).expect("no error");
        assert_eq!(out.text, "a");
        assert!(!out.done);
    }
}
