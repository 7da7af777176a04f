//! `CudaMemory` (device allocations, synchronous and asynchronous copies, IPC, DMA-BUF
//! export) and `PinnedHostMemory` (page-locked host staging buffers).

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::future::Future;
use std::marker::PhantomData;
use std::os::fd::{FromRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use cudarc::driver::sys;
use futures::task::AtomicWaker;
use hmc_core::{
    BoxFuture, Device, DeviceBuffer, DeviceKind, DmaBuf, Error, IpcDescriptor, MemSpan, MemSpanMut,
    Memory, MemoryCapabilities, Region, Result, check_bounds, check_copy,
};

use hmc_backend_runtime::{IpcFormat, max_alloc_error};

use crate::driver::{self, DeviceContext, check};

/// What [`CudaMemory::info`] and [`crate::probe`] report about one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device.
    pub device: Device,
    /// `cuDeviceGetName`.
    pub name: String,
    /// Device memory in bytes (`cuDeviceTotalMem`).
    pub total_bytes: u64,
    /// Free device memory in bytes when asked (`cuMemGetInfo`).
    pub free_bytes: u64,
    /// `cuDriverGetVersion` (`1000 * major + 10 * minor`).
    pub driver_version: i32,
    /// Whether the driver can export device ranges as DMA-BUF file descriptors.
    pub dma_buf: bool,
}

/// One CUDA device's allocator and copy engine. Cheap to clone. Every call first makes the
/// device's primary context current on the calling thread (`cuCtxSetCurrent`); copies run
/// on a non-blocking stream of this device.
#[derive(Clone, Debug)]
pub struct CudaMemory {
    ctx: Arc<DeviceContext>,
}

impl CudaMemory {
    /// CUDA device `ordinal`. `Unavailable` when `libcuda` is missing, too old (< 11.4), or
    /// has no such device; never a panic.
    pub fn new(ordinal: u32) -> Result<Self> {
        Ok(CudaMemory {
            ctx: DeviceContext::open(ordinal)?,
        })
    }

