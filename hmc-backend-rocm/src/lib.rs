//! AMD ROCm and HIP-compatible Hygon DCU memory for HMC: device allocations, copies in
//! every direction, pinned host staging buffers and same-host IPC, through `libamdhip64`
//! opened at run time.
//!
//! # Example
//!
//! Allocate ROCm/DCU memory, copy host bytes in and back. Without the vendor runtime (as on
//! the project's CI machines) the constructor answers `Unavailable` with a hint, never panics.
//!
//! ```
//! use hmc_core::{MemSpan, MemSpanMut, Memory};
//! match hmc_backend_rocm::RocmMemory::new(0) {
//!     Ok(mem) => {
//!         let mut buf = mem.alloc(4096)?;
//!         mem.copy(&mut MemSpanMut::of(&mut buf), &MemSpan::host(&[7u8; 4096]))?;
//!         let mut back = vec![0u8; 4096];
//!         mem.copy(&mut MemSpanMut::host(&mut back), &MemSpan::of(&buf))?;
//!         assert_eq!(back, vec![7u8; 4096]);
//!     }
//!     Err(e) => eprintln!("no ROCm/DCU device here: {e}"),
//! }
//! # Ok::<(), hmc_core::Error>(())
//! ```
//!
//! # What this crate is for
//!
//! [`RocmMemory`] implements [`hmc_core::Memory`] for one HIP device: `hipMalloc`/`hipFree`
//! allocations ([`RocmBuffer`]), and `hipMemcpy` copies host→device, device→host and
//! device→device (host→host spans are copied directly, without the runtime).
//! [`PinnedHostMemory`] (from [`RocmMemory::pinned`]) allocates page-locked host memory
//! with `hipHostMalloc`, which device staging uses as bounce buffers. [`RocmMemory::export_ipc`]
//! and [`RocmMemory::open_ipc`] share a device allocation with another process on the same
//! host (`hipIpcGetMemHandle`/`hipIpcOpenMemHandle`). [`probe`] lists the devices, for
//! `cargo xtask matrix` and for programs choosing a backend.
//!
//! Not for: kernels, streams or asynchronous copies (HMC moves bytes; compute stays with the
//! application), nor peer-to-peer copies between two HIP devices (copy through the host or
//! use each device's own `RocmMemory`).
//!
//! The memory types are the generic ones of `hmc-backend-runtime` over [`HipApi`]
//! (`TableRuntime<Hip>`: the HIP runtime described as a table and bound by the generic code),
//! under this crate's names.
//!
//! # Loading
//!
//! Nothing from ROCm is needed to build. At run time the runtime is looked up as
//! `$HMC_HIP_LIB` when set, else `libamdhip64.so`, `libamdhip64.so.6`, `libamdhip64.so.5`,
//! `/opt/rocm/lib/libamdhip64.so`, `/opt/dtk/lib/libamdhip64.so` ([`LIBRARY_CANDIDATES`]);
//! versions older than HIP 5.0 are refused. A machine without the library, or without a
//! device, gets [`hmc_core::Error::Unavailable`] naming what was looked for and the variable
//! to set; nothing panics. Every failed runtime call becomes [`hmc_core::Error::Device`]
//! with the library, the function, the `hipError_t` code and the runtime's own
//! `hipGetErrorName`/`hipGetErrorString` text.
//!
//! The HIP "current device" is per thread, so every call that touches device memory
//! (alloc, free, copy, IPC, pinned alloc/free, info) first calls `hipSetDevice` for its own
//! device on the calling thread; buffers remember their device and free themselves in its
//! context.
//!
//! # What is verified, and how
//!
//! - Where a HIP device is present, the `hmc-core` memory conformance kit runs against
//!   [`RocmMemory`] and [`PinnedHostMemory`] (`tests/conformance.rs`).
//! - Where it is not, the tests assert the clean `Unavailable` error.
//! - Everywhere, `tests/abi_shim.rs` builds `tests/shim/hip_shim.c` with the C compiler
//!   and runs the full conformance kit, the context checks, error mapping and a two-process
//!   IPC exchange against it. That shim exports the same symbols over host memory and
//!   checks direction enums and the current device: it is an **ABI shim that checks our
//!   binding layer, not a hardware verification**.
//!
//! # Safety
//!
//! This crate has no `unsafe` of its own. It is a table ([`Hip`]'s `RuntimeTable`: the
//! symbols with their header signatures cited, the codes and enum values), and
//! `hmc-backend-runtime`'s `TableRuntime` resolves and calls it, with its `SAFETY` notes
//! there once for every vendor. [`RocmMemory::open_ipc`] is `unsafe` because the length in a
//! handle received from another process cannot be checked.

#![forbid(unsafe_code)]

mod api;

pub use api::{HIP_IPC_HANDLE_SIZE, Hip, HipApi, LIBRARY_CANDIDATES, LIBRARY_ENV};
pub use hmc_backend_runtime::DeviceInfo;

use hmc_backend_runtime::RuntimeApi;
use hmc_core::Result;

/// One HIP device's allocator and copy engine (`hipMalloc`, `hipMemcpy`, `hipSetDevice`
/// before every call). Cheap to clone. [`RocmMemory::new`] uses the default search,
/// [`RocmMemory::with_library`] a given library.
pub type RocmMemory = hmc_backend_runtime::RuntimeMemory<HipApi>;
/// A `hipMalloc` allocation; freed (`hipFree`, in its device's context) on drop.
pub type RocmBuffer = hmc_backend_runtime::RuntimeBuffer<HipApi>;
/// Page-locked host memory from the HIP runtime (`hipHostMalloc`), for staging bounce
/// buffers; its buffers are host memory.
pub type PinnedHostMemory = hmc_backend_runtime::PinnedHostMemory<HipApi>;
/// A `hipHostMalloc` allocation; freed (`hipHostFree`) on drop.
pub type PinnedHostBuffer = hmc_backend_runtime::PinnedHostBuffer<HipApi>;
/// An exported device allocation: the runtime's 64-byte `hipIpcMemHandle_t` and the
/// allocation's length; [`IpcHandle::to_bytes`] gives its 72-byte wire form.
pub type IpcHandle = hmc_backend_runtime::IpcHandle<HipApi>;
/// Another process's device allocation mapped by [`RocmMemory::open_ipc`]
/// (`hipIpcOpenMemHandle`); unmapped (`hipIpcCloseMemHandle`) on drop.
pub type IpcMapping = hmc_backend_runtime::IpcMapping<HipApi>;

/// The HIP devices of the default runtime (see [`RocmMemory::new`]), or `Unavailable` when
/// the runtime or any device is missing. For `cargo xtask matrix` and backend selection.
pub fn probe() -> Result<Vec<DeviceInfo>> {
    hmc_backend_runtime::all_devices(&HipApi::default_runtime()?)
}

/// Like [`probe`], for the runtime at `library`.
pub fn probe_library(library: impl AsRef<std::path::Path>) -> Result<Vec<DeviceInfo>> {
    hmc_backend_runtime::all_devices(&HipApi::open_library(library.as_ref())?)
}
