//! Go to definition, references and rename of stages.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

use crate::client::{Client, apply_edits, offset, position_of, project, uri};

fn at(uri: &str, text: &str, needle: &str, delta: usize) -> Value {
    json!({"textDocument": {"uri": uri}, "position": position_of(text, needle, delta)})
}

fn definition(c: &mut Client, uri: &str, text: &str, needle: &str, delta: usize) -> Value {
    let answer = c.request("textDocument/definition", at(uri, text, needle, delta));
    assert!(
        answer.get("uri").is_some(),
        "no definition at `{needle}`: {answer:#}"
    );
    answer
}

/// The range of `needle` (from `delta`, `len` bytes long) in a text.
fn range_of(text: &str, needle: &str, delta: usize, len: usize) -> Value {
    json!({"start": position_of(text, needle, delta), "end": position_of(text, needle, delta + len)})
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The text a protocol range covers.
fn slice<'t>(text: &'t str, range: &Value) -> &'t str {
    &text[offset(text, &range["start"])..offset(text, &range["end"])]
}

#[test]
fn definition_of_a_stage_from_needs_and_from_a_prompt_file() {
    let dir = project();
    let path = dir.path().join("workflows/spider.toml");
    let text = read(&path);
    let mut c = Client::start(dir.path());
    let u = c.open(&path, &text);
    let d = definition(&mut c, &u, &text, "needs = [\"specify\"]", 12);
    assert_eq!(d["uri"], u);
    assert_eq!(d["range"], range_of(&text, "stages.specify]", 7, 7));
    // A template in the workflow.
    let d = definition(&mut c, &u, &text, "stages.plan.output.phases | length", 8);
    assert_eq!(d["range"], range_of(&text, "stages.plan]", 7, 4));
    // `{{ stages.implement.output... }}` in a prompt file, into the workflow.
    let prompt = dir.path().join("prompts/spider/defend.md.j2");
    let ptext = read(&prompt);
    let pu = c.open(&prompt, &ptext);
    let d = definition(&mut c, &pu, &ptext, "stages.implement.output", 9);
    assert_eq!(d["uri"], u);
    assert_eq!(d["range"], range_of(&text, "stages.implement]", 7, 9));
    // A param's use, to its definition.
    let d = definition(&mut c, &u, &text, "{{ params.spec_path", 12);
    assert_eq!(d["range"], range_of(&text, "[params.spec_path]", 8, 9));
    c.shutdown();
}

#[test]
fn definition_of_files_prompt_file_schema_and_a_built_in_preset() {
    let dir = project();
    let path = dir.path().join("workflows/spider.toml");
    let text = read(&path);
    let mut c = Client::start(dir.path());
    let u = c.open(&path, &text);
    let d = definition(&mut c, &u, &text, "prompt_file = \"specify.md.j2\"", 18);
    assert_eq!(
        d["uri"],
        uri(&dir.path().join("prompts/spider/specify.md.j2"))
    );
    let d = definition(&mut c, &u, &text, "schema = \"../schemas/spider-plan", 14);
    assert_eq!(
        d["uri"],
        uri(&dir.path().join("schemas/spider-plan.schema.json"))
    );

    // A workflow of the user's that extends a built-in preset by name.
    let mine = dir.path().join("mine.toml");
    let mtext = "name = \"mine\"\nextends = \"spider\"\n\n[overrides.review]\ntimeout = \"2h\"\n";
    std::fs::write(&mine, mtext).unwrap_or_else(|e| panic!("{e}"));
    let mu = c.open(&mine, mtext);
    assert_eq!(c.diagnostics(&mu), Vec::<Value>::new());
    let d = definition(&mut c, &mu, mtext, "\"spider\"", 2);
    let target = d["uri"]
        .as_str()
        .and_then(|s| s.strip_prefix("file://"))
        .unwrap_or_else(|| panic!("not a file: {d:#}"));
    assert!(!target.contains("<built-in>"), "{target}");
    let builtin = ralph_flow::fs::builtin_file(Path::new("/<built-in>/workflows/spider.toml"))
        .unwrap_or_else(|| panic!("no built-in spider"));
    assert_eq!(read(Path::new(target)), builtin);
    // An override names a stage of the preset: its definition is in that copy too.
    let d = definition(&mut c, &mu, mtext, "overrides.review", 11);
    assert_eq!(
        d["uri"].as_str().and_then(|s| s.strip_prefix("file://")),
        Some(target)
    );
    assert_eq!(slice(builtin, &d["range"]), "review");
    c.shutdown();
}

