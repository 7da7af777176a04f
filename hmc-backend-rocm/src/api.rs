//! The HIP runtime functions this crate uses, resolved from `libamdhip64` at run time, and
//! the mapping of `hipError_t` into [`hmc_core::Error`].
//!
//! Every signature, type and enum value below is taken from the public HIP header
//! `include/hip/hip_runtime_api.h` of ROCm/HIP (also shipped by Hygon's DTK), and is cited
//! beside its declaration. Only the functions HMC needs are declared, once, here.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use hmc_backend_runtime::{CopyDirection, IpcFormat, LibrarySpec, RuntimeApi, c_string};
use hmc_core::{DeviceErrorKind, DeviceKind, Error, Result};

/// The library name used in errors.
const LIBRARY: &str = "libamdhip64";

/// The environment variable naming the library to load instead of the default search.
pub const LIBRARY_ENV: &str = "HMC_HIP_LIB";

/// File names tried, in order, when [`LIBRARY_ENV`] is not set: the unversioned development
/// link, the ROCm 6 and 5 sonames, then the default install prefixes of ROCm and Hygon DTK.
pub const LIBRARY_CANDIDATES: &[&str] = &[
    "libamdhip64.so",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
    "/opt/rocm/lib/libamdhip64.so",
    "/opt/dtk/lib/libamdhip64.so",
];

/// Oldest runtime accepted: HIP 5.0. `hipRuntimeGetVersion` encodes
/// `HIP_VERSION_MAJOR * 10000000 + HIP_VERSION_MINOR * 100000 + HIP_VERSION_PATCH`
/// (hip_runtime_api.h / hip_version.h).
const MIN_RUNTIME_VERSION: c_int = 50_000_000;

/// `typedef enum hipError_t { hipSuccess = 0, ... } hipError_t;` (hip_runtime_api.h): a C
/// enum, passed as `int`.
type HipError = c_int;
/// `hipSuccess = 0` (hip_runtime_api.h, enum hipError_t).
const HIP_SUCCESS: HipError = 0;
/// `hipErrorOutOfMemory` (hip_runtime_api.h): the device is out of memory.
const HIP_ERROR_OUT_OF_MEMORY: HipError = 2;
/// `hipErrorNoDevice = 100` (hip_runtime_api.h, enum hipError_t).
const HIP_ERROR_NO_DEVICE: HipError = 100;

/// `typedef enum hipMemcpyKind` (hip_runtime_api.h): `hipMemcpyHostToHost = 0`,
/// `hipMemcpyHostToDevice = 1`, `hipMemcpyDeviceToHost = 2`, `hipMemcpyDeviceToDevice = 3`,
/// `hipMemcpyDefault = 4` (never used: we always know the direction).
type HipMemcpyKind = c_int;
const HIP_MEMCPY_HOST_TO_DEVICE: HipMemcpyKind = 1;
const HIP_MEMCPY_DEVICE_TO_HOST: HipMemcpyKind = 2;
const HIP_MEMCPY_DEVICE_TO_DEVICE: HipMemcpyKind = 3;

/// `#define hipHostMallocDefault 0x0` (hip_runtime_api.h).
const HIP_HOST_MALLOC_DEFAULT: c_uint = 0;
/// `#define hipIpcMemLazyEnablePeerAccess 0x01` (hip_runtime_api.h).
const HIP_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 1;

/// `#define HIP_IPC_HANDLE_SIZE 64` (hip_runtime_api.h).
pub const HIP_IPC_HANDLE_SIZE: usize = 64;

/// `typedef struct hipIpcMemHandle_st { char reserved[HIP_IPC_HANDLE_SIZE]; }
/// hipIpcMemHandle_t;` (hip_runtime_api.h), passed by value to `hipIpcOpenMemHandle`.
#[repr(C)]
#[derive(Clone, Copy)]
struct HipIpcMemHandle {
    reserved: [c_char; HIP_IPC_HANDLE_SIZE],
}

