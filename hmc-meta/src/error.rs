//! The crate's error type: every failure says what to do about it.

use std::time::Duration;

/// Why a metadata operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetaError {
    /// A metadata URL or member name that cannot be used.
    #[error("invalid metadata setting: {0}")]
    Invalid(String),
    /// The store could not be reached within the timeout (each attempt retried with
    /// backoff). Connections already made between engines are not affected.
    #[error(
        "metadata store {endpoints} unreachable after {after:?} ({attempts} attempt(s)): {why}; existing connections keep working, check that etcd runs there or pass a longer timeout"
    )]
    Unavailable {
        /// The endpoints tried.
        endpoints: String,
        /// How long it was tried.
        after: Duration,
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        why: String,
    },
    /// A configured limit was reached.
    #[error("limit `{limit}` reached ({value} > {max}); {hint}")]
    Limit {
        /// The limit's name (an `EtcdConfig` field and engine option key).
        limit: &'static str,
        /// What was asked for.
        value: u64,
        /// The limit.
        max: u64,
        /// How to proceed.
        hint: &'static str,
    },
    /// A record in the store that this crate did not write (or a newer format).
    #[error("record of `{name}` in the metadata store is unreadable: {why}")]
    BadRecord {
        /// The member.
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// The namespace holds more members than this process reads (`max_members`): at start
    /// (the engine cannot join), in a listing, or in the watched set.
    #[error(
        "limit `max_members` reached: {namespace} holds more than {max} members; use a namespace per job, or raise EtcdConfig::max_members (engine option max_members) on every member"
    )]
    NamespaceFull {
        /// The namespace (`etcd://…/ns`).
        namespace: String,
        /// The limit.
        max: u64,
    },
    /// Another live member holds the name (its key, under its own lease).
    #[error(
        "the name `{name}` is in use in {namespace} by a live member at {holder}; choose another name, or stop that member first (its key goes when its lease lapses)"
    )]
    NameInUse {
        /// The name asked for.
        name: String,
        /// The namespace (`etcd://…/ns`).
        namespace: String,
        /// The address the holder registered.
        holder: String,
    },
    /// The store was closed.
    #[error("the metadata store was closed")]
    Closed,
}

/// The crate's result type.
pub type Result<T, E = MetaError> = std::result::Result<T, E>;
