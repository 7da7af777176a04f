//! The CNRT functions this crate uses, resolved from `libcnrt` at run time, and the mapping
//! of `cnrtRet_t` into [`hmc_core::Error`].
//!
//! Every signature, type and enum value below is taken from the public header `cnrt.h` of
//! Cambricon's CNToolkit/Neuware (CNRT 5 and later, the generation with `cnrtSetDevice`),
//! and is cited beside its declaration. Only the functions HMC needs are declared, once,
//! here.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use hmc_backend_runtime::{CopyDirection, IpcFormat, LibrarySpec, RuntimeApi, c_string};
use hmc_core::{DeviceErrorKind, DeviceKind, Error, Result};

/// The library name used in errors.
const LIBRARY: &str = "libcnrt";

/// The environment variable naming the library to load instead of the default search.
pub const LIBRARY_ENV: &str = "HMC_CNRT_LIB";

/// File names tried, in order, when [`LIBRARY_ENV`] is not set: the soname CNToolkit
/// installs, then its default install prefix (`NEUWARE_HOME` is usually `/usr/local/neuware`).
pub const LIBRARY_CANDIDATES: &[&str] = &["libcnrt.so", "/usr/local/neuware/lib64/libcnrt.so"];

/// `typedef enum { cnrtSuccess = 0, ... } cnrtRet_t;` (cnrt.h): a C enum, passed as `int`.
type CnrtRet = c_int;
/// `cnrtSuccess = 0` (cnrt.h, cnrtRet_t).
const CNRT_SUCCESS: CnrtRet = 0;
/// `cnrtErrorNoMem` (cnrt.h): the device is out of memory.
const CNRT_ERROR_NO_MEM: CnrtRet = 100_100;
/// `cnrtErrorNoDevice = 100004` (cnrt.h, cnrtRet_t).
const CNRT_ERROR_NO_DEVICE: CnrtRet = 100_004;

/// `typedef enum { cnrtMemcpyHostToDev = 0, cnrtMemcpyDevToDev, cnrtMemcpyDevToHost,
/// cnrtMemcpyHostToHost, cnrtMemcpyPeerToPeer, cnrtMemcpyNoDirection } cnrtMemTransDir_t;`
/// (cnrt.h; the same values as CNRT 4's `CNRT_MEM_TRANS_DIR_HOST2DEV = 0, ...DEV2DEV,
/// ...DEV2HOST`).
type CnrtMemTransDir = c_int;
const CNRT_MEMCPY_HOST_TO_DEV: CnrtMemTransDir = 0;
const CNRT_MEMCPY_DEV_TO_DEV: CnrtMemTransDir = 1;
const CNRT_MEMCPY_DEV_TO_HOST: CnrtMemTransDir = 2;

/// `cnrtMapMemHandle`'s `flags`: "Currently it only supports value 0" (cnrt.h).
const CNRT_MAP_MEM_HANDLE_FLAGS: c_int = 0;

/// `typedef void *cnrtIpcMemHandle;` (cnrt.h: "The IPC memory handle. Pointer to void by
/// default."). Its value is what a peer process needs.
type CnrtIpcMemHandle = *mut c_void;

/// Size of a `cnrtIpcMemHandle` on the wire.
pub const CNRT_IPC_HANDLE_SIZE: usize = std::mem::size_of::<CnrtIpcMemHandle>();

