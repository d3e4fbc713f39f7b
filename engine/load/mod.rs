//! Loading a workflow file with everything it extends and includes into one model.
//!
//! **Invariant:** this is the only I/O of check and compile: it reads the workflow's own files
//! (the file, its bases, includes, prompt files, schemas and subflows) and nothing else.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::fs::{FileSystem, MAX_FILE_BYTES, normalize, relative};
use crate::model::{Count, Named, Override, Stage, StageBody, Workflow, lower::lower};
use crate::preset::{self, DeclaredSource, MissingSource, Reference, lock};
use crate::source::{FileId, Sources, Span, Spanned};
use crate::syntax::{self, Format};

/// Everything the loader needs while it works.
pub struct Loader<'a> {
    pub fs: &'a dyn FileSystem,
    pub sources: &'a mut Sources,
    pub diags: &'a mut Diagnostics,
    stack: Vec<PathBuf>,
    /// The preset directories searched for bare preset names.
    pub roots: Vec<preset::Root>,
    /// Directories searched for prompt files before the workflow's own `prompt_path`
    /// (`RALPH_FLOW_PROMPT_PATH`).
    pub prompt_dirs: Vec<PathBuf>,
    /// Git sources named but not in the cache (see [`MissingSource`]).
    pub missing: Vec<MissingSource>,
    /// Every git source declared by a loaded file.
    pub declared: Vec<DeclaredSource>,
    /// Cached copies of git sources already checked against their lockfile.
    /// Cached copies hashed so far, each with what is wrong with it (`None`: nothing).
    verified: Vec<(PathBuf, Option<String>)>,
    /// The git sources each loaded file sees (its own, then its bases'), by its path.
    visible: HashMap<PathBuf, Vec<DeclaredSource>>,
    /// Prompt search directories named by files that are not fetched presets: a fetched
    /// preset's prompt may come from them (a team replacing one of its prompts).
    trusted_dirs: std::cell::RefCell<Vec<PathBuf>>,
}

impl<'a> Loader<'a> {
    /// Creates a loader.
    pub fn new(
        fs: &'a dyn FileSystem,
        sources: &'a mut Sources,
        diags: &'a mut Diagnostics,
    ) -> Self {
        let prompt_dirs = std::env::var_os("RALPH_FLOW_PROMPT_PATH")
            .map(|v| {
                std::env::split_paths(&v)
                    .filter(|p| !p.as_os_str().is_empty())
                    .map(|p| normalize(&p))
                    .collect()
            })
            .unwrap_or_default();
        Loader {
            fs,
            sources,
            diags,
            stack: Vec::new(),
            roots: preset::search_roots(),
            prompt_dirs,
            missing: Vec::new(),
            declared: Vec::new(),
            verified: Vec::new(),
            trusted_dirs: std::cell::RefCell::default(),
            visible: HashMap::new(),
        }
    }

