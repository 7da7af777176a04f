//! The tokio server: accept loop, one task per connection around a [`ServerConn`] core,
//! handler execution (async tasks and a fixed pool of blocking workers), limits, and
//! graceful shutdown.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::{BoxStream, SelectAll};
use hmc_core::{Communicator, Error, PeerAddr, Result};
use parking_lot::Mutex;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::budget::{HeldBudget, ServerStats};
use crate::data_plane::{
    ConnUse, DataPlaneConfig, DataPlaneStats, NoDataPlane, RpcPeer, ServerDp, ServerPlane,
};
use crate::dispatch::{CancelToken, Connection, Dispatcher, HandlerResult, RpcError};
use crate::frame::PayloadMode;
use crate::frame::Status;
use crate::net::{BusyPoll, ConnTimer, Listener, POLL_MAX_MESSAGE, Stream};
use crate::proto::{ConnConfig, IdMap, ReadTarget, ServerConn, ServerEvent};
use crate::settings::{Settings, features};

mod admit;
mod start;

use admit::{admit, refuse_connection};
use start::start_call;

/// Server limits and sizes. Every field has a default and a name used in error messages.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Per-connection limits and timers (`max_inflight_per_conn`, `max_payload_len`, …).
    pub conn: ConnConfig,
    /// Open connections (`max_connections`, default 1024); beyond it a new connection gets
    /// GOAWAY(OVERLOADED) and is closed.
    pub max_connections: usize,
    /// Calls running across all connections (`max_inflight_total`, default 4096); beyond
    /// it calls are answered OVERLOADED.
    pub max_inflight_total: usize,
    /// Bytes the server holds for all its clients together (`max_held_bytes`, default
    /// 1 GiB): what every connection's `max_conn_held_bytes` counts, summed. Beyond it new
    /// calls are answered OVERLOADED (see [`crate::budget`]).
    pub max_held_bytes: u64,
    /// Threads of the fixed pool that runs blocking handlers (`workers`, default 4).
    pub workers: usize,
    /// How long a graceful shutdown waits for calls in flight (`shutdown_grace`, 30 s).
    pub shutdown_grace: Duration,
    /// How long an async handler keeps running after its call is cancelled
    /// (`handler_cancel_grace`, 100 ms): the handler's `ctx.cancel` has fired, and the
    /// runtime goes on polling it for up to this long so that it can see the token, clean
    /// up and return; then its future is dropped. See [`Dispatcher`]'s "Cancellation".
    pub handler_cancel_grace: Duration,
    /// A pre-shared secret every client must prove it holds before its first frame is read
    /// (`auth_secret`, default none; see `ClientConfig::auth_secret`). The exchange is
    /// HMAC-SHA256 in both directions; nothing is encrypted.
    pub auth_secret: Option<crate::AuthSecret>,
    /// Without an `auth_secret`: refuse clients on this host that run as another user
    /// (Unix sockets by `SO_PEERCRED`, TCP from this host by the socket's owner in
    /// `/proc/net/tcp`); clients on other hosts are admitted (`same_user_only`, default
    /// false). The engine's metadata service turns it on.
    pub same_user_only: bool,
    /// How long a client may take to finish the authentication exchange (`auth_timeout`,
    /// default 5 s).
    pub auth_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            conn: ConnConfig::default(),
            max_connections: 1024,
            max_inflight_total: 4096,
            max_held_bytes: 1 << 30,
            workers: 4,
            shutdown_grace: Duration::from_secs(30),
            handler_cancel_grace: Duration::from_millis(100),
            auth_secret: None,
            same_user_only: false,
            auth_timeout: Duration::from_secs(5),
        }
    }
}

/// An RPC server, generic over the data plane used for HMC_BUFFER payloads.
pub struct Server<C: Communicator = NoDataPlane> {
    dispatcher: Dispatcher,
    config: ServerConfig,
    data_plane: Option<Arc<C>>,
    dp_config: DataPlaneConfig,
}

impl Server<NoDataPlane> {
    /// A server for `dispatcher` without a data plane.
    pub fn new(dispatcher: Dispatcher, config: ServerConfig) -> Self {
        Server {
            dispatcher,
            config,
            data_plane: None,
            dp_config: DataPlaneConfig::default(),
        }
    }
}

