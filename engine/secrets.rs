//! Secrets that must never be written or printed, and the one masker that keeps them out.
//!
//! **What is secret.** The values of:
//! - the variables the workflow's agents name (`api_key_env`, and the default key variables
//!   of the HTTP kinds);
//! - the key variables of the agent kinds the workflow declares (`backend::key_variables`,
//!   each agent CLI's own: `ANTHROPIC_API_KEY` for `claude`, `OPENAI_API_KEY` for `codex`,
//!   ...);
//! - the variables the workflow lists in `secrets = [...]`;
//! - every variable of the environment with a well-known secret name ([`is_well_known`]:
//!   `*_API_KEY`, `*_TOKEN`, `*_SECRET`, `*_SECRET_KEY`, `*_SECRET_ACCESS_KEY`,
//!   `*_PASSWORD`, `PGPASSWORD`, `MYSQL_PWD`);
//! - the password of every URL with one (`scheme://user:PASSWORD@host`) in any variable of
//!   the environment ([`register_well_known`]).
//!
//! Besides those values, the password of any URL in any text is masked
//! (`scheme://user:[REDACTED]@host`), registered or not.
//!
//! **Short values.** A value shorter than [`MIN_LEN`] characters is not masked: replacing
//! every `abc` or `true` of every text would garble ordinary text without hiding anything
//! (such a value is guessed, not leaked). [`register`] says so ([`Registered::Short`]), and a
//! run warns about a variable it was told is secret (`api_key_env`, `secrets`) whose value is
//! that short. A URL's password is masked in its URL (`:PASSWORD@`) whatever its length.
//!
//! **Where.** This is the one masker. A run registers its secrets before anything starts
//! (`run::register_secrets`; a worker for each run it carries out, and for each unit of work
//! it takes); then every store write (masked inside the store: each store's `commit` goes
//! through `store::Write::masked`, whoever commits), every artifact record, every file a
//! program streams its output to (`redact_streamed`, `redact_file`), every recording line,
//! every progress line, every message and JSON document printed by the CLI, every tracing
//! line, and every page, API body and metric of the monitor goes through [`redact`], which
//! replaces each secret by `[REDACTED]`, in the forms a value takes once escaped for JSON
//! or HTML too. A server that echoes a key (a proxy's login page, an error body with
//! `Bearer <key>`) therefore leaves no copy of it anywhere.
//!
//! **Cost.** [`redact`] is one pass of an Aho-Corasick automaton over the registered forms
//! (none when nothing is registered) and one search for `://` (a URL's password is masked
//! whether or not anything is registered, so no text can skip the masker; a text without
//! `://` holds no URL and costs only that search). Nothing is copied unless something is
//! masked.

use std::borrow::Cow;
use std::sync::RwLock;

use aho_corasick::{AhoCorasick, MatchKind};

/// What a secret is replaced by.
pub const MASK: &str = "[REDACTED]";

/// Values shorter than this (in characters) are not treated as secrets (they would mask
/// ordinary text).
pub const MIN_LEN: usize = 8;

/// The ends of names whose variables hold secrets: a name that is one of these, or ends
/// with `_` and one of these (ASCII case ignored).
pub const WELL_KNOWN_SUFFIXES: &[&str] = &[
    "API_KEY",
    "TOKEN",
    "SECRET",
    "SECRET_KEY",
    "SECRET_ACCESS_KEY",
    "PASSWORD",
];

/// Names of variables that hold secrets without a well-known ending (`AWS_SECRET_ACCESS_KEY`
/// needs no entry: it ends with `_SECRET_ACCESS_KEY`).
pub const WELL_KNOWN_NAMES: &[&str] = &["PGPASSWORD", "MYSQL_PWD"];

/// What a registered URL password is replaced by where it stands in its URL (`:PASSWORD@`).
const URL_MASK: &str = ":[REDACTED]@";

/// The registered texts and what replaces each, with one automaton that finds them all.
struct Needles {
    texts: Vec<String>,
    /// What replaces `texts[i]`: [`MASK`], or [`URL_MASK`] for a password in its URL.
    with: Vec<&'static str>,
    /// Every text, leftmost-longest (a secret containing another is masked whole); rebuilt
    /// when one is added (registration happens before a run starts), `None` while empty.
    finder: Option<AhoCorasick>,
}

