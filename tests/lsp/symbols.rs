//! Document symbols: the stages as a nested outline, each symbol's range its whole text in
//! the document and its selection range its id, inside it.

use serde_json::{Value, json};

use crate::client::{Client, position_of, project};

fn symbols(c: &mut Client, uri: &str) -> Vec<Value> {
    let answer = c.request(
        "textDocument/documentSymbol",
        json!({"textDocument": {"uri": uri}}),
    );
    answer
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("no list of symbols: {answer}"))
}

fn pos(p: &Value) -> (u64, u64) {
    (
        p["line"].as_u64().unwrap_or(u64::MAX),
        p["character"].as_u64().unwrap_or(u64::MAX),
    )
}

/// The (line, character) just past the end of `text`.
fn end_of(text: &str) -> (u64, u64) {
    let line = text.matches('\n').count() as u64;
    let last = &text[text.rfind('\n').map_or(0, |i| i + 1)..];
    (line, last.encode_utf16().count() as u64)
}

/// Checks what the protocol requires of every symbol (and what an outline needs): ranges
/// within the text, the selection inside the range, children inside their parent.
fn check_ranges(text: &str, list: &[Value], parent: Option<&Value>) {
    let end = end_of(text);
    for s in list {
        let (start, stop) = (pos(&s["range"]["start"]), pos(&s["range"]["end"]));
        let (sel_start, sel_stop) = (
            pos(&s["selectionRange"]["start"]),
            pos(&s["selectionRange"]["end"]),
        );
        assert!(start <= stop && stop <= end, "range beyond the text: {s:#}");
        assert!(
            start <= sel_start && sel_start <= sel_stop && sel_stop <= stop,
            "selection outside the range: {s:#}"
        );
        if let Some(p) = parent {
            assert!(
                pos(&p["range"]["start"]) <= start && stop <= pos(&p["range"]["end"]),
                "{} lies outside {}",
                s["name"],
                p["name"]
            );
        }
        if let Some(children) = s["children"].as_array() {
            check_ranges(text, children, Some(s));
        }
    }
}

/// The outline as nested names: `name(child, child(...))`.
fn shape(list: &[Value]) -> String {
    list.iter()
        .map(|s| {
            let name = s["name"].as_str().unwrap_or("?").to_string();
            match s["children"].as_array() {
                Some(c) if !c.is_empty() => format!("{name}({})", shape(c)),
                _ => name,
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn find<'a>(list: &'a [Value], name: &str) -> &'a Value {
    fn walk<'a>(list: &'a [Value], name: &str) -> Option<&'a Value> {
        for s in list {
            if s["name"] == name {
                return Some(s);
            }
            if let Some(found) = s["children"].as_array().and_then(|c| walk(c, name)) {
                return Some(found);
            }
        }
        None
    }
    walk(list, name).unwrap_or_else(|| panic!("no symbol `{name}` in {}", shape(list)))
}

/// The zero-based line of the first occurrence of `needle`.
fn line_of(text: &str, needle: &str) -> u64 {
    position_of(text, needle, 0)["line"]
        .as_u64()
        .unwrap_or(u64::MAX)
}

