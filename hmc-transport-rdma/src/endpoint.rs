//! The initiator side: endpoints (their QPs and control connection), connecting, posting a batch as chains of work requests per QP, waiting for it, cancelling it, and re-establishing a QP.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::task::Poll;
use std::time::{Duration, Instant};

use hmc_core::{Deadline, Error, Op, PeerAddr, Result};
use parking_lot::Mutex;

use crate::comm::{Inner, RdmaCommunicator, random_psn};
use crate::control::{self, Stream, read_frame, write_frame};
use crate::engine::{Batch, Link, LinkInner, LinkState, TimerSlot};
use crate::nic::Qp;
use crate::sys::*;
use crate::wire::{ConnRecord, wr_id};

/// What `post_link` does next with one chain.
pub(crate) enum Step {
    Posted,
    Stop,
    Failed(Error),
    Reestablish,
}

/// One work request to post.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Wr {
    pub(crate) laddr: u64,
    pub(crate) lkey: u32,
    pub(crate) raddr: u64,
    pub(crate) rkey: u32,
    pub(crate) len: u32,
    pub(crate) qp: usize,
}

pub(crate) struct EpInner {
    pub(crate) id: u64,
    pub(crate) peer: PeerAddr,
    pub(crate) links: Vec<Arc<Link>>,
    pub(crate) control: Mutex<Stream>,
    pub(crate) dead: Mutex<Option<String>>,
    pub(crate) reconnecting: Mutex<()>,
    pub(crate) owner: Weak<Inner>,
    pub(crate) cq_reserved: usize,
}

impl EpInner {
    pub(crate) fn kill(&self, reason: &str) {
        let mut dead = self.dead.lock();
        if dead.is_none() {
            *dead = Some(reason.to_string());
        }
        for link in &self.links {
            let mut li = link.inner.lock();
            if li.state != LinkState::Dead(reason.to_string()) {
                let _ = li.qp.to_err();
                li.state = LinkState::Dead(reason.to_string());
            }
            Link::wake_all(&mut li);
        }
        self.control.lock().shutdown();
    }

    pub(crate) fn dead_error(&self) -> Option<Error> {
        self.dead
            .lock()
            .as_ref()
            .map(|r| Error::peer(&self.peer, r.clone()))
    }

    /// One control round trip; a failure ends the endpoint.
    pub(crate) fn round_trip(&self, kind: u8, payload: &[u8], answer: u8) -> Result<Vec<u8>> {
        if let Some(e) = self.dead_error() {
            return Err(e);
        }
        let mut s = self.control.lock();
        let res = write_frame(&mut *s, kind, payload).and_then(|()| read_frame(&mut *s));
        drop(s);
        match res {
            Ok((k, p)) if k == answer => Ok(p),
            Ok((control::REFUSED, p)) => Err(control::refused(&self.peer, &p)),
            Ok((k, _)) => {
                self.kill("protocol violation on the control connection");
                Err(Error::Protocol(format!(
                    "expected control frame {answer}, got {k}"
                )))
            }
            Err(e) => {
                let reason = format!("the control connection failed: {e}");
                self.kill(&reason);
                Err(Error::peer(&self.peer, reason))
            }
        }
    }

    /// Walks a broken link's QP back to RTS with the peer (both sides reset theirs). One
    /// at a time per endpoint; no link lock is held across the control round trip.
    fn reestablish(&self, link: &Link, inner: &Inner) -> Result<()> {
        let _one = self.reconnecting.lock();
        let psn = random_psn();
        let qpn = {
            let li = link.inner.lock();
            match &li.state {
                LinkState::Ready => return Ok(()),
                LinkState::Dead(r) => return Err(Error::peer(&self.peer, r.clone())),
                LinkState::Broken if li.outstanding > 0 => return Ok(()),
                LinkState::Broken => {}
            }
            li.qp.to_reset()?;
            li.qp.to_init()?;
            li.qp.qpn()
        };
        let mut payload = vec![link.index];
        payload.extend_from_slice(&inner.shared.nic.record(qpn, psn, inner.local_mtu).encode());
        let answer = self.round_trip(control::RESET_QP, &payload, control::RESET_ACK)?;
        let remote = ConnRecord::decode(&answer)?;
        let mut li = link.inner.lock();
        if let LinkState::Dead(r) = &li.state {
            return Err(Error::peer(&self.peer, r.clone()));
        }
        li.qp.to_rtr(&remote, inner.local_mtu.min(remote.mtu))?;
        li.qp.to_rts(psn, &inner.params)?;
        li.generation = inner.shared.next_generation();
        li.state = LinkState::Ready;
        inner.reestablished.fetch_add(1, Ordering::Relaxed);
        Link::wake_all(&mut li);
        Ok(())
    }
}

