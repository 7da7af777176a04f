//! [`RuntimeMemory`] (device allocations and copies), [`PinnedHostMemory`] (page-locked host
//! staging buffers) and IPC export/import of device allocations, generic over the vendor's
//! [`RuntimeApi`].

use std::ffi::c_void;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use hmc_core::{
    Device, DeviceBuffer, Error, IpcDescriptor, MemSpan, MemSpanMut, Memory, MemoryCapabilities,
    Region, Result, check_copy,
};

use crate::{CopyDirection, IpcFormat, RuntimeApi};

/// What `info()` and a backend's `probe` report about one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device.
    pub device: Device,
    /// Device memory in bytes (the runtime's `MemGetInfo`).
    pub total_bytes: u64,
    /// Free device memory in bytes when asked.
    pub free_bytes: u64,
    /// The runtime version, as the vendor encodes it (see the backend's crate docs).
    pub runtime_version: i32,
}

/// The `LimitExceeded` error of an allocation larger than [`Memory::max_alloc`], naming the
/// limit and what to do.
pub fn max_alloc_error(len: usize, max: usize) -> Error {
    Error::LimitExceeded {
        limit: "max_alloc",
        value: len as u64,
        max: max as u64,
        hint: "one buffer cannot exceed isize::MAX bytes; split the allocation into several \
               buffers"
            .into(),
    }
}

/// Makes `ordinal` current on this thread, then runs `f`.
fn bound<A: RuntimeApi, T>(api: &A, ordinal: u32, f: impl FnOnce() -> Result<T>) -> Result<T> {
    api.set_device(ordinal)?;
    f()
}

/// One device's allocator and copy engine. Cheap to clone; every call first makes its
/// device current on the calling thread.
pub struct RuntimeMemory<A: RuntimeApi> {
    api: Arc<A>,
    ordinal: u32,
}

impl<A: RuntimeApi> Clone for RuntimeMemory<A> {
    fn clone(&self) -> Self {
        RuntimeMemory {
            api: self.api.clone(),
            ordinal: self.ordinal,
        }
    }
}

impl<A: RuntimeApi> fmt::Debug for RuntimeMemory<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(A::MEMORY_TYPE)
            .field("api", &self.api)
            .field("ordinal", &self.ordinal)
            .finish()
    }
}

impl<A: RuntimeApi> RuntimeMemory<A> {
    /// Device `ordinal` of the runtime found by the vendor's default search (see the
    /// backend's crate docs). `Unavailable` when the runtime or the device is missing.
    pub fn new(ordinal: u32) -> Result<Self> {
        Self::with_api(A::default_runtime()?, ordinal)
    }

    /// Device `ordinal` of the runtime at `library` (a path to the vendor library or to a
    /// library exporting the same ABI).
    pub fn with_library(library: impl AsRef<Path>, ordinal: u32) -> Result<Self> {
        Self::with_api(A::open_library(library.as_ref())?, ordinal)
    }

    /// Device `ordinal` of `api`; `Unavailable` when the runtime has no such device.
    pub fn with_api(api: Arc<A>, ordinal: u32) -> Result<Self> {
        let count = api.device_count()?;
        if ordinal >= count {
            return Err(Error::Unavailable {
                what: format!("{} device {ordinal}", A::NAME),
                reason: format!(
                    "the runtime at {} has {count} device(s)",
                    api.path().display()
                ),
                hint: A::ORDINAL_HINT.into(),
            });
        }
        api.set_device(ordinal)?;
        Ok(RuntimeMemory { api, ordinal })
    }

    /// The device's memory size and the runtime version.
    pub fn info(&self) -> Result<DeviceInfo> {
        let (free, total) = bound(&*self.api, self.ordinal, || self.api.mem_info())?;
        Ok(DeviceInfo {
            device: self.device(),
            total_bytes: total,
            free_bytes: free,
            runtime_version: self.api.runtime_version(),
        })
    }

    /// Waits for the work queued on this device ([`RuntimeApi::device_synchronize`]), so
    /// that copies see what a producer's kernels wrote; `Ok(false)` when the runtime binds
    /// no such call (nothing was waited for).
    pub fn synchronize(&self) -> Result<bool> {
        bound(&*self.api, self.ordinal, || self.api.device_synchronize())
    }

    /// The page-locked host allocator of this device's runtime, for staging bounce buffers.
    pub fn pinned(&self) -> PinnedHostMemory<A> {
        PinnedHostMemory {
            api: self.api.clone(),
            ordinal: self.ordinal,
        }
    }