#[test]
fn spider_toml_is_outlined_as_its_stages_nest() {
    let dir = project();
    let path = dir.path().join("workflows/spider.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
    let mut c = Client::start(dir.path());
    let uri = c.open(&path, &text);
    let list = symbols(&mut c, &uri);
    check_ranges(&text, &list, None);
    let stages: Vec<Value> = list
        .iter()
        .filter(|s| !["params", "agents", "exits"].contains(&s["name"].as_str().unwrap_or("")))
        .cloned()
        .collect();
    assert_eq!(
        shape(&stages),
        "specify_loop(specify, approve_spec), plan_loop(plan, approve_plan), \
         phases(phase_loop(implement, defend(write_tests, tests), evaluate)), review"
    );
    let names: Vec<&str> = list.iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "params",
            "agents",
            "exits",
            "specify_loop",
            "plan_loop",
            "phases",
            "review"
        ]
    );
    assert_eq!(
        shape(&[find(&list, "agents").clone()]),
        "agents(claude, codex)"
    );
    // Kinds: a loop a namespace, a fan-out an array, an agent stage a function, a gate an
    // event, a check an operator; the detail is the kind and the agent.
    let kind = |name: &str| find(&list, name)["kind"].as_u64().unwrap_or(0);
    assert_eq!(kind("specify_loop"), 3);
    assert_eq!(kind("phases"), 18);
    assert_eq!(kind("specify"), 12);
    assert_eq!(kind("approve_spec"), 24);
    assert_eq!(kind("tests"), 25);
    assert_eq!(
        find(&list, "specify")["detail"],
        "agent · {{ params.author_backend }}"
    );
    assert_eq!(find(&list, "approve_spec")["detail"], "gate");
    // A loop's range: from its header to the last line of its body's last stage.
    let specify_loop = find(&list, "specify_loop");
    assert_eq!(
        specify_loop["range"]["start"],
        position_of(&text, "[stages.specify_loop]", 0)
    );
    let end_line = line_of(&text, "on_timeout = \"exit:gate_timeout\"");
    assert_eq!(specify_loop["range"]["end"]["line"], end_line);
    assert_eq!(
        specify_loop["selectionRange"]["start"],
        position_of(&text, "specify_loop]", 0)
    );
    // A stage's own: its header's id.
    let specify = find(&list, "specify");
    assert_eq!(
        specify["selectionRange"]["start"],
        position_of(&text, "specify]", 0)
    );
    assert_eq!(
        specify["range"]["start"],
        position_of(&text, "[stages.specify_loop.stages.specify]", 0)
    );
    // The comment heading the next part is not the stage's.
    let review = find(&list, "review");
    assert_eq!(
        review["range"]["end"]["line"],
        end_of(text.trim_end()).0,
        "{review:#}"
    );
    let phases = find(&list, "phases");
    assert!(
        pos(&phases["range"]["end"]) < pos(&review["range"]["start"]),
        "{phases:#}"
    );
    c.shutdown();
}

