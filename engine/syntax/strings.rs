//! Maps offsets in a decoded string value back to its literal in the source: escapes, line
//! continuations, the trimmed first newline and KDL's dedented multi-line strings make the
//! two differ, and a diagnostic about part of a string (a template error) should point at
//! that part where it is written.

/// Decodes a TOML or KDL string literal (`raw`, as written, possibly preceded by `key=` in
/// KDL), returning the decoded text and, for each byte of it and its end, the offset in `raw`
/// it comes from. `None` when `raw` is not a string literal this decoder understands.
pub fn decode(raw: &str, kdl: bool) -> Option<(String, Vec<usize>)> {
    let start = literal_start(raw, kdl)?;
    let lit = &raw[start..];
    let (mut text, mut offsets) = if kdl {
        kdl_string(lit)?
    } else {
        toml_string(lit)?
    };
    for o in &mut offsets {
        *o += start;
    }
    text.shrink_to_fit();
    Some((text, offsets))
}

/// Maps a byte range of the decoded text into `raw`, when `raw` decodes to `decoded`.
pub fn map_range(
    raw: &str,
    kdl: bool,
    decoded: &str,
    range: std::ops::Range<usize>,
) -> Option<std::ops::Range<usize>> {
    let (text, offsets) = decode(raw, kdl)?;
    if text != decoded || range.end > text.len() || range.start > range.end {
        return None;
    }
    let start = offsets[range.start];
    // The end of the last byte covered, so an escape at the end is covered whole.
    let end = if range.end > range.start {
        next_raw(&offsets, range.end - 1, raw.len())
    } else {
        start
    };
    Some(start..end.max(start))
}

/// The raw offset just after the source of decoded byte `i`.
fn next_raw(offsets: &[usize], i: usize, len: usize) -> usize {
    offsets
        .iter()
        .skip(i + 1)
        .copied()
        .find(|o| *o > offsets[i])
        .unwrap_or(len)
}

fn literal_start(raw: &str, kdl: bool) -> Option<usize> {
    let trimmed = raw.len() - raw.trim_start().len();
    let rest = &raw[trimmed..];
    if rest.starts_with(['"', '\'', '#']) {
        return Some(trimmed);
    }
    if kdl {
        // `key="..."`: the entry's span starts at the property name.
        let eq = rest.find('=')?;
        let after = &rest[eq + 1..];
        let ws = after.len() - after.trim_start().len();
        return Some(trimmed + eq + 1 + ws);
    }
    None
}

struct Out {
    text: String,
    offsets: Vec<usize>,
}

impl Out {
    fn new() -> Self {
        Out {
            text: String::new(),
            offsets: Vec::new(),
        }
    }

    fn push(&mut self, ch: char, at: usize) {
        for _ in 0..ch.len_utf8() {
            self.offsets.push(at);
        }
        self.text.push(ch);
    }

    fn finish(mut self, end: usize) -> (String, Vec<usize>) {
        self.offsets.push(end);
        (self.text, self.offsets)
    }
}

/// Decodes one escape at `body[i..]` (just after the backslash); returns the character (or
/// `None` for an escape that produces nothing) and the bytes consumed after the backslash.
fn escape(body: &str, i: usize, kdl: bool) -> Option<(Option<char>, usize)> {
    let rest = &body[i..];
    let c = rest.chars().next()?;
    let simple = match c {
        'n' => Some('\n'),
        't' => Some('\t'),
        'r' => Some('\r'),
        'b' => Some('\u{8}'),
        'f' => Some('\u{c}'),
        '"' => Some('"'),
        '\\' => Some('\\'),
        'e' => Some('\u{1b}'),
        's' if kdl => Some(' '),
        _ => None,
    };
    if let Some(ch) = simple {
        return Some((Some(ch), 1));
    }
    if c == 'u' && kdl {
        let close = rest.find('}')?;
        let hex = rest.get(2..close)?;
        let ch = char::from_u32(u32::from_str_radix(hex, 16).ok()?)?;
        return Some((Some(ch), close + 1));
    }
    if c == 'u' || c == 'U' {
        let n = if c == 'u' { 4 } else { 8 };
        let hex = rest.get(1..=n)?;
        let ch = char::from_u32(u32::from_str_radix(hex, 16).ok()?)?;
        return Some((Some(ch), n + 1));
    }
    if c.is_whitespace() {
        // A line continuation (TOML, at the end of a line) or a whitespace escape (KDL):
        // all whitespace, newlines included, up to the next other character.
        let skipped = rest.len() - rest.trim_start().len();
        if !kdl && !rest[..skipped].contains('\n') {
            return None;
        }
        return Some((None, skipped));
    }
    None
}

/// Decodes `body` (from `base` in the literal) with escapes, into `out`.
fn escaped(body: &str, base: usize, kdl: bool, out: &mut Out) -> Option<()> {
    let mut i = 0;
    while i < body.len() {
        let ch = body[i..].chars().next()?;
        if ch == '\\' {
            let (decoded, used) = escape(body, i + 1, kdl)?;
            if let Some(d) = decoded {
                out.push(d, base + i);
            }
            i += 1 + used;
        } else {
            out.push(ch, base + i);
            i += ch.len_utf8();
        }
    }
    Some(())
}

