//! Random, truncated, mutated and huge inputs never make parse or check panic; random and
//! mutated workflows compile, run, and show their runs (`status`, `logs`, `resume`) without a
//! panic or a hang, ending with a documented exit code.

mod common;

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

/// Nothing in loading, checking, compiling, explaining or drawing recurses along a chain:
/// a chain of 20,000 stages goes through them on a thread with a 1 MiB stack (the checker's
/// cycle search was Tarjan's recursive SCC, which overflowed the main thread's 8 MiB stack,
/// an abort, on a chain of 100,000 stages).
#[test]
fn a_long_chain_needs_no_deep_stack() {
    let mut chain = String::from("name = \"chain\"\n");
    for i in 0..20_000 {
        chain.push_str(&format!(
            "[stages.s{i}]\nkind = \"command\"\nargv = [\"true\"]\n"
        ));
        if i > 0 {
            chain.push_str(&format!("needs = [\"s{}\"]\n", i - 1));
        }
    }
    check_on_a_small_stack("chain.toml", chain);
}

/// Nor does checking what templates read: a chain of 20,000 stages written last first, each
/// reading the first stage's output, on a thread with a 1 MiB stack (the question whether a
/// stage runs only after the one it reads walked the chain recursively, and aborted with a
/// stack overflow on 100,000 such stages).
#[test]
fn reads_along_a_long_chain_need_no_deep_stack() {
    let mut chain = String::from("name = \"reads\"\n");
    for i in (0..20_000).rev() {
        chain.push_str(&format!("[stages.s{i}]\nkind = \"command\"\n"));
        if i > 0 {
            chain.push_str(&format!(
                "argv = [\"echo\", \"{{{{ stages.s0.output }}}}\"]\nneeds = [\"s{}\"]\n",
                i - 1
            ));
        } else {
            chain.push_str("argv = [\"true\"]\n");
        }
    }
    check_on_a_small_stack("reads.toml", chain);
}

/// [`check_text`] on a thread with a 1 MiB stack: a walk that recurses along a long chain
/// overflows it (an abort, which fails the test).
fn check_on_a_small_stack(name: &'static str, text: String) {
    std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(move || check_text(name, text))
        .expect("a thread")
        .join()
        .expect("no panic");
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

// ---------------------------------------------------------------------------------------------
// Runs: random and mutated workflows, compiled and run by the real binary.
//
// Every program a run can start is harmless: the argv of every command and check stage and
// the command of every `command` agent are replaced by one of a few programs (`/bin/true`,
// `/bin/echo`, a short `sleep`...), other agents answer from a recording (`--replay`), and the
// environment is emptied (no key reaches an HTTP agent). A run must end (each process is
// killed after `HANG`, and the test fails: a hang detector, not a timed assertion), never
// panic, and exit with a documented code: ralph-flow's own (0, 1, 3, 75, 130) or one of the
// workflow's exits. `status`, `logs` and `resume` are run on what it left.
// ---------------------------------------------------------------------------------------------

use ralph_flow::syntax::tree::{Table, Value, ValueKind};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How many random workflows, and mutants of the demo, are run.
const RANDOM_RUNS: usize = 120;
const DEMO_RUNS: usize = 30;

/// How long one process may run before the test calls it a hang.
const HANG: Duration = Duration::from_secs(60);

/// The exit codes ralph-flow documents for itself: success, failed, a configuration error,
/// waiting on a gate, interrupted.
const ENGINE_CODES: [i32; 5] = [0, 1, 3, 75, 130];

/// Programs a command or check stage may run.
const STAGE_ARGVS: &[&[&str]] = &[
    &["/bin/true"],
    &["/bin/false"],
    &["/bin/echo", "{{ run.id }}"],
    &[
        "/bin/echo",
        "{\"tasks\": [], \"verdict\": \"VALID\", \"passed\": true}",
    ],
    &["/bin/echo", "[1, 2, 3]"],
    &["/bin/sh", "-c", "echo out; echo err >&2; exit 2"],
    &["/bin/sleep", "0.05"],
    &["/bin/cat"],
    &["/nonexistent/program", "x"],
];

/// Commands a `command` agent may run (the prompt on stdin, or as an argument).
const AGENT_COMMANDS: &[&[&str]] = &[
    &["/bin/echo", "VERDICT: VALID"],
    &["/bin/echo", "NO_ISSUES"],
    &["/bin/echo", "ISSUE: a.rs:1 something"],
    &[
        "/bin/echo",
        "{\"verdict\": \"VALID\", \"confidence\": 90, \"issues\": [], \"tickets\": []}",
    ],
    &[
        "/bin/echo",
        "```json\n{\"status\": \"done\", \"items\": [1, 2]}\n```",
    ],
    &["/bin/cat"],
    &["/bin/true"],
    &["/bin/false"],
    &["/bin/sh", "-c", "sleep 0.05; echo 'VERDICT: INVALID'"],
];

const SMALL_INTS: &[i64] = &[-1, 0, 1, 2, 3];
const HUGE_INTS: &[i64] = &[-1, 0, 1, 255, 256, 65_536, 1 << 32, i64::MAX, i64::MIN];
const CODES: &[i64] = &[0, 1, 2, 3, 75, 130, 255, 256, -1, i64::MAX];
const DURATIONS: &[&str] = &[
    "9223372036854775807s",
    "18446744073709551615s",
    "18446744073709551615ms",
    "213503982334601d",
    "99999999999999999999s",
    "0s",
    "0ms",
    "0",
    "1ms",
    "-1s",
    "",
    "1.5s",
    "5m30s",
    "2h",
    "{{ params.nope }}s",
];
const STRINGS: &[&str] = &[
    "",
    " ",
    "{{",
    "{{ nope }}",
    "{{ params.nope }}",
    "{% if %}",
    "{{ stages }}",
    "{{ 1 / 0 }}",
    "é🦀",
    "\u{0}",
    "\u{1b}[31m",
    "continue",
    "break",
    "exit:nope",
    "exit:success",
    "stages.nope.output.x",
    "true",
    "false",
    "none",
    "[1, 2, 3]",
    "range(3)",
    "a.b.c",
    "-1",
    "9223372036854775807s",
    "spider",
];
const KEYS: &[&str] = &[
    "timeout",
    "needs",
    "kind",
    "x",
    "",
    "é",
    "a.b",
    "a b",
    "max_iterations",
    "until",
    "when",
    "on_fail",
    "stages",
    "retries",
    "output",
    "agent",
    "\"",
];

/// What one ralph-flow process did.
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs ralph-flow in `dir` with an empty environment; kills it and fails after `HANG`.
fn ralph(dir: &Path, args: &[String]) -> Ran {
    ralph_interrupted(dir, args, None)
}

/// Runs ralph-flow as [`ralph`] does, sending it SIGINT (Ctrl-C) after `interrupt` if it is
/// still running then.
fn ralph_interrupted(dir: &Path, args: &[String], interrupt: Option<Duration>) -> Ran {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ralph-flow"))
        .args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", dir.join(".home"))
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ralph-flow starts");
    let pid = i32::try_from(child.id()).expect("a pid");
    if let Some(after) = interrupt {
        std::thread::sleep(after);
        // Not reaped yet, so the pid is still this child's.
        if matches!(child.try_wait(), Ok(None)) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGINT,
            );
        }
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(HANG) {
        Ok(out) => {
            let out = out.expect("ralph-flow's output");
            // Killed by a signal: the code a shell shows (Ctrl-C before ralph-flow has set
            // up its handler ends it by SIGINT: 130, interrupted).
            use std::os::unix::process::ExitStatusExt as _;
            let code = out
                .status
                .code()
                .unwrap_or_else(|| 128 + out.status.signal().unwrap_or(0));
            Ran {
                code,
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            }
        }
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!(
                "hang: `ralph-flow {}` in {} did not end within {HANG:?}",
                args.join(" "),
                dir.display()
            );
        }
    }
}

