//! The plugin side for Rust authors: any `hmc_core::Communicator` exported over the C ABI by [`export_plugin!`](crate::export_plugin), with no `unsafe` in the author's code.
//!
//! The glue here owns the `unsafe`: it turns the host's raw handles back into the
//! communicator's own types, runs each transfer's future inside `transfer_poll` with a
//! waker that signals the communicator's eventfd (so no executor and no tokio is needed on
//! either side), maps `hmc_core::Error` to status codes plus the per-thread last-error
//! string, and catches every panic at the boundary.
//!
//! A transport that needs a runtime context while its futures run (the TCP transport
//! needs tokio's) says so with [`Exported::with_scope`]: every call into the communicator
//! then runs inside that scope.

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char};
use std::future::Future;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::OnceLock;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use hmc_core::{
    Access, Communicator, Deadline, Error, Notification, Op, PeerAddr, Region, RemoteRegion,
    Result, TransferDesc, TransportId,
};
use parking_lot::Mutex;

use crate::abi::*;

/// A Rust transport exported as a plugin; implemented by [`export_plugin!`](crate::export_plugin).
pub trait PluginTransport: 'static {
    /// The communicator type.
    type Comm: Communicator;
    /// The plugin's name (`--data-plane NAME`), NUL-terminated.
    const NAME: &'static CStr;
    /// The transport wire number its descriptors carry.
    const TRANSPORT: TransportId;
    /// Opens a communicator from the host's configuration.
    fn open(config: &Config) -> Result<Exported<Self::Comm>>;
}

/// A communicator ready to export, with the scope its calls run in.
pub struct Exported<C> {
    comm: C,
    scope: Option<Scope>,
}

type Scope = Box<dyn Fn(&mut dyn FnMut()) + Send + Sync>;

impl<C: Communicator> Exported<C> {
    /// Exports `comm` as is.
    pub fn new(comm: C) -> Self {
        Exported { comm, scope: None }
    }

    /// Runs every call into the communicator inside `scope`, which must call the function
    /// it is given exactly once (for example after entering a tokio runtime:
    /// `|run| { let _g = RUNTIME.enter(); run() }`).
    pub fn with_scope(mut self, scope: impl Fn(&mut dyn FnMut()) + Send + Sync + 'static) -> Self {
        self.scope = Some(Box::new(scope));
        self
    }
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
    LAST_ERROR.with(|l| *l.borrow_mut() = CString::default());
}

/// The status code of `e`, with its text as the thread's last error.
fn fail(e: &Error) -> i32 {
    set_error(&e.to_string());
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

/// Signals an eventfd when woken.
struct FdWaker(Arc<OwnedFd>);

impl Wake for FdWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let one = 1u64;
        // SAFETY: writes 8 bytes to an eventfd this waker keeps open.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The communicator behind an `HmcComm*`.
struct GComm<C: Communicator> {
    // Field order: futures borrowing `comm` drop before it.
    recv: Mutex<RecvState>,
    comm: Arc<C>,
    scope: Option<Scope>,
    efd: Arc<OwnedFd>,
    waker: Waker,
    address: String,
}

#[derive(Default)]
struct RecvState {
    fut: Option<BoxFut<Result<Notification>>>,
    ready: Option<Notification>,
}

impl<C: Communicator> GComm<C> {
    fn run<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.scope {
            None => f(),
            Some(scope) => {
                let mut f = Some(f);
                let mut out = None;
                scope(&mut || out = f.take().map(|f| f()));
                out.expect("the plugin's scope must call the function it is given")
            }
        }
    }

    /// `&'static` access to the communicator, for futures stored in handles.
    ///
    /// # Safety
    /// The reference must not outlive this `GComm`: the host destroys a communicator only
    /// after releasing every handle of it, and `recv` drops before `comm`.
    unsafe fn comm_static(&self) -> &'static C {
        // SAFETY: per this function's contract.
        unsafe { &*Arc::as_ptr(&self.comm) }
    }
}

struct GTransfer {
    fut: Option<BoxFut<Result<()>>>,
    done: Option<i32>,
    message: String,
}

fn deadline_from_ns(ns: u64) -> Deadline {
    hmc_backend_helpers::deadline::from_monotonic_ns(ns)
}

