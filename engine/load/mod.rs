//! Loading a workflow file with everything it extends and includes into one model.
//!
//! **Invariant:** this is the only I/O of check and compile: it reads the workflow's own files
//! (the file, its bases, includes, prompt files, schemas and subflows) and nothing else.
//!
//! This file holds the [`Loader`] and [`Loader::load`]; `sources.rs` resolves references
//! (presets, git sources and their lockfile), `files.rs` reads files and finds prompt files,
//! `merge.rs` merges includes and bases, `overrides.rs` applies overrides.

mod files;
mod merge;
mod overrides;
mod sources;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::fs::{FileSystem, normalize};
use crate::model::lower::{lower, lower_included};
use crate::model::{Stage, StageBody, Workflow};
use crate::preset::{self, DeclaredSource, MissingSource, Reference};
use crate::source::{FileId, Sources, Span};
use crate::syntax::{self, Format};
use merge::{merge_extends, merge_include};
use std::sync::Arc;

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
    /// Cached copies of git sources hashed so far, each with what is wrong with it (`None`: nothing).
    verified: Vec<(PathBuf, Option<String>)>,
    /// The git sources each loaded file sees (its own, then its bases'), by its path.
    visible: HashMap<PathBuf, Vec<DeclaredSource>>,
    /// Prompt search directories named by files that are not fetched presets: a fetched
    /// preset's prompt may come from them (a team replacing one of its prompts).
    trusted_dirs: std::cell::RefCell<Vec<PathBuf>>,
    /// The next file loaded is pulled in by `include` (and so needs no `name`).
    including: bool,
    /// The files pulled in by `include`: parts of a workflow, not workflows of their own.
    pub included: Vec<PathBuf>,
    /// Trees of files parsed before (see [`ParseCache`]); none for a single check.
    cache: Option<&'a mut ParseCache>,
}

/// The syntax trees of the files a workflow extends and includes, kept between loads: a
/// language server loads the same workflow on every edit, and parses again only the files
/// whose text changed. The file loaded first (the one being edited) is never kept. A tree is
/// reused only for the same path, text and file id (its spans name the file by id).
#[derive(Default)]
pub struct ParseCache {
    trees: HashMap<PathBuf, (FileId, Arc<str>, Arc<syntax::tree::Table>)>,
    /// Trees reused and trees parsed (and kept), for tests and benchmarks.
    pub hits: u64,
    pub misses: u64,
}

impl ParseCache {
    fn get(
        &mut self,
        path: &Path,
        file: FileId,
        text: &Arc<str>,
    ) -> Option<Arc<syntax::tree::Table>> {
        match self.trees.get(path) {
            Some((id, t, tree)) if *id == file && (Arc::ptr_eq(t, text) || **t == **text) => {
                self.hits += 1;
                Some(tree.clone())
            }
            _ => None,
        }
    }

    fn put(&mut self, path: PathBuf, file: FileId, text: Arc<str>, tree: Arc<syntax::tree::Table>) {
        self.misses += 1;
        self.trees.insert(path, (file, text, tree));
    }

    /// Forgets the files that are not in `keep` (those no workflow reads any more).
    pub fn retain(&mut self, keep: impl Fn(&Path) -> bool) {
        self.trees.retain(|p, _| keep(p));
    }
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
            including: false,
            included: Vec::new(),
            cache: None,
        }
    }

    /// Keeps the trees of the files this loader parses in `cache`, and reuses those whose
    /// text is unchanged.
    pub fn with_cache(mut self, cache: &'a mut ParseCache) -> Self {
        self.cache = Some(cache);
        self
    }

    /// Loads a workflow file and merges in the files it extends and includes.
    pub fn load(&mut self, path: &Path, from: Option<Span>) -> Option<Workflow> {
        let included = std::mem::take(&mut self.including);
        let canonical = normalize(path);
        if included && !self.included.contains(&canonical) {
            self.included.push(canonical.clone());
        }
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
        let first = self.stack.is_empty();
        let cached = match self.cache.as_deref_mut() {
            Some(cache) if !first => cache.get(&canonical, file, &text),
            _ => None,
        };
        let table = match cached {
            Some(table) => table,
            None => {
                let before_all = self.diags.iter().count();
                let table = Arc::new(syntax::parse(
                    file,
                    &text,
                    Format::from_path(&canonical),
                    self.diags,
                ));
                let clean = self.diags.iter().count() == before_all;
                if let Some(cache) = self.cache.as_deref_mut().filter(|_| clean && !first) {
                    cache.put(canonical.clone(), file, text.clone(), table.clone());
                }
                table
            }
        };
        if self.diags.error_count() > before {
            // A file that does not parse has nothing more worth reporting.
            return None;
        }
        let mut wf = if included {
            lower_included(file, &table, self.diags)
        } else {
            lower(file, &table, self.diags)
        };
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
            self.including = true;
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
