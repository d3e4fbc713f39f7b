//! `ralph-flow check` of every shipped preset: loading (parse, includes, extends, prompt files
//! and schemas) and checking, in the process, as the command does; and the whole command,
//! process start included. The results are written down in BENCHMARKS.md; the target is
//! under 15 ms per preset.
//!
//! `cargo bench --bench check` (release). Under `cargo test --all-targets` it runs once per
//! preset as a smoke test.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ralph_flow::diag::Diagnostics;
use ralph_flow::fs::RealFs;
use ralph_flow::load::Loader;
use ralph_flow::source::Sources;

/// Loads and checks one file as `ralph-flow check FILE` does; returns the number of
/// diagnostics (the presets have none).
fn check(path: &Path) -> usize {
    let mut sources = Sources::new();
    let mut diags = Diagnostics::default();
    let fs = RealFs;
    let mut loader = Loader::new(&fs, &mut sources, &mut diags);
    let mut found = Diagnostics::default();
    if let Some(wf) = loader.load(path, None) {
        let _ = ralph_flow::check::check(&wf, &mut loader, &[], false, &mut found);
    }
    diags.extend(found);
    diags.into_sorted().len()
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let reps = if full { 101 } else { 1 };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut presets: Vec<PathBuf> = std::fs::read_dir(root.join("workflows"))
        .expect("workflows/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "toml" || e == "kdl"))
        .collect();
    presets.sort();
    let exe = env!("CARGO_BIN_EXE_ralph-flow");
    println!("| preset | in-process median | in-process max | `ralph-flow check` median |");
    println!("| --- | ---: | ---: | ---: |");
    for p in &presets {
        assert_eq!(check(p), 0, "{} checks clean", p.display());
        let inproc: Vec<Duration> = (0..reps)
            .map(|_| {
                let t = Instant::now();
                check(p);
                t.elapsed()
            })
            .collect();
        let max = *inproc.iter().max().expect("a time");
        let command: Vec<Duration> = (0..reps.min(31))
            .map(|_| {
                let t = Instant::now();
                let out = Command::new(exe)
                    .arg("check")
                    .arg(p)
                    .output()
                    .expect("ralph-flow check");
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                t.elapsed()
            })
            .collect();
        println!(
            "| {} | {:.2} ms | {:.2} ms | {:.2} ms |",
            p.file_name().and_then(|n| n.to_str()).unwrap_or("?"),
            ms(median(inproc)),
            ms(max),
            ms(median(command)),
        );
    }
}
