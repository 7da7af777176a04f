//! The HMC_BUFFER data plane: `Server<C>`/`Client<C>` take an optional `C: Communicator`
//! that moves large payloads one-sided; [`NoDataPlane`] is the always-built empty one.
//!
//! Who does what (normative text in `docs/protocol.md`, "HMC_BUFFER"): the client copies a
//! request payload of at least [`DataPlaneConfig::threshold`] bytes into a pooled registered
//! buffer, lends a second pooled buffer for the response, and sends only a descriptor (its
//! data-plane address and both regions). The server connects to that address (one cached
//! endpoint per client address), READs the payload into its own pooled buffer, runs the
//! handler, WRITEs a large response into the client's response region and answers
//! RESPONSE/HMC_BUFFER with the length. A response that does not fit goes back as
//! TCP_STREAM. No tag matching, and no lock is held across a transfer.
//!
//! Copies per call: the server's READ and WRITE move the bytes once each way. The client
//! copies the request into a pooled buffer, unless the caller wrote it there in the first
//! place ([`ClientDataPlane::request_buffer`]); the response reaches the caller as a view
//! of the pooled response buffer, without a copy.
//!
//! Device methods ([`crate::Dispatcher::register_device`]) take a pipelined path on the
//! server: the payload is READ a chunk at a time into one of two pooled bounce buffers
//! while the previous chunk is copied to the device, and a large response is copied off
//! the device a chunk at a time while the previous chunk is WRITTEN, so device copies and
//! transfers overlap and two chunk-sized buffers serve any payload size.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use hmc_core::{
    Access, BoxFuture, Communicator, Deadline, Error, LocalRegistration, Notification, Op,
    PeerAddr, Region, RemoteRegion, Result, TransferDesc, TransportId,
};
use parking_lot::Mutex;

use crate::device::DEFAULT_DEVICE_STAGING;
use crate::dispatch::{CallContext, DeviceRequest, DeviceRoute, HandlerResult, RpcError};
use crate::frame::Status;
use crate::pool::{BufferPool, LentBuffers, PoolConfig, PoolStats, PooledBuffer, RequestBuffer};

/// Data-plane settings shared by server and client. Every limit has a default and a name.
#[derive(Clone, Copy, Debug)]
pub struct DataPlaneConfig {
    /// Payloads of at least this many bytes move over the data plane (`ucx_threshold`,
    /// default 64 KiB; `--ucx-threshold`). Smaller ones travel INLINE or TCP_STREAM.
    pub threshold: usize,
    /// The registered buffer pool (`max_pool_bytes`, …).
    pub pool: PoolConfig,
    /// Server: cached data-plane endpoints, one per client data-plane address
    /// (`max_data_plane_peers`, default 1024); the cache is cleared when it is full.
    pub max_peers: usize,
    /// Server: imported remote keys cached per endpoint (`max_keys_per_peer`, default 256).
    pub max_keys_per_peer: usize,
}

impl Default for DataPlaneConfig {
    fn default() -> Self {
        DataPlaneConfig {
            threshold: 64 << 10,
            pool: PoolConfig::default(),
            max_peers: 1024,
            max_keys_per_peer: 256,
        }
    }
}

/// Data-plane counters of a server or client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataPlaneStats {
    /// Calls whose request moved over the data plane.
    pub buffer_calls: u64,
    /// Client: of those, calls whose payload was a [`RequestBuffer`] lent as is (no copy).
    pub lent_requests: u64,
    /// Responses written one-sided into a client's region.
    pub buffer_responses: u64,
    /// Client: large calls sent TCP_STREAM because the data plane could not be prepared.
    /// Server: large responses sent TCP_STREAM (no region, too small, pool exhausted).
    pub fallbacks: u64,
    /// Calls that failed on the data plane (answered DATA_PLANE or BAD_PAYLOAD).
    pub failures: u64,
    /// Server: data-plane endpoints cached now (one per client address in use).
    pub endpoints: usize,
    /// The buffer pool.
    pub pool: PoolStats,
}

#[derive(Default)]
pub(crate) struct Counters {
    buffer_calls: AtomicU64,
    lent_requests: AtomicU64,
    buffer_responses: AtomicU64,
    fallbacks: AtomicU64,
    failures: AtomicU64,
}