/// `void cnrtGetLibVersion(int *major, int *minor, int *patch);`
type GetLibVersionFn = unsafe extern "C" fn(*mut c_int, *mut c_int, *mut c_int);
/// `cnrtRet_t cnrtGetDeviceCount(unsigned int *pCount);`
type GetDeviceCountFn = unsafe extern "C" fn(*mut c_uint) -> CnrtRet;
/// `cnrtRet_t cnrtSetDevice(int ordinal);`
type SetDeviceFn = unsafe extern "C" fn(c_int) -> CnrtRet;
/// `cnrtRet_t cnrtMalloc(void **pPtr, size_t bytes);`
type MallocFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> CnrtRet;
/// `cnrtRet_t cnrtFree(void *ptr);`
type FreeFn = unsafe extern "C" fn(*mut c_void) -> CnrtRet;
/// `cnrtRet_t cnrtHostMalloc(void **pPtr, size_t bytes);`
type HostMallocFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> CnrtRet;
/// `cnrtRet_t cnrtFreeHost(void *ptr);`
type FreeHostFn = unsafe extern "C" fn(*mut c_void) -> CnrtRet;
/// `cnrtRet_t cnrtMemcpy(void *dst, void *src, size_t bytes, cnrtMemTransDir_t dir);`
/// (`src` is not `const` in the header; CNRT does not write through it.)
type MemcpyFn = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, CnrtMemTransDir) -> CnrtRet;
/// `cnrtRet_t cnrtMemGetInfo(size_t *free, size_t *total);`
type MemGetInfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> CnrtRet;
/// `cnrtRet_t cnrtAcquireMemHandle(cnrtIpcMemHandle *handle, void *ptr);`
type AcquireMemHandleFn = unsafe extern "C" fn(*mut CnrtIpcMemHandle, *mut c_void) -> CnrtRet;
/// `cnrtRet_t cnrtMapMemHandle(void **ptr, cnrtIpcMemHandle handle, int flags);`
type MapMemHandleFn = unsafe extern "C" fn(*mut *mut c_void, CnrtIpcMemHandle, c_int) -> CnrtRet;
/// `cnrtRet_t cnrtUnMapMemHandle(void *ptr);`
type UnMapMemHandleFn = unsafe extern "C" fn(*mut c_void) -> CnrtRet;
/// `const char *cnrtGetErrorStr(cnrtRet_t err_code);`
type GetErrorStrFn = unsafe extern "C" fn(CnrtRet) -> *const c_char;

/// What the shared loader needs to know about `libcnrt`.
const SPEC: LibrarySpec = LibrarySpec {
    library: LIBRARY,
    runtime: "the Cambricon runtime",
    env: LIBRARY_ENV,
    candidates: LIBRARY_CANDIDATES,
    install: "install Cambricon CNToolkit (Neuware) so that libcnrt.so is on the loader path \
              (e.g. add $NEUWARE_HOME/lib64 to LD_LIBRARY_PATH)",
    missing_symbol: "HMC needs CNRT 5 or later (CNToolkit 2 or later)",
};

/// The resolved CNRT runtime, as [`hmc_backend_runtime::RuntimeApi`] for the generic memory
/// types ([`crate::MluMemory`] is `RuntimeMemory<CnrtApi>`). The function pointers stay
/// valid while the library is loaded, which is as long as this value lives; everything
/// holding a pointer holds an `Arc` of it.
pub struct CnrtApi {
    path: PathBuf,
    /// `major * 10000 + minor * 100 + patch` from `cnrtGetLibVersion`.
    runtime_version: c_int,
    get_device_count: GetDeviceCountFn,
    set_device: SetDeviceFn,
    malloc: MallocFn,
    free: FreeFn,
    host_malloc: HostMallocFn,
    free_host: FreeHostFn,
    memcpy: MemcpyFn,
    mem_get_info: MemGetInfoFn,
    acquire_mem_handle: AcquireMemHandleFn,
    map_mem_handle: MapMemHandleFn,
    unmap_mem_handle: UnMapMemHandleFn,
    get_error_str: GetErrorStrFn,
    _library: libloading::Library,
}

impl std::fmt::Debug for CnrtApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CnrtApi")
            .field("path", &self.path)
            .field("runtime_version", &self.runtime_version)
            .finish_non_exhaustive()
    }
}

impl CnrtApi {
    /// Opens the runtime: `explicit` when given, else `$HMC_CNRT_LIB`, else the first of
    /// [`LIBRARY_CANDIDATES`] that loads.
    pub(crate) fn open(explicit: Option<&Path>) -> Result<Arc<CnrtApi>> {
        let (lib, path) = SPEC.load(explicit)?;
        Self::resolve(lib, path).map(Arc::new)
    }

    /// The process-wide runtime for the default search, loaded once on first success.
    pub(crate) fn default_runtime() -> Result<Arc<CnrtApi>> {
        static DEFAULT: OnceLock<Arc<CnrtApi>> = OnceLock::new();
        hmc_backend_runtime::default_runtime(&DEFAULT, || Self::open(None))
    }