    /// Resolves a workflow reference written in a file that declares `sources`: a path
    /// relative to that file, or a preset. Reports what cannot be resolved.
    pub fn resolve(&mut self, r: &Spanned<String>, sources: &[DeclaredSource]) -> Option<PathBuf> {
        let dir = crate::fs::base_dir(self.sources, r.span);
        match preset::parse_reference(&r.value) {
            Reference::Path(p) => Some(dir.join(p)),
            Reference::Invalid => {
                self.diags.push(
                    Diagnostic::new(
                        Code::UnknownPreset,
                        r.span,
                        format!(
                            "`{}` is neither a workflow file nor a preset name",
                            r.value
                        ),
                    )
                    .label("not a path nor a preset")
                    .help("a path ends in `.toml` or `.kdl`; a preset is `NAME` or `SOURCE:NAME` (letters, digits, `-`, `_`)"),
                );
                None
            }
            Reference::Preset { source: None, name } => {
                if let Some((path, _)) = preset::find(self.fs, &self.roots, name) {
                    return Some(path);
                }
                let names = preset::all_names(self.fs, &self.roots);
                self.diags.push(
                    Diagnostic::new(
                        Code::UnknownPreset,
                        r.span,
                        format!("there is no preset `{name}`"),
                    )
                    .label("unknown preset")
                    .suggest(name, names.iter().map(String::as_str))
                    .help_or(format!(
                        "`ralph-flow presets` lists them ({}); a path must end in `.toml` or `.kdl`",
                        names.join(", ")
                    )),
                );
                None
            }
            Reference::Preset {
                source: Some(src),
                name,
            } => {
                let (root, _) = self.git_root(src, sources, r.span)?;
                if let Some(path) = preset::find_in(self.fs, &root, name) {
                    return Some(path);
                }
                let names: Vec<String> = preset::list_in(self.fs, &root)
                    .into_iter()
                    .map(|(n, _)| n)
                    .collect();
                self.diags.push(
                    Diagnostic::new(
                        Code::UnknownPreset,
                        r.span,
                        format!("source `{src}` has no preset `{name}`"),
                    )
                    .label("unknown preset")
                    .suggest(name, names.iter().map(String::as_str))
                    .help_or(format!(
                        "its presets: {}",
                        if names.is_empty() {
                            "none (it holds no workflows/NAME.toml)".to_string()
                        } else {
                            names.join(", ")
                        }
                    )),
                );
                None
            }
        }
    }

    /// The preset directory of a declared git source and its lockfile entry, verified
    /// against each other; what is wrong is reported as diagnostics.
    pub fn source_root(&mut self, d: &DeclaredSource) -> Option<(PathBuf, lock::Locked)> {
        let name = d.source.name.value.clone();
        self.git_root(&name, std::slice::from_ref(d), d.source.name.span)
    }

