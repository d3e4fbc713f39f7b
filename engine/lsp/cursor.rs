//! What surrounds a cursor, read from the text alone (the text is often half-typed and does
//! not parse): in which table (TOML) or node (KDL) it stands, whether it is where a key is
//! written or in which key's value, whether it is inside a `{{ }}` / `{% %}` template or an
//! expression, and the dotted identifiers typed before it there.
//!
//! Both syntaxes give their place as a table path in the TOML spelling (`stage "review"` in
//! KDL is `["stages", "review"]`), so that completion reads one form; the path is resolved
//! against [`crate::spec`] by [`shape`].

use std::ops::Range;

use crate::spec::{TableSpec, Ty, WORKFLOW};

/// Where the cursor stands.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Cursor {
    /// The table the cursor is in, TOML-spelled from the top (`["stages", "review",
    /// "output"]`). For a value, the table that holds its key.
    pub(crate) table: Vec<String>,
    /// The `kind` written in that table, if any.
    pub(crate) kind: Option<String>,
    /// The keys already written in that table (before and after the cursor).
    pub(crate) written: Vec<String>,
    pub(crate) place: Place,
}

/// What kind of place the cursor is at.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Place {
    /// Where a key is written; `prefix` is the part already typed. `property` is set for a
    /// KDL property on a node's line (`key=value`), rather than a child node.
    Key {
        prefix: Range<usize>,
        property: bool,
    },
    /// In the value of `key` (a string, or a bare word); `prefix` is what is typed of it.
    Value {
        key: String,
        prefix: Range<usize>,
        quoted: bool,
    },
    /// Inside a template's `{{ }}` or `{% %}`, or an expression-valued key.
    Code(Code),
    /// Nowhere to complete (a comment, a number, a table header, ...).
    Nothing,
}

/// The cursor in template code.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Code {
    /// The identifiers before the one being typed: `stages.plan.output.ph` gives
    /// `["stages", "plan", "output"]`.
    pub(crate) chain: Vec<String>,
    /// The part of the identifier being typed (`ph`).
    pub(crate) prefix: Range<usize>,
    pub(crate) after: After,
    /// Names bound before the cursor by `{% for %}`, `{% set %}`, `{% with %}` and `{% macro %}`.
    pub(crate) locals: Vec<String>,
    /// The key whose value holds the code, in a workflow file.
    pub(crate) key: Option<String>,
}

/// What comes right before the identifier typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum After {
    /// Nothing special: a variable or an attribute.
    Plain,
    /// `|`: a filter name.
    Filter,
    /// `is` or `is not`: a test name.
    Test,
}

