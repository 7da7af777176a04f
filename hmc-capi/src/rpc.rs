//! The RPC runtime through C (`hmc_rpc_*`): a server whose methods are C callbacks
//! registered by method id (run on the server's worker pool, so they may block), the demo
//! methods in one call, and a client with sync calls and async calls whose completion
//! reaches the caller by status, wait, a pollable descriptor or a callback. Over
//! [`hmc_rpc`]'s server and client, on the library's runtime.

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hmc_core::PeerAddr;
use hmc_rpc::demo::{COMPLEX, ComplexRequest, ComplexResponse, UPPERCASE};
use hmc_rpc::{
    AuthSecret, CallError, CallOptions, CancelToken, Client, ClientConfig, Dispatcher, RpcCodec,
    RpcError, RunningServer, Server, ServerConfig,
};
use hmc_transport_kit::wake::WakeFd;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::error::{Error, Result, Status, call_status, guard, guard_with};
use crate::handles::{
    Table, drain_completed, id, need_out, opaque, optional_arg, ptr, same_engine, sized_arg,
    slice_arg, str_arg, write_buf, write_out,
};
use crate::{block_on, runtime};

opaque! {
    /// `hmc_rpc_server`: an opaque server handle.
    HmcRpcServer;
    /// `hmc_rpc_client`: an opaque client handle.
    HmcRpcClient;
    /// `hmc_rpc_call`: a call being handled, valid during its handler.
    HmcRpcCall;
    /// `hmc_rpc_pending`: an asynchronous client call.
    HmcRpcPending;
    /// `hmc_bytes`: bytes the library returns (a response).
    HmcBytes;
}

/// `hmc_rpc_handler`: a method's C implementation; returns 0 (OK, with the bytes given to
/// `hmc_rpc_respond` as the response) or an RPC status (application codes from 1000),
/// with those bytes as the error message.
pub type RpcHandler = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        call: *mut HmcRpcCall,
        request: *const u8,
        request_len: usize,
    ) -> u32,
>;

/// `hmc_rpc_callback`: called once, on a library thread, when an async call ends.
pub type RpcCallback =
    Option<unsafe extern "C" fn(user_data: *mut c_void, call: *mut HmcRpcPending, status: i32)>;

/// `hmc_rpc_server_options`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RpcServerOptions {
    /// `sizeof(hmc_rpc_server_options)`.
    pub struct_size: usize,
    /// Threads running the C handlers (0: the default, 4).
    pub workers: u32,
    /// Calls running at once across connections (0: the default, 4096).
    pub max_inflight: u32,
    /// NULL, or a file holding the pre-shared secret every client must prove.
    pub auth_secret_file: *const c_char,
}

impl Default for RpcServerOptions {
    fn default() -> Self {
        RpcServerOptions {
            struct_size: 0,
            workers: 0,
            max_inflight: 0,
            auth_secret_file: std::ptr::null(),
        }
    }
}

/// `hmc_rpc_client_options`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RpcClientOptions {
    /// `sizeof(hmc_rpc_client_options)`.
    pub struct_size: usize,
    /// How long connecting may take (0: 5 s).
    pub connect_timeout_ms: u32,
    /// Deadline of a call whose timeout is 0 (0: 30 s).
    pub default_timeout_ms: u32,
    /// NULL, or a file holding the server's pre-shared secret.
    pub auth_secret_file: *const c_char,
}

impl Default for RpcClientOptions {
    fn default() -> Self {
        RpcClientOptions {
            struct_size: 0,
            connect_timeout_ms: 0,
            default_timeout_ms: 0,
            auth_secret_file: std::ptr::null(),
        }
    }
}

/// `hmc_rpc_complex_result`: the demo method `complex`'s answer.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ComplexResult {
    /// `sizeof(hmc_rpc_complex_result)`, set by the caller.
    pub struct_size: usize,
    /// Number of values.
    pub count: u32,
    /// 1 when there were values (min, max and mean are set), else 0.
    pub has_values: u32,
    /// Their sum (saturating).
    pub sum: i64,
    /// Smallest value.
    pub min: i64,
    /// Largest value.
    pub max: i64,
    /// Their mean.
    pub mean: f64,
}

