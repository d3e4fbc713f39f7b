//! `ralph-flow presets` (list, fetch, update) and `ralph-flow init`.

use ralph_flow::diag::error_chain;
use std::path::{Path, PathBuf};

use ralph_flow::diag::Diagnostics;
use ralph_flow::fs::{FileSystem, RealFs};
use ralph_flow::load::Loader;
use ralph_flow::model::{StageBody, Workflow};
use ralph_flow::preset::{self, Origin, Reference, Root, git};
use ralph_flow::source::Sources;

use super::EXIT_CONFIG;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(super) struct Args {
    #[command(subcommand)]
    action: Option<Action>,
    /// Also list the presets of the git sources these workflows declare.
    #[arg(long = "from", value_name = "WORKFLOW")]
    from: Vec<PathBuf>,
    /// Print the list as JSON.
    #[arg(long)]
    json: bool,
    /// Print only the names, one per line, without loading the presets (what the shell
    /// completion scripts of `ralph-flow completions` call).
    #[arg(long, conflicts_with = "json")]
    names: bool,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Fetch the git sources a workflow names that are not in the cache, and pin new ones in
    /// ralph-flow.lock beside the file that declares them.
    Fetch {
        /// The workflow (with everything it extends, includes and calls).
        workflow: PathBuf,
        /// Set a param, as the run would.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
    },
    /// Resolve git sources anew from their `rev` and pin the commits they point to now.
    Update {
        /// The workflow.
        workflow: PathBuf,
        /// The sources to update (default: every one the workflow's files declare).
        sources: Vec<String>,
    },
}

pub(super) fn run(args: &Args) -> i32 {
    match &args.action {
        Some(Action::Fetch { workflow, set }) => {
            let Some(sets) = super::sets(set) else {
                return EXIT_CONFIG;
            };
            sync(workflow, &sets, None)
        }
        Some(Action::Update { workflow, sources }) => sync(workflow, &[], Some(sources)),
        None => list(args),
    }
}

fn sync(workflow: &Path, sets: &[(String, String)], update: Option<&[String]>) -> i32 {
    match super::sync::sync(workflow, sets, update) {
        Ok(done) => {
            for s in &done {
                super::report_fetch(s);
            }
            // What is left wrong with the workflow (a missing file, a tampered cache, ...).
            if let Err(code) = super::with_checked(workflow, sets, false, |_| ()) {
                return code;
            }
            if done.is_empty() {
                println!(
                    "every git source of {} is pinned and in the cache",
                    workflow.display()
                );
            }
            0
        }
        Err(e) => {
            super::print_diagnostics(&e.sources, &e.diagnostics);
            EXIT_CONFIG
        }
    }
}

/// The names of the presets in these roots, once each, in the order they resolve; nothing is
/// loaded, so a completion script may call it on every Tab.
fn names(fs: &RealFs, roots: &[Root]) -> i32 {
    let mut seen = std::collections::HashSet::new();
    for root in roots {
        for (name, _) in preset::list_in(fs, &root.dir) {
            if seen.insert(name.clone()) {
                println!("{name}");
            }
        }
    }
    0
}

/// One listed preset.
#[derive(serde::Serialize)]
struct Entry {
    name: String,
    origin: String,
    file: String,
    description: Option<String>,
    /// An earlier directory has a preset of the same name, which is the one `NAME` means.
    shadowed: bool,
    params: Vec<ParamInfo>,
}

#[derive(serde::Serialize)]
struct ParamInfo {
    name: String,
    #[serde(rename = "type")]
    ty: &'static str,
    default: Option<serde_json::Value>,
    required: bool,
    description: Option<String>,
}

fn origin_text(o: &Origin) -> String {
    match o {
        Origin::Builtin => "built-in".into(),
        Origin::Installed => "installed".into(),
        Origin::Git {
            source,
            git,
            commit,
        } => format!("{source}: {git} @ {}", &commit[..commit.len().min(12)]),
    }
}

