//! Notifications: sending active messages to a peer and handing received ones to waiters.

use super::*;

impl State {
    pub(super) fn notify(
        &mut self,
        ep: u64,
        header: Vec<u8>,
        data: Vec<u8>,
        deadline: Instant,
        reply: oneshot::Sender<Result<()>>,
    ) {
        let handle = match self.eps.get(&ep) {
            Some(e) if e.phase == EpPhase::Open => e.handle,
            _ => {
                let _ = reply.send(Err(self.ep_error(ep)));
                return;
            }
        };
        let (hp, hl, dp, dl) = (header.as_ptr(), header.len(), data.as_ptr(), data.len());
        let slot = self.alloc_slot(Owner::Notify {
            ep,
            reply: Some(reply),
            deadline,
            _bufs: (header, data),
        });
        let mut p = Self::param(slot);
        p.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = sys::UCP_AM_SEND_FLAG_EAGER;
        // SAFETY: live endpoint; the header and data vectors are owned by the request record
        // (moving a Vec does not move its heap buffer) until the request completes.
        let ret = unsafe {
            (self.ucp.ucp_am_send_nbx)(
                handle,
                AM_ID,
                hp as *const c_void,
                hl,
                dp as *const c_void,
                dl,
                &p,
            )
        };
        if ret.is_null() || sys::ptr_is_err(ret) {
            let st = if ret.is_null() {
                sys::UCS_OK
            } else {
                sys::ptr_status(ret)
            };
            let rec = self.reqs[slot].take().expect("allocated");
            self.free_slots.push(slot);
            if let Owner::Notify { reply: Some(r), .. } = rec.owner {
                let _ = r.send(if st == sys::UCS_OK {
                    Ok(())
                } else {
                    Err(self.status_error(ep, "ucp_am_send_nbx", st))
                });
            }
        } else {
            self.reqs[slot].as_mut().expect("allocated").req = ret;
            self.live_requests += 1;
            self.eps.get_mut(&ep).expect("checked").inflight += 1;
        }
    }

    pub(super) fn deliver_notes(&mut self) {
        while !self.notes.is_empty() {
            let Some((_, w)) = self.waiters.pop_front() else {
                break;
            };
            let note = self.notes.pop_front().expect("non-empty");
            if let Err(Ok(note)) = w.send(Ok(note)) {
                self.notes.push_front(note);
            }
        }
    }
}
