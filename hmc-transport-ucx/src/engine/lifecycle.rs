//! The engine's closing rules as state of their own: whether the communicator was closed,
//! and the drain after `close()` that decides when the worker may still be progressed and
//! whether it may be destroyed. No UCX call is made here; the engine thread asks.
//!
//! Why the rules exist: UCX answers peers by itself (replies to their emulated GETs, PUT
//! acknowledgements). Queued behind a full peer queue, such a send stays in the worker, and
//! `ucp_worker_destroy` crashes UCX 1.13 purging it. So after `close()` the worker is
//! progressed until it settles, but only while every registration is still mapped: once
//! one is unmapped, peers' queued writes may target memory the application freed, so the
//! worker must never be progressed again.

use std::time::{Duration, Instant};

/// Longest `close()` (and tear-down, where that is safe) keeps progressing the worker so
/// that what UCX itself still sends to peers leaves it.
pub(super) const SETTLE_LIMIT: Duration = Duration::from_secs(1);

/// A worker whose progress reported nothing for this long after `close()` counts as
/// settled: no peer request is left for it to answer, nothing of its own is queued.
pub(super) const SETTLE_QUIET: Duration = Duration::from_millis(100);

/// Closed or not, and the settling drain after `close()`.
pub(super) struct Lifecycle {
    /// No new operation is taken (`close()` ran, or the last handle was dropped).
    pub closed: bool,
    /// `close()` ran (called, or from dropping the communicator): revocation no longer
    /// reaches peers.
    pub closed_by_user: bool,
    /// Until when `close()` keeps progressing the worker to settle it.
    pub close_drain: Option<Instant>,
    /// A registration was unmapped after `close()`: the worker must never be progressed
    /// again once our own endpoints are closed.
    pub unmapped_after_close: bool,
    /// Since `close()`, progress did work that may have queued sends to peers, and no
    /// quiet period ([`SETTLE_QUIET`]) has followed yet.
    pub unsettled: bool,
    /// A drain reached [`SETTLE_LIMIT`] without settling; no further drains start.
    pub drain_gave_up: bool,
    /// The worker did work after `unmapped_after_close` was set (closing our endpoints).
    pub progressed_after_unmap: bool,
    /// When `ucp_worker_progress` last reported work.
    pub last_activity: Instant,
}

impl Lifecycle {
    /// An open engine whose worker last did work at `now`.
    pub fn new(now: Instant) -> Self {
        Lifecycle {
            closed: false,
            closed_by_user: false,
            close_drain: None,
            unmapped_after_close: false,
            unsettled: false,
            drain_gave_up: false,
            progressed_after_unmap: false,
            last_activity: now,
        }
    }

    /// `ucp_worker_progress` reported work at `now`. After `close()`, that work may have
    /// queued sends to peers, so the worker is unsettled again; a drain starts anew unless
    /// one gave up or a registration was already unmapped.
    pub fn progressed(&mut self, now: Instant) {
        self.last_activity = now;
        self.progressed_after_unmap |= self.unmapped_after_close;
        if self.closed {
            self.unsettled = true;
            if self.close_drain.is_none()
                && self.closed_by_user
                && !self.unmapped_after_close
                && !self.drain_gave_up
            {
                self.close_drain = Some(now + SETTLE_LIMIT);
            }
        }
    }

    /// Ends the drain: settled once progress has been quiet for [`SETTLE_QUIET`]; given
    /// up at [`SETTLE_LIMIT`].
    pub fn check_settled(&mut self, now: Instant) {
        let Some(until) = self.close_drain else {
            return;
        };
        if self.quiet(now) {
            self.unsettled = false;
            self.close_drain = None;
        } else if now >= until {
            self.close_drain = None;
            self.drain_gave_up = true;
        }
    }

