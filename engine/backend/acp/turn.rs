//! One prompt turn as the agent reports it (`session/update`): the answer's text, the tool
//! calls and the plan as [`Activity`], the usage, and `transcript.md`, the turn for people
//! and the monitor (messages, thoughts, tool calls with their status and output,
//! permissions with their decisions, files written).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use agent_client_protocol_schema::v1::{
    ContentBlock, SessionUpdate, ToolCallContent, ToolCallStatus,
};
use serde_json::Value;

use super::client::ToolSeen;
use crate::backend::{Activity, Usage, Watch};

/// The most characters of a tool call's output the transcript keeps.
const OUTPUT_CHARS: usize = 2000;

/// What streams in as text, merged until something else comes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Streaming {
    Message,
    Thought,
}

/// The turn so far.
pub(super) struct Turn {
    /// The text of every message of the agent's.
    all: String,
    /// The text since the last tool call or plan: the final answer.
    last: String,
    streaming: Option<(Streaming, String)>,
    pub(super) tools: HashMap<String, ToolSeen>,
    watch: Option<Watch>,
    md: Option<std::fs::File>,
    md_path: PathBuf,
    /// The cost the agent reported last (`usage_update`), in US dollars.
    pub(super) cost_usd: Option<f64>,
    /// The model the agent said it used.
    pub(super) model: Option<String>,
    /// Usage reported in a message's `_meta` (qwen): added up.
    meta_usage: Option<Usage>,
}

impl Turn {
    pub(super) fn new(md_path: &Path, watch: Option<Watch>) -> Turn {
        let md = std::fs::File::create(md_path)
            .map_err(|e| tracing::warn!("cannot write {}: {e}", md_path.display()))
            .ok();
        Turn {
            all: String::new(),
            last: String::new(),
            streaming: None,
            tools: HashMap::new(),
            watch,
            md,
            md_path: md_path.to_path_buf(),
            cost_usd: None,
            model: None,
            meta_usage: None,
        }
    }

    /// The answer of the turn: the agent's last message (what it said after its last tool
    /// call), else all it said.
    pub(super) fn answer(&self) -> String {
        if self.last.trim().is_empty() {
            self.all.trim().to_string()
        } else {
            self.last.trim().to_string()
        }
    }

    /// Usage reported in the messages' `_meta`, if any was.
    pub(super) fn meta_usage(&self) -> Option<Usage> {
        self.meta_usage.clone()
    }

    /// Reports an activity to whoever watches.
    pub(super) fn report(&mut self, a: Activity) {
        match &a {
            Activity::Permission { asked, decision } => {
                self.note(&format!("- permission: `{asked}`: {decision}"));
            }
            Activity::Wrote(path) => self.note(&format!("- wrote `{path}`")),
            _ => {}
        }
        if let Some(w) = &self.watch {
            let _ = w.send(a);
        }
    }

    /// Writes a line of the transcript (after what was streaming).
    pub(super) fn note(&mut self, line: &str) {
        self.flush_streaming();
        self.write(&format!("{line}\n"));
    }

    fn write(&mut self, text: &str) {
        let Some(f) = &mut self.md else {
            return;
        };
        let masked = crate::secrets::redact(text);
        if let Err(e) = f.write_all(masked.as_bytes()) {
            tracing::warn!("cannot write {}: {e}", self.md_path.display());
            self.md = None;
        }
    }

    fn flush_streaming(&mut self) {
        if let Some((kind, text)) = self.streaming.take() {
            let text = text.trim();
            if !text.is_empty() {
                let block = match kind {
                    Streaming::Message => format!("\n{text}\n\n"),
                    Streaming::Thought => format!(
                        "\n> _thinking:_ {}\n\n",
                        text.lines().collect::<Vec<_>>().join("\n> ")
                    ),
                };
                self.write(&block);
            }
        }
    }

    fn stream(&mut self, kind: Streaming, text: &str) {
        match &mut self.streaming {
            Some((k, buf)) if *k == kind => buf.push_str(text),
            _ => {
                self.flush_streaming();
                self.streaming = Some((kind, text.to_string()));
            }
        }
    }

