//! The pipelined client: one persistent connection carrying many calls, answers matched by
//! request id, a default deadline per call, cancel on drop, reconnect after loss (calls
//! already sent are failed, never replayed), and a blocking wrapper.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hmc_backend_cpu::HostMemory;
use hmc_core::{Communicator, Error, MemSpan, MemSpanMut, Memory, PeerAddr};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tracing::{Instrument, Span};

mod blocking;
mod error;
mod negotiate;

pub use blocking::BlockingClient;
pub use error::CallError;
use negotiate::Negotiated;

use crate::codec::RpcCodec;
use crate::data_plane::{
    ClientDataPlane, DataPlaneConfig, DataPlaneStats, NoDataPlane, PreparedCall,
};
use crate::device::{self, DEFAULT_DEVICE_STAGING, DeviceSink, StagingRing};
use crate::frame::{INLINE_MAX, Status};
use crate::net::{BusyPoll, ConnTimer, POLL_MAX_MESSAGE, Stream};
use crate::proto::{
    ClientConn, ClientEvent, ConnConfig, IdMap, ReadTarget, ResponseSink, StagedPayload, StartError,
};

/// Client settings; every field has a default.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Per-connection limits and timers; `max_inflight` is the number of calls the client
    /// keeps in flight before callers wait for a credit.
    pub conn: ConnConfig,
    /// Deadline of a call that does not choose one (`default_timeout`, 30 s).
    pub default_timeout: Duration,
    /// How long a (re)connect may take (`connect_timeout`, 5 s), the authentication
    /// exchange included.
    pub connect_timeout: Duration,
    /// The server's pre-shared secret (`ServerConfig::auth_secret`), proved on every
    /// (re)connect before the first frame; the server proves it too, so no request goes to
    /// a server without it (default none).
    pub auth_secret: Option<crate::AuthSecret>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            conn: ConnConfig::default(),
            default_timeout: hmc_core::Deadline::DEFAULT_TIMEOUT,
            connect_timeout: Duration::from_secs(5),
            auth_secret: None,
        }
    }
}

/// Per-call options.
#[derive(Clone, Copy, Debug, Default)]
pub struct CallOptions {
    /// Overrides [`ClientConfig::default_timeout`].
    pub timeout: Option<Duration>,
    /// HMC_BUFFER calls: bytes of the response region lent to the server (default: the
    /// request's length; 0 lends none). A larger response comes back TCP_STREAM.
    pub response_capacity: Option<usize>,
}

/// What a call sends.
enum Body {
    Payload(Bytes),
    /// HMC_BUFFER: the payload length, the response region's capacity and the data-plane
    /// descriptor.
    Buffer {
        len: u64,
        response: u64,
        descriptor: Bytes,
    },
    /// TCP_STREAM of this length whose pieces follow as [`Cmd::Feed`].
    Fed(u64),
}

/// What a call gets back.
enum Reply {
    Payload(Bytes),
    /// HMC_BUFFER: this many bytes are in the call's response region.
    InBuffer(u64),
    /// The response went into the call's response sink.
    Staged(StagedPayload),
}

type ReplyTx = oneshot::Sender<Result<Reply, CallError>>;

enum Cmd {
    Call {
        id: u64,
        method: u32,
        body: Body,
        deadline: Instant,
        reply: ReplyTx,
        /// Where a streamed OK response goes instead of host memory.
        sink: Option<ResponseSink>,
    },
    /// The next piece of a [`Body::Fed`] payload.
    Feed(u64, Bytes),
    Cancel(u64),
}

#[derive(Clone)]
struct ConnHandle {
    cmd: mpsc::UnboundedSender<Cmd>,
    usable: Arc<AtomicBool>,
    /// This end's socket address (TCP), for the call spans ([`crate::trace`]).
    local: Option<SocketAddr>,
}

impl ConnHandle {
    fn is_usable(&self) -> bool {
        self.usable.load(Ordering::Acquire) && !self.cmd.is_closed()
    }
}

struct Inner {
    addr: PeerAddr,
    config: ClientConfig,
    /// Serialises reconnects.
    conn: Mutex<Option<ConnHandle>>,
    /// The connection calls use; read without waiting.
    current: parking_lot::Mutex<Option<ConnHandle>>,
    credits: Arc<Semaphore>,
    next_id: AtomicU64,
    /// A v1 server on the current connection answered that it has no data plane: large
    /// payloads go TCP_STREAM until the next reconnect.
    no_buffer: AtomicBool,
    /// Counts connections: what was negotiated belongs to one of them.
    conn_gen: AtomicU64,
    /// The settings exchange on connection `.0`.
    negotiated: parking_lot::Mutex<(u64, Negotiated)>,
    /// Host staging buffers of [`Client::call_device`], made on first use.
    device_ring: std::sync::OnceLock<Arc<StagingRing<HostMemory>>>,
}

