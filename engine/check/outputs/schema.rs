//! The schemas of the built-in outputs of each kind of stage, and following a field path
//! through a schema.

use serde_json::{Value as Json, json};

use crate::model::StageKind;

/// The schema of what a command stage produces.
pub fn command_schema() -> Json {
    json!({"type": "object", "properties": {
        "exit_code": {"type": "integer"}, "stdout": {"type": "string"}, "stderr": {"type": "string"}
    }})
}

pub(super) fn builtin_schema(kind: StageKind) -> Option<Json> {
    Some(match kind {
        StageKind::Agent => json!({"type": "object", "properties": {"text": {"type": "string"}}}),
        StageKind::Command => command_schema(),
        StageKind::Check => json!({"type": "object", "properties": {
            "passed": {"type": "boolean"}, "exit_code": {"type": "integer"},
            "stdout": {"type": "string"}, "stderr": {"type": "string"}
        }}),
        StageKind::Gate => json!({"type": "object", "properties": {
            "approved": {"type": "boolean"}, "comment": {"type": "string"}, "by": {"type": "string"}, "at": {"type": "string"}
        }}),
        StageKind::Subflow => json!({"type": "object", "properties": {
            "exit": {"type": "string"}, "code": {"type": "integer"}, "outputs": {"type": "object"}
        }}),
        StageKind::Loop => json!({"type": "object", "properties": {
            "iterations": {"type": "integer"}, "outcome": {"type": "string"},
            "history": {"type": "array", "items": {"type": "object", "properties": {
                "iteration": {"type": "integer"}, "feedback": {"type": "string"}, "outputs": {"type": "object"}
            }}}
        }}),
        StageKind::ForEach | StageKind::Group => json!({"type": "object", "properties": {
            "results": {"type": "array"}, "value": {}
        }}),
    })
}
