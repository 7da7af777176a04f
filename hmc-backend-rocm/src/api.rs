//! The HIP runtime functions this crate uses, resolved from `libamdhip64` at run time, and
//! the mapping of `hipError_t` into [`hmc_core::Error`].
//!
//! Every signature, type and enum value below is taken from the public HIP header
//! `include/hip/hip_runtime_api.h` of ROCm/HIP (also shipped by Hygon's DTK), and is cited
//! beside its declaration. Only the functions HMC needs are declared, once, here.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use hmc_core::{Error, Result};

/// The library name used in errors.
pub(crate) const LIBRARY: &str = "libamdhip64";

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
pub(crate) const MIN_RUNTIME_VERSION: c_int = 50_000_000;

/// `typedef enum hipError_t { hipSuccess = 0, ... } hipError_t;` (hip_runtime_api.h): a C
/// enum, passed as `int`.
pub(crate) type HipError = c_int;
/// `hipSuccess = 0` (hip_runtime_api.h, enum hipError_t).
pub(crate) const HIP_SUCCESS: HipError = 0;
/// `hipErrorNoDevice = 100` (hip_runtime_api.h, enum hipError_t).
pub(crate) const HIP_ERROR_NO_DEVICE: HipError = 100;

/// `typedef enum hipMemcpyKind` (hip_runtime_api.h): `hipMemcpyHostToHost = 0`,
/// `hipMemcpyHostToDevice = 1`, `hipMemcpyDeviceToHost = 2`, `hipMemcpyDeviceToDevice = 3`,
/// `hipMemcpyDefault = 4` (never used: we always know the direction).
pub(crate) type HipMemcpyKind = c_int;
pub(crate) const HIP_MEMCPY_HOST_TO_DEVICE: HipMemcpyKind = 1;
pub(crate) const HIP_MEMCPY_DEVICE_TO_HOST: HipMemcpyKind = 2;
pub(crate) const HIP_MEMCPY_DEVICE_TO_DEVICE: HipMemcpyKind = 3;

/// `#define hipHostMallocDefault 0x0` (hip_runtime_api.h).
pub(crate) const HIP_HOST_MALLOC_DEFAULT: c_uint = 0;
/// `#define hipIpcMemLazyEnablePeerAccess 0x01` (hip_runtime_api.h).
pub(crate) const HIP_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 1;

/// `#define HIP_IPC_HANDLE_SIZE 64` (hip_runtime_api.h).
pub const HIP_IPC_HANDLE_SIZE: usize = 64;

/// `typedef struct hipIpcMemHandle_st { char reserved[HIP_IPC_HANDLE_SIZE]; }
/// hipIpcMemHandle_t;` (hip_runtime_api.h), passed by value to `hipIpcOpenMemHandle`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct HipIpcMemHandle {
    pub(crate) reserved: [c_char; HIP_IPC_HANDLE_SIZE],
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
/// `const char* hipGetErrorName(hipError_t hip_error);`
type GetErrorNameFn = unsafe extern "C" fn(HipError) -> *const c_char;
/// `const char* hipGetErrorString(hipError_t hipError);`
type GetErrorStringFn = unsafe extern "C" fn(HipError) -> *const c_char;

/// The resolved HIP runtime. The function pointers stay valid while `_library` is loaded,
/// which is as long as this value lives; everything holding a pointer holds an `Arc` of it.
pub(crate) struct HipApi {
    pub(crate) path: PathBuf,
    pub(crate) runtime_version: c_int,
    pub(crate) get_device_count: GetDeviceCountFn,
    pub(crate) set_device: SetDeviceFn,
    pub(crate) malloc: MallocFn,
    pub(crate) free: FreeFn,
    pub(crate) host_malloc: HostMallocFn,
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

impl std::fmt::Debug for HipApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HipApi")
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
            "install ROCm (or Hygon DTK) so that libamdhip64.so is on the loader path, or set \
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
            format!("it does not export `{name}` ({e}); it is not a HIP runtime HMC supports"),
        )
    })?;
    Ok(*sym)
}