impl Counters {
    fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
    fn stats(&self, pool: PoolStats) -> DataPlaneStats {
        DataPlaneStats {
            buffer_calls: self.buffer_calls.load(Ordering::Relaxed),
            lent_requests: self.lent_requests.load(Ordering::Relaxed),
            buffer_responses: self.buffer_responses.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            endpoints: 0,
            pool,
        }
    }
}

/// The body of an HMC_BUFFER REQUEST (see `docs/protocol.md`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BufferDescriptor {
    /// The client's data-plane address (text form, e.g. `tcp://127.0.0.1:40123`).
    pub reply_to: PeerAddr,
    /// The request payload's region (the server READs it).
    pub request: RemoteRegion,
    /// Where the server may WRITE the response.
    pub response: Option<RemoteRegion>,
}

/// Descriptor body version.
const DESC_VERSION: u8 = 1;
const DESC_HAS_RESPONSE: u8 = 1;

impl BufferDescriptor {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let addr = self.reply_to.to_string();
        let req = self.request.encode();
        let mut out = Vec::with_capacity(64 + addr.len() + 2 * req.len());
        out.push(DESC_VERSION);
        out.push(if self.response.is_some() {
            DESC_HAS_RESPONSE
        } else {
            0
        });
        out.extend_from_slice(&(addr.len() as u16).to_be_bytes());
        out.extend_from_slice(addr.as_bytes());
        out.extend_from_slice(&(req.len() as u32).to_be_bytes());
        out.extend_from_slice(&req);
        if let Some(r) = &self.response {
            let r = r.encode();
            out.extend_from_slice(&(r.len() as u32).to_be_bytes());
            out.extend_from_slice(&r);
        }
        out
    }

    pub(crate) fn decode(b: &[u8]) -> std::result::Result<Self, String> {
        let mut at = 0usize;
        let mut take = |n: usize, what: &str| -> std::result::Result<&[u8], String> {
            let end = at
                .checked_add(n)
                .filter(|e| *e <= b.len())
                .ok_or_else(|| format!("HMC_BUFFER descriptor: {what} runs past the body's end"))?;
            let s = &b[at..end];
            at = end;
            Ok(s)
        };
        let head = take(2, "the header")?;
        if head[0] != DESC_VERSION {
            return Err(format!(
                "HMC_BUFFER descriptor version {} is not supported (expected {DESC_VERSION})",
                head[0]
            ));
        }
        let flags = head[1];
        if flags & !DESC_HAS_RESPONSE != 0 {
            return Err(format!("HMC_BUFFER descriptor: unknown flags {flags:#x}"));
        }
        let n = u16::from_be_bytes(take(2, "the address length")?.try_into().unwrap()) as usize;
        let addr = std::str::from_utf8(take(n, "the address")?)
            .map_err(|_| "HMC_BUFFER descriptor: the address is not UTF-8".to_string())?;
        let reply_to: PeerAddr = addr
            .parse()
            .map_err(|e| format!("HMC_BUFFER descriptor: {e}"))?;
        let mut region = |what: &str| -> std::result::Result<RemoteRegion, String> {
            let n = u32::from_be_bytes(take(4, what)?.try_into().unwrap()) as usize;
            RemoteRegion::decode(take(n, what)?).map_err(|e| format!("HMC_BUFFER {what}: {e}"))
        };
        let request = region("request region")?;
        let response = if flags & DESC_HAS_RESPONSE != 0 {
            Some(region("response region")?)
        } else {
            None
        };
        if at != b.len() {
            return Err(format!(
                "HMC_BUFFER descriptor: {} trailing bytes",
                b.len() - at
            ));
        }
        Ok(BufferDescriptor {
            reply_to,
            request,
            response,
        })
    }
}

fn dp_error(why: impl std::fmt::Display) -> RpcError {
    RpcError::new(Status::DATA_PLANE, format!("data plane: {why}"))
}

/// How the server answers an HMC_BUFFER call.
pub(crate) enum Served {
    /// An ordinary answer (INLINE or TCP_STREAM, or an error status).
    Answer(HandlerResult),
    /// The response (this many bytes) is in the client's response region.
    InBuffer(u64),
}

