//! Quoting what the `kdl` crate would write unreadably: names and strings with control or
//! bidi characters and bare strings such as `-.5` (which its own parser rejects), and text
//! of several lines (which it writes on one line with `\n`), as a multi-line string.

use std::fmt::Write as _;

use kdl::{KdlEntry, KdlEntryFormat, KdlIdentifier, KdlNode, KdlValue};

/// Quotes the names and strings that the `kdl` crate (6.7) would write in a form its own
/// parser rejects: control and bidi characters, `\u{85}`, `\u{2028}` and bare strings such
/// as `-.5`; quotes every other bare string too (`"plan"`, not `plan`); and writes text of several lines as a multi-line string, indented one level
/// below its node, which is at `depth`. Runs after `autoformat`, which would reset these
/// representations.
pub(super) fn fix_reprs(nodes: &mut [KdlNode], depth: usize) {
    for node in nodes {
        fix_ident(node.name_mut());
        for entry in node.entries_mut() {
            if let Some(name) = entry.name_mut() {
                fix_ident(name);
            }
            if let KdlValue::String(s) = entry.value()
                && entry.name().is_none()
                && let Some(value_repr) = multi_line(s, depth)
            {
                entry.set_format(KdlEntryFormat {
                    value_repr,
                    leading: " ".into(),
                    ..Default::default()
                });
            } else if let KdlValue::String(s) = entry.value() {
                let rendered = entry.value().to_string();
                let ok = KdlEntry::parse(&rendered)
                    .is_ok_and(|e| e.name().is_none() && e.value().as_string() == Some(s.as_str()));
                // A bare string (`plan`, `kind=agent`) is quoted too, as people write them.
                let bare = !rendered.starts_with(['"', '#']);
                if !ok || bare {
                    let value_repr = kdl_quote(s);
                    entry.set_format(KdlEntryFormat {
                        value_repr,
                        leading: " ".into(),
                        ..Default::default()
                    });
                }
            }
        }
        if let Some(children) = node.children_mut() {
            fix_reprs(children.nodes_mut(), depth + 1);
        }
    }
}

fn fix_ident(ident: &mut KdlIdentifier) {
    let rendered = ident.to_string();
    if KdlIdentifier::parse(&rendered).is_ok_and(|i| i.value() == ident.value()) {
        return;
    }
    let repr = kdl_quote(ident.value());
    ident.set_repr(repr);
}

/// Text of several lines as a KDL v2 multi-line string: raw (`#"""`, no escapes) when it has
/// quotes or backslashes, else `"""`; each line indented one level below a node at `depth`,
/// the closing quotes on a line of their own. A line of blanks only (which a multi-line
/// string reads as empty) is written with escapes (`\s`, `\t`), in a `"""` string, and so is
/// text with a character that only an escape can carry. `None` when the text has no line
/// break, or (a safeguard) when neither form reads back as it is: it then stays on one line.
fn multi_line(s: &str, depth: usize) -> Option<String> {
    if !s.contains('\n') {
        return None;
    }
    let raw = s.contains(['"', '\\']) && !s.split('\n').any(blank_line);
    multi_line_as(s, depth, raw).or_else(|| {
        if raw {
            multi_line_as(s, depth, false)
        } else {
            None
        }
    })
}

/// A line of blanks only, which a multi-line string would read as an empty line.
fn blank_line(l: &str) -> bool {
    !l.is_empty() && l.trim_matches([' ', '\t']).is_empty()
}

/// Text of several lines as a raw or plain multi-line string, if it reads back as it is.
fn multi_line_as(s: &str, depth: usize, raw: bool) -> Option<String> {
    let indent = "    ".repeat(depth + 1);
    let (open, close) = if raw {
        // Enough `#`s that no `"""#...` inside the text closes the string.
        let mut hashes = String::from("#");
        while s.contains(&format!("\"\"\"{hashes}")) {
            hashes.push('#');
        }
        (format!("{hashes}\"\"\""), format!("\"\"\"{hashes}"))
    } else {
        ("\"\"\"".to_string(), "\"\"\"".to_string())
    };
    let mut out = open;
    out.push('\n');
    for line in s.split('\n') {
        if !line.is_empty() {
            out.push_str(&indent);
            if raw {
                out.push_str(line);
            } else if blank_line(line) {
                out.push_str(&line.replace(' ', "\\s").replace('\t', "\\t"));
            } else {
                // Only what a literal may not hold needs an escape.
                let quoted = kdl_quote(line);
                out.push_str(&quoted[1..quoted.len() - 1]);
            }
        }
        out.push('\n');
    }
    out.push_str(&indent);
    out.push_str(&close);
    let back = KdlEntry::parse(&out).ok()?;
    (back.name().is_none() && back.value().as_string() == Some(s)).then_some(out)
}

/// A quoted KDL v2 string that escapes every character a literal may not contain.
fn kdl_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control()
                || matches!(c, '\u{200E}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{2028}' | '\u{2029}' | '\u{FEFF}') =>
            {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use crate::syntax::Format;
    use crate::syntax::emit::test_support::{assert_round_trips, parse_ok};

    #[test]
    fn tricky_scalars_round_trip() {
        let text = r##"
name = "tricky"
description = "quote \" backslash \\ newline \n tab \t cr \r esc \u001b[0m nul \u0000 del \u007f nel \u0085 ls \u2028 bom \ufeff bidi \u200e end"

[params."-.5"]
type = "float"
default = -0.0
choices = [1.0, 0.5, 1e-7, 1e300, -2.5e-300, 123456789.0]
description = "-.5"

[params.big]
type = "int"
default = -9223372036854775808
choices = [9223372036854775807, 0, -1]

[params.strs]
type = "list"
default = ["", " ", "true", "#null", "1.0", "-", "a=b", "é", "x\u0085y", "\u000b"]

[params."weird \"key\"\n"]
type = "bool"
default = false

[params."\u0001"]
type = "string"
default = { "a b" = { "" = true, "\u200f" = [true] } }
"##;
        let tree = parse_ok(text, Format::Toml);
        assert_round_trips(&tree);
    }

    #[test]
    fn text_of_several_lines_is_a_multi_line_string_that_reads_back() {
        for (text, raw) in [
            ("one\ntwo\n", false),
            ("a carriage return\r\nescaped", false),
            ("a line of blanks\n   \n\t\nend", false),
            ("blanks and \"quotes\"\n  \nend\\", false),
            ("\"quotes\" and a bell \u{7}\nx", false),
            ("no trailing\nline break", false),
            ("  indented\n\tand a tab\n\n\nblank lines\n", false),
            ("say \"hi\"\nback\\slash\n", true),
            ("a \"\"\"# inside\n\"\"\"## too\n", true),
            ("#\"\"\" opener\nend", true),
        ] {
            let s = super::multi_line(text, 1).unwrap_or_else(|| panic!("{text:?}"));
            assert_eq!(s.starts_with('#'), raw, "{s}");
            assert!(!s.contains("\\n"), "{s}");
            assert!(s.ends_with("    \"\"\"") || s.contains("\"\"\"#"), "{s}");
        }
        assert_eq!(super::multi_line("one line", 0), None);
        let tree = parse_ok(
            "name = \"x\"\ndescription = \"\"\"\nsay \"hi\" \\\\ \n\n  indented\n\"\"\"\n[stages.a]\nkind = \"command\"\nargv = [\"sh\", \"-c\", \"\"\"\nset -e\necho ok\n\"\"\"]\n",
            Format::Toml,
        );
        assert_round_trips(&tree);
    }
}