/// Fails unless a process ended without a panic and with one of `allowed`.
fn assert_sane(ran: &Ran, allowed: &[i32], what: &dyn Fn() -> String) {
    assert!(
        ran.code != 101 && !ran.stderr.contains("panicked") && !ran.stdout.contains("panicked"),
        "ralph-flow panicked (exit {}) on {}\n--- stderr:\n{}",
        ran.code,
        what(),
        ran.stderr
    );
    assert!(
        allowed.contains(&ran.code),
        "ralph-flow exited with {}, not one of {allowed:?}, on {}\n--- stderr:\n{}",
        ran.code,
        what(),
        ran.stderr
    );
}

/// A scratch git repository with the presets, their prompts and schemas, the demo, and the
/// valid check fixtures (as `fx/`, the workflows they extend, include or call made harmless).
fn lab() -> tempfile::TempDir {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("a temporary directory");
    let d = dir.path();
    for sub in ["workflows", "prompts", "schemas", "examples"] {
        common::copy_dir(&root.join(sub), &d.join(sub));
    }
    common::copy_dir(&root.join("tests/fixtures/check/valid"), &d.join("fx"));
    let mut rng = Rng(7);
    for path in workflow_files(&d.join("fx/support")) {
        let (mut tree, kdl) = parse_file(&path);
        harmless(&mut tree, &mut rng, true);
        std::fs::write(&path, emit(&tree, kdl)).expect("a support workflow");
    }
    std::fs::create_dir_all(d.join(".home")).expect("a home");
    for (file, text) in [
        (".gitignore", ".ralph-flow/\n.home/\n"),
        ("BRIEF.md", "Add a --verbose flag.\n"),
        ("TASK.md", "Fix the flaky test.\n"),
        ("empty.jsonl", ""),
    ] {
        std::fs::write(d.join(file), text).expect("a file");
    }
    common::commit_all(d);
    dir
}

/// The TOML and KDL workflow files directly in a directory, sorted.
fn workflow_files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("a directory")
        .flatten()
        .map(|e| e.path())
        .filter(|p| matches!(p.extension().and_then(|x| x.to_str()), Some("toml" | "kdl")))
        .collect();
    out.sort();
    out
}

/// Parses a workflow file into its syntax tree; tells whether it is KDL.
fn parse_file(path: &Path) -> (Table, bool) {
    let text = std::fs::read_to_string(path).expect("a workflow file");
    let format = ralph_flow::syntax::Format::from_path(path);
    let mut sources = Sources::new();
    let id = sources.add(path, text.as_str());
    let mut diags = Diagnostics::default();
    let tree = ralph_flow::syntax::parse(id, &text, format, &mut diags);
    assert!(!diags.has_errors(), "{} parses", path.display());
    (tree, format == ralph_flow::syntax::Format::Kdl)
}

fn emit(tree: &Table, kdl: bool) -> String {
    if kdl {
        ralph_flow::syntax::emit::to_kdl(tree)
    } else {
        ralph_flow::syntax::emit::to_toml(tree)
    }
}

impl Rng {
    fn pick<'a, T: ?Sized>(&mut self, items: &[&'a T]) -> &'a T {
        items[self.below(items.len())]
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

