//! Sharing presets: built-in presets by name, installed preset directories, the prompt search
//! path, git sources pinned in ralph-flow.lock (against local repositories: no network), and
//! the `presets` and `init` commands.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;

use common::{Out, Project};

/// A preset directory laid out like the built-in one: a workflow with a `command` agent
/// running the scripted fake, its prompts under prompts/base/.
fn preset_dir(root: &Path, prompt_text: &str) {
    let w = r#"name = "base"
description = "A small preset for tests: one drafted answer, then a check."
prompt_path = ["../prompts/base"]

[params.topic]
type = "string"
default = "ducks"
description = "What to write about."

[params.tries]
type = "int"
default = 2

[agents.writer]
kind = "command"
command = ["scripted"]

[stages.draft]
kind = "agent"
agent = "writer"
prompt_file = "draft.md.j2"
timeout = "1m"

[stages.verify]
kind = "command"
needs = ["draft"]
argv = ["sh", "-c", "printf 'verified: %s' \"$DRAFT\""]
env = { DRAFT = "{{ stages.draft.output.text }}" }
"#;
    std::fs::create_dir_all(root.join("workflows")).unwrap();
    std::fs::create_dir_all(root.join("prompts/base")).unwrap();
    std::fs::write(root.join("workflows/base.toml"), w).unwrap();
    std::fs::write(root.join("prompts/base/draft.md.j2"), prompt_text).unwrap();
    std::fs::write(
        root.join("prompts/base/notes.md.j2"),
        "unused prompt of the preset\n",
    )
    .unwrap();
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn ok(out: &Out) {
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
}

fn run_env(p: &Project, args: &[&str], cache: &str) -> Out {
    p.run_env(
        args,
        &[
            ("RALPH_FLOW_CACHE_DIR", cache),
            ("RALPH_FLOW_PRESET_PATH", ""),
            ("XDG_CONFIG_HOME", cache),
        ],
    )
}

#[test]
fn a_builtin_preset_is_extended_by_name_and_a_misspelt_one_is_reported() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        "name = \"mine\"\nextends = { workflow = \"wiggum-review\", params = { max_iterations = 2 } }\n\n[overrides.review]\ntimeout = \"5m\"\n",
    );
    let out = p.run(&["check", "w.toml"]);
    ok(&out);
    p.workflow("bad.toml", "name = \"mine\"\nextends = \"wigum-review\"\n");
    let out = p.run(&["check", "bad.toml"]);
    assert_eq!(out.code, 3);
    assert!(out.stderr.contains("bad.toml:2:11"), "{}", out.stderr);
    assert!(out.stderr.contains("there is no preset `wigum-review`"));
    assert!(
        out.stderr.contains("did you mean `wiggum-review`?"),
        "{}",
        out.stderr
    );
    // Overriding a stage the preset lacks is an error, as with a base file.
    p.workflow(
        "over.toml",
        "name = \"mine\"\nextends = \"spider\"\n\n[overrides.specfy]\ntimeout = \"5m\"\n",
    );
    let out = p.run(&["check", "over.toml", "--format", "short"]);
    assert_eq!(out.code, 3);
    assert!(out.stderr.contains("RF056"), "{}", out.stderr);
    assert!(
        out.stderr.contains("did you mean `specify`?"),
        "{}",
        out.stderr
    );
    // A preset's name works where a file is expected.
    ok(&p.run(&["check", "spider"]));
    let out = p.run(&["explain", "council"]);
    ok(&out);
    assert!(out.stdout.contains("Workflow `council`"));
}

