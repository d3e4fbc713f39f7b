//! `ralph-flow runs prune` (also `ralph-flow gc`): removes runs that ended, by age or beyond
//! a count per workflow, from the store (every row, and the spilled outputs no remaining run
//! shares) and from the disk (the run's directory, its workspaces and its units'
//! directories); says how much it freed. Also what `runs` shows of a run's size on disk.
//!
//! The store decides, in the transaction that deletes a run, that it may go
//! ([`Store::delete_run`]: ended, and no live holder of its lock); only then are its files
//! removed, so a run that resumed between the listing and the deletion keeps everything.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ralph_flow::store::{
    Location, OpenOptions, Removed, RunRecord, RunStatus, Store, StoreError, StoredSize, now_ms,
    rfc3339,
};
use ralph_flow::text::bytes;
use serde::Serialize;

use super::runs::{Failure, exit_code, print_json, table};

/// The exit code for a store or a file that could not be changed.
const EXIT_STORE: i32 = 1;

#[derive(clap::Args)]
pub(super) struct Args {
    #[command(flatten)]
    store: super::store::StoreArgs,
    /// Remove runs that ended longer ago than this (`30d`, `12h`, `2weeks`).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    older_than: Option<Duration>,
    /// Keep the N newest ended runs of each workflow; remove the older ones. With
    /// --older-than, a run goes only when both say so.
    #[arg(long, value_name = "N")]
    keep: Option<usize>,
    /// Only runs of this workflow (its `name`, as `runs` shows it).
    #[arg(long, value_name = "NAME")]
    workflow: Option<String>,
    /// List what would go, with sizes; remove nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print one JSON document.
    #[arg(long)]
    json: bool,
}

/// `ralph-flow runs prune` and `ralph-flow gc`.
pub(super) fn run(args: &Args) -> i32 {
    exit_code(prune(args))
}

/// Where a run keeps things on this machine: its directory, its workspaces (git worktrees)
/// and its units' directories.
struct Places {
    /// `STATE_DIR/runs/RUN`: artifacts.jsonl, the attempts' directories.
    run_dir: PathBuf,
    /// `STATE_DIR/worktrees/RUN`: the git worktrees made for it.
    worktrees: PathBuf,
    /// `STATE_DIR/units/attempts/RUN` (of the run's state directory, and of the one given
    /// when it differs): what workers on this machine wrote for its units.
    units: Vec<PathBuf>,
}

impl Places {
    /// The places of `run`, in the state directory its record names (`dir` is
    /// `STATE_DIR/runs/RUN`), else in `state_dir`.
    fn of(run: &RunRecord, state_dir: &Path) -> Places {
        let recorded = PathBuf::from(&run.dir);
        let own = (recorded.file_name() == Some(run.id.as_ref()))
            .then(|| recorded.parent())
            .flatten()
            .filter(|p| p.file_name() == Some("runs".as_ref()))
            .and_then(Path::parent)
            .map(Path::to_path_buf);
        let home = own.clone().unwrap_or_else(|| state_dir.to_path_buf());
        let mut units = vec![home.join("units").join("attempts").join(&run.id)];
        // Canonical only when the paths differ (`runs` places every listed run).
        if own.is_some() && home != state_dir && canonical(&home) != canonical(state_dir) {
            units.push(state_dir.join("units").join("attempts").join(&run.id));
        }
        Places {
            run_dir: home.join("runs").join(&run.id),
            worktrees: home.join("worktrees").join(&run.id),
            units,
        }
    }

    /// Every directory, for measuring.
    fn all(&self) -> impl Iterator<Item = &Path> {
        [self.run_dir.as_path(), self.worktrees.as_path()]
            .into_iter()
            .chain(self.units.iter().map(PathBuf::as_path))
    }

    /// The bytes of the files in them now.
    fn bytes(&self) -> u64 {
        self.all().map(tree_bytes).sum()
    }
}

/// The bytes of the files under `path` (or of `path` itself), as their lengths say; symbolic
/// links count as themselves, never followed. 0 for nothing there.
pub(super) fn tree_bytes(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    let mut total = 0;
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push(entry.path()),
                Ok(_) => total += entry.metadata().map_or(0, |m| m.len()),
                Err(_) => {}
            }
        }
    }
    total
}

/// What `runs` shows of a run's size: the files of its directories on this machine plus
/// what it takes in the store (`stored`, an estimate of its rows and its spilled outputs).
pub(super) fn run_size(run: &RunRecord, state_dir: &Path, stored: Option<&StoredSize>) -> u64 {
    let stored = stored.map_or(0, |s| s.row_bytes + s.file_bytes);
    Places::of(run, state_dir).bytes() + stored
}