    /// Name, memory and capabilities of the device.
    pub fn info(&self) -> Result<DeviceInfo> {
        self.ctx.bind()?;
        let mut name = [0 as c_char; 256];
        let (mut total, mut free, mut total_now) = (0usize, 0usize, 0usize);
        // SAFETY: valid out-pointers of the stated sizes; the context is current.
        unsafe {
            check(
                "cuDeviceGetName",
                sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as c_int, self.ctx.device),
            )?;
            check(
                "cuDeviceTotalMem",
                sys::cuDeviceTotalMem_v2(&mut total, self.ctx.device),
            )?;
            check(
                "cuMemGetInfo",
                sys::cuMemGetInfo_v2(&mut free, &mut total_now),
            )?;
        }
        // SAFETY: cuDeviceGetName NUL-terminates within the buffer.
        let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        Ok(DeviceInfo {
            device: self.device(),
            name,
            total_bytes: total as u64,
            free_bytes: free as u64,
            driver_version: self.ctx.driver_version,
            dma_buf: self.dma_buf_supported()?,
        })
    }

    /// Waits until the work queued on `stream` has finished: a `CUstream` of this device's
    /// primary context made by another library (PyTorch, CuPy), or one of the driver's
    /// default stream handles (`1` = `CU_STREAM_LEGACY`, `2` = `CU_STREAM_PER_THREAD`, as
    /// `__cuda_array_interface__` and DLPack name them). Copies of this backend run on its
    /// own non-blocking stream, which does not wait for other streams by itself: a caller
    /// that registers memory a producer is still writing synchronises that producer's
    /// stream here first. `0` is taken as the legacy default stream.
    ///
    /// # Safety
    /// `stream` must be 0, 1, 2, or a live stream of this device's primary context.
    pub unsafe fn synchronize_stream(&self, stream: usize) -> Result<()> {
        self.ctx.bind()?;
        let handle = if stream == 0 { 1 } else { stream };
        // SAFETY: a default stream handle or a live stream of this context (the caller's
        // contract); the context is current on this thread.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(handle as sys::CUstream)
        })
    }

    /// The page-locked host allocator of this device's context, for staging bounce buffers.
    pub fn pinned(&self) -> PinnedHostMemory {
        PinnedHostMemory {
            ctx: self.ctx.clone(),
        }
    }

    fn enqueue(&self, dst: &MemSpanMut<'_>, src: &MemSpan<'_>) -> Result<bool> {
        let (d, s) = (dst.region(), src.region());
        let stream = self.ctx.stream;
        // SAFETY: the spans borrow live memory of the kinds the function names (host or this
        // device, checked by check_copy), each `s.len` bytes; the context is current.
        unsafe {
            match (d.device.is_host(), s.device.is_host()) {
                (true, true) => {
                    std::ptr::copy(s.addr as *const u8, d.addr as *mut u8, s.len);
                    return Ok(false);
                }
                (false, true) => check(
                    "cuMemcpyHtoDAsync",
                    sys::cuMemcpyHtoDAsync_v2(d.addr, s.addr as *const c_void, s.len, stream),
                )?,
                (true, false) => check(
                    "cuMemcpyDtoHAsync",
                    sys::cuMemcpyDtoHAsync_v2(d.addr as *mut c_void, s.addr, s.len, stream),
                )?,
                (false, false) => check(
                    "cuMemcpyDtoDAsync",
                    sys::cuMemcpyDtoDAsync_v2(d.addr, s.addr, s.len, stream),
                )?,
            }
        }
        Ok(true)
    }

    /// Starts a copy on this device's stream and returns a future that completes when the
    /// bytes are in `dst` (a host function queued behind the copy wakes it; no thread
    /// polls). Host spans in pinned memory ([`CudaMemory::pinned`]) copy truly
    /// asynchronously; pageable host memory is staged by the driver before this returns.
    ///
    /// Dropping the future before it completes blocks until the copy has finished, so the
    /// spans are never touched after the drop returns.
    ///
    /// # Safety
    /// The future must be polled to completion or dropped; it must not be leaked
    /// (`mem::forget`), since the device would keep writing `dst` after its borrow ends.
    pub unsafe fn copy_async<'a>(
        &'a self,
        dst: &'a mut MemSpanMut<'_>,
        src: &'a MemSpan<'_>,
    ) -> Result<CopyFuture<'a>> {
        check_copy(self.device(), dst, src)?;
        let mut fut = CopyFuture {
            ctx: self.ctx.clone(),
            event: std::ptr::null_mut(),
            state: Arc::new(CopyState {
                done: AtomicBool::new(false),
                waker: AtomicWaker::new(),
            }),
            finished: true,
            _borrow: PhantomData,
        };
        if src.is_empty() {
            return Ok(fut);
        }
        self.ctx.bind()?;
        // SAFETY: valid out-pointer; the context is current.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(
                &mut fut.event,
                sys::CUevent_flags_enum::CU_EVENT_DISABLE_TIMING as c_uint,
            )
        })?;
        fut.finished = false;
        if !self.enqueue(dst, src)? {
            fut.finished = true; // host to host: already done
            return Ok(fut);
        }
        // SAFETY: the event and stream belong to this context.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(fut.event, self.ctx.stream)
        })?;
        let user = Arc::into_raw(fut.state.clone()) as *mut c_void;
        // SAFETY: `on_copy_done` takes back the Arc leaked into `user` exactly once; it makes
        // no CUDA calls, as host functions must not.
        let r = unsafe { sys::cuLaunchHostFunc(self.ctx.stream, Some(on_copy_done), user) };
        if let Err(e) = check("cuLaunchHostFunc", r) {
            // SAFETY: the host function was not queued, so the Arc is still ours.
            drop(unsafe { Arc::from_raw(user as *const CopyState) });
            return Err(e); // dropping `fut` waits for the copy
        }
        Ok(fut)
    }

    /// Exports `buf` for another process on this host (`cuIpcGetMemHandle`). The handle is
    /// valid while `buf` lives.
    pub fn export_ipc(&self, buf: &CudaBuffer) -> Result<IpcHandle> {
        self.own(buf)?;
        if buf.len == 0 {
            return Err(Error::InvalidArgument(
                "a zero-length buffer has no memory to share".into(),
            ));
        }
        self.ctx.bind()?;
        // SAFETY: `buf.ptr` is a live cuMemAlloc base of this context, now bound.
        unsafe { handle_of(buf.ptr, buf.len) }
    }

    /// Exports the allocation holding `region` (found by `cuMemGetAddressRange`) for
    /// another process, naming only `region` in it; [`Memory::open_ipc`] of the
    /// descriptor maps exactly `region`. For memory a framework allocated, where no
    /// [`CudaBuffer`] exists.
    pub fn export_ipc_span(&self, region: Region) -> Result<IpcDescriptor> {
        if region.device != self.device() || region.len == 0 {
            return Err(Error::InvalidArgument(format!(
                "{} cannot export {} bytes on {}; pass non-empty memory of this device",
                self.device(),
                region.len,
                region.device
            )));
        }
        self.ctx.bind()?;
        let (mut base, mut len): (sys::CUdeviceptr, usize) = (0, 0);
        // SAFETY: valid out-pointers; the driver checks `region.addr` itself.
        check("cuMemGetAddressRange", unsafe {
            sys::cuMemGetAddressRange_v2(&mut base, &mut len, region.addr)
        })?;
        let offset = IpcDescriptor::offset_in(region, base, len)?;
        // SAFETY: `base` is the base of the live allocation holding `region`, in this
        // context, bound above.
        let whole = unsafe { handle_of(base, len) }?;
        let bytes = whole.to_bytes().to_vec();
        Ok(IpcDescriptor::of_span(
            DeviceKind::CUDA,
            bytes,
            offset,
            region.len as u64,
        ))
    }

    /// Maps device memory another process exported (`cuIpcOpenMemHandle` with
    /// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`) as a buffer of this device.
    ///
    /// # Safety
    /// `handle` must come from [`CudaMemory::export_ipc`] in another process that keeps
    /// the exported buffer alive while the mapping lives; its length is trusted.
    pub unsafe fn open_ipc(&self, handle: &IpcHandle) -> Result<IpcMapping> {
        let len = usize::try_from(handle.len())
            .map_err(|_| Error::InvalidArgument("IPC handle length too large".into()))?;
        self.ctx.bind()?;
        let mut raw = sys::CUipcMemHandle { reserved: [0; 64] };
        for (c, b) in raw.reserved.iter_mut().zip(handle.handle()) {
            *c = *b as c_char;
        }
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; the handle is passed by value as cuda.h declares.
        check("cuIpcOpenMemHandle", unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut ptr,
                raw,
                sys::CUipcMem_flags_enum::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as c_uint,
            )
        })?;
        Ok(IpcMapping {
            ctx: self.ctx.clone(),
            ptr,
            len,
        })
    }

    /// Whether this device can export ranges as DMA-BUF (driver >= 11.7 and
    /// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`).
    pub fn dma_buf_supported(&self) -> Result<bool> {
        if self.ctx.driver_version < driver::DMA_BUF_MIN_DRIVER {
            return Ok(false);
        }
        let mut v: c_int = 0;
        // SAFETY: valid out-pointer; the attribute exists from 11.7, checked above.
        check("cuDeviceGetAttribute", unsafe {
            sys::cuDeviceGetAttribute(
                &mut v,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
                self.ctx.device,
            )
        })?;
        Ok(v != 0)
    }

    /// Exports `[offset, offset + len)` of `buf` as a DMA-BUF file descriptor
    /// (`cuMemGetHandleForAddressRange` with `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`), for
    /// registering GPU memory with an RDMA NIC. Start and length must be multiples of the
    /// host page size. `Unsupported` where the driver cannot do it.
    pub fn export_dmabuf(&self, buf: &CudaBuffer, offset: usize, len: usize) -> Result<OwnedFd> {
        self.own(buf)?;
        check_bounds("DMA-BUF range", offset as u64, len as u64, buf.len as u64)?;
        self.export_range(buf.ptr + offset as u64, len)
    }

    /// Exports `[start, start + len)` of this device's memory as a DMA-BUF; the range must
    /// be page-aligned and inside one live allocation (the driver checks the latter).
    fn export_range(&self, start: u64, len: usize) -> Result<OwnedFd> {
        let page = page_size();
        if len == 0 || !start.is_multiple_of(page) || !(len as u64).is_multiple_of(page) {
            return Err(Error::InvalidArgument(format!(
                "a DMA-BUF range must be non-empty and start and end on host page boundaries \
                 ({page} bytes); got address {start:#x} length {len}"
            )));
        }
        if !self.dma_buf_supported()? {
            return Err(Error::Unsupported(format!(
                "{}: the driver does not export DMA-BUF (needs driver API >= 11.7 reporting \
                 CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, i.e. the open GPU kernel modules on \
                 Linux >= 5.12); fall back to host staging",
                self.device()
            )));
        }
        self.ctx.bind()?;
        let mut fd: c_int = -1;
        // SAFETY: for DMA_BUF_FD the handle out-parameter is an int; the range is memory of
        // this context (the driver refuses one outside a live allocation).
        check("cuMemGetHandleForAddressRange", unsafe {
            sys::cuMemGetHandleForAddressRange(
                &mut fd as *mut c_int as *mut c_void,
                start,
                len,
                sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        })?;
        // SAFETY: on success the driver returns a new file descriptor we now own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn own(&self, buf: &CudaBuffer) -> Result<()> {
        if Arc::ptr_eq(&buf.ctx, &self.ctx) || buf.ctx.ordinal == self.ctx.ordinal {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "{} cannot act on a buffer of {}; use that device's CudaMemory",
                self.device(),
                buf.region().device
            )))
        }
    }
}

