//! `TcpCommunicator`: one-sided READ/WRITE and notifications over TCP or Unix sockets, for hosts without UCX or RDMA.
//!
//! The initiator side lives here; the target side (the responder that serves peers'
//! requests against this process's registrations) lives in [`crate::responder`].
//!
//! Each endpoint keeps a small pool of connections (`crate::endpoint`). A transfer
//! (`crate::request`) takes one connection for its whole batch and does its I/O inside
//! the transfer future, straight between the socket and the registered memory. Dropping
//! the future therefore stops every access to the local buffers at once; the connection
//! it held is reset rather than returned, so a half-finished request never confuses the
//! next one.
//!
//! # An early end is final after `settle`
//!
//! A WRITE given up half-way resets its connection; the endpoint remembers the
//! connection's local address. [`Communicator::settle`] then sends the target an ABANDON
//! naming each such connection (over another connection of the endpoint) and waits for the
//! answers: once it returns `Ok`, the target applies no more of those WRITEs, even bytes
//! its socket already held (see `crate::abandon`). A target of an older version does not
//! know the request, and a stopped one does not answer: `settle` then returns an error
//! that says so, and keeps the connections to try again at the next `settle`.
//!
//! # Who may notify
//!
//! A target takes a notification only from a peer it granted access: `notify` sends the
//! key of the region imported last on the endpoint (the target checks it like a READ or
//! WRITE key: a deregistered or rekeyed one is refused as `InvalidKey`), or, without an
//! imported key, needs a connection that passed the pre-shared-secret authentication
//! ([`TcpConfig::auth_secret`]). Otherwise the sender gets `AccessDenied` saying so.
//!
//! # Revoking keys
//!
//! [`Communicator::rekey`] replaces a registration's random token in place, so the keys
//! exported before stop working while the memory stays registered: a pooled buffer can
//! get a fresh key for each use.

use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hmc_core::{
    Access, AnyMemory, CommCapabilities, Communicator, Deadline, Error, Memory, Notification, Op,
    PeerAddr, Region, RemoteRegion, Result, TransferDesc, TransportId,
};
use hmc_transport_kit::registry::Registry;
use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::TcpConfig;
use crate::endpoint::{EndpointInner, TcpEndpoint, Unfinished, dial};
use crate::net::Listener;
use crate::registration::{TcpRegistration, TcpRemoteKey};
use crate::request::{self, broken, check_batch};
use crate::staged::{StagingPool, StagingStats};
use crate::state::{Counters, Notifications, Shared, Tasks};
use crate::wait::Watched;
use crate::wire::{self, KEY_LEN, TOKEN_LEN};

/// What a [`TcpCommunicator`] has done and holds, for monitoring and tests
/// ([`TcpCommunicator::stats`]). Counts are since `bind`; "now" fields are a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TcpStats {
    /// Connections the responder admitted (HELLO, and authentication when configured, passed).
    pub accepted_connections: u64,
    /// Admitted connections open now.
    pub open_connections: u64,
    /// Connections closed because they sent no HELLO (or did not finish authenticating)
    /// within `hello_timeout`.
    pub closed_hello_timeout: u64,
    /// Connections closed after `idle_timeout` without a request.
    pub closed_idle_timeout: u64,
    /// Connections closed because a request did not arrive (or did not progress) within
    /// `request_timeout`.
    pub closed_request_timeout: u64,
    /// NOTIFY requests refused (no or a bad key, too long, or a pending budget full).
    pub refused_notifications: u64,
    /// Notifications received and not yet taken by `recv_notification`.
    pub pending_notifications: u64,
    /// Bytes of those notifications.
    pub pending_notification_bytes: u64,
    /// Connections refused because the peer failed the pre-shared-secret authentication
    /// (or one side had a secret and the other none).
    pub auth_failures: u64,
}

/// A `Communicator` over TCP or Unix sockets. Many threads may use it at once; share it
/// with `Arc`. Dropping it closes it.
pub struct TcpCommunicator {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for TcpCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpCommunicator")
            .field("addr", &self.shared.addr)
            .finish_non_exhaustive()
    }
}

