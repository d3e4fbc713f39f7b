//! Filters and tests used in templates and expressions: finding their names in the text, and
//! telling whether the environment the run renders with provides them.
//!
//! minijinja looks filters and tests up only when it renders, so `{{ x | truncate(600) }}`
//! compiles and then fails in the middle of a run. The names are found here by scanning the
//! text (strings, comments and raw blocks left out) after it compiled, and each is asked of an
//! environment built like the executor's.

use std::ops::Range;
use std::sync::OnceLock;

/// Whether a name follows `|` (or `{% filter %}`) or `is` / `is not`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UseKind {
    Filter,
    Test,
}

impl UseKind {
    /// Returns the word for it: `filter` or `test`.
    pub(super) fn word(self) -> &'static str {
        match self {
            UseKind::Filter => "filter",
            UseKind::Test => "test",
        }
    }
}

/// One filter or test name in a text, with its byte range there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Use {
    pub kind: UseKind,
    pub range: Range<usize>,
}

/// minijinja's built-in filters (with the features this crate enables), for suggestions; the
/// probe decides what exists, and a test keeps this list in step with it.
pub(crate) const FILTERS: &[&str] = &[
    "abs",
    "attr",
    "batch",
    "bool",
    "capitalize",
    "chain",
    "count",
    "d",
    "default",
    "dictsort",
    "e",
    "escape",
    "first",
    "float",
    "format",
    "groupby",
    "indent",
    "int",
    "items",
    "join",
    "last",
    "length",
    "lines",
    "list",
    "lower",
    "map",
    "max",
    "min",
    "pprint",
    "reject",
    "rejectattr",
    "replace",
    "reverse",
    "round",
    "safe",
    "select",
    "selectattr",
    "slice",
    "sort",
    "split",
    "string",
    "sum",
    "title",
    "tojson",
    "trim",
    "unique",
    "upper",
    "zip",
];

/// minijinja's built-in tests (those written as a name), for suggestions.
pub(crate) const TESTS: &[&str] = &[
    "boolean",
    "defined",
    "divisibleby",
    "endingwith",
    "eq",
    "equalto",
    "escaped",
    "even",
    "false",
    "filter",
    "float",
    "ge",
    "greaterthan",
    "gt",
    "in",
    "int",
    "integer",
    "iterable",
    "le",
    "lessthan",
    "lower",
    "lt",
    "mapping",
    "ne",
    "none",
    "number",
    "odd",
    "safe",
    "sameas",
    "sequence",
    "startingwith",
    "string",
    "test",
    "true",
    "undefined",
    "upper",
];

/// The environment templates are rendered with at run time, as far as filters and tests go:
/// minijinja's defaults plus what the engine registers (helpers that need the store are
/// functions, not filters, and are left out).
fn probe_env() -> &'static minijinja::Environment<'static> {
    static ENV: OnceLock<minijinja::Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| crate::template::environment(crate::template::Roots::default(), || {}))
}

/// Tells whether the run's environment has a filter or test of that name. When the probe
/// itself fails the name is taken as known, so that a problem here never blocks a workflow.
pub(crate) fn exists(kind: UseKind, name: &str) -> bool {
    let env = probe_env();
    let Ok(tmpl) = env.template_from_str("") else {
        return true;
    };
    let mut state = tmpl.new_state();
    state
        .perform_test(kind.word(), &[minijinja::Value::from(name)])
        .unwrap_or(true)
}

/// The known names of a kind, for suggestions.
pub(super) fn known(kind: UseKind) -> Vec<&'static str> {
    let list = match kind {
        UseKind::Filter => FILTERS,
        UseKind::Test => TESTS,
    };
    list.iter().copied().filter(|n| exists(kind, n)).collect()
}

/// Finds the filters and tests of a template: inside `{{ }}` and `{% %}`, not in text,
/// comments, raw blocks or string literals.
pub(crate) fn in_template(src: &str) -> Vec<Use> {
    let mut out = Vec::new();
    walk_template(src, &mut out, &mut Vec::new());
    out
}

