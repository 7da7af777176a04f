//! The plugin side for Rust authors: an `hmc_core::Communicator`, an `hmc_core::Memory`, or both, exported over the C ABI by [`export_plugin!`](crate::export_plugin), with no `unsafe` in the author's code.
//!
//! The glue here owns the `unsafe`: it turns the host's raw handles back into the
//! backend's own types, maps `hmc_core::Error` to status codes plus the per-thread
//! last-error string, and catches every panic at the boundary (a panic becomes
//! `HMC_ERR_INTERNAL` with its text). The transport side (`comm`) runs each transfer's
//! future inside `transfer_poll` with a waker that calls the host's wake callback
//! (`transfer_start_wake`) or, for a host that started it without one, signals the
//! communicator's eventfd (so no executor and no tokio is needed on either side); the
//! memory side (`memory`) is synchronous, as `Memory::alloc` and `Memory::copy` are.
//!
//! A transport that needs a runtime context while its futures run (the TCP transport
//! needs tokio's) says so with [`Exported::with_scope`]: every call into the communicator
//! then runs inside that scope.

mod comm;
mod memory;

pub use comm::{Exported, PluginTransport, fill_transport};
pub use memory::{PluginMemoryBackend, fill_memory};

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char};
use std::panic::AssertUnwindSafe;
use std::sync::OnceLock;

use hmc_core::{Device, DeviceKind, Error, Region, Result};

use crate::abi::*;

/// What one plugin exports: its name and the functions of its table. Implemented by
/// [`export_plugin!`](crate::export_plugin), which calls [`fill_transport`] and/or
/// [`fill_memory`] from [`PluginExports::fill`].
pub trait PluginExports: 'static {
    /// The plugin's name (`--data-plane NAME`), NUL-terminated.
    const NAME: &'static CStr;
    /// Sets the functions, capability bits and transport id of what the plugin provides.
    fn fill(api: &mut HmcPluginApi);
}

/// The host's configuration for `comm_open`: `key=value` lines.
#[derive(Clone, Debug, Default)]
pub struct Config {
    entries: Vec<(String, String)>,
}

impl Config {
    /// Parses `key=value` lines; blank lines and lines starting with `#` are skipped.
    pub fn parse(text: &str) -> Result<Config> {
        let mut entries = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (k, v) = line.split_once('=').ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "plugin configuration line `{line}` is not key=value"
                ))
            })?;
            entries.push((k.trim().to_string(), v.trim().to_string()));
        }
        Ok(Config { entries })
    }

    /// The last value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every entry, in order.
    pub fn entries(&self) -> &[(String, String)] {
        &self.entries
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

fn clear_error() {
    // Every entry clears; only an error left from an earlier call costs an allocation.
    LAST_ERROR.with(|l| {
        if !l.borrow().is_empty() {
            *l.borrow_mut() = CString::default();
        }
    });
}

/// The status code of `e`, with its text as the thread's last error.
fn fail(e: &Error) -> i32 {
    match e {
        // The host reads the limit back from this form (hmc_plugin.h, HMC_ERR_LIMIT).
        Error::LimitExceeded {
            limit,
            value,
            max,
            hint,
        } => set_error(&format!("{limit}: {value} > {max}; {hint}")),
        e => set_error(&e.to_string()),
    }
    match e {
        Error::InvalidArgument(_) => HMC_ERR_INVALID_ARGUMENT,
        Error::OutOfBounds { .. } => HMC_ERR_OUT_OF_BOUNDS,
        Error::AccessDenied(_) => HMC_ERR_ACCESS_DENIED,
        Error::InvalidKey(_) => HMC_ERR_INVALID_KEY,
        Error::DeadlineExceeded { .. } => HMC_ERR_DEADLINE,
        Error::Cancelled(_) => HMC_ERR_CANCELLED,
        Error::Peer { .. } => HMC_ERR_PEER,
        Error::Closed(_) => HMC_ERR_CLOSED,
        Error::Protocol(_) => HMC_ERR_PROTOCOL,
        Error::Unsupported(_) => HMC_ERR_UNSUPPORTED,
        Error::UnsupportedMemory { .. } => HMC_ERR_UNSUPPORTED_MEMORY,
        Error::LimitExceeded { .. } => HMC_ERR_LIMIT,
        Error::Io { .. } => HMC_ERR_IO,
        Error::Unavailable { .. } => HMC_ERR_UNAVAILABLE,
        e if e.is_out_of_memory() => HMC_ERR_OUT_OF_MEMORY,
        _ => HMC_ERR_INTERNAL,
    }
}

fn status(r: Result<()>) -> i32 {
    match r {
        Ok(()) => HMC_OK,
        Err(e) => fail(&e),
    }
}

/// Hands `made` to the host as a new handle in `*out` (`HMC_OK`; the matching release
/// function takes the box back), or fails with its error.
///
/// # Safety
/// `out` is writable.
unsafe fn hand_out<T, H>(made: Result<T>, out: *mut *mut H) -> i32 {
    match made {
        Ok(value) => {
            // SAFETY: per this function's contract.
            unsafe { *out = Box::into_raw(Box::new(value)).cast() };
            HMC_OK
        }
        Err(e) => fail(&e),
    }
}

/// Runs `f`, turning a panic into `HMC_ERR_INTERNAL` with the panic's text.
fn guard(f: impl FnOnce() -> i32) -> i32 {
    clear_error();
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(code) => code,
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            set_error(&format!("the plugin panicked: {what}"));
            HMC_ERR_INTERNAL
        }
    }
}

