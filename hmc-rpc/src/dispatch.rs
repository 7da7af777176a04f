//! The method table: typed and raw handlers, async and blocking, each seeing its call's
//! remaining deadline and a cancellation signal.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::BoxFuture;
use hmc_backend_cpu::HostMemory;
use hmc_core::{AnyBuffer, AnyMemory, DeviceBuffer, MemSpan, MemSpanMut, Memory};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, mpsc};

use crate::codec::RpcCodec;
use crate::device::{self, DEFAULT_DEVICE_STAGING, DeviceSink, StagingRing};
use crate::frame::{INLINE_MAX, Status};
use crate::proto::{IdMap, StagedPayload, StreamSink};

/// A handler's failure: a status for the wire and a message for the caller.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct RpcError {
    /// The status sent back (application codes start at 1000).
    pub status: Status,
    /// Human-readable explanation, sent as the response payload.
    pub message: String,
}

impl RpcError {
    /// An error with `status` and `message`.
    pub fn new(status: Status, message: impl Into<String>) -> Self {
        RpcError {
            status,
            message: message.into(),
        }
    }

    /// A `BAD_PAYLOAD` error.
    pub fn bad_payload(message: impl Into<String>) -> Self {
        Self::new(Status::BAD_PAYLOAD, message)
    }
}

/// A cancellation signal shared by the runtime and one handler. Idempotent.
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<CancelInner>);

#[derive(Debug, Default)]
struct CancelInner {
    cancelled: AtomicBool,
    notify: Notify,
}

impl CancelToken {
    /// A fresh, uncancelled token.
    pub fn new() -> Self {
        Self::default()
    }

    /// Signals cancellation; wakes every waiter.
    pub fn cancel(&self) {
        if !self.0.cancelled.swap(true, Ordering::AcqRel) {
            self.0.notify.notify_waiters();
        }
    }

    /// True once cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.0.cancelled.load(Ordering::Acquire)
    }

    /// Completes when cancelled.
    pub async fn cancelled(&self) {
        loop {
            let n = self.0.notify.notified();
            if self.is_cancelled() {
                return;
            }
            n.await;
        }
    }
}

/// The connection a call came on, as the server knows it: shared by every call of that
/// connection, so a handler can tie what one call established (the engine's peer name at
/// its metadata request) to the calls after it.
#[derive(Clone, Debug)]
pub struct Connection(Arc<ConnectionInfo>);

#[derive(Debug)]
struct ConnectionInfo {
    id: u64,
    peer: String,
    peer_ip: Option<std::net::IpAddr>,
    authenticated: bool,
    label: std::sync::OnceLock<String>,
    /// Calls of this connection holding a `max_inflight_total` permit.
    calls: std::sync::atomic::AtomicUsize,
}

impl Connection {
    /// A connection numbered `id` from `peer` (its address, or a Unix peer's uid).
    pub(crate) fn new(
        id: u64,
        peer: String,
        peer_ip: Option<std::net::IpAddr>,
        authenticated: bool,
    ) -> Self {
        Connection(Arc::new(ConnectionInfo {
            id,
            peer,
            peer_ip,
            authenticated,
            label: std::sync::OnceLock::new(),
            calls: std::sync::atomic::AtomicUsize::new(0),
        }))
    }

    /// Unique among the server's connections.
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// Who is at the other end, as the socket says (`tcp://IP:PORT`, `unix (uid N)`).
    pub fn peer(&self) -> &str {
        &self.0.peer
    }

    /// A TCP peer's IP address.
    pub fn peer_ip(&self) -> Option<std::net::IpAddr> {
        self.0.peer_ip
    }

    /// Whether the peer proved it holds the server's `auth_secret`.
    pub fn authenticated(&self) -> bool {
        self.0.authenticated
    }

    /// The label a handler gave this connection ([`Connection::set_label`]).
    pub fn label(&self) -> Option<&str> {
        self.0.label.get().map(String::as_str)
    }

