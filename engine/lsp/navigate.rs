//! Go to definition, references and rename of stages.

use super::World;

pub(super) fn definition(
    _world: &World,
    _params: lsp_types::GotoDefinitionParams,
) -> Option<lsp_types::GotoDefinitionResponse> {
    None
}

pub(super) fn references(
    _world: &World,
    _params: lsp_types::ReferenceParams,
) -> Option<Vec<lsp_types::Location>> {
    None
}

pub(super) fn prepare_rename(
    _world: &World,
    _params: lsp_types::TextDocumentPositionParams,
) -> Option<lsp_types::PrepareRenameResponse> {
    None
}

pub(super) fn rename(
    _world: &World,
    _params: lsp_types::RenameParams,
) -> Option<lsp_types::WorkspaceEdit> {
    None
}
