//! Endpoint generations: how an initiator abandons what it sent to a target that stopped
//! running, so that none of it lands after the initiator reported the transfer's end, and
//! how the initiator's next transfer then works on a new UCX endpoint with the same keys.
//!
//! # Why
//!
//! Over TCP and shared memory UCX emulates RMA with active messages: a put is applied by
//! the *target's* progress thread. A WRITE to a stopped target (SIGSTOP, a debugger) sits
//! in the target's socket buffer or shared-memory queue; the initiator's flush cannot
//! complete, and force-closing its own endpoint does not take back what the target's
//! kernel or queue already holds. When the target runs again, its progress would apply
//! those bytes, long after the initiator reported the transfer failed.
//!
//! # How
//!
//! - Every UCX endpoint an initiator creates is a *generation* with a random token.
//!   Before its first transfer it sends a BIND active message carrying the token (with
//!   `UCP_AM_SEND_FLAG_REPLY`), so the target learns which of *its* UCX endpoints carries
//!   that generation; the target answers BOUND, and no transfer issues on the endpoint
//!   before that answer. (Not at creation: an endpoint that never carries a transfer is
//!   never wired up; see `State::bind_then_ready`.) A put names the target's endpoint,
//!   and UCX drops one that arrives for an endpoint closed there ("SW PUT request" on an
//!   unknown endpoint id).
//! - When a failed or cancelled transfer does not drain within `drain_timeout`, the
//!   initiator stops issuing on that UCX endpoint and sends ABANDON (the token) over the
//!   control connection. The target force-closes its endpoint of that generation and
//!   answers ABANDONED; the initiator then force-closes its own, which completes what was
//!   in flight, and only then reports the end.
//! - A stopped target cannot answer. The initiator waits `abandon_timeout` for the answer
//!   and at least until the target's host acknowledged the ABANDON frame (the socket's
//!   unacknowledged bytes are 0), so it lies in the target's socket buffer before the end
//!   is reported. The target's progress thread, before it progresses the worker after
//!   having been kept from running for longer than [`STALL_GAP`] (which `abandon_timeout`
//!   exceeds), first lets its control connections settle (every received frame handled,
//!   bounded by [`SETTLE_LIMIT`]) and ends the generations abandoned meanwhile: the queued
//!   bytes of an abandoned generation are then dropped, not applied.
//! - The initiator re-creates the UCX endpoint (a new generation, bound again) and
//!   unpacks every key imported on the user's endpoints again, so the next transfer over
//!   the same endpoint and keys works without connecting or importing again.
//!
//! # Limits
//!
//! - A target process stopped *inside* `ucp_worker_progress` finishes that call when it
//!   runs again, before anything else can run: what that call had already taken in still
//!   lands.
//! - A target whose progress thread runs while its control thread does not read for
//!   longer than `abandon_timeout` (a starved thread, not a stopped process) is not
//!   covered by the stall rule.
//! - A target host that does not acknowledge the ABANDON frame within `abandon_timeout`
//!   (a network partition) is warned about and the end is reported anyway.
//! - Transports without peer failure handling (`UCP_ERR_HANDLING_MODE_NONE`) cannot
//!   force-close: their generations are not bound and not protected.
//! - UCX 1.13 as Debian 12 builds it (with assertions) aborts a *target* process whose
//!   peer dies while the target's wire-up reply to it is still queued
//!   (openucx/ucx#8175, fixed upstream). Binding at the first transfer keeps peers that
//!   only connect, or only use staged transfers, out of that window; a peer killed
//!   during its first transfer's wire-up is not.
//! - The target keeps each generation's UCX endpoint handle until that generation is
//!   abandoned or the worker goes away; UCX 1.13 keeps those endpoints as long itself.

use std::collections::HashMap;
use std::ffi::c_void;
use std::time::{Duration, Instant};

use super::State;
use super::callbacks::{BOUND, GEN_AM_ID};
use super::endpoints::EpPhase;
#[cfg(test)]
use super::endpoints::new_token;
use super::requests::{Owner, Requests};
use crate::sys;

/// How long the target's progress thread may be kept from running (beyond a planned
/// park) before it settles its control connections ahead of progressing again.
pub(crate) const STALL_GAP: Duration = Duration::from_millis(100);
/// Longest a target waits for its control connections to settle after a stall.
pub(crate) const SETTLE_LIMIT: Duration = Duration::from_millis(500);