/// What a table path stands for in the format.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Shape {
    /// A table of fixed keys.
    Table(&'static TableSpec),
    /// A table of user-chosen keys with values of one type.
    Map(&'static Ty),
    /// A keyed collection (`stages`, `params`): its keys are names.
    Names(&'static TableSpec),
    /// Free-form (an inline schema, a default), or unknown.
    Free,
}

/// What a table path stands for.
pub(crate) fn shape(path: &[String]) -> Shape {
    let mut shape = Shape::Table(&WORKFLOW);
    let mut i = 0;
    while i < path.len() {
        let seg = path[i].as_str();
        shape = match shape {
            Shape::Table(t) => match t.field(seg) {
                Some(f) => match &f.ty {
                    Ty::Named(s, _) => {
                        if i + 1 < path.len() {
                            i += 1;
                            table_shape(s)
                        } else {
                            Shape::Names(s)
                        }
                    }
                    ty => ty_shape(ty),
                },
                None => Shape::Free,
            },
            Shape::Names(s) => table_shape(s),
            Shape::Map(ty) => ty_shape(ty),
            Shape::Free => Shape::Free,
        };
        i += 1;
    }
    shape
}

fn table_shape(t: &'static TableSpec) -> Shape {
    if t.fields.is_empty() {
        Shape::Free
    } else {
        Shape::Table(t)
    }
}

fn ty_shape(ty: &'static Ty) -> Shape {
    match ty {
        Ty::Table(s) | Ty::Tables(s, _) | Ty::StrOrTable(s) => table_shape(s),
        Ty::Named(s, _) => Shape::Names(s),
        Ty::Map(inner) => Shape::Map(inner),
        Ty::List(inner) => ty_shape(inner),
        _ => Shape::Free,
    }
}

/// The type of `key`'s value in the table at `table`, lists unwrapped.
pub(crate) fn value_ty(table: &[String], key: &str) -> Option<&'static Ty> {
    let ty = match shape(table) {
        Shape::Table(t) => &t.field(key)?.ty,
        Shape::Map(ty) => ty,
        _ => return None,
    };
    Some(unlist(ty))
}

fn unlist(ty: &'static Ty) -> &'static Ty {
    match ty {
        Ty::List(inner) => unlist(inner),
        Ty::Map(inner) => unlist(inner),
        t => t,
    }
}

/// Whether a value's string is all code (an expression), a template, or plain text.
fn string_kind(table: &[String], key: &str) -> Option<bool> {
    match value_ty(table, key)? {
        Ty::Expr => Some(true),
        Ty::Template | Ty::Count | Ty::Duration => Some(false),
        _ => None,
    }
}

/// The place in a string value of `key` whose text starts at `content` (after the quote).
fn in_string(text: &str, table: &[String], key: &str, content: usize, at: usize) -> Place {
    match string_kind(table, key) {
        Some(expression) => match code(text, content, at, expression) {
            Some(mut c) => {
                c.key = Some(key.to_string());
                Place::Code(c)
            }
            None if expression => Place::Nothing,
            None => Place::Value {
                key: key.to_string(),
                prefix: content..at,
                quoted: true,
            },
        },
        None => Place::Value {
            key: key.to_string(),
            prefix: content..at,
            quoted: true,
        },
    }
}

/// The cursor in a prompt file: all of it is a template.
pub(crate) fn template(text: &str, at: usize) -> Place {
    let at = clamp(text, at);
    code(text, 0, at, false).map_or(Place::Nothing, Place::Code)
}

fn clamp(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The cursor in template code between `start` and `at`: `None` when it is not in code
/// (outside `{{ }}` / `{% %}`, or inside a string literal or a comment there).
pub(crate) fn code(text: &str, start: usize, at: usize, expression: bool) -> Option<Code> {
    let region = text.get(start..at)?;
    let code_start = if expression {
        start
    } else {
        start + open_tag(region)?
    };
    let b = text.as_bytes();
    // Inside a string literal of the code: nothing to complete.
    let mut quote: Option<u8> = None;
    let mut i = code_start;
    while i < at {
        match (quote, b[i]) {
            (Some(_), b'\\') => i += 1,
            (Some(q), c) if c == q => quote = None,
            (None, c @ (b'"' | b'\'')) => quote = Some(c),
            _ => {}
        }
        i += 1;
    }
    if quote.is_some() {
        return None;
    }
    let mut p = at;
    while p > code_start && is_ident(b[p - 1]) {
        p -= 1;
    }
    if p < at && b[p].is_ascii_digit() {
        return None;
    }
    let mut chain = Vec::new();
    let mut q = p;
    while q > code_start && b[q - 1] == b'.' {
        let end = q - 1;
        let mut s = end;
        while s > code_start && is_ident(b[s - 1]) {
            s -= 1;
        }
        if s == end {
            // `).x` or `].x`: an attribute of something that is not a name.
            return Some(Code {
                chain: vec![String::new()],
                prefix: p..at,
                after: After::Plain,
                locals: Vec::new(),
                key: None,
            });
        }
        chain.push(text[s..end].to_string());
        q = s;
    }
    chain.reverse();
    let before = text[code_start..q].trim_end();
    let is_not = before
        .strip_suffix("not")
        .is_some_and(|b2| ends_with_word(b2.trim_end(), "is"));
    let after = if !chain.is_empty() {
        After::Plain
    } else if before.ends_with('|') && !before.ends_with("||") {
        After::Filter
    } else if ends_with_word(before, "is") || is_not {
        After::Test
    } else {
        After::Plain
    };
    Some(Code {
        chain,
        prefix: p..at,
        after,
        // Names set by `{% for %}` and `{% set %}` earlier in this template only.
        locals: locals(text.get(start.min(at)..at).unwrap_or("")),
        key: None,
    })
}

fn ends_with_word(s: &str, w: &str) -> bool {
    s.strip_suffix(w).is_some_and(|r| {
        !r.as_bytes()
            .last()
            .is_some_and(|&c| is_ident(c) || c == b'.')
    })
}

/// Where the code of the last `{{` or `{%` that is not closed yet starts (an offset into
/// `region`), skipping `{# #}` comments.
fn open_tag(region: &str) -> Option<usize> {
    let b = region.as_bytes();
    let mut open: Option<(usize, u8)> = None;
    let mut i = 0;
    while i + 1 < b.len() {
        match open {
            None if b[i] == b'{' && matches!(b[i + 1], b'{' | b'%') => {
                open = Some((i + 2, b[i + 1]));
                i += 2;
            }
            None if b[i] == b'{' && b[i + 1] == b'#' => match region[i + 2..].find("#}") {
                Some(e) => i += 2 + e + 2,
                None => return None,
            },
            Some((_, k)) if b[i + 1] == b'}' && b[i] == closer(k) => {
                open = None;
                i += 2;
            }
            _ => i += 1,
        }
    }
    open.map(|(s, _)| s)
}

/// The first byte of the tag that closes one opened with `{` + `k`.
fn closer(k: u8) -> u8 {
    if k == b'{' { b'}' } else { b'%' }
}

/// The names a template binds before the cursor: `{% for a, b in %}`, `{% set x = %}`,
/// `{% with x = %}`, `{% macro m() %}`; and `loop` inside a for.
fn locals(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("{%") {
        rest = &rest[i + 2..];
        let tag = rest.trim_start_matches(['-', '+']).trim_start();
        let (word, tail) = split_word(tag);
        match word {
            "for" => {
                let names = tail.split(" in ").next().unwrap_or("");
                for n in names.split(',') {
                    let n = n.trim();
                    if !n.is_empty() && n.bytes().all(is_ident) {
                        out.push(n.to_string());
                    }
                }
                out.push("loop".to_string());
            }
            "set" | "with" | "macro" => {
                let (name, _) = split_word(tail.trim_start());
                if !name.is_empty() {
                    out.push(name.to_string());
                }
            }
            _ => {}
        }
    }
    out.sort();
    out.dedup();
    out
}

fn split_word(s: &str) -> (&str, &str) {
    let end = s.bytes().position(|c| !is_ident(c)).unwrap_or(s.len());
    (&s[..end], &s[end..])
}

// ------------------------------------------------------------------------------------ TOML

/// A bracket opened in a TOML value.
struct Frame {
    /// The key path (from the table) where it opened.
    key: Vec<String>,
    inline: bool,
    /// Keys written in it (inline tables).
    written: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    Key,
    Eq,
    Value,
    After,
}

/// The cursor in a TOML workflow file.
pub(crate) fn toml(text: &str, at: usize) -> Cursor {
    let at = clamp(text, at);
    let b = text.as_bytes();
    let mut table: Vec<String> = Vec::new();
    let mut frames: Vec<Frame> = Vec::new();
    let mut written: Vec<String> = Vec::new();
    let mut key: Vec<String> = Vec::new();
    let mut expect = Expect::Key;
    let mut i = 0usize;
    // The table (TOML-spelled) and key path of a value at the cursor.
    let full = |table: &[String], frames: &[Frame], key: &[String]| -> Vec<String> {
        let mut p = table.to_vec();
        if let Some(f) = frames.last() {
            p.extend(f.key.iter().cloned());
            if f.inline {
                p.extend(key.iter().cloned());
            }
        } else {
            p.extend(key.iter().cloned());
        }
        p
    };
    let place: Place;
    let here: Vec<String>;
    let mut here_written: Vec<String>;
    loop {
        // Spaces (not newlines).
        while i < b.len() && (b[i] == b' ' || b[i] == b'\t' || b[i] == b'\r') {
            i += 1;
        }
        let s = i;
        if at < s || (at == s && (s >= b.len() || b[s] == b'\n' || b[s] == b'#')) || s >= b.len() {
            // The cursor is in spaces before the next token.
            match expect {
                Expect::Key => {
                    here = full(&table, &frames, &[]);
                    here_written = frames
                        .last()
                        .map_or_else(|| written.clone(), |f| f.written.clone());
                    place = Place::Key {
                        prefix: at..at,
                        property: false,
                    };
                }
                Expect::Value => {
                    let p = full(&table, &frames, &key);
                    let (t, k) = split_last(&p);
                    here = t;
                    here_written = Vec::new();
                    place = Place::Value {
                        key: k,
                        prefix: at..at,
                        quoted: false,
                    };
                }
                _ => {
                    here = full(&table, &frames, &[]);
                    here_written = Vec::new();
                    place = Place::Nothing;
                }
            }
            break;
        }
        let c = b[s];
        match c {
            b'\n' => {
                i += 1;
                if frames.is_empty() {
                    expect = Expect::Key;
                    key.clear();
                }
            }
            b'#' => {
                let e = line_end(text, s);
                if at <= e {
                    here = full(&table, &frames, &[]);
                    here_written = Vec::new();
                    place = Place::Nothing;
                    break;
                }
                i = e;
            }
            b'[' if frames.is_empty() && expect == Expect::Key => {
                let e = line_end(text, s);
                if at <= e {
                    here = table.clone();
                    here_written = Vec::new();
                    place = Place::Nothing;
                    break;
                }
                let inner = text[s..e].trim_start_matches('[');
                let inner = inner.split(']').next().unwrap_or("");
                table = dotted(inner);
                written.clear();
                i = e;
            }
            b'"' | b'\'' if expect != Expect::Value => {
                // A quoted key (or a stray string).
                let e = string_end(text, s);
                if expect == Expect::Key && at <= e {
                    // Typing a quoted key: nothing to offer.
                    here = full(&table, &frames, &[]);
                    here_written = Vec::new();
                    place = Place::Nothing;
                    break;
                }
                i = e;
                if expect == Expect::Key {
                    key = vec![unquote(&text[s..e])];
                    expect = Expect::Eq;
                }
            }
            b'"' | b'\'' => {
                let triple = text[s..].starts_with(if c == b'"' { "\"\"\"" } else { "'''" });
                let content = if triple { s + 3 } else { s + 1 };
                let e = string_end(text, s);
                let closed = e > content && closes(text, s, e, triple);
                if at >= content && (at < e || (at == e && !closed)) {
                    let p = full(&table, &frames, &key);
                    let (t, k) = split_last(&p);
                    place = in_string(text, &t, &k, content, at);
                    here = t;
                    here_written = Vec::new();
                    break;
                }
                i = e;
                expect = Expect::After;
            }
            b'=' => {
                i += 1;
                if expect == Expect::Eq {
                    expect = Expect::Value;
                }
            }
            b'[' => {
                frames.push(Frame {
                    key: frame_key(&frames, &key),
                    inline: false,
                    written: Vec::new(),
                });
                key.clear();
                i += 1;
                expect = Expect::Value;
            }
            b'{' => {
                frames.push(Frame {
                    key: frame_key(&frames, &key),
                    inline: true,
                    written: Vec::new(),
                });
                key.clear();
                i += 1;
                expect = Expect::Key;
            }
            b',' => {
                i += 1;
                match frames.last() {
                    Some(f) if f.inline => {
                        expect = Expect::Key;
                        key.clear();
                    }
                    Some(_) => expect = Expect::Value,
                    None => {}
                }
            }
            b']' | b'}' => {
                i += 1;
                frames.pop();
                key.clear();
                expect = Expect::After;
            }
            _ => {
                // A bare word: a key (dotted), or a bare value.
                let mut e = s;
                while e < b.len() && is_bare(b[e]) {
                    e += 1;
                }
                if e == s {
                    e = s + text[s..].chars().next().map_or(1, char::len_utf8);
                }
                if expect == Expect::Key {
                    // A dotted key: `a.b . c`.
                    let mut segs = Vec::new();
                    let mut seg_start = s;
                    let mut j = s;
                    loop {
                        while j < b.len() && is_bare(b[j]) {
                            j += 1;
                        }
                        segs.push((seg_start, j));
                        let mut k = j;
                        while k < b.len() && (b[k] == b' ' || b[k] == b'\t') {
                            k += 1;
                        }
                        if k < b.len() && b[k] == b'.' {
                            k += 1;
                            while k < b.len() && (b[k] == b' ' || b[k] == b'\t') {
                                k += 1;
                            }
                            seg_start = k;
                            j = k;
                            continue;
                        }
                        break;
                    }
                    let last = segs.last().copied().unwrap_or((s, e));
                    if at <= last.1 {
                        // The segment being typed is the one the cursor is in.
                        let typing = segs
                            .iter()
                            .position(|(ss, se)| *ss <= at && at <= *se)
                            .unwrap_or(segs.len().saturating_sub(1));
                        let parents: Vec<String> = segs[..typing]
                            .iter()
                            .map(|(ss, se)| text[*ss..*se].to_string())
                            .collect();
                        let (ss, _) = segs[typing];
                        here = full(&table, &frames, &parents);
                        here_written = if parents.is_empty() {
                            frames
                                .last()
                                .map_or_else(|| written.clone(), |f| f.written.clone())
                        } else {
                            Vec::new()
                        };
                        place = Place::Key {
                            prefix: ss..at,
                            property: false,
                        };
                        break;
                    }
                    key = segs
                        .iter()
                        .map(|(ss, se)| text[*ss..*se].to_string())
                        .collect();
                    if let Some(first) = key.first() {
                        match frames.last_mut() {
                            Some(f) => f.written.push(first.clone()),
                            None => written.push(first.clone()),
                        }
                    }
                    i = j;
                    expect = Expect::Eq;
                } else {
                    if expect == Expect::Value && at <= e {
                        let p = full(&table, &frames, &key);
                        let (t, k) = split_last(&p);
                        here = t;
                        here_written = Vec::new();
                        place = Place::Value {
                            key: k,
                            prefix: s..at,
                            quoted: false,
                        };
                        break;
                    }
                    i = e;
                    if expect == Expect::Value {
                        expect = Expect::After;
                    }
                }
            }
        }
    }
    // Keys written after the cursor in the same (header) table, and sub-tables named in
    // headers anywhere.
    if matches!(place, Place::Key { .. }) && frames.is_empty() && here == table {
        here_written.extend(keys_after(text, line_end(text, at)));
    }
    if matches!(place, Place::Key { .. }) {
        here_written.extend(subtables(text, &here));
        here_written.sort();
        here_written.dedup();
    }
    let kind = kind_of(text, &here);
    Cursor {
        table: here,
        kind,
        written: here_written,
        place,
    }
}

fn frame_key(frames: &[Frame], key: &[String]) -> Vec<String> {
    let mut k = frames.last().map(|f| f.key.clone()).unwrap_or_default();
    if frames.last().is_none_or(|f| f.inline) {
        k.extend(key.iter().cloned());
    }
    k
}

fn split_last(p: &[String]) -> (Vec<String>, String) {
    match p.split_last() {
        Some((k, t)) => (t.to_vec(), k.clone()),
        None => (Vec::new(), String::new()),
    }
}

fn is_bare(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b':' || b == b'+'
}

fn line_end(text: &str, from: usize) -> usize {
    text[from.min(text.len())..]
        .find('\n')
        .map_or(text.len(), |e| from + e)
}

/// Where the TOML string that starts at `s` ends (after its closing quote, or at the end of
/// its line, or of the text for a multi-line one).
fn string_end(text: &str, s: usize) -> usize {
    let b = text.as_bytes();
    let q = b[s];
    let triple = text[s..].starts_with(if q == b'"' { "\"\"\"" } else { "'''" });
    if triple {
        let close = if q == b'"' { "\"\"\"" } else { "'''" };
        let mut i = s + 3;
        while i < b.len() {
            if q == b'"' && b[i] == b'\\' {
                i += 2;
                continue;
            }
            if b[i..].starts_with(close.as_bytes()) {
                let mut e = i + 3;
                // Up to two more quotes belong to the content.
                while e < b.len() && b[e] == q && e < i + 5 {
                    e += 1;
                }
                return e;
            }
            i += 1;
        }
        return b.len();
    }
    let mut i = s + 1;
    while i < b.len() {
        match b[i] {
            b'\\' if q == b'"' => i += 2,
            b'\n' => return i,
            c if c == q => return i + 1,
            _ => i += 1,
        }
    }
    b.len()
}

fn closes(text: &str, s: usize, e: usize, triple: bool) -> bool {
    let q = &text[s..s + 1];
    if triple {
        e >= s + 6 && text[..e].ends_with(&q.repeat(3))
    } else {
        e >= s + 2 && text[..e].ends_with(q)
    }
}

fn unquote(s: &str) -> String {
    s.trim_matches(|c| c == '"' || c == '\'').to_string()
}

/// A dotted key (`stages.a."b c"`) split into its parts.
fn dotted(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    for c in s.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '"' | '\'') => quote = Some(c),
            (None, '.') => out.push(std::mem::take(&mut cur).trim().to_string()),
            (None, c) => cur.push(c),
        }
    }
    out.push(cur.trim().to_string());
    out
}

