//! Huawei Ascend NPU memory for HMC: device allocations, copies in every direction, pinned
//! host staging buffers and same-host IPC, through ACL (`libascendcl`) opened at run time.
//!
//! # Example
//!
//! Allocate Ascend device memory, copy host bytes in and back. Without CANN (as on the
//! project's CI machines) the constructor answers `Unavailable` with a hint, never panics.
//!
//! ```
//! use hmc_core::{MemSpan, MemSpanMut, Memory};
//! match hmc_backend_ascend::AscendMemory::new(0) {
//!     Ok(mem) => {
//!         let mut buf = mem.alloc(4096)?;
//!         mem.copy(&mut MemSpanMut::of(&mut buf), &MemSpan::host(&[7u8; 4096]))?;
//!         let mut back = vec![0u8; 4096];
//!         mem.copy(&mut MemSpanMut::host(&mut back), &MemSpan::of(&buf))?;
//!         assert_eq!(back, vec![7u8; 4096]);
//!     }
//!     Err(e) => {
//!         assert!(matches!(e, hmc_core::Error::Unavailable { .. }), "{e}");
//!         eprintln!("no Ascend device here: {e}");
//!     }
//! }
//! # Ok::<(), hmc_core::Error>(())
//! ```
//!
//! # What this crate is for
//!
//! [`AscendMemory`] implements [`hmc_core::Memory`] for one Ascend device:
//! `aclrtMalloc`/`aclrtFree` allocations with the `ACL_MEM_MALLOC_HUGE_FIRST` policy
//! ([`AscendBuffer`]), and synchronous `aclrtMemcpy` copies host→device, device→host and
//! device→device (host→host spans are copied directly, without the runtime), each with
//! `destMax` set to the destination span's length. [`PinnedHostMemory`] (from
//! [`AscendMemory::pinned`]) allocates page-locked host memory with `aclrtMallocHost`, which
//! device staging uses as bounce buffers. [`AscendMemory::export_ipc`] and
//! [`AscendMemory::open_ipc`] share a device allocation with another process on the same
//! host through ACL's IPC keys (`aclrtIpcMemGetExportKey` without the process white list,
//! `aclrtIpcMemImportByKey`, `aclrtIpcMemClose`), where the runtime exports them
//! ([`AclApi::supports_ipc`]); elsewhere both are `Unsupported`, saying so. [`probe`] lists
//! the devices.
//!
//! Not for: kernels, streams or asynchronous copies (HMC moves bytes; compute stays with the
//! application), nor copies between two Ascend devices' memories (copy through the host or
//! use each device's own `AscendMemory`).
//!
//! The memory types are the generic ones of `hmc-backend-runtime` over [`AclApi`], this
//! crate's binding of ACL, under this crate's names.
//!
//! # Loading
//!
//! Nothing from CANN is needed to build. At run time ACL is looked up as
//! `$HMC_ASCEND_LIB` when set, else `libascendcl.so` on the loader path, then under the
//! CANN toolkit's default prefixes ([`LIBRARY_CANDIDATES`]); `aclInit(NULL)` runs once per
//! loaded handle (`ACL_ERROR_REPEAT_INITIALIZE`, when the application initialised ACL first,
//! is accepted; HMC never calls `aclFinalize`, which would tear down the application's
//! ACL). A machine without the library, or without a device, gets
//! [`hmc_core::Error::Unavailable`] naming what was looked for, the variable to set and how
//! to install CANN; nothing panics. Every failed runtime call becomes
//! [`hmc_core::Error::Device`] with the library, the function, the `aclError` code and
//! `aclGetRecentErrMsg`'s text; `ACL_ERROR_RT_MEMORY_ALLOCATION` and
//! `ACL_ERROR_BAD_ALLOC` are [`hmc_core::DeviceErrorKind::OutOfMemory`].
//!
//! The ACL current device is per thread, so every call that touches device memory first
//! calls `aclrtSetDevice` for its own device on the calling thread; buffers remember their
//! device and free themselves in its context. ACL reference-counts `aclrtSetDevice` per
//! device; a runtime handle calls `aclrtResetDevice` once per device it bound when it is
//! dropped (the default handle lives as long as the process), so HMC never releases a
//! device context the application still holds.
//!
//! # What is verified, and how
//!
//! - Where an Ascend device is present, the `hmc-core` memory conformance kit runs against
//!   [`AscendMemory`] and [`PinnedHostMemory`] (`tests/conformance.rs`).
//! - Where it is not, the tests assert the clean `Unavailable` error.
//! - Everywhere, `tests/abi_shim.rs` builds `tests/shim/acl_shim.c` with the C compiler
//!   and runs the full conformance kit, the context checks, error mapping, copy kinds and
//!   `destMax`, the allocation policy and a two-process IPC exchange against it. That shim
//!   exports the same symbols over host memory: it is an **ABI shim that checks our
//!   binding layer, not a hardware verification**. No Ascend hardware has run this crate.
//!
//! # Safety
//!
//! `unsafe` is confined to the FFI edge: resolving symbols with the headers' signatures
//! (the `api` module, each cited), and the `unsafe fn`s of its `RuntimeApi` impl, whose
//! contracts `hmc-backend-runtime` states and whose generic types call them only with
//! pointers from live borrows ([`hmc_core::MemSpan`]/[`hmc_core::MemSpanMut`]) or from
//! allocations they own. Buffers free themselves exactly once. [`AscendMemory::open_ipc`] is
//! `unsafe` because the length in a handle received from another process cannot be checked.

