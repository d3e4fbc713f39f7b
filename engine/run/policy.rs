//! What to do when an agent call fails: retry after a backoff, wait out a rate limit, hand
//! over to a fallback agent, or give up. [`decide`] is a pure function of the failure and of
//! what happened so far; [`call`] drives calls with it, sleeping on the tokio clock, so that
//! tests run it with a paused clock.

use std::future::Future;
use std::time::Duration;

use crate::backend::CallError;

/// The longest single wait between two tries that the backoff makes (a `Retry-After` the
/// server sends is honoured as it is).
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(900);

/// The `n`th wait (from 1) of an exponential backoff that starts at `first` and doubles,
/// never longer than [`MAX_BACKOFF`]: backon's delay iterator, without jitter (a run's waits
/// are reproducible, and its calls are too few to stampede a server).
pub(super) fn backoff_delay(first: Duration, n: u32) -> Duration {
    use backon::BackoffBuilder as _;
    backon::ExponentialBuilder::new()
        .with_min_delay(first.min(MAX_BACKOFF))
        .with_max_delay(MAX_BACKOFF)
        .with_factor(2.0)
        .without_max_times()
        .build()
        // 64 doublings of even a nanosecond pass the cap: later waits are the cap.
        .nth(usize::try_from(n.clamp(1, 64) - 1).unwrap_or(0))
        .map_or(MAX_BACKOFF, |d| d.min(MAX_BACKOFF))
}

/// The settings of the policy.
#[derive(Clone, Debug)]
pub(super) struct Policy {
    /// The first delay of the exponential backoff (of transient failures and of rate limits
    /// that do not say how long to wait).
    pub backoff: Duration,
    /// How many times a transient failure is retried.
    pub transient_retries: u32,
    /// The longest a rate-limited call waits in all before it fails.
    pub rate_limit_wait: Duration,
    /// How many agents the chain has (the agent and its fallbacks).
    pub chain: usize,
}

/// What happened so far in one call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Tries {
    /// The agent of the chain being called.
    pub agent: usize,
    /// Transient failures so far.
    pub transient: u32,
    /// Time waited on rate limits so far.
    pub waited: Duration,
    /// Rate limits waited out so far without being told how long (their backoff grows).
    pub rate_backoffs: u32,
}

/// What to do after a failure.
#[derive(Debug, PartialEq)]
pub(super) enum Next {
    /// Call the next agent of the chain (`to`), because of this failure.
    HandOver { to: usize, why: CallError },
    /// Try the same agent again after `wait`.
    Retry {
        wait: Duration,
        /// The failure, with which retry this is (`n` of `of`) for transient ones.
        why: CallError,
        n: u32,
        of: u32,
    },
    /// Wait out a rate limit, then try the same agent again.
    WaitRateLimit { wait: Duration, why: CallError },
    /// Stop: the call fails with this error.
    GiveUp(CallError),
}

/// Decides what follows a failed call. `tries` is updated (the agent, the counts).
pub(super) fn decide(policy: &Policy, tries: &mut Tries, err: CallError) -> Next {
    let has_next = tries.agent + 1 < policy.chain;
    match err {
        CallError::Missing { .. } | CallError::Refused { .. } if has_next => {
            tries.agent += 1;
            Next::HandOver {
                to: tries.agent,
                why: err,
            }
        }
        CallError::RateLimited { .. } if has_next => {
            tries.agent += 1;
            Next::HandOver {
                to: tries.agent,
                why: err,
            }
        }
        CallError::RateLimited {
            message,
            retry_after,
        } => {
            let wait = retry_after.unwrap_or_else(|| {
                tries.rate_backoffs = tries.rate_backoffs.saturating_add(1);
                backoff_delay(policy.backoff, tries.rate_backoffs)
            });
            tries.waited = tries.waited.saturating_add(wait);
            if tries.waited > policy.rate_limit_wait {
                return Next::GiveUp(CallError::RateLimited {
                    message: format!(
                        "{message}; gave up after waiting {}s in all",
                        tries.waited.as_secs()
                    ),
                    retry_after,
                });
            }
            Next::WaitRateLimit {
                wait,
                why: CallError::RateLimited {
                    message,
                    retry_after,
                },
            }
        }
        CallError::Transient {
            message,
            retry_after,
        } => {
            tries.transient += 1;
            if tries.transient > policy.transient_retries {
                return Next::GiveUp(CallError::Transient {
                    message: format!("{message} (after {} retries)", policy.transient_retries),
                    retry_after,
                });
            }
            let wait =
                retry_after.unwrap_or_else(|| backoff_delay(policy.backoff, tries.transient));
            Next::Retry {
                wait,
                why: CallError::Transient {
                    message,
                    retry_after,
                },
                n: tries.transient,
                of: policy.transient_retries,
            }
        }
        other => Next::GiveUp(other),
    }
}

