//! Transfers: the request slots UCX callbacks complete, issuing the chunks of a batch
//! (`pump`), finishing it, and cancelling what a caller gave up on.

use super::*;

impl State {
    pub(super) fn alloc_slot(&mut self, owner: Owner) -> usize {
        let rec = Some(ReqRec {
            owner,
            req: std::ptr::null_mut(),
        });
        match self.free_slots.pop() {
            Some(i) => {
                self.reqs[i] = rec;
                i
            }
            None => {
                self.reqs.push(rec);
                self.reqs.len() - 1
            }
        }
    }

    pub(super) fn param(slot: usize) -> sys::ucp_request_param_t {
        let mut p = sys::ucp_request_param_t::empty();
        p.op_attr_mask = sys::UCP_OP_ATTR_FIELD_CALLBACK | sys::UCP_OP_ATTR_FIELD_USER_DATA;
        p.cb = Some(on_request);
        p.user_data = slot as *mut c_void;
        p
    }

    /// Interprets an `_nbx` return value; keeps the slot when a request is pending.
    pub(super) fn settle(&mut self, slot: usize, ret: sys::ucs_status_ptr_t) -> Issue {
        if ret.is_null() {
            self.reqs[slot] = None;
            self.free_slots.push(slot);
            Issue::Done(sys::UCS_OK)
        } else if sys::ptr_is_err(ret) {
            self.reqs[slot] = None;
            self.free_slots.push(slot);
            Issue::Done(sys::ptr_status(ret))
        } else {
            self.reqs[slot].as_mut().expect("allocated").req = ret;
            self.live_requests += 1;
            Issue::Pending
        }
    }

    /// Issues what a transfer may issue and finishes it when nothing is left in flight.
    pub(super) fn pump(&mut self, id: u64) {
        let window = self.cfg.max_inflight_chunks.max(1);
        loop {
            let Some(op) = self.ops.get_mut(&id) else {
                return;
            };
            if op.failure.is_some() || op.next >= op.chunks.len() || op.inflight >= window {
                break;
            }
            if Instant::now() >= op.deadline {
                op.failure = Some(Error::DeadlineExceeded {
                    during: "ucx transfer",
                    elapsed: op.started.elapsed(),
                });
                op.failed_at = Some(Instant::now());
                break;
            }
            let chunk = op.chunks[op.next];
            let (ep_id, kind) = (op.ep, op.op);
            let ep_handle = match self.eps.get(&ep_id) {
                Some(e) if e.phase == EpPhase::Open => e.handle,
                _ => {
                    let err = self.ep_error(ep_id);
                    let op = self.ops.get_mut(&id).expect("present");
                    op.failure = Some(err);
                    op.failed_at = Some(Instant::now());
                    break;
                }
            };
            let rkey = match self.keys.get(&chunk.key) {
                Some(k) if !k.shared.revoked.load(Ordering::Acquire) && !k.rkey.is_null() => k.rkey,
                _ => {
                    let op = self.ops.get_mut(&id).expect("present");
                    op.failure = Some(Error::InvalidKey(
                        "the target deregistered the region (or the key was released)".into(),
                    ));
                    op.failed_at = Some(Instant::now());
                    break;
                }
            };
            let op = self.ops.get_mut(&id).expect("present");
            op.next += 1;
            let slot = self.alloc_slot(Owner::Chunk {
                op: id,
                key: chunk.key,
                ep: ep_id,
            });
            let p = Self::param(slot);
            // SAFETY: live endpoint and rkey; the local range lies in a registration the
            // transfer future keeps alive (it waits for this request before returning), and
            // the remote range was bounds-checked against the target's registration.
            let ret = unsafe {
                match kind {
                    Op::Write => (self.ucp.ucp_put_nbx)(
                        ep_handle,
                        chunk.local as *const c_void,
                        chunk.len,
                        chunk.remote,
                        rkey,
                        &p,
                    ),
                    Op::Read => (self.ucp.ucp_get_nbx)(
                        ep_handle,
                        chunk.local as *mut c_void,
                        chunk.len,
                        chunk.remote,
                        rkey,
                        &p,
                    ),
                }
            };
            match self.settle(slot, ret) {
                Issue::Done(sys::UCS_OK) => {}
                Issue::Done(st) => {
                    let err = self.status_error(ep_id, "ucp_put_nbx/ucp_get_nbx", st);
                    let op = self.ops.get_mut(&id).expect("present");
                    op.failure = Some(err);
                    op.failed_at = Some(Instant::now());
                }
                Issue::Pending => {
                    self.ops.get_mut(&id).expect("present").inflight += 1;
                    self.keys.get_mut(&chunk.key).expect("checked").inflight += 1;
                    self.eps.get_mut(&ep_id).expect("checked").inflight += 1;
                }
            }
        }
        let op = self.ops.get_mut(&id).expect("present");
        if op.inflight > 0 {
            return;
        }
        if op.failure.is_none() && op.next < op.chunks.len() {
            return;
        }
        if op.failure.is_none() && op.op == Op::Write && !op.flushed && !op.chunks.is_empty() {
            let ep_id = op.ep;
            op.flushed = true;
            let handle = match self.eps.get(&ep_id) {
                Some(e) if e.phase == EpPhase::Open => e.handle,
                _ => {
                    let err = self.ep_error(ep_id);
                    self.finish(id, Err(err));
                    return;
                }
            };
            let slot = self.alloc_slot(Owner::Flush { op: id, ep: ep_id });
            let p = Self::param(slot);
            // SAFETY: live endpoint; flush touches no user memory.
            let ret = unsafe { (self.ucp.ucp_ep_flush_nbx)(handle, &p) };
            match self.settle(slot, ret) {
                Issue::Done(sys::UCS_OK) => self.finish(id, Ok(())),
                Issue::Done(st) => {
                    let err = self.status_error(ep_id, "ucp_ep_flush_nbx", st);
                    self.finish(id, Err(err));
                }
                Issue::Pending => {
                    self.ops.get_mut(&id).expect("present").inflight += 1;
                    self.eps.get_mut(&ep_id).expect("checked").inflight += 1;
                }
            }
            return;
        }
        let result = match op.failure.take() {
            Some(e) => Err(e),
            None => Ok(()),
        };
        self.finish(id, result);
    }

    pub(super) fn status_error(
        &self,
        ep: u64,
        function: &'static str,
        st: sys::ucs_status_t,
    ) -> Error {
        match self.eps.get(&ep) {
            Some(e) if e.failed.is_some() => self.ep_error(ep),
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
        let Some(rec) = self.reqs.get_mut(slot).and_then(Option::take) else {
            return;
        };
        self.live_requests -= 1;
        self.free_slots.push(slot);
        if !rec.req.is_null() {
            // SAFETY: the request was returned by an `_nbx` call and completed; freed once.
            unsafe { (self.ucp.ucp_request_free)(rec.req) };
        }
        match rec.owner {
            Owner::Chunk { op, key, ep } => {
                if let Some(k) = self.keys.get_mut(&key) {
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
        if let Some(e) = err
            && op.failure.is_none()
        {
            op.failure = Some(e);
            op.failed_at = Some(Instant::now());
        }
        self.pump(id);
    }

    pub(super) fn cancel_requests_of(&mut self, id: u64) {
        for rec in self.reqs.iter().flatten() {
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