    fn resolve(lib: libloading::Library, path: PathBuf) -> Result<CnrtApi> {
        // SAFETY: for all `symbol` calls and the version call, each type alias above is the
        // header's signature for the named function, as cited beside the alias; the version
        // function writes three ints through valid pointers.
        let api = unsafe {
            let get_lib_version: GetLibVersionFn = SPEC.symbol(&lib, &path, "cnrtGetLibVersion")?;
            let (mut major, mut minor, mut patch) = (0, 0, 0);
            get_lib_version(&mut major, &mut minor, &mut patch);
            CnrtApi {
                runtime_version: major * 10_000 + minor * 100 + patch,
                get_device_count: SPEC.symbol(&lib, &path, "cnrtGetDeviceCount")?,
                set_device: SPEC.symbol(&lib, &path, "cnrtSetDevice")?,
                malloc: SPEC.symbol(&lib, &path, "cnrtMalloc")?,
                free: SPEC.symbol(&lib, &path, "cnrtFree")?,
                host_malloc: SPEC.symbol(&lib, &path, "cnrtHostMalloc")?,
                free_host: SPEC.symbol(&lib, &path, "cnrtFreeHost")?,
                memcpy: SPEC.symbol(&lib, &path, "cnrtMemcpy")?,
                mem_get_info: SPEC.symbol(&lib, &path, "cnrtMemGetInfo")?,
                acquire_mem_handle: SPEC.symbol(&lib, &path, "cnrtAcquireMemHandle")?,
                map_mem_handle: SPEC.symbol(&lib, &path, "cnrtMapMemHandle")?,
                unmap_mem_handle: SPEC.symbol(&lib, &path, "cnrtUnMapMemHandle")?,
                get_error_str: SPEC.symbol(&lib, &path, "cnrtGetErrorStr")?,
                path,
                _library: lib,
            }
        };
        tracing::debug!(path = %api.path.display(), version = api.runtime_version, "loaded CNRT");
        Ok(api)
    }

    /// `Ok` for `cnrtSuccess`, else an [`Error::Device`] naming the library, `function`, the
    /// code, and the runtime's own description of the code (`cnrtGetErrorStr`).
    fn check(&self, function: &'static str, code: CnrtRet) -> Result<()> {
        if code == CNRT_SUCCESS {
            Ok(())
        } else {
            Err(self.error(function, code))
        }
    }

    fn error(&self, function: &'static str, code: CnrtRet) -> Error {
        // SAFETY: cnrtGetErrorStr accepts any cnrtRet_t value and returns a pointer to a
        // static NUL-terminated string (or NULL, handled by `c_string`).
        let text = unsafe { c_string((self.get_error_str)(code)) };
        let kind = if code == CNRT_ERROR_NO_MEM {
            DeviceErrorKind::OutOfMemory
        } else {
            DeviceErrorKind::Other
        };
        Error::Device {
            kind,
            library: LIBRARY,
            function,
            code: code.into(),
            message: text,
        }
    }
}

impl IpcFormat for CnrtApi {
    const NAME: &'static str = "MLU";
    const IPC_HANDLE_SIZE: usize = CNRT_IPC_HANDLE_SIZE;
    type IpcWire = [u8; CNRT_IPC_HANDLE_SIZE + 8];
    const IPC_WIRE_ZERO: Self::IpcWire = [0; CNRT_IPC_HANDLE_SIZE + 8];
}

impl RuntimeApi for CnrtApi {
    const KIND: DeviceKind = DeviceKind::MLU;
    const MEMORY_TYPE: &'static str = "MluMemory";
    const ORDINAL_HINT: &'static str = "use an ordinal below the device count (see \
        hmc_backend_mlu::probe), or check MLU_VISIBLE_DEVICES";

    fn default_runtime() -> Result<Arc<Self>> {
        CnrtApi::default_runtime()
    }

    fn open_library(library: &Path) -> Result<Arc<Self>> {
        CnrtApi::open(Some(library))
    }

    fn path(&self) -> &Path {
        &self.path
    }

    fn runtime_version(&self) -> i32 {
        self.runtime_version
    }

    fn device_count(&self) -> Result<u32> {
        let mut count: c_uint = 0;
        // SAFETY: `count` is a valid out-pointer for the call's duration.
        let code = unsafe { (self.get_device_count)(&mut count) };
        if code == CNRT_ERROR_NO_DEVICE || (code == CNRT_SUCCESS && count == 0) {
            return Err(SPEC.unavailable(
                "a Cambricon MLU device".into(),
                if code == CNRT_SUCCESS {
                    format!("the runtime at {} reports 0 devices", self.path.display())
                } else {
                    format!(
                        "the runtime at {} reports no device: {}",
                        self.path.display(),
                        self.error("cnrtGetDeviceCount", code)
                    )
                },
            ));
        }
        self.check("cnrtGetDeviceCount", code)?;
        Ok(count)
    }