impl Drop for EpInner {
    fn drop(&mut self) {
        self.control.lock().shutdown();
        if let Some(inner) = self.owner.upgrade() {
            inner
                .cq_reserved
                .fetch_sub(self.cq_reserved, Ordering::AcqRel);
        }
    }
}

/// A connection to one peer: `qps_per_endpoint` RC QPs and a control connection. Cheap
/// to clone.
#[derive(Clone)]
pub struct RdmaEndpoint(pub(crate) Arc<EpInner>);

impl RdmaEndpoint {
    /// The peer's control address.
    pub fn peer(&self) -> &PeerAddr {
        &self.0.peer
    }

    /// The QP numbers of this endpoint's QPs.
    pub fn qp_numbers(&self) -> Vec<u32> {
        self.0
            .links
            .iter()
            .map(|l| l.inner.lock().qp.qpn())
            .collect()
    }
}

impl std::fmt::Debug for RdmaEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaEndpoint")
            .field("peer", &self.0.peer.to_string())
            .field("qps", &self.0.links.len())
            .finish()
    }
}

/// Cancels a batch whose future is dropped (or whose deadline passed): its QPs go to ERR,
/// and the drop returns only once the NIC has flushed every WR of the batch, so it no
/// longer touches the batch's memory, and the target has reset its side of each QP, so
/// none of the batch's bytes lands there afterwards.
struct CancelGuard<'a> {
    inner: &'a Inner,
    ep: &'a EpInner,
    batch: Arc<Batch>,
    used: Vec<bool>,
    armed: bool,
}

impl CancelGuard<'_> {
    fn cancel(&mut self) {
        if !self.armed {
            return;
        }
        self.armed = false;
        if self.batch.state.lock().outstanding == 0 {
            return;
        }
        for (i, link) in self.ep.links.iter().enumerate() {
            if !self.used[i] {
                continue;
            }
            let mut li = link.inner.lock();
            if li.state == LinkState::Ready {
                if let Err(e) = li.qp.to_err() {
                    tracing::error!(error = %e, "cannot move a QP to ERR to cancel a transfer");
                }
                li.state = LinkState::Broken;
            }
        }
        let until = Instant::now() + self.inner.config.drain_timeout;
        let mut b = self.batch.state.lock();
        while b.outstanding > 0 {
            if self.batch.cv.wait_until(&mut b, until).timed_out() {
                tracing::error!(
                    outstanding = b.outstanding,
                    "the NIC did not flush a cancelled transfer within drain_timeout"
                );
                break;
            }
        }
        drop(b);
        // Our QPs stopped sending, but what they sent may still be arriving at the target
        // (in flight, or waiting in its NIC). Walk each pair back through RESET now, over
        // the control connection (bounded by `control_timeout`): once the target answers,
        // its QP of the old incarnation is gone, and nothing of this batch lands there
        // after the drop returns. A target that does not answer ends the endpoint.
        for (i, link) in self.ep.links.iter().enumerate() {
            if self.used[i]
                && let Err(e) = self.ep.reestablish(link, self.inner)
            {
                tracing::debug!(error = %e, "a cancelled transfer's QP was not re-established");
            }
        }
    }
}

impl Drop for CancelGuard<'_> {
    fn drop(&mut self) {
        self.cancel();
    }
}