    /// Whether progress has reported nothing for [`SETTLE_QUIET`].
    pub fn quiet(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last_activity) >= SETTLE_QUIET
    }

    /// Whether the worker may be progressed. After `close()`, once our own endpoints are
    /// closed (`endpoints_left` false), never again: peers see the close as EOF on the
    /// control connection and force-close theirs. The exception is the bounded drain right
    /// after `close()` while every registration is still mapped; the first unmap ends it.
    pub fn progress_allowed(&self, endpoints_left: bool) -> bool {
        !self.closed || endpoints_left || (!self.unmapped_after_close && self.close_drain.is_some())
    }

    /// `close()` was called at `now`: the registrations are all still mapped, so the
    /// worker is progressed until it settles (a worker quiet for [`SETTLE_QUIET`] already
    /// is settled).
    pub fn close_by_user(&mut self, now: Instant) {
        self.closed = true;
        self.closed_by_user = true;
        self.unsettled = true;
        self.close_drain = Some(now + SETTLE_LIMIT);
        self.check_settled(now);
    }

    /// A registration is about to be unmapped at `now`: until when to progress the worker
    /// first, to settle it while the memory is still mapped (in the drain, or where
    /// progress is allowed anyway), or `None` for no settling. The drain, if any, ends.
    pub fn settle_before_unmap(&mut self, now: Instant, endpoints_left: bool) -> Option<Instant> {
        if !(self.closed_by_user && self.unsettled) {
            return None;
        }
        let drain = self.close_drain.take();
        drain.or_else(|| {
            self.progress_allowed(endpoints_left)
                .then(|| now + SETTLE_LIMIT)
        })
    }

    /// A registration was unmapped. After `close()` revocation cannot reach peers: from
    /// now on their queued writes may target memory the application frees.
    pub fn unmapped(&mut self) {
        if self.closed_by_user {
            self.unmapped_after_close = true;
            self.close_drain = None;
        }
    }

    /// Whether tear-down may try to settle the worker by progressing it: not when a
    /// registration was unmapped after `close()` and the worker was not progressed since.
    pub fn may_settle_at_teardown(&self) -> bool {
        !(self.closed_by_user && self.unmapped_after_close && !self.progressed_after_unmap)
    }

    /// The latest the engine thread may park without missing the drain's end.
    pub fn wake_by(&self) -> Option<Instant> {
        self.close_drain
            .map(|t| t.min(self.last_activity + SETTLE_QUIET))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn an_open_engine_always_progresses() {
        let t0 = Instant::now();
        let life = Lifecycle::new(t0);
        assert!(life.progress_allowed(false));
        assert!(life.progress_allowed(true));
        assert!(life.may_settle_at_teardown());
        assert_eq!(life.wake_by(), None);
    }

    #[test]
    fn a_quiet_worker_settles_at_close() {
        let t0 = Instant::now();
        let mut life = Lifecycle::new(t0);
        life.close_by_user(t0 + SETTLE_QUIET);
        assert!(!life.unsettled);
        assert_eq!(life.close_drain, None);
        // Closed, no endpoints left, no drain: never progressed again.
        assert!(!life.progress_allowed(false));
        assert!(life.progress_allowed(true));
    }

    #[test]
    fn a_busy_worker_drains_until_quiet() {
        let t0 = Instant::now();
        let mut life = Lifecycle::new(t0);
        life.close_by_user(t0);
        assert!(life.unsettled);
        assert!(
            life.progress_allowed(false),
            "the drain progresses the worker"
        );
        life.progressed(t0 + ms(50));
        life.check_settled(t0 + ms(100));
        assert!(life.close_drain.is_some(), "50 ms of quiet is not enough");
        assert_eq!(life.wake_by(), Some(t0 + ms(50) + SETTLE_QUIET));
        life.check_settled(t0 + ms(50) + SETTLE_QUIET);
        assert!(!life.unsettled);
        assert!(life.close_drain.is_none());
    }

    #[test]
    fn a_drain_that_never_settles_gives_up_once() {
        let t0 = Instant::now();
        let mut life = Lifecycle::new(t0);
        life.close_by_user(t0);
        let mut t = t0;
        while t < t0 + SETTLE_LIMIT {
            t += ms(10);
            life.progressed(t);
            life.check_settled(t);
        }
        assert!(life.drain_gave_up);
        assert!(life.unsettled);
        assert!(life.close_drain.is_none());
        life.progressed(t + ms(1));
        assert!(
            life.close_drain.is_none(),
            "no drain starts after one gave up"
        );
    }

    #[test]
    fn work_after_a_settled_drain_starts_another() {
        let t0 = Instant::now();
        let mut life = Lifecycle::new(t0);
        life.close_by_user(t0 + SETTLE_QUIET);
        assert!(!life.unsettled);
        let t1 = t0 + ms(500);
        life.progressed(t1);
        assert!(life.unsettled);
        assert_eq!(life.close_drain, Some(t1 + SETTLE_LIMIT));
    }

    #[test]
    fn the_first_unmap_after_close_ends_progress_for_good() {
        let t0 = Instant::now();
        let mut life = Lifecycle::new(t0);
        life.close_by_user(t0);
        let until = life.settle_before_unmap(t0 + ms(1), false);
        assert_eq!(until, Some(t0 + SETTLE_LIMIT), "the running drain's end");
        life.unmapped();
        assert!(life.unmapped_after_close);
        assert!(!life.progress_allowed(false));
        life.progressed(t0 + ms(2));
        assert!(life.close_drain.is_none(), "no drain after an unmap");
        assert!(life.progressed_after_unmap);
        assert!(life.may_settle_at_teardown());
    }

    #[test]
    fn teardown_does_not_progress_a_worker_left_alone_after_an_unmap() {
        let t0 = Instant::now();
        let mut life = Lifecycle::new(t0);
        life.close_by_user(t0);
        life.unmapped();
        assert!(!life.may_settle_at_teardown());
    }

    #[test]
    fn an_unmap_before_close_settles_nothing_and_is_forgotten() {
        let t0 = Instant::now();
        let mut life = Lifecycle::new(t0);
        assert_eq!(life.settle_before_unmap(t0, true), None);
        life.unmapped();
        assert!(!life.unmapped_after_close);
    }

    #[test]
    fn an_unmap_after_a_drain_gave_up_settles_first_while_endpoints_remain() {
        let t0 = Instant::now();
        let mut life = Lifecycle::new(t0);
        life.close_by_user(t0);
        let mut t = t0;
        while !life.drain_gave_up {
            t += ms(10);
            life.progressed(t);
            life.check_settled(t);
        }
        assert!(life.unsettled && life.close_drain.is_none());
        let now = t + ms(400);
        assert_eq!(
            life.settle_before_unmap(now, true),
            Some(now + SETTLE_LIMIT)
        );
        assert_eq!(life.settle_before_unmap(now, false), None);
    }
}