enum ServerState {
    /// Boxed: the method table and settings are large beside a running server.
    Building(Box<(Dispatcher, ServerConfig)>),
    Running(RunningServer),
    Closed,
}

struct ServerObj {
    state: Mutex<ServerState>,
}

/// A call being handled: what the C handler may ask about it, and its response.
struct CallObj {
    deadline: Option<Instant>,
    cancel: CancelToken,
    response: Mutex<Vec<u8>>,
}

struct ClientObj {
    client: Client,
    default_timeout: Duration,
    wake: Arc<WakeFd>,
    completed: Arc<Mutex<VecDeque<u64>>>,
}

/// How an async call ended.
#[derive(Clone)]
struct Outcome {
    status: Status,
    message: String,
    rpc_status: u32,
    body: Bytes,
}

struct PendingObj {
    client: u64,
    done: watch::Receiver<Option<Outcome>>,
    cancel: Arc<tokio::sync::Notify>,
}

static SERVERS: Table<ServerObj> = Table::new("RPC server", 5);
static CLIENTS: Table<ClientObj> = Table::new("RPC client", 6);
static CALLS: Table<CallObj> = Table::new("RPC call", 7);
static BYTES: Table<Bytes> = Table::new("byte buffer", 8);
static PENDING: Table<PendingObj> = Table::new("RPC pending call", 9);

/// A C pointer carried to another thread.
struct SendPtr(*mut c_void);
// SAFETY: the pointer is only handed back to the caller's own callback or handler, which
// hmc.h documents as called from library threads.
unsafe impl Send for SendPtr {}
// SAFETY: as above; the library never dereferences it.
unsafe impl Sync for SendPtr {}

/// Reads an optional secret file argument.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn secret_arg(p: *const c_char) -> Result<Option<AuthSecret>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: forwarded contract.
    let path = unsafe { str_arg(p, "auth_secret_file") }?;
    Ok(Some(AuthSecret::from_file(std::path::Path::new(path))?))
}

fn addr_arg(s: &str) -> Result<PeerAddr> {
    s.parse::<PeerAddr>().map_err(|e| {
        Error::InvalidArgument(format!(
            "`{s}` is not an RPC address ({e}); use tcp://IP:PORT or unix:///path"
        ))
    })
}

fn ms_or(ms: u32, default: Duration) -> Duration {
    if ms == 0 {
        default
    } else {
        Duration::from_millis(u64::from(ms))
    }
}

/// `hmc_rpc_server_new`: see `hmc.h`.
///
/// # Safety
/// `options` is NULL or a valid `hmc_rpc_server_options`; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_rpc_server_new(
    options: *const RpcServerOptions,
    out: *mut *mut HmcRpcServer,
) -> Status {
    guard("hmc_rpc_server_new", || {
        need_out(out, "out")?;
        // SAFETY: forwarded contract.
        let o = unsafe { optional_arg(options, "hmc_rpc_server_options") }?;
        let mut config = ServerConfig::default();
        if o.workers > 0 {
            config.workers = o.workers as usize;
        }
        if o.max_inflight > 0 {
            config.max_inflight_total = o.max_inflight as usize;
        }
        // SAFETY: forwarded contract.
        config.auth_secret = unsafe { secret_arg(o.auth_secret_file) }?;
        let s = SERVERS.insert(ServerObj {
            state: Mutex::new(ServerState::Building(Box::new((Dispatcher::new(), config)))),
        });
        // SAFETY: checked writable above.
        unsafe { write_out(out, "out", ptr(s)) }
    })
}

/// Runs `f` on the server's method table, which exists until the server starts.
fn building(server: *mut HmcRpcServer, f: impl FnOnce(&mut Dispatcher)) -> Result<()> {
    let s = SERVERS.get(id(server))?;
    let mut state = s.state.lock();
    match &mut *state {
        ServerState::Building(b) => {
            f(&mut b.0);
            Ok(())
        }
        _ => Err(Error::State(
            "the server has started (or closed); register its methods before hmc_rpc_server_start"
                .into(),
        )),
    }
}

