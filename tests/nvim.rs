//! `ralph-flow lsp` in a real editor: Neovim's built-in LSP client, headless (Debian's
//! `neovim`). Neovim starts with the README's set-up (`tests/nvim/init.lua`, which starts the
//! binary this test builds) and runs `tests/nvim/drive.lua`, which opens the SPIDER preset
//! and a broken copy of it in a copy of the presets, types, asks for a completion, a hover, a
//! go-to-definition, the outline and a rename through the client's own commands and
//! handlers, and writes what Neovim shows to a JSON file. Each test here judges one part of
//! it; Neovim runs once for all of them.
//!
//! Without `nvim` the tests say SKIPPED (CI installs Neovim and sets
//! RALPH_FLOW_REQUIRE_NVIM=1, which makes a missing Neovim fail). Neovim is killed after
//! [`PATIENCE`], and the test fails with its output and how far it came.

mod common;

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

const REQUIRE: &str = "RALPH_FLOW_REQUIRE_NVIM";
/// How long the whole Neovim session may take (a normal one takes a few seconds).
const PATIENCE: Duration = Duration::from_secs(90);

/// What Neovim saw: `Ok(None)` when Neovim is not installed (and not required).
static SESSION: OnceLock<Result<Option<Value>, String>> = OnceLock::new();

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The session's record, run once for every test; `None` means skipped.
fn session() -> Option<&'static Value> {
    match SESSION.get_or_init(run_session) {
        Ok(v) => v.as_ref(),
        Err(e) => panic!("{e}"),
    }
}

/// One step's record, failing the test with the error that stopped the step.
fn step<'a>(s: &'a Value, name: &str) -> &'a Value {
    let r = &s["steps"][name];
    assert!(r.is_object(), "step `{name}` did not run: {s:#}");
    if let Some(e) = r.get("error") {
        panic!(
            "step `{name}` failed in Neovim: {e}\nwhat it saw: {r:#}\n{}",
            told(s)
        );
    }
    r
}

/// What Neovim showed in its message area and what the server logged.
fn told(s: &Value) -> String {
    format!(
        "Neovim's messages: {}\nthe server's log: {}",
        s["notifications"], s["log"]
    )
}

/// A missing Neovim: a visible skip (past the test harness's capture), or an error under
/// RALPH_FLOW_REQUIRE_NVIM=1.
fn skip(why: &str) -> Result<Option<Value>, String> {
    let message = format!("SKIPPED: {why} (install Debian's neovim, 0.7 or later)");
    if std::env::var(REQUIRE).is_ok_and(|v| v == "1") {
        return Err(format!("{message} [{REQUIRE}=1]"));
    }
    let _ = writeln!(std::io::stderr(), "{message}");
    Ok(None)
}