    /// Exports `buf` for another process on this host. The handle is valid while `buf`
    /// lives.
    pub fn export_ipc(&self, buf: &RuntimeBuffer<A>) -> Result<IpcHandle<A>> {
        if buf.ordinal != self.ordinal || buf.api.path() != self.api.path() {
            return Err(Error::InvalidArgument(format!(
                "{} cannot export a buffer of {}; use that device's {}",
                self.device(),
                buf.region().device,
                A::MEMORY_TYPE
            )));
        }
        if buf.len == 0 {
            return Err(Error::InvalidArgument(
                "a zero-length buffer has no memory to share".into(),
            ));
        }
        bound(&*self.api, self.ordinal, || {
            // SAFETY: `buf.ptr` is the base of a live allocation of this device (checked
            // above), made current by `bound`.
            unsafe { self.handle_of(buf.ptr, buf.len) }
        })
    }

    /// The IPC handle of the allocation of `len` bytes at `base`.
    ///
    /// # Safety
    /// `base` is the base of a live allocation of this device, which is current.
    unsafe fn handle_of(&self, base: u64, len: usize) -> Result<IpcHandle<A>> {
        let mut scratch = A::IPC_WIRE_ZERO;
        let handle = &mut scratch.as_mut()[..A::IPC_HANDLE_SIZE];
        // SAFETY: the caller's contract.
        unsafe { self.api.ipc_get(base as *mut c_void, handle) }?;
        Ok(IpcHandle::from_parts(
            &scratch.as_ref()[..A::IPC_HANDLE_SIZE],
            len as u64,
        ))
    }

    /// Exports the allocation holding `region` (memory of this device, found by the
    /// runtime's address-range query) for another process, naming only `region` in it.
    pub fn export_ipc_span(&self, region: Region) -> Result<IpcDescriptor> {
        if region.device != self.device() || region.len == 0 {
            return Err(Error::InvalidArgument(format!(
                "{} cannot export {} bytes on {}; pass non-empty memory of this device",
                self.device(),
                region.len,
                region.device
            )));
        }
        bound(&*self.api, self.ordinal, || {
            // SAFETY: the device is current (`bound`); the runtime checks the pointer.
            let range = unsafe { self.api.address_range(region.addr as *const c_void) }?;
            let Some((base, len)) = range else {
                return Err(Error::Unsupported(format!(
                    "the {} runtime at {} binds no address-range query, so memory inside an \
                     allocation cannot be exported by IPC; register the whole allocation's \
                     buffer instead (ShmCommunicator::register_device, {}::export_ipc)",
                    A::NAME,
                    self.api.path().display(),
                    A::MEMORY_TYPE
                )));
            };
            let offset = IpcDescriptor::offset_in(region, base, len)?;
            // SAFETY: `base` is the base of the live allocation holding `region`, on the
            // current device.
            let whole = unsafe { self.handle_of(base, len) }?;
            let bytes = whole.to_bytes().as_ref().to_vec();
            Ok(IpcDescriptor::of_span(
                A::KIND,
                bytes,
                offset,
                region.len as u64,
            ))
        })
    }

    /// Maps memory another process exported as a buffer of this device.
    ///
    /// # Safety
    /// `handle` must come from `export_ipc` in a process that keeps the exported buffer
    /// alive while the mapping lives; its length is trusted.
    pub unsafe fn open_ipc(&self, handle: &IpcHandle<A>) -> Result<IpcMapping<A>> {
        let len = usize::try_from(handle.len())
            .map_err(|_| Error::InvalidArgument("IPC handle length too large".into()))?;
        let raw = handle.handle();
        let ptr = bound(&*self.api, self.ordinal, || {
            // SAFETY: the caller guarantees the handle's origin and lifetime; the device is
            // current.
            unsafe { self.api.ipc_open(raw) }
        })?;
        Ok(IpcMapping {
            api: self.api.clone(),
            ordinal: self.ordinal,
            ptr: ptr as u64,
            len,
        })
    }
}

impl<A: RuntimeApi> Memory for RuntimeMemory<A> {
    type Buffer = RuntimeBuffer<A>;

    /// IPC export and mapping; no asynchronous copy or DMA-BUF export (the runtime
    /// table binds neither).
    fn capabilities(&self) -> MemoryCapabilities {
        let mut caps = MemoryCapabilities::new(self.device(), self.max_alloc());
        caps.ipc = self.api.ipc_supported();
        caps
    }

