//! The ACL runtime functions this crate uses, resolved from `libascendcl` at run time, and
//! the mapping of `aclError` into [`hmc_core::Error`].
//!
//! Every signature, type and value below is taken from CANN's public headers
//! `include/external/acl/acl_rt.h`, `acl_base_rt.h` and `error_codes/rt_error_codes.h`
//! (as published in the `hicann/runtime` repository) and the CANN application development
//! API reference (`aclrtMemcpy`, `aclrtMemcpyKind`, `aclrtIpcMemGetExportKey`), cited beside
//! each declaration. Only the functions HMC needs are declared, once, here.

use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use hmc_backend_runtime::{CopyDirection, IpcFormat, LibrarySpec, RuntimeApi, c_string};
use hmc_core::{DeviceErrorKind, DeviceKind, Error, Result};

/// The library name used in errors.
const LIBRARY: &str = "libascendcl";

/// The environment variable naming the library to load instead of the default search.
pub const LIBRARY_ENV: &str = "HMC_ASCEND_LIB";

/// File names tried, in order, when [`LIBRARY_ENV`] is not set: the loader path (CANN's
/// `set_env.sh` puts its `lib64` there), then the default install prefixes of the CANN
/// toolkit (root and per-user installs are both `ascend-toolkit/latest`).
pub const LIBRARY_CANDIDATES: &[&str] = &[
    "libascendcl.so",
    "/usr/local/Ascend/ascend-toolkit/latest/lib64/libascendcl.so",
    "/usr/local/Ascend/latest/lib64/libascendcl.so",
];

/// `typedef int aclError;` (acl_base_rt.h).
type AclError = i32;
/// `static const int ACL_SUCCESS = 0;` (acl_base_rt.h).
const ACL_SUCCESS: AclError = 0;
/// `static const int ACL_ERROR_REPEAT_INITIALIZE = 100002;` (acl_base_rt.h): `aclInit`
/// called again in a process that already initialised ACL (the application, or another
/// runtime handle of ours). Not an error for us.
const ACL_ERROR_REPEAT_INITIALIZE: AclError = 100_002;
/// `static const int ACL_ERROR_BAD_ALLOC = 200000;` (acl_base_rt.h).
const ACL_ERROR_BAD_ALLOC: AclError = 200_000;
/// `#define ACL_ERROR_RT_MEMORY_ALLOCATION 207001 // memory allocation error, only used by
/// out of memory` (rt_error_codes.h).
const ACL_ERROR_RT_MEMORY_ALLOCATION: AclError = 207_001;
/// `#define ACL_ERROR_RT_NO_DEVICE 207004 // no device` (rt_error_codes.h).
const ACL_ERROR_RT_NO_DEVICE: AclError = 207_004;

/// `typedef enum aclrtMemcpyKind { ACL_MEMCPY_HOST_TO_HOST, ACL_MEMCPY_HOST_TO_DEVICE,
/// ACL_MEMCPY_DEVICE_TO_HOST, ACL_MEMCPY_DEVICE_TO_DEVICE, ... }` (acl_rt.h; the CANN API
/// reference's `aclrtMemcpy` and `aclrtMemcpyKind` pages): 0, 1, 2, 3. Host→host never
/// reaches the runtime (`hmc-backend-runtime` copies it directly).
type AclrtMemcpyKind = i32;
const ACL_MEMCPY_HOST_TO_DEVICE: AclrtMemcpyKind = 1;
const ACL_MEMCPY_DEVICE_TO_HOST: AclrtMemcpyKind = 2;
const ACL_MEMCPY_DEVICE_TO_DEVICE: AclrtMemcpyKind = 3;

/// `typedef enum aclrtMemMallocPolicy { ACL_MEM_MALLOC_HUGE_FIRST, ... }` (acl_rt.h):
/// huge pages first, falling back to normal pages.
type AclrtMemMallocPolicy = i32;
const ACL_MEM_MALLOC_HUGE_FIRST: AclrtMemMallocPolicy = 0;

/// `typedef enum aclrtMemAttr { ACL_DDR_MEM, ACL_HBM_MEM, ... }` (acl_rt.h): the device's
/// HBM, as `aclrtGetMemInfo` reports it.
type AclrtMemAttr = i32;
const ACL_HBM_MEM: AclrtMemAttr = 1;