fn on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// `(major, minor)` from `nvim --version`'s first line, `NVIM v0.7.2`.
fn version(nvim: &Path) -> Option<(u32, u32)> {
    let out = Command::new(nvim).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text.lines().next()?.strip_prefix("NVIM v")?;
    let mut parts = v.split(['.', '-']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The broken copy of spider.toml the session opens: a need that names no stage.
fn broken_spider() -> String {
    let text = read(&repo().join("workflows/spider.toml"));
    let broken = text.replacen("needs = [\"specify\"]", "needs = [\"specfy\"]", 1);
    assert_ne!(broken, text, "spider.toml changed: fix the test's typo");
    broken
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn run_session() -> Result<Option<Value>, String> {
    let Some(nvim) = on_path("nvim") else {
        return skip("no `nvim` on PATH");
    };
    match version(&nvim) {
        Some(v) if v >= (0, 7) => {}
        Some((major, minor)) => return skip(&format!("nvim is {major}.{minor}")),
        None => return skip("`nvim --version` says no version"),
    }
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let root = dir.path().canonicalize().map_err(|e| e.to_string())?;
    for sub in ["workflows", "prompts", "schemas"] {
        common::copy_dir(&repo().join(sub), &root.join(sub));
    }
    std::fs::write(root.join("workflows/spider-broken.toml"), broken_spider())
        .map_err(|e| e.to_string())?;
    let out = root.join("observed.json");
    let home = root.join("home");
    // The README's set-up runs `ralph-flow` from PATH: this test's build of it.
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_ralph-flow"));
    let mut path = vec![bin.parent().map(Path::to_path_buf).unwrap_or_default()];
    path.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let path = std::env::join_paths(path).map_err(|e| e.to_string())?;
    let mut child = Command::new(&nvim)
        .args(["--headless", "--clean", "-i", "NONE", "-n", "-u"])
        .arg(repo().join("tests/nvim/init.lua"))
        .arg("-c")
        .arg(format!(
            "luafile {}",
            repo().join("tests/nvim/drive.lua").display()
        ))
        .current_dir(&root)
        .env("PATH", path)
        .env("RF_NVIM_ROOT", &root)
        .env("RF_NVIM_OUT", &out)
        // Neovim's own files (the LSP log, swap, state) stay in the temporary directory.
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("XDG_DATA_HOME", home.join("data"))
        .env("XDG_STATE_HOME", home.join("state"))
        .env("XDG_CACHE_HOME", home.join("cache"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", nvim.display()))?;
    let drain = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let _ = r.read_to_string(&mut s);
            }
            s
        })
    };
    let stdout = drain(child.stdout.take().map(|s| Box::new(s) as _));
    let stderr = drain(child.stderr.take().map(|s| Box::new(s) as _));
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() > PATIENCE => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(format!("waiting for nvim: {e}")),
        }
    };
    let output = format!(
        "stdout:\n{}\nstderr:\n{}",
        stdout.join().unwrap_or_default(),
        stderr.join().unwrap_or_default()
    );
    let observed = std::fs::read_to_string(&out).unwrap_or_default();
    let Some(status) = status else {
        return Err(format!(
            "nvim did not finish within {PATIENCE:?} (killed)\n{output}\nwhat it observed: {observed}"
        ));
    };
    if !status.success() {
        return Err(format!(
            "nvim ended with {status}\n{output}\nwhat it observed: {observed}"
        ));
    }
    let v: Value = serde_json::from_str(&observed)
        .map_err(|e| format!("nvim wrote no record ({e}): {observed}\n{output}"))?;
    Ok(Some(v))
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// A JSON list; Neovim's `json_encode` writes an empty Lua table as `[]`.
fn list(v: &Value) -> &[Value] {
    v.as_array().map_or(&[], Vec::as_slice)
}

/// The 0-based line and byte column of `needle` in `text`.
fn line_col(text: &str, needle: &str) -> (u64, u64) {
    let at = text
        .find(needle)
        .unwrap_or_else(|| panic!("`{needle}` is not in the text"));
    let before = &text[..at];
    let line = before.matches('\n').count();
    let col = at - before.rfind('\n').map_or(0, |i| i + 1);
    (line as u64, col as u64)
}

#[test]
fn diagnostics_show_none_in_the_preset_and_the_typo_where_it_is_typed() {
    let Some(s) = session() else { return };
    let start = step(s, "start");
    assert_eq!(start["client"], "ralph-flow", "{start:#}");
    assert_eq!(
        start["attached"], true,
        "the init.lua did not attach the server: {start:#}"
    );
    assert_eq!(
        start["published"], true,
        "no diagnostics arrived for spider.toml: {start:#}"
    );
    let d = step(s, "diagnostics");
    assert_eq!(
        list(&d["preset"]),
        &[] as &[Value],
        "the shipped preset shows diagnostics"
    );
    assert_eq!(d["broken_published"], true, "{d:#}");
    let broken = list(&d["broken"]);
    let typo = broken
        .iter()
        .find(|x| x["code"] == "RF010")
        .unwrap_or_else(|| panic!("no RF010 in the broken copy: {d:#}"));
    let (line, col) = line_col(&broken_spider(), "\"specfy\"");
    assert_eq!(
        (typo["lnum"].as_u64(), typo["col"].as_u64()),
        (Some(line), Some(col)),
        "{typo:#}"
    );
    assert_eq!(typo["end_col"].as_u64(), Some(col + 8), "{typo:#}");
    assert_eq!(typo["severity"], 1, "an error: {typo:#}");
    let message = typo["message"].as_str().unwrap_or("");
    assert!(message.contains("there is no stage `specfy`"), "{message}");
    assert!(message.contains("did you mean `specify`?"), "{message}");
    // Fixed by typing in the buffer: the diagnostics go away without a save.
    assert_eq!(d["fixed_cleared"], true, "{d:#}");
    assert_eq!(list(&d["fixed"]), &[] as &[Value]);
    assert_eq!(list(&d["preset_after"]), &[] as &[Value]);
    assert!(
        list(&s["log"]).is_empty(),
        "the server logged: {:#}",
        s["log"]
    );
}