/// One transfer between the start of a bounce buffer and `remote` at `offset`.
fn bounce_desc<'a, C: Communicator>(
    bounce: &'a PooledBuffer<C>,
    remote: &'a C::RemoteKey,
    offset: usize,
    len: usize,
) -> [TransferDesc<'a, C>; 1] {
    [TransferDesc {
        local: bounce.registration(),
        local_offset: 0,
        remote,
        remote_offset: offset as u64,
        len,
    }]
}

/// A call's checked descriptor, the client's endpoint and the imported request region.
struct OpenCall<C: Communicator> {
    d: BufferDescriptor,
    peer: Arc<Peer<C>>,
    rkey: Arc<C::RemoteKey>,
    len: usize,
}

/// Runs the handler on the pulled payload.
pub(crate) type RunHandler = Box<dyn FnOnce(Bytes) -> BoxFuture<'static, HandlerResult> + Send>;

/// What an HMC_BUFFER call runs on its payload.
pub(crate) enum Work {
    /// A handler of host bytes: the payload is pulled whole into a pooled buffer.
    Bytes(RunHandler),
    /// A device method: the payload is pulled chunk by chunk, each chunk copied to the
    /// device while the next is read, and a large response is copied out chunk by chunk,
    /// each chunk WRITTEN while the next is copied.
    Device(CallContext, Arc<dyn DeviceRoute>),
}

/// The data-plane addresses one RPC connection's calls used. A cached endpoint lives while
/// some open RPC connection uses it, so connect/call/disconnect cycles leave nothing behind.
#[derive(Default)]
pub(crate) struct ConnUse {
    /// `None` once the connection has closed.
    addrs: Mutex<Option<std::collections::HashSet<PeerAddr>>>,
}

impl ConnUse {
    pub(crate) fn new() -> Self {
        ConnUse {
            addrs: Mutex::new(Some(Default::default())),
        }
    }
}

/// The server's data plane, type-erased so the server's shared state stays non-generic.
pub(crate) trait ServerPlane: Send + Sync + 'static {
    /// Pulls the payload `desc` describes, runs `work` on it, pushes a large response.
    fn serve(
        self: Arc<Self>,
        conn: Arc<ConnUse>,
        desc: Bytes,
        len: u64,
        deadline: Deadline,
        work: Work,
    ) -> BoxFuture<'static, Served>;
    /// Counters.
    fn stats(&self) -> DataPlaneStats;
    /// The connection closed: endpoints no other open connection uses are dropped.
    fn release(&self, conn: &ConnUse);
}

struct Peer<C: Communicator> {
    ep: C::Endpoint,
    keys: Mutex<HashMap<Vec<u8>, Arc<C::RemoteKey>>>,
    /// Open RPC connections whose calls used this endpoint.
    users: AtomicU64,
}

/// The server half of HMC_BUFFER over any communicator.
pub(crate) struct ServerDp<C: Communicator> {
    comm: Arc<C>,
    pool: BufferPool<C>,
    config: DataPlaneConfig,
    peers: Mutex<HashMap<PeerAddr, Arc<Peer<C>>>>,
    counters: Counters,
}

impl<C: Communicator> ServerDp<C> {
    pub(crate) fn new(comm: Arc<C>, config: DataPlaneConfig) -> Self {
        ServerDp {
            pool: BufferPool::new(comm.clone(), Access::READ, config.pool),
            comm,
            config,
            peers: Mutex::new(HashMap::new()),
            counters: Counters::default(),
        }
    }

    async fn peer(
        &self,
        conn: &ConnUse,
        addr: &PeerAddr,
        deadline: Deadline,
    ) -> Result<Arc<Peer<C>>> {
        let cached = self.peers.lock().get(addr).cloned();
        let p = match cached {
            Some(p) => p,
            None => self.connect(conn, addr, deadline).await?,
        };
        // Count this connection as a user of the endpoint (once).
        let mut addrs = conn.addrs.lock();
        if let Some(set) = addrs.as_mut()
            && set.insert(addr.clone())
        {
            p.users.fetch_add(1, Ordering::AcqRel);
        }
        Ok(p)
    }

