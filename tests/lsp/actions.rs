//! Code actions: the checker's advice as quick fixes. Each test breaks a file, takes the
//! fix the server offers, applies its edit as an editor would, and checks through the server
//! that the diagnostic is gone.

use std::path::Path;

use serde_json::{Value, json};

use crate::client::{Client, apply_edits, position_of, project};

/// Applies an action's edits to the document's text (edits of one document, applied from
/// the last one up).
fn apply(text: &str, action: &Value, uri: &str) -> String {
    let edits = action["edit"]["changes"][uri]
        .as_array()
        .unwrap_or_else(|| panic!("no edit of {uri}: {action:#}"));
    apply_edits(text, edits)
}

/// The code actions for a range, with the given diagnostics in the context.
fn actions(c: &mut Client, uri: &str, range: Value, diagnostics: Vec<Value>) -> Vec<Value> {
    let answer = c.request(
        "textDocument/codeAction",
        json!({
            "textDocument": {"uri": uri},
            "range": range,
            "context": {"diagnostics": diagnostics},
        }),
    );
    answer
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("no list of actions: {answer}"))
}

/// Breaks `path`'s text with `edit`, finds the diagnostic `code` whose message holds
/// `about`, takes the one quick fix the server offers for it (asked as an editor asks: for
/// the diagnostic's range, with the diagnostic in the context) and checks its title; then
/// applies it and returns the fixed text, once the server has checked it. A fix that
/// `asks_alone` is also offered when the context sends no diagnostic.
fn fix(
    c: &mut Client,
    path: &Path,
    broken: &str,
    code: &str,
    about: &str,
    title: &str,
) -> (String, Vec<Value>) {
    let uri = c.open(path, broken);
    let diags = c.diagnostics(&uri);
    let d = diags
        .iter()
        .find(|d| d["code"] == code && d["message"].as_str().is_some_and(|m| m.contains(about)))
        .unwrap_or_else(|| panic!("no {code} about `{about}`: {diags:#?}"))
        .clone();
    let offered = actions(c, &uri, d["range"].clone(), vec![d.clone()]);
    let fixes: Vec<&Value> = offered
        .iter()
        .filter(|a| a["diagnostics"].as_array().is_some_and(|l| l.contains(&d)))
        .collect();
    assert_eq!(fixes.len(), 1, "one fix for {d:#}: {offered:#?}");
    let action = fixes[0];
    assert_eq!(action["title"], title, "{action:#}");
    assert_eq!(action["kind"], "quickfix");
    assert_eq!(action["isPreferred"], true);
    // Asked for the range alone (clients that send no context): the server's own
    // diagnostics answer.
    let alone = actions(c, &uri, d["range"].clone(), Vec::new());
    assert!(
        alone
            .iter()
            .any(|a| a["title"] == title && a["edit"] == action["edit"]),
        "not offered without the context: {alone:#?}"
    );
    let fixed = apply(broken, action, &uri);
    c.replace(&uri, &fixed);
    let after = c.diagnostics(&uri);
    (fixed, after)
}