    /// The preset directory of a git source and its lockfile entry, once its cached copy
    /// matches the lockfile.
    /// `sources` are those the naming file sees: its own, then its bases' (each with the
    /// directory of the file that declares it, where its lockfile is).
    fn git_root(
        &mut self,
        name: &str,
        sources: &[DeclaredSource],
        at: Span,
    ) -> Option<(PathBuf, lock::Locked)> {
        let Some(declared) = sources
            .iter()
            .find(|s| s.source.name.value == name)
            .cloned()
        else {
            self.diags.push(
                Diagnostic::new(
                    Code::UnknownPreset,
                    at,
                    format!("this file declares no source `{name}`"),
                )
                .label("unknown source")
                .suggest(name, sources.iter().map(|s| s.source.name.value.as_str()))
                .help_or_syntax(
                    format!(
                        "declare it in this file: [sources.{name}] with `git` (a URL or a path) and `rev` (a tag, branch or commit)"
                    ),
                    format!(
                        "declare it in this file: source \"{name}\" git=\"URL or path\" rev=\"tag, branch or commit\""
                    ),
                ),
            );
            return None;
        };
        let (src, dir) = (declared.source, declared.decl_dir);
        let dir = dir.as_path();
        if let Some(p) = &src.path {
            let rel = Path::new(&p.value);
            if rel.is_absolute()
                || rel
                    .components()
                    .any(|c| matches!(c, std::path::Component::ParentDir))
            {
                self.diags.push(
                    Diagnostic::new(
                        Code::InvalidValue,
                        p.span,
                        format!("`{}` leaves the repository", p.value),
                    )
                    .help("`path` is a directory inside the repository, such as `presets`"),
                );
                return None;
            }
        }
        let lock_path = lock::path_in(dir);
        let lock = if self.fs.exists(&lock_path) {
            let file = self.read(&lock_path, Some(src.span), Code::PresetSource, "lockfile")?;
            match lock::LockFile::parse(&self.sources.get(file).text) {
                Ok(l) => l,
                Err(e) => {
                    self.diags.push(
                        Diagnostic::new(
                            Code::PresetSource,
                            src.span,
                            format!("{} is not valid: {e}", relative(&lock_path).display()),
                        )
                        .help("fix it, or delete it and run `ralph-flow presets fetch` to pin every source again"),
                    );
                    return None;
                }
            }
        } else {
            lock::LockFile::default()
        };
        let entry = lock.find(&src.git.value, &src.rev.value).cloned();
        // Not in the lockfile, or not in the cache: what `presets fetch` and `run` fetch.
        let mut not_fetched = |locked: Option<lock::Locked>, message: String, label| {
            self.missing.push(MissingSource {
                declared: DeclaredSource {
                    decl_dir: dir.to_path_buf(),
                    source: src.clone(),
                },
                locked,
            });
            self.diags.push(
                Diagnostic::new(Code::PresetSource, src.span, message)
                    .label(label)
                    .help("run `ralph-flow presets fetch WORKFLOW` to fetch it and pin it in ralph-flow.lock (`ralph-flow run` does this by itself)"),
            );
        };
        let Some(entry) = entry else {
            let message = format!(
                "source `{name}` (`{}` at `{}`) is not fetched yet",
                src.git.value, src.rev.value
            );
            not_fetched(None, message, "not in ralph-flow.lock");
            return None;
        };
        let checkout = preset::git::checkout_dir(&entry.commit);
        if !checkout.is_dir() {
            let message = format!(
                "source `{name}` is pinned to commit {} but the cache ({}) has no copy of it",
                entry.commit,
                preset::cache_dir().display()
            );
            not_fetched(Some(entry), message, "not in the cache");
            return None;
        }
        let verdict = match self.verified.iter().find(|(d, _)| *d == checkout) {
            Some((_, v)) => v.clone(),
            None => {
                let v = match preset::tree_hash(&checkout) {
                    Ok(h) if h == entry.hash => None,
                    Ok(h) => Some(format!(
                        "the cached copy of source `{name}` ({}) does not match ralph-flow.lock: its content hash is {h}, the lockfile says {}",
                        checkout.display(),
                        entry.hash
                    )),
                    Err(e) => Some(format!(
                        "cannot read the cached copy of source `{name}` ({}): {e}",
                        checkout.display()
                    )),
                };
                self.verified.push((checkout.clone(), v.clone()));
                v
            }
        };
        if let Some(message) = verdict {
            self.diags.push(
                Diagnostic::new(Code::PresetSource, src.span, message)
                    .label("verification failed")
                    .help(format!(
                        "the cache or the lockfile was changed by hand: delete {} and run `ralph-flow presets fetch WORKFLOW`; to pin a new commit, `ralph-flow presets update WORKFLOW`",
                        checkout.display()
                    )),
            );
            return None;
        }
        let root = match &src.path {
            Some(p) => normalize(&checkout.join(&p.value)),
            None => checkout,
        };
        Some((root, entry))
    }

    /// The file a stage's `prompt_file` names: the first of `RALPH_FLOW_PROMPT_PATH`'s
    /// directories, then the workflow's `prompt_path`, that has it; else the file relative to
    /// the file that names it.
    pub fn prompt_file(&self, prompt_path: &[Spanned<String>], pf: &Spanned<String>) -> PathBuf {
        let name = Path::new(&pf.value);
        if name.is_absolute() {
            return name.to_path_buf();
        }
        let dirs: Vec<PathBuf> = self
            .prompt_dirs
            .iter()
            .cloned()
            .chain(prompt_path.iter().filter_map(|d| {
                let dir = normalize(&crate::fs::base_dir(self.sources, d.span).join(&d.value));
                match self.checkout_of(d.span) {
                    // A fetched preset's search directory must be its own.
                    Some(root) => dir.starts_with(&root).then_some(dir),
                    None => {
                        self.trusted_dirs.borrow_mut().push(dir.clone());
                        Some(dir)
                    }
                }
            }))
            .collect();
        for dir in dirs {
            let candidate = normalize(&dir.join(name));
            if self.fs.exists(&candidate) {
                return candidate;
            }
        }
        crate::fs::base_dir(self.sources, pf.span).join(name)
    }