/// `#define ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION 0x1UL` (acl_rt.h): no
/// process white list, so no `aclrtIpcMemSetImportPid` round trip before the peer imports.
const ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION: u64 = 1;
/// `#define ACL_RT_IPC_MEM_IMPORT_FLAG_DEFAULT 0x0UL` (acl_rt.h).
const ACL_RT_IPC_MEM_IMPORT_FLAG_DEFAULT: u64 = 0;

/// The length of an IPC key: `aclrtIpcMemGetExportKey`'s `len` "fixed at 65" (CANN API
/// reference), a NUL-terminated string.
pub const ACL_IPC_KEY_SIZE: usize = 65;

/// `aclError aclInit(const char *configPath);`
type InitFn = unsafe extern "C" fn(*const c_char) -> AclError;
/// `aclError aclrtGetVersion(int32_t *majorVersion, int32_t *minorVersion, int32_t *patchVersion);`
type GetVersionFn = unsafe extern "C" fn(*mut i32, *mut i32, *mut i32) -> AclError;
/// `aclError aclrtGetDeviceCount(uint32_t *count);`
type GetDeviceCountFn = unsafe extern "C" fn(*mut u32) -> AclError;
/// `aclError aclrtSetDevice(int32_t deviceId);` and `aclError aclrtResetDevice(int32_t deviceId);`
type DeviceFn = unsafe extern "C" fn(i32) -> AclError;
/// `aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy);`
type MallocFn = unsafe extern "C" fn(*mut *mut c_void, usize, AclrtMemMallocPolicy) -> AclError;
/// `aclError aclrtMallocHost(void **hostPtr, size_t size);`
type MallocHostFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> AclError;
/// `aclError aclrtFree(void *devPtr);` and `aclError aclrtFreeHost(void *hostPtr);`
type FreeFn = unsafe extern "C" fn(*mut c_void) -> AclError;
/// `aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count,
/// aclrtMemcpyKind kind);`
type MemcpyFn =
    unsafe extern "C" fn(*mut c_void, usize, *const c_void, usize, AclrtMemcpyKind) -> AclError;
/// `aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free, size_t *total);`
type GetMemInfoFn = unsafe extern "C" fn(AclrtMemAttr, *mut usize, *mut usize) -> AclError;
/// `const char *aclGetRecentErrMsg();`
type GetRecentErrMsgFn = unsafe extern "C" fn() -> *const c_char;
/// `aclError aclrtIpcMemGetExportKey(void *devPtr, size_t size, char *key, size_t len,
/// uint64_t flags);`
type IpcGetExportKeyFn =
    unsafe extern "C" fn(*mut c_void, usize, *mut c_char, usize, u64) -> AclError;
/// `aclError aclrtIpcMemImportByKey(void **devPtr, const char *key, uint64_t flags);`
type IpcImportByKeyFn = unsafe extern "C" fn(*mut *mut c_void, *const c_char, u64) -> AclError;
/// `aclError aclrtIpcMemClose(const char *key);`
type IpcCloseFn = unsafe extern "C" fn(*const c_char) -> AclError;

/// What the shared loader needs to know about `libascendcl`.
const SPEC: LibrarySpec = LibrarySpec {
    library: LIBRARY,
    runtime: "the Ascend ACL runtime",
    env: LIBRARY_ENV,
    candidates: LIBRARY_CANDIDATES,
    install: "install the Ascend CANN toolkit and source its set_env.sh \
        (/usr/local/Ascend/ascend-toolkit/set_env.sh) so that libascendcl.so is on the \
        loader path",
    missing_symbol: "it is not an ACL runtime HMC supports",
};

/// The optional IPC functions (`aclrtIpcMem*`), exported by recent CANN releases only.
#[derive(Clone, Copy)]
struct IpcFns {
    get_export_key: IpcGetExportKeyFn,
    import_by_key: IpcImportByKeyFn,
    close: IpcCloseFn,
}

