//! The MUSA runtime functions this crate uses, resolved from `libmusart` at run time, and
//! the mapping of `musaError_t` into [`hmc_core::Error`].
//!
//! Every signature, type and enum value below is taken from the public headers of the Moore
//! Threads MUSA toolkit, `include/musa_runtime_api.h` and `include/driver_types.h`, and is
//! cited beside its declaration. The MUSA runtime API mirrors the CUDA runtime API name for
//! name (`cudaMalloc` -> `musaMalloc`), including the numeric values of `musaError_t` and
//! `musaMemcpyKind`. Only the functions HMC needs are declared, once, here.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use hmc_core::{Error, Result};

/// The library name used in errors.
pub(crate) const LIBRARY: &str = "libmusart";

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
pub(crate) const MIN_RUNTIME_VERSION: c_int = 1;

/// `typedef enum musaError_t { musaSuccess = 0, ... } musaError_t;` (driver_types.h): a C
/// enum, passed as `int`.
pub(crate) type MusaError = c_int;
/// `musaSuccess = 0` (musa_runtime_api.h, enum musaError_t).
pub(crate) const MUSA_SUCCESS: MusaError = 0;
/// `musaErrorNoDevice = 100` (musa_runtime_api.h, enum musaError_t).
pub(crate) const MUSA_ERROR_NO_DEVICE: MusaError = 100;

/// `typedef enum musaMemcpyKind` (musa_runtime_api.h): `musaMemcpyHostToHost = 0`,
/// `musaMemcpyHostToDevice = 1`, `musaMemcpyDeviceToHost = 2`, `musaMemcpyDeviceToDevice = 3`,
/// `musaMemcpyDefault = 4` (never used: we always know the direction).
pub(crate) type MusaMemcpyKind = c_int;
pub(crate) const MUSA_MEMCPY_HOST_TO_DEVICE: MusaMemcpyKind = 1;
pub(crate) const MUSA_MEMCPY_DEVICE_TO_HOST: MusaMemcpyKind = 2;
pub(crate) const MUSA_MEMCPY_DEVICE_TO_DEVICE: MusaMemcpyKind = 3;

/// `#define musaHostAllocDefault 0x0` (musa_runtime_api.h).
pub(crate) const MUSA_HOST_ALLOC_DEFAULT: c_uint = 0;
/// `#define musaIpcMemLazyEnablePeerAccess 0x01` (musa_runtime_api.h).
pub(crate) const MUSA_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 1;

/// `#define MUSA_IPC_HANDLE_SIZE 64` (musa_runtime_api.h).
pub const MUSA_IPC_HANDLE_SIZE: usize = 64;

/// `typedef struct musaIpcMemHandle_st { char reserved[MUSA_IPC_HANDLE_SIZE]; }
/// musaIpcMemHandle_t;` (musa_runtime_api.h), passed by value to `musaIpcOpenMemHandle`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct MusaIpcMemHandle {
    pub(crate) reserved: [c_char; MUSA_IPC_HANDLE_SIZE],
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

/// The resolved MUSA runtime. The function pointers stay valid while `_library` is loaded,
/// which is as long as this value lives; everything holding a pointer holds an `Arc` of it.
pub(crate) struct MusaApi {
    pub(crate) path: PathBuf,
    pub(crate) runtime_version: c_int,
    pub(crate) get_device_count: GetDeviceCountFn,
    pub(crate) set_device: SetDeviceFn,
    pub(crate) malloc: MallocFn,
    pub(crate) free: FreeFn,
    pub(crate) host_alloc: HostMallocFn,
    pub(crate) host_free: HostFreeFn,
    pub(crate) memcpy: MemcpyFn,
    pub(crate) mem_get_info: MemGetInfoFn,
    pub(crate) ipc_get_mem_handle: IpcGetMemHandleFn,
    pub(crate) ipc_open_mem_handle: IpcOpenMemHandleFn,
    pub(crate) ipc_close_mem_handle: IpcCloseMemHandleFn,
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

fn unavailable(what: String, reason: String) -> Error {
    Error::Unavailable {
        what,
        reason,
        hint: format!(
            "install the MUSA toolkit so that libmusart.so is on the loader path, or set \
             {LIBRARY_ENV} to its full path"
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
            format!("it does not export `{name}` ({e}); it is not a MUSA runtime HMC supports"),
        )
    })?;
    Ok(*sym)
}