    /// Reads a file into the source map, reporting a read failure at `from` with `code`.
    pub fn read(
        &mut self,
        path: &Path,
        from: Option<Span>,
        code: Code,
        what: &str,
    ) -> Option<FileId> {
        let shown = relative(&normalize(path));
        let path = shown.as_path();
        if let Some(why) = from.and_then(|f| self.escapes_checkout(f, path)) {
            self.diags.push(
                Diagnostic::new(code, from, format!("{what} `{}` {why}", path.display()))
                    .label("named by a preset fetched from a git source")
                    .help("a fetched preset may read only the files of its own repository (and prompts the workflows using it provide); fix the preset, or ask its owners to"),
            );
            return None;
        }
        if let Some(id) = self.sources.find(path) {
            return Some(id);
        }
        match self.fs.read(path) {
            Ok(text) if text.len() > MAX_FILE_BYTES => {
                self.diags.push(
                    Diagnostic::new(
                        code,
                        from,
                        format!("{what} `{}` is larger than 16 MiB", path.display()),
                    )
                    .help("split it into smaller files"),
                );
                None
            }
            Ok(text) => Some(self.sources.add(path, text)),
            Err(err) => {
                self.diags.push(
                    Diagnostic::new(
                        code,
                        from,
                        format!("cannot read {what} `{}`: {err}", path.display()),
                    )
                    .label("this file")
                    .help("check the path; it is relative to the file that names it"),
                );
                None
            }
        }
    }

    /// The checkout of a fetched git source that the file of a span lies in, if it does.
    fn checkout_of(&self, span: Span) -> Option<PathBuf> {
        let file = normalize(&std::path::absolute(&self.sources.get(span.file).path).ok()?);
        let checkouts = normalize(&std::path::absolute(preset::git::checkouts_dir()).ok()?);
        let commit = file.strip_prefix(&checkouts).ok()?.components().next()?;
        Some(checkouts.join(commit))
    }

    /// Why a file named by a fetched preset may not be read: it lies outside the preset's
    /// checkout (by an absolute path, by `..`, or through a symbolic link), and is neither a
    /// built-in preset file nor in a prompt directory that a workflow of the user names.
    fn escapes_checkout(&self, from: Span, path: &Path) -> Option<String> {
        let root = self.checkout_of(from)?;
        if crate::fs::is_builtin(path) {
            return None;
        }
        let absolute = normalize(&std::path::absolute(path).ok()?);
        let trusted = self
            .prompt_dirs
            .iter()
            .chain(self.trusted_dirs.borrow().iter())
            .filter_map(|d| std::path::absolute(d).ok())
            .any(|d| absolute.starts_with(normalize(&d)));
        if trusted {
            return None;
        }
        if !absolute.starts_with(&root) {
            return Some("lies outside the preset's checkout".into());
        }
        // Inside by its name; a symbolic link may still lead out.
        match (absolute.canonicalize(), root.canonicalize()) {
            (Ok(real), Ok(root)) if !real.starts_with(&root) => Some(format!(
                "is a symbolic link that leads outside the preset's checkout (to {})",
                real.display()
            )),
            _ => None,
        }
    }

