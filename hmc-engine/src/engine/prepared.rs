//! Prepared descriptor lists: blocks resolved once to (registration, offset) on this
//! engine or on a connected peer, then named by index in any number of transfers (NIXL's
//! `prep_xfer_dlist`, vLLM's per-(layer, block) descriptors).
//!
//! A list is stored as segments: a run of `count` blocks of `len` bytes, `stride` apart,
//! in one region. A strided entry is one segment; consecutive single blocks of one region
//! with one length and a constant step are folded into one segment as they are added, so a
//! block table prepared block by block (the common case) costs a few segments, not one
//! record per block.

use std::sync::Arc;

use hmc_core::Communicator;

use super::{Engine, LocalReg, Peer, RemoteEntry, miss};
use crate::error::{EngineError, Result, Side};
use crate::region_map::Lookup;

/// One entry of a list to prepare: `count` blocks of `len` bytes, the first at `addr`, each
/// `stride` bytes after the one before (NIXL 1.5's strided form); `count` 1 is one block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockDesc {
    /// Address of the first block.
    pub addr: u64,
    /// Bytes of each block.
    pub len: usize,
    /// Bytes from one block's start to the next's (ignored when `count` is 1).
    pub stride: u64,
    /// Blocks in the entry.
    pub count: u64,
}

impl BlockDesc {
    /// One block of `len` bytes at `addr`.
    pub fn block(addr: u64, len: usize) -> Self {
        BlockDesc {
            addr,
            len,
            stride: len as u64,
            count: 1,
        }
    }

    /// `count` blocks of `len` bytes, `stride` apart, from `addr`.
    pub fn strided(addr: u64, len: usize, stride: u64, count: u64) -> Self {
        BlockDesc {
            addr,
            len,
            stride,
            count,
        }
    }
}

/// A run of blocks in one region: entries `first .. first + count` of the list.
#[derive(Clone, Copy, Debug)]
pub(super) struct Segment {
    pub(super) first: u64,
    pub(super) count: u64,
    /// Index into the list's regions.
    pub(super) reg: u32,
    pub(super) off: u64,
    pub(super) len: u64,
    pub(super) stride: u64,
}

/// Segments over a list's regions (`R`: this engine's registrations or a peer's imported
/// regions).
pub(super) struct Resolved<R> {
    pub(super) regs: Vec<R>,
    pub(super) segs: Vec<Segment>,
    /// Entries in the list.
    pub(super) len: u64,
}

impl<R> Resolved<R> {
    fn new() -> Self {
        Resolved {
            regs: Vec::new(),
            segs: Vec::new(),
            len: 0,
        }
    }

    /// Appends `count` blocks at `off` in region `reg`, folding them into the last segment
    /// when they continue it.
    fn push(&mut self, reg: u32, off: u64, len: u64, stride: u64, count: u64) {
        if let Some(last) = self.segs.last_mut()
            && last.reg == reg
            && last.len == len
        {
            let continues =
                |step: u64| (count == 1 || stride == step) && last.off + last.count * step == off;
            if last.count == 1 && off >= last.off && (count == 1 || off - last.off == stride) {
                last.stride = off - last.off;
                last.count += count;
                self.len += count;
                return;
            }
            if last.count > 1 && continues(last.stride) {
                last.count += count;
                self.len += count;
                return;
            }
        }
        self.segs.push(Segment {
            first: self.len,
            count,
            reg,
            off,
            len,
            stride: if count == 1 { len } else { stride },
        });
        self.len += count;
    }

    /// Entry `i`: (region index, offset, length).
    pub(super) fn entry(&self, i: u64) -> Option<(u32, u64, u64)> {
        if i >= self.len {
            return None;
        }
        let s = if self.segs.len() as u64 == self.len {
            // One segment per entry: no search.
            &self.segs[i as usize]
        } else {
            &self.segs[self.segs.partition_point(|s| s.first <= i) - 1]
        };
        Some((s.reg, s.off + (i - s.first) * s.stride, s.len))
    }

    /// Bytes this list keeps per entry and overall (for the preparation bench).
    fn heap_bytes(&self) -> usize {
        self.segs.capacity() * std::mem::size_of::<Segment>()
            + self.regs.capacity() * std::mem::size_of::<R>()
    }
}

/// Which side a list was prepared for.
pub(super) enum ListSide<C: Communicator> {
    /// Held weakly: a list does not keep memory registered (a transfer in flight does).
    Local(Resolved<std::sync::Weak<LocalReg<C>>>),
    Remote {
        peer: Arc<Peer<C>>,
        resolved: Resolved<Arc<RemoteEntry<C>>>,
    },
}

