//! Completion: keys, values, names, and inside templates and expressions, in both syntaxes
//! and in prompt files; from half-typed text that does not parse.

use std::path::Path;

use serde_json::{Value, json};

use crate::client::{Client, position, project};

/// The cursor mark in the tests' texts.
const MARK: &str = "§";

/// `text` with `MARK` taken out, and the offset where it was.
fn marked(text: &str) -> (String, usize) {
    let at = text
        .find(MARK)
        .unwrap_or_else(|| panic!("no cursor mark in the text"));
    (text.replacen(MARK, "", 1), at)
}

/// Replaces `old` (which must be there) in `text` by `new`.
fn edit(text: &str, old: &str, new: &str) -> String {
    assert!(
        text.contains(old),
        "`{old}` is not in the text: fix the test's edit"
    );
    text.replacen(old, new, 1)
}

/// Sets the document's text to `text` (with its cursor mark) and asks for completion there.
fn complete(c: &mut Client, uri: &str, text: &str) -> (Vec<Value>, String, usize) {
    let (t, at) = marked(text);
    c.replace(uri, &t);
    let items = ask(c, uri, &t, at);
    (items, t, at)
}

fn ask(c: &mut Client, uri: &str, text: &str, at: usize) -> Vec<Value> {
    let answer = c.request(
        "textDocument/completion",
        json!({"textDocument": {"uri": uri}, "position": position(text, at)}),
    );
    match &answer["items"] {
        Value::Array(items) => items.clone(),
        _ => panic!("no items: {answer}"),
    }
}

fn labels(items: &[Value]) -> Vec<String> {
    let mut l: Vec<String> = items
        .iter()
        .filter_map(|i| i["label"].as_str().map(str::to_string))
        .collect();
    l.sort();
    l
}

fn item<'a>(items: &'a [Value], label: &str) -> &'a Value {
    items
        .iter()
        .find(|i| i["label"] == label)
        .unwrap_or_else(|| panic!("no `{label}` among {:?}", labels(items)))
}

fn has(items: &[Value], want: &[&str], not: &[&str]) {
    let l = labels(items);
    for w in want {
        assert!(l.iter().any(|x| x == w), "`{w}` missing from {l:?}");
    }
    for n in not {
        assert!(!l.iter().any(|x| x == n), "`{n}` should not be in {l:?}");
    }
}

fn exactly(items: &[Value], want: &[&str]) {
    let mut w: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    w.sort();
    assert_eq!(labels(items), w);
}

