//! Transfers: issuing the chunks of a batch within its window (`pump`), the flush that
//! makes a WRITE visible at the target, finishing it, and cancelling what a caller gave
//! up on; and where each completed request goes.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Instant;

use futures::channel::oneshot;
use hmc_core::{Error, Op, Result};

use super::requests::{Issue, Owner, Requests};
use super::{Chunk, State};
use crate::sys;

/// A running transfer.
pub(super) struct TransferState {
    pub ep: u64,
    pub op: Op,
    pub chunks: Vec<Chunk>,
    /// The next chunk to issue.
    pub next: usize,
    /// Requests issued and not completed (chunks, then the flush).
    pub inflight: usize,
    pub flushed: bool,
    /// The UCX endpoint (generation) its first chunk was issued on.
    pub issued_on: Option<u64>,
    pub failure: Option<Error>,
    /// When `failure` was set: issued chunks must drain within `drain_timeout` of it.
    pub failed_at: Option<Instant>,
    pub deadline: Instant,
    pub started: Instant,
    pub reply: Option<oneshot::Sender<Result<()>>>,
    /// Callers of `Cancel` waiting for the transfer to end.
    pub cancel_done: Vec<mpsc::SyncSender<()>>,
}

impl TransferState {
    /// A transfer of `chunks` on `ep`, answered on `reply`.
    pub fn new(
        ep: u64,
        op: Op,
        chunks: Vec<Chunk>,
        deadline: Instant,
        reply: oneshot::Sender<Result<()>>,
    ) -> Self {
        TransferState {
            ep,
            op,
            chunks,
            next: 0,
            inflight: 0,
            flushed: false,
            issued_on: None,
            failure: None,
            failed_at: None,
            deadline,
            started: Instant::now(),
            reply: Some(reply),
            cancel_done: Vec::new(),
        }
    }

    /// Records the transfer's first failure (later ones are consequences).
    pub fn fail(&mut self, err: Error) {
        if self.failure.is_none() {
            self.failure = Some(err);
            self.failed_at = Some(Instant::now());
        }
    }
}

/// The running transfers by id.
pub(super) type Transfers = HashMap<u64, TransferState>;

impl State {
    /// Issues what a transfer may issue and finishes it when nothing is left in flight.
    pub(super) fn pump(&mut self, id: u64) {
        let window = self.cfg.tunables.max_inflight_chunks.max(1);
        while self.issue_next(id, window) {}
        self.end_when_drained(id);
    }

    /// Issues transfer `id`'s next chunk if its window, deadline, endpoint and key let
    /// it; whether another may follow. A reason to stop is recorded as its failure.
    fn issue_next(&mut self, id: u64, window: usize) -> bool {
        let Some(op) = self.ops.get_mut(&id) else {
            return false;
        };
        if op.failure.is_some() || op.next >= op.chunks.len() || op.inflight >= window {
            return false;
        }
        if Instant::now() >= op.deadline {
            let elapsed = op.started.elapsed();
            op.fail(Error::DeadlineExceeded {
                during: "ucx transfer",
                elapsed,
            });
            return false;
        }
        let chunk = op.chunks[op.next];
        let (ep_id, kind) = (op.ep, op.op);
        let Some(ep_handle) = self.eps.open_handle(ep_id) else {
            let err = self.eps.error(ep_id);
            self.fail_op(id, err);
            return false;
        };
        // The first transfer on an endpoint sends its generation's BIND; the lookups stay
        // off the per-chunk path once it is bound.
        if !self.eps.ready(ep_id) && !self.bind_then_ready(ep_id) {
            // Its UCX endpoint's generation is not bound yet, or being abandoned:
            // issued once it is (`generations`), or ended at the deadline.
            return false;
        }
        let Some(rkey) = self.live_rkey(chunk.key) else {
            let err = "the target deregistered the region (or the key was released)";
            self.fail_op(id, Error::InvalidKey(err.into()));
            return false;
        };
        let pid = self.eps.by_id.get(&ep_id).map(|e| e.phys);
        let op = self.ops.get_mut(&id).expect("present");
        op.next += 1;
        if op.issued_on.is_none() {
            op.issued_on = pid;
        }
        let slot = self.reqs.alloc(Owner::Chunk {
            op: id,
            key: chunk.key,
            ep: ep_id,
        });
        let p = Requests::param(slot);
        let (local, len, remote) = (chunk.local as *mut c_void, chunk.len, chunk.remote);
        // SAFETY: live endpoint and rkey; the local range lies in a registration the
        // transfer future keeps alive (it waits for this request before returning), and
        // the remote range was bounds-checked against the target's registration.
        let ret = unsafe {
            match kind {
                Op::Write => (self.ucp.ucp_put_nbx)(ep_handle, local, len, remote, rkey, &p),
                Op::Read => (self.ucp.ucp_get_nbx)(ep_handle, local, len, remote, rkey, &p),
            }
        };
        match self.reqs.settle(slot, ret) {
            Issue::Done(sys::UCS_OK) => {}
            Issue::Done(st) => {
                let err = self.status_error(ep_id, "ucp_put_nbx/ucp_get_nbx", st);
                self.fail_op(id, err);
            }
            Issue::Pending => self.count_chunk_inflight(id, chunk.key, ep_id),
        }
        true
    }

