//! The HMC_BUFFER data plane: `Server<C>`/`Client<C>` take an optional `C: Communicator`
//! that moves large payloads one-sided; [`NoDataPlane`] is the always-built empty one.
//!
//! Who does what (normative text in `docs/protocol.md`, "HMC_BUFFER"): the client copies a
//! request payload of at least [`DataPlaneConfig::threshold`] bytes into a pooled registered
//! buffer, lends a second pooled buffer for the response, and sends only a descriptor (its
//! data-plane address and both regions). The server connects to that address if the dial
//! rule allows it (`check_dial`: the RPC peer's own IP, on this host its own user's
//! socket, or `--data-plane-allow`; one cached endpoint per client address), READs the
//! payload into its own pooled buffer within `data_plane_timeout`, runs the
//! handler, WRITEs a large response into the client's response region and answers
//! RESPONSE/HMC_BUFFER with the length. A response that does not fit goes back as
//! TCP_STREAM. No tag matching, and no lock is held across a transfer.
//!
//! Copies per call: the server's READ and WRITE move the bytes once each way. The client
//! copies the request into a pooled buffer, unless the caller wrote it there in the first
//! place ([`ClientDataPlane::request_buffer`]); the response reaches the caller as a view
//! of the pooled response buffer, without a copy. Where the transport maps the client's
//! buffers ([`hmc_core::Communicator::view`]: shared memory, from a buffer's second use
//! on), a handler registered with
//! [`Dispatcher::register_raw_in_place`](crate::Dispatcher::register_raw_in_place) reads
//! the request in place (no READ), and a large response is copied once, straight into the
//! client's response region (no WRITE from a server buffer): an echo costs one copy on
//! the server instead of two.
//!
//! Device methods ([`crate::Dispatcher::register_device`]) take a pipelined path on the
//! server: the payload is READ a chunk at a time into one of two pooled bounce buffers
//! while the previous chunk is copied to the device, and a large response is copied off
//! the device a chunk at a time while the previous chunk is WRITTEN, so device copies and
//! transfers overlap and two chunk-sized buffers serve any payload size.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use hmc_core::{BoxFuture, PeerAddr};
use parking_lot::Mutex;

use crate::dispatch::{CallContext, DeviceRoute, HandlerResult};
mod client;
mod descriptor;
mod dial;
mod server;

pub use client::ClientDataPlane;
pub(crate) use client::PreparedCall;
pub use dial::DataPlaneAllow;
pub(crate) use dial::RpcPeer;
pub(crate) use server::{ServerDp, ServerPlane};

use crate::pool::{PoolConfig, PoolStats};

/// Data-plane settings shared by server and client. Every limit has a default and a name.
#[derive(Clone, Debug)]
pub struct DataPlaneConfig {
    /// Payloads of at least this many bytes move over the data plane
    /// (`data_plane_threshold`, default 64 KiB; `--data-plane-threshold`, formerly
    /// `--ucx-threshold`). Smaller ones travel INLINE or TCP_STREAM.
    pub threshold: usize,
    /// The registered buffer pool (`max_pool_bytes`, …).
    pub pool: PoolConfig,
    /// Server: cached data-plane endpoints, one per client data-plane address
    /// (`max_data_plane_peers`, default 1024); the cache is cleared when it is full.
    pub max_peers: usize,
    /// Server: imported remote keys cached per endpoint (`max_keys_per_peer`, default 256).
    pub max_keys_per_peer: usize,
    /// Server: the longest one call's data-plane work may hold its in-flight slot
    /// (`data_plane_timeout`, default 5 s; `--data-plane-timeout-ms`): connecting, importing,
    /// READing the request and WRITING the response together end by the earlier of the
    /// call's deadline and this much data-plane time (the handler's own time not counted).
    /// A data-plane peer that stays silent fails that call with DATA_PLANE.
    pub timeout: Duration,
    /// Server: data-plane addresses dialled without the default rule (`data_plane_allow`,
    /// default none; `--data-plane-allow`, repeatable). By default a descriptor's address
    /// is dialled only when it is the RPC peer's own IP (and, on this host, a socket of
    /// the RPC peer's user); see [`DataPlaneAllow`] and `docs/protocol.md`, "HMC_BUFFER".
    pub allow: Vec<DataPlaneAllow>,
}

