//! A vendor runtime as data: [`RuntimeTable`] names a CUDA-runtime-shaped library's symbols,
//! codes and enum values, and [`TableRuntime`] is the one binding of such a library — symbol
//! resolution, the version check, error mapping and every [`RuntimeApi`] call — written once
//! for HIP, MUSA and CNRT.
//!
//! Why a table and not a trait per vendor: the three vendors' bindings were the same code
//! three times with different names (a fix to error mapping or to the IPC handle had to be
//! made three times and drifted). What really differs between them is data (symbol names,
//! enum values, error codes, messages) plus three shapes this module names: how the version
//! is queried ([`VersionQuery`]), whether pinned allocation takes flags ([`HostAlloc`]),
//! and whether the runtime describes a code by name and text or by text only
//! ([`ErrorText`]); the IPC handle's C type is the vendor's [`Vendor::IpcRaw`].
//!
//! # ABI
//!
//! The function pointer types below are the CUDA runtime's shapes, which every vendor here
//! copies: `int f(...)` returning the vendor's status enum (a C enum, passed as `int`).
//! Where a vendor's header differs only in a way the C ABI does not see (`unsigned int*`
//! for a count the runtime keeps far below `INT_MAX`, a non-`const` source pointer the
//! runtime does not write through, `int` flags for `unsigned int`), the vendor's table says
//! so beside the symbol's citation.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use hmc_core::{DeviceErrorKind, DeviceKind, Error, Result};

use crate::{CopyDirection, IpcFormat, LibrarySpec, RuntimeApi, c_string};

/// Everything about one vendor's runtime that is data: its library, names, codes and the
/// symbols HMC calls. A vendor crate writes one `const` of it, each symbol cited to its
/// header beside the table.
#[derive(Clone, Copy, Debug)]
pub struct RuntimeTable {
    /// The binding's type name in `Debug` output (`"HipApi"`).
    pub api_name: &'static str,
    /// How the library is found and loaded.
    pub spec: LibrarySpec,
    /// The device kind the vendor's devices report.
    pub kind: DeviceKind,
    /// The vendor crate's memory type, for messages (`"RocmMemory"`).
    pub memory_type: &'static str,
    /// What to do when an ordinal is past the device count.
    pub ordinal_hint: &'static str,
    /// A device of this vendor, as "no device" errors name it (`"an AMD/Hygon HIP device"`).
    pub device: &'static str,
    /// The C name of the status type, for messages (`"hipError_t"`).
    pub status_type: &'static str,
    /// The status value of success.
    pub success: c_int,
    /// The status value of an out-of-memory failure ([`DeviceErrorKind::OutOfMemory`]).
    pub out_of_memory: c_int,
    /// The status `GetDeviceCount` returns when there is no device.
    pub no_device: c_int,
    /// How the runtime's version is queried and which versions are accepted.
    pub version: VersionQuery,
    /// How the runtime describes a status code.
    pub error_text: ErrorText,
    /// The copy-direction enum's values.
    pub memcpy_kind: MemcpyKinds,
    /// The pinned host allocation call.
    pub host_alloc: HostAlloc,
    /// The flags passed to the IPC open call.
    pub ipc_open_flags: c_uint,
    /// The symbols with the same shape in every vendor.
    pub symbols: Symbols,
}