/// Loads a preset's file (for its description, params and prompt directories), with the
/// files it was built from.
fn info(path: &Path) -> Result<(Workflow, Sources), DoesNotLoad> {
    let fs = RealFs;
    let mut sources = Sources::new();
    let mut diags = Diagnostics::default();
    let wf = Loader::new(&fs, &mut sources, &mut diags).load(path, None);
    match wf {
        Some(wf) if !diags.has_errors() => Ok((wf, sources)),
        _ => Err(DoesNotLoad {
            diagnostics: diags.into_sorted(),
            sources,
        }),
    }
}

/// A preset whose file does not load: its diagnostics, with the files to show them.
struct DoesNotLoad {
    sources: Sources,
    diagnostics: Vec<ralph_flow::diag::Diagnostic>,
}

impl DoesNotLoad {
    /// The diagnostics, a line each.
    fn lines(&self) -> String {
        ralph_flow::diag::render_short(&self.sources, &self.diagnostics)
    }
}

fn params(wf: &Workflow) -> Vec<ParamInfo> {
    wf.params
        .iter()
        .map(|p| ParamInfo {
            name: p.name.value.clone(),
            ty: p.ty.value.as_str(),
            default: p.default.as_ref().map(|d| d.to_json()),
            required: p.default.is_none(),
            description: p.description.as_ref().map(|d| d.value.clone()),
        })
        .collect()
}

fn list(args: &Args) -> i32 {
    let fs = RealFs;
    let mut roots: Vec<Root> = preset::search_roots();
    if args.names && args.from.is_empty() {
        return names(&fs, &roots);
    }
    let mut code = 0;
    for w in &args.from {
        let mut sources = Sources::new();
        let mut diags = Diagnostics::default();
        let mut loader = Loader::new(&fs, &mut sources, &mut diags);
        loader.load(w, None);
        // Each declared source, verified, even when nothing names it.
        for d in std::mem::take(&mut loader.declared) {
            if let Some((dir, locked)) = loader.source_root(&d) {
                roots.push(Root {
                    dir,
                    origin: Origin::Git {
                        source: d.source.name.value,
                        git: d.source.git.value,
                        commit: locked.commit,
                    },
                });
            }
        }
        drop(loader);
        if diags.has_errors() {
            super::print_diagnostics(&sources, &diags.into_sorted());
            code = EXIT_CONFIG;
        }
    }
    let mut entries = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    for root in &roots {
        for (name, path) in preset::list_in(&fs, &root.dir) {
            let (description, params) = match info(&path) {
                Ok((wf, _)) => (
                    wf.description.as_ref().map(|d| d.value.clone()),
                    params(&wf),
                ),
                Err(e) => (
                    Some(format!("(does not load: {})", e.lines().trim())),
                    Vec::new(),
                ),
            };
            // Bare names resolve through the search roots only; a git source's presets are
            // named SOURCE:NAME and shadow nothing.
            let shown = match &root.origin {
                Origin::Git { source, .. } => format!("{source}:{name}"),
                _ => name.clone(),
            };
            let shadowed = seen.contains(&shown);
            seen.push(shown.clone());
            entries.push(Entry {
                name: shown,
                origin: origin_text(&root.origin),
                file: ralph_flow::fs::relative(&path).display().to_string(),
                description,
                shadowed,
                params,
            });
        }
    }
    if args.names {
        let mut seen = std::collections::HashSet::new();
        for e in entries.iter().filter(|e| seen.insert(e.name.clone())) {
            println!("{}", e.name);
        }
        return code;
    }
    if args.json {
        match serde_json::to_string_pretty(&entries) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("error: {e}");
                return 1;
            }
        }
        return code;
    }
    for e in &entries {
        println!(
            "{}  ({}{})  {}",
            e.name,
            e.origin,
            if e.shadowed { ", shadowed" } else { "" },
            e.file
        );
        if let Some(d) = &e.description {
            println!("    {d}");
        }
        let width = e.params.iter().map(|p| p.name.len()).max().unwrap_or(0);
        for p in &e.params {
            let value = match &p.default {
                Some(v) => format!("= {v}"),
                None => "(required)".to_string(),
            };
            println!(
                "      {:width$}  {:6} {}{}",
                p.name,
                p.ty,
                value,
                p.description
                    .as_ref()
                    .map(|d| format!("  {d}"))
                    .unwrap_or_default()
            );
        }
        println!();
    }
    println!(
        "Use one with `extends = \"NAME\"` (or `SOURCE:NAME` for a git source), run it with `ralph-flow run NAME`, or start a project workflow with `ralph-flow init NAME`."
    );
    if let Some(dir) = preset::user_presets_dir() {
        println!(
            "Installed presets are read from RALPH_FLOW_PRESET_PATH and {}.",
            dir.display()
        );
    }
    code
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Toml,
    Kdl,
}