/// An RPC client over one persistent connection. Cheap to clone; clones share it.
///
/// Its connection task is spawned on the tokio runtime that connects ([`Client::connect`],
/// or the call that reconnects after a loss); any runtime flavour works. `hmc-rpc-bench`
/// measures it on tokio's default multi-thread runtime (one worker per CPU, what
/// `#[tokio::main]` gives), the runtime the tonic peer's client uses too. Calls queued by
/// callers that one batch of answers woke go out in one write.
///
/// For many small calls pipelined on one connection, a current-thread runtime (callers
/// and connection task on one thread) can be markedly faster where waking a parked
/// worker thread is dear (measured in `docs/benchmarks.md`; `docs/guide/rust.md`, "Many
/// small calls on one connection").
///
/// # Performance traps
///
/// - **`block_on` on a multi-thread runtime.** Driving each call with
///   `runtime.block_on(client.call(..))` from outside the runtime parks and wakes a thread
///   per call, and with several callers pipelining small calls that costs more than the
///   call. Call from tasks inside the runtime (`tokio::spawn`, or `async fn main`), or
///   drive calls with `block_on` on a current-thread runtime, or use the socket-level
///   [`DirectClient`](crate::DirectClient), which needs no runtime. [`BlockingClient`]
///   (its own one-worker runtime) pays two thread hops per call: fine for occasional
///   calls, not for many small ones.
/// - **`Vec<u8>` in typed calls.** [`Client::call_typed`] encodes with
///   [`RpcCodec`]; a `Vec<u8>` field goes byte by byte. Mark it `#[serde(with =
///   "serde_bytes")]` or use `bytes::Bytes`, or send bytes with [`Client::call`] (see
///   [`Dispatcher`](crate::Dispatcher), "Typed methods: what to know").
/// - **Type tags.** A typed payload carries no type tag; the method id is the type. A
///   request of the wrong type with the same layout decodes at the server (see
///   [`Dispatcher`](crate::Dispatcher)).
///
/// # Errors
///
/// [`CallError`] has one shape per condition; see its table.
///
/// ```no_run
/// # async fn run() -> Result<(), hmc_rpc::CallError> {
/// use hmc_rpc::{Client, ClientConfig};
///
/// let client = Client::connect(&"tcp://127.0.0.1:7100".parse().unwrap(), ClientConfig::default())
///     .await?;
/// let sum: u64 = client.call_typed(7, &(2u64, 3u64)).await?;
/// # let _ = sum; Ok(()) }
/// ```
pub struct Client<C: Communicator = NoDataPlane> {
    inner: Arc<Inner>,
    dp: Option<Arc<ClientDataPlane<C>>>,
}

impl<C: Communicator> Clone for Client<C> {
    fn clone(&self) -> Self {
        Client {
            inner: self.inner.clone(),
            dp: self.dp.clone(),
        }
    }
}

impl Client<NoDataPlane> {
    /// Connects to `addr` (`tcp://…` or `unix://…`).
    pub async fn connect(addr: &PeerAddr, config: ClientConfig) -> Result<Self, CallError> {
        let c = Client {
            inner: Arc::new(Inner {
                addr: addr.clone(),
                credits: Arc::new(Semaphore::new(config.conn.max_inflight)),
                config,
                conn: Mutex::new(None),
                current: parking_lot::Mutex::new(None),
                next_id: AtomicU64::new(1),
                no_buffer: AtomicBool::new(false),
                conn_gen: AtomicU64::new(0),
                negotiated: parking_lot::Mutex::new((0, Negotiated::Unknown)),
                device_ring: std::sync::OnceLock::new(),
            }),
            dp: None,
        };
        c.connection().await?;
        Ok(c)
    }
}

impl<C: Communicator> Client<C> {
    /// Attaches a data plane: payloads from [`DataPlaneConfig::threshold`] (64 KiB) go
    /// HMC_BUFFER (the server pulls them one-sided) with the default [`DataPlaneConfig`].
    pub fn with_data_plane<D: Communicator>(self, data_plane: Arc<D>) -> Client<D> {
        self.with_data_plane_config(data_plane, DataPlaneConfig::default())
    }