impl<C: Communicator> Server<C> {
    /// Attaches a data plane: HMC_BUFFER requests are pulled over it and large responses
    /// pushed into the client's region (default [`DataPlaneConfig`]).
    pub fn with_data_plane<D: Communicator>(self, data_plane: Arc<D>) -> Server<D> {
        Server {
            dispatcher: self.dispatcher,
            config: self.config,
            data_plane: Some(data_plane),
            dp_config: self.dp_config,
        }
    }

    /// Sets the data-plane settings (threshold, pool limits).
    pub fn data_plane_config(mut self, config: DataPlaneConfig) -> Self {
        self.dp_config = config;
        self
    }

    /// The configured data plane.
    pub fn data_plane(&self) -> Option<&Arc<C>> {
        self.data_plane.as_ref()
    }

    /// Binds `addr` (`tcp://IP:PORT`, port 0 picks one; `unix:///path`) and starts serving
    /// on the current tokio runtime.
    pub async fn bind(self, addr: &PeerAddr) -> Result<RunningServer> {
        if self.config.workers == 0 {
            return Err(Error::InvalidArgument(
                "`workers` must be at least 1".into(),
            ));
        }
        let listener = Listener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let threshold = self.dp_config.threshold as u64;
        let dp = self
            .data_plane
            .map(|c| Arc::new(ServerDp::new(c, self.dp_config)) as Arc<dyn ServerPlane>);
        let limits = &self.config.conn.limits;
        let settings = Settings {
            features: features::SETTINGS | features::HALF_CLOSE | features::HELD_BYTE_BUDGETS,
            data_planes: dp.iter().map(|d| d.transport_wire_id()).collect(),
            data_plane_threshold: dp.as_ref().map(|_| threshold),
            max_payload_len: Some(limits.max_payload_len),
            max_inflight: Some(self.config.conn.max_inflight.min(u32::MAX as usize) as u32),
            max_body_len: Some(limits.max_body_len),
        };
        let shared = Arc::new(Shared {
            dp,
            dispatcher: self.dispatcher,
            inflight: Arc::new(Semaphore::new(self.config.max_inflight_total)),
            budget: Arc::new(
                HeldBudget::new(self.config.max_held_bytes)
                    .with_observer(crate::metrics::held_bytes_settled),
            ),
            _held_limit: crate::metrics::HeldLimit::open(self.config.max_held_bytes),
            pool: BlockingPool::new(self.config.workers, self.config.max_inflight_total)?,
            connections: AtomicUsize::new(0),
            refused: 0.into(),
            active: Arc::new(AtomicUsize::new(0)),
            config: self.config,
            settings,
        });
        let task = tokio::spawn(accept_loop(listener, shared.clone(), shutdown_rx));
        tracing::info!(%local_addr, "hmc-rpc server listening");
        Ok(RunningServer {
            local_addr,
            shutdown: Arc::new(shutdown_tx),
            task: Mutex::new(Some(task)),
            shared,
        })
    }
}

/// A server that is serving.
pub struct RunningServer {
    local_addr: PeerAddr,
    shutdown: Arc<watch::Sender<bool>>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    shared: Arc<Shared>,
}

/// Starts a graceful shutdown from anywhere (a signal handler, another task).
#[derive(Clone)]
pub struct ShutdownHandle(Arc<watch::Sender<bool>>);

impl ShutdownHandle {
    /// GOAWAY to every connection, stop accepting; calls in flight finish.
    pub fn shutdown(&self) {
        let _ = self.0.send(true);
    }
}

impl RunningServer {
    /// Where clients connect.
    pub fn local_addr(&self) -> &PeerAddr {
        &self.local_addr
    }

    /// A handle that starts the graceful shutdown.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.shutdown.clone())
    }

    /// Data-plane counters (`None` without a data plane).
    pub fn data_plane_stats(&self) -> Option<DataPlaneStats> {
        self.shared.dp.as_ref().map(|d| d.stats())
    }

    /// Open connections now.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::Relaxed)
    }

    /// Held bytes, their peak, and how often each limit and timeout acted.
    pub fn stats(&self) -> ServerStats {
        let mut s = self.shared.budget.stats();
        s.connections = self.connections();
        s.refused_peers = self.shared.refused.load(Ordering::Relaxed);
        s
    }

    /// Starts a graceful shutdown and waits until it is done.
    pub async fn shutdown(&self) {
        let _ = self.shutdown.send(true);
        self.wait().await;
    }

    /// Waits until the server stopped (after a shutdown).
    pub async fn wait(&self) {
        let task = self.task.lock().take();
        if let Some(t) = task {
            let _ = t.await;
        }
    }
}