fn verbatim(body: &str, base: usize, out: &mut Out) {
    for (i, ch) in body.char_indices() {
        out.push(ch, base + i);
    }
}

/// Skips the newline right after an opening `"""` or `'''`.
fn first_newline(body: &str) -> usize {
    if body.starts_with("\r\n") {
        2
    } else if body.starts_with('\n') {
        1
    } else {
        0
    }
}

fn toml_string(lit: &str) -> Option<(String, Vec<usize>)> {
    let mut out = Out::new();
    for (delim, escapes) in [("\"\"\"", true), ("'''", false), ("\"", true), ("'", false)] {
        let Some(inner) = lit.strip_prefix(delim).and_then(|r| r.strip_suffix(delim)) else {
            continue;
        };
        let mut base = delim.len();
        let mut body = inner;
        if delim.len() == 3 {
            let skip = first_newline(body);
            base += skip;
            body = &body[skip..];
        }
        if escapes {
            escaped(body, base, false, &mut out)?;
        } else {
            verbatim(body, base, &mut out);
        }
        return Some(out.finish(base + body.len()));
    }
    None
}

fn kdl_string(lit: &str) -> Option<(String, Vec<usize>)> {
    let hashes = lit.len() - lit.trim_start_matches('#').len();
    let rest = &lit[hashes..];
    let closing = format!("\"{}", "#".repeat(hashes));
    let multi = rest.starts_with("\"\"\"");
    let open = if multi { 3 } else { 1 };
    if !rest.starts_with('"') {
        // A bare identifier string.
        let mut out = Out::new();
        verbatim(lit, 0, &mut out);
        return Some(out.finish(lit.len()));
    }
    let close = if multi {
        format!("\"\"{closing}")
    } else {
        closing
    };
    let inner = rest.get(open..)?.strip_suffix(close.as_str())?;
    let base = hashes + open;
    let raw = hashes > 0;
    let mut out = Out::new();
    if !multi {
        if raw {
            verbatim(inner, base, &mut out);
        } else {
            escaped(inner, base, true, &mut out)?;
        }
        return Some(out.finish(base + inner.len()));
    }
    // Multi-line: a newline after the opening quotes, the closing quotes on a line of their
    // own whose indentation every line loses; whitespace-only lines become empty.
    let skip = first_newline(inner);
    if skip == 0 {
        return None;
    }
    let body = &inner[skip..];
    let last_nl = body.rfind('\n')?;
    let indent = &body[last_nl + 1..];
    if !indent.chars().all(char::is_whitespace) {
        return None;
    }
    let content = body[..last_nl]
        .strip_suffix('\r')
        .unwrap_or(&body[..last_nl]);
    let mut at = base + skip;
    let lines: Vec<&str> = content.split('\n').collect();
    for (n, line) in lines.iter().enumerate() {
        if n > 0 {
            out.push('\n', at - 1);
        }
        let line_body = line.strip_suffix('\r').unwrap_or(line);
        if !line_body.trim().is_empty() {
            let rest = line_body.strip_prefix(indent)?;
            let start = at + indent.len();
            if raw {
                verbatim(rest, start, &mut out);
            } else {
                escaped(rest, start, true, &mut out)?;
            }
        }
        at += line.len() + 1;
    }
    let end = out.offsets.last().map_or(base, |o| o + 1);
    Some(out.finish(end))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(raw: &str, kdl: bool, decoded: &str, needle: &str) -> String {
        let i = decoded.find(needle).expect("the needle is in the text");
        let r = map_range(raw, kdl, decoded, i..i + needle.len()).expect("the literal decodes");
        raw[r].to_string()
    }

    #[test]
    fn maps_through_escapes_and_continuations() {
        let raw = r#""a\tb {{ x }}""#;
        assert_eq!(at(raw, false, "a\tb {{ x }}", "{{ x }}"), "{{ x }}");
        let raw = "\"\"\"\nline one \\\n    two {{ y }}\n\"\"\"";
        assert_eq!(
            at(raw, false, "line one two {{ y }}\n", "{{ y }}"),
            "{{ y }}"
        );
        let raw = "'''\nfirst\n{% if %}'''";
        assert_eq!(at(raw, false, "first\n{% if %}", "{% if %}"), "{% if %}");
        let raw = "prompt=\"say \\\"hi\\\" {{ z }}\"";
        assert_eq!(at(raw, true, "say \"hi\" {{ z }}", "{{ z }}"), "{{ z }}");
        let raw = "\"\"\"\n    one\n      {{ w }}\n    \"\"\"";
        assert_eq!(at(raw, true, "one\n  {{ w }}", "{{ w }}"), "{{ w }}");
        let raw = "#\"raw \\d {{ v }}\"#";
        assert_eq!(at(raw, true, "raw \\d {{ v }}", "{{ v }}"), "{{ v }}");
    }
}