    /// Attaches a data plane with explicit settings (threshold, pool limits).
    pub fn with_data_plane_config<D: Communicator>(
        self,
        data_plane: Arc<D>,
        config: DataPlaneConfig,
    ) -> Client<D> {
        self.with_client_data_plane(Arc::new(ClientDataPlane::new(data_plane, config)))
    }

    /// Attaches a data plane shared with other clients (one pool of registered buffers).
    pub fn with_client_data_plane<D: Communicator>(
        self,
        data_plane: Arc<ClientDataPlane<D>>,
    ) -> Client<D> {
        Client {
            inner: self.inner,
            dp: Some(data_plane),
        }
    }

    /// The configured data plane.
    pub fn data_plane(&self) -> Option<&Arc<C>> {
        self.dp.as_ref().map(|d| &d.comm)
    }

    /// Data-plane counters (`None` without a data plane).
    pub fn data_plane_stats(&self) -> Option<DataPlaneStats> {
        self.dp.as_ref().map(|d| d.stats())
    }

    /// The server's address.
    pub fn server_addr(&self) -> &PeerAddr {
        &self.inner.addr
    }

    /// The current connection's command queue and local address, connecting first if
    /// there is none (or it was lost).
    async fn connection(
        &self,
    ) -> Result<(mpsc::UnboundedSender<Cmd>, Option<SocketAddr>), CallError> {
        // Fast path: the current connection, without touching the async reconnect lock.
        if let Some(h) = self.inner.current.lock().as_ref()
            && h.is_usable()
        {
            return Ok((h.cmd.clone(), h.local));
        }
        let mut g = self.inner.conn.lock().await;
        if let Some(h) = g.as_ref()
            && h.is_usable()
        {
            return Ok((h.cmd.clone(), h.local));
        }
        let stream = tokio::time::timeout(
            self.inner.config.connect_timeout,
            Stream::connect(&self.inner.addr),
        )
        .await
        .map_err(|_| {
            CallError::Connect(Error::DeadlineExceeded {
                during: "connecting to the RPC server",
                elapsed: self.inner.config.connect_timeout,
            })
        })?
        .map_err(CallError::Connect)?;
        let mut stream = stream;
        if let Some(secret) = &self.inner.config.auth_secret {
            stream
                .authenticate_client(secret, self.inner.config.connect_timeout)
                .await
                .map_err(|e| {
                    CallError::Connect(Error::io("authenticating to the RPC server", e))
                })?;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let usable = Arc::new(AtomicBool::new(true));
        let local = stream.local_tcp_addr();
        tokio::spawn(run_connection(
            stream,
            self.inner.config.conn.clone(),
            rx,
            usable.clone(),
        ));
        let handle = ConnHandle {
            cmd: tx,
            usable,
            local,
        };
        *g = Some(handle.clone());
        self.inner.no_buffer.store(false, Ordering::Release);
        let before = self.inner.conn_gen.fetch_add(1, Ordering::AcqRel);
        crate::metrics::client_connected(before > 0);
        let r = (handle.cmd.clone(), handle.local);
        *self.inner.current.lock() = Some(handle);
        Ok(r)
    }

    /// Calls `method` with raw bytes and the default deadline.
    pub async fn call(&self, method: u32, payload: impl Into<Bytes>) -> Result<Bytes, CallError> {
        self.call_with(method, payload, CallOptions::default())
            .await
    }

    /// Calls `method` with raw bytes. Dropping the returned future cancels the call (a
    /// CANCEL frame goes to the server).
    pub async fn call_with(
        &self,
        method: u32,
        payload: impl Into<Bytes>,
        opts: CallOptions,
    ) -> Result<Bytes, CallError> {
        let payload = payload.into();
        let m = crate::metrics::ClientCall::start(payload.len());
        let span = crate::trace::call(&self.inner.addr, method);
        let r = self
            .call_with_inner(method, payload, opts, &span)
            .instrument(span.clone())
            .await;
        crate::trace::finished(&span, &r);
        m.finish(r.as_ref().map(|b| b.len()));
        r
    }

    async fn call_with_inner(
        &self,
        method: u32,
        payload: Bytes,
        opts: CallOptions,
        span: &Span,
    ) -> Result<Bytes, CallError> {
        if let Some(dp) = &self.dp
            && payload.len() >= dp.config.threshold
            && self.server_takes_buffer(dp).await
        {
            let resp_len = opts.response_capacity.unwrap_or(payload.len());
            let peer = crate::pool::peer_tag(&self.inner.addr);
            match dp.prepare(&payload, resp_len, peer) {
                Ok(prep) => {
                    let body = Body::Buffer {
                        len: payload.len() as u64,
                        response: resp_len as u64,
                        descriptor: prep.descriptor.clone(),
                    };
                    let r = self.call_body(method, body, opts, span).await;
                    // A v1 server cannot say up front that it has no data plane; it says so in
                    // its refusal, which is the one text a client recognises.
                    if let Err(CallError::Status { status, message }) = &r
                        && *status == Status::DATA_PLANE
                        && self.negotiated_now() == Negotiated::V1
                        && message.contains(crate::proto::NO_DATA_PLANE_MARK)
                    {
                        tracing::warn!(
                            "the server has no data plane; large payloads go TCP_STREAM on this connection"
                        );
                        self.inner.no_buffer.store(true, Ordering::Release);
                    }
                    return finish_buffer_call(dp, prep, r);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "HMC_BUFFER not prepared; sending TCP_STREAM")
                }
            }
        }
        match self
            .call_body(method, Body::Payload(payload), opts, span)
            .await?
        {
            Reply::Payload(b) => Ok(b),
            Reply::InBuffer(_) | Reply::Staged(_) => Err(CallError::ConnectionLost(
                "an HMC_BUFFER or staged answer to a call that asked for neither".into(),
            )),
        }
    }