/// The first segment of every `key = ...` line from `from` up to the next table header.
fn keys_after(text: &str, from: usize) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.get(from..).unwrap_or("").lines() {
        let t = line.trim_start();
        if t.starts_with('[') {
            break;
        }
        if let Some((k, _)) = t.split_once('=') {
            let k = k.trim();
            if !k.is_empty() && k.bytes().all(|c| is_bare(c) || c == b'.' || c == b' ') {
                if let Some(first) = dotted(k).into_iter().next() {
                    out.push(first);
                }
            }
        }
    }
    out
}

/// The TOML headers of a text, as paths (multi-line strings not told apart: a line that
/// starts with `[` inside one is rare).
fn headers(text: &str) -> impl Iterator<Item = Vec<String>> + '_ {
    text.lines().filter_map(|l| {
        let t = l.trim_start();
        let inner = t.strip_prefix('[')?;
        let inner = inner.trim_start_matches('[');
        let end = inner.find(']')?;
        Some(dotted(&inner[..end]))
    })
}

/// The keys of `table` written as headers of their own (`[stages.a.output]` for `stages.a`).
fn subtables(text: &str, table: &[String]) -> Vec<String> {
    headers(text)
        .filter(|h| h.len() > table.len() && h.starts_with(table))
        .map(|h| h[table.len()].clone())
        .collect()
}