#[test]
fn references_of_a_stage_span_the_workflow_and_its_prompt_files() {
    let dir = project();
    let path = dir.path().join("workflows/spider.toml");
    let text = read(&path);
    let mut c = Client::start(dir.path());
    let u = c.open(&path, &text);
    let params = |include: bool| {
        let mut p = at(&u, &text, "needs = [\"implement\"]", 12);
        p["context"] = json!({"includeDeclaration": include});
        p
    };
    let all = c.request("textDocument/references", params(true));
    let all = all.as_array().cloned().unwrap_or_default();
    let mut by_file: BTreeMap<String, usize> = BTreeMap::new();
    for loc in &all {
        let u = loc["uri"].as_str().unwrap_or("").to_string();
        let file = read(Path::new(u.strip_prefix("file://").unwrap_or("")));
        assert_eq!(slice(&file, &loc["range"]), "implement", "{loc:#}");
        *by_file.entry(u).or_default() += 1;
    }
    let count = |p: &str| {
        read(&dir.path().join(p))
            .matches("stages.implement.")
            .count()
    };
    let prompt = |p: &str| uri(&dir.path().join(p));
    assert!(count("prompts/spider/defend.md.j2") >= 2);
    let want: BTreeMap<String, usize> = [
        (u.clone(), 2),
        (
            prompt("prompts/spider/defend.md.j2"),
            count("prompts/spider/defend.md.j2"),
        ),
        (
            prompt("prompts/spider/evaluate.md.j2"),
            count("prompts/spider/evaluate.md.j2"),
        ),
    ]
    .into_iter()
    .collect();
    assert_eq!(by_file, want, "{all:#?}");
    let uses = c.request("textDocument/references", params(false));
    assert_eq!(uses.as_array().map(Vec::len), Some(all.len() - 1));
    c.shutdown();
}

fn apply(text: &str, edits: &[Value]) -> String {
    apply_edits(text, edits)
}

#[test]
fn renaming_a_stage_renames_every_reference_and_checks_clean() {
    let dir = project();
    let path = dir.path().join("workflows/spider.toml");
    // A prompt file that reads the stage too.
    let plan = dir.path().join("prompts/spider/plan.md.j2");
    let ptext = format!(
        "{}\n{{% if stages.specify.ran %}}Spec summary: {{{{ stages[\"specify\"].output.summary }}}}{{% endif %}}\n",
        read(&plan)
    );
    std::fs::write(&plan, &ptext).unwrap_or_else(|e| panic!("{e}"));
    let text = read(&path);
    let mut c = Client::start(dir.path());
    let u = c.open(&path, &text);
    assert_eq!(c.diagnostics(&u), Vec::<Value>::new());

    let prep = c.request(
        "textDocument/prepareRename",
        at(&u, &text, "stages.specify.output", 9),
    );
    assert_eq!(prep, range_of(&text, "stages.specify.output", 7, 7));

    let mut p = at(&u, &text, "needs = [\"specify\"]", 12);
    p["newName"] = json!("draft_spec");
    let edit = c.request("textDocument/rename", p);
    let changes = edit["changes"]
        .as_object()
        .cloned()
        .unwrap_or_else(|| panic!("no changes: {edit:#}"));
    let plan_uri = uri(&plan);
    assert_eq!(
        {
            let mut k: Vec<String> = changes.keys().cloned().collect();
            k.sort();
            k
        },
        {
            let mut k = vec![u.clone(), plan_uri.clone()];
            k.sort();
            k
        },
        "{edit:#}"
    );
    for (file, edits) in &changes {
        let before = if *file == u {
            text.clone()
        } else {
            read(&plan)
        };
        for e in edits.as_array().into_iter().flatten() {
            assert_eq!(slice(&before, &e["range"]), "specify", "{e:#}");
            assert_eq!(e["newText"], "draft_spec");
        }
    }
    assert_eq!(changes[&u].as_array().map(Vec::len), Some(3));
    assert_eq!(changes[&plan_uri].as_array().map(Vec::len), Some(2));

    let renamed = apply(&text, changes[&u].as_array().map_or(&[], |v| v));
    assert!(renamed.contains("[stages.specify_loop.stages.draft_spec]"));
    assert!(renamed.contains("needs = [\"draft_spec\"]"));
    assert!(renamed.contains("stages.draft_spec.output.summary"));
    assert!(renamed.contains("[stages.specify_loop]"));
    let pnew = apply(&ptext, changes[&plan_uri].as_array().map_or(&[], |v| v));
    assert!(pnew.contains("stages.draft_spec.ran"));
    assert!(pnew.contains("stages[\"draft_spec\"].output"));
    // Applied, the workflow checks clean: the prompt file on disk, the workflow in the editor.
    std::fs::write(&plan, &pnew).unwrap_or_else(|e| panic!("{e}"));
    c.notify(
        "workspace/didChangeWatchedFiles",
        json!({"changes": [{"uri": plan_uri, "type": 2}]}),
    );
    c.replace(&u, &renamed);
    assert_eq!(c.diagnostics(&u), Vec::<Value>::new());
    // And the old name is gone: a reference to it is an error now.
    let stale = renamed.replacen("needs = [\"draft_spec\"]", "needs = [\"specify\"]", 1);
    c.replace(&u, &stale);
    assert!(c.codes(&u).contains(&"RF010".to_string()));
    c.shutdown();
}