    /// Sends one call and waits for its answer; `span` gets its request id
    /// ([`crate::trace`]).
    async fn call_body(
        &self,
        method: u32,
        body: Body,
        opts: CallOptions,
        span: &Span,
    ) -> Result<Reply, CallError> {
        self.send_call(method, body, None, opts, span)
            .await?
            .answer()
            .await
    }

    /// Takes a credit, sends the call to the connection task and returns the handle that
    /// waits for its answer (dropping it cancels the call).
    async fn send_call(
        &self,
        method: u32,
        body: Body,
        sink: Option<ResponseSink>,
        opts: CallOptions,
        span: &Span,
    ) -> Result<SentCall, CallError> {
        let timeout = opts.timeout.unwrap_or(self.inner.config.default_timeout);
        let start = Instant::now();
        let deadline = start + timeout;
        let permit =
            tokio::time::timeout_at(deadline.into(), self.inner.credits.clone().acquire_owned())
                .await
                .map_err(|_| CallError::DeadlineExceeded(timeout))?
                .expect("the credit semaphore is never closed");
        let (cmd, local) = self.connection().await?;
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        crate::trace::sent(span, id, || local);
        let (reply, rx) = oneshot::channel();
        let guard = CancelOnDrop {
            id,
            cmd: cmd.clone(),
            armed: true,
            _permit: permit,
        };
        if cmd
            .send(Cmd::Call {
                id,
                method,
                body,
                deadline,
                reply,
                sink,
            })
            .is_err()
        {
            return Err(CallError::ConnectionLost(
                "the connection closed before the call was sent".into(),
            ));
        }
        Ok(SentCall {
            id,
            cmd,
            rx,
            guard,
            start,
        })
    }

    /// Calls `method` with a payload that lives in device memory of `memory` (any
    /// [`Memory`] backend: CUDA, ROCm, MLU, MUSA or host), and returns the response in a
    /// new buffer from the same backend. Staging buffers: the client's own ring of plain
    /// host memory ([`DEFAULT_DEVICE_STAGING`]); [`Client::call_device_staged`] takes a
    /// ring of pinned memory.
    pub async fn call_device<M: Memory>(
        &self,
        method: u32,
        memory: &Arc<M>,
        payload: &MemSpan<'_>,
    ) -> Result<M::Buffer, CallError> {
        let ring = match self.inner.device_ring.get() {
            Some(r) => r.clone(),
            None => {
                let r = StagingRing::new(Arc::new(HostMemory::new()), DEFAULT_DEVICE_STAGING)
                    .map_err(CallError::Device)?;
                self.inner.device_ring.get_or_init(|| r).clone()
            }
        };
        self.call_device_staged(method, memory, payload, &ring, CallOptions::default())
            .await
    }