#[test]
fn completion_inside_stages_dot_in_a_prompt_file_offers_the_stages() {
    let Some(s) = session() else { return };
    let c = step(s, "completion");
    assert_eq!(
        c["published"], true,
        "no diagnostics arrived for review.md.j2: {c:#}"
    );
    assert!(c.get("request_error").is_none(), "{c:#}");
    let words = strings(&c["words"]);
    for stage in ["specify", "plan", "phases"] {
        assert!(
            words.contains(&stage),
            "`{stage}` is not offered: {c:#}\n{}",
            told(s)
        );
    }
    assert_eq!(list(&c["diagnostics_before"]), &[] as &[Value], "{c:#}");
    assert_eq!(list(&c["diagnostics_after"]), &[] as &[Value], "{c:#}");
}

#[test]
fn hover_on_a_stage_reference_shows_the_stage() {
    let Some(s) = session() else { return };
    let h = step(s, "hover");
    assert_eq!(h["shown"], true, "no hover window opened\n{}", told(s));
    let text = strings(&h["lines"]).join("\n");
    // The stage's name, its kind, and its output's fields (from its schema).
    for needle in ["specify", "agent", "summary"] {
        assert!(text.contains(needle), "the hover lacks `{needle}`:\n{text}");
    }
}

#[test]
fn references_of_a_stage_list_the_workflow_and_its_prompt_files() {
    let Some(s) = session() else { return };
    let r = step(s, "references");
    let list = list(&r["list"]);
    let files: Vec<&str> = list.iter().filter_map(|i| i["file"].as_str()).collect();
    // `implement`: its definition and the need of the defend loop...
    assert!(
        files
            .iter()
            .filter(|f| f.ends_with("/workflows/spider.toml"))
            .count()
            >= 2,
        "{r:#}\n{}",
        told(s)
    );
    // ...and the prompt files that read its output.
    for prompt in [
        "/prompts/spider/defend.md.j2",
        "/prompts/spider/evaluate.md.j2",
    ] {
        assert!(
            files.iter().any(|f| f.ends_with(prompt)),
            "{prompt} is not among the references: {r:#}"
        );
    }
    assert!(
        files.len() >= 6,
        "fewer references than spider and its prompts write (6): {r:#}"
    );
    for item in list {
        let text = item["text"].as_str().unwrap_or("");
        assert!(
            text.contains("implement"),
            "a reference on a line without the name: {item}"
        );
    }
}

#[test]
fn a_code_action_fixes_a_typo_as_neovim_applies_it() {
    let Some(s) = session() else { return };
    let a = step(s, "code_action");
    assert_eq!(a["diagnosed"], true, "the typo was not reported: {a:#}");
    let titles = strings(&a["titles"]);
    assert!(
        titles.iter().any(|t| t.contains("plan")),
        "no fix offered for `plna`: {a:#}\n{}",
        told(s)
    );
    assert_eq!(a["cleared"], true, "the diagnostic stayed: {a:#}");
    assert_eq!(
        a["restored"], true,
        "the text is not the preset's again: {a:#}"
    );
}

#[test]
fn go_to_definition_from_prompt_file_opens_the_prompt() {
    let Some(s) = session() else { return };
    let d = step(s, "definition");
    assert_eq!(
        d["jumped"],
        true,
        "the cursor stayed in spider.toml: {d:#}\n{}",
        told(s)
    );
    let file = d["file"].as_str().unwrap_or("");
    assert!(file.ends_with("/prompts/spider/specify.md.j2"), "{file}");
    assert_eq!(
        (d["line"].as_u64(), d["col"].as_u64()),
        (Some(0), Some(0)),
        "{d:#}"
    );
    assert_eq!(d["attached"], true, "the prompt file is served too: {d:#}");
}

