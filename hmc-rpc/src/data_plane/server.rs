//! The server half of the data plane: cached endpoints and keys per client address, the
//! READ of a request and the WRITE of a response within `data_plane_timeout`, and the
//! pipelined device path.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hmc_core::{
    Access, BoxFuture, Communicator, Deadline, Error, Op, PeerAddr, RemoteRegion, Result,
    TransferDesc,
};
use parking_lot::Mutex;

use super::descriptor::BufferDescriptor;
use super::dial::check_dial;
use super::{ConnUse, Counters, DataPlaneConfig, DataPlaneStats, RunHandler, Served, Work};
use crate::device::DEFAULT_DEVICE_STAGING;
use crate::dispatch::{CallContext, DeviceOut, DeviceRequest, DeviceRoute, RpcError};
use crate::frame::Status;
use crate::pool::{BufferPool, PooledBuffer};
use crate::proto::{StagedPayload, StreamSink};

pub(super) fn dp_error(why: impl std::fmt::Display) -> RpcError {
    RpcError::new(Status::DATA_PLANE, format!("data plane: {why}"))
}

/// The DATA_PLANE answer for a failed copy of a device method's response to host memory.
fn copy_out_error(e: Error) -> RpcError {
    dp_error(format!("copying the response off the device: {e}"))
}

/// The data-plane time one call may still spend (`data_plane_timeout`), and its deadline.
pub(super) struct DpClock {
    pub(super) call: Deadline,
    pub(super) left: Duration,
}

/// One stretch of a call's data-plane work: it ends by `deadline`.
pub(super) struct Phase {
    pub(super) deadline: Deadline,
    pub(super) started: Instant,
    /// `data_plane_timeout`, not the call's deadline, is what ends this phase.
    pub(super) limited: bool,
}

impl DpClock {
    pub(super) fn new(call: Deadline, timeout: Duration) -> Self {
        DpClock {
            call,
            left: timeout,
        }
    }

    /// Starts a phase that ends by the call's deadline or when the data-plane time left
    /// runs out, whichever is first.
    pub(super) fn phase(&self) -> Phase {
        let dp = Deadline::after(self.left);
        Phase {
            deadline: self.call.min(dp),
            started: Instant::now(),
            limited: dp.instant() < self.call.instant(),
        }
    }

    /// `ph` is over: its time is spent.
    pub(super) fn spent(&mut self, ph: &Phase) {
        self.left = self.left.saturating_sub(ph.started.elapsed());
    }
}

impl Phase {
    /// The DATA_PLANE answer for `e` while `what`; one that ran into `data_plane_timeout`
    /// says so and names the flag.
    pub(super) fn error(
        &self,
        config: &DataPlaneConfig,
        what: impl std::fmt::Display,
        e: Error,
    ) -> RpcError {
        if self.limited && matches!(e, Error::DeadlineExceeded { .. }) {
            dp_error(format!(
                "{what}: the call's data-plane time reached `data_plane_timeout` ({} ms); \
                 raise --data-plane-timeout-ms (DataPlaneConfig::timeout) if the client's data \
                 plane is that slow ({e})",
                config.timeout.as_millis()
            ))
        } else {
            dp_error(format!("{what}: {e}"))
        }
    }
}

/// One transfer between the start of a pooled buffer (a bounce buffer, or a request's
/// buffer) and `remote` at `offset`.
pub(super) fn bounce_desc<'a, C: Communicator>(
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
pub(super) struct OpenCall<C: Communicator> {
    pub(super) d: BufferDescriptor,
    pub(super) peer: Arc<Peer<C>>,
    pub(super) rkey: Arc<C::RemoteKey>,
    pub(super) len: usize,
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
    /// The wire id of the data plane's transport (for the settings exchange).
    fn transport_wire_id(&self) -> u16;
    /// Counters.
    fn stats(&self) -> DataPlaneStats;
    /// The connection closed: endpoints no other open connection uses are dropped.
    fn release(&self, conn: &ConnUse);
}

pub(super) struct Peer<C: Communicator> {
    pub(super) ep: C::Endpoint,
    pub(super) keys: Mutex<HashMap<Vec<u8>, Arc<C::RemoteKey>>>,
    /// Open RPC connections whose calls used this endpoint.
    pub(super) users: AtomicU64,
}