/// Runs the C handler for one call.
fn run_handler(
    handler: unsafe extern "C" fn(*mut c_void, *mut HmcRpcCall, *const u8, usize) -> u32,
    user: &SendPtr,
    ctx: &hmc_rpc::CallContext,
    body: Bytes,
) -> hmc_rpc::dispatch::HandlerResult {
    let call = CALLS.insert(CallObj {
        deadline: ctx.deadline,
        cancel: ctx.cancel.clone(),
        response: Mutex::new(Vec::new()),
    });
    // SAFETY: the caller's handler, with its data and the request's bytes, valid for the
    // call; the call handle is valid until it returns (removed right after).
    let code = unsafe { handler(user.0, ptr(call), body.as_ptr(), body.len()) };
    let obj = CALLS
        .remove(call)
        .map_err(|e| RpcError::new(hmc_rpc::Status::INTERNAL, e.to_string()))?;
    let response = std::mem::take(&mut *obj.response.lock());
    if code == 0 {
        Ok(Bytes::from(response))
    } else {
        Err(RpcError::new(
            hmc_rpc::Status(code),
            String::from_utf8_lossy(&response).into_owned(),
        ))
    }
}

/// `hmc_rpc_server_register`: see `hmc.h`.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_rpc_server_register(
    server: *mut HmcRpcServer,
    method_id: u32,
    handler: RpcHandler,
    user_data: *mut c_void,
) -> Status {
    guard("hmc_rpc_server_register", || {
        let handler = handler.ok_or(Error::Null("handler"))?;
        let user = SendPtr(user_data);
        building(server, |d| {
            d.register_raw_blocking(method_id, move |ctx, body| {
                run_handler(handler, &user, ctx, body)
            });
        })
    })
}

/// `hmc_rpc_server_register_demo`: see `hmc.h`.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_rpc_server_register_demo(server: *mut HmcRpcServer) -> Status {
    guard("hmc_rpc_server_register_demo", || {
        building(server, |d| {
            hmc_rpc::demo::register_demo(d);
        })
    })
}

/// `hmc_rpc_server_start`: see `hmc.h`.
///
/// # Safety
/// `addr` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_rpc_server_start(
    server: *mut HmcRpcServer,
    addr: *const c_char,
) -> Status {
    guard("hmc_rpc_server_start", || {
        // SAFETY: forwarded contract.
        let addr = addr_arg(unsafe { str_arg(addr, "addr") }?)?;
        let s = SERVERS.get(id(server))?;
        let mut state = s.state.lock();
        // Copies, so that a failed bind leaves the server as it was (to start elsewhere).
        let ServerState::Building(b) = &*state else {
            return Err(Error::State(
                "the server has already started (or closed)".into(),
            ));
        };
        let server = Server::new(b.0.clone(), b.1.clone());
        let bound = block_on(async move { server.bind(&addr).await })??;
        *state = ServerState::Running(bound);
        Ok(())
    })
}

/// `hmc_rpc_server_address`: see `hmc.h`.
///
/// # Safety
/// `buf` is NULL or writable for `cap` bytes; `len` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_rpc_server_address(
    server: *const HmcRpcServer,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> Status {
    guard("hmc_rpc_server_address", || {
        let s = SERVERS.get(id(server))?;
        let addr = match &*s.state.lock() {
            ServerState::Running(r) => r.local_addr().to_string(),
            _ => return Err(Error::State("the server is not running".into())),
        };
        // SAFETY: forwarded contract.
        unsafe { write_buf(addr.as_bytes(), true, buf.cast(), cap, len, "the address") }
    })
}

/// `hmc_rpc_server_close`: see `hmc.h`.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_rpc_server_close(server: *mut HmcRpcServer) -> Status {
    guard("hmc_rpc_server_close", || {
        let s = SERVERS.remove(id(server))?;
        let state = std::mem::replace(&mut *s.state.lock(), ServerState::Closed);
        if let ServerState::Running(r) = state {
            if tokio::runtime::Handle::try_current().is_ok() {
                runtime()?.spawn(async move { r.shutdown().await });
            } else {
                block_on(r.shutdown())?;
            }
        }
        Ok(())
    })
}