    /// [`Client::call_device`] through the staging buffers of `ring` (make it of the
    /// device backend's pinned host memory, e.g. `CudaMemory::pinned()`, and share it
    /// between calls).
    ///
    /// A payload above [`INLINE_MAX`] goes TCP_STREAM without ever being whole in host
    /// memory: chunk *i + 1* is copied device-to-host into a staging buffer while chunk *i*
    /// is on the wire. A streamed response is copied to a new device buffer chunk by chunk
    /// as it arrives. With a data plane attached, payloads from its threshold go
    /// HMC_BUFFER instead: copied device-to-host once into a pooled registered buffer that
    /// the server pulls one-sided (a device method on the server pulls and pushes chunk by
    /// chunk, overlapping its device copies with the transfers). A staging failure is [`CallError::Device`]; if it happens
    /// while the payload is being sent, the call is cancelled.
    pub async fn call_device_staged<M: Memory, H: Memory>(
        &self,
        method: u32,
        memory: &Arc<M>,
        payload: &MemSpan<'_>,
        ring: &Arc<StagingRing<H>>,
        opts: CallOptions,
    ) -> Result<M::Buffer, CallError> {
        let len = payload.len();
        let over_data_plane = match &self.dp {
            Some(dp) => len >= dp.config.threshold && self.server_takes_buffer(dp).await,
            None => false,
        };
        if over_data_plane {
            // Copied device-to-host once, straight into a pooled registered buffer that the
            // call lends as it is; the response is a view of the lent response region.
            let dp = self.dp.as_ref().expect("checked by `over_data_plane`");
            let request = match dp.request_buffer_for(len, &self.inner.addr) {
                Ok(mut buf) => {
                    memory
                        .copy(&mut MemSpanMut::host(buf.as_mut_slice()), payload)
                        .map_err(CallError::Device)?;
                    buf.freeze()
                }
                // The pool cannot lend now: the bytes go TCP_STREAM like any payload.
                Err(_) => {
                    Bytes::from(device::download(&**memory, payload).map_err(CallError::Device)?)
                }
            };
            let response = self.call_with(method, request, opts).await?;
            return device::upload(&**memory, &response).map_err(CallError::Device);
        }
        if len <= INLINE_MAX {
            let host = device::download(&**memory, payload).map_err(CallError::Device)?;
            let response = self.call_with(method, host, opts).await?;
            return device::upload(&**memory, &response).map_err(CallError::Device);
        }
        let span = crate::trace::call(&self.inner.addr, method);
        // The call's pieces are fed to the connection as they come off the device.
        let fed = async {
            let sink_mem = memory.clone();
            let sink: ResponseSink = Box::new(move |n| DeviceSink::boxed(sink_mem, n));
            let mut sent = self
                .send_call(method, Body::Fed(len as u64), Some(sink), opts, &span)
                .await?;
            let (id, cmd) = (sent.id, sent.cmd.clone());
            let produced = {
                let feeding = device::produce(&**memory, payload, ring, |piece| {
                    cmd.send(Cmd::Feed(id, piece)).is_ok()
                });
                tokio::select! {
                    // An early answer (refusal, deadline, lost connection) stops the copies.
                    r = &mut sent.rx => Err(r),
                    p = feeding => Ok(p),
                }
            };
            let reply = match produced {
                Err(early) => sent.finish(early),
                Ok(Err(e)) => return Err(CallError::Device(e)), // dropping `sent` cancels
                Ok(Ok(_)) => sent.answer().await,
            }?;
            match reply {
                Reply::Staged(p) => device::take_staged::<M>(p).map_err(CallError::Device),
                Reply::Payload(b) => device::upload(&**memory, &b).map_err(CallError::Device),
                Reply::InBuffer(_) => Err(CallError::ConnectionLost(
                    "an HMC_BUFFER answer to a call that lent no region".into(),
                )),
            }
        };
        let r = fed.instrument(span.clone()).await;
        crate::trace::finished(&span, &r);
        r
    }

    /// A typed call: encodes `req` and decodes the answer with [`RpcCodec`].
    pub async fn call_typed<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        method: u32,
        req: &Req,
    ) -> Result<Resp, CallError> {
        self.call_typed_with(method, req, CallOptions::default())
            .await
    }

    /// A typed call with options.
    pub async fn call_typed_with<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        method: u32,
        req: &Req,
        opts: CallOptions,
    ) -> Result<Resp, CallError> {
        let b = RpcCodec::encode(req)?;
        let r = self.call_with(method, b, opts).await?;
        Ok(RpcCodec::decode(&r)?)
    }
}