impl Memory for CudaMemory {
    type Buffer = CudaBuffer;

    /// Asynchronous copies, IPC, and DMA-BUF where the driver reports it (a failed query
    /// counts as no).
    fn capabilities(&self) -> MemoryCapabilities {
        let mut caps = MemoryCapabilities::new(self.device(), self.max_alloc());
        caps.async_copy = true;
        caps.ipc = true;
        caps.dma_buf = self.dma_buf_supported().unwrap_or(false);
        caps
    }

    /// [`CudaMemory::copy_async`], boxed. Dropping the future waits for the copy.
    unsafe fn copy_async<'a>(
        &'a self,
        dst: &'a mut MemSpanMut<'_>,
        src: &'a MemSpan<'_>,
    ) -> Result<BoxFuture<'a, Result<()>>> {
        // SAFETY: the caller's promise not to leak the future is passed on unchanged.
        let fut = unsafe { CudaMemory::copy_async(self, dst, src)? };
        Ok(Box::pin(fut))
    }

    /// Exports the host pages around `span` ([`CudaMemory::export_dmabuf`] needs page
    /// boundaries), with `offset` locating `span` inside them. The pages must lie in one
    /// allocation, or the driver refuses.
    fn export_dmabuf(&self, span: &MemSpan<'_>) -> Result<DmaBuf> {
        let r = span.region();
        if r.device != self.device() {
            return Err(Error::InvalidArgument(format!(
                "{} cannot export memory on {}; use that device's CudaMemory",
                self.device(),
                r.device
            )));
        }
        let page = page_size();
        let start = r.addr - r.addr % page;
        let end = (r.addr + r.len as u64)
            .next_multiple_of(page)
            .max(start + page);
        let fd = self.export_range(start, (end - start) as usize)?;
        Ok(DmaBuf::new(fd, r.addr - start, r.len))
    }

    /// [`CudaMemory::export_ipc`]'s handle in its 72-byte wire form.
    /// Page-locked host memory of this device's runtime ([`Self::pinned`]).
    fn pinned_host(&self) -> Option<hmc_core::AnyMemory> {
        Some(hmc_core::AnyMemory::new(self.pinned()))
    }

    fn export_ipc(&self, buf: &CudaBuffer) -> Result<IpcDescriptor> {
        let handle = CudaMemory::export_ipc(self, buf)?;
        Ok(IpcDescriptor::new(
            DeviceKind::CUDA,
            handle.to_bytes().to_vec(),
        ))
    }

    /// [`CudaMemory::export_ipc_span`] of `span`.
    fn export_ipc_span(&self, span: &MemSpan<'_>) -> Result<IpcDescriptor> {
        CudaMemory::export_ipc_span(self, span.region())
    }

    /// [`CudaMemory::open_ipc`] of a descriptor from [`Memory::export_ipc`], or of the
    /// allocation an [`Memory::export_ipc_span`] descriptor names, cut to its span.
    unsafe fn open_ipc(&self, ipc: &IpcDescriptor) -> Result<Box<dyn DeviceBuffer>> {
        ipc.check_kind(DeviceKind::CUDA)?;
        let (whole, span) = ipc.split_span(IPC_HANDLE_SIZE + 8)?;
        let handle = IpcHandle::from_bytes(whole)?;
        // SAFETY: the caller's promise about the handle's origin is passed on unchanged.
        let mapping = Box::new(unsafe { CudaMemory::open_ipc(self, &handle)? });
        hmc_core::IpcSpanMapping::cut(mapping, span)
    }

    fn device(&self) -> Device {
        Device::new(DeviceKind::CUDA, self.ctx.ordinal)
    }

    fn alloc(&self, len: usize) -> Result<CudaBuffer> {
        if len > self.max_alloc() {
            return Err(max_alloc_error(len, self.max_alloc()));
        }
        let mut ptr: sys::CUdeviceptr = 0;
        if len > 0 {
            self.ctx.bind()?;
            // SAFETY: valid out-pointer; the context is current.
            check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut ptr, len) })?;
        }
        Ok(CudaBuffer {
            ctx: self.ctx.clone(),
            ptr,
            len,
        })
    }

    /// Synchronous copy: queued on this device's stream, then `cuStreamSynchronize`, so it
    /// is ordered after earlier [`CudaMemory::copy_async`] calls and returns with the bytes
    /// in `dst`.
    fn copy(&self, dst: &mut MemSpanMut<'_>, src: &MemSpan<'_>) -> Result<()> {
        check_copy(self.device(), dst, src)?;
        if src.is_empty() {
            return Ok(());
        }
        if dst.region().device.is_host() && src.region().device.is_host() {
            self.enqueue(dst, src)?;
            return Ok(());
        }
        self.ctx.bind()?;
        self.enqueue(dst, src)?;
        // SAFETY: the stream belongs to the current context.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.ctx.stream)
        })
    }
}