    async fn connect(
        &self,
        conn: &ConnUse,
        addr: &PeerAddr,
        deadline: Deadline,
    ) -> Result<Arc<Peer<C>>> {
        let ep = self.comm.connect(addr, deadline).await?;
        let p = Arc::new(Peer {
            ep,
            keys: Mutex::new(HashMap::new()),
            users: AtomicU64::new(0),
        });
        if conn.addrs.lock().is_none() {
            // The RPC connection is gone: use the endpoint for this call only.
            return Ok(p);
        }
        let mut peers = self.peers.lock();
        if peers.len() >= self.config.max_peers {
            tracing::debug!(
                max_data_plane_peers = self.config.max_peers,
                "data-plane endpoint cache full; clearing it"
            );
            peers.clear();
        }
        Ok(peers.entry(addr.clone()).or_insert(p).clone())
    }

    fn forget_peer(&self, addr: &PeerAddr) {
        self.peers.lock().remove(addr);
    }

    fn key(&self, peer: &Peer<C>, region: &RemoteRegion) -> Result<Arc<C::RemoteKey>> {
        let id = region.encode();
        if let Some(k) = peer.keys.lock().get(&id) {
            return Ok(k.clone());
        }
        let k = Arc::new(crate::pool::blocking(|| {
            self.comm.import(&peer.ep, region)
        })?);
        let mut keys = peer.keys.lock();
        if keys.len() >= self.config.max_keys_per_peer {
            keys.clear();
        }
        keys.insert(id, k.clone());
        Ok(k)
    }

    fn forget_key(&self, peer: &Peer<C>, region: &RemoteRegion) {
        peer.keys.lock().remove(&region.encode());
    }

    fn check_region(
        &self,
        r: &RemoteRegion,
        need: Access,
        what: &str,
    ) -> std::result::Result<(), RpcError> {
        if r.transport != self.comm.transport() {
            return Err(dp_error(format!(
                "the {what} region is a {:?} region but this server's data plane is {:?};                  start both peers with the same --data-plane",
                r.transport,
                self.comm.transport()
            )));
        }
        if !r.access.allows(need) {
            return Err(RpcError::bad_payload(format!(
                "HMC_BUFFER {what} region allows {:?}, the server needs {need:?}",
                r.access
            )));
        }
        Ok(())
    }

    /// Decodes and checks a call's descriptor, connects to the client's data plane and
    /// imports the request region.
    async fn open_call(
        &self,
        conn: &ConnUse,
        desc: &Bytes,
        len: u64,
        deadline: Deadline,
    ) -> std::result::Result<OpenCall<C>, RpcError> {
        let d = BufferDescriptor::decode(desc).map_err(RpcError::bad_payload)?;
        self.check_region(&d.request, Access::READ, "request")?;
        if len > d.request.region.len as u64 {
            return Err(RpcError::bad_payload(format!(
                "HMC_BUFFER payload length {len} is past the end of its {}-byte request region",
                d.request.region.len
            )));
        }
        let len = len as usize;
        let peer = self.peer(conn, &d.reply_to, deadline).await.map_err(|e| {
            dp_error(format!(
                "connecting to the client's data plane at {}: {e}",
                d.reply_to
            ))
        })?;
        let rkey = self
            .key(&peer, &d.request)
            .map_err(|e| dp_error(format!("importing the request region: {e}")))?;
        Ok(OpenCall { d, peer, rkey, len })
    }

