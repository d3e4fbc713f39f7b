//! Random, truncated, mutated and huge inputs never make parse or check panic.

use ralph_flow::diag::Diagnostics;
use ralph_flow::fs::FileSystem;
use ralph_flow::load::Loader;
use ralph_flow::source::Sources;
use std::path::{Path, PathBuf};

/// A deterministic xorshift generator, so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A file system holding one workflow; every other read fails.
struct One(PathBuf, String);

impl FileSystem for One {
    fn read(&self, path: &Path) -> std::io::Result<String> {
        if ralph_flow::fs::normalize(path) == ralph_flow::fs::normalize(&self.0) {
            Ok(self.1.clone())
        } else {
            Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "not in the test",
            ))
        }
    }
}

fn check_text(name: &str, text: String) {
    let fs = One(PathBuf::from(name), text);
    let mut sources = Sources::new();
    let mut diags = Diagnostics::default();
    let mut loader = Loader::new(&fs, &mut sources, &mut diags);
    if let Some(wf) = loader.load(Path::new(name), None) {
        let mut cd = Diagnostics::default();
        if let Some(checked) = ralph_flow::check::check(&wf, &mut loader, &[], false, &mut cd) {
            let plan = ralph_flow::compile::compile(&checked);
            let _ = ralph_flow::compile::explain::explain(&plan);
            let _ = ralph_flow::compile::render::render(
                &plan,
                ralph_flow::compile::render::GraphFormat::Dot,
            );
        }
        diags.extend(cd);
    }
    // Rendering must not panic either, whatever the spans.
    let _ = ralph_flow::diag::render(&sources, &diags.into_sorted(), false);
}

fn seeds() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for dir in [
        "workflows",
        "tests/fixtures/check/valid",
        "tests/fixtures/check/invalid",
    ] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for e in entries {
            let p = e.expect("entry").path();
            if let (Some(ext @ ("toml" | "kdl")), Ok(text)) = (
                p.extension().and_then(|x| x.to_str()),
                std::fs::read_to_string(&p),
            ) {
                out.push((format!("seed.{ext}"), text));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn truncated_inputs_do_not_panic() {
    for (name, text) in seeds() {
        let bytes = text.as_bytes();
        let step = (bytes.len() / 40).max(1);
        for cut in (0..bytes.len()).step_by(step) {
            check_text(&name, String::from_utf8_lossy(&bytes[..cut]).into_owned());
        }
    }
}

#[test]
fn mutated_inputs_do_not_panic() {
    const PIECES: &[&str] = &[
        "{{",
        "}}",
        "{%",
        "\"",
        "'",
        "[",
        "]",
        "{",
        "}",
        "=",
        "\n",
        "#",
        "\\",
        "stages.",
        "kind = \"loop\"",
        "needs = [\"x\"]",
        "max_iterations = 0",
        "until = \"",
        "exit:",
        "continue",
        "\u{0}",
        "\u{feff}",
        "é",
        "🦀",
        "/-",
        "#true",
        "999999999999999999999",
        "-1",
        "1.5e308",
        "nan",
        "inf",
        "stage \"a\" {",
        "}",
        ";",
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for (name, text) in seeds() {
        for _ in 0..60 {
            let mut t: Vec<char> = text.chars().collect();
            for _ in 0..1 + rng.below(4) {
                if t.is_empty() {
                    break;
                }
                let at = rng.below(t.len());
                match rng.below(3) {
                    0 => {
                        let end = (at + rng.below(20)).min(t.len());
                        t.drain(at..end);
                    }
                    1 => {
                        let piece = PIECES[rng.below(PIECES.len())];
                        for (i, c) in piece.chars().enumerate() {
                            t.insert((at + i).min(t.len()), c);
                        }
                    }
                    _ => {
                        let other = rng.below(t.len());
                        t.swap(at, other);
                    }
                }
            }
            check_text(&name, t.into_iter().collect());
        }
    }
}

#[test]
fn random_bytes_do_not_panic() {
    let mut rng = Rng(42);
    for n in 0..200 {
        let len = rng.below(400);
        let bytes: Vec<u8> = (0..len).map(|_| (rng.next() & 0xff) as u8).collect();
        let ext = if n % 2 == 0 { "toml" } else { "kdl" };
        check_text(
            &format!("random.{ext}"),
            String::from_utf8_lossy(&bytes).into_owned(),
        );
    }
}

#[test]
fn huge_and_deep_inputs_do_not_panic() {
    let mut wide = String::from("name = \"wide\"\n");
    for i in 0..3000 {
        wide.push_str(&format!(
            "[stages.s{i}]\nkind = \"command\"\nargv = [\"true\"]\n{}\n",
            if i > 0 {
                format!("needs = [\"s{}\"]", i - 1)
            } else {
                String::new()
            }
        ));
    }
    check_text("wide.toml", wide);
    let mut deep = String::from("name = \"deep\"\n");
    let mut path = String::from("stages");
    for i in 0..60 {
        path.push_str(&format!(".l{i}"));
        deep.push_str(&format!(
            "[{path}]\nkind = \"loop\"\nmax_iterations = 2\nuntil = \"true\"\n"
        ));
        path.push_str(".stages");
    }
    check_text("deep.toml", deep);
    check_text(
        "nested.toml",
        format!(
            "name = \"x\"\nv = {}1{}\n",
            "[".repeat(2000),
            "]".repeat(2000)
        ),
    );
    check_text(
        "nested.kdl",
        format!("name x\n{}\n", "a {".repeat(2000) + &"}".repeat(2000)),
    );
}

#[test]
fn non_ascii_next_to_reported_places_does_not_panic() {
    let toml = [
        "name = \"é\"\n[stages.é]\nkind = \"command\"\n[stages.é]\nkind = \"command\"\n",
        "name = \"x\"\n[stages.a]\nkind = \"command\"\nargv = [\"é\\t{{ nöpe }}\", \"\"\"\nç \\\n  {% if é %}\"\"\"]\nargv = []\n",
        "name = \"x\"\n[stages.a]\nkind = \"command\"\nargv = [\"\\u00e9{{ params.x\"]\n",
    ];
    for text in toml {
        for cut in 0..=text.len() {
            if text.is_char_boundary(cut) {
                check_text("w.toml", text[..cut].to_string());
            }
        }
    }
    let kdl = [
        "name \"x\"\nstage \"a\" kind=\"command\" {\n    argv \"é\\u{e9}{{ nöpe }}\" \"\"\"\n        ç {% if é %}\n        \"\"\"\n}\n",
        "name \"x\"\nstage \"é\" kind=true {\n    argv \"ç\né\"\n",
    ];
    for text in kdl {
        for cut in 0..=text.len() {
            if text.is_char_boundary(cut) {
                check_text("w.kdl", text[..cut].to_string());
            }
        }
    }
}
