//! [`Faulty`]: a [`Communicator`] that forwards to another and injects its plan's
//! initiator-side faults (and the notification faults of its side) on the way.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use hmc_core::{
    Access, AnyMemory, CommCapabilities, Communicator, Deadline, Error, Notification, Op, PeerAddr,
    Region, RemoteFacts, RemoteRegion, RemoteView, Result, TransferDesc, TransportId, check_desc,
};
use parking_lot::Mutex;

use crate::plan::{FaultPlan, NotifyFault, TransferEnd, TransferFault};

/// What every injected error ends with, so that nobody chases a fault they asked for.
const ON_PURPOSE: &str = "fault injection is on (HMC_FAULTS, the `faults` option or a \
                          `faulty:` transport); turn it off to stop these";

/// `inner` with faults injected by `plan`: connects refused or delayed, transfers stalled,
/// failed or cut, endpoints that lose their peer or see it restart, notifications dropped,
/// delayed or duplicated, registrations slowed. With an empty spec it behaves as `inner`
/// (and passes the conformance kit).
///
/// Its descriptors are `inner`'s: a peer that runs `inner` unwrapped imports them, and
/// [`Communicator::transport`] is `inner`'s.
pub struct Faulty<C: Communicator> {
    inner: C,
    plan: FaultPlan,
    /// How many times each peer has restarted, as this side saw it.
    restarts: Mutex<HashMap<PeerAddr, u64>>,
    /// Notifications received and held: duplicates to hand out again, delayed ones until
    /// their time (in arrival order).
    held: Mutex<VecDeque<(Instant, Notification)>>,
}

impl<C: Communicator> Faulty<C> {
    /// `inner` with `plan`'s faults.
    pub fn new(inner: C, plan: FaultPlan) -> Self {
        Faulty {
            inner,
            plan,
            restarts: Mutex::new(HashMap::new()),
            held: Mutex::new(VecDeque::new()),
        }
    }

    /// The plan: clone it for anything else that should draw from the same decisions
    /// (the engine's notifications and metadata lookups).
    pub fn plan(&self) -> &FaultPlan {
        &self.plan
    }

    /// The wrapped communicator.
    pub fn inner(&self) -> &C {
        &self.inner
    }

    fn epoch(&self, peer: &PeerAddr) -> u64 {
        self.restarts.lock().get(peer).copied().unwrap_or(0)
    }

    /// Counts one operation on `ep` and fails it if the plan has its peer lost or
    /// restarted by now.
    fn gate(&self, ep: &FaultyEndpoint<C::Endpoint>) -> Result<()> {
        let link = &ep.link;
        if let Some(down) = link.down.get() {
            return Err(down.error(&link.peer));
        }
        let n = link.ops.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(k) = self.plan.disconnect_after()
            && n > k
        {
            let down = link.down.get_or_init(|| Down::Disconnected(k));
            return Err(down.error(&link.peer));
        }
        if let Some(k) = self.plan.restart_after()
            && (n > k || link.epoch < self.epoch(&link.peer))
        {
            // Past its own count, or the peer restarted under another endpoint: a
            // restart ends every connection to it.
            let mut first = false;
            let down = link.down.get_or_init(|| {
                first = true;
                Down::Restarted(k)
            });
            if first && n > k {
                *self.restarts.lock().entry(link.peer.clone()).or_default() += 1;
                tracing::debug!(peer = %link.peer, "injected fault: the peer restarted");
            }
            return Err(down.error(&link.peer));
        }
        Ok(())
    }

    fn check_key(&self, key: &FaultyKey<C::RemoteKey>) -> Result<()> {
        if key.link.epoch < self.epoch(&key.link.peer) {
            return Err(Error::InvalidKey(format!(
                "the peer {} restarted since this key was imported (injected fault \
                 `restart.after`; {ON_PURPOSE})",
                key.link.peer
            )));
        }
        Ok(())
    }

    fn slow_registration(&self) {
        if let Some(d) = self.plan.register() {
            tracing::debug!(delay = ?d, "injected fault: slow registration");
            std::thread::sleep(d);
        }
    }
}

