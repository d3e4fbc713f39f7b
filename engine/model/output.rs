//! How a stage's output is extracted and validated: the extract mode, the schema, the
//! pattern and the markers.

use super::Text;
use crate::source::{Span, Spanned};

keywords! {
    /// How an answer becomes an output (`output.extract`).
    pub enum ExtractMode {
        Text = "text",
        Json = "json",
        FencedJson = "fenced_json",
        Markers = "markers",
        Regex = "regex",
    }
}

/// How output is extracted and validated.
#[derive(Clone, Debug)]
pub struct OutputSpec {
    pub extract: Option<Spanned<ExtractMode>>,
    pub schema: Option<SchemaRef>,
    pub pattern: Option<Text>,
    pub markers: Vec<Marker>,
    pub files: Vec<Text>,
    pub span: Span,
}

/// Where an output schema comes from.
#[derive(Clone, Debug)]
pub enum SchemaRef {
    File(Text),
    Inline(Spanned<serde_json::Value>),
}

/// A field read from marker lines.
#[derive(Clone, Debug)]
pub struct Marker {
    pub name: Text,
    pub prefix: Option<Text>,
    pub pattern: Option<Text>,
    pub many: bool,
    pub values: Vec<Text>,
    pub span: Span,
}

/// Follows a dotted field path through a schema's `properties`. Fails with the first field
/// that the schema does not define and the fields it does define there.
pub fn walk_schema<'a>(
    schema: &'a serde_json::Value,
    path: &[&str],
) -> Result<&'a serde_json::Value, (String, Vec<String>)> {
    let mut cur = schema;
    for part in path {
        if part.parse::<usize>().is_ok() {
            match cur.get("items") {
                Some(items) => {
                    cur = items;
                    continue;
                }
                None => return Ok(cur),
            }
        }
        let Some(props) = cur.get("properties").and_then(serde_json::Value::as_object) else {
            return Ok(cur);
        };
        match props.get(*part) {
            Some(next) => cur = next,
            None => return Err(((*part).to_string(), props.keys().cloned().collect())),
        }
    }
    Ok(cur)
}