/// A tree value (its span is of no use here).
fn val(kind: ValueKind) -> Value {
    Value::new(ralph_flow::source::Span::default(), kind)
}

fn str_val(s: &str) -> Value {
    val(ValueKind::Str(s.to_string()))
}

fn argv_val(argv: &[&str]) -> Value {
    val(ValueKind::Array(argv.iter().map(|a| str_val(a)).collect()))
}

/// Calls `f` on every value of a table, depth first, with the key it is under (an array's
/// items are under the array's key).
fn each_value(t: &mut Table, f: &mut dyn FnMut(&str, &mut Value)) {
    for e in &mut t.entries {
        visit(&e.key, &mut e.value, f);
    }
}

fn visit(key: &str, v: &mut Value, f: &mut dyn FnMut(&str, &mut Value)) {
    f(key, v);
    match &mut v.kind {
        ValueKind::Table(t) => each_value(t, f),
        ValueKind::Array(items) => {
            for item in items {
                visit(key, item, f);
            }
        }
        _ => {}
    }
}

/// Calls `f` on every table of a tree, the root first.
fn each_table(t: &mut Table, f: &mut dyn FnMut(&mut Table)) {
    f(t);
    for e in &mut t.entries {
        each_table_in(&mut e.value, f);
    }
}

fn each_table_in(v: &mut Value, f: &mut dyn FnMut(&mut Table)) {
    match &mut v.kind {
        ValueKind::Table(t) => each_table(t, f),
        ValueKind::Array(items) => {
            for item in items {
                each_table_in(item, f);
            }
        }
        _ => {}
    }
}

/// Every stage id of a tree, bodies included.
fn stage_ids(t: &Table, out: &mut Vec<String>) {
    for e in &t.entries {
        if let Some(sub) = e.value.as_table() {
            if e.key == "stages" {
                for s in &sub.entries {
                    out.push(s.key.clone());
                    if let Some(st) = s.value.as_table() {
                        stage_ids(st, out);
                    }
                }
            }
        }
    }
}

/// Makes every program a workflow can start harmless: every `argv` and `command` becomes one
/// of a few programs; with `agents`, every agent of the file becomes a `command` agent.
fn harmless(tree: &mut Table, rng: &mut Rng, agents: bool) {
    if agents {
        if let Some(e) = tree.entries.iter_mut().find(|e| e.key == "agents") {
            if let ValueKind::Table(t) = &mut e.value.kind {
                for a in &mut t.entries {
                    let mut agent = Table::default();
                    for (k, v) in [
                        ("kind", str_val("command")),
                        ("command", argv_val(rng.pick(AGENT_COMMANDS))),
                        ("prompt_via", str_val(rng.pick(&["stdin", "arg", "file"]))),
                    ] {
                        agent.insert(ralph_flow::syntax::tree::Entry {
                            key: k.to_string(),
                            key_span: ralph_flow::source::Span::default(),
                            value: v,
                        });
                    }
                    a.value = val(ValueKind::Table(agent));
                }
            }
        }
    }
    each_table(tree, &mut |t: &mut Table| {
        for e in &mut t.entries {
            match e.key.as_str() {
                "argv" => e.value = argv_val(rng.pick(STAGE_ARGVS)),
                "command" => e.value = argv_val(rng.pick(AGENT_COMMANDS)),
                _ => {}
            }
        }
    });
}

/// Whether a string reads like a duration (`30m`, `72h`, `1h30m`, `120`).
fn looks_like_duration(s: &str) -> bool {
    let s = s.trim();
    !s.is_empty()
        && s.chars().next().is_some_and(|c| c.is_ascii_digit())
        && s.chars().all(|c| c.is_ascii_digit() || "smhd".contains(c))
}