struct CopyState {
    done: AtomicBool,
    waker: AtomicWaker,
}

/// Host function queued behind an asynchronous copy: marks it done and wakes its future.
///
/// # Safety
/// `user` is an `Arc<CopyState>` leaked by `copy_async`, taken back here exactly once.
unsafe extern "C" fn on_copy_done(user: *mut c_void) {
    // SAFETY: per the contract above.
    let state = unsafe { Arc::from_raw(user as *const CopyState) };
    state.done.store(true, Ordering::Release);
    state.waker.wake();
}

/// An asynchronous copy in flight (see [`CudaMemory::copy_async`]); resolves to `Ok` when
/// the bytes are in the destination, or to the stream's error.
pub struct CopyFuture<'a> {
    ctx: Arc<DeviceContext>,
    event: sys::CUevent,
    state: Arc<CopyState>,
    finished: bool,
    _borrow: PhantomData<&'a mut [u8]>,
}

// SAFETY: the event is a driver handle usable from any thread with the context bound (Drop
// and poll bind it); the borrow marker is Send for the same reason `&mut [u8]` is.
unsafe impl Send for CopyFuture<'_> {}

impl std::fmt::Debug for CopyFuture<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyFuture")
            .field("device", &self.ctx.ordinal)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl Future for CopyFuture<'_> {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        if self.finished {
            return Poll::Ready(Ok(()));
        }
        self.state.waker.register(cx.waker());
        if !self.state.done.load(Ordering::Acquire) {
            return Poll::Pending;
        }
        self.finished = true;
        // The host function ran after the event's work, so a query reports success or the
        // stream's sticky error.
        let r = self.ctx.bind().and_then(|()| {
            // SAFETY: the event was created and recorded in this context.
            check("cuEventQuery", unsafe { sys::cuEventQuery(self.event) })
        });
        Poll::Ready(r)
    }
}