    /// Takes in one `session/update`.
    pub(super) fn update(&mut self, update: SessionUpdate) {
        match update {
            SessionUpdate::AgentMessageChunk(chunk) => {
                self.add_meta_usage(chunk.meta.as_ref().and_then(|m| m.get("usage")));
                if let ContentBlock::Text(t) = chunk.content {
                    self.all.push_str(&t.text);
                    self.last.push_str(&t.text);
                    self.stream(Streaming::Message, &t.text);
                }
            }
            SessionUpdate::AgentThoughtChunk(chunk) => {
                if let ContentBlock::Text(t) = chunk.content {
                    self.stream(Streaming::Thought, &t.text);
                }
            }
            SessionUpdate::ToolCall(call) => {
                let id = call.tool_call_id.to_string();
                let paths = call.locations.iter().map(|l| l.path.clone()).collect();
                let seen = ToolSeen {
                    title: call.title.clone(),
                    kind: Some(call.kind),
                    raw_input: call.raw_input.clone(),
                    paths,
                    status: String::new(),
                };
                self.tools.insert(id.clone(), seen);
                self.tool(&id, &call.status, &call.content, call.raw_output.as_ref());
            }
            SessionUpdate::ToolCallUpdate(u) => {
                let id = u.tool_call_id.to_string();
                let f = u.fields;
                let seen = self.tools.entry(id.clone()).or_default();
                let mut retitled = false;
                if let Some(t) = f.title.filter(|t| !t.is_empty() && *t != seen.title) {
                    seen.title = t;
                    retitled = true;
                }
                if let Some(k) = f.kind {
                    seen.kind = Some(k);
                }
                if let Some(r) = f
                    .raw_input
                    .filter(|r| r.as_object().is_none_or(|m| !m.is_empty()))
                {
                    seen.raw_input = Some(r);
                }
                if let Some(l) = &f.locations {
                    seen.paths = l.iter().map(|l| l.path.clone()).collect();
                }
                if let Some(status) = f.status {
                    let content = f.content.unwrap_or_default();
                    self.tool(&id, &status, &content, f.raw_output.as_ref());
                } else if retitled && !seen.status.is_empty() {
                    // A better title than the start's (claude-agent-acp starts a write as
                    // `Preparing file…`, names it once its input is streamed): shown.
                    if let Some(w) = &self.watch {
                        let _ = w.send(Activity::Tool {
                            id,
                            title: seen.title.clone(),
                            kind: seen
                                .kind
                                .as_ref()
                                .map_or_else(|| "other".to_string(), snake),
                            status: seen.status.clone(),
                        });
                    }
                }
            }
            SessionUpdate::Plan(plan) => {
                let entries: Vec<(String, String)> = plan
                    .entries
                    .into_iter()
                    .map(|e| (e.content, snake(&e.status)))
                    .collect();
                let text = entries
                    .iter()
                    .map(|(t, s)| format!("  - [{}] {t}", if s == "completed" { "x" } else { " " }))
                    .collect::<Vec<_>>()
                    .join("\n");
                self.note(&format!("- plan:\n{text}"));
                self.last.clear();
                if let Some(w) = &self.watch {
                    let _ = w.send(Activity::Plan(entries));
                }
            }
            SessionUpdate::UsageUpdate(u) => {
                if let Some(c) = u.cost.filter(|c| c.currency.eq_ignore_ascii_case("USD")) {
                    self.cost_usd = Some(c.amount);
                }
                if let Some(m) = u
                    .meta
                    .as_ref()
                    .and_then(|m| m.get("_claude/model"))
                    .and_then(Value::as_str)
                {
                    self.model = Some(m.to_string());
                }
            }
            _ => {}
        }
    }

    /// A tool call's start or change of status: reported, and in the transcript with its
    /// output once it ends.
    fn tool(
        &mut self,
        id: &str,
        status: &ToolCallStatus,
        content: &[ToolCallContent],
        raw_output: Option<&Value>,
    ) {
        let status_word = snake(status);
        if let Some(t) = self.tools.get_mut(id) {
            t.status = status_word;
        }
        let seen = self.tools.get(id).cloned().unwrap_or_default();
        let kind = seen
            .kind
            .as_ref()
            .map_or_else(|| "other".to_string(), snake);
        let status = snake(status);
        // What the agent says after a tool call is what answers.
        self.last.clear();
        let mut line = format!("- tool `{kind}`: {} ({status})", seen.title);
        if matches!(status.as_str(), "completed" | "failed") {
            let out = output_text(content, raw_output);
            if !out.trim().is_empty() {
                let cut: String = out.trim().chars().take(OUTPUT_CHARS).collect();
                line.push_str(&format!(
                    "\n\n  ```\n  {}\n  ```\n",
                    cut.lines().collect::<Vec<_>>().join("\n  ")
                ));
            }
        }
        self.note(&line);
        if let Some(w) = &self.watch {
            let _ = w.send(Activity::Tool {
                id: id.to_string(),
                title: seen.title,
                kind,
                status,
            });
        }
    }

