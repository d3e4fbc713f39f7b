//! Subcommands of the command line, one file each.

mod cancel;
mod check;
mod fmt;
mod graph;
mod lsp;
mod presets;
mod prune;
mod run;
mod runs;
mod schema;
mod serve;
mod shell;
mod store;
mod sync;
mod worker;

use std::io::IsTerminal;
use std::path::Path;

use clap::{Parser, Subcommand};
use ralph_flow::check::Checked;
use ralph_flow::diag::{Diagnostic, Diagnostics, render, render_short};
use ralph_flow::fs::RealFs;
use ralph_flow::load::Loader;
use ralph_flow::model::Workflow;
use ralph_flow::params::parse_set;
use ralph_flow::source::Sources;

pub(crate) use ralph_flow::exit::CONFIG as EXIT_CONFIG;

#[derive(Parser)]
#[command(
    name = "ralph-flow",
    version,
    about = "A declarative, durable workflow engine for Ralph loops of coding agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check workflow files and report every problem at once.
    Check(check::Args),
    /// Draw a workflow as Mermaid or Graphviz DOT.
    Graph(graph::Args),
    /// Describe a workflow's plan in words.
    Explain(graph::ExplainArgs),
    /// Print the JSON Schema of the TOML form of workflow files.
    Schema(schema::Args),
    /// Convert a workflow between TOML and KDL.
    Fmt(fmt::Args),
    /// Run a workflow.
    Run(run::RunArgs),
    /// Continue a run after a crash, Ctrl-C or a wait on a gate.
    Resume(run::ResumeArgs),
    /// Approve a gate of a run.
    Approve(run::AnswerArgs),
    /// Reject a gate of a run; the comment is the next attempt's feedback.
    Reject(run::AnswerArgs),
    /// Cancel a queued, running or waiting run: its stages are stopped, its gates withdrawn,
    /// and it cannot be resumed.
    Cancel(cancel::Args),
    /// List runs, newest first.
    Runs(runs::RunsArgs),
    /// Show a run: its settled stages, the gates it waits on and its usage.
    Status(runs::StatusArgs),
    /// Show a run's events in order.
    Logs(runs::LogsArgs),
    /// Write a run's attempt records (prompts, answers, outputs, feedback) out as files.
    Export(runs::ExportArgs),
    /// List the built-in and installed presets; fetch or update git presets.
    Presets(presets::Args),
    /// Write a project-local workflow that extends a preset.
    Init(presets::InitArgs),
    /// Serve the language server (LSP over stdio) for workflow files and their prompts.
    Lsp(lsp::Args),
    /// Print a shell completion script (bash, zsh, fish, powershell, elvish).
    Completions(shell::CompletionsArgs),
    /// Print the man page (roff), or write one per subcommand with --out-dir.
    Man(shell::ManArgs),
    /// Serve a live web monitor of the runs (on 127.0.0.1, behind a printed access token).
    Serve(serve::Args),
    /// Claim queued runs (`run --detach`) from a shared PostgreSQL store and carry them out,
    /// until Ctrl-C or SIGTERM; runs whose worker died are taken over once their lease ends.
    Worker(worker::Args),
    /// Remove runs that ended, by age or count per workflow (the same as `runs prune`).
    Gc(prune::Args),
}

/// Runs the command line and returns the process exit code.
pub(crate) fn main() -> i32 {
    // Before any thread starts (they inherit it): a write beyond `ulimit -f` fails with
    // EFBIG, which stops a run as resumable, naming the limit, instead of SIGXFSZ killing
    // ralph-flow without a word.
    ralph_flow::backend::process::limit::block_file_size_signal();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("RUST_LOG"))
        // Every line is masked and escaped like everything else printed (so no colour).
        .with_writer(|| ralph_flow::secrets::RedactingWriter(std::io::stderr()))
        .with_ansi(false)
        .init();
    // What this process prints is masked with the environment's well-known secrets (a run
    // adds its own when it starts; `logs`, `status` and `export` mask with these).
    ralph_flow::secrets::register_well_known();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            let code = if err.use_stderr() { EXIT_CONFIG } else { 0 };
            let _ = err.print();
            return code;
        }
    };
    match cli.command {
        Command::Check(args) => check::run(&args),
        Command::Graph(args) => graph::run(&args),
        Command::Explain(args) => graph::explain(&args),
        Command::Schema(args) => schema::run(&args),
        Command::Fmt(args) => fmt::run(&args),
        Command::Run(args) => run::run(&args),
        Command::Resume(args) => run::resume(&args),
        Command::Approve(args) => run::answer(&args, true),
        Command::Reject(args) => run::answer(&args, false),
        Command::Cancel(args) => cancel::run(&args),
        Command::Runs(args) => runs::runs(&args),
        Command::Status(args) => runs::status(&args),
        Command::Logs(args) => runs::logs(&args),
        Command::Export(args) => runs::export(&args),
        Command::Presets(args) => presets::run(&args),
        Command::Init(args) => presets::init(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Lsp(args) => lsp::run(&args),
        Command::Completions(args) => shell::completions(&args),
        Command::Man(args) => shell::man(&args),
        Command::Worker(args) => worker::run(&args),
        Command::Gc(args) => prune::run(&args),
    }
}