impl Drop for CopyFuture<'_> {
    fn drop(&mut self) {
        if self.event.is_null() {
            return;
        }
        if self.ctx.bind().is_ok() {
            if !self.finished {
                // The copy may still be reading or writing the borrowed spans: wait for the
                // stream, so that nothing touches them once this drop returns.
                // SAFETY: the stream belongs to the bound context.
                if let Err(e) = check("cuStreamSynchronize", unsafe {
                    sys::cuStreamSynchronize(self.ctx.stream)
                }) {
                    tracing::error!(error = %e, "waiting for a cancelled CUDA copy failed");
                }
            }
            // SAFETY: the event was created in this context and is destroyed once.
            let _ = unsafe { sys::cuEventDestroy_v2(self.event) };
        }
    }
}

/// A `cuMemAlloc` allocation; freed (in its context) on drop.
#[derive(Debug)]
pub struct CudaBuffer {
    ctx: Arc<DeviceContext>,
    ptr: sys::CUdeviceptr,
    len: usize,
}

impl DeviceBuffer for CudaBuffer {
    fn region(&self) -> Region {
        Region {
            device: Device::new(DeviceKind::CUDA, self.ctx.ordinal),
            addr: self.ptr,
            len: self.len,
        }
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        let result = self.ctx.bind().and_then(|()| {
            // SAFETY: `ptr` came from cuMemAlloc in this context and is freed once, here;
            // copies that borrowed it have completed (futures wait in their Drop).
            check("cuMemFree", unsafe { sys::cuMemFree_v2(self.ptr) })
        });
        if let Err(e) = result {
            tracing::error!(error = %e, "leaking a CUDA device buffer that could not be freed");
        }
    }
}

