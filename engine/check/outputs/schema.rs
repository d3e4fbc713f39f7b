//! The schemas of the built-in outputs of each kind of stage, and following a field path
//! through a schema.

use serde_json::Value as Json;

use crate::model::StageKind;

/// The schema of what a command stage produces.
pub fn command_schema() -> Json {
    StageKind::Command.output_schema()
}

/// The schema of what a stage of a kind produces without an `output` of its own.
pub(super) fn builtin_schema(kind: StageKind) -> Option<Json> {
    Some(kind.output_schema())
}