    /// Loads a workflow file and merges in the files it extends and includes.
    pub fn load(&mut self, path: &Path, from: Option<Span>) -> Option<Workflow> {
        let canonical = normalize(path);
        if let Some(pos) = self.stack.iter().position(|p| *p == canonical) {
            let chain: Vec<String> = self.stack[pos..]
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            self.diags.push(
                Diagnostic::new(
                    Code::FileCycle,
                    from,
                    format!(
                        "workflow files form a cycle: {} → {}",
                        chain.join(" → "),
                        canonical.display()
                    ),
                )
                .help("remove one of the extends, include or subflow references"),
            );
            return None;
        }
        let file = self.read(&canonical, from, Code::MissingWorkflowFile, "workflow file")?;
        let text = self.sources.get(file).text.clone();
        let before = self.diags.error_count();
        let table = syntax::parse(file, &text, Format::from_path(&canonical), self.diags);
        if self.diags.error_count() > before {
            // A file that does not parse has nothing more worth reporting.
            return None;
        }
        let mut wf = lower(file, &table, self.diags);
        self.stack.push(canonical.clone());
        let dir = canonical
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let own: Vec<DeclaredSource> = wf
            .sources
            .iter()
            .map(|s| DeclaredSource {
                decl_dir: dir.clone(),
                source: s.clone(),
            })
            .collect();
        self.declared.extend(own.iter().cloned());
        // The base first: the file's own references then see its sources and, after them,
        // those its bases declare (the extends reference itself sees only its own).
        let mut base = None;
        if let Some(ext) = wf.extends.clone() {
            match self.resolve(&ext.workflow, &own) {
                Some(path) => {
                    base = self.load(&path, Some(ext.workflow.span));
                    if base.is_none() {
                        wf.overrides.clear();
                    }
                    let inherited = self.visible.get(&normalize(&path)).cloned();
                    let mut visible = own.clone();
                    for d in inherited.unwrap_or_default() {
                        if !visible
                            .iter()
                            .any(|v| v.source.name.value == d.source.name.value)
                        {
                            visible.push(d);
                        }
                    }
                    self.visible.insert(canonical.clone(), visible);
                }
                // Without its base, the file's overrides and references cannot be checked.
                None => wf.overrides.clear(),
            }
        }
        let sources = self
            .visible
            .get(&canonical)
            .cloned()
            .unwrap_or_else(|| own.clone());
        self.visible.insert(canonical.clone(), sources.clone());
        self.resolve_subflows(&mut wf.stages, &sources, &mut wf.broken);
        for inc in std::mem::take(&mut wf.include) {
            let Some(path) = self.resolve(&inc, &sources) else {
                continue;
            };
            if let Some(other) = self.load(&path, Some(inc.span)) {
                merge_include(&mut wf, other, self.diags);
            }
        }
        if wf.extends.is_none() {
            for o in &wf.overrides {
                self.diags.push(
                    Diagnostic::new(Code::BadOverride, o.stage.span, format!("override of `{}` in a file that extends nothing", o.stage.value))
                        .help("overrides change stages of the extended workflow: add `extends`, or edit the stage itself"),
                );
            }
        }
        if let Some(base) = base {
            wf = merge_extends(base, wf, self.diags);
        }
        self.stack.pop();
        Some(wf)
    }

    /// Turns subflow references to presets into the paths of their files; a reference that
    /// cannot be resolved is reported here and dropped.
    fn resolve_subflows(
        &mut self,
        stages: &mut [Stage],
        sources: &[DeclaredSource],
        broken: &mut Vec<String>,
    ) {
        for s in stages.iter_mut() {
            if let StageBody::Subflow { workflow, .. } = &mut s.body {
                if let Some(w) = workflow.as_mut() {
                    if matches!(preset::parse_reference(&w.value), Reference::Path(_)) {
                        continue;
                    }
                    match self.resolve(w, sources) {
                        Some(path) => w.value = path.to_string_lossy().into_owned(),
                        None => {
                            *workflow = None;
                            broken.push(s.id.value.clone());
                        }
                    }
                }
            }
            if let Some(children) = s.children_mut() {
                self.resolve_subflows(children, sources, broken);
            }
        }
    }
}

fn duplicate(kind: &str, name: &Spanned<String>, first: Span, diags: &mut Diagnostics, help: &str) {
    diags.push(
        Diagnostic::new(
            Code::Duplicate,
            name.span,
            format!("{kind} `{}` is defined twice", name.value),
        )
        .label("defined again here")
        .related(first, "first defined here")
        .help(help.to_string()),
    );
}

