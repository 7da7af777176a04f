//! `PluginCommunicator`: a loaded plugin's communicator as an `hmc_core::Communicator`, so the conformance kit, hmc-rpc and the engine run over it unchanged.
//!
//! The host checks what it can before calling the plugin (handles of another communicator,
//! bounds against the sizes it knows, access rights the exporter granted, batch limits the
//! plugin declared, expired deadlines), so a plugin's mistakes there cannot reach memory; the
//! plugin still checks every request against its own registration table at the target.

use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Instant;

use hmc_core::{
    Access, CommCapabilities, Communicator, Deadline, DeviceKind, DeviceMemoryPath, Error,
    LocalRegistration, MemoryKinds, Notification, Op, PeerAddr, Region, RemoteRegion, Result,
    TransferDesc, TransportId,
};

use crate::abi::*;
use crate::error::overran;
use crate::events::Events;
use crate::load::Plugin;
use crate::memory::abi_region;

/// A raw handle that may cross threads: the ABI makes every handle but a transfer usable
/// from any thread, and a transfer is used by one future at a time.
struct Handle<T>(*mut T);
// SAFETY: see the type's doc; the ABI's thread-safety table.
unsafe impl<T> Send for Handle<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Handle<T> {}

struct CommInner {
    plugin: Arc<Plugin>,
    comm: Handle<HmcComm>,
    events: parking_lot::Mutex<Option<Events>>,
    address: PeerAddr,
    caps: CommCapabilities,
    closed: AtomicBool,
}

impl CommInner {
    fn api(&self) -> &HmcPluginApi {
        &self.plugin.api
    }

    /// The error for status `code` of `function`, with the calling thread's last-error
    /// message (call right after the failing call, on its thread).
    fn error(&self, function: &'static str, code: i32, started: Instant) -> Error {
        self.plugin.call_error(function, code, started)
    }

    fn check(&self, function: &'static str, code: i32) -> Result<()> {
        if code == HMC_OK {
            Ok(())
        } else {
            Err(self.error(function, code, Instant::now()))
        }
    }

    fn with_events<T>(&self, f: impl FnOnce(&Events) -> T) -> Option<T> {
        self.events.lock().as_ref().map(f)
    }
}

impl Drop for CommInner {
    fn drop(&mut self) {
        // The event thread polls the plugin's fd, which lives until comm_destroy.
        if let Some(mut e) = self.events.lock().take() {
            e.stop();
        }
        // SAFETY: every handle of this communicator holds an Arc to it, so none is left.
        unsafe { self.api().comm_destroy.expect("checked at load")(self.comm.0) };
    }
}

/// A communicator of a transport plugin. Cheap to share behind an `Arc`; every handle it
/// gives out keeps it alive.
pub struct PluginCommunicator {
    inner: Arc<CommInner>,
}

impl std::fmt::Debug for PluginCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PluginCommunicator({} at {})",
            self.inner.plugin.name(),
            self.inner.address
        )
    }
}

/// A connection to one peer.
#[derive(Clone)]
pub struct PluginEndpoint(Arc<EpInner>);

impl std::fmt::Debug for PluginEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PluginEndpoint({})", self.0.comm.plugin.name())
    }
}

struct EpInner {
    comm: Arc<CommInner>,
    ep: Handle<HmcEndpoint>,
}

impl Drop for EpInner {
    fn drop(&mut self) {
        // SAFETY: every remote key of this endpoint holds an Arc to it, so none is left.
        unsafe { self.comm.api().endpoint_release.expect("checked")(self.comm.comm.0, self.ep.0) };
    }
}

/// Local memory registered with a plugin; deregistered when dropped.
pub struct PluginRegistration {
    comm: Arc<CommInner>,
    reg: Handle<HmcReg>,
    region: Region,
    access: Access,
}

impl Drop for PluginRegistration {
    fn drop(&mut self) {
        // SAFETY: a transfer borrows its registrations, so none names this one any more;
        // the plugin returns only once no peer can touch the memory.
        unsafe { self.comm.api().deregister.expect("checked")(self.comm.comm.0, self.reg.0) };
    }
}

