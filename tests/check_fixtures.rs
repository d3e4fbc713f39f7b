//! Snapshot tests of `ralph-flow check` over the fixture corpus in `tests/fixtures/check`.
//!
//! - `valid/*.{toml,kdl}`: workflows that must check without errors (warnings only when the
//!   file name says `warn`). Every construct is written in both syntaxes, under the same name.
//!   `valid/support/` holds the prompt files, schemas and workflows they refer to.
//! - `invalid/<CODE>-<name>.{toml,kdl}`: each must report at least one diagnostic with `CODE`;
//!   every code of [`Code::ALL`] has at least one. `invalid/many-*.{toml,kdl}` show that every
//!   problem of a file is reported at once.
//! - `gaps/*.{toml,kdl}`: known checker gaps; snapshotted as they behave today, without
//!   assertions, so that a fix shows up as a snapshot change.
//!
//! A fixture may carry directives in comments (`#` in TOML, `//` in KDL):
//! - `--set key=value`: passed as the CLI's `--set` (which also makes required params required);
//! - `expect: RF002 RF010`: codes that must all be reported, besides the file name's one.
//!
//! Each fixture is loaded and checked exactly as `ralph-flow check` does, and its diagnostics
//! are rendered without colors; paths are shown relative to the crate root.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use ralph_flow::diag::{Code, Diagnostic, Diagnostics, Severity, render};
use ralph_flow::fs::RealFs;
use ralph_flow::load::Loader;
use ralph_flow::params::parse_set;
use ralph_flow::source::Sources;

const FIXTURES: &str = "tests/fixtures/check";

/// What checking one fixture gave.
struct Outcome {
    diags: Vec<Diagnostic>,
    /// The rendered diagnostics and a summary line, as snapshotted.
    text: String,
}

impl Outcome {
    fn codes(&self) -> BTreeSet<&'static str> {
        self.diags.iter().map(|d| d.code.as_str()).collect()
    }

    fn errors(&self) -> usize {
        self.diags
            .iter()
            .filter(|d| d.severity == Severity::Error)
            .count()
    }

    fn warnings(&self) -> usize {
        self.diags.len() - self.errors()
    }

    /// The last line of a snapshot: counts and codes.
    fn summary(&self) -> String {
        let codes: Vec<&str> = self.codes().into_iter().collect();
        format!(
            "=> {} error(s), {} warning(s){}{}\n",
            self.errors(),
            self.warnings(),
            if codes.is_empty() { "" } else { ": " },
            codes.join(", ")
        )
    }
}

/// The crate root (as Cargo and as the current directory name it), with a trailing separator,
/// as it appears at the start of absolute paths.
fn root_prefixes() -> Vec<String> {
    let cwd = std::env::current_dir().expect("the current directory");
    let mut roots = vec![
        format!("{}/", env!("CARGO_MANIFEST_DIR")),
        format!("{}/", cwd.display()),
    ];
    roots.dedup();
    roots
}

/// Turns the absolute path `insta::glob!` hands out into one relative to the crate root.
fn relative(path: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    path.strip_prefix(root)
        .map_or_else(|_| path.to_path_buf(), Path::to_path_buf)
}

/// Reads a fixture's directives: `--set` values and expected codes.
fn directives(path: &Path) -> (Vec<(String, String)>, Vec<String>) {
    let bytes = std::fs::read(path).expect("the fixture is readable");
    let text = String::from_utf8_lossy(&bytes);
    let mut sets = Vec::new();
    let mut expect = Vec::new();
    for line in text.lines() {
        let line = line.trim_start();
        let Some(comment) = line.strip_prefix('#').or_else(|| line.strip_prefix("//")) else {
            continue;
        };
        let comment = comment.trim();
        if let Some(set) = comment.strip_prefix("--set ") {
            sets.push(parse_set(set.trim()).expect("a `--set key=value` directive"));
        } else if let Some(codes) = comment.strip_prefix("expect:") {
            expect.extend(codes.split_whitespace().map(str::to_string));
        }
    }
    (sets, expect)
}

/// Removes the crate root from paths written in a text.
fn strip_root(text: &str, roots: &[String]) -> String {
    roots
        .iter()
        .fold(text.to_string(), |t, root| t.replace(root.as_str(), ""))
}