impl RdmaCommunicator {
    /// Posts `wrs` (all for `link`) as chains, waiting for send-queue room; re-establishes
    /// the link first when it is broken and idle.
    async fn post_link(
        &self,
        ep: &EpInner,
        link: &Arc<Link>,
        wrs: &[Wr],
        op: Op,
        batch: &Arc<Batch>,
        deadline: Instant,
    ) -> Result<bool> {
        let shared = &self.inner.shared;
        let chain_max = (self.inner.config.max_chain.max(1) as usize)
            .min(link.inner.lock().qp.max_send_wr as usize);
        for chain in wrs.chunks(chain_max) {
            loop {
                // Decided under the link's lock, where the waker is registered too, so a
                // completion that frees room between the check and the sleep still wakes us.
                let mut timer = TimerSlot::new(shared);
                let step = std::future::poll_fn(|cx| {
                    if Instant::now() >= deadline || batch.state.lock().error.is_some() {
                        return Poll::Ready(Step::Stop); // the batch wait reports it
                    }
                    let mut li = link.inner.lock();
                    match &li.state {
                        LinkState::Dead(r) => {
                            return Poll::Ready(Step::Failed(Error::peer(&ep.peer, r.clone())));
                        }
                        LinkState::Broken if li.outstanding == 0 => {
                            return Poll::Ready(Step::Reestablish);
                        }
                        LinkState::Ready
                            if li.qp.max_send_wr - li.outstanding >= chain.len() as u32 =>
                        {
                            return Poll::Ready(
                                match self.post_chain(&mut li, link, chain, op, batch) {
                                    Ok(()) => Step::Posted,
                                    Err(e) => Step::Failed(e),
                                },
                            );
                        }
                        _ => {}
                    }
                    li.waiters.push(cx.waker().clone());
                    timer.arm(deadline, cx.waker());
                    Poll::Pending
                })
                .await;
                drop(timer);
                match step {
                    Step::Posted => break,
                    Step::Stop => return Ok(false),
                    Step::Failed(e) => return Err(e),
                    Step::Reestablish => ep.reestablish(link, &self.inner)?,
                }
            }
        }
        Ok(true)
    }

    fn post_chain(
        &self,
        li: &mut LinkInner,
        link: &Arc<Link>,
        chain: &[Wr],
        op: Op,
        batch: &Arc<Batch>,
    ) -> Result<()> {
        let shared = &self.inner.shared;
        let slot = shared.insert(li.generation, batch, link, chain.len() as u32);
        let mut sges: Vec<ibv_sge> = chain
            .iter()
            .map(|w| ibv_sge {
                addr: w.laddr,
                length: w.len,
                lkey: w.lkey,
            })
            .collect();
        let mut reqs: Vec<ibv_send_wr> = Vec::with_capacity(chain.len());
        for (i, w) in chain.iter().enumerate() {
            let last = i + 1 == chain.len();
            let mut r = ibv_send_wr {
                wr_id: wr_id::pack(li.generation, slot, last),
                num_sge: 1,
                opcode: match op {
                    Op::Read => IBV_WR_RDMA_READ,
                    Op::Write => IBV_WR_RDMA_WRITE,
                },
                send_flags: if last { IBV_SEND_SIGNALED } else { 0 },
                ..Default::default()
            };
            r.rdma.remote_addr = w.raddr;
            r.rdma.rkey = w.rkey;
            reqs.push(r);
        }
        for i in 0..reqs.len() {
            reqs[i].sg_list = &mut sges[i];
            if i + 1 < reqs.len() {
                let next: *mut ibv_send_wr = &mut reqs[i + 1];
                reqs[i].next = next;
            }
        }
        batch.state.lock().outstanding += 1;
        li.outstanding += chain.len() as u32;
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is live and in RTS (we hold its link); the chain and its SGEs
        // live until the call returns (the provider copies them into its queue); the
        // SGEs name registered memory kept alive by the transfer's borrows.
        let rc = unsafe {
            shared
                .nic
                .verbs
                .post_send(li.qp.raw, reqs.as_mut_ptr(), &mut bad)
        };
        if rc != 0 {
            // A refused first WR posted nothing: forget the chain. A refusal further down
            // posted a prefix whose completions cannot be told from the rest, and the
            // chain's last WR (the one that frees its slot) is not among them: move the QP
            // to ERR and post the remainder there, where the NIC flushes it at once, so
            // every WR of the chain completes (flushed) and the slot is freed as usual.
            let first_bad = bad == reqs.as_mut_ptr();
            let mut released = first_bad;
            if !first_bad {
                let _ = li.qp.to_err();
                li.state = LinkState::Broken;
                let mut bad2: *mut ibv_send_wr = std::ptr::null_mut();
                // SAFETY: as above; `bad` points into `reqs`, still alive.
                let rc2 = unsafe { shared.nic.verbs.post_send(li.qp.raw, bad, &mut bad2) };
                if rc2 != 0 {
                    tracing::error!(rc2, "cannot flush the rest of a refused chain");
                    released = true; // give up on its completions; the new QP generation
                    // makes any that still arrive stale
                }
            }
            if released {
                shared.remove(slot);
                li.outstanding -= chain.len() as u32;
                batch.state.lock().outstanding -= 1;
            }
            return Err(crate::nic::verbs_error(
                "ibv_post_send",
                rc,
                "posting RDMA work requests",
            ));
        }
        Ok(())
    }