impl LocalRegistration for PluginRegistration {
    fn region(&self) -> Region {
        self.region
    }
    fn access(&self) -> Access {
        self.access
    }
}

/// A peer's region imported on one endpoint.
pub struct PluginRemoteKey {
    ep: Arc<EpInner>,
    key: Handle<HmcRemoteKey>,
    len: u64,
    access: Access,
}

impl Drop for PluginRemoteKey {
    fn drop(&mut self) {
        let c = &self.ep.comm;
        // SAFETY: a transfer borrows its keys, so none names this one any more.
        unsafe { c.api().remote_key_release.expect("checked")(c.comm.0, self.key.0) };
    }
}

/// A transfer in the plugin; released (cancelled if still running) when dropped.
struct TransferHandle {
    comm: Arc<CommInner>,
    t: Handle<HmcTransfer>,
    waiter: u64,
    /// The task to wake when the plugin calls [`wake_transfer`] (`transfer_start_wake`);
    /// `None` when the plugin has only `transfer_start` and wakes through the event fd.
    /// Dropped after `transfer_release`, so it outlives every call the plugin may make.
    wake: Option<Arc<futures::task::AtomicWaker>>,
}

/// The host's [`HmcWakeFn`]: wakes the task waiting on one transfer.
///
/// # Safety
/// `ctx` is the `AtomicWaker` a [`TransferHandle`] passed to `transfer_start_wake`, alive
/// until its `transfer_release` returned (the ABI's promise).
unsafe extern "C" fn wake_transfer(ctx: *const std::ffi::c_void) {
    // SAFETY: per this function's contract.
    let waker = unsafe { &*ctx.cast::<futures::task::AtomicWaker>() };
    // A waker does not panic in practice; if one did, unwinding into C would abort.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| waker.wake()));
}

impl Drop for TransferHandle {
    fn drop(&mut self) {
        self.comm.with_events(|e| e.forget(self.waiter));
        // SAFETY: the handle came from transfer_start and is released once; the plugin
        // returns only when the transfer no longer touches local memory.
        unsafe { self.comm.api().transfer_release.expect("checked")(self.comm.comm.0, self.t.0) };
    }
}

/// CLOCK_MONOTONIC nanoseconds of `deadline`, as the ABI passes deadlines.
fn deadline_ns(deadline: Deadline) -> u64 {
    hmc_transport_kit::deadline::to_monotonic_ns(deadline)
}

/// Runs `f` on a thread of its own (the ABI's blocking calls), without blocking the caller.
async fn off_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    let (tx, rx) = futures::channel::oneshot::channel();
    std::thread::Builder::new()
        .name("hmc-plugin-call".into())
        .spawn(move || {
            // A receiver gone (the caller's future dropped) drops the result, which
            // releases whatever handle it holds.
            let _ = tx.send(f());
        })
        .map_err(|e| Error::io("spawning a thread for a blocking plugin call", e))?;
    rx.await.map_err(|_| {
        Error::Cancelled("a blocking plugin call's thread ended without an answer".into())
    })
}

/// Reads text or bytes through a `(buf, cap, *len)` call, growing the buffer once when
/// the plugin answers `HMC_ERR_TOO_SMALL`.
fn read_sized(
    inner: &CommInner,
    function: &'static str,
    first: usize,
    mut call: impl FnMut(*mut u8, usize, *mut usize) -> i32,
) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; first];
    for _ in 0..2 {
        let mut len = 0usize;
        let code = call(buf.as_mut_ptr(), buf.len(), &mut len);
        if code == HMC_ERR_TOO_SMALL && len > buf.len() && len <= RemoteRegion::MAX_KEY_LEN {
            buf.resize(len, 0);
            continue;
        }
        inner.check(function, code)?;
        if len > buf.len() {
            return Err(Error::Protocol(format!(
                "plugin `{}`: {function} claims {len} bytes in a buffer of {}",
                inner.plugin.name(),
                buf.len()
            )));
        }
        buf.truncate(len);
        return Ok(buf);
    }
    Err(Error::Protocol(format!(
        "plugin `{}`: {function} asked for a larger buffer twice",
        inner.plugin.name()
    )))
}

