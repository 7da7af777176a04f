//! The CNRT functions this crate uses, resolved from `libcnrt` at run time, and the mapping
//! of `cnrtRet_t` into [`hmc_core::Error`].
//!
//! Every signature, type and enum value below is taken from the public header `cnrt.h` of
//! Cambricon's CNToolkit/Neuware (CNRT 5 and later, the generation with `cnrtSetDevice`),
//! and is cited beside its declaration. Only the functions HMC needs are declared, once,
//! here.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use hmc_core::{Error, Result};

/// The library name used in errors.
pub(crate) const LIBRARY: &str = "libcnrt";

/// The environment variable naming the library to load instead of the default search.
pub const LIBRARY_ENV: &str = "HMC_CNRT_LIB";

/// File names tried, in order, when [`LIBRARY_ENV`] is not set: the soname CNToolkit
/// installs, then its default install prefix (`NEUWARE_HOME` is usually `/usr/local/neuware`).
pub const LIBRARY_CANDIDATES: &[&str] = &["libcnrt.so", "/usr/local/neuware/lib64/libcnrt.so"];

/// `typedef enum { cnrtSuccess = 0, ... } cnrtRet_t;` (cnrt.h): a C enum, passed as `int`.
pub(crate) type CnrtRet = c_int;
/// `cnrtSuccess = 0` (cnrt.h, cnrtRet_t).
pub(crate) const CNRT_SUCCESS: CnrtRet = 0;
/// `cnrtErrorNoDevice = 100004` (cnrt.h, cnrtRet_t).
pub(crate) const CNRT_ERROR_NO_DEVICE: CnrtRet = 100_004;

/// `typedef enum { cnrtMemcpyHostToDev = 0, cnrtMemcpyDevToDev, cnrtMemcpyDevToHost,
/// cnrtMemcpyHostToHost, cnrtMemcpyPeerToPeer, cnrtMemcpyNoDirection } cnrtMemTransDir_t;`
/// (cnrt.h; the same values as CNRT 4's `CNRT_MEM_TRANS_DIR_HOST2DEV = 0, ...DEV2DEV,
/// ...DEV2HOST`).
pub(crate) type CnrtMemTransDir = c_int;
pub(crate) const CNRT_MEMCPY_HOST_TO_DEV: CnrtMemTransDir = 0;
pub(crate) const CNRT_MEMCPY_DEV_TO_DEV: CnrtMemTransDir = 1;
pub(crate) const CNRT_MEMCPY_DEV_TO_HOST: CnrtMemTransDir = 2;

/// `cnrtMapMemHandle`'s `flags`: "Currently it only supports value 0" (cnrt.h).
pub(crate) const CNRT_MAP_MEM_HANDLE_FLAGS: c_int = 0;

/// `typedef void *cnrtIpcMemHandle;` (cnrt.h: "The IPC memory handle. Pointer to void by
/// default."). Its value is what a peer process needs.
pub(crate) type CnrtIpcMemHandle = *mut c_void;

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

/// The resolved CNRT runtime. The function pointers stay valid while `_library` is loaded,
/// which is as long as this value lives; everything holding a pointer holds an `Arc` of it.
pub(crate) struct CnrtApi {
    pub(crate) path: PathBuf,
    /// `major * 10000 + minor * 100 + patch` from `cnrtGetLibVersion`.
    pub(crate) runtime_version: c_int,
    pub(crate) get_device_count: GetDeviceCountFn,
    pub(crate) set_device: SetDeviceFn,
    pub(crate) malloc: MallocFn,
    pub(crate) free: FreeFn,
    pub(crate) host_malloc: HostMallocFn,
    pub(crate) free_host: FreeHostFn,
    pub(crate) memcpy: MemcpyFn,
    pub(crate) mem_get_info: MemGetInfoFn,
    pub(crate) acquire_mem_handle: AcquireMemHandleFn,
    pub(crate) map_mem_handle: MapMemHandleFn,
    pub(crate) unmap_mem_handle: UnMapMemHandleFn,
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

fn unavailable(what: String, reason: String) -> Error {
    Error::Unavailable {
        what,
        reason,
        hint: format!(
            "install Cambricon CNToolkit (Neuware) so that libcnrt.so is on the loader path \
             (e.g. add $NEUWARE_HOME/lib64 to LD_LIBRARY_PATH), or set {LIBRARY_ENV} to its \
             full path"
        ),
    }
}

/// Resolves one symbol as a function pointer of type `T`.
///
/// # Safety
/// `T` must be the exact C signature of `name` in the library.
unsafe fn symbol<T: Copy>(lib: &libloading::Library, path: &Path, name: &str) -> Result<T> {
    // SAFETY: the caller guarantees `T` matches the symbol's C signature.
    let sym = unsafe { lib.get::<T>(name.as_bytes()) }.map_err(|e| {
        unavailable(
            format!("{LIBRARY} at {}", path.display()),
            format!(
                "it does not export `{name}` ({e}); HMC needs CNRT 5 or later (CNToolkit 2 or later)"
            ),
        )
    })?;
    Ok(*sym)
}

impl CnrtApi {
    /// Opens the runtime: `explicit` when given, else `$HMC_CNRT_LIB`, else the first of
    /// [`LIBRARY_CANDIDATES`] that loads.
    pub(crate) fn open(explicit: Option<&Path>) -> Result<Arc<CnrtApi>> {
        let env = std::env::var_os(LIBRARY_ENV).map(PathBuf::from);
        let tries: Vec<PathBuf> = match explicit.map(Path::to_path_buf).or(env) {
            Some(p) => vec![p],
            None => LIBRARY_CANDIDATES.iter().map(PathBuf::from).collect(),
        };
        let mut reasons = Vec::new();
        for path in tries {
            // SAFETY: loading a library runs its initialisers; CNRT's initialisers are
            // designed to run in any process that links or dlopens it.
            match unsafe { libloading::Library::new(&path) } {
                Ok(lib) => return Self::resolve(lib, path).map(Arc::new),
                Err(e) => reasons.push(format!("{}: {e}", path.display())),
            }
        }
        Err(unavailable(
            format!("the Cambricon runtime ({LIBRARY})"),
            format!("could not load it: {}", reasons.join("; ")),
        ))
    }