/// Waits `delay` (an injected fault, logged at debug with `peer` and `during`), or fails
/// at `deadline` if it comes first; returns at once without a delay.
async fn wait(
    delay: Option<Duration>,
    deadline: Deadline,
    during: &'static str,
    peer: &PeerAddr,
) -> Result<()> {
    let Some(delay) = delay else { return Ok(()) };
    tracing::debug!(%peer, ?delay, during, "injected fault: waiting");
    let start = Instant::now();
    if delay <= deadline.remaining() {
        tokio::time::sleep(delay).await;
        return Ok(());
    }
    tokio::time::sleep_until(deadline.instant().into()).await;
    Err(Error::DeadlineExceeded {
        during,
        elapsed: start.elapsed(),
    })
}

/// Why an endpoint answers no more.
#[derive(Debug)]
enum Down {
    Disconnected(u64),
    Restarted(u64),
}

impl Down {
    fn error(&self, peer: &PeerAddr) -> Error {
        match self {
            Down::Disconnected(k) => Error::peer(
                peer,
                format!(
                    "connection lost: the peer went away after {k} operations on this \
                     endpoint (injected fault `disconnect.after`; {ON_PURPOSE}); connect again"
                ),
            ),
            Down::Restarted(k) => Error::peer(
                peer,
                format!(
                    "the peer restarted, ending every connection to it (injected fault \
                     `restart.after={k}`: after {k} operations on an endpoint; {ON_PURPOSE}): \
                     connect again and import its regions anew, the keys imported before \
                     are gone"
                ),
            ),
        }
    }
}

#[derive(Debug)]
struct Link {
    peer: PeerAddr,
    /// The peer's restarts when this endpoint connected.
    epoch: u64,
    ops: AtomicU64,
    down: OnceLock<Down>,
}

/// An endpoint of [`Faulty`]: the inner one and what the faults did to it.
pub struct FaultyEndpoint<E> {
    inner: E,
    link: Arc<Link>,
}

impl<E: Clone> Clone for FaultyEndpoint<E> {
    fn clone(&self) -> Self {
        FaultyEndpoint {
            inner: self.inner.clone(),
            link: self.link.clone(),
        }
    }
}

impl<E> std::fmt::Debug for FaultyEndpoint<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyEndpoint")
            .field("peer", &self.link.peer)
            .field("ops", &self.link.ops.load(Ordering::Relaxed))
            .field("down", &self.link.down.get())
            .finish_non_exhaustive()
    }
}

impl<E> FaultyEndpoint<E> {
    /// The wrapped endpoint.
    pub fn inner(&self) -> &E {
        &self.inner
    }
}

/// A remote key of [`Faulty`]: the inner one, the endpoint it was imported on (and so the
/// peer's restarts then), and what a transfer checks before a fault is injected.
pub struct FaultyKey<K> {
    inner: K,
    link: Arc<Link>,
    len: u64,
    access: Access,
}

impl<K> std::fmt::Debug for FaultyKey<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyKey")
            .field("peer", &self.link.peer)
            .field("epoch", &self.link.epoch)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl<K> FaultyKey<K> {
    /// The wrapped key.
    pub fn inner(&self) -> &K {
        &self.inner
    }
}

/// `batch` with the inner communicator's keys.
fn unwrapped<'a, C: Communicator>(
    batch: &'a [TransferDesc<'a, Faulty<C>>],
) -> Vec<TransferDesc<'a, C>> {
    batch
        .iter()
        .map(|d| {
            TransferDesc::new(
                d.local,
                d.local_offset,
                &d.remote.inner,
                d.remote_offset,
                d.len,
            )
        })
        .collect()
}

/// The first `bytes` bytes of `batch`, the last descriptor shortened where they end in it.
fn prefix<'a, C: Communicator>(
    batch: &[TransferDesc<'a, C>],
    mut bytes: usize,
) -> Vec<TransferDesc<'a, C>> {
    let mut out = Vec::new();
    for d in batch {
        if bytes == 0 {
            break;
        }
        let take = d.len.min(bytes);
        out.push(TransferDesc::new(
            d.local,
            d.local_offset,
            d.remote,
            d.remote_offset,
            take,
        ));
        bytes -= take;
    }
    out
}