    pub(crate) async fn run_batch(
        &self,
        ep: &RdmaEndpoint,
        op: Op,
        wrs: &[Wr],
        deadline: Deadline,
    ) -> Result<()> {
        let nlinks = ep.0.links.len();
        let mut per_link: Vec<Vec<Wr>> = vec![Vec::new(); nlinks];
        for w in wrs {
            per_link[w.qp].push(*w);
        }
        let start = Instant::now();
        let expired = || Error::DeadlineExceeded {
            during: "rdma transfer",
            elapsed: start.elapsed(),
        };
        loop {
            if deadline.is_expired() {
                return Err(expired());
            }
            if let Some(e) = ep.0.dead_error() {
                return Err(e);
            }
            let batch = Arc::new(Batch::default());
            let mut guard = CancelGuard {
                inner: &self.inner,
                ep: &ep.0,
                batch: batch.clone(),
                used: per_link.iter().map(|v| !v.is_empty()).collect(),
                armed: true,
            };
            // Not everything is posted when the deadline passes (or a chain fails) first.
            let mut posted = Ok(true);
            for (i, link_wrs) in per_link.iter().enumerate() {
                if link_wrs.is_empty() {
                    continue;
                }
                posted = self
                    .post_link(
                        &ep.0,
                        &ep.0.links[i],
                        link_wrs,
                        op,
                        &batch,
                        deadline.instant(),
                    )
                    .await;
                if !matches!(posted, Ok(true)) {
                    break;
                }
            }
            // Wait for every posted chain (also after a posting error: the memory must be
            // released before returning).
            let shared = &self.inner.shared;
            let mut timer = TimerSlot::new(shared);
            std::future::poll_fn(|cx| {
                let mut b = batch.state.lock();
                if b.outstanding == 0 || deadline.is_expired() {
                    return Poll::Ready(());
                }
                b.waker = Some(cx.waker().clone());
                timer.arm(deadline.instant(), cx.waker());
                Poll::Pending
            })
            .await;
            drop(timer);
            let timed_out = batch.state.lock().outstanding > 0;
            guard.cancel();
            drop(guard);
            let all_posted = posted?;
            let mut b = batch.state.lock();
            if let Some(e) = b.error.take() {
                return Err(e);
            }
            if timed_out || !all_posted {
                return Err(expired());
            }
            if !b.retry {
                return Ok(());
            }
            tracing::debug!(
                "a batch was flushed by another QP error or a cancel; posting it again"
            );
        }
    }
}

pub(crate) fn connect_blocking(
    inner: &Arc<Inner>,
    peer: &PeerAddr,
    deadline: Deadline,
) -> Result<RdmaEndpoint> {
    let n = inner.config.qps_per_endpoint;
    let per_qp = inner
        .config
        .max_send_wr
        .clamp(1, inner.shared.nic.max_qp_wr) as usize;
    let want = n * per_qp;
    reserve_cq(inner, want)?;
    // From here the reservation belongs to the endpoint (returned by its Drop), or is
    // returned below on failure.
    let (s, links) = match handshake(inner, peer, deadline, n, per_qp) {
        Ok(v) => v,
        Err(e) => {
            inner.cq_reserved.fetch_sub(want, Ordering::AcqRel);
            return Err(e);
        }
    };
    let ep = Arc::new(EpInner {
        id: inner.next_id.fetch_add(1, Ordering::Relaxed),
        peer: peer.clone(),
        links,
        control: Mutex::new(s),
        dead: Mutex::new(None),
        reconnecting: Mutex::new(()),
        owner: Arc::downgrade(inner),
        cq_reserved: want,
    });
    let mut eps = inner.endpoints.lock();
    eps.retain(|w| w.strong_count() > 0);
    eps.push(Arc::downgrade(&ep));
    Ok(RdmaEndpoint(ep))
}