/// The code of a template: the insides of its `{{ }}` and `{% %}` tags, without their
/// delimiters; not text, comments or raw blocks, and a `}}` in a string literal does not
/// end a tag (the language server finds names in these).
pub(crate) fn code_regions(src: &str) -> Vec<Range<usize>> {
    let mut regions = Vec::new();
    walk_template(src, &mut Vec::new(), &mut regions);
    regions
}

/// Walks a template's tags, recording their filters and tests in `uses` and the range of
/// each tag's code in `regions`.
fn walk_template(src: &str, uses: &mut Vec<Use>, regions: &mut Vec<Range<usize>>) {
    let b = src.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'{' || i + 1 >= b.len() {
            i += 1;
            continue;
        }
        let (close, statement) = match b[i + 1] {
            b'#' => {
                i = src[i + 2..].find("#}").map_or(b.len(), |e| i + 2 + e + 2);
                continue;
            }
            b'%' if starts_word(src, i + 2, "raw") => {
                i = end_of_raw(src, i + 2);
                continue;
            }
            b'{' => ("}}", false),
            b'%' => ("%}", true),
            _ => {
                i += 1;
                continue;
            }
        };
        let start = i + 2;
        i = code(src, start, Some(close), statement, uses);
        let end = if src[..i].ends_with(close) && i >= start + close.len() {
            i - close.len()
        } else {
            i
        };
        regions.push(start..end);
    }
}

/// Finds the filters and tests of an expression (written without `{{ }}`).
pub(crate) fn in_expression(src: &str) -> Vec<Use> {
    let mut out = Vec::new();
    code(src, 0, None, false, &mut out);
    out
}

/// Tells whether, after an optional whitespace-control sign and spaces, `word` starts at `at`
/// as a whole word.
fn starts_word(src: &str, at: usize, word: &str) -> bool {
    let rest = src.get(at..).unwrap_or_default();
    let rest = rest.strip_prefix(['-', '+']).unwrap_or(rest).trim_start();
    rest.strip_prefix(word)
        .is_some_and(|r| !r.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_'))
}

/// Returns where the text after `{% raw %}` (its tag starting at `at`) ends: after the
/// `{% endraw %}` tag, or at the end.
fn end_of_raw(src: &str, at: usize) -> usize {
    let Some(close) = src[at..].find("%}") else {
        return src.len();
    };
    let mut i = at + close + 2;
    while let Some(open) = src[i..].find("{%") {
        let tag = i + open + 2;
        if starts_word(src, tag, "endraw") {
            return src[tag..].find("%}").map_or(src.len(), |e| tag + e + 2);
        }
        i = tag;
    }
    src.len()
}

/// What the next identifier is, given the tokens before it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    Nothing,
    Filter,
    /// After `is`: a test, or `not` and then a test.
    Test,
}

/// Scans code from `start` up to `end` (or the end of the text), recording filter and test
/// names. Returns the position after `end`. `statement` is set inside `{% %}`, where a
/// `filter` tag names filters too.
fn code(src: &str, start: usize, end: Option<&str>, statement: bool, out: &mut Vec<Use>) -> usize {
    let b = src.as_bytes();
    let mut i = start;
    let mut expect = Expect::Nothing;
    let mut first = true;
    // The last byte of the previous token (not a space): `x.is` is an attribute, not `is`.
    let mut prev = 0u8;
    while i < b.len() {
        if let Some(end) = end {
            if src[i..].starts_with(end) {
                return i + end.len();
            }
        }
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if c == b'"' || c == b'\'' {
            i = skip_string(b, i);
            expect = Expect::Nothing;
            first = false;
            prev = c;
            continue;
        }
        if c.is_ascii_alphabetic() || c == b'_' {
            let s = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            let word = &src[s..i];
            match expect {
                Expect::Filter => {
                    out.push(Use {
                        kind: UseKind::Filter,
                        range: s..i,
                    });
                    expect = Expect::Nothing;
                }
                Expect::Test if word == "not" => {}
                Expect::Test => {
                    out.push(Use {
                        kind: UseKind::Test,
                        range: s..i,
                    });
                    expect = Expect::Nothing;
                }
                Expect::Nothing if word == "is" && prev != b'.' => expect = Expect::Test,
                Expect::Nothing if word == "filter" && statement && first => {
                    expect = Expect::Filter;
                }
                Expect::Nothing => {}
            }
            first = false;
            prev = b'a';
            continue;
        }
        if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.') {
                i += 1;
            }
            expect = Expect::Nothing;
            first = false;
            prev = b'0';
            continue;
        }
        // Whitespace control (`{{-`, `-%}`) is not a token of its own.
        if !(first && matches!(c, b'-' | b'+')) {
            first = false;
            expect = if c == b'|' {
                Expect::Filter
            } else {
                Expect::Nothing
            };
        }
        prev = c;
        i += src[i..].chars().next().map_or(1, char::len_utf8);
    }
    b.len()
}