/// The target's record of its peers' generations: token → the UCX endpoint they arrive on.
#[derive(Default)]
pub(super) struct PeerGens {
    pub by_token: HashMap<u64, sys::ucp_ep_h>,
}

/// When the worker was last progressed and how long the thread then meant to sleep: a
/// longer absence is a stall (see the module docs).
pub(super) struct StallClock {
    pub mark: Instant,
    pub allowed: Duration,
}

impl StallClock {
    /// A clock marked now.
    pub fn new() -> Self {
        StallClock {
            mark: Instant::now(),
            allowed: Duration::ZERO,
        }
    }

    /// Whether the thread was kept from running for longer than [`STALL_GAP`] since the
    /// last mark.
    pub fn stalled(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.mark) > self.allowed + STALL_GAP
    }
}

impl State {
    /// Sends a BIND or BOUND for `token` on `handle`; whether it was sent.
    pub(super) fn send_gen(&mut self, handle: sys::ucp_ep_h, kind: u8, token: u64) -> bool {
        let mut header = Box::new([0u8; 9]);
        header[0] = kind;
        header[1..].copy_from_slice(&token.to_be_bytes());
        let hp = header.as_ptr();
        let slot = self.reqs.alloc(Owner::Gen {
            _header: Some(header),
        });
        let mut p = Requests::param(slot);
        p.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = sys::UCP_AM_SEND_FLAG_EAGER;
        if kind != BOUND {
            p.flags |= sys::UCP_AM_SEND_FLAG_REPLY;
        }
        // SAFETY: a live endpoint; the header is boxed in the request's slot (moving the
        // box does not move its bytes) until the send completes.
        let ret = unsafe {
            (self.ucp.ucp_am_send_nbx)(
                handle,
                GEN_AM_ID,
                hp as *const c_void,
                9,
                std::ptr::null(),
                0,
                &p,
            )
        };
        match self.reqs.issued(slot, ret) {
            Some((sys::UCS_OK, _)) | None => true,
            Some((st, _)) => {
                tracing::warn!(
                    status = %self.ucp.status_string(st),
                    "could not send an endpoint-generation message; transfers on this \
                     endpoint are not protected against a stopped target"
                );
                false
            }
        }
    }

    /// A peer's BIND: remembers the endpoint its generation arrives on and answers.
    pub(super) fn bind_arrived(&mut self, token: u64, reply_ep: sys::ucp_ep_h) {
        // An endpoint UCX destroyed (its peer failed) may have left its address to this
        // one: a generation recorded there is gone.
        self.gens.by_token.retain(|_, h| *h != reply_ep);
        self.gens.by_token.insert(token, reply_ep);
        self.send_gen(reply_ep, BOUND, token);
    }

    /// A target's BOUND: transfers waiting on that generation's endpoint issue now.
    pub(super) fn bound_arrived(&mut self, token: u64) {
        let Some(pid) = self
            .eps
            .phys
            .iter()
            .find(|(_, p)| p.token == token)
            .map(|(i, _)| *i)
        else {
            return;
        };
        self.eps.phys.get_mut(&pid).expect("found").bound = true;
        self.pump_on(pid);
    }

    /// Pumps every transfer on a user endpoint of UCX endpoint `pid`.
    fn pump_on(&mut self, pid: u64) {
        let ids: Vec<u64> = self
            .ops
            .iter()
            .filter(|(_, o)| self.eps.by_id.get(&o.ep).is_some_and(|e| e.phys == pid))
            .map(|(i, _)| *i)
            .collect();
        for id in ids {
            self.pump(id);
        }
    }

