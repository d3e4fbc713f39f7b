//! Fetching a workflow's git sources: load and check it to find the sources it names, fetch
//! what the cache lacks, and load again until nothing is missing. This loads and checks, so it
//! lives above the preset layer, with the command that uses it.

use std::path::Path;

use ralph_flow::check::check;
use ralph_flow::diag::{Code, Diagnostic, Diagnostics};
use ralph_flow::fs::RealFs;
use ralph_flow::load::Loader;
use ralph_flow::preset::{self, DeclaredSource, MissingSource, Synced};
use ralph_flow::source::Sources;

/// Why [`sync`] stopped: diagnostics (at the source's declaration where there is one), with
/// the files to render them.
pub(super) struct SyncError {
    pub sources: Sources,
    pub diagnostics: Vec<Diagnostic>,
}

/// What loading and checking a workflow found about its git sources.
struct Discovered {
    sources: Sources,
    missing: Vec<MissingSource>,
    declared: Vec<DeclaredSource>,
}

fn discover(path: &Path, sets: &[(String, String)]) -> Discovered {
    let fs = RealFs;
    let mut sources = Sources::new();
    let mut diags = Diagnostics::default();
    let mut loader = Loader::new(&fs, &mut sources, &mut diags);
    if let Some(wf) = loader.load(path, None) {
        // Subflows are followed by the checker; their sources count too.
        let mut check_diags = Diagnostics::default();
        let _ = check(&wf, &mut loader, sets, false, &mut check_diags);
    }
    let missing = std::mem::take(&mut loader.missing);
    let declared = std::mem::take(&mut loader.declared);
    Discovered {
        sources,
        missing,
        declared,
    }
}

/// Fetches every git source that a workflow (with everything it extends, includes and calls)
/// names and the cache lacks, and pins new ones in the lockfile beside the file that declares
/// them ([`fetch_missing`], then a load again, until nothing is missing). With `update`, the
/// named sources (every declared one when the list is empty) are first resolved anew from
/// their `rev` and pinned again.
pub(super) fn sync(
    path: &Path,
    sets: &[(String, String)],
    update: Option<&[String]>,
) -> Result<Vec<Synced>, SyncError> {
    let fail = |sources: Sources, d: Diagnostic| SyncError {
        sources,
        diagnostics: vec![d],
    };
    let mut done: Vec<Synced> = Vec::new();
    if let Some(names) = update {
        let found = discover(path, sets);
        let declared = |n: &str| found.declared.iter().any(|d| d.source.name.value == n);
        if let Some(n) = names.iter().find(|n| !declared(n)) {
            let known: Vec<&str> = found
                .declared
                .iter()
                .map(|d| d.source.name.value.as_str())
                .collect();
            let message = format!(
                "no file of {} declares a source `{n}` (declared: {})",
                path.display(),
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            );
            return Err(fail(
                found.sources,
                Diagnostic::new(Code::UnknownPreset, None, message),
            ));
        }
        let mut seen = Vec::new();
        for d in &found.declared {
            // The sources of a fetched preset are pinned by that preset's own lockfile.
            let own = !d.decl_dir.starts_with(preset::git::checkouts_dir());
            let named = names.is_empty() || names.contains(&d.source.name.value);
            if own && named && !seen.contains(&d.key()) {
                seen.push(d.key());
                match preset::fetch_one(d, None, "updated") {
                    Ok(s) => done.push(s),
                    Err(e) => return Err(fail(found.sources, *e)),
                }
            }
        }
    }
    // Every round fetches sources not fetched before (or stops), and a workflow names
    // finitely many, so this ends.
    let mut fetched = Vec::new();
    loop {
        let found = discover(path, sets);
        if found.missing.is_empty() {
            return Ok(done);
        }
        if let Some(m) = found
            .missing
            .iter()
            .find(|m| fetched.contains(&m.declared.key()))
        {
            let message = format!(
                "source `{}` is still missing after it was fetched (is RALPH_FLOW_CACHE_DIR changing?)",
                m.declared.source.name.value
            );
            let span = m.declared.source.span;
            return Err(fail(
                found.sources,
                Diagnostic::new(Code::PresetSource, span, message),
            ));
        }
        match preset::fetch_missing(&found.missing) {
            Ok(round) => done.extend(round),
            Err(e) => return Err(fail(found.sources, *e)),
        }
        fetched.extend(found.missing.iter().map(|m| m.declared.key()));
    }
}