    /// Labels the connection once (what a peer said it is, checked by the handler); a
    /// second label is refused with the first. Lives as long as the connection.
    pub fn set_label(&self, label: String) -> Result<(), &str> {
        match self.0.label.set(label) {
            Ok(()) => Ok(()),
            Err(_) => Err(self.0.label.get().map(String::as_str).unwrap_or_default()),
        }
    }

    /// Calls of this connection in flight (holding a `max_inflight_total` permit).
    pub(crate) fn calls(&self) -> usize {
        self.0.calls.load(Ordering::Relaxed)
    }

    /// Counts a call in; `true` when it is the connection's only one (it became active).
    pub(crate) fn call_started(&self) -> bool {
        self.0.calls.fetch_add(1, Ordering::AcqRel) == 0
    }

    /// Counts a call out; `true` when it was the last (the connection is idle again).
    pub(crate) fn call_ended(&self) -> bool {
        self.0.calls.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// A connection for calls made without a server (tests, in-process dispatch).
    pub fn detached() -> Self {
        Connection::new(0, "detached".into(), None, false)
    }
}

/// What a handler knows about its call.
#[derive(Clone, Debug)]
pub struct CallContext {
    /// The connection the call came on.
    pub connection: Connection,
    /// The request id on its connection.
    pub request_id: u64,
    /// The method called.
    pub method_id: u32,
    /// When the client stops waiting, if it said.
    pub deadline: Option<Instant>,
    /// Fires when the client cancels, the deadline passes or the connection goes away.
    pub cancel: CancelToken,
}

impl CallContext {
    /// Time left before the deadline (`None`: no deadline; zero: already passed).
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// True once the call was cancelled or timed out; a long handler should check it.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }
}

/// The result of a handler: response bytes or an error status.
pub type HandlerResult = Result<Bytes, RpcError>;
type BoxFut = Pin<Box<dyn Future<Output = HandlerResult> + Send>>;
pub(crate) type AsyncFn = dyn Fn(CallContext, Bytes) -> BoxFut + Send + Sync;
pub(crate) type BlockingFn = dyn Fn(&CallContext, Bytes) -> HandlerResult + Send + Sync;

/// How a method runs.
#[derive(Clone)]
pub enum Handler {
    /// A future spawned on the runtime.
    Async(Arc<AsyncFn>),
    /// A function run on the server's fixed pool of blocking worker threads.
    Blocking(Arc<BlockingFn>),
}

/// The request of a device method as the server has it.
pub(crate) enum DeviceRequest {
    /// Whole in host memory (INLINE).
    Host(Bytes),
    /// Put into device memory by the method's sink as it arrived (TCP_STREAM DATA chunks,
    /// or chunks the data plane pulled).
    Staged(StagedPayload),
}

/// The response of a device method.
pub(crate) enum DeviceReply {
    /// Small enough to send INLINE: copied to host memory whole.
    Host(Bytes),
    /// `len` bytes produced chunk by chunk (or the producer's error).
    Fed {
        len: u64,
        pieces: mpsc::UnboundedReceiver<hmc_core::Result<Bytes>>,
    },
}

/// A device method's response where it lies: the buffer and its memory in core's erased
/// forms, copied out piece by piece (the data plane WRITEs one piece while the next is
/// copied).
pub(crate) struct DeviceOut {
    pub(crate) memory: AnyMemory,
    pub(crate) buf: AnyBuffer,
}

impl DeviceOut {
    /// Bytes.
    pub(crate) fn len(&self) -> usize {
        self.buf.region().len
    }