/// One random change to one value. `bounded` keeps what counts repetitions (loop bounds,
/// retries, ints that may feed them) small, so that every run ends soon; `numbers` changes
/// only numbers and durations.
fn mutate_value(
    rng: &mut Rng,
    key: &str,
    v: &mut Value,
    ids: &[String],
    bounded: bool,
    numbers: bool,
) {
    let ints = |rng: &mut Rng, pool: &[i64]| val(ValueKind::Int(pool[rng.below(pool.len())]));
    let reps = if bounded { SMALL_INTS } else { HUGE_INTS };
    let is_str = matches!(v.kind, ValueKind::Str(_));
    let is_int = matches!(v.kind, ValueKind::Int(_));
    match key {
        "max_iterations" | "retries" | "repeats" if is_int || is_str => {
            *v = if is_str && rng.chance(50) {
                str_val(&format!("{}", reps[rng.below(reps.len())]))
            } else {
                ints(rng, reps)
            };
        }
        "timeout" | "idle_timeout" if is_int || is_str => {
            *v = if rng.chance(25) {
                ints(rng, HUGE_INTS)
            } else {
                str_val(rng.pick(DURATIONS))
            };
        }
        "max_concurrency" | "capacity" | "context_window" | "max_tokens" | "tokens" if is_int => {
            *v = ints(rng, HUGE_INTS);
        }
        "code" | "ok_codes" | "pass_codes" if is_int => *v = ints(rng, CODES),
        _ if numbers => match &v.kind {
            ValueKind::Int(_) => *v = ints(rng, if bounded { SMALL_INTS } else { HUGE_INTS }),
            ValueKind::Float(_) => {
                *v = val(ValueKind::Float(
                    [0.0, -1.0, 1e308, f64::MIN_POSITIVE][rng.below(4)],
                ));
            }
            ValueKind::Str(s) if looks_like_duration(s) => *v = str_val(rng.pick(DURATIONS)),
            _ => {}
        },
        "needs" | "run" => {
            let n = rng.below(3);
            let mut items: Vec<Value> = (0..n)
                .map(|_| match ids.get(rng.below(ids.len() + 1)) {
                    Some(id) => str_val(id),
                    None => str_val("nope"),
                })
                .collect();
            *v = if n == 1 && rng.chance(50) {
                items.remove(0)
            } else {
                val(ValueKind::Array(items))
            };
        }
        "on_fail" | "on_error" | "on_exhausted" | "then" | "on_timeout" | "on_reject"
        | "default" | "cases"
            if is_str =>
        {
            let actions = [
                "continue",
                "break",
                "fail",
                "exit:success",
                "exit:failed",
                "exit:nope",
                "approve",
                "reject",
            ];
            *v = match ids.get(rng.below(ids.len() + actions.len())) {
                Some(id) => str_val(id),
                None => str_val(rng.pick(&actions)),
            };
        }
        _ => match &mut v.kind {
            ValueKind::Int(_) => *v = ints(rng, if bounded { SMALL_INTS } else { HUGE_INTS }),
            ValueKind::Float(_) => {
                *v = val(ValueKind::Float(
                    [0.0, -1.0, 1e308, f64::MIN_POSITIVE, f64::NAN][rng.below(5)],
                ));
            }
            ValueKind::Bool(b) => *b = !*b,
            ValueKind::Str(s) if looks_like_duration(s) => *v = str_val(rng.pick(DURATIONS)),
            ValueKind::Str(s) => match rng.below(4) {
                0 => *v = str_val(rng.pick(STRINGS)),
                1 => {
                    *v = str_val(
                        &ids.get(rng.below(ids.len().max(1)))
                            .cloned()
                            .unwrap_or_default(),
                    )
                }
                2 => {
                    let at = s
                        .char_indices()
                        .nth(rng.below(s.chars().count() + 1))
                        .map_or(s.len(), |(i, _)| i);
                    s.insert_str(at, rng.pick(STRINGS));
                }
                _ => {
                    *v = val(ValueKind::Int(
                        HUGE_INTS[rng.below(HUGE_INTS.len())].min(if bounded {
                            3
                        } else {
                            i64::MAX
                        }),
                    ))
                }
            },
            ValueKind::Array(items) => match rng.below(3) {
                0 => items.clear(),
                1 if !items.is_empty() => {
                    let i = rng.below(items.len());
                    items.push(items[i].clone());
                }
                _ if !items.is_empty() => {
                    let i = rng.below(items.len());
                    items.remove(i);
                }
                _ => items.push(str_val(rng.pick(STRINGS))),
            },
            ValueKind::Table(t) => {
                if rng.chance(20) {
                    t.entries.clear();
                }
            }
        },
    }
}

/// One random change to a tree: a value (numbers, durations, strings, references, bounds),
/// or a key (renamed, removed, repeated).
fn mutate(tree: &mut Table, rng: &mut Rng, bounded: bool, numbers: bool) {
    let mut ids = Vec::new();
    stage_ids(tree, &mut ids);
    if numbers || rng.chance(75) {
        // With `numbers`, only numbers and durations are candidates.
        let candidate = |key: &str, v: &Value| match &v.kind {
            ValueKind::Int(_) | ValueKind::Float(_) => true,
            ValueKind::Str(s) => {
                !numbers
                    || looks_like_duration(s)
                    || matches!(
                        key,
                        "max_iterations" | "retries" | "repeats" | "timeout" | "idle_timeout"
                    )
            }
            _ => !numbers,
        };
        let mut count = 0usize;
        each_value(tree, &mut |key, v| count += usize::from(candidate(key, v)));
        let target = rng.below(count);
        let mut n = 0usize;
        each_value(tree, &mut |key, v| {
            if candidate(key, v) {
                if n == target {
                    mutate_value(rng, key, v, &ids, bounded, numbers);
                }
                n += 1;
            }
        });
        return;
    }
    let mut count = 0usize;
    each_table(tree, &mut |_| count += 1);
    let target = rng.below(count);
    let mut n = 0usize;
    each_table(tree, &mut |t: &mut Table| {
        if n == target && !t.entries.is_empty() {
            let i = rng.below(t.entries.len());
            match rng.below(3) {
                0 => t.entries[i].key = rng.pick(KEYS).to_string(),
                1 => {
                    t.entries.remove(i);
                }
                _ => {
                    let e = t.entries[i].clone();
                    t.entries.push(e);
                }
            }
        }
        n += 1;
    });
}

/// `--set` values for a workflow's params that have no default.
fn required_sets(tree: &Table) -> Vec<(String, String)> {
    let Some(params) = tree.get("params").and_then(Value::as_table) else {
        return Vec::new();
    };
    params
        .entries
        .iter()
        .filter_map(|p| {
            let t = p.value.as_table()?;
            if t.get("default").is_some() {
                return None;
            }
            let value = match t.get("type").and_then(Value::as_str) {
                Some("int") => "2",
                Some("float") => "1.5",
                Some("bool") => "true",
                Some("list") => "a,b",
                _ => match p.key.as_str() {
                    "paths" => "examples/demo",
                    "criteria" => "examples/demo/criteria.md",
                    _ => "x",
                },
            };
            Some((p.key.clone(), value.to_string()))
        })
        .collect()
}

/// One workflow to run, and how.
struct Case {
    /// The workflow file, relative to the lab.
    file: String,
    text: String,
    sets: Vec<(String, String)>,
    /// Extra arguments of `run` (`--replay F`, `--max-concurrency N`).
    extra: Vec<String>,
    /// Whether the run waits on gates (only when every gate times out soon) instead of
    /// stopping with 75 (`--no-wait`).
    wait: bool,
    /// Ctrl-C after this long (then `resume`).
    interrupt: Option<Duration>,
}