impl TcpCommunicator {
    /// Listens on `addr` (`tcp://IP:PORT`, port 0 for any, or `unix:///path`) and starts
    /// the responder. Must be called inside a tokio runtime.
    pub fn bind(addr: &PeerAddr, config: TcpConfig) -> Result<TcpCommunicator> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::InvalidArgument(
                "TcpCommunicator::bind must be called inside a tokio runtime".into(),
            ));
        }
        if config.staging_chunk == 0 || config.max_staging_bytes / config.staging_chunk < 2 {
            return Err(Error::InvalidArgument(format!(
                "max_staging_bytes ({}) must hold at least two staging chunks of {} bytes \
                 (TcpConfig::staging_chunk, the engine option staging_chunk_bytes): each \
                 request on device memory takes two",
                config.max_staging_bytes, config.staging_chunk
            )));
        }
        let listener = Listener::bind(addr)?;
        let addr = listener.local_addr()?;
        let (closed, _) = watch::channel(false);
        let staging = StagingPool::new(config.staging_chunk, config.max_staging_bytes);
        let shared = Arc::new(Shared {
            staging,
            config,
            addr,
            regions: Registry::new(),
            registered_bytes: Mutex::new(0),
            next_endpoint: AtomicU64::new(1),
            notifications: Watched::new(Notifications::default()),
            tasks: Mutex::new(Tasks::default()),
            counters: Counters::default(),
            closed,
            gates: Default::default(),
        });
        crate::responder::start(&shared, listener);
        tracing::debug!(addr = %shared.addr, "TcpCommunicator listening");
        Ok(TcpCommunicator { shared })
    }

    /// Bytes registered now.
    pub fn registered_bytes(&self) -> u64 {
        *self.shared.registered_bytes.lock()
    }

    /// What the bounce chunks of device regions served to peers have done.
    pub fn staging_stats(&self) -> StagingStats {
        self.shared.staging.stats()
    }

    /// Counters and current holdings of this communicator's responder.
    pub fn stats(&self) -> TcpStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (pending, bytes) = self
            .shared
            .notifications
            .with(|n| (n.queue.len() as u64, n.bytes as u64));
        TcpStats {
            accepted_connections: get(&c.accepted),
            open_connections: get(&c.open),
            closed_hello_timeout: get(&c.hello_timeouts),
            closed_idle_timeout: get(&c.idle_timeouts),
            closed_request_timeout: get(&c.request_timeouts),
            refused_notifications: get(&c.refused_notifications),
            pending_notifications: pending,
            pending_notification_bytes: bytes,
            auth_failures: get(&c.auth_failures),
        }
    }
}

impl Drop for TcpCommunicator {
    fn drop(&mut self) {
        self.close();
    }
}

/// Connections taken from an endpoint's record of abandoned ones for one `settle`; those
/// still here when it drops (not confirmed, or the `settle` itself dropped) go back, ahead
/// of any recorded meanwhile.
struct Unsettled<'e> {
    ep: &'e EndpointInner,
    conns: Vec<Option<crate::conn_name::ConnName>>,
}

impl<'e> Unsettled<'e> {
    fn take(ep: &'e EndpointInner) -> Self {
        let conns = std::mem::take(&mut ep.abandoned.lock().conns);
        Unsettled { ep, conns }
    }
}

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        if self.conns.is_empty() {
            return;
        }
        let mut kept = self.ep.abandoned.lock();
        let later = std::mem::replace(&mut kept.conns, std::mem::take(&mut self.conns));
        for conn in later {
            kept.push(conn);
        }
        let excess = kept
            .conns
            .len()
            .saturating_sub(crate::abandon::Pending::MAX);
        kept.conns.drain(..excess);
    }
}

/// Sends an ABANDON for each of `pending` (connections a WRITE on `ep` was given up on)
/// over one connection of `ep` and reads the answers.
async fn settle_with(
    shared: &Shared,
    ep: &EndpointInner,
    pending: &[Option<crate::conn_name::ConnName>],
    deadline: Deadline,
    started: Instant,
) -> Result<()> {
    let peer = &ep.peer;
    let mut lease = ep
        .checkout(shared, deadline, started, Unfinished::Close)
        .await?;
    for conn in pending.iter().flatten() {
        let stream = lease.stream();
        let asked = async {
            stream
                .write_all(&crate::abandon::encode_request(conn))
                .await?;
            wire::read_status(stream, peer).await
        };
        match asked.await {
            Err(e) => {
                return Err(Error::peer(
                    peer,
                    format!(
                        "the connection broke while asking it to drop the rest of a WRITE \
                         that ended early ({e}); bytes it already received may still land \
                         (a target of a version before the ABANDON request closes the \
                         connection on it: upgrade it)"
                    ),
                ));
            }
            Ok(Err(Error::Protocol(msg))) if msg.contains("unknown request kind") => {
                return Err(Error::Unsupported(format!(
                    "the target at {peer} does not know the ABANDON request (an older \
                     hmc-transport-tcp; it said: {msg}), so it cannot be told to drop the \
                     rest of a WRITE that ended early: bytes it already received may still \
                     land; upgrade the target"
                )));
            }
            Ok(Err(e)) => {
                lease.checkin(true);
                return Err(e);
            }
            Ok(Ok(())) => {}
        }
    }
    lease.checkin(false);
    Ok(())
}