fn kinds(mask: &[u64; 4]) -> MemoryKinds {
    if mask.iter().all(|w| *w == u64::MAX) {
        return MemoryKinds::Any;
    }
    MemoryKinds::Only(
        (0..=255u8)
            .filter(|k| kind_mask_has(mask, *k))
            .map(DeviceKind::from_wire_id)
            .collect(),
    )
}

impl PluginCommunicator {
    /// Opens a communicator of `plugin` with `config` (`key=value` lines; every host
    /// passes `bind=IP`).
    pub fn open(plugin: Arc<Plugin>, config: &str) -> Result<Self> {
        if !plugin.provides_communicator() {
            return Err(Error::Unsupported(format!(
                "plugin `{}` ({}) provides no communicator, only memory",
                plugin.name(),
                plugin.path().display()
            )));
        }
        let api = plugin.api;
        let comm = plugin.open_handle("comm_open", api.comm_open.expect("checked"), config)?;
        // From here on, dropping `inner` destroys the communicator.
        let mut inner = CommInner {
            plugin: plugin.clone(),
            comm: Handle(comm),
            events: parking_lot::Mutex::new(None),
            address: PeerAddr::Unix("/".into()),
            caps: CommCapabilities::new(plugin.transport()),
            closed: AtomicBool::new(false),
        };
        let text = read_sized(&inner, "comm_address", 256, |buf, cap, len| {
            // SAFETY: `buf` has `cap` writable bytes; `len` is written.
            unsafe { api.comm_address.expect("checked")(comm, buf, cap, len) }
        })?;
        let text = String::from_utf8(text).map_err(|_| {
            Error::Protocol(format!(
                "plugin `{}`: comm_address is not UTF-8",
                plugin.name()
            ))
        })?;
        inner.address = PeerAddr::from_str(&text).map_err(|e| {
            Error::Protocol(format!(
                "plugin `{}`: comm_address `{text}` is not a peer address: {e}",
                plugin.name()
            ))
        })?;
        inner.caps = Self::capabilities_of(&inner)?;
        // SAFETY: returns the plugin's fd, valid until comm_destroy.
        let fd = unsafe { api.comm_event_fd.expect("checked")(comm) };
        if fd < 0 {
            return Err(inner.error("comm_event_fd", HMC_ERR_IO, Instant::now()));
        }
        *inner.events.lock() = Some(Events::start(plugin.name(), fd)?);
        tracing::debug!(plugin = plugin.name(), address = %inner.address, "plugin communicator open");
        Ok(PluginCommunicator {
            inner: Arc::new(inner),
        })
    }

    fn capabilities_of(inner: &CommInner) -> Result<CommCapabilities> {
        // SAFETY: all-zero is a valid HmcCommCaps.
        let mut raw: HmcCommCaps = unsafe { std::mem::zeroed() };
        raw.struct_size = std::mem::size_of::<HmcCommCaps>();
        // SAFETY: `raw` is writable for its struct_size.
        let code =
            unsafe { inner.api().comm_capabilities.expect("checked")(inner.comm.0, &mut raw) };
        inner.check("comm_capabilities", code)?;
        let mut caps = CommCapabilities::new(inner.plugin.transport());
        caps.local_memory = kinds(&raw.local_kinds);
        caps.remote_memory = kinds(&raw.remote_kinds);
        caps.device_memory = DeviceMemoryPath::Refused;
        caps.notifications = raw.flags & HMC_CAP_NOTIFICATIONS != 0;
        caps.max_notification_len = if caps.notifications {
            raw.max_notification_len as usize
        } else {
            0
        };
        caps.max_transfer_len = raw.max_transfer_len;
        caps.max_batch_len = usize::try_from(raw.max_batch_len).unwrap_or(usize::MAX);
        caps.zero_copy = raw.flags & HMC_CAP_ZERO_COPY != 0;
        caps.rekey = raw.flags & HMC_CAP_REKEY != 0 && inner.api().rekey.is_some();
        Ok(caps)
    }

