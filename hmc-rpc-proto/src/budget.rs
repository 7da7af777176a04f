//! One accounting of the bytes peers make a server hold, and the server's counters.
//!
//! Every byte a client can make the server keep is charged to its connection and, through
//! a shared [`HeldBudget`], to the process: request payloads of admitted calls (from the
//! header until the call is answered, whether the body is still arriving, reassembled or
//! in a handler's hands), responses queued or still streaming out (the whole announced
//! body of a streamed or fed response), and a fixed cost for the bookkeeping of each
//! refused stream whose body is still being skipped. Two rules follow (normative text in
//! `docs/protocol.md`, "Limits"):
//!
//! - a call whose request would take its connection past `max_conn_held_bytes`, or the
//!   process past `max_held_bytes`, is answered OVERLOADED before any of its body is kept;
//! - a connection whose queued responses reach `max_tx_backlog` is not read until its peer
//!   reads them (backpressure), and one whose peer reads nothing for `write_stall_timeout`
//!   is closed.
//!
//! The sans-IO core ([`crate::proto::ServerConn`]) keeps its connection's exact figure and
//! settles it with the process total in steps of at least [`SETTLE_SLACK`] bytes (and
//! whenever it drops to zero), so that small calls touch no shared cache line: the process
//! total may lag each connection by less than that.

use std::sync::atomic::{AtomicU64, Ordering};

/// A connection settles its held bytes with the process total once they moved by this
/// much since it last did (or fell to zero).
pub const SETTLE_SLACK: u64 = 64 << 10;

/// Bytes charged for the bookkeeping of one refused or abandoned stream whose remaining
/// DATA frames are read and dropped (its table entry and header).
pub const SKIPPED_STREAM_COST: u64 = 256;

/// The process-wide budget of held bytes and the server's counters, shared by every
/// connection of one server.
#[derive(Debug)]
pub struct HeldBudget {
    limit: u64,
    held: AtomicU64,
    peak: AtomicU64,
    counters: Counters,
    observer: Option<SettleObserver>,
}

/// Told each time a connection settles, with the bytes it moved the total from and to
/// (a runtime exports them as a gauge; this crate records no metrics itself).
pub type SettleObserver = fn(from: u64, to: u64);

/// Event counters a [`HeldBudget`] collects for [`ServerStats`].
#[derive(Debug, Default)]
struct Counters {
    refused_conn_budget: AtomicU64,
    refused_process_budget: AtomicU64,
    closed_write_stall: AtomicU64,
    closed_idle: AtomicU64,
    closed_skipped_streams: AtomicU64,
    streams_stalled: AtomicU64,
    half_closed: AtomicU64,
}

/// Counters a server exposes (`hmc_rpc::RunningServer::stats`), so that tests and operators
/// can see the limits at work without reading RSS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerStats {
    /// Open connections.
    pub connections: usize,
    /// Bytes held for peers now, across connections (settled in steps, see
    /// [`SETTLE_SLACK`]).
    pub held_bytes: u64,
    /// The most `held_bytes` has been.
    pub held_bytes_peak: u64,
    /// Calls answered OVERLOADED by `max_conn_held_bytes`.
    pub refused_conn_budget: u64,
    /// Calls answered OVERLOADED by `max_held_bytes`.
    pub refused_process_budget: u64,
    /// Connections closed because their peer read nothing for `write_stall_timeout`.
    pub closed_write_stall: u64,
    /// Connections closed by `idle_timeout`.
    pub closed_idle: u64,
    /// Connections closed for leaving more than `max_inflight_per_conn` refused streams
    /// unfinished.
    pub closed_skipped_streams: u64,
    /// Request streams failed by `stream_idle_timeout` (no DATA for that long).
    pub streams_stalled: u64,
    /// Connections whose peer closed its sending side first (answers were still sent).
    pub half_closed: u64,
    /// Connections refused before their first frame: a failed or missing authentication
    /// (`auth_secret`), or a local peer of another user (`same_user_only`).
    pub refused_peers: u64,
}

