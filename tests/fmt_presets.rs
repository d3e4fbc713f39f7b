//! What `ralph-flow fmt` writes for every shipped preset, in both syntaxes, kept as snapshots
//! so that a change in how the files read is seen in review; and the readability rules the
//! snapshots rely on: multi-line text stays multi-line, stages stand apart.

use std::path::Path;

use ralph_flow::diag::Diagnostics;
use ralph_flow::source::FileId;
use ralph_flow::syntax::tree::{Table, Value, ValueKind};
use ralph_flow::syntax::{self, Format, emit};

fn parse(text: &str, format: Format) -> Table {
    let mut diags = Diagnostics::default();
    let tree = syntax::parse(FileId(0), text, format, &mut diags);
    assert!(
        !diags.has_errors(),
        "{format:?} did not parse: {:?}\n{text}",
        diags.into_sorted()
    );
    tree
}

fn read(path: &Path) -> Table {
    let text = std::fs::read_to_string(path).expect("read the preset");
    parse(&text, Format::from_path(path))
}

#[test]
fn every_preset_in_kdl() {
    insta::glob!("../workflows", "*.{toml,kdl}", |path| {
        insta::assert_snapshot!(emit::to_kdl(&read(path)));
    });
}

#[test]
fn every_preset_in_toml() {
    insta::glob!("../workflows", "*.{toml,kdl}", |path| {
        insta::assert_snapshot!(emit::to_toml(&read(path)));
    });
}

/// Every string of the tree that holds a line break.
fn multi_line_strings(value: &Value, out: &mut Vec<String>) {
    match &value.kind {
        ValueKind::Str(s) if s.contains('\n') => out.push(s.clone()),
        ValueKind::Array(items) => items.iter().for_each(|v| multi_line_strings(v, out)),
        ValueKind::Table(t) => t
            .entries
            .iter()
            .for_each(|e| multi_line_strings(&e.value, out)),
        _ => {}
    }
}

/// A prompt of several lines, with quotes and backslashes in one of them, in both syntaxes.
const PROMPTS_TOML: &str = r#"
name = "prompts"

[stages.plan]
kind = "agent"
agent = "claude"
prompt = """
Plan the work for {{ params.task }}.
Keep it short.
"""

[stages.review]
kind = "agent"
agent = "claude"
needs = ["plan"]
prompt = '''
Review it. Write "VERDICT:" then approve or revise.
A path such as C:\work is fine.
'''
"#;

#[test]
fn multi_line_text_stays_multi_line_in_both_syntaxes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut trees = vec![("inline".to_string(), parse(PROMPTS_TOML, Format::Toml))];
    for preset in ["workflows/task-loop.toml", "workflows/wiggum-review.kdl"] {
        trees.push((preset.to_string(), read(&root.join(preset))));
    }
    for (name, tree) in trees {
        let mut texts = Vec::new();
        multi_line_strings(
            &Value::new(Default::default(), ValueKind::Table(tree.clone())),
            &mut texts,
        );
        assert!(!texts.is_empty(), "{name}: has text of several lines");
        for (format, out) in [
            (Format::Kdl, emit::to_kdl(&tree)),
            (Format::Toml, emit::to_toml(&tree)),
        ] {
            // No `\n` escape anywhere: each line of the text is a line of the file.
            assert!(
                !out.contains("\\n"),
                "{name} as {format:?}: a `\\n` escape\n{out}"
            );
            for text in &texts {
                for line in text.lines().filter(|l| !l.trim().is_empty()) {
                    // The last line may end with the closing quotes.
                    let line = line.trim();
                    let closing = ["\"\"\"", "'''", "\"\"\"#"];
                    assert!(
                        out.lines().map(str::trim).any(|l| l == line
                            || l.strip_prefix(line)
                                .is_some_and(|end| closing.contains(&end))),
                        "{name} as {format:?}: the line {line:?} is not a line of\n{out}"
                    );
                }
            }
            assert_eq!(
                syntax::tree::Value::new(Default::default(), ValueKind::Table(parse(&out, format)))
                    .to_json(),
                syntax::tree::Value::new(Default::default(), ValueKind::Table(tree.clone()))
                    .to_json(),
                "{name} as {format:?}: reads back the same"
            );
        }
    }
}

#[test]
fn stages_stand_apart_and_kind_is_on_the_stage_line() {
    let tree = parse(PROMPTS_TOML, Format::Toml);
    let kdl = emit::to_kdl(&tree);
    assert!(
        kdl.contains("\n\nstage \"plan\" kind=\"agent\" agent=\"claude\" {\n")
            || kdl.contains("\n\nstage plan kind=agent agent=claude {\n"),
        "{kdl}"
    );
    assert!(
        kdl.contains("}\n\nstage "),
        "a blank line between stages\n{kdl}"
    );
    // A raw string for the text with quotes and a backslash, a plain one for the other.
    assert!(kdl.contains("prompt #\"\"\"\n        Review it."), "{kdl}");
    assert!(
        kdl.contains("prompt \"\"\"\n        Plan the work"),
        "{kdl}"
    );
    let toml = emit::to_toml(&tree);
    assert!(toml.contains("\n\n[stages.review]\n"), "{toml}");
}