/// A workspace of a pruned run that stays, and why.
#[derive(Serialize)]
struct Kept {
    path: String,
    why: String,
}

/// What went of a run.
#[derive(Serialize, Default)]
struct Freed {
    /// What the store removed: rows (with an estimate of their bytes) and spilled outputs.
    store: Removed,
    /// The bytes of the files removed from its directories and workspaces.
    dir_bytes: u64,
    /// The bytes of files removed in all: `dir_bytes` plus the store's spilled outputs.
    freed_bytes: u64,
    /// What could not be removed, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    problems: Vec<String>,
}

/// A run that goes (or would go).
#[derive(Serialize)]
struct Planned {
    id: String,
    workflow: String,
    status: &'static str,
    /// When it ended (its last update).
    ended: String,
    /// The bytes of its directories' files on this machine, now.
    dir_bytes: u64,
    /// What it takes in the store (an estimate of its rows; its spilled outputs).
    store: StoredSize,
    /// `dir_bytes` plus the store's two figures.
    size_bytes: u64,
    /// Its workspaces that stay because a run that goes on uses them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    kept: Vec<Kept>,
    /// What went (not with --dry-run).
    #[serde(skip_serializing_if = "Option::is_none")]
    removed: Option<Freed>,
    /// Why the store refused to remove it (it resumed, or a process holds it, since it was
    /// listed); nothing of it was removed.
    #[serde(skip_serializing_if = "Option::is_none")]
    skipped: Option<String>,
    #[serde(skip)]
    places: Places,
    #[serde(skip)]
    workspaces: Vec<PathBuf>,
}

#[derive(Serialize)]
struct Report {
    dry_run: bool,
    /// The store, as messages name it.
    store: String,
    runs: Vec<Planned>,
    /// The bytes of the files removed (or, with --dry-run, of all the runs listed).
    freed_bytes: u64,
    /// An estimate of the bytes of the rows deleted: space the store reuses (see `note`).
    store_row_bytes: u64,
    /// What happens to the store's space.
    note: String,
}

fn prune(args: &Args) -> Result<(), Failure> {
    if args.older_than.is_none() && args.keep.is_none() {
        return Err(Failure(
            "say which runs go: --older-than DURATION (ended longer ago than that, such as \
             30d) and/or --keep N (all but the N newest ended runs of each workflow); add \
             --dry-run to see them first"
                .into(),
            super::EXIT_CONFIG,
        ));
    }
    let cwd = std::env::current_dir().map_err(|e| {
        Failure(
            format!("cannot read the current directory: {e}"),
            EXIT_STORE,
        )
    })?;
    let place = args
        .store
        .location_in(&cwd)
        .map_err(|e| Failure(ralph_flow::diag::error_chain(&e), super::EXIT_CONFIG))?;
    let state_dir = args.store.state_dir_in(&cwd);
    if !place.exists() {
        println!("no runs in {place}; nothing to remove");
        return Ok(());
    }
    let mut store = if args.dry_run {
        match place.open_to_read()? {
            Some(s) => s,
            None => {
                println!("no runs in {place}; nothing to remove");
                return Ok(());
            }
        }
    } else {
        place.open(&OpenOptions::default())?
    };
    let all = store.runs(usize::MAX)?;
    let chosen = choose(&all, args, now_ms());
    let sizes = store.stored_sizes(&chosen.iter().map(|r| r.id.as_str()).collect::<Vec<_>>())?;
    let going: Vec<&str> = chosen.iter().map(|r| r.id.as_str()).collect();
    let used = workspaces_in_use(store.as_ref(), &all, &going)?;
    let mut planned: Vec<Planned> = chosen
        .iter()
        .enumerate()
        .map(|(i, run)| plan(run, &state_dir, sizes.get(i).copied(), &used))
        .collect();
    if !args.dry_run {
        for p in &mut planned {
            remove(store.as_mut(), p);
        }
    }
    let report = report(&place, args.dry_run, planned);
    if args.json {
        print_json(&report)?;
    } else {
        print!("{}", text(&report, all.len()));
    }
    let problems = report
        .runs
        .iter()
        .filter_map(|p| p.removed.as_ref())
        .any(|f| !f.problems.is_empty());
    if problems {
        return Err(Failure(
            "some files could not be removed (listed above); remove them by hand once \
             nothing uses them"
                .into(),
            EXIT_STORE,
        ));
    }
    Ok(())
}