/// The IPC handle (`cuIpcGetMemHandle`) of the allocation of `len` bytes at `base`.
///
/// # Safety
/// `base` is the base of a live allocation of the context bound on this thread.
unsafe fn handle_of(base: sys::CUdeviceptr, len: usize) -> Result<IpcHandle> {
    let mut raw = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: valid out-pointer; the caller vouches for `base`.
    check("cuIpcGetMemHandle", unsafe {
        sys::cuIpcGetMemHandle(&mut raw, base)
    })?;
    let mut bytes = [0u8; IPC_HANDLE_SIZE];
    for (b, c) in bytes.iter_mut().zip(raw.reserved) {
        *b = c as u8;
    }
    Ok(IpcHandle::from_parts(&bytes, len as u64))
}

/// Size of `CUipcMemHandle` (`CU_IPC_HANDLE_SIZE` in cuda.h).
pub const IPC_HANDLE_SIZE: usize = 64;

/// The shape of CUDA's IPC handle (`CUipcMemHandle`, [`IPC_HANDLE_SIZE`] bytes), for the
/// wire form shared with the other backends ([`hmc_backend_runtime::IpcHandle`]).
#[derive(Clone, Copy, Debug)]
pub struct CudaIpc;

impl IpcFormat for CudaIpc {
    const NAME: &'static str = "CUDA";
    const IPC_HANDLE_SIZE: usize = IPC_HANDLE_SIZE;
    type IpcWire = [u8; IPC_HANDLE_SIZE + 8];
    const IPC_WIRE_ZERO: Self::IpcWire = [0; IPC_HANDLE_SIZE + 8];
}

/// A portable description of an exported device allocation: the driver's 64-byte
/// `CUipcMemHandle` and the allocation's length; send it to a peer on the same host with
/// [`IpcHandle::to_bytes`] (72 bytes: the handle, then the length as big-endian `u64`).
pub type IpcHandle = hmc_backend_runtime::IpcHandle<CudaIpc>;

/// Device memory of another process mapped by [`CudaMemory::open_ipc`]; unmapped
/// (`cuIpcCloseMemHandle`) on drop.
#[derive(Debug)]
pub struct IpcMapping {
    ctx: Arc<DeviceContext>,
    ptr: sys::CUdeviceptr,
    len: usize,
}

