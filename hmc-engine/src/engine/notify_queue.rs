//! The receiver's notification queue and the ledger that makes delivery exactly once.
//!
//! Every notification carries a [`NotifyId`] (the sender's instance and a number it never
//! reuses). The ledger remembers, per sending connection's name and id, what became of
//! it: queued, taken by the program (`get_notifies`), or retracted. With it:
//!
//! - a notification arriving again under an id already queued or taken (a resend after
//!   the metadata connection was dialled again, a duplicate on the wire) is answered
//!   [`NotifyAck::Duplicate`] and not queued again;
//! - a failure notice (the sender's transfer ended in error after its notification was
//!   sent but not seen queued) takes the place of the notification of the same id that is
//!   still waiting, so the program sees one notification per post: the failure;
//! - a retraction (the sender gave up on a standalone notification) removes it if still
//!   waiting;
//! - whatever arrives under a retracted id later (a delayed copy) is dropped.
//!
//! The ledger holds at most `remember` ids (the engine's `max_notify_ids`); past it the
//! oldest is forgotten, so a copy delayed by more than that many later notifications from
//! all peers would be queued again. Sans-IO: the RPC handler and `get_notifies` call it
//! under the engine's lock.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::Notify;
use crate::meta::{NotifyAck, NotifyId};

/// Who sent a notification (the name its connection gave) and which send it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct NotifyKey {
    /// Shared by every key of one sender in a row ([`NotifyQueue::key`]), so that the
    /// ledger's copies of a key (its fate, its place in the order, the waiting
    /// notification) allocate nothing.
    pub(super) from: Arc<str>,
    pub(super) id: NotifyId,
}

/// Only the id is hashed (equality still compares the sender): ids are unique per
/// sending engine, so keys that share a hash are the same id from different senders, at
/// most one per sender, and the sender's name is not hashed again on every lookup.
impl Hash for NotifyKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

/// What became of one id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Queued,
    Taken,
    Retracted,
}

/// A notification waiting for `get_notifies`, with its accounted bytes.
struct Waiting {
    notify: Notify,
    key: NotifyKey,
    len: usize,
}

/// Why a new notification was not queued: the limit it would exceed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum QueueFull {
    /// `max_pending_notifies` notifications wait already.
    Count,
    /// The waiting notifications' bytes plus this one's would pass
    /// `max_pending_notify_bytes`.
    Bytes { waiting: usize },
}

/// The queue's bounds, from the engine's configuration.
#[derive(Clone, Copy, Debug)]
pub(super) struct QueueLimits {
    pub(super) max_count: usize,
    pub(super) max_bytes: usize,
    pub(super) remember: usize,
}

/// Notifications waiting for [`crate::Engine::get_notifies`], their bytes, and the
/// ledger of ids.
#[derive(Default)]
pub(super) struct NotifyQueue {
    queue: VecDeque<Waiting>,
    bytes: usize,
    fates: HashMap<NotifyKey, Fate>,
    /// Ids in the order first seen, to forget the oldest past `remember`.
    order: VecDeque<NotifyKey>,
    /// The last sender's name, which the next key most likely shares.
    last_sender: Option<Arc<str>>,
}

impl NotifyQueue {
    /// The key of notification `id` from `from`, sharing the name with the last key made
    /// when the sender is the same.
    pub(super) fn key(&mut self, from: &str, id: NotifyId) -> NotifyKey {
        let from = match &self.last_sender {
            Some(last) if **last == *from => last.clone(),
            _ => {
                let name: Arc<str> = from.into();
                self.last_sender = Some(name.clone());
                name
            }
        };
        NotifyKey { from, id }
    }

    /// A notification (`notify.failed` set: a failure notice) of `len` accounted bytes
    /// arrived under `key`.
    pub(super) fn offer(
        &mut self,
        key: NotifyKey,
        notify: Notify,
        len: usize,
        limits: QueueLimits,
    ) -> Result<NotifyAck, QueueFull> {
        let failure = notify.failed.is_some();
        match self.fates.get(&key).copied() {
            Some(Fate::Retracted) => Ok(NotifyAck::Retracted),
            Some(Fate::Taken) if failure => Ok(NotifyAck::AlreadyTaken),
            Some(Fate::Taken) => Ok(NotifyAck::Duplicate),
            Some(Fate::Queued) if !failure => Ok(NotifyAck::Duplicate),
            Some(Fate::Queued) => {
                // In place of the waiting notification of this post: the program sees
                // one notification for it, and in its place in the order.
                if let Some(w) = self.queue.iter_mut().find(|w| w.key == key) {
                    self.bytes = self.bytes - w.len + len;
                    w.notify = notify;
                    w.len = len;
                }
                self.fates.insert(key, Fate::Retracted);
                Ok(NotifyAck::Queued)
            }
            None => {
                if self.queue.len() >= limits.max_count {
                    return Err(QueueFull::Count);
                }
                if self.bytes + len > limits.max_bytes {
                    return Err(QueueFull::Bytes {
                        waiting: self.bytes,
                    });
                }
                self.bytes += len;
                // A failure notice that came first ends its id: a late copy of the
                // notification it replaces is dropped.
                let fate = if failure {
                    Fate::Retracted
                } else {
                    Fate::Queued
                };
                self.remember(key.clone(), fate, limits.remember);
                self.queue.push_back(Waiting { notify, key, len });
                Ok(NotifyAck::Queued)
            }
        }
    }