fn read(dir: &Path, rel: &str) -> String {
    std::fs::read_to_string(dir.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The text edit of an item replaces `from..to` of the text with `new_text`.
fn assert_edit(it: &Value, text: &str, from: usize, to: usize, new_text: &str) {
    let e = &it["textEdit"];
    assert_eq!(e["range"]["start"], position(text, from), "{it}");
    assert_eq!(e["range"]["end"], position(text, to), "{it}");
    assert_eq!(e["newText"], new_text, "{it}");
}

#[test]
fn toml_keys_by_table_and_kind_leave_out_written_ones() {
    let dir = project();
    let path = dir.path().join("workflows/spider.toml");
    let text = read(dir.path(), "workflows/spider.toml");
    let mut c = Client::start(dir.path());
    let u = c.open(&path, &text);
    // A half-typed key in an agent stage: the file does not parse.
    let typed = edit(
        &text,
        "[stages.review]\nkind = \"agent\"\n",
        &format!("[stages.review]\nkind = \"agent\"\npro{MARK}\n"),
    );
    let (items, t, at) = complete(&mut c, &u, &typed);
    has(
        &items,
        &[
            "prompt", "retries", "timeout", "when", "on_fail", "labels", "then",
        ],
        // Written already, or for other kinds.
        &[
            "kind",
            "agent",
            "needs",
            "description",
            "prompt_file",
            "route",
            "output",
            "argv",
            "message",
            "max_iterations",
            "over",
        ],
    );
    assert_edit(item(&items, "prompt"), &t, at - 3, at, "prompt = ");
    let doc = item(&items, "retries")["detail"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(doc.starts_with("Retries of transient failures"), "{doc}");
    // A loop's keys.
    let typed = edit(
        &text,
        "on_exhausted = \"exit:spec_rejected\"\n",
        &format!("on_exhausted = \"exit:spec_rejected\"\n{MARK}\n"),
    );
    let (items, _, _) = complete(&mut c, &u, &typed);
    has(
        &items,
        &["stuck", "escalation", "worktree", "on_fail"],
        &["until", "max_iterations", "prompt", "over", "argv"],
    );
    // The top level: `name` is written, `extends` is not.
    let typed = format!("{MARK}\n{text}");
    let (items, _, _) = complete(&mut c, &u, &typed);
    has(
        &items,
        &["extends", "include", "budget", "max_concurrency"],
        &["name", "version", "prompt_path", "kind"],
    );
    // An inline table: the output's keys.
    let typed = edit(
        &text,
        "output = { extract = \"fenced_json\", schema = \"../schemas/spider-plan.schema.json\"",
        &format!(
            "output = {{ extract = \"fenced_json\", {MARK} schema = \"../schemas/spider-plan.schema.json\""
        ),
    );
    let (items, _, _) = complete(&mut c, &u, &typed);
    has(
        &items,
        &["pattern", "markers", "files"],
        &["extract", "kind", "agent"],
    );
    c.shutdown();
}

#[test]
fn kdl_keys_by_node_and_kind() {
    let dir = project();
    let path = dir.path().join("workflows/wiggum-review.kdl");
    let text = read(dir.path(), "workflows/wiggum-review.kdl");
    let mut c = Client::start(dir.path());
    let u = c.open(&path, &text);
    let typed = edit(
        &text,
        "        expect \"output.stdout | trim == ''\"\n",
        &format!("        expect \"output.stdout | trim == ''\"\n        pa{MARK}\n"),
    );
    let (items, t, at) = complete(&mut c, &u, &typed);
    has(
        &items,
        &["pass_codes", "stdin", "timeout", "labels"],
        &[
            "ok_codes",
            "prompt",
            "needs",
            "argv",
            "expect",
            "description",
            "max_iterations",
            "message",
        ],
    );
    assert_edit(item(&items, "pass_codes"), &t, at - 2, at, "pass_codes ");
    // A property on a node's line: the node's own keys.
    let typed = edit(
        &text,
        "stage \"stats\" kind=\"command\"",
        &format!("stage \"stats\" kind=\"command\" {MARK}"),
    );
    let (items, _, _) = complete(&mut c, &u, &typed);
    has(
        &items,
        &["retries", "timeout", "cwd"],
        &["kind", "pass_codes", "stages", "output", "needs"],
    );
    let it = item(&items, "retries");
    assert_eq!(it["textEdit"]["newText"], "retries=");
    // Top-level nodes: collections by their singular name.
    let typed = format!("{text}\n{MARK}");
    let (items, _, _) = complete(&mut c, &u, &typed);
    has(
        &items,
        &["stage", "param", "agent", "exit", "extends"],
        &["stages", "params", "name", "version"],
    );
    c.shutdown();
}

#[test]
fn enum_values_and_actions_in_both_syntaxes() {
    let dir = project();
    let mut c = Client::start(dir.path());
    let path = dir.path().join("workflows/spider.toml");
    let text = read(dir.path(), "workflows/spider.toml");
    let u = c.open(&path, &text);
    let typed = edit(
        &text,
        "idle_timeout = \"10m\"\nfallbacks = [\"claude\"]\npermissions = \"full\"",
        &format!("idle_timeout = \"10m\"\nfallbacks = [\"claude\"]\npermissions = \"{MARK}\""),
    );
    let (items, t, at) = complete(&mut c, &u, &typed);
    // The levels (and the workflow's policies, of which spider has none).
    exactly(&items, &["read-only", "edit", "commit", "full"]);
    assert_edit(item(&items, "edit"), &t, at, at, "edit");
    // A gate's timeout action: the words, the exits, the stages beside the gate.
    let typed = edit(
        &text,
        "on_timeout = \"exit:gate_timeout\"",
        &format!("on_timeout = \"ex{MARK}\""),
    );
    let (items, t, at) = complete(&mut c, &u, &typed);
    has(
        &items,
        &[
            "continue",
            "break",
            "fail",
            "approve",
            "reject",
            "exit:gate_timeout",
            "exit:spec_rejected",
            "exit:success",
            "specify",
        ],
        &["approve_spec", "plan", "review", "read-only"],
    );
    assert_edit(item(&items, "exit:success"), &t, at - 2, at, "exit:success");
    // A loop's give-up action: stages beside the loop.
    let typed = edit(
        &text,
        "on_exhausted = \"exit:plan_rejected\"",
        &format!("on_exhausted = \"{MARK}\""),
    );
    let (items, _, _) = complete(&mut c, &u, &typed);
    has(
        &items,
        &["specify_loop", "phases", "review", "exit:plan_rejected"],
        &["plan_loop", "plan", "approve", "reject"],
    );
    // A route's field: the stage's output fields.
    let typed = edit(
        &text,
        "route = { on = \"verdict\", cases = { PASS",
        &format!("route = {{ on = \"ver{MARK}\", cases = {{ PASS"),
    );
    let (items, t, at) = complete(&mut c, &u, &typed);
    exactly(&items, &["verdict", "gaps", "text"]);
    assert_edit(item(&items, "verdict"), &t, at - 3, at, "verdict");
    // Unquoted: the value is inserted with its quotes.
    let typed = edit(
        &text,
        "[stages.review]\nkind = \"agent\"",
        &format!("[stages.review]\nkind = {MARK}"),
    );
    let (items, _, _) = complete(&mut c, &u, &typed);
    exactly(
        &items,
        &[
            "agent", "command", "gate", "check", "subflow", "loop", "for_each", "group",
        ],
    );
    assert_eq!(item(&items, "gate")["textEdit"]["newText"], "\"gate\"");

    let kpath = dir.path().join("workflows/wiggum-review.kdl");
    let ktext = read(dir.path(), "workflows/wiggum-review.kdl");
    let ku = c.open(&kpath, &ktext);
    let typed = edit(
        &ktext,
        "extract \"markers\"",
        &format!("extract \"fe{MARK}\""),
    );
    let (items, _, _) = complete(&mut c, &ku, &typed);
    exactly(&items, &["text", "json", "fenced_json", "markers", "regex"]);
    let typed = edit(
        &ktext,
        "param \"criteria\" type=\"string\"",
        &format!("param \"criteria\" type=\"{MARK}\""),
    );
    let (items, _, _) = complete(&mut c, &ku, &typed);
    exactly(&items, &["string", "int", "float", "bool", "list"]);
    // Route cases: the exits and the stages beside the one routed.
    let typed = edit(
        &ktext,
        "cases exhausted=\"exit:max_iterations\"",
        &format!("cases exhausted=\"{MARK}\""),
    );
    let (items, _, _) = complete(&mut c, &ku, &typed);
    has(
        &items,
        &[
            "exit:max_iterations",
            "exit:stuck",
            "exit:clean",
            "review_loop",
            "fail",
        ],
        &["report", "review", "approve"],
    );
    c.shutdown();
}

#[test]
fn stage_agent_and_preset_names() {
    let dir = project();
    let mut c = Client::start(dir.path());
    let path = dir.path().join("workflows/spider.toml");
    let text = read(dir.path(), "workflows/spider.toml");
    let u = c.open(&path, &text);
    // needs: the stages of the same body, not the stage itself.
    let typed = edit(
        &text,
        "needs = [\"plan\"]",
        &format!("needs = [\"{MARK}\"]"),
    );
    let (items, _, _) = complete(&mut c, &u, &typed);
    exactly(&items, &["plan"]);
    let typed = edit(
        &text,
        "needs = [\"phases\"]",
        &format!("needs = [\"phases\", \"{MARK}\"]"),
    );
    let (items, _, _) = complete(&mut c, &u, &typed);
    exactly(&items, &["specify_loop", "plan_loop", "phases"]);
    let typed = edit(
        &text,
        "agent = \"{{ params.author_backend }}\"\nprompt_file = \"review.md.j2\"",
        &format!("agent = \"{MARK}\"\nprompt_file = \"review.md.j2\""),
    );
    let (items, _, _) = complete(&mut c, &u, &typed);
    exactly(&items, &["claude", "codex"]);
    // Presets after extends.
    let new = dir.path().join("workflows/mine.toml");
    let nu = c.open(&new, "");
    let (items, t, at) = complete(&mut c, &nu, &format!("extends = \"sp{MARK}\"\n"));
    has(
        &items,
        &["spider", "council", "wiggum-review", "task-loop"],
        &["stages"],
    );
    assert_edit(item(&items, "spider"), &t, at - 2, at, "spider");

    let kpath = dir.path().join("workflows/wiggum-review.kdl");
    let ktext = read(dir.path(), "workflows/wiggum-review.kdl");
    let ku = c.open(&kpath, &ktext);
    let typed = edit(
        &ktext,
        "needs \"review\"\n        argv \"git\"",
        &format!("needs \"{MARK}\"\n        argv \"git\""),
    );
    let (items, _, _) = complete(&mut c, &ku, &typed);
    exactly(&items, &["review", "stats"]);
    let typed = edit(
        &ktext,
        "agent \"reviewer\"\n        prompt_file",
        &format!("agent \"{MARK}\"\n        prompt_file"),
    );
    let (items, _, _) = complete(&mut c, &ku, &typed);
    exactly(&items, &["reviewer"]);
    let knew = dir.path().join("workflows/mine.kdl");
    let knu = c.open(&knew, "");
    let (items, _, _) = complete(
        &mut c,
        &knu,
        &format!("name \"mine\"\nextends \"{MARK}\"\n"),
    );
    has(&items, &["spider", "wiggum-review"], &["reviewer"]);
    c.shutdown();
}

#[test]
fn templates_and_expressions_in_workflow_files_while_half_typed() {
    let dir = project();
    let mut c = Client::start(dir.path());
    let path = dir.path().join("workflows/spider.toml");
    let text = read(dir.path(), "workflows/spider.toml");
    let u = c.open(&path, &text);
    assert_eq!(c.diagnostics(&u), Vec::<Value>::new());
    // An unclosed string: the file does not parse; the names come from the last good check.
    let desc = "description = \"Reviews the whole change against the spec and writes the review document.\"";
    let typed = edit(
        &text,
        desc,
        &format!("feedback = \"é {{{{ stages.spe{MARK}"),
    );
    let (items, t, at) = complete(&mut c, &u, &typed);
    assert!(
        !c.diagnostics(&u).is_empty(),
        "the half-typed text should not parse"
    );
    has(
        &items,
        &[
            "specify",
            "approve_spec",
            "plan",
            "phases",
            "evaluate",
            "specify_loop",
        ],
        &["output", "params"],
    );
    // `spe` is replaced, with UTF-16 columns.
    assert_edit(item(&items, "specify"), &t, at - 3, at, "specify");
    let typed = edit(
        &text,
        desc,
        &format!("feedback = \"{{{{ stages.specify.output.{MARK}"),
    );
    let (items, _, _) = complete(&mut c, &u, &typed);
    exactly(
        &items,
        &["spec_path", "summary", "open_questions", "changes"],
    );
    assert_eq!(
        item(&items, "summary")["detail"],
        "Two or three sentences a reviewer reads before opening the spec."
    );
    let typed = edit(
        &text,
        desc,
        &format!("feedback = \"{{{{ stages.plan.{MARK}"),
    );
    let (items, _, _) = complete(&mut c, &u, &typed);
    has(
        &items,
        &["output", "ran", "last", "status", "attempts"],
        &["summary"],
    );
    // A nested object of a schema: the phases' items are not fields, the plan's are.
    let typed = edit(&text, desc, &format!("feedback = \"{{{{ params.{MARK}"));
    let (items, _, _) = complete(&mut c, &u, &typed);
    has(
        &items,
        &["brief", "spec_path", "max_spec_revisions", "author_backend"],
        &["specify"],
    );
    assert_eq!(
        item(&items, "brief")["detail"],
        "string, default \"BRIEF.md\""
    );
    let typed = edit(
        &text,
        desc,
        &format!("feedback = \"{{{{ params.brief | up{MARK}"),
    );
    let (items, _, _) = complete(&mut c, &u, &typed);
    has(
        &items,
        &["upper", "trim", "length", "spread"],
        &["defined", "brief"],
    );
    let typed = edit(
        &text,
        desc,
        &format!("feedback = \"{{% if stages.plan is de{MARK}"),
    );
    let (items, _, _) = complete(&mut c, &u, &typed);
    has(
        &items,
        &["defined", "undefined", "string"],
        &["trim", "join"],
    );
    // An expression-valued key: all of it is code; in a loop, the loop variables.
    let typed = edit(
        &text,
        "until = \"stages.tests.output.passed\"",
        &format!("until = \"stages.tests.output.{MARK}"),
    );
    let (items, _, _) = complete(&mut c, &u, &typed);
    has(&items, &["passed"], &["summary"]);
    let typed = edit(
        &text,
        "until = \"stages.tests.output.passed\"",
        &format!("until = \"{MARK}\""),
    );
    let (items, _, _) = complete(&mut c, &u, &typed);
    has(
        &items,
        &[
            "stages",
            "params",
            "iteration",
            "phase",
            "loops",
            "read_file",
        ],
        &["item"],
    );
    // Outside any loop, no loop variables.
    let typed = edit(&text, desc, &format!("when = \"{MARK}\"\n{desc}"));
    let (items, _, _) = complete(&mut c, &u, &typed);
    has(
        &items,
        &["stages", "params", "run"],
        &["iteration", "phase", "loops"],
    );
    c.shutdown();
}

#[test]
fn kdl_templates_and_expressions() {
    let dir = project();
    let mut c = Client::start(dir.path());
    let path = dir.path().join("workflows/wiggum-review.kdl");
    let text = read(dir.path(), "workflows/wiggum-review.kdl");
    let u = c.open(&path, &text);
    assert_eq!(c.diagnostics(&u), Vec::<Value>::new());
    let typed = edit(
        &text,
        "until \"stages.review.output.no_issues and",
        &format!("until \"stages.review.output.{MARK}"),
    );
    let (items, _, _) = complete(&mut c, &u, &typed);
    // A markers output: its markers, and the text they were read from.
    exactly(&items, &["no_issues", "issues", "text"]);
    let typed = edit(
        &text,
        "feedback \"{{ output.issues | join('\\n') }}\"",
        &format!("feedback \"{{{{ output.{MARK} }}}}\""),
    );
    let (items, _, _) = complete(&mut c, &u, &typed);
    exactly(&items, &["no_issues", "issues", "text"]);
    let typed = edit(
        &text,
        "max_iterations \"{{ params.max_iterations }}\"",
        &format!("max_iterations \"{{{{ params.{MARK} }}}}\""),
    );
    let (items, _, _) = complete(&mut c, &u, &typed);
    exactly(&items, &["max_iterations", "criteria", "paths"]);
    let typed = edit(
        &text,
        "max_iterations \"{{ params.max_iterations }}\"",
        &format!("max_iterations \"{{{{ stages.{MARK} }}}}\""),
    );
    let (items, _, _) = complete(&mut c, &u, &typed);
    has(
        &items,
        &["review_loop", "review", "clean_tree", "stats", "report"],
        &["reviewer"],
    );
    c.shutdown();
}

/// The prompt file of a stage: its scope is the stage's.
fn prompt_file_scope(open_workflow: bool) {
    let dir = project();
    let mut c = Client::start(dir.path());
    if open_workflow {
        let wf = dir.path().join("workflows/spider.toml");
        c.open_file(&wf);
    }
    let prompt = dir.path().join("prompts/spider/plan.md.j2");
    let text = read(dir.path(), "prompts/spider/plan.md.j2");
    let pu = c.open(&prompt, &text);
    let (items, t, at) = complete(&mut c, &pu, &format!("{text}\n{{{{ stages.{MARK}"));
    has(
        &items,
        &[
            "specify",
            "plan",
            "approve_spec",
            "approve_plan",
            "implement",
            "review",
            "specify_loop",
        ],
        &["output", "brief"],
    );
    assert_edit(item(&items, "specify"), &t, at, at, "specify");
    // Upstream stages sort before the others.
    let sort = |l: &str| {
        item(&items, l)["sortText"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    assert!(
        sort("specify") < sort("review"),
        "{} {}",
        sort("specify"),
        sort("review")
    );
    let (items, _, _) = complete(
        &mut c,
        &pu,
        &format!("{text}\n{{{{ stages.specify.output.{MARK} }}}}"),
    );
    exactly(
        &items,
        &["spec_path", "summary", "open_questions", "changes"],
    );
    let (items, _, _) = complete(
        &mut c,
        &pu,
        &format!("{text}\n{{{{ stages.plan.output.ph{MARK}"),
    );
    has(&items, &["phases", "plan_path"], &["summary"]);
    let (items, _, _) = complete(&mut c, &pu, &format!("{text}\n{{% if {MARK}"));
    has(
        &items,
        &[
            "stages",
            "params",
            "run",
            "attempt",
            "iteration",
            "feedback",
            "read_file",
            "file_exists",
        ],
        &["phase", "output"],
    );
    let (items, _, _) = complete(&mut c, &pu, &format!("{text}\n{{{{ params.{MARK}"));
    has(
        &items,
        &["brief", "plan_path", "gate_timeout"],
        &["specify"],
    );
    // Outside `{{ }}`: nothing.
    let (items, _, _) = complete(&mut c, &pu, &format!("{text}\nstages.{MARK}"));
    exactly(&items, &[]);
    c.shutdown();
}

#[test]
fn item_variables_of_a_for_each_have_the_fields_of_its_list_items() {
    let dir = project();
    let mut c = Client::start(dir.path());
    c.open_file(&dir.path().join("workflows/spider.toml"));
    let prompt = dir.path().join("prompts/spider/implement.md.j2");
    let text = read(dir.path(), "prompts/spider/implement.md.j2");
    let pu = c.open(&prompt, &text);
    let (items, _, _) = complete(&mut c, &pu, &format!("{text}\n{{{{ phase.{MARK}"));
    exactly(
        &items,
        &["id", "title", "goal", "deliverables", "acceptance", "files"],
    );
    assert_eq!(
        item(&items, "goal")["detail"],
        "What is true when the phase is done."
    );
    let (items, _, _) = complete(&mut c, &pu, &format!("{text}\n{{{{ {MARK}"));
    has(
        &items,
        &["phase", "index", "iteration", "stages"],
        &["item"],
    );
    c.shutdown();
}

#[test]
fn prompt_file_with_its_workflow_open() {
    prompt_file_scope(true);
}

#[test]
fn prompt_file_alone_finds_its_workflow_in_the_workspace() {
    prompt_file_scope(false);
}

#[test]
fn a_file_that_never_parsed_gives_the_names_its_text_declares() {
    let dir = project();
    let mut c = Client::start(dir.path());
    let path = dir.path().join("workflows/draft.toml");
    let u = c.open(&path, "");
    let text = format!(
        "name = \"draft\"\n[params.target]\ntype = \"string\"\n[agents.bot]\nkind = \"claude\"\n[exits.done]\ncode = 0\n\n[stages.build]\nkind = \"command\"\nargv = [\"make\"]\n\n[stages.test]\nkind = \"gate\"\nneeds = [\"{MARK}\"]\nmessage = \"{{{{ stages."
    );
    let (items, _, _) = complete(&mut c, &u, &text);
    exactly(&items, &["build"]);
    let (t, _) = marked(&text);
    let at = t.len();
    let items = ask(&mut c, &u, &t, at);
    exactly(&items, &["build", "test"]);
    let t2 = format!("{t}build.output }}}} {{{{ params.");
    c.replace(&u, &t2);
    let items = ask(&mut c, &u, &t2, t2.len());
    exactly(&items, &["target"]);
    let (items, _, _) = complete(
        &mut c,
        &u,
        &format!(
            "name = \"draft\"\n[exits.done]\ncode = 0\n[stages.g]\nkind = \"gate\"\non_timeout = \"{MARK}\"\n[stages.h]\nkind = \"command\"\n"
        ),
    );
    has(&items, &["exit:done", "h", "approve"], &["g"]);
    c.shutdown();
}

#[test]
fn completion_answers_in_a_comment_and_in_garbage_without_failing() {
    let dir = project();
    let mut c = Client::start(dir.path());
    let path = dir.path().join("workflows/x.toml");
    let u = c.open(&path, "");
    let (items, _, _) = complete(&mut c, &u, &format!("# stages.{MARK}\n"));
    exactly(&items, &[]);
    for garbage in [
        "[[[{MARK}",
        "\"\"\"{{{{ {MARK}",
        "a.b.c = {{ d = [{MARK}",
        "= = {MARK} =",
    ] {
        let g = garbage.replace("{MARK}", MARK).replace("{{{{", "{{");
        let (t, at) = marked(&g);
        c.replace(&u, &t);
        let _ = ask(&mut c, &u, &t, at);
    }
    c.shutdown();
}

/// Completion anywhere in the shipped presets and a prompt file, in the whole text and in
/// the text cut there (as it is while typed), answers without an error.
#[test]
fn completion_anywhere_in_the_presets_answers() {
    let dir = project();
    let mut c = Client::start(dir.path());
    for rel in [
        "workflows/spider.toml",
        "workflows/council.kdl",
        "workflows/wiggum-review.kdl",
        "prompts/spider/implement.md.j2",
    ] {
        let path = dir.path().join(rel);
        let text = read(dir.path(), rel);
        let u = c.open(&path, &text);
        let step = (text.len() / 60).max(1);
        for cut in (0..=text.len()).step_by(step) {
            if !text.is_char_boundary(cut) {
                continue;
            }
            for t in [text.clone(), text[..cut].to_string()] {
                c.replace(&u, &t);
                let answer = c.try_request(
                    "textDocument/completion",
                    json!({"textDocument": {"uri": u}, "position": position(&t, cut)}),
                );
                assert!(
                    matches!(&answer, Ok(v) if v["items"].is_array()),
                    "{rel} at {cut}: {answer:?}"
                );
            }
        }
    }
    c.shutdown();
}

#[test]
fn names_set_in_a_template_are_offered_in_that_template_only() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("w.toml");
    let mut c = Client::start(dir.path());
    let u = c.open(&path, "");
    let head = "name = \"w\"\n\n[agents.a]\nkind = \"claude\"\n\n[stages.one]\nkind = \"agent\"\nagent = \"a\"\nprompt = \"{% set early = 1 %}{{ early }}\"\n\n[stages.two]\nkind = \"agent\"\nagent = \"a\"\nneeds = [\"one\"]\n";
    // Another stage's template: its `early` is not this one's.
    let (items, _, _) = complete(
        &mut c,
        &u,
        &format!("{head}prompt = \"{{{{ ea{MARK} }}}}\"\n"),
    );
    has(&items, &["params"], &["early"]);
    // The same template, after its `set`: offered.
    let (items, _, _) = complete(
        &mut c,
        &u,
        &format!("{head}prompt = \"{{% set late = 2 %}}{{{{ la{MARK} }}}}\"\n"),
    );
    has(&items, &["late"], &["early"]);
    c.shutdown();
}
