//! KDL syntax errors in ralph-flow's own words.
//!
//! The `kdl` crate reports what its parser expected where it stopped ("Expected quoted
//! string", "No closing '}' for child block", ...), often several times for one mistake and
//! sometimes far from it (a missing `{` shows up as a stray `}` at the end of the file). Here
//! each of its diagnostics is classified by the text it points at, brace problems are located
//! from the text itself (a light scan of strings, comments and braces, with the indentation of
//! each line), and what is only a consequence of an earlier mistake is dropped.

use std::ops::Range;

use kdl::KdlDiagnostic;

/// One mistake, explained: where it is, what is wrong, and what to write instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Mistake {
    pub(super) range: Range<usize>,
    pub(super) message: String,
    pub(super) label: String,
    pub(super) help: String,
    /// Later errors are likely consequences of this one: none after it is reported.
    fatal: bool,
    /// A mistake in how strings or comments are written, which throws brace counts off.
    lexical: bool,
    /// A brace left open, missing or extra.
    brace: bool,
    /// Where the parser noticed it, which orders mistakes: a mistake located before that point
    /// (a missing `{` found from a stray `}`) still comes after what the parser saw first.
    order: usize,
    /// What to write in place of `range` when the advice is to quote what is there.
    pub(super) quoted: Option<String>,
}

impl Mistake {
    fn new(range: Range<usize>, message: impl Into<String>) -> Self {
        Mistake {
            message: format!("invalid KDL: {}", message.into()),
            label: String::new(),
            help: String::new(),
            fatal: false,
            lexical: false,
            brace: false,
            order: range.start,
            range,
            quoted: None,
        }
    }

    /// Sets the quoted text to write in place of the mistake's range.
    fn quoting(mut self, quoted: String) -> Self {
        self.quoted = Some(quoted);
        self
    }

    fn label(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
        self
    }

    fn help(mut self, help: impl Into<String>) -> Self {
        self.help = help.into();
        self
    }

    /// Marks the mistake as throwing the rest of the file out of step.
    fn fatal(mut self) -> Self {
        self.fatal = true;
        self
    }

    fn lexical(mut self) -> Self {
        self.lexical = true;
        self
    }

    fn brace(mut self) -> Self {
        self.brace = true;
        self
    }
}

/// Explains the crate's diagnostics for `text`: at least one mistake, each on its own line,
/// none after one that throws the rest of the file out of step.
pub(super) fn explain(text: &str, found: &[KdlDiagnostic]) -> Vec<Mistake> {
    let cx = Cx::new(text);
    let mut mistakes: Vec<Mistake> = Vec::new();
    if let Some(m) = cx.control_character() {
        mistakes.push(m);
    }
    for d in found {
        let start = d.span.offset().min(text.len());
        let end = (start + d.span.len()).min(text.len());
        if let Some(mut m) = cx.classify(start..end, d.message.as_deref().unwrap_or_default(), d) {
            m.order = start;
            if !mistakes
                .iter()
                .any(|k| k.range == m.range && k.message == m.message)
            {
                mistakes.push(m);
            }
        }
    }
    // A string or comment written wrong throws brace counts off: its brace errors are echoes.
    if mistakes.iter().any(|m| m.lexical) {
        mistakes.retain(|m| !m.brace);
    }
    mistakes.sort_by_key(|m| (m.order, m.range.start));
    let mut kept: Vec<Mistake> = Vec::new();
    let mut withheld = false;
    for m in mistakes {
        if let Some(last) = kept.last() {
            if last.fatal {
                withheld = true;
                break;
            }
            if cx.line_of(last.range.start) == cx.line_of(m.range.start) {
                continue;
            }
        }
        kept.push(m);
    }
    if let Some(last) = kept.last_mut().filter(|_| withheld) {
        last.help
            .push_str(" (errors after this one are not reported: they are likely echoes of it)");
    }
    kept.sort_by_key(|m| (m.range.start, m.range.end));
    if kept.is_empty() {
        let at = found.first().map_or(0, |d| d.span.offset().min(text.len()));
        kept.push(cx.unexpected(at));
    }
    kept
}

/// What is known of one line of the text.
#[derive(Clone, Debug, Default)]
struct Line {
    start: usize,
    /// The offset of the line break (or of the end of the text).
    end: usize,
    /// The line begins inside a multi-line string or comment.
    starts_inside: bool,
    /// The first and last bytes that are code (not whitespace or comment) on the line.
    first_code: Option<usize>,
    last_code: Option<usize>,
}

/// The text, its lines, and its braces as a light scan reads them.
struct Cx<'t> {
    text: &'t str,
    lines: Vec<Line>,
    /// Matched braces: (offset of `{`, offset of `}`).
    pairs: Vec<(usize, usize)>,
    /// `{` never closed, outermost first.
    unclosed: Vec<usize>,
    /// `}` that close nothing.
    stray: Vec<usize>,
}

impl<'t> Cx<'t> {
    fn new(text: &'t str) -> Self {
        let mut scan = Scanner {
            b: text.as_bytes(),
            i: 0,
            lines: Vec::new(),
            line: Line::default(),
            stack: Vec::new(),
            pairs: Vec::new(),
            stray: Vec::new(),
        };
        scan.run();
        Cx {
            text,
            lines: scan.lines,
            pairs: scan.pairs,
            unclosed: scan.stack,
            stray: scan.stray,
        }
    }

    fn byte(&self, at: usize) -> u8 {
        self.text.as_bytes().get(at).copied().unwrap_or(0)
    }