/// `hipError_t hipRuntimeGetVersion(int* runtimeVersion);`
type RuntimeGetVersionFn = unsafe extern "C" fn(*mut c_int) -> HipError;
/// `hipError_t hipGetDeviceCount(int* count);`
type GetDeviceCountFn = unsafe extern "C" fn(*mut c_int) -> HipError;
/// `hipError_t hipSetDevice(int deviceId);`
type SetDeviceFn = unsafe extern "C" fn(c_int) -> HipError;
/// `hipError_t hipMalloc(void** ptr, size_t size);`
type MallocFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError;
/// `hipError_t hipFree(void* ptr);`
type FreeFn = unsafe extern "C" fn(*mut c_void) -> HipError;
/// `hipError_t hipHostMalloc(void** ptr, size_t size, unsigned int flags);`
type HostMallocFn = unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> HipError;
/// `hipError_t hipHostFree(void* ptr);`
type HostFreeFn = unsafe extern "C" fn(*mut c_void) -> HipError;
/// `hipError_t hipMemcpy(void* dst, const void* src, size_t sizeBytes, hipMemcpyKind kind);`
type MemcpyFn = unsafe extern "C" fn(*mut c_void, *const c_void, usize, HipMemcpyKind) -> HipError;
/// `hipError_t hipMemGetInfo(size_t* free, size_t* total);`
type MemGetInfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> HipError;
/// `hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t* handle, void* devPtr);`
type IpcGetMemHandleFn = unsafe extern "C" fn(*mut HipIpcMemHandle, *mut c_void) -> HipError;
/// `hipError_t hipIpcOpenMemHandle(void** devPtr, hipIpcMemHandle_t handle, unsigned int flags);`
type IpcOpenMemHandleFn =
    unsafe extern "C" fn(*mut *mut c_void, HipIpcMemHandle, c_uint) -> HipError;
/// `hipError_t hipIpcCloseMemHandle(void* devPtr);`
type IpcCloseMemHandleFn = unsafe extern "C" fn(*mut c_void) -> HipError;
/// `hipError_t hipMemGetAddressRange(hipDeviceptr_t* pbase, size_t* psize, hipDeviceptr_t dptr);`
type MemGetAddressRangeFn =
    unsafe extern "C" fn(*mut *mut c_void, *mut usize, *mut c_void) -> HipError;
/// `hipError_t hipDeviceSynchronize(void);`
type DeviceSynchronizeFn = unsafe extern "C" fn() -> HipError;
/// `const char* hipGetErrorName(hipError_t hip_error);`
type GetErrorNameFn = unsafe extern "C" fn(HipError) -> *const c_char;
/// `const char* hipGetErrorString(hipError_t hipError);`
type GetErrorStringFn = unsafe extern "C" fn(HipError) -> *const c_char;

/// What the shared loader needs to know about `libamdhip64`.
const SPEC: LibrarySpec = LibrarySpec {
    library: LIBRARY,
    runtime: "the HIP runtime",
    env: LIBRARY_ENV,
    candidates: LIBRARY_CANDIDATES,
    install: "install ROCm (or Hygon DTK) so that libamdhip64.so is on the loader path",
    missing_symbol: "it is not a HIP runtime HMC supports",
};

/// The resolved HIP runtime, as [`hmc_backend_runtime::RuntimeApi`] for the generic memory
/// types ([`crate::RocmMemory`] is `RuntimeMemory<HipApi>`). The function pointers stay
/// valid while the library is loaded, which is as long as this value lives; everything
/// holding a pointer holds an `Arc` of it.
pub struct HipApi {
    path: PathBuf,
    runtime_version: c_int,
    get_device_count: GetDeviceCountFn,
    set_device: SetDeviceFn,
    malloc: MallocFn,
    free: FreeFn,
    host_malloc: HostMallocFn,
    host_free: HostFreeFn,
    memcpy: MemcpyFn,
    mem_get_info: MemGetInfoFn,
    ipc_get_mem_handle: IpcGetMemHandleFn,
    ipc_open_mem_handle: IpcOpenMemHandleFn,
    ipc_close_mem_handle: IpcCloseMemHandleFn,
    /// Absent from some runtimes; without it memory inside an allocation has no IPC export.
    mem_get_address_range: Option<MemGetAddressRangeFn>,
    device_synchronize: Option<DeviceSynchronizeFn>,
    get_error_name: GetErrorNameFn,
    get_error_string: GetErrorStringFn,
    _library: libloading::Library,
}