/// Loads and checks one fixture as `ralph-flow check FILE` does, and renders the result.
fn check_fixture(path: &Path) -> Outcome {
    let rel = relative(path);
    let (sets, _) = directives(path);
    let mut sources = Sources::new();
    let mut diags = Diagnostics::default();
    let fs = RealFs;
    let mut loader = Loader::new(&fs, &mut sources, &mut diags);
    if let Some(wf) = loader.load(&rel, None) {
        let mut cd = Diagnostics::default();
        let _ = ralph_flow::check::check(&wf, &mut loader, &sets, !sets.is_empty(), &mut cd);
        diags.extend(cd);
    }
    let mut diags = diags.into_sorted();

    // Show every path relative to the crate root, whatever the loader made of it.
    let root = root_prefixes();
    let mut shown = Sources::new();
    for (id, file) in sources.iter() {
        let path = strip_root(&file.path.display().to_string(), &root);
        let new_id = shown.add(path, file.text.clone());
        assert_eq!(id, new_id, "relative paths keep file ids");
    }
    for d in &mut diags {
        d.message = strip_root(&d.message, &root);
        d.label = d.label.as_deref().map(|l| strip_root(l, &root));
        d.help = d.help.as_deref().map(|h| strip_root(h, &root));
        for (_, label) in &mut d.related {
            *label = strip_root(label, &root);
        }
    }

    let rendered = render(&shown, &diags, false);
    let text = rendered
        .lines()
        .map(|l| format!("{}\n", printable(l.trim_end())))
        .collect();
    let mut outcome = Outcome { diags, text };
    let summary = outcome.summary();
    outcome.text.push_str(&summary);
    assert!(
        root.iter().all(|r| !outcome.text.contains(r.as_str())),
        "the snapshot of {} shows an absolute path:\n{}",
        rel.display(),
        outcome.text
    );
    outcome
}

/// Escapes control characters (garbage fixtures hold some), so snapshots stay plain text.
fn printable(line: &str) -> String {
    line.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn file_name(path: &Path) -> &str {
    path.file_name()
        .and_then(|n| n.to_str())
        .expect("a UTF-8 file name")
}

/// Valid fixtures check without errors, and without warnings unless their name says `warn`.
#[test]
fn valid() {
    insta::glob!("fixtures/check/valid/*.{toml,kdl}", |path| {
        let outcome = check_fixture(path);
        let name = file_name(path);
        assert_eq!(
            outcome.errors(),
            0,
            "{name} must check without errors:\n{}",
            outcome.text
        );
        if !name.contains("warn") {
            assert_eq!(
                outcome.warnings(),
                0,
                "{name} must check without warnings (or say `warn` in its name):\n{}",
                outcome.text
            );
        }
        insta::assert_snapshot!(outcome.text);
    });
}

#[test]
fn valid_support_workflows_check_cleanly() {
    insta::glob!("fixtures/check/valid/support/*.{toml,kdl}", |path| {
        let outcome = check_fixture(path);
        assert!(
            outcome.diags.is_empty(),
            "{} must check cleanly:\n{}",
            file_name(path),
            outcome.text
        );
    });
}

/// Each invalid fixture reports the code its name starts with (and any `expect:` codes).
#[test]
fn invalid() {
    insta::glob!("fixtures/check/invalid/*.{toml,kdl}", |path| {
        let outcome = check_fixture(path);
        let name = file_name(path);
        let codes = outcome.codes();
        let (_, mut expected) = directives(path);
        if let Some(many) = name.strip_prefix("many-") {
            assert!(
                expected.len() >= 3,
                "many-{many} must list the codes it shows in an `expect:` directive (three or more)"
            );
            assert!(
                outcome.diags.len() >= 5,
                "{name} must report many problems at once:\n{}",
                outcome.text
            );
        } else {
            let prefix = name.split('-').next().unwrap_or_default();
            assert!(
                Code::ALL.iter().any(|c| c.as_str() == prefix),
                "{name} must be named <CODE>-<name> after a code of Code::ALL, or many-<name>"
            );
            expected.insert(0, prefix.to_string());
        }
        for code in &expected {
            assert!(
                codes.contains(code.as_str()),
                "{name} must report {code}, but reported {codes:?}:\n{}",
                outcome.text
            );
        }
        insta::assert_snapshot!(outcome.text);
    });
}

/// The parser's own phrases, which a KDL syntax error must never show: ralph-flow says what is
/// wrong and what to write in words of its own.
const KDL_PARSER_PHRASES: &[&str] = &[
    "not quoted string",
    "not identifier string",
    "not node name",
    "not property value",
    "not closed",
    "Expected end of document",
    "not EOF",
    "value terminator",
    "partially parsed",
    "Found invalid node name",
    "Found child block",
    "Did you forget",
    "Expected quoted string",
    "Expected identifier string",
];

/// Each KDL syntax fixture (`invalid/RF001-kdl-*.kdl`) marks the lines of its mistakes with a
/// `// mistake-on-line: N ...` directive: it must report exactly one diagnostic per marked line
/// (no echo errors after it), each on its line, in ralph-flow's own words.
#[test]
fn kdl_syntax_errors_are_ours_one_per_mistake_on_its_line() {
    let names: Vec<String> = names_in("invalid")
        .into_iter()
        .filter(|n| n.starts_with("RF001-kdl-") && n.ends_with(".kdl"))
        .collect();
    assert!(names.len() >= 20, "the KDL syntax fixtures: {names:?}");
    for name in names {
        let path = Path::new(FIXTURES).join("invalid").join(&name);
        let text = std::fs::read_to_string(&path).expect("a KDL fixture is UTF-8");
        let marked: Vec<usize> = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("// mistake-on-line:"))
            .unwrap_or_else(|| panic!("{name} must mark its mistake: `// mistake-on-line: N`"))
            .split_whitespace()
            .map(|n| n.parse().expect("a line number"))
            .collect();
        let outcome = check_fixture(&path);
        let lines: Vec<usize> = outcome
            .diags
            .iter()
            .map(|d| {
                let start = d.span.map_or(0, |s| s.start as usize);
                text[..start.min(text.len())].matches('\n').count() + 1
            })
            .collect();
        assert_eq!(
            lines, marked,
            "{name} must report one diagnostic on each marked line, and nothing else:\n{}",
            outcome.text
        );
        for d in &outcome.diags {
            assert_eq!(d.code, Code::Syntax, "{name}:\n{}", outcome.text);
            let words = [
                d.message.as_str(),
                d.label.as_deref().unwrap_or_default(),
                d.help.as_deref().unwrap_or_default(),
            ];
            for phrase in KDL_PARSER_PHRASES {
                assert!(
                    words.iter().all(|w| !w.contains(phrase)),
                    "{name} shows the parser's phrase {phrase:?}:\n{}",
                    outcome.text
                );
            }
            assert!(
                d.help.as_deref().is_some_and(|h| !h.is_empty()),
                "{name} must say what to write instead:\n{}",
                outcome.text
            );
        }
    }
}