/// `hmc_rpc_respond`: see `hmc.h`.
///
/// # Safety
/// `data` is readable for `len` bytes (or NULL with 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_rpc_respond(
    call: *mut HmcRpcCall,
    data: *const u8,
    len: usize,
) -> Status {
    guard("hmc_rpc_respond", || {
        let c = CALLS.get(id(call))?;
        // SAFETY: forwarded contract; bounded by the protocol's largest payload first.
        let bytes = unsafe { slice_arg(data, len, 1 << 40, "data", "max_payload_len") }?;
        *c.response.lock() = bytes.to_vec();
        Ok(())
    })
}

/// `hmc_rpc_call_remaining_ms`: see `hmc.h`.
///
/// # Safety
/// `ms` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_rpc_call_remaining_ms(
    call: *const HmcRpcCall,
    ms: *mut i64,
) -> Status {
    guard("hmc_rpc_call_remaining_ms", || {
        let c = CALLS.get(id(call))?;
        let left = c.deadline.map_or(-1, |d| {
            d.saturating_duration_since(Instant::now()).as_millis() as i64
        });
        // SAFETY: forwarded contract.
        unsafe { write_out(ms, "ms", left) }
    })
}

/// `hmc_rpc_call_cancelled`: see `hmc.h`.
///
/// # Safety
/// `cancelled` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_rpc_call_cancelled(
    call: *const HmcRpcCall,
    cancelled: *mut c_int,
) -> Status {
    guard("hmc_rpc_call_cancelled", || {
        let c = CALLS.get(id(call))?;
        // SAFETY: forwarded contract.
        unsafe { write_out(cancelled, "cancelled", c_int::from(c.cancel.is_cancelled())) }
    })
}

/// `hmc_rpc_client_connect`: see `hmc.h`.
///
/// # Safety
/// `addr` is a NUL-terminated string; `options` is NULL or a valid
/// `hmc_rpc_client_options`; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_rpc_client_connect(
    addr: *const c_char,
    options: *const RpcClientOptions,
    out: *mut *mut HmcRpcClient,
) -> Status {
    guard("hmc_rpc_client_connect", || {
        need_out(out, "out")?;
        // SAFETY: forwarded contract.
        let addr = addr_arg(unsafe { str_arg(addr, "addr") }?)?;
        // SAFETY: forwarded contract.
        let o = unsafe { optional_arg(options, "hmc_rpc_client_options") }?;
        let mut config = ClientConfig::default();
        config.connect_timeout = ms_or(o.connect_timeout_ms, config.connect_timeout);
        config.default_timeout = ms_or(o.default_timeout_ms, config.default_timeout);
        // SAFETY: forwarded contract.
        config.auth_secret = unsafe { secret_arg(o.auth_secret_file) }?;
        let default_timeout = config.default_timeout;
        let client = block_on(Client::connect(&addr, config))??;
        let c = CLIENTS.insert(ClientObj {
            client,
            default_timeout,
            wake: Arc::new(WakeFd::new("the RPC client's completion eventfd")?),
            completed: Arc::default(),
        });
        // SAFETY: checked writable above.
        unsafe { write_out(out, "out", ptr(c)) }
    })
}

/// `hmc_rpc_client_close`: see `hmc.h`.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_rpc_client_close(client: *mut HmcRpcClient) -> Status {
    guard("hmc_rpc_client_close", || {
        CLIENTS.remove(id(client))?;
        let me = id(client);
        for p in PENDING.remove_where(|p| p.client == me) {
            p.cancel.notify_one();
        }
        Ok(())
    })
}

impl ClientObj {
    /// A call's options: its timeout, or the client's default for 0.
    fn options(&self, timeout_ms: u32) -> CallOptions {
        CallOptions {
            timeout: Some(ms_or(timeout_ms, self.default_timeout)),
            ..CallOptions::default()
        }
    }
}

/// A request's bytes from C, copied (the call may outlive the caller's buffer).
///
/// # Safety
/// `request` is readable for `len` bytes (or NULL with 0).
unsafe fn payload_arg(request: *const u8, len: usize) -> Result<Bytes> {
    // SAFETY: forwarded contract; the length is bounded first.
    let req = unsafe { slice_arg(request, len, 1 << 40, "request", "max_payload_len") }?;
    Ok(Bytes::copy_from_slice(req))
}

