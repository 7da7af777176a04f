//! The request slots: every UCX `_nbx` call the engine makes carries a slot index as its
//! user data, and the slot says who owns the request (a transfer's chunk or flush, a
//! notification, an endpoint close, a revocation's flush) so its completion reaches them.

use std::ffi::c_void;
use std::time::Instant;

use futures::channel::oneshot;
use hmc_core::Result;

use super::callbacks::on_request;
use crate::sys;

/// Confirms a key revocation to the target.
pub(super) type Ack = Box<dyn FnOnce() + Send>;

/// Who a request's completion goes to.
pub(super) enum Owner {
    Chunk {
        op: u64,
        key: u64,
        ep: u64,
    },
    Flush {
        op: u64,
        ep: u64,
    },
    Notify {
        ep: u64,
        reply: Option<oneshot::Sender<Result<()>>>,
        deadline: Instant,
        /// The header and data UCX reads until the send completes.
        _bufs: (Vec<u8>, Vec<u8>),
    },
    EpClose {
        ep: u64,
    },
    AckFlush {
        ep: u64,
        ack: Option<Ack>,
    },
    /// A BIND or BOUND message, or the forced close of a peer's endpoint generation
    /// (`generations`): nobody waits for it.
    Gen {
        /// A message's header, read by UCX until the send completes.
        _header: Option<Box<[u8; 9]>>,
    },
}

/// One slot: its owner and, once UCX returned one, the request to free at completion.
pub(super) struct ReqRec {
    pub owner: Owner,
    pub req: *mut c_void,
}

/// What an `_nbx` call's return value meant.
pub(super) enum Issue {
    /// Completed at once, with this status; the slot is free again.
    Done(sys::ucs_status_t),
    /// A request is pending; its completion arrives as an event for the slot.
    Pending,
}

/// The slot table.
#[derive(Default)]
pub(super) struct Requests {
    slots: Vec<Option<ReqRec>>,
    free: Vec<usize>,
    /// UCX requests issued and not yet completed.
    live: usize,
}

impl Requests {
    /// A slot for a request of `owner`.
    pub fn alloc(&mut self, owner: Owner) -> usize {
        let rec = Some(ReqRec {
            owner,
            req: std::ptr::null_mut(),
        });
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = rec;
                i
            }
            None => {
                self.slots.push(rec);
                self.slots.len() - 1
            }
        }
    }

    /// Request parameters that complete into `slot`.
    pub fn param(slot: usize) -> sys::ucp_request_param_t {
        let mut p = sys::ucp_request_param_t::empty();
        p.op_attr_mask = sys::UCP_OP_ATTR_FIELD_CALLBACK | sys::UCP_OP_ATTR_FIELD_USER_DATA;
        p.cb = Some(on_request);
        p.user_data = slot as *mut c_void;
        p
    }

    /// Interprets an `_nbx` return value; keeps the slot when a request is pending.
    pub fn settle(&mut self, slot: usize, ret: sys::ucs_status_ptr_t) -> Issue {
        match self.issued(slot, ret) {
            None => Issue::Pending,
            Some((status, _)) => Issue::Done(status),
        }
    }

    /// Like [`Requests::settle`], but a call that completed at once hands back its status
    /// and its record (whose owner the caller answers); `None` while the request pends.
    pub fn issued(
        &mut self,
        slot: usize,
        ret: sys::ucs_status_ptr_t,
    ) -> Option<(sys::ucs_status_t, ReqRec)> {
        let status = if ret.is_null() {
            sys::UCS_OK
        } else if sys::ptr_is_err(ret) {
            sys::ptr_status(ret)
        } else {
            self.slots[slot].as_mut().expect("allocated").req = ret;
            self.live += 1;
            return None;
        };
        let rec = self.slots[slot].take().expect("allocated");
        self.free.push(slot);
        Some((status, rec))
    }

    /// The record of a slot whose request completed; `None` for a slot already freed.
    pub fn complete(&mut self, slot: usize) -> Option<ReqRec> {
        let rec = self.slots.get_mut(slot).and_then(Option::take)?;
        self.live -= 1;
        self.free.push(slot);
        Some(rec)
    }

    /// Whether any request is outstanding.
    pub fn any_live(&self) -> bool {
        self.live > 0
    }

    /// The records of outstanding requests.
    pub fn iter(&self) -> impl Iterator<Item = &ReqRec> {
        self.slots.iter().flatten()
    }

    /// The slots of outstanding requests with their records, to change their owners.
    pub fn slots_mut(&mut self) -> impl Iterator<Item = (usize, &mut ReqRec)> {
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(|(i, r)| Some((i, r.as_mut()?)))
    }

    /// The records of outstanding requests, to change their owners.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut ReqRec> {
        self.slots.iter_mut().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_slots_are_reused_and_completion_counts_down() {
        let mut reqs = Requests::default();
        let a = reqs.alloc(Owner::EpClose { ep: 1 });
        let b = reqs.alloc(Owner::EpClose { ep: 2 });
        assert_ne!(a, b);
        assert!(matches!(
            reqs.settle(a, std::ptr::null_mut()),
            Issue::Done(sys::UCS_OK)
        ));
        assert_eq!(
            reqs.alloc(Owner::EpClose { ep: 3 }),
            a,
            "a freed slot is reused"
        );
        // A pending request: any non-null, non-error pointer.
        let fake: sys::ucs_status_ptr_t = std::ptr::without_provenance_mut(0x1000);
        assert!(matches!(reqs.settle(b, fake), Issue::Pending));
        assert!(reqs.any_live());
        let rec = reqs.complete(b).expect("pending");
        assert!(matches!(rec.owner, Owner::EpClose { ep: 2 }));
        assert!(!reqs.any_live());
        assert!(reqs.complete(b).is_none(), "completed once");
    }
}
