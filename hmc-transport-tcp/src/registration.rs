//! The keys of a transfer's two sides: [`TcpRegistration`], local memory registered with a
//! communicator (counted against `max_registered_bytes` while it lives), and
//! [`TcpRemoteKey`], a peer's region imported for one endpoint.

use std::sync::Arc;

use hmc_core::{Access, AnyMemory, Error, LocalRegistration, Region, Result};
use hmc_transport_kit::key_token::KeyToken;
use parking_lot::RwLock;

use crate::region::RegEntry;
use crate::state::Shared;
use crate::wire::TOKEN_LEN;

/// Local memory registered with a [`crate::TcpCommunicator`]; deregistered on drop.
pub struct TcpRegistration {
    pub(crate) entry: Arc<RegEntry>,
    pub(crate) shared: Arc<Shared>,
}

impl TcpRegistration {
    /// Registers `region` (with `memory` when it is device memory served through the
    /// staging pool), counted against `max_registered_bytes` until the registration drops.
    pub(crate) fn add(
        shared: &Arc<Shared>,
        region: Region,
        access: Access,
        memory: Option<AnyMemory>,
    ) -> Result<TcpRegistration> {
        {
            let mut used = shared.registered_bytes.lock();
            let max = shared.config.max_registered_bytes;
            let want = used.saturating_add(region.len as u64);
            if want > max {
                return Err(Error::LimitExceeded {
                    limit: "max_registered_bytes",
                    value: want,
                    max,
                    hint: "deregister buffers you no longer need, or raise \
                           TcpConfig::max_registered_bytes"
                        .into(),
                });
            }
            *used = want;
        }
        let made = shared.regions.insert(|id| {
            Ok(RegEntry {
                id,
                region,
                access,
                token: KeyToken::new()?,
                live: RwLock::new(true),
                memory,
            })
        });
        let entry = made.inspect_err(|_| {
            *shared.registered_bytes.lock() -= region.len as u64;
        })?;
        Ok(TcpRegistration {
            entry,
            shared: shared.clone(),
        })
    }
}

impl std::fmt::Debug for TcpRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpRegistration")
            .field("id", &self.entry.id)
            .field("region", &self.entry.region)
            .field("access", &self.entry.access)
            .finish_non_exhaustive()
    }
}

impl LocalRegistration for TcpRegistration {
    fn region(&self) -> Region {
        self.entry.region
    }
    fn access(&self) -> Access {
        self.entry.access
    }
}

impl Drop for TcpRegistration {
    fn drop(&mut self) {
        self.shared.regions.remove(self.entry.id);
        // Waits for a copy in progress (one system call at most), then no peer request can
        // touch the region again.
        *self.entry.live.write() = false;
        *self.shared.registered_bytes.lock() -= self.entry.region.len as u64;
    }
}

/// A peer's region imported for one endpoint.
#[derive(Clone)]
pub struct TcpRemoteKey {
    pub(crate) endpoint: u64,
    pub(crate) id: u64,
    pub(crate) token: [u8; TOKEN_LEN],
    pub(crate) len: u64,
    pub(crate) access: Access,
}

impl std::fmt::Debug for TcpRemoteKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a secret: never logged.
        f.debug_struct("TcpRemoteKey")
            .field("id", &self.id)
            .field("len", &self.len)
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}
