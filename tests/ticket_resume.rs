//! The ticket pipeline across runs: a ticket left unlanded by one run is resumed and landed
//! by the next, whose worktree takes over the one the earlier run left on the ticket's
//! branch (never one with changes ralph-flow did not leave there, never one of a live run,
//! never one outside the state directory), and whose later discovery rounds do not list
//! what its earlier rounds landed. Scripted fake agents, as in tests/presets.rs.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};

use common::Project;
use ralph_flow::store::Store;

/// Copies workflows/, prompts/ and schemas/ into the project, keeping their layout.
fn with_presets(p: &Project) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for dir in ["workflows", "prompts", "schemas"] {
        common::copy_dir(&root.join(dir), &p.dir().join(dir));
    }
}

fn fenced(json: &str) -> String {
    format!("Done.\n```json\n{json}\n```\n")
}

/// An implementer that answers from the script and commits. A branch without commits of its
/// own appends its ticket to the same file (so the second ticket to land conflicts); one with
/// commits (evicted, or resumed from an earlier run) starts again from main and writes its
/// own file, so it lands. A change it finds left in the worktree (`wip.txt`) is noted in
/// `answers/wip-seen`, a build cache git ignores in `answers/cache-seen`.
const IMPLEMENTER: &str = r#"p=$(cat)
printf '%s' "$p" | scripted || exit 1
id=$(printf '%s\n' "$p" | sed -n 's/^## Ticket `\([^`]*\)`.*/\1/p' | head -n 1)
[ "$id" = "slow-ticket" ] && sleep 1
[ -f .build-cache ] && echo "$id" >> "$SCRIPT_DIR/cache-seen"
if [ -f wip.txt ]; then
  echo "$id: $(cat wip.txt)" >> "$SCRIPT_DIR/wip-seen"
  rm wip.txt
fi
if [ "$(git rev-list --count main..HEAD)" = 0 ]; then
  echo "$id" >> shared.txt
else
  git reset -q --hard main
  echo "$id" > "$id.txt"
fi
git add -A && git commit -qm "$id"
if [ "$id" = "slow-ticket" ] && [ -f "$SCRIPT_DIR/leave-wip" ]; then
  echo "half done" > wip.txt
fi
"#;

const TWO_TICKETS: &str = r#"{"tickets": [
  {"id": "fast-ticket", "title": "Fast", "description": "d", "priority": "high", "tier": "trivial"},
  {"id": "slow-ticket", "title": "Slow", "description": "d", "priority": "low", "tier": "small"}],
 "reasoning": "r"}"#;

/// A project running the ticket pipeline with one pass per ticket: the first run lands
/// `fast-ticket` and leaves `slow-ticket` unlanded (evicted for a conflict), its worktree
/// kept on `ticket/slow-ticket`.
fn first_run_leaves_slow_ticket() -> (Project, String) {
    first_run(false)
}

