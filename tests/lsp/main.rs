//! `ralph-flow lsp` at the protocol level: one module per feature, all through [`client`].

mod actions;
mod client;
#[path = "../common/mod.rs"]
mod common;
mod completion;
mod diagnostics;
mod hover;
mod navigate;
mod robustness;
mod symbols;