    /// The plugin this communicator belongs to.
    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.inner.plugin
    }

    fn own(&self, reg: &PluginRegistration) -> Result<()> {
        if Arc::ptr_eq(&reg.comm, &self.inner) {
            return Ok(());
        }
        Err(Error::InvalidArgument(
            "this registration was made by a different communicator; use handles with the \
             communicator that made them"
                .into(),
        ))
    }

    /// A plugin bug: `function` returned `HMC_OK` without a handle.
    fn null_handle(&self, function: &str) -> Error {
        Error::Protocol(format!(
            "plugin `{}`: {function} returned HMC_OK without a handle (a plugin bug; report \
             it to the plugin's authors)",
            self.inner.plugin.name()
        ))
    }

    fn comm_ptr(&self) -> *mut HmcComm {
        self.inner.comm.0
    }

    /// Host-side checks of a batch, before the plugin sees it.
    fn check_batch(
        &self,
        ep: &PluginEndpoint,
        op: Op,
        batch: &[TransferDesc<'_, Self>],
    ) -> Result<()> {
        let caps = &self.inner.caps;
        if batch.len() > caps.max_batch_len {
            return Err(Error::LimitExceeded {
                limit: "max_batch_len",
                value: batch.len() as u64,
                max: caps.max_batch_len as u64,
                hint: format!(
                    "plugin `{}` declares this limit in its capabilities; split the batch",
                    self.inner.plugin.name()
                ),
            });
        }
        for d in batch {
            self.own(d.local)?;
            let remote = hmc_core::RemoteFacts {
                len: d.remote.len,
                access: d.remote.access,
                on_endpoint: Arc::ptr_eq(&d.remote.ep, &ep.0),
            };
            hmc_core::check_desc(op, d, remote)?;
            if d.len as u64 > caps.max_transfer_len {
                return Err(Error::LimitExceeded {
                    limit: "max_transfer_len",
                    value: d.len as u64,
                    max: caps.max_transfer_len,
                    hint: "the plugin declares this limit; split the descriptor".into(),
                });
            }
        }
        Ok(())
    }

    /// Hands a checked, non-empty batch to the plugin: `transfer_start_wake` when it has
    /// it (its wake-ups reach the task directly), else `transfer_start`.
    fn start_transfer(
        &self,
        ep: &PluginEndpoint,
        op: Op,
        batch: &[TransferDesc<'_, Self>],
        deadline: Deadline,
        started: Instant,
    ) -> Result<TransferHandle> {
        let raw = |d: &TransferDesc<'_, Self>| HmcTransferDesc {
            local: d.local.reg.0,
            local_offset: d.local_offset as u64,
            remote: d.remote.key.0,
            remote_offset: d.remote_offset,
            len: d.len as u64,
        };
        // One descriptor (the common case) needs no allocation.
        let one: [HmcTransferDesc; 1];
        let many: Vec<HmcTransferDesc>;
        let descs: &[HmcTransferDesc] = if let [d] = batch {
            one = [raw(d)];
            &one
        } else {
            many = batch.iter().map(raw).collect();
            &many
        };
        let raw_op = match op {
            Op::Read => HMC_OP_READ,
            Op::Write => HMC_OP_WRITE,
        };
        let (comm, ep, ns) = (self.comm_ptr(), ep.0.ep.0, deadline_ns(deadline));
        let mut t: Handle<HmcTransfer> = Handle(std::ptr::null_mut());
        let api = self.inner.api();
        let wake = api
            .transfer_start_wake
            .map(|_| Arc::new(futures::task::AtomicWaker::new()));
        let (ptr, count) = (descs.as_ptr(), descs.len());
        // SAFETY: `descs` is read during the call; the handles it names are borrowed by
        // `batch` for the calling future's life, which outlives the transfer handle made
        // here. The wake context lives in that handle, which drops it after
        // transfer_release.
        let code = unsafe {
            match (api.transfer_start_wake, &wake) {
                (Some(start), Some(w)) => {
                    let ctx = Arc::as_ptr(w).cast();
                    start(
                        comm,
                        ep,
                        raw_op,
                        ptr,
                        count,
                        ns,
                        wake_transfer,
                        ctx,
                        &mut t.0,
                    )
                }
                _ => {
                    let start = api.transfer_start.expect("checked");
                    start(comm, ep, raw_op, ptr, count, ns, &mut t.0)
                }
            }
        };
        if code != HMC_OK {
            return Err(self.inner.error("transfer_start", code, started));
        }
        if t.0.is_null() {
            return Err(self.null_handle("transfer_start"));
        }
        Ok(TransferHandle {
            comm: self.inner.clone(),
            t,
            waiter: self.inner.with_events(Events::id).unwrap_or(0),
            wake,
        })
    }

    /// One poll of a started transfer: done, failed, overran its deadline, or still
    /// running (the task is then woken by the plugin, the event fd or the deadline).
    fn poll_transfer(
        &self,
        handle: &TransferHandle,
        cx: &mut std::task::Context<'_>,
        deadline: Deadline,
        started: Instant,
    ) -> Poll<Result<()>> {
        // Registered before asking the plugin, so a wake in between is not lost. The
        // event task still wakes this task at the deadline (and at any fd signal).
        if let Some(w) = &handle.wake {
            w.register(cx.waker());
        }
        self.inner
            .with_events(|e| e.wait(handle.waiter, cx.waker(), deadline.instant()));
        // SAFETY: `handle.t` is live and polled by the one future that holds it.
        let code = unsafe {
            self.inner.api().transfer_poll.expect("checked")(self.comm_ptr(), handle.t.0)
        };
        match code {
            HMC_OK => Poll::Ready(Ok(())),
            HMC_PENDING if deadline.is_expired() => {
                Poll::Ready(Err(overran(self.inner.plugin.name(), started)))
            }
            HMC_PENDING => Poll::Pending,
            code => Poll::Ready(Err(self.inner.error("transfer", code, started))),
        }
    }
}