    async fn serve_inner(
        self: Arc<Self>,
        conn: Arc<ConnUse>,
        desc: Bytes,
        len: u64,
        deadline: Deadline,
        run: RunHandler,
    ) -> std::result::Result<Served, RpcError> {
        let OpenCall { d, peer, rkey, len } = self.open_call(&conn, &desc, len, deadline).await?;
        let buf = self.pool.acquire(len).map_err(dp_error)?;
        let read = self
            .comm
            .transfer(
                &peer.ep,
                Op::Read,
                &[TransferDesc {
                    local: buf.registration(),
                    local_offset: 0,
                    remote: &rkey,
                    remote_offset: 0,
                    len,
                }],
                deadline,
            )
            .await;
        if let Err(e) = read {
            self.on_transfer_error(&d.reply_to, &peer, &d.request, &e);
            return Err(dp_error(format!("reading the request payload: {e}")));
        }
        Counters::bump(&self.counters.buffer_calls);
        let req = Arc::new(buf);
        let payload = Bytes::from_owner(SharedView {
            buf: req.clone(),
            len,
        });
        let resp = run(payload).await?;
        let fits = d
            .response
            .as_ref()
            .is_some_and(|r| r.region.len >= resp.len());
        if resp.len() < self.config.threshold {
            return Ok(Served::Answer(Ok(resp)));
        }
        if !fits {
            Counters::bump(&self.counters.fallbacks);
            return Ok(Served::Answer(Ok(resp)));
        }
        let region = d.response.as_ref().expect("checked by `fits`");
        self.check_region(region, Access::WRITE, "response")?;
        let wkey = self
            .key(&peer, region)
            .map_err(|e| dp_error(format!("importing the response region: {e}")))?;
        // The response is sent from a registered buffer: the request's own when the handler
        // answered with (a slice of) the request bytes, as echo does; else a pooled copy.
        let base = req.region().addr as usize;
        let p = resp.as_ptr() as usize;
        let own;
        let (local, offset) = if p >= base && p + resp.len() <= base + req.len() {
            (req.registration(), p - base)
        } else {
            match self.pool.acquire(resp.len()) {
                Ok(b) => {
                    b.fill(&resp).map_err(dp_error)?;
                    own = b;
                    (own.registration(), 0)
                }
                Err(e) => {
                    tracing::debug!(error = %e, "no buffer for the response; sending it TCP_STREAM");
                    Counters::bump(&self.counters.fallbacks);
                    return Ok(Served::Answer(Ok(resp)));
                }
            }
        };
        let write = self
            .comm
            .transfer(
                &peer.ep,
                Op::Write,
                &[TransferDesc {
                    local,
                    local_offset: offset,
                    remote: &wkey,
                    remote_offset: 0,
                    len: resp.len(),
                }],
                deadline,
            )
            .await;
        if let Err(e) = write {
            self.on_transfer_error(&d.reply_to, &peer, region, &e);
            return Err(dp_error(format!("writing the response: {e}")));
        }
        Counters::bump(&self.counters.buffer_responses);
        Ok(Served::InBuffer(resp.len() as u64))
    }