/// Known gaps: snapshots of what the checker does today, where it should do more.
#[test]
fn gaps() {
    // Closing the last known gap leaves the directory without fixtures (only its README).
    let mut settings = insta::Settings::clone_current();
    settings.set_allow_empty_glob(true);
    settings.bind(|| {
        insta::glob!("fixtures/check/gaps/*.{toml,kdl}", |path| {
            insta::assert_snapshot!(check_fixture(path).text);
        });
    });
}

/// Lists the file names of a fixture directory.
fn names_in(dir: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(Path::new(FIXTURES).join(dir))
        .expect("the fixture directory")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_file())
        .map(|p| file_name(&p).to_string())
        .collect();
    names.sort();
    names
}

#[test]
fn every_code_has_an_invalid_fixture() {
    let names = names_in("invalid");
    let missing: Vec<&str> = Code::ALL
        .iter()
        .map(|c| c.as_str())
        .filter(|code| !names.iter().any(|n| n.starts_with(&format!("{code}-"))))
        .collect();
    assert!(
        missing.is_empty(),
        "codes without a fixture in {FIXTURES}/invalid: {missing:?}"
    );
}

#[test]
fn every_valid_fixture_exists_in_both_syntaxes() {
    let names = names_in("valid");
    let stems = |ext: &str| -> BTreeSet<String> {
        names
            .iter()
            .filter_map(|n| n.strip_suffix(ext))
            .map(str::to_string)
            .collect()
    };
    let (toml, kdl) = (stems(".toml"), stems(".kdl"));
    let only_toml: Vec<&String> = toml.difference(&kdl).collect();
    let only_kdl: Vec<&String> = kdl.difference(&toml).collect();
    assert!(
        only_toml.is_empty() && only_kdl.is_empty(),
        "valid fixtures in one syntax only: TOML {only_toml:?}, KDL {only_kdl:?}"
    );
}