/// [`first_run_leaves_slow_ticket`]; with `wip`, slow-ticket's implementer leaves an
/// uncommitted file, so its build fails (before the merge queue) and the worktree is left
/// with that change.
fn first_run(wip: bool) -> (Project, String) {
    let p = Project::new();
    if wip {
        p.write("answers/leave-wip", "");
    }
    p.git_init();
    with_presets(&p);
    p.write("implementer.sh", IMPLEMENTER);
    p.write(
        ".gitignore",
        ".ralph-flow/\nanswers/\nprobe.log\n.build-cache\n",
    );
    let w = format!(
        "name = \"test-ticket-pipeline\"\n\
         extends = {{ workflow = \"workflows/ticket-pipeline.toml\", params = {{ build_command = \"test ! -f wip.txt\", test_command = \"true\", land_checks = \"true\", max_landings = 1 }} }}\n\
         \n[agents.claude]\nkind = \"command\"\ncommand = [\"scripted\"]\n\
         \n[agents.codex]\nkind = \"command\"\ncommand = [\"sh\", \"{}\"]\n",
        p.dir().join("implementer.sh").display()
    );
    p.workflow("w.toml", &w);
    p.git(&["add", "-A"]);
    p.git(&["commit", "-qm", "presets"]);
    p.answer("discover", 1, &fenced(TWO_TICKETS));
    p.write("answers/implement/last", &fenced(r#"{"summary": "done"}"#));
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 2, "slow-ticket did not land: {}", out.stderr);
    assert_eq!(out.json["exit"], "some_unlanded");
    let run = out.json["run"].as_str().unwrap().to_string();
    let left =
        leftover(&p, "ticket/slow-ticket").expect("run 1 keeps the failed ticket's worktree");
    assert!(
        left.starts_with(p.dir().join(".ralph-flow/worktrees").join(&run)),
        "{}",
        left.display()
    );
    (p, run)
}

/// The worktree that has `branch` checked out, if any.
fn leftover(p: &Project, branch: &str) -> Option<PathBuf> {
    let list = p.git(&["worktree", "list", "--porcelain"]);
    let mut path = None;
    for line in list.lines() {
        if let Some(w) = line.strip_prefix("worktree ") {
            path = Some(PathBuf::from(w));
        } else if line == format!("branch refs/heads/{branch}") {
            return path;
        }
    }
    None
}

/// The second run's discovery: round 1 resumes `slow-ticket`, round 2 finds nothing.
fn resume_slow_ticket(p: &Project, run: &str) {
    p.answer(
        "discover",
        2,
        &fenced(&format!(
            r#"{{"tickets": [
              {{"id": "slow-ticket", "title": "Slow", "description": "d", "priority": "low", "tier": "small", "resumed_from": "{run}"}}],
             "reasoning": "resume it"}}"#
        )),
    );
    p.answer(
        "discover",
        3,
        &fenced(r#"{"tickets": [], "reasoning": "all done"}"#),
    );
}

/// A section of a prompt (from its heading to the next), empty when absent.
fn section(prompt: &str, heading: &str) -> String {
    prompt
        .split(heading)
        .nth(1)
        .map(|s| s.split("\n## ").next().unwrap_or_default().to_string())
        .unwrap_or_default()
}

#[test]
fn the_next_run_resumes_an_unlanded_ticket_in_the_worktree_the_earlier_run_left() {
    let (p, run1) = first_run_leaves_slow_ticket();
    let old = leftover(&p, "ticket/slow-ticket").unwrap();
    // What git ignores (a build's output) is no change: it moves with the worktree.
    std::fs::write(old.join(".build-cache"), "kept").unwrap();
    resume_slow_ticket(&p, &run1);
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}\n{}", out.stderr, out.stdout);
    let run2 = out.json["run"].as_str().unwrap().to_string();
    let files = p.git(&["ls-tree", "--name-only", "main"]);
    assert!(
        files.contains("slow-ticket.txt"),
        "slow-ticket landed: {files}"
    );
    // Its implementer is told where the work it goes on from comes from.
    let implement = p.prompt("implement", 3);
    assert!(
        implement.contains(&format!("## Resumed from run {run1}")),
        "{implement}"
    );
    assert!(!p.prompt("implement", 1).contains("## Resumed"));
    // The leftover was moved into the second run, with what git ignores.
    assert!(!old.exists(), "{}", old.display());
    assert_eq!(p.read("answers/cache-seen"), "slow-ticket\n");
    let logs = p.run(&["logs", &run2]).stdout;
    assert!(
        logs.contains("took over") && logs.contains(&run1),
        "the takeover is in the log: {logs}"
    );
    // It succeeded, so it was removed (cleanup = on_success), and so were the directories
    // run 1 left empty; the branch keeps its commits.
    assert!(leftover(&p, "ticket/slow-ticket").is_none());
    assert!(!p.dir().join(".ralph-flow/worktrees").join(&run1).exists());
    let log = p.git(&["log", "--format=%s", "ticket/slow-ticket"]);
    assert!(log.contains("slow-ticket"), "{log}");
}

