//! kill -9 at many points of a run with parallel branches, a loop and a fan-out: every
//! resume finishes with the same outputs as an uninterrupted run, and no node that was
//! committed before a kill runs again.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::Project;
use ralph_flow::store::Store;

const WORKFLOW: &str = r#"name = "crash"

[stages.a]
kind = "command"
argv = ["rec", "0.15", "alpha"]

[stages.b]
kind = "command"
argv = ["rec", "0.25", "beta"]

[stages.refine]
kind = "loop"
needs = ["a", "b"]
max_iterations = 5
until = "stages.step.output.stdout | trim == '3'"

[stages.refine.stages.step]
kind = "command"
argv = ["rec", "0.1", "{{ iteration }}"]

[stages.refine.stages.check]
kind = "check"
needs = ["step"]
argv = ["rec", "0.05", "checked {{ iteration }}"]

[stages.items]
kind = "for_each"
needs = ["a"]
over = "['x', 'y', 'z']"
max_concurrency = 2

[stages.items.stages.work]
kind = "command"
argv = ["rec", "0.2", "{{ item }}-{{ stages.a.output.stdout | trim }}"]

[stages.join]
kind = "command"
needs = ["refine", "items"]
argv = ["rec", "0.05", "{{ stages.step.output.stdout | trim }} {{ stages.items.output.results | map(attribute='stdout') | map('trim') | join(',') }}"]
"#;

fn outputs(out: &common::Out) -> serde_json::Value {
    out.json["outputs"].clone()
}

#[test]
fn kill_9_at_many_points_then_resume_gives_the_same_outputs_and_never_reruns_a_committed_node() {
    let clean = Project::new();
    clean.workflow("w.toml", WORKFLOW);
    let expected = clean.run(&["run", "w.toml", "--json"]);
    assert_eq!(expected.code, 0, "{}", expected.stderr);
    let expected = outputs(&expected);
    assert_eq!(expected["join"]["stdout"], "3 x-alpha,y-alpha,z-alpha\n");

    let mut tested = 0;
    for delay_ms in [
        30u64, 90, 150, 210, 270, 330, 390, 450, 510, 570, 630, 700, 780,
    ] {
        let p = Project::new();
        p.workflow("w.toml", WORKFLOW);
        // Kill the run, then (for every other point) kill its first resume too.
        let kills: &[u64] = if delay_ms % 60 == 30 {
            &[delay_ms, 120]
        } else {
            &[delay_ms]
        };
        // (log offset, nodes committed) at each kill.
        let mut checkpoints: Vec<(usize, HashSet<String>)> = Vec::new();
        let mut run_id: Option<String> = None;
        for &k in kills {
            let child = match &run_id {
                None => p.spawn(&["run", "w.toml", "--json"]),
                Some(id) => p.spawn(&["resume", id, "--json"]),
            };
            std::thread::sleep(Duration::from_millis(k));
            child.signal(nix::sys::signal::Signal::SIGKILL);
            let _ = child.finish();
            let Some(store) = p.store() else { break };
            let Some(run) = store.runs(1).unwrap().into_iter().next() else {
                break;
            };
            if run.status == ralph_flow::store::RunStatus::Finished {
                break;
            }
            let committed: HashSet<String> = store
                .nodes(&run.id)
                .unwrap()
                .into_iter()
                .filter(|n| {
                    !n.node.starts_with('@') && n.state == ralph_flow::store::NodeState::Done
                })
                .filter(|n| !matches!(n.node.as_str(), "refine" | "items"))
                .map(|n| node_dir(&run.dir, &n.scope, &n.node))
                .collect();
            checkpoints.push((p.probe_log().len(), committed));
            run_id = Some(run.id);
        }
        let Some(id) = run_id else { continue };
        if checkpoints.is_empty() {
            continue;
        }
        tested += 1;
        let out = p.run(&["resume", &id, "--json"]);
        assert_eq!(
            out.code, 0,
            "resume after a kill at {delay_ms} ms: {}",
            out.stderr
        );
        assert_eq!(outputs(&out), expected, "kill at {delay_ms} ms");
        let log = p.probe_log();
        for (offset, committed) in &checkpoints {
            for line in log[*offset..].lines() {
                if let Some(node) = line.strip_prefix("start ") {
                    assert!(
                        !committed.contains(node),
                        "kill at {delay_ms} ms: {node} was committed, yet it ran again"
                    );
                }
            }
        }
    }
    assert!(
        tested >= 8,
        "only {tested} kill points landed inside the run"
    );
}

fn node_dir(run_dir: &str, scope: &str, node: &str) -> String {
    let mut p = std::path::PathBuf::from(run_dir);
    for part in scope.split('/').filter(|s| !s.is_empty()) {
        p.push(part);
    }
    p.push(node);
    p.to_string_lossy().into_owned()
}