/// The names of the calls whose shape every vendor shares.
#[derive(Clone, Copy, Debug)]
pub struct Symbols {
    /// `status GetDeviceCount(int* count)`.
    pub get_device_count: &'static str,
    /// `status SetDevice(int ordinal)`.
    pub set_device: &'static str,
    /// `status Malloc(void** ptr, size_t len)`.
    pub malloc: &'static str,
    /// `status Free(void* ptr)`.
    pub free: &'static str,
    /// `status FreeHost(void* ptr)`: frees what [`HostAlloc`]'s call allocated.
    pub host_free: &'static str,
    /// `status Memcpy(void* dst, const void* src, size_t len, kind)`.
    pub memcpy: &'static str,
    /// `status MemGetInfo(size_t* free, size_t* total)`.
    pub mem_get_info: &'static str,
    /// `status IpcGetMemHandle(handle* out, void* ptr)`.
    pub ipc_get: &'static str,
    /// `status IpcOpenMemHandle(void** ptr, handle h, flags)`.
    pub ipc_open: &'static str,
    /// `status IpcCloseMemHandle(void* ptr)`.
    pub ipc_close: &'static str,
    /// `status MemGetAddressRange(void** base, size_t* len, void* ptr)`, when the vendor has
    /// it (resolved optionally: some versions lack it).
    pub address_range: Option<&'static str>,
    /// `status DeviceSynchronize(void)`, when the vendor has it (resolved optionally).
    pub device_synchronize: Option<&'static str>,
}

/// How a runtime reports its version.
#[derive(Clone, Copy, Debug)]
pub enum VersionQuery {
    /// `status RuntimeGetVersion(int* version)`; versions below `min` are refused.
    Runtime {
        /// The symbol.
        symbol: &'static str,
        /// The oldest version accepted, as the runtime encodes it.
        min: c_int,
        /// That minimum as users know it (`"HIP 5.0"`).
        min_name: &'static str,
    },
    /// `void GetLibVersion(int* major, int* minor, int* patch)`, recorded as
    /// `major * 10000 + minor * 100 + patch`; the symbols resolved are the requirement.
    LibTriple {
        /// The symbol.
        symbol: &'static str,
    },
}

/// How a runtime describes a status code in errors.
#[derive(Clone, Copy, Debug)]
pub enum ErrorText {
    /// `const char* GetErrorName(status)` and `const char* GetErrorString(status)`: the
    /// message is `"<name>: <text>"`.
    NameAndString {
        /// The name call.
        name: &'static str,
        /// The description call.
        string: &'static str,
    },
    /// `const char* GetErrorStr(status)` only: the message is its text.
    String(&'static str),
}

/// The pinned host allocation call.
#[derive(Clone, Copy, Debug)]
pub enum HostAlloc {
    /// `status HostAlloc(void** ptr, size_t len, unsigned int flags)`, called with `flags`.
    WithFlags {
        /// The symbol.
        symbol: &'static str,
        /// The flags passed (the vendor's default).
        flags: c_uint,
    },
    /// `status HostMalloc(void** ptr, size_t len)`.
    Plain(&'static str),
}

/// The values of the vendor's copy-direction enum.
#[derive(Clone, Copy, Debug)]
pub struct MemcpyKinds {
    /// Host to device.
    pub host_to_device: c_int,
    /// Device to host.
    pub device_to_host: c_int,
    /// Device to device.
    pub device_to_device: c_int,
}

/// The C type of a vendor's IPC memory handle, as its get call writes it and its open call
/// takes it by value, and its bytes on the wire.
///
/// # Safety
/// `Self` must have exactly the C layout of the vendor's handle type (it is passed to and
/// written by the vendor's functions), and `SIZE` must be the length `to_wire`/`from_wire`
/// use.
pub unsafe trait RawIpcHandle: Copy + Send + Sync + 'static {
    /// The handle's size on the wire.
    const SIZE: usize;
    /// An all-zero handle, for the get call to overwrite.
    fn zeroed() -> Self;
    /// Writes the handle's wire bytes into `out` (`SIZE` bytes).
    fn to_wire(&self, out: &mut [u8]);
    /// The handle whose wire bytes are `bytes` (`SIZE` bytes).
    fn from_wire(bytes: &[u8]) -> Self;
}

/// A handle that is an opaque byte array in a struct (`typedef struct { char
/// reserved[N]; } hipIpcMemHandle_t;`), carried on the wire as those bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcBytes<const N: usize> {
    reserved: [c_char; N],
}

