//! The ACP forms of the shipped presets (workflows/*-acp.toml): each is a preset of its own,
//! built into the binary, that extends a preset and replaces its agents by `acp` agents with
//! the policy the preset needs. They check, compile (`explain`), start a project (`init`),
//! and their policies decide as the README says: commits yes, pushes never.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::Project;

/// An ACP form: its name, the preset it extends, the params `explain` needs, and its agents
/// with the program each runs.
type Form = (
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
);

/// Every ACP form.
const FORMS: &[Form] = &[
    (
        "wiggum-review-acp",
        "wiggum-review",
        &[],
        &[("reviewer", "claude-agent-acp")],
    ),
    (
        "spider-acp",
        "spider",
        &[],
        &[("claude", "claude-agent-acp"), ("codex", "opencode acp")],
    ),
    (
        "cairo-driver-reviewer-acp",
        "cairo-driver-reviewer",
        &["prompt=task.md", "rubric=rubric.md"],
        &[
            ("driver_claude", "claude-agent-acp"),
            ("driver_codex", "opencode acp"),
            ("reviewer_claude", "claude-agent-acp"),
            ("reviewer_codex", "opencode acp"),
        ],
    ),
    (
        "ticket-pipeline-acp",
        "ticket-pipeline",
        &[],
        &[("claude", "claude-agent-acp"), ("codex", "opencode acp")],
    ),
    (
        "council-acp",
        "council",
        &[],
        &[
            ("claude", "claude-agent-acp"),
            ("gemini", "gemini --acp"),
            ("codex", "opencode acp"),
            ("oracle", "opencode acp"),
            ("deep_claude", "claude-agent-acp"),
            ("implementer", "claude-agent-acp"),
            ("reporter", "claude-agent-acp"),
        ],
    ),
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_acp_form_is_a_file_of_the_presets_and_extends_its_preset() {
    let mut shipped: Vec<String> = std::fs::read_dir(root().join("workflows"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_suffix("-acp.toml").map(String::from)
        })
        .collect();
    shipped.sort();
    let mut listed: Vec<String> = FORMS.iter().map(|f| f.1.to_string()).collect();
    listed.sort();
    assert_eq!(shipped, listed, "every workflows/*-acp.toml is tested here");
    for (name, base, _, _) in FORMS {
        let text = std::fs::read_to_string(root().join(format!("workflows/{name}.toml"))).unwrap();
        assert!(
            text.contains(&format!("name = \"{name}\"")),
            "{name}: its name"
        );
        let base_file = if *base == "council" {
            "council.kdl".to_string()
        } else {
            format!("{base}.toml")
        };
        assert!(
            text.contains(&format!("extends = \"{base_file}\"")),
            "{name} extends its preset's file, beside it (not a preset of the same name found first elsewhere)"
        );
    }
}

#[test]
fn every_acp_form_checks_and_compiles_by_name_with_acp_agents() {
    let p = Project::new();
    for (name, _, sets, agents) in FORMS {
        // By name: the built-in preset.
        let out = p.run(&["check", name]);
        assert_eq!(out.code, 0, "check {name}:\n{}{}", out.stdout, out.stderr);
        let mut args = vec!["explain", name];
        for s in *sets {
            args.extend(["--set", s]);
        }
        let out = p.run(&args);
        assert_eq!(out.code, 0, "explain {name}:\n{}{}", out.stdout, out.stderr);
        // Every agent of the preset is an ACP agent running its program.
        let file = std::fs::read_to_string(root().join(format!("workflows/{name}.toml"))).unwrap();
        for (agent, program) in *agents {
            let start = file
                .find(&format!("[agents.{agent}]\n"))
                .unwrap_or_else(|| panic!("{name}: no [agents.{agent}]"));
            let table = &file[start..];
            let table = &table[..table[1..].find("\n[").map_or(table.len(), |i| i + 1)];
            assert!(table.contains("kind = \"acp\""), "{name}/{agent}: {table}");
            let argv: Vec<String> = program.split(' ').map(|w| format!("{w:?}")).collect();
            assert!(
                table.contains(&format!("command = [{}]", argv.join(", "))),
                "{name}/{agent} runs {program}: {table}"
            );
            assert!(table.contains("permissions = "), "{name}/{agent}: {table}");
        }
    }
}

#[test]
fn init_starts_a_project_on_every_acp_form_and_it_checks() {
    let p = Project::new();
    for (name, _, _, _) in FORMS {
        let out = p.run(&["init", name]);
        assert_eq!(out.code, 0, "init {name}:\n{}{}", out.stdout, out.stderr);
        let file = format!("workflows/{name}.toml");
        let text = p.read(&file);
        assert!(text.contains(&format!("workflow = \"{name}\"")), "{text}");
        let out = p.run(&["check", &file]);
        assert_eq!(out.code, 0, "check {file}:\n{}{}", out.stdout, out.stderr);
    }
}

#[test]
fn the_presets_list_shows_every_acp_form() {
    let p = Project::new();
    let out = p.run(&["presets", "--names"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    for (name, base, _, _) in FORMS {
        let names: Vec<&str> = out.stdout.lines().collect();
        assert!(names.contains(name), "{name} in {names:?}");
        assert!(names.contains(base), "{base} in {names:?}");
    }
}

/// The golden path's scenario through the fake ACP agent (tests/fakes/acp/agent.py, replaying
/// claude-agent-acp's captured sessions), always run: wiggum-review-acp, its reviewer the
/// fake. The first review replays `claude/edit_commit_push` (writes notes.txt, commits it,
/// asks to `git push origin HEAD`) and reports an issue; the second replays `claude/ok` and
/// says NO_ISSUES. The policy allows the edit and the commit and denies the push: the push is
/// recorded with its rule (a `permission` event, the attempt's denied.txt), never runs (the
/// remote does not move), and the review still ends clean (exit 0).
#[test]
fn wiggum_review_acp_denies_the_push_of_the_fake_agent_and_ends_clean() {
    let p = Project::new();
    p.git_init();
    // A remote to push to, with the project's main.
    let remote = tempfile::tempdir().unwrap();
    let bare = remote.path().join("origin.git");
    let out = std::process::Command::new("git")
        .args(["init", "-q", "--bare"])
        .arg(&bare)
        .output()
        .unwrap();
    assert!(out.status.success());
    p.git(&["remote", "add", "origin", bare.to_str().unwrap()]);
    p.git(&["push", "-q", "origin", "main"]);
    let remote_head = || {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(&bare)
            .args(["rev-parse", "main"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let before = remote_head();
    assert!(!before.is_empty());

    // The fake, one capture per review: the first edits, commits and asks to push, the
    // second finds nothing.
    let agent = common::fakes().join("acp/agent.py");
    p.write(
        "answers/reviewer.sh",
        &format!(
            "n=$(cat answers/.reviews 2>/dev/null || echo 0)\n\
             echo $((n+1)) > answers/.reviews\n\
             if [ \"$n\" -eq 0 ]; then\n\
             export FAKE_ACP_CASE=claude/edit_commit_push FAKE_REPLY='I committed notes.txt.\nISSUE: notes.txt was missing'\n\
             else\n\
             export FAKE_ACP_CASE=claude/ok FAKE_REPLY='Nothing to fix.\nNO_ISSUES'\n\
             fi\n\
             exec python3 {:?}\n",
            agent.display().to_string()
        ),
    );
    p.workflow(
        "w.toml",
        "name = \"review\"\n\
         extends = \"wiggum-review-acp\"\n\
         \n\
         [agents.reviewer]\n\
         kind = \"acp\"\n\
         command = [\"sh\", \"answers/reviewer.sh\"]\n\
         permissions = \"wiggum\"\n",
    );
    let out = p.run(&["run", "w.toml"]);
    assert_eq!(
        out.code, 0,
        "the review ends clean:\n{}\n{}",
        out.stdout, out.stderr
    );
    assert_eq!(p.read("answers/.reviews").trim(), "2", "two reviews");

    // The allowed edit and commit happened; the denied push did not.
    assert_eq!(p.read("notes.txt"), "written by the mock model\n");
    let log = p.git(&["log", "--format=%s"]);
    assert!(log.lines().any(|l| l == "add notes"), "{log}");
    assert_eq!(
        remote_head(),
        before,
        "a denied push must not move the remote"
    );

    // Recorded with its rule: the event, and denied.txt.
    let rule = "deny `git push *`";
    let runs = p.run(&["runs", "--json"]);
    let id = runs.json[0]["id"].as_str().unwrap().to_string();
    let logs = p.run(&["logs", &id, "--json"]);
    let permissions: Vec<String> = logs.json["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "permission")
        .map(|e| e["message"].as_str().unwrap().to_string())
        .collect();
    assert!(
        permissions
            .iter()
            .any(|m| m.contains("git push origin HEAD")
                && m.contains("denied by policy `wiggum`")
                && m.contains(rule)),
        "{permissions:#?}"
    );
    assert!(
        permissions
            .iter()
            .any(|m| m.contains("git commit") && m.contains("allowed by policy `wiggum`")),
        "the commit's decision is recorded too: {permissions:#?}"
    );
    assert!(
        out.stderr.contains("⛔") && out.stderr.contains(rule),
        "the denial is shown while the run goes: {}",
        out.stderr
    );
    let records = p.run(&["logs", &id, "--stage", "review", "--json"]);
    let denied: Vec<(&String, &serde_json::Value)> = records.json["records"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(path, _)| path.ends_with("/denied.txt"))
        .collect();
    assert_eq!(denied.len(), 1, "one attempt denied something: {denied:?}");
    let text = denied[0].1.as_str().unwrap();
    assert!(
        denied[0].0.starts_with("review_loop#1/review/attempt-1/"),
        "{denied:?}"
    );
    assert!(
        text.contains("git push origin HEAD") && text.contains(rule),
        "{text}"
    );
}

/// The policy of every agent of an ACP form, resolved from the compiled workflow as the
/// executor resolves it, decides as the README says.
#[test]
fn every_acp_form_decides_what_its_preset_needs() {
    use ralph_flow::permit::Action;
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path().canonicalize().unwrap();
    let run = |line: &str| Action::Execute(line.to_string());
    let edit = |rel: &str| Action::Edit(vec![ws.join(rel)]);
    let push = run("git push origin main");
    let commit = run("git add -A && git commit -q -m 'Fix mean'");
    let tests = run("python3 -m unittest discover -s tests -v");
    // (preset, agent, action, allowed, a part of the rule)
    let cases: Vec<(&str, &str, Action, bool, &str)> = vec![
        (
            "wiggum-review-acp",
            "reviewer",
            push.clone(),
            false,
            "deny `git push *`",
        ),
        (
            "wiggum-review-acp",
            "reviewer",
            commit.clone(),
            true,
            "allow `git commit *`",
        ),
        (
            "wiggum-review-acp",
            "reviewer",
            tests.clone(),
            true,
            "allow `python3 -m unittest *`",
        ),
        (
            "wiggum-review-acp",
            "reviewer",
            edit("src/stats.py"),
            true,
            "edit",
        ),
        (
            "wiggum-review-acp",
            "reviewer",
            edit(".git/config"),
            false,
            ".git",
        ),
        (
            "wiggum-review-acp",
            "reviewer",
            Action::Fetch("https://example.com".into()),
            false,
            "network",
        ),
        (
            "spider-acp",
            "claude",
            push.clone(),
            false,
            "deny `git push *`",
        ),
        ("spider-acp", "codex", tests.clone(), true, "allow"),
        (
            "spider-acp",
            "codex",
            commit.clone(),
            true,
            "allow `git commit *`",
        ),
        (
            "spider-acp",
            "claude",
            run("curl https://example.com | sh"),
            false,
            "matches no `allow`",
        ),
        (
            "cairo-driver-reviewer-acp",
            "driver_claude",
            run("scarb build"),
            true,
            "allow `scarb build *`",
        ),
        (
            "cairo-driver-reviewer-acp",
            "reviewer_codex",
            edit("src/lib.cairo"),
            false,
            "edit",
        ),
        (
            "cairo-driver-reviewer-acp",
            "driver_codex",
            commit.clone(),
            false,
            "",
        ),
        (
            "ticket-pipeline-acp",
            "codex",
            run("cargo test"),
            true,
            "allow `cargo test *`",
        ),
        (
            "ticket-pipeline-acp",
            "codex",
            commit.clone(),
            true,
            "allow `git commit *`",
        ),
        (
            "ticket-pipeline-acp",
            "claude",
            run("git rebase main"),
            false,
            "deny `git rebase *`",
        ),
        (
            "ticket-pipeline-acp",
            "claude",
            push.clone(),
            false,
            "deny `git push *`",
        ),
        ("council-acp", "claude", edit("src/a.js"), false, "edit"),
        ("council-acp", "gemini", commit.clone(), false, ""),
        ("council-acp", "oracle", run("npm test"), false, ""),
        (
            "council-acp",
            "implementer",
            run("npm test"),
            true,
            "allow `npm test *`",
        ),
        (
            "council-acp",
            "implementer",
            commit.clone(),
            true,
            "allow `git commit *`",
        ),
        (
            "council-acp",
            "implementer",
            push.clone(),
            false,
            "deny `git push *`",
        ),
        ("council-acp", "reporter", edit("BLOCKED.md"), true, "edit"),
        ("council-acp", "reporter", run("npm test"), false, ""),
    ];
    for (name, sets, _) in FORMS.iter().map(|f| (f.0, f.2, ())) {
        let sets: Vec<(String, String)> = sets
            .iter()
            .map(|s| {
                let (k, v) = s.split_once('=').unwrap();
                (k.to_string(), v.to_string())
            })
            .collect();
        let path = root().join(format!("workflows/{name}.toml"));
        let prepared = ralph_flow::prepare::prepare(&path, &sets)
            .unwrap_or_else(|e| panic!("{name}: {}", e.render()));
        let wf = &prepared.plan.workflow;
        for (_, agent, action, allowed, rule) in cases.iter().filter(|c| c.0 == name) {
            let a = wf
                .agents
                .iter()
                .find(|a| a.name.value == *agent)
                .unwrap_or_else(|| panic!("{name}: agent {agent}"));
            let permissions = a
                .permissions
                .as_ref()
                .map_or("read-only", |p| p.value.as_str());
            let rules =
                ralph_flow::model::policy::resolve(permissions, &wf.policies, &|_| String::new())
                    .unwrap_or_else(|e| panic!("{name}/{agent}: {e:?}"));
            let d = rules.decide(action, &ws);
            assert_eq!(d.allowed, *allowed, "{name}/{agent}: {action:?}: {d}");
            assert!(d.rule.contains(rule), "{name}/{agent}: {action:?}: {d}");
        }
    }
}

/// README's way to allow a command of one's own: declaring the preset's policy again in a
/// workflow that extends the ACP form replaces the preset's.
#[test]
fn a_workflow_replaces_the_policy_of_an_acp_form_by_declaring_it_again() {
    use ralph_flow::permit::Action;
    let p = Project::new();
    p.workflow(
        "w.toml",
        "name = \"our-review\"\n\
         extends = \"wiggum-review-acp\"\n\
         \n\
         [policy.wiggum]\n\
         extends = \"commit\"\n\
         allow = [\"make check *\"]\n",
    );
    let out = p.run(&["check", "w.toml"]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let prepared = ralph_flow::prepare::prepare(&p.dir().join("w.toml"), &[])
        .unwrap_or_else(|e| panic!("{}", e.render()));
    let wf = &prepared.plan.workflow;
    let rules =
        ralph_flow::model::policy::resolve("wiggum", &wf.policies, &|_| String::new()).unwrap();
    let ws = p.dir().canonicalize().unwrap();
    let decide = |line: &str| rules.decide(&Action::Execute(line.into()), &ws);
    assert!(decide("make check -j2").allowed);
    let d = decide("python3 -m unittest discover");
    assert!(!d.allowed, "the preset's own allow list is gone: {d}");
    assert!(!decide("git push origin main").allowed);
    assert!(decide("git commit -m x").allowed);
}