/// A failed call's status, message and RPC status code.
fn failed(e: &CallError) -> Outcome {
    Outcome {
        status: call_status(e),
        message: e.to_string(),
        rpc_status: e.status().map_or(0, |s| s.0),
        body: Bytes::new(),
    }
}

/// Writes a call's outcome to the caller's outputs: the response as a new `hmc_bytes`,
/// the RPC status code; a failure becomes the returned error.
///
/// # Safety
/// `response` and `rpc_status` are NULL or writable.
unsafe fn deliver(o: Outcome, response: *mut *mut HmcBytes, rpc_status: *mut u32) -> Result<()> {
    if !rpc_status.is_null() {
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { rpc_status.write(o.rpc_status) };
    }
    if o.status != Status::Ok {
        return Err(Error::Request {
            status: o.status,
            message: o.message,
        });
    }
    if !response.is_null() {
        let b = BYTES.insert(o.body);
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { response.write(ptr(b)) };
    }
    Ok(())
}

/// `hmc_rpc_call_sync`: see `hmc.h`.
///
/// # Safety
/// `request` is readable for `request_len` bytes (or NULL with 0); `response` and
/// `rpc_status` are NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_rpc_call_sync(
    client: *mut HmcRpcClient,
    method_id: u32,
    request: *const u8,
    request_len: usize,
    timeout_ms: u32,
    response: *mut *mut HmcBytes,
    rpc_status: *mut u32,
) -> Status {
    guard("hmc_rpc_call_sync", || {
        let c = CLIENTS.get(id(client))?;
        // SAFETY: forwarded contract.
        let payload = unsafe { payload_arg(request, request_len) }?;
        let opts = c.options(timeout_ms);
        let o = match block_on(c.client.call_with(method_id, payload, opts))? {
            Ok(body) => Outcome::from(body),
            Err(e) => failed(&e),
        };
        // SAFETY: forwarded contract.
        unsafe { deliver(o, response, rpc_status) }
    })
}

/// `hmc_rpc_call_async`: see `hmc.h`.
///
/// # Safety
/// `request` is readable for `request_len` bytes (or NULL with 0); `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_rpc_call_async(
    client: *mut HmcRpcClient,
    method_id: u32,
    request: *const u8,
    request_len: usize,
    timeout_ms: u32,
    callback: RpcCallback,
    user_data: *mut c_void,
    out: *mut *mut HmcRpcPending,
) -> Status {
    guard("hmc_rpc_call_async", || {
        need_out(out, "out")?;
        let c = CLIENTS.get(id(client))?;
        // SAFETY: forwarded contract.
        let payload = unsafe { payload_arg(request, request_len) }?;
        let opts = c.options(timeout_ms);
        let (tx, rx) = watch::channel(None);
        let cancel = Arc::new(tokio::sync::Notify::new());
        let pid = PENDING.insert(PendingObj {
            client: id(client),
            done: rx,
            cancel: cancel.clone(),
        });
        // SAFETY: checked writable above; written before the call can end.
        unsafe { write_out(out, "out", ptr(pid)) }?;
        let user = SendPtr(user_data);
        let rt = runtime()?;
        rt.spawn(async move {
            // Dropping the call's future sends the server a CANCEL.
            let o = tokio::select! {
                r = c.client.call_with(method_id, payload, opts) => match r {
                    Ok(body) => Outcome::from(body),
                    Err(e) => failed(&e),
                },
                _ = cancel.notified() => Outcome {
                    status: Status::Cancelled,
                    message: format!("the call of method {method_id} was cancelled"),
                    rpc_status: hmc_rpc::Status::CANCELLED.0,
                    body: Bytes::new(),
                },
            };
            let status = o.status;
            let _ = tx.send(Some(o));
            c.completed.lock().push_back(pid);
            c.wake.signal();
            drop(c);
            if let Some(cb) = callback {
                let user = user;
                // SAFETY: the caller's callback with the caller's data, as documented.
                unsafe { cb(user.0, ptr(pid), status as i32) };
            }
        });
        Ok(())
    })
}

impl From<Bytes> for Outcome {
    fn from(body: Bytes) -> Self {
        Outcome {
            status: Status::Ok,
            message: String::new(),
            rpc_status: 0,
            body,
        }
    }
}