    /// The sender of `key` gave up on it.
    pub(super) fn retract(&mut self, key: NotifyKey, remember: usize) -> NotifyAck {
        match self.fates.get(&key).copied() {
            Some(Fate::Taken) => NotifyAck::AlreadyTaken,
            Some(Fate::Retracted) => NotifyAck::Retracted,
            Some(Fate::Queued) => {
                if let Some(at) = self.queue.iter().position(|w| w.key == key) {
                    let w = self.queue.remove(at).expect("found above");
                    self.bytes -= w.len;
                }
                self.fates.insert(key, Fate::Retracted);
                NotifyAck::Retracted
            }
            None => {
                self.remember(key, Fate::Retracted, remember);
                NotifyAck::Retracted
            }
        }
    }

    /// Takes every waiting notification, oldest first.
    pub(super) fn take_all(&mut self) -> Vec<Notify> {
        self.bytes = 0;
        let mut out = Vec::with_capacity(self.queue.len());
        for w in self.queue.drain(..) {
            if let Some(f) = self.fates.get_mut(&w.key)
                && *f == Fate::Queued
            {
                *f = Fate::Taken;
            }
            out.push(w.notify);
        }
        out
    }

    /// Waiting notifications and their bytes.
    #[cfg(test)]
    fn waiting(&self) -> (usize, usize) {
        (self.queue.len(), self.bytes)
    }

    fn remember(&mut self, key: NotifyKey, fate: Fate, remember: usize) {
        // A waiting notification's id is kept (the queue's own limits bound those):
        // forgetting it would let a duplicate be queued beside it. So the oldest ended
        // ids go, passing over waiting ones at most once each.
        let mut turns = self.order.len();
        while self.order.len() >= remember.max(1) && turns > 0 {
            turns -= 1;
            let Some(old) = self.order.pop_front() else {
                break;
            };
            // One lookup: a waiting id (rare here) is put back.
            if self.fates.remove(&old) == Some(Fate::Queued) {
                self.fates.insert(old.clone(), Fate::Queued);
                self.order.push_back(old);
            }
        }
        self.fates.insert(key.clone(), fate);
        self.order.push_back(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: QueueLimits = QueueLimits {
        max_count: 8,
        max_bytes: 1 << 20,
        remember: 16,
    };

    fn key(from: &str, seq: u64) -> NotifyKey {
        NotifyKey {
            from: from.into(),
            id: NotifyId { instance: 7, seq },
        }
    }

    fn note(msg: &str, failed: Option<&str>) -> Notify {
        Notify {
            from: "a".into(),
            name: "n".into(),
            msg: msg.as_bytes().to_vec(),
            failed: failed.map(str::to_string),
        }
    }

    #[test]
    fn a_second_arrival_of_one_id_is_not_queued_waiting_or_taken() {
        let mut q = NotifyQueue::default();
        assert_eq!(
            q.offer(key("a", 1), note("x", None), 1, LIMITS),
            Ok(NotifyAck::Queued)
        );
        assert_eq!(
            q.offer(key("a", 1), note("x", None), 1, LIMITS),
            Ok(NotifyAck::Duplicate)
        );
        assert_eq!(q.take_all().len(), 1);
        assert_eq!(
            q.offer(key("a", 1), note("x", None), 1, LIMITS),
            Ok(NotifyAck::Duplicate)
        );
        assert!(q.take_all().is_empty());
        // Another sender's same number is another notification.
        assert_eq!(
            q.offer(key("b", 1), note("x", None), 1, LIMITS),
            Ok(NotifyAck::Queued)
        );
        assert_eq!(q.take_all().len(), 1);
    }

    #[test]
    fn keys_of_one_sender_in_a_row_share_its_name_and_senders_stay_apart() {
        let mut q = NotifyQueue::default();
        let id = |seq| NotifyId { instance: 7, seq };
        let (a1, a2) = (q.key("a", id(1)), q.key("a", id(2)));
        assert!(Arc::ptr_eq(&a1.from, &a2.from));
        let b1 = q.key("b", id(1));
        assert_ne!(a1, b1, "same id, another sender");
        assert_eq!(&*b1.from, "b");
        assert_eq!(q.key("a", id(1)), a1);
        // Same id from two senders: both kept apart in the ledger.
        q.offer(a1.clone(), note("x", None), 1, LIMITS).unwrap();
        assert_eq!(
            q.offer(b1, note("y", None), 1, LIMITS),
            Ok(NotifyAck::Queued)
        );
        assert_eq!(q.retract(a1, 16), NotifyAck::Retracted);
        let left = q.take_all();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].msg, b"y");
    }

