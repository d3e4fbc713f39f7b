//! `ralph-flow fmt --to kdl|toml FILE`: convert a workflow between its two syntaxes.

use std::path::PathBuf;

use ralph_flow::diag::Diagnostics;
use ralph_flow::source::Sources;
use ralph_flow::syntax::{self, Format, emit};

#[derive(clap::Args)]
pub(super) struct Args {
    /// The syntax to write.
    #[arg(long, value_enum)]
    to: To,
    /// The workflow file to read.
    file: PathBuf,
    /// Write here instead of standard output.
    #[arg(long, short)]
    output: Option<PathBuf>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum To {
    Kdl,
    Toml,
}

pub(super) fn run(args: &Args) -> i32 {
    let text = match std::fs::read_to_string(&args.file) {
        Ok(t) => t,
        Err(err) => {
            eprintln!("error: cannot read `{}`: {err}", args.file.display());
            return super::EXIT_CONFIG;
        }
    };
    let mut sources = Sources::new();
    let file = sources.add(&args.file, text.clone());
    let mut diags = Diagnostics::default();
    let tree = syntax::parse(file, &text, Format::from_path(&args.file), &mut diags);
    // Lowering reports unknown keys and wrong types, which a conversion would silently carry.
    let _ = ralph_flow::model::lower::lower(file, &tree, &mut diags);
    if diags.has_errors() {
        super::print_diagnostics(&sources, &diags.into_sorted());
        eprintln!("not converted: fix the errors first");
        return super::EXIT_CONFIG;
    }
    let out = match args.to {
        To::Kdl => emit::to_kdl(&tree),
        To::Toml => emit::to_toml(&tree),
    };
    match &args.output {
        Some(path) => match std::fs::write(path, out) {
            Ok(()) => 0,
            Err(err) => {
                eprintln!("error: cannot write `{}`: {err}", path.display());
                1
            }
        },
        None => {
            print!("{out}");
            0
        }
    }
}
