//! The shared core of HMC's device backends whose vendor API is shaped like the CUDA
//! runtime (AMD HIP, Moore Threads MUSA, Cambricon CNRT): one implementation of device
//! memory, pinned host memory, IPC export/import and library loading, generic over a small
//! per-vendor trait.
//!
//! # Example
//!
//! How a vendor backend describes its library and loads it at run time; a missing library
//! is `Unavailable` with the install hint and the environment variable to set.
//!
//! ```
//! use hmc_backend_runtime::LibrarySpec;
//! let spec = LibrarySpec {
//!     library: "libexample_rt",
//!     runtime: "the Example runtime",
//!     env: "HMC_EXAMPLE_LIB",
//!     candidates: &["libexample_rt.so.1"],
//!     install: "install the Example SDK",
//!     missing_symbol: "it is not an Example runtime HMC supports",
//! };
//! match spec.load(None) {
//!     Ok((_lib, path)) => println!("loaded {}", path.display()),
//!     Err(e) => {
//!         assert!(matches!(e, hmc_core::Error::Unavailable { .. }));
//!         assert!(e.to_string().contains("HMC_EXAMPLE_LIB"), "{e}");
//!     }
//! }
//! ```
//!
//! # Shape
//!
//! A vendor whose runtime has the CUDA runtime's shape (HIP, MUSA, CNRT) is a table: a
//! [`RuntimeTable`] `const` (symbol names, codes, enum values, each cited to its header)
//! on a marker type implementing [`Vendor`], and [`TableRuntime`] is its binding — one
//! implementation of symbol resolution, version checks, error mapping and every call.
//! A backend whose runtime is shaped otherwise implements [`RuntimeApi`] itself: set the current device, allocate, free, copy in a
//! [`CopyDirection`], pinned host alloc/free, IPC get/open/close, device count, memory info,
//! each failure mapped to [`hmc_core::Error::Device`] with the vendor's own function name
//! and error text. Everything else — binding the device before every call, choosing the copy
//! direction, host→host pass-through, the allocation limit, buffers that free themselves
//! exactly once in their device's context, the IPC wire form, device enumeration — lives
//! here once: [`RuntimeMemory`], [`RuntimeBuffer`], [`PinnedHostMemory`],
//! [`PinnedHostBuffer`], [`IpcHandle`], [`IpcMapping`], [`DeviceInfo`]. The vendor crate
//! re-exports them as type aliases under its own names (`RocmMemory = RuntimeMemory<HipApi>`).
//!
//! [`LibrarySpec`] holds what the loading code needs to know about a vendor (library name,
//! environment variable, candidate paths, install hint) and loads the library the same way
//! for every vendor.
//!
//! # Safety
//!
//! The trait's `unsafe fn`s take raw device or host pointers; their contracts are stated on
//! each. The generic code calls them only with pointers from allocations it owns or from
//! live borrows ([`hmc_core::MemSpan`]/[`hmc_core::MemSpanMut`]) checked by
//! [`hmc_core::check_copy`].

mod load;
mod memory;
mod table;

use std::ffi::c_void;
use std::fmt::Debug;
use std::path::Path;
use std::sync::Arc;

use hmc_core::{DeviceKind, Result};

pub use load::{LibrarySpec, c_string, default_runtime};
pub use memory::{
    DeviceInfo, IpcHandle, IpcMapping, PinnedHostBuffer, PinnedHostMemory, RuntimeBuffer,
    RuntimeMemory, all_devices, max_alloc_error,
};
pub use table::{
    ErrorText, HostAlloc, IpcBytes, IpcPointer, MemcpyKinds, RawIpcHandle, RuntimeTable, Symbols,
    TableRuntime, Vendor, VersionQuery,
};

/// The direction of a runtime copy. Host→host copies never reach the runtime (they are done
/// directly), so there is no variant for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyDirection {
    /// Host memory to device memory.
    HostToDevice,
    /// Device memory to host memory.
    DeviceToHost,
    /// Device memory to device memory (of the same device).
    DeviceToDevice,
}

/// The shape of a vendor's IPC memory handle, for [`IpcHandle`]: its size and the array
/// type of its wire form. Every [`RuntimeApi`] is one; a backend with its own memory types
/// (CUDA's driver API) implements it on a marker type to share [`IpcHandle`].
pub trait IpcFormat: Sized + 'static {
    /// The short vendor name used in messages and logs ("HIP", "MUSA", "MLU", "CUDA").
    const NAME: &'static str;
    /// The size of the vendor's IPC memory handle in bytes.
    const IPC_HANDLE_SIZE: usize;
    /// The wire form of an [`IpcHandle`]: `[u8; IPC_HANDLE_SIZE + 8]` (the handle, then the
    /// allocation length as big-endian `u64`).
    type IpcWire: Copy + Eq + Debug + Send + Sync + AsRef<[u8]> + AsMut<[u8]> + 'static;
    /// An all-zero [`Self::IpcWire`].
    const IPC_WIRE_ZERO: Self::IpcWire;
}