static SECRETS: RwLock<Needles> = RwLock::new(Needles {
    texts: Vec::new(),
    with: Vec::new(),
    finder: None,
});

fn needles() -> std::sync::RwLockReadGuard<'static, Needles> {
    SECRETS
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What [`register`] did with a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Registered {
    /// The variable is not set, or the value is empty.
    Unset,
    /// The value is shorter than [`MIN_LEN`]: it is not masked.
    Short,
    /// The value is masked from now on.
    Masked,
}

/// Tells whether a variable's name says it holds a secret (see [`WELL_KNOWN_SUFFIXES`] and
/// [`WELL_KNOWN_NAMES`]).
pub fn is_well_known(name: &str) -> bool {
    let name = name.to_ascii_uppercase();
    WELL_KNOWN_NAMES.contains(&name.as_str())
        || WELL_KNOWN_SUFFIXES.iter().any(|s| {
            name == *s
                || name
                    .strip_suffix(s)
                    .is_some_and(|head| head.len() > 1 && head.ends_with('_'))
        })
}

/// Registers the values of the environment's well-known secret variables and the passwords
/// of the URLs in any of its variables. Once per process: the environment of a run does not
/// change.
pub fn register_well_known() {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        for (name, value) in std::env::vars_os() {
            let (Some(name), Some(value)) = (name.to_str(), value.to_str()) else {
                continue;
            };
            if is_well_known(name) {
                register(value);
            }
            register_url_passwords(value);
        }
    });
}

/// Registers the value of an environment variable as a secret, if it is set; the
/// passwords of the URLs it holds too.
pub fn register_env(var: &str) -> Registered {
    match std::env::var(var) {
        Ok(value) => {
            register_url_passwords(&value);
            register(&value)
        }
        Err(_) => Registered::Unset,
    }
}

/// Registers a secret value (and, of a value of several lines, each line long enough).
pub fn register(value: &str) -> Registered {
    let value = value.trim();
    if value.is_empty() {
        return Registered::Unset;
    }
    if value.chars().count() < MIN_LEN {
        return Registered::Short;
    }
    let mut needles = vec![value];
    if value.contains('\n') {
        needles.extend(
            value
                .lines()
                .map(str::trim)
                .filter(|l| l.chars().count() >= MIN_LEN),
        );
    }
    for n in needles {
        for form in escaped_forms(n) {
            add(form, MASK);
        }
    }
    Registered::Masked
}

/// A value as it reads in text, in a JSON string and in HTML (escaped as the monitor's
/// templates escape it): the forms it may take in what is written or served.
fn escaped_forms(value: &str) -> Vec<String> {
    let mut forms = vec![value.to_string()];
    if let Ok(json) = serde_json::to_string(value) {
        let inner = &json[1..json.len() - 1];
        if inner != value {
            forms.push(inner.to_string());
        }
    }
    let mut html = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '&' => html.push_str("&amp;"),
            '<' => html.push_str("&lt;"),
            '>' => html.push_str("&gt;"),
            '"' => html.push_str("&quot;"),
            '\'' => html.push_str("&#x27;"),
            '/' => html.push_str("&#x2f;"),
            c => html.push(c),
        }
    }
    if html != value {
        forms.push(html);
    }
    forms
}

/// Registers the password of each URL in `text`: masked alone (when long enough, as written
/// and percent-decoded) and, whatever its length, where it stands in its URL (`:PASSWORD@`).
fn register_url_passwords(text: &str) {
    for range in url_passwords(text) {
        let written = &text[range];
        let decoded = percent_decoded(written);
        for pw in [written, decoded.as_str()] {
            register(pw);
            for form in escaped_forms(pw) {
                add(format!(":{form}@"), URL_MASK);
            }
        }
    }
}

/// `%XX` escapes decoded (a URL's password as the program that reads it sees it).
fn percent_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn add(text: String, with: &'static str) {
    let mut needles = SECRETS
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if needles.texts.contains(&text) {
        return;
    }
    needles.texts.push(text);
    needles.with.push(with);
    // A few dozen texts at most: built in microseconds, once per text registered.
    match AhoCorasick::builder()
        .match_kind(MatchKind::LeftmostLongest)
        .build(&needles.texts)
    {
        Ok(finder) => needles.finder = Some(finder),
        Err(e) => {
            // Beyond the automaton's limits (never for texts of this size): the new text is
            // not registered, and the warning says so without showing it.
            tracing::warn!("a secret cannot be registered for masking: {e}");
            needles.texts.pop();
            needles.with.pop();
        }
    }
}