    #[test]
    fn a_failure_notice_takes_the_waiting_notifications_place() {
        let mut q = NotifyQueue::default();
        q.offer(key("a", 1), note("first", None), 5, LIMITS)
            .unwrap();
        q.offer(key("a", 2), note("second", None), 6, LIMITS)
            .unwrap();
        assert_eq!(
            q.offer(key("a", 1), note("first", Some("timed out")), 14, LIMITS),
            Ok(NotifyAck::Queued)
        );
        assert_eq!(q.waiting(), (2, 20));
        let got = q.take_all();
        assert_eq!(got[0].failed.as_deref(), Some("timed out"));
        assert_eq!(got[1].failed, None);
        // A late copy of the replaced notification is dropped.
        assert_eq!(
            q.offer(key("a", 1), note("first", None), 5, LIMITS),
            Ok(NotifyAck::Retracted)
        );
        assert!(q.take_all().is_empty());
    }

    #[test]
    fn a_failure_notice_after_the_program_took_the_notification_says_so() {
        let mut q = NotifyQueue::default();
        q.offer(key("a", 1), note("x", None), 1, LIMITS).unwrap();
        q.take_all();
        assert_eq!(
            q.offer(key("a", 1), note("x", Some("lost reply")), 1, LIMITS),
            Ok(NotifyAck::AlreadyTaken)
        );
        assert!(q.take_all().is_empty());
    }

    #[test]
    fn a_failure_notice_first_ends_the_id() {
        let mut q = NotifyQueue::default();
        q.offer(key("a", 3), note("x", Some("stalled")), 1, LIMITS)
            .unwrap();
        assert_eq!(
            q.offer(key("a", 3), note("x", None), 1, LIMITS),
            Ok(NotifyAck::Retracted)
        );
        assert_eq!(q.take_all().len(), 1);
    }

    #[test]
    fn a_retraction_removes_a_waiting_notification_and_drops_late_copies() {
        let mut q = NotifyQueue::default();
        q.offer(key("a", 1), note("x", None), 3, LIMITS).unwrap();
        assert_eq!(q.retract(key("a", 1), 16), NotifyAck::Retracted);
        assert_eq!(q.waiting(), (0, 0));
        assert_eq!(
            q.offer(key("a", 1), note("x", None), 3, LIMITS),
            Ok(NotifyAck::Retracted)
        );
        // Retracting what never arrived drops it when it does.
        assert_eq!(q.retract(key("a", 2), 16), NotifyAck::Retracted);
        assert_eq!(
            q.offer(key("a", 2), note("y", None), 3, LIMITS),
            Ok(NotifyAck::Retracted)
        );
        assert!(q.take_all().is_empty());
        // Too late once taken.
        q.offer(key("a", 4), note("z", None), 3, LIMITS).unwrap();
        q.take_all();
        assert_eq!(q.retract(key("a", 4), 16), NotifyAck::AlreadyTaken);
    }

    #[test]
    fn limits_refuse_new_notifications_but_not_a_replacement() {
        let limits = QueueLimits {
            max_count: 2,
            max_bytes: 10,
            remember: 16,
        };
        let mut q = NotifyQueue::default();
        q.offer(key("a", 1), note("x", None), 4, limits).unwrap();
        assert_eq!(
            q.offer(key("a", 2), note("x", None), 7, limits),
            Err(QueueFull::Bytes { waiting: 4 })
        );
        q.offer(key("a", 3), note("x", None), 4, limits).unwrap();
        assert_eq!(
            q.offer(key("a", 4), note("x", None), 1, limits),
            Err(QueueFull::Count)
        );
        // A refused id was not remembered: its resend may be queued once there is room.
        q.take_all();
        assert_eq!(
            q.offer(key("a", 2), note("x", None), 7, limits),
            Ok(NotifyAck::Queued)
        );
        // The failure notice of a waiting notification is not a new one.
        q.offer(key("a", 5), note("x", None), 1, limits).unwrap();
        assert_eq!(
            q.offer(key("a", 5), note("x", Some("why")), 3, limits),
            Ok(NotifyAck::Queued)
        );
    }

    #[test]
    fn the_ledger_forgets_the_oldest_ended_ids_but_keeps_waiting_ones() {
        let limits = QueueLimits {
            remember: 4,
            ..LIMITS
        };
        let mut q = NotifyQueue::default();
        for seq in 0..4 {
            q.offer(key("a", seq), note("x", None), 1, limits).unwrap();
        }
        q.take_all();
        // Id 0 is forgotten once a fifth arrives...
        q.offer(key("a", 4), note("x", None), 1, limits).unwrap();
        assert_eq!(
            q.offer(key("a", 1), note("x", None), 1, limits),
            Ok(NotifyAck::Duplicate)
        );
        assert_eq!(q.fates.len(), 4);
        // ...while id 4, still waiting, is kept however many arrive after it.
        for seq in 10..20 {
            q.retract(key("a", seq), limits.remember);
        }
        assert_eq!(
            q.offer(key("a", 4), note("x", None), 1, limits),
            Ok(NotifyAck::Duplicate)
        );
        assert_eq!(q.take_all().len(), 1);
    }
}
