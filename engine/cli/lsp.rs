//! `ralph-flow lsp`: the language server, over stdin and stdout.

#[derive(clap::Args)]
pub(super) struct Args {
    /// Accepted for editors that always pass it: the server only speaks over stdio.
    #[arg(long)]
    stdio: bool,
}

pub(super) fn run(_args: &Args) -> i32 {
    ralph_flow::lsp::run_stdio()
}