impl Default for DataPlaneConfig {
    fn default() -> Self {
        DataPlaneConfig {
            threshold: 64 << 10,
            pool: PoolConfig::default(),
            max_peers: 1024,
            max_keys_per_peer: 256,
            timeout: Duration::from_secs(5),
            allow: Vec::new(),
        }
    }
}

/// Data-plane counters of a server or client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataPlaneStats {
    /// Calls whose request moved over the data plane.
    pub buffer_calls: u64,
    /// Client: of those, calls whose payload was a [`RequestBuffer`](crate::pool::RequestBuffer) lent as is (no copy).
    pub lent_requests: u64,
    /// Responses written one-sided into a client's region.
    pub buffer_responses: u64,
    /// Server: requests handed to their handler as a view of the client's buffer
    /// ([`Dispatcher::register_raw_in_place`](crate::Dispatcher::register_raw_in_place)),
    /// not READ.
    pub viewed_requests: u64,
    /// Server: of `buffer_responses`, those copied straight into the client's mapped
    /// response region ([`hmc_core::Communicator::view`]), not WRITTEN from a local buffer.
    pub viewed_responses: u64,
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
    viewed_requests: AtomicU64,
    viewed_responses: AtomicU64,
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
            viewed_requests: self.viewed_requests.load(Ordering::Relaxed),
            viewed_responses: self.viewed_responses.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            endpoints: 0,
            pool,
        }
    }
}

/// How the server answers an HMC_BUFFER call.
pub(crate) enum Served {
    /// An ordinary answer (INLINE or TCP_STREAM, or an error status).
    Answer(HandlerResult),
    /// The response (this many bytes) is in the client's response region.
    InBuffer(u64),
}

/// Runs the handler on the pulled payload.
pub(crate) type RunHandler = Box<dyn FnOnce(Bytes) -> BoxFuture<'static, HandlerResult> + Send>;

/// What an HMC_BUFFER call runs on its payload.
pub(crate) enum Work {
    /// A handler of host bytes: the payload is pulled whole into a pooled buffer, or,
    /// for a handler that takes it `in_place` where the transport maps the client's
    /// request region ([`hmc_core::Communicator::view`]), handed over as a view of it.
    Bytes {
        /// The handler.
        run: RunHandler,
        /// The handler was registered with
        /// [`Dispatcher::register_raw_in_place`](crate::Dispatcher::register_raw_in_place).
        in_place: bool,
    },
    /// A device method: the payload is pulled chunk by chunk, each chunk copied to the
    /// device while the next is read, and a large response is copied out chunk by chunk,
    /// each chunk WRITTEN while the next is copied.
    Device(CallContext, Arc<dyn DeviceRoute>),
}

/// The data-plane addresses one RPC connection's calls used. A cached endpoint lives while
/// some open RPC connection uses it, so connect/call/disconnect cycles leave nothing behind.
/// It also carries who is at the other end of the RPC connection, for the dial rule.
#[derive(Default)]
pub(crate) struct ConnUse {
    /// `None` once the connection has closed. An address in the set passed the dial rule
    /// for this connection.
    addrs: Mutex<Option<std::collections::HashSet<PeerAddr>>>,
    peer: RpcPeer,
}

impl ConnUse {
    /// For an RPC connection whose other end is `peer` ([`crate::net`]'s `rpc_peer`).
    pub(crate) fn for_peer(peer: RpcPeer) -> Self {
        ConnUse {
            addrs: Mutex::new(Some(Default::default())),
            peer,
        }
    }
}

/// The server's and client's default data plane: none. It is core's always-built empty
/// communicator ([`hmc_core::NoCommunicator`]), every operation of which reports
/// [`hmc_core::Error::Unavailable`]; it keeps the generic code honest without a transport.
pub type NoDataPlane = hmc_core::NoCommunicator;

/// The registration type of [`NoDataPlane`] (never constructed).
pub use hmc_core::NoRegistration;

#[cfg(test)]
mod tests {
    use hmc_core::{Communicator, Deadline, Error};

    #[tokio::test]
    async fn the_default_data_plane_reports_unavailable_with_a_hint() {
        let d = hmc_core::NoCommunicator;
        let e = d
            .connect(&d.address(), Deadline::default())
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Unavailable { .. }), "{e}");
        assert!(e.to_string().contains("Communicator"), "{e}");
        assert!(d.recv_notification(Deadline::default()).await.is_err());
    }
}