    /// Copies `dst.len()` bytes from `offset` into `dst` (host memory).
    pub(crate) fn copy_out(&self, offset: usize, dst: &mut MemSpanMut<'_>) -> hmc_core::Result<()> {
        self.memory
            .copy(dst, &MemSpan::of(&self.buf).slice(offset, dst.len())?)
    }
}

/// The streaming side of a method registered with [`Dispatcher::register_device`]: where
/// its streamed requests go, and how it runs on them.
pub(crate) trait DeviceRoute: Send + Sync {
    /// A sink for a `len`-byte streamed request.
    fn sink(&self, len: u64) -> Box<dyn StreamSink>;
    /// Runs the handler; a response above the INLINE size is produced in chunks.
    fn run(
        &self,
        ctx: CallContext,
        request: DeviceRequest,
    ) -> BoxFuture<'static, Result<DeviceReply, RpcError>>;
    /// Runs the handler and hands back its response where it lies (the data plane's path).
    fn run_raw(
        &self,
        ctx: CallContext,
        request: DeviceRequest,
    ) -> BoxFuture<'static, Result<DeviceOut, RpcError>>;
}

struct DeviceMethod<M: Memory, H: Memory, F> {
    memory: Arc<M>,
    ring: Arc<StagingRing<H>>,
    handler: Arc<F>,
}

fn device_error(what: &str, e: hmc_core::Error) -> RpcError {
    RpcError::new(
        Status::INTERNAL,
        format!("{what} on the handler's device: {e}"),
    )
}

impl<M, H, F, Fut> DeviceRoute for DeviceMethod<M, H, F>
where
    M: Memory,
    H: Memory,
    F: Fn(CallContext, M::Buffer) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<M::Buffer, RpcError>> + Send + 'static,
{
    fn sink(&self, len: u64) -> Box<dyn StreamSink> {
        DeviceSink::boxed(self.memory.clone(), len)
    }

    fn run(
        &self,
        ctx: CallContext,
        request: DeviceRequest,
    ) -> BoxFuture<'static, Result<DeviceReply, RpcError>> {
        let running = self.start(ctx, request);
        let memory = self.memory.clone();
        let ring = self.ring.clone();
        Box::pin(async move {
            let out = running?.await?;
            if out.len() <= INLINE_MAX {
                let host = device::download(&*memory, &MemSpan::of(&out))
                    .map_err(|e| device_error("staging the response", e))?;
                return Ok(DeviceReply::Host(Bytes::from(host)));
            }
            let (tx, rx) = mpsc::unbounded_channel();
            let len = out.len() as u64;
            tokio::spawn(async move {
                let r = device::produce(&*memory, &MemSpan::of(&out), &ring, |piece| {
                    tx.send(Ok(piece)).is_ok()
                })
                .await;
                if let Err(e) = r {
                    let _ = tx.send(Err(e));
                }
            });
            Ok(DeviceReply::Fed { len, pieces: rx })
        })
    }

    fn run_raw(
        &self,
        ctx: CallContext,
        request: DeviceRequest,
    ) -> BoxFuture<'static, Result<DeviceOut, RpcError>> {
        let running = self.start(ctx, request);
        let memory = self.memory.clone();
        Box::pin(async move {
            let buf = AnyBuffer::of(&*memory, running?.await?);
            Ok(DeviceOut {
                memory: AnyMemory::from_arc(memory),
                buf,
            })
        })
    }
}

impl<M, H, F, Fut> DeviceMethod<M, H, F>
where
    M: Memory,
    H: Memory,
    F: Fn(CallContext, M::Buffer) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<M::Buffer, RpcError>> + Send + 'static,
{
    /// Puts the request on the device and starts the handler on it.
    fn start(&self, ctx: CallContext, request: DeviceRequest) -> Result<Fut, RpcError> {
        let staged = match request {
            DeviceRequest::Host(b) => device::upload(&*self.memory, &b),
            DeviceRequest::Staged(p) => device::take_staged::<M>(p),
        }
        .map_err(|e| device_error("staging the request", e))?;
        Ok((self.handler)(ctx, staged))
    }
}