impl Case {
    fn new(file: String, text: String) -> Self {
        Case {
            file,
            text,
            sets: Vec::new(),
            extra: Vec::new(),
            wait: false,
            interrupt: None,
        }
    }
}

/// What the runs of a test did, for its summary and its sanity checks.
#[derive(Default)]
struct Tally {
    runs: usize,
    by_code: std::collections::BTreeMap<i32, usize>,
    slowest: (Duration, String),
}

/// Runs a case to its end, then `status` (text and JSON), `logs`, and `resume` when it
/// waits on a gate, checking each.
fn run_case(lab: &Path, case: &Case, tally: &mut Tally) {
    std::fs::write(lab.join(&case.file), &case.text).expect("the workflow");
    let what = || {
        format!(
            "{} (with {:?} {:?}):\n{}",
            case.file, case.sets, case.extra, case.text
        )
    };
    // The same load, check and compile as the run's, in process: errors mean exit 3, and
    // the workflow's own exits are the other codes it may end with.
    let mut allowed = ENGINE_CODES.to_vec();
    let prepared = ralph_flow::prepare::prepare(&lab.join(&case.file), &case.sets);
    let valid = match &prepared {
        Ok(p) => {
            let _ = ralph_flow::compile::explain::explain(&p.plan);
            let _ = ralph_flow::compile::render::render(
                &p.plan,
                ralph_flow::compile::render::GraphFormat::Mermaid,
            );
            allowed.extend(
                p.plan
                    .exits
                    .iter()
                    .filter_map(|e| i32::try_from(e.code).ok()),
            );
            true
        }
        Err(_) => false,
    };
    let mut args: Vec<String> = vec!["run".into(), case.file.clone()];
    for (k, v) in &case.sets {
        args.push("--set".into());
        args.push(format!("{k}={v}"));
    }
    args.extend(case.extra.iter().cloned());
    if !case.wait {
        args.push("--no-wait".into());
    }
    args.extend(
        ["--json", "--progress", "plain", "--backoff", "1ms"]
            .iter()
            .map(|s| s.to_string()),
    );
    let start = Instant::now();
    let ran = ralph_interrupted(lab, &args, case.interrupt);
    let took = start.elapsed();
    assert_sane(&ran, &allowed, &what);
    if !valid {
        // (Unless Ctrl-C came first.)
        assert!(
            ran.code == 3 || (case.interrupt.is_some() && ran.code == 130),
            "an invalid workflow is a configuration error, not {}: {}\n{}",
            ran.code,
            what(),
            ran.stderr
        );
    }
    tally.runs += 1;
    *tally.by_code.entry(ran.code).or_default() += 1;
    if took > tally.slowest.0 {
        tally.slowest = (took, case.file.clone());
    }
    let json: serde_json::Value = serde_json::from_str(&ran.stdout).unwrap_or_default();
    let Some(id) = json["run"].as_str() else {
        return;
    };
    let show = |args: &[&str], allowed: &[i32]| {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        assert_sane(&ralph(lab, &args), allowed, &|| {
            format!("`{}` after {}", args.join(" "), what())
        });
    };
    show(&["status", id], &[0]);
    show(&["status", id, "--json"], &[0]);
    show(&["logs", id], &[0]);
    // A run that stopped on a gate gets an answer (approve, or reject with a comment), and
    // one that was interrupted or stopped is continued.
    if ran.code == 75 {
        if let Some(gate) = json["waiting_on"][0].as_str() {
            let verb = if id.len() % 2 == 0 {
                "approve"
            } else {
                "reject"
            };
            show(&[verb, id, gate, "--comment", "not yet"], &[0]);
        }
    }
    if ran.code == 75 || ran.code == 130 {
        let mut resume: Vec<String> = vec!["resume".into(), id.to_string()];
        resume.extend(
            ["--no-wait", "--progress", "plain", "--backoff", "1ms"]
                .iter()
                .map(|s| s.to_string()),
        );
        assert_sane(&ralph(lab, &resume), &allowed, &|| {
            format!("`resume` after {}", what())
        });
        show(&["status", id], &[0]);
    }
}

/// Whether every gate of a tree times out soon with an action, so that a run waiting on
/// them ends by itself.
fn gates_time_out_soon(tree: &mut Table) -> bool {
    let mut soon = true;
    each_table(tree, &mut |t: &mut Table| {
        if t.get("kind").and_then(Value::as_str) == Some("gate") {
            let short = t
                .get("timeout")
                .and_then(Value::as_str)
                .is_some_and(|d| ["0s", "1ms", "10ms"].contains(&d));
            soon &= short && t.get("on_timeout").is_some();
        }
    });
    soon
}

