//! The library's modules and what each may use: an explicit table of allowed edges, not a
//! total order, so that a module cannot start to lean on another only because that one sits
//! lower. ARCHITECTURE.md draws the same table, and this test holds the two equal.
//!
//! The check reads every `crate::MODULE` path in engine/ (comments left out), every `super::`
//! of a top-level module and every `super::super::` anywhere, so a forbidden import fails
//! here with its file and line.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Every module of `engine/lib.rs`, with the modules it may use (besides itself), bottom up.
const ALLOWED: &[(&str, &[&str])] = &[
    ("keywords", &[]),
    ("source", &[]),
    ("suggest", &[]),
    ("text", &[]),
    ("dialect", &[]),
    ("exit", &[]),
    ("shell", &[]),
    ("spec", &["dialect"]),
    ("permit", &["shell"]),
    ("template", &[]),
    ("diag", &["source", "suggest"]),
    ("fs", &["source"]),
    ("secrets", &["text"]),
    ("syntax", &["diag", "source", "spec"]),
    // `permit`: policies resolve into the rules that decide.
    (
        "model",
        &["diag", "dialect", "permit", "source", "spec", "syntax"],
    ),
    ("params", &["diag", "model"]),
    ("preset", &["diag", "fs", "model"]),
    (
        "load",
        &["diag", "fs", "model", "preset", "source", "syntax"],
    ),
    (
        "check",
        &[
            "diag", "dialect", "exit", "fs", "load", "model", "params", "permit", "source",
            "suggest", "syntax", "template",
        ],
    ),
    // `load` in its tests only; `preset` names the sources a failed preparation lacks.
    (
        "compile",
        &[
            "check", "diag", "exit", "fs", "load", "model", "params", "preset", "source",
        ],
    ),
    (
        "prepare",
        &["check", "compile", "diag", "fs", "load", "preset", "source"],
    ),
    ("store", &["fs", "secrets", "shell", "text"]),
    (
        "backend",
        &[
            "diag", "dialect", "fs", "model", "permit", "secrets", "store",
        ],
    ),
    // Not `check`, `load`, `preset` or `prepare`: the executor runs what was prepared, and
    // prepares a subflow during a run only through the callback left in the plan.
    (
        "run",
        &[
            "backend", "compile", "diag", "exit", "fs", "model", "params", "permit", "secrets",
            "shell", "source", "store", "template", "text",
        ],
    ),
    (
        "serve",
        &[
            "backend", "compile", "diag", "model", "prepare", "run", "secrets", "spec", "store",
            "text",
        ],
    ),
    // The static side only: the language server loads and checks, and never runs.
    (
        "lsp",
        &[
            "check", "diag", "fs", "load", "model", "preset", "source", "spec", "syntax",
            "template",
        ],
    ),
];

fn allowed(module: &str) -> Option<&'static [&'static str]> {
    ALLOWED
        .iter()
        .find(|(m, _)| *m == module)
        .map(|(_, uses)| *uses)
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
        let text = std::fs::read_to_string(file).expect("a source file is readable");
        for (n, line) in text.lines().enumerate() {
            if code(line).contains("super::super::") {
                found.push(format!(
                    "{}:{}: `super::super::` climbs two modules up; write a `crate::` path",
                    file.display(),
                    n + 1
                ));
            }
        }
        let Some(module) = module_of(engine, file) else {
            continue;
        };
        let Some(uses) = allowed(&module) else {
            found.push(format!(
                "{}: module `{module}` is not in the table (add it to ALLOWED here and to ARCHITECTURE.md)",
                file.display()
            ));
            continue;
        };
        let top_level = file.parent() == Some(engine);
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
                if target == module || uses.contains(&target) {
                    continue;
                }
                found.push(if allowed(target).is_some() {
                    format!(
                        "{}:{}: `{module}` uses `{target}`, which its row does not allow",
                        file.display(),
                        n + 1
                    )
                } else {
                    format!(
                        "{}:{}: `crate::{target}` is not in the table",
                        file.display(),
                        n + 1
                    )
                });
            }
        }
    }
    found
}

#[test]
fn modules_use_only_what_their_row_allows() {
    let engine = Path::new(env!("CARGO_MANIFEST_DIR")).join("engine");
    let found = violations(&engine);
    assert!(
        found.is_empty(),
        "imports not allowed:\n{}",
        found.join("\n")
    );
}

#[test]
fn every_library_module_has_a_row() {
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
        assert!(allowed(m).is_some(), "`{m}` is not in the table");
    }
    for (m, uses) in ALLOWED {
        assert!(
            modules.contains(m),
            "ALLOWED names `{m}`, which lib.rs lacks"
        );
        for u in *uses {
            assert!(
                allowed(u).is_some(),
                "`{m}` may use `{u}`, which is not in the table"
            );
        }
    }
}

/// ARCHITECTURE.md's table (`| `module` | what it is | `a`, `b` |` rows under "## Layers").
fn documented() -> Vec<(String, BTreeSet<String>)> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md"))
            .expect("ARCHITECTURE.md is readable");
    let section = doc
        .split("\n## Layers\n")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("ARCHITECTURE.md has a `## Layers` section");
    let ticked = |cell: &str| -> BTreeSet<String> {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').collect();
            let module = cells[0].trim().trim_matches('`').to_string();
            let uses = cells.last().map(|c| ticked(c)).unwrap_or_default();
            (module, uses)
        })
        .collect()
}

#[test]
fn architecture_md_draws_the_same_table() {
    let doc = documented();
    let mut want: Vec<(String, BTreeSet<String>)> = ALLOWED
        .iter()
        .map(|(m, uses)| (m.to_string(), uses.iter().map(|u| u.to_string()).collect()))
        .collect();
    want.sort();
    let mut got = doc;
    got.sort();
    assert_eq!(
        got, want,
        "ARCHITECTURE.md's `## Layers` table differs from ALLOWED in tests/layers.rs"
    );
}

#[test]
fn a_forbidden_import_is_caught() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let engine = dir.path();
    std::fs::create_dir_all(engine.join("model")).expect("mkdir");
    std::fs::create_dir_all(engine.join("run/deep")).expect("mkdir");
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
    // Lower in a total order, and still not allowed: the executor may not load or check.
    std::fs::write(
        engine.join("run/deep/x.rs"),
        "use crate::store::Store;\nuse super::super::exec::Exec;\nfn f() { crate::check::check(); }\n",
    )
    .expect("write");
    let found = violations(engine);
    assert_eq!(found.len(), 4, "{found:#?}");
    assert!(found[0].contains("fs.rs:1: a top-level module names `super::`"));
    assert!(found[1].contains("shape.rs:3: `model` uses `check`"));
    assert!(found[2].contains("x.rs:2: `super::super::` climbs two modules up"));
    assert!(found[3].contains("x.rs:3: `run` uses `check`"));
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