#[derive(clap::Args)]
pub(super) struct InitArgs {
    /// The preset to build on: a name (`ralph-flow presets` lists them), or `SOURCE:NAME` with
    /// `--git` and `--rev`.
    preset: String,
    /// Where to write the workflow (default: `workflows/PRESET.toml`, or `.kdl`).
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// The new workflow's name (default: the preset's).
    #[arg(long)]
    name: Option<String>,
    /// The syntax of the new file.
    #[arg(long, value_enum, default_value_t = Format::Toml)]
    format: Format,
    /// The git repository of a `SOURCE:NAME` preset (a URL, or a path).
    #[arg(long, value_name = "URL")]
    git: Option<String>,
    /// The revision of `--git` to pin (a tag, branch or commit).
    #[arg(long, value_name = "REV")]
    rev: Option<String>,
    /// Overwrite the file if it exists.
    #[arg(long)]
    force: bool,
}

/// What the scaffold says about the preset and its source.
struct Scaffold<'a> {
    reference: &'a str,
    name: String,
    wf: Workflow,
    prompts: Vec<String>,
    prompt_dir: String,
    source: Option<(&'a str, &'a str, &'a str)>,
    out: &'a Path,
}

pub(super) fn init(args: &InitArgs) -> i32 {
    let fail = |msg: String| {
        eprintln!("error: {msg}");
        EXIT_CONFIG
    };
    let fs = RealFs;
    let (source_name, preset_name) = match preset::parse_reference(&args.preset) {
        Reference::Preset { source, name } => (source, name),
        _ => {
            return fail(format!(
                "`{}` is not a preset name; `ralph-flow presets` lists them",
                args.preset
            ));
        }
    };
    let ext = match args.format {
        Format::Toml => "toml",
        Format::Kdl => "kdl",
    };
    let out = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from("workflows").join(format!("{preset_name}.{ext}")));
    if out.exists() && !args.force {
        return fail(format!(
            "{} exists; choose another file with -o, or overwrite it with --force",
            out.display()
        ));
    }
    let out_dir = ralph_flow::fs::normalize(out.parent().unwrap_or(Path::new("")));
    let mut git_written = String::new();
    let path = match (source_name, &args.git, &args.rev) {
        (None, None, None) => match preset::find(&fs, &preset::search_roots(), preset_name) {
            Some((p, _)) => p,
            None => {
                let names = preset::all_names(&fs, &preset::search_roots());
                return fail(format!(
                    "there is no preset `{preset_name}`; the presets: {}",
                    names.join(", ")
                ));
            }
        },
        (Some(_), Some(g), Some(rev)) => {
            if let Err(e) = std::fs::create_dir_all(&out_dir) {
                return fail(format!("cannot create {}: {e}", out_dir.display()));
            }
            // A path on the command line is relative to where the command runs; in the
            // workflow it is relative to the workflow's directory.
            git_written = if git::is_url(g) {
                g.clone()
            } else {
                let abs = ralph_flow::fs::normalize(Path::new(g));
                relative_to(&abs, &out_dir)
            };
            let url = git::resolve_url(&git_written, &out_dir);
            let fetched = match git::fetch(&url, rev, None) {
                Ok(f) => f,
                Err(e) => return fail(error_chain(&e)),
            };
            let source = source_name.unwrap_or_default();
            if let Err(e) = preset::pin(&out_dir, source, &git_written, rev, &fetched) {
                return fail(error_chain(&e));
            }
            match preset::find_in(&fs, &fetched.dir, preset_name) {
                Some(p) => p,
                None => {
                    return fail(format!(
                        "{g} at {rev} has no preset `{preset_name}` (no workflows/{preset_name}.toml)"
                    ));
                }
            }
        }
        (Some(_), _, _) => {
            return fail(format!(
                "`{}` names a git source: give its repository and revision with --git URL --rev REV",
                args.preset
            ));
        }
        (None, _, _) => {
            return fail(
                "--git and --rev go with a `SOURCE:NAME` preset (such as `team:spider`)".into(),
            );
        }
    };
    let (wf, sources) = match info(&path) {
        Ok(x) => x,
        Err(e) => return fail(format!("the preset does not load:\n{}", e.lines())),
    };
    let mut prompts: Vec<String> = Vec::new();
    for d in &wf.prompt_path {
        let dir = ralph_flow::fs::base_dir(&sources, d.span).join(&d.value);
        for f in fs.list(&ralph_flow::fs::normalize(&dir)) {
            if let Some(n) = f.file_name().and_then(|n| n.to_str()) {
                prompts.push(n.to_string());
            }
        }
    }
    prompts.sort();
    prompts.dedup();
    let name = args.name.clone().unwrap_or_else(|| preset_name.to_string());
    let cwd = std::env::current_dir().unwrap_or_default();
    let prompt_dir = relative_to(&cwd.join("prompts").join(preset_name), &out_dir);
    let sc = Scaffold {
        reference: &args.preset,
        name,
        wf,
        prompts,
        prompt_dir,
        source: match (source_name, &args.rev) {
            (Some(s), Some(r)) => Some((s, git_written.as_str(), r.as_str())),
            _ => None,
        },
        out: &out,
    };
    let text = match args.format {
        Format::Toml => toml_scaffold(&sc),
        Format::Kdl => kdl_scaffold(&sc),
    };
    if let Err(e) = std::fs::create_dir_all(&out_dir).and_then(|()| std::fs::write(&out, text)) {
        return fail(format!("cannot write {}: {e}", out.display()));
    }
    println!("wrote {}", out.display());
    // The prompt directory the workflow points to exists, with a note on what goes there,
    // so that `check` has nothing to warn about (RF059) in a fresh project.
    let prompts_dir = cwd.join("prompts").join(preset_name);
    let empty = std::fs::read_dir(&prompts_dir).map_or(true, |mut d| d.next().is_none());
    if empty {
        let note = prompts_dir.join("README.md");
        let text = format!(
            "# Prompts of this project's `{preset_name}` workflow\n\nA file here named like one of \
             the preset's prompts replaces that prompt; the others stay the preset's.{}\n",
            if sc.prompts.is_empty() {
                String::new()
            } else {
                format!("\nThe preset's prompts: {}.", sc.prompts.join(", "))
            }
        );
        match std::fs::create_dir_all(&prompts_dir).and_then(|()| std::fs::write(&note, text)) {
            Ok(()) => println!("wrote {}", ralph_flow::fs::relative(&note).display()),
            Err(e) => return fail(format!("cannot write {}: {e}", note.display())),
        }
    }
    println!(
        "next: ralph-flow check {0}; ralph-flow run {0}",
        out.display()
    );
    println!(
        "to replace one of the preset's prompts, put a file of the same name in {}",
        ralph_flow::fs::relative(&cwd.join("prompts").join(preset_name)).display()
    );
    0
}