/// Adds included definitions; a name defined in both files is an error.
fn add_all<T: Named>(into: &mut Vec<T>, from: Vec<T>, kind: &str, diags: &mut Diagnostics) {
    for item in from {
        if let Some(prev) = into.iter().find(|p| p.name().value == item.name().value) {
            let first = prev.name().span;
            duplicate(
                kind,
                item.name(),
                first,
                diags,
                "each name may be defined in only one of the included files",
            );
        } else {
            into.push(item);
        }
    }
}

/// Adds definitions of an extending file, replacing the base's definitions of the same name.
fn replace_all<T: Named>(base: &mut Vec<T>, child: Vec<T>) {
    for item in child {
        base.retain(|b| b.name().value != item.name().value);
        base.push(item);
    }
}

fn merge_include(wf: &mut Workflow, inc: Workflow, diags: &mut Diagnostics) {
    wf.broken.extend(inc.broken.iter().cloned());
    add_all(&mut wf.params, inc.params, "param", diags);
    add_all(&mut wf.agents, inc.agents, "agent", diags);
    add_all(&mut wf.resources, inc.resources, "resource", diags);
    add_all(&mut wf.exits, inc.exits, "exit", diags);
    add_all(&mut wf.stages, inc.stages, "stage", diags);
    wf.prompt_path.extend(inc.prompt_path);
    wf.file_roots.extend(inc.file_roots);
}

/// Merges a file into the base it extends: the child's agents replace the base's agents of
/// the same name, its params add to (or redefine) the base's, `extends.params` set the base's
/// param defaults, its stages are added, and its overrides change the base's stages.
fn merge_extends(mut base: Workflow, child: Workflow, diags: &mut Diagnostics) -> Workflow {
    let ext = child.extends.clone();
    base.broken.extend(child.broken.iter().cloned());
    if let Some(ext) = &ext {
        for (name, value) in &ext.params {
            match base.params.iter_mut().find(|p| p.name.value == name.value) {
                Some(p) => p.default = Some(value.clone()),
                None => diags.push(
                    Diagnostic::new(
                        Code::UnknownParam,
                        name.span,
                        format!("the base workflow has no param `{}`", name.value),
                    )
                    .suggest(
                        &name.value,
                        base.params.iter().map(|p| p.name.value.as_str()),
                    ),
                ),
            }
        }
    }
    replace_all(&mut base.params, child.params);
    replace_all(&mut base.agents, child.agents);
    replace_all(&mut base.resources, child.resources);
    replace_all(&mut base.exits, child.exits);
    for o in &child.overrides {
        apply_override(&mut base.stages, o, diags);
    }
    for stage in child.stages {
        if let Some(prev) = find_stage(&base.stages, &stage.id.value) {
            let first = prev.id.span;
            duplicate(
                "stage",
                &stage.id,
                first,
                diags,
                "to change a stage of the base workflow, use [overrides.ID]",
            );
        } else {
            base.stages.push(stage);
        }
    }
    let mut prompt_path = child.prompt_path;
    prompt_path.append(&mut base.prompt_path);
    base.prompt_path = prompt_path;
    base.file_roots.extend(child.file_roots);
    base.worktree = child.worktree.or(base.worktree);
    base.sources = child.sources;
    base.file = child.file;
    base.name = child.name;
    base.version = child.version.or(base.version);
    base.description = child.description.or(base.description);
    base.extends = ext;
    base.max_concurrency = child.max_concurrency.or(base.max_concurrency);
    base.budget = child.budget.or(base.budget);
    base
}

fn find_stage<'s>(stages: &'s [crate::model::Stage], id: &str) -> Option<&'s crate::model::Stage> {
    stages.iter().find_map(|s| {
        if s.id.value == id {
            Some(s)
        } else {
            find_stage(s.children(), id)
        }
    })
}