    fn add_meta_usage(&mut self, usage: Option<&Value>) {
        let Some(u) = usage.and_then(usage_of) else {
            return;
        };
        self.meta_usage.get_or_insert_with(Usage::default).add(&u);
    }

    /// Ends the transcript.
    pub(super) fn finish(&mut self, last: &str) {
        self.note(last);
    }
}

/// A tool call's output as text: its text content, or its raw output.
fn output_text(content: &[ToolCallContent], raw_output: Option<&Value>) -> String {
    let mut out = String::new();
    for c in content {
        match c {
            ToolCallContent::Content(c) => {
                if let ContentBlock::Text(t) = &c.content {
                    out.push_str(&t.text);
                    out.push('\n');
                }
            }
            ToolCallContent::Diff(d) => {
                out.push_str(&format!("(diff of {})\n", d.path.display()));
            }
            _ => {}
        }
    }
    if out.trim().is_empty() {
        match raw_output {
            Some(Value::String(s)) => out = s.clone(),
            Some(v) if !v.is_null() => {
                out = v
                    .get("output")
                    .and_then(Value::as_str)
                    .map_or_else(|| v.to_string(), str::to_string);
            }
            _ => {}
        }
    }
    out
}

/// A protocol enum's name as the protocol writes it (`in_progress`).
fn snake<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(Value::String(s)) => s,
        _ => "other".into(),
    }
}

/// The usage in an object with the protocol's usage fields (`inputTokens`, `outputTokens`,
/// `cachedReadTokens`: claude-agent-acp and opencode's `PromptResponse.usage`, qwen's
/// message `_meta.usage`) or gemini's `_meta.quota.token_count` (`input_tokens`,
/// `output_tokens`). `None` when it holds no count.
pub(super) fn usage_of(v: &Value) -> Option<Usage> {
    let n = |keys: &[&str]| keys.iter().find_map(|k| v.get(*k)?.as_u64());
    let input = n(&["inputTokens", "input_tokens"]);
    let output = n(&["outputTokens", "output_tokens"]);
    if input.is_none() && output.is_none() {
        return None;
    }
    let (input, output) = (input.unwrap_or(0), output.unwrap_or(0));
    let read = n(&[
        "cachedReadTokens",
        "cached_input_tokens",
        "cachedInputTokens",
    ])
    .unwrap_or(0);
    let write = n(&["cachedWriteTokens"]).unwrap_or(0);
    let thought = n(&["thoughtTokens"]).unwrap_or(0);
    // `totalTokens` is the sum of every kind: when it adds the cache's reads and writes to
    // `inputTokens` (claude-agent-acp: Anthropic's counts), they are apart from it, and are
    // added in, so that input tokens mean every token read, as for every other backend
    // (the claude CLI's too).
    let apart = read + write > 0
        && n(&["totalTokens"]).is_some_and(|t| t == input + output + thought + read + write);
    Some(Usage {
        input_tokens: if apart { input + read + write } else { input },
        output_tokens: output,
        cached_tokens: read,
        cost_usd: None,
        unreported: 0,
    })
}

/// The usage a `session/prompt` answer reports: its `usage`, else its `_meta.quota`'s
/// `token_count` (gemini).
pub(super) fn prompt_usage(result: &Value) -> Option<Usage> {
    result
        .get("usage")
        .and_then(usage_of)
        .or_else(|| {
            result
                .pointer("/_meta/quota/token_count")
                .and_then(usage_of)
        })
        .filter(|u| u.input_tokens > 0 || u.output_tokens > 0)
}

