//! The MUSA runtime functions this crate uses, resolved from `libmusart` at run time, and
//! the mapping of `musaError_t` into [`hmc_core::Error`].
//!
//! Every signature, type and enum value below is taken from the public headers of the Moore
//! Threads MUSA toolkit, `include/musa_runtime_api.h` and `include/driver_types.h`, and is
//! cited beside its declaration. The MUSA runtime API mirrors the CUDA runtime API name for
//! name (`cudaMalloc` -> `musaMalloc`), including the numeric values of `musaError_t` and
//! `musaMemcpyKind`. Only the functions HMC needs are declared, once, here.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use hmc_backend_runtime::{CopyDirection, IpcFormat, LibrarySpec, RuntimeApi, c_string};
use hmc_core::{DeviceErrorKind, DeviceKind, Error, Result};

/// The library name used in errors.
const LIBRARY: &str = "libmusart";

/// The environment variable naming the library to load instead of the default search.
pub const LIBRARY_ENV: &str = "HMC_MUSA_LIB";

/// File names tried, in order, when [`LIBRARY_ENV`] is not set: the unversioned development
/// link, the sonames of MUSA toolkits 4 to 1, then the toolkit's default install prefix.
pub const LIBRARY_CANDIDATES: &[&str] = &[
    "libmusart.so",
    "libmusart.so.4",
    "libmusart.so.3",
    "libmusart.so.2",
    "libmusart.so.1",
    "/usr/local/musa/lib/libmusart.so",
];

/// Oldest runtime accepted: any that reports a positive version from
/// `musaRuntimeGetVersion(int* runtimeVersion)` (musa_runtime_api.h); the symbols resolved
/// below are what HMC actually depends on.
const MIN_RUNTIME_VERSION: c_int = 1;

/// `typedef enum musaError_t { musaSuccess = 0, ... } musaError_t;` (driver_types.h): a C
/// enum, passed as `int`.
type MusaError = c_int;
/// `musaSuccess = 0` (musa_runtime_api.h, enum musaError_t).
const MUSA_SUCCESS: MusaError = 0;
/// `musaErrorMemoryAllocation` (musa_runtime_api.h): the device is out of memory.
const MUSA_ERROR_MEMORY_ALLOCATION: MusaError = 2;
/// `musaErrorNoDevice = 100` (musa_runtime_api.h, enum musaError_t).
const MUSA_ERROR_NO_DEVICE: MusaError = 100;

/// `typedef enum musaMemcpyKind` (musa_runtime_api.h): `musaMemcpyHostToHost = 0`,
/// `musaMemcpyHostToDevice = 1`, `musaMemcpyDeviceToHost = 2`, `musaMemcpyDeviceToDevice = 3`,
/// `musaMemcpyDefault = 4` (never used: we always know the direction).
type MusaMemcpyKind = c_int;
const MUSA_MEMCPY_HOST_TO_DEVICE: MusaMemcpyKind = 1;
const MUSA_MEMCPY_DEVICE_TO_HOST: MusaMemcpyKind = 2;
const MUSA_MEMCPY_DEVICE_TO_DEVICE: MusaMemcpyKind = 3;

/// `#define musaHostAllocDefault 0x0` (musa_runtime_api.h).
const MUSA_HOST_ALLOC_DEFAULT: c_uint = 0;
/// `#define musaIpcMemLazyEnablePeerAccess 0x01` (musa_runtime_api.h).
const MUSA_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 1;

/// `#define MUSA_IPC_HANDLE_SIZE 64` (musa_runtime_api.h).
pub const MUSA_IPC_HANDLE_SIZE: usize = 64;

/// `typedef struct musaIpcMemHandle_st { char reserved[MUSA_IPC_HANDLE_SIZE]; }
/// musaIpcMemHandle_t;` (musa_runtime_api.h), passed by value to `musaIpcOpenMemHandle`.
#[repr(C)]
#[derive(Clone, Copy)]
struct MusaIpcMemHandle {
    reserved: [c_char; MUSA_IPC_HANDLE_SIZE],
}

