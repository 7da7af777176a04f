//! What the engine needs of the control connections, named here as traits so that the
//! engine does not name the control module: that module drives the engine (it sends
//! [`Command`](super::Command)s and holds [`KeyShared`](super::KeyShared)s) and implements
//! these for its connection types.
//!
//! Both serve endpoint generations (`generations`): an initiator abandons a generation
//! over the control connection beside its endpoint, and a target ends the generations its
//! peers abandoned, settling its control connections first after a stall.

use std::time::Duration;

/// Answers a peer's ABANDON: whether the generation was known and ended.
pub(crate) type AbandonAck = Box<dyn FnOnce(bool) + Send>;

/// An initiator's control connection beside one of its endpoints.
pub(crate) trait InitiatorControl: Send + Sync {
    /// Tells the target to drop endpoint generation `token`; `true` once it answered that
    /// it did, `false` after `wait` without that answer (see `generations`).
    fn abandon(&self, token: u64, wait: Duration) -> bool;

    /// Whether the connection died (an abandon over it can reach no one).
    fn is_dead(&self) -> bool;
}

/// The target side of a communicator's control connections.
pub(crate) trait TargetControl: Send + Sync {
    /// The abandons peers queued since the last call, each with its answer to send.
    fn take_abandons(&self) -> Vec<(u64, AbandonAck)>;

    /// Waits, at most `limit`, until every frame the connections received was handled.
    fn wait_idle(&self, limit: Duration);
}
