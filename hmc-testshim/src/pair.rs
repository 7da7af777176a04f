//! The setup most two-sided transport tests open with, for any `Communicator`: a buffer
//! registered at each of two communicators, and the initiator's endpoint with the
//! target's buffer imported on it.
//!
//! Test-only: every step panics on an error, as the tests' own setup did.

use std::sync::Arc;

use hmc_core::{Access, Communicator, Deadline, Memory, RegisteredBuffer};

/// A `len`-byte buffer of `memory` registered read-write at `comm`.
pub fn registered<M: Memory, C: Communicator>(
    memory: &Arc<M>,
    comm: &Arc<C>,
    len: usize,
) -> RegisteredBuffer<M, C> {
    RegisteredBuffer::new(memory.clone(), comm.clone(), len, Access::READ_WRITE)
        .expect("register a read-write buffer")
}

/// A `len`-byte read-write buffer of `memory` registered at `b` (the target), then one at
/// `a` (the initiator's local side): `(target, local)`.
pub fn buffers<M: Memory, C: Communicator>(
    memory: &Arc<M>,
    a: &Arc<C>,
    b: &Arc<C>,
    len: usize,
) -> (RegisteredBuffer<M, C>, RegisteredBuffer<M, C>) {
    (registered(memory, b, len), registered(memory, a, len))
}

/// `a`'s endpoint to `b`, and `target` (a buffer registered at `b`) imported on it.
pub async fn reach<M: Memory, C: Communicator>(
    a: &Arc<C>,
    b: &Arc<C>,
    target: &RegisteredBuffer<M, C>,
) -> (C::Endpoint, C::RemoteKey) {
    let ep = a
        .connect(&b.address(), Deadline::default())
        .await
        .expect("connect to the target");
    let key = a
        .import(&ep, &target.export().expect("export the target's buffer"))
        .expect("import the target's buffer");
    (ep, key)
}
