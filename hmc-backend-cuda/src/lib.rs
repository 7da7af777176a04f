//! NVIDIA CUDA memory for HMC: device and pinned allocations, synchronous and asynchronous
//! copies, same-host IPC and DMA-BUF export, through the CUDA driver API loaded at run time.
//!
//! # Example
//!
//! Allocate CUDA memory, copy host bytes in and back. Without the vendor runtime (as on
//! the project's CI machines) the constructor answers `Unavailable` with a hint, never panics.
//!
//! ```
//! use hmc_core::{MemSpan, MemSpanMut, Memory};
//! match hmc_backend_cuda::CudaMemory::new(0) {
//!     Ok(mem) => {
//!         let mut buf = mem.alloc(4096)?;
//!         mem.copy(&mut MemSpanMut::of(&mut buf), &MemSpan::host(&[7u8; 4096]))?;
//!         let mut back = vec![0u8; 4096];
//!         mem.copy(&mut MemSpanMut::host(&mut back), &MemSpan::of(&buf))?;
//!         assert_eq!(back, vec![7u8; 4096]);
//!     }
//!     Err(e) => eprintln!("no CUDA device here: {e}"),
//! }
//! # Ok::<(), hmc_core::Error>(())
//! ```
//!
//! # What this crate is for
//!
//! [`CudaMemory`] implements [`hmc_core::Memory`] for one CUDA device: `cuMemAlloc`
//! allocations ([`CudaBuffer`]) and copies host→device, device→host and device→device on a
//! non-blocking stream of that device. [`Memory::copy`](hmc_core::Memory::copy) waits for
//! the copy; [`CudaMemory::copy_async`] returns a [`CopyFuture`] that a host function queued
//! behind the copy (`cuLaunchHostFunc`) wakes, so no thread polls. [`PinnedHostMemory`]
//! (from [`CudaMemory::pinned`]) allocates page-locked host memory with `cuMemHostAlloc`
//! for staging bounce buffers. [`CudaMemory::export_ipc`]/[`CudaMemory::open_ipc`] share a
//! device allocation with another process on the same host (`cuIpcGetMemHandle`/
//! `cuIpcOpenMemHandle`), and [`CudaMemory::export_dmabuf`] exports a device range as a
//! DMA-BUF file descriptor (`cuMemGetHandleForAddressRange`) for GPU-direct registration
//! with a NIC where the driver supports it. [`probe`] lists the devices for
//! `cargo xtask matrix`.
//!
//! The same features are reachable through the [`hmc_core::Memory`] trait
//! (`capabilities`, `copy_async`, `export_dmabuf` of any span, `export_ipc`/`open_ipc`), so
//! a transport or `hmc_core::AnyMemory` uses them without depending on this crate; the
//! inherent methods keep the typed handles and the unboxed [`CopyFuture`].
//!
//! Not for: kernels, modules or graphs (HMC moves bytes; compute stays with the
//! application), nor peer-to-peer copies between two GPUs.
//!
//! # Loading
//!
//! Nothing from CUDA is needed to build: `cudarc` (with `dynamic-loading`) resolves each
//! driver symbol from `libcuda.so`/`libcuda.so.1` on first use. cudarc panics when the
//! library is missing, so every entry point first calls
//! `cudarc::driver::sys::is_culib_present()` and reports
//! [`hmc_core::Error::Unavailable`] instead; the same for a driver older than CUDA 11.4 or
//! a machine without a device. Every failed driver call becomes
//! [`hmc_core::Error::Device`] with the library, the function, the `CUresult` code and the
//! driver's own `cuGetErrorName`/`cuGetErrorString` text.
//!
//! Each [`CudaMemory`] retains its device's primary context, and every call that touches
//! device memory makes that context current on the calling thread first
//! (`cuCtxSetCurrent`), so buffers of several devices can be used from any thread.
//!
//! # What is verified, and how
//!
//! - Where a CUDA device is present, the `hmc-core` memory conformance kit runs against
//!   [`CudaMemory`] and [`PinnedHostMemory`], together with asynchronous copies, cancelled
//!   copies, IPC and DMA-BUF export (`tests/conformance.rs`, `tests/cuda.rs`).
//! - Where it is not, the tests assert the clean `Unavailable` error.
//! - Everywhere, `tests/driver_shim.rs` builds `tests/shim/cuda_shim.c` (cuda.h's symbols
//!   over host memory) and runs this crate's test binary again with it first on
//!   `LD_LIBRARY_PATH` as `libcuda.so`: the conformance kit, per-thread context binding,
//!   the event/host-function plumbing of [`CopyFuture`] (pending until woken, drop waits),
//!   IPC between two processes, DMA-BUF export and error mapping all run through cudarc's
//!   real loader. That is an **ABI shim that checks our binding layer, not a hardware
//!   verification**: this crate has not yet run on a GPU, and no figures from hardware
//!   exist (see `gpu-check.sh` and `examples/cuda_bandwidth.rs` for that run).
//!
//! # Safety
//!
//! `unsafe` is confined to driver calls whose pointer arguments come from live borrows
//! ([`hmc_core::MemSpan`]/[`hmc_core::MemSpanMut`]) or allocations this crate owns; each
//! block says why it is sound. Buffers free themselves exactly once, in their context.
//! Two calls stay `unsafe` for the caller: [`CudaMemory::copy_async`], because leaking its
//! future with `mem::forget` would let the GPU write memory whose borrow has ended (dropping
//! it is fine: the drop waits), and [`CudaMemory::open_ipc`], because the length in a
//! handle from another process cannot be checked.

mod driver;
mod memory;

pub use memory::{
    CopyFuture, CudaBuffer, CudaIpc, CudaMemory, DeviceInfo, IPC_HANDLE_SIZE, IpcHandle,
    IpcMapping, PinnedHostBuffer, PinnedHostMemory,
};

/// The CUDA devices of this machine, or `Unavailable` when the driver or any device is
/// missing (never a panic). For `cargo xtask matrix` and backend selection.
pub fn probe() -> hmc_core::Result<Vec<DeviceInfo>> {
    memory::all_devices()
}