struct Shared {
    dp: Option<Arc<dyn ServerPlane>>,
    dispatcher: Dispatcher,
    inflight: Arc<Semaphore>,
    /// Bytes held for clients, across connections.
    budget: Arc<HeldBudget>,
    /// Its limit, counted in the metrics while the server lives.
    _held_limit: crate::metrics::HeldLimit,
    /// What connections answer in the settings exchange.
    settings: Settings,
    pool: BlockingPool,
    connections: AtomicUsize,
    /// Connections refused by [`admit`].
    refused: std::sync::atomic::AtomicU64,
    /// Connections with calls in flight (each connection's share of `max_inflight_total`).
    active: Arc<AtomicUsize>,
    config: ServerConfig,
}

async fn accept_loop(listener: Listener, shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let mut conns = JoinSet::new();
    let next_conn = std::sync::atomic::AtomicU64::new(1);
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok(stream) => {
                    let n = shared.connections.fetch_add(1, Ordering::AcqRel);
                    if n >= shared.config.max_connections {
                        shared.connections.fetch_sub(1, Ordering::AcqRel);
                        refuse_connection(&stream, shared.config.max_connections);
                        continue;
                    }
                    let shared2 = shared.clone();
                    let sd = shutdown.clone();
                    let peer = stream.rpc_peer();
                    let span = crate::trace::conn(&peer);
                    let id = next_conn.fetch_add(1, Ordering::Relaxed);
                    conns.spawn(
                        async move {
                            if let Some((stream, conn)) = admit(stream, &peer, id, &shared2).await {
                                serve_connection(stream, peer, conn, shared2.clone(), sd).await;
                            }
                            shared2.connections.fetch_sub(1, Ordering::AcqRel);
                        }
                        .instrument(span),
                    );
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed; retrying in 50 ms");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = shutdown.changed() => break,
        }
    }
    drop(listener);
    tracing::info!(
        connections = conns.len(),
        "shutting down: waiting for calls in flight"
    );
    let grace = shared.config.shutdown_grace;
    if tokio::time::timeout(grace, async { while conns.join_next().await.is_some() {} })
        .await
        .is_err()
    {
        tracing::warn!(
            ?grace,
            "`shutdown_grace` passed with calls still running; closing them"
        );
        conns.abort_all();
    }
}

struct Completion {
    request_id: u64,
    method_id: u32,
    result: HandlerResult,
    /// The response (this many bytes) was written into the client's region.
    in_buffer: Option<u64>,
    /// The response is this many bytes produced in pieces (a device method's).
    fed: Option<(u64, mpsc::UnboundedReceiver<Result<Bytes>>)>,
}

/// The pieces of fed responses, tagged with their request id.
type Feeds = SelectAll<BoxStream<'static, (u64, Result<Bytes>)>>;

/// Longest a closing connection waits for its GOAWAY to be written.
const CLOSE_LINGER: Duration = Duration::from_secs(1);
/// Bytes offered to each read.
const READ_CHUNK: usize = 256 * 1024;

async fn serve_connection(
    stream: Stream,
    peer: RpcPeer,
    conn: Connection,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let _counted = crate::metrics::ServerConnection::open();
    let conn_use = Arc::new(ConnUse::for_peer(peer));
    let (mut rd, wr) = stream.into_split();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Completion>();
    let mut st = ConnLoop::new(&shared, *shutdown.borrow());
    // One wait on the shutdown signal for the connection's whole life. A fresh `changed()`
    // in every wait below would join and leave the signal's list of waiters on every
    // wake-up: a lock every connection of the server shares, and list nodes that live in
    // other connections' (cold) tasks.
    let mut shutdown_signal = std::pin::pin!(async move { shutdown.changed().await.is_ok() });
    let calls = CallSink {
        shared: &shared,
        conn_use: &conn_use,
        conn: &conn,
        done: &done_tx,
    };
    loop {
        let (want_write, may_read) = match st.run_ready(&calls, &mut rd, &wr) {
            Next::Wait {
                want_write,
                may_read,
            } => (want_write, may_read),
            Next::Again => continue,
            Next::Yield => {
                tokio::task::yield_now().await;
                continue;
            }
            Next::Close => break,
        };
        tokio::select! {
            biased;
            Some(c) = done_rx.recv(), if st.in_tasks > 0 => st.completed(c, &mut done_rx),
            Some((id, piece)) = st.feeds.next(), if !st.feeds.is_empty() => match piece {
                // False when the stream is gone (connection closing): the rest is dropped.
                Ok(piece) => { st.core.feed(id, piece); }
                Err(e) => st.core.abort_fed(id, &e.to_string()),
            },
            r = rd.readable(), if may_read => {
                if r.is_err() || st.read_now(&mut rd) == Some(false) { break; }
            }
            r = wr.writable(), if want_write => { if r.is_err() { break; } }
            _ = st.timer.fired(), if st.timer.is_armed() => st.core.handle_timeout(Instant::now()),
            signalled = &mut shutdown_signal, if !st.shutdown_seen => {
                st.shutdown_seen = true;
                if signalled { st.core.begin_shutdown(); }
            }
            // Nothing left that could wake this connection (no reads, writes, timers,
            // handlers or shutdown to wait for): the checks above end it before this.
            else => {
                tracing::debug!("nothing left to wait for; closing the connection");
                break;
            }
        }
    }
    for (_, t) in st.tokens {
        t.cancel();
    }
    if let Some(dp) = &shared.dp {
        dp.release(&conn_use);
    }
}

