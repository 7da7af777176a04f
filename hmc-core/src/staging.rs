//! Device staging: moving device memory one-sided through registered host bounce buffers, for transports that cannot register device memory.
//!
//! A [`Stager`] owns `depth` host bounce buffers of `chunk` bytes each, registered once
//! with the transport (never per call). A staged WRITE copies chunk *i + 1* from the device
//! into one bounce buffer while chunk *i* travels from the other; a staged READ copies
//! chunk *i − 1* to the device while chunk *i* arrives. The device copy runs on the calling
//! task while the transport's own I/O carries the transfer, so the two overlap without an
//! async runtime in this crate.
//!
//! Many small runs (a KV request's blocks) go together: [`Stager::write_gather`] and
//! [`Stager::read_scatter`] pack consecutive runs into one bounce buffer and move each
//! buffer's runs as one batch, so a request of 512 blocks costs a few transfers, not 512.
//!
//! The host side should be pinned memory of the device's backend (page-locked, so the
//! device's DMA engine copies at full speed); any host [`Memory`] works.

use std::ops::Range;
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

    /// Groups of consecutive runs of `lens` that fit one bounce buffer; a run longer than a
    /// buffer is a group of its own, moved by [`Stager::write_from`]/[`Stager::read_into`].
    fn groups(&self, lens: impl Iterator<Item = usize>) -> Vec<Range<usize>> {
        let mut out: Vec<Range<usize>> = Vec::new();
        let mut fill = 0usize;
        for (i, len) in lens.enumerate() {
            match out.last_mut() {
                // An oversized run's `fill` takes no follower.
                Some(g) if len <= self.chunk && fill + len <= self.chunk => {
                    g.end = i + 1;
                    fill += len;
                }
                _ => {
                    out.push(i..i + 1);
                    fill = if len > self.chunk {
                        usize::MAX / 2
                    } else {
                        len
                    };
                }
            }
        }
        out
    }

    /// Whether `group` of `runs` is one run longer than a bounce buffer.
    fn oversized(&self, lens: &[usize], group: &Range<usize>) -> bool {
        group.len() == 1 && lens[group.start] > self.chunk
    }

    /// The batch moving `group`'s runs between bounce buffer `i` (packed from its start) and
    /// their remote regions.
    fn group_descs<'a, S>(
        &'a self,
        i: usize,
        runs: &'a [StagedRun<'_, C, S>],
        group: &Range<usize>,
        len: impl Fn(&S) -> usize,
    ) -> Vec<TransferDesc<'a, C>> {
        let mut at = 0usize;
        runs[group.clone()]
            .iter()
            .map(|r| {
                let n = len(&r.local);
                let d = TransferDesc {
                    local: self.bounce[i % self.bounce.len()].registration(),
                    local_offset: at,
                    remote: r.remote,
                    remote_offset: r.remote_offset,
                    len: n,
                };
                at += n;
                d
            })
            .collect()
    }

    /// WRITEs every run's local memory (of `device`, or host) to its remote region, runs
    /// packed into the bounce buffers: the device copies of buffer *i + 1*'s runs overlap
    /// the transfer of buffer *i*'s. Complete when every byte is at the target.
    pub async fn write_gather<D: Memory>(
        &mut self,
        device: &D,
        ep: &C::Endpoint,
        runs: &[StagedRun<'_, C, MemSpan<'_>>],
        deadline: Deadline,
    ) -> Result<()> {
        let lens: Vec<usize> = runs.iter().map(|r| r.local.len()).collect();
        let groups = self.groups(lens.iter().copied());
        let mut k = 0usize; // bounce buffers used so far
        let mut filled = false;
        for (gi, g) in groups.iter().enumerate() {
            if self.oversized(&lens, g) {
                let r = &runs[g.start];
                self.write_from(device, ep, &r.local, r.remote, r.remote_offset, deadline)
                    .await?;
                filled = false;
                continue;
            }
            if !filled {
                self.fill_group(device, k, &runs[g.clone()])?;
            }
            let next = groups
                .get(gi + 1)
                .filter(|n| !self.oversized(&lens, n))
                .cloned();
            let descs = self.group_descs(k, runs, g, |s: &MemSpan<'_>| s.len());
            let send = self.comm.transfer(ep, Op::Write, &descs, deadline);
            let prefetch = async {
                if let Some(n) = &next {
                    self.fill_group(device, k + 1, &runs[n.clone()])?;
                }
                Ok::<(), Error>(())
            };
            let (sent, copied) = futures::join!(send, prefetch);
            sent?;
            copied?;
            filled = next.is_some();
            k += 1;
        }
        Ok(())
    }

    /// READs every run's remote region into its local memory (of `device`, or host), runs
    /// packed into the bounce buffers: the device copies out of buffer *i − 1* overlap the
    /// transfer into buffer *i*.
    pub async fn read_scatter<D: Memory>(
        &mut self,
        device: &D,
        ep: &C::Endpoint,
        runs: &mut [StagedRun<'_, C, MemSpanMut<'_>>],
        deadline: Deadline,
    ) -> Result<()> {
        let lens: Vec<usize> = runs.iter().map(|r| r.local.len()).collect();
        let groups = self.groups(lens.iter().copied());
        let mut k = 0usize;
        // The group whose bytes wait in bounce `k - 1` for their device copies.
        let mut pending: Option<Range<usize>> = None;
        for g in groups
            .iter()
            .cloned()
            .map(Some)
            .chain(std::iter::once(None))
        {
            if let Some(g) = g.as_ref().filter(|g| self.oversized(&lens, g)) {
                if let Some(p) = pending.take() {
                    self.drain_group(device, k - 1, &mut runs[p])?;
                }
                let r = &mut runs[g.start];
                let (remote, off) = (r.remote, r.remote_offset);
                self.read_into(device, ep, &mut r.local, remote, off, deadline)
                    .await?;
                continue;
            }
            let (ready, later) = runs.split_at_mut(g.as_ref().map_or(runs.len(), |g| g.start));
            let fetch = async {
                if let Some(g) = &g {
                    let descs =
                        self.group_descs(k, later, &(0..g.len()), |s: &MemSpanMut<'_>| s.len());
                    self.comm.transfer(ep, Op::Read, &descs, deadline).await?;
                }
                Ok::<(), Error>(())
            };
            let drain = async {
                if let Some(p) = &pending {
                    self.drain_group(device, k.wrapping_sub(1), &mut ready[p.clone()])?;
                }
                Ok::<(), Error>(())
            };
            let (fetched, drained) = futures::join!(fetch, drain);
            fetched?;
            drained?;
            pending = g;
            k += 1;
        }
        Ok(())
    }

    /// Packs `runs`' local bytes into bounce buffer `i` from its start.
    fn fill_group<D: Memory>(
        &self,
        device: &D,
        i: usize,
        runs: &[StagedRun<'_, C, MemSpan<'_>>],
    ) -> Result<()> {
        let mut at = 0usize;
        for r in runs {
            let n = r.local.len();
            let region = self.bounce[i % self.bounce.len()].region().slice(at, n)?;
            // SAFETY: as in `bounce_span_mut`: bounce `i` is not on the wire while it is
            // filled (the pipeline alternates buffers).
            let mut dst = unsafe { MemSpanMut::from_region(region) };
            device.copy(&mut dst, &r.local)?;
            at += n;
        }
        Ok(())
    }

    /// Copies the runs packed in bounce buffer `i` out to their local memory.
    fn drain_group<D: Memory>(
        &self,
        device: &D,
        i: usize,
        runs: &mut [StagedRun<'_, C, MemSpanMut<'_>>],
    ) -> Result<()> {
        let mut at = 0usize;
        for r in runs {
            let n = r.local.len();
            let region = self.bounce[i % self.bounce.len()].region().slice(at, n)?;
            // SAFETY: as in `bounce_span`: bounce `i` is off the wire (its READ completed)
            // and not refilled while drained.
            let src = unsafe { MemSpan::from_region(region) };
            device.copy(&mut r.local, &src)?;
            at += n;
        }
        Ok(())
    }
}

/// One run of [`Stager::write_gather`] or [`Stager::read_scatter`]: local memory (a
/// [`MemSpan`] to write from, a [`MemSpanMut`] to read into) and where it goes or comes
/// from in a peer's region.
pub struct StagedRun<'a, C: Communicator, S> {
    /// The local bytes.
    pub local: S,
    /// The peer's region.
    pub remote: &'a C::RemoteKey,
    /// Offset in the peer's region.
    pub remote_offset: u64,
}