/// The `kind` written in a TOML table: `kind = "x"` in its header's section, or inline.
fn kind_of(text: &str, table: &[String]) -> Option<String> {
    if table.is_empty() {
        return None;
    }
    let mut inside = false;
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with('[') {
            let inner = t.trim_start_matches('[');
            let end = inner.find(']').unwrap_or(inner.len());
            inside = dotted(&inner[..end]) == table;
            continue;
        }
        if inside {
            if let Some(v) = value_of(t, "kind") {
                return Some(v);
            }
        }
    }
    // `[stages.x]` absent: `x = { kind = "..." }` or `x.kind = "..."` lines.
    let (parent, last) = table.split_last().map(|(l, p)| (p, l))?;
    let mut inside = parent.is_empty();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with('[') {
            let inner = t.trim_start_matches('[');
            let end = inner.find(']').unwrap_or(inner.len());
            inside = dotted(&inner[..end]) == parent;
            continue;
        }
        if inside {
            if let Some(rest) = t.strip_prefix(last.as_str()) {
                if let Some(v) = rest.find("kind").and_then(|i| value_of(&rest[i..], "kind")) {
                    return Some(v);
                }
            }
        }
    }
    None
}

/// The string value of `key = "v"` (or `key="v"`) at the start of `t`.
fn value_of(t: &str, key: &str) -> Option<String> {
    let rest = t.strip_prefix(key)?.trim_start();
    let rest = rest.strip_prefix('=')?.trim_start();
    let rest = rest.strip_prefix('"')?;
    Some(rest[..rest.find('"')?].to_string())
}

/// Names written in a TOML workflow: stage ids (with their parent stage's id), params,
/// agents and exits, from its headers; used when the file does not parse.
pub(crate) fn toml_names(text: &str) -> Names {
    let mut n = Names::default();
    for h in headers(text) {
        match h.as_slice() {
            [k, name, ..] if k == "params" => n.params.push(name.clone()),
            [k, name, ..] if k == "agents" => n.agents.push(name.clone()),
            [k, name, ..] if k == "exits" => n.exits.push(name.clone()),
            [k, ..] if k == "stages" => {
                let ids = stage_ids(&h);
                if let Some(id) = ids.last() {
                    let parent = ids.len().checked_sub(2).map(|i| ids[i].clone());
                    n.stages.push((id.clone(), parent));
                }
            }
            _ => {}
        }
    }
    n.dedup();
    n
}

/// The stage ids along a table path: `stages.a.stages.b.output` gives `[a, b]`.
pub(crate) fn stage_ids(path: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i + 1 < path.len() && path[i] == "stages" {
        out.push(path[i + 1].clone());
        i += 2;
    }
    out
}

/// Names found in a workflow's text.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Names {
    /// Stage ids with the id of the stage whose body holds them.
    pub(crate) stages: Vec<(String, Option<String>)>,
    pub(crate) params: Vec<String>,
    pub(crate) agents: Vec<String>,
    pub(crate) exits: Vec<String>,
}

impl Names {
    fn dedup(&mut self) {
        let mut seen = std::collections::HashSet::new();
        self.stages.retain(|(s, _)| seen.insert(s.clone()));
        for v in [&mut self.params, &mut self.agents, &mut self.exits] {
            let mut seen = std::collections::HashSet::new();
            v.retain(|s| seen.insert(s.clone()));
        }
    }
}

// ------------------------------------------------------------------------------------- KDL

/// One KDL node, read tolerantly.
#[derive(Debug)]
struct Node {
    name: String,
    name_range: Range<usize>,
    entries: Vec<Entry>,
    /// Where its line ends (the `{`, `;`, newline or `}` after its entries).
    header_end: usize,
    /// Its children block: after the `{` up to the `}` (or the end of the text).
    block: Option<Range<usize>>,
    kids: Vec<Node>,
}