#[test]
fn rename_refuses_a_bad_or_taken_name_and_what_is_not_a_stage() {
    let dir = project();
    let path = dir.path().join("workflows/spider.toml");
    let text = read(&path);
    let mut c = Client::start(dir.path());
    let u = c.open(&path, &text);
    let rename = |c: &mut Client, name: &str| {
        let mut p = at(&u, &text, "needs = [\"specify\"]", 12);
        p["newName"] = json!(name);
        c.try_request("textDocument/rename", p)
    };
    let taken = rename(&mut c, "plan").expect_err("a taken name");
    assert!(taken.contains("a stage `plan` already exists"), "{taken}");
    let bad = rename(&mut c, "9 lives").expect_err("a bad id");
    assert!(bad.contains("not a valid stage id"), "{bad}");
    let reserved = rename(&mut c, "stages").expect_err("a reserved word");
    assert!(reserved.contains("reserved"), "{reserved}");
    let dashed = rename(&mut c, "draft-spec").expect_err("a dash read by templates");
    assert!(dashed.contains("use `_`"), "{dashed}");
    assert!(rename(&mut c, "draft_spec").is_ok());
    // Not a stage: a key.
    let key = c.try_request(
        "textDocument/prepareRename",
        at(&u, &text, "prompt_file = \"specify", 3),
    );
    match key {
        Ok(v) => assert_eq!(v, Value::Null),
        Err(e) => assert!(e.contains("only stages can be renamed"), "{e}"),
    }
    c.shutdown();
}

#[test]
fn rename_refuses_to_change_a_built_in_preset() {
    let dir = project();
    let mine = dir.path().join("mine.toml");
    let mtext = "name = \"mine\"\nextends = \"spider\"\n\n[overrides.review]\ntimeout = \"2h\"\n";
    std::fs::write(&mine, mtext).unwrap_or_else(|e| panic!("{e}"));
    let mut c = Client::start(dir.path());
    let mu = c.open(&mine, mtext);
    let mut p = at(&mu, mtext, "overrides.review", 11);
    p["newName"] = json!("final_review");
    let err = c
        .try_request("textDocument/rename", p)
        .expect_err("the preset is not the user's");
    assert!(err.contains("built-in preset"), "{err}");
    c.shutdown();
}

#[test]
fn renaming_a_stage_in_kdl_renames_its_references_and_checks_clean() {
    let dir = project();
    let path = dir.path().join("workflows/wiggum-review.kdl");
    let text = read(&path);
    let mut c = Client::start(dir.path());
    let u = c.open(&path, &text);
    assert_eq!(c.diagnostics(&u), Vec::<Value>::new());
    let mut p = at(&u, &text, "stage \"review\"", 8);
    p["newName"] = json!("fresh_review");
    let edit = c.request("textDocument/rename", p);
    let edits = edit["changes"][&u].as_array().cloned().unwrap_or_default();
    assert!(edits.len() >= 8, "{edit:#}");
    for e in &edits {
        assert_eq!(slice(&text, &e["range"]), "review", "{e:#}");
    }
    let renamed = apply(&text, &edits);
    assert!(renamed.contains("stage \"fresh_review\" kind=\"agent\""));
    assert!(renamed.contains("needs \"fresh_review\""));
    assert!(renamed.contains("stages.fresh_review.output.issues"));
    assert!(renamed.contains("h.outputs.fresh_review.issues"));
    assert!(!renamed.contains("stages.review."), "{renamed}");
    assert!(renamed.contains("stage \"review_loop\""));
    c.replace(&u, &renamed);
    assert_eq!(c.diagnostics(&u), Vec::<Value>::new());
    c.shutdown();
}