/// Ends an HMC_BUFFER call: buffers go back to the pool after an OK answer, and are
/// discarded after anything else (the server may still be transferring).
fn finish_buffer_call<C: Communicator>(
    dp: &ClientDataPlane<C>,
    prep: PreparedCall<C>,
    r: Result<Reply, CallError>,
) -> Result<Bytes, CallError> {
    match r {
        Ok(Reply::Payload(b)) => {
            prep.settle();
            Ok(b)
        }
        Ok(Reply::Staged(_)) => Err(CallError::ConnectionLost(
            "a staged answer to an HMC_BUFFER call".into(),
        )),
        Ok(Reply::InBuffer(len)) => {
            dp.responded_in_buffer();
            prep.take_response(len).map_err(|e| {
                dp.failed();
                CallError::Status {
                    status: Status::DATA_PLANE,
                    message: format!("the server's HMC_BUFFER answer is unusable: {e}"),
                }
            })
        }
        Err(e) => {
            if e.status() == Some(Status::DATA_PLANE) || e.status() == Some(Status::BAD_PAYLOAD) {
                dp.failed();
            }
            drop(prep);
            Err(e)
        }
    }
}

/// A call handed to the connection task, not yet answered.
struct SentCall {
    id: u64,
    cmd: mpsc::UnboundedSender<Cmd>,
    rx: oneshot::Receiver<Result<Reply, CallError>>,
    guard: CancelOnDrop,
    start: Instant,
}

impl SentCall {
    async fn answer(mut self) -> Result<Reply, CallError> {
        let r = (&mut self.rx).await;
        self.finish(r)
    }

    fn finish(
        self,
        r: Result<Result<Reply, CallError>, oneshot::error::RecvError>,
    ) -> Result<Reply, CallError> {
        let r = r.unwrap_or_else(|_| {
            Err(CallError::ConnectionLost(
                "the connection task ended".into(),
            ))
        });
        disarm(self.guard);
        match r {
            Err(CallError::DeadlineExceeded(_)) => {
                Err(CallError::DeadlineExceeded(self.start.elapsed()))
            }
            r => r,
        }
    }
}

struct CancelOnDrop {
    id: u64,
    cmd: mpsc::UnboundedSender<Cmd>,
    armed: bool,
    _permit: OwnedSemaphorePermit,
}

fn disarm(mut g: CancelOnDrop) {
    g.armed = false;
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.cmd.send(Cmd::Cancel(self.id));
        }
    }
}

/// Bytes offered to each read.
const READ_CHUNK: usize = 256 * 1024;

async fn run_connection(
    stream: Stream,
    cfg: ConnConfig,
    cmds: mpsc::UnboundedReceiver<Cmd>,
    usable: Arc<AtomicBool>,
) {
    let (mut rd, wr) = stream.into_split();
    let mut st = ConnLoop {
        poll: BusyPoll::new(cfg.busy_poll),
        core: ClientConn::new(cfg, Instant::now()),
        timer: ConnTimer::new(),
        waiting: IdMap::default(),
        cmds,
        cmds_open: true,
        answered: 0,
        small_reads: true,
    };
    let lost: String = loop {
        match st.run_ready(&mut rd, &wr, &usable) {
            Ok(Next::Wait) => {}
            Ok(Next::Again) => continue,
            Ok(Next::Yield) => {
                tokio::task::yield_now().await;
                continue;
            }
            Err(lost) => break lost,
        }
        st.timer.want(st.core.poll_timeout());
        let want_write = st.core.has_tx();
        tokio::select! {
            biased;
            r = rd.readable() => {
                if let Err(e) = r { break format!("read failed: {e}"); }
                if let Err(lost) = st.read_now(&mut rd) { break lost; }
            }
            c = st.cmds.recv(), if st.cmds_open => match c {
                None => st.cmds_open = false,
                Some(c) => st.queue_calls(c).await,
            },
            r = wr.writable(), if want_write => {
                if let Err(e) = r { break format!("write failed: {e}"); }
            }
            _ = st.timer.fired(), if st.timer.is_armed() => st.core.handle_timeout(Instant::now()),
        }
    };
    usable.store(false, Ordering::Release);
    fail_remaining(&mut st.core, &wr, st.waiting, &mut st.cmds, &lost);
}

/// What a connection task keeps between wake-ups, beside its socket halves.
struct ConnLoop {
    poll: BusyPoll,
    core: ClientConn,
    timer: ConnTimer,
    waiting: IdMap<u64, ReplyTx>,
    cmds: mpsc::UnboundedReceiver<Cmd>,
    cmds_open: bool,
    /// Callers woken by answers since calls were last queued.
    answered: usize,
    /// The last read from the socket took at most `POLL_MAX_MESSAGE` bytes.
    small_reads: bool,
}

/// What a connection task does after the work that needs no waiting (`Err`: why the
/// connection is lost).
enum Next {
    /// Wait for the socket, new calls or the timer.
    Wait,
    /// Go round again at once (busy-polling took bytes or a call).
    Again,
    /// Let the other ready tasks run, then go round again (busy-polling found nothing).
    Yield,
}