#[derive(Debug)]
enum Entry {
    /// An argument: its whole token, its text without quotes, and whether quoted.
    Arg(Tok),
    /// A property: its key and value (if any).
    Prop {
        key: String,
        key_range: Range<usize>,
        value: Option<Tok>,
    },
}

#[derive(Debug, Clone)]
struct Tok {
    range: Range<usize>,
    content: Range<usize>,
    quoted: bool,
    /// A string not closed before the line (or text) ends.
    open: bool,
}

struct KdlParser<'a> {
    text: &'a str,
    b: &'a [u8],
    i: usize,
}

impl KdlParser<'_> {
    /// Skips spaces, comments and line continuations; stops at a newline.
    fn space(&mut self) {
        loop {
            while self.i < self.b.len() && matches!(self.b[self.i], b' ' | b'\t' | b'\r') {
                self.i += 1;
            }
            let rest = &self.text[self.i..];
            if rest.starts_with("//") {
                self.i = line_end(self.text, self.i);
            } else if let Some(body) = rest.strip_prefix("/*") {
                self.i = body.find("*/").map_or(self.b.len(), |e| self.i + 2 + e + 2);
            } else if rest.starts_with('\\') {
                self.i = (line_end(self.text, self.i) + 1).min(self.b.len());
            } else {
                return;
            }
        }
    }

    /// Reads a value or identifier token at `self.i`.
    fn token(&mut self) -> Tok {
        let s = self.i;
        let b = self.b;
        if s >= b.len() {
            return Tok {
                range: s..s,
                content: s..s,
                quoted: false,
                open: false,
            };
        }
        let rest = &self.text[s..];
        let hashes = rest.bytes().take_while(|&c| c == b'#').count();
        if rest[hashes..].starts_with('"') {
            let q = s + hashes;
            let triple = self.text[q..].starts_with("\"\"\"");
            let content = if triple { q + 3 } else { q + 1 };
            let close = format!(
                "{}{}",
                if triple { "\"\"\"" } else { "\"" },
                "#".repeat(hashes)
            );
            let mut i = content;
            while i < b.len() {
                if hashes == 0 && b[i] == b'\\' {
                    i += 2;
                    continue;
                }
                if !triple && b[i] == b'\n' {
                    break;
                }
                if b[i..].starts_with(close.as_bytes()) {
                    self.i = i + close.len();
                    return Tok {
                        range: s..self.i,
                        content: content..i,
                        quoted: true,
                        open: false,
                    };
                }
                i += 1;
            }
            // An escape may have stepped into a character: end on its boundary.
            let mut i = i.min(b.len());
            while !self.text.is_char_boundary(i) {
                i += 1;
            }
            self.i = i;
            return Tok {
                range: s..i,
                content: content..i,
                quoted: true,
                open: true,
            };
        }
        let mut e = s;
        while e < b.len() && !is_kdl_stop(b[e]) {
            e += 1;
        }
        if e == s {
            e = s + self.text[s..].chars().next().map_or(1, char::len_utf8);
        }
        self.i = e;
        Tok {
            range: s..e,
            content: s..e,
            quoted: false,
            open: false,
        }
    }

    /// Reads nodes up to a `}` (when `nested`) or the end.
    fn nodes(&mut self, nested: bool, depth: usize) -> Vec<Node> {
        let mut out = Vec::new();
        loop {
            self.space();
            if self.i >= self.b.len() {
                return out;
            }
            match self.b[self.i] {
                b'\n' | b';' => self.i += 1,
                b'}' if nested => {
                    return out;
                }
                b'}' => self.i += 1,
                _ => {
                    let slashdash = self.text[self.i..].starts_with("/-");
                    if slashdash {
                        self.i += 2;
                        self.space();
                    }
                    if let Some(n) = self.node(depth) {
                        if !slashdash {
                            out.push(n);
                        }
                    }
                }
            }
        }
    }

    fn node(&mut self, depth: usize) -> Option<Node> {
        self.skip_annotation();
        let name = self.token();
        let mut node = Node {
            name: self.text[name.content.clone()].to_string(),
            name_range: name.range.clone(),
            entries: Vec::new(),
            header_end: self.b.len(),
            block: None,
            kids: Vec::new(),
        };
        loop {
            self.space();
            if self.i >= self.b.len() {
                node.header_end = self.b.len();
                return Some(node);
            }
            match self.b[self.i] {
                b'\n' | b';' | b'}' => {
                    node.header_end = self.i;
                    return Some(node);
                }
                b'{' => {
                    node.header_end = self.i;
                    self.i += 1;
                    let start = self.i;
                    node.kids = if depth < 128 {
                        self.nodes(true, depth + 1)
                    } else {
                        Vec::new()
                    };
                    node.block = Some(start..self.i);
                    if self.i < self.b.len() {
                        self.i += 1;
                    }
                    return Some(node);
                }
                _ => {
                    let slashdash = self.text[self.i..].starts_with("/-");
                    if slashdash {
                        self.i += 2;
                        self.space();
                        if self.i < self.b.len() && self.b[self.i] == b'{' {
                            // A children block left out: skip it.
                            self.i += 1;
                            let _ = self.nodes(true, depth + 1);
                            if self.i < self.b.len() {
                                self.i += 1;
                            }
                            continue;
                        }
                    }
                    self.skip_annotation();
                    let t = self.token();
                    let entry = if self.i < self.b.len() && self.b[self.i] == b'=' {
                        self.i += 1;
                        self.skip_annotation();
                        let value = if self.i < self.b.len()
                            && !matches!(self.b[self.i], b' ' | b'\t' | b'\n' | b'\r' | b';')
                        {
                            Some(self.token())
                        } else {
                            None
                        };
                        Entry::Prop {
                            key: self.text[t.content.clone()].to_string(),
                            key_range: t.range,
                            value,
                        }
                    } else {
                        Entry::Arg(t)
                    };
                    if !slashdash {
                        node.entries.push(entry);
                    }
                }
            }
        }
    }

    fn skip_annotation(&mut self) {
        if self.i < self.b.len() && self.b[self.i] == b'(' {
            self.i = self.text[self.i..]
                .find(')')
                .map_or(self.b.len(), |e| self.i + e + 1);
        }
    }
}

fn is_kdl_stop(b: u8) -> bool {
    matches!(
        b,
        b' ' | b'\t' | b'\r' | b'\n' | b'{' | b'}' | b'(' | b')' | b'=' | b';' | b'"' | b'\\'
    )
}