mod api;

pub use api::{ACL_IPC_KEY_SIZE, AclApi, LIBRARY_CANDIDATES, LIBRARY_ENV};
pub use hmc_backend_runtime::DeviceInfo;

use hmc_backend_runtime::RuntimeApi;
use hmc_core::Result;

/// One Ascend device's allocator and copy engine (`aclrtMalloc`, `aclrtMemcpy`,
/// `aclrtSetDevice` before every call). Cheap to clone. [`AscendMemory::new`] uses the
/// default search, [`AscendMemory::with_library`] a given library.
pub type AscendMemory = hmc_backend_runtime::RuntimeMemory<AclApi>;
/// An `aclrtMalloc` allocation; freed (`aclrtFree`, in its device's context) on drop.
pub type AscendBuffer = hmc_backend_runtime::RuntimeBuffer<AclApi>;
/// Page-locked host memory from ACL (`aclrtMallocHost`), for staging bounce buffers; its
/// buffers are host memory.
pub type PinnedHostMemory = hmc_backend_runtime::PinnedHostMemory<AclApi>;
/// An `aclrtMallocHost` allocation; freed (`aclrtFreeHost`) on drop.
pub type PinnedHostBuffer = hmc_backend_runtime::PinnedHostBuffer<AclApi>;
/// An exported device allocation: ACL's 65-byte IPC key and the allocation's length;
/// [`IpcHandle::to_bytes`] gives its 73-byte wire form.
pub type IpcHandle = hmc_backend_runtime::IpcHandle<AclApi>;
/// Another process's device allocation mapped by [`AscendMemory::open_ipc`]
/// (`aclrtIpcMemImportByKey`); unmapped (`aclrtIpcMemClose`) on drop.
pub type IpcMapping = hmc_backend_runtime::IpcMapping<AclApi>;

/// The Ascend devices of the default runtime (see [`AscendMemory::new`]), or `Unavailable`
/// when ACL or any device is missing. For `cargo xtask matrix` and backend selection.
pub fn probe() -> Result<Vec<DeviceInfo>> {
    hmc_backend_runtime::all_devices(&AclApi::default_runtime()?)
}

/// Like [`probe`], for the runtime at `library`.
pub fn probe_library(library: impl AsRef<std::path::Path>) -> Result<Vec<DeviceInfo>> {
    hmc_backend_runtime::all_devices(&AclApi::open_library(library.as_ref())?)
}
