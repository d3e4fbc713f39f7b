//! Parsing: TOML and KDL text into one spanned syntax tree.

pub mod emit;
pub mod kdl;
pub mod strings;
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

/// The deepest nesting of brackets and braces a file may have; deeper input is refused before
/// parsing, so that no input can exhaust the stack.
pub const MAX_DEPTH: usize = 128;

/// Parses a workflow file's text in the given syntax.
pub fn parse(file: FileId, text: &str, format: Format, diags: &mut Diagnostics) -> tree::Table {
    if let Some(at) = too_deep(text) {
        diags.push(
            crate::diag::Diagnostic::new(
                crate::diag::Code::Syntax,
                crate::source::Span::new(file, at..at + 1),
                format!("nested more than {MAX_DEPTH} levels deep"),
            )
            .help("flatten the structure; workflows never need this depth"),
        );
        return tree::Table::default();
    }
    match format {
        Format::Toml => toml::parse(file, text, diags),
        Format::Kdl => kdl::parse(file, text, diags),
    }
}

/// Returns the offset where bracket nesting first exceeds [`MAX_DEPTH`], counting every `[`
/// and `{` (also inside strings, which only makes the limit stricter).
fn too_deep(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, b) in text.bytes().enumerate() {
        match b {
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Some(i);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}