impl std::fmt::Debug for HipApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HipApi")
            .field("path", &self.path)
            .field("runtime_version", &self.runtime_version)
            .finish_non_exhaustive()
    }
}

impl HipApi {
    /// Opens the runtime: `explicit` when given, else `$HMC_HIP_LIB`, else the first of
    /// [`LIBRARY_CANDIDATES`] that loads.
    pub(crate) fn open(explicit: Option<&Path>) -> Result<Arc<HipApi>> {
        let (lib, path) = SPEC.load(explicit)?;
        Self::resolve(lib, path).map(Arc::new)
    }

    /// The process-wide runtime for the default search, loaded once on first success.
    pub(crate) fn default_runtime() -> Result<Arc<HipApi>> {
        static DEFAULT: OnceLock<Arc<HipApi>> = OnceLock::new();
        hmc_backend_runtime::default_runtime(&DEFAULT, || Self::open(None))
    }

    fn resolve(lib: libloading::Library, path: PathBuf) -> Result<HipApi> {
        // SAFETY: for all `symbol` calls, each type alias above is the header's signature for
        // the named function, as cited beside the alias.
        let api = unsafe {
            let runtime_get_version: RuntimeGetVersionFn =
                SPEC.symbol(&lib, &path, "hipRuntimeGetVersion")?;
            HipApi {
                get_device_count: SPEC.symbol(&lib, &path, "hipGetDeviceCount")?,
                set_device: SPEC.symbol(&lib, &path, "hipSetDevice")?,
                malloc: SPEC.symbol(&lib, &path, "hipMalloc")?,
                free: SPEC.symbol(&lib, &path, "hipFree")?,
                host_malloc: SPEC.symbol(&lib, &path, "hipHostMalloc")?,
                host_free: SPEC.symbol(&lib, &path, "hipHostFree")?,
                memcpy: SPEC.symbol(&lib, &path, "hipMemcpy")?,
                mem_get_info: SPEC.symbol(&lib, &path, "hipMemGetInfo")?,
                ipc_get_mem_handle: SPEC.symbol(&lib, &path, "hipIpcGetMemHandle")?,
                ipc_open_mem_handle: SPEC.symbol(&lib, &path, "hipIpcOpenMemHandle")?,
                ipc_close_mem_handle: SPEC.symbol(&lib, &path, "hipIpcCloseMemHandle")?,
                mem_get_address_range: LibrarySpec::optional_symbol(&lib, "hipMemGetAddressRange"),
                device_synchronize: LibrarySpec::optional_symbol(&lib, "hipDeviceSynchronize"),
                get_error_name: SPEC.symbol(&lib, &path, "hipGetErrorName")?,
                get_error_string: SPEC.symbol(&lib, &path, "hipGetErrorString")?,
                runtime_version: {
                    let mut v: c_int = 0;
                    let code = runtime_get_version(&mut v);
                    if code != HIP_SUCCESS {
                        return Err(SPEC.unavailable_at(
                            &path,
                            format!("hipRuntimeGetVersion failed with hipError_t {code}"),
                        ));
                    }
                    v
                },
                path,
                _library: lib,
            }
        };
        if api.runtime_version < MIN_RUNTIME_VERSION {
            return Err(SPEC.unavailable_at(
                &api.path,
                format!(
                    "its runtime version {} is older than HIP 5.0 ({MIN_RUNTIME_VERSION})",
                    api.runtime_version
                ),
            ));
        }
        tracing::debug!(path = %api.path.display(), version = api.runtime_version, "loaded the HIP runtime");
        Ok(api)
    }