/// The table of plugin `P`, as `hmc_plugin_init` hands it out.
fn table<P: PluginTransport>() -> HmcPluginApi {
    HmcPluginApi {
        header: HmcTableHeader {
            struct_size: std::mem::size_of::<HmcPluginApi>(),
            abi_major: HMC_PLUGIN_ABI_MAJOR,
            abi_minor: HMC_PLUGIN_ABI_MINOR,
            name: P::NAME.as_ptr(),
            capabilities: HMC_PLUGIN_PROVIDES_COMMUNICATOR,
        },
        transport_id: P::TRANSPORT.wire_id() as u32,
        reserved: 0,
        last_error: Some(last_error),
        comm_open: Some(comm_open::<P>),
        comm_close: Some(comm_close::<P>),
        comm_destroy: Some(comm_destroy::<P>),
        comm_event_fd: Some(comm_event_fd::<P>),
        comm_address: Some(comm_address::<P>),
        comm_capabilities: Some(comm_capabilities::<P>),
        connect: Some(connect::<P>),
        endpoint_release: Some(endpoint_release::<P>),
        register_mem: Some(register::<P>),
        deregister: Some(deregister::<P>),
        export_key: Some(export_key::<P>),
        rekey: Some(rekey::<P>),
        import: Some(import::<P>),
        remote_key_release: Some(remote_key_release::<P>),
        transfer_start: Some(transfer_start::<P>),
        transfer_poll: Some(transfer_poll::<P>),
        transfer_release: Some(transfer_release::<P>),
        notify: Some(notify::<P>),
        recv_notification: Some(recv_notification::<P>),
        memory_open: None,
        memory_destroy: None,
        memory_info: None,
        memory_alloc: None,
        memory_free: None,
        memory_copy: None,
    }
}

/// `hmc_plugin_init` of plugin `P`; [`export_plugin!`](crate::export_plugin) exports it.
///
/// # Safety
/// Called by the host as include/hmc_plugin.h describes: `out` points to `out_size`
/// writable bytes and `host` is NULL or valid for the life of the process.
pub unsafe fn init<P: PluginTransport>(
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

unsafe extern "C" fn comm_open<P: PluginTransport>(
    config: *const u8,
    len: usize,
    out: *mut *mut HmcComm,
) -> i32 {
    guard(|| {
        // SAFETY: the host passes `len` readable bytes.
        let text = unsafe { std::slice::from_raw_parts(config, len) };
        let opened = std::str::from_utf8(text)
            .map_err(|_| Error::InvalidArgument("plugin configuration is not UTF-8".into()))
            .and_then(Config::parse)
            .and_then(|c| P::open(&c));
        let exported = match opened {
            Ok(e) => e,
            Err(e) => return fail(&e),
        };
        // SAFETY: plain syscall; the fd is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return fail(&Error::io("eventfd", std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        let efd = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        let address = exported.comm.address().to_string();
        let g = GComm {
            recv: Mutex::new(RecvState::default()),
            comm: Arc::new(exported.comm),
            scope: exported.scope,
            waker: Waker::from(Arc::new(FdWaker(efd.clone()))),
            efd,
            address,
        };
        // SAFETY: `out` is writable.
        unsafe { *out = Box::into_raw(Box::new(g)).cast() };
        HMC_OK
    })
}

unsafe extern "C" fn comm_close<P: PluginTransport>(comm: *mut HmcComm) {
    guard_void(|| {
        // SAFETY: a live communicator of this glue.
        let g = unsafe { at::<GComm<P::Comm>, _>(comm) };
        g.run(|| g.comm.close());
    })
}

unsafe extern "C" fn comm_destroy<P: PluginTransport>(comm: *mut HmcComm) {
    guard_void(|| {
        // SAFETY: made by comm_open, destroyed once, after every other handle.
        let mut g = *unsafe { Box::from_raw(comm.cast::<GComm<P::Comm>>()) };
        // Drop inside the scope (a transport's drop may need its runtime), the scope itself
        // after.
        match g.scope.take() {
            Some(scope) => {
                let mut g = Some(g);
                scope(&mut || drop(g.take()));
            }
            None => drop(g),
        }
    })
}

unsafe extern "C" fn comm_event_fd<P: PluginTransport>(comm: *mut HmcComm) -> i32 {
    let mut fd = -1;
    let code = guard(|| {
        // SAFETY: a live communicator of this glue.
        fd = unsafe { at::<GComm<P::Comm>, _>(comm) }.efd.as_raw_fd();
        HMC_OK
    });
    if code == HMC_OK { fd } else { code }
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
    // SAFETY: `bytes.len() <= cap`.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf, bytes.len()) };
    HMC_OK
}

unsafe extern "C" fn comm_address<P: PluginTransport>(
    comm: *mut HmcComm,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
) -> i32 {
    guard(|| {
        // SAFETY: a live communicator of this glue; the out-parameters are the host's.
        unsafe {
            write_out(
                at::<GComm<P::Comm>, _>(comm).address.as_bytes(),
                buf,
                cap,
                len,
            )
        }
    })
}

unsafe extern "C" fn comm_capabilities<P: PluginTransport>(
    comm: *mut HmcComm,
    out: *mut HmcCommCaps,
) -> i32 {
    guard(|| {
        // SAFETY: a live communicator of this glue.
        let g = unsafe { at::<GComm<P::Comm>, _>(comm) };
        let c = g.comm.capabilities();
        // SAFETY: all-zero is a valid HmcCommCaps.
        let mut caps: HmcCommCaps = unsafe { std::mem::zeroed() };
        caps.flags = [
            (c.notifications, HMC_CAP_NOTIFICATIONS),
            (c.zero_copy, HMC_CAP_ZERO_COPY),
            (c.rekey, HMC_CAP_REKEY),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .fold(0, |flags, (_, bit)| flags | bit);
        caps.max_notification_len = c.max_notification_len as u64;
        caps.max_transfer_len = c.max_transfer_len;
        caps.max_batch_len = c.max_batch_len as u64;
        for k in 0..=255u8 {
            if c.local_memory
                .contains(hmc_core::DeviceKind::from_wire_id(k))
            {
                kind_mask_set(&mut caps.local_kinds, k);
            }
            if c.remote_memory
                .contains(hmc_core::DeviceKind::from_wire_id(k))
            {
                kind_mask_set(&mut caps.remote_kinds, k);
            }
        }
        // SAFETY: the host's struct is writable for its struct_size.
        let room = unsafe { (*out).struct_size }.min(std::mem::size_of::<HmcCommCaps>());
        caps.struct_size = room;
        // SAFETY: `room` bytes fit both structs.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&caps as *const HmcCommCaps).cast::<u8>(),
                out.cast::<u8>(),
                room,
            )
        };
        HMC_OK
    })
}

