//! One workflow file loaded and checked as `ralph-flow check` does, through the editor's
//! unsaved text: its diagnostics, every file it read, its model and what the checker learned
//! of its stages (kinds, output schemas, prompt files), kept for completion, hover and
//! navigation until the next edit.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use crate::check::check_all;
use crate::diag::{Diagnostic, Diagnostics};
use crate::fs::normalize;
use crate::load::Loader;
use crate::model::{StageKind, Workflow};
use crate::source::{Sources, Span};

use super::docs::{Docs, Overlay};

/// What the checker knows of one stage.
#[derive(Clone, Debug)]
pub(crate) struct StageFact {
    pub(crate) id: String,
    /// Where its id is written.
    pub(crate) id_span: Span,
    /// The whole stage.
    pub(crate) span: Span,
    pub(crate) kind: StageKind,
    /// The index (in [`Analysis::stages`]) of the loop, fan-out or group whose body holds it.
    pub(crate) parent: Option<usize>,
    pub(crate) children: Vec<usize>,
    /// Its agent's name, for an agent stage.
    pub(crate) agent: Option<String>,
    pub(crate) description: Option<String>,
    /// Its output schema (given, or its kind's built-in one).
    pub(crate) schema: Option<Arc<serde_json::Value>>,
    /// The prompt file it reads, for an agent stage with one.
    pub(crate) prompt_file: Option<PathBuf>,
}

/// One workflow file, loaded and checked.
pub(crate) struct Analysis {
    /// The workflow file (normalized).
    pub(crate) root: PathBuf,
    /// Every file read: the workflow, its bases, includes, prompt files and schemas.
    pub(crate) sources: Sources,
    pub(crate) diagnostics: Vec<Diagnostic>,
    /// The merged model; `None` when the file does not parse.
    pub(crate) workflow: Option<Workflow>,
    /// The stages in the checker's order (a body's stages after their region).
    pub(crate) stages: Vec<StageFact>,
    pub(crate) by_id: HashMap<String, usize>,
    /// The files pulled in by `include` (parts, not workflows of their own).
    pub(crate) included: Vec<PathBuf>,
    /// Every file read, normalized (the source map holds them as the loader names them:
    /// relative to the working directory when they lie below it).
    pub(crate) files: HashSet<PathBuf>,
    /// See [`Analysis::index`].
    index: std::cell::OnceCell<super::refs::Index>,
}

impl Analysis {
    /// Loads and checks `root`, reading open documents before the disk.
    pub(crate) fn run(root: PathBuf, docs: &Docs, cache: &mut crate::load::ParseCache) -> Analysis {
        let fs = Overlay { docs };
        let mut sources = Sources::new();
        let mut diags = Diagnostics::default();
        let mut stages = Vec::new();
        let mut by_id = HashMap::new();
        let (workflow, included) = {
            let mut loader = Loader::new(&fs, &mut sources, &mut diags).with_cache(cache);
            let wf = loader.load(&root, None);
            if let Some(wf) = &wf {
                let mut found = Diagnostics::default();
                let checked = check_all(wf, &mut loader, &[], false, &mut found);
                for (i, info) in checked.stages.iter().enumerate() {
                    let s = info.stage;
                    let (agent, prompt_file) = match &s.body {
                        crate::model::StageBody::Agent { agent, .. } => (
                            agent.as_ref().map(|a| a.value.clone()),
                            checked
                                .prompt_files
                                .get(&crate::model::StageId(i))
                                .map(|(p, _)| normalize(p)),
                        ),
                        _ => (None, None),
                    };
                    by_id.entry(s.id.value.clone()).or_insert(i);
                    stages.push(StageFact {
                        id: s.id.value.clone(),
                        id_span: s.id.span,
                        span: s.span,
                        kind: s.kind().value,
                        parent: info.parent.map(|p| p.0),
                        children: info.children.iter().map(|c| c.0).collect(),
                        agent,
                        description: s.keys().description.as_ref().map(|d| d.value.clone()),
                        schema: checked.schemas.get(&crate::model::StageId(i)).cloned(),
                        prompt_file,
                    });
                }
                drop(checked);
                loader.diags.extend(found);
            }
            (wf, std::mem::take(&mut loader.included))
        };
        let files = sources
            .iter()
            .map(|(_, f)| crate::fs::normalize(&f.path))
            .collect();
        Analysis {
            root,
            files,
            sources: absolute(sources),
            diagnostics: diags.into_sorted(),
            workflow,
            stages,
            by_id,
            included: included.iter().map(|p| normalize(p)).collect(),
            index: std::cell::OnceCell::new(),
        }
    }