    /// The device method's path: READ chunk i into one pooled bounce buffer while chunk
    /// i - 1 goes from the other to the device; run the handler; WRITE chunk i of a large
    /// response from one bounce buffer while chunk i + 1 is copied out of the device into
    /// the other. Two pooled buffers of one chunk each, whatever the payload's size.
    async fn serve_device_inner(
        self: Arc<Self>,
        conn: Arc<ConnUse>,
        desc: Bytes,
        len: u64,
        deadline: Deadline,
        ctx: CallContext,
        route: Arc<dyn DeviceRoute>,
    ) -> std::result::Result<Served, RpcError> {
        let OpenCall { d, peer, rkey, len } = self.open_call(&conn, &desc, len, deadline).await?;
        let chunk = DEFAULT_DEVICE_STAGING.chunk;
        let bounce = [
            self.pool.acquire(chunk).map_err(dp_error)?,
            self.pool.acquire(chunk).map_err(dp_error)?,
        ];
        let mut sink = route.sink(len as u64);
        let n = len.div_ceil(chunk);
        let piece = |i: usize| (i * chunk, chunk.min(len - i * chunk));
        for i in 0..=n {
            let fetch = async {
                if i < n {
                    let (off, l) = piece(i);
                    let desc = bounce_desc(&bounce[i % 2], &rkey, off, l);
                    self.comm
                        .transfer(&peer.ep, Op::Read, &desc, deadline)
                        .await?;
                }
                Ok::<(), Error>(())
            };
            let drain = async {
                if i > 0 {
                    let (off, l) = piece(i - 1);
                    // A copy error stays in the sink and is reported when it finishes.
                    sink.write(off as u64, bounce[(i - 1) % 2].as_slice(l)?);
                }
                Ok::<(), Error>(())
            };
            let (fetched, drained) = futures::join!(fetch, drain);
            if let Err(e) = fetched {
                self.on_transfer_error(&d.reply_to, &peer, &d.request, &e);
                return Err(dp_error(format!("reading the request payload: {e}")));
            }
            drained.map_err(dp_error)?;
        }
        Counters::bump(&self.counters.buffer_calls);
        let out = route
            .run_raw(ctx, DeviceRequest::Staged(sink.finish()))
            .await?;
        let region = d.response.as_ref().filter(|r| r.region.len >= out.len());
        let Some(region) = region.filter(|_| out.len() >= self.config.threshold) else {
            if out.len() >= self.config.threshold {
                Counters::bump(&self.counters.fallbacks);
            }
            // Small (or no room lent): one copy to host memory, answered on the stream.
            let mut host = vec![0u8; out.len()];
            out.copy_out(0, &mut hmc_core::MemSpanMut::host(&mut host))
                .map_err(|e| dp_error(format!("copying the response off the device: {e}")))?;
            return Ok(Served::Answer(Ok(Bytes::from(host))));
        };
        self.check_region(region, Access::WRITE, "response")?;
        let wkey = self
            .key(&peer, region)
            .map_err(|e| dp_error(format!("importing the response region: {e}")))?;
        let total = out.len();
        let n = total.div_ceil(chunk);
        let piece = |i: usize| (i * chunk, chunk.min(total - i * chunk));
        let copy_out = |i: usize| -> Result<()> {
            let (off, l) = piece(i);
            let r = bounce[i % 2].region().slice(0, l)?;
            #[allow(unsafe_code)]
            // SAFETY: bounce buffer `i % 2` is host memory this call holds (a pooled
            // registered buffer, alive until the call ends), and nothing else touches it
            // now: the WRITE that used it last (chunk i - 2) has completed, and the WRITE
            // running meanwhile reads the other one.
            let mut dst = unsafe { hmc_core::MemSpanMut::from_region(r) };
            out.copy_out(off, &mut dst)
        };
        copy_out(0).map_err(|e| dp_error(format!("copying the response off the device: {e}")))?;
        for i in 0..n {
            let (off, l) = piece(i);
            let desc = bounce_desc(&bounce[i % 2], &wkey, off, l);
            let send = self.comm.transfer(&peer.ep, Op::Write, &desc, deadline);
            let next = async {
                if i + 1 < n {
                    copy_out(i + 1)?;
                }
                Ok::<(), Error>(())
            };
            let (sent, copied) = futures::join!(send, next);
            if let Err(e) = sent {
                self.on_transfer_error(&d.reply_to, &peer, region, &e);
                return Err(dp_error(format!("writing the response: {e}")));
            }
            copied.map_err(|e| dp_error(format!("copying the response off the device: {e}")))?;
        }
        Counters::bump(&self.counters.buffer_responses);
        Ok(Served::InBuffer(total as u64))
    }

    fn on_transfer_error(&self, addr: &PeerAddr, peer: &Peer<C>, region: &RemoteRegion, e: &Error) {
        self.forget_key(peer, region);
        if !matches!(
            e,
            Error::InvalidKey(_) | Error::OutOfBounds { .. } | Error::AccessDenied(_)
        ) {
            self.forget_peer(addr);
        }
    }
}

impl<C: Communicator> ServerPlane for ServerDp<C> {
    fn serve(
        self: Arc<Self>,
        conn: Arc<ConnUse>,
        desc: Bytes,
        len: u64,
        deadline: Deadline,
        work: Work,
    ) -> BoxFuture<'static, Served> {
        Box::pin(async move {
            let me = self.clone();
            let served = match work {
                Work::Bytes(run) => self.serve_inner(conn, desc, len, deadline, run).await,
                Work::Device(ctx, route) => {
                    self.serve_device_inner(conn, desc, len, deadline, ctx, route)
                        .await
                }
            };
            served.unwrap_or_else(|e| {
                Counters::bump(&me.counters.failures);
                tracing::debug!(status = %e.status, why = %e.message, "HMC_BUFFER call failed");
                Served::Answer(Err(e))
            })
        })
    }

    fn stats(&self) -> DataPlaneStats {
        DataPlaneStats {
            endpoints: self.peers.lock().len(),
            ..self.counters.stats(self.pool.stats())
        }
    }

    fn release(&self, conn: &ConnUse) {
        let Some(addrs) = conn.addrs.lock().take() else {
            return;
        };
        let mut peers = self.peers.lock();
        for a in addrs {
            if let Some(p) = peers.get(&a) {
                let left = p
                    .users
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                    .map_or(0, |prev| prev - 1);
                if left == 0 {
                    peers.remove(&a);
                }
            }
        }
    }
}

