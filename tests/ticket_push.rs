//! The ticket pipeline across machines (`land = "push"`): two runs queued from two clones of
//! one repository (a bare repository standing for the shared remote), carried out by two
//! workers with state directories of their own (two machines) on a real PostgreSQL
//! (tests/pg), land their tickets by rebasing on the remote's `main` and pushing to it.
//! The agents are scripts that answer as the scripted agents of tests/ticket_resume.rs do
//! (a discovery per run, an implementer that commits a file per ticket).
//!
//! The two runs land at the same time on purpose: run A's first land checks wait until run
//! B has pushed, so A's push is refused as not a fast-forward; A then fetches, rebases, runs
//! the checks again and pushes. Every ticket's commit ends on the remote's `main`, once, in
//! the order the merge queues served them, and no landing is lost.
#![allow(clippy::unwrap_used)]

mod common;
mod pg;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ralph_flow::store::postgres::PgStore;
use ralph_flow::store::{RunStatus, Store};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_ralph-flow")
}

/// The git identity every git command here and on the workers uses (a rebase makes
/// commits).
const IDENTITY: [(&str, &str); 4] = [
    ("GIT_AUTHOR_NAME", "t"),
    ("GIT_AUTHOR_EMAIL", "t@example.com"),
    ("GIT_COMMITTER_NAME", "t"),
    ("GIT_COMMITTER_EMAIL", "t@example.com"),
];

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .envs(IDENTITY)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The discovery: the tickets of its side (`SIDE-1` high, `SIDE-2` low; the side is the
/// `specs` param the prompt names) in round 1, none after; each prompt kept as
/// `prompts/discover-SIDE-N`.
const DISCOVER: &str = r#"p=$(cat)
case "$p" in *spec-a*) side=a ;; *) side=b ;; esac
n=$(( $(ls "$SIG_DIR/prompts" | grep -c "^discover-$side-") + 1 ))
printf '%s' "$p" > "$SIG_DIR/prompts/discover-$side-$n"
if [ "$n" = 1 ]; then
  printf 'Found.\n```json\n{"tickets": [{"id": "%s-1", "title": "One", "description": "d", "priority": "high", "tier": "trivial"}, {"id": "%s-2", "title": "Two", "description": "d", "priority": "low", "tier": "trivial"}], "reasoning": "r"}\n```\n' "$side" "$side"
else
  printf 'Nothing left.\n```json\n{"tickets": [], "reasoning": "all done"}\n```\n'
fi
"#;

/// The implementer: commits a file named after its ticket.
const IMPLEMENT: &str = r#"p=$(cat)
id=$(printf '%s\n' "$p" | sed -n 's/^## Ticket `\([^`]*\)`.*/\1/p' | head -n 1)
[ -n "$id" ] || { echo "no ticket in the prompt" >&2; exit 1; }
echo "$id" > "$id.txt"
git add "$id.txt" && git commit -qm "ticket $id" || exit 1
printf 'Done.\n```json\n{"summary": "done"}\n```\n'
"#;

/// Run A's land checks: the first waits (60 s at most) until the remote's main moves past
/// what this landing rebased on (run B lands meanwhile), so that its push is refused.
const CHECKS_A: &str = r#"if mkdir "$SIG_DIR/a-first" 2>/dev/null; then
  rebased_on=$(git rev-parse refs/remotes/origin/main)
  touch "$SIG_DIR/a-checking"
  i=0
  while [ "$(git ls-remote origin refs/heads/main | cut -f1)" = "$rebased_on" ] && [ "$i" -lt 600 ]; do
    sleep 0.1; i=$((i + 1))
  done
fi
exit 0
"#;

/// Run B's land checks: wait (60 s at most) until run A is in its first checks.
const CHECKS_B: &str = r#"i=0
while [ ! -f "$SIG_DIR/a-checking" ] && [ "$i" -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
exit 0
"#;

struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for w in &mut self.0 {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(w.id()).unwrap());
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        }
        for w in &mut self.0 {
            let _ = w.wait();
        }
    }
}