/// Returns the position after the string literal that starts at `at`.
fn skip_string(b: &[u8], at: usize) -> usize {
    let quote = b[at];
    let mut i = at + 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            q if q == quote => return i + 1,
            _ => i += 1,
        }
    }
    b.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(uses: &[Use], src: &str) -> Vec<(UseKind, String)> {
        uses.iter()
            .map(|u| (u.kind, src[u.range.clone()].to_string()))
            .collect()
    }

    fn t(src: &str) -> Vec<(UseKind, String)> {
        names(&in_template(src), src)
    }

    fn e(src: &str) -> Vec<(UseKind, String)> {
        names(&in_expression(src), src)
    }

    use UseKind::{Filter as F, Test as T};

    #[test]
    fn finds_filters_and_tests_in_templates() {
        assert_eq!(
            t("a | b {{ x | trim | truncate(600) }} {% if y is not defined %}{% endif %}"),
            vec![
                (F, "trim".into()),
                (F, "truncate".into()),
                (T, "defined".into())
            ]
        );
        assert_eq!(
            t("{%- filter upper|trim -%}x{% endfilter %}{{- x|d(1) -}}"),
            vec![(F, "upper".into()), (F, "trim".into()), (F, "d".into())]
        );
        assert_eq!(
            t("{{ xs | selectattr('a', 'eq', 1) | map(attribute='b') | join(', ') }}"),
            vec![
                (F, "selectattr".into()),
                (F, "map".into()),
                (F, "join".into())
            ]
        );
    }

    #[test]
    fn skips_strings_comments_raw_and_attributes() {
        assert!(t("{{ 'a | b' ~ \"x is y\" ~ 'it\\'s | z' }}").is_empty());
        assert!(
            t("{# {{ x | nope }} #} text | nope {% raw %}{{ x | nope }}{% endraw %}").is_empty()
        );
        assert!(t("{{ x.is }} {{ \"}}\" | upper }}").len() == 1);
        assert!(t("{{ x | ").len() <= 1);
        assert!(t("{% raw %}{{ x | nope }}").is_empty());
    }

    #[test]
    fn finds_them_in_expressions() {
        assert_eq!(
            e("stages.a.output.items | length > 1 and x is even and 'q | r' is string"),
            vec![
                (F, "length".into()),
                (T, "even".into()),
                (T, "string".into())
            ]
        );
    }

    #[test]
    fn builtin_lists_match_the_environment() {
        for f in FILTERS {
            assert!(exists(F, f), "filter {f}");
        }
        for x in TESTS {
            assert!(exists(T, x), "test {x}");
        }
        assert!(!exists(F, "truncate"));
        assert!(!exists(T, "emtpy"));
        assert!(!exists(F, "read_file"));
    }

    #[test]
    fn odd_input_does_not_panic() {
        for s in [
            "{",
            "{{",
            "{%",
            "{#",
            "{{ '",
            "{% raw",
            "|",
            "is",
            "é | ü",
            "{{ x | é }}",
        ] {
            let _ = t(s);
            let _ = e(s);
        }
    }
}