/// The server half of HMC_BUFFER over any communicator.
pub(crate) struct ServerDp<C: Communicator> {
    pub(super) comm: Arc<C>,
    pub(super) pool: BufferPool<C>,
    pub(super) config: DataPlaneConfig,
    pub(super) peers: Mutex<HashMap<PeerAddr, Arc<Peer<C>>>>,
    pub(super) counters: Counters,
    /// The transport's `import` may wait on the peer (`key_ops_wait`): run it through
    /// `blocking`, else in place.
    pub(super) import_waits: bool,
}

impl<C: Communicator> ServerDp<C> {
    pub(crate) fn new(comm: Arc<C>, config: DataPlaneConfig) -> Self {
        ServerDp {
            import_waits: comm.capabilities().key_ops_wait,
            pool: BufferPool::new(comm.clone(), Access::READ, config.pool),
            comm,
            config,
            peers: Mutex::new(HashMap::new()),
            counters: Counters::default(),
        }
    }

    pub(super) async fn peer(
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

    pub(super) async fn connect(
        &self,
        conn: &ConnUse,
        addr: &PeerAddr,
        deadline: Deadline,
    ) -> Result<Arc<Peer<C>>> {
        // The transport ends a connect by its deadline; the timer is a second guard, so
        // that a silent listener never holds the call's slot past it.
        let started = Instant::now();
        let ep =
            tokio::time::timeout_at(deadline.instant().into(), self.comm.connect(addr, deadline))
                .await
                .map_err(|_| Error::DeadlineExceeded {
                    during: "connecting to the client's data plane",
                    elapsed: started.elapsed(),
                })??;
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

    pub(super) fn forget_peer(&self, addr: &PeerAddr) {
        self.peers.lock().remove(addr);
    }

    pub(super) fn key(&self, peer: &Peer<C>, region: &RemoteRegion) -> Result<Arc<C::RemoteKey>> {
        let id = region.encode();
        if let Some(k) = peer.keys.lock().get(&id) {
            return Ok(k.clone());
        }
        let import = || self.comm.import(&peer.ep, region);
        let k = Arc::new(if self.import_waits {
            crate::pool::blocking(import)
        } else {
            import()
        }?);
        let mut keys = peer.keys.lock();
        if keys.len() >= self.config.max_keys_per_peer {
            keys.clear();
        }
        keys.insert(id, k.clone());
        Ok(k)
    }

    pub(super) fn forget_key(&self, peer: &Peer<C>, region: &RemoteRegion) {
        peer.keys.lock().remove(&region.encode());
    }

    pub(super) fn check_region(
        &self,
        r: &RemoteRegion,
        need: Access,
        what: &str,
    ) -> std::result::Result<(), RpcError> {
        if r.transport != self.comm.transport() {
            return Err(dp_error(format!(
                "the {what} region is a {:?} region but this server's data plane is {:?}; give both peers a data plane over the same transport",
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

    /// Decodes and checks a call's descriptor, checks the dial rule, connects to the
    /// client's data plane and imports the request region.
    pub(super) async fn open_call(
        &self,
        conn: &ConnUse,
        desc: &Bytes,
        len: u64,
        ph: &Phase,
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
        // The dial rule, once per address and RPC connection, before anything is sent.
        let checked = conn
            .addrs
            .lock()
            .as_ref()
            .is_some_and(|s| s.contains(&d.reply_to));
        if !checked {
            check_dial(&conn.peer, &d.reply_to, &self.config.allow).map_err(dp_error)?;
        }
        let peer = self
            .peer(conn, &d.reply_to, ph.deadline)
            .await
            .map_err(|e| {
                ph.error(
                    &self.config,
                    format!("connecting to the client's data plane at {}", d.reply_to),
                    e,
                )
            })?;
        let rkey = self
            .key(&peer, &d.request)
            .map_err(|e| dp_error(format!("importing the request region: {e}")))?;
        Ok(OpenCall { d, peer, rkey, len })
    }

    pub(super) async fn serve_inner(
        self: Arc<Self>,
        conn: Arc<ConnUse>,
        desc: Bytes,
        len: u64,
        mut clock: DpClock,
        run: RunHandler,
        in_place: bool,
    ) -> std::result::Result<Served, RpcError> {
        let ph = clock.phase();
        let call = self.open_call(&conn, &desc, len, &ph).await?;
        let (payload, req) = self.take_request(&call, &ph, in_place).await?;
        clock.spent(&ph);
        Counters::bump(&self.counters.buffer_calls);
        let resp = run(payload).await?;
        self.send_response(&call, req, resp, &clock).await
    }

    /// The request's bytes: a handler that takes its request in place gets a view of the
    /// client's buffer where the transport has it mapped; any other payload is READ into a
    /// pooled buffer, returned too (a response may be sent from it).
    async fn take_request(
        &self,
        call: &OpenCall<C>,
        ph: &Phase,
        in_place: bool,
    ) -> std::result::Result<(Bytes, Option<Arc<PooledBuffer<C>>>), RpcError> {
        let OpenCall { d, peer, rkey, len } = call;
        let len = *len;
        let viewed = match in_place {
            true => self.comm.view(&peer.ep, rkey, 0, len, Access::READ),
            false => Ok(None),
        };
        let viewed = viewed
            .map_err(|e| self.failed(call, &d.request, ph, "viewing the request payload", e))?;
        if let Some(view) = viewed {
            Counters::bump(&self.counters.viewed_requests);
            return Ok((Bytes::from_owner(ViewBytes(view)), None));
        }
        let buf = self.pool.acquire(len).map_err(dp_error)?;
        let read = self
            .comm
            .transfer(
                &peer.ep,
                Op::Read,
                &bounce_desc(&buf, rkey, 0, len),
                ph.deadline,
            )
            .await;
        if let Err(e) = read {
            return Err(self.failed(call, &d.request, ph, "reading the request payload", e));
        }
        let req = Arc::new(buf);
        let payload = Bytes::from_owner(SharedView {
            buf: req.clone(),
            len,
        });
        Ok((payload, Some(req)))
    }

    /// Answers with the handler's `resp`: on the stream when it is small or the client lent
    /// no room for it; else into the client's response region, in place where the
    /// transport maps it, else by a WRITE.
    async fn send_response(
        &self,
        call: &OpenCall<C>,
        req: Option<Arc<PooledBuffer<C>>>,
        resp: Bytes,
        clock: &DpClock,
    ) -> std::result::Result<Served, RpcError> {
        let fits = call
            .d
            .response
            .as_ref()
            .is_some_and(|r| r.region.len >= resp.len());
        if resp.len() < self.config.threshold {
            // A small answer that is a slice of a viewed request would hold the client's
            // buffer until the frame is written: copy its few bytes and let the view go now.
            let resp = match req {
                None => Bytes::copy_from_slice(&resp),
                Some(_) => resp,
            };
            return Ok(Served::Answer(Ok(resp)));
        }
        if !fits {
            Counters::bump(&self.counters.fallbacks);
            return Ok(Served::Answer(Ok(resp)));
        }
        let region = call.d.response.as_ref().expect("checked by `fits`");
        self.check_region(region, Access::WRITE, "response")?;
        let ph = clock.phase();
        let wkey = self.response_key(&call.peer, region)?;
        // Straight into the client's response region where the transport maps it: one copy
        // from wherever the handler's bytes are (the viewed request, for echo).
        match self.write_in_place(&call.peer, &wkey, &resp, &ph).await {
            Ok(true) => {
                Counters::bump(&self.counters.buffer_responses);
                Counters::bump(&self.counters.viewed_responses);
                return Ok(Served::InBuffer(resp.len() as u64));
            }
            Ok(false) => {}
            Err(e) => return Err(self.failed(call, region, &ph, "writing the response", e)),
        }
        self.write_response(call, region, &wkey, req.as_deref(), resp, &ph)
            .await
    }

    /// WRITEs `resp` into the client's response `region` from a registered buffer: the
    /// request's own when the handler answered with (a slice of) the request bytes, as echo
    /// does; else a pooled copy (with none free, `resp` is answered on the stream).
    async fn write_response(
        &self,
        call: &OpenCall<C>,
        region: &RemoteRegion,
        wkey: &C::RemoteKey,
        req: Option<&PooledBuffer<C>>,
        resp: Bytes,
        ph: &Phase,
    ) -> std::result::Result<Served, RpcError> {
        let p = resp.as_ptr() as usize;
        let own;
        let in_request = req.and_then(|req| {
            let base = req.region().addr as usize;
            (p >= base && p + resp.len() <= base + req.len())
                .then(|| (req.registration(), p - base))
        });
        let (local, offset) = match in_request {
            Some(at) => at,
            None => match self.pool.acquire(resp.len()) {
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
            },
        };
        let write = self
            .comm
            .transfer(
                &call.peer.ep,
                Op::Write,
                &[TransferDesc {
                    local,
                    local_offset: offset,
                    remote: wkey,
                    remote_offset: 0,
                    len: resp.len(),
                }],
                ph.deadline,
            )
            .await;
        if let Err(e) = write {
            return Err(self.failed(call, region, ph, "writing the response", e));
        }
        Counters::bump(&self.counters.buffer_responses);
        Ok(Served::InBuffer(resp.len() as u64))
    }

    /// The device method's path: READ chunk i into one pooled bounce buffer while chunk
    /// i - 1 goes from the other to the device; run the handler; WRITE chunk i of a large
    /// response from one bounce buffer while chunk i + 1 is copied out of the device into
    /// the other. Two pooled buffers of one chunk each, whatever the payload's size.
    pub(super) async fn serve_device_inner(
        self: Arc<Self>,
        conn: Arc<ConnUse>,
        desc: Bytes,
        len: u64,
        mut clock: DpClock,
        ctx: CallContext,
        route: Arc<dyn DeviceRoute>,
    ) -> std::result::Result<Served, RpcError> {
        let ph = clock.phase();
        let call = self.open_call(&conn, &desc, len, &ph).await?;
        let chunk = DEFAULT_DEVICE_STAGING.chunk;
        let bounce = [
            self.pool.acquire(chunk).map_err(dp_error)?,
            self.pool.acquire(chunk).map_err(dp_error)?,
        ];
        let sink = route.sink(call.len as u64);
        let staged = self.read_to_device(&call, &bounce, sink, &ph).await?;
        clock.spent(&ph);
        Counters::bump(&self.counters.buffer_calls);
        let out = route.run_raw(ctx, DeviceRequest::Staged(staged)).await?;
        let region = call
            .d
            .response
            .as_ref()
            .filter(|r| r.region.len >= out.len());
        let Some(region) = region.filter(|_| out.len() >= self.config.threshold) else {
            if out.len() >= self.config.threshold {
                Counters::bump(&self.counters.fallbacks);
            }
            // Small (or no room lent): one copy to host memory, answered on the stream.
            let mut host = vec![0u8; out.len()];
            out.copy_out(0, &mut hmc_core::MemSpanMut::host(&mut host))
                .map_err(copy_out_error)?;
            return Ok(Served::Answer(Ok(Bytes::from(host))));
        };
        self.check_region(region, Access::WRITE, "response")?;
        let wkey = self.response_key(&call.peer, region)?;
        self.write_from_device(&call, region, &wkey, &bounce, &out, &clock)
            .await
    }

    /// READs the request chunk by chunk into the two `bounce` buffers in turn, each chunk
    /// going on to the device through `sink` while the next one is read.
    async fn read_to_device(
        &self,
        call: &OpenCall<C>,
        bounce: &[PooledBuffer<C>; 2],
        mut sink: Box<dyn StreamSink>,
        ph: &Phase,
    ) -> std::result::Result<StagedPayload, RpcError> {
        let chunk = DEFAULT_DEVICE_STAGING.chunk;
        let len = call.len;
        let n = len.div_ceil(chunk);
        let piece = |i: usize| (i * chunk, chunk.min(len - i * chunk));
        for i in 0..=n {
            let fetch = async {
                if i < n {
                    let (off, l) = piece(i);
                    let desc = bounce_desc(&bounce[i % 2], &call.rkey, off, l);
                    self.comm
                        .transfer(&call.peer.ep, Op::Read, &desc, ph.deadline)
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
                return Err(self.failed(
                    call,
                    &call.d.request,
                    ph,
                    "reading the request payload",
                    e,
                ));
            }
            drained.map_err(dp_error)?;
        }
        Ok(sink.finish())
    }

    /// WRITEs the device method's response `out` into the client's response `region`
    /// chunk by chunk from the two `bounce` buffers in turn, copying the next chunk off the
    /// device while one is written.
    async fn write_from_device(
        &self,
        call: &OpenCall<C>,
        region: &RemoteRegion,
        wkey: &C::RemoteKey,
        bounce: &[PooledBuffer<C>; 2],
        out: &DeviceOut,
        clock: &DpClock,
    ) -> std::result::Result<Served, RpcError> {
        let chunk = DEFAULT_DEVICE_STAGING.chunk;
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
        let ph = clock.phase();
        copy_out(0).map_err(copy_out_error)?;
        for i in 0..n {
            let (off, l) = piece(i);
            let desc = bounce_desc(&bounce[i % 2], wkey, off, l);
            let send = self
                .comm
                .transfer(&call.peer.ep, Op::Write, &desc, ph.deadline);
            let next = async {
                if i + 1 < n {
                    copy_out(i + 1)?;
                }
                Ok::<(), Error>(())
            };
            let (sent, copied) = futures::join!(send, next);
            if let Err(e) = sent {
                return Err(self.failed(call, region, &ph, "writing the response", e));
            }
            copied.map_err(copy_out_error)?;
        }
        Counters::bump(&self.counters.buffer_responses);
        Ok(Served::InBuffer(total as u64))
    }

    /// The key to the client's response `region` (imported once per peer).
    fn response_key(
        &self,
        peer: &Peer<C>,
        region: &RemoteRegion,
    ) -> std::result::Result<Arc<C::RemoteKey>, RpcError> {
        self.key(peer, region)
            .map_err(|e| dp_error(format!("importing the response region: {e}")))
    }

    /// The DATA_PLANE answer for a transfer of `call` on `region` that failed with `e`
    /// while `what`; the cached key (and, unless the key alone was at fault, the endpoint)
    /// is dropped first.
    fn failed(
        &self,
        call: &OpenCall<C>,
        region: &RemoteRegion,
        ph: &Phase,
        what: &str,
        e: Error,
    ) -> RpcError {
        self.on_transfer_error(&call.d.reply_to, &call.peer, region, &e);
        ph.error(&self.config, what, e)
    }

    /// Writes `resp` into the client's response region through a view
    /// ([`Communicator::view`]) where the transport has it mapped, [`IN_PLACE_CHUNK`] bytes
    /// at a time with the deadline checked between them. `Ok(false)`: not mapped here;
    /// WRITE it.
    async fn write_in_place(
        &self,
        peer: &Peer<C>,
        wkey: &C::RemoteKey,
        resp: &[u8],
        ph: &Phase,
    ) -> Result<bool> {
        let Some(view) = self
            .comm
            .view(&peer.ep, wkey, 0, resp.len(), Access::WRITE)?
        else {
            return Ok(false);
        };
        let started = Instant::now();
        for (i, piece) in resp.chunks(IN_PLACE_CHUNK).enumerate() {
            if ph.deadline.is_expired() {
                return Err(Error::DeadlineExceeded {
                    during: "writing the response in place",
                    elapsed: started.elapsed(),
                });
            }
            if i > 0 {
                tokio::task::yield_now().await;
            }
            view.write(i * IN_PLACE_CHUNK, piece)?;
        }
        Ok(true)
    }

    pub(super) fn on_transfer_error(
        &self,
        addr: &PeerAddr,
        peer: &Peer<C>,
        region: &RemoteRegion,
        e: &Error,
    ) {
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
    fn transport_wire_id(&self) -> u16 {
        u16::from(self.comm.transport().wire_id())
    }

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
            let clock = DpClock::new(deadline, self.config.timeout);
            let served = match work {
                Work::Bytes { run, in_place } => {
                    self.serve_inner(conn, desc, len, clock, run, in_place)
                        .await
                }
                Work::Device(ctx, route) => {
                    self.serve_device_inner(conn, desc, len, clock, ctx, route)
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

/// Bytes of a response written in place between checks of the deadline (and yields).
const IN_PLACE_CHUNK: usize = 4 << 20;

/// `Bytes` owner over a view of the client's request region; dropping the last clone ends
/// the view, and with it the key's use the client's rekey waits for.
struct ViewBytes(hmc_core::RemoteView);

impl AsRef<[u8]> for ViewBytes {
    fn as_ref(&self) -> &[u8] {
        // Asked for READ: `as_slice` cannot refuse it.
        self.0.as_slice().unwrap_or(&[])
    }
}

/// `Bytes` owner over a pooled buffer also used as the response source.
pub(super) struct SharedView<C: Communicator> {
    pub(super) buf: Arc<PooledBuffer<C>>,
    pub(super) len: usize,
}

impl<C: Communicator> AsRef<[u8]> for SharedView<C> {
    fn as_ref(&self) -> &[u8] {
        self.buf.as_slice(self.len).unwrap_or(&[])
    }
}