/// What a connection's loop keeps between wake-ups, beside its socket halves and the
/// channel completions come back on.
struct ConnLoop {
    core: ServerConn,
    timer: ConnTimer,
    poll: BusyPoll,
    feeds: Feeds,
    tokens: IdMap<u64, CancelToken>,
    /// Calls handed to tasks or blocking workers whose completions have not come back:
    /// while there are none, the wait leaves the completions' channel alone (with many
    /// connections, each connection's channel is cold memory, and touching it on every
    /// wake-up costs a cache miss for nothing).
    in_tasks: usize,
    shutdown_seen: bool,
    /// Since the busy-polling window was last opened, the last call that came in opens it
    /// again once answered: one of at most `POLL_MAX_MESSAGE` bytes (work 0), or an
    /// HMC_BUFFER call with the bytes of data-plane work the client does before its next
    /// request (it takes the response and builds the next request in registered buffers:
    /// about twice this one's payload, as for an echo); and how many calls came in since,
    /// each of which the client turns around before the next request of a pipeline.
    poll_work: Option<(u64, usize)>,
    closing_since: Option<Instant>,
}

/// What a connection's loop does after the work that needs no waiting.
enum Next {
    /// Wait for the next event: a write once the socket takes one, a read if allowed.
    Wait { want_write: bool, may_read: bool },
    /// Go round again at once (a busy-polling read took bytes).
    Again,
    /// Let the other ready tasks run, then go round again (busy-polling found nothing).
    Yield,
    /// The connection is over.
    Close,
}

impl ConnLoop {
    /// A new connection's loop; `shutting_down` when the server's shutdown began before it.
    fn new(shared: &Arc<Shared>, shutting_down: bool) -> Self {
        let mut core = new_core(shared);
        if shutting_down {
            core.begin_shutdown();
        }
        ConnLoop {
            core,
            timer: ConnTimer::new(),
            poll: BusyPoll::new(shared.config.conn.busy_poll),
            feeds: SelectAll::new(),
            tokens: Default::default(),
            in_tasks: 0,
            shutdown_seen: shutting_down,
            poll_work: None,
            closing_since: None,
        }
    }

    /// The work that needs no waiting: parsed calls started, queued bytes written, timers
    /// settled, the end of the connection noticed, and the busy-polling window opened (and
    /// polled) once every call is answered and written.
    #[inline]
    fn run_ready(
        &mut self,
        calls: &CallSink<'_>,
        rd: &mut crate::net::ReadHalf,
        wr: &crate::net::WriteHalf,
    ) -> Next {
        let core = &mut self.core;
        self.in_tasks += calls.take_events(core, &mut self.tokens, &mut self.poll_work);
        if let Err(e) = wr.write_queued(core) {
            tracing::debug!(error = %e, "write failed; dropping connection");
            return Next::Close;
        }
        let now = Instant::now();
        core.settle(now);
        if connection_done(core, &mut self.closing_since, now) {
            return Next::Close;
        }
        let want_write = core.has_tx();
        // Not while closing, after the peer's FIN, or while `max_tx_backlog` answers wait
        // for a peer that does not read them.
        let may_read = core.may_read();
        let mut timeout = core.poll_timeout();
        if let Some(s) = self.closing_since {
            let t = s + CLOSE_LINGER;
            timeout = Some(timeout.map_or(t, |x| x.min(t)));
        }
        if may_read && core.inflight_len() == 0 && !want_write && self.feeds.is_empty() {
            // Every call is answered and written: the window for the next request opens
            // (not between the pieces of a large request).
            if let Some((work, calls)) = self.poll_work.take() {
                self.poll.arm_for(now, work, calls);
            }
            if self.poll.active(now) {
                // Busy-polling for the next request, then the other ready tasks.
                let r = rd.recv_now(self.core.read_target(READ_CHUNK));
                return match self.took(r) {
                    Some(true) => Next::Again,
                    Some(false) => Next::Close,
                    None => Next::Yield,
                };
            }
        } else {
            self.poll.disarm();
        }
        if self.core.inflight_len() == 0 && !want_write {
            // Quiet: hand the input buffer back until bytes arrive (an idle connection
            // then holds none).
            self.core.release_input();
        }
        self.timer.want(timeout);
        Next::Wait {
            want_write,
            may_read,
        }
    }