impl DeviceBuffer for IpcMapping {
    fn region(&self) -> Region {
        Region {
            device: Device::new(DeviceKind::CUDA, self.ctx.ordinal),
            addr: self.ptr,
            len: self.len,
        }
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        let result = self.ctx.bind().and_then(|()| {
            // SAFETY: `ptr` came from cuIpcOpenMemHandle and is closed once, here.
            check("cuIpcCloseMemHandle", unsafe {
                sys::cuIpcCloseMemHandle(self.ptr)
            })
        });
        if let Err(e) = result {
            tracing::error!(error = %e, "could not unmap a CUDA IPC mapping");
        }
    }
}

/// Page-locked host memory from the CUDA driver (`cuMemHostAlloc`): host memory the GPU's
/// copy engines reach directly, for staging bounce buffers and truly asynchronous copies.
/// Its buffers are host memory ([`Device::HOST`]).
#[derive(Clone, Debug)]
pub struct PinnedHostMemory {
    ctx: Arc<DeviceContext>,
}

impl Memory for PinnedHostMemory {
    type Buffer = PinnedHostBuffer;

    fn device(&self) -> Device {
        Device::HOST
    }

    fn alloc(&self, len: usize) -> Result<PinnedHostBuffer> {
        if len > self.max_alloc() {
            return Err(max_alloc_error(len, self.max_alloc()));
        }
        let mut ptr: *mut c_void = std::ptr::null_mut();
        if len > 0 {
            self.ctx.bind()?;
            // SAFETY: valid out-pointer; flags 0 (default: pinned, this context).
            check("cuMemHostAlloc", unsafe {
                sys::cuMemHostAlloc(&mut ptr, len, 0)
            })?;
        }
        Ok(PinnedHostBuffer {
            ctx: self.ctx.clone(),
            ptr: ptr as u64,
            len,
        })
    }

    fn copy(&self, dst: &mut MemSpanMut<'_>, src: &MemSpan<'_>) -> Result<()> {
        check_copy(Device::HOST, dst, src)?;
        let (d, s) = (dst.region(), src.region());
        if s.len > 0 {
            // SAFETY: both spans are host memory (checked) of equal length, borrowed for the
            // call; `copy` is memmove.
            unsafe { std::ptr::copy(s.addr as *const u8, d.addr as *mut u8, s.len) };
        }
        Ok(())
    }
}

/// A `cuMemHostAlloc` allocation; freed (`cuMemFreeHost`) on drop.
#[derive(Debug)]
pub struct PinnedHostBuffer {
    ctx: Arc<DeviceContext>,
    ptr: u64,
    len: usize,
}

impl PinnedHostBuffer {
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr` is a live host allocation of `len` bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as above, and `&mut self` makes the slice unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.len) }
    }
}

impl DeviceBuffer for PinnedHostBuffer {
    fn region(&self) -> Region {
        Region {
            device: Device::HOST,
            addr: self.ptr,
            len: self.len,
        }
    }
}

impl Drop for PinnedHostBuffer {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        let result = self.ctx.bind().and_then(|()| {
            // SAFETY: `ptr` came from cuMemHostAlloc and is freed once, here.
            check("cuMemFreeHost", unsafe {
                sys::cuMemFreeHost(self.ptr as *mut c_void)
            })
        });
        if let Err(e) = result {
            tracing::error!(error = %e, "leaking a pinned host buffer that could not be freed");
        }
    }
}

/// The host page size, the granularity of DMA-BUF export.
fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64
}

/// Every device, described (for [`crate::probe`]).
pub(crate) fn all_devices() -> Result<Vec<DeviceInfo>> {
    let count = driver::device_count()?;
    (0..count).map(|i| CudaMemory::new(i)?.info()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipc_handles_round_trip_their_wire_form_and_refuse_other_lengths() {
        assert_eq!(IpcHandle::ENCODED_LEN, IPC_HANDLE_SIZE + 8);
        hmc_testshim::runtime::ipc_wire_form_round_trips_and_refuses_other_lengths::<CudaIpc>();
    }
}
