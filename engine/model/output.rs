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