/// Runs a future to completion on the calling thread (the ABI's blocking calls).
fn block_on<C: Communicator, T>(g: &GComm<C>, fut: impl Future<Output = T>) -> T {
    g.run(|| futures::executor::block_on(fut))
}

unsafe extern "C" fn connect<P: PluginTransport>(
    comm: *mut HmcComm,
    addr: *const u8,
    addr_len: usize,
    deadline_ns: u64,
    out: *mut *mut HmcEndpoint,
) -> i32 {
    guard(|| {
        // SAFETY: a live communicator; `addr` has `addr_len` readable bytes.
        let (g, text) = unsafe {
            (
                at::<GComm<P::Comm>, _>(comm),
                std::slice::from_raw_parts(addr, addr_len),
            )
        };
        let peer = match std::str::from_utf8(text)
            .map_err(|_| "not UTF-8".to_string())
            .and_then(|t| PeerAddr::from_str(t).map_err(|e| e.to_string()))
        {
            Ok(p) => p,
            Err(e) => return fail(&Error::InvalidArgument(format!("connect address: {e}"))),
        };
        match block_on(g, g.comm.connect(&peer, deadline_from_ns(deadline_ns))) {
            Ok(ep) => {
                // SAFETY: `out` is writable.
                unsafe { *out = Box::into_raw(Box::new(ep)).cast() };
                HMC_OK
            }
            Err(e) => fail(&e),
        }
    })
}

unsafe extern "C" fn endpoint_release<P: PluginTransport>(
    comm: *mut HmcComm,
    ep: *mut HmcEndpoint,
) {
    guard_void(|| {
        // SAFETY: live handles of this glue, `ep` released once.
        let (g, ep) = unsafe {
            (
                at::<GComm<P::Comm>, _>(comm),
                Box::from_raw(ep.cast::<<P::Comm as Communicator>::Endpoint>()),
            )
        };
        g.run(|| drop(ep));
    })
}

