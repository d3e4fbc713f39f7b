//! Embeds the shipped presets (`workflows/`, `prompts/`, `schemas/`) into the binary, so that
//! `extends = "spider"` works wherever ralph-flow is installed.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["workflows", "prompts", "schemas"] {
        println!("cargo:rerun-if-changed={dir}");
        collect(&root, &root.join(dir), &mut files);
    }
    files.sort();
    let mut out =
        String::from("/// Every embedded file: its path below the preset root, and its text.\n");
    out.push_str("pub(crate) static FILES: &[(&str, &str)] = &[\n");
    for rel in &files {
        let full = root.join(rel);
        writeln!(
            out,
            "    ({rel:?}, include_str!({:?})),",
            full.display().to_string()
        )
        .expect("writing to a String");
    }
    out.push_str("];\n");
    let dest = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("builtin.rs");
    std::fs::write(dest, out).expect("writing builtin.rs");
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(root, &path, out);
        } else if let Ok(rel) = path.strip_prefix(root) {
            let rel = rel.to_string_lossy().replace('\\', "/");
            if !rel.ends_with('~') && !rel.contains("/.") {
                out.push(rel);
            }
        }
    }
}