    /// The index of the line holding `offset`.
    fn line_of(&self, offset: usize) -> usize {
        self.lines
            .partition_point(|l| l.start <= offset)
            .saturating_sub(1)
    }

    fn line_text(&self, n: usize) -> &'t str {
        self.lines
            .get(n)
            .and_then(|l| self.text.get(l.start..l.end))
            .unwrap_or_default()
            .trim_end_matches('\r')
    }

    /// The width of a line's leading whitespace (a tab counts 4).
    fn indent(&self, n: usize) -> usize {
        self.line_text(n)
            .bytes()
            .take_while(|b| *b == b' ' || *b == b'\t')
            .map(|b| if b == b'\t' { 4 } else { 1 })
            .sum()
    }

    /// The line's code, without indentation and without a trailing comment.
    fn code_of(&self, n: usize) -> &'t str {
        let Some(line) = self.lines.get(n) else {
            return "";
        };
        match (line.first_code, line.last_code) {
            (Some(a), Some(b)) if a <= b => self.text.get(a..=b).unwrap_or_default(),
            _ => "",
        }
    }

    /// The next line after `n` that holds code, if any.
    fn next_code_line(&self, n: usize) -> Option<usize> {
        (n + 1..self.lines.len()).find(|&m| self.lines[m].first_code.is_some())
    }

    /// The line before `n` that holds code, if any.
    fn previous_code_line(&self, n: usize) -> Option<usize> {
        (0..n).rev().find(|&m| self.lines[m].first_code.is_some())
    }

    /// The first word of a line: the name of the node it starts.
    fn node_name(&self, n: usize) -> &'t str {
        let code = self.code_of(n);
        let end = code
            .find(|c: char| c.is_whitespace() || c == '{' || c == '=')
            .unwrap_or(code.len());
        &code[..end]
    }

    /// The number a person reads for line `n` (lines count from 1).
    fn line_no(&self, n: usize) -> usize {
        n + 1
    }

    /// The first control character KDL refuses, when the text holds one: a binary file or a
    /// copy-paste accident; everything after it is unreadable.
    fn control_character(&self) -> Option<Mistake> {
        let (at, c) = self
            .text
            .char_indices()
            .find(|(_, c)| matches!(*c, '\u{0}'..='\u{8}' | '\u{e}'..='\u{1f}' | '\u{7f}'))?;
        Some(
            Mistake::new(
                at..at + c.len_utf8(),
                format!(
                    "the control character U+{:04X} is not allowed in KDL text",
                    c as u32
                ),
            )
            .label("control character")
            .help("a workflow file is plain text: remove the character (is this a binary file?)")
            .fatal()
            .lexical(),
        )
    }

    /// A mistake with no better explanation: says what is there, never the parser's words.
    fn unexpected(&self, at: usize) -> Mistake {
        let token = self.token_at(at);
        let shown = if token.is_empty() {
            "the end of the file".to_string()
        } else {
            format!("`{token}`")
        };
        Mistake::new(
            at..at + token.len(),
            format!("KDL cannot read {shown} here"),
        )
        .label("not valid KDL")
        .help("a KDL node is a name, then values and key=value properties separated by spaces, then an optional { block }; https://kdl.dev describes KDL v2")
    }

    /// The word at `at`: up to the next whitespace, at most to the end of the line.
    fn token_at(&self, at: usize) -> &'t str {
        let rest = self.text.get(at..).unwrap_or_default();
        let end = rest.find(|c: char| c.is_whitespace()).unwrap_or(rest.len());
        &rest[..end]
    }

    /// Classifies one of the crate's diagnostics; `None` when it only echoes another.
    fn classify(&self, span: Range<usize>, message: &str, d: &KdlDiagnostic) -> Option<Mistake> {
        let at = span.start;
        let written = self.text.get(span.clone()).unwrap_or_default();
        let c = self.byte(at);
        if message.contains("Closing '}' was not found") {
            return None;
        }
        if message.contains("No closing '}'") {
            return self.brace_mistake();
        }
        if message.contains("Expected end of document") {
            return match c {
                b'}' => self.brace_mistake(),
                b'=' => Some(self.equals(at)),
                b'[' => Some(self.bracket_list(at)),
                _ => Some(self.unexpected(at)),
            };
        }
        if message.contains("child block instead of node name") {
            return Some(self.block_without_node(at));
        }
        if message.contains("Unexpected newline in single-line quoted string") {
            return Some(self.newline_in_string(at));
        }
        if message.contains("Expected property value") {
            return Some(self.property_without_value(span.end));
        }
        if message.contains("Multi-line string opening quotes") {
            return Some(self.multiline_open(at));
        }
        if message.contains("multiline string prefix")
            || message.contains("multiline raw string prefix")
        {
            return Some(self.multiline_indent(at));
        }
        if message.contains("multiline string closing quotes")
            || message.contains("multi-line string")
            || message.contains("multiline raw string")
            || (written.starts_with("\"\"\"") && !message.contains("node name"))
        {
            return Some(self.multiline_close(at));
        }
        if message.contains("multi-line comment") {
            return Some(
                Mistake::new(at..at + 2, "this `/*` comment is never closed")
                    .label("comment opened here")
                    .help("close the comment with `*/`, or use `//` comments, which end at the line's end")
                    .fatal()
                    .lexical(),
            );
        }
        if message.contains("Single-line raw strings cannot look like multi-line") {
            return Some(
                Mistake::new(span, "a raw string `#\"\"\"` on one line")
                    .label("raw string")
                    .help("a multi-line raw string puts its text on the lines after `#\"\"\"` and closes with `\"\"\"#` on a line of its own; for a one-line text write #\"...\"#"),
            );
        }
        if message.contains("type annotation") || c == b'(' {
            return Some(
                Mistake::new(at..at + self.token_at(at).len(), "`(` starts a KDL type annotation here")
                    .label("type annotation")
                    .help(format!("KDL reads `(type)value`, like `(u8)10`; to write text with parentheses, quote it: {}", quote(self.token_at(at)))),
            );
        }
        if c == b'#' {
            let keyword_help = d.help.as_deref().is_some_and(|h| h.contains("keywords"));
            if message.contains("node name") || is_comment_hash(self.text, at) || !keyword_help {
                return Some(self.hash_comment(at));
            }
            return Some(self.unknown_keyword(at));
        }
        if message.contains("node name") {
            return Some(match c {
                b'[' => self.bracket_list(at),
                b'=' => self.equals(at),
                b'"' => return None,
                _ => self.unexpected(at),
            });
        }
        Some(self.bad_value(span, message))
    }

    /// A value the parser could not read, or that is followed by something that is no
    /// separator: a KDL v1 spelling, a comma, a colon, a bad escape, a word to quote.
    fn bad_value(&self, span: Range<usize>, message: &str) -> Mistake {
        let at = span.start;
        let token = self.token_at(at);
        let line_end = self.lines[self.line_of(at)].end;
        // Property values: `key=value` where the parser points at the value.
        if let Some(word) = ["true", "false", "null"]
            .iter()
            .find(|w| token == **w || token.strip_suffix(['}', ';', ',']) == Some(**w))
        {
            return Mistake::new(
                at..at + word.len(),
                format!("`{word}` is the KDL v1 spelling; KDL v2 writes `#{word}`"),
            )
            .label(format!("write `#{word}`"))
            .help("KDL v2 spells its keywords `#true`, `#false` and `#null`; a bare word is a string, and `true`, `false` and `null` may not be bare words");
        }
        if token.starts_with("r\"") || token.starts_with("r#") {
            let end = raw_v1_end(self.text, at).unwrap_or(at + token.len());
            return Mistake::new(
                at..end,
                "`r\"...\"` is a KDL v1 raw string; KDL v2 writes `#\"...\"#`",
            )
            .label("KDL v1 raw string")
            .help("write the raw string as #\"...\"# (add more `#` on both sides if the text holds `\"#`)");
        }
        if self.byte(at) == b'"' {
            match quoted_end(self.text, at) {
                Quoted::Closed(end) => return self.after_value(at, end),
                Quoted::BadEscape(esc) => return self.bad_escape(at, esc),
                Quoted::Open => return self.newline_in_string(at),
            }
        }
        // A bare word: up to the first character a bare word cannot hold.
        let word_end = bare_end(self.text, at).min(line_end);
        let next = self.byte(word_end);
        if word_end > at && matches!(next, b',') {
            return self.comma(word_end);
        }
        if word_end > at && next == b':' {
            return self.colon(word_end);
        }
        let word = self
            .text
            .get(at..(at + token.len()).min(line_end))
            .unwrap_or_default();
        let word = word.trim_end_matches([',', ';', '}']);
        let numberish = word.starts_with(|c: char| c.is_ascii_digit())
            || (word.starts_with(['-', '+', '.'])
                && word[1..].starts_with(|c: char| c.is_ascii_digit()));
        let what = if numberish
            || message.contains("integer")
            || message.contains("float")
            || message.contains("number")
        {
            format!("`{word}` is not a number KDL can read")
        } else {
            format!("`{word}` must be quoted")
        };
        Mistake::new(at..at + word.len(), what)
            .label("write this as a quoted string")
            .help(format!(
                "write {}: a bare word may not start with a digit, nor hold spaces or any of ( ) [ ] {{ }} / \\ \" # ; =",
                quote(word)
            ))
            .quoting(quote(word))
    }

    /// What follows a closed quoted string at `end` (the offset after its closing quote).
    fn after_value(&self, at: usize, end: usize) -> Mistake {
        match self.byte(end) {
            b',' => self.comma(end),
            b':' => self.colon(end),
            b']' => self.bracket_list(at),
            _ => {
                let token = self.token_at(end);
                Mistake::new(
                    end..end + token.len().max(1),
                    format!("`{token}` follows a value without a space"),
                )
                .label("add a space before this")
                .help("KDL separates values with spaces; to make it part of the text, put it inside the quotes")
            }
        }
    }

    /// A comma at `at`, between values.
    fn comma(&self, at: usize) -> Mistake {
        let n = self.line_of(at);
        let fixed = without_commas(self.code_of(n));
        Mistake::new(at..at + 1, "KDL separates values with spaces, not commas")
            .label("remove this comma")
            .help(format!("write `{fixed}`"))
    }

    /// A colon at `at` after a key: JSON or YAML habits.
    fn colon(&self, at: usize) -> Mistake {
        let n = self.line_of(at);
        let start = self.lines[n].first_code.unwrap_or(at);
        let key = self
            .text
            .get(start..at)
            .unwrap_or_default()
            .trim()
            .trim_matches('"');
        let key = key.rsplit(char::is_whitespace).next().unwrap_or(key);
        let value_at = at
            + 1
            + self
                .text
                .get(at + 1..)
                .unwrap_or_default()
                .find(|c: char| c != ' ' && c != '\t')
                .unwrap_or(0);
        let rest = match quoted_end(self.text, value_at) {
            Quoted::Closed(end) if self.byte(value_at) == b'"' => {
                self.text.get(value_at..end).unwrap_or_default()
            }
            _ => self.token_at(value_at).trim_end_matches(','),
        };
        Mistake::new(
            at..at + 1,
            "KDL does not put `:` between a key and its value",
        )
        .label("remove this `:`")
        .help(format!(
            "write `{key} {rest}` for a node of its own, or `{key}={rest}` for a property of a node"
        ))
    }

    /// An invalid escape `\x` at `esc` in the string starting at `at`.
    fn bad_escape(&self, at: usize, esc: usize) -> Mistake {
        let shown: String = self
            .text
            .get(esc..)
            .unwrap_or_default()
            .chars()
            .take(2)
            .collect();
        let line_end = self.lines[self.line_of(at)].end;
        let body = self.text.get(at..line_end).unwrap_or_default();
        let close = body
            .get(1..)
            .and_then(|b| b.find('"'))
            .map_or(body.len(), |i| i + 2);
        let raw = format!("#{}#", body.get(..close).unwrap_or(body));
        Mistake::new(
            esc..esc + shown.len(),
            format!("`{shown}` is not an escape KDL knows"),
        )
        .label("invalid escape")
        .help(format!(
            "in a \"...\" string a backslash starts an escape (\\n, \\t, \\\", \\\\, \\u{{...}}): write `\\{shown}` for a backslash, or use a raw string, in which a backslash is plain text: {raw}"
        ))
        .lexical()
    }

    /// A quoted string at `at` that runs to the end of its line.
    fn newline_in_string(&self, at: usize) -> Mistake {
        let n = self.line_of(at);
        let line_end = self.lines[n].end;
        // The string goes on on the next line when that line closes it: an odd number of quotes.
        let continued = self.lines.get(n + 1).is_some_and(|l| {
            let next = self.text.get(l.start..l.end).unwrap_or_default();
            next.matches('"')
                .count()
                .saturating_sub(next.matches("\\\"").count())
                % 2
                == 1
        });
        let message = if continued {
            "a line break inside a quoted string"
        } else {
            "this string is never closed"
        };
        Mistake::new(at..line_end.max(at + 1), message)
            .label("the string is still open at the end of this line")
            .help("a \"...\" string ends on the line it starts: close it with `\"` on this line; for text on several lines write the line breaks as \\n, or use a multi-line string: `\"\"\"` at the end of the line, the text on the lines after it, then `\"\"\"` on a line of its own")
            .fatal()
            .lexical()
    }

    /// `key=` with nothing readable after it; `end` is where the parser stopped.
    fn property_without_value(&self, end: usize) -> Mistake {
        let before = self.text.get(..end).unwrap_or_default();
        // `key=#word`: the parser stops after the `#` of a keyword it does not know.
        if let Some(hash) = before.trim_end().strip_suffix('#') {
            if hash.ends_with('=') && !is_comment_hash(self.text, hash.len()) {
                return self.unknown_keyword(hash.len());
            }
        }
        let eq = before
            .trim_end()
            .len()
            .checked_sub(1)
            .filter(|&i| self.byte(i) == b'=');
        let Some(eq) = eq else {
            return self.unexpected(end);
        };
        let key_start = before[..eq]
            .rfind(|c: char| c.is_whitespace())
            .map_or(0, |i| i + 1);
        let key = &before[key_start..eq];
        if self.byte(end) == b'#' && !is_comment_hash(self.text, end) {
            return self.unknown_keyword(end);
        }
        Mistake::new(
            key_start..eq + 1,
            format!("the property `{key}=` has no value"),
        )
        .label("the value is missing")
        .help(format!(
            "write the value right after the `=`, e.g. `{key}=\"...\"`, or remove `{key}=`"
        ))
        .fatal()
    }

    /// A `#` that does not start a keyword or a raw string: a TOML or shell comment.
    fn hash_comment(&self, at: usize) -> Mistake {
        Mistake::new(at..at + 1, "`#` does not start a comment in KDL")
            .label("write `//` here")
            .help("KDL comments are `// ...` to the end of the line or `/* ... */`; `/-` before a node, a value or a block comments that out")
    }

    /// `#word` that is no KDL keyword.
    fn unknown_keyword(&self, at: usize) -> Mistake {
        let word = self
            .text
            .get(at..bare_end(self.text, at + 1))
            .unwrap_or("#");
        Mistake::new(at..at + word.len(), format!("`{word}` is not a KDL keyword"))
            .label("unknown keyword")
            .help(format!(
                "the KDL v2 keywords are #true, #false, #null, #inf, #-inf and #nan; to write text, quote it: {}",
                quote(word)
            ))
            .quoting(quote(word))
    }

    /// An `=` after a node's name (`name = "x"`), or one on its own.
    fn equals(&self, at: usize) -> Mistake {
        let n = self.line_of(at);
        if let Some(m) = self.toml_file() {
            return m;
        }
        let code = self.code_of(n);
        if let Some((key, value)) = code.split_once('=') {
            let (key, value) = (key.trim(), value.trim());
            if !key.is_empty() && !key.contains(char::is_whitespace) && self.node_name(n) == key {
                let value = if value.starts_with('[') {
                    without_commas(value.trim_start_matches('[').trim_end_matches(']'))
                        .trim()
                        .to_string()
                } else {
                    value.to_string()
                };
                return Mistake::new(
                    at..at + 1,
                    "a node's value follows its name without `=`",
                )
                .label("remove this `=`")
                .help(format!("write `{key} {value}` (`key = value` is TOML; in KDL `key=value` is a property of a node, as in `stage \"build\" kind=\"command\"`)"));
            }
        }
        Mistake::new(at..at + 1, "an `=` without a property name before it")
            .label("unexpected `=`")
            .help("a property is written `key=value` after its node's name, as in `stage \"build\" kind=\"command\"`")
    }

    /// A `[` in KDL text: a TOML table header, or a TOML or JSON list.
    fn bracket_list(&self, at: usize) -> Mistake {
        let n = self.line_of(at);
        if let Some(m) = self.toml_file() {
            return m;
        }
        let code = self.code_of(n);
        let fixed = without_commas(&code.replace(['[', ']'], " ").replace(" = ", " "));
        let fixed = fixed.split_whitespace().collect::<Vec<_>>().join(" ");
        Mistake::new(at..at + 1, "KDL has no `[...]` lists")
            .label("a list is written without brackets")
            .help(format!(
                "write the items as values after the key, separated by spaces: `{fixed}`"
            ))
    }

    /// When the text reads as TOML (a `[table]` header, or two `key = value` lines), one
    /// mistake at its first TOML line.
    fn toml_file(&self) -> Option<Mistake> {
        let mut headers = 0;
        let mut keys = 0;
        let mut first = None;
        for n in 0..self.lines.len() {
            let code = self.code_of(n).trim();
            let header = (code.starts_with('[')
                && code.ends_with(']')
                && code.len() > 2
                && !code[1..code.len() - 1].contains([' ', '"', ',']))
                || code.starts_with("[[");
            let key = code.split_once('=').is_some_and(|(k, v)| {
                let k = k.trim_end();
                !k.is_empty()
                    && k.len() < code.len()
                    && k.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"_-.\"".contains(&b))
                    && code.as_bytes().get(k.len()) == Some(&b' ')
                    && v.starts_with(' ')
            });
            if header {
                headers += 1;
            }
            if key {
                keys += 1;
            }
            if (header || key) && first.is_none() {
                first = Some(n);
            }
        }
        let first = first?;
        if headers == 0 && keys < 2 {
            return None;
        }
        let start = self.lines[first]
            .first_code
            .unwrap_or(self.lines[first].start);
        let end = self.lines[first].last_code.map_or(start, |e| e + 1);
        Some(
            Mistake::new(start..end, "this is TOML, not KDL")
                .label("TOML syntax")
                .help("a `.kdl` file is read as KDL: if the file is TOML, name it `.toml`; `ralph-flow fmt --to kdl FILE.toml` converts it (in KDL, `[stages.build]` is `stage \"build\" { ... }` and `key = \"value\"` is `key \"value\"`)")
                .fatal(),
        )
    }

    /// A `{` where a node's name should be: the block's node is on the line above.
    fn block_without_node(&self, at: usize) -> Mistake {
        let n = self.line_of(at);
        let alone = self.lines[n].first_code == Some(at);
        if let Some(prev) = self.previous_code_line(n).filter(|_| alone) {
            let code = self.code_of(prev);
            if !code.ends_with(['{', '}', ';']) {
                return Mistake::new(at..at + 1, "a block's `{` must be on the line of its node")
                    .label("KDL reads this `{` as a block without a node")
                    .help(format!(
                        "end line {} with the `{{`: `{code} {{`",
                        self.line_no(prev)
                    ));
            }
        }
        Mistake::new(at..at + 1, "a block `{` without a node name before it")
            .label("block without a node")
            .help("a block belongs to a node: write the node's name (and its values) before the `{`, as in `stage \"build\" kind=\"command\" {`")
    }

    /// A multi-line string whose `"""` is followed by text on its line.
    fn multiline_open(&self, at: usize) -> Mistake {
        Mistake::new(at..at + 3, "the text of a multi-line string starts on the line after its `\"\"\"`")
            .label("break the line after `\"\"\"`")
            .help("write `\"\"\"`, a line break, the text, then `\"\"\"` on a line of its own; for text on one line, use \"...\"")
            .fatal()
            .lexical()
    }

    /// A multi-line string whose closing `"""` is not alone on its line, or is missing.
    fn multiline_close(&self, at: usize) -> Mistake {
        let body_start = (at + 3).min(self.text.len());
        let close = self
            .text
            .get(body_start..)
            .and_then(|t| t.find("\"\"\""))
            .map(|i| body_start + i);
        match close {
            Some(close) => {
                let n = self.line_of(close);
                let line_start = self.lines[n].start;
                let before = self.text.get(line_start..close).unwrap_or_default();
                let at_close = if before.trim().is_empty() { at } else { close };
                Mistake::new(
                    at_close..at_close + 3,
                    "the closing `\"\"\"` of a multi-line string must be on a line of its own",
                )
                .label("put this `\"\"\"` on its own line")
                .help("end the text with a line break, then write `\"\"\"` alone on the next line; its indentation is removed from every line of the text")
                .fatal()
                .lexical()
            }
            None => Mistake::new(at..at + 3, "this multi-line string is never closed")
                .label("opened here")
                .help("close it with `\"\"\"` on a line of its own after the text")
                .fatal()
                .lexical(),
        }
    }

    /// A multi-line string line that does not start with the closing `"""`'s indentation.
    fn multiline_indent(&self, at: usize) -> Mistake {
        let first = self.line_of(at);
        let body_start = (at + 3).min(self.text.len());
        let close = self
            .text
            .get(body_start..)
            .and_then(|t| t.find("\"\"\""))
            .map(|i| body_start + i);
        let mut range = at..at + 3;
        let mut prefix_shown = String::from("the indentation of the closing `\"\"\"`");
        if let Some(close) = close {
            let last = self.line_of(close);
            let prefix = self
                .text
                .get(self.lines[last].start..close)
                .unwrap_or_default();
            if prefix.trim().is_empty() {
                prefix_shown = format!("the {} of the closing `\"\"\"`", describe_indent(prefix));
                if let Some(bad) = (first + 1..last).find(|&m| {
                    let t = self.line_text(m);
                    !t.trim().is_empty() && !t.starts_with(prefix)
                }) {
                    let s = self.lines[bad].start;
                    range = s..s + self.line_text(bad).len().max(1);
                }
            }
        }
        Mistake::new(range, "a line of a multi-line string is indented less than its closing `\"\"\"`")
            .label("indented less than the closing `\"\"\"`")
            .help(format!("every line of a multi-line string starts with {prefix_shown}, which is removed from the text: indent this line at least as far, or move the closing `\"\"\"` left"))
            .fatal()
            .lexical()
    }

    /// The mistake behind a brace the parser could not match: an unclosed `{`, a missing `{`
    /// (its children then end the enclosing block, and a `}` later closes nothing), a stray
    /// `}`. `None` when the scan finds every brace matched (the parser's complaint then echoes
    /// another mistake).
    fn brace_mistake(&self) -> Option<Mistake> {
        if let Some(&stray) = self.stray.first() {
            let stray_line = self.line_of(stray);
            if let Some(n) = (0..stray_line).rev().find(|&n| self.lacks_open(n)) {
                let (start, end) = (
                    self.lines[n].first_code.unwrap_or(self.lines[n].start),
                    self.lines[n].last_code.map_or(self.lines[n].end, |e| e + 1),
                );
                let name = self.node_name(n);
                let child = self
                    .next_code_line(n)
                    .map(|m| self.node_name(m))
                    .unwrap_or_default();
                return Some(
                    Mistake::new(
                        start..end,
                        format!("`{name}` has children below it but no `{{`"),
                    )
                    .label("`{` missing at the end of this line")
                    .help(format!(
                        "end the line with `{{`: `{} {{`; the indented lines below it (`{child}` ...) are its children, and a `}}` closes them",
                        self.code_of(n),
                    ))
                    .brace(),
                );
            }
            return Some(
                Mistake::new(stray..stray + 1, "this `}` closes no block")
                    .label("no `{` is open here")
                    .help("remove this `}`, or add the `{` it should close at the end of its node's line")
                    .brace(),
            );
        }
        if self.unclosed.is_empty() {
            return None;
        }
        // The block left open is the one whose `}` sits left of its own line: that `}`
        // belongs to an enclosing block.
        let open = self
            .pairs
            .iter()
            .find(|(open, close)| {
                let (o, c) = (self.line_of(*open), self.line_of(*close));
                self.lines[c].first_code == Some(*close) && self.indent(c) < self.indent(o)
            })
            .map(|(open, _)| *open)
            .or_else(|| self.unclosed.last().copied())?;
        let n = self.line_of(open);
        let name = self.node_name(n);
        let before = (n + 1..self.lines.len()).find(|&m| {
            self.lines[m].first_code.is_some()
                && !self.lines[m].starts_inside
                && self.indent(m) <= self.indent(n)
        });
        let place = match before {
            Some(m) => format!(
                "before line {} (`{}`)",
                self.line_no(m),
                shorten(self.code_of(m))
            ),
            None => "at the end of the file".to_string(),
        };
        Some(
            Mistake::new(
                open..open + 1,
                format!("the block of `{name}` is never closed"),
            )
            .label("this `{` has no matching `}`")
            .help(format!(
                "add a `}}` on a line of its own {place}, after the block's last child"
            ))
            .fatal()
            .brace(),
        )
    }

    /// Whether line `n` is a node whose children follow on more indented lines, but which
    /// does not open a block.
    fn lacks_open(&self, n: usize) -> bool {
        let line = &self.lines[n];
        let (Some(first), Some(last)) = (line.first_code, line.last_code) else {
            return false;
        };
        if line.starts_inside
            || matches!(self.byte(last), b'{' | b'\\' | b';')
            || self.byte(first) == b'}'
        {
            return false;
        }
        let Some(m) = self.next_code_line(n) else {
            return false;
        };
        let next = &self.lines[m];
        !next.starts_inside
            && self.indent(m) > self.indent(n)
            && next.first_code.is_some_and(|f| self.byte(f) != b'}')
    }
}

