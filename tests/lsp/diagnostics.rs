//! Diagnostics: what `check` reports, in the file it points into, from the unsaved text.

use serde_json::{Value, json};

use crate::client::{Client, position_of, project, uri};

#[test]
fn a_shipped_preset_is_clean_and_a_typo_shows_where_it_is_typed() {
    let dir = project();
    let path = dir.path().join("workflows/spider.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
    let mut c = Client::start(dir.path());
    let u = c.open(&path, &text);
    assert_eq!(c.diagnostics(&u), Vec::<Value>::new());
    // An unsaved edit: a need that names no stage.
    let broken = text.replacen("needs = [\"specify\"]", "needs = [\"specfy\"]", 1);
    assert!(broken != text, "the preset changed: fix the test's edit");
    c.replace(&u, &broken);
    let diags = c.diagnostics(&u);
    // The unknown need, and the read of `specify`'s output that it no longer orders.
    let codes: Vec<&str> = diags.iter().filter_map(|d| d["code"].as_str()).collect();
    assert_eq!(codes, ["RF010", "RF032"], "{diags:#?}");
    let d = &diags[0];
    assert_eq!(d["code"], "RF010");
    assert_eq!(d["severity"], 1);
    assert_eq!(d["range"]["start"], position_of(&broken, "\"specfy\"", 0));
    assert_eq!(d["range"]["end"], position_of(&broken, "\"specfy\"", 8));
    let message = d["message"].as_str().unwrap_or("");
    assert!(message.contains("there is no stage `specfy`"), "{message}");
    assert!(message.contains("did you mean `specify`?"), "{message}");
    // Fixed again: the diagnostic goes away.
    c.replace(&u, &text);
    assert_eq!(c.diagnostics(&u), Vec::<Value>::new());
    c.shutdown();
}

#[test]
fn a_template_error_in_a_prompt_file_shows_in_the_prompt_file() {
    let dir = project();
    let wf = dir.path().join("workflows/spider.toml");
    let prompt = dir.path().join("prompts/spider/specify.md.j2");
    let text = std::fs::read_to_string(&prompt).unwrap_or_else(|e| panic!("{e}"));
    let mut c = Client::start(dir.path());
    let wu = c.open_file(&wf);
    let pu = c.open(&prompt, &text);
    assert_eq!(c.diagnostics(&pu), Vec::<Value>::new());
    let broken = format!("{text}\n{{{{ stages.nope.output.x }}}}\n");
    c.replace(&pu, &broken);
    let diags = c.diagnostics(&pu);
    assert!(
        diags
            .iter()
            .any(|d| d["code"] == "RF031" || d["code"] == "RF010"),
        "{diags:#?}"
    );
    // The workflow itself stays clean: the problem is the prompt file's.
    assert_eq!(c.diagnostics(&wu), Vec::<Value>::new());
    c.shutdown();
}

#[test]
fn a_prompt_file_opened_alone_is_checked_with_the_workflow_that_reads_it() {
    let dir = project();
    let prompt = dir.path().join("prompts/spider/specify.md.j2");
    let text = std::fs::read_to_string(&prompt).unwrap_or_else(|e| panic!("{e}"));
    let mut c = Client::start(dir.path());
    let pu = c.open(&prompt, &format!("{text}\n{{{{ stages.nope }}}}\n"));
    let diags = c.diagnostics(&pu);
    assert!(!diags.is_empty(), "the prompt's workflow was not found");
    c.shutdown();
}

/// A workflow `w.toml` that includes `part.toml`, whose stage needs one that does not exist.
const MAIN_TEXT: &str = "name = \"w\"\ninclude = [\"part.toml\"]\n\n[stages.a]\nkind = \"command\"\nargv = [\"true\"]\n";
const PART_TEXT: &str = "[stages.b]\nkind = \"command\"\nneeds = \"zz\"\nargv = [\"true\"]\n";

/// [`MAIN_TEXT`] and [`PART_TEXT`] written in a new directory: (it, the workflow, the part).
fn workflow_and_part() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (main, part) = (dir.path().join("w.toml"), dir.path().join("part.toml"));
    std::fs::write(&main, MAIN_TEXT).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(&part, PART_TEXT).unwrap_or_else(|e| panic!("{e}"));
    (dir, main, part)
}

#[test]
fn a_diagnostic_in_an_included_file_shows_in_that_file() {
    let (dir, main, part) = workflow_and_part();
    let mut c = Client::start(dir.path());
    let mu = c.open(&main, MAIN_TEXT);
    let pu = c.open(&part, PART_TEXT);
    assert_eq!(c.codes(&pu), vec!["RF010".to_string()]);
    assert_eq!(c.codes(&mu), Vec::<String>::new());
    // The part is not checked as a workflow of its own (it has no `name`).
    let diags = c.diagnostics(&pu);
    assert_eq!(
        diags[0]["range"]["start"],
        position_of(PART_TEXT, "\"zz\"", 0)
    );
    c.shutdown();
}