    /// `Ok` for `hipSuccess`, else an [`Error::Device`] naming the library, `function`, the
    /// code, and the runtime's own name and description of the code.
    fn check(&self, function: &'static str, code: HipError) -> Result<()> {
        if code == HIP_SUCCESS {
            Ok(())
        } else {
            Err(self.error(function, code))
        }
    }

    fn error(&self, function: &'static str, code: HipError) -> Error {
        // SAFETY: both functions accept any hipError_t value and return a pointer to a
        // static NUL-terminated string (or NULL, handled by `c_string`).
        let (name, text) = unsafe {
            (
                c_string((self.get_error_name)(code)),
                c_string((self.get_error_string)(code)),
            )
        };
        let kind = if code == HIP_ERROR_OUT_OF_MEMORY {
            DeviceErrorKind::OutOfMemory
        } else {
            DeviceErrorKind::Other
        };
        Error::Device {
            kind,
            library: LIBRARY,
            function,
            code: code.into(),
            message: format!("{name}: {text}"),
        }
    }
}

impl IpcFormat for HipApi {
    const NAME: &'static str = "HIP";
    const IPC_HANDLE_SIZE: usize = HIP_IPC_HANDLE_SIZE;
    type IpcWire = [u8; HIP_IPC_HANDLE_SIZE + 8];
    const IPC_WIRE_ZERO: Self::IpcWire = [0; HIP_IPC_HANDLE_SIZE + 8];
}

impl RuntimeApi for HipApi {
    const KIND: DeviceKind = DeviceKind::ROCM;
    const MEMORY_TYPE: &'static str = "RocmMemory";
    const ORDINAL_HINT: &'static str = "use an ordinal below the device count (see \
        hmc_backend_rocm::probe), or check HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES";

    fn default_runtime() -> Result<Arc<Self>> {
        HipApi::default_runtime()
    }

    fn open_library(library: &Path) -> Result<Arc<Self>> {
        HipApi::open(Some(library))
    }

    fn path(&self) -> &Path {
        &self.path
    }

    fn runtime_version(&self) -> i32 {
        self.runtime_version
    }

    fn device_count(&self) -> Result<u32> {
        let mut count: c_int = 0;
        // SAFETY: `count` is a valid out-pointer for the call's duration.
        let code = unsafe { (self.get_device_count)(&mut count) };
        if code == HIP_ERROR_NO_DEVICE || (code == HIP_SUCCESS && count <= 0) {
            return Err(SPEC.unavailable(
                "an AMD/Hygon HIP device".into(),
                if code == HIP_SUCCESS {
                    format!("the runtime at {} reports 0 devices", self.path.display())
                } else {
                    format!(
                        "the runtime at {} reports no device: {}",
                        self.path.display(),
                        self.error("hipGetDeviceCount", code)
                    )
                },
            ));
        }
        self.check("hipGetDeviceCount", code)?;
        Ok(count as u32)
    }

    /// `hipSetDevice`: every call that touches device memory is preceded by it, since the
    /// current device is per thread.
    fn set_device(&self, ordinal: u32) -> Result<()> {
        let ordinal = c_int::try_from(ordinal)
            .map_err(|_| Error::InvalidArgument(format!("device ordinal {ordinal} too large")))?;
        // SAFETY: hipSetDevice takes a plain int and has no memory preconditions.
        self.check("hipSetDevice", unsafe { (self.set_device)(ordinal) })
    }