impl ConnLoop {
    /// The work that needs no waiting: answers handed to their callers, queued bytes
    /// written, the end of the connection noticed, and the busy-polling window opened (and
    /// polled) or closed.
    #[inline]
    fn run_ready(
        &mut self,
        rd: &mut crate::net::ReadHalf,
        wr: &crate::net::WriteHalf,
        usable: &AtomicBool,
    ) -> Result<Next, String> {
        let core = &mut self.core;
        self.answered += deliver_events(core, &mut self.waiting, usable);
        if let Err(e) = wr.write_queued(core) {
            return Err(format!("write failed: {e}"));
        }
        if let Some(r) = core.closed_reason() {
            return Err(r.to_string());
        }
        if (!self.cmds_open || core.draining_reason().is_some()) && core.pending_len() == 0 {
            return Err("closed".to_string());
        }
        // Several small calls in flight (no stream under way) poll too: the next answer is
        // as near as a lone call's, and polling for it keeps this task's thread from
        // parking between answers (waking a parked runtime worker costs more than a round
        // trip on idle VMs). The same window rules apply: only while no other connection
        // of the process waits in one, backing off when it does not pay.
        let several = core.pending_len() > 1;
        let several_small = several && self.small_reads && !core.streaming();
        if several_small && !core.has_tx() {
            self.poll.arm_for(Instant::now(), 0, core.pending_len());
        }
        if core.pending_len() == 0 || (several && !several_small) {
            self.poll.disarm();
        } else if !core.has_tx() {
            let now = Instant::now();
            if self.poll.active(now) {
                return self.busy_poll(rd, now);
            }
        }
        Ok(Next::Wait)
    }

    /// Busy-polling for the one answer: the socket, then new calls, then the timers (the
    /// other ready tasks run when none had anything).
    #[inline]
    fn busy_poll(&mut self, rd: &mut crate::net::ReadHalf, now: Instant) -> Result<Next, String> {
        let r = rd.recv_now(self.core.read_target(READ_CHUNK));
        if self.took(r, || now)? {
            return Ok(Next::Again);
        }
        if self.cmds_open {
            match self.cmds.try_recv() {
                Ok(c) => {
                    handle_cmd(&mut self.core, &mut self.waiting, c, now);
                    return Ok(Next::Again);
                }
                Err(mpsc::error::TryRecvError::Disconnected) => self.cmds_open = false,
                Err(mpsc::error::TryRecvError::Empty) => {}
            }
        }
        if self.core.poll_timeout().is_some_and(|t| t <= now) {
            self.core.handle_timeout(now);
        }
        Ok(Next::Yield)
    }

    /// One read of what the socket has (it said it is readable); `Err` as
    /// [`ConnLoop::took`].
    #[inline]
    fn read_now(&mut self, rd: &mut crate::net::ReadHalf) -> Result<(), String> {
        let r = match self.core.read_target(READ_CHUNK) {
            ReadTarget::Input(b) => rd.read_now(b),
            ReadTarget::Append(v, max) => rd.read_now_append(v, max),
        };
        self.took(r, Instant::now).map(|_| ())
    }

