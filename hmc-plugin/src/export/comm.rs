//! The transport half of the Rust plugin glue: an `hmc_core::Communicator` behind the table's `comm_*`, `connect` … `recv_notification` functions.

use std::ffi::c_void;
use std::future::Future;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use hmc_core::{
    Access, Communicator, Deadline, Error, Notification, Op, PeerAddr, RemoteRegion, Result,
    TransferDesc, TransportId,
};
use hmc_transport_kit::wake::WakeFd;
use parking_lot::Mutex;

use super::{
    Config, LAST_ERROR, at, config_from, fail, guard, guard_void, hand_out, region_of, set_error,
    slice_of, status, write_out, write_sized,
};
use crate::abi::*;

/// A Rust transport exported as a plugin; implemented by [`export_plugin!`](crate::export_plugin).
pub trait PluginTransport: 'static {
    /// The communicator type.
    type Comm: Communicator;
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
/// Signals an eventfd when woken.
struct FdWaker(Arc<WakeFd>);

impl Wake for FdWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.signal();
    }
}

type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The handle types of plugin `P`'s communicator, as the glue boxes them.
type Ep<P> = <<P as PluginTransport>::Comm as Communicator>::Endpoint;
type Reg<P> = <<P as PluginTransport>::Comm as Communicator>::Registration;
type Key<P> = <<P as PluginTransport>::Comm as Communicator>::RemoteKey;

/// Sets the transport functions of `P` in `api`, its transport id and
/// `HMC_PLUGIN_PROVIDES_COMMUNICATOR`; [`export_plugin!`](crate::export_plugin) calls it.
pub fn fill_transport<P: PluginTransport>(api: &mut HmcPluginApi) {
    api.header.capabilities |= HMC_PLUGIN_PROVIDES_COMMUNICATOR;
    api.transport_id = P::TRANSPORT.wire_id() as u32;
    api.comm_open = Some(comm_open::<P>);
    api.comm_close = Some(comm_close::<P>);
    api.comm_destroy = Some(comm_destroy::<P>);
    api.comm_event_fd = Some(comm_event_fd::<P>);
    api.comm_address = Some(comm_address::<P>);
    api.comm_capabilities = Some(comm_capabilities::<P>);
    api.connect = Some(connect::<P>);
    api.endpoint_release = Some(endpoint_release::<P>);
    api.register_mem = Some(register::<P>);
    api.deregister = Some(deregister::<P>);
    api.export_key = Some(export_key::<P>);
    api.rekey = Some(rekey::<P>);
    api.import = Some(import::<P>);
    api.remote_key_release = Some(remote_key_release::<P>);
    api.transfer_start = Some(transfer_start::<P>);
    api.transfer_start_wake = Some(transfer_start_wake::<P>);
    api.transfer_poll = Some(transfer_poll::<P>);
    api.transfer_release = Some(transfer_release::<P>);
    api.notify = Some(notify::<P>);
    api.recv_notification = Some(recv_notification::<P>);
    api.endpoint_settle = Some(endpoint_settle::<P>);
}

/// The communicator behind an `HmcComm*`.
struct GComm<C: Communicator> {
    // Field order: futures borrowing `comm` drop before it.
    recv: Mutex<RecvState>,
    comm: Arc<C>,
    scope: Option<Scope>,
    efd: Arc<WakeFd>,
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
    wake: Arc<TransferWaker>,
    done: Option<i32>,
    message: String,
}

/// How many times in a row a transfer that wakes itself while being polled is polled again
/// in place before the host is asked to come back through the eventfd (letting the host's
/// other tasks run in between).
const REPOLLS_IN_PLACE: usize = 64;

const IDLE: u8 = 0;
const POLLING: u8 = 1;
const WOKEN_WHILE_POLLING: u8 = 2;

/// One transfer's waker. A wake while its future is being polled (a future that yields,
/// such as the TCP transport busy-polling its socket) only marks it, and the glue polls it
/// again in place: going through the eventfd, the host's poller and a task switch for every
/// yield would cost more than the op. A wake at any other time tells the host: through its
/// wake callback when it gave one (`transfer_start_wake`), else through the eventfd.
struct TransferWaker {
    efd: Arc<WakeFd>,
    state: AtomicU8,
    /// The host's callback; `None` without one and once the transfer is released (a waker
    /// clone a transport kept may outlive the transfer, the host's context does not).
    host: Mutex<Option<HostWake>>,
}

/// The host's wake callback and its context (`transfer_start_wake`).
#[derive(Clone, Copy)]
struct HostWake {
    wake: HmcWakeFn,
    ctx: *const c_void,
}