// SAFETY: `#[repr(C)]` over `[c_char; N]` is the layout of the C struct it stands for, and
// the wire form is those N bytes.
unsafe impl<const N: usize> RawIpcHandle for IpcBytes<N> {
    const SIZE: usize = N;
    fn zeroed() -> Self {
        IpcBytes { reserved: [0; N] }
    }
    fn to_wire(&self, out: &mut [u8]) {
        for (b, c) in out.iter_mut().zip(self.reserved) {
            *b = c as u8;
        }
    }
    fn from_wire(bytes: &[u8]) -> Self {
        let mut raw = Self::zeroed();
        for (c, b) in raw.reserved.iter_mut().zip(bytes) {
            *c = *b as c_char;
        }
        raw
    }
}

/// A handle that is a pointer-sized value (`typedef void *cnrtIpcMemHandle;`): what the
/// exporting process's runtime gave out, meaningful to the importing process's runtime
/// only. It travels big-endian.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct IpcPointer(*mut c_void);

// SAFETY: the value is never dereferenced by HMC; it is a token the runtime interprets,
// so moving it between threads is moving an integer.
unsafe impl Send for IpcPointer {}
// SAFETY: as for `Send`; the value is immutable.
unsafe impl Sync for IpcPointer {}

// SAFETY: `#[repr(transparent)]` over `*mut c_void` is the layout of `void*`; the wire form
// is the pointer's value in `size_of::<usize>()` bytes.
unsafe impl RawIpcHandle for IpcPointer {
    const SIZE: usize = std::mem::size_of::<usize>();
    fn zeroed() -> Self {
        IpcPointer(std::ptr::null_mut())
    }
    fn to_wire(&self, out: &mut [u8]) {
        out.copy_from_slice(&(self.0 as usize).to_be_bytes());
    }
    fn from_wire(bytes: &[u8]) -> Self {
        let mut value = [0u8; std::mem::size_of::<usize>()];
        value.copy_from_slice(bytes);
        IpcPointer(usize::from_be_bytes(value) as *mut c_void)
    }
}

/// One vendor's runtime: its table, its handle type and where its process-wide instance
/// lives. Implemented on a marker type by each vendor crate (`pub struct Hip;`), whose
/// binding is then `TableRuntime<Hip>`.
pub trait Vendor: Sized + Send + Sync + 'static {
    /// The vendor's library, names, codes and symbols.
    const TABLE: RuntimeTable;
    /// The C type of the vendor's IPC handle.
    type IpcRaw: RawIpcHandle;
    /// `[u8; IpcRaw::SIZE + 8]`, the wire form of an [`crate::IpcHandle`].
    type IpcWire: Copy + Eq + fmt::Debug + Send + Sync + AsRef<[u8]> + AsMut<[u8]> + 'static;
    /// An all-zero [`Self::IpcWire`].
    const IPC_WIRE_ZERO: Self::IpcWire;
    /// The short vendor name used in messages and logs (`"HIP"`).
    const NAME: &'static str;
    /// Where the runtime of the default search is kept once loaded (a `static` of the
    /// vendor crate: statics cannot be generic).
    fn default_cell() -> &'static OnceLock<Arc<TableRuntime<Self>>>;
}

type CountFn = unsafe extern "C" fn(*mut c_int) -> c_int;
type OrdinalFn = unsafe extern "C" fn(c_int) -> c_int;
type AllocFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
type AllocFlagsFn = unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> c_int;
type PtrFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type MemcpyFn = unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> c_int;
type InfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> c_int;
type IpcGetFn<H> = unsafe extern "C" fn(*mut H, *mut c_void) -> c_int;
type IpcOpenFn<H> = unsafe extern "C" fn(*mut *mut c_void, H, c_uint) -> c_int;
type RangeFn = unsafe extern "C" fn(*mut *mut c_void, *mut usize, *mut c_void) -> c_int;
type SyncFn = unsafe extern "C" fn() -> c_int;
type TextFn = unsafe extern "C" fn(c_int) -> *const c_char;
type RuntimeVersionFn = unsafe extern "C" fn(*mut c_int) -> c_int;
type LibVersionFn = unsafe extern "C" fn(*mut c_int, *mut c_int, *mut c_int);