/// The byte ranges of the passwords of the URLs in a text: what stands between the first `:`
/// of a URL's user info and its last `@` (`scheme://user:PASSWORD@host`), unless masked.
fn url_passwords(text: &str) -> Vec<std::ops::Range<usize>> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find("://") {
        let sep = from + i;
        from = sep + 3;
        let scheme = text[..sep]
            .bytes()
            .next_back()
            .is_some_and(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'.' | b'-'));
        if !scheme {
            continue;
        }
        let rest = &text[from..];
        let end = rest
            .find(|c: char| {
                c.is_whitespace()
                    || matches!(c, '/' | '?' | '#' | '"' | '\'' | '<' | '>' | '`' | '\\')
            })
            .unwrap_or(rest.len());
        let authority = &rest[..end];
        let Some(at) = authority.rfind('@') else {
            continue;
        };
        let Some(colon) = authority[..at].find(':') else {
            continue;
        };
        let range = from + colon + 1..from + at;
        if !range.is_empty() && &text[range.clone()] != MASK {
            found.push(range);
        }
    }
    found
}

/// The text with every registered secret, and the password of every URL, masked: one pass
/// of the automaton, then the URLs' passwords (only in a text with `://`). Borrowed, no copy,
/// when nothing is masked.
pub fn redact(text: &str) -> Cow<'_, str> {
    let mut out: Option<String> = None;
    {
        let needles = needles();
        if let Some(finder) = &needles.finder {
            let mut last = 0;
            for m in finder.find_iter(text) {
                let o = out.get_or_insert_with(|| String::with_capacity(text.len()));
                o.push_str(&text[last..m.start()]);
                o.push_str(needles.with[m.pattern().as_usize()]);
                last = m.end();
            }
            if let Some(o) = &mut out {
                o.push_str(&text[last..]);
            }
        }
    }
    let cur = out.as_deref().unwrap_or(text);
    let passwords = if cur.contains("://") {
        url_passwords(cur)
    } else {
        Vec::new()
    };
    if !passwords.is_empty() {
        let mut masked = String::with_capacity(cur.len());
        let mut last = 0;
        for r in passwords {
            masked.push_str(&cur[last..r.start]);
            masked.push_str(MASK);
            last = r.end;
        }
        masked.push_str(&cur[last..]);
        out = Some(masked);
    }
    match out {
        Some(s) => Cow::Owned(s),
        None => Cow::Borrowed(text),
    }
}

/// Whether [`redact`] would change a text (without building the masked copy).
pub fn leaks(text: &str) -> bool {
    needles().finder.as_ref().is_some_and(|f| f.is_match(text))
        || (text.contains("://") && !url_passwords(text).is_empty())
}

/// Whether [`redact_json`] would change a JSON value (a string or a key in it).
pub fn json_leaks(value: &serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::String(s) => leaks(s),
        Value::Array(items) => items.iter().any(json_leaks),
        Value::Object(map) => map.iter().any(|(k, v)| leaks(k) || json_leaks(v)),
        _ => false,
    }
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
/// program streamed to disk before anything could look at them, when what was streamed is
/// no longer all in memory (else [`redact_streamed`] spares the read).
pub fn redact_file(path: &std::path::Path) {
    let Ok(bytes) = std::fs::read(path) else {
        return;
    };
    redact_streamed(path, &bytes);
}

