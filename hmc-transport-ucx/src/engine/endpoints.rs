//! Endpoints: creating, sharing and lingering the physical UCX endpoint to each peer
//! worker, closing endpoints gracefully or by force, and reacting to a peer's failure.
//!
//! A user's endpoint ([`EpState`], one per `connect`) sits on a physical UCX endpoint
//! ([`PhysEp`], one per peer worker), shared by every user endpoint to that worker and kept
//! for `ep_linger` after the last one closes. Reusing it means a peer that connects and
//! disconnects often does not make UCX build (and leave behind on the passive side) a new
//! transport connection each time.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use hmc_core::{Error, Result};

use super::callbacks::{BIND, on_ep_error};
use super::requests::{Ack, Issue, Owner, Requests};
use super::{InitiatorControl, State};
use crate::sys;

/// Where a user's endpoint is in its life.
#[derive(PartialEq, Eq, Clone, Copy, Debug)]
pub(super) enum EpPhase {
    Open,
    /// Failed or closing: no new operations; waiting for in-flight requests.
    Draining,
    Closed,
}

/// A UCX endpoint to one peer worker.
pub(super) struct PhysEp {
    pub handle: sys::ucp_ep_h,
    pub addr: Vec<u8>,
    pub refs: usize,
    pub failed: bool,
    pub closing: bool,
    /// Created with `UCP_ERR_HANDLING_MODE_PEER`; only then may it be closed with FORCE
    /// (UCX: FORCE without PEER mode on both sides is undefined behaviour).
    pub peer_mode: bool,
    pub idle_since: Option<Instant>,
    /// This endpoint's generation (`generations`): the token of its BIND.
    pub token: u64,
    /// The target answered the BIND: transfers may issue on it.
    pub bound: bool,
    /// Its BIND was sent (at the first transfer that needs it; see [`State::bind_then_ready`]).
    pub bind_sent: bool,
    /// Its generation is being abandoned: nothing more is issued on it.
    pub abandoning: bool,
}

/// A user's endpoint.
pub(super) struct EpState {
    pub handle: sys::ucp_ep_h,
    pub phys: u64,
    pub phase: EpPhase,
    pub failed: Option<String>,
    /// The user dropped the endpoint: remove the entry once closed.
    pub released: bool,
    /// UCX or the control connection reported the peer gone: close with FORCE.
    pub peer_failed: bool,
    pub inflight: usize,
    /// The imported keys used through this endpoint.
    pub keys: Vec<u64>,
    pub drain_since: Option<Instant>,
    /// The control connection beside it, which carries an abandon to the target.
    pub link: Option<Arc<dyn InitiatorControl>>,
}

/// The engine's endpoints, user and physical.
pub(super) struct Endpoints {
    pub by_id: HashMap<u64, EpState>,
    pub phys: HashMap<u64, PhysEp>,
    pub phys_by_addr: HashMap<Vec<u8>, u64>,
    /// The selected transports refused `UCP_ERR_HANDLING_MODE_PEER` once.
    pub peer_mode_unsupported: bool,
    /// UCX endpoints held, including ones still closing (read by the communicator's stats).
    pub count: Arc<AtomicUsize>,
}

impl Endpoints {
    /// No endpoints; `count` is shared with the engine's handle.
    pub fn new(count: Arc<AtomicUsize>) -> Self {
        Endpoints {
            by_id: HashMap::new(),
            phys: HashMap::new(),
            phys_by_addr: HashMap::new(),
            peer_mode_unsupported: false,
            count,
        }
    }

    /// The UCX handle of `ep` while it is open.
    pub fn open_handle(&self, ep: u64) -> Option<sys::ucp_ep_h> {
        match self.by_id.get(&ep) {
            Some(e) if e.phase == EpPhase::Open => Some(e.handle),
            _ => None,
        }
    }

    /// Whether `ep`'s UCX endpoint generation is being abandoned.
    pub fn abandoning(&self, ep: u64) -> bool {
        self.by_id
            .get(&ep)
            .and_then(|e| self.phys.get(&e.phys))
            .is_some_and(|p| p.abandoning)
    }

    /// Whether transfers may issue on `ep` now: its UCX endpoint's generation is bound at
    /// the target and not being abandoned (until then they wait, within their deadline).
    pub fn ready(&self, ep: u64) -> bool {
        self.by_id
            .get(&ep)
            .and_then(|e| self.phys.get(&e.phys))
            .is_some_and(|p| p.bound && !p.abandoning)
    }

