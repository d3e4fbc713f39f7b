//! The library's modules form layers, and imports only point down: a module may use those of
//! its own layer or below, never one above. ARCHITECTURE.md draws the same table.
//!
//! The check reads every `crate::MODULE` path in engine/ (comments left out) and every
//! `super::` of a top-level module, so an upward import fails here with its file and line.

use std::path::{Path, PathBuf};

/// The layers, bottom first. Each module of `engine/lib.rs` is in exactly one.
const LAYERS: &[&[&str]] = &[
    &["keywords", "source", "suggest", "text"],
    &["diag", "dialect", "exit", "fs", "secrets", "shell", "spec"],
    &["syntax"],
    &["model"],
    &["params"],
    &["preset"],
    &["load"],
    &["template"],
    &["check"],
    &["compile"],
    &["store"],
    &["backend"],
    &["run"],
    &["serve"],
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("engine/ is readable")
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The library module a file belongs to: `engine/run/exec.rs` → `run`, `engine/fs.rs` → `fs`.
/// None for the crate roots and for the binary's own modules (the CLI, on top of everything).
fn module_of(engine: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(engine).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main" | "cli")).then(|| name.to_string())
}

/// The modules a line names as `crate::NAME`.
fn crate_paths(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        out.push(&rest[..end]);
    }
    out
}

/// The code of a line: without a `//` comment (a `//` inside a string is rare enough in
/// `use` lines and paths to be ignored).
fn code(line: &str) -> &str {
    line.split("//").next().unwrap_or("")
}

fn violations(engine: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(engine, &mut files);
    let mut found = Vec::new();
    for file in &files {
        let Some(module) = module_of(engine, file) else {
            continue;
        };
        let Some(own) = layer(&module) else {
            found.push(format!(
                "{}: module `{module}` is in no layer (add it to LAYERS here and to ARCHITECTURE.md)",
                file.display()
            ));
            continue;
        };
        let top_level = file.parent() == Some(engine);
        let text = std::fs::read_to_string(file).expect("a source file is readable");
        // Inside an inline module (`mod tests {`), `super::` is the file's own module.
        let mut nested = false;
        for (n, line) in text.lines().enumerate() {
            let code = code(line);
            nested |= code.trim_start().starts_with("mod ") && code.contains('{');
            if top_level && !nested && code.contains("super::") {
                found.push(format!(
                    "{}:{}: a top-level module names `super::`; write `crate::` paths",
                    file.display(),
                    n + 1
                ));
            }
            for target in crate_paths(code) {
                if target == module {
                    continue;
                }
                match layer(target) {
                    Some(l) if l > own => found.push(format!(
                        "{}:{}: `{module}` (layer {own}) uses `{target}` (layer {l}), a layer above it",
                        file.display(),
                        n + 1
                    )),
                    Some(_) => {}
                    None => found.push(format!(
                        "{}:{}: `crate::{target}` is in no layer",
                        file.display(),
                        n + 1
                    )),
                }
            }
        }
    }
    found
}

#[test]
fn imports_point_down_the_layers() {
    let engine = Path::new(env!("CARGO_MANIFEST_DIR")).join("engine");
    let found = violations(&engine);
    assert!(found.is_empty(), "upward imports:\n{}", found.join("\n"));
}

#[test]
fn every_library_module_has_a_layer() {
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("engine/lib.rs"))
        .expect("engine/lib.rs is readable");
    let modules: Vec<&str> = lib
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            l.strip_prefix("pub mod ")
                .or_else(|| l.strip_prefix("mod "))
        })
        .map(|m| m.trim_end_matches(';'))
        .collect();
    assert!(modules.len() > 10, "{modules:?}");
    for m in &modules {
        assert!(layer(m).is_some(), "`{m}` is in no layer");
    }
    for m in LAYERS.iter().flat_map(|l| l.iter()) {
        assert!(
            modules.contains(m),
            "LAYERS names `{m}`, which lib.rs lacks"
        );
    }
}

#[test]
fn an_upward_import_is_caught() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let engine = dir.path();
    std::fs::create_dir_all(engine.join("model")).expect("mkdir");
    std::fs::write(
        engine.join("model/shape.rs"),
        "// crate::run is only mentioned here\nuse crate::syntax::tree;\nfn f() { crate::check::article(\"x\"); }\n",
    )
    .expect("write");
    std::fs::write(
        engine.join("fs.rs"),
        "use super::load::Loader;\n#[cfg(test)]\nmod tests {\n    use super::Loader;\n}\n",
    )
    .expect("write");
    let found = violations(engine);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(found[0].contains("fs.rs:1: a top-level module names `super::`"));
    assert!(found[1].contains("shape.rs:3: `model` (layer 3) uses `check` (layer 8)"));
}

/// What names a concrete store. Only `store/` may: the executor and the monitor reach a store
/// through `store::Location` and the traits of `store::shared`, so that a new store is
/// `store/` plus one registration.
const CONCRETE_STORES: &[&str] = &["PgStore", "SqliteStore", "store::postgres", "store::sqlite"];

/// Every line under `engine/run/` and `engine/serve/` (comments and tests too, read as text)
/// that names a concrete store.
fn concrete_store_names(engine: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for dir in ["run", "serve"] {
        let mut files = Vec::new();
        if engine.join(dir).is_dir() {
            rust_files(&engine.join(dir), &mut files);
        }
        for file in files {
            let text = std::fs::read_to_string(&file).expect("a source file is readable");
            for (i, line) in text.lines().enumerate() {
                for name in CONCRETE_STORES.iter().filter(|n| line.contains(*n)) {
                    found.push(format!("{}:{}: names `{name}`", file.display(), i + 1));
                }
            }
        }
    }
    found
}

#[test]
fn run_and_serve_name_no_concrete_store() {
    let engine = Path::new(env!("CARGO_MANIFEST_DIR")).join("engine");
    let found = concrete_store_names(&engine);
    assert!(
        found.is_empty(),
        "run/ and serve/ name a concrete store (go through store::Location and the traits of \
         store::shared):\n{}",
        found.join("\n")
    );
}

#[test]
fn a_concrete_store_named_in_run_or_serve_is_caught() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let engine = dir.path();
    std::fs::create_dir_all(engine.join("run")).expect("mkdir");
    std::fs::create_dir_all(engine.join("serve")).expect("mkdir");
    std::fs::write(
        engine.join("run/units.rs"),
        "use crate::store::{SharedStore, UnitRequest};\nuse crate::store::postgres::PgStore;\n",
    )
    .expect("write");
    std::fs::write(
        engine.join("serve/mod.rs"),
        "// opened as store::sqlite::Durability::Normal\n",
    )
    .expect("write");
    let found = concrete_store_names(engine);
    assert_eq!(found.len(), 3, "{found:#?}");
    assert!(
        found[0].contains("units.rs:2: names `PgStore`"),
        "{found:#?}"
    );
    assert!(
        found[1].contains("units.rs:2: names `store::postgres`"),
        "{found:#?}"
    );
    assert!(
        found[2].contains("mod.rs:1: names `store::sqlite`"),
        "{found:#?}"
    );
}