/// A random workflow: stages of every kind, nested up to two levels, with random needs,
/// conditions, routes, actions, bounds, timeouts and concurrency; every program harmless.
fn random_workflow(rng: &mut Rng) -> Table {
    use serde_json::{Map, Value as J, json};
    fn actions(in_loop: bool) -> Vec<&'static str> {
        let mut a = vec!["fail", "exit:odd", "exit:success"];
        if in_loop {
            a.extend(["continue", "break"]);
        }
        a
    }
    fn body(rng: &mut Rng, n: &mut usize, depth: usize, in_loop: bool) -> J {
        let mut stages = Map::new();
        let mut names: Vec<String> = Vec::new();
        for _ in 0..1 + rng.below(4) {
            let name = format!("s{n}");
            *n += 1;
            let kinds: &[&str] = if depth >= 2 {
                &["command", "check", "agent", "gate", "subflow"]
            } else {
                &[
                    "command", "check", "agent", "gate", "subflow", "loop", "for_each", "group",
                ]
            };
            let kind = rng.pick(kinds);
            let mut s = Map::new();
            s.insert("kind".into(), json!(kind));
            let needs: Vec<&String> = names.iter().filter(|_| rng.chance(40)).collect();
            if !needs.is_empty() {
                s.insert("needs".into(), json!(needs));
            }
            if rng.chance(20) {
                let mut when = vec!["true", "false", "params.n > 1"];
                if in_loop {
                    when.push("iteration > 1");
                }
                s.insert("when".into(), json!(rng.pick(&when)));
            }
            if rng.chance(20) {
                s.insert("on_fail".into(), json!(rng.pick(&actions(in_loop))));
            }
            if rng.chance(15) {
                s.insert("on_error".into(), json!(rng.pick(&actions(in_loop))));
            }
            let leaf = matches!(kind, "command" | "check" | "agent");
            if leaf && rng.chance(30) {
                s.insert("retries".into(), json!(rng.below(3)));
            }
            if leaf && rng.chance(15) {
                s.insert("resource".into(), json!("r"));
                if rng.chance(50) {
                    s.insert("priority".into(), json!(rng.pick(&["1", "params.n", "-5"])));
                }
            }
            if leaf && rng.chance(30) {
                let t = rng.pick(&[
                    "50ms",
                    "1s",
                    "0s",
                    "1h",
                    "9223372036854775807s",
                    "18446744073709551615ms",
                ]);
                s.insert("timeout".into(), json!(t));
            }
            match kind {
                "command" => {
                    s.insert("argv".into(), json!(rng.pick(STAGE_ARGVS)));
                    if rng.chance(30) {
                        s.insert("ok_codes".into(), json!([0, 2]));
                    }
                    if rng.chance(20) {
                        s.insert(
                            "cwd".into(),
                            json!(rng.pick(&["gen", "nowhere", "/", "{{ run.dir }}"])),
                        );
                    }
                    if rng.chance(20) {
                        s.insert("env".into(), json!({"A": "{{ params.n }}", "PATH": ""}));
                    }
                    if rng.chance(20) {
                        s.insert("stdin".into(), json!("{{ params | tojson }}\n"));
                    }
                    if rng.chance(20) {
                        let extract = rng.pick(&["json", "fenced_json", "regex", "text"]);
                        let mut out = json!({"extract": extract});
                        if extract == "regex" {
                            out["pattern"] = json!("(?P<word>\\w+)");
                        }
                        if extract == "json" && rng.chance(50) {
                            out["schema"] = json!({"type": "object", "required": ["tasks"]});
                        }
                        s.insert("output".into(), out);
                    }
                    if in_loop && rng.chance(30) {
                        s.insert(
                            "feedback".into(),
                            json!("{{ output.stdout | default('') }} after {{ iteration }}"),
                        );
                    }
                    if rng.chance(15) {
                        s.insert("then".into(), json!(rng.pick(&actions(in_loop))));
                    }
                }
                "check" => {
                    if rng.chance(70) {
                        s.insert("argv".into(), json!(rng.pick(STAGE_ARGVS)));
                        s.insert("expect".into(), json!("output.exit_code == 0"));
                    } else {
                        s.insert(
                            "expect".into(),
                            json!(rng.pick(&["true", "false", "params.n > 1"])),
                        );
                    }
                }
                "agent" => {
                    s.insert("agent".into(), json!("bot"));
                    let prompt = if in_loop && rng.chance(50) {
                        "Attempt {{ iteration }} of {{ max_iterations }}: {{ feedback }}"
                    } else {
                        "Go {{ params.n }} in {{ run.id }}."
                    };
                    s.insert("prompt".into(), json!(prompt));
                    if rng.chance(50) {
                        let a = actions(in_loop);
                        s.insert(
                            "output".into(),
                            json!({"extract": "markers", "markers": {"verdict": {"prefix": "VERDICT:"}}}),
                        );
                        s.insert(
                            "route".into(),
                            json!({
                                "on": "verdict",
                                "cases": {"VALID": rng.pick(&a), "INVALID": rng.pick(&a)},
                                "default": rng.pick(&a),
                            }),
                        );
                    }
                }
                "subflow" => {
                    s.insert("workflow".into(), json!("child.toml"));
                    s.insert("params".into(), json!({"n": "{{ params.n }}"}));
                }
                "gate" => {
                    s.insert("message".into(), json!("Go on with {{ params.n }}?"));
                    if rng.chance(30) {
                        s.insert("show".into(), json!(["BRIEF.md", "{{ run.id }}.txt"]));
                    }
                    if rng.chance(70) {
                        s.insert(
                            "timeout".into(),
                            json!(rng.pick(&["1ms", "0s", "10ms", "9223372036854775807s"])),
                        );
                        s.insert(
                            "on_timeout".into(),
                            json!(rng.pick(&["approve", "reject", "fail", "exit:odd"])),
                        );
                    }
                }
                "loop" => {
                    let until = rng.pick(&["false", "true", "iteration >= 2"]);
                    // A huge bound only where the first iteration ends the loop.
                    let bound = match rng.below(5) {
                        0 => json!("{{ params.n }}"),
                        4 if until == "true" => json!(i64::MAX),
                        4 => json!(1),
                        b => json!(b),
                    };
                    s.insert("max_iterations".into(), bound);
                    s.insert("until".into(), json!(until));
                    if rng.chance(20) {
                        s.insert(
                            "stuck".into(),
                            json!({"on": "1", "repeats": 2 + rng.below(2), "then": rng.pick(&["fail", "exit:odd"])}),
                        );
                    }
                    if rng.chance(15) {
                        s.insert(
                            "worktree".into(),
                            json!({"branch": format!("w/{{{{ run.id }}}}/{name}")}),
                        );
                    }
                    if rng.chance(50) {
                        s.insert(
                            "on_exhausted".into(),
                            json!(rng.pick(&["fail", "exit:odd"])),
                        );
                    }
                    s.insert("stages".into(), body(rng, n, depth + 1, true));
                }
                "for_each" | "group" => {
                    if kind == "for_each" {
                        s.insert(
                            "over".into(),
                            json!(rng.pick(&["[1, 2, 3]", "range(2)", "[]"])),
                        );
                        s.insert("as".into(), json!("it"));
                        if rng.chance(30) {
                            s.insert("key".into(), json!(rng.pick(&["it", "1", "it * 0", "'x'"])));
                        }
                        if rng.chance(15) {
                            s.insert(
                                "worktree".into(),
                                json!({"branch": format!("w/{{{{ run.id }}}}/{name}-{{{{ index }}}}")}),
                            );
                        }
                    }
                    if rng.chance(50) {
                        s.insert("max_concurrency".into(), json!(1 + rng.below(3)));
                    }
                    if rng.chance(30) {
                        s.insert("aggregate".into(), json!({"mode": "collect"}));
                    }
                    s.insert("stages".into(), body(rng, n, depth + 1, false));
                }
                _ => {}
            }
            stages.insert(name.clone(), J::Object(s));
            names.push(name);
        }
        J::Object(stages)
    }
    let mut n = 0;
    let stages = body(rng, &mut n, 0, false);
    let mut wf = json!({
        "name": "gen",
        "params": {"n": {"type": "int", "default": 1 + rng.below(3)}},
        "agents": {"bot": {"kind": "command", "command": rng.pick(AGENT_COMMANDS), "prompt_via": rng.pick(&["stdin", "arg", "file"])}},
        "exits": {"odd": {"code": ([2, 4, 42, 200][rng.below(4)]), "message": "odd after {{ params.n }}"}},
    });
    if rng.chance(30) {
        wf["max_concurrency"] = json!(1 + rng.below(4));
    }
    wf["resources"] = json!({"r": {"capacity": ([1, 2, i64::MAX][rng.below(3)])}});
    if rng.chance(15) {
        wf["budget"] = json!({"tokens": rng.below(2), "cost_usd": 0.0, "on_exceeded": "exit:odd"});
    }
    wf["stages"] = stages;
    match Value::from_json(&wf, ralph_flow::source::Span::default()).map(|v| v.kind) {
        Some(ValueKind::Table(t)) => t,
        _ => Table::default(),
    }
}