/// A prepared descriptor list (see [`Engine::prepare_local`] and
/// [`Engine::prepare_remote`]). Cheap to clone. A local list does not keep memory
/// registered: [`Engine::deregister_mem`] of a region under it waits only for transfers
/// in flight, and later posts of a transfer made of the list fail with
/// [`EngineError::ListInvalid`].
pub struct PreparedList<C: Communicator> {
    pub(super) inner: Arc<ListSide<C>>,
}

impl<C: Communicator> Clone for PreparedList<C> {
    fn clone(&self) -> Self {
        PreparedList {
            inner: self.inner.clone(),
        }
    }
}

impl<C: Communicator> std::fmt::Debug for PreparedList<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedList")
            .field("peer", &self.peer())
            .field("len", &self.len())
            .field("segments", &self.segments())
            .finish()
    }
}

impl<C: Communicator> PreparedList<C> {
    /// Entries in the list (a strided entry counts its blocks).
    pub fn len(&self) -> u64 {
        match &*self.inner {
            ListSide::Local(r) => r.len,
            ListSide::Remote { resolved, .. } => resolved.len,
        }
    }

    /// True for a list of no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The peer a remote list was prepared for; `None` for a local list.
    pub fn peer(&self) -> Option<&str> {
        match &*self.inner {
            ListSide::Local(_) => None,
            ListSide::Remote { peer, .. } => Some(&peer.name),
        }
    }

    /// Segments the entries were folded into (consecutive blocks of one region with one
    /// length and a constant step make one).
    pub fn segments(&self) -> usize {
        match &*self.inner {
            ListSide::Local(r) => r.segs.len(),
            ListSide::Remote { resolved, .. } => resolved.segs.len(),
        }
    }

    /// Heap bytes the list holds.
    pub fn heap_bytes(&self) -> usize {
        match &*self.inner {
            ListSide::Local(r) => r.heap_bytes(),
            ListSide::Remote { resolved, .. } => resolved.heap_bytes(),
        }
    }
}

/// Checks one entry's shape: what it spans, from its first block's start.
fn span(d: &BlockDesc) -> Result<u64> {
    if d.len == 0 || d.count == 0 {
        return Err(EngineError::InvalidArgument(format!(
            "an entry of 0 bytes or 0 blocks ({d:?}); leave it out"
        )));
    }
    (d.count - 1)
        .checked_mul(d.stride)
        .and_then(|s| s.checked_add(d.len as u64))
        .filter(|&s| d.addr.checked_add(s).is_some())
        .ok_or_else(|| {
            EngineError::InvalidArgument(format!(
                "entry {d:?} runs past the end of the address space"
            ))
        })
}

/// Resolves `entries` in `find` (a region map lookup), each entry inside one region.
fn resolve<R: Clone>(
    entries: &[BlockDesc],
    mut find: impl FnMut(u64, u64) -> std::result::Result<(R, u64), EngineError>,
    same: impl Fn(&R, &R) -> bool,
) -> Result<Resolved<R>> {
    let mut out = Resolved::new();
    for d in entries {
        let spanned = span(d)?;
        let (reg, off) = find(d.addr, spanned)?;
        // Entries of one list mostly share a few regions: the last ones are checked first.
        let idx = match out.regs.iter().rposition(|r| same(r, &reg)) {
            Some(i) => i,
            None => {
                out.regs.push(reg);
                out.regs.len() - 1
            }
        };
        let idx = u32::try_from(idx).map_err(|_| {
            EngineError::InvalidArgument("a list over more than 2^32 regions".into())
        })?;
        out.push(idx, off, d.len as u64, d.stride, d.count);
    }
    Ok(out)
}

impl<C: Communicator> Engine<C> {
    /// Prepares `entries` of this engine's registered memory for transfers
    /// ([`Engine::make_transfer`]): each entry is resolved to its registration here, and
    /// refused here when it is outside every region or straddles two.
    pub fn prepare_local(&self, entries: &[BlockDesc]) -> Result<PreparedList<C>> {
        self.check_open()?;
        let t = self.inner.shared.local.read();
        let name = &self.inner.name;
        let resolved = resolve(
            entries,
            |addr, len| match t.map.find(addr, len) {
                // Device memory the transport stages is moved through this engine's bounce
                // buffers by the transfers made of the list (or by the transport itself where
                // it moves it directly).
                Lookup::Inside(r, off) => Ok((Arc::downgrade(r), off)),
                other => {
                    if let Lookup::Inside(..) = t.staged.find(addr, len) {
                        return Err(EngineError::InvalidArgument(format!(
                            "{addr:#x}+{len} is device memory the transport cannot register (moved through host bounce buffers): prepared lists take registered memory only; use Engine::transfer for it"
                        )));
                    }
                    Err(miss(Side::Local, name, addr, len, other))
                }
            },
            std::sync::Weak::ptr_eq,
        )?;
        Ok(PreparedList {
            inner: Arc::new(ListSide::Local(resolved)),
        })
    }

