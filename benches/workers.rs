//! Workers on the PostgreSQL store: `RALPH_FLOW_BENCH_POSTGRES=postgres://... cargo bench
//! --bench workers` (an empty database; without it, nothing runs).
//!
//! - claim and settle: one idle worker, one detached run of a `true` command at a time; the
//!   time from `enqueue` to the run's `finished` status (the queue's notification wakes the
//!   worker), and per stage in a chain of 20 such stages;
//! - throughput: 32 runs of one `sleep 1` stage with 1, 2, 4 and 8 worker processes (one
//!   unit of work at a time each), the workers started (and listening) before the runs are
//!   queued;
//! - one run's fan-out: a for_each of 32 `sleep 1` items (all at once) in one run, its
//!   programs spread as units over 1, 2, 4 and 8 workers.
//!
//! `cargo test --all-targets` runs this without `--bench`: it does nothing then.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ralph_flow::prepare::prepare;
use ralph_flow::run::{RunOptions, worker::enqueue};
use ralph_flow::store::postgres::PgStore;
use ralph_flow::store::{RunStatus, Store};

fn main() {
    let Ok(url) = std::env::var("RALPH_FLOW_BENCH_POSTGRES") else {
        println!("workers benchmark: set RALPH_FLOW_BENCH_POSTGRES=postgres://... to run it");
        return;
    };
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let dir = tempfile::tempdir().expect("temporary directory");
    let chain = |n: usize, argv: &str| {
        let mut wf = String::from("name = \"bench\"\n");
        for i in 0..n {
            wf.push_str(&format!(
                "\n[stages.s{i}]\nkind = \"command\"\nargv = {argv}\n"
            ));
            if i > 0 {
                wf.push_str(&format!("needs = [\"s{}\"]\n", i - 1));
            }
        }
        wf
    };
    std::fs::write(dir.path().join("one.toml"), chain(1, "[\"true\"]")).expect("write");
    std::fs::write(dir.path().join("chain.toml"), chain(20, "[\"true\"]")).expect("write");
    std::fs::write(
        dir.path().join("sleep.toml"),
        chain(1, "[\"sleep\", \"1\"]"),
    )
    .expect("write");
    std::fs::write(
        dir.path().join("fanout.toml"),
        "name = \"fanout\"\n\n[stages.items]\nkind = \"for_each\"\n\
         over = \"range(32) | list\"\n\n[stages.items.stages.work]\nkind = \"command\"\n\
         argv = [\"sleep\", \"1\"]\n",
    )
    .expect("write");
    let store = PgStore::connect(&url).expect("connect");
    let queue = |file: &str| {
        let prepared = prepare(&dir.path().join(file), &[])
            .unwrap_or_else(|e| panic!("the bench's workflow: {}", e.render()));
        let mut opts = RunOptions::new(dir.path().to_path_buf());
        opts.store = Some(ralph_flow::store::Location::Url(url.clone()));
        enqueue(&prepared, &opts, &[]).expect("enqueue")
    };
    // Polls the runs' status every `every` until all are finished.
    let wait = |ids: &[String], every: Duration| {
        let t = Instant::now();
        while ids
            .iter()
            .any(|id| store.run(id).expect("run").map(|r| r.status) != Some(RunStatus::Finished))
        {
            assert!(
                t.elapsed() < Duration::from_secs(300),
                "runs did not finish"
            );
            std::thread::sleep(every);
        }
    };

    println!("| case | runs | mean | p50 | p99 |\n|---|---:|---:|---:|---:|");
    let mut w = vec![worker(&url, dir.path(), 0)];
    std::thread::sleep(Duration::from_millis(500));
    for (case, file, n, per) in [
        (
            "claim and settle: a run of one `true` stage",
            "one.toml",
            50,
            1,
        ),
        (
            "claim and settle: a run of 20 `true` stages (per stage)",
            "chain.toml",
            10,
            20,
        ),
    ] {
        let mut times: Vec<Duration> = (0..n)
            .map(|_| {
                let t = Instant::now();
                let id = queue(file);
                wait(&[id], Duration::from_millis(1));
                t.elapsed() / per
            })
            .collect();
        times.sort();
        let mean = times.iter().sum::<Duration>() / u32::try_from(n).unwrap_or(1);
        println!(
            "| {case} | {n} | {:.1} ms | {:.1} ms | {:.1} ms |",
            ms(mean),
            ms(times[n / 2]),
            ms(times[(n * 99 / 100).min(n - 1)])
        );
    }
    stop(&mut w);

    println!(
        "\n| workers | runs of `sleep 1` | wall time | runs/s | against 1 worker |\n|---:|---:|---:|---:|---:|"
    );
    let mut one = None;
    for workers in [1, 2, 4, 8] {
        let mut pool: Vec<Child> = (0..workers)
            .map(|i| worker(&url, dir.path(), 10 * workers + i))
            .collect();
        // The workers start and listen before anything is queued.
        std::thread::sleep(Duration::from_secs(2));
        let t = Instant::now();
        let ids: Vec<String> = (0..32).map(|_| queue("sleep.toml")).collect();
        // Not too often: the reads would take the cores the workers need.
        wait(&ids, Duration::from_millis(20));
        let took = t.elapsed().as_secs_f64();
        stop(&mut pool);
        let base = *one.get_or_insert(took);
        println!(
            "| {workers} | 32 | {took:.2} s | {:.1} | {:.1}x |",
            32.0 / took,
            base / took
        );
    }

    println!(
        "\n| workers | one run, for_each of 32 `sleep 1` | wall time | items/s | against 1 worker |\n|---:|---:|---:|---:|---:|"
    );
    let mut one = None;
    for workers in [1, 2, 4, 8] {
        let mut pool: Vec<Child> = (0..workers)
            .map(|i| worker(&url, dir.path(), 100 + 10 * workers + i))
            .collect();
        std::thread::sleep(Duration::from_secs(2));
        let t = Instant::now();
        let id = queue("fanout.toml");
        wait(&[id], Duration::from_millis(20));
        let took = t.elapsed().as_secs_f64();
        stop(&mut pool);
        let base = *one.get_or_insert(took);
        println!(
            "| {workers} | 32 | {took:.2} s | {:.1} | {:.1}x |",
            32.0 / took,
            base / took
        );
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn worker(url: &str, dir: &Path, n: usize) -> Child {
    Command::new(env!("CARGO_BIN_EXE_ralph-flow"))
        .args(["worker", "--store", url, "--poll", "5s", "--state-dir"])
        .arg(dir.join(format!("w{n}")))
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a worker")
}

fn stop(pool: &mut Vec<Child>) {
    for w in pool.iter() {
        if let Ok(pid) = i32::try_from(w.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }
    for mut w in pool.drain(..) {
        let _ = w.wait();
    }
}