/// Reads strings, comments and braces just well enough to match braces and find each line's
/// code; never fails.
struct Scanner<'t> {
    b: &'t [u8],
    i: usize,
    lines: Vec<Line>,
    line: Line,
    stack: Vec<usize>,
    pairs: Vec<(usize, usize)>,
    stray: Vec<usize>,
}

impl Scanner<'_> {
    fn at(&self, i: usize) -> u8 {
        self.b.get(i).copied().unwrap_or(0)
    }

    fn code(&mut self, i: usize) {
        if self.line.first_code.is_none() {
            self.line.first_code = Some(i);
        }
        self.line.last_code = Some(i);
    }

    /// Ends the line at the line break at `i`; the next one starts inside a string or comment
    /// when `inside`.
    fn newline(&mut self, i: usize, inside: bool) {
        self.line.end = i;
        let next = Line {
            start: i + 1,
            end: self.b.len(),
            starts_inside: inside,
            ..Line::default()
        };
        self.lines.push(std::mem::replace(&mut self.line, next));
    }

    fn run(&mut self) {
        self.line.end = self.b.len();
        while self.i < self.b.len() {
            let i = self.i;
            let c = self.b[i];
            match c {
                b'\n' => {
                    self.newline(i, false);
                    self.i += 1;
                }
                b' ' | b'\t' | b'\r' => self.i += 1,
                b'/' if self.at(i + 1) == b'/' => {
                    while self.i < self.b.len() && self.b[self.i] != b'\n' {
                        self.i += 1;
                    }
                }
                b'/' if self.at(i + 1) == b'*' => self.block_comment(),
                b'/' if self.at(i + 1) == b'-' => self.i += 2,
                b'"' => self.quoted(),
                b'#' | b'r' if self.raw_start(i).is_some() => self.raw(),
                b'{' => {
                    self.code(i);
                    self.stack.push(i);
                    self.i += 1;
                }
                b'}' => {
                    self.code(i);
                    match self.stack.pop() {
                        Some(open) => self.pairs.push((open, i)),
                        None => self.stray.push(i),
                    }
                    self.i += 1;
                }
                _ => {
                    // A whole character, so that a line's code ends on a character boundary.
                    let len = match c {
                        0xf0.. => 4,
                        0xe0.. => 3,
                        0xc0.. => 2,
                        _ => 1,
                    };
                    let end = (i + len).min(self.b.len());
                    self.code(i);
                    self.line.last_code = Some(end - 1);
                    self.i = end;
                }
            }
        }
        self.lines.push(std::mem::take(&mut self.line));
    }

    fn block_comment(&mut self) {
        let mut depth = 0usize;
        while self.i < self.b.len() {
            let (c, d) = (self.b[self.i], self.at(self.i + 1));
            if c == b'/' && d == b'*' {
                depth += 1;
                self.i += 2;
            } else if c == b'*' && d == b'/' {
                depth -= 1;
                self.i += 2;
                if depth == 0 {
                    return;
                }
            } else {
                if c == b'\n' {
                    self.newline(self.i, true);
                }
                self.i += 1;
            }
        }
    }

    /// A `"..."` or `"""..."""` string; a single-line one ends at its line's end at the latest.
    fn quoted(&mut self) {
        let start = self.i;
        self.code(start);
        let multi = self.b[start..].starts_with(b"\"\"\"");
        if multi {
            self.code(start + 2);
        }
        self.i += if multi { 3 } else { 1 };
        while self.i < self.b.len() {
            let c = self.b[self.i];
            match c {
                b'\\' if self.at(self.i + 1).is_ascii_whitespace() => {
                    // `\` then whitespace (line breaks too) is skipped, in every string.
                    self.i += 1;
                    while self.i < self.b.len() && self.b[self.i].is_ascii_whitespace() {
                        if self.b[self.i] == b'\n' {
                            self.newline(self.i, true);
                        }
                        self.i += 1;
                    }
                }
                b'\\' => self.i += 2,
                b'"' if !multi => {
                    self.code(self.i);
                    self.i += 1;
                    return;
                }
                b'"' if self.b[self.i..].starts_with(b"\"\"\"") => {
                    self.code(self.i + 2);
                    self.i += 3;
                    return;
                }
                b'\n' if !multi => return,
                b'\n' => {
                    self.newline(self.i, true);
                    self.i += 1;
                }
                _ => self.i += 1,
            }
        }
    }

    /// The number of `#` of a raw string starting at `i` (`#"`, `##"""`, v1 `r"`, `r#"`).
    fn raw_start(&self, i: usize) -> Option<usize> {
        let mut j = i;
        if self.b[i] == b'r' {
            let prev = if i == 0 { b' ' } else { self.b[i - 1] };
            if !(prev.is_ascii_whitespace() || prev == b'=' || prev == b')') {
                return None;
            }
            j += 1;
        }
        let hashes = self.b[j..].iter().take_while(|b| **b == b'#').count();
        (self.at(j + hashes) == b'"').then_some(hashes)
    }

    fn raw(&mut self) {
        let start = self.i;
        let Some(hashes) = self.raw_start(start) else {
            self.i += 1;
            return;
        };
        self.code(start);
        let open = start + usize::from(self.b[start] == b'r') + hashes;
        let multi = self.b[open..].starts_with(b"\"\"\"");
        let quote: &[u8] = if multi { b"\"\"\"" } else { b"\"" };
        self.i = open + quote.len();
        while self.i < self.b.len() {
            let c = self.b[self.i];
            if self.b[self.i..].starts_with(quote)
                && self.b[self.i + quote.len()..]
                    .iter()
                    .take(hashes)
                    .filter(|b| **b == b'#')
                    .count()
                    == hashes
            {
                let end = self.i + quote.len() + hashes;
                self.code(end - 1);
                self.i = end;
                return;
            }
            if c == b'\n' {
                if !multi {
                    return;
                }
                self.newline(self.i, true);
            }
            self.i += 1;
        }
    }
}