/// `target` written relative to `base` (both absolute).
fn relative_to(target: &Path, base: &Path) -> String {
    let t: Vec<_> = target.components().collect();
    let b: Vec<_> = base.components().collect();
    let common = t.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut out = PathBuf::new();
    for _ in common..b.len() {
        out.push("..");
    }
    for c in &t[common..] {
        out.push(c);
    }
    out.to_string_lossy().into_owned()
}

/// A JSON value as a TOML (or KDL) literal: strings, numbers, booleans and lists of them are
/// written the same way in both.
fn literal(v: &serde_json::Value) -> String {
    v.to_string()
}

/// The stages a scaffold names in its override example, with their kinds.
fn stage_list(wf: &Workflow) -> Vec<String> {
    fn walk(stages: &[ralph_flow::model::Stage], out: &mut Vec<String>) {
        for s in stages {
            out.push(format!("{} ({})", s.id.value, s.kind().value.as_str()));
            walk(s.children(), out);
        }
    }
    let mut out = Vec::new();
    walk(&wf.stages, &mut out);
    out
}

fn first_agent_stage(wf: &Workflow) -> Option<String> {
    fn walk(stages: &[ralph_flow::model::Stage]) -> Option<String> {
        stages.iter().find_map(|s| {
            if matches!(s.body, StageBody::Agent { .. }) {
                Some(s.id.value.clone())
            } else {
                walk(s.children())
            }
        })
    }
    walk(&wf.stages)
}