// SAFETY: the ABI lets the callback be called with its context from any thread, until
// transfer_release returns (which takes it out of the waker under the lock first).
unsafe impl Send for HostWake {}

impl TransferWaker {
    /// Tells the host to poll this transfer again.
    fn notify_host(&self) {
        let host = self.host.lock();
        match *host {
            // SAFETY: the context is valid until transfer_release, which clears `host`
            // under this lock before it returns.
            Some(h) => unsafe { (h.wake)(h.ctx) },
            None => {
                drop(host);
                self.efd.signal();
            }
        }
    }
}

impl Wake for TransferWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let marked = self.state.compare_exchange(
            POLLING,
            WOKEN_WHILE_POLLING,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if marked == Err(IDLE) {
            self.notify_host();
        }
    }
}

fn deadline_from_ns(ns: u64) -> Deadline {
    hmc_transport_kit::deadline::from_monotonic_ns(ns)
}

unsafe extern "C" fn comm_open<P: PluginTransport>(
    config: *const u8,
    len: usize,
    out: *mut *mut HmcComm,
) -> i32 {
    guard(|| {
        // SAFETY: the host passes `len` readable bytes.
        let opened = unsafe { config_from(config, len) }.and_then(|c| P::open(&c));
        let exported = match opened {
            Ok(e) => e,
            Err(e) => return fail(&e),
        };
        let efd = match WakeFd::new("a plugin communicator's eventfd") {
            Ok(efd) => Arc::new(efd),
            Err(e) => return fail(&e),
        };
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
        // SAFETY: the host's struct is writable for its struct_size, its first field.
        unsafe { write_sized(caps, out) };
        HMC_OK
    })
}

/// Runs a future to completion on the calling thread (the ABI's blocking calls).
fn block_on<C: Communicator, T>(g: &GComm<C>, fut: impl Future<Output = T>) -> T {
    g.run(|| futures::executor::block_on(fut))
}

/// Takes back a handle of type `T` that the glue handed out, and drops it inside the
/// communicator's scope (a transport's drop may need its runtime).
///
/// # Safety
/// `comm` is a live communicator of this glue; `handle` is a live `T` of it, released
/// once.
unsafe fn release_in_scope<C: Communicator, T, H>(comm: *mut HmcComm, handle: *mut H) {
    guard_void(|| {
        // SAFETY: per this function's contract.
        let (g, handle) = unsafe { (at::<GComm<C>, _>(comm), Box::from_raw(handle.cast::<T>())) };
        g.run(|| drop(handle));
    })
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
        let (g, text) = unsafe { (at::<GComm<P::Comm>, _>(comm), slice_of(addr, addr_len)) };
        let peer = match std::str::from_utf8(text)
            .map_err(|_| "not UTF-8".to_string())
            .and_then(|t| PeerAddr::from_str(t).map_err(|e| e.to_string()))
        {
            Ok(p) => p,
            Err(e) => return fail(&Error::InvalidArgument(format!("connect address: {e}"))),
        };
        let connected = block_on(g, g.comm.connect(&peer, deadline_from_ns(deadline_ns)));
        // SAFETY: `out` is writable.
        unsafe { hand_out(connected, out) }
    })
}

unsafe extern "C" fn endpoint_release<P: PluginTransport>(
    comm: *mut HmcComm,
    ep: *mut HmcEndpoint,
) {
    // SAFETY: forwarded from the host: a live communicator, `ep` released once.
    unsafe { release_in_scope::<P::Comm, Ep<P>, _>(comm, ep) }
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
        let region = match region_of(&r) {
            Ok(region) => region,
            Err(e) => return fail(&e),
        };
        // SAFETY: the host keeps the memory allocated until deregister returns (ABI).
        let registered = g.run(|| unsafe { g.comm.register(region, access) });
        // SAFETY: `out` is writable.
        unsafe { hand_out(registered, out) }
    })
}

unsafe extern "C" fn deregister<P: PluginTransport>(comm: *mut HmcComm, reg: *mut HmcReg) {
    // SAFETY: forwarded from the host: a live communicator, `reg` released once.
    unsafe { release_in_scope::<P::Comm, Reg<P>, _>(comm, reg) }
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
        let (g, reg) = unsafe { (at::<GComm<P::Comm>, _>(comm), at::<Reg<P>, _>(reg)) };
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
        let (g, reg) = unsafe { (at::<GComm<P::Comm>, _>(comm), at::<Reg<P>, _>(reg)) };
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
                at::<Ep<P>, _>(ep),
                slice_of(d.key, d.key_len),
            )
        };
        // SAFETY: `desc` is readable during the call.
        let d = unsafe { &*desc };
        let bits = u8::try_from(d.access).unwrap_or(0);
        let result = Access::from_bits(bits).and_then(|access| {
            let remote = RemoteRegion {
                transport: P::TRANSPORT,
                region: region_of(&d.region)?,
                access,
                key: key.to_vec(),
            };
            g.run(|| g.comm.import(ep, &remote))
        });
        // SAFETY: `out` is writable.
        unsafe { hand_out(result, out) }
    })
}