    /// The process-wide runtime for the default search, loaded once on first success.
    pub(crate) fn default_runtime() -> Result<Arc<CnrtApi>> {
        static DEFAULT: OnceLock<Arc<CnrtApi>> = OnceLock::new();
        if let Some(api) = DEFAULT.get() {
            return Ok(api.clone());
        }
        let api = Self::open(None)?;
        Ok(DEFAULT.get_or_init(|| api).clone())
    }

    fn resolve(lib: libloading::Library, path: PathBuf) -> Result<CnrtApi> {
        // SAFETY: for all `symbol` calls and the version call, each type alias above is the
        // header's signature for the named function, as cited beside the alias; the version
        // function writes three ints through valid pointers.
        let api = unsafe {
            let get_lib_version: GetLibVersionFn = symbol(&lib, &path, "cnrtGetLibVersion")?;
            let (mut major, mut minor, mut patch) = (0, 0, 0);
            get_lib_version(&mut major, &mut minor, &mut patch);
            CnrtApi {
                runtime_version: major * 10_000 + minor * 100 + patch,
                get_device_count: symbol(&lib, &path, "cnrtGetDeviceCount")?,
                set_device: symbol(&lib, &path, "cnrtSetDevice")?,
                malloc: symbol(&lib, &path, "cnrtMalloc")?,
                free: symbol(&lib, &path, "cnrtFree")?,
                host_malloc: symbol(&lib, &path, "cnrtHostMalloc")?,
                free_host: symbol(&lib, &path, "cnrtFreeHost")?,
                memcpy: symbol(&lib, &path, "cnrtMemcpy")?,
                mem_get_info: symbol(&lib, &path, "cnrtMemGetInfo")?,
                acquire_mem_handle: symbol(&lib, &path, "cnrtAcquireMemHandle")?,
                map_mem_handle: symbol(&lib, &path, "cnrtMapMemHandle")?,
                unmap_mem_handle: symbol(&lib, &path, "cnrtUnMapMemHandle")?,
                get_error_str: symbol(&lib, &path, "cnrtGetErrorStr")?,
                path,
                _library: lib,
            }
        };
        tracing::debug!(path = %api.path.display(), version = api.runtime_version, "loaded CNRT");
        Ok(api)
    }

    /// `Ok` for `cnrtSuccess`, else an [`Error::Device`] naming the library, `function`, the
    /// code, and the runtime's own description of the code (`cnrtGetErrorStr`).
    pub(crate) fn check(&self, function: &'static str, code: CnrtRet) -> Result<()> {
        if code == CNRT_SUCCESS {
            Ok(())
        } else {
            Err(self.error(function, code))
        }
    }

    pub(crate) fn error(&self, function: &'static str, code: CnrtRet) -> Error {
        // SAFETY: cnrtGetErrorStr accepts any cnrtRet_t value and returns a pointer to a
        // static NUL-terminated string (or NULL, handled by `c_string`).
        let text = unsafe { c_string((self.get_error_str)(code)) };
        Error::Device {
            library: LIBRARY,
            function,
            code: code.into(),
            message: text,
        }
    }

    /// Makes `ordinal` the calling thread's current device (`cnrtSetDevice`); every call
    /// that touches device memory is preceded by it, since the current device is per thread.
    pub(crate) fn bind(&self, ordinal: u32) -> Result<()> {
        let ordinal = c_int::try_from(ordinal)
            .map_err(|_| Error::InvalidArgument(format!("device ordinal {ordinal} too large")))?;
        // SAFETY: cnrtSetDevice takes a plain int and has no memory preconditions.
        self.check("cnrtSetDevice", unsafe { (self.set_device)(ordinal) })
    }

    /// The number of devices, or `Unavailable` when there are none.
    pub(crate) fn device_count(&self) -> Result<u32> {
        let mut count: c_uint = 0;
        // SAFETY: `count` is a valid out-pointer for the call's duration.
        let code = unsafe { (self.get_device_count)(&mut count) };
        if code == CNRT_ERROR_NO_DEVICE || (code == CNRT_SUCCESS && count == 0) {
            return Err(unavailable(
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
}

/// Copies a C string returned by the runtime.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays valid during the call.
unsafe fn c_string(p: *const c_char) -> String {
    if p.is_null() {
        return "(no description)".into();
    }
    // SAFETY: non-null and NUL-terminated per the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
