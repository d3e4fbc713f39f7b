//! The committed JSON Schema matches the format's spec, and every shipped workflow fits it.

use std::path::Path;

#[test]
fn committed_schema_is_up_to_date() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let committed: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("schemas/workflow.schema.json")).expect("read schema"),
    )
    .expect("json");
    let generated = ralph_flow::model::jsonschema::workflow_schema();
    assert!(
        committed == generated,
        "schemas/workflow.schema.json is stale: run `cargo run -- schema > schemas/workflow.schema.json`"
    );
}

#[test]
fn shipped_toml_workflows_validate_against_the_schema() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let schema = ralph_flow::model::jsonschema::workflow_schema();
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let mut dirs = vec![
        root.join("workflows"),
        root.join("tests/fixtures/check/valid"),
    ];
    let mut seen = 0;
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("toml") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read");
            let value: toml::Value = toml::from_str(&text).expect("toml");
            let json = serde_json::to_value(value).expect("json");
            let errors: Vec<String> = validator
                .iter_errors(&json)
                .map(|e| format!("{e} at {}", e.instance_path()))
                .collect();
            assert!(
                errors.is_empty(),
                "{}: {}",
                path.display(),
                errors.join("; ")
            );
            seen += 1;
        }
    }
    assert!(seen >= 1, "no TOML workflow was validated");
}

#[test]
fn workflow_spec_documents_every_key_and_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let spec =
        std::fs::read_to_string(root.join("WORKFLOW-SPEC.md")).expect("read WORKFLOW-SPEC.md");
    assert!(
        spec.contains(&ralph_flow::model::jsonschema::markdown_reference()),
        "WORKFLOW-SPEC.md's key reference is stale: paste the output of `ralph-flow schema --markdown`"
    );
    for code in ralph_flow::diag::Code::ALL {
        let row = format!("| {} | ", code.as_str());
        assert!(
            spec.contains(&row),
            "WORKFLOW-SPEC.md does not list {}",
            code.as_str()
        );
        assert!(
            spec.contains(code.summary()),
            "WORKFLOW-SPEC.md does not explain {}",
            code.as_str()
        );
    }
}