/// The resolved pinned allocation call.
#[derive(Clone, Copy)]
enum HostAllocFn {
    WithFlags(AllocFlagsFn, c_uint, &'static str),
    Plain(AllocFn, &'static str),
}

/// A vendor runtime loaded from its library and bound through its [`RuntimeTable`]: the
/// [`RuntimeApi`] of the generic memory types (`RocmMemory` is
/// `RuntimeMemory<TableRuntime<Hip>>`). The function pointers stay valid while the library
/// is loaded, which is as long as this value lives; everything holding a pointer holds an
/// `Arc` of it.
pub struct TableRuntime<V: Vendor> {
    path: PathBuf,
    runtime_version: c_int,
    get_device_count: CountFn,
    set_device: OrdinalFn,
    malloc: AllocFn,
    free: PtrFn,
    host_alloc: HostAllocFn,
    host_free: PtrFn,
    memcpy: MemcpyFn,
    mem_get_info: InfoFn,
    ipc_get: IpcGetFn<V::IpcRaw>,
    ipc_open: IpcOpenFn<V::IpcRaw>,
    ipc_close: PtrFn,
    /// Absent from some runtimes; without it memory inside an allocation has no IPC export.
    address_range: Option<RangeFn>,
    device_synchronize: Option<SyncFn>,
    error_name: Option<TextFn>,
    error_string: TextFn,
    _library: libloading::Library,
}

impl<V: Vendor> fmt::Debug for TableRuntime<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(V::TABLE.api_name)
            .field("path", &self.path)
            .field("runtime_version", &self.runtime_version)
            .finish_non_exhaustive()
    }
}

impl<V: Vendor> TableRuntime<V> {
    /// Opens the runtime: `explicit` when given, else the table's environment variable,
    /// else the first of its candidates that loads.
    pub fn open(explicit: Option<&Path>) -> Result<Arc<Self>> {
        let (lib, path) = V::TABLE.spec.load(explicit)?;
        Self::resolve(lib, path).map(Arc::new)
    }

    fn resolve(lib: libloading::Library, path: PathBuf) -> Result<Self> {
        let t = &V::TABLE;
        let spec = &t.spec;
        let s = &t.symbols;
        // SAFETY: for every `symbol` call, the vendor's table names a function whose header
        // signature is the type it is resolved as (each cited in the vendor crate, with the
        // ABI-neutral differences noted there); the version call writes through valid
        // out-pointers.
        let api = unsafe {
            TableRuntime {
                runtime_version: Self::query_version(&lib, &path)?,
                get_device_count: spec.symbol(&lib, &path, s.get_device_count)?,
                set_device: spec.symbol(&lib, &path, s.set_device)?,
                malloc: spec.symbol(&lib, &path, s.malloc)?,
                free: spec.symbol(&lib, &path, s.free)?,
                host_alloc: match t.host_alloc {
                    HostAlloc::WithFlags { symbol, flags } => {
                        HostAllocFn::WithFlags(spec.symbol(&lib, &path, symbol)?, flags, symbol)
                    }
                    HostAlloc::Plain(symbol) => {
                        HostAllocFn::Plain(spec.symbol(&lib, &path, symbol)?, symbol)
                    }
                },
                host_free: spec.symbol(&lib, &path, s.host_free)?,
                memcpy: spec.symbol(&lib, &path, s.memcpy)?,
                mem_get_info: spec.symbol(&lib, &path, s.mem_get_info)?,
                ipc_get: spec.symbol(&lib, &path, s.ipc_get)?,
                ipc_open: spec.symbol(&lib, &path, s.ipc_open)?,
                ipc_close: spec.symbol(&lib, &path, s.ipc_close)?,
                address_range: s
                    .address_range
                    .and_then(|n| LibrarySpec::optional_symbol(&lib, n)),
                device_synchronize: s
                    .device_synchronize
                    .and_then(|n| LibrarySpec::optional_symbol(&lib, n)),
                error_name: match t.error_text {
                    ErrorText::NameAndString { name, .. } => Some(spec.symbol(&lib, &path, name)?),
                    ErrorText::String(_) => None,
                },
                error_string: match t.error_text {
                    ErrorText::NameAndString { string, .. } | ErrorText::String(string) => {
                        spec.symbol(&lib, &path, string)?
                    }
                },
                path,
                _library: lib,
            }
        };
        tracing::debug!(path = %api.path.display(), version = api.runtime_version,
            "loaded {}", t.spec.runtime);
        Ok(api)
    }

