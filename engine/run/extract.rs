//! Output extraction and validation: from an agent's text (or a command's stdout) to the
//! JSON value that templates, routes and the store see.

use serde_json::{Map, Value as Json, json};

use crate::model::{ExtractMode, Marker, OutputSpec};

/// A compiled output specification of one stage.
#[derive(Debug)]
pub struct Extractor {
    mode: Mode,
    markers: Vec<(Marker, Option<regex::Regex>)>,
    validator: Option<jsonschema::Validator>,
}

#[derive(Debug)]
enum Mode {
    /// `{text}` for agents; the builtin object for commands and checks.
    Text,
    Json,
    FencedJson,
    Markers,
    Regex(regex::Regex),
}

/// An output spec that does not compile (the checker has compiled it already, so this is
/// reported rather than unwrapped).
#[derive(Debug, thiserror::Error)]
pub enum OutputSpecError {
    #[error("its pattern does not compile")]
    Pattern(#[from] regex::Error),
    #[error("its schema does not compile")]
    Schema(#[source] Box<jsonschema::ValidationError<'static>>),
}

impl Extractor {
    /// Compiles a stage's output spec. `schema` is the declared schema (not a builtin one).
    /// The checker has validated patterns and schemas; a failure here is reported, not
    /// unwrapped.
    pub fn new(spec: Option<&OutputSpec>, schema: Option<&Json>) -> Result<Self, OutputSpecError> {
        let declared = spec.and_then(|s| s.schema.as_ref()).is_some();
        let mode = match spec.and_then(|s| s.extract.as_ref()).map(|e| e.value) {
            Some(ExtractMode::Json) => Mode::Json,
            Some(ExtractMode::FencedJson) => Mode::FencedJson,
            Some(ExtractMode::Markers) => Mode::Markers,
            Some(ExtractMode::Regex) => {
                let p = spec
                    .and_then(|s| s.pattern.as_ref())
                    .map(|p| p.value.as_str())
                    .unwrap_or("");
                Mode::Regex(regex::Regex::new(p)?)
            }
            Some(ExtractMode::Text) => Mode::Text,
            None if declared => Mode::Json,
            None => Mode::Text,
        };
        let mut markers = Vec::new();
        for m in spec.map(|s| s.markers.as_slice()).unwrap_or_default() {
            let re = match &m.pattern {
                Some(p) => Some(regex::Regex::new(&p.value)?),
                None => None,
            };
            markers.push((m.clone(), re));
        }
        let validator = match (declared, schema) {
            (true, Some(s)) => Some(
                jsonschema::validator_for(s).map_err(|e| OutputSpecError::Schema(Box::new(e)))?,
            ),
            _ => None,
        };
        Ok(Extractor {
            mode,
            markers,
            validator,
        })
    }

    /// Tells whether the output is parsed as JSON (so a native JSON-schema backend helps).
    pub fn wants_json(&self) -> bool {
        matches!(self.mode, Mode::Json | Mode::FencedJson)
    }

    /// Extracts the output from a text. `base` is the stage's builtin output (a command's
    /// `{exit_code, stdout, stderr}`), used in text and markers modes; `None` means `{text}`.
    /// Returns the value, or every problem found (parse errors, schema violations).
    pub fn extract(&self, text: &str, base: Option<Json>) -> Result<Json, Vec<String>> {
        let mut value = match &self.mode {
            Mode::Text | Mode::Markers => base.unwrap_or_else(|| json!({ "text": text })),
            // A server's structured-output mode answers with bare JSON, and models often
            // fence JSON they were asked to give bare: both modes take both forms, so a
            // stage's `extract` never contradicts the agent's `structured_output`.
            Mode::Json => match parse_json(text.trim()) {
                Ok(v) => v,
                Err(problems) => match last_fenced_json(text) {
                    Some(block) => parse_json(block)?,
                    None => return Err(problems),
                },
            },
            Mode::FencedJson => match last_fenced_json(text) {
                Some(block) => parse_json(block)?,
                None => match serde_json::from_str::<Json>(text.trim()) {
                    Ok(v) if v.is_object() || v.is_array() => v,
                    _ => {
                        return Err(vec![
                            "the answer has no fenced ```json block; answer with one".to_string(),
                        ]);
                    }
                },
            },
            Mode::Regex(re) => match re.captures_iter(text).last() {
                Some(caps) => {
                    let mut obj = Map::new();
                    for name in re.capture_names().flatten() {
                        if let Some(m) = caps.name(name) {
                            obj.insert(name.to_string(), Json::String(m.as_str().to_string()));
                        }
                    }
                    Json::Object(obj)
                }
                None => {
                    return Err(vec![format!(
                        "no line of the answer matches the pattern `{}`",
                        re.as_str()
                    )]);
                }
            },
        };
        let mut problems = Vec::new();
        if !self.markers.is_empty() {
            let found = self.markers(text, &mut problems);
            match value.as_object_mut() {
                // A field the answer gives itself (a JSON answer under a schema that has the
                // marker's field) is kept: the markers fill what the answer leaves empty, so
                // the two never contradict each other.
                Some(obj) => {
                    for (name, marked) in found {
                        let own = obj.get(&name).filter(|v| !is_empty(v));
                        if own.is_none() && (!is_empty(&marked) || !obj.contains_key(&name)) {
                            obj.insert(name, marked);
                        }
                    }
                }
                None => problems.push("markers need an object output, not this JSON".into()),
            }
        }
        if let Some(v) = &self.validator {
            for err in v.iter_errors(&value) {
                let at = err.instance_path().to_string();
                let at = if at.is_empty() { "/".to_string() } else { at };
                problems.push(format!("at `{at}`: {err}"));
            }
        }
        if problems.is_empty() {
            Ok(value)
        } else {
            Err(problems)
        }
    }

    fn markers(&self, text: &str, problems: &mut Vec<String>) -> Map<String, Json> {
        let mut out = Map::new();
        for (m, re) in &self.markers {
            let mut hits: Vec<Json> = Vec::new();
            for line in text.lines() {
                let line = line.trim_end_matches('\r');
                let hit = match (&m.prefix, re) {
                    (Some(p), _) => line
                        .trim_start()
                        .strip_prefix(p.value.as_str())
                        .map(|rest| Json::String(rest.trim().to_string())),
                    (None, Some(re)) => re.captures(line).map(|c| match c.get(1) {
                        Some(g) => Json::String(g.as_str().trim().to_string()),
                        None => Json::Bool(true),
                    }),
                    (None, None) => None,
                };
                if let Some(h) = hit {
                    hits.push(h);
                }
            }
            let name = m.name.value.clone();
            if !m.values.is_empty() {
                for h in &hits {
                    if let Json::String(s) = h {
                        if !m.values.iter().any(|v| v.value == *s) {
                            let allowed: Vec<&str> =
                                m.values.iter().map(|v| v.value.as_str()).collect();
                            problems.push(format!(
                                "marker `{name}` is `{s}`, which is not one of: {}",
                                allowed.join(", ")
                            ));
                        }
                    }
                }
            }
            let value = if m.many {
                Json::Array(hits)
            } else if let Some(last) = hits.pop() {
                last
            } else if re.as_ref().is_some_and(|r| r.captures_len() == 1) {
                Json::Bool(false)
            } else {
                Json::Null
            };
            out.insert(name, value);
        }
        out
    }
}

/// Whether a value says nothing: null, false, an empty string or array.
fn is_empty(v: &Json) -> bool {
    match v {
        Json::Null | Json::Bool(false) => true,
        Json::String(s) => s.is_empty(),
        Json::Array(a) => a.is_empty(),
        _ => false,
    }
}

fn parse_json(text: &str) -> Result<Json, Vec<String>> {
    serde_json::from_str(text).map_err(|e| {
        vec![format!(
            "the answer is not valid JSON ({e}); answer with only the JSON value"
        )]
    })
}

/// Returns the content of the last fenced code block tagged `json` (or untagged, if no
/// block is tagged).
fn last_fenced_json(text: &str) -> Option<&str> {
    let mut tagged = None;
    let mut untagged = None;
    let mut rest = text;
    let mut offset = 0;
    while let Some(start) = rest.find("```") {
        let after = &rest[start + 3..];
        let Some(line_end) = after.find('\n') else {
            break;
        };
        let tag = after[..line_end].trim();
        let body_start = start + 3 + line_end + 1;
        let body = &rest[body_start..];
        let Some(end) = body.find("```") else { break };
        let block = &text[offset + body_start..offset + body_start + end];
        if tag.eq_ignore_ascii_case("json") {
            tagged = Some(block);
        } else if tag.is_empty() {
            untagged = Some(block);
        }
        let consumed = body_start + end + 3;
        offset += consumed;
        rest = &rest[consumed..];
    }
    tagged.or(untagged).map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::{FileId, Span, Spanned};

    fn text(s: &str) -> Spanned<String> {
        Spanned::new(s.to_string(), Span::new(FileId(0), 0..0))
    }

    fn spec(extract: &str) -> OutputSpec {
        OutputSpec {
            extract: ExtractMode::parse(extract)
                .map(|e| Spanned::new(e, Span::new(FileId(0), 0..0))),
            schema: None,
            pattern: None,
            markers: Vec::new(),
            files: Vec::new(),
            span: Span::new(FileId(0), 0..0),
        }
    }

    #[test]
    fn fenced_json_takes_the_last_json_block() {
        let t = "x\n```json\n{\"a\":1}\n```\nmore\n```\nplain\n```\n```json\n{\"a\":2}\n```\n";
        assert_eq!(last_fenced_json(t), Some("{\"a\":2}"));
        let e = Extractor::new(Some(&spec("fenced_json")), None).expect("compiles");
        assert_eq!(e.extract(t, None), Ok(json!({"a": 2})));
        assert!(e.extract("no block", None).is_err());
        // A server's structured output: bare JSON, no fence.
        assert_eq!(e.extract(" {\"a\": 3}\n", None), Ok(json!({"a": 3})));
        assert!(e.extract("42", None).is_err(), "a bare scalar is no answer");
        // A fence with no newline after it does not lose the block found before it.
        assert_eq!(
            e.extract("```json\n{\"a\":4}\n```\ntrailing ```", None),
            Ok(json!({"a": 4}))
        );
    }

    #[test]
    fn json_takes_a_fenced_block_too() {
        let e = Extractor::new(Some(&spec("json")), None).expect("compiles");
        assert_eq!(e.extract("{\"a\":1}", None), Ok(json!({"a": 1})));
        assert_eq!(
            e.extract("Here it is:\n```json\n{\"a\":2}\n```", None),
            Ok(json!({"a": 2}))
        );
        assert!(e.extract("no json here", None).is_err());
    }

    #[test]
    fn markers_take_the_last_line_and_check_values() {
        let mut s = spec("markers");
        s.markers.push(Marker {
            name: text("verdict"),
            prefix: Some(text("VERDICT:")),
            pattern: None,
            many: false,
            values: vec![text("VALID"), text("INVALID")],
            span: Span::new(FileId(0), 0..0),
        });
        s.markers.push(Marker {
            name: text("done"),
            prefix: None,
            pattern: Some(text("^NO_ISSUES$")),
            many: false,
            values: Vec::new(),
            span: Span::new(FileId(0), 0..0),
        });
        let e = Extractor::new(Some(&s), None).expect("compiles");
        let v = e
            .extract("VERDICT: INVALID\nwork\nVERDICT: VALID\n", None)
            .expect("valid");
        assert_eq!(v["verdict"], json!("VALID"));
        assert_eq!(v["done"], json!(false));
        let err = e
            .extract("VERDICT: MAYBE", None)
            .expect_err("invalid value");
        assert!(err[0].contains("MAYBE"), "{err:?}");
    }

    #[test]
    fn a_field_the_json_answer_gives_is_kept_over_an_empty_marker() {
        // council's implementer under a schema: bare JSON with its own `learnings`, and no
        // `LEARNING:` lines.
        let mut s = spec("json");
        s.markers.push(Marker {
            name: text("learnings"),
            prefix: Some(text("LEARNING:")),
            pattern: None,
            many: true,
            values: Vec::new(),
            span: Span::new(FileId(0), 0..0),
        });
        let e = Extractor::new(Some(&s), None).expect("compiles");
        let v = e
            .extract(
                r#"{"summary":"done","learnings":["run the tests first"]}"#,
                None,
            )
            .expect("valid");
        assert_eq!(v["learnings"], json!(["run the tests first"]));
        // Marker lines fill a field the answer leaves empty or out.
        let v = e
            .extract(
                "```json\n{\"learnings\":[]}\n```\nLEARNING: one\nLEARNING: two",
                None,
            )
            .expect("valid");
        assert_eq!(v["learnings"], json!(["one", "two"]));
        let v = e.extract(r#"{"summary":"x"}"#, None).expect("valid");
        assert_eq!(v["learnings"], json!([]));
    }

    #[test]
    fn schema_errors_name_the_place() {
        let mut s = spec("json");
        let schema = json!({"type": "object", "required": ["verdict"],
            "properties": {"verdict": {"enum": ["VALID", "INVALID"]}}});
        s.schema = Some(crate::model::SchemaRef::Inline(Spanned::new(
            schema.clone(),
            Span::new(FileId(0), 0..0),
        )));
        let e = Extractor::new(Some(&s), Some(&schema)).expect("compiles");
        assert!(e.extract("{\"verdict\": \"VALID\"}", None).is_ok());
        let err = e.extract("{\"verdict\": \"OK\"}", None).expect_err("enum");
        assert!(err[0].contains("/verdict"), "{err:?}");
        let err = e.extract("not json", None).expect_err("parse");
        assert!(err[0].contains("not valid JSON"), "{err:?}");
    }
}