/// An IPC key as ACL writes it (NUL-terminated within [`ACL_IPC_KEY_SIZE`] bytes).
type Key = [c_char; ACL_IPC_KEY_SIZE];

/// What ACL's IPC needs that the generic trait does not carry: the length of each device
/// allocation (the export call takes it), the key each exported allocation has (closed
/// before it is freed), and the key of each imported mapping (closed to unmap it).
#[derive(Default)]
struct IpcBook {
    /// Device allocation base → (length, the key it was exported under, if any).
    allocations: HashMap<usize, (usize, Option<Key>)>,
    /// Imported mapping base → the key it was imported from.
    imports: HashMap<usize, Key>,
}

/// The resolved ACL runtime, as [`hmc_backend_runtime::RuntimeApi`] for the generic memory
/// types ([`crate::AscendMemory`] is `RuntimeMemory<AclApi>`). The function pointers stay
/// valid while the library is loaded, which is as long as this value lives; everything
/// holding a pointer holds an `Arc` of it.
pub struct AclApi {
    path: PathBuf,
    version: (i32, i32, i32),
    get_device_count: GetDeviceCountFn,
    set_device: DeviceFn,
    reset_device: DeviceFn,
    malloc: MallocFn,
    free: FreeFn,
    malloc_host: MallocHostFn,
    free_host: FreeFn,
    memcpy: MemcpyFn,
    get_mem_info: GetMemInfoFn,
    get_recent_err_msg: GetRecentErrMsgFn,
    ipc: Option<IpcFns>,
    book: Mutex<IpcBook>,
    /// Devices this handle has bound at least once (`aclrtSetDevice`), reset once each
    /// when it is dropped.
    bound: Mutex<Vec<u32>>,
    _library: libloading::Library,
}

impl std::fmt::Debug for AclApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AclApi")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("ipc", &self.ipc.is_some())
            .finish_non_exhaustive()
    }
}

impl AclApi {
    /// Opens the runtime: `explicit` when given, else `$HMC_ASCEND_LIB`, else the first of
    /// [`LIBRARY_CANDIDATES`] that loads; then `aclInit(NULL)`.
    pub(crate) fn open(explicit: Option<&Path>) -> Result<Arc<AclApi>> {
        let (lib, path) = SPEC.load(explicit)?;
        Self::resolve(lib, path).map(Arc::new)
    }

    /// The process-wide runtime for the default search, loaded once on first success.
    pub(crate) fn default_runtime() -> Result<Arc<AclApi>> {
        static DEFAULT: OnceLock<Arc<AclApi>> = OnceLock::new();
        hmc_backend_runtime::default_runtime(&DEFAULT, || Self::open(None))
    }

    /// Whether this runtime exports the `aclrtIpcMem*` functions IPC needs.
    pub fn supports_ipc(&self) -> bool {
        self.ipc.is_some()
    }