/// The pending call `p` of client `c`.
fn pending_arg(c: *const HmcRpcClient, p: *const HmcRpcPending) -> Result<Arc<PendingObj>> {
    CLIENTS.get(id(c))?;
    let obj = PENDING.get(id(p))?;
    same_engine("RPC pending call", id(p), obj.client, id(c))?;
    Ok(obj)
}

/// `hmc_rpc_pending_wait`: see `hmc.h`.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_rpc_pending_wait(
    client: *mut HmcRpcClient,
    call: *mut HmcRpcPending,
    timeout_ms: u32,
) -> Status {
    guard_with("hmc_rpc_pending_wait", || {
        let p = pending_arg(client, call)?;
        let mut rx = p.done.clone();
        if rx.borrow().is_none() && timeout_ms > 0 {
            let wait = Duration::from_millis(u64::from(timeout_ms));
            // The timer is made inside the runtime (block_on's future), which it needs.
            let _ = block_on(async {
                tokio::time::timeout(wait, rx.wait_for(Option::is_some))
                    .await
                    .is_ok()
            })?;
        }
        let o = rx.borrow().clone();
        match o {
            None => Ok(Status::Pending),
            Some(o) if o.status == Status::Ok => Ok(Status::Ok),
            Some(o) => Err(Error::Request {
                status: o.status,
                message: o.message,
            }),
        }
    })
}

/// `hmc_rpc_pending_take`: see `hmc.h`.
///
/// # Safety
/// `response` and `rpc_status` are NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_rpc_pending_take(
    client: *mut HmcRpcClient,
    call: *mut HmcRpcPending,
    response: *mut *mut HmcBytes,
    rpc_status: *mut u32,
) -> Status {
    guard_with("hmc_rpc_pending_take", || {
        let p = pending_arg(client, call)?;
        let o = p.done.borrow().clone();
        match o {
            None => Ok(Status::Pending),
            // SAFETY: forwarded contract.
            Some(o) => unsafe { deliver(o, response, rpc_status) }.map(|()| Status::Ok),
        }
    })
}

/// `hmc_rpc_pending_cancel`: see `hmc.h`.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_rpc_pending_cancel(
    client: *mut HmcRpcClient,
    call: *mut HmcRpcPending,
) -> Status {
    guard("hmc_rpc_pending_cancel", || {
        pending_arg(client, call)?.cancel.notify_one();
        Ok(())
    })
}

/// `hmc_rpc_pending_release`: see `hmc.h`.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_rpc_pending_release(
    client: *mut HmcRpcClient,
    call: *mut HmcRpcPending,
) -> Status {
    guard("hmc_rpc_pending_release", || {
        pending_arg(client, call)?;
        let p = PENDING.remove(id(call))?;
        if p.done.borrow().is_none() {
            p.cancel.notify_one();
        }
        Ok(())
    })
}

/// `hmc_rpc_client_fd`: see `hmc.h`.
///
/// # Safety
/// `fd` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_rpc_client_fd(client: *const HmcRpcClient, fd: *mut c_int) -> Status {
    guard("hmc_rpc_client_fd", || {
        let c = CLIENTS.get(id(client))?;
        // SAFETY: forwarded contract.
        unsafe { write_out(fd, "fd", c.wake.as_raw_fd()) }
    })
}

/// `hmc_rpc_client_fd_drain`: see `hmc.h`.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_rpc_client_fd_drain(client: *const HmcRpcClient) -> Status {
    guard("hmc_rpc_client_fd_drain", || {
        CLIENTS.get(id(client))?.wake.drain();
        Ok(())
    })
}

/// `hmc_rpc_client_poll_completed`: see `hmc.h`.
///
/// # Safety
/// `calls` is writable for `cap` handles; `count` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_rpc_client_poll_completed(
    client: *mut HmcRpcClient,
    calls: *mut *mut HmcRpcPending,
    cap: usize,
    count: *mut usize,
) -> Status {
    guard("hmc_rpc_client_poll_completed", || {
        need_out(count, "count")?;
        if cap > 0 {
            need_out(calls, "calls")?;
        }
        let c = CLIENTS.get(id(client))?;
        // SAFETY: forwarded contract.
        let n = unsafe { drain_completed(&mut c.completed.lock(), &PENDING, calls, cap) };
        // SAFETY: checked writable above.
        unsafe { write_out(count, "count", n) }
    })
}