    /// Tells whether the analysis read a file (by its normalized path).
    pub(crate) fn involves(&self, path: &std::path::Path) -> bool {
        self.files.contains(path)
    }

    /// The index of every name written in the workflow's files, built on first use and kept
    /// until the next edit replaces the analysis (hover, definition, references and rename
    /// all read it).
    pub(crate) fn index(&self) -> &super::refs::Index {
        self.index.get_or_init(|| super::refs::Index::of(self))
    }

    /// The stage with an id.
    pub(crate) fn stage(&self, id: &str) -> Option<&StageFact> {
        self.by_id.get(id).map(|&i| &self.stages[i])
    }
}

/// The same files under absolute paths. The loader names the files below the current
/// directory relatively (as `check` shows them), and an editor often starts the server in
/// the project's directory; the server looks files up by the editor's absolute paths.
/// The ids stay those of the loader (the files are added in the same order), else the map
/// is kept as it is.
fn absolute(sources: Sources) -> Sources {
    let mut out = Sources::new();
    for (_, file) in sources.iter() {
        out.add(normalize(&file.path), file.text.clone());
    }
    if out.iter().count() == sources.iter().count() {
        out
    } else {
        sources
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lsp::docs::Doc;

    #[test]
    fn the_files_a_workflow_extends_are_parsed_again_only_when_they_change() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let base = dir.path().join("base.toml");
        let base_text = "name = \"base\"\n\n[stages.a]\nkind = \"command\"\nargv = [\"true\"]\n";
        std::fs::write(&base, base_text).unwrap_or_else(|e| panic!("{e}"));
        let child = dir.path().join("child.toml");
        let child_text = "name = \"child\"\nextends = \"base.toml\"\n";
        let mut docs = Docs::default();
        let uri =
            |p: &std::path::Path| crate::lsp::docs::path_uri(p).unwrap_or_else(|| panic!("no uri"));
        docs.open
            .insert(child.clone(), Doc::new(uri(&child), child_text.into(), 1));
        let mut cache = crate::load::ParseCache::default();
        let first = Analysis::run(child.clone(), &docs, &mut cache);
        assert_eq!(first.stages.len(), 1);
        assert_eq!(
            (cache.hits, cache.misses),
            (0, 1),
            "the base is parsed once"
        );
        // An edit of the child: the base is not parsed again.
        if let Some(d) = docs.open.get_mut(&child) {
            d.set(format!("{child_text}# edited\n"), 2);
        }
        let again = Analysis::run(child.clone(), &docs, &mut cache);
        assert_eq!(again.stages.len(), 1);
        assert_eq!((cache.hits, cache.misses), (1, 1), "the base is reused");
        // The base opened and changed in the editor: parsed again, and its new stage seen.
        docs.open.insert(
            base.clone(),
            Doc::new(
                uri(&base),
                format!("{base_text}\n[stages.b]\nkind = \"command\"\nargv = [\"true\"]\n"),
                1,
            ),
        );
        let changed = Analysis::run(child, &docs, &mut cache);
        assert_eq!(changed.stages.len(), 2);
        assert_eq!((cache.hits, cache.misses), (1, 2));
    }
}