    /// Answers completion `c` and every other one already back.
    #[inline]
    fn completed(&mut self, c: Completion, done: &mut mpsc::UnboundedReceiver<Completion>) {
        let now = Instant::now();
        self.in_tasks -= 1;
        self.tokens.remove(&c.request_id);
        respond(&mut self.core, &mut self.feeds, c, now);
        while let Ok(c) = done.try_recv() {
            self.in_tasks = self.in_tasks.saturating_sub(1);
            self.tokens.remove(&c.request_id);
            respond(&mut self.core, &mut self.feeds, c, now);
        }
    }

    /// One read of what the socket has (it said it is readable); as [`ConnLoop::took`].
    #[inline]
    fn read_now(&mut self, rd: &mut crate::net::ReadHalf) -> Option<bool> {
        let r = match self.core.read_target(READ_CHUNK) {
            ReadTarget::Input(b) => rd.read_now(b),
            ReadTarget::Append(v, max) => rd.read_now_append(v, max),
        };
        self.took(r)
    }

    /// Hands a read's outcome to the core: `Some(true)` when bytes (or EOF) arrived,
    /// `Some(false)` when the socket failed, `None` when nothing was there.
    #[inline]
    fn took(&mut self, r: std::io::Result<usize>) -> Option<bool> {
        match r {
            Ok(0) => {
                self.core.handle_eof(Instant::now());
                Some(true)
            }
            Ok(n) => {
                let now = Instant::now();
                self.core.handle_read(n, now);
                self.poll.arrived(now);
                Some(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
            Err(_) => Some(false),
        }
    }
}

/// A connection's protocol core, configured from the server's settings.
fn new_core(shared: &Arc<Shared>) -> ServerConn {
    let mut core = ServerConn::with_budget(
        shared.config.conn.clone(),
        Instant::now(),
        shared.budget.clone(),
    );
    core.set_settings(&shared.settings);
    if shared.dp.is_some() {
        core.enable_hmc_buffer();
    }
    if shared.dispatcher.has_device_routes() {
        // Streamed requests of device methods go to the device as they arrive.
        let s = shared.clone();
        core.set_sink_factory(Box::new(move |method, len| {
            s.dispatcher.device_route(method).map(|r| r.sink(len))
        }));
    }
    core
}

/// Where a connection's calls start: the server, the connection, and the channel their
/// completions come back on.
struct CallSink<'a> {
    shared: &'a Arc<Shared>,
    conn_use: &'a Arc<ConnUse>,
    conn: &'a Connection,
    done: &'a mpsc::UnboundedSender<Completion>,
}

impl CallSink<'_> {
    /// Starts the calls the core has parsed and cancels the abandoned ones; how many went
    /// to tasks or workers. Each call also sets what reopens the busy-polling window once
    /// it is answered (`poll_work`: see [`ConnLoop`]).
    fn take_events(
        &self,
        core: &mut ServerConn,
        tokens: &mut IdMap<u64, CancelToken>,
        poll_work: &mut Option<(u64, usize)>,
    ) -> usize {
        let mut spawned = 0;
        while let Some(ev) = core.poll_event() {
            match ev {
                ServerEvent::Call(call) => {
                    let work = if call.mode == PayloadMode::HmcBuffer {
                        Some(call.payload_len.saturating_mul(2))
                    } else {
                        (call.payload_len <= POLL_MAX_MESSAGE as u64).then_some(0)
                    };
                    let calls = poll_work.map_or(0, |(_, n)| n) + 1;
                    *poll_work = work.map(|w| (w, calls));
                    if start_call(
                        self.shared,
                        self.conn_use,
                        self.conn,
                        core,
                        tokens,
                        self.done,
                        call,
                    ) {
                        spawned += 1;
                    }
                }
                ServerEvent::Abandon { request_id, .. } => {
                    if let Some(t) = tokens.remove(&request_id) {
                        t.cancel();
                    }
                }
            }
        }
        spawned
    }
}