/// The runs that go, newest first: ended (finished or cancelled), of the workflow asked
/// for, beyond the `--keep` newest ended runs of their workflow and ended before
/// `--older-than` ago (both, when both are given).
fn choose<'a>(runs: &'a [RunRecord], args: &Args, now: i64) -> Vec<&'a RunRecord> {
    let cutoff = args
        .older_than
        .map(|d| now.saturating_sub(ralph_flow::store::ms(d)));
    let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    // `runs` is newest first: a workflow's count of ended runs so far is the run's rank.
    runs.iter()
        .filter(|r| matches!(r.status, RunStatus::Finished | RunStatus::Cancelled))
        .filter(|r| args.workflow.as_ref().is_none_or(|w| *w == r.workflow))
        .filter(|r| {
            let rank = seen.entry(r.workflow.as_str()).or_default();
            *rank += 1;
            let beyond = args.keep.is_none_or(|keep| *rank > keep);
            let old = cutoff.is_none_or(|c| r.updated_at < c);
            beyond && old
        })
        .collect()
}

/// The workspaces that runs which stay and may go on (not ended) work in: the paths their
/// `@worktree:` decisions recorded, canonical. A workspace of a pruned run among them stays.
fn workspaces_in_use(
    store: &dyn Store,
    all: &[RunRecord],
    going: &[&str],
) -> Result<Vec<(PathBuf, String)>, Failure> {
    let mut used = Vec::new();
    for run in all {
        if going.contains(&run.id.as_str())
            || matches!(run.status, RunStatus::Finished | RunStatus::Cancelled)
        {
            continue;
        }
        store.each_node(&run.id, &mut |n| {
            if n.node.starts_with("@worktree:")
                && let Some(p) = n.output.get("path").and_then(serde_json::Value::as_str)
            {
                used.push((canonical(Path::new(p)), run.id.clone()));
            }
        })?;
    }
    Ok(used)
}

/// The git worktrees under `dir`: the directories holding a `.git` file (not looked into).
fn worktrees_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if d.join(".git").is_file() {
            found.push(d);
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
        }
    }
    found.sort();
    found
}

fn plan(
    run: &RunRecord,
    state_dir: &Path,
    stored: Option<StoredSize>,
    used: &[(PathBuf, String)],
) -> Planned {
    let places = Places::of(run, state_dir);
    let mut kept = Vec::new();
    let mut workspaces = Vec::new();
    for w in worktrees_under(&places.worktrees) {
        let c = canonical(&w);
        let why = match used
            .iter()
            .find(|(p, _)| p.starts_with(&c) || c.starts_with(p))
        {
            Some((_, by)) => Some(format!("run {by}, which may go on, works in it")),
            None => changes(&w),
        };
        match why {
            Some(why) => kept.push(Kept {
                path: w.to_string_lossy().into_owned(),
                why,
            }),
            None => workspaces.push(w),
        }
    }
    let kept_bytes: u64 = kept.iter().map(|k| tree_bytes(Path::new(&k.path))).sum();
    let dir_bytes = places.bytes().saturating_sub(kept_bytes);
    let store = stored.unwrap_or_default();
    Planned {
        id: run.id.clone(),
        workflow: run.workflow.clone(),
        status: run.status.as_str(),
        ended: rfc3339(run.updated_at),
        dir_bytes,
        store,
        size_bytes: dir_bytes + store.row_bytes + store.file_bytes,
        kept,
        removed: None,
        skipped: None,
        places,
        workspaces,
    }
}

/// Removes a planned run: from the store first (which refuses a run that may go on), then
/// its workspaces (the way git removes a worktree) and its directories, counting the bytes
/// that went.
fn remove(store: &mut dyn Store, p: &mut Planned) {
    let removed = match store.delete_run(&p.id) {
        Ok(r) => r,
        Err(StoreError::Refused(why)) => {
            p.skipped = Some(why);
            return;
        }
        Err(e) => {
            p.skipped = Some(ralph_flow::diag::error_chain(&e));
            return;
        }
    };
    let mut freed = Freed {
        store: removed,
        ..Freed::default()
    };
    for w in &p.workspaces {
        let before = tree_bytes(w);
        if let Err(why) = remove_worktree(w) {
            freed.problems.push(why);
        }
        freed.dir_bytes += before.saturating_sub(tree_bytes(w));
    }
    let mut dirs: Vec<&Path> = vec![&p.places.run_dir];
    dirs.extend(p.places.units.iter().map(PathBuf::as_path));
    if p.kept.is_empty() {
        dirs.push(&p.places.worktrees);
    }
    for dir in dirs {
        let before = tree_bytes(dir);
        match std::fs::remove_dir_all(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => freed
                .problems
                .push(format!("cannot remove {}: {e}", dir.display())),
        }
        freed.dir_bytes += before.saturating_sub(tree_bytes(dir));
    }
    freed.freed_bytes = freed.dir_bytes + freed.store.file_bytes;
    p.removed = Some(freed);
}