impl MusaApi {
    /// Opens the runtime: `explicit` when given, else `$HMC_MUSA_LIB`, else the first of
    /// [`LIBRARY_CANDIDATES`] that loads.
    pub(crate) fn open(explicit: Option<&Path>) -> Result<Arc<MusaApi>> {
        let env = std::env::var_os(LIBRARY_ENV).map(PathBuf::from);
        let tries: Vec<PathBuf> = match explicit.map(Path::to_path_buf).or(env) {
            Some(p) => vec![p],
            None => LIBRARY_CANDIDATES.iter().map(PathBuf::from).collect(),
        };
        let mut reasons = Vec::new();
        for path in tries {
            // SAFETY: loading a library runs its initialisers; a MUSA runtime's initialisers
            // are designed to run in any process that links or dlopens it.
            match unsafe { libloading::Library::new(&path) } {
                Ok(lib) => return Self::resolve(lib, path).map(Arc::new),
                Err(e) => reasons.push(format!("{}: {e}", path.display())),
            }
        }
        Err(unavailable(
            format!("the MUSA runtime ({LIBRARY})"),
            format!("could not load it: {}", reasons.join("; ")),
        ))
    }

    /// The process-wide runtime for the default search, loaded once on first success.
    pub(crate) fn default_runtime() -> Result<Arc<MusaApi>> {
        static DEFAULT: OnceLock<Arc<MusaApi>> = OnceLock::new();
        if let Some(api) = DEFAULT.get() {
            return Ok(api.clone());
        }
        let api = Self::open(None)?;
        Ok(DEFAULT.get_or_init(|| api).clone())
    }

    fn resolve(lib: libloading::Library, path: PathBuf) -> Result<MusaApi> {
        // SAFETY: for all `symbol` calls, each type alias above is the header's signature for
        // the named function, as cited beside the alias.
        let api = unsafe {
            let runtime_get_version: RuntimeGetVersionFn =
                symbol(&lib, &path, "musaRuntimeGetVersion")?;
            MusaApi {
                get_device_count: symbol(&lib, &path, "musaGetDeviceCount")?,
                set_device: symbol(&lib, &path, "musaSetDevice")?,
                malloc: symbol(&lib, &path, "musaMalloc")?,
                free: symbol(&lib, &path, "musaFree")?,
                host_alloc: symbol(&lib, &path, "musaHostAlloc")?,
                host_free: symbol(&lib, &path, "musaFreeHost")?,
                memcpy: symbol(&lib, &path, "musaMemcpy")?,
                mem_get_info: symbol(&lib, &path, "musaMemGetInfo")?,
                ipc_get_mem_handle: symbol(&lib, &path, "musaIpcGetMemHandle")?,
                ipc_open_mem_handle: symbol(&lib, &path, "musaIpcOpenMemHandle")?,
                ipc_close_mem_handle: symbol(&lib, &path, "musaIpcCloseMemHandle")?,
                get_error_name: symbol(&lib, &path, "musaGetErrorName")?,
                get_error_string: symbol(&lib, &path, "musaGetErrorString")?,
                runtime_version: {
                    let mut v: c_int = 0;
                    let code = runtime_get_version(&mut v);
                    if code != MUSA_SUCCESS {
                        return Err(unavailable(
                            format!("{LIBRARY} at {}", path.display()),
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
            return Err(unavailable(
                format!("{LIBRARY} at {}", api.path.display()),
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
    pub(crate) fn check(&self, function: &'static str, code: MusaError) -> Result<()> {
        if code == MUSA_SUCCESS {
            Ok(())
        } else {
            Err(self.error(function, code))
        }
    }

    pub(crate) fn error(&self, function: &'static str, code: MusaError) -> Error {
        // SAFETY: both functions accept any musaError_t value and return a pointer to a
        // static NUL-terminated string (or NULL, handled by `c_string`).
        let (name, text) = unsafe {
            (
                c_string((self.get_error_name)(code)),
                c_string((self.get_error_string)(code)),
            )
        };
        Error::Device {
            library: LIBRARY,
            function,
            code: code.into(),
            message: format!("{name}: {text}"),
        }
    }

    /// Makes `ordinal` the calling thread's current device (`musaSetDevice`); every call that
    /// touches device memory is preceded by it, since the current device is per thread.
    pub(crate) fn bind(&self, ordinal: u32) -> Result<()> {
        let ordinal = c_int::try_from(ordinal)
            .map_err(|_| Error::InvalidArgument(format!("device ordinal {ordinal} too large")))?;
        // SAFETY: musaSetDevice takes a plain int and has no memory preconditions.
        self.check("musaSetDevice", unsafe { (self.set_device)(ordinal) })
    }

    /// The number of devices, or `Unavailable` when there are none.
    pub(crate) fn device_count(&self) -> Result<u32> {
        let mut count: c_int = 0;
        // SAFETY: `count` is a valid out-pointer for the call's duration.
        let code = unsafe { (self.get_device_count)(&mut count) };
        if code == MUSA_ERROR_NO_DEVICE || (code == MUSA_SUCCESS && count <= 0) {
            return Err(unavailable(
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
