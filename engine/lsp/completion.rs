//! Completion: keys, enum values, stage, agent and preset names, and inside templates and
//! expressions the stages in scope, their output fields, params, filters and tests.

use super::World;

pub(super) fn complete(
    _world: &World,
    _params: lsp_types::CompletionParams,
) -> Option<lsp_types::CompletionResponse> {
    None
}