#[test]
fn installed_presets_with_prompt_search_path_params_and_overrides_run_end_to_end() {
    let p = Project::new();
    let presets = tempfile::tempdir().unwrap();
    preset_dir(presets.path(), "Write about {{ params.topic }}.\n");
    let env = [
        ("RALPH_FLOW_PRESET_PATH", presets.path().to_str().unwrap()),
        ("XDG_CONFIG_HOME", "/nonexistent"),
    ];
    // The project replaces one prompt by putting it in its own prompt directory, sets a
    // param, overrides a limit and adds a stage.
    p.workflow(
        "workflows/ours.toml",
        r#"name = "ours"
prompt_path = ["../prompts/ours"]
extends = { workflow = "base", params = { topic = "geese" } }

[overrides.draft]
timeout = "2m"
retries = 0

[stages.announce]
kind = "command"
needs = ["verify"]
argv = ["echo", "announced"]
"#,
    );
    p.write(
        "prompts/ours/draft.md.j2",
        "OUR PROMPT: {{ params.topic }} in verse.\n",
    );
    p.answer("draft", 1, "a goose poem");
    let out = p.run_env(&["run", "workflows/ours.toml", "--json"], &env);
    ok(&out);
    assert_eq!(p.prompt("draft", 1).trim(), "OUR PROMPT: geese in verse.");
    let status = p.run_env(&["status", "--json"], &env);
    let text = status.stdout;
    assert!(text.contains("verified: a goose poem"), "{text}");
    assert!(text.contains("announced"), "{text}");

    // Without the project's prompt the preset's own is used.
    std::fs::remove_file(p.dir().join("prompts/ours/draft.md.j2")).unwrap();
    p.answer("draft", 2, "another");
    ok(&p.run_env(&["run", "workflows/ours.toml"], &env));
    assert_eq!(p.prompt("draft", 2).trim(), "Write about geese.");

    // RALPH_FLOW_PROMPT_PATH comes before every prompt_path.
    p.write("elsewhere/draft.md.j2", "FROM THE ENVIRONMENT\n");
    p.answer("draft", 3, "third");
    let prompt_env = p.dir().join("elsewhere");
    let mut env3 = env.to_vec();
    env3.push(("RALPH_FLOW_PROMPT_PATH", prompt_env.to_str().unwrap()));
    ok(&p.run_env(&["run", "workflows/ours.toml"], &env3));
    assert_eq!(p.prompt("draft", 3).trim(), "FROM THE ENVIRONMENT");

    // An installed preset comes before a built-in one of the same name.
    std::fs::write(
        presets.path().join("spider.toml"),
        std::fs::read_to_string(presets.path().join("workflows/base.toml"))
            .unwrap()
            .replace("name = \"base\"", "name = \"spider\"")
            .replace("../prompts/base", "prompts/base"),
    )
    .unwrap();
    let out = p.run_env(&["explain", "spider"], &env);
    ok(&out);
    assert!(
        out.stdout.contains("A small preset for tests"),
        "{}",
        out.stdout
    );

    // `presets` lists the installed presets with their description and params, before the
    // built-in ones, and says which built-in one is shadowed.
    let list = p.run_env(&["presets", "--json"], &env);
    ok(&list);
    let entries = list.json.as_array().unwrap();
    assert_eq!(entries[0]["name"], "base");
    assert_eq!(entries[0]["origin"], "installed");
    assert_eq!(entries[0]["params"][0]["name"], "topic");
    assert_eq!(entries[0]["params"][0]["default"], "ducks");
    let spiders: Vec<(&str, bool)> = entries
        .iter()
        .filter(|e| e["name"] == "spider")
        .map(|e| {
            (
                e["origin"].as_str().unwrap(),
                e["shadowed"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(spiders, [("installed", false), ("built-in", true)]);
}

#[test]
fn a_subflow_and_an_include_name_presets() {
    let p = Project::new();
    let presets = tempfile::tempdir().unwrap();
    preset_dir(presets.path(), "Write about {{ params.topic }}.\n");
    std::fs::write(
        presets.path().join("common.toml"),
        "name = \"common\"\n\n[exits.gave_up]\ncode = 9\n",
    )
    .unwrap();
    let env = [
        ("RALPH_FLOW_PRESET_PATH", presets.path().to_str().unwrap()),
        ("XDG_CONFIG_HOME", "/nonexistent"),
    ];
    p.workflow(
        "w.toml",
        r#"name = "outer"
include = ["common"]

[stages.inner]
kind = "subflow"
workflow = "base"
params = { topic = "swans" }

[stages.after]
kind = "command"
needs = ["inner"]
argv = ["true"]
on_fail = "exit:gave_up"
"#,
    );
    p.answer("draft", 1, "swan song");
    let out = p.run_env(&["run", "w.toml"], &env);
    ok(&out);
    assert_eq!(p.prompt("draft", 1).trim(), "Write about swans.");
    // The exit comes from the included preset: without the include it is unknown.
    let out = p.run_env(
        &["check", "w.toml"],
        &[("RALPH_FLOW_PRESET_PATH", "/nonexistent")],
    );
    assert_eq!(out.code, 3);
    assert!(
        out.stderr.contains("there is no preset `common`"),
        "{}",
        out.stderr
    );
    p.workflow(
        "w2.toml",
        "name = \"outer\"\n\n[stages.inner]\nkind = \"subflow\"\nworkflow = \"bose\"\n",
    );
    let out = p.run_env(&["check", "w2.toml", "--format", "short"], &env);
    assert_eq!(out.code, 3);
    assert!(out.stderr.contains("RF057"), "{}", out.stderr);
    assert!(
        out.stderr.contains("did you mean `base`?"),
        "{}",
        out.stderr
    );
}

/// A repository of presets with tag v1, and a project whose workflow extends `team:base`.
fn git_setup() -> (Project, tempfile::TempDir, tempfile::TempDir) {
    let repo = tempfile::tempdir().unwrap();
    preset_dir(
        &repo.path().join("presets"),
        "v1 prompt about {{ params.topic }}\n",
    );
    git(repo.path(), &["init", "-q", "-b", "main"]);
    git(repo.path(), &["add", "."]);
    git(repo.path(), &["commit", "-qm", "v1"]);
    git(repo.path(), &["tag", "v1"]);
    let cache = tempfile::tempdir().unwrap();
    let p = Project::new();
    p.workflow(
        "workflows/ours.toml",
        &format!(
            r#"name = "ours"
extends = {{ workflow = "team:base", params = {{ topic = "herons" }} }}

[sources.team]
git = "{}"
rev = "v1"
path = "presets"
"#,
            repo.path().display()
        ),
    );
    (p, repo, cache)
}

#[test]
fn git_presets_are_pinned_fetched_into_the_cache_and_verified_on_every_run() {
    let (p, repo, cache) = git_setup();
    let cache_s = cache.path().to_str().unwrap();

    // check does no fetching: it says what to do.
    let out = run_env(&p, &["check", "workflows/ours.toml"], cache_s);
    assert_eq!(out.code, 3);
    assert!(out.stderr.contains("RF058"), "{}", out.stderr);
    assert!(out.stderr.contains("is not fetched yet"), "{}", out.stderr);
    assert!(
        out.stderr.contains("ralph-flow presets fetch"),
        "{}",
        out.stderr
    );
    assert!(!p.dir().join("workflows/ralph-flow.lock").exists());

    // presets fetch pins the tag's commit with a content hash.
    let out = run_env(&p, &["presets", "fetch", "workflows/ours.toml"], cache_s);
    ok(&out);
    let v1 = git(repo.path(), &["rev-parse", "v1"]);
    let lock = p.read("workflows/ralph-flow.lock");
    assert!(lock.contains(&format!("commit = \"{v1}\"")), "{lock}");
    assert!(lock.contains("hash = \"sha256:"), "{lock}");
    assert!(
        out.stderr.contains("pinned source `team`"),
        "{}",
        out.stderr
    );
    ok(&run_env(&p, &["check", "workflows/ours.toml"], cache_s));

    p.answer("draft", 1, "heron haiku");
    let out = run_env(&p, &["run", "workflows/ours.toml"], cache_s);
    ok(&out);
    assert_eq!(p.prompt("draft", 1).trim(), "v1 prompt about herons");

    // The tag moves upstream: the lockfile keeps the run on the pinned commit.
    preset_dir(
        &repo.path().join("presets"),
        "v2 prompt about {{ params.topic }}\n",
    );
    git(repo.path(), &["commit", "-qam", "v2"]);
    git(repo.path(), &["tag", "-f", "v1"]);
    p.answer("draft", 2, "again");
    ok(&run_env(&p, &["run", "workflows/ours.toml"], cache_s));
    assert_eq!(p.prompt("draft", 2).trim(), "v1 prompt about herons");

    // `presets update` pins what the revision names now.
    let out = run_env(&p, &["presets", "update", "workflows/ours.toml"], cache_s);
    ok(&out);
    assert!(
        out.stderr.contains("updated source `team`"),
        "{}",
        out.stderr
    );
    let v2 = git(repo.path(), &["rev-parse", "v1"]);
    assert_ne!(v1, v2);
    assert!(p.read("workflows/ralph-flow.lock").contains(&v2));
    p.answer("draft", 3, "third");
    ok(&run_env(&p, &["run", "workflows/ours.toml"], cache_s));
    assert_eq!(p.prompt("draft", 3).trim(), "v2 prompt about herons");

    // A cached copy changed by hand fails verification: nothing runs.
    let cached = cache
        .path()
        .join("git/checkouts")
        .join(&v2)
        .join("presets/prompts/base/draft.md.j2");
    std::fs::write(&cached, "tampered {{ params.topic }}\n").unwrap();
    let out = run_env(&p, &["run", "workflows/ours.toml"], cache_s);
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(
        out.stderr.contains("does not match ralph-flow.lock"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("workflows/ours.toml:4:1"),
        "{}",
        out.stderr
    );
    assert_eq!(p.calls("draft"), 3);

    // Without a cache, `run` fetches the pinned commit by itself and checks its hash.
    std::fs::remove_dir_all(cache.path().join("git")).unwrap();
    p.answer("draft", 4, "fourth");
    let out = run_env(&p, &["run", "workflows/ours.toml"], cache_s);
    ok(&out);
    assert!(
        out.stderr.contains("fetched source `team`"),
        "{}",
        out.stderr
    );
    assert_eq!(p.prompt("draft", 4).trim(), "v2 prompt about herons");

    // `presets --from` lists the source's presets.
    let out = run_env(
        &p,
        &["presets", "--from", "workflows/ours.toml", "--json"],
        cache_s,
    );
    ok(&out);
    let names: Vec<&str> = out
        .json
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(names.contains(&"team:base"), "{names:?}");
}

#[test]
fn git_source_errors_name_the_place_and_the_remedy() {
    let (p, _repo, cache) = git_setup();
    let cache_s = cache.path().to_str().unwrap();
    ok(&run_env(
        &p,
        &["presets", "fetch", "workflows/ours.toml"],
        cache_s,
    ));
    // A preset the source lacks, and a source the file does not declare.
    p.workflow(
        "workflows/other.toml",
        &p.read("workflows/ours.toml")
            .replace("team:base", "team:bsae"),
    );
    let out = run_env(&p, &["check", "workflows/other.toml"], cache_s);
    assert_eq!(out.code, 3);
    assert!(
        out.stderr.contains("source `team` has no preset `bsae`"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("did you mean `base`?"),
        "{}",
        out.stderr
    );
    p.workflow(
        "workflows/third.toml",
        &p.read("workflows/ours.toml")
            .replace("team:base", "tema:base"),
    );
    let out = run_env(&p, &["check", "workflows/third.toml"], cache_s);
    assert!(
        out.stderr.contains("this file declares no source `tema`"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("did you mean `team`?"),
        "{}",
        out.stderr
    );
    // A revision the repository does not have.
    p.workflow(
        "workflows/fourth.toml",
        &p.read("workflows/ours.toml")
            .replace("rev = \"v1\"", "rev = \"v9\""),
    );
    let out = run_env(&p, &["run", "workflows/fourth.toml"], cache_s);
    assert_eq!(out.code, 3);
    assert!(
        out.stderr.contains("has no branch, tag or commit `v9`"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("workflows/fourth.toml:4:1"),
        "{}",
        out.stderr
    );
    let out = run_env(&p, &["presets", "fetch", "workflows/fourth.toml"], cache_s);
    assert_eq!(out.code, 3);
    assert!(
        out.stderr.contains("workflows/fourth.toml:4:1"),
        "{}",
        out.stderr
    );
    // A `path` that leaves the repository.
    p.workflow(
        "workflows/fifth.toml",
        &p.read("workflows/ours.toml")
            .replace("path = \"presets\"", "path = \"../../etc\""),
    );
    let out = run_env(&p, &["check", "workflows/fifth.toml"], cache_s);
    assert_eq!(out.code, 3);
    assert!(
        out.stderr.contains("`../../etc` leaves the repository"),
        "{}",
        out.stderr
    );
    // A broken lockfile.
    p.write(
        "workflows/ralph-flow.lock",
        "version = 1\n[[source]]\nname = 3\n",
    );
    let out = run_env(&p, &["check", "workflows/ours.toml"], cache_s);
    assert_eq!(out.code, 3);
    assert!(
        out.stderr.contains("ralph-flow.lock is not valid"),
        "{}",
        out.stderr
    );
}

#[test]
fn init_scaffolds_a_workflow_that_checks_for_every_builtin_preset() {
    let p = Project::new();
    let names = [
        "cairo-driver-reviewer",
        "council",
        "spider",
        "task-loop",
        "ticket-pipeline",
        "wiggum-review",
    ];
    for name in names {
        for format in ["toml", "kdl"] {
            let out_file = format!("flows/{name}.{format}");
            let out = p.run(&["init", name, "--format", format, "-o", &out_file]);
            ok(&out);
            let text = p.read(&out_file);
            // Written by the emitter, which quotes every string.
            assert!(
                text.contains(&if format == "toml" {
                    format!("workflow = \"{name}\"")
                } else {
                    format!("extends workflow=\"{name}\" {{")
                }),
                "{text}"
            );
            assert!(text.contains("../prompts/"), "{text}");
            let out = p.run(&["check", &out_file]);
            ok(&out);
            // It names the preset's agents, and its example of pointing one at a local
            // server is a valid workflow once uncommented.
            assert!(text.contains("Its agents: "), "{text}");
            let (c, head, lines) = if format == "toml" {
                ("# ", "# [agents.", 4)
            } else {
                ("// ", "// agent ", 1)
            };
            let start = text
                .lines()
                .position(|l| l.starts_with(head))
                .unwrap_or_else(|| panic!("{text}"));
            let uncommented: Vec<String> = text
                .lines()
                .enumerate()
                .map(|(i, l)| {
                    if (start..start + lines).contains(&i) {
                        l.strip_prefix(c).unwrap().to_string()
                    } else {
                        l.to_string()
                    }
                })
                .collect();
            let example = format!("flows/{name}-local.{format}");
            p.write(&example, &uncommented.join("\n"));
            ok(&p.run(&["check", &example]));
            // So is every param line, uncommented (TOML: those under [extends.params]).
            let mut in_params = false;
            let with_params: Vec<String> = text
                .lines()
                .map(|l| {
                    if format == "toml" {
                        if l == "[extends.params]" {
                            in_params = true;
                        } else if l.is_empty() {
                            in_params = false;
                        }
                    }
                    if format == "kdl" {
                        // The whole `params` node, uncommented.
                        if l.starts_with("    // params ") {
                            in_params = true;
                        }
                        let was = in_params;
                        if in_params
                            && (l == "    // }"
                                || (l.starts_with("    // params ") && !l.ends_with('{')))
                        {
                            in_params = false;
                        }
                        return if was {
                            l.replacen("// ", "", 1)
                        } else {
                            l.to_string()
                        };
                    }
                    let param = in_params
                        && l.starts_with("# ")
                        && !l.starts_with("#  ")
                        && l.contains(" = ");
                    if param && !l.contains("# required") {
                        l.replacen("# ", "", 1)
                    } else {
                        l.to_string()
                    }
                })
                .collect();
            let example = format!("flows/{name}-params.{format}");
            p.write(&example, &with_params.join("\n"));
            ok(&p.run(&["check", &example]));
        }
    }
    // The scaffold's prompt directory replaces the preset's prompt of the same name.
    ok(&p.run(&["init", "spider"]));
    let again = p.run(&["init", "spider"]);
    assert_eq!(again.code, 3);
    assert!(again.stderr.contains("--force"));
    assert!(
        p.read("workflows/spider.toml")
            .contains("prompt_path = [\"../prompts/spider\"]")
    );
    let out = p.run(&["init", "nope"]);
    assert_eq!(out.code, 3);
    assert!(out.stderr.contains("there is no preset `nope`"));
}

#[test]
fn init_from_a_git_source_pins_it() {
    let p = Project::new();
    let cache = tempfile::tempdir().unwrap();
    let cache_s = cache.path().to_str().unwrap();
    // A repository whose root is the preset directory, given by a path relative to where
    // the command runs.
    let flat = p.dir().join("vendor/flat");
    preset_dir(&flat, "flat {{ params.topic }}\n");
    git(&flat, &["init", "-q", "-b", "main"]);
    git(&flat, &["add", "."]);
    git(&flat, &["commit", "-qm", "flat"]);
    let out = run_env(
        &p,
        &[
            "init",
            "crew:base",
            "--git",
            "vendor/flat",
            "--rev",
            "main",
            "-o",
            "flows/crew.toml",
        ],
        cache_s,
    );
    ok(&out);
    let text = p.read("flows/crew.toml");
    assert!(
        text.contains("git = \"../vendor/flat\""),
        "relative to the workflow: {text}"
    );
    assert!(
        p.read("flows/ralph-flow.lock")
            .contains(&git(&flat, &["rev-parse", "main"]))
    );
    ok(&run_env(&p, &["check", "flows/crew.toml"], cache_s));
    p.answer("draft", 1, "x");
    ok(&run_env(&p, &["run", "flows/crew.toml"], cache_s));
    assert_eq!(p.prompt("draft", 1).trim(), "flat ducks");
    let out = run_env(&p, &["init", "crew:base", "-o", "flows/x.toml"], cache_s);
    assert_eq!(out.code, 3);
    assert!(out.stderr.contains("--git URL --rev REV"), "{}", out.stderr);
    // `presets fetch` reports what else is wrong with the workflow.
    let out = run_env(&p, &["presets", "fetch", "flows/nope.toml"], cache_s);
    assert_eq!(out.code, 3);
    assert!(
        out.stderr.contains("cannot read workflow file"),
        "{}",
        out.stderr
    );
}

/// A preset repository whose files try to reach outside it, in one way per tag.
#[test]
fn a_fetched_preset_reads_only_its_own_files() {
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret.txt");
    std::fs::write(&secret, "TOP SECRET\n").unwrap();
    let outside_flow = outside.path().join("outside.toml");
    std::fs::write(
        &outside_flow,
        "name = \"outside\"\n[stages.x]\nkind = \"command\"\nargv = [\"true\"]\n",
    )
    .unwrap();
    let cache = tempfile::tempdir().unwrap();
    let cache_s = cache.path().to_str().unwrap();
    type Breaks<'a> = Box<dyn Fn(&Path) + 'a>;
    let cases: Vec<(&str, Breaks, &str)> = vec![
        (
            "absolute-prompt",
            Box::new(|root: &Path| {
                let w = std::fs::read_to_string(root.join("workflows/base.toml")).unwrap();
                std::fs::write(
                    root.join("workflows/base.toml"),
                    w.replace(
                        "prompt_file = \"draft.md.j2\"",
                        &format!("prompt_file = \"{}\"", secret.display()),
                    ),
                )
                .unwrap();
            }),
            "lies outside the preset's checkout",
        ),
        (
            "dotdot-prompt-path",
            Box::new(|root: &Path| {
                let w = std::fs::read_to_string(root.join("workflows/base.toml")).unwrap();
                let up = "../".repeat(12);
                std::fs::write(
                    root.join("workflows/base.toml"),
                    w.replace(
                        "prompt_path = [\"../prompts/base\"]",
                        &format!(
                            "prompt_path = [\"{up}{}\"]",
                            outside.path().display().to_string().trim_start_matches('/')
                        ),
                    )
                    .replace(
                        "prompt_file = \"draft.md.j2\"",
                        "prompt_file = \"secret.txt\"",
                    ),
                )
                .unwrap();
            }),
            "secret.txt",
        ),
        (
            "symlinked-prompt",
            Box::new(|root: &Path| {
                std::fs::remove_file(root.join("prompts/base/draft.md.j2")).unwrap();
                std::os::unix::fs::symlink(&secret, root.join("prompts/base/draft.md.j2")).unwrap();
            }),
            "symbolic link that leads outside the repository",
        ),
        (
            "symlinked-workflow",
            Box::new(|root: &Path| {
                std::os::unix::fs::symlink(&outside_flow, root.join("workflows/linked.toml"))
                    .unwrap();
            }),
            "symbolic link that leads outside the repository",
        ),
    ];
    for (tag, break_it, expected) in &cases {
        let repo = tempfile::tempdir().unwrap();
        preset_dir(
            &repo.path().join("presets"),
            "prompt about {{ params.topic }}\n",
        );
        break_it(&repo.path().join("presets"));
        git(repo.path(), &["init", "-q", "-b", "main"]);
        git(repo.path(), &["add", "."]);
        git(repo.path(), &["commit", "-qm", tag]);
        git(repo.path(), &["tag", tag]);
        let p = Project::new();
        p.workflow(
            "workflows/ours.toml",
            &format!(
                "name = \"ours\"\nextends = \"team:base\"\n\n[sources.team]\ngit = \"{}\"\nrev = \"{tag}\"\npath = \"presets\"\n",
                repo.path().display()
            ),
        );
        p.answer("draft", 1, "an answer");
        let out = run_env(&p, &["run", "workflows/ours.toml"], cache_s);
        assert_ne!(out.code, 0, "{tag}: {}\n{}", out.stdout, out.stderr);
        // Messages are wrapped to the terminal's width: compare the words.
        let words = |t: &str| {
            t.replace('│', " ")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert!(
            words(&out.stderr).contains(expected),
            "{tag}: {}",
            out.stderr
        );
        assert!(!p.prompt("draft", 1).contains("TOP SECRET"), "{tag}");
        assert_eq!(p.calls("draft"), 0, "{tag}: nothing ran");
    }
}

#[test]
fn a_base_declares_git_sources_that_the_files_extending_it_use() {
    let (p, repo, cache) = git_setup();
    let cache_s = cache.path().to_str().unwrap();
    // The base, in a directory of its own, declares the source; the lock goes beside it.
    p.workflow(
        "shared/common.toml",
        &format!(
            "name = \"common\"\n\n[sources.team]\ngit = \"{}\"\nrev = \"v1\"\npath = \"presets\"\n\n[stages.prepare]\nkind = \"command\"\nargv = [\"true\"]\n",
            repo.path().display()
        ),
    );
    // The extending file names a preset of that source, without declaring it.
    p.workflow(
        "workflows/team.toml",
        "name = \"team-run\"\nextends = \"../shared/common.toml\"\n\n[stages.drafting]\nkind = \"subflow\"\nneeds = [\"prepare\"]\nworkflow = \"team:base\"\n",
    );
    ok(&run_env(
        &p,
        &["presets", "fetch", "workflows/team.toml"],
        cache_s,
    ));
    assert!(
        p.read("shared/ralph-flow.lock")
            .contains("hash = \"sha256:")
    );
    assert!(!p.dir().join("workflows/ralph-flow.lock").exists());
    ok(&run_env(&p, &["check", "workflows/team.toml"], cache_s));
    p.answer("draft", 1, "a draft");
    let out = run_env(&p, &["run", "workflows/team.toml", "--json"], cache_s);
    ok(&out);
    // A file that neither declares nor extends the source still cannot name it.
    p.workflow(
        "workflows/alone.toml",
        "name = \"alone\"\n\n[stages.drafting]\nkind = \"subflow\"\nworkflow = \"team:base\"\n",
    );
    let out = run_env(&p, &["check", "workflows/alone.toml"], cache_s);
    assert_eq!(out.code, 3);
    assert!(
        out.stderr.contains("this file declares no source `team`"),
        "{}",
        out.stderr
    );
}