/// The kinds a tool's permission is asked for, as words (for tests).
#[cfg(test)]
pub(super) fn kind_name(k: &agent_client_protocol_schema::v1::ToolKind) -> String {
    snake(k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_client_protocol_schema::v1::ToolKind;
    use serde_json::json;

    fn update(v: Value) -> SessionUpdate {
        serde_json::from_value(v).expect("a session update")
    }

    #[test]
    fn the_answer_is_what_follows_the_last_tool_call() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut t = Turn::new(&tmp.path().join("transcript.md"), Some(tx));
        t.update(update(json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "Let me write it."}})));
        t.update(update(json!({"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "Write notes.txt", "kind": "edit", "status": "pending"})));
        t.update(update(json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed", "rawOutput": "File created"})));
        t.update(update(json!({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "done now"}})));
        t.update(update(json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "{\"ok\": "}})));
        t.update(update(json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "true}"}})));
        t.update(update(json!({"sessionUpdate": "usage_update", "used": 5184, "size": 1000000, "cost": {"amount": 0.16, "currency": "USD"}, "_meta": {"_claude/model": "claude-opus-5-5"}})));
        assert_eq!(t.answer(), "{\"ok\": true}");
        assert_eq!(t.cost_usd, Some(0.16));
        assert_eq!(t.model.as_deref(), Some("claude-opus-5-5"));
        t.finish("- end");
        let md = std::fs::read_to_string(tmp.path().join("transcript.md")).expect("md");
        assert!(md.contains("Let me write it."), "{md}");
        assert!(
            md.contains("- tool `edit`: Write notes.txt (completed)"),
            "{md}"
        );
        assert!(md.contains("File created"), "{md}");
        assert!(md.contains("> _thinking:_ done now"), "{md}");
        let mut got = Vec::new();
        while let Ok(a) = rx.try_recv() {
            got.push(a);
        }
        assert_eq!(
            got,
            vec![
                Activity::Tool {
                    id: "t1".into(),
                    title: "Write notes.txt".into(),
                    kind: "edit".into(),
                    status: "pending".into()
                },
                Activity::Tool {
                    id: "t1".into(),
                    title: "Write notes.txt".into(),
                    kind: "edit".into(),
                    status: "completed".into()
                },
            ]
        );
    }

    #[test]
    fn usage_is_read_where_each_agent_reports_it() {
        // claude-agent-acp 0.101.0 and opencode: `usage`.
        let claude = json!({"stopReason": "end_turn", "usage": {"inputTokens": 17284, "outputTokens": 3060, "cachedReadTokens": 392, "cachedWriteTokens": 0, "totalTokens": 20736}});
        let u = prompt_usage(&claude).expect("usage");
        // Its total adds the cache reads to `inputTokens`: they are added in.
        assert_eq!(
            (u.input_tokens, u.output_tokens, u.cached_tokens),
            (17284 + 392, 3060, 392)
        );
        // The mock's answers as each agent reported them (tests/fakes/captures/acp/*/ok.jsonl):
        // to claude, Anthropic's 4321 input tokens with 98 cache reads apart (4419 read in
        // all, as the claude CLI's usage reads); to opencode and qwen, OpenAI's 4321 with 98
        // of them cached, which opencode reports taken out of its input and qwen inside it.
        for (usage, input) in [
            (
                json!({"inputTokens": 4321, "outputTokens": 765, "cachedReadTokens": 98, "cachedWriteTokens": 0, "totalTokens": 5184}),
                4419,
            ),
            (
                json!({"inputTokens": 4223, "outputTokens": 765, "totalTokens": 5086, "cachedReadTokens": 98}),
                4321,
            ),
            (
                json!({"inputTokens": 4321, "outputTokens": 765, "totalTokens": 5086, "thoughtTokens": 0, "cachedReadTokens": 98}),
                4321,
            ),
        ] {
            let u = usage_of(&usage).expect("usage");
            assert_eq!(
                (u.input_tokens, u.output_tokens, u.cached_tokens),
                (input, 765, 98),
                "{usage}"
            );
        }
        // gemini: `_meta.quota.token_count`.
        let gemini = json!({"stopReason": "end_turn", "_meta": {"quota": {"token_count": {"input_tokens": 4321, "output_tokens": 765}}}});
        let u = prompt_usage(&gemini).expect("usage");
        assert_eq!((u.input_tokens, u.output_tokens), (4321, 765));
        // qwen: none in its answer.
        assert_eq!(prompt_usage(&json!({"stopReason": "end_turn"})), None);
        assert_eq!(kind_name(&ToolKind::SwitchMode), "switch_mode");
    }
}
