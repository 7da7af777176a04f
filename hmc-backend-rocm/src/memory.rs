//! `RocmMemory` (device allocations and copies), `PinnedHostMemory` (page-locked host
//! staging buffers) and IPC export/import of device allocations.

use std::ffi::c_void;
use std::path::Path;
use std::sync::Arc;

use hmc_core::{
    Device, DeviceBuffer, DeviceKind, Error, MemSpan, MemSpanMut, Memory, Region, Result,
    check_copy,
};

use crate::api::{self, HipApi, HipIpcMemHandle};

/// What [`RocmMemory::info`] and [`crate::probe`] report about one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device.
    pub device: Device,
    /// Device memory in bytes (`hipMemGetInfo`).
    pub total_bytes: u64,
    /// Free device memory in bytes when asked.
    pub free_bytes: u64,
    /// `hipRuntimeGetVersion` (major * 10^7 + minor * 10^5 + patch).
    pub runtime_version: i32,
}

fn max_alloc_error(len: usize, max: usize) -> Error {
    Error::LimitExceeded {
        limit: "max_alloc",
        value: len as u64,
        max: max as u64,
        hint: "one buffer cannot exceed isize::MAX bytes; split the allocation into several \
               buffers"
            .into(),
    }
}

/// One HIP device's allocator and copy engine. Cheap to clone; every call first makes its
/// device current on the calling thread (`hipSetDevice`).
#[derive(Clone, Debug)]
pub struct RocmMemory {
    api: Arc<HipApi>,
    ordinal: u32,
}

impl RocmMemory {
    /// Device `ordinal` of the runtime found by the default search (`$HMC_HIP_LIB`, then
    /// `libamdhip64.so`, `.so.6`, `.so.5`, the ROCm and DTK prefixes). `Unavailable` when
    /// the runtime or the device is missing.
    pub fn new(ordinal: u32) -> Result<Self> {
        Self::with_api(HipApi::default_runtime()?, ordinal)
    }

    /// Device `ordinal` of the HIP runtime at `library` (a path to `libamdhip64.so` or to a
    /// library exporting the same ABI).
    pub fn with_library(library: impl AsRef<Path>, ordinal: u32) -> Result<Self> {
        Self::with_api(HipApi::open(Some(library.as_ref()))?, ordinal)
    }

    fn with_api(api: Arc<HipApi>, ordinal: u32) -> Result<Self> {
        let count = api.device_count()?;
        if ordinal >= count {
            return Err(Error::Unavailable {
                what: format!("HIP device {ordinal}"),
                reason: format!(
                    "the runtime at {} has {count} device(s)",
                    api.path.display()
                ),
                hint: "use an ordinal below the device count (see hmc_backend_rocm::probe), or \
                       check HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES"
                    .into(),
            });
        }
        api.bind(ordinal)?;
        Ok(RocmMemory { api, ordinal })
    }

    /// The device's memory size and the runtime version.
    pub fn info(&self) -> Result<DeviceInfo> {
        self.api.bind(self.ordinal)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both are valid out-pointers for the call's duration.
        let code = unsafe { (self.api.mem_get_info)(&mut free, &mut total) };
        self.api.check("hipMemGetInfo", code)?;
        Ok(DeviceInfo {
            device: self.device(),
            total_bytes: total as u64,
            free_bytes: free as u64,
            runtime_version: self.api.runtime_version,
        })
    }

    /// The page-locked host allocator of this device's runtime, for staging bounce buffers.
    pub fn pinned(&self) -> PinnedHostMemory {
        PinnedHostMemory {
            api: self.api.clone(),
            ordinal: self.ordinal,
        }
    }

    /// Exports `buf` for another process on this host (`hipIpcGetMemHandle`). The handle is
    /// valid while `buf` lives.
    pub fn export_ipc(&self, buf: &RocmBuffer) -> Result<IpcHandle> {
        if buf.ordinal != self.ordinal || buf.api.path != self.api.path {
            return Err(Error::InvalidArgument(format!(
                "{} cannot export a buffer of {}; use that device's RocmMemory",
                self.device(),
                buf.region().device
            )));
        }
        if buf.len == 0 {
            return Err(Error::InvalidArgument(
                "a zero-length buffer has no memory to share".into(),
            ));
        }
        self.api.bind(self.ordinal)?;
        let mut raw = HipIpcMemHandle {
            reserved: [0; api::HIP_IPC_HANDLE_SIZE],
        };
        // SAFETY: `raw` is a valid out-pointer; `buf.ptr` is the base of a live hipMalloc
        // allocation of this device, made current above.
        let code = unsafe { (self.api.ipc_get_mem_handle)(&mut raw, buf.ptr as *mut c_void) };
        self.api.check("hipIpcGetMemHandle", code)?;
        let mut bytes = [0u8; api::HIP_IPC_HANDLE_SIZE];
        for (b, c) in bytes.iter_mut().zip(raw.reserved) {
            *b = c as u8;
        }
        Ok(IpcHandle {
            raw: bytes,
            len: buf.len as u64,
        })
    }