/// Wraps text into comment lines of at most ~92 columns.
fn comment(prefix: &str, text: &str) -> String {
    let mut out = String::new();
    let mut line = String::from(prefix);
    for word in text.split_whitespace() {
        if line.len() + word.len() + 1 > 92 && line.len() > prefix.len() {
            out.push_str(line.trim_end());
            out.push('\n');
            line = String::from(prefix);
        }
        line.push_str(word);
        line.push(' ');
    }
    if line.len() > prefix.len() {
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn header(sc: &Scaffold<'_>, c: &str) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "{c} A project-local workflow built on the preset `{}`.\n",
        sc.reference
    ));
    if let Some(d) = &sc.wf.description {
        s.push_str(&comment(&format!("{c} "), &d.value));
    }
    let shown = sc.out.display();
    s.push_str(&format!(
        "{c}\n{c}   ralph-flow check {shown}\n{c}   ralph-flow explain {shown}\n{c}   ralph-flow run {shown}\n{c}\n"
    ));
    s.push_str(&comment(
        &format!("{c} "),
        &format!(
            "Prompts: a file in {} named like one of the preset's prompts replaces that prompt; the others stay the preset's.{}",
            sc.prompt_dir,
            if sc.prompts.is_empty() {
                String::new()
            } else {
                format!(" The preset's prompts: {}.", sc.prompts.join(", "))
            }
        ),
    ));
    s
}

fn toml_scaffold(sc: &Scaffold<'_>) -> String {
    use ralph_flow::syntax::emit::to_toml;
    let mut s = header(sc, "#");
    // What the file sets is written by the TOML emitter, so it reads back as written.
    s.push_str(&to_toml(&scaffold_tree(sc, false)));
    if let Some(t) = scaffold_tree_sources(sc) {
        s.push_str("\n# Pinned in ralph-flow.lock beside this file; `ralph-flow presets update` moves the pin.\n");
        s.push_str(&to_toml(&t));
    }
    s.push_str(&format!(
        "\n[extends]\n{}\n[extends.params]\n",
        to_toml(&one_entry("workflow", str_value(sc.reference)))
    ));
    s.push_str(
        "# The preset's params, with their defaults; set them here or with --set at run time.\n",
    );
    for p in &sc.wf.params {
        match &p.default {
            Some(v) => {
                for line in to_toml(&one_entry(&p.name.value, v.clone())).lines() {
                    s.push_str(&format!("# {line}\n"));
                }
            }
            None => s.push_str(&format!("# {} = \"\"  # required\n", p.name.value)),
        }
        if let Some(d) = &p.description {
            s.push_str(&comment("#   ", &d.value));
        }
    }
    s.push_str(&overrides_help(sc, "#"));
    if let Some(stage) = first_agent_stage(&sc.wf) {
        s.push_str(&format!(
            "# [overrides.{stage}]\n# timeout = \"30m\"\n# agent = \"my-agent\"\n"
        ));
    }
    s.push_str(&agents_help(sc, "#", false));
    s.push_str("\n# Agents, stages and exits of your own go below; a stage of the preset is changed with an\n# override, not redefined.\n");
    s
}

