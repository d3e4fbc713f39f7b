//! Preparing a workflow to run: load → check → compile, with its files hashed for resume and
//! the subflows whose workflow and params are written out compiled with it.
//!
//! This is the front half of the pipeline, above the executor: the CLI, a worker and the
//! monitor prepare, and the executor only reads what they prepared ([`Prepared`]). A
//! subflow whose params come from outputs is prepared during the run through the
//! [`Later`] callback left in the plan, so `run` never depends on `load` or `check`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::compile::{Ahead, Later, PrepareError, Prepared, SubflowKey, Subflows, compile_parts};
use crate::diag::Diagnostics;
use crate::fs::{FileSystem, RealFs};
use crate::load::Loader;
use crate::source::Sources;

/// Loads, checks and compiles a workflow with `--set` values; every param must have a value.
pub fn prepare(path: &Path, sets: &[(String, String)]) -> Result<Prepared, Box<PrepareError>> {
    prepare_in(
        &(Arc::new(RealFs) as Arc<dyn FileSystem + Send + Sync>),
        path,
        sets,
    )
}

/// [`prepare`], reading the workflow's files through `fs` (a worker reads a detached run's
/// files from the store). Its subflows are read through `fs` too, ahead or during the run.
pub fn prepare_in(
    fs: &Arc<dyn FileSystem + Send + Sync>,
    path: &Path,
    sets: &[(String, String)],
) -> Result<Prepared, Box<PrepareError>> {
    prepare_tree(fs, path, sets, &mut HashMap::new())
}

/// The subflows compiled so far while preparing one workflow, by file and params: each is
/// compiled once however often it is named.
type Compiled = HashMap<SubflowKey, Result<Arc<Prepared>, Arc<PrepareError>>>;

/// Prepares one workflow, then the subflows it names with written-out params (theirs too,
/// depth first: `check` refuses a subflow that leads back to itself).
fn prepare_tree(
    fs: &Arc<dyn FileSystem + Send + Sync>,
    path: &Path,
    sets: &[(String, String)],
    compiled: &mut Compiled,
) -> Result<Prepared, Box<PrepareError>> {
    let mut prepared = prepare_one(fs.as_ref(), path, sets)?;
    let later = Later {
        prepare: prepare_in,
        fs: fs.clone(),
    };
    let mut ahead = Vec::new();
    for (stage, key) in prepared.plan.written_subflows(&prepared.sources) {
        if ahead.iter().any(|a: &Ahead| a.key == key) {
            continue;
        }
        let result = match compiled.get(&key) {
            Some(done) => done.clone(),
            None => {
                let done = prepare_tree(fs, &key.0, &key.1, compiled)
                    .map(Arc::new)
                    .map_err(Arc::from);
                compiled.insert(key.clone(), done.clone());
                done
            }
        };
        ahead.push(Ahead {
            stage,
            key,
            prepared: result,
        });
    }
    prepared.subflows = Subflows {
        ahead,
        later: Some(later),
    };
    Ok(prepared)
}

/// Loads, checks and compiles one workflow file (its subflows left to [`prepare_tree`]).
fn prepare_one(
    fs: &dyn FileSystem,
    path: &Path,
    sets: &[(String, String)],
) -> Result<Prepared, Box<PrepareError>> {
    let mut sources = Sources::new();
    let mut diags = Diagnostics::default();
    let (wf, mut missing) = {
        let mut loader = Loader::new(fs, &mut sources, &mut diags);
        let wf = loader.load(path, None);
        (wf, std::mem::take(&mut loader.missing))
    };
    let Some(wf) = wf else {
        return Err(Box::new(PrepareError {
            sources,
            diagnostics: diags.into_sorted(),
            missing,
        }));
    };
    let plan = {
        let mut loader = Loader::new(fs, &mut sources, &mut diags);
        let mut check_diags = Diagnostics::default();
        let checked = crate::check::check(&wf, &mut loader, sets, true, &mut check_diags);
        let parts = checked.as_ref().map(compile_parts);
        missing.append(&mut loader.missing);
        drop(checked);
        drop(loader);
        diags.extend(check_diags);
        parts.map(|p| p.with_workflow(wf))
    };
    let has_errors = diags.has_errors();
    let all = diags.into_sorted();
    match plan {
        Some(plan) if !has_errors => {
            let mut hasher = Sha256::new();
            for (_, f) in sources.iter() {
                hasher.update(f.path.to_string_lossy().as_bytes());
                hasher.update([0]);
                hasher.update(f.text.as_bytes());
                hasher.update([0]);
            }
            let hash = format!("{:x}", hasher.finalize());
            Ok(Prepared {
                plan,
                hash,
                path: path.to_path_buf(),
                warnings: all,
                sources,
                subflows: Subflows::default(),
            })
        }
        _ => Err(Box::new(PrepareError {
            sources,
            diagnostics: all,
            missing,
        })),
    }
}

