//! Loading a workflow file with everything it extends and includes into one model.
//!
//! **Invariant:** this is the only I/O of check and compile: it reads the workflow's own files
//! (the file, its bases, includes, prompt files, schemas and subflows) and nothing else.

use std::path::{Path, PathBuf};

use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::{Count, Named, Override, StageBody, Workflow, lower::lower};
use crate::source::{FileId, Sources, Span, Spanned};
use crate::syntax::{self, Format};

/// Reads files for the loader; tests and fuzzers use an in-memory one.
pub trait FileSystem {
    /// Reads a whole file as UTF-8 text.
    fn read(&self, path: &Path) -> std::io::Result<String>;
}

/// The real file system.
pub struct RealFs;

impl FileSystem for RealFs {
    fn read(&self, path: &Path) -> std::io::Result<String> {
        let bytes = std::fs::read(path)?;
        String::from_utf8(bytes)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error()))
    }
}

/// The largest workflow, prompt or schema file read (16 MiB); larger files are refused.
pub const MAX_FILE_BYTES: usize = 16 << 20;

/// Everything the loader needs while it works.
pub struct Loader<'a> {
    pub fs: &'a dyn FileSystem,
    pub sources: &'a mut Sources,
    pub diags: &'a mut Diagnostics,
    stack: Vec<PathBuf>,
}

impl<'a> Loader<'a> {
    /// Creates a loader.
    pub fn new(
        fs: &'a dyn FileSystem,
        sources: &'a mut Sources,
        diags: &'a mut Diagnostics,
    ) -> Self {
        Loader {
            fs,
            sources,
            diags,
            stack: Vec::new(),
        }
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
        for inc in std::mem::take(&mut wf.include) {
            if let Some(other) = self.load(&dir.join(&inc.value), Some(inc.span)) {
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
        if let Some(ext) = wf.extends.clone() {
            if let Some(base) = self.load(&dir.join(&ext.workflow.value), Some(ext.workflow.span)) {
                wf = merge_extends(base, wf, self.diags);
            }
        }
        self.stack.pop();
        Some(wf)
    }
}

/// Shows a path relative to the current directory when it lies below it.
pub fn relative(path: &Path) -> PathBuf {
    let cwd = std::env::current_dir().unwrap_or_default();
    path.strip_prefix(&cwd)
        .map_or_else(|_| path.to_path_buf(), Path::to_path_buf)
}

/// Makes a path absolute and removes `.` and `..` parts, without touching the file system.
pub fn normalize(path: &Path) -> PathBuf {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_default().join(path)
    };
    let mut out = PathBuf::new();
    for part in abs.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
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
