//! Process-wide allocator tuning for the binaries: keep large payload buffers in the heap
//! instead of a fresh `mmap` + page faults for every megabyte-sized call.

/// Bytes below which glibc serves allocations from the heap, set by [`tune_allocator`]
/// (32 MiB: payload buffers up to that size are reused instead of mapped and unmapped).
pub const MMAP_THRESHOLD: i32 = 32 << 20;
/// Free heap kept before glibc trims it, set by [`tune_allocator`] (256 MiB).
pub const TRIM_THRESHOLD: i32 = 256 << 20;

/// The same settings as a `GLIBC_TUNABLES` value, for child processes (the bench passes
/// it to every peer so that the comparison stays fair).
pub const GLIBC_TUNABLES: &str =
    "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=268435456";

/// Raises glibc's mmap and trim thresholds (a no-op on other C libraries). With the
/// defaults, each 1 MiB payload is mapped, faulted in page by page and unmapped; measured
/// on loopback echo this costs more than the copy itself. Call once at program start.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        #[allow(unsafe_code)]
        // SAFETY: `mallopt` only changes allocator parameters; it is called with valid
        // parameter numbers and values, and does not touch any memory we own.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        }
    }
}