/// Extra `run` arguments: sometimes a global concurrency limit.
fn concurrency_arg(rng: &mut Rng) -> Vec<String> {
    if rng.chance(25) {
        vec![
            "--max-concurrency".into(),
            rng.pick(&["1", "2", "0", "1000000", "18446744073709551615"])
                .to_string(),
        ]
    } else {
        Vec::new()
    }
}

fn summary(name: &str, tally: &Tally, start: Instant) {
    eprintln!(
        "{name}: {} runs in {:.1?}, exit codes {:?}, slowest {:.1?} ({})",
        tally.runs,
        start.elapsed(),
        tally.by_code,
        tally.slowest.0,
        tally.slowest.1
    );
}

/// The share of runs that got past the configuration check (not exit 3), in percent.
fn started_share(tally: &Tally) -> usize {
    let config = tally.by_code.get(&3).copied().unwrap_or(0);
    100 * (tally.runs - config) / tally.runs.max(1)
}

#[test]
fn random_workflows_run_and_end_cleanly() {
    let start = Instant::now();
    let lab = lab();
    std::fs::create_dir_all(lab.path().join("gen")).expect("a directory");
    // What subflow stages run.
    std::fs::write(
        lab.path().join("gen/child.toml"),
        "name = \"child\"\n[params.n]\ntype = \"int\"\n\n[exits.odd]\ncode = 42\n\n\
         [stages.work]\nkind = \"command\"\nargv = [\"/bin/echo\", \"{{ params.n }}\"]\n\n\
         [stages.judge]\nkind = \"check\"\nneeds = [\"work\"]\nexpect = \"params.n > 1\"\non_fail = \"exit:odd\"\n",
    )
    .expect("the child workflow");
    let mut rng = Rng(0x5eed_1234_abcd_ef01);
    let mut tally = Tally::default();
    for i in 0..RANDOM_RUNS {
        let mut tree = random_workflow(&mut rng);
        let kdl = rng.chance(30);
        let mut case = Case::new(
            format!("gen/g{i}.{}", if kdl { "kdl" } else { "toml" }),
            emit(&tree, kdl),
        );
        case.extra = concurrency_arg(&mut rng);
        case.wait = gates_time_out_soon(&mut tree) && rng.chance(50);
        if rng.chance(15) {
            case.interrupt = Some(Duration::from_millis(rng.below(60) as u64));
        }
        run_case(lab.path(), &case, &mut tally);
    }
    summary("random workflows", &tally, start);
    // Most generated workflows are valid and really run, or the test tests little.
    assert!(
        started_share(&tally) >= 60,
        "too few generated workflows got past the check: {:?}",
        tally.by_code
    );
}

