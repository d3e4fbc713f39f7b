//! Targeted notifications (tests/pg): coordinators waiting for their units of work on a real
//! PostgreSQL server, woken by the store's notifications through one listener as a worker
//! process has ([`UnitWakes`]). Four coordinators wait for 50 units each; this test plays
//! the worker that finishes them.
//!
//! - a unit's result wakes only its coordinator, which reads only that unit, at once; the
//!   other coordinators read nothing;
//! - a notification lost while the listening connection was down (it is killed here) is
//!   made up for on reconnection: every coordinator sweeps (one read of all its units) and
//!   the finished unit is seen;
//! - a notification lost without a reconnection is made up for by the periodic sweep.
#![allow(clippy::unwrap_used)]

mod pg;

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ralph_flow::run::units::{UnitWaits, UnitWakes, WaitReads};
use ralph_flow::store::postgres::PgStore;
use ralph_flow::store::{
    AcceptUnit, LockOwner, SharedStore, Store, UnitQueue, UnitRequest, UnitState, now_ms,
};
use serde_json::json;

const COORDINATORS: usize = 4;
const UNITS: usize = 50;

fn leased(holder: &str) -> LockOwner {
    let now = now_ms();
    LockOwner {
        pid: std::process::id(),
        host: format!("{holder}-host"),
        since: now,
        holder: holder.to_string(),
        expires: Some(now + 600_000),
        ..LockOwner::default()
    }
}

/// The label of coordinator `c`'s unit `i`: each unit has one of its own, so the test's
/// worker claims exactly the unit it means.
fn label(c: usize, i: usize) -> String {
    format!("c{c}-u{i}")
}

/// Plays a worker: claims unit (c, i) and finishes it.
fn finish(worker: &Mutex<PgStore>, c: usize, i: usize) -> i64 {
    let mut w = worker.lock().unwrap();
    let owner = leased("worker");
    let accept: AcceptUnit = Arc::new(|_: &serde_json::Value| true);
    let unit = w
        .claim_unit(&owner, &[label(c, i)], accept)
        .unwrap()
        .unwrap_or_else(|| panic!("unit {c}/{i} is claimable"));
    assert!(w.finish_unit(unit.id, &owner, &json!({"ok": i})).unwrap());
    unit.id
}