    /// Why `ep` cannot be used: its failure, or that it is closed.
    pub fn error(&self, ep: u64) -> Error {
        match self.by_id.get(&ep) {
            Some(e) if e.failed.is_some() => Error::peer(
                "ucx endpoint",
                format!("{}; connect again", e.failed.as_deref().unwrap_or_default()),
            ),
            Some(e) if e.phase == EpPhase::Open => Error::peer("ucx endpoint", "usable"),
            _ => Error::Closed("the UCX endpoint is closed".into()),
        }
    }
}

impl State {
    pub(super) fn create_ep(
        &mut self,
        worker_addr: &[u8],
        link: Option<Arc<dyn InitiatorControl>>,
    ) -> Result<u64> {
        let cached = self.eps.phys_by_addr.get(worker_addr).copied();
        let (pid, handle) = match cached {
            Some(pid) => {
                let ph = self.eps.phys.get_mut(&pid).expect("indexed");
                ph.refs += 1;
                ph.idle_since = None;
                (pid, ph.handle)
            }
            None => {
                let pid = self.id();
                let handle = self.create_phys(pid, worker_addr)?;
                (pid, handle)
            }
        };
        let id = self.id();
        self.eps.by_id.insert(
            id,
            EpState {
                handle,
                phys: pid,
                phase: EpPhase::Open,
                failed: None,
                released: false,
                peer_failed: false,
                inflight: 0,
                keys: Vec::new(),
                drain_since: None,
                link,
            },
        );
        Ok(id)
    }

    pub(super) fn create_phys(&mut self, id: u64, worker_addr: &[u8]) -> Result<sys::ucp_ep_h> {
        // SAFETY: all-zero is valid; flagged fields set below.
        let mut p: sys::ucp_ep_params_t = unsafe { std::mem::zeroed() };
        p.field_mask = sys::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS
            | sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
            | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER;
        p.address = worker_addr.as_ptr() as *const c_void;
        p.err_mode = sys::UCP_ERR_HANDLING_MODE_PEER;
        p.err_handler = sys::ucp_err_handler_t {
            cb: Some(on_ep_error),
            arg: id as *mut c_void,
        };
        let mut ep: sys::ucp_ep_h = std::ptr::null_mut();
        // SAFETY: live worker; the address bytes outlive the call (UCX copies what it needs).
        let mut st = if self.eps.peer_mode_unsupported {
            sys::UCS_ERR_UNREACHABLE
        } else {
            unsafe { (self.ucp.ucp_ep_create)(self.worker, &p, &mut ep) }
        };
        if st == sys::UCS_ERR_UNREACHABLE {
            // Remembered, so UCX logs its "no peer failure handler" error once per communicator.
            self.eps.peer_mode_unsupported = true;
            // UCX 1.13's shared-memory transports (posix, sysv) have no peer-failure handler,
            // so UCX refuses PEER mode over them. Fall back to NONE: the control connection's
            // EOF still reports a dead peer, and CMA operations to a dead process fail.
            tracing::debug!(
                "peer error handling unsupported by the selected transports; using UCP_ERR_HANDLING_MODE_NONE"
            );
            p.field_mask &=
                !(sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER);
            // SAFETY: as above.
            st = unsafe { (self.ucp.ucp_ep_create)(self.worker, &p, &mut ep) };
        }
        if st != sys::UCS_OK {
            return Err(Error::peer(
                "ucx worker",
                format!("ucp_ep_create failed: {}", self.ucp.status_string(st)),
            ));
        }
        self.eps.count.fetch_add(1, Ordering::AcqRel);
        let token = new_token();
        // A generation can be abandoned only where the endpoint can be force-closed at
        // both ends (PEER mode); without it transfers issue at once, unprotected. The BIND
        // waits for the first transfer on the endpoint (`bind_then_ready`), not its creation.
        let peer_mode = !self.eps.peer_mode_unsupported;
        let bound = !peer_mode;
        self.eps.phys.insert(
            id,
            PhysEp {
                handle: ep,
                addr: worker_addr.to_vec(),
                refs: 1,
                failed: false,
                closing: false,
                peer_mode,
                idle_since: None,
                token,
                bound,
                bind_sent: false,
                abandoning: false,
            },
        );
        self.eps.phys_by_addr.insert(worker_addr.to_vec(), id);
        Ok(ep)
    }

    /// [`Self::bind_for`], then whether transfers may issue on `ep` now (a BIND that could
    /// not be sent leaves the endpoint unprotected and ready).
    pub(super) fn bind_then_ready(&mut self, ep: u64) -> bool {
        self.bind_for(ep);
        self.eps.ready(ep)
    }

