//! What the writers' tests share: trees compared without spans, parsing that must succeed, the
//! round trip through both writers, and a workflow that uses most of the format.

use super::{to_kdl, to_toml};
use crate::diag::Diagnostics;
use crate::source::FileId;
use crate::syntax::tree::{Table, Value, ValueKind};
use crate::syntax::{Format, parse};

/// A tree without spans, compared in order (floats by their bits, so `-0.0` counts).
#[derive(Debug, PartialEq)]
pub(super) enum Plain {
    Str(String),
    Int(i64),
    Float(u64),
    Bool(bool),
    Array(Vec<Plain>),
    Table(Vec<(String, Plain)>),
}

pub(super) fn plain_table(t: &Table) -> Plain {
    Plain::Table(
        t.entries
            .iter()
            .map(|e| (e.key.clone(), plain(&e.value)))
            .collect(),
    )
}

fn plain(v: &Value) -> Plain {
    match &v.kind {
        ValueKind::Str(s) => Plain::Str(s.clone()),
        ValueKind::Int(i) => Plain::Int(*i),
        ValueKind::Float(f) => Plain::Float(f.to_bits()),
        ValueKind::Bool(b) => Plain::Bool(*b),
        ValueKind::Array(a) => Plain::Array(a.iter().map(plain).collect()),
        ValueKind::Table(t) => plain_table(t),
    }
}

pub(super) fn parse_ok(text: &str, format: Format) -> Table {
    let mut diags = Diagnostics::default();
    let tree = parse(FileId(0), text, format, &mut diags);
    let diags = diags.into_sorted();
    assert!(
        diags.is_empty(),
        "{format:?} did not parse: {:#?}\n--- text ---\n{text}",
        diags.iter().map(|d| &d.message).collect::<Vec<_>>()
    );
    tree
}

/// Checks that the tree survives both writers.
pub(super) fn assert_round_trips(tree: &Table) {
    let expected = plain_table(tree);
    let kdl = to_kdl(tree);
    assert_eq!(
        plain_table(&parse_ok(&kdl, Format::Kdl)),
        expected,
        "KDL round trip\n--- KDL ---\n{kdl}"
    );
    let toml = to_toml(tree);
    assert_eq!(
        plain_table(&parse_ok(&toml, Format::Toml)),
        expected,
        "TOML round trip\n--- TOML ---\n{toml}"
    );
}

pub(super) const REVIEW_LOOP: &str = r#"
name = "review-loop"
version = "1.0"
description = "Plan, implement and review until approved."
max_concurrency = 4

[budget]
tokens = 2000000
cost_usd = 12.5
on_exceeded = "fail"

[params.task]
type = "string"
description = "What to build"

[params.max_rounds]
type = "int"
default = 5

[params.ratio]
type = "float"
default = 1.0
choices = [0.5, 1.0, 2.0]

[params.targets]
type = "list"
default = ["src"]
choices = [["src"], ["src", "tests"]]

[agents.claude]
kind = "claude"
model = "opus"
args = ["--verbose"]
env = { ANTHROPIC_LOG = "debug", "weird key" = "x y", "1st" = "one" }
timeout = "10m"
fallbacks = ["local"]

[agents.local]
kind = "command"
command = ["my-agent", "--prompt-file", "{{ prompt_file }}"]
prompt_via = "file"

[exits.blocked]
code = 3
message = "blocked: {{ outputs.review.reason }}"

[stages.plan]
kind = "agent"
agent = "claude"
prompt = """
Plan the work for: {{ params.task }}
Write "PLAN:" then the plan; use a \\ if you must.
\tIndented with a tab.
"""
output = { extract = "markers", markers = { plan = { prefix = "PLAN:" }, files = { prefix = "FILE:", many = true, values = ["a"] } } }

[stages.build]
kind = "loop"
needs = ["plan"]
max_iterations = "{{ params.max_rounds }}"
until = "outputs.review.verdict == 'approve'"
on_exhausted = "exit:blocked"
worktree = { branch = "ralph/{{ run.id }}", cleanup = "always" }
stuck = { on = "outputs.review.findings", repeats = 3 }

[[stages.build.escalation]]
when = "iteration >= 3"
run = ["oracle"]
description = "ask for help"

[[stages.build.escalation]]
when = "iteration >= 5"
run = ["oracle", "human"]

[stages.build.stages.implement]
kind = "agent"
agent = "claude"
prompt_file = "prompts/implement.md"
retries = 0

[stages.build.stages.test]
kind = "check"
needs = ["implement"]
argv = ["cargo", "test"]
env = { RUST_BACKTRACE = "1" }
pass_codes = [0]
on_fail = "continue"

[stages.build.stages.review]
kind = "agent"
needs = ["implement", "test"]
agent = "claude"
prompt = "Review it."
feedback = "{{ outputs.review.findings }}"
route = { on = "verdict", cases = { approve = "break", revise = "continue", "needs human" = "exit:blocked" }, default = "fail" }

[stages.build.stages.review.output]
extract = "json"
files = ["review.md"]

[stages.build.stages.review.output.schema]
type = "object"
required = ["verdict"]
additionalProperties = false

[stages.build.stages.review.output.schema.properties.verdict]
type = "string"
enum = ["approve", "revise", "needs human"]

[stages.build.stages.review.output.schema.properties.findings]
type = "array"
items = { type = "object", properties = { file = { type = "string" }, line = { type = "integer", minimum = 1 } } }
maxItems = 50
examples = [[{ file = "a.rs", line = 3 }], {}, [[1], [2, 3]], [[true]]]
"-" = { "-" = 1, x = 2 }

[stages.build.stages.oracle]
kind = "gate"
message = "Stuck after {{ iteration }} rounds."
timeout = 3600
on_timeout = "reject"

[stages.build.stages.human]
kind = "gate"

[stages.fanout]
kind = "for_each"
needs = ["build"]
over = "params.targets"
as = "target"
max_concurrency = 2
aggregate = { mode = "worst", field = "status", order = ["ok", "warn", "error"] }
result = "lint"

[stages.fanout.stages.lint]
kind = "command"
argv = ["cargo", "clippy", "--", "{{ target }}"]
ok_codes = [0, 1]
timeout = 90
"#;