/// `hmc_bytes_data`: see `hmc.h`.
///
/// # Safety
/// `data` and `len` are writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_bytes_data(
    bytes: *const HmcBytes,
    data: *mut *const u8,
    len: *mut usize,
) -> Status {
    guard("hmc_bytes_data", || {
        need_out(data, "data")?;
        need_out(len, "len")?;
        let b = BYTES.get(id(bytes))?;
        // The bytes stay where they are until hmc_bytes_free: the table holds them.
        // SAFETY: checked writable above.
        unsafe {
            write_out(data, "data", b.as_ptr())?;
            write_out(len, "len", b.len())
        }
    })
}

/// `hmc_bytes_free`: see `hmc.h`.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_bytes_free(bytes: *mut HmcBytes) -> Status {
    guard("hmc_bytes_free", || {
        BYTES.remove(id(bytes))?;
        Ok(())
    })
}

/// A typed call of a demo method.
fn demo_call(c: &ClientObj, method: u32, req: Vec<u8>, timeout_ms: u32) -> Result<Bytes> {
    let opts = c.options(timeout_ms);
    Ok(block_on(c.client.call_with(method, req, opts))??)
}

/// `hmc_rpc_demo_uppercase`: see `hmc.h`.
///
/// # Safety
/// `text` is a NUL-terminated string; `buf` is NULL or writable for `cap` bytes; `len`
/// is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_rpc_demo_uppercase(
    client: *mut HmcRpcClient,
    text: *const c_char,
    timeout_ms: u32,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> Status {
    guard("hmc_rpc_demo_uppercase", || {
        let c = CLIENTS.get(id(client))?;
        // SAFETY: forwarded contract.
        let text = unsafe { str_arg(text, "text") }?;
        let req = RpcCodec::encode(text).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let body = demo_call(&c, UPPERCASE, req, timeout_ms)?;
        let upper: String = RpcCodec::decode(&body)
            .map_err(|e| Error::InvalidArgument(format!("the answer of uppercase: {e}")))?;
        // SAFETY: forwarded contract.
        unsafe { write_buf(upper.as_bytes(), true, buf.cast(), cap, len, "the answer") }
    })
}

/// `hmc_rpc_demo_complex`: see `hmc.h`.
///
/// # Safety
/// `label` is a NUL-terminated string; `values` is readable for `num_values` values;
/// `out` points to a `hmc_rpc_complex_result` whose `struct_size` is set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_rpc_demo_complex(
    client: *mut HmcRpcClient,
    label: *const c_char,
    values: *const i64,
    num_values: usize,
    timeout_ms: u32,
    out: *mut ComplexResult,
) -> Status {
    guard("hmc_rpc_demo_complex", || {
        let c = CLIENTS.get(id(client))?;
        // SAFETY: forwarded contract.
        let label = unsafe { str_arg(label, "label") }?.to_string();
        // SAFETY: forwarded contract; bounded first.
        let values = unsafe { slice_arg(values, num_values, 1 << 24, "values", "values") }?;
        // SAFETY: forwarded contract (reads its struct_size).
        let shape =
            unsafe { sized_arg(out, "hmc_rpc_complex_result", size_of::<ComplexResult>()) }?;
        let req = RpcCodec::encode(&ComplexRequest {
            label,
            values: values.to_vec(),
        })
        .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let body = demo_call(&c, COMPLEX, req, timeout_ms)?;
        let r: ComplexResponse = RpcCodec::decode(&body)
            .map_err(|e| Error::InvalidArgument(format!("the answer of complex: {e}")))?;
        let v = ComplexResult {
            struct_size: shape.struct_size,
            count: r.count,
            has_values: u32::from(r.min.is_some()),
            sum: r.sum,
            min: r.min.unwrap_or(0),
            max: r.max.unwrap_or(0),
            mean: r.mean.unwrap_or(0.0),
        };
        // SAFETY: writable for its struct_size, at least ours (checked by sized_arg).
        unsafe { out.write(v) };
        Ok(())
    })
}