    /// Sends the BIND of `ep`'s UCX endpoint generation if it has not been sent: called
    /// by a transfer about to issue on it. Binding at the first transfer rather than at
    /// creation keeps UCX's wire-up off endpoints that never carry a transfer (a peer
    /// whose transfers are all staged over the control connection): UCX 1.13 (Debian
    /// 12's build, with assertions) aborts the *target* process when the peer dies while
    /// the target's wire-up reply is still queued (openucx/ucx#8175, fixed upstream).
    fn bind_for(&mut self, ep: u64) {
        let Some(pid) = self.eps.by_id.get(&ep).map(|e| e.phys) else {
            return;
        };
        let Some(ph) = self.eps.phys.get_mut(&pid) else {
            return;
        };
        if ph.bound || ph.bind_sent || ph.abandoning || ph.failed || ph.closing {
            return;
        }
        ph.bind_sent = true;
        let (handle, token) = (ph.handle, ph.token);
        if !self.send_gen(handle, BIND, token) {
            // Not sent: transfers issue unprotected (`send_gen` warned).
            self.eps.phys.get_mut(&pid).expect("present").bound = true;
        }
    }

    /// Drops one reference to a UCX endpoint; closes it when unused and failed (FORCE),
    /// or when the communicator is closing, else keeps it for reuse.
    pub(super) fn release_phys(&mut self, pid: u64, failed: bool) {
        let closed = self.life.closed;
        let Some(ph) = self.eps.phys.get_mut(&pid) else {
            return;
        };
        ph.refs -= 1;
        if failed && !ph.failed {
            ph.failed = true;
            let addr = ph.addr.clone();
            self.eps.phys_by_addr.remove(&addr);
        }
        let ph = self.eps.phys.get_mut(&pid).expect("present");
        if ph.refs == 0 {
            if ph.failed || closed {
                let force = ph.failed;
                self.close_phys(pid, force);
            } else {
                ph.idle_since = Some(Instant::now());
            }
        }
    }

    pub(super) fn close_phys(&mut self, pid: u64, force: bool) {
        let Some(ph) = self.eps.phys.get_mut(&pid) else {
            return;
        };
        if ph.closing {
            return;
        }
        ph.closing = true;
        let force = force && ph.peer_mode;
        let (handle, addr) = (ph.handle, ph.addr.clone());
        if self.eps.phys_by_addr.get(&addr) == Some(&pid) {
            self.eps.phys_by_addr.remove(&addr);
        }
        let slot = self.reqs.alloc(Owner::EpClose { ep: pid });
        let mut p = Requests::param(slot);
        if force {
            p.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_FLAGS;
            p.flags = sys::UCP_EP_CLOSE_FLAG_FORCE;
        }
        // SAFETY: a live UCX endpoint nobody uses any more (refs == 0), closed once.
        let ret = unsafe { (self.ucp.ucp_ep_close_nbx)(handle, &p) };
        if let Issue::Done(_) = self.reqs.settle(slot, ret) {
            self.phys_closed(pid);
        }
    }

    /// Gracefully closes unused UCX endpoints idle since before `older_than` (all if `None`).
    pub(super) fn close_idle_phys(&mut self, older_than: Option<Instant>) {
        let idle: Vec<u64> = self
            .eps
            .phys
            .iter()
            .filter(|(_, p)| {
                p.refs == 0
                    && !p.closing
                    && older_than.is_none_or(|t| p.idle_since.is_some_and(|i| i <= t))
            })
            .map(|(i, _)| *i)
            .collect();
        for pid in idle {
            self.close_phys(pid, false);
        }
    }