#[test]
fn council_kdl_is_outlined_as_its_stages_nest() {
    let dir = project();
    let path = dir.path().join("workflows/council.kdl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
    let mut c = Client::start(dir.path());
    let uri = c.open(&path, &text);
    let list = symbols(&mut c, &uri);
    check_ranges(&text, &list, None);
    let stages: Vec<Value> = list
        .iter()
        .filter(|s| !["params", "agents", "exits"].contains(&s["name"].as_str().unwrap_or("")))
        .cloned()
        .collect();
    assert_eq!(
        shape(&stages),
        "attempts(snapshot, gather, analysis(analyze_fast, analyze_wide), oracle, \
         council(council_alternatives, council_patch, council_plan), implement, \
         record_learnings, tests, review), block"
    );
    let attempts = find(&list, "attempts");
    assert_eq!(
        attempts["range"]["start"],
        position_of(&text, "stage \"attempts\"", 0)
    );
    // Its block's closing brace: the line before `stage "block"`'s blank line.
    assert_eq!(
        attempts["range"]["end"]["line"],
        line_of(&text, "stage \"block\"") - 2
    );
    assert_eq!(
        attempts["selectionRange"]["start"],
        position_of(&text, "\"attempts\"", 0)
    );
    assert_eq!(find(&list, "analysis")["kind"], 23);
    // The stage `oracle`, not the agent of that name.
    assert_eq!(
        find(std::slice::from_ref(attempts), "oracle")["detail"],
        "agent · oracle"
    );
    assert_eq!(
        find(std::slice::from_ref(find(&list, "agents")), "oracle")["detail"],
        "codex · gpt-5.2"
    );
    assert_eq!(
        shape(&[find(&list, "agents").clone()]),
        "agents(claude, gemini, codex, oracle, deep_claude)"
    );
    assert_eq!(
        shape(&[find(&list, "exits").clone()]),
        "exits(success, blocked)"
    );
    c.shutdown();
}

#[test]
fn a_workflow_that_extends_a_preset_shows_its_own_stages_and_overrides() {
    let dir = project();
    let path = dir.path().join("workflows/mine.toml");
    let text = "name = \"mine\"\nextends = \"spider.toml\"\n\n[overrides.review]\ntimeout = \"15m\"\n\n[stages.publish]\nkind = \"command\"\nneeds = [\"phases\"]\nargv = [\"true\"]\n";
    let mut c = Client::start(dir.path());
    let uri = c.open(&path, text);
    assert_eq!(c.diagnostics(&uri), Vec::<Value>::new());
    let list = symbols(&mut c, &uri);
    check_ranges(text, &list, None);
    assert_eq!(shape(&list), "overrides(review), publish");
    assert_eq!(
        find(&list, "review")["detail"],
        "override of an agent stage"
    );
    assert_eq!(find(&list, "publish")["detail"], "command");
    // The same in KDL.
    let path = dir.path().join("workflows/mine.kdl");
    let text = "name \"mine\"\nextends \"council.kdl\"\n\noverride \"review\" timeout=\"15m\"\n\nstage \"publish\" kind=\"command\" {\n    needs \"attempts\"\n    argv \"true\"\n}\n";
    let uri = c.open(&path, text);
    assert_eq!(c.diagnostics(&uri), Vec::<Value>::new());
    let list = symbols(&mut c, &uri);
    check_ranges(text, &list, None);
    assert_eq!(shape(&list), "overrides(review), publish");
    c.shutdown();
}

#[test]
fn a_file_that_does_not_parse_gets_no_range_beyond_its_text() {
    let dir = project();
    let mut c = Client::start(dir.path());
    for name in ["council.kdl", "spider.toml"] {
        let path = dir.path().join("workflows").join(name);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
        let uri = c.open(&path, &text);
        assert!(!symbols(&mut c, &uri).is_empty());
        // Cut in the middle of a block, then shorter and shorter.
        for keep in [
            text.len() * 2 / 3,
            text.len() / 2,
            text.len() / 3 + 7,
            10,
            0,
        ] {
            let mut keep = keep;
            while !text.is_char_boundary(keep) {
                keep -= 1;
            }
            let cut = &text[..keep];
            c.replace(&uri, cut);
            let list = symbols(&mut c, &uri);
            check_ranges(cut, &list, None);
        }
    }
    c.shutdown();
}

#[test]
fn a_toml_file_that_does_not_parse_is_outlined_from_its_headers() {
    let dir = project();
    let path = dir.path().join("workflows/spider.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
    // Half-typed: an array left open, and a header of a new stage.
    let broken = text.replacen("needs = [\"plan_loop\"]", "needs = [\"plan_loop\"", 1);
    assert!(broken != text);
    let broken = format!("{broken}\n[stages.review.stages.x\n");
    let mut c = Client::start(dir.path());
    let uri = c.open(&path, &broken);
    assert!(c.codes(&uri).contains(&"RF001".to_string()));
    let list = symbols(&mut c, &uri);
    check_ranges(&broken, &list, None);
    assert_eq!(
        shape(&list),
        "specify_loop(specify, approve_spec), plan_loop(plan, approve_plan), \
         phases(phase_loop(implement, defend(write_tests, tests), evaluate)), review(x)"
    );
    assert_eq!(find(&list, "approve_spec")["kind"], 24);
    assert_eq!(
        find(&list, "specify")["selectionRange"]["start"],
        position_of(&broken, "specify]", 0)
    );
    c.shutdown();
}

#[test]
fn a_stage_written_as_an_inline_table_covers_its_key() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("w.toml");
    let text = "name = \"w\"\n\n[stages]\na = { kind = \"command\", argv = [\"true\"] }\n";
    let mut c = Client::start(dir.path());
    let uri = c.open(&path, text);
    assert_eq!(c.diagnostics(&uri), Vec::<Value>::new());
    let list = symbols(&mut c, &uri);
    check_ranges(text, &list, None);
    assert_eq!(shape(&list), "a");
    assert_eq!(list[0]["range"]["start"], position_of(text, "a = {", 0));
    assert_eq!(list[0]["range"]["end"], position_of(text, "] }", 3));
    assert_eq!(
        list[0]["selectionRange"]["start"],
        position_of(text, "a = {", 0)
    );
    assert_eq!(
        list[0]["selectionRange"]["end"],
        position_of(text, "a = {", 1)
    );
    c.shutdown();
}