    fn resolve(lib: libloading::Library, path: PathBuf) -> Result<AclApi> {
        // SAFETY: for all `symbol` and `get` calls, each type alias above is the header's
        // signature for the named function, as cited beside the alias.
        let (init, get_version, mut api) = unsafe {
            let init: InitFn = SPEC.symbol(&lib, &path, "aclInit")?;
            let get_version: GetVersionFn = SPEC.symbol(&lib, &path, "aclrtGetVersion")?;
            let ipc = match (
                lib.get::<IpcGetExportKeyFn>(b"aclrtIpcMemGetExportKey"),
                lib.get::<IpcImportByKeyFn>(b"aclrtIpcMemImportByKey"),
                lib.get::<IpcCloseFn>(b"aclrtIpcMemClose"),
            ) {
                (Ok(g), Ok(i), Ok(c)) => Some(IpcFns {
                    get_export_key: *g,
                    import_by_key: *i,
                    close: *c,
                }),
                _ => None,
            };
            let api = AclApi {
                get_device_count: SPEC.symbol(&lib, &path, "aclrtGetDeviceCount")?,
                set_device: SPEC.symbol(&lib, &path, "aclrtSetDevice")?,
                reset_device: SPEC.symbol(&lib, &path, "aclrtResetDevice")?,
                malloc: SPEC.symbol(&lib, &path, "aclrtMalloc")?,
                free: SPEC.symbol(&lib, &path, "aclrtFree")?,
                malloc_host: SPEC.symbol(&lib, &path, "aclrtMallocHost")?,
                free_host: SPEC.symbol(&lib, &path, "aclrtFreeHost")?,
                memcpy: SPEC.symbol(&lib, &path, "aclrtMemcpy")?,
                get_mem_info: SPEC.symbol(&lib, &path, "aclrtGetMemInfo")?,
                get_recent_err_msg: SPEC.symbol(&lib, &path, "aclGetRecentErrMsg")?,
                ipc,
                book: Mutex::default(),
                bound: Mutex::default(),
                version: (0, 0, 0),
                path,
                _library: lib,
            };
            (init, get_version, api)
        };
        // SAFETY: aclInit accepts NULL (no configuration file).
        let code = unsafe { init(std::ptr::null()) };
        if code != ACL_SUCCESS && code != ACL_ERROR_REPEAT_INITIALIZE {
            return Err(SPEC.unavailable_at(
                &api.path,
                format!("aclInit failed: {}", api.error("aclInit", code)),
            ));
        }
        let (mut major, mut minor, mut patch) = (0, 0, 0);
        // SAFETY: three valid out-pointers for the call's duration.
        let code = unsafe { get_version(&mut major, &mut minor, &mut patch) };
        api.check("aclrtGetVersion", code)
            .map_err(|e| SPEC.unavailable_at(&api.path, e.to_string()))?;
        api.version = (major, minor, patch);
        tracing::debug!(
            path = %api.path.display(),
            version = ?api.version,
            ipc = api.ipc.is_some(),
            "loaded the ACL runtime"
        );
        Ok(api)
    }

    /// `Ok` for `ACL_SUCCESS`, else an [`Error::Device`] naming the library, `function`,
    /// the code, and `aclGetRecentErrMsg`'s text.
    fn check(&self, function: &'static str, code: AclError) -> Result<()> {
        if code == ACL_SUCCESS {
            Ok(())
        } else {
            Err(self.error(function, code))
        }
    }

