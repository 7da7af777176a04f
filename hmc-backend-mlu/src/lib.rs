//! Cambricon MLU memory for HMC: device allocations, copies in every direction, pinned
//! host staging buffers and same-host IPC, through CNRT (`libcnrt`) opened at run time.
//!
//! # Example
//!
//! Allocate MLU memory, copy host bytes in and back. Without the vendor runtime (as on
//! the project's CI machines) the constructor answers `Unavailable` with a hint, never panics.
//!
//! ```
//! use hmc_core::{MemSpan, MemSpanMut, Memory};
//! match hmc_backend_mlu::MluMemory::new(0) {
//!     Ok(mem) => {
//!         let mut buf = mem.alloc(4096)?;
//!         mem.copy(&mut MemSpanMut::of(&mut buf), &MemSpan::host(&[7u8; 4096]))?;
//!         let mut back = vec![0u8; 4096];
//!         mem.copy(&mut MemSpanMut::host(&mut back), &MemSpan::of(&buf))?;
//!         assert_eq!(back, vec![7u8; 4096]);
//!     }
//!     Err(e) => eprintln!("no MLU device here: {e}"),
//! }
//! # Ok::<(), hmc_core::Error>(())
//! ```
//!
//! # What this crate is for
//!
//! [`MluMemory`] implements [`hmc_core::Memory`] for one MLU: `cnrtMalloc`/`cnrtFree`
//! allocations ([`MluBuffer`]), and `cnrtMemcpy` copies host→device, device→host and
//! device→device (host→host spans are copied directly, without the runtime).
//! [`PinnedHostMemory`] (from [`MluMemory::pinned`]) allocates page-locked host memory
//! with `cnrtHostMalloc`, which device staging uses as bounce buffers.
//! [`MluMemory::export_ipc`] and [`MluMemory::open_ipc`] share a device allocation with
//! another process on the same host (`cnrtAcquireMemHandle`/`cnrtMapMemHandle`/
//! `cnrtUnMapMemHandle`, CNRT's counterparts of CUDA's IPC calls). [`probe`] lists the
//! devices, for `cargo xtask matrix` and for programs choosing a backend.
//!
//! Not for: kernels, queues or asynchronous copies (HMC moves bytes; compute stays with the
//! application), nor peer-to-peer copies between two MLUs.
//!
//! The memory types are the generic ones of `hmc-backend-runtime` over [`CnrtApi`]
//! (`TableRuntime<Cnrt>`: CNRT described as a table and bound by the generic code),
//! under this crate's names.
//!
//! # Loading
//!
//! Nothing from CNToolkit is needed to build. At run time the runtime is looked up as
//! `$HMC_CNRT_LIB` when set, else `libcnrt.so`, `/usr/local/neuware/lib64/libcnrt.so`
//! ([`LIBRARY_CANDIDATES`]). HMC targets CNRT 5 and later (the generation with
//! `cnrtSetDevice`); an older library lacks symbols and is reported as `Unavailable`
//! naming the missing one. A machine without the library, or without a device, gets
//! [`hmc_core::Error::Unavailable`] naming what was looked for and the variable to set;
//! nothing panics. Every failed runtime call becomes [`hmc_core::Error::Device`] with the
//! library, the function, the `cnrtRet_t` code and the runtime's own `cnrtGetErrorStr` text.
//!
//! The CNRT current device is per thread, so every call that touches device memory
//! (alloc, free, copy, IPC, pinned alloc/free, info) first calls `cnrtSetDevice` for its own
//! device on the calling thread; buffers remember their device and free themselves in its
//! context.
//!
//! # What is verified, and how
//!
//! - Where an MLU is present, the `hmc-core` memory conformance kit runs against
//!   [`MluMemory`] and [`PinnedHostMemory`] (`tests/conformance.rs`).
//! - Where it is not, the tests assert the clean `Unavailable` error.
//! - Everywhere, `tests/abi_shim.rs` builds `tests/shim/cnrt_shim.c` with the C compiler
//!   and runs the full conformance kit, the context checks, error mapping and a two-process
//!   IPC exchange against it. That shim exports the same symbols over host memory and
//!   checks direction enums and the current device: it is an **ABI shim that checks our
//!   binding layer, not a hardware verification**. No MLU has run this crate yet.
//!
//! # Safety
//!
//! This crate has no `unsafe` of its own. It is a table ([`Cnrt`]'s `RuntimeTable`: the
//! symbols with their header signatures cited, the codes and enum values), and
//! `hmc-backend-runtime`'s `TableRuntime` resolves and calls it, with its `SAFETY` notes
//! there once for every vendor. [`MluMemory::open_ipc`] is `unsafe` because the length in a
//! handle received from another process cannot be checked.

#![forbid(unsafe_code)]

mod api;

pub use api::{CNRT_IPC_HANDLE_SIZE, Cnrt, CnrtApi, LIBRARY_CANDIDATES, LIBRARY_ENV};
pub use hmc_backend_runtime::DeviceInfo;

use hmc_backend_runtime::RuntimeApi;
use hmc_core::Result;

/// One Cambricon MLU device's allocator and copy engine (`cnrtMalloc`, `cnrtMemcpy`, `cnrtSetDevice`
/// before every call). Cheap to clone. [`MluMemory::new`] uses the default search,
/// [`MluMemory::with_library`] a given library.
pub type MluMemory = hmc_backend_runtime::RuntimeMemory<CnrtApi>;
/// A `cnrtMalloc` allocation; freed (`cnrtFree`, in its device's context) on drop.
pub type MluBuffer = hmc_backend_runtime::RuntimeBuffer<CnrtApi>;
/// Page-locked host memory from CNRT (`cnrtHostMalloc`), for staging bounce
/// buffers; its buffers are host memory.
pub type PinnedHostMemory = hmc_backend_runtime::PinnedHostMemory<CnrtApi>;
/// A `cnrtHostMalloc` allocation; freed (`cnrtFreeHost`) on drop.
pub type PinnedHostBuffer = hmc_backend_runtime::PinnedHostBuffer<CnrtApi>;
/// An exported device allocation: the runtime's `cnrtIpcMemHandle` (a pointer-sized
/// value, stored big-endian) and the allocation's length; [`IpcHandle::to_bytes`] gives its
/// wire form.
pub type IpcHandle = hmc_backend_runtime::IpcHandle<CnrtApi>;
/// Another process's device allocation mapped by [`MluMemory::open_ipc`]
/// (`cnrtMapMemHandle`); unmapped (`cnrtUnMapMemHandle`) on drop.
pub type IpcMapping = hmc_backend_runtime::IpcMapping<CnrtApi>;

/// The MLU devices of the default runtime (see [`MluMemory::new`]), or `Unavailable` when
/// the runtime or any device is missing. For `cargo xtask matrix` and backend selection.
pub fn probe() -> Result<Vec<DeviceInfo>> {
    hmc_backend_runtime::all_devices(&CnrtApi::default_runtime()?)
}

/// Like [`probe`], for the runtime at `library`.
pub fn probe_library(library: impl AsRef<std::path::Path>) -> Result<Vec<DeviceInfo>> {
    hmc_backend_runtime::all_devices(&CnrtApi::open_library(library.as_ref())?)
}