    /// Target: ends a peer's generation `token` by force-closing the UCX endpoint it
    /// arrives on, so that what is still queued for it is dropped. Whether it was known.
    fn end_peer_gen(&mut self, token: u64) -> bool {
        let Some(handle) = self.gens.by_token.remove(&token) else {
            return false;
        };
        tracing::debug!(
            token,
            "a peer abandoned an endpoint generation; force-closing it"
        );
        // UCX may have matched it with an endpoint of our own to that peer.
        if let Some(pid) = self
            .eps
            .phys
            .iter()
            .find(|(_, p)| p.handle == handle)
            .map(|(i, _)| *i)
        {
            self.phys_failed(pid, "the peer abandoned this endpoint's generation".into());
            return true;
        }
        let slot = self.reqs.alloc(Owner::Gen { _header: None });
        let mut p = Requests::param(slot);
        p.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = sys::UCP_EP_CLOSE_FLAG_FORCE;
        // SAFETY: an endpoint UCX created for the peer's BIND, closed once (removed from
        // the table); UCX keeps such endpoints until the worker goes away.
        let ret = unsafe { (self.ucp.ucp_ep_close_nbx)(handle, &p) };
        if let Some((st, _)) = self.reqs.issued(slot, ret)
            && st != sys::UCS_OK
        {
            tracing::warn!(
                status = %self.ucp.status_string(st),
                "could not force-close an abandoned endpoint generation"
            );
            return false;
        }
        true
    }

    /// Target: ends the generations that control connections were told to abandon, and
    /// answers each.
    pub(super) fn take_abandons(&mut self) {
        for (token, ack) in self.control.take_abandons() {
            let ended = self.end_peer_gen(token);
            ack(ended);
        }
    }

    /// Called before every `ucp_worker_progress`: after a stall, settles the control
    /// connections and ends the generations abandoned meanwhile (module docs).
    pub(super) fn before_progress(&mut self) {
        let now = Instant::now();
        if self.stall.stalled(now) && !self.gens.by_token.is_empty() {
            tracing::debug!(
                absent = ?now.saturating_duration_since(self.stall.mark),
                "the progress thread was kept from running; settling control connections first"
            );
            self.control.wait_idle(SETTLE_LIMIT);
            self.take_abandons();
        }
    }