unsafe extern "C" fn register<P: PluginTransport>(
    comm: *mut HmcComm,
    region: *const HmcRegion,
    access: u32,
    out: *mut *mut HmcReg,
) -> i32 {
    guard(|| {
        // SAFETY: a live communicator; `region` readable.
        let (g, r) = unsafe { (at::<GComm<P::Comm>, _>(comm), *region) };
        let access = match u8::try_from(access)
            .map_err(|_| ())
            .and_then(|a| Access::from_bits(a).map_err(|_| ()))
        {
            Ok(a) => a,
            Err(()) => return fail(&Error::InvalidArgument(format!("access bits {access:#x}"))),
        };
        let region = Region {
            device: hmc_core::Device::new(
                hmc_core::DeviceKind::from_wire_id(r.device_kind as u8),
                r.device_ordinal,
            ),
            addr: r.addr,
            len: r.len as usize,
        };
        // SAFETY: the host keeps the memory allocated until deregister returns (ABI).
        match g.run(|| unsafe { g.comm.register(region, access) }) {
            Ok(reg) => {
                // SAFETY: `out` is writable.
                unsafe { *out = Box::into_raw(Box::new(reg)).cast() };
                HMC_OK
            }
            Err(e) => fail(&e),
        }
    })
}

unsafe extern "C" fn deregister<P: PluginTransport>(comm: *mut HmcComm, reg: *mut HmcReg) {
    guard_void(|| {
        // SAFETY: live handles of this glue, `reg` released once.
        let (g, reg) = unsafe {
            (
                at::<GComm<P::Comm>, _>(comm),
                Box::from_raw(reg.cast::<<P::Comm as Communicator>::Registration>()),
            )
        };
        g.run(|| drop(reg));
    })
}

unsafe extern "C" fn export_key<P: PluginTransport>(
    comm: *mut HmcComm,
    reg: *mut HmcReg,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
) -> i32 {
    guard(|| {
        // SAFETY: live handles of this glue.
        let (g, reg) = unsafe {
            (
                at::<GComm<P::Comm>, _>(comm),
                at::<<P::Comm as Communicator>::Registration, _>(reg),
            )
        };
        match g.run(|| g.comm.export(reg)) {
            // The host builds the descriptor from the registration's region and access and
            // these key bytes, so descriptors stay those of the transport linked statically.
            // SAFETY: the out-parameters are the host's.
            Ok(remote) => unsafe { write_out(&remote.key, buf, cap, len) },
            Err(e) => fail(&e),
        }
    })
}

unsafe extern "C" fn rekey<P: PluginTransport>(comm: *mut HmcComm, reg: *mut HmcReg) -> i32 {
    guard(|| {
        // SAFETY: live handles of this glue.
        let (g, reg) = unsafe {
            (
                at::<GComm<P::Comm>, _>(comm),
                at::<<P::Comm as Communicator>::Registration, _>(reg),
            )
        };
        match g.run(|| g.comm.rekey(reg)) {
            Ok(revoked) => i32::from(revoked),
            Err(e) => fail(&e),
        }
    })
}

unsafe extern "C" fn import<P: PluginTransport>(
    comm: *mut HmcComm,
    ep: *mut HmcEndpoint,
    desc: *const HmcRemoteDesc,
    out: *mut *mut HmcRemoteKey,
) -> i32 {
    guard(|| {
        // SAFETY: live handles of this glue; `desc` and its key bytes readable.
        let (g, ep, key) = unsafe {
            let d = &*desc;
            (
                at::<GComm<P::Comm>, _>(comm),
                at::<<P::Comm as Communicator>::Endpoint, _>(ep),
                std::slice::from_raw_parts(d.key, d.key_len),
            )
        };
        // SAFETY: `desc` is readable during the call.
        let d = unsafe { &*desc };
        let bits = u8::try_from(d.access).unwrap_or(0);
        let result = Access::from_bits(bits).and_then(|access| {
            let remote = RemoteRegion {
                transport: P::TRANSPORT,
                region: Region {
                    device: hmc_core::Device::new(
                        hmc_core::DeviceKind::from_wire_id(d.region.device_kind as u8),
                        d.region.device_ordinal,
                    ),
                    addr: d.region.addr,
                    len: usize::try_from(d.region.len).map_err(|_| {
                        Error::InvalidArgument("region length does not fit this platform".into())
                    })?,
                },
                access,
                key: key.to_vec(),
            };
            g.run(|| g.comm.import(ep, &remote))
        });
        match result {
            Ok(k) => {
                // SAFETY: `out` is writable.
                unsafe { *out = Box::into_raw(Box::new(k)).cast() };
                HMC_OK
            }
            Err(e) => fail(&e),
        }
    })
}

