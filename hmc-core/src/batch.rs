//! One check of a transfer's descriptors before any byte moves, which every transport and
//! the plugin host call, so that a refused batch reads the same whichever moves it: the
//! remote key was imported on the endpoint the transfer uses, both ranges lie inside their
//! regions (without overflow), and the remote region's exported access allows the op.
//! Checks only a transport can make (whose memory a registration is, limits it declares,
//! device memory it cannot move) stay with it.

use crate::comm::{Access, Communicator, LocalRegistration, Op, TransferDesc};
use crate::error::{Error, Result, check_bounds};

/// What a transport knows of a descriptor's remote key, for [`check_desc`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteFacts {
    /// Length of the remote region the key covers.
    pub len: u64,
    /// The access the region was exported with.
    pub access: Access,
    /// Whether the key was imported on the endpoint this transfer uses.
    pub on_endpoint: bool,
}

/// Checks one descriptor of an `op` batch: the key's endpoint, the local range against the
/// registration, the remote range against `remote.len`, and `remote.access`.
#[inline]
pub fn check_desc<C: Communicator + ?Sized>(
    op: Op,
    d: &TransferDesc<'_, C>,
    remote: RemoteFacts,
) -> Result<()> {
    if !remote.on_endpoint {
        return Err(Error::InvalidArgument(
            "a remote key imported on another endpoint was used; import the region on the \
             endpoint you transfer on"
                .into(),
        ));
    }
    check_bounds(
        "local registration",
        d.local_offset as u64,
        d.len as u64,
        d.local.region().len as u64,
    )?;
    check_bounds("remote region", d.remote_offset, d.len as u64, remote.len)?;
    let need = Access::required_by(op);
    if !remote.access.allows(need) {
        return Err(Error::AccessDenied(format!(
            "the remote region allows {:?} but {op:?} needs {need:?}; export it with that access",
            remote.access
        )));
    }
    Ok(())
}