    /// Maps memory another process exported (`hipIpcOpenMemHandle` with
    /// `hipIpcMemLazyEnablePeerAccess`) as a buffer of this device.
    ///
    /// # Safety
    /// `handle` must come from [`RocmMemory::export_ipc`] in a process that keeps the
    /// exported buffer alive while the mapping lives; its length is trusted.
    pub unsafe fn open_ipc(&self, handle: &IpcHandle) -> Result<IpcMapping> {
        let len = usize::try_from(handle.len)
            .map_err(|_| Error::InvalidArgument("IPC handle length too large".into()))?;
        self.api.bind(self.ordinal)?;
        let mut raw = HipIpcMemHandle {
            reserved: [0; api::HIP_IPC_HANDLE_SIZE],
        };
        for (c, b) in raw.reserved.iter_mut().zip(handle.raw) {
            *c = b as _;
        }
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer; the handle is passed by value as the
        // header declares.
        let code = unsafe {
            (self.api.ipc_open_mem_handle)(&mut ptr, raw, api::HIP_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        };
        self.api.check("hipIpcOpenMemHandle", code)?;
        Ok(IpcMapping {
            api: self.api.clone(),
            ordinal: self.ordinal,
            ptr: ptr as u64,
            len,
        })
    }
}

impl Memory for RocmMemory {
    type Buffer = RocmBuffer;

    fn device(&self) -> Device {
        Device::new(DeviceKind::Rocm, self.ordinal)
    }

    fn alloc(&self, len: usize) -> Result<RocmBuffer> {
        if len > self.max_alloc() {
            return Err(max_alloc_error(len, self.max_alloc()));
        }
        let mut ptr: *mut c_void = std::ptr::null_mut();
        if len > 0 {
            self.api.bind(self.ordinal)?;
            // SAFETY: `ptr` is a valid out-pointer; the device is current on this thread.
            let code = unsafe { (self.api.malloc)(&mut ptr, len) };
            self.api.check("hipMalloc", code)?;
        }
        Ok(RocmBuffer {
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
        let kind = match (d.device.is_host(), s.device.is_host()) {
            (true, true) => {
                // SAFETY: both spans are host memory of equal length (checked), borrowed
                // for the call; `copy` is memmove, so overlap is harmless.
                unsafe { std::ptr::copy(s.addr as *const u8, d.addr as *mut u8, s.len) };
                return Ok(());
            }
            (false, true) => api::HIP_MEMCPY_HOST_TO_DEVICE,
            (true, false) => api::HIP_MEMCPY_DEVICE_TO_HOST,
            (false, false) => api::HIP_MEMCPY_DEVICE_TO_DEVICE,
        };
        self.api.bind(self.ordinal)?;
        // SAFETY: the spans borrow live memory of the kinds `kind` names (host or this
        // device, checked by check_copy), each `s.len` bytes long.
        let code = unsafe {
            (self.api.memcpy)(d.addr as *mut c_void, s.addr as *const c_void, s.len, kind)
        };
        self.api.check("hipMemcpy", code)
    }
}

/// A `hipMalloc` allocation; freed (in its device's context) on drop.
#[derive(Debug)]
pub struct RocmBuffer {
    api: Arc<HipApi>,
    ordinal: u32,
    ptr: u64,
    len: usize,
}

impl DeviceBuffer for RocmBuffer {
    fn region(&self) -> Region {
        Region {
            device: Device::new(DeviceKind::Rocm, self.ordinal),
            addr: self.ptr,
            len: self.len,
        }
    }
}

impl Drop for RocmBuffer {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        let result = self.api.bind(self.ordinal).and_then(|()| {
            // SAFETY: `ptr` came from hipMalloc on this device and is freed once, here.
            let code = unsafe { (self.api.free)(self.ptr as *mut c_void) };
            self.api.check("hipFree", code)
        });
        if let Err(e) = result {
            tracing::error!(error = %e, "leaking a HIP device buffer that could not be freed");
        }
    }
}

/// A device allocation of another process, mapped into this one by
/// [`RocmMemory::open_ipc`]; unmapped (`hipIpcCloseMemHandle`) on drop.
#[derive(Debug)]
pub struct IpcMapping {
    api: Arc<HipApi>,
    ordinal: u32,
    ptr: u64,
    len: usize,
}

impl DeviceBuffer for IpcMapping {
    fn region(&self) -> Region {
        Region {
            device: Device::new(DeviceKind::Rocm, self.ordinal),
            addr: self.ptr,
            len: self.len,
        }
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        let result = self.api.bind(self.ordinal).and_then(|()| {
            // SAFETY: `ptr` came from hipIpcOpenMemHandle and is closed once, here.
            let code = unsafe { (self.api.ipc_close_mem_handle)(self.ptr as *mut c_void) };
            self.api.check("hipIpcCloseMemHandle", code)
        });
        if let Err(e) = result {
            tracing::error!(error = %e, "could not unmap a HIP IPC mapping");
        }
    }
}

/// A portable description of an exported device allocation: the runtime's 64-byte
/// `hipIpcMemHandle_t` and the allocation's length. Send it to a peer on the same host with
/// [`IpcHandle::to_bytes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcHandle {
    raw: [u8; api::HIP_IPC_HANDLE_SIZE],
    len: u64,
}

impl IpcHandle {
    /// Encoded size: the handle, then the length as big-endian `u64`.
    pub const ENCODED_LEN: usize = api::HIP_IPC_HANDLE_SIZE + 8;