/// Method id → handler.
///
/// # Cancellation
///
/// A call ends early when the client cancels it (drops its future), its deadline passes,
/// or its connection goes away. Then, always in this order:
///
/// 1. The call's [`CallContext::cancel`] token fires, and the client is answered
///    (`DEADLINE_EXCEEDED` or `CANCELLED`) without waiting for the handler.
/// 2. An async handler is polled on for up to
///    [`ServerConfig::handler_cancel_grace`](crate::ServerConfig::handler_cancel_grace)
///    (100 ms): a handler that awaits `ctx.cancel.cancelled()` (in a `select!` beside its
///    work) runs its cancel branch every time, and whatever it returns is discarded.
/// 3. A handler still running after the grace is dropped at its current `.await`: put
///    cleanup that must happen even then in a `Drop` guard, not after an `.await`.
///
/// Blocking handlers are never interrupted: they check [`CallContext::is_cancelled`] or
/// [`CallContext::remaining`] themselves, and their answer is discarded.
///
/// ```no_run
/// use hmc_rpc::{Dispatcher, RpcError, Status};
///
/// let mut d = Dispatcher::new();
/// d.register(7, |ctx, n: u64| async move {
///     tokio::select! {
///         _ = tokio::time::sleep(std::time::Duration::from_millis(n)) => Ok(n),
///         // Runs whenever the call is cancelled or expires while the sleep is pending.
///         _ = ctx.cancel.cancelled() => Err(RpcError::new(Status::CANCELLED, "gave up")),
///     }
/// });
/// ```
///
/// # Typed methods: what to know
///
/// - **Byte fields.** serde hands a `Vec<u8>` (or `[u8]`) field to [`RpcCodec`] as a
///   sequence, one byte at a time, while a field marked `#[serde(with = "serde_bytes")]`,
///   a `serde_bytes::ByteBuf`, or a `bytes::Bytes` (with `bytes`' `serde` feature) goes
///   as one byte string: the same bytes on the wire, encoded and decoded as one copy
///   instead of a serde call per byte, which dominates a call's cost for large fields.
///   For payloads
///   that are bytes only, skip the codec: [`Dispatcher::register_raw`] and
///   [`Client::call`](crate::Client::call) move [`Bytes`] without a copy.
/// - **No type tag on the wire.** A typed payload is its fields, nothing else: the method
///   id is the only thing that says which type it is. The codec refuses a payload with
///   bytes left over or too few, which catches most mismatches, but a request of another
///   type with the same layout (`u64` vs `i64`, two structs of the same fields) decodes
///   "successfully". Give every request type its own method id, and when a type changes
///   shape, give it a new id (or make its first field a version or schema number your
///   handler checks).
/// - **Where handlers run.** A handler that is ready at once is answered on the
///   connection's task; one that waits is spawned. Long CPU work belongs in
///   [`Dispatcher::register_blocking`], which runs on the server's worker pool.
#[derive(Clone, Default)]
pub struct Dispatcher {
    methods: IdMap<u32, Handler>,
    devices: IdMap<u32, Arc<dyn DeviceRoute>>,
    /// Methods registered with [`Dispatcher::register_raw_in_place`].
    in_place: IdMap<u32, ()>,
}

impl Dispatcher {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    fn insert(&mut self, id: u32, h: Handler) -> &mut Self {
        self.devices.remove(&id);
        self.in_place.remove(&id);
        if self.methods.insert(id, h).is_some() {
            tracing::warn!(
                method_id = id,
                "method registered twice; the last registration wins"
            );
        }
        self
    }

