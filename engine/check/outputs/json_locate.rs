//! Finding the byte range of the value at a JSON pointer in JSON text, so that a schema file's
//! problem points at the value at fault.

/// The byte range of the value at a JSON pointer (`/a/b`, with `~1` and `~0` escapes) in
/// JSON text; `0..0` when it is not there.
pub(super) fn pointer_range(text: &str, pointer: &str) -> std::ops::Range<usize> {
    let tokens: Vec<String> = pointer
        .split('/')
        .skip(1)
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect();
    json_locate(text, &tokens).unwrap_or(0..0)
}

/// Finds the byte range of the value at a JSON pointer (as tokens) in JSON text.
pub(super) fn json_locate(text: &str, path: &[String]) -> Option<std::ops::Range<usize>> {
    let b = text.as_bytes();
    let ws = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    // Returns the end of the value starting at `i`.
    fn skip(b: &[u8], i: usize) -> Option<usize> {
        let ws = |mut i: usize| {
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
            i
        };
        match *b.get(i)? {
            b'"' => {
                let mut j = i + 1;
                while j < b.len() {
                    match b[j] {
                        b'\\' => j += 2,
                        b'"' => return Some(j + 1),
                        _ => j += 1,
                    }
                }
                None
            }
            open @ (b'{' | b'[') => {
                let close = if open == b'{' { b'}' } else { b']' };
                let mut j = ws(i + 1);
                if b.get(j) == Some(&close) {
                    return Some(j + 1);
                }
                loop {
                    if open == b'{' {
                        j = ws(skip(b, j)?);
                        j = ws(j + 1); // the colon
                    }
                    j = ws(skip(b, j)?);
                    match *b.get(j)? {
                        b',' => j = ws(j + 1),
                        c if c == close => return Some(j + 1),
                        _ => return None,
                    }
                }
            }
            _ => {
                let mut j = i;
                while j < b.len()
                    && !matches!(b[j], b',' | b'}' | b']')
                    && !b[j].is_ascii_whitespace()
                {
                    j += 1;
                }
                Some(j)
            }
        }
    }
    let mut start = ws(0);
    for token in path {
        match *b.get(start)? {
            b'{' => {
                let mut j = ws(start + 1);
                loop {
                    if b.get(j) != Some(&b'"') {
                        return None;
                    }
                    let key_end = skip(b, j)?;
                    let key: String = serde_json::from_slice(&b[j..key_end]).ok()?;
                    let value = ws(ws(key_end) + 1);
                    if key == *token {
                        start = value;
                        break;
                    }
                    j = ws(skip(b, value)?);
                    if b.get(j) != Some(&b',') {
                        return None;
                    }
                    j = ws(j + 1);
                }
            }
            b'[' => {
                let n: usize = token.parse().ok()?;
                let mut j = ws(start + 1);
                for _ in 0..n {
                    j = ws(skip(b, j)?);
                    if b.get(j) != Some(&b',') {
                        return None;
                    }
                    j = ws(j + 1);
                }
                start = j;
            }
            _ => return None,
        }
    }
    Some(start..skip(b, start)?)
}