#[test]
fn a_later_discovery_round_does_not_list_what_an_earlier_round_of_the_run_landed() {
    let (p, run1) = first_run_leaves_slow_ticket();
    // The user removed the leftover worktree by hand: only the discovery is tested here.
    let old = leftover(&p, "ticket/slow-ticket").unwrap();
    p.git(&["worktree", "remove", "--force", &old.to_string_lossy()]);
    resume_slow_ticket(&p, &run1);
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}\n{}", out.stderr, out.stdout);
    assert_eq!(out.json["outputs"]["rounds"]["iterations"], 2);
    let round1 = p.prompt("discover", 2);
    assert!(
        section(&round1, "## Unfinished tickets from earlier runs").contains("slow-ticket"),
        "round 1 resumes it: {round1}"
    );
    assert!(
        section(
            &round1,
            "## Tickets the merge queue evicted in earlier runs"
        )
        .contains("slow-ticket"),
        "{round1}"
    );
    let round2 = p.prompt("discover", 3);
    assert!(round2.contains("Round 2 of 3"), "{round2}");
    assert!(
        !section(&round2, "## Unfinished tickets from earlier runs").contains("slow-ticket"),
        "round 1 of this run landed it: {round2}"
    );
    assert!(
        !section(
            &round2,
            "## Tickets the merge queue evicted in earlier runs"
        )
        .contains("slow-ticket"),
        "round 1 of this run landed it: {round2}"
    );
    assert!(
        section(&round2, "## Already landed").contains("slow-ticket"),
        "{round2}"
    );
    // A third run sees it landed as well (the second run's landing is an earlier run's now).
    p.answer(
        "discover",
        4,
        &fenced(r#"{"tickets": [], "reasoning": "nothing"}"#),
    );
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let third = p.prompt("discover", 4);
    assert!(
        !section(&third, "## Unfinished tickets").contains("slow-ticket"),
        "{third}"
    );
    assert!(
        !section(&third, "## Tickets the merge queue evicted").contains("slow-ticket"),
        "{third}"
    );
}

#[test]
fn a_leftover_worktree_with_changes_ralph_flow_did_not_make_is_never_touched() {
    let (p, run1) = first_run_leaves_slow_ticket();
    let old = leftover(&p, "ticket/slow-ticket").unwrap();
    // The user works in the leftover: a changed file and a new one, not committed.
    std::fs::write(old.join("shared.txt"), "my edit\n").unwrap();
    std::fs::write(old.join("notes.txt"), "mine\n").unwrap();
    resume_slow_ticket(&p, &run1);
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_ne!(out.code, 0, "{}", out.stdout);
    let run2 = out.json["run"].as_str().unwrap_or_default().to_string();
    let logs = p.run(&["logs", &run2]).stdout;
    let said = format!("{}\n{logs}", out.stderr);
    assert!(
        said.contains(&old.to_string_lossy().to_string()) && said.contains("uncommitted"),
        "the refusal names the worktree and why: {said}"
    );
    assert!(said.contains("stash"), "and what to do: {said}");
    // Untouched: still there, on its branch, with the user's changes.
    assert_eq!(leftover(&p, "ticket/slow-ticket"), Some(old.clone()));
    assert_eq!(
        std::fs::read_to_string(old.join("shared.txt")).unwrap(),
        "my edit\n"
    );
    assert_eq!(
        std::fs::read_to_string(old.join("notes.txt")).unwrap(),
        "mine\n"
    );
    // Once the user committed them, the next run takes it over and lands the ticket.
    p.git(&["-C", &old.to_string_lossy(), "add", "-A"]);
    p.git(&["-C", &old.to_string_lossy(), "commit", "-qm", "user's work"]);
    p.answer("discover", 3, &p.read("answers/discover/2"));
    p.answer(
        "discover",
        4,
        &fenced(r#"{"tickets": [], "reasoning": "all done"}"#),
    );
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}\n{}", out.stderr, out.stdout);
    assert!(!old.exists());
    let run3 = out.json["run"].as_str().unwrap().to_string();
    let logs = p.run(&["logs", &run3]).stdout;
    assert!(logs.contains("took over"), "{logs}");
    // The implementer found the user's commit on the branch (and, as the fake does, started
    // again from main).
    assert!(
        p.git(&["reflog", "ticket/slow-ticket"])
            .contains("user's work")
    );
}

