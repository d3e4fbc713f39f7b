//! `ralph-flow check`: report every problem of workflow files at once.

use std::path::PathBuf;

use ralph_flow::diag::{Diagnostics, Severity};
use ralph_flow::fs::RealFs;
use ralph_flow::load::Loader;
use ralph_flow::source::Sources;

#[derive(clap::Args)]
pub(super) struct Args {
    /// The workflow files to check.
    #[arg(required_unless_present = "config")]
    files: Vec<PathBuf>,
    /// Check the user's config file too ($XDG_CONFIG_HOME/ralph-flow/config.toml, else
    /// ~/.config/ralph-flow/config.toml), which runs read when they start.
    #[arg(long)]
    config: bool,
    /// Set a param, as the run would (`--set name=value`); then required params must be set.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// How to print diagnostics.
    #[arg(long, value_enum, default_value_t = Format::Human)]
    format: Format,
    /// Fail on warnings too.
    #[arg(long)]
    deny_warnings: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Format {
    /// Source snippets with labels and hints.
    Human,
    /// One line per diagnostic: file:line:col: severity[CODE]: message.
    Short,
    /// A JSON array.
    Json,
}

pub(super) fn run(args: &Args) -> i32 {
    let Some(sets) = super::sets(&args.set) else {
        return super::EXIT_CONFIG;
    };
    let mut sources = Sources::new();
    let mut all = Diagnostics::default();
    for file in &args.files {
        let mut diags = Diagnostics::default();
        let fs = RealFs;
        let mut loader = Loader::new(&fs, &mut sources, &mut diags);
        if let Some(wf) = loader.load(&super::workflow_arg(file), None) {
            let mut cd = Diagnostics::default();
            let _ = ralph_flow::check::check(&wf, &mut loader, &sets, !sets.is_empty(), &mut cd);
            diags.extend(cd);
        }
        all.extend(diags);
    }
    if args.config {
        if let Err(code) = check_user_config(&mut sources, &mut all) {
            return code;
        }
    }
    let diags = all.into_sorted();
    let errors = diags
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .count();
    let warnings = diags.len() - errors;
    match args.format {
        Format::Human => super::print_diagnostics(&sources, &diags),
        Format::Short => super::print_short(&sources, &diags),
        Format::Json => {
            let items: Vec<serde_json::Value> = diags
                .iter()
                .map(|d| {
                    let place = d.span.map(|s| {
                        let f = sources.get(s.file);
                        let (line, col) = f.line_col(s.start as usize);
                        serde_json::json!({"file": f.path.display().to_string(), "line": line, "column": col, "offset": s.start, "length": s.len()})
                    });
                    serde_json::json!({
                        "code": d.code.as_str(),
                        "severity": if d.severity == Severity::Error { "error" } else { "warning" },
                        "message": d.message,
                        "location": place,
                        "label": d.label,
                        "help": d.help,
                    })
                })
                .collect();
            println!(
                "{}",
                serde_json::to_string_pretty(&items).unwrap_or_default()
            );
        }
    }
    if !matches!(args.format, Format::Json) {
        eprintln!(
            "checked {} file{}: {errors} error{}, {warnings} warning{}",
            args.files.len(),
            if args.files.len() == 1 { "" } else { "s" },
            if errors == 1 { "" } else { "s" },
            if warnings == 1 { "" } else { "s" }
        );
    }
    if errors > 0 || (args.deny_warnings && warnings > 0) {
        super::EXIT_CONFIG
    } else {
        0
    }
}

/// Checks the user's config file, as a run reads it when it starts; says so when there is
/// none. `Err`: it cannot be read (the exit code).
fn check_user_config(sources: &mut Sources, diags: &mut Diagnostics) -> Result<(), i32> {
    let Some(path) = ralph_flow::preset::user_config_file() else {
        eprintln!("no user config file: neither XDG_CONFIG_HOME nor HOME is set");
        return Ok(());
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let _ = ralph_flow::check::notify::user_config(sources, &path, &text, diags);
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("no user config file at {}", path.display());
            Ok(())
        }
        Err(e) => {
            eprintln!(
                "error: cannot read the user config file {}: {e}; fix its permissions or move it away",
                path.display()
            );
            Err(super::EXIT_CONFIG)
        }
    }
}