/// [`prepare`], first fetching the git preset sources the workflow names and the cache lacks
/// (pinning new ones in their lockfile); `report` hears of each source fetched. What is in
/// the cache is verified against the lockfile either way.
pub fn prepare_fetching(
    path: &Path,
    sets: &[(String, String)],
    report: &mut dyn FnMut(&crate::preset::Synced),
) -> Result<Prepared, Box<PrepareError>> {
    let mut fetched = Vec::new();
    loop {
        let mut e = match prepare(path, sets) {
            Err(e) if !e.missing.is_empty() => e,
            other => return other,
        };
        // Fetched presets may name sources of their own: prepare again until none is
        // missing. A source still missing once fetched stops it, so this ends.
        if e.missing
            .iter()
            .any(|m| fetched.contains(&m.declared.key()))
        {
            return Err(e);
        }
        match crate::preset::fetch_missing(&e.missing) {
            Ok(done) => done.iter().for_each(&mut *report),
            Err(d) => {
                e.diagnostics.push(*d);
                return Err(e);
            }
        }
        fetched.extend(e.missing.iter().map(|m| m.declared.key()));
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::fs::MemFs;

    fn files(list: &[(&str, &str)]) -> Arc<dyn FileSystem + Send + Sync> {
        Arc::new(MemFs::new(
            list.iter()
                .map(|(p, t)| (PathBuf::from(p), (*t).to_string())),
        ))
    }

    const CHILD: &str = "name = \"child\"\n[params.n]\ntype = \"int\"\n\n[stages.inner]\nkind = \"subflow\"\nworkflow = \"leaf.toml\"\n\n[stages.say]\nkind = \"command\"\nargv = [\"echo\", \"{{ params.n }}\"]\n";
    const LEAF: &str = "name = \"leaf\"\n[stages.x]\nkind = \"command\"\nargv = [\"true\"]\n";

    #[test]
    fn written_out_subflows_are_compiled_once_each_with_their_own() {
        let fs = files(&[
            (
                "/p/w.toml",
                "name = \"w\"\n[stages.a]\nkind = \"subflow\"\nworkflow = \"child.toml\"\nparams = { n = \"1\" }\n\n[stages.b]\nkind = \"subflow\"\nworkflow = \"child.toml\"\nparams = { n = \"1\" }\n\n[stages.c]\nkind = \"subflow\"\nworkflow = \"child.toml\"\nparams = { n = \"2\" }\n\n[stages.d]\nkind = \"command\"\nargv = [\"echo\", \"3\"]\n\n[stages.e]\nkind = \"subflow\"\nneeds = [\"d\"]\nworkflow = \"child.toml\"\nparams = { n = \"{{ stages.d.output.stdout }}\" }\n",
            ),
            ("/p/child.toml", CHILD),
            ("/p/leaf.toml", LEAF),
        ]);
        let prepared = prepare_in(&fs, Path::new("/p/w.toml"), &[])
            .unwrap_or_else(|e| panic!("{}", e.render()));
        let ahead = &prepared.subflows.ahead;
        // `a` and `b` name the same file and params: one entry, `a`'s; `e`'s params are
        // an output's, so it waits for the run.
        let named: Vec<(&str, &str)> = ahead
            .iter()
            .map(|a| (a.stage.as_str(), a.key.1[0].1.as_str()))
            .collect();
        assert_eq!(named, [("a", "1"), ("c", "2")]);
        let child = |i: usize| match &ahead[i].prepared {
            Ok(p) => p.clone(),
            Err(e) => panic!("{}", e.render()),
        };
        assert_eq!(child(0).path, PathBuf::from("/p/child.toml"));
        // Each child carries its own, and the leaf both children name is compiled once.
        let leaf = |c: &Prepared| match &c.subflows.ahead[..] {
            [only] => only.prepared.as_ref().ok().cloned(),
            other => panic!("{} subflows ahead", other.len()),
        };
        let (one, two) = (child(0), child(1));
        let (l1, l2) = (leaf(&one), leaf(&two));
        assert!(l1.zip(l2).is_some_and(|(a, b)| Arc::ptr_eq(&a, &b)));
        assert!(prepared.subflows.later.is_some());
    }

    #[test]
    fn a_subflow_that_does_not_check_for_its_params_is_kept_for_the_run_to_report() {
        let fs = files(&[
            (
                "/p/w.toml",
                "name = \"w\"\n[stages.a]\nkind = \"subflow\"\nworkflow = \"child.toml\"\nparams = { n = \"many\" }\n",
            ),
            ("/p/child.toml", CHILD),
            ("/p/leaf.toml", LEAF),
        ]);
        let prepared = prepare_in(&fs, Path::new("/p/w.toml"), &[])
            .unwrap_or_else(|e| panic!("{}", e.render()));
        match &prepared.subflows.ahead[..] {
            [a] => match &a.prepared {
                Err(e) => assert!(e.render().contains("many"), "{}", e.render()),
                Ok(_) => panic!("`n = \"many\"` is not an int"),
            },
            other => panic!("{} subflows ahead", other.len()),
        }
    }

    #[test]
    fn a_subflow_prepared_during_the_run_reads_the_same_files() {
        let fs = files(&[("/p/child.toml", CHILD), ("/p/leaf.toml", LEAF)]);
        let later = Later {
            prepare: prepare_in,
            fs,
        };
        let child = later
            .prepare(Path::new("/p/child.toml"), &[("n".into(), "5".into())])
            .unwrap_or_else(|e| panic!("{}", e.render()));
        assert_eq!(child.plan.workflow.name.value, "child");
        assert!(
            later
                .prepare(Path::new("/elsewhere/child.toml"), &[])
                .is_err()
        );
    }
}