impl<C: Communicator> Communicator for Faulty<C> {
    type Endpoint = FaultyEndpoint<C::Endpoint>;
    type Registration = C::Registration;
    type RemoteKey = FaultyKey<C::RemoteKey>;

    fn transport(&self) -> TransportId {
        self.inner.transport()
    }

    fn capabilities(&self) -> CommCapabilities {
        self.inner.capabilities()
    }

    fn address(&self) -> PeerAddr {
        self.inner.address()
    }

    async fn connect(&self, peer: &PeerAddr, deadline: Deadline) -> Result<Self::Endpoint> {
        let fault = self.plan.connect();
        let during = "connect (delayed by injected fault `connect.delay`)";
        wait(fault.delay, deadline, during, peer).await?;
        if fault.refuse {
            tracing::debug!(%peer, "injected fault: connect refused");
            return Err(Error::io(
                format!("connecting to {peer} (injected fault `connect.refuse`; {ON_PURPOSE})"),
                std::io::ErrorKind::ConnectionRefused.into(),
            ));
        }
        let epoch = self.epoch(peer);
        let inner = self.inner.connect(peer, deadline).await?;
        Ok(FaultyEndpoint {
            inner,
            link: Arc::new(Link {
                peer: peer.clone(),
                epoch,
                ops: AtomicU64::new(0),
                down: OnceLock::new(),
            }),
        })
    }

    unsafe fn register(&self, region: Region, access: Access) -> Result<Self::Registration> {
        self.slow_registration();
        // SAFETY: the caller upholds `Communicator::register`'s contract, forwarded as is.
        unsafe { self.inner.register(region, access) }
    }

    unsafe fn register_memory(
        &self,
        region: Region,
        access: Access,
        memory: &AnyMemory,
    ) -> Result<Self::Registration> {
        self.slow_registration();
        // SAFETY: the caller upholds `Communicator::register_memory`'s contract, forwarded.
        unsafe { self.inner.register_memory(region, access, memory) }
    }

    fn alloc_registered(&self, len: usize, access: Access) -> Result<Option<Self::Registration>> {
        self.slow_registration();
        self.inner.alloc_registered(len, access)
    }

    fn rekey(&self, reg: &Self::Registration) -> Result<bool> {
        self.inner.rekey(reg)
    }

    fn export(&self, reg: &Self::Registration) -> Result<RemoteRegion> {
        self.inner.export(reg)
    }

    fn import(&self, ep: &Self::Endpoint, remote: &RemoteRegion) -> Result<Self::RemoteKey> {
        Ok(FaultyKey {
            inner: self.inner.import(&ep.inner, remote)?,
            link: ep.link.clone(),
            len: remote.region.len as u64,
            access: remote.access,
        })
    }

    fn view(
        &self,
        ep: &Self::Endpoint,
        remote: &Self::RemoteKey,
        offset: u64,
        len: usize,
        access: Access,
    ) -> Result<Option<RemoteView>> {
        if let Some(down) = ep.link.down.get() {
            return Err(down.error(&ep.link.peer));
        }
        self.check_key(remote)?;
        self.inner
            .view(&ep.inner, &remote.inner, offset, len, access)
    }

    fn moves_device_memory(
        &self,
        ep: &Self::Endpoint,
        local: &Self::Registration,
        remote: &Self::RemoteKey,
    ) -> bool {
        self.inner
            .moves_device_memory(&ep.inner, local, &remote.inner)
    }

