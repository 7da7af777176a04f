//! Host memory for HMC: page-aligned allocations with optional huge pages and `mlock`.
//!
//! # Example
//!
//! ```
//! use hmc_backend_cpu::HostMemory;
//! use hmc_core::{MemSpan, MemSpanMut, Memory};
//! let mem = HostMemory::new();
//! let mut buf = mem.alloc(1 << 20)?; // page-aligned, huge pages when the config asks
//! mem.copy(&mut MemSpanMut::of(&mut buf), &MemSpan::host(&[1u8; 1 << 20]))?;
//! let mut back = vec![0u8; 1 << 20];
//! mem.copy(&mut MemSpanMut::host(&mut back), &MemSpan::of(&buf))?;
//! assert!(back.iter().all(|&b| b == 1));
//! # Ok::<(), hmc_core::Error>(())
//! ```
//!
//! [`HostMemory`] is the [`Memory`] every machine has. Its buffers come straight from
//! `mmap`, so they are page aligned (what NICs and DMA engines want), zero-filled, and
//! returned to the kernel on drop.
//!
//! - **Huge pages** ([`HostMemoryConfig::huge_pages`]): tries `MAP_HUGETLB` first (needs
//!   pages reserved in `/proc/sys/vm/nr_hugepages`), and when that fails falls back to normal
//!   pages with `madvise(MADV_HUGEPAGE)` so transparent huge pages can still back the buffer.
//!   The fallback is logged at debug level, never an error.
//! - **Locking** ([`HostMemoryConfig::mlock`]): pins the pages with `mlock` so registration
//!   never sees them swapped out. Exceeding `RLIMIT_MEMLOCK` is an error that names the
//!   limit (`ulimit -l`), since a silently unlocked buffer would defeat the purpose.
//!
//! Not for: device memory (see the device backends) or pinned memory registered with a GPU
//! driver (each GPU backend has its own pinned allocator).
//!
//! Safety: the only `unsafe` is the `mmap`/`munmap`/`mlock` FFI and `memmove`-style copies
//! between spans whose bounds and lengths were checked first.

use std::ptr::NonNull;

use hmc_core::{
    Device, DeviceBuffer, Error, MemSpan, MemSpanMut, Memory, Region, Result, check_copy,
};

/// How [`HostMemory`] allocates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostMemoryConfig {
    /// Back buffers with huge pages when possible (falls back cleanly).
    pub huge_pages: bool,
    /// Lock buffers in RAM with `mlock`.
    pub mlock: bool,
}

/// The host's allocator and copy engine.
#[derive(Clone, Debug, Default)]
pub struct HostMemory {
    config: HostMemoryConfig,
}

impl HostMemory {
    /// Page-aligned allocations, no huge pages, no locking.
    pub fn new() -> Self {
        Self::default()
    }

    /// With explicit options.
    pub fn with_config(config: HostMemoryConfig) -> Self {
        HostMemory { config }
    }

    /// The options in use.
    pub fn config(&self) -> HostMemoryConfig {
        self.config
    }
}

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 { n as usize } else { 4096 }
}

const HUGE_PAGE: usize = 2 << 20;

/// A page-aligned host allocation, unmapped on drop.
#[derive(Debug)]
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
    mapped_len: usize,
    huge: bool,
    locked: bool,
}

// SAFETY: the buffer exclusively owns its mapping; access goes through spans whose borrows
// the type system tracks, so sharing the handle across threads is sound.
unsafe impl Send for HostBuffer {}
// SAFETY: as above; `&HostBuffer` only exposes the address.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// True when the mapping is backed by explicit huge pages (`MAP_HUGETLB`).
    pub fn is_huge(&self) -> bool {
        self.huge
    }

    /// True when the pages are locked in RAM.
    pub fn is_locked(&self) -> bool {
        self.locked
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is `len` readable bytes (a dangling non-null pointer for 0),
        // alive as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl DeviceBuffer for HostBuffer {
    fn region(&self) -> Region {
        Region {
            device: Device::HOST,
            addr: self.ptr.as_ptr() as u64,
            len: self.len,
        }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if self.mapped_len == 0 {
            return;
        }
        // SAFETY: `ptr`/`mapped_len` are exactly what mmap returned; munmap also drops any
        // mlock on the range.
        let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped_len) };
        if rc != 0 {
            tracing::error!(error = %std::io::Error::last_os_error(), "munmap of a host buffer failed");
        }
    }
}

fn round_up(len: usize, to: usize) -> Option<usize> {
    len.checked_add(to - 1).map(|n| n / to * to)
}

fn map(len: usize, extra_flags: libc::c_int) -> std::io::Result<NonNull<u8>> {
    // SAFETY: an anonymous private mapping with no address hint has no preconditions.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra_flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(NonNull::new(p.cast()).expect("mmap returned null without MAP_FAILED"))
}