/// How a quoted string starting at some offset ends.
enum Quoted {
    /// Closed: the offset after its closing quote.
    Closed(usize),
    /// An escape KDL does not know, at this offset (its backslash).
    BadEscape(usize),
    /// Not closed on its line.
    Open,
}

/// Reads the single-line quoted string at `at` (which holds `"`).
fn quoted_end(text: &str, at: usize) -> Quoted {
    let b = text.as_bytes();
    let mut i = at + 1;
    while i < b.len() {
        match b[i] {
            b'\\' => {
                let next = b.get(i + 1).copied().unwrap_or(0);
                if !(b"nrt\\\"bfs/".contains(&next) || next == b'u' || next.is_ascii_whitespace()) {
                    return Quoted::BadEscape(i);
                }
                i += 2;
            }
            b'"' => return Quoted::Closed(i + 1),
            b'\n' => return Quoted::Open,
            _ => i += 1,
        }
    }
    Quoted::Open
}

/// The end of a v1 raw string `r"..."` or `r#"..."#` at `at`.
fn raw_v1_end(text: &str, at: usize) -> Option<usize> {
    let rest = text.get(at + 1..)?;
    let hashes = rest.bytes().take_while(|b| *b == b'#').count();
    let body = rest.get(hashes + 1..)?;
    let close = format!("\"{}", "#".repeat(hashes));
    let end = body.find(&close)?;
    let line_break = body.find('\n').unwrap_or(body.len());
    (end < line_break).then(|| at + 1 + hashes + 1 + end + close.len())
}