    /// Hands a read's outcome to the core (at the time `now` gives, asked only when bytes
    /// came): `Ok(true)` when bytes arrived, `Ok(false)` when nothing was there, `Err` why
    /// the connection is lost.
    #[inline]
    fn took(
        &mut self,
        r: std::io::Result<usize>,
        now: impl FnOnce() -> Instant,
    ) -> Result<bool, String> {
        match r {
            Ok(0) => Err("the server closed the connection".to_string()),
            Ok(n) => {
                let now = now();
                self.core.handle_read(n, now);
                self.poll.arrived(now);
                self.small_reads = n <= POLL_MAX_MESSAGE;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(format!("read failed: {e}")),
        }
    }

    /// Queues call `c` with whatever else is queued into the same write, and opens the
    /// busy-polling window for their answers when the write is small.
    async fn queue_calls(&mut self, c: Cmd) {
        let now = Instant::now();
        let mut work = handle_cmd(&mut self.core, &mut self.waiting, c, now);
        // Batch whatever else is queued into the same write. When the last answers woke
        // more callers than have queued a call yet, first let them run (the LIFO slot
        // would run this task before them, and each call would go out in its own write);
        // a lone caller's call goes out at once.
        let mut queued = 1;
        while let Ok(c) = self.cmds.try_recv() {
            work = work.saturating_add(handle_cmd(&mut self.core, &mut self.waiting, c, now));
            queued += 1;
        }
        if self.core.queued_tx_len() <= POLL_MAX_MESSAGE {
            self.poll.arm_for(now, work, self.core.pending_len());
        }
        if self.answered > queued {
            tokio::task::yield_now().await;
            while let Ok(c) = self.cmds.try_recv() {
                handle_cmd(&mut self.core, &mut self.waiting, c, now);
            }
        }
        self.answered = 0;
    }
}

/// Hands the answers the core has parsed to their callers (how many were woken), and
/// marks the connection unusable for new calls once the server drains it.
fn deliver_events(
    core: &mut ClientConn,
    waiting: &mut IdMap<u64, ReplyTx>,
    usable: &AtomicBool,
) -> usize {
    let mut answered = 0;
    while let Some(ev) = core.poll_event() {
        match ev {
            ClientEvent::Response {
                request_id,
                status,
                payload,
            } => {
                if let Some(tx) = waiting.remove(&request_id) {
                    let r = if status == Status::OK {
                        Ok(match core.take_staged(request_id) {
                            Some(staged) => Reply::Staged(staged),
                            None => Reply::Payload(payload),
                        })
                    } else {
                        Err(CallError::answered(status, &payload))
                    };
                    let _ = tx.send(r);
                    answered += 1;
                }
            }
            ClientEvent::ResponseInBuffer { request_id, len } => {
                if let Some(tx) = waiting.remove(&request_id) {
                    let _ = tx.send(Ok(Reply::InBuffer(len)));
                    answered += 1;
                }
            }
            ClientEvent::TimedOut { request_id } => {
                if let Some(tx) = waiting.remove(&request_id) {
                    let _ = tx.send(Err(CallError::DeadlineExceeded(Duration::ZERO)));
                    answered += 1;
                }
            }
            ClientEvent::Draining { reason } => {
                tracing::debug!(%reason, "server draining; the next call reconnects");
                usable.store(false, Ordering::Release);
            }
        }
    }
    answered
}

/// After the connection is lost: a final GOAWAY flushed if the core queued one (best
/// effort), and every call waiting or still queued failed with `lost`.
fn fail_remaining(
    core: &mut ClientConn,
    wr: &crate::net::WriteHalf,
    mut waiting: IdMap<u64, ReplyTx>,
    cmds: &mut mpsc::UnboundedReceiver<Cmd>,
    lost: &str,
) {
    core.connection_lost(lost);
    // Flush a final GOAWAY if the core queued one; best effort.
    let p = core.pending_tx();
    if !p.is_empty() {
        let _ = wr.try_write(p);
    }
    for (_, tx) in waiting.drain() {
        let _ = tx.send(Err(CallError::ConnectionLost(lost.to_string())));
    }
    // Calls queued after the loss are failed too (they were never sent).
    cmds.close();
    while let Ok(c) = cmds.try_recv() {
        if let Cmd::Call { reply, .. } = c {
            let _ = reply.send(Err(CallError::ConnectionLost(format!(
                "{lost}; the call was not sent"
            ))));
        }
    }
}

/// Handles one command; returns the bytes of data-plane work its call asks of the server
/// (what it READs and may WRITE), which lengthens the busy-polling window for its answer.
fn handle_cmd(
    core: &mut ClientConn,
    waiting: &mut IdMap<u64, ReplyTx>,
    c: Cmd,
    now: Instant,
) -> u64 {
    let mut work = 0;
    match c {
        Cmd::Call {
            id,
            method,
            body,
            deadline,
            reply,
            sink,
        } => match match body {
            Body::Payload(p) => core.start_call_with_id(id, method, p, Some(deadline), false, now),
            Body::Buffer {
                len,
                response,
                descriptor,
            } => {
                work = len.saturating_add(response);
                core.start_call_in_buffer(id, method, len, descriptor, Some(deadline), now)
            }
            Body::Fed(len) => core.start_call_fed(id, method, len, Some(deadline), now),
        } {
            Ok(()) => {
                if let Some(sink) = sink {
                    core.set_response_sink(id, sink);
                }
                waiting.insert(id, reply);
            }
            Err(StartError::Closed(why)) => {
                let _ = reply.send(Err(CallError::Status {
                    status: Status::SHUTTING_DOWN,
                    message: why,
                }));
            }
            Err(e) => {
                let _ = reply.send(Err(CallError::Refused(e)));
            }
        },
        Cmd::Feed(id, piece) => {
            // False when the call is gone; its producer learns from the answer.
            core.feed(id, piece);
        }
        Cmd::Cancel(id) => {
            waiting.remove(&id);
            core.cancel(id);
        }
    }
    work
}
