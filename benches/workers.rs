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
//!   programs spread as units over 1, 2, 4 and 8 workers;
//! - notifications: 4 coordinators wait for 50 units each, woken through one listener as a
//!   worker process's are, while a worker finishes 20 of them one at a time: the reads of
//!   units per result and per second of quiet, with the wait loop as it was before
//!   notifications named their unit (every waiter woken by every notification, and
//!   polling every 250 ms; reproduced here) and with `run::units::UnitWaits`.
//!   `cargo bench --bench workers -- notifications` runs this part alone.
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
    notifications(&url);
    if std::env::args().any(|a| a == "notifications") {
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

/// How coordinators wait for their units in [`notifications`].
#[derive(Clone, Copy, PartialEq)]
enum Waiting {
    /// The loop before notifications named their unit: every notification wakes every
    /// waiter, which reads its unit; each also polls, every 5 ms doubling to 250 ms.
    Before,
    /// `run::units::UnitWaits`: a notification wakes the waiter of the unit it names.
    Targeted,
}

/// Reads of units per result and per second of quiet: 4 coordinators x 50 waiting units,
/// 20 results (5 per coordinator) one at a time.
fn notifications(url: &str) {
    use ralph_flow::run::units::{UnitWaits, UnitWakes};
    use ralph_flow::store::{
        AcceptUnit, LockOwner, SharedStore, UnitQueue, UnitRequest, UnitState, now_ms,
    };
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    const COORDINATORS: usize = 4;
    const UNITS: usize = 50;
    const RESULTS: usize = 20;
    let leased = |holder: &str| {
        let now = now_ms();
        LockOwner {
            pid: std::process::id(),
            host: format!("{holder}-host"),
            since: now,
            holder: holder.to_string(),
            expires: Some(now + 600_000),
            ..LockOwner::default()
        }
    };
    println!(
        "| waiting | coordinators x waiting units | reads of units per result | result seen after (p50) | reads per second, quiet |\n|---|---:|---:|---:|---:|"
    );
    for how in [Waiting::Before, Waiting::Targeted] {
        let tag = format!("{}-{}", std::process::id(), now_ms());
        let mut boss = PgStore::connect(url).expect("connect");
        let label = |c: usize, i: usize| format!("{tag}-c{c}-u{i}");
        let mut ids = vec![Vec::new(); COORDINATORS];
        for (c, list) in ids.iter_mut().enumerate() {
            let run = format!("bench-{tag}-{c}");
            boss.lock(&run, &leased("boss")).expect("lock");
            for i in 0..UNITS {
                let id = boss
                    .dispatch(&UnitRequest {
                        coordinator: "boss",
                        run: &run,
                        key: &format!("items#{i}/work#1.1@h"),
                        stage_prefix: &format!("items#{i}/work#"),
                        kind: "command",
                        payload: &serde_json::json!({"i": i}),
                        labels: &[label(c, i)],
                        place: &serde_json::json!({"dir": "/here"}),
                        hold: None,
                    })
                    .expect("dispatch");
                list.push(id);
            }
        }
        let wakes = UnitWakes::new();
        let all = Arc::new(tokio::sync::Notify::new());
        let stop = Arc::new(AtomicBool::new(false));
        let listener = {
            let (wakes, all) = (wakes.clone(), all.clone());
            boss.listen(
                stop.clone(),
                Box::new(move |payload| {
                    wakes.notified(payload);
                    all.notify_waiters();
                }),
            )
            .expect("listen")
        };
        let worker = Arc::new(Mutex::new(PgStore::connect(url).expect("connect")));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let local = tokio::task::LocalSet::new();
        let (per_result, p50, quiet) = local.block_on(&rt, async {
            let reads = Rc::new(Cell::new(0u64));
            let seen: Rc<RefCell<Vec<i64>>> = Rc::default();
            let waits: Vec<Rc<UnitWaits>> = (0..COORDINATORS)
                .map(|_| {
                    Rc::new(UnitWaits::new(
                        Some(wakes.clone()),
                        ralph_flow::run::units::SWEEP,
                    ))
                })
                .collect();
            for (c, list) in ids.iter().enumerate() {
                let store: Rc<RefCell<Box<dyn SharedStore>>> = Rc::new(RefCell::new(Box::new(
                    PgStore::connect(url).expect("connect"),
                )));
                for id in list.iter().copied() {
                    let (store, seen, reads, all) =
                        (store.clone(), seen.clone(), reads.clone(), all.clone());
                    let waits = waits[c].clone();
                    tokio::task::spawn_local(async move {
                        match how {
                            Waiting::Targeted => {
                                waits.settled(&store, id).await.expect("wait");
                            }
                            Waiting::Before => {
                                let mut delay = Duration::from_millis(5);
                                loop {
                                    tokio::select! {
                                        () = all.notified() => {}
                                        () = tokio::time::sleep(delay) => {}
                                    }
                                    delay = (delay * 2).min(Duration::from_millis(250));
                                    reads.set(reads.get() + 1);
                                    let unit = store.borrow().unit(id).expect("read");
                                    if unit.is_some_and(|u| u.state == UnitState::Done) {
                                        break;
                                    }
                                }
                            }
                        }
                        seen.borrow_mut().push(id);
                    });
                }
            }
            let count = || match how {
                Waiting::Before => reads.get(),
                Waiting::Targeted => waits
                    .iter()
                    .map(|w| {
                        let r = w.reads();
                        r.units + r.sweeps
                    })
                    .sum(),
            };
            // Settled: every waiter has started (and read once).
            tokio::time::sleep(Duration::from_secs(3)).await;
            let at = count();
            let mut took = Vec::new();
            for n in 0..RESULTS {
                let (c, i) = (n % COORDINATORS, n / COORDINATORS);
                let id = ids[c][i];
                let worker = worker.clone();
                let label = label(c, i);
                let t = Instant::now();
                tokio::task::spawn_blocking(move || {
                    let mut w = worker.lock().expect("worker");
                    let owner = leased("worker");
                    let accept: AcceptUnit = Arc::new(|_: &serde_json::Value| true);
                    let unit = w
                        .claim_unit(&owner, &[label], accept)
                        .expect("claim")
                        .expect("claimable");
                    w.finish_unit(unit.id, &owner, &serde_json::json!({}))
                        .expect("finish");
                })
                .await
                .expect("worker");
                while !seen.borrow().contains(&id) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                took.push(t.elapsed());
            }
            let per_result = (count() - at) as f64 / RESULTS as f64;
            took.sort();
            let p50 = took[RESULTS / 2];
            let quiet_from = count();
            let quiet_for = Duration::from_secs(10);
            tokio::time::sleep(quiet_for).await;
            let quiet = (count() - quiet_from) as f64 / quiet_for.as_secs_f64();
            (per_result, p50, quiet)
        });
        stop.store(true, Ordering::SeqCst);
        let _ = listener.join();
        drop(rt);
        println!(
            "| {} | {COORDINATORS} x {UNITS} | {per_result:.1} | {:.1} ms | {quiet:.1} |",
            match how {
                Waiting::Before => "before: every waiter woken, polling",
                Waiting::Targeted => "targeted, sweep every 5 s",
            },
            ms(p50)
        );
    }
    println!();
}
