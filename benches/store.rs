//! What a durable commit of the SQLite store costs: `cargo bench --bench store`; with
//! `RALPH_FLOW_BENCH_POSTGRES=postgres://...` (an empty database), the PostgreSQL store's too.
//!
//! `cargo bench --bench store -- full` runs only the cases whose name (or durability) contains
//! `full`. Each case opens a fresh store in a temporary directory, does some warm-up commits, then
//! times every commit with `Instant` and prints the mean, median and 99th percentile. Rows
//! accumulate as they would in a long run (every commit settles a node in a new scope).

use std::path::Path;
use std::time::{Duration, Instant};

use ralph_flow::backend::Usage;
use ralph_flow::store::sqlite::{Durability, SqliteStore};
use ralph_flow::store::{
    AttemptRecord, Event, NodeRecord, NodeState, RunRecord, RunStatus, Store, Write,
};
use serde_json::json;

const RUN: &str = "20260101-000000-bench";
const WARMUP: usize = 200;

fn main() {
    // `cargo bench --bench store -- WORD` runs only the cases whose name or durability
    // contains WORD.
    let filter = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .unwrap_or_default()
        .to_lowercase();
    // `cargo test --all-targets` runs this too (without `--bench`): a fiftieth of the work.
    let scale = if std::env::args().any(|a| a == "--bench") {
        1
    } else {
        50
    };
    // On the project's disk (the target directory), as a real run's `.ralph-flow` is.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temporary directory");
    println!("store commit benchmark in {}", dir.path().display());
    println!();
    println!(
        "| case | durability | commits | mean | p50 | p99 | per node (mean) |\n\
         |---|---|---:|---:|---:|---:|---:|"
    );
    for durability in [Durability::Normal, Durability::Full] {
        // (name, commits, nodes per commit, output size, fenced: the run locked with a
        // lease, as an executor holds it, so every commit checks the lease).
        let cases: [(&str, usize, usize, usize, bool); 4] = [
            (
                "1 node (2 KiB output + attempt end + event)",
                5000,
                1,
                2 * 1024,
                false,
            ),
            ("1 node, fenced by the run's lease", 5000, 1, 2 * 1024, true),
            ("8 nodes in one group commit", 1000, 8, 2 * 1024, false),
            (
                "1 node, 100 KiB output (spilled)",
                500,
                1,
                100 * 1024,
                false,
            ),
        ];
        let floor = format!("floor {durability:?}").to_lowercase();
        if floor.contains(&filter) {
            let path = dir.path().join(format!("{durability:?}-floor.db"));
            let n = 5000 / scale;
            let stats = Stats::of(raw_floor(&path, durability, n));
            println!(
                "| floor: raw SQLite, one 2 KiB row per transaction | {durability:?} | {n} | {} | {} | {} | - |",
                us(stats.mean),
                us(stats.p50),
                us(stats.p99),
            );
        }
        for (i, (name, commits, per_commit, size, fenced)) in cases.into_iter().enumerate() {
            let commits = commits / scale;
            let label = format!("{name} {durability:?}").to_lowercase();
            if !label.contains(&filter) {
                continue;
            }
            let path = dir
                .path()
                .join(format!("{durability:?}-{i}"))
                .join("state.db");
            let (times, rss) = bench(&path, durability, commits, per_commit, size, fenced);
            let stats = Stats::of(times);
            println!(
                "| {name} | {durability:?} | {commits} | {} | {} | {} | {} |",
                us(stats.mean),
                us(stats.p50),
                us(stats.p99),
                us(stats.mean / u32::try_from(per_commit).expect("small")),
            );
            if let Some((before, after)) = rss {
                eprintln!("  {name}, {durability:?}: resident memory {before} KiB -> {after} KiB");
            }
        }
    }
    if let Ok(url) = std::env::var("RALPH_FLOW_BENCH_POSTGRES") {
        postgres_cases(&url, &filter, scale);
    }
}

/// The same cases on the PostgreSQL store (the server's own durability settings), and the
/// floor: one 2 KiB row per transaction through the same client.
fn postgres_cases(url: &str, filter: &str, scale: usize) {
    use ralph_flow::store::postgres::PgStore;
    if "floor postgres".contains(filter) {
        let mut c = postgres::Client::connect(url, postgres::NoTls).expect("connect");
        c.batch_execute(
            "CREATE TABLE IF NOT EXISTS bench_floor (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL)",
        )
        .expect("schema");
        let body = "x".repeat(2048);
        let n = 5000 / scale;
        let mut times = Vec::with_capacity(n);
        for i in 0..WARMUP + n {
            let start = Instant::now();
            let mut tx = c.transaction().expect("begin");
            tx.execute("INSERT INTO bench_floor (body) VALUES ($1)", &[&body])
                .expect("insert");
            tx.commit().expect("commit");
            if i >= WARMUP {
                times.push(start.elapsed());
            }
        }
        let stats = Stats::of(times);
        println!(
            "| floor: raw PostgreSQL client, one 2 KiB row per transaction | postgres | {n} | {} | {} | {} | - |",
            us(stats.mean),
            us(stats.p50),
            us(stats.p99),
        );
    }
    let cases: [(&str, usize, usize); 2] = [
        ("1 node (2 KiB output + attempt end + event)", 5000, 1),
        ("8 nodes in one group commit", 1000, 8),
    ];
    for (i, (name, commits, per_commit)) in cases.into_iter().enumerate() {
        let commits = commits / scale;
        if !format!("{name} postgres").to_lowercase().contains(filter) {
            continue;
        }
        let store = PgStore::connect(url).expect("connect");
        let run = format!("{RUN}-{i}-{}", std::process::id());
        let (times, _) = bench_store(Box::new(store), &run, commits, per_commit, 2 * 1024, false);
        let stats = Stats::of(times);
        println!(
            "| {name} | postgres | {commits} | {} | {} | {} | {} |",
            us(stats.mean),
            us(stats.p50),
            us(stats.p99),
            us(stats.mean / u32::try_from(per_commit).expect("small")),
        );
    }
}