    pub(super) fn phys_closed(&mut self, pid: u64) {
        if self.eps.phys.remove(&pid).is_some() {
            self.eps.count.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// UCX reported the endpoint to a peer worker failed: fail everything using it.
    pub(super) fn phys_failed(&mut self, pid: u64, reason: String) {
        if let Some(ph) = self.eps.phys.get_mut(&pid) {
            ph.failed = true;
            let addr = ph.addr.clone();
            if self.eps.phys_by_addr.get(&addr) == Some(&pid) {
                self.eps.phys_by_addr.remove(&addr);
            }
        }
        if self.eps.phys.get(&pid).is_some_and(|p| p.refs == 0) {
            self.close_phys(pid, true);
            return;
        }
        let eps: Vec<u64> = self
            .eps
            .by_id
            .iter()
            .filter(|(_, e)| e.phys == pid && e.phase != EpPhase::Closed)
            .map(|(i, _)| *i)
            .collect();
        for ep in eps {
            self.begin_ep_close(ep, Some(reason.clone()), true);
        }
        // A dead peer never completes what is queued for it: a FORCE close completes every
        // outstanding request (UCS_ERR_CANCELED), so the transfers drain now instead of at
        // `drain_timeout`. Their rkeys are destroyed right after, when the endpoints drain.
        if self.eps.phys.get(&pid).is_some_and(|p| p.peer_mode) {
            self.close_phys(pid, true);
        }
    }

    /// Starts tearing an endpoint down: `reason` marks a failure (peer gone, local close).
    pub(super) fn begin_ep_close(&mut self, ep: u64, reason: Option<String>, peer_failed: bool) {
        let Some(e) = self.eps.by_id.get_mut(&ep) else {
            return;
        };
        e.peer_failed |= peer_failed;
        if e.failed.is_none()
            && let Some(r) = &reason
        {
            tracing::debug!(ep, reason = %r, "ucx endpoint failed");
            e.failed = Some(r.clone());
        }
        if e.phase == EpPhase::Open {
            e.phase = EpPhase::Draining;
            e.drain_since = Some(Instant::now());
        }
        let keys = e.keys.clone();
        for k in keys {
            if let Some(k) = self.keys.imported.get(&k) {
                k.shared.revoke();
            }
        }
        let err = self.eps.error(ep);
        let ids: Vec<u64> = self
            .ops
            .iter()
            .filter(|(_, o)| o.ep == ep)
            .map(|(i, _)| *i)
            .collect();
        for id in ids {
            let op = self.ops.get_mut(&id).expect("present");
            if op.failure.is_none() {
                op.failure = Some(match &err {
                    Error::Peer { peer, reason } => Error::peer(peer, reason.clone()),
                    _ => Error::Closed("the UCX endpoint was closed".into()),
                });
                op.failed_at = Some(Instant::now());
            }
            self.pump(id);
        }
        self.advance_ep(ep);
    }

    /// Moves a draining endpoint on: once nothing is in flight (or `drain_timeout` passed),
    /// destroys its rkeys and closes it; removes it once closed and released.
    pub(super) fn advance_ep(&mut self, ep: u64) {
        let Some(e) = self.eps.by_id.get_mut(&ep) else {
            return;
        };
        match e.phase {
            EpPhase::Open => {}
            EpPhase::Draining => {
                let timed_out = e
                    .drain_since
                    .is_some_and(|t| t.elapsed() >= self.cfg.tunables.drain_timeout);
                if e.inflight > 0 && !timed_out {
                    return;
                }
                let leak_keys = e.inflight > 0;
                // Only a failed peer or a stuck drain justifies FORCE: a forced close of a live
                // connection leaves the peer's wire-up half done, which UCX 1.13 handles badly.
                let failed = e.peer_failed || timed_out;
                let pid = e.phys;
                e.phase = EpPhase::Closed;
                e.handle = std::ptr::null_mut();
                if e.failed.is_none() {
                    e.failed = Some("the endpoint was closed".into());
                }
                let keys = std::mem::take(&mut e.keys);
                if leak_keys {
                    tracing::warn!(
                        ep,
                        "ucx endpoint did not drain within drain_timeout; force-closing it and leaking its rkeys"
                    );
                }
                for k in keys {
                    if let Some(mut k) = self.keys.imported.remove(&k) {
                        if leak_keys {
                            k.rkey = std::ptr::null_mut();
                        }
                        self.destroy_rkey(k);
                    }
                }
                self.release_phys(pid, failed);
                self.advance_ep(ep);
            }
            EpPhase::Closed => {
                if e.released {
                    self.eps.by_id.remove(&ep);
                }
            }
        }
    }

    pub(super) fn ep_done(&mut self, ep: u64) {
        if let Some(e) = self.eps.by_id.get_mut(&ep) {
            e.inflight -= 1;
            if e.inflight == 0 && e.phase == EpPhase::Draining {
                self.advance_ep(ep);
            }
        }
    }

    /// Runs `ack` once everything issued on `ep` is complete at the target: over transports
    /// that emulate RMA with messages, a put completes locally before the target applied it.
    pub(super) fn flush_then(&mut self, ep: u64, ack: Ack) {
        let Some(handle) = self.eps.open_handle(ep) else {
            return ack();
        };
        let slot = self.reqs.alloc(Owner::AckFlush { ep, ack: Some(ack) });
        let p = Requests::param(slot);
        // SAFETY: live endpoint; flush touches no user memory.
        let ret = unsafe { (self.ucp.ucp_ep_flush_nbx)(handle, &p) };
        match self.reqs.issued(slot, ret) {
            Some((_, rec)) => {
                if let Owner::AckFlush { ack: Some(a), .. } = rec.owner {
                    a();
                }
            }
            None => self.eps.by_id.get_mut(&ep).expect("checked").inflight += 1,
        }
    }
}

/// A fresh, unpredictable generation token (`generations`): what a BIND carries.
pub(super) fn new_token() -> u64 {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish()
}