    /// The runtime's version per the table's [`VersionQuery`], refused when too old.
    ///
    /// # Safety
    /// The table's version symbol has the signature its variant states.
    unsafe fn query_version(lib: &libloading::Library, path: &Path) -> Result<c_int> {
        let t = &V::TABLE;
        match t.version {
            VersionQuery::Runtime {
                symbol,
                min,
                min_name,
            } => {
                // SAFETY: the caller guarantees the signature.
                let get: RuntimeVersionFn = unsafe { t.spec.symbol(lib, path, symbol)? };
                let mut v: c_int = 0;
                // SAFETY: `v` is a valid out-pointer for the call's duration.
                let code = unsafe { get(&mut v) };
                if code != t.success {
                    return Err(t.spec.unavailable_at(
                        path,
                        format!("{symbol} failed with {} {code}", t.status_type),
                    ));
                }
                if v < min {
                    return Err(t.spec.unavailable_at(
                        path,
                        format!("its runtime version {v} is below {min} ({min_name})"),
                    ));
                }
                Ok(v)
            }
            VersionQuery::LibTriple { symbol } => {
                // SAFETY: the caller guarantees the signature.
                let get: LibVersionFn = unsafe { t.spec.symbol(lib, path, symbol)? };
                let (mut major, mut minor, mut patch) = (0, 0, 0);
                // SAFETY: three valid out-pointers for the call's duration.
                unsafe { get(&mut major, &mut minor, &mut patch) };
                Ok(major * 10_000 + minor * 100 + patch)
            }
        }
    }

    /// `Ok` for success, else an [`Error::Device`] naming the library, `function`, the code
    /// and the runtime's own description of it.
    fn check(&self, function: &'static str, code: c_int) -> Result<()> {
        if code == V::TABLE.success {
            Ok(())
        } else {
            Err(self.error(function, code))
        }
    }

    fn error(&self, function: &'static str, code: c_int) -> Error {
        // SAFETY: the description calls accept any status value and return a pointer to a
        // static NUL-terminated string (or NULL, handled by `c_string`).
        let text = unsafe { c_string((self.error_string)(code)) };
        let message = match self.error_name {
            // SAFETY: as above.
            Some(name) => format!("{}: {text}", unsafe { c_string(name(code)) }),
            None => text,
        };
        let kind = if code == V::TABLE.out_of_memory {
            DeviceErrorKind::OutOfMemory
        } else {
            DeviceErrorKind::Other
        };
        Error::Device {
            kind,
            library: V::TABLE.spec.library,
            function,
            code: code.into(),
            message,
        }
    }

    /// One out-pointer call: `call(&mut ptr)` checked as `function`, then `ptr`.
    fn out_ptr(
        &self,
        function: &'static str,
        call: impl FnOnce(*mut *mut c_void) -> c_int,
    ) -> Result<*mut c_void> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        self.check(function, call(&mut ptr))?;
        Ok(ptr)
    }
}