/// Tells whether diagnostics on stderr may use color.
pub(crate) fn color() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// Prints diagnostics to stderr in the long form.
pub(crate) fn print_diagnostics(sources: &Sources, diags: &[Diagnostic]) {
    if !diags.is_empty() {
        eprint!("{}", render(sources, diags, color()));
    }
}

/// Prints diagnostics to stderr one per line.
pub(crate) fn print_short(sources: &Sources, diags: &[Diagnostic]) {
    eprint!("{}", render_short(sources, diags));
}

/// Parses `--set` arguments, printing errors.
pub(crate) fn sets(raw: &[String]) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    for s in raw {
        match parse_set(s) {
            Ok(kv) => out.push(kv),
            Err(e) => {
                eprintln!("error: --set {e}");
                return None;
            }
        }
    }
    Some(out)
}

/// The workflow a command-line argument names: the file, or, when there is no such file and
/// the argument is a preset name (`spider`), that preset.
pub(crate) fn workflow_arg(arg: &Path) -> std::path::PathBuf {
    if arg.exists() {
        return arg.to_path_buf();
    }
    if let Some(ralph_flow::preset::Reference::Preset { source: None, name }) =
        arg.to_str().map(ralph_flow::preset::parse_reference)
    {
        if let Some((path, _)) =
            ralph_flow::preset::find(&RealFs, &ralph_flow::preset::search_roots(), name)
        {
            return path;
        }
    }
    arg.to_path_buf()
}

/// Tells on stderr that a git preset source was fetched.
pub(crate) fn report_fetch(s: &ralph_flow::preset::Synced) {
    eprintln!(
        "{} source `{}` ({} at {}) -> {} ({})",
        s.action,
        s.name,
        s.git,
        s.rev,
        &s.commit[..s.commit.len().min(12)],
        ralph_flow::fs::relative(&s.lock).display()
    );
}

/// Loads a workflow file and everything it refers to.
pub(crate) fn load(
    path: &Path,
    sources: &mut Sources,
    diags: &mut Diagnostics,
) -> Option<Workflow> {
    let fs = RealFs;
    let mut loader = Loader::new(&fs, sources, diags);
    loader.load(path, None)
}

/// Loads and checks a workflow, then hands the checked workflow to `f`. Prints diagnostics;
/// returns the exit code for a configuration error when there are errors.
pub(crate) fn with_checked<T>(
    path: &Path,
    sets: &[(String, String)],
    require_params: bool,
    f: impl FnOnce(&Checked<'_>) -> T,
) -> Result<T, i32> {
    let mut sources = Sources::new();
    let mut diags = Diagnostics::default();
    let path = &workflow_arg(path);
    let Some(wf) = load(path, &mut sources, &mut diags) else {
        print_diagnostics(&sources, &diags.into_sorted());
        return Err(EXIT_CONFIG);
    };
    let fs = RealFs;
    let result = {
        let mut loader = Loader::new(&fs, &mut sources, &mut diags);
        let mut check_diags = Diagnostics::default();
        let checked =
            ralph_flow::check::check(&wf, &mut loader, sets, require_params, &mut check_diags);
        let out = checked.as_ref().map(f);
        (out, check_diags)
    };
    let (out, check_diags) = result;
    diags.extend(check_diags);
    let has_errors = diags.has_errors();
    print_diagnostics(&sources, &diags.into_sorted());
    match out {
        Some(v) if !has_errors => Ok(v),
        _ => Err(EXIT_CONFIG),
    }
}