    /// A typed async method: the request is decoded with [`RpcCodec`] (failures answer
    /// `BAD_PAYLOAD`), the response encoded with it.
    pub fn register<Req, Resp, F, Fut>(&mut self, id: u32, handler: F) -> &mut Self
    where
        Req: DeserializeOwned + Send + 'static,
        Resp: Serialize + Send + 'static,
        F: Fn(CallContext, Req) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Resp, RpcError>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        self.insert(
            id,
            Handler::Async(Arc::new(move |ctx, bytes: Bytes| {
                let handler = handler.clone();
                Box::pin(async move {
                    let req: Req = RpcCodec::decode(&bytes).map_err(|e| {
                        RpcError::bad_payload(format!("request of method {id}: {e}"))
                    })?;
                    let resp = handler(ctx, req).await?;
                    encode_response(&resp)
                })
            })),
        )
    }

    /// A typed blocking method, run on the worker pool.
    pub fn register_blocking<Req, Resp, F>(&mut self, id: u32, handler: F) -> &mut Self
    where
        Req: DeserializeOwned + Send + 'static,
        Resp: Serialize + Send + 'static,
        F: Fn(&CallContext, Req) -> Result<Resp, RpcError> + Send + Sync + 'static,
    {
        self.insert(
            id,
            Handler::Blocking(Arc::new(move |ctx: &CallContext, bytes: Bytes| {
                let req: Req = RpcCodec::decode(&bytes)
                    .map_err(|e| RpcError::bad_payload(format!("request of method {id}: {e}")))?;
                encode_response(&handler(ctx, req)?)
            })),
        )
    }

    /// A method whose handler works on device memory of `memory` (any [`Memory`]
    /// backend): the handler gets the request in a new device buffer and returns the
    /// response in one. Staging goes through a ring of plain host memory
    /// ([`DEFAULT_DEVICE_STAGING`]); [`Dispatcher::register_device_staged`] takes pinned
    /// memory. An allocation or copy failure answers `INTERNAL` naming the device error.
    pub fn register_device<M, F, Fut>(&mut self, id: u32, memory: Arc<M>, handler: F) -> &mut Self
    where
        M: Memory,
        F: Fn(CallContext, M::Buffer) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<M::Buffer, RpcError>> + Send + 'static,
    {
        let ring = StagingRing::new(Arc::new(HostMemory::new()), DEFAULT_DEVICE_STAGING)
            .expect("the default staging settings are valid host memory");
        self.register_device_staged(id, memory, ring, handler)
    }

    /// [`Dispatcher::register_device`] with the staging buffers of `ring` (make it of the
    /// backend's pinned host memory, e.g. `CudaMemory::pinned()`).
    ///
    /// A request streamed TCP_STREAM is copied to the device chunk by chunk as it arrives
    /// (never whole in host memory); a response above the INLINE size is copied out chunk
    /// by chunk into the staging buffers, each chunk going to the socket while the next is
    /// copied. Requests pulled over the data plane (HMC_BUFFER) are staged whole.
    pub fn register_device_staged<M, H, F, Fut>(
        &mut self,
        id: u32,
        memory: Arc<M>,
        ring: Arc<StagingRing<H>>,
        handler: F,
    ) -> &mut Self
    where
        M: Memory,
        H: Memory,
        F: Fn(CallContext, M::Buffer) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<M::Buffer, RpcError>> + Send + 'static,
    {
        let route = Arc::new(DeviceMethod {
            memory,
            ring,
            handler: Arc::new(handler),
        });
        // The whole-payload path, for requests the data plane pulled into host memory.
        let whole = route.clone();
        self.register_raw(id, move |ctx, payload: Bytes| {
            let reply = whole.run(ctx, DeviceRequest::Host(payload));
            async move {
                match reply.await? {
                    DeviceReply::Host(b) => Ok(b),
                    DeviceReply::Fed { len, mut pieces } => {
                        let mut out = Vec::with_capacity(len as usize);
                        while let Some(piece) = pieces.recv().await {
                            let piece =
                                piece.map_err(|e| device_error("staging the response", e))?;
                            out.extend_from_slice(&piece);
                        }
                        Ok(Bytes::from(out))
                    }
                }
            }
        });
        self.devices.insert(id, route);
        self
    }

    /// The streaming side of a device method.
    pub(crate) fn device_route(&self, id: u32) -> Option<&Arc<dyn DeviceRoute>> {
        self.devices.get(&id)
    }

    /// True when some method is a device method.
    pub(crate) fn has_device_routes(&self) -> bool {
        !self.devices.is_empty()
    }

    /// A raw-bytes async method.
    pub fn register_raw<F, Fut>(&mut self, id: u32, handler: F) -> &mut Self
    where
        F: Fn(CallContext, Bytes) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        self.insert(
            id,
            Handler::Async(Arc::new(move |ctx, bytes| Box::pin(handler(ctx, bytes)))),
        )
    }

    /// A raw-bytes async method whose request may be handed to it in place: over a data
    /// plane that maps the client's memory (shared memory,
    /// [`hmc_core::Communicator::view`]), the payload is a view of the client's request
    /// buffer instead of a copy READ into a server buffer.
    ///
    /// The view is for the call: the client lent the buffer for it, and its next use of
    /// the buffer (after rekeying it) waits until every clone of the payload is dropped.
    /// Copy what you keep past the call (`Bytes::copy_from_slice`); a payload kept longer
    /// makes the client's rekey wait up to its transport's revoke timeout and then drop
    /// the buffer instead of reusing it. Where the request cannot be viewed (another
    /// transport, a region not mapped yet, TCP_STREAM or INLINE), the payload is an
    /// ordinary copy, as for [`Dispatcher::register_raw`].
    pub fn register_raw_in_place<F, Fut>(&mut self, id: u32, handler: F) -> &mut Self
    where
        F: Fn(CallContext, Bytes) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        self.register_raw(id, handler);
        self.in_place.insert(id, ());
        self
    }

    /// True when `id`'s handler takes its request in place
    /// ([`Dispatcher::register_raw_in_place`]).
    pub(crate) fn takes_in_place(&self, id: u32) -> bool {
        self.in_place.contains_key(&id)
    }

    /// A raw-bytes blocking method, run on the worker pool.
    pub fn register_raw_blocking<F>(&mut self, id: u32, handler: F) -> &mut Self
    where
        F: Fn(&CallContext, Bytes) -> HandlerResult + Send + Sync + 'static,
    {
        self.insert(id, Handler::Blocking(Arc::new(handler)))
    }

    /// The handler of `id`.
    pub fn get(&self, id: u32) -> Option<&Handler> {
        self.methods.get(&id)
    }

    /// Registered method ids, sorted.
    pub fn method_ids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.methods.keys().copied().collect();
        v.sort_unstable();
        v
    }
}