impl<V: Vendor> IpcFormat for TableRuntime<V> {
    const NAME: &'static str = V::NAME;
    const IPC_HANDLE_SIZE: usize = V::IpcRaw::SIZE;
    type IpcWire = V::IpcWire;
    const IPC_WIRE_ZERO: Self::IpcWire = V::IPC_WIRE_ZERO;
}

impl<V: Vendor> RuntimeApi for TableRuntime<V> {
    const KIND: DeviceKind = V::TABLE.kind;
    const MEMORY_TYPE: &'static str = V::TABLE.memory_type;
    const ORDINAL_HINT: &'static str = V::TABLE.ordinal_hint;

    fn default_runtime() -> Result<Arc<Self>> {
        crate::default_runtime(V::default_cell(), || Self::open(None))
    }

    fn open_library(library: &Path) -> Result<Arc<Self>> {
        Self::open(Some(library))
    }

    fn path(&self) -> &Path {
        &self.path
    }

    fn runtime_version(&self) -> i32 {
        self.runtime_version
    }

    fn device_count(&self) -> Result<u32> {
        let t = &V::TABLE;
        let mut count: c_int = 0;
        // SAFETY: `count` is a valid out-pointer for the call's duration.
        let code = unsafe { (self.get_device_count)(&mut count) };
        if code == t.no_device || (code == t.success && count <= 0) {
            let reason = if code == t.success {
                format!("the runtime at {} reports 0 devices", self.path.display())
            } else {
                format!(
                    "the runtime at {} reports no device: {}",
                    self.path.display(),
                    self.error(t.symbols.get_device_count, code)
                )
            };
            return Err(t.spec.unavailable(t.device.into(), reason));
        }
        self.check(t.symbols.get_device_count, code)?;
        Ok(count as u32)
    }

    /// Every call that touches device memory is preceded by this, since the current device
    /// is per thread.
    fn set_device(&self, ordinal: u32) -> Result<()> {
        let ordinal = c_int::try_from(ordinal)
            .map_err(|_| Error::InvalidArgument(format!("device ordinal {ordinal} too large")))?;
        // SAFETY: SetDevice takes a plain int and has no memory preconditions.
        let code = unsafe { (self.set_device)(ordinal) };
        self.check(V::TABLE.symbols.set_device, code)
    }