/// Why a worktree must stay as git sees it: it holds uncommitted changes (a changed, staged
/// or new file; files git ignores, such as build output, do not count), which
/// `git worktree remove` refuses to lose, and so does `prune`. `None` when it is clean, or
/// git cannot read it (its repository is gone: nothing of it is git's any more).
fn changes(worktree: &Path) -> Option<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(worktree)
        .args(["status", "--porcelain", "--untracked-files=normal"])
        .stdin(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let n = String::from_utf8_lossy(&out.stdout).lines().count();
    (n > 0).then(|| {
        format!(
            "it holds {n} uncommitted change{} (git would lose them): commit or discard them, \
             or remove it anyway with `git worktree remove --force {}`",
            if n == 1 { "" } else { "s" },
            ralph_flow::shell::quote(&worktree.to_string_lossy())
        )
    })
}

/// Removes a git worktree as a run does (`git worktree remove --force`, in its repository,
/// under the worktree lock every ralph-flow process takes, so git forgets it too); a
/// worktree whose repository is gone (its `.git` file names a directory that is not there)
/// is an ordinary directory.
fn remove_worktree(path: &Path) -> Result<(), String> {
    match ralph_flow::run::remove_worktree(path) {
        Ok(Some(_)) => Ok(()),
        // No repository answers for it: git has nothing to forget.
        Ok(None) => std::fs::remove_dir_all(path)
            .map_err(|e| format!("cannot remove {}: {e}", path.display())),
        Err(e) => Err(format!(
            "cannot remove the worktree {}: {}; remove it with `git worktree remove --force {}` \
             in its repository once nothing in it is needed",
            path.display(),
            ralph_flow::diag::error_chain(&e),
            ralph_flow::shell::quote(&path.to_string_lossy())
        )),
    }
}

/// A path with its symbolic links resolved, else as it is made absolute.
fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p)
        .or_else(|_| std::path::absolute(p))
        .unwrap_or_else(|_| p.to_path_buf())
}

fn report(place: &Location, dry_run: bool, runs: Vec<Planned>) -> Report {
    let freed_bytes = if dry_run {
        runs.iter().map(|p| p.dir_bytes + p.store.file_bytes).sum()
    } else {
        runs.iter()
            .filter_map(|p| p.removed.as_ref())
            .map(|f| f.freed_bytes)
            .sum()
    };
    let store_row_bytes = if dry_run {
        runs.iter().map(|p| p.store.row_bytes).sum()
    } else {
        runs.iter()
            .filter_map(|p| p.removed.as_ref())
            .map(|f| f.store.row_bytes)
            .sum()
    };
    let note = match place.state_dir() {
        Some(dir) => format!(
            "the rows' space is free space inside {} that later runs reuse: the file does not \
             shrink (`sqlite3 {} VACUUM` shrinks it, while no run is going on)",
            ralph_flow::store::default_path(dir).display(),
            ralph_flow::shell::quote(&ralph_flow::store::default_path(dir).to_string_lossy())
        ),
        None => "the rows' space is reclaimed by the server's autovacuum".to_string(),
    };
    Report {
        dry_run,
        store: place.to_string(),
        runs,
        freed_bytes,
        store_row_bytes,
        note,
    }
}

