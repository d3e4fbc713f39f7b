//! A client for protocol-level tests: the server runs in a thread of the test over an
//! in-memory connection, as `ralph-flow lsp` runs over stdio.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lsp_server::{Connection, Message, Notification, Request, RequestId};
use serde_json::{Value, json};

pub(crate) struct Client {
    conn: Connection,
    server: Option<std::thread::JoinHandle<Result<(), String>>>,
    next_id: i32,
    /// Every notification the server sent, in order.
    pub(crate) notifications: Vec<Notification>,
    versions: std::collections::HashMap<String, i32>,
}

/// How long an answer may take before the test says the server hangs.
const PATIENCE: Duration = Duration::from_secs(60);

impl Client {
    /// Starts a server with a workspace folder, as an editor does.
    pub(crate) fn start(workspace: &Path) -> Client {
        Self::start_with(workspace, json!({}))
    }

    /// Starts a server; `capabilities` are the client's.
    pub(crate) fn start_with(workspace: &Path, capabilities: Value) -> Client {
        let (server_side, client_side) = Connection::memory();
        let server = std::thread::spawn(move || ralph_flow::lsp::serve(&server_side));
        let mut c = Client {
            conn: client_side,
            server: Some(server),
            next_id: 0,
            notifications: Vec::new(),
            versions: Default::default(),
        };
        let root = uri(workspace);
        let answer = c.request(
            "initialize",
            json!({
                "processId": null,
                "rootUri": root,
                "workspaceFolders": [{"uri": root, "name": "w"}],
                "capabilities": capabilities,
            }),
        );
        assert!(
            answer.get("capabilities").is_some(),
            "no capabilities: {answer}"
        );
        c.notify("initialized", json!({}));
        c
    }

    pub(crate) fn notify(&self, method: &str, params: Value) {
        self.conn
            .sender
            .send(Message::Notification(Notification::new(
                method.to_string(),
                params,
            )))
            .unwrap_or_else(|e| panic!("the server is gone: {e}"));
    }

    /// Sends a request and waits for its answer; an error answer fails the test.
    pub(crate) fn request(&mut self, method: &str, params: Value) -> Value {
        match self.try_request(method, params) {
            Ok(v) => v,
            Err(e) => panic!("`{method}` failed: {e}"),
        }
    }

    /// Sends a request and waits for its answer (`Err` holds an error answer's message).
    pub(crate) fn try_request(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.next_id += 1;
        let id = RequestId::from(self.next_id);
        self.conn
            .sender
            .send(Message::Request(Request::new(
                id.clone(),
                method.to_string(),
                params,
            )))
            .unwrap_or_else(|e| panic!("the server is gone: {e}"));
        loop {
            match self.conn.receiver.recv_timeout(PATIENCE) {
                Ok(Message::Response(r)) if r.id == id => {
                    return match r.response_result {
                        Ok(v) => Ok(v),
                        Err(e) => Err(format!("{} ({})", e.message, e.code)),
                    };
                }
                Ok(Message::Notification(n)) => self.notifications.push(n),
                Ok(_) => {}
                Err(e) => panic!("no answer to `{method}` within {PATIENCE:?}: {e}"),
            }
        }
    }

    /// Waits until the server handled everything sent so far (and published what it
    /// found): an unknown request is answered only after the checks an edit asked for.
    pub(crate) fn sync(&mut self) {
        let _ = self.try_request("ralph-flow/sync", json!({}));
    }

    /// Opens a document with the given text.
    pub(crate) fn open(&mut self, path: &Path, text: &str) -> String {
        let u = uri(path);
        self.versions.insert(u.clone(), 1);
        let lang = match path.extension().and_then(|e| e.to_str()) {
            Some("kdl") => "kdl",
            Some("toml") => "toml",
            _ => "jinja",
        };
        self.notify(
            "textDocument/didOpen",
            json!({"textDocument": {"uri": u, "languageId": lang, "version": 1, "text": text}}),
        );
        u
    }

    /// Opens a file with the text it has on disk.
    pub(crate) fn open_file(&mut self, path: &Path) -> String {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        self.open(path, &text)
    }

    /// Replaces the whole text of an open document.
    pub(crate) fn replace(&mut self, uri: &str, text: &str) {
        self.change(uri, json!([{"text": text}]));
    }