    /// `cnrtSetDevice`: every call that touches device memory is preceded by it, since the
    /// current device is per thread.
    fn set_device(&self, ordinal: u32) -> Result<()> {
        let ordinal = c_int::try_from(ordinal)
            .map_err(|_| Error::InvalidArgument(format!("device ordinal {ordinal} too large")))?;
        // SAFETY: cnrtSetDevice takes a plain int and has no memory preconditions.
        self.check("cnrtSetDevice", unsafe { (self.set_device)(ordinal) })
    }

    fn mem_info(&self) -> Result<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both are valid out-pointers for the call's duration.
        let code = unsafe { (self.mem_get_info)(&mut free, &mut total) };
        self.check("cnrtMemGetInfo", code)?;
        Ok((free as u64, total as u64))
    }

    fn malloc(&self, len: usize) -> Result<*mut c_void> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer for the call's duration.
        let code = unsafe { (self.malloc)(&mut ptr, len) };
        self.check("cnrtMalloc", code)?;
        Ok(ptr)
    }

    unsafe fn free(&self, ptr: *mut c_void) -> Result<()> {
        // SAFETY: the caller guarantees `ptr` came from cnrtMalloc and is freed once.
        let code = unsafe { (self.free)(ptr) };
        self.check("cnrtFree", code)
    }

    fn host_alloc(&self, len: usize) -> Result<*mut c_void> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer.
        let code = unsafe { (self.host_malloc)(&mut ptr, len) };
        self.check("cnrtHostMalloc", code)?;
        Ok(ptr)
    }

    unsafe fn host_free(&self, ptr: *mut c_void) -> Result<()> {
        // SAFETY: the caller guarantees `ptr` came from cnrtHostMalloc and is freed once.
        let code = unsafe { (self.free_host)(ptr) };
        self.check("cnrtFreeHost", code)
    }

    unsafe fn memcpy(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        len: usize,
        dir: CopyDirection,
    ) -> Result<()> {
        let kind = match dir {
            CopyDirection::HostToDevice => CNRT_MEMCPY_HOST_TO_DEV,
            CopyDirection::DeviceToHost => CNRT_MEMCPY_DEV_TO_HOST,
            CopyDirection::DeviceToDevice => CNRT_MEMCPY_DEV_TO_DEV,
        };
        // SAFETY: the caller guarantees both pointers are live memory of the kinds `kind`
        // names, `len` bytes each; CNRT does not write through `src` (non-const in the
        // header only).
        let code = unsafe { (self.memcpy)(dst, src as *mut c_void, len, kind) };
        self.check("cnrtMemcpy", code)
    }

    unsafe fn ipc_get(&self, ptr: *mut c_void, handle: &mut [u8]) -> Result<()> {
        let mut raw: CnrtIpcMemHandle = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the caller guarantees `ptr` is the base of a
        // live cnrtMalloc allocation of the current device.
        let code = unsafe { (self.acquire_mem_handle)(&mut raw, ptr) };
        self.check("cnrtAcquireMemHandle", code)?;
        // The handle is a pointer-sized value; it travels big-endian.
        handle.copy_from_slice(&(raw as usize).to_be_bytes());
        Ok(())
    }

    unsafe fn ipc_open(&self, handle: &[u8]) -> Result<*mut c_void> {
        // The handle is a pointer-sized value the exporting process's runtime gave out.
        let mut value = [0u8; CNRT_IPC_HANDLE_SIZE];
        value.copy_from_slice(handle);
        let raw = usize::from_be_bytes(value) as CnrtIpcMemHandle;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer; the handle is passed by value as the header
        // declares; the caller guarantees its origin.
        let code = unsafe { (self.map_mem_handle)(&mut ptr, raw, CNRT_MAP_MEM_HANDLE_FLAGS) };
        self.check("cnrtMapMemHandle", code)?;
        Ok(ptr)
    }

    unsafe fn ipc_close(&self, ptr: *mut c_void) -> Result<()> {
        // SAFETY: the caller guarantees `ptr` came from cnrtMapMemHandle, closed once.
        let code = unsafe { (self.unmap_mem_handle)(ptr) };
        self.check("cnrtUnMapMemHandle", code)
    }
}