unsafe extern "C" fn remote_key_release<P: PluginTransport>(
    comm: *mut HmcComm,
    key: *mut HmcRemoteKey,
) {
    guard_void(|| {
        // SAFETY: live handles of this glue, `key` released once.
        let (g, key) = unsafe {
            (
                at::<GComm<P::Comm>, _>(comm),
                Box::from_raw(key.cast::<<P::Comm as Communicator>::RemoteKey>()),
            )
        };
        g.run(|| drop(key));
    })
}

unsafe extern "C" fn transfer_start<P: PluginTransport>(
    comm: *mut HmcComm,
    ep: *mut HmcEndpoint,
    op: u32,
    descs: *const HmcTransferDesc,
    count: usize,
    deadline_ns: u64,
    out: *mut *mut HmcTransfer,
) -> i32 {
    type C<P> = <P as PluginTransport>::Comm;
    guard(|| {
        let op = match op {
            HMC_OP_READ => Op::Read,
            HMC_OP_WRITE => Op::Write,
            other => return fail(&Error::InvalidArgument(format!("transfer op {other}"))),
        };
        // SAFETY: live handles of this glue. The host keeps the endpoint, registrations and
        // keys alive until transfer_release, and the communicator longer still (ABI), so
        // the future may hold them as `'static`.
        let (g, comm_ref, ep) = unsafe {
            let g = at::<GComm<C<P>>, _>(comm);
            (
                g,
                g.comm_static(),
                at::<'static, <C<P> as Communicator>::Endpoint, _>(ep),
            )
        };
        let raw = if count == 0 {
            &[][..]
        } else {
            // SAFETY: `descs` has `count` readable elements during this call.
            unsafe { std::slice::from_raw_parts(descs, count) }
        };
        let batch: Vec<TransferDesc<'static, C<P>>> = raw
            .iter()
            .map(|d| TransferDesc {
                // SAFETY: as above.
                local: unsafe { at::<'static, <C<P> as Communicator>::Registration, _>(d.local) },
                local_offset: d.local_offset as usize,
                // SAFETY: as above.
                remote: unsafe { at::<'static, <C<P> as Communicator>::RemoteKey, _>(d.remote) },
                remote_offset: d.remote_offset,
                len: d.len as usize,
            })
            .collect();
        let deadline = deadline_from_ns(deadline_ns);
        let fut: BoxFut<Result<()>> =
            Box::pin(async move { comm_ref.transfer(ep, op, &batch, deadline).await });
        let mut t = GTransfer {
            fut: Some(fut),
            done: None,
            message: String::new(),
        };
        poll_transfer(g, &mut t);
        // SAFETY: `out` is writable.
        unsafe { *out = Box::into_raw(Box::new(t)).cast() };
        HMC_OK
    })
}

/// Polls a transfer's future once, inside the communicator's scope.
fn poll_transfer<C: Communicator>(g: &GComm<C>, t: &mut GTransfer) {
    let Some(fut) = t.fut.as_mut() else { return };
    let mut cx = Context::from_waker(&g.waker);
    if let Poll::Ready(r) = g.run(|| fut.as_mut().poll(&mut cx)) {
        let code = status(r);
        if code != HMC_OK {
            LAST_ERROR.with(|l| t.message = l.borrow().to_string_lossy().into_owned());
        }
        t.done = Some(code);
        // The batch is finished: drop the future (and its borrows) now.
        let fut = t.fut.take();
        g.run(|| drop(fut));
    }
}

unsafe extern "C" fn transfer_poll<P: PluginTransport>(
    comm: *mut HmcComm,
    t: *mut HmcTransfer,
) -> i32 {
    guard(|| {
        // SAFETY: live handles of this glue; a transfer is used by one thread at a time.
        let (g, t) = unsafe { (at::<GComm<P::Comm>, _>(comm), &mut *(t.cast::<GTransfer>())) };
        poll_transfer(g, t);
        match t.done {
            None => HMC_PENDING,
            Some(HMC_OK) => HMC_OK,
            Some(code) => {
                set_error(&t.message);
                code
            }
        }
    })
}

unsafe extern "C" fn transfer_release<P: PluginTransport>(comm: *mut HmcComm, t: *mut HmcTransfer) {
    guard_void(|| {
        // SAFETY: live handles of this glue, `t` released once.
        let (g, t) = unsafe {
            (
                at::<GComm<P::Comm>, _>(comm),
                Box::from_raw(t.cast::<GTransfer>()),
            )
        };
        // Dropping the future cancels the batch; the Communicator contract says that once
        // the drop returns, the transport no longer touches its local memory.
        g.run(|| drop(t));
    })
}

unsafe extern "C" fn notify<P: PluginTransport>(
    comm: *mut HmcComm,
    ep: *mut HmcEndpoint,
    tag: u64,
    msg: *const u8,
    len: usize,
    deadline_ns: u64,
) -> i32 {
    guard(|| {
        // SAFETY: live handles of this glue; `msg` has `len` readable bytes.
        let (g, ep, msg) = unsafe {
            (
                at::<GComm<P::Comm>, _>(comm),
                at::<<P::Comm as Communicator>::Endpoint, _>(ep),
                if len == 0 {
                    &[][..]
                } else {
                    std::slice::from_raw_parts(msg, len)
                },
            )
        };
        status(block_on(
            g,
            g.comm.notify(ep, tag, msg, deadline_from_ns(deadline_ns)),
        ))
    })
}

unsafe extern "C" fn recv_notification<P: PluginTransport>(
    comm: *mut HmcComm,
    out: *mut HmcNotification,
) -> i32 {
    guard(|| {
        // SAFETY: a live communicator of this glue; `out` is the host's.
        let (g, out) = unsafe { (at::<GComm<P::Comm>, _>(comm), &mut *out) };
        let mut st = g.recv.lock();
        if st.ready.is_none() {
            // SAFETY: the future is stored in `g.recv`, which drops before `g.comm`.
            let comm_ref = unsafe { g.comm_static() };
            let fut = st.fut.get_or_insert_with(|| {
                Box::pin(
                    comm_ref.recv_notification(Deadline::after(Duration::from_secs(86_400 * 365))),
                )
            });
            let mut cx = Context::from_waker(&g.waker);
            match g.run(|| fut.as_mut().poll(&mut cx)) {
                Poll::Pending => return HMC_PENDING,
                Poll::Ready(r) => {
                    st.fut = None;
                    match r {
                        Ok(n) => st.ready = Some(n),
                        Err(Error::DeadlineExceeded { .. }) => return HMC_PENDING,
                        Err(e) => return fail(&e),
                    }
                }
            }
        }
        let n = st.ready.as_ref().expect("set above");
        let from = n.from.to_string();
        out.from_len = from.len();
        out.msg_len = n.msg.len();
        out.tag = n.tag;
        if from.len() > out.from_cap || n.msg.len() > out.msg_cap {
            set_error("recv_notification: the host's buffers are too small");
            return HMC_ERR_TOO_SMALL;
        }
        // SAFETY: the host's buffers have the capacities checked just above.
        unsafe {
            std::ptr::copy_nonoverlapping(from.as_ptr(), out.from, from.len());
            std::ptr::copy_nonoverlapping(n.msg.as_ptr(), out.msg, n.msg.len());
        }
        st.ready = None;
        HMC_OK
    })
}

/// Exports a Rust [`Communicator`] as an HMC transport plugin: defines `hmc_plugin_init`
/// for a `cdylib` crate. The author writes no `unsafe`:
///
/// ```ignore
/// fn open(config: &hmc_plugin::export::Config) -> hmc_core::Result<hmc_plugin::export::Exported<MyComm>> {
///     Ok(hmc_plugin::export::Exported::new(MyComm::bind(config.get("bind"))?))
/// }
/// hmc_plugin::export_plugin! {
///     name: "mytransport",
///     transport: hmc_core::TransportId::from_wire_id(200),
///     comm: MyComm,
///     open: open,
/// }
/// ```
#[macro_export]
macro_rules! export_plugin {
    (name: $name:literal, transport: $transport:expr, comm: $comm:ty, open: $open:path $(,)?) => {
        #[doc(hidden)]
        pub struct __HmcExportedPlugin;

        impl $crate::export::PluginTransport for __HmcExportedPlugin {
            type Comm = $comm;
            const NAME: &'static ::std::ffi::CStr =
                match ::std::ffi::CStr::from_bytes_with_nul(::std::concat!($name, "\0").as_bytes())
                {
                    Ok(n) => n,
                    Err(_) => panic!("a plugin name must not contain NUL"),
                };
            const TRANSPORT: $crate::hmc_core::TransportId = $transport;
            fn open(
                config: &$crate::export::Config,
            ) -> $crate::hmc_core::Result<$crate::export::Exported<$comm>> {
                $open(config)
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
