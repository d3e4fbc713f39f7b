//! ralph-flow: a declarative, durable workflow engine for Ralph loops of coding agents.
//!
//! The pipeline is parse ([`syntax`]) → shape and lower ([`model`]) → check ([`check`]) →
//! compile ([`compile`]); the CLI in `main.rs` drives it. See ARCHITECTURE.md.

#[macro_use]
mod keywords;

pub mod backend;
pub mod check;
pub mod compile;
pub mod diag;
pub mod dialect;
pub mod exit;
pub mod fs;
pub mod load;
pub mod lsp;
pub mod model;
pub mod params;
pub mod permit;
pub mod prepare;
pub mod preset;
pub mod run;
pub mod secrets;
pub mod serve;
pub mod shell;
pub mod source;
pub mod spec;
pub mod store;
pub mod suggest;
pub mod syntax;
pub mod template;
pub mod text;
