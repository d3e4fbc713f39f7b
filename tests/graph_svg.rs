//! `ralph-flow graph --format svg`: the drawing of every shipped preset kept as a snapshot,
//! and what the drawing promises: gates as hexagons, edge labels apart from each other and
//! from the stages, a `when` on the first stage of a body drawn, resources shown, and large
//! plans laid out left to right in the order the stages are declared.

use std::path::Path;

use ralph_flow::compile::Plan;
use ralph_flow::model::StageKind;
use ralph_flow::serve::layout::{self, Drawing};

fn plan_of(path: &Path, sets: &[(&str, &str)]) -> Plan {
    let sets: Vec<(String, String)> = sets
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    ralph_flow::prepare::prepare(path, &sets)
        .unwrap_or_else(|e| panic!("{}: {}", path.display(), e.render()))
        .plan
}

/// The params a preset needs to be drawn.
fn preset_sets(path: &Path) -> Vec<(&'static str, &'static str)> {
    match path.file_name().and_then(|n| n.to_str()) {
        Some("cairo-driver-reviewer.toml" | "cairo-driver-reviewer-acp.toml") => {
            vec![("prompt", "fix it"), ("rubric", "rubric.md")]
        }
        _ => vec![],
    }
}

fn presets() -> Vec<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("workflows");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("workflows/")
        .map(|e| e.expect("entry").path())
        .filter(|p| matches!(p.extension().and_then(|x| x.to_str()), Some("toml" | "kdl")))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "the shipped presets");
    files
}

fn drawn(path: &Path) -> (Plan, Drawing) {
    let plan = plan_of(path, &preset_sets(path));
    let d = layout::draw(&plan);
    (plan, d)
}

#[test]
fn every_preset_as_svg() {
    insta::glob!("../workflows", "*.{toml,kdl}", |path| {
        let (_, d) = drawn(path);
        insta::assert_snapshot!(layout::standalone(&d));
    });
}

fn meet(a: (i32, i32, i32, i32), b: (i32, i32, i32, i32)) -> bool {
    a.0 < b.0 + b.2 && b.0 < a.0 + a.2 && a.1 < b.1 + b.3 && b.1 < a.1 + a.3
}

/// Edge labels meet no other label, no stage and no region's title, and stay in the drawing.
fn assert_labels_apart(name: &str, d: &Drawing) {
    let labels: Vec<_> = d
        .arrows
        .iter()
        .filter(|a| !a.label.is_empty())
        .map(|a| (a.label.as_str(), a.label_box()))
        .collect();
    for (i, (la, a)) in labels.iter().enumerate() {
        assert!(
            a.0 >= 0 && a.1 >= 0 && a.0 + a.2 <= d.width && a.1 + a.3 <= d.height,
            "{name}: the label {la:?} {a:?} is outside the drawing ({}x{})",
            d.width,
            d.height
        );
        for (lb, b) in &labels[i + 1..] {
            assert!(
                !meet(*a, *b),
                "{name}: the labels {la:?} {a:?} and {lb:?} {b:?} overlap"
            );
        }
        for s in &d.boxes {
            let r = if s.region {
                (s.x, s.y, s.w, 28)
            } else {
                (s.x, s.y, s.w, s.h)
            };
            assert!(
                !meet(*a, r),
                "{name}: the label {la:?} {a:?} covers {} {r:?}",
                s.name
            );
        }
    }
}

#[test]
fn gates_are_hexagons() {
    let mut gates = 0;
    for path in presets() {
        let (plan, d) = drawn(&path);
        let svg = layout::standalone(&d);
        for b in d.boxes.iter().filter(|b| !b.region) {
            let id = plan.find(&b.name).expect("a stage of the plan");
            let is_gate = plan.node(id).kind == StageKind::Gate;
            assert_eq!(b.gate, is_gate, "{}: {}", path.display(), b.name);
            let start = svg
                .find(&format!("data-node=\"{}\"", b.name))
                .expect("the stage is drawn");
            let group = &svg[start..start + svg[start..].find("</g>").expect("its end")];
            if is_gate {
                gates += 1;
                assert!(group.contains("<polygon points="), "{group}");
                assert!(!group.contains("<rect"), "{group}");
                // Six corners.
                let points = group
                    .split("points=\"")
                    .nth(1)
                    .and_then(|p| p.split('"').next())
                    .expect("points");
                assert_eq!(points.split(' ').count(), 12, "{points}");
            } else {
                assert!(group.contains("<rect"), "{group}");
            }
        }
    }
    assert!(gates >= 2, "the presets have gates ({gates})");
}