/// Runs `f` for a function without a status; a panic is logged through the host.
fn guard_void(f: impl FnOnce()) {
    if guard(|| {
        f();
        HMC_OK
    }) != HMC_OK
    {
        LAST_ERROR.with(|l| log(HMC_LOG_ERROR, &l.borrow().to_string_lossy()));
    }
}

static HOST_LOG: OnceLock<unsafe extern "C" fn(u32, *const u8, usize)> = OnceLock::new();

/// Writes `msg` to the host's log at `level` (`HMC_LOG_*`); nothing before init.
pub fn log(level: u32, msg: &str) {
    if let Some(f) = HOST_LOG.get() {
        // SAFETY: the host's log function reads `len` bytes at `msg` during the call.
        unsafe { f(level, msg.as_ptr(), msg.len()) };
    }
}

/// The table of plugin `P`, as `hmc_plugin_init` hands it out.
fn table<P: PluginExports>() -> HmcPluginApi {
    // SAFETY: all-zero is a valid HmcPluginApi: integers, a null name and None functions.
    let mut api: HmcPluginApi = unsafe { std::mem::zeroed() };
    api.header = HmcTableHeader {
        struct_size: std::mem::size_of::<HmcPluginApi>(),
        abi_major: HMC_PLUGIN_ABI_MAJOR,
        abi_minor: HMC_PLUGIN_ABI_MINOR,
        name: P::NAME.as_ptr(),
        capabilities: 0,
    };
    api.last_error = Some(last_error);
    P::fill(&mut api);
    api
}

/// `hmc_plugin_init` of plugin `P`; [`export_plugin!`](crate::export_plugin) exports it.
///
/// # Safety
/// Called by the host as include/hmc_plugin.h describes: `out` points to `out_size`
/// writable bytes and `host` is NULL or valid for the life of the process.
pub unsafe fn init<P: PluginExports>(
    host_major: u32,
    host_minor: u32,
    host: *const HmcHostApi,
    out: *mut HmcPluginApi,
    out_size: usize,
) -> i32 {
    guard(|| {
        let table = table::<P>();
        let header = std::mem::size_of::<HmcTableHeader>();
        if out.is_null() || out_size < header {
            set_error("hmc_plugin_init: the host's table is smaller than its header");
            return HMC_ERR_TOO_SMALL;
        }
        let n = out_size.min(std::mem::size_of::<HmcPluginApi>());
        // SAFETY: `out` has `out_size >= n` writable bytes; `table` has `n` readable ones.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&table as *const HmcPluginApi).cast::<u8>(),
                out.cast::<u8>(),
                n,
            );
            (*out).header.struct_size = n;
        }
        if host_major != HMC_PLUGIN_ABI_MAJOR {
            set_error(&format!(
                "plugin `{}` speaks HMC plugin ABI {HMC_PLUGIN_ABI_MAJOR}.{HMC_PLUGIN_ABI_MINOR}, \
                 the host {host_major}.{host_minor}",
                P::NAME.to_string_lossy()
            ));
            return HMC_ERR_VERSION;
        }
        // SAFETY: `host` is NULL or a table valid for the life of the process.
        if let Some(h) = unsafe { host.as_ref() }
            && h.header.struct_size >= std::mem::size_of::<HmcHostApi>()
            && let Some(f) = h.log
        {
            let _ = HOST_LOG.set(f);
        }
        HMC_OK
    })
}

