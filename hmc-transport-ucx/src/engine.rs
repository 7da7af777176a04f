//! The progress engine: one thread that owns the UCP context and worker, executes commands sent from any thread, and parks on the worker's event fd when idle.
//!
//! # Thread-safety model
//!
//! The worker is created with `UCS_THREAD_MODE_SINGLE` and every UCX call of a
//! communicator (context, worker, endpoints, memory maps, rkeys, requests) is made on this
//! one thread. Other threads talk to it through a channel of [`Command`]s and an `eventfd`
//! that wakes it; replies come back over one-shot channels. So the communicator is `Send +
//! Sync` without a lock around UCX, no UCX call ever contends, and completion callbacks run
//! on a thread that owns all the state they touch (a thread-local event queue).
//!
//! # Progress and parking
//!
//! The loop drains commands, calls `ucp_worker_progress` until it reports nothing, handles
//! completions, and issues more chunks of running transfers. After `spin` without any event
//! it arms the worker (`ucp_worker_arm`) and sleeps in `poll(2)` on the worker's event fd and
//! the wake eventfd, with a timeout no later than the nearest deadline (and at most
//! `park_max`, a safety net for transports without wake-up support). Idle costs no CPU.
//!
//! # Transfers
//!
//! A batch is split into chunks of at most `chunk_size` bytes; at most `max_inflight_chunks`
//! are outstanding per transfer. A WRITE completes after `ucp_ep_flush_nbx`, i.e. when the
//! bytes are visible at the target. On deadline, cancel or peer failure the transfer stops
//! issuing chunks and reports only once every issued chunk has completed, so when the caller
//! hears back UCX no longer touches its memory. If a chunk does not complete within
//! `drain_timeout` the endpoint is force-closed, which completes every request on it.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::ffi::{CString, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use futures::channel::oneshot;
use hmc_core::{Access, Error, Op, Result};

use crate::sys::{self, Ucp};

/// The active-message id notifications use.
const AM_ID: u32 = 0x484D;

/// Longest `close()` (and tear-down, where that is safe) keeps progressing the worker so
/// that what UCX itself still sends to peers (replies to their emulated GETs, PUT
/// acknowledgements) leaves it; see [`State::settled`].
const SETTLE_LIMIT: Duration = Duration::from_secs(1);

/// A worker whose progress reported nothing for this long after `close()` counts as
/// settled: no peer request is left for it to answer, nothing of its own is queued.
const SETTLE_QUIET: Duration = Duration::from_millis(100);

/// Tunables of one engine (copied from [`crate::UcxConfig`]).
#[derive(Clone, Debug)]
pub(crate) struct EngineConfig {
    pub name: String,
    pub ucx_options: Vec<(String, String)>,
    /// Defaults applied before `ucx_options`; a library that does not know one is fine.
    pub soft_options: Vec<(String, String)>,
    pub max_inflight_chunks: usize,
    pub spin: Duration,
    pub wakeup: bool,
    pub park_max: Duration,
    pub drain_timeout: Duration,
    pub ep_linger: Duration,
    pub max_pending_notifications: usize,
    /// Ask UCX for a local mapping of imported regions (`ucp_rkey_ptr`).
    pub direct_mapped: bool,
}

/// A notification as it arrived: tag, sender address text, bytes.
pub(crate) struct RawNote {
    pub tag: u64,
    pub from: Vec<u8>,
    pub msg: Vec<u8>,
}

/// What `Register` returns: id, packed rkey, and the mapped address.
pub(crate) struct Registered {
    pub id: u64,
    pub rkey: Vec<u8>,
    pub addr: u64,
}

/// State of an imported key shared with its `RemoteKey` handle.
#[derive(Default)]
pub(crate) struct KeyShared {
    /// Set once the owner deregistered the region (or the endpoint died).
    pub revoked: AtomicBool,
    /// The region's start address in the target's address space.
    pub remote_base: u64,
    /// Where UCX mapped the region into this process (`ucp_rkey_ptr`), 0 when it did not.
    pub mapped: AtomicU64,
    /// Direct copies through `mapped` running now; the rkey (and its mapping) is destroyed,
    /// and a revocation confirmed, only once this is 0 after `revoked` was set.
    pub direct_busy: AtomicUsize,
}

impl KeyShared {
    /// Shared state of a key for a region starting at `remote_base` at the target.
    pub fn new(remote_base: u64) -> Self {
        KeyShared {
            remote_base,
            ..KeyShared::default()
        }
    }

    /// The local address of the region's start when UCX mapped it into this process and
    /// the key is live; the caller then counts as a direct user until it calls
    /// [`KeyShared::end_direct`]. `None`: use the progress thread.
    pub fn begin_direct(&self) -> Option<u64> {
        let base = self.mapped.load(Ordering::Acquire);
        if base == 0 {
            return None;
        }
        // Pairs with `revoke` (SeqCst on both sides): either we see `revoked`, or the
        // revoker sees our count and waits for `end_direct`.
        self.direct_busy.fetch_add(1, Ordering::SeqCst);
        if self.revoked.load(Ordering::SeqCst) {
            self.end_direct();
            return None;
        }
        Some(base)
    }

    /// Ends a direct copy begun with [`KeyShared::begin_direct`].
    pub fn end_direct(&self) {
        self.direct_busy.fetch_sub(1, Ordering::SeqCst);
    }

    /// Marks the key revoked; no direct copy starts after this returns.
    pub fn revoke(&self) {
        self.revoked.store(true, Ordering::SeqCst);
    }

    /// Revokes the key and waits until the direct copies already running have finished
    /// (each is one bounded memcpy), so the mapping can go.
    fn revoke_and_drain(&self) {
        self.revoke();
        while self.direct_busy.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
    }
}

/// One piece of a transfer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Chunk {
    pub local: u64,
    pub remote: u64,
    pub len: usize,
    pub key: u64,
}

/// What other threads ask of the engine.
pub(crate) enum Command {
    Register {
        addr: u64,
        len: usize,
        access: Access,
        /// Let UCX allocate the memory (`addr` ignored); the reply carries its address.
        allocate: bool,
        reply: mpsc::SyncSender<Result<Registered>>,
    },
    Unregister {
        id: u64,
        done: mpsc::SyncSender<()>,
    },
    CreateEp {
        worker_addr: Vec<u8>,
        reply: mpsc::SyncSender<Result<u64>>,
    },
    CloseEp {
        ep: u64,
    },
    PeerGone {
        ep: u64,
        reason: String,
    },
    ImportKey {
        ep: u64,
        reg_id: u64,
        rkey: Vec<u8>,
        shared: Arc<KeyShared>,
        reply: mpsc::SyncSender<Result<u64>>,
    },
    DropKey {
        key: u64,
    },
    Revoke {
        ep: u64,
        reg_id: u64,
        ack: Box<dyn FnOnce() + Send>,
    },
    Transfer {
        id: u64,
        ep: u64,
        op: Op,
        chunks: Vec<Chunk>,
        deadline: Instant,
        reply: oneshot::Sender<Result<()>>,
    },
    Notify {
        ep: u64,
        header: Vec<u8>,
        data: Vec<u8>,
        deadline: Instant,
        reply: oneshot::Sender<Result<()>>,
    },
    Cancel {
        id: u64,
        done: mpsc::SyncSender<()>,
    },
    Recv {
        deadline: Instant,
        reply: oneshot::Sender<Result<RawNote>>,
    },
    Close,
}

/// A handle to a running engine. Cloned by every object that needs the engine; the thread
/// tears UCX down when the last handle is dropped.
#[derive(Clone)]
pub(crate) struct Engine {
    tx: mpsc::Sender<Command>,
    wake: Arc<OwnedFd>,
    pub ucp: Arc<Ucp>,
    pub worker_address: Arc<Vec<u8>>,
    /// UCX endpoints the engine holds, including ones still closing.
    pub ucx_endpoints: Arc<std::sync::atomic::AtomicUsize>,
}

/// Workers (with their contexts) left undestroyed because they still held sends at
/// tear-down; see [`State::settled`].
pub(crate) static LEAKED_WORKERS: AtomicUsize = AtomicUsize::new(0);

/// Progress threads still running (their worker and context not yet destroyed).
static LIVE_THREADS: std::sync::Mutex<usize> = std::sync::Mutex::new(0);
static LIVE_CHANGED: std::sync::Condvar = std::sync::Condvar::new();
static EXIT_HOOK: std::sync::Once = std::sync::Once::new();

/// Longest a process exit waits for progress threads still tearing UCX down (a thread
/// closing endpoints to a dead peer waits up to 2 s for them).
const EXIT_WAIT: Duration = Duration::from_secs(3);