    /// [`RuntimeMemory::export_ipc`]'s handle in its wire form.
    /// Page-locked host memory of this device's runtime ([`Self::pinned`]).
    fn pinned_host(&self) -> Option<hmc_core::AnyMemory> {
        Some(hmc_core::AnyMemory::new(self.pinned()))
    }

    fn export_ipc(&self, buf: &RuntimeBuffer<A>) -> Result<IpcDescriptor> {
        let handle = RuntimeMemory::export_ipc(self, buf)?;
        Ok(IpcDescriptor::new(
            A::KIND,
            handle.to_bytes().as_ref().to_vec(),
        ))
    }

    /// [`RuntimeMemory::export_ipc_span`] of `span`.
    fn export_ipc_span(&self, span: &MemSpan<'_>) -> Result<IpcDescriptor> {
        RuntimeMemory::export_ipc_span(self, span.region())
    }

    /// [`RuntimeMemory::open_ipc`] of a descriptor from [`Memory::export_ipc`], or of the
    /// allocation a [`Memory::export_ipc_span`] descriptor names, cut to its span.
    unsafe fn open_ipc(&self, ipc: &IpcDescriptor) -> Result<Box<dyn DeviceBuffer>> {
        ipc.check_kind(A::KIND)?;
        let (whole, span) = ipc.split_span(A::IPC_WIRE_ZERO.as_ref().len())?;
        let handle = IpcHandle::<A>::from_bytes(whole)?;
        // SAFETY: the caller's promise about the handle's origin is passed on unchanged.
        let mapping = Box::new(unsafe { RuntimeMemory::open_ipc(self, &handle)? });
        hmc_core::IpcSpanMapping::cut(mapping, span)
    }

    fn device(&self) -> Device {
        Device::new(A::KIND, self.ordinal)
    }

    fn alloc(&self, len: usize) -> Result<RuntimeBuffer<A>> {
        if len > self.max_alloc() {
            return Err(max_alloc_error(len, self.max_alloc()));
        }
        let mut ptr: *mut c_void = std::ptr::null_mut();
        if len > 0 {
            ptr = bound(&*self.api, self.ordinal, || self.api.malloc(len))?;
        }
        Ok(RuntimeBuffer {
            api: self.api.clone(),
            ordinal: self.ordinal,
            ptr: ptr as u64,
            len,
        })
    }

    fn copy(&self, dst: &mut MemSpanMut<'_>, src: &MemSpan<'_>) -> Result<()> {
        check_copy(self.device(), dst, src)?;
        if src.is_empty() {
            return Ok(());
        }
        let (d, s) = (dst.region(), src.region());
        let dir = match (d.device.is_host(), s.device.is_host()) {
            (true, true) => {
                // SAFETY: both spans are host memory of equal length (checked), borrowed
                // for the call; `copy` is memmove, so overlap is harmless.
                unsafe { std::ptr::copy(s.addr as *const u8, d.addr as *mut u8, s.len) };
                return Ok(());
            }
            (false, true) => CopyDirection::HostToDevice,
            (true, false) => CopyDirection::DeviceToHost,
            (false, false) => CopyDirection::DeviceToDevice,
        };
        bound(&*self.api, self.ordinal, || {
            // SAFETY: the spans borrow live memory of the kinds `dir` names (host or this
            // device, checked by check_copy), each `s.len` bytes long; the device is current.
            unsafe {
                self.api
                    .memcpy(d.addr as *mut c_void, s.addr as *const c_void, s.len, dir)
            }
        })
    }
}

/// A device allocation of [`RuntimeMemory`]; freed (in its device's context) on drop.
pub struct RuntimeBuffer<A: RuntimeApi> {
    api: Arc<A>,
    ordinal: u32,
    ptr: u64,
    len: usize,
}

impl<A: RuntimeApi> fmt::Debug for RuntimeBuffer<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RuntimeBuffer")
            .field("api", &self.api)
            .field("ordinal", &self.ordinal)
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl<A: RuntimeApi> DeviceBuffer for RuntimeBuffer<A> {
    fn region(&self) -> Region {
        Region {
            device: Device::new(A::KIND, self.ordinal),
            addr: self.ptr,
            len: self.len,
        }
    }
}

