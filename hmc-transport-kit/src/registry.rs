//! The table of a communicator's registrations by id: what a peer's request names (the
//! id half of a remote key) and the target looks up before it checks the token
//! ([`crate::key_token`]). The TCP and shared-memory transports each serve their peers
//! from one; what an entry holds, and how it is revoked (TCP's liveness lock per copy,
//! shm's leases under its control page), stays with each transport.
//!
//! Ids start at 1 and are never reused in a table's life, so a key to a dropped
//! registration can never reach a later one that happens to share its id.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

/// Registrations by id, read by every request and written by register and drop.
#[derive(Debug)]
pub struct Registry<E> {
    entries: RwLock<HashMap<u64, Arc<E>>>,
    next: AtomicU64,
}

impl<E> Default for Registry<E> {
    fn default() -> Self {
        Registry {
            entries: RwLock::new(HashMap::new()),
            next: AtomicU64::new(1),
        }
    }
}

impl<E> Registry<E> {
    /// An empty table whose first id is 1.
    pub fn new() -> Self {
        Self::default()
    }

    /// Draws the next id, builds the entry for it and serves it from now on. When `make`
    /// fails nothing is added (the id is not handed out again).
    pub fn insert<Err>(&self, make: impl FnOnce(u64) -> Result<E, Err>) -> Result<Arc<E>, Err> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let entry = Arc::new(make(id)?);
        self.entries.write().insert(id, entry.clone());
        Ok(entry)
    }

    /// The entry a request names, if it is still registered.
    #[inline]
    pub fn get(&self, id: u64) -> Option<Arc<E>> {
        self.entries.read().get(&id).cloned()
    }

    /// Stops serving `id`: later lookups miss. Requests that looked it up before keep
    /// their `Arc`; the transport's own revocation decides what they may still do.
    pub fn remove(&self, id: u64) -> Option<Arc<E>> {
        self.entries.write().remove(&id)
    }

    /// How many entries are served.
    pub fn len(&self) -> usize {
        self.entries.read().len()
    }

    /// Whether no entry is served.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_start_at_one_and_are_never_reused() {
        let r = Registry::new();
        let a = r.insert(Ok::<_, ()>).unwrap();
        let b = r.insert(Ok::<_, ()>).unwrap();
        assert_eq!((*a, *b), (1, 2));
        assert_eq!(r.remove(1).as_deref(), Some(&1));
        assert!(r.get(1).is_none(), "a removed id misses");
        let c = r.insert(Ok::<_, ()>).unwrap();
        assert_eq!(*c, 3, "a freed id is not handed out again");
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn a_failed_build_adds_nothing() {
        let r: Registry<u64> = Registry::new();
        assert_eq!(r.insert(|_| Err("no token")), Err("no token"));
        assert!(r.is_empty());
        assert_eq!(*r.insert(Ok::<_, ()>).unwrap(), 2);
        assert_eq!(r.get(2).as_deref(), Some(&2));
    }

    #[test]
    fn a_lookup_outlives_the_removal() {
        let r = Registry::new();
        r.insert(|_| Ok::<_, ()>(String::from("region"))).unwrap();
        let held = r.get(1).unwrap();
        r.remove(1);
        assert_eq!(*held, "region", "a request in flight keeps its entry");
        assert!(r.remove(1).is_none());
    }
}