unsafe extern "C" fn last_error() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}

/// The glue's view of a raw handle.
///
/// # Safety
/// `p` must be a live handle of type `T` made by this glue.
unsafe fn at<'a, T, U>(p: *mut U) -> &'a T {
    // SAFETY: per this function's contract.
    unsafe { &*(p as *const T) }
}
/// Writes `bytes` to a `(buf, cap, *len)` out-parameter triple.
///
/// # Safety
/// `buf` has `cap` writable bytes; `len` is writable.
unsafe fn write_out(bytes: &[u8], buf: *mut u8, cap: usize, len: *mut usize) -> i32 {
    // SAFETY: per this function's contract.
    unsafe { *len = bytes.len() };
    if bytes.len() > cap {
        set_error(&format!(
            "a buffer of {cap} bytes is too small for {}",
            bytes.len()
        ));
        return HMC_ERR_TOO_SMALL;
    }
    if !bytes.is_empty() {
        // SAFETY: `bytes.len() <= cap`, so `buf` has that many writable bytes (and, with
        // a non-zero capacity, is not NULL).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf, bytes.len()) };
    }
    HMC_OK
}

/// The host's `(pointer, length)` slice; an empty one may come with any pointer, NULL
/// included (C has no dangling non-null convention).
///
/// # Safety
/// When `len` is not 0, `p` points to `len` readable elements that stay unchanged for `'a`.
unsafe fn slice_of<'a, T>(p: *const T, len: usize) -> &'a [T] {
    if len == 0 {
        &[]
    } else {
        // SAFETY: per this function's contract.
        unsafe { std::slice::from_raw_parts(p, len) }
    }
}

/// The host's `(config, len)` as a [`Config`].
///
/// # Safety
/// `config` has `len` readable bytes (or `len` is 0).
unsafe fn config_from(config: *const u8, len: usize) -> Result<Config> {
    // SAFETY: per this function's contract.
    let text = unsafe { slice_of(config, len) };
    std::str::from_utf8(text)
        .map_err(|_| Error::InvalidArgument("plugin configuration is not UTF-8".into()))
        .and_then(Config::parse)
}

/// An ABI region as hmc-core's.
fn region_of(r: &HmcRegion) -> Result<Region> {
    let kind = u8::try_from(r.device_kind).map_err(|_| {
        Error::InvalidArgument(format!(
            "device kind {} is not a wire number",
            r.device_kind
        ))
    })?;
    Ok(Region {
        device: Device::new(DeviceKind::from_wire_id(kind), r.device_ordinal),
        addr: r.addr,
        len: usize::try_from(r.len).map_err(|_| {
            Error::InvalidArgument("region length does not fit this platform".into())
        })?,
    })
}

/// Writes `value` to the host's `out`, no more bytes than the host's `struct_size` says
/// it has (the first field of every appendable struct), and sets `struct_size` to what
/// was written.
///
/// # Safety
/// `T` is `repr(C)` and starts with `struct_size: usize`; `out` is writable for the
/// `struct_size` it holds.
unsafe fn write_sized<T: Copy>(value: T, out: *mut T) {
    // SAFETY: per this function's contract, `out` starts with a readable `usize`.
    let room = unsafe { out.cast::<usize>().read() }.min(std::mem::size_of::<T>());
    // SAFETY: `room` bytes fit both structs.
    unsafe {
        std::ptr::copy_nonoverlapping((&value as *const T).cast::<u8>(), out.cast::<u8>(), room);
        if room >= std::mem::size_of::<usize>() {
            out.cast::<usize>().write(room);
        }
    }
}