impl<A: RuntimeApi> Drop for RuntimeBuffer<A> {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        let result = bound(&*self.api, self.ordinal, || {
            // SAFETY: `ptr` came from `malloc` on this device (current now) and is freed
            // once, here.
            unsafe { self.api.free(self.ptr as *mut c_void) }
        });
        if let Err(e) = result {
            tracing::error!(error = %e, runtime = A::NAME, "leaking a device buffer that could not be freed");
        }
    }
}

/// A device allocation of another process, mapped into this one by
/// [`RuntimeMemory::open_ipc`]; unmapped on drop.
pub struct IpcMapping<A: RuntimeApi> {
    api: Arc<A>,
    ordinal: u32,
    ptr: u64,
    len: usize,
}

impl<A: RuntimeApi> fmt::Debug for IpcMapping<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcMapping")
            .field("api", &self.api)
            .field("ordinal", &self.ordinal)
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl<A: RuntimeApi> DeviceBuffer for IpcMapping<A> {
    fn region(&self) -> Region {
        Region {
            device: Device::new(A::KIND, self.ordinal),
            addr: self.ptr,
            len: self.len,
        }
    }
}

impl<A: RuntimeApi> Drop for IpcMapping<A> {
    fn drop(&mut self) {
        let result = bound(&*self.api, self.ordinal, || {
            // SAFETY: `ptr` came from `ipc_open` on this device (current now) and is closed
            // once, here.
            unsafe { self.api.ipc_close(self.ptr as *mut c_void) }
        });
        if let Err(e) = result {
            tracing::error!(error = %e, runtime = A::NAME, "could not unmap an IPC mapping");
        }
    }
}

/// A portable description of an exported device allocation: the runtime's IPC handle and
/// the allocation's length. Send it to a peer on the same host with [`IpcHandle::to_bytes`].
pub struct IpcHandle<F: IpcFormat> {
    /// The wire form: the handle, then the length as big-endian `u64`.
    wire: F::IpcWire,
}

impl<F: IpcFormat> Clone for IpcHandle<F> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<F: IpcFormat> Copy for IpcHandle<F> {}

impl<F: IpcFormat> PartialEq for IpcHandle<F> {
    fn eq(&self, other: &Self) -> bool {
        self.wire == other.wire
    }
}

impl<F: IpcFormat> Eq for IpcHandle<F> {}

impl<F: IpcFormat> fmt::Debug for IpcHandle<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcHandle")
            .field("raw", &&self.wire.as_ref()[..Self::handle_size()])
            .field("len", &self.len())
            .finish()
    }
}

impl<F: IpcFormat> IpcHandle<F> {
    /// Encoded size: the handle, then the length as big-endian `u64`.
    pub const ENCODED_LEN: usize = std::mem::size_of::<F::IpcWire>();

    /// The vendor handle's size; checks at compile time that the wire form is the handle
    /// plus 8 bytes.
    const fn handle_size() -> usize {
        const {
            assert!(
                std::mem::size_of::<F::IpcWire>() == F::IPC_HANDLE_SIZE + 8,
                "RuntimeApi::IpcWire must be [u8; IPC_HANDLE_SIZE + 8]"
            );
        }
        F::IPC_HANDLE_SIZE
    }

    /// A handle from the vendor's `handle` bytes ([`IpcFormat::IPC_HANDLE_SIZE`] of them)
    /// and the allocation's length.
    ///
    /// # Panics
    /// If `handle` is not [`IpcFormat::IPC_HANDLE_SIZE`] bytes long.
    pub fn from_parts(handle: &[u8], len: u64) -> Self {
        let size = Self::handle_size();
        assert_eq!(
            handle.len(),
            size,
            "a {} IPC handle is {size} bytes",
            F::NAME
        );
        let mut wire = F::IPC_WIRE_ZERO;
        wire.as_mut()[..size].copy_from_slice(handle);
        wire.as_mut()[size..].copy_from_slice(&len.to_be_bytes());
        IpcHandle { wire }
    }

    /// The vendor's handle bytes.
    pub fn handle(&self) -> &[u8] {
        &self.wire.as_ref()[..Self::handle_size()]
    }

    /// Length of the exported allocation in bytes.
    pub fn len(&self) -> u64 {
        let mut len = [0u8; 8];
        len.copy_from_slice(&self.wire.as_ref()[Self::handle_size()..]);
        u64::from_be_bytes(len)
    }

