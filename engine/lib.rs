//! ralph-flow: a declarative, durable workflow engine for Ralph loops of coding agents.
//!
//! The pipeline is parse ([`syntax`]) → shape and lower ([`model`]) → check ([`check`]) →
//! compile ([`compile`]); the CLI in `main.rs` drives it. See ARCHITECTURE.md.

pub mod backend;
pub mod check;
pub mod compile;
pub mod diag;
pub mod load;
pub mod model;
pub mod preset;
pub mod run;
pub mod secrets;
pub mod shell;
pub mod source;
pub mod store;
pub mod suggest;
pub mod syntax;
pub mod text;