    fn error(&self, function: &'static str, code: AclError) -> Error {
        // SAFETY: aclGetRecentErrMsg takes nothing and returns the calling thread's most
        // recent error text (NUL-terminated, valid until the next ACL call on this thread)
        // or NULL, handled by `c_string`; it is copied at once.
        let text = unsafe { c_string((self.get_recent_err_msg)()) };
        let kind = if code == ACL_ERROR_RT_MEMORY_ALLOCATION || code == ACL_ERROR_BAD_ALLOC {
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

    fn ipc_fns(&self) -> Result<IpcFns> {
        self.ipc.ok_or_else(|| {
            Error::Unsupported(format!(
                "IPC on Ascend needs aclrtIpcMemGetExportKey, aclrtIpcMemImportByKey and \
                 aclrtIpcMemClose, which the ACL runtime at {} (version {}.{}.{}) does not \
                 export; install a CANN release that has them",
                self.path.display(),
                self.version.0,
                self.version.1,
                self.version.2
            ))
        })
    }

    fn book(&self) -> std::sync::MutexGuard<'_, IpcBook> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for AclApi {
    /// Balances this handle's `aclrtSetDevice` calls with one `aclrtResetDevice` per device
    /// (ACL reference-counts them per process, so this never tears down a context another
    /// user of the device still holds).
    fn drop(&mut self) {
        let bound = std::mem::take(&mut *self.bound.lock().unwrap_or_else(|e| e.into_inner()));
        for ordinal in bound {
            // SAFETY: aclrtResetDevice takes a plain int; every buffer of this handle is
            // gone (they hold an `Arc` of it).
            let code = unsafe { (self.reset_device)(ordinal as i32) };
            if let Err(e) = self.check("aclrtResetDevice", code) {
                tracing::warn!(error = %e, ordinal, "could not reset an Ascend device");
            }
        }
    }
}

impl IpcFormat for AclApi {
    const NAME: &'static str = "Ascend";
    const IPC_HANDLE_SIZE: usize = ACL_IPC_KEY_SIZE;
    type IpcWire = [u8; ACL_IPC_KEY_SIZE + 8];
    const IPC_WIRE_ZERO: Self::IpcWire = [0; ACL_IPC_KEY_SIZE + 8];
}

impl RuntimeApi for AclApi {
    fn ipc_supported(&self) -> bool {
        self.supports_ipc()
    }

    const KIND: DeviceKind = DeviceKind::ASCEND;
    const MEMORY_TYPE: &'static str = "AscendMemory";
    const ORDINAL_HINT: &'static str = "use an ordinal below the device count (see \
        hmc_backend_ascend::probe), or check ASCEND_RT_VISIBLE_DEVICES";

    fn default_runtime() -> Result<Arc<Self>> {
        AclApi::default_runtime()
    }

    fn open_library(library: &Path) -> Result<Arc<Self>> {
        AclApi::open(Some(library))
    }

    fn path(&self) -> &Path {
        &self.path
    }

    /// `major * 10000 + minor * 100 + patch` of `aclrtGetVersion`.
    fn runtime_version(&self) -> i32 {
        let (major, minor, patch) = self.version;
        major * 10_000 + minor * 100 + patch
    }

    fn device_count(&self) -> Result<u32> {
        let mut count: u32 = 0;
        // SAFETY: `count` is a valid out-pointer for the call's duration.
        let code = unsafe { (self.get_device_count)(&mut count) };
        if code == ACL_ERROR_RT_NO_DEVICE || (code == ACL_SUCCESS && count == 0) {
            return Err(SPEC.unavailable(
                "an Ascend device (NPU)".into(),
                if code == ACL_SUCCESS {
                    format!("the runtime at {} reports 0 devices", self.path.display())
                } else {
                    format!(
                        "the runtime at {} reports no device: {}",
                        self.path.display(),
                        self.error("aclrtGetDeviceCount", code)
                    )
                },
            ));
        }
        self.check("aclrtGetDeviceCount", code)?;
        Ok(count)
    }

    /// `aclrtSetDevice`: every call that touches device memory is preceded by it, since the
    /// current device is per thread. ACL counts these calls per device; [`AclApi`]'s drop
    /// resets each device it bound once.
    fn set_device(&self, ordinal: u32) -> Result<()> {
        let id = i32::try_from(ordinal)
            .map_err(|_| Error::InvalidArgument(format!("device ordinal {ordinal} too large")))?;
        // SAFETY: aclrtSetDevice takes a plain int and has no memory preconditions.
        self.check("aclrtSetDevice", unsafe { (self.set_device)(id) })?;
        let mut bound = self.bound.lock().unwrap_or_else(|e| e.into_inner());
        if !bound.contains(&ordinal) {
            bound.push(ordinal);
        }
        Ok(())
    }

    fn mem_info(&self) -> Result<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both are valid out-pointers for the call's duration.
        let code = unsafe { (self.get_mem_info)(ACL_HBM_MEM, &mut free, &mut total) };
        self.check("aclrtGetMemInfo", code)?;
        Ok((free as u64, total as u64))
    }

    fn malloc(&self, len: usize) -> Result<*mut c_void> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer for the call's duration.
        let code = unsafe { (self.malloc)(&mut ptr, len, ACL_MEM_MALLOC_HUGE_FIRST) };
        self.check("aclrtMalloc", code)?;
        self.book().allocations.insert(ptr as usize, (len, None));
        Ok(ptr)
    }

    unsafe fn free(&self, ptr: *mut c_void) -> Result<()> {
        let exported = self
            .book()
            .allocations
            .remove(&(ptr as usize))
            .and_then(|(_, key)| key);
        if let (Some(key), Some(ipc)) = (exported, self.ipc) {
            // SAFETY: `key` is the NUL-terminated key aclrtIpcMemGetExportKey wrote for
            // this allocation, closed once, before the allocation is freed.
            let code = unsafe { (ipc.close)(key.as_ptr()) };
            if let Err(e) = self.check("aclrtIpcMemClose", code) {
                tracing::warn!(error = %e, "could not close an exported Ascend IPC key");
            }
        }
        // SAFETY: the caller guarantees `ptr` came from aclrtMalloc and is freed once.
        let code = unsafe { (self.free)(ptr) };
        self.check("aclrtFree", code)
    }