    fn mem_info(&self) -> Result<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both are valid out-pointers for the call's duration.
        let code = unsafe { (self.mem_get_info)(&mut free, &mut total) };
        self.check(V::TABLE.symbols.mem_get_info, code)?;
        Ok((free as u64, total as u64))
    }

    fn malloc(&self, len: usize) -> Result<*mut c_void> {
        // SAFETY: the out-pointer is valid for the call's duration.
        self.out_ptr(V::TABLE.symbols.malloc, |p| unsafe {
            (self.malloc)(p, len)
        })
    }

    unsafe fn free(&self, ptr: *mut c_void) -> Result<()> {
        // SAFETY: the caller guarantees `ptr` came from Malloc and is freed once.
        let code = unsafe { (self.free)(ptr) };
        self.check(V::TABLE.symbols.free, code)
    }

    fn host_alloc(&self, len: usize) -> Result<*mut c_void> {
        match self.host_alloc {
            // SAFETY: the out-pointer is valid for the call's duration; the vendor's default
            // flags.
            HostAllocFn::WithFlags(f, flags, symbol) => {
                self.out_ptr(symbol, |p| unsafe { f(p, len, flags) })
            }
            // SAFETY: the out-pointer is valid for the call's duration.
            HostAllocFn::Plain(f, symbol) => self.out_ptr(symbol, |p| unsafe { f(p, len) }),
        }
    }

    unsafe fn host_free(&self, ptr: *mut c_void) -> Result<()> {
        // SAFETY: the caller guarantees `ptr` came from the host allocation call and is
        // freed once.
        let code = unsafe { (self.host_free)(ptr) };
        self.check(V::TABLE.symbols.host_free, code)
    }

    unsafe fn memcpy(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        len: usize,
        dir: CopyDirection,
    ) -> Result<()> {
        let kinds = V::TABLE.memcpy_kind;
        let kind = match dir {
            CopyDirection::HostToDevice => kinds.host_to_device,
            CopyDirection::DeviceToHost => kinds.device_to_host,
            CopyDirection::DeviceToDevice => kinds.device_to_device,
        };
        // SAFETY: the caller guarantees both pointers are live memory of the kinds `kind`
        // names, `len` bytes each.
        let code = unsafe { (self.memcpy)(dst, src, len, kind) };
        self.check(V::TABLE.symbols.memcpy, code)
    }

    unsafe fn ipc_get(&self, ptr: *mut c_void, handle: &mut [u8]) -> Result<()> {
        let mut raw = V::IpcRaw::zeroed();
        // SAFETY: `raw` is a valid out-pointer of the vendor's handle type; the caller
        // guarantees `ptr` is the base of a live allocation of the current device.
        let code = unsafe { (self.ipc_get)(&mut raw, ptr) };
        self.check(V::TABLE.symbols.ipc_get, code)?;
        raw.to_wire(handle);
        Ok(())
    }

    unsafe fn ipc_open(&self, handle: &[u8]) -> Result<*mut c_void> {
        let raw = V::IpcRaw::from_wire(handle);
        let flags = V::TABLE.ipc_open_flags;
        // SAFETY: the out-pointer is valid; the handle is passed by value as the header
        // declares; the caller guarantees its origin.
        self.out_ptr(V::TABLE.symbols.ipc_open, |p| unsafe {
            (self.ipc_open)(p, raw, flags)
        })
    }

    unsafe fn address_range(&self, ptr: *const c_void) -> Result<Option<(u64, usize)>> {
        let (Some(f), Some(name)) = (self.address_range, V::TABLE.symbols.address_range) else {
            return Ok(None);
        };
        let (mut base, mut len): (*mut c_void, usize) = (std::ptr::null_mut(), 0);
        // SAFETY: both out-pointers are valid; the runtime checks `ptr` and fails for memory
        // it did not allocate.
        let code = unsafe { f(&mut base, &mut len, ptr as *mut c_void) };
        self.check(name, code)?;
        Ok(Some((base as u64, len)))
    }

    unsafe fn ipc_close(&self, ptr: *mut c_void) -> Result<()> {
        // SAFETY: the caller guarantees `ptr` came from the IPC open call, closed once.
        let code = unsafe { (self.ipc_close)(ptr) };
        self.check(V::TABLE.symbols.ipc_close, code)
    }

    fn device_synchronize(&self) -> Result<bool> {
        let (Some(f), Some(name)) = (self.device_synchronize, V::TABLE.symbols.device_synchronize)
        else {
            return Ok(false);
        };
        // SAFETY: no arguments; the runtime waits on the current device.
        let code = unsafe { f() };
        self.check(name, code)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_handles_travel_as_their_bytes() {
        let wire: Vec<u8> = (0..64).map(|i| (i * 7 + 200) as u8).collect();
        let raw = IpcBytes::<64>::from_wire(&wire);
        let mut back = [0u8; 64];
        raw.to_wire(&mut back);
        assert_eq!(&back[..], &wire[..]);
        assert_eq!(<IpcBytes<64> as RawIpcHandle>::SIZE, 64);
        assert_eq!(std::mem::size_of::<IpcBytes<64>>(), 64);
    }

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn pointer_handles_travel_big_endian() {
        let raw = IpcPointer(0x0102_0304_0506_0708usize as *mut c_void);
        let mut wire = [0u8; 8];
        raw.to_wire(&mut wire);
        assert_eq!(wire, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(
            IpcPointer::from_wire(&wire).0 as usize,
            0x0102_0304_0506_0708
        );
        assert_eq!(IpcPointer::zeroed().0, std::ptr::null_mut());
    }
}