/// Exports Rust backends as an HMC plugin: defines `hmc_plugin_init` for a `cdylib`
/// crate. A plugin exports a transport (an [`hmc_core::Communicator`]), a device memory
/// backend (an [`hmc_core::Memory`]), or both; the author writes no `unsafe`:
///
/// ```ignore
/// use hmc_plugin::export::{Config, Exported};
///
/// fn open(config: &Config) -> hmc_core::Result<Exported<MyComm>> {
///     Ok(Exported::new(MyComm::bind(config.get("bind"))?))
/// }
/// // Hosts pass `ordinal=N` to a memory backend.
/// fn open_memory(config: &Config) -> hmc_core::Result<MyMemory> {
///     MyMemory::open(config.get("ordinal").unwrap_or("0").parse().unwrap_or(0))
/// }
///
/// // A transport alone:
/// hmc_plugin::export_plugin! {
///     name: "mytransport",
///     transport: hmc_core::TransportId::from_wire_id(200),
///     comm: MyComm,
///     open: open,
/// }
/// // A memory backend alone:
/// hmc_plugin::export_plugin! {
///     name: "mydevice",
///     memory: MyMemory,
///     open_memory: open_memory,
/// }
/// // Both, from one library:
/// hmc_plugin::export_plugin! {
///     name: "mynic",
///     transport: hmc_core::TransportId::from_wire_id(200),
///     comm: MyComm,
///     open: open,
///     memory: MyMemory,
///     open_memory: open_memory,
/// }
/// ```
///
/// The host opens them as [`PluginCommunicator`](crate::PluginCommunicator) and
/// [`PluginMemory`](crate::PluginMemory).
#[macro_export]
macro_rules! export_plugin {
    (name: $name:literal, transport: $transport:expr, comm: $comm:ty, open: $open:path $(,)?) => {
        $crate::export_plugin!(@transport $transport, $comm, $open);
        $crate::export_plugin!(@entry $name, [$crate::export::fill_transport::<__HmcExportedTransport>]);
    };
    (name: $name:literal, memory: $memory:ty, open_memory: $open_memory:path $(,)?) => {
        $crate::export_plugin!(@memory $memory, $open_memory);
        $crate::export_plugin!(@entry $name, [$crate::export::fill_memory::<__HmcExportedMemory>]);
    };
    (
        name: $name:literal,
        transport: $transport:expr,
        comm: $comm:ty,
        open: $open:path,
        memory: $memory:ty,
        open_memory: $open_memory:path $(,)?
    ) => {
        $crate::export_plugin!(@transport $transport, $comm, $open);
        $crate::export_plugin!(@memory $memory, $open_memory);
        $crate::export_plugin!(@entry $name, [
            $crate::export::fill_transport::<__HmcExportedTransport>,
            $crate::export::fill_memory::<__HmcExportedMemory>
        ]);
    };
    (@transport $transport:expr, $comm:ty, $open:path) => {
        #[doc(hidden)]
        struct __HmcExportedTransport;

        impl $crate::export::PluginTransport for __HmcExportedTransport {
            type Comm = $comm;
            const TRANSPORT: $crate::hmc_core::TransportId = $transport;
            fn open(
                config: &$crate::export::Config,
            ) -> $crate::hmc_core::Result<$crate::export::Exported<$comm>> {
                $open(config)
            }
        }
    };
    (@memory $memory:ty, $open_memory:path) => {
        #[doc(hidden)]
        struct __HmcExportedMemory;

        impl $crate::export::PluginMemoryBackend for __HmcExportedMemory {
            type Memory = $memory;
            fn open(config: &$crate::export::Config) -> $crate::hmc_core::Result<$memory> {
                $open_memory(config)
            }
        }
    };
    (@entry $name:literal, [$($fill:expr),+]) => {
        #[doc(hidden)]
        struct __HmcExportedPlugin;

        impl $crate::export::PluginExports for __HmcExportedPlugin {
            const NAME: &'static ::std::ffi::CStr =
                match ::std::ffi::CStr::from_bytes_with_nul(::std::concat!($name, "\0").as_bytes())
                {
                    Ok(n) => n,
                    Err(_) => panic!("a plugin name must not contain NUL"),
                };
            fn fill(api: &mut $crate::abi::HmcPluginApi) {
                $(($fill)(api);)+
            }
        }

        /// The plugin's entry point (include/hmc_plugin.h).
        ///
        /// # Safety
        /// Called by an HMC host as the header describes.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn hmc_plugin_init(
            host_abi_major: u32,
            host_abi_minor: u32,
            host: *const $crate::abi::HmcHostApi,
            out: *mut $crate::abi::HmcPluginApi,
            out_size: usize,
        ) -> i32 {
            // SAFETY: forwarded from the host, which follows the header's contract.
            unsafe {
                $crate::export::init::<__HmcExportedPlugin>(
                    host_abi_major,
                    host_abi_minor,
                    host,
                    out,
                    out_size,
                )
            }
        }
    };
}