/// Masks the secrets in a file known to hold exactly `bytes` (a program's output kept whole
/// in memory as it was streamed to the file): masked in memory, and the file rewritten only
/// when that changed something. Nothing is read, and nothing is written in the common case.
pub fn redact_streamed(path: &std::path::Path, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let text = String::from_utf8_lossy(bytes);
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
        assert_eq!(register("sk-test-0123456789abcdef"), Registered::Masked);
        assert_eq!(register("short"), Registered::Short);
        assert_eq!(register("  "), Registered::Unset);
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

    #[test]
    fn escaped_forms_and_lines_of_a_secret_are_masked() {
        register("wJalr/K7MDENG\"bPxRf<EXAMPLE>");
        assert_eq!(redact("wJalr/K7MDENG\"bPxRf<EXAMPLE>"), MASK);
        assert_eq!(redact("wJalr&#x2f;K7MDENG&quot;bPxRf&lt;EXAMPLE&gt;"), MASK);
        assert_eq!(
            redact(r#""wJalr/K7MDENG\"bPxRf<EXAMPLE>""#),
            "\"[REDACTED]\""
        );
        register("-----BEGIN TEST KEY-----\nAAAAB3NzaC1yc2EAAAADAQAB\nend\n");
        assert_eq!(redact("half: AAAAB3NzaC1yc2EAAAADAQAB"), "half: [REDACTED]");
        assert_eq!(redact("end"), "end", "a line too short stays");
    }

    #[test]
    fn the_passwords_of_urls_are_masked_registered_or_not() {
        assert_eq!(
            redact("clone https://bot:s3cr3t-v4lue@git.example.com/r.git now"),
            "clone https://bot:[REDACTED]@git.example.com/r.git now"
        );
        assert_eq!(
            redact("redis://:pw@cache:6379 and postgres://u:p%40ss@db/x"),
            "redis://:[REDACTED]@cache:6379 and postgres://u:[REDACTED]@db/x"
        );
        for plain in [
            "https://example.com/a@b",
            "ssh://git@github.com:22/x",
            "git@github.com:org/repo",
            "http://[::1]:8080/",
            "no url at all",
            "https://u:[REDACTED]@h",
        ] {
            assert!(matches!(redact(plain), Cow::Borrowed(_)), "{plain}");
        }
        // A registered URL's password: alone (long enough) and in its URL (any length).
        register_url_passwords("postgres://app:Long-pass%2F91@db:5432/prod");
        assert_eq!(redact("pw Long-pass/91"), "pw [REDACTED]");
        assert_eq!(redact("pw Long-pass%2F91"), "pw [REDACTED]");
        register_url_passwords("mysql://root:tiny@db/x");
        assert_eq!(
            redact("tiny"),
            "tiny",
            "a short password is masked in its URL only"
        );
        assert_eq!(
            redact("mysql:&#x2f;&#x2f;root:tiny@db&#x2f;x"),
            "mysql:&#x2f;&#x2f;root:[REDACTED]@db&#x2f;x"
        );
    }

    #[test]
    fn well_known_names() {
        for name in [
            "GITHUB_TOKEN",
            "OPENAI_API_KEY",
            "AWS_SECRET_ACCESS_KEY",
            "STRIPE_SECRET",
            "DJANGO_SECRET_KEY",
            "DB_PASSWORD",
            "token",
            "PGPASSWORD",
        ] {
            assert!(is_well_known(name), "{name}");
        }
        for name in [
            "PATH",
            "TOKENIZER",
            "HOME",
            "MY_TOKENS",
            "_TOKEN",
            "KEYBOARD",
        ] {
            assert!(!is_well_known(name), "{name}");
        }
    }

    #[test]
    fn leaks_says_what_redact_would_change() {
        register("leak-check-0123456789");
        for text in [
            "a leak-check-0123456789 here",
            "https://u:pw@host/x",
            "\"leak-check-0123456789\"",
        ] {
            assert!(leaks(text), "{text}");
            assert!(matches!(redact(text), Cow::Owned(_)), "{text}");
        }
        for text in [
            "nothing",
            "https://example.com/a@b",
            "https://u:[REDACTED]@h",
        ] {
            assert!(!leaks(text), "{text}");
        }
        assert!(json_leaks(
            &serde_json::json!({"k": [1, "x leak-check-0123456789"]})
        ));
        assert!(json_leaks(&serde_json::json!({"leak-check-0123456789": 1})));
        assert!(!json_leaks(&serde_json::json!({"k": [1, "clean", null]})));
        assert_eq!(URL_MASK, format!(":{MASK}@"));
    }

    #[test]
    fn a_secret_containing_another_is_masked_whole() {
        register("inner-secret-42");
        register("outer-inner-secret-42-tail");
        assert_eq!(redact("x outer-inner-secret-42-tail y"), "x [REDACTED] y");
        assert_eq!(redact("x inner-secret-42 y"), "x [REDACTED] y");
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decoded("a%2Fb%zz%4"), "a/b%zz%4");
        assert_eq!(percent_decoded("%41"), "A");
    }
}
