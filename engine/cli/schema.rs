//! `ralph-flow schema`: print the JSON Schema of the TOML form.

pub fn run() -> i32 {
    let schema = ralph_flow::model::jsonschema::workflow_schema();
    match serde_json::to_string_pretty(&schema) {
        Ok(text) => {
            println!("{text}");
            0
        }
        Err(err) => {
            eprintln!("error: {err}");
            1
        }
    }
}