fn kdl_nodes(text: &str) -> Vec<Node> {
    let mut p = KdlParser {
        text,
        b: text.as_bytes(),
        i: 0,
    };
    p.nodes(false, 0)
}

/// The TOML-spelled path of a node under a table: `stage "x"` is `stages.x`, `escalation`
/// is `escalation`, `output` is `output`.
fn node_path(table: &[String], node: &Node, text: &str) -> Vec<String> {
    let mut p = table.to_vec();
    if let Shape::Table(t) = shape(table) {
        if t.field(&node.name).is_none() {
            for f in t.fields {
                match &f.ty {
                    Ty::Named(_, singular) if *singular == node.name => {
                        p.push(f.key.to_string());
                        let id = node.entries.iter().find_map(|e| match e {
                            Entry::Arg(t) => Some(text[t.content.clone()].to_string()),
                            _ => None,
                        });
                        p.push(id.unwrap_or_default());
                        return p;
                    }
                    Ty::Tables(_, singular) if *singular == node.name => {
                        p.push(f.key.to_string());
                        return p;
                    }
                    _ => {}
                }
            }
        }
    }
    p.push(node.name.clone());
    p
}

/// Whether a node under `table` is a named item (its first argument is its name).
fn is_named(table: &[String], name: &str) -> bool {
    match shape(table) {
        Shape::Table(t) => {
            t.field(name).is_none()
                && t.fields
                    .iter()
                    .any(|f| matches!(&f.ty, Ty::Named(_, s) if *s == name))
        }
        _ => false,
    }
}

/// The keys a KDL node writes: its properties and its children's names (TOML-spelled).
fn node_keys(node: &Node, path: &[String], text: &str) -> Vec<String> {
    let mut out: Vec<String> = node
        .entries
        .iter()
        .filter_map(|e| match e {
            Entry::Prop { key, .. } => Some(key.clone()),
            Entry::Arg(_) => None,
        })
        .collect();
    for k in &node.kids {
        let p = node_path(path, k, text);
        if let Some(seg) = p.get(path.len()) {
            out.push(seg.clone());
        }
    }
    out
}

fn kdl_kind(node: &Node, text: &str) -> Option<String> {
    for e in &node.entries {
        if let Entry::Prop {
            key,
            value: Some(v),
            ..
        } = e
        {
            if key == "kind" {
                return Some(text[v.content.clone()].to_string());
            }
        }
    }
    node.kids.iter().find(|k| k.name == "kind").and_then(|k| {
        k.entries.iter().find_map(|e| match e {
            Entry::Arg(t) => Some(text[t.content.clone()].to_string()),
            _ => None,
        })
    })
}

/// The cursor in a KDL workflow file.
pub(crate) fn kdl(text: &str, at: usize) -> Cursor {
    let at = clamp(text, at);
    let nodes = kdl_nodes(text);
    if in_comment(text, at) {
        return Cursor {
            table: Vec::new(),
            kind: None,
            written: Vec::new(),
            place: Place::Nothing,
        };
    }
    let mut table: Vec<String> = Vec::new();
    let mut parent: Option<&Node> = None;
    let mut list: &[Node] = &nodes;
    'outer: loop {
        for n in list {
            let path = node_path(&table, n, text);
            if let Some(block) = &n.block {
                if block.start <= at && (at < block.end || (at == block.end && at == text.len())) {
                    table = path;
                    parent = Some(n);
                    list = &n.kids;
                    continue 'outer;
                }
            }
            if n.name_range.start <= at && at <= n.header_end {
                return in_node(text, at, &table, parent, n, path);
            }
        }
        break;
    }
    // Between nodes: where a key (a child node) is written.
    let (written, kind) = match parent {
        Some(p) => (node_keys(p, &table, text), kdl_kind(p, text)),
        None => (
            nodes
                .iter()
                .map(|n| node_path(&[], n, text).first().cloned().unwrap_or_default())
                .collect(),
            None,
        ),
    };
    Cursor {
        table,
        kind,
        written,
        place: Place::Key {
            prefix: at..at,
            property: false,
        },
    }
}

/// The cursor on the line of node `n` (whose path is `path`), under `table`.
fn in_node(
    text: &str,
    at: usize,
    table: &[String],
    parent: Option<&Node>,
    n: &Node,
    path: Vec<String>,
) -> Cursor {
    let parent_written = |table: &[String]| match parent {
        Some(p) => node_keys(p, table, text),
        None => Vec::new(),
    };
    if at <= n.name_range.end {
        return Cursor {
            table: table.to_vec(),
            kind: parent.and_then(|p| kdl_kind(p, text)),
            written: parent_written(table),
            place: Place::Key {
                prefix: n.name_range.start..at,
                property: false,
            },
        };
    }
    let named = is_named(table, &n.name);
    let tableish = !matches!(shape(&path), Shape::Free);
    let own = |place: Place| Cursor {
        table: path.clone(),
        kind: kdl_kind(n, text),
        written: node_keys(n, &path, text),
        place,
    };
    let value_of_node = |prefix: Range<usize>, quoted: bool| -> Cursor {
        if quoted {
            return Cursor {
                table: table.to_vec(),
                kind: parent.and_then(|p| kdl_kind(p, text)),
                written: Vec::new(),
                place: in_string(text, table, &n.name, prefix.start, at),
            };
        }
        Cursor {
            table: table.to_vec(),
            kind: parent.and_then(|p| kdl_kind(p, text)),
            written: Vec::new(),
            place: Place::Value {
                key: n.name.clone(),
                prefix,
                quoted,
            },
        }
    };
    for (idx, e) in n.entries.iter().enumerate() {
        match e {
            Entry::Arg(t) => {
                let inside = t.range.start <= at
                    && (at < t.range.end || (at == t.range.end && (!t.quoted || t.open)));
                if !inside {
                    continue;
                }
                if t.quoted && at < t.content.start {
                    return own(Place::Nothing);
                }
                if named && idx == 0 {
                    return own(Place::Nothing);
                }
                if tableish && !t.quoted {
                    return own(Place::Key {
                        prefix: t.range.start..at,
                        property: true,
                    });
                }
                return value_of_node(t.content.start..at, t.quoted);
            }
            Entry::Prop {
                key,
                key_range,
                value,
            } => {
                if key_range.start <= at && at <= key_range.end {
                    return own(Place::Key {
                        prefix: key_range.start..at,
                        property: true,
                    });
                }
                let vstart = key_range.end + 1;
                let in_value = match value {
                    Some(v) => {
                        v.range.start <= at
                            && (at < v.range.end || (at == v.range.end && (!v.quoted || v.open)))
                    }
                    None => at == vstart,
                };
                if at >= vstart && in_value {
                    let c = own(Place::Nothing);
                    let place = match value {
                        Some(v) if v.quoted && at < v.content.start => Place::Nothing,
                        Some(v) if v.quoted => in_string(text, &path, key, v.content.start, at),
                        Some(v) => Place::Value {
                            key: key.clone(),
                            prefix: v.range.start..at,
                            quoted: false,
                        },
                        None => Place::Value {
                            key: key.clone(),
                            prefix: at..at,
                            quoted: false,
                        },
                    };
                    return Cursor { place, ..c };
                }
            }
        }
    }
    // In the spaces after the entries: a new entry.
    if named && !n.entries.iter().any(|e| matches!(e, Entry::Arg(_))) {
        return own(Place::Nothing);
    }
    if tableish {
        own(Place::Key {
            prefix: at..at,
            property: true,
        })
    } else {
        value_of_node(at..at, false)
    }
}

