//! JSON-RPC 2.0 over an ACP agent's stdio: one JSON object per line, each way. What comes
//! in is told apart here ([`Incoming`]); every message, both ways, goes to the call's
//! `acp.jsonl` with its direction, masked of secrets ([`Log`]).

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// The JSON-RPC error codes ralph-flow answers with.
pub(super) mod code {
    /// The method is not one the client serves (`terminal/*`, extensions).
    pub(crate) const METHOD_NOT_FOUND: i64 = -32601;
    /// The parameters do not fit the method.
    pub(crate) const INVALID_PARAMS: i64 = -32602;
    /// The request could not be served (a file refused or unreadable).
    pub(crate) const INTERNAL: i64 = -32603;
    /// ACP's "resource not found": a file that does not exist.
    pub(crate) const NOT_FOUND: i64 = -32002;
}

/// One message from the agent.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Incoming {
    /// A request the client must answer (`session/request_permission`, `fs/*`...).
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    /// A notification (`session/update`).
    Notification { method: String, params: Value },
    /// The answer to one of the client's requests.
    Response {
        id: Value,
        result: Result<Value, RpcError>,
    },
}

/// A JSON-RPC error an agent answered with.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct RpcError {
    pub(super) code: i64,
    pub(super) message: String,
    pub(super) data: Option<Value>,
}

impl RpcError {
    /// Its message, with its data when there is some (where agents put the service's
    /// answer: "429 Too Many Requests ...").
    pub(super) fn text(&self) -> String {
        match &self.data {
            Some(Value::String(d)) if !d.is_empty() => format!("{} ({d})", self.message),
            Some(d) if !d.is_null() => format!("{} ({d})", self.message),
            _ => self.message.clone(),
        }
    }
}

/// Reads one line of the agent's stdout. `Err` holds what was wrong with it: a line that is
/// not a JSON-RPC message means the program does not speak ACP (or wrote its logs to stdout).
pub(super) fn parse(line: &str) -> Result<Incoming, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("it is not JSON ({e})"))?;
    let Value::Object(mut m) = value else {
        return Err("it is not a JSON object".into());
    };
    let id = m.remove("id");
    if let Some(Value::String(method)) = m.remove("method") {
        let params = m.remove("params").unwrap_or(Value::Null);
        return Ok(match id {
            Some(id) if !id.is_null() => Incoming::Request { id, method, params },
            _ => Incoming::Notification { method, params },
        });
    }
    let Some(id) = id else {
        return Err("it has neither a `method` nor an `id`".into());
    };
    if let Some(error) = m.remove("error") {
        return Ok(Incoming::Response {
            id,
            result: Err(RpcError {
                code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: error
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("(no message)")
                    .to_string(),
                data: error.get("data").cloned(),
            }),
        });
    }
    Ok(Incoming::Response {
        id,
        result: Ok(m.remove("result").unwrap_or(Value::Null)),
    })
}

/// A request of the client's, as a line.
pub(super) fn request(id: u64, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

/// A notification of the client's.
pub(super) fn notification(method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params})
}

/// The client's answer to a request of the agent's.
pub(super) fn response(id: &Value, result: Result<Value, (i64, String)>) -> Value {
    match result {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err((code, message)) => {
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
        }
    }
}

/// The transcript of the wire, `acp.jsonl`: `{"from": "client"|"agent", "msg": ...}` per
/// line (what was not JSON as `{"from": "agent", "text": ...}`), masked of secrets.
pub(super) struct Log {
    file: Option<std::fs::File>,
    path: PathBuf,
}

impl Log {
    pub(super) fn create(path: &Path) -> Log {
        let file = std::fs::File::create(path)
            .map_err(|e| tracing::warn!("cannot write {}: {e}", path.display()))
            .ok();
        Log {
            file,
            path: path.to_path_buf(),
        }
    }

    /// Appends one message.
    pub(super) fn message(&mut self, from: &str, msg: &Value) {
        self.line(&json!({"from": from, "msg": msg}));
    }

    /// Appends a line of the agent's stdout that was not a message.
    pub(super) fn text(&mut self, text: &str) {
        self.line(&json!({"from": "agent", "text": text}));
    }

    fn line(&mut self, v: &Value) {
        let Some(f) = &mut self.file else {
            return;
        };
        let text = v.to_string();
        let masked = crate::secrets::redact(&text);
        if let Err(e) = writeln!(f, "{masked}") {
            tracing::warn!(
                "cannot write {}: {e}; not writing it further",
                self.path.display()
            );
            self.file = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_told_apart() {
        let r = parse(
            r#"{"jsonrpc":"2.0","id":3,"method":"fs/read_text_file","params":{"path":"/a"}}"#,
        )
        .expect("a request");
        assert_eq!(
            r,
            Incoming::Request {
                id: json!(3),
                method: "fs/read_text_file".into(),
                params: json!({"path": "/a"})
            }
        );
        let n = parse(r#"{"jsonrpc":"2.0","method":"session/update","params":{}}"#)
            .expect("a notification");
        assert!(matches!(n, Incoming::Notification { method, .. } if method == "session/update"));
        let ok =
            parse(r#"{"jsonrpc":"2.0","id":1,"result":{"sessionId":"s"}}"#).expect("a response");
        assert_eq!(
            ok,
            Incoming::Response {
                id: json!(1),
                result: Ok(json!({"sessionId": "s"}))
            }
        );
        let err = parse(
            r#"{"jsonrpc":"2.0","id":2,"error":{"code":-32603,"message":"Internal error","data":"429 rate limit"}}"#,
        )
        .expect("an error");
        let Incoming::Response { result: Err(e), .. } = err else {
            panic!("an error response: {err:?}");
        };
        assert_eq!(e.code, -32603);
        assert_eq!(e.text(), "Internal error (429 rate limit)");
    }

    #[test]
    fn what_is_not_json_rpc_says_why() {
        assert_eq!(
            parse("Welcome to my agent!")
                .err()
                .as_deref()
                .map(|e| e.starts_with("it is not JSON")),
            Some(true)
        );
        assert_eq!(
            parse("[1]").err().as_deref(),
            Some("it is not a JSON object")
        );
        assert_eq!(
            parse(r#"{"jsonrpc":"2.0"}"#).err().as_deref(),
            Some("it has neither a `method` nor an `id`")
        );
    }

    #[test]
    fn answers_are_json_rpc() {
        assert_eq!(
            response(&json!(4), Err((code::METHOD_NOT_FOUND, "no".into()))),
            json!({"jsonrpc":"2.0","id":4,"error":{"code":-32601,"message":"no"}})
        );
        assert_eq!(
            request(1, "session/new", json!({})),
            json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{}})
        );
    }
}
