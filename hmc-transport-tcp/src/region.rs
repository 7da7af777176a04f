//! [`RegEntry`]: one registered region as the responder and the staging code see it, its
//! key's random half and its liveness lock.

use hmc_core::{Access, AnyMemory, Region};
use hmc_transport_kit::key_token::KeyToken;
use parking_lot::RwLock;

use crate::wire::TOKEN_LEN;

/// One registered region as the responder sees it.
pub(crate) struct RegEntry {
    pub(crate) id: u64,
    pub(crate) region: Region,
    pub(crate) access: Access,
    /// The random half of the key; replaced by `Communicator::rekey`, which revokes every
    /// key exported before.
    pub(crate) token: KeyToken,
    /// False once deregistered. Readers hold the read lock across each synchronous copy
    /// into or out of the region, never across an `.await`, so deregistration waits for
    /// at most one system call.
    pub(crate) live: RwLock<bool>,
    /// The backend of device memory registered by `register_memory`, whose bytes are
    /// served through the staging pool ([`crate::staged`]); `None` for host memory.
    pub(crate) memory: Option<AnyMemory>,
}

impl RegEntry {
    /// Compares tokens in time independent of where they differ.
    pub(crate) fn token_matches(&self, token: &[u8; TOKEN_LEN]) -> bool {
        self.token.matches(token)
    }
}