impl TcpCommunicator {
    /// Runs `work` until it ends, the deadline passes, or the communicator closes.
    /// `start`: when the call began (its clock read, shared with the caller). `work` is
    /// pinned by the caller: an async fn keeps its arguments apart from its state, so a
    /// future taken by value would be stored twice in every op's future.
    async fn bounded<T>(
        &self,
        during: &'static str,
        (start, deadline): (Instant, Deadline),
        work: Pin<&mut impl Future<Output = Result<T>>>,
    ) -> Result<T> {
        // `work` first: an op that completes in its first poll (a small one, busy-polled)
        // then never arms the timer or subscribes to the watch (each an async block, so
        // nothing is made before its first poll), which the other order did in two polls
        // of three.
        tokio::select! {
            biased;
            r = work => r,
            _ = async { crate::wait::sleep_until_precise(deadline.instant()).await } => {
                Err(Error::DeadlineExceeded { during, elapsed: start.elapsed() })
            }
            _ = async { self.shared.closed.subscribe().wait_for(|c| *c).await.is_ok() } => {
                Err(Error::Closed(format!(
                    "the TcpCommunicator at {} was closed during {during}",
                    self.shared.addr
                )))
            }
        }
    }
}

impl Communicator for TcpCommunicator {
    type Endpoint = TcpEndpoint;
    type Registration = TcpRegistration;
    type RemoteKey = TcpRemoteKey;

    fn transport(&self) -> TransportId {
        TransportId::TCP
    }

    /// Host memory only, at both ends (the CPU moves the bytes through sockets, so nothing
    /// is zero-copy); batches of any length (split into `max_batch_descs` per request);
    /// notifications up to `max_notify_len`; `rekey` revokes keys.
    fn capabilities(&self) -> CommCapabilities {
        let mut caps = CommCapabilities::new(TransportId::TCP);
        caps.max_notification_len = self.shared.config.max_notify_len;
        // Device memory of any backend is served to peers through the staging pool.
        caps.staged_memory = hmc_core::MemoryKinds::Any;
        caps.remote_memory = hmc_core::MemoryKinds::Any;
        caps.rekey = true;
        // `rekey` swaps a token, `import` parses the key: neither waits on the peer.
        caps.key_ops_wait = false;
        caps
    }

    fn address(&self) -> PeerAddr {
        self.shared.addr.clone()
    }

    async fn connect(&self, peer: &PeerAddr, deadline: Deadline) -> Result<TcpEndpoint> {
        self.shared.check_open()?;
        let shared = &self.shared;
        let stream = self
            .bounded(
                "connect",
                (Instant::now(), deadline),
                pin!(dial(shared, peer, deadline)),
            )
            .await?;
        Ok(TcpEndpoint::new(shared, peer, stream))
    }

    unsafe fn register(&self, region: Region, access: Access) -> Result<TcpRegistration> {
        self.shared.check_open()?;
        if !region.device.is_host() {
            return Err(Error::UnsupportedMemory {
                transport: TransportId::TCP,
                device: region.device,
                reason: "the TCP transport moves bytes with the CPU: a Region of device \
                         memory is registered with register_memory and its backend, which \
                         stages it through host chunks"
                    .into(),
            });
        }
        TcpRegistration::add(&self.shared, region, access, None)
    }