#[test]
fn changes_the_earlier_run_left_in_its_worktree_move_with_it() {
    let (p, run1) = first_run(true);
    let old = leftover(&p, "ticket/slow-ticket").unwrap();
    assert!(old.join("wip.txt").exists(), "run 1 left its change");
    std::fs::remove_file(p.dir().join("answers/leave-wip")).unwrap();
    resume_slow_ticket(&p, &run1);
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}\n{}", out.stderr, out.stdout);
    assert!(!old.exists());
    // The second run's implementer found the change run 1 left, where run 1 left it.
    assert_eq!(p.read("answers/wip-seen"), "slow-ticket: half done\n");
    let files = p.git(&["ls-tree", "--name-only", "main"]);
    assert!(files.contains("slow-ticket.txt"), "{files}");
}

#[test]
fn changes_made_after_the_earlier_run_left_its_worktree_are_never_touched() {
    let (p, run1) = first_run(true);
    let old = leftover(&p, "ticket/slow-ticket").unwrap();
    std::fs::remove_file(p.dir().join("answers/leave-wip")).unwrap();
    // The user went on from what run 1 left.
    std::fs::write(old.join("wip.txt"), "half done, and mine\n").unwrap();
    resume_slow_ticket(&p, &run1);
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_ne!(out.code, 0, "{}", out.stdout);
    assert_eq!(leftover(&p, "ticket/slow-ticket"), Some(old.clone()));
    assert_eq!(
        std::fs::read_to_string(old.join("wip.txt")).unwrap(),
        "half done, and mine\n"
    );
    assert_eq!(p.read("answers/wip-seen"), "", "no stage ran on it");
}

#[test]
fn a_worktree_of_a_run_that_is_still_running_is_never_taken() {
    let (p, run1) = first_run_leaves_slow_ticket();
    let old = leftover(&p, "ticket/slow-ticket").unwrap();
    // Run 1 held by a live process (this test's).
    let mut store = p.store().unwrap();
    let owner = ralph_flow::store::current_owner();
    store.lock(&run1, &owner).unwrap();
    resume_slow_ticket(&p, &run1);
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_ne!(out.code, 0, "{}", out.stdout);
    let run2 = out.json["run"].as_str().unwrap_or_default().to_string();
    let said = format!("{}\n{}", out.stderr, p.run(&["logs", &run2]).stdout);
    assert!(
        said.contains(&run1) && said.contains(&old.to_string_lossy().to_string()),
        "{said}"
    );
    assert_eq!(leftover(&p, "ticket/slow-ticket"), Some(old));
    store.unlock(&run1, &owner).unwrap();
}

#[test]
fn a_worktree_outside_the_state_directory_is_never_taken() {
    let (p, run1) = first_run_leaves_slow_ticket();
    let old = leftover(&p, "ticket/slow-ticket").unwrap();
    // The user moved it out of the state directory to work on it.
    let mine = tempfile::tempdir().unwrap();
    let theirs = mine.path().join("slow");
    p.git(&[
        "worktree",
        "move",
        &old.to_string_lossy(),
        &theirs.to_string_lossy(),
    ]);
    assert_eq!(leftover(&p, "ticket/slow-ticket"), Some(theirs.clone()));
    resume_slow_ticket(&p, &run1);
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_ne!(out.code, 0, "{}", out.stdout);
    let run2 = out.json["run"].as_str().unwrap_or_default().to_string();
    let said = format!("{}\n{}", out.stderr, p.run(&["logs", &run2]).stdout);
    assert!(
        said.contains(&theirs.to_string_lossy().to_string()) && said.contains("outside"),
        "{said}"
    );
    assert_eq!(leftover(&p, "ticket/slow-ticket"), Some(theirs));
}
