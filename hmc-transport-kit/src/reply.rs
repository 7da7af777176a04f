//! Request/reply matching for a side channel: each request takes an id and waits for the reply of that id by its deadline; a reply nobody waits for (late, or forged) is reported, and losing the connection fails every waiter at once.

use std::collections::HashMap;
use std::sync::Arc;

use hmc_core::{Deadline, Error, Result};
use parking_lot::Mutex;
use tokio::sync::oneshot;

struct Inner<T> {
    next: u64,
    pending: HashMap<u64, oneshot::Sender<Result<T>>>,
    closed: Option<String>,
}

/// The requests of one connection awaiting replies. Cheap to clone (one table).
pub struct ReplyTable<T> {
    inner: Arc<Mutex<Inner<T>>>,
}

impl<T> Clone for ReplyTable<T> {
    fn clone(&self) -> Self {
        ReplyTable {
            inner: self.inner.clone(),
        }
    }
}

impl<T> Default for ReplyTable<T> {
    fn default() -> Self {
        ReplyTable {
            inner: Arc::new(Mutex::new(Inner {
                next: 1,
                pending: HashMap::new(),
                closed: None,
            })),
        }
    }
}

/// One request's wait; dropping it forgets the request (a later reply is then unknown).
pub struct PendingReply<T> {
    id: u64,
    rx: oneshot::Receiver<Result<T>>,
    table: Arc<Mutex<Inner<T>>>,
}

impl<T> ReplyTable<T> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// A fresh id to send the request under, and its wait. `Closed` after [`fail_all`](Self::fail_all).
    pub fn start(&self) -> Result<PendingReply<T>> {
        let mut g = self.inner.lock();
        if let Some(why) = &g.closed {
            return Err(Error::Closed(why.clone()));
        }
        let id = g.next;
        g.next += 1;
        let (tx, rx) = oneshot::channel();
        g.pending.insert(id, tx);
        Ok(PendingReply {
            id,
            rx,
            table: self.inner.clone(),
        })
    }

    /// Delivers the reply of `id`; `false` when nobody waits for it (late after a
    /// deadline, or an id never issued: count it as the peer's error).
    pub fn complete(&self, id: u64, reply: T) -> bool {
        let tx = self.inner.lock().pending.remove(&id);
        tx.is_some_and(|tx| tx.send(Ok(reply)).is_ok())
    }

    /// Fails every waiter with `Error::Peer` (the connection is gone) and refuses later
    /// requests with `Error::Closed`.
    pub fn fail_all(&self, peer: &str, why: &str) {
        let waiters: Vec<_> = {
            let mut g = self.inner.lock();
            g.closed = Some(format!("the side channel to {peer} is gone: {why}"));
            g.pending.drain().map(|(_, tx)| tx).collect()
        };
        for tx in waiters {
            let _ = tx.send(Err(Error::peer(peer, why)));
        }
    }

    /// Requests waiting for a reply.
    pub fn pending(&self) -> usize {
        self.inner.lock().pending.len()
    }
}

impl<T> PendingReply<T> {
    /// The id to send the request under.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Waits for the reply by `deadline` (`DeadlineExceeded` after it).
    pub async fn wait(mut self, deadline: Deadline) -> Result<T> {
        let start = std::time::Instant::now();
        match tokio::time::timeout_at(deadline.instant().into(), &mut self.rx).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => Err(Error::Cancelled("the reply table was dropped".into())),
            Err(_) => Err(Error::DeadlineExceeded {
                during: "waiting for a side-channel reply",
                elapsed: start.elapsed(),
            }),
        }
    }
}

impl<T> Drop for PendingReply<T> {
    fn drop(&mut self) {
        self.table.lock().pending.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn replies_reach_their_request_and_late_ones_are_reported() {
        let t = ReplyTable::<&str>::new();
        let a = t.start().unwrap();
        let b = t.start().unwrap();
        assert_ne!(a.id(), b.id());
        assert!(t.complete(b.id(), "for b"));
        assert!(t.complete(a.id(), "for a"));
        assert_eq!(b.wait(Deadline::default()).await.unwrap(), "for b");
        assert_eq!(a.wait(Deadline::default()).await.unwrap(), "for a");
        let c = t.start().unwrap();
        let id = c.id();
        let e = c
            .wait(Deadline::after(Duration::from_millis(20)))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::DeadlineExceeded { .. }), "{e:?}");
        assert!(
            !t.complete(id, "too late"),
            "a late reply has nobody to go to"
        );
        assert!(!t.complete(999, "forged"));
        assert_eq!(t.pending(), 0);
    }

    #[tokio::test]
    async fn a_lost_connection_fails_every_waiter_and_later_requests() {
        let t = ReplyTable::<u32>::new();
        let waits: Vec<_> = (0..3).map(|_| t.start().unwrap()).collect();
        t.fail_all("peer 7", "connection reset");
        for w in waits {
            let e = w.wait(Deadline::default()).await.unwrap_err();
            assert!(matches!(e, Error::Peer { .. }), "{e:?}");
        }
        assert!(matches!(t.start(), Err(Error::Closed(_))));
    }
}