/// The end of the bare word at `at`: the first byte a KDL identifier cannot hold.
fn bare_end(text: &str, at: usize) -> usize {
    let rest = text.get(at..).unwrap_or_default();
    at + rest
        .find(|c: char| c.is_whitespace() || "()[]{}/\\\"#;=,:".contains(c))
        .unwrap_or(rest.len())
}

/// Whether the `#` at `at` reads as a TOML or shell comment: followed by a space, another
/// `#`, `!` or the end of the line.
fn is_comment_hash(text: &str, at: usize) -> bool {
    matches!(
        text.as_bytes().get(at + 1).copied(),
        None | Some(b' ' | b'\t' | b'\r' | b'\n' | b'#' | b'!')
    )
}

/// A KDL quoted string holding `text`.
fn quote(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The line of `text` holding `offset`, trimmed, with the commas between values removed.
pub(super) fn line_without_commas(text: &str, offset: usize) -> String {
    let start = text
        .get(..offset)
        .and_then(|t| t.rfind('\n'))
        .map_or(0, |i| i + 1);
    let end = text
        .get(offset..)
        .and_then(|t| t.find('\n'))
        .map_or(text.len(), |i| offset + i);
    without_commas(text.get(start..end).unwrap_or_default().trim())
}

/// A line's code with the commas between values removed (those inside strings kept).
fn without_commas(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut in_string = false;
    let mut escaped = false;
    let mut chars = code.chars().peekable();
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            ',' => {
                if chars.peek().is_some_and(|n| !n.is_whitespace()) {
                    out.push(' ');
                }
            }
            _ => out.push(c),
        }
    }
    out
}

