//! The engine's own cost per stage, end to end through `execute`: templates, extraction,
//! artifacts, the durable commit and scheduling.
//!
//! - `replay`: agent stages answered in-process from a recording (a no-op backend);
//! - `/bin/true`: command stages that spawn `/bin/true`.
//!
//! Run with `cargo bench --bench executor`; results go in BENCHMARKS.md.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use ralph_flow::prepare::prepare;
use ralph_flow::run::progress::Mode;
use ralph_flow::run::{RunOptions, execute};

fn chain_workflow(n: usize, kind: &str) -> String {
    let mut s = String::from("name = \"bench\"\n[agents.bot]\nkind = \"claude\"\n");
    for i in 0..n {
        let _ = writeln!(s, "[stages.s{i}]");
        if kind == "agent" {
            let _ = writeln!(
                s,
                "kind = \"agent\"\nagent = \"bot\"\nprompt = \"step {i}\""
            );
        } else {
            let _ = writeln!(s, "kind = \"command\"\nargv = [\"/bin/true\"]");
        }
        if i > 0 {
            let _ = writeln!(s, "needs = [\"s{}\"]", i - 1);
        }
    }
    s
}

fn recording(n: usize) -> String {
    let mut s = String::new();
    for i in 0..n {
        // The length of the prompt the stage renders (`step {i}`): the replay warns of none.
        let bytes = format!("step {i}").len();
        let _ = writeln!(
            s,
            "{{\"scope\":\"\",\"stage\":\"s{i}\",\"attempt\":1,\"agent\":\"bot\",\"prompt_bytes\":{bytes},\"reply\":{{\"text\":\"ok {i}\",\"raw\":\"ok\",\"usage\":{{\"input_tokens\":10,\"output_tokens\":2,\"cached_tokens\":0,\"cost_usd\":null}},\"session_id\":null,\"model\":null}}}}"
        );
    }
    s
}

fn run_once(n: usize, kind: &str, full_sync: bool, keep: &mut Vec<tempfile::TempDir>) -> Duration {
    // On the project's disk (the target directory), as a real run's `.ralph-flow` is.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let wf = dir.path().join("w.toml");
    std::fs::write(&wf, chain_workflow(n, kind)).expect("write");
    let rec = dir.path().join("rec.jsonl");
    std::fs::write(&rec, recording(n)).expect("write");
    let prepared = prepare(&wf, &[])
        .map_err(|e| e.render())
        .expect("valid workflow");
    let mut opts = RunOptions::new(dir.path().to_path_buf());
    opts.progress = Mode::Quiet;
    opts.full_sync = full_sync;
    if kind == "agent" {
        opts.replay = Some(rec);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let t = Instant::now();
    let r = rt.block_on(execute(&prepared, opts)).expect("run");
    let elapsed = t.elapsed();
    assert_eq!(r.end.code(), 0);
    // Removing thousands of files makes the disk slow for a while (ext4 with `discard`):
    // the directories are removed after all the measurements instead.
    keep.push(dir);
    elapsed
}

fn main() {
    // `cargo test --all-targets` runs this too (without `--bench`): a small smoke run then.
    let full = std::env::args().any(|a| a == "--bench");
    let n = if full { 300 } else { 5 };
    let mut keep = Vec::new();
    println!("| stages | backend | sync | total | per stage |");
    println!("| --- | --- | --- | --- | --- |");
    for (kind, label) in [
        ("agent", "in-process replay (no-op)"),
        ("command", "/bin/true"),
    ] {
        for full_sync in [false, true] {
            // Warm up once, then take the median of five runs.
            let _ = run_once(n, kind, full_sync, &mut keep);
            let mut times: Vec<Duration> = (0..5)
                .map(|_| run_once(n, kind, full_sync, &mut keep))
                .collect();
            times.sort();
            let median = times[2];
            println!(
                "| {n} | {label} | {} | {:.1} ms | {:.0} µs |",
                if full_sync { "FULL" } else { "NORMAL" },
                median.as_secs_f64() * 1e3,
                median.as_secs_f64() * 1e6 / n as f64
            );
        }
    }
}
