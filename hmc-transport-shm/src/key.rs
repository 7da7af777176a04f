//! `ShmRemoteKey`, a peer's region imported for one endpoint, and views of a peer's shared
//! memory through it ([`Communicator::view`](hmc_core::Communicator::view)): the mapped
//! bytes, used in place under a key checked and announced on the region's control page.

use std::collections::HashMap;
use std::sync::Arc;

use hmc_core::{Access, Error, Op, RemoteView, Result, TransferDesc, check_bounds};

use crate::control::{CONTROL_LEN, token_words};
use crate::mapped::Mapping;
use crate::page_copy::Held;
use crate::wire::TOKEN_LEN;
use hmc_core::RemoteFacts;

/// A peer's region imported for one endpoint.
pub struct ShmRemoteKey {
    pub(crate) endpoint: u64,
    pub(crate) device: hmc_core::Device,
    /// Registration id and token.
    pub(crate) key: (u64, [u8; TOKEN_LEN]),
    pub(crate) len: u64,
    pub(crate) access: Access,
}

impl std::fmt::Debug for ShmRemoteKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a secret: never logged.
        f.debug_struct("ShmRemoteKey")
            .field("id", &self.key.0)
            .field("len", &self.len)
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

/// Checks one descriptor of a batch on endpoint `endpoint` before any byte moves: the key
/// was imported there, both ranges lie inside their regions, and the region's exported
/// access allows `op`.
pub(crate) fn check_desc(
    endpoint: u64,
    op: Op,
    d: &TransferDesc<'_, crate::ShmCommunicator>,
) -> Result<()> {
    let remote = RemoteFacts {
        len: d.remote.len,
        access: d.remote.access,
        on_endpoint: d.remote.endpoint == endpoint,
    };
    hmc_core::check_desc(op, d, remote)
}

/// `len` bytes at `offset` of the region `k` names, from the peer's shared memory mapped
/// on the endpoint `endpoint` (`maps`, by registration id), with the key announced on its
/// control page until the view drops. `Ok(None)`: not mapped here with a control page
/// that covers the range and the access (user memory, a region no transfer mapped yet);
/// a transfer takes the lease path and gives the precise error, if any.
pub(crate) fn view(
    endpoint: u64,
    maps: &HashMap<u64, Arc<Mapping>>,
    k: &ShmRemoteKey,
    offset: u64,
    len: usize,
    access: Access,
) -> Result<Option<RemoteView>> {
    if k.endpoint != endpoint {
        return Err(Error::InvalidArgument(
            "a remote key was imported for another endpoint; import the region on this endpoint"
                .into(),
        ));
    }
    check_bounds("remote region", offset, len as u64, k.len)?;
    if !k.access.allows(access) {
        return Err(Error::AccessDenied(format!(
            "the remote region allows {:?} but the view needs {access:?}; export it with that \
             access",
            k.access
        )));
    }
    let Some(map) = maps.get(&k.key.0).cloned() else {
        return Ok(None);
    };
    let Some(page) = map.control() else {
        return Ok(None);
    };
    let (reg_len, reg_access) = page.describe();
    // The page is the peer's to write: bound by the mapping too (its data part).
    let data = (map.len() - CONTROL_LEN) as u64;
    let end = offset + len as u64;
    if !reg_access.is_some_and(|a| a.allows(access)) || end > reg_len.min(data) {
        return Ok(None);
    }
    let ptr = map.ptr();
    let Some(held) = Held::enter(map, token_words(&k.key.1)) else {
        return Err(Error::InvalidKey(
            "the region was deregistered or rekeyed: its key no longer works; ask its owner \
             for a new export"
                .into(),
        ));
    };
    // SAFETY: `offset..end` lies in the registration's data, before the control page, in a
    // mapping `held` keeps alive; the key is announced as in use until `held` drops, so the
    // owner's rekey or deregistration waits for it before reusing the memory.
    Ok(Some(unsafe {
        RemoteView::new(ptr.add(offset as usize), len, access, Box::new(held))
    }))
}