#[test]
fn mutated_presets_and_fixtures_run_and_end_cleanly() {
    let start = Instant::now();
    let lab = lab();
    let mut seeds = workflow_files(&lab.path().join("workflows"));
    seeds.extend(workflow_files(&lab.path().join("fx")));
    let mut rng = Rng(0x0dd_ba11_cafe_f00d);
    let mut tally = Tally::default();
    let mut n = 0;
    for seed in &seeds {
        let (original, kdl) = parse_file(seed);
        let dir = seed
            .parent()
            .and_then(|p| p.file_name())
            .and_then(|d| d.to_str())
            .unwrap_or("fx");
        // The workflow as it is (its programs made harmless), then changed: mostly its
        // numbers and durations, which keep it valid, else anything.
        for round in 0..6 {
            let mut tree = original.clone();
            let changes = if round == 0 { 0 } else { 1 + rng.below(2) };
            for _ in 0..changes {
                let numbers = rng.chance(60);
                mutate(&mut tree, &mut rng, true, numbers);
            }
            // Agents answer from an empty recording (every call fails), or are commands.
            let replay = rng.chance(30);
            harmless(&mut tree, &mut rng, !replay);
            let mut extra = concurrency_arg(&mut rng);
            if replay {
                extra.extend(["--replay".to_string(), "empty.jsonl".to_string()]);
            }
            let kdl = if rng.chance(20) { !kdl } else { kdl };
            n += 1;
            let mut case = Case::new(
                format!("{dir}/m{n}.{}", if kdl { "kdl" } else { "toml" }),
                emit(&tree, kdl),
            );
            case.sets = required_sets(&tree);
            case.extra = extra;
            case.wait = gates_time_out_soon(&mut tree) && rng.chance(50);
            run_case(lab.path(), &case, &mut tally);
        }
    }
    summary("mutated presets and fixtures", &tally, start);
    assert!(
        started_share(&tally) >= 25,
        "too few mutated workflows got past the check: {:?}",
        tally.by_code
    );
}

/// The README's demo (the Wiggum review preset replaying its recording) with its numbers
/// and durations changed, loop bounds included (the recording ends every loop).
#[test]
fn mutated_demo_runs_end_cleanly() {
    let start = Instant::now();
    let lab = lab();
    let (original, _) = parse_file(&lab.path().join("workflows/wiggum-review.toml"));
    let mut rng = Rng(0xdead_beef_0bad_cafe);
    let mut tally = Tally::default();
    for i in 0..DEMO_RUNS {
        let mut tree = original.clone();
        // The first run is the demo itself, which must end clean.
        for _ in 0..if i == 0 { 0 } else { 1 + rng.below(3) } {
            mutate(&mut tree, &mut rng, false, true);
        }
        let mut case = Case::new(format!("workflows/demo{i}.toml"), emit(&tree, false));
        case.sets = vec![
            ("criteria".into(), "examples/demo/criteria.md".into()),
            ("paths".into(), "examples/demo".into()),
        ];
        case.extra = vec![
            "--replay".into(),
            "examples/wiggum-review.replay.jsonl".into(),
        ];
        run_case(lab.path(), &case, &mut tally);
        if i == 0 {
            assert_eq!(
                tally.by_code.get(&0),
                Some(&1),
                "the unchanged demo ends clean"
            );
        }
    }
    summary("mutated demo", &tally, start);
}

// Regressions the runs above found, each pinned by a workflow of its own.

/// Runs `args` in a fresh directory holding `workflow` as `w.toml`.
fn run_in_scratch(workflow: &str, args: &[&str]) -> (tempfile::TempDir, Ran) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("w.toml"), workflow).expect("the workflow");
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let ran = ralph(dir.path(), &args);
    (dir, ran)
}

/// A gate timeout of centuries used to pass `check`, and then `status` panicked on its
/// deadline (RFC 3339 cannot write a time after the year 9999). Durations are now bounded
/// (366 days), so the run is refused before it starts; `store::rfc3339` still writes such a
/// time as its last second, for stores written before the bound.
#[test]
fn a_gate_due_after_the_year_9999_is_refused() {
    let (_dir, ran) = run_in_scratch(
        "name = \"w\"\n[stages.ok]\nkind = \"gate\"\nmessage = \"Go?\"\n\
         timeout = \"9223372036854775807s\"\non_timeout = \"approve\"\n",
        &["run", "w.toml", "--no-wait", "--progress", "quiet"],
    );
    assert_eq!(ran.code, 3, "{}", ran.stderr);
    assert!(
        ran.stderr.contains("longer than the longest duration"),
        "{}",
        ran.stderr
    );
    assert_eq!(ralph_flow::store::rfc3339(i64::MAX), "9999-12-31T23:59:59Z");
}

/// A fan-out's `max_concurrency` or `--max-concurrency` above what a tokio semaphore holds
/// panicked; such a limit is no limit.
#[test]
fn huge_concurrency_limits_are_no_limits() {
    let (_dir, ran) = run_in_scratch(
        "name = \"w\"\nmax_concurrency = 9223372036854775807\n\
         [stages.each]\nkind = \"for_each\"\nover = \"[1, 2]\"\nmax_concurrency = 9223372036854775807\n\
         [stages.each.stages.one]\nkind = \"command\"\nargv = [\"/bin/true\"]\n\
         [stages.both]\nkind = \"group\"\nmax_concurrency = 9223372036854775807\n\
         [stages.both.stages.two]\nkind = \"command\"\nargv = [\"/bin/true\"]\n",
        &[
            "run",
            "w.toml",
            "--max-concurrency",
            "18446744073709551615",
            "--progress",
            "quiet",
        ],
    );
    assert_sane(&ran, &[0], &|| "a run with huge limits".to_string());
}