#[test]
fn a_part_its_workflow_stops_including_is_checked_on_its_own() {
    let (dir, main, part) = workflow_and_part();
    let mut c = Client::start(dir.path());
    // The part is opened first: it is checked within the workflow that includes it
    // even before that workflow is open.
    let pu = c.open(&part, PART_TEXT);
    let mu = c.open(&main, MAIN_TEXT);
    assert_eq!(c.codes(&pu), vec!["RF010".to_string()]);
    // Once the workflow drops the include, the part is a workflow of its own again,
    // and a workflow needs a name.
    c.replace(&mu, &MAIN_TEXT.replace("include = [\"part.toml\"]\n", ""));
    let mut codes = c.codes(&pu);
    codes.sort();
    assert_eq!(codes, vec!["RF004".to_string(), "RF010".to_string()]);
    assert_eq!(c.codes(&mu), Vec::<String>::new());
    // And back.
    c.replace(&mu, MAIN_TEXT);
    assert_eq!(c.codes(&pu), vec!["RF010".to_string()]);
    c.shutdown();
}

#[test]
fn diagnostics_follow_incremental_edits_and_a_closed_file_is_cleared() {
    let dir = project();
    let path = dir.path().join("workflows/wiggum-review.kdl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
    let mut c = Client::start(dir.path());
    let u = c.open(&path, &text);
    assert_eq!(c.codes(&u), Vec::<String>::new());
    // Type a stray `{` at the end, one character at a time would do the same.
    let end = position_of(&text, &text[text.len() - 1..], 1);
    let end = if text.ends_with('\n') {
        json!({"line": text.matches('\n').count(), "character": 0})
    } else {
        end
    };
    c.change(
        &u,
        json!([{"range": {"start": end, "end": end}, "text": "stage \"x\" {"}]),
    );
    let codes = c.codes(&u);
    assert_eq!(codes, vec!["RF001".to_string()], "{codes:?}");
    c.notify("textDocument/didClose", json!({"textDocument": {"uri": u}}));
    assert_eq!(c.diagnostics(&uri(&path)), Vec::<Value>::new());
    c.shutdown();
}

#[test]
fn toml_files_that_are_not_workflows_get_no_diagnostics() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cargo = dir.path().join("Cargo.toml");
    let cargo_text = "[package]\nname = \"x\"\nversion = \"0.1.0\"\n";
    let flow = dir.path().join("flow.toml");
    let flow_text =
        "name = \"f\"\n\n[stages.a]\nkind = \"command\"\nneeds = \"zz\"\nargv = [\"true\"]\n";
    let mut c = Client::start(dir.path());
    let cu = c.open(&cargo, cargo_text);
    let fu = c.open(&flow, flow_text);
    assert_eq!(c.diagnostics(&cu), Vec::<Value>::new());
    // Nor completion: `stages` is no key of a Cargo.toml.
    let at = json!({"textDocument": {"uri": cu}, "position": {"line": 3, "character": 0}});
    assert_eq!(c.request("textDocument/completion", at), Value::Null);
    // A workflow outside a `workflows` directory is known by its keys.
    assert_eq!(c.codes(&fu), vec!["RF010".to_string()]);
    // A file in a `workflows` directory is a workflow whatever it holds yet.
    std::fs::create_dir_all(dir.path().join("workflows")).unwrap_or_else(|e| panic!("{e}"));
    let fresh = dir.path().join("workflows/new.toml");
    let nu = c.open(&fresh, "nme = \"x\"\n");
    assert!(
        c.codes(&nu).contains(&"RF002".to_string()),
        "{:?}",
        c.diagnostics(&nu)
    );
    c.shutdown();
}

#[test]
fn a_prompt_file_stays_checked_when_its_workflow_is_closed() {
    let dir = project();
    let wf = dir.path().join("workflows/spider.toml");
    let prompt = dir.path().join("prompts/spider/specify.md.j2");
    let text = std::fs::read_to_string(&prompt).unwrap_or_else(|e| panic!("{e}"));
    let mut c = Client::start(dir.path());
    let pu = c.open(&prompt, &text);
    assert_eq!(c.diagnostics(&pu), Vec::<Value>::new());
    let wu = c.open_file(&wf);
    assert_eq!(c.diagnostics(&wu), Vec::<Value>::new());
    c.notify(
        "textDocument/didClose",
        json!({"textDocument": {"uri": wu}}),
    );
    c.sync();
    // The workflow closed, the prompt file is still checked with it (as saved on disk).
    c.replace(&pu, &format!("{text}\n{{{{ stages.nope }}}}\n"));
    assert!(
        !c.diagnostics(&pu).is_empty(),
        "the prompt file is no longer checked"
    );
    c.shutdown();
}

#[test]
fn a_problem_in_a_file_nobody_opened_shows_at_the_top_of_the_workflow() {
    let dir = project();
    let wf = dir.path().join("workflows/spider.toml");
    let prompt = dir.path().join("prompts/spider/specify.md.j2");
    let text = std::fs::read_to_string(&prompt).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(&prompt, format!("{text}\n{{{{ stages.nope }}}}\n"))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut c = Client::start(dir.path());
    let wu = c.open_file(&wf);
    let diags = c.diagnostics(&wu);
    assert_eq!(diags.len(), 1, "{diags:#?}");
    assert_eq!(
        diags[0]["range"]["start"],
        json!({"line": 0, "character": 0})
    );
    let message = diags[0]["message"].as_str().unwrap_or("");
    // Named as `check` names it: the prompt file, its line and column.
    let line = text.matches('\n').count() + 2;
    assert!(
        message.contains(&format!("specify.md.j2:{line}:")),
        "{message}"
    );
    // Once the prompt file is open, the problem shows there instead.
    let pu = c.open_file(&prompt);
    assert!(!c.diagnostics(&pu).is_empty());
    assert_eq!(c.diagnostics(&wu), Vec::<Value>::new());
    c.shutdown();
}
