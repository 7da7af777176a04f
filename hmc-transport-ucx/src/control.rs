//! The control connection beside every UCX endpoint: a small TCP protocol that bootstraps the endpoint (worker-address exchange), confirms keys at import, revokes keys at deregistration, and reports the peer's death by EOF.
//!
//! Frames are `kind u8, length u32 (big-endian), payload`:
//!
//! | kind | direction | payload |
//! | --- | --- | --- |
//! | 1 HELLO | initiator → target | version `u8` (2; a target accepts 1 too) |
//! | 2 HELLO_ACK | target → initiator | the target's UCX worker address |
//! | 3 VALIDATE | initiator → target | request id `u64`, region id `u64`, the descriptor as exported |
//! | 4 VALID | target → initiator | request id `u64`, verdict `u8` (0 live, 1 unknown or deregistered, 2 differs from the export) |
//! | 5 REVOKE | target → initiator | region id `u64` |
//! | 6 REVOKED | initiator → target | region id `u64` |
//! | 7 STAGED_READ | initiator → target | request id, region id, offset, length (`u64` each) |
//! | 8 STAGED_DATA | target → initiator | request id `u64`, bytes |
//! | 9 STAGED_DONE | target → initiator | request id `u64`, status `u8`, detail |
//! | 10 STAGED_WRITE | initiator → target | request id, region id, offset (`u64` each), last `u8`, bytes |
//! | 11 ABANDON | initiator → target | endpoint generation token `u64` |
//! | 12 ABANDONED | target → initiator | token `u64`, verdict `u8` (0 dropped, 1 unknown generation) |
//!
//! Frames 7-10 move device regions the loaded UCX cannot register (see `staged.rs`).
//! Frames 11-12 end a UCX endpoint generation whose bytes the target must drop (see the
//! engine's `generations` module): the target settles these connections (every frame
//! received handled, `TargetState`'s `wait_idle`) before it progresses again after a stall.
//!
//! Why: UCX neither checks a registration's access rights for TCP or shared memory nor
//! invalidates an rkey when its memory is unmapped (a CMA put with a stale key writes into
//! whatever now lives at that address). So the target stays the authority: an import is
//! accepted only when the target confirms the descriptor byte for byte (a forged key never
//! reaches `ucp_ep_rkey_unpack`, and the rights and bounds the initiator enforces are the
//! target's), and a deregistration first revokes the key at every peer that imported it and
//! waits until their in-flight operations on it have drained.

use std::io::Read;

mod initiator;
mod target;

pub(crate) use initiator::Link;
pub(crate) use target::TargetState;

pub(crate) const HELLO: u8 = 1;
pub(crate) const HELLO_ACK: u8 = 2;
pub(crate) const VALIDATE: u8 = 3;
pub(crate) const VALID: u8 = 4;
pub(crate) const REVOKE: u8 = 5;
pub(crate) const REVOKED: u8 = 6;
pub(crate) const ABANDON: u8 = 11;
pub(crate) const ABANDONED: u8 = 12;
pub(crate) use crate::staged::{STAGED_DATA, STAGED_DONE, STAGED_READ, STAGED_WRITE};
/// The control protocol version an initiator sends: 2 binds every UCX endpoint's
/// generation (the engine's `generations`), whose BOUND answer a version-1 target never
/// sends; such a target refuses the HELLO, so the mismatch is a failed connect rather than
/// transfers that wait for a BOUND until their deadline.
pub(crate) const VERSION: u8 = 2;
/// The versions a target accepts: a version-1 initiator never binds, which costs the
/// target nothing (its transfers are just not protected against this target stopping).
const ACCEPTED_VERSIONS: [u8; 2] = [1, VERSION];
/// Largest control frame accepted (worker addresses and descriptors are far smaller).
pub(crate) const MAX_FRAME: usize = 1 << 20;

pub(crate) use hmc_transport_kit::control_frame::write_frame;
pub(crate) use hmc_transport_kit::control_frame::write_frame_parts;

/// Reads one control frame, refusing one over [`MAX_FRAME`] from its header.
pub(crate) fn read_frame(r: &mut impl Read) -> std::io::Result<(u8, Vec<u8>)> {
    hmc_transport_kit::control_frame::read_frame(r, MAX_FRAME)
}

/// The big-endian `u64` at `at` in `b`, if `b` holds one there.
fn be_u64(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 8)
        .map(|s| u64::from_be_bytes(s.try_into().expect("8 bytes")))
}

/// A refused frame, as the error that ends its connection.
fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}