impl Memory for HostMemory {
    type Buffer = HostBuffer;

    fn device(&self) -> Device {
        Device::HOST
    }

    fn max_alloc(&self) -> usize {
        isize::MAX as usize - HUGE_PAGE
    }

    fn alloc(&self, len: usize) -> Result<HostBuffer> {
        if len == 0 {
            return Ok(HostBuffer {
                ptr: NonNull::dangling(),
                len: 0,
                mapped_len: 0,
                huge: false,
                locked: false,
            });
        }
        if len > self.max_alloc() {
            return Err(Error::LimitExceeded {
                limit: "max_alloc",
                value: len as u64,
                max: self.max_alloc() as u64,
                hint: "allocate in smaller pieces".into(),
            });
        }
        let oom = |e: std::io::Error| {
            if e.raw_os_error() == Some(libc::ENOMEM) {
                Error::OutOfMemory {
                    device: Device::HOST,
                    len: len as u64,
                }
            } else {
                Error::io(format!("mmap of {len} bytes"), e)
            }
        };
        let (ptr, mapped_len, huge) = if self.config.huge_pages {
            let huge_len = round_up(len, HUGE_PAGE).expect("bounded by max_alloc");
            match map(huge_len, libc::MAP_HUGETLB) {
                Ok(p) => (p, huge_len, true),
                Err(e) => {
                    tracing::debug!(error = %e, "no explicit huge pages; using normal pages with MADV_HUGEPAGE");
                    let n = round_up(len, page_size()).expect("bounded by max_alloc");
                    let p = map(n, 0).map_err(oom)?;
                    // SAFETY: advice on a mapping we own; failure only means no THP.
                    unsafe { libc::madvise(p.as_ptr().cast(), n, libc::MADV_HUGEPAGE) };
                    (p, n, false)
                }
            }
        } else {
            let n = round_up(len, page_size()).expect("bounded by max_alloc");
            (map(n, 0).map_err(oom)?, n, false)
        };
        let mut buf = HostBuffer {
            ptr,
            len,
            mapped_len,
            huge,
            locked: false,
        };
        if self.config.mlock {
            // SAFETY: locking pages of a mapping we own.
            if unsafe { libc::mlock(ptr.as_ptr().cast(), mapped_len) } != 0 {
                let e = std::io::Error::last_os_error();
                return Err(Error::LimitExceeded {
                    limit: "RLIMIT_MEMLOCK",
                    value: mapped_len as u64,
                    max: memlock_limit(),
                    hint: format!(
                        "mlock failed ({e}); raise `ulimit -l` or turn HostMemoryConfig::mlock off"
                    ),
                });
            }
            buf.locked = true;
        }
        Ok(buf)
    }

    fn copy(&self, dst: &mut MemSpanMut<'_>, src: &MemSpan<'_>) -> Result<()> {
        check_copy(Device::HOST, dst, src)?;
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: both spans are host memory of equal length (checked above), valid for
        // their borrows; `copy` (memmove) tolerates overlap, which spans made from the same
        // registered buffer may have.
        unsafe {
            std::ptr::copy(
                src.region().addr as *const u8,
                dst.region().addr as *mut u8,
                src.len(),
            );
        }
        Ok(())
    }
}

fn memlock_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } == 0 {
        lim.rlim_cur
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_page_aligned_and_zeroed() {
        let m = HostMemory::new();
        let b = m.alloc(10_000).unwrap();
        assert_eq!(b.region().addr as usize % page_size(), 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
    }

    #[test]
    fn huge_pages_fall_back_cleanly() {
        let m = HostMemory::with_config(HostMemoryConfig {
            huge_pages: true,
            mlock: false,
        });
        let mut b = m.alloc(3 << 20).unwrap();
        b.as_mut_slice()[(3 << 20) - 1] = 7;
        assert_eq!(b.as_slice()[(3 << 20) - 1], 7);
    }

    #[test]
    fn mlock_locks_or_names_the_limit() {
        let m = HostMemory::with_config(HostMemoryConfig {
            huge_pages: false,
            mlock: true,
        });
        match m.alloc(64 << 10) {
            Ok(b) => assert!(b.is_locked()),
            Err(Error::LimitExceeded { limit, hint, .. }) => {
                assert_eq!(limit, "RLIMIT_MEMLOCK");
                assert!(hint.contains("ulimit -l"));
            }
            Err(e) => panic!("unexpected error {e}"),
        }
    }

    #[test]
    fn oversized_allocation_names_the_limit() {
        let err = HostMemory::new().alloc(usize::MAX).unwrap_err();
        assert!(err.to_string().contains("max_alloc"), "{err}");
    }
}