/// Which counter an event bumps.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Event {
    RefusedConnBudget,
    RefusedProcessBudget,
    ClosedWriteStall,
    ClosedIdle,
    ClosedSkippedStreams,
    StreamStalled,
    HalfClosed,
}

impl HeldBudget {
    /// A budget of `limit` bytes (`max_held_bytes`).
    pub fn new(limit: u64) -> Self {
        HeldBudget {
            limit,
            held: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            counters: Counters::default(),
            observer: None,
        }
    }

    /// Calls `observer` whenever a connection settles (in steps of [`SETTLE_SLACK`], so
    /// not for every small call).
    pub fn with_observer(mut self, observer: SettleObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The limit (`max_held_bytes`).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes held now, as settled so far.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Moves the total from `from` to `to` bytes for one connection.
    pub(crate) fn settle(&self, from: u64, to: u64) {
        if let Some(observe) = self.observer {
            observe(from, to);
        }
        if to >= from {
            let now = self.held.fetch_add(to - from, Ordering::Relaxed) + (to - from);
            self.peak.fetch_max(now, Ordering::Relaxed);
        } else {
            self.held.fetch_sub(from - to, Ordering::Relaxed);
        }
    }

    pub(crate) fn bump(&self, e: Event) {
        let c = &self.counters;
        let counter = match e {
            Event::RefusedConnBudget => &c.refused_conn_budget,
            Event::RefusedProcessBudget => &c.refused_process_budget,
            Event::ClosedWriteStall => &c.closed_write_stall,
            Event::ClosedIdle => &c.closed_idle,
            Event::ClosedSkippedStreams => &c.closed_skipped_streams,
            Event::StreamStalled => &c.streams_stalled,
            Event::HalfClosed => &c.half_closed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters now (`connections` is left 0 for the runtime to fill in).
    pub fn stats(&self) -> ServerStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ServerStats {
            connections: 0,
            held_bytes: self.held(),
            held_bytes_peak: get(&self.peak),
            refused_conn_budget: get(&c.refused_conn_budget),
            refused_process_budget: get(&c.refused_process_budget),
            closed_write_stall: get(&c.closed_write_stall),
            closed_idle: get(&c.closed_idle),
            closed_skipped_streams: get(&c.closed_skipped_streams),
            streams_stalled: get(&c.streams_stalled),
            half_closed: get(&c.half_closed),
            refused_peers: 0,
        }
    }
}

impl Default for HeldBudget {
    /// Without a limit (a connection core used on its own, in tests).
    fn default() -> Self {
        HeldBudget::new(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settling_moves_the_total_and_keeps_the_peak() {
        let b = HeldBudget::new(1000);
        b.settle(0, 300);
        b.settle(0, 500);
        assert_eq!(b.held(), 800);
        b.settle(500, 100);
        assert_eq!(b.held(), 400);
        assert_eq!(b.stats().held_bytes_peak, 800);
        b.bump(Event::ClosedIdle);
        b.bump(Event::ClosedIdle);
        assert_eq!(b.stats().closed_idle, 2);
        assert_eq!(b.stats().refused_conn_budget, 0);
    }

    #[test]
    fn the_observer_sees_every_settlement() {
        use std::sync::atomic::AtomicI64;
        static SEEN: AtomicI64 = AtomicI64::new(0);
        fn observe(from: u64, to: u64) {
            SEEN.fetch_add(to as i64 - from as i64, Ordering::Relaxed);
        }
        let b = HeldBudget::new(1000).with_observer(observe);
        b.settle(0, 300);
        b.settle(300, 100);
        assert_eq!(SEEN.load(Ordering::Relaxed), 100);
        b.settle(100, 0);
        assert_eq!(SEEN.load(Ordering::Relaxed), 0);
    }
}