/// `musaError_t musaRuntimeGetVersion(int* runtimeVersion);`
type RuntimeGetVersionFn = unsafe extern "C" fn(*mut c_int) -> MusaError;
/// `musaError_t musaGetDeviceCount(int* count);`
type GetDeviceCountFn = unsafe extern "C" fn(*mut c_int) -> MusaError;
/// `musaError_t musaSetDevice(int deviceId);`
type SetDeviceFn = unsafe extern "C" fn(c_int) -> MusaError;
/// `musaError_t musaMalloc(void** ptr, size_t size);`
type MallocFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> MusaError;
/// `musaError_t musaFree(void* ptr);`
type FreeFn = unsafe extern "C" fn(*mut c_void) -> MusaError;
/// `musaError_t musaHostAlloc(void** ptr, size_t size, unsigned int flags);`
type HostMallocFn = unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> MusaError;
/// `musaError_t musaFreeHost(void* ptr);`
type HostFreeFn = unsafe extern "C" fn(*mut c_void) -> MusaError;
/// `musaError_t musaMemcpy(void* dst, const void* src, size_t sizeBytes, musaMemcpyKind kind);`
type MemcpyFn =
    unsafe extern "C" fn(*mut c_void, *const c_void, usize, MusaMemcpyKind) -> MusaError;
/// `musaError_t musaMemGetInfo(size_t* free, size_t* total);`
type MemGetInfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> MusaError;
/// `musaError_t musaIpcGetMemHandle(musaIpcMemHandle_t* handle, void* devPtr);`
type IpcGetMemHandleFn = unsafe extern "C" fn(*mut MusaIpcMemHandle, *mut c_void) -> MusaError;
/// `musaError_t musaIpcOpenMemHandle(void** devPtr, musaIpcMemHandle_t handle, unsigned int flags);`
type IpcOpenMemHandleFn =
    unsafe extern "C" fn(*mut *mut c_void, MusaIpcMemHandle, c_uint) -> MusaError;
/// `musaError_t musaIpcCloseMemHandle(void* devPtr);`
type IpcCloseMemHandleFn = unsafe extern "C" fn(*mut c_void) -> MusaError;
/// `const char* musaGetErrorName(musaError_t error);`
type GetErrorNameFn = unsafe extern "C" fn(MusaError) -> *const c_char;
/// `const char* musaGetErrorString(musaError_t musaError);`
type GetErrorStringFn = unsafe extern "C" fn(MusaError) -> *const c_char;

/// What the shared loader needs to know about `libmusart`.
const SPEC: LibrarySpec = LibrarySpec {
    library: LIBRARY,
    runtime: "the MUSA runtime",
    env: LIBRARY_ENV,
    candidates: LIBRARY_CANDIDATES,
    install: "install the MUSA toolkit so that libmusart.so is on the loader path",
    missing_symbol: "it is not a MUSA runtime HMC supports",
};

/// The resolved MUSA runtime, as [`hmc_backend_runtime::RuntimeApi`] for the generic memory
/// types ([`crate::MusaMemory`] is `RuntimeMemory<MusaApi>`). The function pointers stay
/// valid while the library is loaded, which is as long as this value lives; everything
/// holding a pointer holds an `Arc` of it.
pub struct MusaApi {
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
    get_error_name: GetErrorNameFn,
    get_error_string: GetErrorStringFn,
    _library: libloading::Library,
}

impl std::fmt::Debug for MusaApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MusaApi")
            .field("path", &self.path)
            .field("runtime_version", &self.runtime_version)
            .finish_non_exhaustive()
    }
}

impl MusaApi {
    /// Opens the runtime: `explicit` when given, else `$HMC_MUSA_LIB`, else the first of
    /// [`LIBRARY_CANDIDATES`] that loads.
    pub(crate) fn open(explicit: Option<&Path>) -> Result<Arc<MusaApi>> {
        let (lib, path) = SPEC.load(explicit)?;
        Self::resolve(lib, path).map(Arc::new)
    }

    /// The process-wide runtime for the default search, loaded once on first success.
    pub(crate) fn default_runtime() -> Result<Arc<MusaApi>> {
        static DEFAULT: OnceLock<Arc<MusaApi>> = OnceLock::new();
        hmc_backend_runtime::default_runtime(&DEFAULT, || Self::open(None))
    }