    /// Sends content changes (a JSON array of `TextDocumentContentChangeEvent`).
    pub(crate) fn change(&mut self, uri: &str, changes: Value) {
        let v = self.versions.entry(uri.to_string()).or_insert(1);
        *v += 1;
        let version = *v;
        self.notify(
            "textDocument/didChange",
            json!({"textDocument": {"uri": uri, "version": version}, "contentChanges": changes}),
        );
    }

    /// The diagnostics last published for a document, once the server is idle.
    pub(crate) fn diagnostics(&mut self, uri: &str) -> Vec<Value> {
        self.sync();
        self.notifications
            .iter()
            .rev()
            .find(|n| {
                n.method == "textDocument/publishDiagnostics"
                    && n.params.get("uri").and_then(Value::as_str) == Some(uri)
            })
            .and_then(|n| {
                n.params
                    .get("diagnostics")
                    .and_then(Value::as_array)
                    .cloned()
            })
            // "No diagnostics" is what the server said, not that it said nothing.
            .unwrap_or_else(|| panic!("the server published no diagnostics for {uri}"))
    }

    /// The codes of the diagnostics last published for a document.
    pub(crate) fn codes(&mut self, uri: &str) -> Vec<String> {
        self.diagnostics(uri)
            .iter()
            .filter_map(|d| d.get("code").and_then(Value::as_str).map(str::to_string))
            .collect()
    }

    /// Shuts the server down and checks that it ended cleanly.
    pub(crate) fn shutdown(mut self) {
        let _ = self.request("shutdown", Value::Null);
        self.notify("exit", Value::Null);
        if let Some(server) = self.server.take() {
            let ended = server.join().unwrap_or_else(|_| Err("panicked".into()));
            assert_eq!(ended, Ok(()), "the server did not end cleanly");
        }
    }
}

/// The `file:` URI of a path.
pub(crate) fn uri(path: &Path) -> String {
    let mut out = String::from("file://");
    for b in path.to_string_lossy().bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'/' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The repository's root.
pub(crate) fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A copy of the shipped presets (workflows, prompts, schemas) in a temporary directory.
pub(crate) fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    for sub in ["workflows", "prompts", "schemas"] {
        crate::common::copy_dir(&repo().join(sub), &dir.path().join(sub));
    }
    dir
}

/// The zero-based line and UTF-16 column of the first occurrence of `needle` in `text`
/// (plus `delta` bytes), as the protocol counts them.
pub(crate) fn position_of(text: &str, needle: &str, delta: usize) -> Value {
    let at = text
        .find(needle)
        .unwrap_or_else(|| panic!("`{needle}` is not in the text"))
        + delta;
    position(text, at)
}

/// The protocol position (UTF-16 columns) of a byte offset.
pub(crate) fn position(text: &str, at: usize) -> Value {
    let before = &text[..at];
    let line = before.matches('\n').count();
    let col: usize = before[before.rfind('\n').map_or(0, |i| i + 1)..]
        .chars()
        .map(char::len_utf16)
        .sum();
    json!({"line": line, "character": col})
}

/// The byte offset of a protocol position (UTF-16 columns) in `text`.
pub(crate) fn offset(text: &str, pos: &Value) -> usize {
    let line = pos["line"]
        .as_u64()
        .unwrap_or_else(|| panic!("no line: {pos}")) as usize;
    let col = pos["character"]
        .as_u64()
        .unwrap_or_else(|| panic!("no character: {pos}")) as usize;
    let start: usize = text.split_inclusive('\n').take(line).map(str::len).sum();
    let mut units = 0;
    for (i, ch) in text[start..].char_indices() {
        if units >= col || ch == '\n' {
            return start + i;
        }
        units += ch.len_utf16();
    }
    text.len()
}

/// Applies `TextEdit`s (of one document) to its text, from the last one up.
pub(crate) fn apply_edits(text: &str, edits: &[Value]) -> String {
    let mut spans: Vec<(usize, usize, &str)> = edits
        .iter()
        .map(|e| {
            (
                offset(text, &e["range"]["start"]),
                offset(text, &e["range"]["end"]),
                e["newText"]
                    .as_str()
                    .unwrap_or_else(|| panic!("no newText: {e}")),
            )
        })
        .collect();
    spans.sort_by_key(|s| std::cmp::Reverse(s.0));
    let mut out = text.to_string();
    for (a, b, new) in spans {
        out.replace_range(a..b, new);
    }
    out
}