/// Commits `commits` groups of `per_commit` nodes (each with its attempt's end and an event)
/// and returns the time of each commit, and the resident memory before and after.
fn bench(
    path: &Path,
    durability: Durability,
    commits: usize,
    per_commit: usize,
    size: usize,
    fenced: bool,
) -> (Vec<Duration>, Option<(u64, u64)>) {
    let store = SqliteStore::open_with(path, durability).expect("open the store");
    bench_store(Box::new(store), RUN, commits, per_commit, size, fenced)
}

/// [`bench`] on any store, in run `run`.
fn bench_store(
    mut store: Box<dyn Store>,
    run: &str,
    commits: usize,
    per_commit: usize,
    size: usize,
    fenced: bool,
) -> (Vec<Duration>, Option<(u64, u64)>) {
    store
        .create_run(&RunRecord {
            id: run.to_string(),
            workflow: "bench".to_string(),
            file: "bench.toml".to_string(),
            workflow_hash: "0".repeat(64),
            params: json!({"max_attempts": 3}),
            status: RunStatus::Running,
            exit: None,
            started_at: 0,
            updated_at: 0,
            dir: ".ralph-flow/runs/bench".to_string(),
            options: serde_json::json!({}),
        })
        .expect("create the run");
    if fenced {
        let owner = ralph_flow::store::current_owner().with_lease(Duration::from_secs(3600));
        store.lock(run, &owner).expect("lock the run");
    }
    let filler = "lorem ipsum dolor sit amet, ".repeat(size / 28 + 1);
    let mut times = Vec::with_capacity(commits);
    let mut rss_before = None;
    for i in 0..WARMUP + commits {
        if i == WARMUP {
            rss_before = rss_kib();
        }
        let writes: Vec<Write> = (0..per_commit)
            .flat_map(|j| group(run, i, j, &filler[..size - 40]))
            .collect();
        let start = Instant::now();
        store.commit(&writes).expect("commit");
        if i >= WARMUP {
            times.push(start.elapsed());
        }
    }
    let rss = rss_before.zip(rss_kib());
    (times, rss)
}

/// The floor: plain rusqlite, one 2 KiB row inserted per transaction into a one-table file
/// with the same settings (WAL, the same `synchronous`).
fn raw_floor(path: &Path, durability: Durability, commits: usize) -> Vec<Duration> {
    let conn = rusqlite::Connection::open(path).expect("open");
    let sync = match durability {
        Durability::Normal => "NORMAL",
        Durability::Full => "FULL",
    };
    conn.execute_batch(&format!(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = {sync};\
         CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL);"
    ))
    .expect("schema");
    let body = "x".repeat(2048);
    let mut times = Vec::with_capacity(commits);
    for i in 0..WARMUP + commits {
        let start = Instant::now();
        conn.execute_batch("BEGIN IMMEDIATE").expect("begin");
        conn.prepare_cached("INSERT INTO t (body) VALUES (?1)")
            .and_then(|mut stmt| stmt.execute([&body]))
            .expect("insert");
        conn.execute_batch("COMMIT").expect("commit");
        if i >= WARMUP {
            times.push(start.elapsed());
        }
    }
    times
}

/// The writes of one settled node, in the executor's order: its attempt's end, then its
/// settlement event and the node at the same time (which the store keeps in one row).
fn group(run: &str, i: usize, j: usize, text: &str) -> [Write; 3] {
    let scope = format!("loop#{i}");
    let node = format!("stage{j}");
    let usage = Usage {
        input_tokens: 12_000,
        output_tokens: 800,
        cached_tokens: 9_000,
        cost_usd: Some(0.042),
        unreported: 0,
    };
    [
        Write::Attempt(AttemptRecord {
            run: run.to_string(),
            scope: scope.clone(),
            node: node.clone(),
            attempt: 1,
            state: ralph_flow::store::AttemptState::Ok,
            agent: Some("claude".to_string()),
            dir: format!(".ralph-flow/runs/bench/{scope}/{node}/1"),
            error: None,
            usage: usage.clone(),
            started_at: 1_000,
            finished_at: Some(2_000),
        }),
        Write::Event(Event {
            run: run.to_string(),
            at: 2_000,
            scope: scope.clone(),
            node: node.clone(),
            kind: "done".to_string(),
            message: "done in 1s, 12800 tokens".to_string(),
        }),
        Write::Node(NodeRecord {
            run: run.to_string(),
            scope,
            node,
            state: NodeState::Done,
            // The index keeps spilled outputs distinct, so each one is a new file.
            output: json!({"summary": text, "i": i, "j": j, "ok": true}),
            action: Some("continue".to_string()),
            feedback: None,
            attempts: 1,
            usage,
            started_at: 1_000,
            finished_at: 2_000,
        }),
    ]
}

struct Stats {
    mean: Duration,
    p50: Duration,
    p99: Duration,
}

impl Stats {
    fn of(mut times: Vec<Duration>) -> Stats {
        times.sort_unstable();
        let total: Duration = times.iter().sum();
        let pick = |q: f64| times[((times.len() as f64 - 1.0) * q).round() as usize];
        Stats {
            mean: total / u32::try_from(times.len()).expect("fewer than 2^32 commits"),
            p50: pick(0.50),
            p99: pick(0.99),
        }
    }
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

/// The resident set size of this process, from /proc (Linux only).
fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