fn text(report: &Report, total: usize) -> String {
    let runs = &report.runs;
    if runs.is_empty() {
        return format!(
            "no run to remove in {} ({total} run{} in all)\n",
            report.store,
            if total == 1 { "" } else { "s" }
        );
    }
    let size_header = if report.dry_run { "FILES" } else { "FREED" };
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|p| {
            let size = match (&p.removed, &p.skipped) {
                (_, Some(_)) => String::from("skipped"),
                (Some(f), None) => bytes(f.freed_bytes),
                (None, None) => bytes(p.dir_bytes + p.store.file_bytes),
            };
            // The store's rows, an estimate.
            let store_rows = match (&p.removed, &p.skipped) {
                (_, Some(_)) => String::from("-"),
                (Some(f), None) => format!("~{}", bytes(f.store.row_bytes)),
                (None, None) => format!("~{}", bytes(p.store.row_bytes)),
            };
            vec![
                p.id.clone(),
                p.workflow.clone(),
                p.status.to_string(),
                p.ended.clone(),
                size,
                store_rows,
            ]
        })
        .collect();
    let mut out = table(
        &["ID", "WORKFLOW", "STATUS", "ENDED", size_header, "ROWS"],
        &rows,
    );
    for p in runs {
        for k in &p.kept {
            out += &format!("kept {} of run {}: {}\n", k.path, p.id, k.why);
        }
        if let Some(why) = &p.skipped {
            out += &format!("skipped {}: {why}\n", p.id);
        }
        for problem in p.removed.iter().flat_map(|f| &f.problems) {
            out += &format!("! {problem}\n");
        }
    }
    let n = |k: usize| format!("{k} run{}", if k == 1 { "" } else { "s" });
    let rows = format!(
        "about {} of rows in the store",
        bytes(report.store_row_bytes)
    );
    if report.dry_run {
        out += &format!(
            "would remove {} of {}: {} of files (directories, workspaces, spilled outputs; \
             spilled outputs other runs share stay) and {rows}\nnothing was removed \
             (--dry-run)\n",
            n(runs.len()),
            total,
            bytes(report.freed_bytes)
        );
    } else {
        let removed = runs.iter().filter(|p| p.removed.is_some()).count();
        out += &format!(
            "removed {}: freed {} of files (directories, workspaces, spilled outputs) and \
             {rows}; {}\n",
            n(removed),
            bytes(report.freed_bytes),
            report.note
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn record(id: &str, workflow: &str, status: RunStatus, updated_at: i64) -> RunRecord {
        RunRecord {
            id: id.into(),
            workflow: workflow.into(),
            file: String::new(),
            workflow_hash: String::new(),
            params: serde_json::json!({}),
            status,
            exit: None,
            started_at: updated_at,
            updated_at,
            dir: format!("/s/runs/{id}"),
            options: serde_json::json!({}),
        }
    }

    fn chosen(runs: &[RunRecord], argv: &[&str], now: i64) -> Vec<String> {
        let cli = Cli::try_parse_from(std::iter::once("t").chain(argv.iter().copied()))
            .unwrap_or_else(|e| panic!("{e}"));
        choose(runs, &cli.args, now)
            .into_iter()
            .map(|r| r.id.clone())
            .collect()
    }

    #[test]
    fn keep_counts_ended_runs_per_workflow_and_age_needs_both() {
        let day = 86_400_000;
        let now = 10 * day;
        // Newest first, as the store lists them.
        let runs = vec![
            record("a5", "a", RunStatus::Finished, now - day),
            record("b2", "b", RunStatus::Finished, now - 2 * day),
            record("a4", "a", RunStatus::Waiting, now - 3 * day),
            record("a3", "a", RunStatus::Cancelled, now - 4 * day),
            record("a2", "a", RunStatus::Finished, now - 5 * day),
            record("b1", "b", RunStatus::Running, now - 6 * day),
            record("a1", "a", RunStatus::Finished, now - 7 * day),
        ];
        assert_eq!(chosen(&runs, &["--keep", "1"], now), ["a3", "a2", "a1"]);
        assert_eq!(
            chosen(&runs, &["--keep", "0"], now),
            ["a5", "b2", "a3", "a2", "a1"]
        );
        assert_eq!(
            chosen(&runs, &["--older-than", "4d 12h"], now),
            ["a2", "a1"]
        );
        assert_eq!(
            chosen(&runs, &["--older-than", "3d", "--keep", "2"], now),
            ["a2", "a1"]
        );
        assert_eq!(
            chosen(&runs, &["--keep", "0", "--workflow", "b"], now),
            ["b2"]
        );
    }

    #[test]
    fn places_follow_the_state_directory_the_run_recorded() {
        let run = record("r1", "a", RunStatus::Finished, 0);
        let p = Places::of(&run, Path::new("/elsewhere"));
        assert_eq!(p.run_dir, Path::new("/s/runs/r1"));
        assert_eq!(p.worktrees, Path::new("/s/worktrees/r1"));
        assert_eq!(
            p.units,
            [
                PathBuf::from("/s/units/attempts/r1"),
                PathBuf::from("/elsewhere/units/attempts/r1")
            ]
        );
        // A record that names no such directory: the state directory given.
        let mut odd = run.clone();
        odd.dir = "/tmp/x".into();
        let p = Places::of(&odd, Path::new("/given"));
        assert_eq!(p.run_dir, Path::new("/given/runs/r1"));
        assert_eq!(p.units, [PathBuf::from("/given/units/attempts/r1")]);
    }
}