    /// The rkey of imported key `key` while the key is live.
    fn live_rkey(&self, key: u64) -> Option<sys::ucp_rkey_h> {
        let k = self.keys.imported.get(&key)?;
        (!k.shared.revoked.load(Ordering::Acquire) && !k.rkey.is_null()).then_some(k.rkey)
    }

    /// A chunk of transfer `id` on key `key` and endpoint `ep` is in flight: each counts it.
    fn count_chunk_inflight(&mut self, id: u64, key: u64, ep: u64) {
        self.ops.get_mut(&id).expect("present").inflight += 1;
        self.keys.imported.get_mut(&key).expect("checked").inflight += 1;
        self.eps.by_id.get_mut(&ep).expect("checked").inflight += 1;
    }

    /// Records `err` as running transfer `id`'s failure.
    fn fail_op(&mut self, id: u64, err: Error) {
        self.ops.get_mut(&id).expect("present").fail(err);
    }

    /// Once transfer `id` has nothing in flight and nothing left to issue (or failed):
    /// flushes a WRITE that issued chunks, else finishes it.
    fn end_when_drained(&mut self, id: u64) {
        let Some(op) = self.ops.get_mut(&id) else {
            return;
        };
        if op.inflight > 0 {
            return;
        }
        if op.failure.is_none() && op.next < op.chunks.len() {
            return;
        }
        // A put's completion only frees its source: its bytes are visible at the target
        // after a flush. So a WRITE ends with one, whether it completed or failed (a
        // deadline, a cancel) after issuing chunks: its end is reported only once every
        // issued byte has landed, or the endpoint was force-closed at `drain_timeout`
        // (housekeeping), so none of it lands after the caller heard of the end.
        if op.op == Op::Write && !op.flushed && op.next > 0 {
            self.flush_write(id);
            return;
        }
        let result = match op.failure.take() {
            Some(e) => Err(e),
            None => Ok(()),
        };
        self.finish(id, result);
    }