/// "4 spaces", "1 tab", "no indentation".
fn describe_indent(prefix: &str) -> String {
    let tabs = prefix.matches('\t').count();
    let spaces = prefix.len() - tabs;
    match (spaces, tabs) {
        (0, 0) => "indentation (none)".to_string(),
        (s, 0) => format!("indentation ({s} space{})", if s == 1 { "" } else { "s" }),
        (0, t) => format!("indentation ({t} tab{})", if t == 1 { "" } else { "s" }),
        (s, t) => format!("indentation ({s} spaces and {t} tabs)"),
    }
}

/// A line's code cut to a readable length.
fn shorten(code: &str) -> String {
    if code.chars().count() <= 40 {
        code.to_string()
    } else {
        let cut: String = code.chars().take(37).collect();
        format!("{cut}...")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn braces_in_strings_and_comments_are_not_counted() {
        let text = "a \"{\" #\"}\"# r\"{\" { // }\n  /* { /* } */ } */ b \"\"\"\n  }\n  \"\"\"\n}\n} \"x\\\n  }\"\n";
        let cx = Cx::new(text);
        assert_eq!(cx.pairs.len(), 1, "{:?}", cx.pairs);
        assert_eq!(cx.stray.len(), 1, "{:?}", cx.stray);
        assert!(cx.unclosed.is_empty());
        assert_eq!(cx.line_of(cx.stray[0]), 5);
    }

    #[test]
    fn a_line_keeps_its_code_to_its_last_character() {
        let cx = Cx::new("name \"x\" // a comment\ndescription héllo\n");
        assert_eq!(cx.code_of(0), "name \"x\"");
        assert_eq!(cx.code_of(1), "description héllo");
    }

    #[test]
    fn commas_between_values_are_removed_and_kept_inside_strings() {
        assert_eq!(
            without_commas("argv \"a, b\", \"c\""),
            "argv \"a, b\" \"c\""
        );
        assert_eq!(without_commas("needs \"a\",\"b\""), "needs \"a\" \"b\"");
    }

    #[test]
    fn a_node_without_its_open_brace_is_found_above_the_stray_close() {
        let text = "stage \"a\" {\n    x 1\n}\nstage \"b\"\n    x 1\n}\n";
        let cx = Cx::new(text);
        let m = cx.brace_mistake().expect("a brace mistake");
        assert_eq!(cx.line_of(m.range.start), 3, "{m:?}");
        assert!(m.message.contains("no `{`"), "{m:?}");
    }
}