/// A vendor runtime with the CUDA-runtime shape: a per-thread current device, `malloc`/
/// `free`, a `memcpy` taking a direction, page-locked host allocations and IPC handles.
///
/// Implemented by each vendor crate over its table of resolved symbols. Every method that
/// fails returns the vendor's [`hmc_core::Error::Device`] (library, function, code, the
/// runtime's own text); the generic code adds nothing vendor-specific.
///
/// Every method that touches device memory is called only after
/// [`set_device`](Self::set_device) for the device concerned on the calling thread.
pub trait RuntimeApi: IpcFormat + Debug + Send + Sync {
    /// The device kind the vendor's devices report.
    const KIND: DeviceKind;
    /// The name of the vendor crate's memory type, for messages ("RocmMemory").
    const MEMORY_TYPE: &'static str;
    /// What to do when a device ordinal is past the device count (the crate's `probe` and
    /// the vendor's visibility variables).
    const ORDINAL_HINT: &'static str;
    /// The process-wide runtime found by the vendor's default search (its environment
    /// variable, then its candidate library names), loaded once on first success.
    fn default_runtime() -> Result<Arc<Self>>;
    /// The runtime at `library` (a path to the vendor library or to one exporting its ABI).
    fn open_library(library: &Path) -> Result<Arc<Self>>;
    /// Whether this runtime can export and open IPC handles (some vendor versions lack the
    /// calls; `capabilities()` reports it). Default: yes.
    fn ipc_supported(&self) -> bool {
        true
    }
    /// Where the library was loaded from.
    fn path(&self) -> &Path;
    /// The runtime's version, as the vendor encodes it.
    fn runtime_version(&self) -> i32;
    /// The number of devices, or `Unavailable` when there are none.
    fn device_count(&self) -> Result<u32>;
    /// Makes `ordinal` the calling thread's current device.
    fn set_device(&self, ordinal: u32) -> Result<()>;
    /// `(free, total)` memory of the current device, in bytes.
    fn mem_info(&self) -> Result<(u64, u64)>;
    /// Allocates `len > 0` bytes of device memory on the current device.
    fn malloc(&self, len: usize) -> Result<*mut c_void>;
    /// Frees a device allocation.
    ///
    /// # Safety
    /// `ptr` came from [`malloc`](Self::malloc) on the current device and is not used again.
    unsafe fn free(&self, ptr: *mut c_void) -> Result<()>;
    /// Allocates `len > 0` bytes of page-locked host memory with default flags.
    fn host_alloc(&self, len: usize) -> Result<*mut c_void>;
    /// Frees a page-locked host allocation.
    ///
    /// # Safety
    /// `ptr` came from [`host_alloc`](Self::host_alloc) and is not used again.
    unsafe fn host_free(&self, ptr: *mut c_void) -> Result<()>;
    /// Copies `len` bytes from `src` to `dst`, synchronously.
    ///
    /// # Safety
    /// `src` and `dst` are live memory of the kinds `dir` names (host, or the current
    /// device), each at least `len` bytes, and `dst` is not otherwise accessed meanwhile.
    unsafe fn memcpy(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        len: usize,
        dir: CopyDirection,
    ) -> Result<()>;
    /// Writes the IPC handle of the device allocation at `ptr` into `handle`
    /// ([`IpcFormat::IPC_HANDLE_SIZE`] bytes).
    ///
    /// # Safety
    /// `ptr` is the base of a live [`malloc`](Self::malloc) allocation of the current device.
    unsafe fn ipc_get(&self, ptr: *mut c_void, handle: &mut [u8]) -> Result<()>;
    /// Maps the allocation `handle` ([`IpcFormat::IPC_HANDLE_SIZE`] bytes) names into this
    /// process, on the current device.
    ///
    /// # Safety
    /// `handle` came from [`ipc_get`](Self::ipc_get) of the same vendor in a process that
    /// keeps the allocation alive while the mapping lives.
    unsafe fn ipc_open(&self, handle: &[u8]) -> Result<*mut c_void>;
    /// The base and length of the device allocation that holds `ptr` (the vendor's
    /// `MemGetAddressRange`), or `Ok(None)` when this runtime's table binds no such call;
    /// what [`hmc_core::Memory::export_ipc_span`] needs to export memory inside an
    /// allocation. Default: `Ok(None)`.
    ///
    /// # Safety
    /// None beyond the current device being set; the runtime checks `ptr` itself.
    unsafe fn address_range(&self, ptr: *const c_void) -> Result<Option<(u64, usize)>> {
        let _ = ptr;
        Ok(None)
    }
    /// Unmaps a mapping made by [`ipc_open`](Self::ipc_open).
    ///
    /// # Safety
    /// `ptr` came from `ipc_open` on the current device and is not used again.
    unsafe fn ipc_close(&self, ptr: *mut c_void) -> Result<()>;
    /// Waits for all work queued on the current device (the vendor's
    /// `DeviceSynchronize`): what a producer of a tensor queued before handing it over is
    /// done. `Ok(false)` when this runtime's table binds no such call. Default:
    /// `Ok(false)`.
    fn device_synchronize(&self) -> Result<bool> {
        Ok(false)
    }
}
