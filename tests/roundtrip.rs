//! TOML → KDL → TOML keeps every workflow the same: the same tree, and the same compiled plan;
//! and each written in its own syntax reads back the same, written the same way every time.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ralph_flow::compile::render::{GraphFormat, render};
use ralph_flow::compile::{compile, explain::explain};
use ralph_flow::diag::Diagnostics;
use ralph_flow::fs::{FileSystem, RealFs};
use ralph_flow::load::Loader;
use ralph_flow::source::{FileId, Sources};
use ralph_flow::syntax::{self, Format, emit};

/// The real file system with some files replaced.
struct Overlay(HashMap<PathBuf, String>);

impl FileSystem for Overlay {
    fn read(&self, path: &Path) -> std::io::Result<String> {
        let abs = ralph_flow::fs::normalize(path);
        match self.0.get(&abs) {
            Some(text) => Ok(text.clone()),
            None => RealFs.read(path),
        }
    }
}

/// Loads, checks and compiles, and describes the plan in every way the CLI can.
fn plan_signature(fs: &dyn FileSystem, path: &Path) -> String {
    let mut sources = Sources::new();
    let mut diags = Diagnostics::default();
    let mut loader = Loader::new(fs, &mut sources, &mut diags);
    let wf = loader.load(path, None).expect("loads");
    let mut cd = Diagnostics::default();
    let checked = ralph_flow::check::check(&wf, &mut loader, &[], false, &mut cd);
    let errors: Vec<String> = cd
        .iter()
        .filter(|d| d.is_error())
        .map(|d| format!("{:?}: {}", d.code, d.message))
        .collect();
    let checked =
        checked.unwrap_or_else(|| panic!("{} does not check: {errors:?}", path.display()));
    let plan = compile(&checked);
    format!(
        "{}\n{}\n{}",
        explain(&plan),
        render(&plan, GraphFormat::Mermaid),
        render(&plan, GraphFormat::Dot)
    )
}

fn tree_json(text: &str, format: Format) -> serde_json::Value {
    let mut diags = Diagnostics::default();
    let tree = syntax::parse(FileId(0), text, format, &mut diags);
    assert!(!diags.has_errors(), "{:?}", diags.into_sorted());
    syntax::tree::Value::new(Default::default(), syntax::tree::ValueKind::Table(tree)).to_json()
}

fn workflow_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["workflows", "tests/fixtures/check/valid"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for e in entries {
            let p = e.expect("entry").path();
            if matches!(p.extension().and_then(|x| x.to_str()), Some("toml" | "kdl")) {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn every_workflow_survives_conversion_both_ways() {
    let files = workflow_files();
    assert!(files.len() >= 2, "expected workflows to test");
    for path in files {
        let text = std::fs::read_to_string(&path).expect("read");
        let format = Format::from_path(&path);
        let other = if format == Format::Toml {
            Format::Kdl
        } else {
            Format::Toml
        };
        let original = tree_json(&text, format);
        let mut diags = Diagnostics::default();
        let tree = syntax::parse(FileId(0), &text, format, &mut diags);
        let converted = match other {
            Format::Kdl => emit::to_kdl(&tree),
            Format::Toml => emit::to_toml(&tree),
        };
        assert_eq!(
            tree_json(&converted, other),
            original,
            "{}: the converted tree differs:\n{converted}",
            path.display()
        );
        let back = match format {
            Format::Kdl => emit::to_kdl(&syntax::parse(FileId(0), &converted, other, &mut diags)),
            Format::Toml => emit::to_toml(&syntax::parse(FileId(0), &converted, other, &mut diags)),
        };
        assert_eq!(
            tree_json(&back, format),
            original,
            "{}: there and back differs",
            path.display()
        );
        // Written again in its own syntax (what `fmt --to` the same syntax does), the file
        // reads back the same, and writing that once more changes nothing.
        let same = match format {
            Format::Kdl => emit::to_kdl(&tree),
            Format::Toml => emit::to_toml(&tree),
        };
        assert_eq!(
            tree_json(&same, format),
            original,
            "{}: written in its own syntax differs:\n{same}",
            path.display()
        );
        let again = match format {
            Format::Kdl => emit::to_kdl(&syntax::parse(FileId(0), &same, format, &mut diags)),
            Format::Toml => emit::to_toml(&syntax::parse(FileId(0), &same, format, &mut diags)),
        };
        assert_eq!(again, same, "{}: writing is not stable", path.display());

        // The converted file, standing where the original stands, compiles to the same plan.
        let ext = if other == Format::Kdl { "kdl" } else { "toml" };
        let twin = ralph_flow::fs::normalize(&path.with_extension(format!("roundtrip.{ext}")));
        let overlay = Overlay(HashMap::from([(twin.clone(), converted)]));
        let expected = plan_signature(&RealFs, &path);
        let actual = plan_signature(&overlay, &twin);
        assert_eq!(
            actual,
            expected,
            "{}: the converted workflow compiles to another plan",
            path.display()
        );
    }
}
