//! Secrets that must never be written or printed: the values of the API key variables the
//! workflow's agents name (and the default ones its HTTP agents use).
//!
//! This is the one choke point for redaction. A run registers its secrets before anything
//! starts; then every store write, every artifact, every recording line, every progress
//! line, every message and JSON document printed by the CLI and every tracing line goes
//! through [`redact`], which replaces each secret by `[REDACTED]`. A server that echoes a
//! key (a proxy's login page, an error body with `Bearer <key>`) therefore leaves no copy of
//! it anywhere.

use std::borrow::Cow;
use std::sync::RwLock;

/// What a secret is replaced by.
pub const MASK: &str = "[REDACTED]";

/// Values shorter than this are not treated as secrets (they would mask ordinary text).
const MIN_LEN: usize = 8;

static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Registers the value of an environment variable as a secret, if it is set.
pub fn register_env(var: &str) {
    if let Ok(value) = std::env::var(var) {
        register(&value);
    }
}

/// Registers a secret value.
pub fn register(value: &str) {
    let value = value.trim();
    if value.len() < MIN_LEN {
        return;
    }
    let mut secrets = SECRETS
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !secrets.iter().any(|s| s == value) {
        secrets.push(value.to_owned());
        // Longer first, so that a secret containing another is masked whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    }
}

/// Tells whether any secret is registered.
pub fn any() -> bool {
    !SECRETS
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .is_empty()
}

/// The text with every registered secret masked.
pub fn redact(text: &str) -> Cow<'_, str> {
    let secrets = SECRETS
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !secrets.iter().any(|s| text.contains(s.as_str())) {
        return Cow::Borrowed(text);
    }
    let mut out = text.to_owned();
    for s in secrets.iter() {
        out = out.replace(s.as_str(), MASK);
    }
    Cow::Owned(out)
}

/// Masks a string in place.
pub fn redact_in_place(text: &mut String) {
    if let Cow::Owned(r) = redact(text) {
        *text = r;
    }
}

/// Masks every string (keys too) in a JSON value.
pub fn redact_json(value: &mut serde_json::Value) {
    use serde_json::Value;
    if !any() {
        return;
    }
    match value {
        Value::String(s) => redact_in_place(s),
        Value::Array(items) => items.iter_mut().for_each(redact_json),
        Value::Object(map) => {
            let leaking: Vec<String> = map
                .keys()
                .filter(|k| matches!(redact(k), Cow::Owned(_)))
                .cloned()
                .collect();
            for k in leaking {
                if let Some(v) = map.remove(&k) {
                    map.insert(redact(&k).into_owned(), v);
                }
            }
            map.values_mut().for_each(redact_json);
        }
        _ => {}
    }
}

/// Masks the secrets in a file, rewriting it only when it holds one. For artifacts that a
/// program streamed to disk before anything could look at them.
pub fn redact_file(path: &std::path::Path) {
    if !any() {
        return;
    }
    let Ok(bytes) = std::fs::read(path) else {
        return;
    };
    let text = String::from_utf8_lossy(&bytes);
    if let Cow::Owned(clean) = redact(&text) {
        if let Err(e) = std::fs::write(path, clean) {
            tracing::warn!("cannot rewrite {} without its secrets: {e}", path.display());
        }
    }
}

/// A writer that masks secrets (and escapes control characters) line by line: for the
/// tracing subscriber.
pub struct RedactingWriter<W: std::io::Write>(pub W);

impl<W: std::io::Write> std::io::Write for RedactingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let clean = redact(&text);
        let clean = crate::text::printable(&clean);
        self.0.write_all(clean.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_masked_everywhere_they_appear() {
        register("sk-test-0123456789abcdef");
        register("short");
        assert_eq!(
            redact("Bearer sk-test-0123456789abcdef and sk-test-0123456789abcdef"),
            "Bearer [REDACTED] and [REDACTED]"
        );
        assert_eq!(redact("short is not a secret"), "short is not a secret");
        let mut v =
            serde_json::json!({"a": ["x sk-test-0123456789abcdef"], "sk-test-0123456789abcdef": 1});
        redact_json(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"a": ["x [REDACTED]"], "[REDACTED]": 1})
        );
    }
}