fn worker_logs(root: &Path) -> String {
    (1..=2)
        .map(|n| std::fs::read_to_string(root.join(format!("m{n}.log"))).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n---\n")
}

#[test]
fn two_machines_land_their_tickets_by_pushing_to_the_shared_repository() {
    let Some(url) = pg::database() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let sig = root.join("sig");
    std::fs::create_dir_all(sig.join("prompts")).unwrap();
    for (name, text) in [
        ("discover.sh", DISCOVER),
        ("implement.sh", IMPLEMENT),
        ("checks-a.sh", CHECKS_A),
        ("checks-b.sh", CHECKS_B),
    ] {
        std::fs::write(root.join(name), text).unwrap();
    }
    // The shared remote, and a first commit on its main: the presets and the workflow.
    let origin = root.join("origin.git");
    git(
        root,
        &[
            "init",
            "-q",
            "--bare",
            "-b",
            "main",
            &origin.to_string_lossy(),
        ],
    );
    let origin_url = format!("file://{}", origin.display());
    let seed = root.join("seed");
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    for dir in ["workflows", "prompts", "schemas"] {
        common::copy_dir(&manifest.join(dir), &seed.join(dir));
    }
    std::fs::write(
        seed.join("w.toml"),
        format!(
            "name = \"push-tickets\"\n\
             extends = {{ workflow = \"workflows/ticket-pipeline.toml\", params = {{ land = \"push\", build_command = \"true\", test_command = \"true\", max_landings = 2 }} }}\n\
             \n[agents.claude]\nkind = \"command\"\ncommand = [\"sh\", \"{}\"]\n\
             \n[agents.codex]\nkind = \"command\"\ncommand = [\"sh\", \"{}\"]\n",
            root.join("discover.sh").display(),
            root.join("implement.sh").display(),
        ),
    )
    .unwrap();
    std::fs::write(seed.join(".gitignore"), ".ralph-flow/\n").unwrap();
    git(&seed, &["init", "-q", "-b", "main"]);
    git(&seed, &["add", "-A"]);
    git(&seed, &["commit", "-qm", "base"]);
    git(&seed, &["push", "-q", &origin_url, "main"]);
    let base = git(&seed, &["rev-parse", "HEAD"]);

    // Two machines: a clone each, from which a run is queued, and a worker each.
    let mut runs = Vec::new();
    for side in ["a", "b"] {
        let clone = root.join(format!("clone-{side}"));
        git(
            root,
            &["clone", "-q", &origin_url, &clone.to_string_lossy()],
        );
        let checks = format!(
            "land_checks=sh {}",
            root.join(format!("checks-{side}.sh")).display()
        );
        let out = Command::new(bin())
            .args(["run", "w.toml", "--detach", "--set"])
            .arg(format!("specs=spec-{side}"))
            .args(["--set", &checks])
            .current_dir(&clone)
            .env("RALPH_FLOW_STORE", &url)
            .env_remove("RALPH_FLOW_LEASE")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        runs.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
    }
    let mut workers = Workers(Vec::new());
    for n in 1..=2 {
        let state = root.join(format!("m{n}"));
        std::fs::create_dir_all(&state).unwrap();
        let log = std::fs::File::create(root.join(format!("m{n}.log"))).unwrap();
        let child = Command::new(bin())
            .args(["worker", "--poll", "500ms", "--max-concurrency", "4"])
            .arg("--state-dir")
            .arg(&state)
            .current_dir(&state)
            .env("RALPH_FLOW_STORE", &url)
            .env("RALPH_FLOW_LEASE", "30s")
            .env("SIG_DIR", &sig)
            .envs(IDENTITY)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        workers.0.push(child);
    }
    let store = PgStore::connect(&url).unwrap();
    let t = Instant::now();
    while runs.iter().any(|id| {
        !matches!(
            store.run(id).unwrap().map(|r| r.status),
            Some(RunStatus::Finished | RunStatus::Cancelled)
        )
    }) {
        assert!(
            t.elapsed() < Duration::from_secs(240),
            "the runs did not finish; workers said:\n{}",
            worker_logs(root)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(workers);
    for id in &runs {
        let run = store.run(id).unwrap().unwrap();
        assert_eq!(
            run.exit,
            Some(("success".into(), 0)),
            "run {id}; workers said:\n{}",
            worker_logs(root)
        );
    }

    // Each landing as its `land` stage recorded it: (run, ticket, commit, finished at,
    // stdout).
    let mut landings: Vec<(String, String, String, i64, String)> = Vec::new();
    for id in &runs {
        for n in store.nodes(id).unwrap() {
            if n.node != "land" || n.output["result"] != "landed" {
                continue;
            }
            landings.push((
                id.clone(),
                n.output["ticket"].as_str().unwrap().to_string(),
                n.output["commit"].as_str().unwrap().to_string(),
                n.finished_at,
                n.output["stdout"].as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    let mut tickets: Vec<&str> = landings.iter().map(|l| l.1.as_str()).collect();
    tickets.sort_unstable();
    assert_eq!(tickets, ["a-1", "a-2", "b-1", "b-2"], "{landings:#?}");

    // The remote's main: the base, then the four tickets' commits, one each (each landing
    // pushed a fast-forward of the one before: none was lost or pushed over).
    let main: Vec<String> = git(
        &origin,
        &[
            "rev-list",
            "--first-parent",
            "--reverse",
            &format!("{base}..main"),
        ],
    )
    .lines()
    .map(str::to_string)
    .collect();
    let mut on_main = main.clone();
    on_main.sort();
    let mut commits: Vec<String> = landings.iter().map(|l| l.2.clone()).collect();
    commits.sort();
    assert_eq!(
        on_main, commits,
        "main holds the landed commits: {landings:#?}"
    );
    let ticket_of = |commit: &str| {
        landings
            .iter()
            .find(|l| l.2 == commit)
            .map(|l| l.1.clone())
            .unwrap()
    };
    let order: Vec<String> = main.iter().map(|c| ticket_of(c)).collect();
    let subjects = git(&origin, &["log", "--format=%s", "--reverse", "main"]);
    let expected: Vec<String> = std::iter::once("base".to_string())
        .chain(order.iter().map(|t| format!("ticket {t}")))
        .collect();
    assert_eq!(subjects.lines().collect::<Vec<_>>(), expected);
    for (_, ticket, commit, _, _) in &landings {
        assert_eq!(
            git(&origin, &["show", &format!("{commit}:{ticket}.txt")]),
            *ticket
        );
    }
    // Within each run, main has its tickets in the order its merge queue served them
    // (one at a time: by when each `land` settled).
    for id in &runs {
        let mut served: Vec<&(String, String, String, i64, String)> =
            landings.iter().filter(|l| &l.0 == id).collect();
        served.sort_by_key(|l| l.3);
        let served: Vec<&str> = served.iter().map(|l| l.1.as_str()).collect();
        let side = &served[0][..1];
        let on_main: Vec<&str> = order
            .iter()
            .map(String::as_str)
            .filter(|t| t.starts_with(side))
            .collect();
        assert_eq!(on_main, served, "run {id}");
    }
    assert!(
        order[0].starts_with("b-"),
        "B landed while A waited: {order:?}"
    );
    // Two landed at the same time: run A's first push was refused (B had pushed), and A
    // fetched, rebased, checked and pushed again instead of losing or evicting its ticket.
    // B's second landing may race A's too and be refused in its turn (seen on a loaded
    // machine): that is the same retry, and it landed all the same.
    let refused: Vec<&str> = landings
        .iter()
        .filter(|l| {
            l.4.contains("PUSH REFUSED: main moved on origin (push 1 of 3)")
        })
        .map(|l| l.1.as_str())
        .collect();
    assert!(refused.iter().any(|t| t.starts_with("a-")), "{landings:#?}");
    for (_, ticket, _, _, text) in &landings {
        if text.contains("PUSH REFUSED") {
            assert!(text.contains("RESULT: landed"), "{ticket}: {text}");
        }
    }
    // Nothing was evicted: a refused push is not an eviction.
    for id in &runs {
        let evicted = store
            .nodes(id)
            .unwrap()
            .into_iter()
            .filter(|n| n.node == "land" && n.output["result"] == "evicted")
            .count();
        assert_eq!(evicted, 0, "run {id}");
    }
    // The second round's discovery saw every ticket of its run as merged into the remote's
    // main (the `merged` stage reads the remote in push mode).
    for side in ["a", "b"] {
        let prompt = std::fs::read_to_string(sig.join(format!("prompts/discover-{side}-2")))
            .unwrap_or_default();
        let merged = prompt
            .split("Branches merged into `main`:")
            .nth(1)
            .unwrap_or_default();
        for n in 1..=2 {
            assert!(
                merged.contains(&format!("ticket/{side}-{n}")),
                "round 2 of {side}: {prompt}"
            );
        }
    }
}