fn kdl_scaffold(sc: &Scaffold<'_>) -> String {
    use ralph_flow::syntax::emit::to_kdl;
    let mut s = header(sc, "//");
    // What the file sets is written by the KDL emitter, so it reads back as written.
    s.push_str(&to_kdl(&scaffold_tree(sc, true)));
    if let Some(t) = scaffold_tree_sources(sc) {
        s.push_str("\n// Pinned in ralph-flow.lock beside this file; `ralph-flow presets update` moves the pin.\n");
        s.push_str(&to_kdl(&t));
    }
    let extends = to_kdl(&one_entry(
        "extends",
        table_value(vec![("workflow", str_value(sc.reference))]),
    ));
    s.push_str(&format!("\n{} {{\n", extends.trim_end()));
    s.push_str("    // The preset's params, with their defaults; set them by uncommenting the `params`\n    // node below and editing it, or with --set at run time.\n");
    for p in &sc.wf.params {
        let required = if p.default.is_none() {
            " (required)"
        } else {
            ""
        };
        let text = p.description.as_ref().map_or("", |d| d.value.as_str());
        s.push_str(&comment(
            "    //   ",
            &format!("{}{required}: {text}", p.name.value),
        ));
    }
    // Written by the KDL emitter, so that uncommenting it gives valid KDL v2.
    for line in kdl_params(sc.reference, &sc.wf.params) {
        s.push_str(&format!("    // {line}\n"));
    }
    s.push_str("}\n");
    s.push_str(&overrides_help(sc, "//"));
    if let Some(stage) = first_agent_stage(&sc.wf) {
        s.push_str(&format!(
            "// override \"{stage}\" timeout=\"30m\" agent=\"my-agent\"\n"
        ));
    }
    s.push_str(&agents_help(sc, "//", true));
    s.push_str("\n// Agents, stages and exits of your own go below; a stage of the preset is changed with an\n// override, not redefined.\n");
    s
}

/// A string value for a scaffold's tree (spans do not matter to the emitter).
fn str_value(s: &str) -> ralph_flow::syntax::tree::Value {
    use ralph_flow::syntax::tree::{Value, ValueKind};
    Value::new(nowhere(), ValueKind::Str(s.to_string()))
}

fn nowhere() -> ralph_flow::source::Span {
    ralph_flow::source::Span::new(ralph_flow::source::FileId(0), 0..0)
}

fn table_value(
    entries: Vec<(&str, ralph_flow::syntax::tree::Value)>,
) -> ralph_flow::syntax::tree::Value {
    use ralph_flow::syntax::tree::{Table, Value, ValueKind};
    let t = Table {
        entries: entries
            .into_iter()
            .map(|(k, v)| one_entry(k, v).entries.remove(0))
            .collect(),
    };
    Value::new(nowhere(), ValueKind::Table(t))
}

/// A table of one key.
fn one_entry(key: &str, value: ralph_flow::syntax::tree::Value) -> ralph_flow::syntax::tree::Table {
    use ralph_flow::syntax::tree::{Entry, Table};
    Table {
        entries: vec![Entry {
            key: key.to_string(),
            key_span: nowhere(),
            value,
        }],
    }
}

/// What a scaffold sets at its top: its name and its prompt search path.
fn scaffold_tree(sc: &Scaffold<'_>, _kdl: bool) -> ralph_flow::syntax::tree::Table {
    use ralph_flow::syntax::tree::{Value, ValueKind};
    let mut t = one_entry("name", str_value(&sc.name));
    t.entries.push(
        one_entry(
            "prompt_path",
            Value::new(nowhere(), ValueKind::Array(vec![str_value(&sc.prompt_dir)])),
        )
        .entries
        .remove(0),
    );
    t
}

