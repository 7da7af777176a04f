//! Device staging: moving device memory one-sided through registered host bounce buffers, for transports that cannot register device memory.
//!
//! A [`Stager`] owns `depth` host bounce buffers of `chunk` bytes each, registered once
//! with the transport (never per call). A staged WRITE copies chunk *i + 1* from the device
//! into one bounce buffer while chunk *i* travels from the other; a staged READ copies
//! chunk *i − 1* to the device while chunk *i* arrives. The device copy runs on the calling
//! task while the transport's own I/O carries the transfer, so the two overlap without an
//! async runtime in this crate.
//!
//! The host side should be pinned memory of the device's backend (page-locked, so the
//! device's DMA engine copies at full speed); any host [`Memory`] works.

use std::sync::Arc;

use crate::{
    Access, Communicator, ConnBuffer, Deadline, Device, Error, MemSpan, MemSpanMut, Memory, Op,
    RegisteredBuffer, Result, TransferDesc, check_bounds,
};

/// How a [`Stager`] splits transfers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagingConfig {
    /// Bytes per bounce buffer (default 4 MiB).
    pub chunk: usize,
    /// Number of bounce buffers (default 2: one in the device copy, one on the wire).
    pub depth: usize,
}

impl Default for StagingConfig {
    fn default() -> Self {
        StagingConfig {
            chunk: 4 << 20,
            depth: 2,
        }
    }
}

impl StagingConfig {
    /// Checks the settings and that `host` (where the staging buffers live) is host
    /// memory; `what` names the user in the error.
    pub fn check(&self, what: &str, host: Device) -> Result<()> {
        if !host.is_host() {
            return Err(Error::InvalidArgument(format!(
                "{what} buffers must be host memory, not {host}"
            )));
        }
        if self.chunk == 0 || self.depth < 2 {
            return Err(Error::InvalidArgument(format!(
                "{what} needs chunk > 0 and depth >= 2 (got chunk {}, depth {}); raise them in the StagingConfig",
                self.chunk, self.depth
            )));
        }
        Ok(())
    }
}

/// Pinned host bounce buffers registered with a transport, and the pipelined copy loop.
pub struct Stager<H: Memory, C: Communicator> {
    bounce: Vec<RegisteredBuffer<H, C>>,
    comm: Arc<C>,
    chunk: usize,
}

impl<H: Memory, C: Communicator> Stager<H, C> {
    /// Allocates and registers the bounce buffers.
    pub fn new(host: Arc<H>, comm: Arc<C>, config: StagingConfig) -> Result<Self> {
        config.check("staging bounce", host.device())?;
        let bounce = (0..config.depth)
            .map(|_| {
                RegisteredBuffer::new(host.clone(), comm.clone(), config.chunk, Access::READ_WRITE)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Stager {
            bounce,
            comm,
            chunk: config.chunk,
        })
    }

    /// Bytes per chunk.
    pub fn chunk(&self) -> usize {
        self.chunk
    }

    fn bounce_span(&self, i: usize, len: usize) -> Result<MemSpan<'_>> {
        let region = self.bounce[i % self.bounce.len()].region().slice(0, len)?;
        // SAFETY: the bounce buffer is owned by `self` and only used by the operation that
        // holds `&mut self`; the span does not outlive that borrow.
        Ok(unsafe { MemSpan::from_region(region) })
    }

    fn bounce_span_mut(&self, i: usize, len: usize) -> Result<MemSpanMut<'_>> {
        let region = self.bounce[i % self.bounce.len()].region().slice(0, len)?;
        // SAFETY: as in `bounce_span`; while this span lives no transfer uses bounce `i`
        // (the pipeline alternates buffers).
        Ok(unsafe { MemSpanMut::from_region(region) })
    }

    /// The descriptor moving chunk `i` between its bounce buffer and the remote region.
    fn chunk_desc<'a>(
        &'a self,
        i: usize,
        remote: &'a C::RemoteKey,
        remote_offset: u64,
        len: usize,
    ) -> TransferDesc<'a, C> {
        TransferDesc {
            local: self.bounce[i % self.bounce.len()].registration(),
            local_offset: 0,
            remote,
            remote_offset,
            len,
        }
    }

    fn chunks(&self, len: usize) -> usize {
        len.div_ceil(self.chunk)
    }

    fn piece(&self, total: usize, i: usize) -> (usize, usize) {
        let off = i * self.chunk;
        (off, self.chunk.min(total - off))
    }

    /// WRITEs `src` (memory of `device`, or host) to `remote` at `remote_offset`, chunk by
    /// chunk through the bounce buffers. Complete when every byte is at the target.
    pub async fn write_from<D: Memory>(
        &mut self,
        device: &D,
        ep: &C::Endpoint,
        src: &MemSpan<'_>,
        remote: &C::RemoteKey,
        remote_offset: u64,
        deadline: Deadline,
    ) -> Result<()> {
        check_bounds("staged write", remote_offset, src.len() as u64, u64::MAX)?;
        let total = src.len();
        let n = self.chunks(total);
        if n == 0 {
            return Ok(());
        }
        let (off, len) = self.piece(total, 0);
        device.copy(&mut self.bounce_span_mut(0, len)?, &src.slice(off, len)?)?;
        for i in 0..n {
            let (off, len) = self.piece(total, i);
            let desc = [self.chunk_desc(i, remote, remote_offset + off as u64, len)];
            let send = self.comm.transfer(ep, Op::Write, &desc, deadline);
            let prefetch = async {
                if i + 1 < n {
                    let (noff, nlen) = self.piece(total, i + 1);
                    device.copy(
                        &mut self.bounce_span_mut(i + 1, nlen)?,
                        &src.slice(noff, nlen)?,
                    )?;
                }
                Ok::<(), Error>(())
            };
            let (sent, copied) = futures::join!(send, prefetch);
            sent?;
            copied?;
        }
        Ok(())
    }

    /// READs from `remote` at `remote_offset` into `dst` (memory of `device`, or host),
    /// chunk by chunk through the bounce buffers.
    pub async fn read_into<D: Memory>(
        &mut self,
        device: &D,
        ep: &C::Endpoint,
        dst: &mut MemSpanMut<'_>,
        remote: &C::RemoteKey,
        remote_offset: u64,
        deadline: Deadline,
    ) -> Result<()> {
        check_bounds("staged read", remote_offset, dst.len() as u64, u64::MAX)?;
        let total = dst.len();
        let n = self.chunks(total);
        for i in 0..=n {
            let fetch = async {
                if i < n {
                    let (off, len) = self.piece(total, i);
                    let desc = [self.chunk_desc(i, remote, remote_offset + off as u64, len)];
                    self.comm.transfer(ep, Op::Read, &desc, deadline).await?;
                }
                Ok::<(), Error>(())
            };
            let drain = async {
                if i > 0 {
                    let (poff, plen) = self.piece(total, i - 1);
                    let src = self.bounce_span(i - 1, plen)?;
                    device.copy(&mut dst.slice_mut(poff, plen)?, &src)?;
                }
                Ok::<(), Error>(())
            };
            let (fetched, drained) = futures::join!(fetch, drain);
            fetched?;
            drained?;
        }
        Ok(())
    }
}
