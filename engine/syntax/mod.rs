//! Parsing: TOML and KDL text into one spanned syntax tree.

pub mod emit;
pub mod kdl;
pub mod toml;
pub mod tree;

use std::path::Path;

use crate::diag::Diagnostics;
use crate::source::FileId;

/// The two syntaxes of a workflow file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Toml,
    Kdl,
}

impl Format {
    /// Chooses the syntax from a file's extension (`.kdl` is KDL; anything else is TOML).
    pub fn from_path(path: &Path) -> Format {
        match path.extension().and_then(|e| e.to_str()) {
            Some("kdl") => Format::Kdl,
            _ => Format::Toml,
        }
    }
}

/// Parses a workflow file's text in the given syntax.
pub fn parse(file: FileId, text: &str, format: Format, diags: &mut Diagnostics) -> tree::Table {
    match format {
        Format::Toml => toml::parse(file, text, diags),
        Format::Kdl => kdl::parse(file, text, diags),
    }
}