fn encode_response<T: Serialize>(v: &T) -> HandlerResult {
    RpcCodec::encode(v)
        .map(Bytes::from)
        .map_err(|e| RpcError::new(Status::INTERNAL, format!("encoding the response: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> CallContext {
        CallContext {
            connection: Connection::detached(),
            request_id: 1,
            method_id: 1,
            deadline: Some(Instant::now() + Duration::from_secs(5)),
            cancel: CancelToken::new(),
        }
    }

    #[tokio::test]
    async fn typed_handler_decodes_request_and_encodes_response() {
        let mut d = Dispatcher::new();
        d.register(7, |_ctx, (a, b): (u32, u32)| async move { Ok(a + b) });
        let Some(Handler::Async(h)) = d.get(7) else {
            panic!("registered as async")
        };
        let req = Bytes::from(RpcCodec::encode(&(2u32, 3u32)).unwrap());
        let out = h(ctx(), req).await.unwrap();
        assert_eq!(RpcCodec::decode::<u32>(&out).unwrap(), 5);
        let bad = h(ctx(), Bytes::from_static(&[1])).await.unwrap_err();
        assert_eq!(bad.status, Status::BAD_PAYLOAD);
    }

    #[test]
    fn blocking_handler_sees_deadline_and_cancel() {
        let mut d = Dispatcher::new();
        d.register_raw_blocking(1, |ctx, _| {
            assert!(ctx.remaining().unwrap() > Duration::from_secs(1));
            if ctx.is_cancelled() {
                Err(RpcError::new(Status::CANCELLED, "stopped"))
            } else {
                Ok(Bytes::new())
            }
        });
        let Some(Handler::Blocking(h)) = d.get(1) else {
            panic!("registered as blocking")
        };
        let c = ctx();
        assert!(h(&c, Bytes::new()).is_ok());
        c.cancel.cancel();
        assert_eq!(h(&c, Bytes::new()).unwrap_err().status, Status::CANCELLED);
        assert_eq!(d.method_ids(), vec![1]);
    }

    #[tokio::test]
    async fn cancel_token_wakes_waiters_once_cancelled() {
        let t = CancelToken::new();
        let t2 = t.clone();
        let w = tokio::spawn(async move { t2.cancelled().await });
        tokio::task::yield_now().await;
        t.cancel();
        t.cancel();
        w.await.unwrap();
        assert!(t.is_cancelled());
    }
}