impl Communicator for PluginCommunicator {
    type Endpoint = PluginEndpoint;
    type Registration = PluginRegistration;
    type RemoteKey = PluginRemoteKey;

    fn transport(&self) -> TransportId {
        self.inner.plugin.transport()
    }

    fn capabilities(&self) -> CommCapabilities {
        self.inner.caps.clone()
    }

    fn address(&self) -> PeerAddr {
        self.inner.address.clone()
    }

    async fn connect(&self, peer: &PeerAddr, deadline: Deadline) -> Result<PluginEndpoint> {
        let inner = self.inner.clone();
        let text = peer.to_string();
        let ns = deadline_ns(deadline);
        let ep = off_thread(move || -> Result<PluginEndpoint> {
            let mut ep: *mut HmcEndpoint = std::ptr::null_mut();
            // SAFETY: `text` is readable for its length; `ep` is written.
            let code = unsafe {
                inner.api().connect.expect("checked")(
                    inner.comm.0,
                    text.as_ptr(),
                    text.len(),
                    ns,
                    &mut ep,
                )
            };
            inner.check("connect", code)?;
            if ep.is_null() {
                return Err(inner.error("connect", HMC_ERR_INTERNAL, Instant::now()));
            }
            Ok(PluginEndpoint(Arc::new(EpInner {
                comm: inner,
                ep: Handle(ep),
            })))
        });
        ep.await?
    }

    unsafe fn register(&self, region: Region, access: Access) -> Result<PluginRegistration> {
        if !self.inner.caps.local_memory.contains(region.device.kind) {
            return Err(Error::UnsupportedMemory {
                transport: self.transport(),
                device: region.device,
                reason: format!(
                    "plugin `{}` does not list that kind in its capabilities",
                    self.inner.plugin.name()
                ),
            });
        }
        let raw = abi_region(region);
        let mut reg: *mut HmcReg = std::ptr::null_mut();
        // SAFETY: the caller keeps `region` allocated until the registration drops (this
        // method's contract); `raw` and `reg` live across the call.
        let code = unsafe {
            self.inner.api().register_mem.expect("checked")(
                self.comm_ptr(),
                &raw,
                access.bits() as u32,
                &mut reg,
            )
        };
        self.inner.check("register", code)?;
        if reg.is_null() {
            return Err(self.null_handle("register_mem"));
        }
        Ok(PluginRegistration {
            comm: self.inner.clone(),
            reg: Handle(reg),
            region,
            access,
        })
    }