fn find_stage_mut<'s>(
    stages: &'s mut [crate::model::Stage],
    id: &str,
) -> Option<&'s mut crate::model::Stage> {
    for s in stages.iter_mut() {
        if s.id.value == id {
            return Some(s);
        }
        if let Some(children) = s.children_mut() {
            if let Some(found) = find_stage_mut(children, id) {
                return Some(found);
            }
        }
    }
    None
}

fn apply_override(stages: &mut [crate::model::Stage], o: &Override, diags: &mut Diagnostics) {
    let names: Vec<String> = all_ids(stages);
    let Some(stage) = find_stage_mut(stages, &o.stage.value) else {
        diags.push(
            Diagnostic::new(
                Code::BadOverride,
                o.stage.span,
                format!("the base workflow has no stage `{}`", o.stage.value),
            )
            .label("overrides a stage that does not exist")
            .suggest(&o.stage.value, names.iter().map(String::as_str)),
        );
        return;
    };
    let not_for = |key: &str, span: Span, kind: &str, diags: &mut Diagnostics| {
        diags.push(
            Diagnostic::new(
                Code::BadOverride,
                span,
                format!(
                    "stage `{}` is a {kind} stage; `{key}` cannot be overridden on it",
                    o.stage.value
                ),
            )
            .help("override only keys the stage's kind has"),
        );
    };
    let kind = stage.kind.value.as_str();
    match &mut stage.body {
        StageBody::Agent {
            agent,
            prompt,
            prompt_file,
        } => {
            if let Some(p) = &o.prompt {
                *prompt = Some(p.clone());
                *prompt_file = None;
            }
            if let Some(p) = &o.prompt_file {
                *prompt_file = Some(p.clone());
                *prompt = None;
            }
            if let Some(a) = &o.agent {
                *agent = Some(a.clone());
            }
        }
        _ => {
            for (key, span) in [
                ("prompt", o.prompt.as_ref().map(|p| p.span)),
                ("prompt_file", o.prompt_file.as_ref().map(|p| p.span)),
                ("agent", o.agent.as_ref().map(|p| p.span)),
            ] {
                if let Some(span) = span {
                    not_for(key, span, kind, diags);
                }
            }
        }
    }
    match &mut stage.body {
        StageBody::Loop { max_iterations, .. } => {
            if let Some(m) = &o.max_iterations {
                *max_iterations = Some(m.clone());
            }
        }
        _ => {
            if let Some(m) = &o.max_iterations {
                not_for("max_iterations", m.span, kind, diags);
            }
        }
    }
    match &mut stage.body {
        StageBody::ForEach {
            max_concurrency, ..
        }
        | StageBody::Group {
            max_concurrency, ..
        } => {
            if let Some(m) = &o.max_concurrency {
                *max_concurrency = Some(m.clone());
            }
        }
        _ => {
            if let Some(m) = &o.max_concurrency {
                not_for("max_concurrency", m.span, kind, diags);
            }
        }
    }
    if o.timeout.is_some() {
        stage.timeout = o.timeout.clone();
    }
    if o.idle_timeout.is_some() {
        stage.idle_timeout = o.idle_timeout.clone();
    }
    if o.retries.is_some() {
        stage.retries = o.retries.clone();
    }
    if o.when.is_some() {
        stage.when = o.when.clone();
    }
    if o.budget.is_some() {
        stage.budget = o.budget.clone();
    }
}

fn all_ids(stages: &[crate::model::Stage]) -> Vec<String> {
    let mut out = Vec::new();
    for s in stages {
        out.push(s.id.value.clone());
        out.extend(all_ids(s.children()));
    }
    out
}

/// Returns the literal value of a count, if it is not a template.
pub fn literal(count: &Spanned<Count>) -> Option<u64> {
    match count.value {
        Count::Literal(n) => Some(n),
        Count::Template(_) => None,
    }
}