#[test]
fn rename_of_a_stage_changes_the_workflow_and_its_prompt_files() {
    let Some(s) = session() else { return };
    let r = step(s, "rename");
    assert_eq!(r["applied"], true, "the buffer did not change\n{}", told(s));
    let original = read(&repo().join("workflows/spider.toml"));
    let expected = original
        .replace(
            "[stages.phases.stages.phase_loop.stages.implement]",
            "[stages.phases.stages.phase_loop.stages.build]",
        )
        .replace("needs = [\"implement\"]", "needs = [\"build\"]");
    assert_eq!(
        r["workflow"].as_str().unwrap_or(""),
        expected.trim_end_matches('\n'),
        "spider.toml after the rename"
    );
    for rel in [
        "prompts/spider/defend.md.j2",
        "prompts/spider/evaluate.md.j2",
    ] {
        let original = read(&repo().join(rel));
        assert!(
            original.contains("stages.implement."),
            "{rel} changed: fix the test"
        );
        let expected = original.replace("stages.implement.", "stages.build.");
        assert_eq!(
            r["prompts"][rel].as_str().unwrap_or(""),
            expected.trim_end_matches('\n'),
            "{rel} after the rename"
        );
        assert_eq!(r["attached"][rel], true, "{rel} is not attached: {r:#}");
    }
    assert!(
        r["on_disk"]
            .as_str()
            .unwrap_or("")
            .contains("stages.build.output.summary"),
        "`:wall` wrote the renamed prompt: {r:#}"
    );
    assert_eq!(list(&r["diagnostics_unsaved"]), &[] as &[Value], "{r:#}");
    assert_eq!(list(&r["diagnostics_saved"]), &[] as &[Value], "{r:#}");
}

/// The node named `name` anywhere in an outline.
fn find<'a>(tree: &'a Value, name: &str) -> Option<&'a Value> {
    list(tree).iter().find_map(|n| {
        if n["name"] == name {
            Some(n)
        } else {
            find(&n["children"], name)
        }
    })
}

fn child_names(node: &Value) -> Vec<&str> {
    list(&node["children"])
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect()
}

#[test]
fn document_symbols_outline_the_stages_nested() {
    let Some(s) = session() else { return };
    let o = step(s, "symbols");
    assert!(o.get("request_error").is_none(), "{o:#}");
    let tree = &o["tree"];
    let node = |name: &str| {
        find(tree, name).unwrap_or_else(|| panic!("no `{name}` in the outline: {o:#}\n{}", told(s)))
    };
    assert_eq!(
        child_names(node("specify_loop")),
        ["specify", "approve_spec"]
    );
    assert_eq!(child_names(node("plan_loop")), ["plan", "approve_plan"]);
    assert_eq!(child_names(node("phases")), ["phase_loop"]);
    assert_eq!(
        child_names(node("phase_loop")),
        ["implement", "defend", "evaluate"]
    );
    assert_eq!(child_names(node("defend")), ["write_tests", "tests"]);
    assert!(find(tree, "review").is_some(), "{tree:#}");
    // The stage's line is where it is defined.
    let spider = read(&repo().join("workflows/spider.toml"));
    let (line, _) = line_col(&spider, "[stages.phases.stages.phase_loop.stages.defend]");
    assert_eq!(node("defend")["line"].as_u64(), Some(line), "{tree:#}");
    // What `:lua vim.lsp.buf.document_symbol()` lists.
    let listed = strings(&o["list"]);
    assert!(
        listed.iter().any(|t| t.contains("write_tests")),
        "{listed:?}"
    );
}

/// README's Neovim set-up is the init.lua this test runs.
#[test]
fn the_readme_shows_the_tested_neovim_set_up() {
    let init = read(&repo().join("tests/nvim/init.lua"));
    let body: String = init
        .lines()
        .skip_while(|l| l.starts_with("--"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(body.len() > 200, "{body}");
    let readme = read(&repo().join("README.md"));
    assert!(
        readme.contains(&body),
        "README.md's Neovim set-up differs from tests/nvim/init.lua; copy it over:\n{body}"
    );
}