/// Tells whether a diagnostic about `about` with `code` is among `diags`.
fn has(diags: &[Value], code: &str, about: &str) -> bool {
    diags
        .iter()
        .any(|d| d["code"] == code && d["message"].as_str().is_some_and(|m| m.contains(about)))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn broken(text: &str, from: &str, to: &str) -> String {
    assert!(
        text.contains(from),
        "the preset changed: `{from}` is not in it"
    );
    text.replacen(from, to, 1)
}

#[test]
fn a_misspelt_need_is_replaced_inside_its_quotes_in_toml_and_kdl() {
    let dir = project();
    let mut c = Client::start(dir.path());
    let path = dir.path().join("workflows/spider.toml");
    let text = read(&path);
    let bad = broken(&text, "needs = [\"specify\"]", "needs = [\"specfy\"]");
    let (fixed, after) = fix(
        &mut c,
        &path,
        &bad,
        "RF010",
        "specfy",
        "Replace `specfy` with `specify`",
    );
    assert_eq!(fixed, text, "the edit is not exactly the name");
    assert_eq!(after, Vec::<Value>::new());

    let path = dir.path().join("workflows/council.kdl");
    let text = read(&path);
    let bad = broken(&text, "needs \"analysis\"", "needs \"anlysis\"");
    let (fixed, after) = fix(
        &mut c,
        &path,
        &bad,
        "RF010",
        "anlysis",
        "Replace `anlysis` with `analysis`",
    );
    assert_eq!(fixed, text);
    assert_eq!(after, Vec::<Value>::new());
    c.shutdown();
}

#[test]
fn a_misspelt_key_and_enum_value_are_replaced() {
    let dir = project();
    let mut c = Client::start(dir.path());
    let path = dir.path().join("workflows/spider.toml");
    let text = read(&path);
    // A key.
    let bad = broken(&text, "max_concurrency = 1", "max_concurency = 1");
    let (fixed, after) = fix(
        &mut c,
        &path,
        &bad,
        "RF002",
        "max_concurency",
        "Replace `max_concurency` with `max_concurrency`",
    );
    assert_eq!(fixed, text);
    assert_eq!(after, Vec::<Value>::new());
    // A level of `permissions` (a level or a policy: RF075, replaced as an enum value is).
    let bad = broken(&text, "permissions = \"full\"", "permissions = \"ful\"");
    let (fixed, after) = fix(
        &mut c,
        &path,
        &bad,
        "RF075",
        "ful",
        "Replace `ful` with `full`",
    );
    assert_eq!(fixed, text);
    assert_eq!(after, Vec::<Value>::new());

    // The same in KDL: a key, an enum value (a property).
    let path = dir.path().join("workflows/council.kdl");
    let text = read(&path);
    let bad = broken(
        &text,
        "    on_exhausted \"block\"",
        "    on_exhausted_ \"block\"",
    );
    let (fixed, after) = fix(
        &mut c,
        &path,
        &bad,
        "RF002",
        "on_exhausted_",
        "Replace `on_exhausted_` with `on_exhausted`",
    );
    assert_eq!(fixed, text);
    assert_eq!(after, Vec::<Value>::new());
    let bad = broken(
        &text,
        "aggregate mode=\"lowest\"",
        "aggregate mode=\"lowst\"",
    );
    let (fixed, after) = fix(
        &mut c,
        &path,
        &bad,
        "RF005",
        "lowst",
        "Replace `lowst` with `lowest`",
    );
    assert_eq!(fixed, text);
    assert_eq!(after, Vec::<Value>::new());
    c.shutdown();
}

#[test]
fn a_misspelt_stage_in_a_template_is_replaced_and_nothing_else_of_the_template() {
    let dir = project();
    let mut c = Client::start(dir.path());
    let path = dir.path().join("workflows/spider.toml");
    let text = read(&path);
    let bad = broken(
        &text,
        "{{ stages.specify.output.summary }}",
        "{{ stages.specfy.output.summary }}",
    );
    let (fixed, after) = fix(
        &mut c,
        &path,
        &bad,
        "RF010",
        "specfy",
        "Replace `specfy` with `specify`",
    );
    assert_eq!(fixed, text);
    assert_eq!(after, Vec::<Value>::new());
    // An output field, the last part of the path.
    let bad = broken(
        &text,
        "{{ stages.specify.output.summary }}",
        "{{ stages.specify.output.sumary }}",
    );
    let (fixed, after) = fix(
        &mut c,
        &path,
        &bad,
        "RF041",
        "sumary",
        "Replace `sumary` with `summary`",
    );
    assert_eq!(fixed, text);
    assert_eq!(after, Vec::<Value>::new());

    let path = dir.path().join("workflows/council.kdl");
    let text = read(&path);
    let bad = broken(
        &text,
        "when \"stages.implement.output.learnings | length > 0\"",
        "when \"stages.implemnt.output.learnings | length > 0\"",
    );
    let (fixed, after) = fix(
        &mut c,
        &path,
        &bad,
        "RF010",
        "implemnt",
        "Replace `implemnt` with `implement`",
    );
    assert_eq!(fixed, text);
    assert_eq!(after, Vec::<Value>::new());
    c.shutdown();
}

#[test]
fn multi_word_kdl_text_is_quoted() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("w.kdl");
    let good = "name \"w\"\ndescription \"build and test the 2 crates\"\n\nstage \"build\" kind=\"command\" description=\"build the project\" {\n    argv \"make\" \"-C\" \"src/app\"\n}\n";
    let mut c = Client::start(dir.path());
    // A node's text.
    let bad = good.replacen(
        "description \"build and test the 2 crates\"",
        "description build and test the 2 crates",
        1,
    );
    let (fixed, after) = fix(
        &mut c,
        &path,
        &bad,
        "RF001",
        "must be quoted",
        "Quote as \"build and test the 2 crates\"",
    );
    assert_eq!(fixed, good);
    assert_eq!(after, Vec::<Value>::new());
    // A property's text: the words after the first are read as arguments of the node.
    let bad = good.replacen(
        "description=\"build the project\"",
        "description=build the project",
        1,
    );
    let (fixed, after) = fix(
        &mut c,
        &path,
        &bad,
        "RF001",
        "must be quoted",
        "Quote as \"build the project\"",
    );
    assert_eq!(fixed, good);
    assert_eq!(after, Vec::<Value>::new());
    // The same with the key quoted.
    let quoted_key = good.replacen("description=", "\"description\"=", 1);
    let bad = quoted_key.replacen("=\"build the project\"", "=build the project", 1);
    assert!(bad != quoted_key);
    let (fixed, after) = fix(
        &mut c,
        &path,
        &bad,
        "RF001",
        "must be quoted",
        "Quote as \"build the project\"",
    );
    assert_eq!(fixed, quoted_key);
    assert_eq!(after, Vec::<Value>::new());
    // A word KDL cannot read bare (a syntax error of the parser's).
    let bad = good.replacen("\"src/app\"", "src/app", 1);
    let (fixed, after) = fix(
        &mut c,
        &path,
        &bad,
        "RF001",
        "must be quoted",
        "Quote as \"src/app\"",
    );
    assert_eq!(fixed, good);
    assert_eq!(after, Vec::<Value>::new());
    c.shutdown();
}