/// Calls `attempt(agent)` until it succeeds or the policy gives up, sleeping the waits it
/// decides on; `tell` hears every decision before it is carried out. Returns the result and
/// the agent of the chain that gave it.
pub(super) async fn call<T, F, Fut>(
    policy: &Policy,
    mut attempt: F,
    mut tell: impl FnMut(usize, &Next),
) -> (Result<T, CallError>, usize)
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<T, CallError>>,
{
    let mut tries = Tries::default();
    loop {
        let agent = tries.agent;
        let err = match attempt(agent).await {
            Ok(v) => return (Ok(v), agent),
            Err(e) => e,
        };
        let next = decide(policy, &mut tries, err);
        tell(agent, &next);
        match next {
            Next::HandOver { .. } => {}
            Next::Retry { wait, .. } | Next::WaitRateLimit { wait, .. } => {
                tokio::time::sleep(wait).await;
            }
            Next::GiveUp(e) => return (Err(e), agent),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    fn policy(chain: usize) -> Policy {
        Policy {
            backoff: Duration::from_secs(2),
            transient_retries: 3,
            rate_limit_wait: Duration::from_secs(60),
            chain,
        }
    }

    fn transient(after: Option<u64>) -> CallError {
        CallError::Transient {
            message: "500".into(),
            retry_after: after.map(Duration::from_secs),
        }
    }

    fn limited(after: Option<u64>) -> CallError {
        CallError::RateLimited {
            message: "429".into(),
            retry_after: after.map(Duration::from_secs),
        }
    }

    /// Runs `call` over scripted results on a paused clock: the virtual time it took, the
    /// result, and the agents called in order.
    async fn drive(
        policy: &Policy,
        script: Vec<Result<&'static str, CallError>>,
    ) -> (Duration, Result<&'static str, CallError>, Vec<usize>) {
        let script = RefCell::new(script.into_iter());
        let called = RefCell::new(Vec::new());
        let start = tokio::time::Instant::now();
        let (r, _) = call(
            policy,
            |agent| {
                called.borrow_mut().push(agent);
                let next = script.borrow_mut().next().unwrap_or(Ok("ok"));
                async move { next }
            },
            |_, _| {},
        )
        .await;
        (start.elapsed(), r, called.into_inner())
    }

    #[tokio::test(start_paused = true)]
    async fn transient_failures_back_off_exponentially_then_give_up() {
        let p = policy(1);
        let (took, r, called) = drive(
            &p,
            vec![Err(transient(None)), Err(transient(None)), Ok("done")],
        )
        .await;
        assert_eq!(r.ok(), Some("done"));
        assert_eq!(took, Duration::from_secs(2 + 4));
        assert_eq!(called, vec![0, 0, 0]);
        let (took, r, _) = drive(
            &p,
            vec![
                Err(transient(None)),
                Err(transient(None)),
                Err(transient(None)),
                Err(transient(None)),
            ],
        )
        .await;
        assert_eq!(
            took,
            Duration::from_secs(2 + 4 + 8),
            "three retries, then no wait"
        );
        let msg = r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("after 3 retries"), "{msg}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_after_is_honoured_over_the_backoff() {
        let (took, r, _) = drive(&policy(1), vec![Err(transient(Some(30))), Ok("x")]).await;
        assert_eq!(r.ok(), Some("x"));
        assert_eq!(took, Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limits_wait_without_using_retries_until_the_total_wait_is_spent() {
        let p = policy(1);
        // Five rate limits without a hint: 2 + 4 + 8 + 16 = 30s, then the next one (32s)
        // would make 62s, over the 60s allowed.
        let script = (0..6).map(|_| Err(limited(None))).collect();
        let (took, r, called) = drive(&p, script).await;
        assert_eq!(took, Duration::from_secs(30));
        assert_eq!(called.len(), 5);
        let msg = r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("gave up after waiting 62s"), "{msg}");
        // Rate limits do not count against the transient retries.
        let script = vec![
            Err(limited(Some(1))),
            Err(transient(None)),
            Err(limited(Some(1))),
            Err(transient(None)),
            Err(transient(None)),
            Ok("ok"),
        ];
        let (took, r, _) = drive(&p, script).await;
        assert_eq!(r.ok(), Some("ok"));
        assert_eq!(took, Duration::from_secs(1 + 2 + 1 + 4 + 8));
    }

    #[tokio::test(start_paused = true)]
    async fn a_fallback_takes_over_at_once_from_a_missing_or_rate_limited_agent() {
        let p = policy(3);
        let (took, r, called) = drive(
            &p,
            vec![
                Err(CallError::Missing {
                    message: "no key".into(),
                }),
                Err(limited(Some(600))),
                Ok("third"),
            ],
        )
        .await;
        assert_eq!(r.ok(), Some("third"));
        assert_eq!(called, vec![0, 1, 2]);
        assert_eq!(took, Duration::ZERO, "handing over waits for nothing");
        // The last agent of the chain waits out its rate limit.
        let (took, _, called) =
            drive(&policy(2), vec![Err(limited(None)), Err(limited(Some(7)))]).await;
        assert_eq!(called, vec![0, 1, 1]);
        assert_eq!(took, Duration::from_secs(7));
    }

    #[test]
    fn backoff_delays_double_from_the_first_up_to_the_cap() {
        let s = Duration::from_secs;
        let waits: Vec<Duration> = (1..=11).map(|n| backoff_delay(s(2), n)).collect();
        assert_eq!(
            waits,
            [2, 4, 8, 16, 32, 64, 128, 256, 512, 900, 900]
                .map(s)
                .to_vec()
        );
        assert_eq!(backoff_delay(Duration::ZERO, 7), Duration::ZERO);
        assert_eq!(backoff_delay(s(2), u32::MAX), MAX_BACKOFF);
        assert_eq!(backoff_delay(s(86_400), 1), MAX_BACKOFF);
    }

    #[test]
    fn the_backoff_is_capped_however_many_retries() {
        let p = Policy {
            transient_retries: 100,
            ..policy(1)
        };
        let mut t = Tries::default();
        let mut longest = Duration::ZERO;
        for _ in 0..100 {
            if let Next::Retry { wait, .. } = decide(&p, &mut t, transient(None)) {
                longest = longest.max(wait);
            }
        }
        assert_eq!(longest, MAX_BACKOFF);
    }

    #[test]
    fn permanent_failures_and_timeouts_give_up_at_once() {
        let mut t = Tries::default();
        let next = decide(
            &policy(2),
            &mut t,
            CallError::Failed {
                message: "bad request".into(),
            },
        );
        assert!(matches!(next, Next::GiveUp(CallError::Failed { .. })));
        let next = decide(
            &policy(2),
            &mut t,
            CallError::Timeout {
                after: Duration::from_secs(1),
                idle: false,
                tail: String::new(),
            },
        );
        assert!(matches!(next, Next::GiveUp(CallError::Timeout { .. })));
        assert_eq!(t, Tries::default(), "nothing counted");
    }

    #[test]
    fn a_refused_configuration_hands_over_or_gives_up_never_retries() {
        let refused = || CallError::Refused {
            message: "--json-schema is not a valid JSON Schema".into(),
        };
        let mut t = Tries::default();
        let next = decide(&policy(2), &mut t, refused());
        assert!(matches!(next, Next::HandOver { to: 1, .. }), "{next:?}");
        let next = decide(&policy(2), &mut t, refused());
        assert!(
            matches!(next, Next::GiveUp(CallError::Refused { .. })),
            "{next:?}"
        );
        assert_eq!(t.transient, 0, "never a retry");
    }
}