/// `Bytes` owner over a pooled buffer also used as the response source.
struct SharedView<C: Communicator> {
    buf: Arc<PooledBuffer<C>>,
    len: usize,
}

impl<C: Communicator> AsRef<[u8]> for SharedView<C> {
    fn as_ref(&self) -> &[u8] {
        self.buf.as_slice(self.len).unwrap_or(&[])
    }
}

/// The client half of HMC_BUFFER: the communicator and its buffer pool. Share one among
/// clients ([`crate::Client::with_client_data_plane`]) so that reconnecting clients reuse
/// the same registered buffers.
pub struct ClientDataPlane<C: Communicator> {
    pub(crate) comm: Arc<C>,
    pool: BufferPool<C>,
    pub(crate) config: DataPlaneConfig,
    counters: Counters,
    lent: Arc<LentBuffers>,
}

/// The buffers of one HMC_BUFFER call. Returned to the pool once the server answered OK;
/// discarded (deregistered, so the server's key dies) otherwise, because a server that
/// gave up may still have a transfer in flight.
pub(crate) struct PreparedCall<C: Communicator> {
    pub(crate) descriptor: Bytes,
    request: Option<PooledBuffer<C>>,
    /// The caller's [`RequestBuffer`] lent as the request: its discard flag.
    lent: Option<Arc<std::sync::atomic::AtomicBool>>,
    response: Option<PooledBuffer<C>>,
    settled: bool,
}

impl<C: Communicator> PreparedCall<C> {
    /// The server answered OK with its response in our region: the bytes, no copy.
    pub(crate) fn take_response(mut self, len: u64) -> Result<Bytes> {
        self.settled = true;
        let resp = self.response.take().ok_or_else(|| {
            Error::Protocol("HMC_BUFFER response to a call that lent no response region".into())
        })?;
        resp.into_bytes(len as usize)
    }

    /// The server answered OK with the response inline or streamed.
    pub(crate) fn settle(mut self) {
        self.settled = true;
    }
}

impl<C: Communicator> Drop for PreparedCall<C> {
    fn drop(&mut self) {
        if !self.settled {
            if let Some(b) = self.request.take() {
                b.discard();
            }
            if let Some(d) = self.lent.take() {
                d.store(true, Ordering::Release);
            }
            if let Some(b) = self.response.take() {
                b.discard();
            }
        }
    }
}

impl<C: Communicator> ClientDataPlane<C> {
    /// A data plane over `comm` with an empty pool.
    pub fn new(comm: Arc<C>, config: DataPlaneConfig) -> Self {
        ClientDataPlane {
            pool: BufferPool::new(comm.clone(), Access::READ_WRITE, config.pool),
            comm,
            config,
            counters: Counters::default(),
            lent: Arc::default(),
        }
    }

    /// A pooled registered buffer of `len` bytes to write a request payload into, for
    /// calls without the copy into a pooled buffer (see [`RequestBuffer`]). Fails like
    /// the pool does ([`Error::LimitExceeded`] naming `max_pool_bytes`).
    pub fn request_buffer(&self, len: usize) -> Result<RequestBuffer<C>> {
        Ok(RequestBuffer::new(
            self.pool.acquire(len)?,
            len,
            self.lent.clone(),
        ))
    }

