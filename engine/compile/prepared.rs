//! A workflow ready to run: its plan, its files and hash, and its subflows compiled with it.
//!
//! [`crate::prepare`] makes one (load → check → compile); the executor only reads it. A
//! subflow whose workflow and params are written out is compiled with its parent
//! ([`Subflows::ahead`]); one whose params come from outputs is prepared during the run by
//! the callback the preparer leaves ([`Subflows::later`]), so the run side never reaches up
//! to the layers that load and check.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::Plan;
use crate::diag::Diagnostic;
use crate::fs::FileSystem;
use crate::source::Sources;

/// A workflow ready to run: its plan, the hash of its files and the files themselves.
pub struct Prepared {
    pub plan: Plan,
    /// SHA-256 over every file the workflow was built from (hex).
    pub hash: String,
    /// The workflow file as given.
    pub path: PathBuf,
    /// Warnings found on the way (errors make preparing fail).
    pub warnings: Vec<Diagnostic>,
    /// Every file the workflow was built from: to resolve paths written in them and to
    /// name places in messages.
    pub sources: Sources,
    /// Its subflows: compiled with it, or how to prepare them during the run.
    pub subflows: Subflows,
}

/// Why a workflow could not be prepared: the diagnostics, with the sources to render them.
pub struct PrepareError {
    pub sources: Sources,
    pub diagnostics: Vec<Diagnostic>,
    /// Git preset sources that are named but not in the cache (`prepare_fetching` fetches
    /// them).
    pub missing: Vec<crate::preset::MissingSource>,
}

impl PrepareError {
    /// Renders the diagnostics without color.
    pub fn render(&self) -> String {
        crate::diag::render(&self.sources, &self.diagnostics, false)
    }
}

/// A subflow's workflow file and its params.
pub type SubflowKey = (PathBuf, Vec<(String, String)>);

/// The subflows of a plan.
#[derive(Clone, Default)]
pub struct Subflows {
    /// The subflows whose workflow and params are written out (no template), compiled with
    /// the plan: in the order of its stages, each once per file and params. Each carries
    /// its own.
    pub ahead: Vec<Ahead>,
    /// Prepares the others (params from outputs) during the run, reading files as the plan
    /// was read. `None`: only the subflows compiled ahead can run.
    pub later: Option<Later>,
}

/// A subflow compiled with its parent, or why it could not be: the run reports that
/// before anything starts, as it reports any subflow that does not check.
#[derive(Clone)]
pub struct Ahead {
    /// The stage that names it (the first one, when several name the same file and params).
    pub stage: String,
    pub key: SubflowKey,
    pub prepared: Result<Arc<Prepared>, Arc<PrepareError>>,
}

/// What prepares a workflow from its file and params, reading files through `fs` (the
/// disk, or a detached run's files from the store).
pub type PrepareFn = fn(
    fs: &Arc<dyn FileSystem + Send + Sync>,
    path: &Path,
    sets: &[(String, String)],
) -> Result<Prepared, Box<PrepareError>>;

/// How a subflow is prepared during a run: the preparer, and the files it reads.
#[derive(Clone)]
pub struct Later {
    pub prepare: PrepareFn,
    pub fs: Arc<dyn FileSystem + Send + Sync>,
}

impl Later {
    /// Prepares the subflow at `path` with `sets`.
    pub fn prepare(
        &self,
        path: &Path,
        sets: &[(String, String)],
    ) -> Result<Prepared, Box<PrepareError>> {
        (self.prepare)(&self.fs, path, sets)
    }
}

/// The file of a subflow's `workflow`, resolved against the file that names it.
pub fn subflow_path(sources: &Sources, wf: &crate::model::Text) -> PathBuf {
    crate::fs::base_dir(sources, wf.span).join(&wf.value)
}

impl Plan {
    /// The subflows whose workflow and params are written out (no template), in the order
    /// of the plan's stages: each with the stage that names it, its file and its params.
    pub fn written_subflows(&self, sources: &Sources) -> Vec<(String, SubflowKey)> {
        let literal = |t: &str| !t.contains("{{") && !t.contains("{%");
        let mut out = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            if node.kind != crate::model::StageKind::Subflow {
                continue;
            }
            let crate::model::StageBody::Subflow {
                workflow: Some(wf),
                params,
            } = &self.stage(super::NodeId(i)).body
            else {
                continue;
            };
            if !params.iter().all(|(_, v)| literal(&v.value)) {
                continue;
            }
            let sets: Vec<(String, String)> = params
                .iter()
                .map(|(k, v)| (k.value.clone(), v.value.clone()))
                .collect();
            out.push((node.name.clone(), (subflow_path(sources, wf), sets)));
        }
        out
    }
}