#[test]
fn a_missing_required_key_is_added_where_its_table_is_written() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut c = Client::start(dir.path());
    // TOML: a stage without `kind` (its first value, `agent`, fits it), indented like its keys.
    let path = dir.path().join("w.toml");
    let text = "name = \"w\"\n\n[agents.a]\nkind = \"claude\"\n\n[stages.s]\n  agent = \"a\"\n  prompt = \"go\"\n";
    let (fixed, after) = fix(
        &mut c,
        &path,
        text,
        "RF004",
        "missing key `kind`",
        "Add `kind`",
    );
    assert_eq!(
        fixed,
        "name = \"w\"\n\n[agents.a]\nkind = \"claude\"\n\n[stages.s]\n  kind = \"agent\"\n  agent = \"a\"\n  prompt = \"go\"\n"
    );
    assert_eq!(after, Vec::<Value>::new());
    // An agent stage without its agent: the workflow's agent is the placeholder.
    let text = "name = \"w\"\n\n[agents.a]\nkind = \"claude\"\n\n[stages.s]\nkind = \"agent\"\nprompt = \"go\"\n";
    let (fixed, after) = fix(&mut c, &path, text, "RF004", "needs `agent`", "Add `agent`");
    assert!(fixed.contains("[stages.s]\nagent = \"a\"\nkind"), "{fixed}");
    assert_eq!(after, Vec::<Value>::new());
    // The workflow's name, after the comments that open the file.
    let text = "# A flow.\n[stages.s]\nkind = \"command\"\nargv = [\"true\"]\n";
    let (fixed, after) = fix(
        &mut c,
        &path,
        text,
        "RF004",
        "missing key `name`",
        "Add `name`",
    );
    assert!(
        fixed.starts_with("# A flow.\nname = \"my-flow\"\n[stages.s]"),
        "{fixed}"
    );
    assert_eq!(after, Vec::<Value>::new());

    // KDL: the kind as a property; another key as a child node, indented like the others.
    let path = dir.path().join("w.kdl");
    let text = "name \"w\"\nagent \"a\" kind=\"claude\"\n\nstage \"s\" agent=\"a\" {\n    prompt \"go\"\n}\n";
    let (fixed, after) = fix(
        &mut c,
        &path,
        text,
        "RF004",
        "missing key `kind`",
        "Add `kind`",
    );
    assert_eq!(
        fixed,
        "name \"w\"\nagent \"a\" kind=\"claude\"\n\nstage \"s\" agent=\"a\" kind=\"agent\" {\n    prompt \"go\"\n}\n"
    );
    assert_eq!(after, Vec::<Value>::new());
    let text = "name \"w\"\nagent \"a\" kind=\"claude\"\n\nstage \"s\" kind=\"agent\" {\n    prompt \"go\"\n}\n";
    let (fixed, after) = fix(&mut c, &path, text, "RF004", "needs `agent`", "Add `agent`");
    assert_eq!(
        fixed,
        "name \"w\"\nagent \"a\" kind=\"claude\"\n\nstage \"s\" kind=\"agent\" {\n    agent \"a\"\n    prompt \"go\"\n}\n"
    );
    assert_eq!(after, Vec::<Value>::new());
    c.shutdown();
}

