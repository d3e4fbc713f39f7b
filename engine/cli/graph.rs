//! `ralph-flow graph` and `ralph-flow explain`: show what a workflow will do.

use std::path::PathBuf;

use ralph_flow::compile::render::{GraphFormat, render};
use ralph_flow::compile::{compile, explain::explain as describe};
use ralph_flow::serve::layout;

#[derive(clap::Args)]
pub(super) struct Args {
    /// The workflow file.
    file: PathBuf,
    /// The drawing format.
    #[arg(long, value_enum, default_value_t = Format::Mermaid)]
    format: Format,
    /// Set a param (`--set name=value`).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

#[derive(clap::Args)]
pub(super) struct ExplainArgs {
    /// The workflow file.
    file: PathBuf,
    /// Set a param (`--set name=value`).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Format {
    Mermaid,
    Dot,
    /// An SVG file, laid out by ralph-flow (no Graphviz needed), as the monitor draws it.
    Svg,
}

pub(super) fn run(args: &Args) -> i32 {
    let Some(sets) = super::sets(&args.set) else {
        return super::EXIT_CONFIG;
    };
    let format = match args.format {
        Format::Mermaid => Some(GraphFormat::Mermaid),
        Format::Dot => Some(GraphFormat::Dot),
        Format::Svg => None,
    };
    let draw = |c: &ralph_flow::check::Checked<'_>| {
        let plan = compile(c);
        match format {
            Some(f) => render(&plan, f),
            None => layout::standalone(&layout::draw(&plan)),
        }
    };
    match super::with_checked(&args.file, &sets, false, draw) {
        Ok(text) => {
            print!("{text}");
            0
        }
        Err(code) => code,
    }
}

pub(super) fn explain(args: &ExplainArgs) -> i32 {
    let Some(sets) = super::sets(&args.set) else {
        return super::EXIT_CONFIG;
    };
    match super::with_checked(&args.file, &sets, false, |c| describe(&compile(c))) {
        Ok(text) => {
            print!("{text}");
            0
        }
        Err(code) => code,
    }
}