/// Whether `at` is inside a `//` or `/* */` comment of a KDL text (strings told apart).
fn in_comment(text: &str, at: usize) -> bool {
    let b = text.as_bytes();
    let mut i = 0;
    while i < at && i < b.len() {
        if b[i..].starts_with(b"//") {
            let e = line_end(text, i);
            if at <= e {
                return true;
            }
            i = e;
        } else if b[i..].starts_with(b"/*") {
            let e = text[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
            if at < e {
                return true;
            }
            i = e;
        } else if b[i] == b'"'
            || (b[i] == b'#' && text[i..].trim_start_matches('#').starts_with('"'))
        {
            let mut p = KdlParser { text, b, i };
            let t = p.token();
            i = t.range.end.max(i + 1);
        } else {
            i += 1;
        }
    }
    false
}

/// Names written in a KDL workflow (see [`toml_names`]).
pub(crate) fn kdl_names(text: &str) -> Names {
    let mut n = Names::default();
    fn walk(nodes: &[Node], table: &[String], text: &str, parent: Option<&str>, n: &mut Names) {
        for node in nodes {
            let path = node_path(table, node, text);
            let last = path.last().cloned().unwrap_or_default();
            match (path.get(table.len()).map(String::as_str), table.is_empty()) {
                (Some("params"), true) => n.params.push(last.clone()),
                (Some("agents"), true) => n.agents.push(last.clone()),
                (Some("exits"), true) => n.exits.push(last.clone()),
                (Some("stages"), _) if path.len() == table.len() + 2 => {
                    n.stages.push((last.clone(), parent.map(str::to_string)));
                    walk(&node.kids, &path, text, Some(&last), n);
                }
                _ => {}
            }
        }
    }
    walk(&kdl_nodes(text), &[], text, None, &mut n);
    n.dedup();
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> (String, usize) {
        // The cursor is the last `|` (templates have `|` filters before it).
        let i = text
            .rfind('|')
            .unwrap_or_else(|| panic!("no cursor in {text}"));
        (format!("{}{}", &text[..i], &text[i + 1..]), i)
    }

    fn t(text: &str) -> (Cursor, String) {
        let (s, i) = at(text);
        (toml(&s, i), s)
    }

    fn k(text: &str) -> (Cursor, String) {
        let (s, i) = at(text);
        (kdl(&s, i), s)
    }

    fn path(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn toml_keys_in_tables_and_written_ones() {
        let (c, s) = t("name = \"x\"\n[stages.a]\nkind = \"agent\"\nag|\nprompt = \"p\"\n");
        assert_eq!(c.table, path(&["stages", "a"]));
        assert_eq!(c.kind.as_deref(), Some("agent"));
        assert!(c.written.contains(&"kind".to_string()));
        assert!(c.written.contains(&"prompt".to_string()), "{:?}", c.written);
        match c.place {
            Place::Key { prefix, .. } => assert_eq!(&s[prefix], "ag"),
            p => panic!("{p:?}"),
        }
        let (c, _) = t("name = \"x\"\n|\n[stages.a]\n");
        assert_eq!(c.table, Vec::<String>::new());
        assert_eq!(c.written, path(&["name", "stages"]));
        let (c, s) = t("[stages.a]\noutput = { extract = \"json\", sch|");
        assert_eq!(c.table, path(&["stages", "a", "output"]));
        assert_eq!(c.written, path(&["extract"]));
        assert!(matches!(c.place, Place::Key { ref prefix, .. } if &s[prefix.clone()] == "sch"));
    }

    #[test]
    fn toml_values_and_code() {
        let (c, s) = t("[stages.a]\nkind = \"ag|\"\n");
        assert_eq!(c.table, path(&["stages", "a"]));
        assert!(
            matches!(c.place, Place::Value { ref key, ref prefix, quoted: true } if key == "kind" && &s[prefix.clone()] == "ag")
        );
        let (c, _) = t("[stages.a]\nneeds = [\"x\", \"|\"]\n");
        assert!(
            matches!(c.place, Place::Value { ref key, .. } if key == "needs"),
            "{c:?}"
        );
        let (c, s) = t("[stages.a]\nprompt = \"\"\"\nhello {{ stages.b.output.su| }}\n\"\"\"\n");
        match c.place {
            Place::Code(code) => {
                assert_eq!(code.chain, path(&["stages", "b", "output"]));
                assert_eq!(&s[code.prefix], "su");
                assert_eq!(code.key.as_deref(), Some("prompt"));
            }
            p => panic!("{p:?}"),
        }
        let (c, _) = t("[stages.a]\nuntil = \"stages.b.|\n");
        assert!(
            matches!(c.place, Place::Code(ref code) if code.chain == path(&["stages", "b"])),
            "{c:?}"
        );
        let (c, _) = t("[stages.a]\nprompt = \"{{ x | tr|\"\n");
        assert!(matches!(c.place, Place::Code(ref code) if code.after == After::Filter));
        let (c, _) = t("[stages.a]\nuntil = \"x is not def|\"\n");
        assert!(matches!(c.place, Place::Code(ref code) if code.after == After::Test));
        let (c, _) = t("[stages.a]\nprompt = \"no code | here\"\n# stages.|\n");
        assert_eq!(c.place, Place::Nothing);
        let (c, _) = t("[stages.a.route]\non = \"verdict\"\ncases = { PASS = \"br|\" }\n");
        assert_eq!(c.table, path(&["stages", "a", "route", "cases"]));
        assert!(matches!(c.place, Place::Value { ref key, .. } if key == "PASS"));
    }

    #[test]
    fn kdl_places() {
        let (c, s) = k("stage \"a\" kind=\"agent\" {\n    ag|\n}\n");
        assert_eq!(c.table, path(&["stages", "a"]));
        assert_eq!(c.kind.as_deref(), Some("agent"));
        assert!(c.written.contains(&"kind".to_string()));
        assert!(
            matches!(c.place, Place::Key { ref prefix, property: false } if &s[prefix.clone()] == "ag")
        );
        let (c, _) = k("stage \"a\" kind=\"ag|\"\n");
        assert_eq!(c.table, path(&["stages", "a"]));
        assert!(matches!(c.place, Place::Value { ref key, quoted: true, .. } if key == "kind"));
        let (c, _) = k("stage \"a\" kind=\"agent\" {\n    agent \"|\"\n}\n");
        assert!(
            matches!(c.place, Place::Value { ref key, .. } if key == "agent"),
            "{c:?}"
        );
        let (c, _) = k("stage \"l\" kind=\"loop\" {\n    until \"stages.b.output.|\"\n}\n");
        assert!(
            matches!(c.place, Place::Code(ref code) if code.chain == path(&["stages", "b", "output"]))
        );
        let (c, _) = k("stage \"a\" kind=\"agent\" {\n    output ex|\n}\n");
        assert_eq!(c.table, path(&["stages", "a", "output"]));
        assert!(
            matches!(c.place, Place::Key { property: true, .. }),
            "{c:?}"
        );
        let (c, _) = k("stage \"a\" kind=\"agent\" {\n    needs |\n}\n");
        assert!(
            matches!(c.place, Place::Value { ref key, .. } if key == "needs"),
            "{c:?}"
        );
        let (c, _) = k("// a comment stages.|\nname \"x\"\n");
        assert_eq!(c.place, Place::Nothing);
        let (c, _) = k("name \"x\"\n|");
        assert_eq!(c.table, Vec::<String>::new());
        assert!(c.written.contains(&"name".to_string()));
        let (c, _) =
            k("stage \"a\" kind=\"loop\" {\n    stage \"b\" kind=\"check\" {\n        ex|");
        assert_eq!(c.table, path(&["stages", "a", "stages", "b"]));
        assert_eq!(c.kind.as_deref(), Some("check"));
    }

    #[test]
    fn templates_in_prompt_files() {
        let s = "Hello {{ params.x }} and {% for p in stages.plan.output.phases %}{{ p.";
        match template(s, s.len()) {
            Place::Code(c) => {
                assert_eq!(c.chain, path(&["p"]));
                assert!(c.locals.contains(&"p".to_string()));
                assert!(c.locals.contains(&"loop".to_string()));
            }
            p => panic!("{p:?}"),
        }
        assert_eq!(template("{{ x }} stages.", 15), Place::Nothing);
        assert_eq!(template("{# {{ stages. #}", 13), Place::Nothing);
        assert_eq!(template("{{ 'stages.", 11), Place::Nothing);
    }

    #[test]
    fn names_from_text() {
        let n = toml_names(
            &std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/workflows/spider.toml"
            ))
            .unwrap_or_default(),
        );
        assert!(
            n.stages
                .contains(&("specify".to_string(), Some("specify_loop".to_string())))
        );
        assert!(n.params.contains(&"brief".to_string()));
        assert!(n.agents.contains(&"codex".to_string()));
        let n = kdl_names(
            &std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/workflows/wiggum-review.kdl"
            ))
            .unwrap_or_default(),
        );
        assert!(
            n.stages
                .contains(&("clean_tree".to_string(), Some("review_loop".to_string()))),
            "{n:?}"
        );
        assert!(n.params.contains(&"paths".to_string()));
        assert!(n.exits.contains(&"stuck".to_string()));
    }

    /// Texts with characters of several bytes, in strings, comments and bare words.
    #[test]
    fn wide_characters_anywhere_are_read() {
        let kdl_text = "// é 日本\nstage \"é\" kind=\"agent\" {\n    prompt \"\"\"\n    {{ stages.é }} \\é 日本\n    \"\"\"\n    description #\"日本 \\é\"# 日本=é\n    /* é */ needs é \"\\日\n}\n";
        let toml_text = "# é 日本\n[stages.\"é\"]\nkind = \"agent\"\nprompt = \"\"\"\n{{ stages.é }} \\é 日本 \"\"\"\ndescription = '日本' # é\nneeds = [\"\\日\", é]\n";
        for cut in 0..=kdl_text.len() {
            if kdl_text.is_char_boundary(cut) {
                let _ = kdl(kdl_text, cut);
                let _ = kdl(&kdl_text[..cut], cut);
                let _ = kdl_names(&kdl_text[..cut]);
            }
        }
        for cut in 0..=toml_text.len() {
            if toml_text.is_char_boundary(cut) {
                let _ = toml(toml_text, cut);
                let _ = toml(&toml_text[..cut], cut);
                let _ = toml_names(&toml_text[..cut]);
                let _ = template(toml_text, cut);
            }
        }
        let (c, _) = k("stage \"é\" kind=\"agent\" {\n    needs \"日本\" |\n}\n");
        assert!(
            matches!(c.place, Place::Value { ref key, .. } if key == "needs"),
            "{c:?}"
        );
    }

    /// Every cut of every shipped workflow (and prompt file) gives a context without a
    /// panic, and a prefix that ends at the cursor.
    #[test]
    fn every_cut_of_the_presets_is_read() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        for dir in ["workflows", "prompts/spider", "prompts/council"] {
            for e in std::fs::read_dir(root.join(dir))
                .into_iter()
                .flatten()
                .flatten()
            {
                files.push(e.path());
            }
        }
        assert!(files.len() > 10);
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            let ext = f.extension().and_then(|e| e.to_str()).unwrap_or("");
            // Every offset of the smaller presets (wiggum-review in both syntaxes), about
            // 2,500 offsets of the bigger ones.
            let step = if text.len() > 5_000 {
                text.len() / 2_500
            } else {
                1
            };
            for cut in (0..=text.len()).step_by(step) {
                if !text.is_char_boundary(cut) {
                    continue;
                }
                // The text as typed up to here, and the whole text with the cursor here.
                for (s, i) in [(&text[..cut], cut), (text.as_str(), cut)] {
                    let place = match ext {
                        "toml" => toml(s, i).place,
                        "kdl" => kdl(s, i).place,
                        _ => template(s, i),
                    };
                    let prefix = match &place {
                        Place::Key { prefix, .. } | Place::Value { prefix, .. } => {
                            Some(prefix.clone())
                        }
                        Place::Code(c) => Some(c.prefix.clone()),
                        Place::Nothing => None,
                    };
                    if let Some(p) = prefix {
                        assert!(
                            p.start <= p.end && p.end == i,
                            "{}:{cut}: {place:?}",
                            f.display()
                        );
                        assert!(s.get(p).is_some(), "{}:{cut}", f.display());
                    }
                }
            }
        }
    }
}