#[test]
fn no_action_where_no_diagnostic_is_and_none_of_another_kind() {
    let dir = project();
    let mut c = Client::start(dir.path());
    let path = dir.path().join("workflows/spider.toml");
    let text = read(&path);
    let bad = broken(&text, "needs = [\"specify\"]", "needs = [\"specfy\"]");
    let uri = c.open(&path, &bad);
    assert!(has(&c.diagnostics(&uri), "RF010", "specfy"));
    // The first line: nothing wrong there.
    let top = json!({"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 1}});
    assert_eq!(actions(&mut c, &uri, top, Vec::new()), Vec::<Value>::new());
    // Only refactorings asked for: no quick fix.
    let at = position_of(&bad, "specfy", 1);
    let answer = c.request(
        "textDocument/codeAction",
        json!({
            "textDocument": {"uri": uri},
            "range": {"start": at, "end": at},
            "context": {"diagnostics": [], "only": ["refactor"]},
        }),
    );
    assert_eq!(answer, json!([]));
    // The cursor inside the name: the fix.
    let found = actions(&mut c, &uri, json!({"start": at, "end": at}), Vec::new());
    assert_eq!(found.len(), 1, "{found:#?}");
    c.shutdown();
}

#[test]
fn a_misspelt_name_in_a_prompt_file_is_replaced_in_the_prompt_file() {
    let dir = project();
    let mut c = Client::start(dir.path());
    c.open_file(&dir.path().join("workflows/spider.toml"));
    let path = dir.path().join("prompts/spider/evaluate.md.j2");
    let text = read(&path);
    let bad = broken(
        &text,
        "{{ stages.implement.output.summary }}",
        "{{ stages.implemnt.output.summary }}",
    );
    let (fixed, after) = fix(
        &mut c,
        &path,
        &bad,
        "RF010",
        "implemnt",
        "Replace `implemnt` with `implement`",
    );
    assert_eq!(fixed, text);
    assert_eq!(after, Vec::<Value>::new());
    let bad = broken(&text, "{{ params.spec_path }}", "{{ params.spec_pth }}");
    let (fixed, after) = fix(
        &mut c,
        &path,
        &bad,
        "RF012",
        "spec_pth",
        "Replace `spec_pth` with `spec_path`",
    );
    assert_eq!(fixed, text);
    assert_eq!(after, Vec::<Value>::new());
    c.shutdown();
}

#[test]
fn a_misspelt_action_exit_or_choice_is_replaced() {
    let dir = project();
    let mut c = Client::start(dir.path());
    let path = dir.path().join("workflows/spider.toml");
    let text = read(&path);
    let cases: [(&str, &str, &str, &str, &str); 3] = [
        // An exit's name after `exit:`.
        (
            "on_exhausted = \"exit:spec_rejected\"",
            "on_exhausted = \"exit:spec_rejectd\"",
            "RF014",
            "spec_rejectd",
            "Replace `spec_rejectd` with `spec_rejected`",
        ),
        // An action of a route's case.
        (
            "FAIL = \"continue\"",
            "FAIL = \"contineu\"",
            "RF010",
            "contineu",
            "Replace `contineu` with `continue`",
        ),
        // A param's default that is none of its choices.
        (
            "default = \"claude\"",
            "default = \"claud\"",
            "RF051",
            "not one of its choices",
            "Replace `claud` with `claude`",
        ),
    ];
    for (from, to, code, about, title) in cases {
        let bad = broken(&text, from, to);
        let (fixed, after) = fix(&mut c, &path, &bad, code, about, title);
        assert_eq!(fixed, text, "{title}");
        assert_eq!(after, Vec::<Value>::new(), "{title}");
    }
    c.shutdown();
}
