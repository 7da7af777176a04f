//! Host memory the engine allocates itself ([`Engine::alloc_mem`](super::Engine::alloc_mem))
//! where its transport has no allocation of its own (`Communicator::alloc_registered`
//! answers `None`, as TCP's does): zeroed, page-aligned, freed when the registration that
//! exposes it has been dropped.

use std::alloc::{Layout, alloc_zeroed, dealloc};

use crate::error::{EngineError, Result};

/// Alignment of the allocation: a page, so that a region starts where the kernel's copies
/// and pinning work in whole pages.
const PAGE: usize = 4096;

/// `len` zeroed bytes on the heap, owned; freed on drop.
pub(super) struct OwnedHostMem {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: the type owns a plain heap allocation and hands out only its address; who reads
// and writes the bytes when is decided by the registration that exposes them.
unsafe impl Send for OwnedHostMem {}
// SAFETY: as above: no method touches the bytes.
unsafe impl Sync for OwnedHostMem {}

impl OwnedHostMem {
    /// Allocates `len` (> 0) zeroed bytes, page-aligned.
    pub(super) fn zeroed(len: usize) -> Result<OwnedHostMem> {
        let layout = Layout::from_size_align(len, PAGE).map_err(|_| {
            EngineError::InvalidArgument(format!("cannot allocate {len} bytes: too large"))
        })?;
        debug_assert!(len > 0, "the caller refuses 0 bytes");
        // SAFETY: the layout's size is non-zero (the caller refuses 0 bytes).
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(EngineError::InvalidArgument(format!(
                "the allocator refused {len} bytes of host memory: free some, or allocate less"
            )));
        }
        Ok(OwnedHostMem { ptr, layout })
    }

    /// Where the bytes start.
    pub(super) fn addr(&self) -> u64 {
        self.ptr as u64
    }
}

impl Drop for OwnedHostMem {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout, freed once.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_zeroed_and_page_aligned() {
        let m = OwnedHostMem::zeroed(3 * PAGE + 5).unwrap();
        assert_eq!(m.addr() % PAGE as u64, 0);
        // SAFETY: the allocation is 3 pages and 5 bytes, owned by `m`, alive here.
        let bytes = unsafe { std::slice::from_raw_parts(m.ptr, 3 * PAGE + 5) };
        assert!(bytes.iter().all(|&b| b == 0));
    }
}