/// Reserves `want` completion entries of the shared CQ for a new endpoint's QPs.
fn reserve_cq(inner: &Inner, want: usize) -> Result<()> {
    let nic = &inner.shared.nic;
    let before = inner.cq_reserved.fetch_add(want, Ordering::AcqRel);
    if before + want > nic.cq_depth as usize {
        inner.cq_reserved.fetch_sub(want, Ordering::AcqRel);
        return Err(Error::LimitExceeded {
            limit: "cq_depth",
            value: (before + want) as u64,
            max: u64::from(nic.cq_depth),
            hint: "every connected QP reserves max_send_wr completion entries; raise \
                   RdmaConfig::cq_depth, lower max_send_wr or qps_per_endpoint, or drop endpoints"
                .into(),
        });
    }
    Ok(())
}

/// Opens the control connection to `peer`, makes `n` QPs of `per_qp` send entries,
/// trades their records for the peer's (HELLO, HELLO_ACK), and walks each QP to RTS.
fn handshake(
    inner: &Inner,
    peer: &PeerAddr,
    deadline: Deadline,
    n: usize,
    per_qp: usize,
) -> Result<(Stream, Vec<Arc<Link>>)> {
    let timeout = deadline.remaining().min(inner.config.control_timeout);
    if timeout.is_zero() {
        return Err(Error::DeadlineExceeded {
            during: "rdma connect",
            elapsed: Duration::ZERO,
        });
    }
    let mut s = Stream::connect(peer, timeout)
        .map_err(|e| Error::peer(peer, format!("cannot reach its control listener: {e}")))?;
    s.set_timeouts(Some(timeout))
        .map_err(|e| Error::io("RDMA control connection", e))?;
    let nic = &inner.shared.nic;
    let mut qps = Vec::with_capacity(n);
    let mut records = Vec::with_capacity(n);
    let mut psns = Vec::with_capacity(n);
    for _ in 0..n {
        let qp = Qp::create(nic, per_qp as u32)?;
        qp.to_init()?;
        let psn = random_psn();
        records.push(nic.record(qp.qpn(), psn, inner.local_mtu));
        psns.push(psn);
        qps.push(qp);
    }
    let remote = exchange_records(inner, &mut s, peer, &records)?;
    let mut links = Vec::with_capacity(n);
    for (i, (qp, r)) in qps.into_iter().zip(&remote).enumerate() {
        qp.to_rtr(r, inner.local_mtu.min(r.mtu))?;
        qp.to_rts(psns[i], &inner.params)?;
        links.push(Arc::new(Link {
            index: i as u8,
            peer: peer.to_string(),
            inner: Mutex::new(LinkInner {
                qp,
                generation: inner.shared.next_generation(),
                state: LinkState::Ready,
                outstanding: 0,
                waiters: Vec::new(),
            }),
        }));
    }
    s.set_timeouts(Some(inner.config.control_timeout))
        .map_err(|e| Error::io("RDMA control connection", e))?;
    Ok((s, links))
}

/// Sends this side's QP records in a HELLO and reads the peer's, one per QP, from its
/// HELLO_ACK (or its refusal).
fn exchange_records(
    inner: &Inner,
    s: &mut Stream,
    peer: &PeerAddr,
    records: &[ConnRecord],
) -> Result<Vec<ConnRecord>> {
    let hello = control::encode_hello(&inner.address, records);
    let io = |e: std::io::Error| Error::peer(peer, format!("control handshake failed: {e}"));
    write_frame(s, control::HELLO, &hello).map_err(io)?;
    let (kind, payload) = read_frame(s).map_err(io)?;
    if kind == control::REFUSED {
        return Err(control::refused(peer, &payload));
    }
    if kind != control::HELLO_ACK {
        return Err(Error::Protocol(format!(
            "expected HELLO_ACK, got frame kind {kind}"
        )));
    }
    let remote = control::decode_records(&payload)?;
    if remote.len() != records.len() {
        return Err(Error::Protocol(format!(
            "the peer answered {} QP records for {} QPs",
            remote.len(),
            records.len()
        )));
    }
    Ok(remote)
}