    /// True for a zero-length export (never produced by `export_ipc`).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The wire form.
    pub fn to_bytes(&self) -> F::IpcWire {
        self.wire
    }

    /// Parses the wire form.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        if bytes.len() != Self::ENCODED_LEN {
            return Err(Error::InvalidArgument(format!(
                "an IPC handle of {} is {} bytes, got {}",
                F::NAME,
                Self::ENCODED_LEN,
                bytes.len()
            )));
        }
        let mut wire = F::IPC_WIRE_ZERO;
        wire.as_mut().copy_from_slice(bytes);
        Ok(IpcHandle { wire })
    }
}

/// Page-locked host memory from the vendor runtime: host memory the device's DMA engines
/// reach directly, for staging bounce buffers. Its buffers are host memory
/// ([`Device::HOST`]), so any backend's `copy` accepts them.
pub struct PinnedHostMemory<A: RuntimeApi> {
    api: Arc<A>,
    ordinal: u32,
}

impl<A: RuntimeApi> Clone for PinnedHostMemory<A> {
    fn clone(&self) -> Self {
        PinnedHostMemory {
            api: self.api.clone(),
            ordinal: self.ordinal,
        }
    }
}

impl<A: RuntimeApi> fmt::Debug for PinnedHostMemory<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedHostMemory")
            .field("api", &self.api)
            .field("ordinal", &self.ordinal)
            .finish()
    }
}

impl<A: RuntimeApi> Memory for PinnedHostMemory<A> {
    type Buffer = PinnedHostBuffer<A>;

    fn device(&self) -> Device {
        Device::HOST
    }

    fn alloc(&self, len: usize) -> Result<PinnedHostBuffer<A>> {
        if len > self.max_alloc() {
            return Err(max_alloc_error(len, self.max_alloc()));
        }
        let mut ptr: *mut c_void = std::ptr::null_mut();
        if len > 0 {
            ptr = bound(&*self.api, self.ordinal, || self.api.host_alloc(len))?;
        }
        Ok(PinnedHostBuffer {
            api: self.api.clone(),
            ordinal: self.ordinal,
            ptr: ptr as u64,
            len,
        })
    }

    fn copy(&self, dst: &mut MemSpanMut<'_>, src: &MemSpan<'_>) -> Result<()> {
        check_copy(Device::HOST, dst, src)?;
        let (d, s) = (dst.region(), src.region());
        if s.len > 0 {
            // SAFETY: both spans are host memory (checked) of equal length, borrowed for
            // the call; `copy` is memmove.
            unsafe { std::ptr::copy(s.addr as *const u8, d.addr as *mut u8, s.len) };
        }
        Ok(())
    }
}

/// A page-locked host allocation of [`PinnedHostMemory`]; freed on drop.
pub struct PinnedHostBuffer<A: RuntimeApi> {
    api: Arc<A>,
    ordinal: u32,
    ptr: u64,
    len: usize,
}

impl<A: RuntimeApi> fmt::Debug for PinnedHostBuffer<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedHostBuffer")
            .field("api", &self.api)
            .field("ordinal", &self.ordinal)
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl<A: RuntimeApi> PinnedHostBuffer<A> {
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

impl<A: RuntimeApi> DeviceBuffer for PinnedHostBuffer<A> {
    fn region(&self) -> Region {
        Region {
            device: Device::HOST,
            addr: self.ptr,
            len: self.len,
        }
    }
}

impl<A: RuntimeApi> Drop for PinnedHostBuffer<A> {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        let result = bound(&*self.api, self.ordinal, || {
            // SAFETY: `ptr` came from `host_alloc` and is freed once, here.
            unsafe { self.api.host_free(self.ptr as *mut c_void) }
        });
        if let Err(e) = result {
            tracing::error!(error = %e, runtime = A::NAME, "leaking a pinned host buffer that could not be freed");
        }
    }
}

/// Every device of `api`, described (for a backend's `probe`).
pub fn all_devices<A: RuntimeApi>(api: &Arc<A>) -> Result<Vec<DeviceInfo>> {
    let count = api.device_count()?;
    (0..count)
        .map(|i| {
            RuntimeMemory {
                api: api.clone(),
                ordinal: i,
            }
            .info()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allocation_limit_error_names_the_limit_and_what_to_do() {
        let e = max_alloc_error(usize::MAX, isize::MAX as usize);
        let s = e.to_string();
        assert!(s.contains("max_alloc") && s.contains("split"), "{s}");
    }
}
