//! `pattern` and `markers` of an output: regular expressions that compile, a pattern only with
//! `extract = "regex"` (its named groups are the fields when there is no schema), and the
//! fields the markers add to the schema.

use serde_json::{Value as Json, json};

use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::{ExtractMode, OutputSpec};

/// Checks `pattern` against `extract`; a regex's named groups make the schema when there is
/// none.
pub(super) fn pattern(
    o: &OutputSpec,
    extract: Option<ExtractMode>,
    schema: &mut Option<Json>,
    diags: &mut Diagnostics,
) {
    if extract == Some(ExtractMode::Regex) {
        match &o.pattern {
            None => diags.push(
                Diagnostic::new(
                    Code::MissingKey,
                    o.span,
                    "`extract = \"regex\"` needs `pattern`",
                )
                .help_syntax(
                    "add pattern = \"(?P<name>...)\"",
                    "add pattern=\"(?P<name>...)\" to the output",
                ),
            ),
            Some(p) => match regex::Regex::new(&p.value) {
                Ok(re) => {
                    if schema.is_none() {
                        let props: serde_json::Map<String, Json> = re
                            .capture_names()
                            .flatten()
                            .map(|n| (n.to_string(), json!({"type": "string"})))
                            .collect();
                        if props.is_empty() {
                            diags.push(
                                Diagnostic::new(
                                    Code::InvalidRegex,
                                    p.span,
                                    "the pattern has no named groups, so it extracts nothing",
                                )
                                .help("name groups as (?P<verdict>...)"),
                            );
                        }
                        *schema = Some(json!({"type": "object", "properties": props}));
                    }
                }
                Err(err) => diags.push(
                    Diagnostic::new(
                        Code::InvalidRegex,
                        p.span,
                        format!("invalid regular expression: {err}"),
                    )
                    .help("fix the pattern"),
                ),
            },
        }
    } else if let Some(p) = &o.pattern {
        diags.push(
            Diagnostic::new(
                Code::KeyNotForKind,
                p.span,
                "`pattern` is only used with `extract = \"regex\"`",
            )
            .help_syntax(
                "set extract = \"regex\" or remove pattern",
                "set extract=\"regex\" or remove pattern",
            ),
        );
    }
}

/// Checks the markers and returns the schema of the fields they make.
pub(super) fn marker_props(
    o: &OutputSpec,
    diags: &mut Diagnostics,
) -> serde_json::Map<String, Json> {
    let mut marker_props = serde_json::Map::new();
    for m in &o.markers {
        match (&m.prefix, &m.pattern) {
            (None, None) => diags.push(
                Diagnostic::new(
                    Code::MissingKey,
                    m.span,
                    format!("marker `{}` needs `prefix` or `pattern`", m.name.value),
                )
                .help_syntax(
                    "add prefix = \"VERDICT:\"",
                    "add prefix=\"VERDICT:\" to the marker",
                ),
            ),
            (Some(p), Some(_)) => diags.push(
                Diagnostic::new(
                    Code::Duplicate,
                    p.span,
                    "a marker has `prefix` or `pattern`, not both",
                )
                .help("keep one"),
            ),
            (None, Some(p)) => {
                if let Err(err) = regex::Regex::new(&p.value) {
                    diags.push(
                        Diagnostic::new(
                            Code::InvalidRegex,
                            p.span,
                            format!("invalid regular expression: {err}"),
                        )
                        .help("fix the pattern"),
                    );
                }
            }
            (Some(_), None) => {}
        }
        let flag = m
            .pattern
            .as_ref()
            .is_some_and(|p| regex::Regex::new(&p.value).is_ok_and(|r| r.captures_len() == 1));
        let mut item = if flag {
            json!({"type": "boolean"})
        } else {
            json!({"type": "string"})
        };
        if !m.values.is_empty() {
            item = json!({"type": "string", "enum": m.values.iter().map(|v| v.value.clone()).collect::<Vec<_>>()});
        }
        if m.many {
            item = json!({"type": "array", "items": item});
        }
        marker_props.insert(m.name.value.clone(), item);
    }
    marker_props
}
