//! `ralph-flow lsp` at the protocol level: one module per feature, all through [`client`].

mod actions;
mod client;
mod completion;
mod diagnostics;
mod hover;
mod navigate;
mod symbols;