    fn host_alloc(&self, len: usize) -> Result<*mut c_void> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer for the call's duration.
        let code = unsafe { (self.malloc_host)(&mut ptr, len) };
        self.check("aclrtMallocHost", code)?;
        Ok(ptr)
    }

    unsafe fn host_free(&self, ptr: *mut c_void) -> Result<()> {
        // SAFETY: the caller guarantees `ptr` came from aclrtMallocHost and is freed once.
        let code = unsafe { (self.free_host)(ptr) };
        self.check("aclrtFreeHost", code)
    }

    unsafe fn memcpy(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        len: usize,
        dir: CopyDirection,
    ) -> Result<()> {
        let kind = match dir {
            CopyDirection::HostToDevice => ACL_MEMCPY_HOST_TO_DEVICE,
            CopyDirection::DeviceToHost => ACL_MEMCPY_DEVICE_TO_HOST,
            CopyDirection::DeviceToDevice => ACL_MEMCPY_DEVICE_TO_DEVICE,
        };
        // SAFETY: the caller guarantees both pointers are live memory of the kinds `kind`
        // names, `len` bytes each; `destMax` is `len`, the destination span's length.
        let code = unsafe { (self.memcpy)(dst, len, src, len, kind) };
        self.check("aclrtMemcpy", code)
    }

    unsafe fn ipc_get(&self, ptr: *mut c_void, handle: &mut [u8]) -> Result<()> {
        let ipc = self.ipc_fns()?;
        let mut book = self.book();
        let Some((len, key)) = book.allocations.get_mut(&(ptr as usize)) else {
            return Err(Error::InvalidArgument(
                "only a whole aclrtMalloc allocation of this runtime can be exported".into(),
            ));
        };
        let key = match key {
            Some(k) => *k,
            None => {
                let mut fresh: Key = [0; ACL_IPC_KEY_SIZE];
                // SAFETY: the caller guarantees `ptr` is the base of a live aclrtMalloc
                // allocation of the current device; `len` is its length (recorded at
                // allocation); `fresh` holds ACL_IPC_KEY_SIZE bytes as `len` says.
                let code = unsafe {
                    (ipc.get_export_key)(
                        ptr,
                        *len,
                        fresh.as_mut_ptr(),
                        ACL_IPC_KEY_SIZE,
                        ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION,
                    )
                };
                self.check("aclrtIpcMemGetExportKey", code)?;
                *key = Some(fresh);
                fresh
            }
        };
        for (b, c) in handle.iter_mut().zip(key) {
            *b = c as u8;
        }
        Ok(())
    }

    unsafe fn ipc_open(&self, handle: &[u8]) -> Result<*mut c_void> {
        let ipc = self.ipc_fns()?;
        let mut key: Key = [0; ACL_IPC_KEY_SIZE];
        for (c, b) in key.iter_mut().zip(handle) {
            *c = *b as c_char;
        }
        if !key.contains(&0) {
            return Err(Error::InvalidArgument(
                "an Ascend IPC key is NUL-terminated within 65 bytes; this one is not".into(),
            ));
        }
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer; `key` is NUL-terminated (checked above);
        // the caller guarantees its origin.
        let code = unsafe {
            (ipc.import_by_key)(&mut ptr, key.as_ptr(), ACL_RT_IPC_MEM_IMPORT_FLAG_DEFAULT)
        };
        self.check("aclrtIpcMemImportByKey", code)?;
        self.book().imports.insert(ptr as usize, key);
        Ok(ptr)
    }

    unsafe fn ipc_close(&self, ptr: *mut c_void) -> Result<()> {
        let ipc = self.ipc_fns()?;
        let Some(key) = self.book().imports.remove(&(ptr as usize)) else {
            return Err(Error::InvalidArgument(
                "not a mapping imported by this runtime".into(),
            ));
        };
        // SAFETY: `key` is the NUL-terminated key this mapping was imported from; the
        // caller guarantees the mapping is not used again.
        let code = unsafe { (ipc.close)(key.as_ptr()) };
        self.check("aclrtIpcMemClose", code)
    }
}
