//! The engine's error type: every failure names what to do about it.

use std::time::Duration;

/// Which side of a transfer descriptor an address belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// This engine's memory.
    Local,
    /// The peer engine's memory.
    Remote,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Local => "local",
            Side::Remote => "remote",
        })
    }
}

/// Why an engine call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// No connection to that engine.
    #[error("not connected to `{0}`; call connect first")]
    NotConnected(String),
    /// `connect` was called twice for one engine.
    #[error("already connected to `{0}`; disconnect first to reconnect")]
    AlreadyConnected(String),
    /// An address range lies in no registered region; nothing was moved.
    #[error(
        "{side} range {addr:#x}+{len} is in no region registered at {owner}; register that memory (register_mem) or fix the address"
    )]
    NotRegistered {
        /// Whose memory.
        side: Side,
        /// The engine that owns it.
        owner: String,
        /// Start of the range.
        addr: u64,
        /// Length of the range.
        len: u64,
    },
    /// An address range starts in a registered region and runs past its end; nothing
    /// was moved.
    #[error(
        "{side} range {addr:#x}+{len} runs past the end of the region {start:#x}+{region_len} registered at {owner}; split the descriptor at {end:#x}",
        end = start + region_len
    )]
    Straddles {
        /// Whose memory.
        side: Side,
        /// The engine that owns it.
        owner: String,
        /// Start of the range.
        addr: u64,
        /// Length of the range.
        len: u64,
        /// The region the range starts in.
        start: u64,
        /// That region's length.
        region_len: u64,
    },
    /// Memory passed to `register_mem` overlaps a region already registered.
    #[error(
        "{addr:#x}+{len} overlaps the registered region {start:#x}+{region_len}; deregister it first or register disjoint memory"
    )]
    Overlaps {
        /// Start of the new range.
        addr: u64,
        /// Its length.
        len: u64,
        /// The region in the way.
        start: u64,
        /// Its length.
        region_len: u64,
    },
    /// An operation did not finish in time; for a transfer, the transport no longer
    /// touches its memory once this is reported.
    #[error("{what} timed out after {after:?}; pass a longer timeout")]
    Timeout {
        /// What timed out.
        what: String,
        /// The timeout.
        after: Duration,
    },
    /// A configured limit was reached.
    #[error("limit `{limit}` reached ({value} > {max}); {hint}")]
    Limit {
        /// The limit's name (an `EngineConfig` field and option key).
        limit: &'static str,
        /// What was asked for.
        value: u64,
        /// The limit.
        max: u64,
        /// How to proceed.
        hint: &'static str,
    },
    /// The peer engine's metadata service failed or sent something unusable.
    #[error("metadata exchange with `{peer}` failed: {why}")]
    Metadata {
        /// The peer.
        peer: String,
        /// What went wrong.
        why: String,
    },
    /// Bytes given as a peer's metadata blob are not one this engine can use (truncated,
    /// another engine's kind or version, signed with another secret); nothing was added.
    #[error(
        "not a usable metadata blob: {0}; pass the bytes of the peer's local_metadata() unchanged"
    )]
    BadMetadata(String),
    /// Two KV caches (or block lists) do not fit each other; nothing was moved.
    #[error("KV layout mismatch: {0}")]
    Layout(String),
    /// Nothing is published under that key at the peer.
    #[error("`{key}` is not published at {peer}; allocate or register the cache there first")]
    UnknownKey {
        /// The key.
        key: String,
        /// The engine asked.
        peer: String,
    },
    /// A bad argument (address, option, descriptor).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The transport failed (connect, register, transfer).
    #[error("transport: {0}")]
    Transport(#[from] hmc_core::Error),
    /// The peer left the metadata namespace (its lease lapsed: dead, hung or cut off, or
    /// it restarted under the same name): transfers in flight with it fail with this, and
    /// it is disconnected.
    #[error("peer `{peer}` is gone: {why}; connect again once it is back")]
    PeerGone {
        /// The peer's name.
        peer: String,
        /// How it was seen to go.
        why: String,
    },
    /// The metadata store (etcd) failed: unreachable within the timeout, or a limit.
    #[error("metadata store: {0}")]
    Store(#[from] hmc_meta::MetaError),
    /// The caller cancelled the operation ([`crate::TransferRequest::cancel`]); the
    /// transport no longer touches its memory.
    #[error("{0} was cancelled; start it again if it is still wanted")]
    Cancelled(String),
    /// A prepared list no longer matches the peer's memory (it deregistered a region under
    /// it): a transfer made of it cannot run.
    #[error("{0}; prepare the list again")]
    ListInvalid(String),
    /// `finalize` was called.
    #[error("the engine was finalized; initialize a new one")]
    Finalized,
}

impl EngineError {
    /// True when an operation ran out of time: [`EngineError::Timeout`], or a transport
    /// deadline.
    pub fn is_timeout(&self) -> bool {
        match self {
            EngineError::Timeout { .. } => true,
            EngineError::Transport(e) => e.is_deadline(),
            _ => false,
        }
    }

    /// True when nobody listens at the address connected to (the transport's
    /// `io::ErrorKind::ConnectionRefused`, kept as the source).
    pub fn is_connection_refused(&self) -> bool {
        matches!(self, EngineError::Transport(e) if e.is_connection_refused())
    }

    /// True when the same operation may succeed if tried again later, unchanged: a
    /// timeout, or a transport failure that [`hmc_core::Error::is_retryable`] calls so.
    pub fn is_retryable(&self) -> bool {
        match self {
            EngineError::Timeout { .. } => true,
            EngineError::Transport(e) => e.is_retryable(),
            _ => false,
        }
    }
}

/// The engine's result type.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