    /// Lends `payload` itself when it is a frozen [`RequestBuffer`] of this data plane,
    /// else copies it into a pooled buffer; and lends a response region of `response_len`
    /// bytes (0: none). Fails (and the caller falls back to TCP_STREAM) when the pool
    /// cannot lend.
    pub(crate) fn prepare(&self, payload: &[u8], response_len: usize) -> Result<PreparedCall<C>> {
        let lent = self.lent.find(payload);
        let r = (|| {
            let (request, export) = match &lent {
                Some(l) => (None, l.export.clone()),
                None => {
                    let request = self.pool.acquire(payload.len())?;
                    request.fill(payload)?;
                    let export = request.export();
                    (Some(request), export)
                }
            };
            let response = if response_len > 0 {
                Some(self.pool.acquire(response_len)?)
            } else {
                None
            };
            let desc = BufferDescriptor {
                reply_to: self.comm.address(),
                request: export,
                response: response.as_ref().map(|b| b.export()),
            };
            Ok(PreparedCall {
                descriptor: Bytes::from(desc.encode()),
                request,
                lent: None,
                response,
                settled: true,
            })
        })();
        match r {
            Ok(mut p) => {
                p.settled = false;
                if let Some(l) = lent {
                    p.lent = Some(l.discard);
                    Counters::bump(&self.counters.lent_requests);
                }
                Counters::bump(&self.counters.buffer_calls);
                Ok(p)
            }
            Err(e) => {
                Counters::bump(&self.counters.fallbacks);
                Err(e)
            }
        }
    }

    pub(crate) fn failed(&self) {
        Counters::bump(&self.counters.failures);
    }

    pub(crate) fn responded_in_buffer(&self) {
        Counters::bump(&self.counters.buffer_responses);
    }

    /// Counters (shared by every client using this data plane).
    pub fn stats(&self) -> DataPlaneStats {
        self.counters.stats(self.pool.stats())
    }
}

/// A `Communicator` that has no data plane: every operation reports
/// [`Error::Unavailable`]. The default type parameter of the server and client, like
/// wgpu-hal's `empty` backend: it keeps the generic code honest without a transport.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoDataPlane;

/// Never constructed: [`NoDataPlane::register`] always fails.
#[derive(Debug)]
pub enum NoRegistration {}

impl LocalRegistration for NoRegistration {
    fn region(&self) -> Region {
        match *self {}
    }
    fn access(&self) -> Access {
        match *self {}
    }
}

fn unavailable() -> Error {
    Error::Unavailable {
        what: "RPC data plane".into(),
        reason: "no Communicator was configured for HMC_BUFFER payloads".into(),
        hint: "build the Server/Client with_data_plane(communicator), or send payloads INLINE/TCP_STREAM".into(),
    }
}

impl Communicator for NoDataPlane {
    type Endpoint = ();
    type Registration = NoRegistration;
    type RemoteKey = ();

    fn transport(&self) -> TransportId {
        TransportId::Tcp
    }
    fn address(&self) -> PeerAddr {
        PeerAddr::Opaque {
            transport: TransportId::Tcp,
            bytes: Vec::new(),
        }
    }
    fn connect(&self, _: &PeerAddr, _: Deadline) -> impl Future<Output = Result<()>> + Send {
        std::future::ready(Err(unavailable()))
    }
    // The trait declares `register` unsafe; this one touches no memory and always fails.
    #[allow(unsafe_code)]
    unsafe fn register(&self, _: Region, _: Access) -> Result<NoRegistration> {
        Err(unavailable())
    }
    fn export(&self, reg: &NoRegistration) -> RemoteRegion {
        match *reg {}
    }
    fn import(&self, _: &(), _: &RemoteRegion) -> Result<()> {
        Err(unavailable())
    }
    fn transfer(
        &self,
        _: &(),
        _: Op,
        _: &[TransferDesc<'_, Self>],
        _: Deadline,
    ) -> impl Future<Output = Result<()>> + Send {
        std::future::ready(Err(unavailable()))
    }
    fn notify(
        &self,
        _: &(),
        _: u64,
        _: &[u8],
        _: Deadline,
    ) -> impl Future<Output = Result<()>> + Send {
        std::future::ready(Err(unavailable()))
    }
    fn recv_notification(&self, _: Deadline) -> impl Future<Output = Result<Notification>> + Send {
        std::future::ready(Err(unavailable()))
    }
    fn close(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_operation_reports_unavailable_with_a_hint() {
        let d = NoDataPlane;
        let e = d
            .connect(&d.address(), Deadline::default())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("with_data_plane"), "{e}");
        assert!(d.recv_notification(Deadline::default()).await.is_err());
    }
}