    fn resolve(lib: libloading::Library, path: PathBuf) -> Result<MusaApi> {
        // SAFETY: for all `symbol` calls, each type alias above is the header's signature for
        // the named function, as cited beside the alias.
        let api = unsafe {
            let runtime_get_version: RuntimeGetVersionFn =
                SPEC.symbol(&lib, &path, "musaRuntimeGetVersion")?;
            MusaApi {
                get_device_count: SPEC.symbol(&lib, &path, "musaGetDeviceCount")?,
                set_device: SPEC.symbol(&lib, &path, "musaSetDevice")?,
                malloc: SPEC.symbol(&lib, &path, "musaMalloc")?,
                free: SPEC.symbol(&lib, &path, "musaFree")?,
                host_malloc: SPEC.symbol(&lib, &path, "musaHostAlloc")?,
                host_free: SPEC.symbol(&lib, &path, "musaFreeHost")?,
                memcpy: SPEC.symbol(&lib, &path, "musaMemcpy")?,
                mem_get_info: SPEC.symbol(&lib, &path, "musaMemGetInfo")?,
                ipc_get_mem_handle: SPEC.symbol(&lib, &path, "musaIpcGetMemHandle")?,
                ipc_open_mem_handle: SPEC.symbol(&lib, &path, "musaIpcOpenMemHandle")?,
                ipc_close_mem_handle: SPEC.symbol(&lib, &path, "musaIpcCloseMemHandle")?,
                get_error_name: SPEC.symbol(&lib, &path, "musaGetErrorName")?,
                get_error_string: SPEC.symbol(&lib, &path, "musaGetErrorString")?,
                runtime_version: {
                    let mut v: c_int = 0;
                    let code = runtime_get_version(&mut v);
                    if code != MUSA_SUCCESS {
                        return Err(SPEC.unavailable_at(
                            &path,
                            format!("musaRuntimeGetVersion failed with musaError_t {code}"),
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
                    "it reports runtime version {}, below {MIN_RUNTIME_VERSION}",
                    api.runtime_version
                ),
            ));
        }
        tracing::debug!(path = %api.path.display(), version = api.runtime_version, "loaded the MUSA runtime");
        Ok(api)
    }

    /// `Ok` for `musaSuccess`, else an [`Error::Device`] naming the library, `function`, the
    /// code, and the runtime's own name and description of the code.
    fn check(&self, function: &'static str, code: MusaError) -> Result<()> {
        if code == MUSA_SUCCESS {
            Ok(())
        } else {
            Err(self.error(function, code))
        }
    }

    fn error(&self, function: &'static str, code: MusaError) -> Error {
        // SAFETY: both functions accept any musaError_t value and return a pointer to a
        // static NUL-terminated string (or NULL, handled by `c_string`).
        let (name, text) = unsafe {
            (
                c_string((self.get_error_name)(code)),
                c_string((self.get_error_string)(code)),
            )
        };
        let kind = if code == MUSA_ERROR_MEMORY_ALLOCATION {
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

impl IpcFormat for MusaApi {
    const NAME: &'static str = "MUSA";
    const IPC_HANDLE_SIZE: usize = MUSA_IPC_HANDLE_SIZE;
    type IpcWire = [u8; MUSA_IPC_HANDLE_SIZE + 8];
    const IPC_WIRE_ZERO: Self::IpcWire = [0; MUSA_IPC_HANDLE_SIZE + 8];
}

impl RuntimeApi for MusaApi {
    const KIND: DeviceKind = DeviceKind::MUSA;
    const MEMORY_TYPE: &'static str = "MusaMemory";
    const ORDINAL_HINT: &'static str = "use an ordinal below the device count (see \
        hmc_backend_musa::probe), or check MUSA_VISIBLE_DEVICES";

    fn default_runtime() -> Result<Arc<Self>> {
        MusaApi::default_runtime()
    }

    fn open_library(library: &Path) -> Result<Arc<Self>> {
        MusaApi::open(Some(library))
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
        if code == MUSA_ERROR_NO_DEVICE || (code == MUSA_SUCCESS && count <= 0) {
            return Err(SPEC.unavailable(
                "a Moore Threads MUSA device".into(),
                if code == MUSA_SUCCESS {
                    format!("the runtime at {} reports 0 devices", self.path.display())
                } else {
                    format!(
                        "the runtime at {} reports no device: {}",
                        self.path.display(),
                        self.error("musaGetDeviceCount", code)
                    )
                },
            ));
        }
        self.check("musaGetDeviceCount", code)?;
        Ok(count as u32)
    }

    /// `musaSetDevice`: every call that touches device memory is preceded by it, since the
    /// current device is per thread.
    fn set_device(&self, ordinal: u32) -> Result<()> {
        let ordinal = c_int::try_from(ordinal)
            .map_err(|_| Error::InvalidArgument(format!("device ordinal {ordinal} too large")))?;
        // SAFETY: musaSetDevice takes a plain int and has no memory preconditions.
        self.check("musaSetDevice", unsafe { (self.set_device)(ordinal) })
    }

    fn mem_info(&self) -> Result<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both are valid out-pointers for the call's duration.
        let code = unsafe { (self.mem_get_info)(&mut free, &mut total) };
        self.check("musaMemGetInfo", code)?;
        Ok((free as u64, total as u64))
    }

    fn malloc(&self, len: usize) -> Result<*mut c_void> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer for the call's duration.
        let code = unsafe { (self.malloc)(&mut ptr, len) };
        self.check("musaMalloc", code)?;
        Ok(ptr)
    }

    unsafe fn free(&self, ptr: *mut c_void) -> Result<()> {
        // SAFETY: the caller guarantees `ptr` came from musaMalloc and is freed once.
        let code = unsafe { (self.free)(ptr) };
        self.check("musaFree", code)
    }

    fn host_alloc(&self, len: usize) -> Result<*mut c_void> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer; default flags.
        let code = unsafe { (self.host_malloc)(&mut ptr, len, MUSA_HOST_ALLOC_DEFAULT) };
        self.check("musaHostAlloc", code)?;
        Ok(ptr)
    }

    unsafe fn host_free(&self, ptr: *mut c_void) -> Result<()> {
        // SAFETY: the caller guarantees `ptr` came from musaHostAlloc and is freed once.
        let code = unsafe { (self.host_free)(ptr) };
        self.check("musaFreeHost", code)
    }

    unsafe fn memcpy(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        len: usize,
        dir: CopyDirection,
    ) -> Result<()> {
        let kind = match dir {
            CopyDirection::HostToDevice => MUSA_MEMCPY_HOST_TO_DEVICE,
            CopyDirection::DeviceToHost => MUSA_MEMCPY_DEVICE_TO_HOST,
            CopyDirection::DeviceToDevice => MUSA_MEMCPY_DEVICE_TO_DEVICE,
        };
        // SAFETY: the caller guarantees both pointers are live memory of the kinds `kind`
        // names, `len` bytes each.
        let code = unsafe { (self.memcpy)(dst, src, len, kind) };
        self.check("musaMemcpy", code)
    }

    unsafe fn ipc_get(&self, ptr: *mut c_void, handle: &mut [u8]) -> Result<()> {
        let mut raw = MusaIpcMemHandle {
            reserved: [0; MUSA_IPC_HANDLE_SIZE],
        };
        // SAFETY: `raw` is a valid out-pointer; the caller guarantees `ptr` is the base of a
        // live musaMalloc allocation of the current device.
        let code = unsafe { (self.ipc_get_mem_handle)(&mut raw, ptr) };
        self.check("musaIpcGetMemHandle", code)?;
        for (b, c) in handle.iter_mut().zip(raw.reserved) {
            *b = c as u8;
        }
        Ok(())
    }

    unsafe fn ipc_open(&self, handle: &[u8]) -> Result<*mut c_void> {
        let mut raw = MusaIpcMemHandle {
            reserved: [0; MUSA_IPC_HANDLE_SIZE],
        };
        for (c, b) in raw.reserved.iter_mut().zip(handle) {
            *c = *b as c_char;
        }
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer; the handle is passed by value as the
        // header declares; the caller guarantees its origin.
        let code = unsafe {
            (self.ipc_open_mem_handle)(&mut ptr, raw, MUSA_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        };
        self.check("musaIpcOpenMemHandle", code)?;
        Ok(ptr)
    }

    unsafe fn ipc_close(&self, ptr: *mut c_void) -> Result<()> {
        // SAFETY: the caller guarantees `ptr` came from musaIpcOpenMemHandle, closed once.
        let code = unsafe { (self.ipc_close_mem_handle)(ptr) };
        self.check("musaIpcCloseMemHandle", code)
    }
}
