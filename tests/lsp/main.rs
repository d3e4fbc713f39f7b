//! `ralph-flow lsp` at the protocol level: one module per feature, all through [`client`].

mod client;
mod diagnostics;
mod robustness;