/// The git source a scaffold declares, if it comes from one.
fn scaffold_tree_sources(sc: &Scaffold<'_>) -> Option<ralph_flow::syntax::tree::Table> {
    let (name, g, rev) = sc.source?;
    Some(one_entry(
        "sources",
        table_value(vec![(
            name,
            table_value(vec![("git", str_value(g)), ("rev", str_value(rev))]),
        )]),
    ))
}

/// The preset's agents, and how to point one elsewhere (a local server, another CLI).
fn agents_help(sc: &Scaffold<'_>, c: &str, kdl: bool) -> String {
    let agents = &sc.wf.agents;
    if agents.is_empty() {
        return String::new();
    }
    let list: Vec<String> = agents
        .iter()
        .map(|a| {
            let model = a
                .model
                .as_ref()
                .map(|m| format!(", model {}", m.value))
                .unwrap_or_default();
            format!("{} ({}{model})", a.name.value, a.kind.value.as_str())
        })
        .collect();
    let mut s = String::from("\n");
    s.push_str(&comment(
        &format!("{c} "),
        &format!(
            "Its agents: {}. Define an agent of the same name below to replace it, for example to point it at a local OpenAI-compatible server (an HTTP model writes no files: stages that expect an agent to edit files need a CLI agent such as claude, codex or gemini, with `permissions = \"edit\"`).",
            list.join("; ")
        ),
    ));
    let name = &agents[0].name.value;
    if kdl {
        s.push_str(&format!(
            "{c} agent {} kind=\"openai\" model=\"my-model\" base_url=\"http://127.0.0.1:8080/v1\"\n",
            literal(&name.clone().into())
        ));
    } else {
        s.push_str(&format!(
            "{c} [agents.{name}]\n{c} kind = \"openai\"\n{c} model = \"my-model\"\n{c} base_url = \"http://127.0.0.1:8080/v1\"\n"
        ));
    }
    s
}

/// How the KDL emitter writes the params of `extends` (a required one as `""`): the lines
/// inside the `extends` node.
fn kdl_params(reference: &str, params: &[ralph_flow::model::Param]) -> Vec<String> {
    use ralph_flow::syntax::tree::{Entry, Table, Value, ValueKind};
    let Some(span) = params.first().map(|p| p.span) else {
        return Vec::new();
    };
    let entry = |key: &str, value: Value| Entry {
        key: key.to_string(),
        key_span: span,
        value,
    };
    let values = Table {
        entries: params
            .iter()
            .map(|p| {
                let value = p
                    .default
                    .clone()
                    .unwrap_or_else(|| Value::new(span, ValueKind::Str(String::new())));
                entry(&p.name.value, value)
            })
            .collect(),
    };
    let extends = Table {
        entries: vec![
            entry(
                "workflow",
                Value::new(span, ValueKind::Str(reference.to_string())),
            ),
            entry("params", Value::new(span, ValueKind::Table(values))),
        ],
    };
    let root = Table {
        entries: vec![entry(
            "extends",
            Value::new(span, ValueKind::Table(extends)),
        )],
    };
    let text = ralph_flow::syntax::emit::to_kdl(&root);
    let lines: Vec<&str> = text.lines().collect();
    // Between `extends ... {` and its closing `}`, one level less indented.
    lines
        .iter()
        .skip(1)
        .take(lines.len().saturating_sub(2))
        .map(|l| l.strip_prefix("    ").unwrap_or(l).to_string())
        .collect()
}

fn overrides_help(sc: &Scaffold<'_>, c: &str) -> String {
    let mut s = String::from("\n");
    s.push_str(&comment(
        &format!("{c} "),
        "Change a stage of the preset with an override: prompt, prompt_file, agent, timeout, idle_timeout, retries, max_iterations, max_concurrency, when, optional, budget. Overriding a stage or key the preset lacks is an error (RF056).",
    ));
    s.push_str(&comment(
        &format!("{c} "),
        &format!("Its stages: {}.", stage_list(&sc.wf).join(", ")),
    ));
    s
}