#[test]
fn a_notification_wakes_only_its_units_coordinator_and_a_lost_one_is_made_up_for() {
    let Some(url) = pg::database() else {
        return;
    };
    // The coordinators' runs and units.
    let mut boss = PgStore::connect(&url).unwrap();
    let mut ids = vec![Vec::new(); COORDINATORS];
    for (c, list) in ids.iter_mut().enumerate() {
        let run = format!("run-{c}");
        boss.lock(&run, &leased("boss")).unwrap();
        for i in 0..UNITS {
            let key = format!("items#{i}/work#1.1@h");
            let id = boss
                .dispatch(&UnitRequest {
                    coordinator: "boss",
                    run: &run,
                    key: &key,
                    stage_prefix: &format!("items#{i}/work#"),
                    kind: "command",
                    payload: &json!({"i": i}),
                    labels: &[label(c, i)],
                    place: &json!({"dir": "/here"}),
                    hold: None,
                })
                .unwrap();
            list.push(id);
        }
    }
    // One listener, as a worker process has; `deaf` drops what it hears (lost
    // notifications), except the word that it reconnected.
    let wakes = UnitWakes::new();
    let deaf = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let listener = {
        let (wakes, deaf) = (wakes.clone(), deaf.clone());
        boss.listen(
            stop.clone(),
            Box::new(move |payload| {
                if payload.is_none() || !deaf.load(Ordering::SeqCst) {
                    wakes.notified(payload);
                }
            }),
        )
        .unwrap()
    };
    let worker = Arc::new(Mutex::new(PgStore::connect(&url).unwrap()));
    // Coordinators 0 to 2 sweep every minute (not within this test unless woken as lost);
    // coordinator 3 every second.
    let waits: Vec<Rc<UnitWaits>> = (0..COORDINATORS)
        .map(|c| {
            let sweep = if c == 3 { 1 } else { 60 };
            Rc::new(UnitWaits::new(
                Some(wakes.clone()),
                Duration::from_secs(sweep),
            ))
        })
        .collect();
    let seen: Rc<RefCell<HashMap<i64, (Instant, UnitState)>>> = Rc::default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async {
        for (c, list) in ids.iter().enumerate() {
            let store: Rc<RefCell<Box<dyn SharedStore>>> =
                Rc::new(RefCell::new(Box::new(PgStore::connect(&url).unwrap())));
            for id in list.iter().copied() {
                let (store, waits, seen) = (store.clone(), waits[c].clone(), seen.clone());
                tokio::task::spawn_local(async move {
                    let unit = waits.settled(&store, id).await.unwrap().unwrap();
                    seen.borrow_mut().insert(id, (Instant::now(), unit.state));
                });
            }
        }
        let reads = |c: usize| waits[c].reads();
        let all_units = || (0..COORDINATORS).map(|c| reads(c).units).sum::<u64>();
        // Every waiter registered and read its unit once.
        let t = Instant::now();
        while wakes.watched() < COORDINATORS * UNITS
            || all_units() < u64::try_from(COORDINATORS * UNITS).unwrap()
        {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "the waiters did not start"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let start: Vec<WaitReads> = (0..COORDINATORS).map(reads).collect();
        assert!(
            start.iter().all(|r| r.units == UNITS as u64),
            "one read each: {start:?}"
        );
        // Wait for (c, i) to be seen as done, within `limit`; returns how long it took.
        let await_seen = |id: i64, limit: Duration| {
            let seen = seen.clone();
            async move {
                let t = Instant::now();
                loop {
                    if let Some((_, state)) = seen.borrow().get(&id) {
                        assert_eq!(*state, UnitState::Done);
                        return t.elapsed();
                    }
                    assert!(t.elapsed() < limit, "unit {id} not seen in {limit:?}");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        };
        let finish_now = |c: usize, i: usize| {
            let worker = worker.clone();
            async move {
                tokio::task::spawn_blocking(move || finish(&worker, c, i))
                    .await
                    .unwrap()
            }
        };

        // 1. Ten results for coordinator 0, one at a time: each is seen promptly, with one
        //    read of that unit; nobody else reads anything.
        for i in 0..10 {
            let id = finish_now(0, i).await;
            let took = await_seen(id, Duration::from_secs(3)).await;
            assert!(took < Duration::from_secs(3), "{took:?}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(reads(0).units, start[0].units + 10, "{:?}", reads(0));
        for (c, at_start) in start.iter().enumerate().take(3).skip(1) {
            assert_eq!(reads(c), *at_start, "coordinator {c} was not woken");
        }
        assert_eq!(
            reads(3).units,
            start[3].units,
            "coordinator 3 was not woken"
        );

        // 2. A result whose notification is lost, then the listening connection is killed:
        //    on reconnection every coordinator sweeps (one read each, not one per unit) and
        //    coordinator 1 sees its unit.
        deaf.store(true, Ordering::SeqCst);
        let lost = finish_now(1, 0).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !seen.borrow().contains_key(&lost),
            "its notification was dropped"
        );
        let before: Vec<WaitReads> = (0..COORDINATORS).map(reads).collect();
        deaf.store(false, Ordering::SeqCst);
        let killed = tokio::task::spawn_blocking({
            let url = url.clone();
            move || {
                let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
                c.query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = current_database() AND query = 'LISTEN ralph_flow' \
                     AND pid <> pg_backend_pid()",
                    &[],
                )
                .unwrap()
                .len()
            }
        })
        .await
        .unwrap();
        assert_eq!(killed, 1, "the listener's connection");
        await_seen(lost, Duration::from_secs(10)).await;
        for (c, was) in before.iter().enumerate().take(3) {
            let r = reads(c);
            assert_eq!(r.units, was.units, "coordinator {c}: {r:?}");
            assert_eq!(r.sweeps, was.sweeps + 1, "coordinator {c}: {r:?}");
        }

        // 3. A lost notification without a reconnection: coordinator 3's sweep (every
        //    second) finds the result.
        deaf.store(true, Ordering::SeqCst);
        let unheard = finish_now(3, 0).await;
        let took = await_seen(unheard, Duration::from_secs(5)).await;
        assert!(took <= Duration::from_secs(3), "{took:?}");
        assert!(reads(3).sweeps > before[3].sweeps);
        deaf.store(false, Ordering::SeqCst);

        // And a notification heard again wakes its coordinator at once.
        let id = finish_now(2, 1).await;
        await_seen(id, Duration::from_secs(3)).await;
    });
    stop.store(true, Ordering::SeqCst);
    listener.join().unwrap();
}