    /// Device memory is served to peers through a bounded pool of pinned staging chunks
    /// (see [`TcpConfig::max_staging_bytes`](crate::TcpConfig::max_staging_bytes)); host
    /// memory is registered as `register` does.
    unsafe fn register_memory(
        &self,
        region: Region,
        access: Access,
        memory: &AnyMemory,
    ) -> Result<TcpRegistration> {
        self.shared.check_open()?;
        if region.device.is_host() {
            return TcpRegistration::add(&self.shared, region, access, None);
        }
        if memory.device() != region.device {
            return Err(Error::InvalidArgument(format!(
                "register_memory: the region is on {} and the memory backend serves {}; pass \
                 the backend of the region's device",
                region.device,
                memory.device()
            )));
        }
        TcpRegistration::add(&self.shared, region, access, Some(memory.clone()))
    }

    /// Draws a new random token for `reg` under the registration's token lock: every key
    /// exported before stops working (the responder refuses it as `InvalidKey`, exactly like
    /// a forged one), and later exports carry the new token. One `getrandom` call and a
    /// 16-byte swap; no allocation. A request whose keys were checked before the swap may
    /// finish; one checked after it is refused.
    fn rekey(&self, reg: &TcpRegistration) -> Result<bool> {
        if !Arc::ptr_eq(&reg.shared, &self.shared) {
            return Err(Error::InvalidArgument(
                "rekey: the registration belongs to another TcpCommunicator".into(),
            ));
        }
        reg.entry.token.rekey()?;
        tracing::trace!(id = reg.entry.id, "registration rekeyed");
        Ok(true)
    }

    fn export(&self, reg: &TcpRegistration) -> Result<RemoteRegion> {
        if !Arc::ptr_eq(&reg.shared, &self.shared) {
            return Err(Error::InvalidArgument(
                "export: the registration belongs to another TcpCommunicator; export it with \
                 the communicator that registered it"
                    .into(),
            ));
        }
        let mut key = Vec::with_capacity(KEY_LEN);
        key.extend_from_slice(&reg.entry.id.to_be_bytes());
        key.extend_from_slice(&reg.entry.token.get());
        Ok(RemoteRegion {
            transport: TransportId::TCP,
            region: reg.entry.region,
            access: reg.entry.access,
            key,
        })
    }

    fn import(&self, ep: &TcpEndpoint, remote: &RemoteRegion) -> Result<TcpRemoteKey> {
        remote.check_transport(TransportId::TCP)?;
        if remote.key.len() != KEY_LEN {
            return Err(Error::InvalidKey(format!(
                "a TCP remote key is {KEY_LEN} bytes, this one is {}",
                remote.key.len()
            )));
        }
        let id = u64::from_be_bytes(remote.key[..8].try_into().expect("8 bytes"));
        let token: [u8; TOKEN_LEN] = remote.key[8..].try_into().expect("16 bytes");
        *ep.inner.notify_key.lock() = Some((id, token));
        Ok(TcpRemoteKey {
            endpoint: ep.inner.id,
            id,
            token,
            len: remote.region.len as u64,
            access: remote.access,
        })
    }