    /// Initiator: a failed transfer on `ep` did not drain within `drain_timeout`. Starts
    /// abandoning its UCX endpoint's generation; `false` when that cannot be done (no
    /// bound generation, or no control connection), and the endpoint is to be closed.
    pub(super) fn abandon(&mut self, ep: u64) -> bool {
        let Some(pid) = self.eps.by_id.get(&ep).map(|e| e.phys) else {
            return false;
        };
        let Some(ph) = self.eps.phys.get(&pid) else {
            return false;
        };
        if ph.abandoning || (!ph.bound && !ph.failed && !ph.closing) {
            // Being abandoned, or a new generation still being bound: what is stuck was
            // issued on an older one, force-closed already, and completes from that close.
            return true;
        }
        if !ph.bound || !ph.peer_mode || ph.failed || ph.closing {
            return false;
        }
        let link = self
            .eps
            .by_id
            .values()
            .filter(|e| e.phys == pid && e.phase == EpPhase::Open)
            .find_map(|e| e.link.clone().filter(|l| !l.is_dead()));
        let Some(link) = link else {
            return false;
        };
        let token = ph.token;
        self.eps.phys.get_mut(&pid).expect("present").abandoning = true;
        tracing::warn!(
            ep,
            "a failed ucx transfer did not drain within drain_timeout (the peer makes no \
             progress); abandoning its endpoint generation at the peer"
        );
        let (tx, wake, wait) = (
            self.abandoned_tx.clone(),
            self.wake.clone(),
            self.cfg.tunables.abandon_timeout,
        );
        let spawned = std::thread::Builder::new()
            .name("hmc-ucx-abandon".into())
            .spawn(move || {
                let confirmed = link.abandon(token, wait);
                if tx.send((pid, confirmed)).is_ok() {
                    wake.signal();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot spawn the thread that abandons a generation");
            self.eps.phys.get_mut(&pid).expect("present").abandoning = false;
            return false;
        }
        true
    }

    /// Initiator: the target dropped generation `pid` (or was told so while stopped).
    /// Force-closes the UCX endpoint, which completes what was in flight on it, and moves
    /// its user endpoints and their keys to a new generation.
    pub(super) fn abandoned(&mut self, pid: u64, confirmed: bool) {
        let Some(ph) = self.eps.phys.get_mut(&pid) else {
            return;
        };
        tracing::debug!(
            pid,
            confirmed,
            "endpoint generation abandoned; starting a new one"
        );
        let addr = ph.addr.clone();
        ph.failed = true;
        if self.eps.phys_by_addr.get(&addr) == Some(&pid) {
            self.eps.phys_by_addr.remove(&addr);
        }
        let users: Vec<u64> = self
            .eps
            .by_id
            .iter()
            .filter(|(_, e)| e.phys == pid && e.phase == EpPhase::Open)
            .map(|(i, _)| *i)
            .collect();
        self.close_phys(pid, true);
        self.detach_requests(pid);
        if users.is_empty() || self.life.closed {
            return;
        }
        let next = self.id();
        let handle = match self.create_phys(next, &addr) {
            Ok(h) => h,
            Err(e) => {
                for ep in users {
                    self.begin_ep_close(ep, Some(format!("reconnecting failed: {e}")), true);
                }
                return;
            }
        };
        self.eps.phys.get_mut(&next).expect("created").refs = users.len();
        for ep in users {
            let e = self.eps.by_id.get_mut(&ep).expect("listed");
            e.handle = handle;
            e.phys = next;
            let keys = e.keys.clone();
            for k in keys {
                if let Err(err) = self.unpack_again(k, handle) {
                    tracing::warn!(ep, error = %err, "a key could not be unpacked on the new endpoint");
                }
            }
        }
    }

    /// After generation `pid` was force-closed: the requests of its transfers that the
    /// close did not complete (UCX 1.13 leaves an emulated GET waiting for a reply that
    /// can no longer come: the target dropped the generation) are detached from them, so
    /// the transfers end. First the worker is progressed until quiet, so a reply already
    /// received (shared memory) is applied before the end is reported; one still in a
    /// socket went with the closed endpoint.
    fn detach_requests(&mut self, pid: u64) {
        while self.progress() {}
        self.handle_events();
        let ops: Vec<u64> = self
            .ops
            .iter()
            .filter(|(_, o)| o.issued_on == Some(pid))
            .map(|(i, _)| *i)
            .collect();
        if ops.is_empty() {
            return;
        }
        let mut detached = Vec::new();
        for (slot, rec) in self.reqs.slots_mut() {
            let owned = match rec.owner {
                Owner::Chunk { op, .. } | Owner::Flush { op, .. } => ops.contains(&op),
                _ => false,
            };
            if owned {
                let owner = std::mem::replace(&mut rec.owner, Owner::Gen { _header: None });
                detached.push((slot, owner));
            }
        }
        for (slot, owner) in detached {
            tracing::debug!(
                slot,
                "detaching a request of an abandoned endpoint generation"
            );
            match owner {
                Owner::Chunk { op, key, ep } => {
                    if let Some(k) = self.keys.imported.get_mut(&key) {
                        k.inflight -= 1;
                    }
                    self.ep_done(ep);
                    self.op_step_done(op, ep, sys::UCS_ERR_CANCELED, "ucp_put_nbx/ucp_get_nbx");
                }
                Owner::Flush { op, ep } => {
                    self.ep_done(ep);
                    self.op_step_done(op, ep, sys::UCS_ERR_CANCELED, "ucp_ep_flush_nbx");
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_absence_past_the_planned_park_and_the_gap_is_a_stall() {
        let t = Instant::now();
        let after_progress = StallClock {
            mark: t,
            allowed: Duration::ZERO,
        };
        assert!(!after_progress.stalled(t + STALL_GAP));
        assert!(after_progress.stalled(t + STALL_GAP + Duration::from_millis(1)));
        // A park of 100 ms that woke on time, or up to STALL_GAP late, is no stall; later is.
        let parked = StallClock {
            mark: t,
            allowed: Duration::from_millis(100),
        };
        assert!(!parked.stalled(t + Duration::from_millis(100)));
        assert!(!parked.stalled(t + Duration::from_millis(100) + STALL_GAP));
        assert!(parked.stalled(t + Duration::from_millis(101) + STALL_GAP));
        // A clock read before the mark (another thread's instant) is no stall.
        assert!(!parked.stalled(t));
    }

    #[test]
    fn tokens_differ() {
        let tokens: std::collections::HashSet<u64> = (0..1000).map(|_| new_token()).collect();
        assert_eq!(tokens.len(), 1000);
    }
}