/// Whether the connection is over: the peer closed its side and every answer is written,
/// a close has nothing left to write (or lingered [`CLOSE_LINGER`]), or a drained
/// connection has nothing to write.
fn connection_done(core: &ServerConn, closing_since: &mut Option<Instant>, now: Instant) -> bool {
    if core.finished() {
        return true;
    }
    if core.close_reason().is_some() {
        let since = *closing_since.get_or_insert(now);
        if !core.has_tx() || now >= since + CLOSE_LINGER {
            return true;
        }
    }
    core.drained() && !core.has_tx()
}

/// Answers a completion; a fed response's pieces join `feeds`.
fn respond(core: &mut ServerConn, feeds: &mut Feeds, mut c: Completion, now: Instant) {
    if let Some((len, pieces)) = c.fed.take() {
        if core.respond_fed(c.request_id, c.method_id, len, now) {
            let id = c.request_id;
            feeds.push(
                futures::stream::unfold(pieces, move |mut rx| async move {
                    rx.recv().await.map(|p| ((id, p), rx))
                })
                .boxed(),
            );
        }
        return;
    }
    respond_now(core, c, now);
}

/// Answers a completion without a fed body (refusals, handlers ready at once, and every
/// non-device answer).
fn respond_now(core: &mut ServerConn, c: Completion, now: Instant) {
    debug_assert!(c.fed.is_none());
    if let Some(len) = c.in_buffer {
        core.respond_in_buffer(c.request_id, c.method_id, len, now);
        return;
    }
    match c.result {
        Ok(b) => {
            crate::metrics::server_answered(Status::OK, b.len());
            core.respond(c.request_id, c.method_id, Status::OK, b, now)
        }
        Err(e) => {
            crate::metrics::server_answered(e.status, e.message.len());
            core.respond(
                c.request_id,
                c.method_id,
                e.status,
                Bytes::from(e.message),
                now,
            )
        }
    }
}

fn panicked(method: u32, p: Box<dyn std::any::Any + Send>) -> RpcError {
    let what = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic".into());
    tracing::error!(method_id = method, panic = %what, "handler panicked; answering INTERNAL");
    RpcError::new(
        Status::INTERNAL,
        format!("the handler of method {method} panicked: {what}"),
    )
}

type Job = Box<dyn FnOnce() + Send>;

/// A fixed pool of threads for blocking handlers, fed by a bounded queue.
struct BlockingPool {
    tx: std::sync::mpsc::SyncSender<Job>,
    capacity: usize,
}

impl BlockingPool {
    /// Fails (instead of panicking) when the system refuses a thread: the workers already
    /// started end when the pool is dropped, as their queue closes.
    fn new(workers: usize, capacity: usize) -> Result<Self> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(capacity);
        let rx = Arc::new(std::sync::Mutex::new(rx));
        for i in 0..workers {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("hmc-rpc-worker-{i}"))
                .spawn(move || {
                    loop {
                        // The lock is held only while waiting for the next job.
                        let job = match rx.lock() {
                            Ok(g) => g.recv(),
                            Err(_) => return,
                        };
                        match job {
                            Ok(job) => job(),
                            Err(_) => return, // the server is gone
                        }
                    }
                })
                .map_err(|e| {
                    Error::io(
                        format!(
                            "starting RPC worker thread {} of {workers} \
                             (`ServerConfig::workers`, `--workers`): lower it, or raise the \
                             process's thread limit",
                            i + 1
                        ),
                        e,
                    )
                })?;
        }
        Ok(BlockingPool { tx, capacity })
    }

    fn submit(&self, job: Job) -> std::result::Result<(), String> {
        self.tx.try_send(job).map_err(|_| {
            format!(
                "the blocking worker queue is full ({} jobs, `max_inflight_total`); retry later",
                self.capacity
            )
        })
    }
}
