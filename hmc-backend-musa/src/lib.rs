//! Moore Threads MUSA GPU memory for HMC: device allocations, copies in every direction,
//! pinned host staging buffers and same-host IPC, through `libmusart` opened at run time.
//!
//! # Example
//!
//! Allocate MUSA memory, copy host bytes in and back. Without the vendor runtime (as on
//! the project's CI machines) the constructor answers `Unavailable` with a hint, never panics.
//!
//! ```
//! use hmc_core::{MemSpan, MemSpanMut, Memory};
//! match hmc_backend_musa::MusaMemory::new(0) {
//!     Ok(mem) => {
//!         let mut buf = mem.alloc(4096)?;
//!         mem.copy(&mut MemSpanMut::of(&mut buf), &MemSpan::host(&[7u8; 4096]))?;
//!         let mut back = vec![0u8; 4096];
//!         mem.copy(&mut MemSpanMut::host(&mut back), &MemSpan::of(&buf))?;
//!         assert_eq!(back, vec![7u8; 4096]);
//!     }
//!     Err(e) => eprintln!("no MUSA device here: {e}"),
//! }
//! # Ok::<(), hmc_core::Error>(())
//! ```
//!
//! # What this crate is for
//!
//! [`MusaMemory`] implements [`hmc_core::Memory`] for one MUSA device: `musaMalloc`/`musaFree`
//! allocations ([`MusaBuffer`]), and `musaMemcpy` copies host→device, device→host and
//! device→device (host→host spans are copied directly, without the runtime).
//! [`PinnedHostMemory`] (from [`MusaMemory::pinned`]) allocates page-locked host memory
//! with `musaHostAlloc`, which device staging uses as bounce buffers.
//! [`MusaMemory::export_ipc`] and [`MusaMemory::open_ipc`] share a device allocation with
//! another process on the same host (`musaIpcGetMemHandle`/`musaIpcOpenMemHandle`).
//! [`probe`] lists the devices, for `cargo xtask matrix` and for programs choosing a backend.
//!
//! Not for: kernels, streams or asynchronous copies (HMC moves bytes; compute stays with the
//! application), nor peer-to-peer copies between two MUSA devices.
//!
//! The memory types are the generic ones of `hmc-backend-runtime` over [`MusaApi`]
//! (`TableRuntime<Musa>`: the MUSA runtime described as a table and bound by the generic code),
//! under this crate's names.
//!
//! # Loading
//!
//! Nothing from the MUSA toolkit is needed to build. At run time the runtime is looked up
//! as `$HMC_MUSA_LIB` when set, else `libmusart.so`, `libmusart.so.4` … `.so.1`,
//! `/usr/local/musa/lib/libmusart.so` ([`LIBRARY_CANDIDATES`]). A machine without the
//! library, or without a device, gets [`hmc_core::Error::Unavailable`] naming what was
//! looked for and the variable to set; nothing panics. Every failed runtime call becomes
//! [`hmc_core::Error::Device`] with the library, the function, the `musaError_t` code and
//! the runtime's own `musaGetErrorName`/`musaGetErrorString` text.
//!
//! The MUSA "current device" is per thread (as in CUDA's runtime API, which MUSA mirrors),
//! so every call that touches device memory (alloc, free, copy, IPC, pinned alloc/free,
//! info) first calls `musaSetDevice` for its own device on the calling thread; buffers
//! remember their device and free themselves in its context.
//!
//! # What is verified, and how
//!
//! - Where a MUSA device is present, the `hmc-core` memory conformance kit runs against
//!   [`MusaMemory`] and [`PinnedHostMemory`] (`tests/conformance.rs`).
//! - Where it is not, the tests assert the clean `Unavailable` error.
//! - Everywhere, `tests/abi_shim.rs` builds `tests/shim/musa_shim.c` with the C compiler
//!   and runs the full conformance kit, the context checks, error mapping and a two-process
//!   IPC exchange against it. That shim exports the same symbols over host memory and
//!   checks direction enums and the current device: it is an **ABI shim that checks our
//!   binding layer, not a hardware verification**. No MUSA hardware has run this crate yet.
//!
//! # Safety
//!
//! This crate has no `unsafe` of its own. It is a table ([`Musa`]'s `RuntimeTable`: the
//! symbols with their header signatures cited, the codes and enum values), and
//! `hmc-backend-runtime`'s `TableRuntime` resolves and calls it, with its `SAFETY` notes
//! there once for every vendor. [`MusaMemory::open_ipc`] is `unsafe` because the length in a
//! handle received from another process cannot be checked.

#![forbid(unsafe_code)]

mod api;

pub use api::{LIBRARY_CANDIDATES, LIBRARY_ENV, MUSA_IPC_HANDLE_SIZE, Musa, MusaApi};
pub use hmc_backend_runtime::DeviceInfo;

use hmc_backend_runtime::RuntimeApi;
use hmc_core::Result;

/// One MUSA device's allocator and copy engine (`musaMalloc`, `musaMemcpy`, `musaSetDevice`
/// before every call). Cheap to clone. [`MusaMemory::new`] uses the default search,
/// [`MusaMemory::with_library`] a given library.
pub type MusaMemory = hmc_backend_runtime::RuntimeMemory<MusaApi>;
/// A `musaMalloc` allocation; freed (`musaFree`, in its device's context) on drop.
pub type MusaBuffer = hmc_backend_runtime::RuntimeBuffer<MusaApi>;
/// Page-locked host memory from the MUSA runtime (`musaHostAlloc`), for staging bounce
/// buffers; its buffers are host memory.
pub type PinnedHostMemory = hmc_backend_runtime::PinnedHostMemory<MusaApi>;
/// A `musaHostAlloc` allocation; freed (`musaFreeHost`) on drop.
pub type PinnedHostBuffer = hmc_backend_runtime::PinnedHostBuffer<MusaApi>;
/// An exported device allocation: the runtime's 64-byte `musaIpcMemHandle_t` and the
/// allocation's length; [`IpcHandle::to_bytes`] gives its 72-byte wire form.
pub type IpcHandle = hmc_backend_runtime::IpcHandle<MusaApi>;
/// Another process's device allocation mapped by [`MusaMemory::open_ipc`]
/// (`musaIpcOpenMemHandle`); unmapped (`musaIpcCloseMemHandle`) on drop.
pub type IpcMapping = hmc_backend_runtime::IpcMapping<MusaApi>;

/// The MUSA devices of the default runtime (see [`MusaMemory::new`]), or `Unavailable` when
/// the runtime or any device is missing. For `cargo xtask matrix` and backend selection.
pub fn probe() -> Result<Vec<DeviceInfo>> {
    hmc_backend_runtime::all_devices(&MusaApi::default_runtime()?)
}

/// Like [`probe`], for the runtime at `library`.
pub fn probe_library(library: impl AsRef<std::path::Path>) -> Result<Vec<DeviceInfo>> {
    hmc_backend_runtime::all_devices(&MusaApi::open_library(library.as_ref())?)
}