    fn rekey(&self, reg: &PluginRegistration) -> Result<bool> {
        self.own(reg)?;
        let Some(rekey) = self.inner.api().rekey else {
            return Ok(false);
        };
        // SAFETY: `reg` is a live registration of this communicator.
        let code = unsafe { rekey(self.comm_ptr(), reg.reg.0) };
        if code < 0 {
            return Err(self.inner.error("rekey", code, Instant::now()));
        }
        Ok(code == 1)
    }

    fn export(&self, reg: &PluginRegistration) -> Result<RemoteRegion> {
        self.own(reg)?;
        let key = read_sized(&self.inner, "export_key", 256, |buf, cap, len| {
            // SAFETY: `buf` has `cap` writable bytes; `reg` is live and ours.
            unsafe {
                self.inner.api().export_key.expect("checked")(
                    self.comm_ptr(),
                    reg.reg.0,
                    buf,
                    cap,
                    len,
                )
            }
        })?;
        Ok(RemoteRegion {
            transport: self.transport(),
            region: reg.region,
            access: reg.access,
            key,
        })
    }

    fn import(&self, ep: &PluginEndpoint, remote: &RemoteRegion) -> Result<PluginRemoteKey> {
        remote.check_transport(self.transport())?;
        if !Arc::ptr_eq(&ep.0.comm, &self.inner) {
            return Err(Error::InvalidArgument(
                "this endpoint was made by a different communicator".into(),
            ));
        }
        let r = remote.region;
        if !self.inner.caps.remote_memory.contains(r.device.kind) {
            return Err(Error::UnsupportedMemory {
                transport: self.transport(),
                device: r.device,
                reason: "the plugin cannot reach remote memory of that kind".into(),
            });
        }
        let desc = HmcRemoteDesc {
            region: abi_region(r),
            access: remote.access.bits() as u32,
            key: remote.key.as_ptr(),
            key_len: remote.key.len(),
        };
        let mut key: *mut HmcRemoteKey = std::ptr::null_mut();
        // SAFETY: `desc` and the key bytes it points to live across the call.
        let code = unsafe {
            self.inner.api().import.expect("checked")(self.comm_ptr(), ep.0.ep.0, &desc, &mut key)
        };
        self.inner.check("import", code)?;
        if key.is_null() {
            return Err(self.null_handle("import"));
        }
        Ok(PluginRemoteKey {
            ep: ep.0.clone(),
            key: Handle(key),
            len: r.len as u64,
            access: remote.access,
        })
    }