    /// Prepares `entries` of the connected peer `remote`'s memory: each entry is resolved
    /// to the peer's region here (its table is fetched again once if an entry is not in
    /// the one known), and refused here when it is outside every region it registered.
    /// The list becomes invalid when the peer deregisters a region under it or restarts:
    /// transfers made of it then fail with [`EngineError::ListInvalid`] or
    /// [`EngineError::PeerGone`].
    pub async fn prepare_remote(
        &self,
        remote: &str,
        entries: &[BlockDesc],
        timeout: std::time::Duration,
    ) -> Result<PreparedList<C>> {
        self.check_open()?;
        let peer = self.peer(remote)?;
        let attempt = || {
            let t = peer.table.read();
            resolve(
                entries,
                |addr, len| match t.map.find(addr, len) {
                    Lookup::Inside(r, off) => Ok((r.clone(), off)),
                    other => Err(miss(Side::Remote, &peer.name, addr, len, other)),
                },
                Arc::ptr_eq,
            )
        };
        let resolved = match attempt() {
            Err(EngineError::NotRegistered { .. } | EngineError::Straddles { .. }) => {
                Box::pin(self.refresh(&peer, hmc_core::Deadline::after(timeout))).await?;
                attempt()?
            }
            other => other?,
        };
        Ok(PreparedList {
            inner: Arc::new(ListSide::Remote { peer, resolved }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(r: &Resolved<u8>) -> Vec<(u32, u64, u64)> {
        (0..r.len).map(|i| r.entry(i).unwrap()).collect()
    }

    #[test]
    fn blocks_with_a_constant_step_fold_into_one_segment() {
        let mut r = Resolved::<u8>::new();
        for b in [0u64, 4, 8, 12] {
            r.push(0, b * 100, 100, 100, 1);
        }
        assert_eq!(r.segs.len(), 1);
        assert_eq!(r.segs[0].stride, 400);
        assert_eq!(
            entries(&r),
            vec![(0, 0, 100), (0, 400, 100), (0, 800, 100), (0, 1200, 100)]
        );
        // A break in the step, another length or region start new segments.
        r.push(0, 5000, 100, 100, 1);
        r.push(0, 5100, 50, 50, 1);
        r.push(1, 0, 50, 50, 1);
        assert_eq!(r.segs.len(), 4);
        assert_eq!(r.entry(4), Some((0, 5000, 100)));
        assert_eq!(r.entry(5), Some((0, 5100, 50)));
        assert_eq!(r.entry(6), Some((1, 0, 50)));
        assert_eq!(r.entry(7), None);
    }

    #[test]
    fn strided_entries_are_one_segment_and_continue_each_other() {
        let mut r = Resolved::<u8>::new();
        r.push(0, 0, 16, 64, 1000);
        r.push(0, 64_000, 16, 64, 1000);
        assert_eq!(r.segs.len(), 1);
        assert_eq!(r.len, 2000);
        assert_eq!(r.entry(1999), Some((0, 1999 * 64, 16)));
        // Descending blocks do not fold (the step would be negative).
        let mut d = Resolved::<u8>::new();
        d.push(0, 800, 8, 8, 1);
        d.push(0, 0, 8, 8, 1);
        assert_eq!(d.segs.len(), 2);
        assert_eq!(entries(&d), vec![(0, 800, 8), (0, 0, 8)]);
    }

    #[test]
    fn entries_of_no_bytes_or_past_the_address_space_are_refused() {
        assert!(span(&BlockDesc::block(0x1000, 0)).is_err());
        assert!(span(&BlockDesc::strided(0x1000, 8, 8, 0)).is_err());
        assert!(span(&BlockDesc::strided(u64::MAX - 4, 8, 8, 1)).is_err());
        assert_eq!(span(&BlockDesc::strided(0, 8, 16, 4)).unwrap(), 56);
    }
}