#[test]
fn route_and_when_labels_do_not_overlap() {
    for path in presets() {
        let (_, d) = drawn(&path);
        assert_labels_apart(&path.display().to_string(), &d);
    }
    // A stage routing to many others, which each say when they run, all in one row.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut text = String::from(
        "name = \"routes\"\n[stages.decide]\nkind = \"command\"\nargv = [\"true\"]\noutput = { extract = \"json\" }\n",
    );
    let targets: Vec<String> = (0..8).map(|i| format!("target_{i}")).collect();
    let cases: Vec<String> = targets
        .iter()
        .map(|t| format!("{t}_case = \"{t}\""))
        .collect();
    text.push_str(&format!(
        "route = {{ on = \"verdict\", cases = {{ {} }} }}\n",
        cases.join(", ")
    ));
    for t in &targets {
        text.push_str(&format!(
            "[stages.{t}]\nkind = \"command\"\nneeds = [\"decide\"]\nwhen = \"stages.decide.ran\"\nargv = [\"true\"]\n"
        ));
    }
    let path = dir.path().join("routes.toml");
    std::fs::write(&path, &text).expect("write");
    let plan = plan_of(&path, &[]);
    let d = layout::draw(&plan);
    assert!(
        d.arrows.iter().filter(|a| a.route).count() >= 8,
        "the routes are drawn: {:?}",
        d.arrows
    );
    assert_labels_apart("routes.toml", &d);
}

#[test]
fn a_when_on_the_first_stage_of_a_body_is_drawn() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("when.toml");
    std::fs::write(
        &path,
        r#"name = "first-when"
[stages.rounds]
kind = "loop"
max_iterations = 3
[stages.rounds.stages.prepare]
kind = "command"
when = "iteration > 1"
argv = ["true"]
[stages.rounds.stages.work]
kind = "command"
needs = ["prepare"]
argv = ["true"]
"#,
    )
    .expect("write");
    let plan = plan_of(&path, &[]);
    let d = layout::draw(&plan);
    let stub = d
        .arrows
        .iter()
        .find(|a| a.when)
        .unwrap_or_else(|| panic!("a stub for the when: {:?}", d.arrows));
    assert_eq!(stub.label, "when iteration > 1");
    let prepare = d
        .boxes
        .iter()
        .find(|b| b.name.ends_with("prepare"))
        .expect("prepare");
    let rounds = d.boxes.iter().find(|b| b.name == "rounds").expect("rounds");
    // The stub ends on top of the stage, below the loop's title.
    assert!(
        stub.path.ends_with(&format!(" {}", prepare.y)),
        "{} ends at {}",
        stub.path,
        prepare.y
    );
    assert!(prepare.y >= rounds.y + 28 + 20, "room for the stub");
    let svg = layout::standalone(&d);
    assert!(svg.contains("class=\"edge when\""), "{svg}");
    assert!(svg.contains(">when iteration &gt; 1</text>"), "{svg}");
    assert_labels_apart("when.toml", &d);
}

#[test]
fn resources_are_shown() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/check/valid/resources.toml");
    let plan = plan_of(&path, &[]);
    let d = layout::draw(&plan);
    let svg = layout::standalone(&d);
    for (stage, resource) in [
        ("train", "gpu"),
        ("evaluate", "gpu"),
        ("merge", "merge_queue"),
    ] {
        let b = d.boxes.iter().find(|b| b.name == stage).expect("the stage");
        assert_eq!(b.resource, format!("holds {resource}"));
        let start = svg.find(&format!("data-node=\"{stage}\"")).expect("drawn");
        let group = &svg[start..start + svg[start..].find("</g>").expect("its end")];
        assert!(
            group.contains("<text class=\"resource\"")
                && group.contains(&format!(">holds {resource}</text>")),
            "{group}"
        );
    }
}

#[test]
fn a_large_plan_reads_left_to_right() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("large.toml");
    // A fan-out of 2,000 stages after one, then a chain after the first of them.
    let mut text =
        String::from("name = \"large\"\n[stages.root]\nkind = \"command\"\nargv = [\"true\"]\n");
    for i in 0..2000 {
        text.push_str(&format!(
            "[stages.s{i:04}]\nkind = \"command\"\nneeds = [\"root\"]\nargv = [\"true\"]\n"
        ));
    }
    for i in 0..3 {
        let before = if i == 0 {
            "s0000".to_string()
        } else {
            format!("c{}", i - 1)
        };
        text.push_str(&format!(
            "[stages.c{i}]\nkind = \"command\"\nneeds = [\"{before}\"]\nargv = [\"true\"]\n"
        ));
    }
    std::fs::write(&path, &text).expect("write");
    let plan = plan_of(&path, &[]);
    let d = layout::draw(&plan);
    let x_of = |name: &str| {
        d.boxes
            .iter()
            .find(|b| b.name == name)
            .map(|b| (b.x, b.y))
            .expect(name)
    };
    let row: Vec<(i32, i32)> = (0..2000).map(|i| x_of(&format!("s{i:04}"))).collect();
    for pair in row.windows(2) {
        assert_eq!(pair[0].1, pair[1].1, "one row");
        assert!(pair[0].0 < pair[1].0, "left to right: {pair:?}");
    }
    // The chain hangs below the row.
    assert!(x_of("c0").1 > row[0].1 && x_of("c1").1 > x_of("c0").1);
}
