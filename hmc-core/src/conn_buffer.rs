//! `ConnBuffer`: a stable, registered staging buffer, and `RegisteredBuffer`, its generic implementation over any `Memory` and `Communicator`.

use std::sync::Arc;

use crate::{
    Access, Communicator, DeviceBuffer, LocalRegistration, MemSpan, MemSpanMut, Memory, Region,
    RemoteRegion, Result, check_bounds,
};

/// A registered buffer that transports read and write, with bounds-checked local access.
///
/// Local reads and writes race with peers' one-sided transfers the way DMA does: bytes read
/// while a peer writes the same range are unspecified. Coordinate with `notify` or RPC.
pub trait ConnBuffer: Send + Sync {
    /// The allocator behind the buffer.
    type Memory: Memory;
    /// The transport the buffer is registered with.
    type Comm: Communicator;

    /// Where the buffer is.
    fn region(&self) -> Region;

    /// The transport registration, for [`crate::TransferDesc::local`].
    fn registration(&self) -> &<Self::Comm as Communicator>::Registration;

    /// Copies `src` into the buffer at `offset`.
    fn write_at(&self, offset: usize, src: &MemSpan<'_>) -> Result<()>;

    /// Copies the buffer's bytes at `offset` into `dst`.
    fn read_at(&self, offset: usize, dst: &mut MemSpanMut<'_>) -> Result<()>;
}

/// The generic [`ConnBuffer`]: owns an allocation from `M` and its registration with `C`.
///
/// The registration is dropped before the allocation, so no transport can reach freed
/// memory.
pub struct RegisteredBuffer<M: Memory, C: Communicator> {
    // Field order matters: drop deregisters first, then frees.
    registration: C::Registration,
    buffer: M::Buffer,
    memory: Arc<M>,
    comm: Arc<C>,
}

impl<M: Memory, C: Communicator> RegisteredBuffer<M, C> {
    /// Allocates `len` bytes from `memory` and registers them with `comm` for `access`.
    pub fn new(memory: Arc<M>, comm: Arc<C>, len: usize, access: Access) -> Result<Self> {
        let buffer = memory.alloc(len)?;
        // SAFETY: `buffer` is owned by the returned value and dropped after `registration`
        // (field order), so the region outlives the registration.
        let registration = unsafe { comm.register(buffer.region(), access)? };
        Ok(RegisteredBuffer {
            registration,
            buffer,
            memory,
            comm,
        })
    }

    /// The portable descriptor a peer imports to reach this buffer. Fails only where the
    /// transport's own `export` does (a closed communicator, for some transports).
    pub fn export(&self) -> Result<RemoteRegion> {
        self.comm.export(&self.registration)
    }

    /// What peers may do to the buffer.
    pub fn access(&self) -> Access {
        self.registration.access()
    }

    /// The allocator.
    pub fn memory(&self) -> &Arc<M> {
        &self.memory
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.buffer.len()
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }
}

impl<M: Memory, C: Communicator> ConnBuffer for RegisteredBuffer<M, C> {
    type Memory = M;
    type Comm = C;

    fn region(&self) -> Region {
        self.buffer.region()
    }

    fn registration(&self) -> &C::Registration {
        &self.registration
    }

    fn write_at(&self, offset: usize, src: &MemSpan<'_>) -> Result<()> {
        let target = self.region().slice(offset, src.len())?;
        // SAFETY: `target` lies within the owned allocation (checked by `slice`), which lives
        // as long as `self`; concurrent access follows the DMA rule documented on the trait.
        let mut dst = unsafe { MemSpanMut::from_region(target) };
        self.memory.copy(&mut dst, src)
    }

    fn read_at(&self, offset: usize, dst: &mut MemSpanMut<'_>) -> Result<()> {
        check_bounds(
            "conn buffer",
            offset as u64,
            dst.len() as u64,
            self.len() as u64,
        )?;
        let source = self.region().slice(offset, dst.len())?;
        // SAFETY: as in `write_at`; the span is only read.
        let src = unsafe { MemSpan::from_region(source) };
        self.memory.copy(dst, &src)
    }
}
