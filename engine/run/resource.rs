//! A semaphore that serves waiters by priority: the resources of a workflow (a merge queue
//! is a resource of capacity 1). Single-threaded, like the executor.

use std::cell::RefCell;
use std::rc::Rc;

use tokio::sync::oneshot;

/// A concurrency limit as a tokio semaphore: at least 1, and at most what tokio allows
/// (`max_concurrency = 9223372036854775807` means no limit, not a panic).
pub(super) fn limit(n: usize) -> tokio::sync::Semaphore {
    tokio::sync::Semaphore::new(n.clamp(1, tokio::sync::Semaphore::MAX_PERMITS))
}

/// How a waiter ranks: lower sorts first (served first), then first come.
pub(super) type Rank = (i64, u64);

#[derive(Debug)]
struct State {
    available: usize,
    seq: u64,
    waiters: Vec<(Rank, oneshot::Sender<()>)>,
}

/// A priority semaphore.
#[derive(Clone, Debug)]
pub(super) struct PrioritySemaphore {
    state: Rc<RefCell<State>>,
}

/// Holds one unit of a resource until dropped.
#[derive(Debug)]
pub(super) struct Permit {
    state: Rc<RefCell<State>>,
}

impl PrioritySemaphore {
    /// Creates a semaphore with a capacity.
    pub(super) fn new(capacity: usize) -> Self {
        PrioritySemaphore {
            state: Rc::new(RefCell::new(State {
                available: capacity.max(1),
                seq: 0,
                waiters: Vec::new(),
            })),
        }
    }

    /// Waits for a unit; `priority` ranks the waiter (lower is served first).
    pub(super) async fn acquire(&self, priority: i64) -> Permit {
        let rx = {
            let mut st = self.state.borrow_mut();
            if st.available > 0 && st.waiters.is_empty() {
                st.available -= 1;
                None
            } else {
                let (tx, rx) = oneshot::channel();
                st.seq += 1;
                let rank = (priority, st.seq);
                st.waiters.push((rank, tx));
                Some(rx)
            }
        };
        if let Some(rx) = rx {
            let mut pending = Pending {
                rx: Some(rx),
                state: self.state.clone(),
            };
            if let Some(rx) = pending.rx.as_mut() {
                // The sender is only dropped after handing the unit over.
                let _ = rx.await;
            }
            pending.rx = None;
        }
        Permit {
            state: self.state.clone(),
        }
    }
}

/// A waiter; if it is dropped after the unit was handed to it, the unit goes back.
struct Pending {
    rx: Option<oneshot::Receiver<()>>,
    state: Rc<RefCell<State>>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            if rx.try_recv().is_ok() {
                drop(Permit {
                    state: self.state.clone(),
                });
            }
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut st = self.state.borrow_mut();
        loop {
            let best = st
                .waiters
                .iter()
                .enumerate()
                .min_by_key(|(_, (rank, _))| *rank)
                .map(|(i, _)| i);
            match best {
                Some(i) => {
                    let (_, tx) = st.waiters.swap_remove(i);
                    // A waiter that gave up (its future was dropped) does not take the unit.
                    if tx.send(()).is_ok() {
                        return;
                    }
                }
                None => {
                    st.available += 1;
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiters_are_served_by_priority() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let sem = PrioritySemaphore::new(1);
            let order = Rc::new(RefCell::new(Vec::new()));
            let first = sem.acquire(0).await;
            let mut futs = Vec::new();
            for (name, prio) in [("low", 3), ("high", 1), ("mid", 2)] {
                let sem = sem.clone();
                let order = order.clone();
                futs.push(async move {
                    let _p = sem.acquire(prio).await;
                    order.borrow_mut().push(name);
                    tokio::task::yield_now().await;
                });
            }
            let all = futures_util::future::join_all(futs);
            let release = async {
                tokio::task::yield_now().await;
                drop(first);
            };
            futures_util::future::join(all, release).await;
            assert_eq!(*order.borrow(), vec!["high", "mid", "low"]);
        });
    }
}
