//! `ralph-flow schema`: print the JSON Schema of the TOML form, or the key reference.

#[derive(clap::Args)]
pub(super) struct Args {
    /// Print the key reference as Markdown (as in WORKFLOW-SPEC.md) instead.
    #[arg(long)]
    markdown: bool,
}

pub(super) fn run(args: &Args) -> i32 {
    if args.markdown {
        print!("{}", ralph_flow::model::jsonschema::markdown_reference());
        return 0;
    }
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