unsafe extern "C" fn remote_key_release<P: PluginTransport>(
    comm: *mut HmcComm,
    key: *mut HmcRemoteKey,
) {
    // SAFETY: forwarded from the host: a live communicator, `key` released once.
    unsafe { release_in_scope::<P::Comm, Key<P>, _>(comm, key) }
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
    // SAFETY: forwarded from the host, under the same contract.
    unsafe { start::<P>(comm, ep, op, descs, count, deadline_ns, None, out) }
}

unsafe extern "C" fn transfer_start_wake<P: PluginTransport>(
    comm: *mut HmcComm,
    ep: *mut HmcEndpoint,
    op: u32,
    descs: *const HmcTransferDesc,
    count: usize,
    deadline_ns: u64,
    wake: HmcWakeFn,
    wake_ctx: *const c_void,
    out: *mut *mut HmcTransfer,
) -> i32 {
    let host = Some(HostWake {
        wake,
        ctx: wake_ctx,
    });
    // SAFETY: forwarded from the host, under the same contract.
    unsafe { start::<P>(comm, ep, op, descs, count, deadline_ns, host, out) }
}

/// `transfer_start` and `transfer_start_wake` (`host`: the latter's callback).
///
/// # Safety
/// As `transfer_start` in the ABI: live handles, `descs` readable for `count`, `out`
/// writable.
#[allow(clippy::too_many_arguments)]
unsafe fn start<P: PluginTransport>(
    comm: *mut HmcComm,
    ep: *mut HmcEndpoint,
    op: u32,
    descs: *const HmcTransferDesc,
    count: usize,
    deadline_ns: u64,
    host: Option<HostWake>,
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
        // SAFETY: `descs` has `count` readable elements during this call.
        let raw = unsafe { slice_of(descs, count) };
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
            wake: Arc::new(TransferWaker {
                efd: g.efd.clone(),
                state: AtomicU8::new(IDLE),
                host: Mutex::new(host),
            }),
            done: None,
            message: String::new(),
        };
        poll_transfer(g, &mut t);
        // SAFETY: `out` is writable.
        unsafe { *out = Box::into_raw(Box::new(t)).cast() };
        HMC_OK
    })
}

/// Polls a transfer's future inside the communicator's scope: again in place while it
/// wakes itself during the poll (up to [`REPOLLS_IN_PLACE`] times), else until its next
/// wake signals the eventfd.
fn poll_transfer<C: Communicator>(g: &GComm<C>, t: &mut GTransfer) {
    let Some(fut) = t.fut.as_mut() else { return };
    let waker = Waker::from(t.wake.clone());
    let mut cx = Context::from_waker(&waker);
    let state = &t.wake.state;
    let ready = g.run(|| {
        for _ in 0..REPOLLS_IN_PLACE {
            state.store(POLLING, Ordering::Release);
            if let Poll::Ready(r) = fut.as_mut().poll(&mut cx) {
                state.store(IDLE, Ordering::Release);
                return Some(r);
            }
            let idle = state.compare_exchange(POLLING, IDLE, Ordering::AcqRel, Ordering::Acquire);
            if idle.is_ok() {
                return None; // Not woken yet: its next wake signals the eventfd.
            }
        }
        // Still yielding: the host polls it again after its other tasks.
        state.store(IDLE, Ordering::Release);
        t.wake.notify_host();
        None
    });
    if let Some(r) = ready {
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
        let wake = t.wake.clone();
        g.run(|| drop(t));
        // A waker clone the transport kept may still be woken: not into the host's
        // context, which ends when this returns.
        *wake.host.lock() = None;
    })
}

/// ABI 1.3's `endpoint_settle`: the communicator's own [`Communicator::settle`], whose
/// contract is the ABI's (a transport that needs none answers `Ok` at once).
unsafe extern "C" fn endpoint_settle<P: PluginTransport>(
    comm: *mut HmcComm,
    ep: *mut HmcEndpoint,
    deadline_ns: u64,
) -> i32 {
    guard(|| {
        // SAFETY: live handles of this glue.
        let (g, ep) = unsafe { (at::<GComm<P::Comm>, _>(comm), at::<Ep<P>, _>(ep)) };
        status(block_on(
            g,
            g.comm.settle(ep, deadline_from_ns(deadline_ns)),
        ))
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
                at::<Ep<P>, _>(ep),
                slice_of(msg, len),
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
