//! Waiting on shared state: a `Notify` paired with a mutex, bounded by a `Deadline`.

use std::time::{Duration, Instant};

use hmc_core::{Deadline, Error, Result};
use parking_lot::Mutex;
use tokio::sync::Notify;

/// How long before an operation's deadline [`sleep_until_precise`] stops trusting the
/// timer and yields to the runtime instead.
const PRECISE_TAIL: Duration = Duration::from_millis(2);

/// Completes once `until` has passed, within microseconds of it on an idle runtime.
///
/// Tokio's timer rounds a deadline up to its next millisecond tick, and a parked worker
/// wakes some time after that, so on the timer alone a deadline a millisecond away ends
/// an operation late by more than the deadline itself. This sleeps on the timer until [`PRECISE_TAIL`] before `until`, then yields to the
/// runtime until the instant passes: CPU is spent only in an operation's last
/// [`PRECISE_TAIL`], and only while it is still running then.
pub(crate) async fn sleep_until_precise(until: Instant) {
    if let Some(coarse) = until.checked_sub(PRECISE_TAIL) {
        tokio::time::sleep_until(coarse.into()).await;
    }
    while Instant::now() < until {
        tokio::task::yield_now().await;
    }
}

/// State guarded by a mutex, with a `Notify` that is fired after every change.
#[derive(Debug, Default)]
pub(crate) struct Watched<S> {
    state: Mutex<S>,
    changed: Notify,
}

impl<S> Watched<S> {
    pub(crate) fn new(state: S) -> Self {
        Watched {
            state: Mutex::new(state),
            changed: Notify::new(),
        }
    }

    /// Runs `f` on the state, then wakes every waiter so each re-checks its condition.
    pub(crate) fn update<T>(&self, f: impl FnOnce(&mut S) -> T) -> T {
        let out = f(&mut self.state.lock());
        self.changed.notify_waiters();
        out
    }

    /// Runs `f` on the state without waking anyone.
    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut S) -> T) -> T {
        f(&mut self.state.lock())
    }

    /// Calls `poll` on the state after every change until it returns `Some`, or fails with
    /// `DeadlineExceeded` (naming `during`) once `deadline` passes. `poll` runs under the
    /// lock; when it returns `Some` the waiters are woken, since it may have changed state.
    pub(crate) async fn wait<T>(
        &self,
        deadline: Deadline,
        during: &'static str,
        mut poll: impl FnMut(&mut S) -> Option<Result<T>>,
    ) -> Result<T> {
        let start = Instant::now();
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            // Registered before the check, so a change between check and await still wakes us.
            notified.as_mut().enable();
            if let Some(out) = poll(&mut self.state.lock()) {
                self.changed.notify_waiters();
                return out;
            }
            if tokio::time::timeout_at(deadline.instant().into(), notified)
                .await
                .is_err()
            {
                return Err(Error::DeadlineExceeded {
                    during,
                    elapsed: start.elapsed(),
                });
            }
        }
    }
}