    fn mem_info(&self) -> Result<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both are valid out-pointers for the call's duration.
        let code = unsafe { (self.mem_get_info)(&mut free, &mut total) };
        self.check("hipMemGetInfo", code)?;
        Ok((free as u64, total as u64))
    }

    fn malloc(&self, len: usize) -> Result<*mut c_void> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer for the call's duration.
        let code = unsafe { (self.malloc)(&mut ptr, len) };
        self.check("hipMalloc", code)?;
        Ok(ptr)
    }

    unsafe fn free(&self, ptr: *mut c_void) -> Result<()> {
        // SAFETY: the caller guarantees `ptr` came from hipMalloc and is freed once.
        let code = unsafe { (self.free)(ptr) };
        self.check("hipFree", code)
    }

    fn host_alloc(&self, len: usize) -> Result<*mut c_void> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer; default flags.
        let code = unsafe { (self.host_malloc)(&mut ptr, len, HIP_HOST_MALLOC_DEFAULT) };
        self.check("hipHostMalloc", code)?;
        Ok(ptr)
    }

    unsafe fn host_free(&self, ptr: *mut c_void) -> Result<()> {
        // SAFETY: the caller guarantees `ptr` came from hipHostMalloc and is freed once.
        let code = unsafe { (self.host_free)(ptr) };
        self.check("hipHostFree", code)
    }

    unsafe fn memcpy(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        len: usize,
        dir: CopyDirection,
    ) -> Result<()> {
        let kind = match dir {
            CopyDirection::HostToDevice => HIP_MEMCPY_HOST_TO_DEVICE,
            CopyDirection::DeviceToHost => HIP_MEMCPY_DEVICE_TO_HOST,
            CopyDirection::DeviceToDevice => HIP_MEMCPY_DEVICE_TO_DEVICE,
        };
        // SAFETY: the caller guarantees both pointers are live memory of the kinds `kind`
        // names, `len` bytes each.
        let code = unsafe { (self.memcpy)(dst, src, len, kind) };
        self.check("hipMemcpy", code)
    }

    unsafe fn ipc_get(&self, ptr: *mut c_void, handle: &mut [u8]) -> Result<()> {
        let mut raw = HipIpcMemHandle {
            reserved: [0; HIP_IPC_HANDLE_SIZE],
        };
        // SAFETY: `raw` is a valid out-pointer; the caller guarantees `ptr` is the base of a
        // live hipMalloc allocation of the current device.
        let code = unsafe { (self.ipc_get_mem_handle)(&mut raw, ptr) };
        self.check("hipIpcGetMemHandle", code)?;
        for (b, c) in handle.iter_mut().zip(raw.reserved) {
            *b = c as u8;
        }
        Ok(())
    }

    unsafe fn ipc_open(&self, handle: &[u8]) -> Result<*mut c_void> {
        let mut raw = HipIpcMemHandle {
            reserved: [0; HIP_IPC_HANDLE_SIZE],
        };
        for (c, b) in raw.reserved.iter_mut().zip(handle) {
            *c = *b as c_char;
        }
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer; the handle is passed by value as the
        // header declares; the caller guarantees its origin.
        let code = unsafe {
            (self.ipc_open_mem_handle)(&mut ptr, raw, HIP_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        };
        self.check("hipIpcOpenMemHandle", code)?;
        Ok(ptr)
    }

    unsafe fn address_range(&self, ptr: *const c_void) -> Result<Option<(u64, usize)>> {
        let Some(f) = self.mem_get_address_range else {
            return Ok(None);
        };
        let (mut base, mut len): (*mut c_void, usize) = (std::ptr::null_mut(), 0);
        // SAFETY: both out-pointers are valid; the runtime checks `ptr` and fails for memory
        // it did not allocate.
        let code = unsafe { f(&mut base, &mut len, ptr as *mut c_void) };
        self.check("hipMemGetAddressRange", code)?;
        Ok(Some((base as u64, len)))
    }

    unsafe fn ipc_close(&self, ptr: *mut c_void) -> Result<()> {
        // SAFETY: the caller guarantees `ptr` came from hipIpcOpenMemHandle, closed once.
        let code = unsafe { (self.ipc_close_mem_handle)(ptr) };
        self.check("hipIpcCloseMemHandle", code)
    }

    fn device_synchronize(&self) -> Result<bool> {
        let Some(f) = self.device_synchronize else {
            return Ok(false);
        };
        // SAFETY: no arguments; the runtime waits on the current device.
        let code = unsafe { f() };
        self.check("hipDeviceSynchronize", code)?;
        Ok(true)
    }
}