    async fn transfer(
        &self,
        ep: &TcpEndpoint,
        op: Op,
        batch: &[TransferDesc<'_, Self>],
        deadline: Deadline,
    ) -> Result<()> {
        self.shared.check_open()?;
        let wire_descs = check_batch(&ep.inner, op, batch)?;
        if batch.is_empty() {
            return Ok(());
        }
        // One clock read for the expiry check, the pool's idle check and the error's time.
        let started = Instant::now();
        if started >= deadline.instant() {
            return Err(Error::DeadlineExceeded {
                during: "transfer",
                elapsed: Duration::ZERO,
            });
        }
        let batch = (batch, &wire_descs[..]);
        let work = request::transfer(&self.shared, &ep.inner, op, batch, deadline, started);
        self.bounded("transfer", (started, deadline), pin!(work))
            .await
    }

    /// Abandons at the target each connection a WRITE on `ep` was given up on (see the
    /// module docs): sends an ABANDON for each over one connection of the endpoint, pooled
    /// or new, and waits for the answers by `deadline`. `Ok` at once when there is none.
    /// Connections not confirmed (no answer in time, a broken connection) are kept for the
    /// next `settle`; those that can never be (an unnamed Unix socket, a target of an older version)
    /// are reported once.
    async fn settle(&self, ep: &TcpEndpoint, deadline: Deadline) -> Result<()> {
        self.shared.check_open()?;
        let started = Instant::now();
        let shared = &self.shared;
        let peer = &ep.inner.peer;
        let by = deadline.instant().into();
        let not_confirmed = || Error::Peer {
            peer: peer.to_string(),
            reason: format!(
                "did not confirm within {:?} that it dropped the rest of a WRITE that ended \
                 early (a stopped or overloaded target): bytes it already received may still \
                 land; call settle again to retry",
                started.elapsed()
            ),
        };
        let Ok(_turn) = tokio::time::timeout_at(by, ep.inner.settling.lock()).await else {
            return Err(not_confirmed());
        };
        let mut unsettled = Unsettled::take(&ep.inner);
        if unsettled.conns.is_empty() {
            return Ok(());
        }
        if unsettled.conns.iter().any(Option::is_none) {
            unsettled.conns.clear();
            return Err(Error::Unsupported(format!(
                "a WRITE to {peer} over a Unix socket ended early on a connection this side \
                 could not name to the target (its socket could not be bound to an abstract \
                 address before it dialled), so the target cannot be asked to drop the rest \
                 of it: bytes it already received may still land; use a tcp:// address where \
                 an early end must be final"
            )));
        }
        let asked = settle_with(shared, &ep.inner, &unsettled.conns, deadline, started);
        match tokio::time::timeout_at(by, asked).await {
            Err(_) => Err(not_confirmed()),
            Ok(Ok(())) => {
                unsettled.conns.clear();
                Ok(())
            }
            Ok(Err(e @ Error::Unsupported(_))) => {
                // An older target: asking again cannot help.
                unsettled.conns.clear();
                Err(e)
            }
            Ok(Err(e)) => Err(e),
        }
    }

    async fn notify(
        &self,
        ep: &TcpEndpoint,
        tag: u64,
        msg: &[u8],
        deadline: Deadline,
    ) -> Result<()> {
        self.shared.check_open()?;
        let max = self.shared.config.max_notify_len;
        if msg.len() > max {
            return Err(Error::LimitExceeded {
                limit: "max_notify_len",
                value: msg.len() as u64,
                max: max as u64,
                hint: "raise TcpConfig::max_notify_len on both peers, or move the bytes with a \
                       transfer"
                    .into(),
            });
        }
        let shared = &self.shared;
        let peer = &ep.inner.peer;
        let started = Instant::now();
        let work = async {
            let mut lease = ep
                .inner
                .checkout(shared, deadline, started, Unfinished::Close)
                .await?;
            let mut req = Vec::with_capacity(13 + KEY_LEN + msg.len());
            match *ep.inner.notify_key.lock() {
                Some((id, token)) => {
                    req.push(wire::REQ_NOTIFY_KEYED);
                    req.extend_from_slice(&id.to_be_bytes());
                    req.extend_from_slice(&token);
                }
                // Accepted only over an authenticated connection (see `notify`'s doc).
                None => req.push(wire::REQ_NOTIFY),
            }
            req.extend_from_slice(&tag.to_be_bytes());
            req.extend_from_slice(&(msg.len() as u32).to_be_bytes());
            req.extend_from_slice(msg);
            let stream = lease.stream();
            let sent = async {
                stream.write_all(&req).await?;
                wire::read_status(stream, peer).await
            };
            match sent.await {
                Err(e) => Err(broken(peer, e)),
                Ok(status) => {
                    lease.checkin(status.is_err());
                    status
                }
            }
        };
        self.bounded("notify", (started, deadline), pin!(work))
            .await
    }

    async fn recv_notification(&self, deadline: Deadline) -> Result<Notification> {
        let addr = &self.shared.addr;
        self.shared
            .notifications
            .wait(deadline, "waiting for a notification", |s| {
                if s.closed {
                    Some(Err(Error::Closed(format!(
                        "the TcpCommunicator at {addr} was closed"
                    ))))
                } else {
                    let n = s.queue.pop_front()?;
                    s.bytes -= n.msg.len();
                    Some(Ok(n))
                }
            })
            .await
    }

    fn close(&self) {
        let first = !self.shared.closed.send_replace(true);
        let running: Vec<AbortHandle> = {
            let mut t = self.shared.tasks.lock();
            t.closed = true;
            t.running.drain().map(|(_, h)| h).collect()
        };
        running.iter().for_each(AbortHandle::abort);
        self.shared.notifications.update(|n| n.closed = true);
        if first {
            tracing::debug!(addr = %self.shared.addr, "TcpCommunicator closed");
        }
    }
}