    /// Length of the exported allocation in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for a zero-length export (never produced by `export_ipc`).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The wire form.
    pub fn to_bytes(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0u8; Self::ENCODED_LEN];
        out[..api::HIP_IPC_HANDLE_SIZE].copy_from_slice(&self.raw);
        out[api::HIP_IPC_HANDLE_SIZE..].copy_from_slice(&self.len.to_be_bytes());
        out
    }

    /// Parses the wire form.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        if bytes.len() != Self::ENCODED_LEN {
            return Err(Error::InvalidArgument(format!(
                "a HIP IPC handle is {} bytes, got {}",
                Self::ENCODED_LEN,
                bytes.len()
            )));
        }
        let mut raw = [0u8; api::HIP_IPC_HANDLE_SIZE];
        raw.copy_from_slice(&bytes[..api::HIP_IPC_HANDLE_SIZE]);
        let mut len = [0u8; 8];
        len.copy_from_slice(&bytes[api::HIP_IPC_HANDLE_SIZE..]);
        Ok(IpcHandle {
            raw,
            len: u64::from_be_bytes(len),
        })
    }
}

/// Page-locked host memory from the HIP runtime (`hipHostMalloc`): host memory the device's
/// DMA engines reach directly, for staging bounce buffers. Its buffers are host memory
/// ([`Device::HOST`]), so any backend's `copy` accepts them.
#[derive(Clone, Debug)]
pub struct PinnedHostMemory {
    api: Arc<HipApi>,
    ordinal: u32,
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
            self.api.bind(self.ordinal)?;
            // SAFETY: `ptr` is a valid out-pointer; default flags.
            let code =
                unsafe { (self.api.host_malloc)(&mut ptr, len, api::HIP_HOST_MALLOC_DEFAULT) };
            self.api.check("hipHostMalloc", code)?;
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

/// A `hipHostMalloc` allocation; freed (`hipHostFree`) on drop.
#[derive(Debug)]
pub struct PinnedHostBuffer {
    api: Arc<HipApi>,
    ordinal: u32,
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
        let result = self.api.bind(self.ordinal).and_then(|()| {
            // SAFETY: `ptr` came from hipHostMalloc and is freed once, here.
            let code = unsafe { (self.api.host_free)(self.ptr as *mut c_void) };
            self.api.check("hipHostFree", code)
        });
        if let Err(e) = result {
            tracing::error!(error = %e, "leaking a pinned host buffer that could not be freed");
        }
    }
}

/// Every device of `api`, described (for [`crate::probe`]).
pub(crate) fn all_devices(api: &Arc<HipApi>) -> Result<Vec<DeviceInfo>> {
    let count = api.device_count()?;
    (0..count)
        .map(|i| {
            RocmMemory {
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
    fn ipc_handles_round_trip_their_wire_form_and_refuse_other_lengths() {
        let mut bytes = [0u8; IpcHandle::ENCODED_LEN];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = i as u8;
        }
        let h = IpcHandle::from_bytes(&bytes).unwrap();
        assert_eq!(h.to_bytes(), bytes);
        assert_eq!(
            h.len(),
            u64::from_be_bytes(bytes[bytes.len() - 8..].try_into().unwrap())
        );
        for wrong in [0, IpcHandle::ENCODED_LEN - 1, IpcHandle::ENCODED_LEN + 1] {
            let err = IpcHandle::from_bytes(&vec![0u8; wrong]).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
        }
    }

    #[test]
    fn the_allocation_limit_error_names_the_limit_and_what_to_do() {
        let e = max_alloc_error(usize::MAX, isize::MAX as usize);
        let s = e.to_string();
        assert!(s.contains("max_alloc") && s.contains("split"), "{s}");
    }
}