    /// Ends a WRITE that issued chunks with a flush of its endpoint (see `pump`), or at
    /// once where its generation was abandoned or its endpoint is gone.
    fn flush_write(&mut self, id: u64) {
        let op = self.ops.get_mut(&id).expect("present");
        let ep_id = op.ep;
        op.flushed = true;
        if op.issued_on.is_some() && op.issued_on != self.eps.by_id.get(&ep_id).map(|e| e.phys) {
            // Its generation was abandoned: the target dropped what it had not applied
            // and the force-close completed the rest; a flush of the new one proves
            // nothing about it.
            let err = op.failure.take().unwrap_or_else(|| {
                Error::Cancelled(
                    "the UCX endpoint's generation was abandoned (the peer made no \
                     progress within drain_timeout) before this WRITE was flushed"
                        .into(),
                )
            });
            self.finish(id, Err(err));
            return;
        }
        let Some(handle) = self.eps.open_handle(ep_id) else {
            let err = op.failure.take().unwrap_or_else(|| self.eps.error(ep_id));
            self.finish(id, Err(err));
            return;
        };
        let slot = self.reqs.alloc(Owner::Flush { op: id, ep: ep_id });
        let p = Requests::param(slot);
        // SAFETY: live endpoint; flush touches no user memory.
        let ret = unsafe { (self.ucp.ucp_ep_flush_nbx)(handle, &p) };
        match self.reqs.settle(slot, ret) {
            Issue::Done(sys::UCS_OK) => {
                let failure = self.ops.get_mut(&id).and_then(|o| o.failure.take());
                self.finish(id, failure.map_or(Ok(()), Err));
            }
            Issue::Done(st) => {
                let err = self.status_error(ep_id, "ucp_ep_flush_nbx", st);
                let failure = self.ops.get_mut(&id).and_then(|o| o.failure.take());
                self.finish(id, Err(failure.unwrap_or(err)));
            }
            Issue::Pending => {
                self.ops.get_mut(&id).expect("present").inflight += 1;
                self.eps.by_id.get_mut(&ep_id).expect("checked").inflight += 1;
            }
        }
    }

    pub(super) fn status_error(
        &self,
        ep: u64,
        function: &'static str,
        st: sys::ucs_status_t,
    ) -> Error {
        match self.eps.by_id.get(&ep) {
            Some(e) if e.failed.is_some() => self.eps.error(ep),
            _ if st == sys::UCS_ERR_CANCELED => {
                Error::Cancelled(format!("{function} was cancelled"))
            }
            _ => self.ucp.error(function, st),
        }
    }

    pub(super) fn finish(&mut self, id: u64, result: Result<()>) {
        if let Some(mut op) = self.ops.remove(&id) {
            if let Some(r) = op.reply.take() {
                let _ = r.send(result);
            }
            for d in op.cancel_done.drain(..) {
                let _ = d.send(());
            }
        }
    }

    pub(super) fn request_done(&mut self, slot: usize, status: sys::ucs_status_t) {
        let Some(rec) = self.reqs.complete(slot) else {
            return;
        };
        if !rec.req.is_null() {
            // SAFETY: the request was returned by an `_nbx` call and completed; freed once.
            unsafe { (self.ucp.ucp_request_free)(rec.req) };
        }
        match rec.owner {
            Owner::Chunk { op, key, ep } => {
                if let Some(k) = self.keys.imported.get_mut(&key) {
                    k.inflight -= 1;
                }
                self.ep_done(ep);
                self.op_step_done(op, ep, status, "ucp_put_nbx/ucp_get_nbx");
            }
            Owner::Flush { op, ep } => {
                self.ep_done(ep);
                self.op_step_done(op, ep, status, "ucp_ep_flush_nbx");
            }
            Owner::Notify { ep, reply, .. } => {
                self.ep_done(ep);
                if let Some(r) = reply {
                    let _ = r.send(if status == sys::UCS_OK {
                        Ok(())
                    } else {
                        Err(self.status_error(ep, "ucp_am_send_nbx", status))
                    });
                }
            }
            Owner::EpClose { ep } => self.phys_closed(ep),
            Owner::Gen { .. } => {}
            Owner::AckFlush { ep, ack } => {
                self.ep_done(ep);
                if let Some(a) = ack {
                    a();
                }
            }
        }
    }

    pub(super) fn op_step_done(
        &mut self,
        id: u64,
        ep: u64,
        status: sys::ucs_status_t,
        function: &'static str,
    ) {
        let err = (status != sys::UCS_OK).then(|| self.status_error(ep, function, status));
        let Some(op) = self.ops.get_mut(&id) else {
            return;
        };
        op.inflight -= 1;
        if let Some(e) = err {
            op.fail(e);
        }
        self.pump(id);
    }

    pub(super) fn cancel_requests_of(&mut self, id: u64) {
        for rec in self.reqs.iter() {
            if let Owner::Chunk { op, .. } = rec.owner
                && op == id
                && !rec.req.is_null()
            {
                // SAFETY: a live request of this worker; cancel is advisory.
                unsafe { (self.ucp.ucp_request_cancel)(self.worker, rec.req) };
            }
        }
    }
}
