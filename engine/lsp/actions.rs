//! Code actions from the checker's advice.

use super::World;

pub(super) fn code_actions(
    _world: &World,
    _params: lsp_types::CodeActionParams,
) -> Option<lsp_types::CodeActionResponse> {
    None
}
