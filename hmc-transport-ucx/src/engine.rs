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
//! issuing chunks and reports only once every issued chunk has completed (a WRITE's after
//! a flush too), so when the caller hears back UCX no longer touches its memory, and none
//! of a WRITE's issued bytes lands at the target later. If a chunk or that flush does not
//! complete within `drain_timeout` the target makes no progress: the UCX endpoint's
//! generation is abandoned (the target drops what it holds of it, `generations`), then
//! force-closed, which completes the requests on it, and replaced by a new one.
//!
//! # Layout
//!
//! This file holds what the communicator sees (the [`Command`]s, the handle [`Engine`], the
//! types they carry) and the engine thread's `State`, which is one table per job, each
//! defined in its own module with the methods that need only it: `endpoints`
//! ([`endpoints::Endpoints`]), `keys` (registrations, imported rkeys, pending
//! revocations), `transfers`, `requests` (the slots UCX completes), `notifications` (the
//! bounded queue and its waiters), `generations` (binding, abandoning and replacing a UCX
//! endpoint's generation) and `lifecycle` (closing and the settling drain, no UCX
//! call). `callbacks` holds the UCX callbacks, which only queue events; `control_side`
//! names what the engine needs of the control connections, as traits the `control`
//! module implements (the engine does not name that module, which drives it). The steps that
//! cross tables are methods of `State` in the module of the job they serve; `progress`
//! holds the loop, parking, housekeeping and shutdown, `commands` the dispatch.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use futures::channel::oneshot;
use hmc_core::{Access, Error, Op, Result};
use hmc_transport_kit::wake::WakeFd;

use crate::config::UcxConfig;
use crate::sys::{self, Ucp};

mod callbacks;
mod commands;
mod control_side;
mod endpoints;
mod generations;
mod keys;
mod lifecycle;
mod notifications;
mod progress;
mod requests;
mod transfers;

pub(crate) use control_side::{AbandonAck, InitiatorControl, TargetControl};

/// What one engine runs with.
#[derive(Clone, Debug)]
pub(crate) struct EngineConfig {
    /// Names the progress thread (the control listener's address).
    pub name: String,
    /// UCX options applied: `TLS` where the user chose transports, then the user's own.
    pub ucx_options: Vec<(String, String)>,
    /// Defaults applied before `ucx_options`; a library that does not know one is fine.
    pub soft_options: Vec<(String, String)>,
    /// The user's configuration with its floors ([`UcxConfig::floored`]), for the
    /// engine's tunables: `max_inflight_chunks`, `spin`, `wakeup`, `park_max`,
    /// `drain_timeout`, `abandon_timeout` (how long an abandoning initiator waits for the
    /// target's answer, `generations`), `ep_linger`, `max_pending_notifications` and
    /// `direct_mapped` (ask UCX for a local mapping of imported regions, `ucp_rkey_ptr`).
    pub tunables: UcxConfig,
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
        /// The control connection beside the endpoint (carries abandons to the target).
        link: Option<Arc<dyn InitiatorControl>>,
        reply: mpsc::SyncSender<Result<u64>>,
    },
    /// A control connection queued an abandon of one of our peers' generations.
    TakeAbandons,
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
    wake: Arc<WakeFd>,
    pub ucp: Arc<Ucp>,
    pub worker_address: Arc<Vec<u8>>,
    /// The memory types the context moves (`ucs_memory_type_t` bits, `ucp_context_query`).
    pub memory_types: u64,
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

impl Engine {
    /// Starts the progress thread, which creates the context and worker.
    /// `control` is the target side of this communicator's control connections, which
    /// the thread settles after a stall (`generations`).
    pub fn start(
        ucp: Arc<Ucp>,
        config: EngineConfig,
        control: Arc<dyn TargetControl>,
    ) -> Result<Engine> {
        let wake = Arc::new(WakeFd::new("the UCX engine's wake eventfd")?);
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
                let links = Links {
                    wake: thread_wake,
                    control,
                };
                match State::new(thread_ucp, config, links, thread_eps) {
                    Ok(mut state) => {
                        let _ =
                            ready_tx.send(Ok((state.worker_address.clone(), state.memory_types)));
                        state.run(rx);
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| Error::io("spawning the UCX progress thread", e))?;
        let (worker_address, memory_types) = ready_rx.recv().map_err(|_| {
            Error::Closed("the UCX progress thread exited during start-up".into())
        })??;
        Ok(Engine {
            tx,
            wake,
            ucp,
            worker_address: Arc::new(worker_address),
            memory_types,
            ucx_endpoints,
        })
    }

    /// Sends a command and wakes the thread.
    pub fn send(&self, cmd: Command) -> Result<()> {
        self.tx
            .send(cmd)
            .map_err(|_| Error::Closed("the UCX progress thread has exited".into()))?;
        self.wake.signal();
        Ok(())
    }

    /// Like [`Engine::send`], but hands the command back when the thread has exited.
    pub fn send_or_return(&self, cmd: Command) -> std::result::Result<(), Command> {
        self.tx.send(cmd).map_err(|e| e.0)?;
        self.wake.signal();
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

/// The engine thread's state: one table per job (see the module's layout).
struct State {
    ucp: Arc<Ucp>,
    cfg: EngineConfig,
    context: sys::ucp_context_h,
    worker: sys::ucp_worker_h,
    /// The worker's event fd, -1 without wake-ups.
    efd: i32,
    wake: Arc<WakeFd>,
    /// Abandoned generations (`generations`): the abandoning threads' answers, (UCX
    /// endpoint, whether the target confirmed). Not the command channel, whose
    /// disconnection ends the thread.
    abandoned_tx: mpsc::Sender<(u64, bool)>,
    abandoned_rx: mpsc::Receiver<(u64, bool)>,
    /// The target side of the control connections (`generations`).
    control: Arc<dyn TargetControl>,
    worker_address: Vec<u8>,
    memory_types: u64,
    next_id: u64,
    eps: endpoints::Endpoints,
    keys: keys::Keys,
    ops: transfers::Transfers,
    reqs: requests::Requests,
    notes: notifications::Notes,
    life: lifecycle::Lifecycle,
    gens: generations::PeerGens,
    stall: generations::StallClock,
}

/// What the engine thread is handed besides UCX: its wake-up and the control
/// connections' target side.
struct Links {
    wake: Arc<WakeFd>,
    control: Arc<dyn TargetControl>,
}