    async fn transfer(
        &self,
        ep: &PluginEndpoint,
        op: Op,
        batch: &[TransferDesc<'_, Self>],
        deadline: Deadline,
    ) -> Result<()> {
        let started = Instant::now();
        self.check_batch(ep, op, batch)?;
        if deadline.is_expired() {
            return Err(Error::DeadlineExceeded {
                during: "a plugin transfer (expired before it started)",
                elapsed: started.elapsed(),
            });
        }
        if batch.is_empty() {
            return Ok(());
        }
        let handle = self.start_transfer(ep, op, batch, deadline, started)?;
        // Whole-value captures: a field capture of the raw pointer would not be `Send`.
        let handle = &handle;
        std::future::poll_fn(move |cx| self.poll_transfer(handle, cx, deadline, started)).await
    }

    /// ABI 1.3's `endpoint_settle` when the plugin provides it; `Ok` at once for a 1.3
    /// plugin without it (its transfers' ends are final by themselves); `Unsupported` for
    /// a plugin that declares an older minor, which never promised that the end of a WRITE
    /// is final at its target.
    async fn settle(&self, ep: &PluginEndpoint, deadline: Deadline) -> Result<()> {
        let (major, minor) = self.inner.plugin.abi();
        if minor < 3 {
            return Err(Error::Unsupported(format!(
                "plugin `{}` declares HMC plugin ABI {major}.{minor}, which does not promise \
                 that no byte of a WRITE lands at the target after the WRITE ended (ABI 1.3 \
                 does): bytes its target already holds may still land; rebuild the plugin \
                 against ABI 1.3 and follow hmc_plugin.h's rule for a transfer's end",
                self.inner.plugin.name()
            )));
        }
        if self.inner.api().endpoint_settle.is_none() {
            return Ok(());
        }
        let ep = ep.clone();
        let ns = deadline_ns(deadline);
        off_thread(move || {
            let c = &ep.0.comm;
            // SAFETY: `ep` is live for the call (this closure holds it).
            let code =
                unsafe { c.api().endpoint_settle.expect("checked above")(c.comm.0, ep.0.ep.0, ns) };
            c.check("endpoint_settle", code)
        })
        .await?
    }

    async fn notify(
        &self,
        ep: &PluginEndpoint,
        tag: u64,
        msg: &[u8],
        deadline: Deadline,
    ) -> Result<()> {
        if msg.len() > self.inner.caps.max_notification_len {
            return Err(Error::LimitExceeded {
                limit: "max_notification_len",
                value: msg.len() as u64,
                max: self.inner.caps.max_notification_len as u64,
                hint: "the plugin declares this limit; send larger data with a transfer".into(),
            });
        }
        let ep = ep.clone();
        let msg = msg.to_vec();
        let ns = deadline_ns(deadline);
        off_thread(move || {
            let c = &ep.0.comm;
            // SAFETY: `msg` is readable for its length; `ep` is live.
            let code = unsafe {
                c.api().notify.expect("checked")(
                    c.comm.0,
                    ep.0.ep.0,
                    tag,
                    msg.as_ptr(),
                    msg.len(),
                    ns,
                )
            };
            c.check("notify", code)
        })
        .await?
    }

    fn recv_notification(
        &self,
        deadline: Deadline,
    ) -> impl Future<Output = Result<Notification>> + Send {
        let inner = self.inner.clone();
        let waiter = inner.with_events(Events::id).unwrap_or(0);
        let started = Instant::now();
        let mut from = vec![0u8; 256];
        let mut msg = vec![0u8; inner.caps.max_notification_len.max(1)];
        let guard = WaiterGuard(inner.clone(), waiter);
        std::future::poll_fn(move |cx| {
            let _keep = &guard;
            inner.with_events(|e| e.wait(waiter, cx.waker(), deadline.instant()));
            loop {
                let mut n = HmcNotification {
                    tag: 0,
                    from: from.as_mut_ptr(),
                    from_cap: from.len(),
                    from_len: 0,
                    msg: msg.as_mut_ptr(),
                    msg_cap: msg.len(),
                    msg_len: 0,
                };
                // SAFETY: the buffers are writable for their capacities during the call.
                let code = unsafe {
                    inner.api().recv_notification.expect("checked")(inner.comm.0, &mut n)
                };
                match code {
                    HMC_OK => {
                        let from_text =
                            String::from_utf8_lossy(&from[..n.from_len.min(from.len())]);
                        let from = PeerAddr::from_str(&from_text)?;
                        return Poll::Ready(Ok(Notification {
                            from,
                            tag: n.tag,
                            msg: msg[..n.msg_len.min(msg.len())].to_vec(),
                        }));
                    }
                    HMC_ERR_TOO_SMALL if n.from_len <= 1 << 16 && n.msg_len <= 1 << 26 => {
                        from.resize(from.len().max(n.from_len), 0);
                        msg.resize(msg.len().max(n.msg_len), 0);
                        if n.from_len <= from.len() && n.msg_len <= msg.len() {
                            continue;
                        }
                    }
                    HMC_PENDING if deadline.is_expired() => {
                        return Poll::Ready(Err(Error::DeadlineExceeded {
                            during: "recv_notification",
                            elapsed: started.elapsed(),
                        }));
                    }
                    HMC_PENDING => return Poll::Pending,
                    _ => {}
                }
                return Poll::Ready(Err(inner.error("recv_notification", code, started)));
            }
        })
    }

    fn close(&self) {
        if !self.inner.closed.swap(true, Ordering::AcqRel) {
            // SAFETY: the communicator is live; close leaves its handles valid.
            unsafe { self.inner.api().comm_close.expect("checked")(self.comm_ptr()) };
        }
    }
}

/// Forgets a waiter when its future is dropped.
struct WaiterGuard(Arc<CommInner>, u64);
impl Drop for WaiterGuard {
    fn drop(&mut self) {
        self.0.with_events(|e| e.forget(self.1));
    }
}