#[test]
fn an_included_file_is_navigated_and_renamed_with_its_workflow() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let main = dir.path().join("w.toml");
    let part = dir.path().join("part.toml");
    let main_text = "name = \"w\"\ninclude = [\"part.toml\"]\n\n[stages.a]\nkind = \"command\"\nargv = [\"echo\", \"{{ stages.b.output.stdout }}\"]\nneeds = [\"b\"]\n";
    let part_text = "[stages.b]\nkind = \"command\"\nargv = [\"true\"]\n";
    std::fs::write(&main, main_text).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(&part, part_text).unwrap_or_else(|e| panic!("{e}"));
    let mut c = Client::start(dir.path());
    let mu = c.open(&main, main_text);
    assert_eq!(c.diagnostics(&mu), Vec::<Value>::new());
    // `include` to the file, a reference to the stage it defines.
    let d = definition(&mut c, &mu, main_text, "\"part.toml\"", 3);
    assert_eq!(d["uri"], uri(&part));
    let d = definition(&mut c, &mu, main_text, "needs = [\"b\"]", 10);
    assert_eq!(d["uri"], uri(&part));
    assert_eq!(d["range"], range_of(part_text, "stages.b]", 7, 1));
    // Renamed from its definition, in the part (not open) and in the workflow.
    let pu = uri(&part);
    let mut p = at(&mu, main_text, "needs = [\"b\"]", 10);
    p["newName"] = json!("build");
    let edit = c.request("textDocument/rename", p);
    assert_eq!(
        edit["changes"][&mu].as_array().map(Vec::len),
        Some(2),
        "{edit:#}"
    );
    assert_eq!(
        edit["changes"][&pu].as_array().map(Vec::len),
        Some(1),
        "{edit:#}"
    );
    let part_new = apply(
        part_text,
        edit["changes"][&pu].as_array().map_or(&[], |v| v),
    );
    assert_eq!(part_new, part_text.replace("stages.b]", "stages.build]"));
    c.shutdown();
}

#[test]
fn rename_leaves_raw_blocks_and_text_in_strings_alone() {
    let dir = project();
    let path = dir.path().join("workflows/spider.toml");
    let plan = dir.path().join("prompts/spider/plan.md.j2");
    // Literal text in a raw block; a real reference after a string that holds `}}`.
    let ptext = format!(
        "{}\n{{% raw %}}{{{{ stages.specify }}}}{{% endraw %}}\n{{{{ \"}}}}\" ~ stages.specify.output.summary }}}}\n",
        read(&plan)
    );
    std::fs::write(&plan, &ptext).unwrap_or_else(|e| panic!("{e}"));
    // A header-like line inside a multi-line string is text.
    let text = read(&path).replacen(
        "description = \"Reviews the whole change against the spec and writes the review document.\"",
        "description = \"\"\"\nReviews the change; see\n[stages.specify_loop.stages.specify]\n\"\"\"",
        1,
    );
    assert!(text.contains("\n[stages.specify_loop.stages.specify]\n\"\"\""));
    let mut c = Client::start(dir.path());
    let u = c.open(&path, &text);
    assert_eq!(c.diagnostics(&u), Vec::<Value>::new());
    let mut p = at(&u, &text, "needs = [\"specify\"]", 12);
    p["newName"] = json!("draft_spec");
    let edit = c.request("textDocument/rename", p);
    let renamed = apply(&text, edit["changes"][&u].as_array().map_or(&[], |v| v));
    assert!(
        renamed.contains("see\n[stages.specify_loop.stages.specify]\n\"\"\""),
        "the string's text was renamed:\n{renamed}"
    );
    assert!(renamed.contains("[stages.specify_loop.stages.draft_spec]\n"));
    let plan_uri = uri(&plan);
    let pnew = apply(
        &ptext,
        edit["changes"][&plan_uri].as_array().map_or(&[], |v| v),
    );
    assert!(
        pnew.contains("{% raw %}{{ stages.specify }}{% endraw %}"),
        "a raw block was renamed:\n{pnew}"
    );
    assert!(
        pnew.contains("{{ \"}}\" ~ stages.draft_spec.output.summary }}"),
        "the reference after a string holding `}}` was missed:\n{pnew}"
    );
    c.shutdown();
}