impl HipApi {
    /// Opens the runtime: `explicit` when given, else `$HMC_HIP_LIB`, else the first of
    /// [`LIBRARY_CANDIDATES`] that loads.
    pub(crate) fn open(explicit: Option<&Path>) -> Result<Arc<HipApi>> {
        let env = std::env::var_os(LIBRARY_ENV).map(PathBuf::from);
        let tries: Vec<PathBuf> = match explicit.map(Path::to_path_buf).or(env) {
            Some(p) => vec![p],
            None => LIBRARY_CANDIDATES.iter().map(PathBuf::from).collect(),
        };
        let mut reasons = Vec::new();
        for path in tries {
            // SAFETY: loading a library runs its initialisers; a HIP runtime's initialisers
            // are designed to run in any process that links or dlopens it.
            match unsafe { libloading::Library::new(&path) } {
                Ok(lib) => return Self::resolve(lib, path).map(Arc::new),
                Err(e) => reasons.push(format!("{}: {e}", path.display())),
            }
        }
        Err(unavailable(
            format!("the HIP runtime ({LIBRARY})"),
            format!("could not load it: {}", reasons.join("; ")),
        ))
    }

    /// The process-wide runtime for the default search, loaded once on first success.
    pub(crate) fn default_runtime() -> Result<Arc<HipApi>> {
        static DEFAULT: OnceLock<Arc<HipApi>> = OnceLock::new();
        if let Some(api) = DEFAULT.get() {
            return Ok(api.clone());
        }
        let api = Self::open(None)?;
        Ok(DEFAULT.get_or_init(|| api).clone())
    }

    fn resolve(lib: libloading::Library, path: PathBuf) -> Result<HipApi> {
        // SAFETY: for all `symbol` calls, each type alias above is the header's signature for
        // the named function, as cited beside the alias.
        let api = unsafe {
            let runtime_get_version: RuntimeGetVersionFn =
                symbol(&lib, &path, "hipRuntimeGetVersion")?;
            HipApi {
                get_device_count: symbol(&lib, &path, "hipGetDeviceCount")?,
                set_device: symbol(&lib, &path, "hipSetDevice")?,
                malloc: symbol(&lib, &path, "hipMalloc")?,
                free: symbol(&lib, &path, "hipFree")?,
                host_malloc: symbol(&lib, &path, "hipHostMalloc")?,
                host_free: symbol(&lib, &path, "hipHostFree")?,
                memcpy: symbol(&lib, &path, "hipMemcpy")?,
                mem_get_info: symbol(&lib, &path, "hipMemGetInfo")?,
                ipc_get_mem_handle: symbol(&lib, &path, "hipIpcGetMemHandle")?,
                ipc_open_mem_handle: symbol(&lib, &path, "hipIpcOpenMemHandle")?,
                ipc_close_mem_handle: symbol(&lib, &path, "hipIpcCloseMemHandle")?,
                get_error_name: symbol(&lib, &path, "hipGetErrorName")?,
                get_error_string: symbol(&lib, &path, "hipGetErrorString")?,
                runtime_version: {
                    let mut v: c_int = 0;
                    let code = runtime_get_version(&mut v);
                    if code != HIP_SUCCESS {
                        return Err(unavailable(
                            format!("{LIBRARY} at {}", path.display()),
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
            return Err(unavailable(
                format!("{LIBRARY} at {}", api.path.display()),
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
    pub(crate) fn check(&self, function: &'static str, code: HipError) -> Result<()> {
        if code == HIP_SUCCESS {
            Ok(())
        } else {
            Err(self.error(function, code))
        }
    }

    pub(crate) fn error(&self, function: &'static str, code: HipError) -> Error {
        // SAFETY: both functions accept any hipError_t value and return a pointer to a
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

    /// Makes `ordinal` the calling thread's current device (`hipSetDevice`); every call that
    /// touches device memory is preceded by it, since the current device is per thread.
    pub(crate) fn bind(&self, ordinal: u32) -> Result<()> {
        let ordinal = c_int::try_from(ordinal)
            .map_err(|_| Error::InvalidArgument(format!("device ordinal {ordinal} too large")))?;
        // SAFETY: hipSetDevice takes a plain int and has no memory preconditions.
        self.check("hipSetDevice", unsafe { (self.set_device)(ordinal) })
    }

    /// The number of devices, or `Unavailable` when there are none.
    pub(crate) fn device_count(&self) -> Result<u32> {
        let mut count: c_int = 0;
        // SAFETY: `count` is a valid out-pointer for the call's duration.
        let code = unsafe { (self.get_device_count)(&mut count) };
        if code == HIP_ERROR_NO_DEVICE || (code == HIP_SUCCESS && count <= 0) {
            return Err(unavailable(
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
