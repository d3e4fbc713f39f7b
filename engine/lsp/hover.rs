//! Hover: a key's reference text, a stage's kind, agent and output fields, a filter's
//! signature, a param's type and default.

use super::World;

pub(super) fn hover(_world: &World, _params: lsp_types::HoverParams) -> Option<lsp_types::Hover> {
    None
}