    async fn transfer(
        &self,
        ep: &Self::Endpoint,
        op: Op,
        batch: &[TransferDesc<'_, Self>],
        deadline: Deadline,
    ) -> Result<()> {
        self.gate(ep)?;
        for d in batch {
            self.check_key(d.remote)?;
        }
        let peer = &ep.link.peer;
        let fault = self.plan.transfer();
        if fault != TransferFault::default() {
            // The checks the transport makes first: a batch it would refuse gets its
            // error, never an injected one, and a cut never moves bytes of it.
            for d in batch {
                let facts = RemoteFacts {
                    len: d.remote.len,
                    access: d.remote.access,
                    on_endpoint: Arc::ptr_eq(&d.remote.link, &ep.link),
                };
                check_desc(op, d, facts)?;
            }
        }
        let during = "transfer (stalled by injected fault `xfer.stall`)";
        wait(fault.stall, deadline, during, peer).await?;
        let inner = unwrapped(batch);
        match fault.end {
            TransferEnd::Complete => self.inner.transfer(&ep.inner, op, &inner, deadline).await,
            TransferEnd::Fail => {
                tracing::debug!(%peer, "injected fault: transfer failed");
                Err(Error::peer(
                    peer,
                    format!(
                        "connection lost mid-transfer before any byte moved (injected fault \
                         `xfer.fail`; {ON_PURPOSE}); retry the transfer"
                    ),
                ))
            }
            TransferEnd::Cut(fraction) => {
                let total: usize = batch.iter().map(|d| d.len).sum();
                let landed = (total as f64 * fraction) as usize;
                tracing::debug!(%peer, landed, total, "injected fault: transfer cut");
                let part = prefix(&inner, landed);
                if !part.is_empty() {
                    self.inner.transfer(&ep.inner, op, &part, deadline).await?;
                }
                Err(Error::peer(
                    peer,
                    format!(
                        "connection lost mid-transfer after {landed} of {total} bytes \
                         (injected fault `xfer.cut`; {ON_PURPOSE}); retry the transfer"
                    ),
                ))
            }
        }
    }

    /// Forwarded as is, with no fault injected and no injected disconnect in the way:
    /// settling is about the real transport's bytes, which an injected fault never holds
    /// back.
    async fn settle(&self, ep: &Self::Endpoint, deadline: Deadline) -> Result<()> {
        self.inner.settle(&ep.inner, deadline).await
    }

    async fn notify(
        &self,
        ep: &Self::Endpoint,
        tag: u64,
        msg: &[u8],
        deadline: Deadline,
    ) -> Result<()> {
        self.gate(ep)?;
        match self.plan.notify_send() {
            NotifyFault::Deliver => self.inner.notify(&ep.inner, tag, msg, deadline).await,
            NotifyFault::Drop => {
                tracing::debug!(peer = %ep.link.peer, tag, "injected fault: notification dropped");
                Ok(())
            }
            NotifyFault::Delay(d) => {
                let during = "notify (delayed by injected fault `notify.delay`)";
                wait(Some(d), deadline, during, &ep.link.peer).await?;
                self.inner.notify(&ep.inner, tag, msg, deadline).await
            }
            NotifyFault::Duplicate => {
                self.inner.notify(&ep.inner, tag, msg, deadline).await?;
                self.inner.notify(&ep.inner, tag, msg, deadline).await
            }
        }
    }

    async fn recv_notification(&self, deadline: Deadline) -> Result<Notification> {
        let start = Instant::now();
        loop {
            // What is held goes first, in arrival order, once its time has come.
            let front = self.held.lock().front().map(|(at, _)| *at);
            if let Some(at) = front {
                if at > deadline.instant() {
                    tokio::time::sleep_until(deadline.instant().into()).await;
                    return Err(Error::DeadlineExceeded {
                        during: "recv_notification (a notification delayed by injected \
                                 fault `notify.delay`)",
                        elapsed: start.elapsed(),
                    });
                }
                tokio::time::sleep_until(at.into()).await;
                if let Some((_, n)) = self.held.lock().pop_front() {
                    return Ok(n);
                }
                continue;
            }
            let n = self.inner.recv_notification(deadline).await?;
            match self.plan.notify_recv() {
                NotifyFault::Deliver => return Ok(n),
                NotifyFault::Drop => {
                    tracing::debug!(from = %n.from, tag = n.tag, "injected fault: notification dropped");
                }
                NotifyFault::Delay(d) => self.held.lock().push_back((Instant::now() + d, n)),
                NotifyFault::Duplicate => {
                    self.held.lock().push_back((Instant::now(), n.clone()));
                    return Ok(n);
                }
            }
        }
    }

    fn close(&self) {
        self.inner.close()
    }
}