/// Runs at process exit, before the UCX libraries' exit-time destructors (`atexit`
/// handlers registered after start-up run before the loader's `_dl_fini`, which runs
/// shared-library destructors). A progress thread still inside UCX while those destructors
/// tear UCX's global state down crashes the process at exit (seen once in CI after a test
/// closed endpoints to a killed peer), so wait, bounded, for threads whose handles were
/// all dropped and which are finishing their shutdown.
extern "C" fn wait_for_progress_threads() {
    let until = Instant::now() + EXIT_WAIT;
    let mut live = LIVE_THREADS.lock().unwrap_or_else(|e| e.into_inner());
    while *live > 0 {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        live = LIVE_CHANGED
            .wait_timeout(live, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// Progress threads alive in this process (handles dropped but still tearing down count).
pub(crate) fn live_threads() -> usize {
    *LIVE_THREADS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Counts one progress thread as live until dropped (when the thread returns or unwinds).
struct LiveThread;

impl LiveThread {
    fn new() -> Self {
        EXIT_HOOK.call_once(|| {
            // SAFETY: registers a plain `extern "C" fn()` with no captured state.
            let r = unsafe { libc::atexit(wait_for_progress_threads) };
            if r != 0 {
                tracing::debug!("atexit refused the UCX progress-thread exit hook");
            }
        });
        *LIVE_THREADS.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        LiveThread
    }
}

impl Drop for LiveThread {
    fn drop(&mut self) {
        let mut live = LIVE_THREADS.lock().unwrap_or_else(|e| e.into_inner());
        *live -= 1;
        LIVE_CHANGED.notify_all();
    }
}

fn wake_fd(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writing 8 bytes from a live u64 to an eventfd we own.
    unsafe { libc::write(fd.as_raw_fd(), &one as *const u64 as *const c_void, 8) };
}

impl Engine {
    /// Starts the progress thread, which creates the context and worker.
    pub fn start(ucp: Arc<Ucp>, config: EngineConfig) -> Result<Engine> {
        // SAFETY: plain syscall; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::io(
                "creating the UCX engine's wake eventfd",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let thread_ucp = ucp.clone();
        let thread_wake = wake.clone();
        let ucx_endpoints = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let thread_eps = ucx_endpoints.clone();
        let live = LiveThread::new();
        std::thread::Builder::new()
            .name(format!("hmc-ucx-{}", config.name))
            .spawn(move || {
                let _live = live;
                match State::new(thread_ucp, config, thread_wake, thread_eps) {
                    Ok(mut state) => {
                        let _ = ready_tx.send(Ok(state.worker_address.clone()));
                        state.run(rx);
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| Error::io("spawning the UCX progress thread", e))?;
        let worker_address = ready_rx.recv().map_err(|_| {
            Error::Closed("the UCX progress thread exited during start-up".into())
        })??;
        Ok(Engine {
            tx,
            wake,
            ucp,
            worker_address: Arc::new(worker_address),
            ucx_endpoints,
        })
    }

    /// Sends a command and wakes the thread.
    pub fn send(&self, cmd: Command) -> Result<()> {
        self.tx
            .send(cmd)
            .map_err(|_| Error::Closed("the UCX progress thread has exited".into()))?;
        wake_fd(&self.wake);
        Ok(())
    }

    /// Like [`Engine::send`], but hands the command back when the thread has exited.
    pub fn send_or_return(&self, cmd: Command) -> std::result::Result<(), Command> {
        self.tx.send(cmd).map_err(|e| e.0)?;
        wake_fd(&self.wake);
        Ok(())
    }

    /// Sends a command built around a blocking reply channel and waits for the reply.
    pub fn call<T>(&self, make: impl FnOnce(mpsc::SyncSender<Result<T>>) -> Command) -> Result<T> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.send(make(tx))?;
        rx.recv()
            .map_err(|_| Error::Closed("the UCX progress thread dropped a request".into()))?
    }
}

/// Completion events queued by UCX callbacks, which only ever run on the engine thread
/// inside `ucp_worker_progress` (or an `_nbx` call made there).
enum Event {
    Req {
        slot: usize,
        status: sys::ucs_status_t,
    },
    EpError {
        ep: u64,
        status: sys::ucs_status_t,
    },
    Note(RawNote),
}

thread_local! {
    static EVENTS: RefCell<Vec<Event>> = const { RefCell::new(Vec::new()) };
}

unsafe extern "C" fn on_request(_req: *mut c_void, status: sys::ucs_status_t, user: *mut c_void) {
    EVENTS.with(|e| {
        e.borrow_mut().push(Event::Req {
            slot: user as usize,
            status,
        })
    });
}

unsafe extern "C" fn on_ep_error(arg: *mut c_void, _ep: sys::ucp_ep_h, status: sys::ucs_status_t) {
    EVENTS.with(|e| {
        e.borrow_mut().push(Event::EpError {
            ep: arg as u64,
            status,
        })
    });
}

unsafe extern "C" fn on_am(
    _arg: *mut c_void,
    header: *const c_void,
    header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: UCX passes a valid parameter block for the duration of the callback.
    let attr = unsafe { (*param).recv_attr };
    if attr & sys::UCP_AM_RECV_ATTR_FLAG_RNDV != 0 || header_length < 8 {
        tracing::warn!(
            header_length,
            length,
            "dropping a malformed or rendezvous notification (notifications are sent eager)"
        );
        return sys::UCS_OK;
    }
    // SAFETY: UCX guarantees `header`/`data` point at `header_length`/`length` readable
    // bytes during the callback; we copy them out.
    let (h, d) = unsafe {
        (
            std::slice::from_raw_parts(header as *const u8, header_length),
            if length == 0 {
                &[][..]
            } else {
                std::slice::from_raw_parts(data as *const u8, length)
            },
        )
    };
    let note = RawNote {
        tag: u64::from_be_bytes(h[..8].try_into().expect("8 bytes")),
        from: h[8..].to_vec(),
        msg: d.to_vec(),
    };
    EVENTS.with(|e| e.borrow_mut().push(Event::Note(note)));
    sys::UCS_OK
}

enum Owner {
    Chunk {
        op: u64,
        key: u64,
        ep: u64,
    },
    Flush {
        op: u64,
        ep: u64,
    },
    Notify {
        ep: u64,
        reply: Option<oneshot::Sender<Result<()>>>,
        deadline: Instant,
        _bufs: (Vec<u8>, Vec<u8>),
    },
    EpClose {
        ep: u64,
    },
    AckFlush {
        ep: u64,
        ack: Option<Ack>,
    },
}

struct ReqRec {
    owner: Owner,
    req: *mut c_void,
}

#[derive(PartialEq, Eq, Clone, Copy, Debug)]
enum EpPhase {
    Open,
    /// Failed or closing: no new operations; waiting for in-flight requests.
    Draining,
    Closed,
}

/// A UCX endpoint to one peer worker, shared by every [`EpState`] connected to that worker
/// and kept for `ep_linger` after the last one closes. Reusing it means a peer that connects
/// and disconnects often does not make UCX build (and leave behind on the passive side) a
/// new transport connection each time.
struct PhysEp {
    handle: sys::ucp_ep_h,
    addr: Vec<u8>,
    refs: usize,
    failed: bool,
    closing: bool,
    /// Created with `UCP_ERR_HANDLING_MODE_PEER`; only then may it be closed with FORCE
    /// (UCX: FORCE without PEER mode on both sides is undefined behaviour).
    peer_mode: bool,
    idle_since: Option<Instant>,
}

struct EpState {
    handle: sys::ucp_ep_h,
    phys: u64,
    phase: EpPhase,
    failed: Option<String>,
    /// The user dropped the endpoint: remove the entry once closed.
    released: bool,
    /// UCX or the control connection reported the peer gone: close with FORCE.
    peer_failed: bool,
    inflight: usize,
    keys: Vec<u64>,
    drain_since: Option<Instant>,
}

struct KeyState {
    ep: u64,
    reg_id: u64,
    rkey: sys::ucp_rkey_h,
    inflight: usize,
    shared: Arc<KeyShared>,
}

struct TransferState {
    ep: u64,
    op: Op,
    chunks: Vec<Chunk>,
    next: usize,
    inflight: usize,
    flushed: bool,
    failure: Option<Error>,
    failed_at: Option<Instant>,
    deadline: Instant,
    started: Instant,
    reply: Option<oneshot::Sender<Result<()>>>,
    cancel_done: Vec<mpsc::SyncSender<()>>,
}

/// Confirms a key revocation to the target.
type Ack = Box<dyn FnOnce() + Send>;

enum Issue {
    Done(sys::ucs_status_t),
    Pending,
}

struct State {
    ucp: Arc<Ucp>,
    cfg: EngineConfig,
    context: sys::ucp_context_h,
    worker: sys::ucp_worker_h,
    efd: i32,
    wake: Arc<OwnedFd>,
    worker_address: Vec<u8>,
    next_id: u64,
    mems: HashMap<u64, sys::ucp_mem_h>,
    eps: HashMap<u64, EpState>,
    phys: HashMap<u64, PhysEp>,
    phys_by_addr: HashMap<Vec<u8>, u64>,
    keys: HashMap<u64, KeyState>,
    ops: HashMap<u64, TransferState>,
    reqs: Vec<Option<ReqRec>>,
    free_slots: Vec<usize>,
    pending_acks: Vec<(u64, u64, Ack)>,
    notes: VecDeque<RawNote>,
    waiters: VecDeque<(Instant, oneshot::Sender<Result<RawNote>>)>,
    closed: bool,
    /// `close()` ran (called, or from dropping the communicator): revocation no longer
    /// reaches peers.
    closed_by_user: bool,
    /// Until when `close()` keeps progressing the worker to settle it.
    close_drain: Option<Instant>,
    /// A registration was unmapped after `close()`: peers' emulated writes may now target
    /// memory the application freed, so the worker must never be progressed again.
    unmapped_after_close: bool,
    /// Since `close()`, progress did work that may have queued sends to peers, and no
    /// quiet period ([`SETTLE_QUIET`]) has followed yet.
    unsettled: bool,
    /// A drain reached [`SETTLE_LIMIT`] without settling; no further drains start.
    drain_gave_up: bool,
    /// The worker did work after `unmapped_after_close` was set (closing our endpoints).
    progressed_after_unmap: bool,
    /// When `ucp_worker_progress` last reported work.
    last_activity: Instant,
    /// UCX requests issued and not yet completed.
    live_requests: usize,
    /// The selected transports refused `UCP_ERR_HANDLING_MODE_PEER` once.
    peer_mode_unsupported: bool,
    ep_count: Arc<std::sync::atomic::AtomicUsize>,
}

impl State {
    fn new(
        ucp: Arc<Ucp>,
        cfg: EngineConfig,
        wake: Arc<OwnedFd>,
        ep_count: Arc<std::sync::atomic::AtomicUsize>,
    ) -> Result<State> {
        let mut config: *mut sys::ucp_config_t = std::ptr::null_mut();
        // SAFETY: out-parameter; NULL prefix/file mean "UCX_ environment, no file".
        let st = unsafe { (ucp.ucp_config_read)(std::ptr::null(), std::ptr::null(), &mut config) };
        ucp.check("ucp_config_read", st)?;
        let release = |c| {
            // SAFETY: `c` came from `ucp_config_read` and is released once.
            unsafe { (ucp.ucp_config_release)(c) }
        };
        for (k, v) in &cfg.soft_options {
            if let (Ok(ck), Ok(cv)) = (CString::new(k.as_str()), CString::new(v.as_str())) {
                // SAFETY: valid config handle and NUL-terminated strings.
                let st = unsafe { (ucp.ucp_config_modify)(config, ck.as_ptr(), cv.as_ptr()) };
                if st != sys::UCS_OK {
                    tracing::debug!(option = %k, status = %ucp.status_string(st), "UCX ignored a default option");
                }
            }
        }
        for (k, v) in &cfg.ucx_options {
            let (ck, cv) = match (CString::new(k.as_str()), CString::new(v.as_str())) {
                (Ok(a), Ok(b)) => (a, b),
                _ => {
                    release(config);
                    return Err(Error::InvalidArgument(format!(
                        "UCX option {k}={v} contains NUL"
                    )));
                }
            };
            // SAFETY: valid config handle and NUL-terminated strings.
            let st = unsafe { (ucp.ucp_config_modify)(config, ck.as_ptr(), cv.as_ptr()) };
            if st != sys::UCS_OK {
                release(config);
                return Err(Error::InvalidArgument(format!(
                    "UCX rejected option {k}={v}: {} (names are UCX variables without the UCX_ prefix, e.g. TLS)",
                    ucp.status_string(st)
                )));
            }
        }
        let name = CString::new(cfg.name.clone()).unwrap_or_default();
        // SAFETY: all-zero is a valid parameter block; we set the fields we flag.
        let mut params: sys::ucp_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = sys::UCP_PARAM_FIELD_FEATURES | sys::UCP_PARAM_FIELD_NAME;
        params.features = sys::UCP_FEATURE_RMA | sys::UCP_FEATURE_AM;
        if cfg.wakeup {
            params.features |= sys::UCP_FEATURE_WAKEUP;
        }
        params.name = name.as_ptr();
        let mut context: sys::ucp_context_h = std::ptr::null_mut();
        // SAFETY: valid params and config; out-parameter.
        let st = unsafe {
            (ucp.ucp_init_version)(
                sys::API_MAJOR,
                sys::API_MINOR,
                &params,
                config,
                &mut context,
            )
        };
        release(config);
        ucp.check("ucp_init", st)?;

        // SAFETY: as above.
        let mut wp: sys::ucp_worker_params_t = unsafe { std::mem::zeroed() };
        wp.field_mask = sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE;
        if cfg.wakeup {
            wp.field_mask |= sys::UCP_WORKER_PARAM_FIELD_EVENTS;
        }
        wp.thread_mode = sys::UCS_THREAD_MODE_SINGLE;
        wp.events = sys::UCP_WAKEUP_RMA | sys::UCP_WAKEUP_TX | sys::UCP_WAKEUP_RX;
        let mut worker: sys::ucp_worker_h = std::ptr::null_mut();
        // SAFETY: live context, valid params.
        let st = unsafe { (ucp.ucp_worker_create)(context, &wp, &mut worker) };
        if st != sys::UCS_OK {
            // SAFETY: context is live and unused elsewhere.
            unsafe { (ucp.ucp_cleanup)(context) };
            return Err(ucp.error("ucp_worker_create", st));
        }
        let cleanup = |e: Error| {
            // SAFETY: both handles are live and owned here.
            unsafe {
                (ucp.ucp_worker_destroy)(worker);
                (ucp.ucp_cleanup)(context);
            }
            e
        };
        let mut efd = -1;
        if cfg.wakeup {
            // SAFETY: live worker; out-parameter.
            let st = unsafe { (ucp.ucp_worker_get_efd)(worker, &mut efd) };
            if st != sys::UCS_OK {
                return Err(cleanup(ucp.error("ucp_worker_get_efd", st)));
            }
        }
        let mut addr: *mut sys::ucp_address_t = std::ptr::null_mut();
        let mut addr_len = 0usize;
        // SAFETY: live worker; out-parameters.
        let st = unsafe { (ucp.ucp_worker_get_address)(worker, &mut addr, &mut addr_len) };
        if st != sys::UCS_OK {
            return Err(cleanup(ucp.error("ucp_worker_get_address", st)));
        }
        // SAFETY: UCX returned `addr_len` bytes at `addr`; copied, then released once.
        let worker_address =
            unsafe { std::slice::from_raw_parts(addr as *const u8, addr_len) }.to_vec();
        // SAFETY: releasing the address just obtained.
        unsafe { (ucp.ucp_worker_release_address)(worker, addr) };
        let am = sys::ucp_am_handler_param_t {
            field_mask: sys::UCP_AM_HANDLER_PARAM_FIELD_ID
                | sys::UCP_AM_HANDLER_PARAM_FIELD_FLAGS
                | sys::UCP_AM_HANDLER_PARAM_FIELD_CB
                | sys::UCP_AM_HANDLER_PARAM_FIELD_ARG,
            id: AM_ID,
            flags: sys::UCP_AM_FLAG_WHOLE_MSG,
            cb: Some(on_am),
            arg: std::ptr::null_mut(),
        };
        // SAFETY: live worker; the callback is a plain function valid forever.
        let st = unsafe { (ucp.ucp_worker_set_am_recv_handler)(worker, &am) };
        if st != sys::UCS_OK {
            return Err(cleanup(ucp.error("ucp_worker_set_am_recv_handler", st)));
        }
        Ok(State {
            ucp,
            cfg,
            context,
            worker,
            efd,
            wake,
            worker_address,
            next_id: 1,
            mems: HashMap::new(),
            eps: HashMap::new(),
            phys: HashMap::new(),
            phys_by_addr: HashMap::new(),
            keys: HashMap::new(),
            ops: HashMap::new(),
            reqs: Vec::new(),
            free_slots: Vec::new(),
            pending_acks: Vec::new(),
            notes: VecDeque::new(),
            waiters: VecDeque::new(),
            closed: false,
            closed_by_user: false,
            close_drain: None,
            unmapped_after_close: false,
            unsettled: false,
            drain_gave_up: false,
            progressed_after_unmap: false,
            last_activity: Instant::now(),
            live_requests: 0,
            peer_mode_unsupported: false,
            ep_count,
        })
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn run(&mut self, rx: mpsc::Receiver<Command>) {
        let mut last_event = Instant::now();
        loop {
            let mut busy = false;
            loop {
                match rx.try_recv() {
                    Ok(cmd) => {
                        busy = true;
                        self.command(cmd);
                    }
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        self.shutdown();
                        return;
                    }
                }
            }
            while self.progress_allowed() && self.progress() {
                busy = true;
            }
            self.check_settled();
            busy |= self.handle_events();
            self.housekeeping();
            if busy {
                last_event = Instant::now();
                continue;
            }
            if last_event.elapsed() < self.cfg.spin || (self.efd < 0 && self.live_requests > 0) {
                // Without an event fd nothing would wake us for in-flight requests.
                std::hint::spin_loop();
                continue;
            }
            self.park();
            last_event = Instant::now() - self.cfg.spin / 2;
        }
    }

    /// Arms the worker and sleeps until it, a command, or the nearest deadline wakes us.
    fn park(&mut self) {
        let progress = self.progress_allowed();
        // SAFETY: live worker on its own thread.
        if progress
            && self.efd >= 0
            && unsafe { (self.ucp.ucp_worker_arm)(self.worker) } == sys::UCS_ERR_BUSY
        {
            return;
        }
        let now = Instant::now();
        let mut until = now + self.cfg.park_max;
        for op in self.ops.values() {
            until = until.min(op.deadline);
            if let Some(t) = op.failed_at {
                until = until.min(t + self.cfg.drain_timeout);
            }
        }
        for (d, _) in &self.waiters {
            until = until.min(*d);
        }
        if let Some(t) = self.close_drain {
            until = until.min(t).min(self.last_activity + SETTLE_QUIET);
        }
        if !self.pending_acks.is_empty() {
            // A revocation may wait for direct copies (`KeyShared::direct_busy`), whose end
            // wakes nobody: look again soon.
            until = until.min(now + Duration::from_millis(1));
        }
        let timeout_ms = until
            .saturating_duration_since(now)
            .as_micros()
            .div_ceil(1000)
            .min(i32::MAX as u128) as i32;
        let mut fds = [
            libc::pollfd {
                // A negative fd is ignored by poll(2).
                fd: if progress { self.efd } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: valid pollfd entries.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
        if fds[1].revents != 0 {
            let mut v = 0u64;
            // SAFETY: draining the eventfd counter into a live u64.
            unsafe { libc::read(self.wake.as_raw_fd(), &mut v as *mut u64 as *mut c_void, 8) };
        }
    }

    fn command(&mut self, cmd: Command) {
        let closed = || Error::Closed("the UCX communicator was closed".into());
        match cmd {
            Command::Register {
                addr,
                len,
                access,
                allocate,
                reply,
            } => {
                let r = if self.closed {
                    Err(closed())
                } else {
                    self.register(addr, len, access, allocate)
                };
                let _ = reply.send(r);
            }
            Command::Unregister { id, done } => {
                self.unmap(id);
                let _ = done.send(());
            }
            Command::CreateEp { worker_addr, reply } => {
                let r = if self.closed {
                    Err(closed())
                } else {
                    self.create_ep(&worker_addr)
                };
                let _ = reply.send(r);
            }
            Command::CloseEp { ep } => {
                if let Some(e) = self.eps.get_mut(&ep) {
                    e.released = true;
                }
                self.begin_ep_close(ep, None, false);
            }
            Command::PeerGone { ep, reason } => {
                // The peer's process or communicator is gone: so is every endpoint to it.
                if let Some(pid) = self.eps.get(&ep).map(|e| e.phys) {
                    self.phys_failed(pid, reason)
                }
            }
            Command::ImportKey {
                ep,
                reg_id,
                rkey,
                shared,
                reply,
            } => {
                let r = self.import_key(ep, reg_id, &rkey, shared);
                let _ = reply.send(r);
            }
            Command::DropKey { key } => {
                if let Some(k) = self.keys.get(&key) {
                    if k.inflight == 0 {
                        let k = self.keys.remove(&key).expect("present");
                        self.destroy_rkey(k);
                    } else {
                        // In use by a draining transfer: destroyed when the endpoint closes.
                        k.shared.revoke();
                    }
                }
            }
            Command::Revoke { ep, reg_id, ack } => {
                for k in self.keys.values() {
                    if k.ep == ep && k.reg_id == reg_id {
                        k.shared.revoke();
                    }
                }
                self.pending_acks.push((ep, reg_id, ack));
            }
            Command::Transfer {
                id,
                ep,
                op,
                chunks,
                deadline,
                reply,
            } => {
                if self.closed {
                    let _ = reply.send(Err(closed()));
                    return;
                }
                self.ops.insert(
                    id,
                    TransferState {
                        ep,
                        op,
                        chunks,
                        next: 0,
                        inflight: 0,
                        flushed: false,
                        failure: None,
                        failed_at: None,
                        deadline,
                        started: Instant::now(),
                        reply: Some(reply),
                        cancel_done: Vec::new(),
                    },
                );
                self.pump(id);
            }
            Command::Notify {
                ep,
                header,
                data,
                deadline,
                reply,
            } => {
                if self.closed {
                    let _ = reply.send(Err(closed()));
                    return;
                }
                self.notify(ep, header, data, deadline, reply);
            }
            Command::Cancel { id, done } => match self.ops.get_mut(&id) {
                Some(op) => {
                    if op.failure.is_none() {
                        op.failure =
                            Some(Error::Cancelled("the transfer future was dropped".into()));
                        op.failed_at = Some(Instant::now());
                    }
                    op.cancel_done.push(done);
                    self.pump(id);
                }
                None => {
                    let _ = done.send(());
                }
            },
            Command::Recv { deadline, reply } => {
                if self.closed {
                    let _ = reply.send(Err(closed()));
                    return;
                }
                self.waiters.push_back((deadline, reply));
                self.deliver_notes();
            }
            Command::Close => {
                self.closed = true;
                self.closed_by_user = true;
                let ids: Vec<u64> = self.eps.keys().copied().collect();
                for ep in ids {
                    self.begin_ep_close(
                        ep,
                        Some("the local communicator was closed".into()),
                        false,
                    );
                }
                for (_, w) in self.waiters.drain(..) {
                    let _ = w.send(Err(closed()));
                }
                self.close_idle_phys(None);
                // UCX answers peers by itself (replies to their emulated GETs, PUT
                // acknowledgements); queued behind a full peer queue, such a send stays in the
                // worker, and `ucp_worker_destroy` crashes UCX 1.13 purging it (its GET
                // replies carry a memory handle it never set). The registrations are all
                // still mapped now, so progressing until the worker settles is as safe as
                // before `close()`. A worker idle for `SETTLE_QUIET` already is settled.
                self.unsettled = true;
                self.close_drain = Some(Instant::now() + SETTLE_LIMIT);
                self.check_settled();
            }
        }
    }

    /// One `ucp_worker_progress`; whether it did anything. After `close()`, work done
    /// may have queued sends to peers, so the worker is unsettled again.
    fn progress(&mut self) -> bool {
        // SAFETY: the worker is live and only used on this thread.
        let did = unsafe { (self.ucp.ucp_worker_progress)(self.worker) } != 0;
        if did {
            self.last_activity = Instant::now();
            self.progressed_after_unmap |= self.unmapped_after_close;
            if self.closed {
                self.unsettled = true;
                // Work after the drain settled (our endpoints still closing): drain again,
                // unless a drain already gave up or the drain's precondition is gone.
                if self.close_drain.is_none()
                    && self.closed_by_user
                    && !self.unmapped_after_close
                    && !self.drain_gave_up
                {
                    self.close_drain = Some(Instant::now() + SETTLE_LIMIT);
                }
            }
        }
        did
    }

    /// Ends the post-`close()` drain: settled once progress (allowed throughout) has been
    /// quiet for [`SETTLE_QUIET`]; given up at [`SETTLE_LIMIT`].
    fn check_settled(&mut self) {
        let Some(until) = self.close_drain else {
            return;
        };
        if self.last_activity.elapsed() >= SETTLE_QUIET {
            self.unsettled = false;
            self.close_drain = None;
        } else if Instant::now() >= until {
            self.close_drain = None;
            self.drain_gave_up = true;
        }
    }

    /// Unmaps a registration. Over transports that emulate RMA with messages (TCP, posix
    /// shared memory), a peer's put is applied by *our* progress; draining progress first
    /// applies everything already queued while the memory is still mapped.
    fn unmap(&mut self, id: u64) {
        let Some(memh) = self.mems.remove(&id) else {
            return;
        };
        while self.progress_allowed() && self.progress() {}
        // The first unmap after close() ends the drain for good (see `progress_allowed`),
        // so settle the worker first, while this memory is still mapped: in the drain, or
        // where progress is allowed anyway (our own endpoints still closing).
        if self.closed_by_user && self.unsettled {
            let drain = self.close_drain.take();
            if let Some(until) = drain.or_else(|| {
                self.progress_allowed()
                    .then(|| Instant::now() + SETTLE_LIMIT)
            }) {
                self.unsettled = !self.progress_until_quiet(until);
            }
        }
        // SAFETY: `memh` came from `ucp_mem_map` on this context and is unmapped exactly
        // once (removed from the table).
        let st = unsafe { (self.ucp.ucp_mem_unmap)(self.context, memh) };
        if st != sys::UCS_OK {
            tracing::warn!(status = %self.ucp.status_string(st), "ucp_mem_unmap failed");
        }
        if self.closed_by_user {
            // Revocation cannot reach peers after close(): from now on their queued writes
            // may target memory the application frees, so they must never be applied.
            self.unmapped_after_close = true;
            self.close_drain = None;
        }
    }

    /// After `close()`, once our own endpoints are closed, the worker is never progressed
    /// again: peers' writes still queued for it (into memory the application may free after
    /// close, when revocation can no longer reach them) are never applied. Peers see the
    /// close as EOF on the control connection and force-close their endpoints.
    ///
    /// The exception is the bounded drain right after `close()` ([`SETTLE_LIMIT`]) while
    /// every registration is still mapped; the first unmap ends it.
    fn progress_allowed(&self) -> bool {
        !(self.closed && self.phys.is_empty())
            || (!self.unmapped_after_close && self.close_drain.is_some())
    }

    fn register(
        &mut self,
        addr: u64,
        len: usize,
        access: Access,
        allocate: bool,
    ) -> Result<Registered> {
        let mut prot = sys::UCP_MEM_MAP_PROT_LOCAL_READ | sys::UCP_MEM_MAP_PROT_LOCAL_WRITE;
        if access.allows(Access::READ) {
            prot |= sys::UCP_MEM_MAP_PROT_REMOTE_READ;
        }
        if access.allows(Access::WRITE) {
            prot |= sys::UCP_MEM_MAP_PROT_REMOTE_WRITE;
        }
        // SAFETY: all-zero is valid; flagged fields set below.
        let mut p: sys::ucp_mem_map_params_t = unsafe { std::mem::zeroed() };
        p.field_mask = sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS
            | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH
            | sys::UCP_MEM_MAP_PARAM_FIELD_PROT;
        p.address = if allocate {
            std::ptr::null_mut()
        } else {
            addr as *mut c_void
        };
        if allocate {
            p.field_mask |= sys::UCP_MEM_MAP_PARAM_FIELD_FLAGS;
            p.flags = sys::UCP_MEM_MAP_ALLOCATE;
        }
        // UCX refuses zero-length maps; a zero-length region maps one byte it never moves.
        p.length = len.max(1);
        p.prot = prot;
        let mut memh: sys::ucp_mem_h = std::ptr::null_mut();
        // SAFETY: the caller of `Communicator::register` promised the region stays allocated
        // (or UCX allocates it and owns it until unmap).
        let st = unsafe { (self.ucp.ucp_mem_map)(self.context, &p, &mut memh) };
        self.ucp.check("ucp_mem_map", st)?;
        let mut mapped = addr;
        if allocate {
            let mut attr = sys::ucp_mem_attr_t {
                field_mask: sys::UCP_MEM_ATTR_FIELD_ADDRESS | sys::UCP_MEM_ATTR_FIELD_LENGTH,
                address: std::ptr::null_mut(),
                length: 0,
                mem_type: 0,
            };
            // SAFETY: live memh; out-parameter.
            let st = unsafe { (self.ucp.ucp_mem_query)(memh, &mut attr) };
            if st != sys::UCS_OK || attr.address.is_null() || attr.length < len {
                // SAFETY: unmapping the handle just mapped.
                unsafe { (self.ucp.ucp_mem_unmap)(self.context, memh) };
                return Err(self.ucp.error("ucp_mem_query", st));
            }
            mapped = attr.address as u64;
        }
        let mut buf: *mut c_void = std::ptr::null_mut();
        let mut size = 0usize;
        // SAFETY: live context and memh; out-parameters.
        let st = unsafe { (self.ucp.ucp_rkey_pack)(self.context, memh, &mut buf, &mut size) };
        if st != sys::UCS_OK {
            // SAFETY: unmapping the handle just mapped.
            unsafe { (self.ucp.ucp_mem_unmap)(self.context, memh) };
            return Err(self.ucp.error("ucp_rkey_pack", st));
        }
        // SAFETY: UCX returned `size` bytes at `buf`; copied and released once.
        let rkey = unsafe { std::slice::from_raw_parts(buf as *const u8, size) }.to_vec();
        // SAFETY: as above.
        unsafe { (self.ucp.ucp_rkey_buffer_release)(buf) };
        let id = self.id();
        self.mems.insert(id, memh);
        Ok(Registered {
            id,
            rkey,
            addr: mapped,
        })
    }

    fn create_ep(&mut self, worker_addr: &[u8]) -> Result<u64> {
        let cached = self.phys_by_addr.get(worker_addr).copied();
        let (pid, handle) = match cached {
            Some(pid) => {
                let ph = self.phys.get_mut(&pid).expect("indexed");
                ph.refs += 1;
                ph.idle_since = None;
                (pid, ph.handle)
            }
            None => {
                let pid = self.id();
                let handle = self.create_phys(pid, worker_addr)?;
                (pid, handle)
            }
        };
        let id = self.id();
        self.eps.insert(
            id,
            EpState {
                handle,
                phys: pid,
                phase: EpPhase::Open,
                failed: None,
                released: false,
                peer_failed: false,
                inflight: 0,
                keys: Vec::new(),
                drain_since: None,
            },
        );
        Ok(id)
    }

    fn create_phys(&mut self, id: u64, worker_addr: &[u8]) -> Result<sys::ucp_ep_h> {
        // SAFETY: all-zero is valid; flagged fields set below.
        let mut p: sys::ucp_ep_params_t = unsafe { std::mem::zeroed() };
        p.field_mask = sys::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS
            | sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
            | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER;
        p.address = worker_addr.as_ptr() as *const c_void;
        p.err_mode = sys::UCP_ERR_HANDLING_MODE_PEER;
        p.err_handler = sys::ucp_err_handler_t {
            cb: Some(on_ep_error),
            arg: id as *mut c_void,
        };
        let mut ep: sys::ucp_ep_h = std::ptr::null_mut();
        // SAFETY: live worker; the address bytes outlive the call (UCX copies what it needs).
        let mut st = if self.peer_mode_unsupported {
            sys::UCS_ERR_UNREACHABLE
        } else {
            unsafe { (self.ucp.ucp_ep_create)(self.worker, &p, &mut ep) }
        };
        if st == sys::UCS_ERR_UNREACHABLE {
            // Remembered, so UCX logs its "no peer failure handler" error once per communicator.
            self.peer_mode_unsupported = true;
            // UCX 1.13's shared-memory transports (posix, sysv) have no peer-failure handler,
            // so UCX refuses PEER mode over them. Fall back to NONE: the control connection's
            // EOF still reports a dead peer, and CMA operations to a dead process fail.
            tracing::debug!(
                "peer error handling unsupported by the selected transports; using UCP_ERR_HANDLING_MODE_NONE"
            );
            p.field_mask &=
                !(sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER);
            // SAFETY: as above.
            st = unsafe { (self.ucp.ucp_ep_create)(self.worker, &p, &mut ep) };
        }
        if st != sys::UCS_OK {
            return Err(Error::peer(
                "ucx worker",
                format!("ucp_ep_create failed: {}", self.ucp.status_string(st)),
            ));
        }
        self.ep_count.fetch_add(1, Ordering::AcqRel);
        self.phys.insert(
            id,
            PhysEp {
                handle: ep,
                addr: worker_addr.to_vec(),
                refs: 1,
                failed: false,
                closing: false,
                peer_mode: !self.peer_mode_unsupported,
                idle_since: None,
            },
        );
        self.phys_by_addr.insert(worker_addr.to_vec(), id);
        Ok(ep)
    }

    /// Drops one reference to a UCX endpoint; closes it when unused and failed (FORCE),
    /// or when the communicator is closing, else keeps it for reuse.
    fn release_phys(&mut self, pid: u64, failed: bool) {
        let closed = self.closed;
        let Some(ph) = self.phys.get_mut(&pid) else {
            return;
        };
        ph.refs -= 1;
        if failed && !ph.failed {
            ph.failed = true;
            let addr = ph.addr.clone();
            self.phys_by_addr.remove(&addr);
        }
        let ph = self.phys.get_mut(&pid).expect("present");
        if ph.refs == 0 {
            if ph.failed || closed {
                let force = ph.failed;
                self.close_phys(pid, force);
            } else {
                ph.idle_since = Some(Instant::now());
            }
        }
    }

    fn close_phys(&mut self, pid: u64, force: bool) {
        let Some(ph) = self.phys.get_mut(&pid) else {
            return;
        };
        if ph.closing {
            return;
        }
        ph.closing = true;
        let force = force && ph.peer_mode;
        let (handle, addr) = (ph.handle, ph.addr.clone());
        if self.phys_by_addr.get(&addr) == Some(&pid) {
            self.phys_by_addr.remove(&addr);
        }
        let slot = self.alloc_slot(Owner::EpClose { ep: pid });
        let mut p = Self::param(slot);
        if force {
            p.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_FLAGS;
            p.flags = sys::UCP_EP_CLOSE_FLAG_FORCE;
        }
        // SAFETY: a live UCX endpoint nobody uses any more (refs == 0), closed once.
        let ret = unsafe { (self.ucp.ucp_ep_close_nbx)(handle, &p) };
        if let Issue::Done(_) = self.settle(slot, ret) {
            self.phys_closed(pid);
        }
    }

    /// Gracefully closes unused UCX endpoints idle since before `older_than` (all if `None`).
    fn close_idle_phys(&mut self, older_than: Option<Instant>) {
        let idle: Vec<u64> = self
            .phys
            .iter()
            .filter(|(_, p)| {
                p.refs == 0
                    && !p.closing
                    && older_than.is_none_or(|t| p.idle_since.is_some_and(|i| i <= t))
            })
            .map(|(i, _)| *i)
            .collect();
        for pid in idle {
            self.close_phys(pid, false);
        }
    }

    fn phys_closed(&mut self, pid: u64) {
        if self.phys.remove(&pid).is_some() {
            self.ep_count.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// UCX reported the endpoint to a peer worker failed: fail everything using it.
    fn phys_failed(&mut self, pid: u64, reason: String) {
        if let Some(ph) = self.phys.get_mut(&pid) {
            ph.failed = true;
            let addr = ph.addr.clone();
            if self.phys_by_addr.get(&addr) == Some(&pid) {
                self.phys_by_addr.remove(&addr);
            }
        }
        if self.phys.get(&pid).is_some_and(|p| p.refs == 0) {
            self.close_phys(pid, true);
            return;
        }
        let eps: Vec<u64> = self
            .eps
            .iter()
            .filter(|(_, e)| e.phys == pid && e.phase != EpPhase::Closed)
            .map(|(i, _)| *i)
            .collect();
        for ep in eps {
            self.begin_ep_close(ep, Some(reason.clone()), true);
        }
        // A dead peer never completes what is queued for it: a FORCE close completes every
        // outstanding request (UCS_ERR_CANCELED), so the transfers drain now instead of at
        // `drain_timeout`. Their rkeys are destroyed right after, when the endpoints drain.
        if self.phys.get(&pid).is_some_and(|p| p.peer_mode) {
            self.close_phys(pid, true);
        }
    }

    fn ep_error(&self, ep: u64) -> Error {
        match self.eps.get(&ep) {
            Some(e) if e.failed.is_some() => Error::peer(
                "ucx endpoint",
                format!("{}; connect again", e.failed.as_deref().unwrap_or_default()),
            ),
            Some(e) if e.phase == EpPhase::Open => Error::peer("ucx endpoint", "usable"),
            _ => Error::Closed("the UCX endpoint is closed".into()),
        }
    }

    fn import_key(
        &mut self,
        ep: u64,
        reg_id: u64,
        rkey: &[u8],
        shared: Arc<KeyShared>,
    ) -> Result<u64> {
        let handle = match self.eps.get(&ep) {
            Some(e) if e.phase == EpPhase::Open => e.handle,
            _ => return Err(self.ep_error(ep)),
        };
        let mut out: sys::ucp_rkey_h = std::ptr::null_mut();
        // SAFETY: live endpoint; `rkey` is a buffer the target produced with `ucp_rkey_pack`
        // and confirmed byte for byte over the control connection (see `control.rs`), so
        // UCX never parses bytes the owner did not pack.
        let st = unsafe {
            (self.ucp.ucp_ep_rkey_unpack)(handle, rkey.as_ptr() as *const c_void, &mut out)
        };
        if st != sys::UCS_OK {
            return Err(Error::InvalidKey(format!(
                "ucp_ep_rkey_unpack refused the key: {}",
                self.ucp.status_string(st)
            )));
        }
        if self.cfg.direct_mapped {
            let mut local: *mut c_void = std::ptr::null_mut();
            // SAFETY: `out` was just unpacked on this thread; out-parameter. UCX answers
            // UCS_OK only when the region is mapped into this process (shared memory
            // allocated by UCX at the target); the mapping lives until `ucp_rkey_destroy`.
            let st = unsafe { (self.ucp.ucp_rkey_ptr)(out, shared.remote_base, &mut local) };
            if st == sys::UCS_OK && !local.is_null() {
                shared.mapped.store(local as u64, Ordering::Release);
            }
        }
        let id = self.id();
        self.keys.insert(
            id,
            KeyState {
                ep,
                reg_id,
                rkey: out,
                inflight: 0,
                shared,
            },
        );
        self.eps.get_mut(&ep).expect("checked").keys.push(id);
        Ok(id)
    }

    fn destroy_rkey(&self, k: KeyState) {
        k.shared.revoke_and_drain();
        if !k.rkey.is_null() {
            // SAFETY: unpacked on this thread, no request uses it (inflight == 0 or the
            // endpoint has drained), destroyed once (the entry is consumed).
            unsafe { (self.ucp.ucp_rkey_destroy)(k.rkey) };
        }
    }

    fn alloc_slot(&mut self, owner: Owner) -> usize {
        let rec = Some(ReqRec {
            owner,
            req: std::ptr::null_mut(),
        });
        match self.free_slots.pop() {
            Some(i) => {
                self.reqs[i] = rec;
                i
            }
            None => {
                self.reqs.push(rec);
                self.reqs.len() - 1
            }
        }
    }

    fn param(slot: usize) -> sys::ucp_request_param_t {
        let mut p = sys::ucp_request_param_t::empty();
        p.op_attr_mask = sys::UCP_OP_ATTR_FIELD_CALLBACK | sys::UCP_OP_ATTR_FIELD_USER_DATA;
        p.cb = Some(on_request);
        p.user_data = slot as *mut c_void;
        p
    }

    /// Interprets an `_nbx` return value; keeps the slot when a request is pending.
    fn settle(&mut self, slot: usize, ret: sys::ucs_status_ptr_t) -> Issue {
        if ret.is_null() {
            self.reqs[slot] = None;
            self.free_slots.push(slot);
            Issue::Done(sys::UCS_OK)
        } else if sys::ptr_is_err(ret) {
            self.reqs[slot] = None;
            self.free_slots.push(slot);
            Issue::Done(sys::ptr_status(ret))
        } else {
            self.reqs[slot].as_mut().expect("allocated").req = ret;
            self.live_requests += 1;
            Issue::Pending
        }
    }

    /// Issues what a transfer may issue and finishes it when nothing is left in flight.
    fn pump(&mut self, id: u64) {
        let window = self.cfg.max_inflight_chunks.max(1);
        loop {
            let Some(op) = self.ops.get_mut(&id) else {
                return;
            };
            if op.failure.is_some() || op.next >= op.chunks.len() || op.inflight >= window {
                break;
            }
            if Instant::now() >= op.deadline {
                op.failure = Some(Error::DeadlineExceeded {
                    during: "ucx transfer",
                    elapsed: op.started.elapsed(),
                });
                op.failed_at = Some(Instant::now());
                break;
            }
            let chunk = op.chunks[op.next];
            let (ep_id, kind) = (op.ep, op.op);
            let ep_handle = match self.eps.get(&ep_id) {
                Some(e) if e.phase == EpPhase::Open => e.handle,
                _ => {
                    let err = self.ep_error(ep_id);
                    let op = self.ops.get_mut(&id).expect("present");
                    op.failure = Some(err);
                    op.failed_at = Some(Instant::now());
                    break;
                }
            };
            let rkey = match self.keys.get(&chunk.key) {
                Some(k) if !k.shared.revoked.load(Ordering::Acquire) && !k.rkey.is_null() => k.rkey,
                _ => {
                    let op = self.ops.get_mut(&id).expect("present");
                    op.failure = Some(Error::InvalidKey(
                        "the target deregistered the region (or the key was released)".into(),
                    ));
                    op.failed_at = Some(Instant::now());
                    break;
                }
            };
            let op = self.ops.get_mut(&id).expect("present");
            op.next += 1;
            let slot = self.alloc_slot(Owner::Chunk {
                op: id,
                key: chunk.key,
                ep: ep_id,
            });
            let p = Self::param(slot);
            // SAFETY: live endpoint and rkey; the local range lies in a registration the
            // transfer future keeps alive (it waits for this request before returning), and
            // the remote range was bounds-checked against the target's registration.
            let ret = unsafe {
                match kind {
                    Op::Write => (self.ucp.ucp_put_nbx)(
                        ep_handle,
                        chunk.local as *const c_void,
                        chunk.len,
                        chunk.remote,
                        rkey,
                        &p,
                    ),
                    Op::Read => (self.ucp.ucp_get_nbx)(
                        ep_handle,
                        chunk.local as *mut c_void,
                        chunk.len,
                        chunk.remote,
                        rkey,
                        &p,
                    ),
                }
            };
            match self.settle(slot, ret) {
                Issue::Done(sys::UCS_OK) => {}
                Issue::Done(st) => {
                    let err = self.status_error(ep_id, "ucp_put_nbx/ucp_get_nbx", st);
                    let op = self.ops.get_mut(&id).expect("present");
                    op.failure = Some(err);
                    op.failed_at = Some(Instant::now());
                }
                Issue::Pending => {
                    self.ops.get_mut(&id).expect("present").inflight += 1;
                    self.keys.get_mut(&chunk.key).expect("checked").inflight += 1;
                    self.eps.get_mut(&ep_id).expect("checked").inflight += 1;
                }
            }
        }
        let op = self.ops.get_mut(&id).expect("present");
        if op.inflight > 0 {
            return;
        }
        if op.failure.is_none() && op.next < op.chunks.len() {
            return;
        }
        if op.failure.is_none() && op.op == Op::Write && !op.flushed && !op.chunks.is_empty() {
            let ep_id = op.ep;
            op.flushed = true;
            let handle = match self.eps.get(&ep_id) {
                Some(e) if e.phase == EpPhase::Open => e.handle,
                _ => {
                    let err = self.ep_error(ep_id);
                    self.finish(id, Err(err));
                    return;
                }
            };
            let slot = self.alloc_slot(Owner::Flush { op: id, ep: ep_id });
            let p = Self::param(slot);
            // SAFETY: live endpoint; flush touches no user memory.
            let ret = unsafe { (self.ucp.ucp_ep_flush_nbx)(handle, &p) };
            match self.settle(slot, ret) {
                Issue::Done(sys::UCS_OK) => self.finish(id, Ok(())),
                Issue::Done(st) => {
                    let err = self.status_error(ep_id, "ucp_ep_flush_nbx", st);
                    self.finish(id, Err(err));
                }
                Issue::Pending => {
                    self.ops.get_mut(&id).expect("present").inflight += 1;
                    self.eps.get_mut(&ep_id).expect("checked").inflight += 1;
                }
            }
            return;
        }
        let result = match op.failure.take() {
            Some(e) => Err(e),
            None => Ok(()),
        };
        self.finish(id, result);
    }

    fn status_error(&self, ep: u64, function: &'static str, st: sys::ucs_status_t) -> Error {
        match self.eps.get(&ep) {
            Some(e) if e.failed.is_some() => self.ep_error(ep),
            _ if st == sys::UCS_ERR_CANCELED => {
                Error::Cancelled(format!("{function} was cancelled"))
            }
            _ => self.ucp.error(function, st),
        }
    }

    fn finish(&mut self, id: u64, result: Result<()>) {
        if let Some(mut op) = self.ops.remove(&id) {
            if let Some(r) = op.reply.take() {
                let _ = r.send(result);
            }
            for d in op.cancel_done.drain(..) {
                let _ = d.send(());
            }
        }
    }

    fn notify(
        &mut self,
        ep: u64,
        header: Vec<u8>,
        data: Vec<u8>,
        deadline: Instant,
        reply: oneshot::Sender<Result<()>>,
    ) {
        let handle = match self.eps.get(&ep) {
            Some(e) if e.phase == EpPhase::Open => e.handle,
            _ => {
                let _ = reply.send(Err(self.ep_error(ep)));
                return;
            }
        };
        let (hp, hl, dp, dl) = (header.as_ptr(), header.len(), data.as_ptr(), data.len());
        let slot = self.alloc_slot(Owner::Notify {
            ep,
            reply: Some(reply),
            deadline,
            _bufs: (header, data),
        });
        let mut p = Self::param(slot);
        p.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = sys::UCP_AM_SEND_FLAG_EAGER;
        // SAFETY: live endpoint; the header and data vectors are owned by the request record
        // (moving a Vec does not move its heap buffer) until the request completes.
        let ret = unsafe {
            (self.ucp.ucp_am_send_nbx)(
                handle,
                AM_ID,
                hp as *const c_void,
                hl,
                dp as *const c_void,
                dl,
                &p,
            )
        };
        if ret.is_null() || sys::ptr_is_err(ret) {
            let st = if ret.is_null() {
                sys::UCS_OK
            } else {
                sys::ptr_status(ret)
            };
            let rec = self.reqs[slot].take().expect("allocated");
            self.free_slots.push(slot);
            if let Owner::Notify { reply: Some(r), .. } = rec.owner {
                let _ = r.send(if st == sys::UCS_OK {
                    Ok(())
                } else {
                    Err(self.status_error(ep, "ucp_am_send_nbx", st))
                });
            }
        } else {
            self.reqs[slot].as_mut().expect("allocated").req = ret;
            self.live_requests += 1;
            self.eps.get_mut(&ep).expect("checked").inflight += 1;
        }
    }

    /// Starts tearing an endpoint down: `reason` marks a failure (peer gone, local close).
    fn begin_ep_close(&mut self, ep: u64, reason: Option<String>, peer_failed: bool) {
        let Some(e) = self.eps.get_mut(&ep) else {
            return;
        };
        e.peer_failed |= peer_failed;
        if e.failed.is_none()
            && let Some(r) = &reason
        {
            tracing::debug!(ep, reason = %r, "ucx endpoint failed");
            e.failed = Some(r.clone());
        }
        if e.phase == EpPhase::Open {
            e.phase = EpPhase::Draining;
            e.drain_since = Some(Instant::now());
        }
        let keys = e.keys.clone();
        for k in keys {
            if let Some(k) = self.keys.get(&k) {
                k.shared.revoke();
            }
        }
        let err = self.ep_error(ep);
        let ids: Vec<u64> = self
            .ops
            .iter()
            .filter(|(_, o)| o.ep == ep)
            .map(|(i, _)| *i)
            .collect();
        for id in ids {
            let op = self.ops.get_mut(&id).expect("present");
            if op.failure.is_none() {
                op.failure = Some(match &err {
                    Error::Peer { peer, reason } => Error::peer(peer, reason.clone()),
                    _ => Error::Closed("the UCX endpoint was closed".into()),
                });
                op.failed_at = Some(Instant::now());
            }
            self.pump(id);
        }
        self.advance_ep(ep);
    }

    /// Moves a draining endpoint on: once nothing is in flight (or `drain_timeout` passed),
    /// destroys its rkeys and closes it; removes it once closed and released.
    fn advance_ep(&mut self, ep: u64) {
        let Some(e) = self.eps.get_mut(&ep) else {
            return;
        };
        match e.phase {
            EpPhase::Open => {}
            EpPhase::Draining => {
                let timed_out = e
                    .drain_since
                    .is_some_and(|t| t.elapsed() >= self.cfg.drain_timeout);
                if e.inflight > 0 && !timed_out {
                    return;
                }
                let leak_keys = e.inflight > 0;
                // Only a failed peer or a stuck drain justifies FORCE: a forced close of a live
                // connection leaves the peer's wire-up half done, which UCX 1.13 handles badly.
                let failed = e.peer_failed || timed_out;
                let pid = e.phys;
                e.phase = EpPhase::Closed;
                e.handle = std::ptr::null_mut();
                if e.failed.is_none() {
                    e.failed = Some("the endpoint was closed".into());
                }
                let keys = std::mem::take(&mut e.keys);
                if leak_keys {
                    tracing::warn!(
                        ep,
                        "ucx endpoint did not drain within drain_timeout; force-closing it and leaking its rkeys"
                    );
                }
                for k in keys {
                    if let Some(mut k) = self.keys.remove(&k) {
                        if leak_keys {
                            k.rkey = std::ptr::null_mut();
                        }
                        self.destroy_rkey(k);
                    }
                }
                self.release_phys(pid, failed);
                self.advance_ep(ep);
            }
            EpPhase::Closed => {
                if e.released {
                    self.eps.remove(&ep);
                }
            }
        }
    }

    fn handle_events(&mut self) -> bool {
        let events = EVENTS.with(|e| std::mem::take(&mut *e.borrow_mut()));
        let any = !events.is_empty();
        for ev in events {
            match ev {
                Event::Req { slot, status } => self.request_done(slot, status),
                Event::EpError { ep, status } => {
                    let reason = format!(
                        "UCX reported an endpoint error: {}",
                        self.ucp.status_string(status)
                    );
                    self.phys_failed(ep, reason);
                }
                Event::Note(n) => {
                    if self.cfg.max_pending_notifications == 0 {
                        // A communicator that reads none (the RPC data plane): nothing to
                        // warn about, and a peer must not be able to flood the log.
                        tracing::debug!(
                            "dropping a notification: this communicator takes none \
                             (UcxConfig::max_pending_notifications is 0)"
                        );
                    } else if self.notes.len() >= self.cfg.max_pending_notifications {
                        tracing::warn!(
                            limit = self.cfg.max_pending_notifications,
                            "dropping a notification: max_pending_notifications reached; call \
                             recv_notification more often or raise UcxConfig::max_pending_notifications"
                        );
                    } else {
                        self.notes.push_back(n);
                    }
                }
            }
        }
        if any {
            self.deliver_notes();
        }
        any
    }

    fn request_done(&mut self, slot: usize, status: sys::ucs_status_t) {
        let Some(rec) = self.reqs.get_mut(slot).and_then(Option::take) else {
            return;
        };
        self.live_requests -= 1;
        self.free_slots.push(slot);
        if !rec.req.is_null() {
            // SAFETY: the request was returned by an `_nbx` call and completed; freed once.
            unsafe { (self.ucp.ucp_request_free)(rec.req) };
        }
        match rec.owner {
            Owner::Chunk { op, key, ep } => {
                if let Some(k) = self.keys.get_mut(&key) {
                    k.inflight -= 1;
                }
                self.ep_done(ep);
                self.op_step_done(op, ep, status, "ucp_put_nbx/ucp_get_nbx");
            }
            Owner::Flush { op, ep } => {
                self.ep_done(ep);
                self.op_step_done(op, ep, status, "ucp_ep_flush_nbx");
            }
            Owner::Notify { ep, reply, .. } => {
                self.ep_done(ep);
                if let Some(r) = reply {
                    let _ = r.send(if status == sys::UCS_OK {
                        Ok(())
                    } else {
                        Err(self.status_error(ep, "ucp_am_send_nbx", status))
                    });
                }
            }
            Owner::EpClose { ep } => self.phys_closed(ep),
            Owner::AckFlush { ep, ack } => {
                self.ep_done(ep);
                if let Some(a) = ack {
                    a();
                }
            }
        }
    }

    fn ep_done(&mut self, ep: u64) {
        if let Some(e) = self.eps.get_mut(&ep) {
            e.inflight -= 1;
            if e.inflight == 0 && e.phase == EpPhase::Draining {
                self.advance_ep(ep);
            }
        }
    }

    fn op_step_done(
        &mut self,
        id: u64,
        ep: u64,
        status: sys::ucs_status_t,
        function: &'static str,
    ) {
        let err = (status != sys::UCS_OK).then(|| self.status_error(ep, function, status));
        let Some(op) = self.ops.get_mut(&id) else {
            return;
        };
        op.inflight -= 1;
        if let Some(e) = err
            && op.failure.is_none()
        {
            op.failure = Some(e);
            op.failed_at = Some(Instant::now());
        }
        self.pump(id);
    }

    /// Deadlines, drain limits, revocation acknowledgements, notification waiters.
    fn housekeeping(&mut self) {
        let now = Instant::now();
        let mut expired = Vec::new();
        let mut stuck = Vec::new();
        for (id, op) in &self.ops {
            if op.failure.is_none() && now >= op.deadline {
                expired.push(*id);
            }
            if op
                .failed_at
                .is_some_and(|t| now >= t + self.cfg.drain_timeout)
            {
                stuck.push(op.ep);
            }
        }
        for id in expired {
            let op = self.ops.get_mut(&id).expect("present");
            op.failure = Some(Error::DeadlineExceeded {
                during: "ucx transfer",
                elapsed: op.started.elapsed(),
            });
            op.failed_at = Some(now);
            self.cancel_requests_of(id);
            self.pump(id);
        }
        for ep in stuck {
            tracing::warn!(
                ep,
                "a cancelled ucx transfer did not drain within drain_timeout; force-closing its endpoint"
            );
            self.begin_ep_close(
                ep,
                Some("a cancelled transfer did not drain within drain_timeout".into()),
                true,
            );
            if let Some(e) = self.eps.get_mut(&ep) {
                e.drain_since = Some(now - self.cfg.drain_timeout);
            }
            self.advance_ep(ep);
        }
        let eps: Vec<u64> = self
            .eps
            .iter()
            .filter(|(_, e)| {
                e.phase == EpPhase::Draining
                    && e.drain_since
                        .is_some_and(|t| now >= t + self.cfg.drain_timeout)
            })
            .map(|(i, _)| *i)
            .collect();
        for ep in eps {
            self.advance_ep(ep);
        }
        if let Some(t) = now.checked_sub(self.cfg.ep_linger) {
            self.close_idle_phys(Some(t));
        }
        // Notify deadlines: the bytes are our own copy, so answering early is safe.
        for rec in self.reqs.iter_mut().flatten() {
            if let Owner::Notify {
                reply, deadline, ..
            } = &mut rec.owner
                && now >= *deadline
                && let Some(r) = reply.take()
            {
                let _ = r.send(Err(Error::DeadlineExceeded {
                    during: "ucx notify",
                    elapsed: Duration::ZERO,
                }));
            }
        }
        if !self.pending_acks.is_empty() {
            let mut i = 0;
            while i < self.pending_acks.len() {
                let (ep, reg_id, _) = &self.pending_acks[i];
                let busy = self.keys.values().any(|k| {
                    k.ep == *ep
                        && k.reg_id == *reg_id
                        && (k.inflight > 0 || k.shared.direct_busy.load(Ordering::SeqCst) > 0)
                });
                if busy {
                    i += 1;
                } else {
                    let (ep, _, ack) = self.pending_acks.swap_remove(i);
                    self.flush_then(ep, ack);
                }
            }
        }
        if !self.waiters.is_empty() {
            let mut kept = VecDeque::with_capacity(self.waiters.len());
            for (d, w) in self.waiters.drain(..) {
                if w.is_canceled() {
                    continue;
                }
                if now >= d {
                    let _ = w.send(Err(Error::DeadlineExceeded {
                        during: "ucx recv_notification",
                        elapsed: Duration::ZERO,
                    }));
                    continue;
                }
                kept.push_back((d, w));
            }
            self.waiters = kept;
        }
    }

    /// Runs `ack` once everything issued on `ep` is complete at the target: over transports
    /// that emulate RMA with messages, a put completes locally before the target applied it.
    fn flush_then(&mut self, ep: u64, ack: Ack) {
        let handle = match self.eps.get(&ep) {
            Some(e) if e.phase == EpPhase::Open => e.handle,
            _ => return ack(),
        };
        let slot = self.alloc_slot(Owner::AckFlush { ep, ack: Some(ack) });
        let p = Self::param(slot);
        // SAFETY: live endpoint; flush touches no user memory.
        let ret = unsafe { (self.ucp.ucp_ep_flush_nbx)(handle, &p) };
        if ret.is_null() || sys::ptr_is_err(ret) {
            let rec = self.reqs[slot].take().expect("allocated");
            self.free_slots.push(slot);
            if let Owner::AckFlush { ack: Some(a), .. } = rec.owner {
                a();
            }
        } else {
            self.reqs[slot].as_mut().expect("allocated").req = ret;
            self.live_requests += 1;
            self.eps.get_mut(&ep).expect("checked").inflight += 1;
        }
    }

    fn cancel_requests_of(&mut self, id: u64) {
        for rec in self.reqs.iter().flatten() {
            if let Owner::Chunk { op, .. } = rec.owner
                && op == id
                && !rec.req.is_null()
            {
                // SAFETY: a live request of this worker; cancel is advisory.
                unsafe { (self.ucp.ucp_request_cancel)(self.worker, rec.req) };
            }
        }
    }

    fn deliver_notes(&mut self) {
        while !self.notes.is_empty() {
            let Some((_, w)) = self.waiters.pop_front() else {
                break;
            };
            let note = self.notes.pop_front().expect("non-empty");
            if let Err(Ok(note)) = w.send(Ok(note)) {
                self.notes.push_front(note);
            }
        }
    }

    fn shutdown(&mut self) {
        self.closed = true;
        let ids: Vec<u64> = self.eps.keys().copied().collect();
        for ep in ids {
            if let Some(e) = self.eps.get_mut(&ep) {
                e.released = true;
            }
            self.begin_ep_close(ep, Some("the communicator was dropped".into()), false);
        }
        self.close_idle_phys(None);
        let until = Instant::now() + Duration::from_secs(2);
        while !(self.eps.is_empty() && self.phys.is_empty()) && Instant::now() < until {
            self.progress();
            self.handle_events();
            self.housekeeping();
        }
        let quiet = self.settled();
        for (_, k) in std::mem::take(&mut self.keys) {
            self.destroy_rkey(k);
        }
        for (_, memh) in std::mem::take(&mut self.mems) {
            // SAFETY: a mapping of this context, unmapped once.
            unsafe { (self.ucp.ucp_mem_unmap)(self.context, memh) };
        }
        if quiet {
            // SAFETY: nothing refers to the worker or context any more, and the worker
            // holds no send (see `settled`); destroyed once.
            unsafe {
                (self.ucp.ucp_worker_destroy)(self.worker);
                (self.ucp.ucp_cleanup)(self.context);
            }
        } else {
            // `ucp_worker_destroy` purges the sends still queued in the worker, and UCX 1.13
            // crashes purging its own GET replies (it reads a memory handle it never set).
            // Leaking one worker is the lesser harm; it is never progressed again.
            tracing::warn!(
                name = %self.cfg.name,
                "the UCX worker still held sends to peers that stopped reading; leaking the \
                 worker and context instead of destroying them (UCX 1.13 crashes purging them)"
            );
            LEAKED_WORKERS.fetch_add(1, Ordering::Relaxed);
        }
        EVENTS.with(|e| e.borrow_mut().clear());
    }

    /// Whether the worker may be destroyed: nothing it did since `close()` can have left a
    /// send queued in it. UCX offers no way to ask (`ucp_worker_flush_nbx` completes at
    /// once over shared memory whatever is queued), so the rule is progress that stayed
    /// quiet for [`SETTLE_QUIET`] after the last work. Where the drain after `close()`
    /// ended unsettled, tear-down progresses the worker again, for at most
    /// [`SETTLE_LIMIT`], if that is safe: no registration was unmapped after `close()`
    /// (every earlier unmap revoked its key at the peers first), or the worker was
    /// progressed after such an unmap anyway, to close its own endpoints
    /// ([`State::progress_allowed`]); then it goes on until the worker is quiet.
    fn settled(&mut self) -> bool {
        if !self.unsettled {
            return true;
        }
        if self.closed_by_user && self.unmapped_after_close && !self.progressed_after_unmap {
            return false;
        }
        let settled = self.progress_until_quiet(Instant::now() + SETTLE_LIMIT);
        self.unsettled = !settled;
        settled
    }

    /// Progresses the worker until it has been quiet for [`SETTLE_QUIET`] (true) or
    /// `until` passes (false).
    fn progress_until_quiet(&mut self, until: Instant) -> bool {
        loop {
            if self.last_activity.elapsed() >= SETTLE_QUIET {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            self.progress();
            self.handle_events();
            std::thread::yield_now();
        }
    }
}
