//! Notifications: sending active messages to a peer, and the bounded queue of received
//! ones handed to waiters in order.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::time::{Duration, Instant};

use futures::channel::oneshot;
use hmc_core::{Error, Result};

use super::callbacks::AM_ID;
use super::requests::{Owner, Requests};
use super::{RawNote, State};
use crate::sys;

/// A caller of `recv_notification` and its deadline.
type Waiter = (Instant, oneshot::Sender<Result<RawNote>>);

/// Received notifications not yet taken, and who waits for one.
pub(super) struct Notes {
    pub queue: VecDeque<RawNote>,
    pub waiters: VecDeque<Waiter>,
    /// `UcxConfig::max_pending_notifications`: the queue's bound (0: take none).
    limit: usize,
}

impl Notes {
    /// An empty queue holding at most `limit` notifications.
    pub fn new(limit: usize) -> Self {
        Notes {
            queue: VecDeque::new(),
            waiters: VecDeque::new(),
            limit,
        }
    }

    /// A notification arrived: queued, or dropped past the bound.
    pub fn arrived(&mut self, note: RawNote) {
        if self.limit == 0 {
            // A communicator that reads none (the RPC data plane): nothing to warn about,
            // and a peer must not be able to flood the log.
            tracing::debug!(
                "dropping a notification: this communicator takes none \
                 (UcxConfig::max_pending_notifications is 0)"
            );
        } else if self.queue.len() >= self.limit {
            tracing::warn!(
                limit = self.limit,
                "dropping a notification: max_pending_notifications reached; call \
                 recv_notification more often or raise UcxConfig::max_pending_notifications"
            );
        } else {
            self.queue.push_back(note);
        }
    }

    /// Hands queued notifications to waiters, oldest to longest waiting; one whose waiter
    /// went away goes to the next.
    pub fn deliver(&mut self) {
        while !self.queue.is_empty() {
            let Some((_, w)) = self.waiters.pop_front() else {
                break;
            };
            let note = self.queue.pop_front().expect("non-empty");
            if let Err(Ok(note)) = w.send(Ok(note)) {
                self.queue.push_front(note);
            }
        }
    }

    /// Answers waiters whose deadline passed, and forgets those who went away.
    pub fn expire(&mut self, now: Instant) {
        if self.waiters.is_empty() {
            return;
        }
        let mut kept = VecDeque::with_capacity(self.waiters.len());
        for (d, w) in self.waiters.drain(..) {
            if w.is_canceled() {
                continue;
            }
            if now >= d {
                let _ = w.send(Err(Error::DeadlineExceeded {
                    during: "ucx recv_notification",
                    elapsed: Duration::ZERO,
                }));
                continue;
            }
            kept.push_back((d, w));
        }
        self.waiters = kept;
    }

    /// Fails every waiter with `err()`.
    pub fn fail_waiters(&mut self, err: impl Fn() -> Error) {
        for (_, w) in self.waiters.drain(..) {
            let _ = w.send(Err(err()));
        }
    }

    /// The nearest waiter's deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.waiters.iter().map(|(d, _)| *d).min()
    }
}

impl State {
    pub(super) fn notify(
        &mut self,
        ep: u64,
        header: Vec<u8>,
        data: Vec<u8>,
        deadline: Instant,
        reply: oneshot::Sender<Result<()>>,
    ) {
        let Some(handle) = self.eps.open_handle(ep) else {
            let _ = reply.send(Err(self.eps.error(ep)));
            return;
        };
        let (hp, hl, dp, dl) = (header.as_ptr(), header.len(), data.as_ptr(), data.len());
        let slot = self.reqs.alloc(Owner::Notify {
            ep,
            reply: Some(reply),
            deadline,
            _bufs: (header, data),
        });
        let mut p = Requests::param(slot);
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
        match self.reqs.issued(slot, ret) {
            Some((st, rec)) => {
                if let Owner::Notify { reply: Some(r), .. } = rec.owner {
                    let _ = r.send(if st == sys::UCS_OK {
                        Ok(())
                    } else {
                        Err(self.status_error(ep, "ucp_am_send_nbx", st))
                    });
                }
            }
            None => self.eps.by_id.get_mut(&ep).expect("checked").inflight += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(tag: u64) -> RawNote {
        RawNote {
            tag,
            from: b"peer".to_vec(),
            msg: vec![tag as u8],
        }
    }

    #[test]
    fn the_queue_holds_at_most_its_limit_and_zero_takes_none() {
        let mut notes = Notes::new(2);
        for t in 0..5 {
            notes.arrived(note(t));
        }
        assert_eq!(
            notes.queue.iter().map(|n| n.tag).collect::<Vec<_>>(),
            [0, 1]
        );
        let mut none = Notes::new(0);
        none.arrived(note(9));
        assert!(none.queue.is_empty());
    }

    #[test]
    fn a_note_whose_waiter_went_away_goes_to_the_next() {
        let mut notes = Notes::new(8);
        let far = Instant::now() + Duration::from_secs(60);
        let (gone_tx, gone_rx) = oneshot::channel();
        drop(gone_rx);
        let (tx, mut rx) = oneshot::channel();
        notes.waiters.push_back((far, gone_tx));
        notes.waiters.push_back((far, tx));
        notes.arrived(note(7));
        notes.deliver();
        let got = rx
            .try_recv()
            .expect("open")
            .expect("delivered")
            .expect("ok");
        assert_eq!(got.tag, 7);
        assert!(notes.queue.is_empty() && notes.waiters.is_empty());
    }

    #[test]
    fn waiters_past_their_deadline_are_answered_and_the_rest_kept() {
        let mut notes = Notes::new(8);
        let now = Instant::now();
        let (late_tx, mut late_rx) = oneshot::channel();
        let (kept_tx, _kept_rx) = oneshot::channel();
        notes.waiters.push_back((now, late_tx));
        notes
            .waiters
            .push_back((now + Duration::from_secs(60), kept_tx));
        assert_eq!(notes.next_deadline(), Some(now));
        notes.expire(now);
        let err = late_rx.try_recv().expect("open").expect("answered");
        assert!(matches!(err, Err(Error::DeadlineExceeded { .. })));
        assert_eq!(notes.waiters.len(), 1);
    }
}
