//! `hmc-meta`: where the engines of a job find each other.
//!
//! # What it is for
//!
//! An engine has a name and an address, and publishes a record (its data-plane address and
//! its table of exported memory) for peers to read. [`MetadataStore`] is the seam between
//! the engine and whatever holds those records:
//!
//! - [`Embedded`] needs no service: a peer's name *is* its address, and the record is
//!   fetched from the peer itself on connect (the engine's peer-to-peer handshake). Nothing
//!   is watched: a peer is gone when its connection fails.
//! - [`EtcdStore`] keeps records in etcd (v3 API) under `<namespace>/members/<name>` (and
//!   labelled blobs under `<namespace>/labels/<name>/<label>`), each
//!   attached to a lease that a background task keeps alive. A member that stops renewing
//!   (dead, hung, cut off) has its key deleted by etcd when the lease's TTL runs out, and
//!   every watcher sees it leave ([`MemberEvent::Left`]). If etcd goes away, existing
//!   connections between engines are untouched (no byte goes through etcd), lookups retry
//!   with backoff until their timeout and then fail naming the endpoints, and the task
//!   reconnects with backoff and registers the member again when etcd is back.
//!
//! # What it is not
//!
//! Not a general etcd wrapper, and not on the data path: nothing here is called per
//! transfer. Records are opaque bytes to this crate (the engine encodes them).
//!
//! # Limits
//!
//! Every bound on what other members (through etcd) can make a process hold has a default,
//! a field in [`EtcdConfig`] and an error naming it ([`MetaError::Limit`]): `max_value_len`
//! (one record), `max_members` (records read from etcd by one listing) and `watch_backlog`
//! (membership events queued for a slow subscriber).

mod config;
mod error;
#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "testing")]
pub mod testing;
mod url;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub use config::EtcdConfig;
pub use error::{MetaError, Result};
#[cfg(feature = "etcd")]
pub use etcd::EtcdStore;
pub use url::MetadataUrl;

/// A boxed future, as [`MetadataStore`]'s methods return (the trait is used as a trait
/// object: the engine picks a store at run time from its options).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A member of a namespace: its name, the address its metadata service listens on, and
/// the record it published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// The member's name, unique in its namespace.
    pub name: String,
    /// Where to reach it (the engine's RPC address).
    pub address: String,
    /// What it published (the engine's data-plane address and region table).
    pub record: Vec<u8>,
}

/// A change of a namespace's membership, as [`MemberEvents`] delivers them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberEvent {
    /// A member registered (or registered again after its lease lapsed).
    Joined(Member),
    /// A member published a new record (registered or deregistered memory).
    Updated(Member),
    /// A member's key is gone: it deregistered, or its lease lapsed (dead or hung, or cut
    /// off from etcd for longer than its TTL).
    Left {
        /// Its name.
        name: String,
    },
}

/// A subscription to membership changes. Events queue up to
/// [`EtcdConfig::watch_backlog`]; a subscriber that falls further behind gets
/// [`MetaError::Limit`] naming `watch_backlog` once, and should re-read the membership
/// ([`MetadataStore::members`]).
pub struct MemberEvents {
    rx: tokio::sync::broadcast::Receiver<MemberEvent>,
    backlog: usize,
}

impl MemberEvents {
    /// The next event; `None` once the store is closed.
    pub async fn next(&mut self) -> Option<Result<MemberEvent>> {
        use tokio::sync::broadcast::error::RecvError;
        match self.rx.recv().await {
            Ok(e) => Some(Ok(e)),
            Err(RecvError::Closed) => None,
            Err(RecvError::Lagged(n)) => Some(Err(MetaError::Limit {
                limit: "watch_backlog",
                value: n + self.backlog as u64,
                max: self.backlog as u64,
                hint: "the subscriber fell behind and events were dropped; re-read the membership, or raise EtcdConfig::watch_backlog",
            })),
        }
    }
}

/// Where members of a namespace register and find each other.
pub trait MetadataStore: Send + Sync + 'static {
    /// What this store is, for logs and errors (`embedded`, `etcd://…/ns`).
    fn describe(&self) -> String;

    /// Publishes this member's record, replacing the previous one. Returns once the store
    /// accepted it locally (etcd: the background task writes it, and writes it again after
    /// an outage); fails only for a record over a limit.
    fn publish(&self, record: Vec<u8>) -> Result<()>;

    /// Finds the member called `name`, retrying with backoff until `timeout` while the
    /// store is unreachable. `Ok(None)`: the store answered, and no such member is
    /// registered.
    fn resolve<'a>(
        &'a self,
        name: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Option<Member>>>;

    /// Every member registered now (at most `max_members`), retrying like
    /// [`MetadataStore::resolve`].
    fn members(&self, timeout: Duration) -> BoxFuture<'_, Result<Vec<Member>>>;

    /// Joins and leaves from now on; `None` for a store that does not watch
    /// ([`Embedded`]).
    fn subscribe(&self) -> Option<MemberEvents>;

    /// Publishes `blob` under `label` beside this member's record, replacing what was
    /// published under it (NIXL's labelled partial metadata: a peer fetches it by this
    /// member's name and the label). It lives as long as this member's registration.
    /// Fails for a label that cannot be a key part, a blob over `max_value_len`, and in a
    /// store without a directory ([`Embedded`]).
    fn publish_label(&self, label: &str, blob: Vec<u8>) -> Result<()>;

    /// What the member `name` published under `label`, retrying like
    /// [`MetadataStore::resolve`]. `Ok(None)`: the store answered, and there is none.
    fn fetch_label<'a>(
        &'a self,
        name: &'a str,
        label: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>>>;

    /// Withdraws this member from the namespace (`false`: its record and labels are
    /// deleted, and watchers see it leave, while the process goes on) or lists it again
    /// (`true`: registered afresh, as after an outage). Returns once the background task
    /// has it to do; in a store without a directory there is nothing to withdraw.
    fn set_listed(&self, listed: bool) -> Result<()>;

    /// Leaves the namespace now (peers see this member leave at once, rather than after
    /// its lease lapses) and stops renewing. Later calls fail with [`MetaError::Closed`]
    /// or find nothing.
    fn close(&self) -> BoxFuture<'_, ()>;
}

/// No service: names are addresses, and records come from the peers themselves.
#[derive(Clone, Debug, Default)]
pub struct Embedded;

impl MetadataStore for Embedded {
    fn describe(&self) -> String {
        "embedded".into()
    }

    fn publish(&self, _record: Vec<u8>) -> Result<()> {
        // Peers ask this member for its record directly on connect.
        Ok(())
    }

    fn resolve<'a>(
        &'a self,
        name: &'a str,
        _timeout: Duration,
    ) -> BoxFuture<'a, Result<Option<Member>>> {
        Box::pin(async move {
            Ok(Some(Member {
                name: name.to_string(),
                address: name.to_string(),
                record: Vec::new(),
            }))
        })
    }

    fn members(&self, _timeout: Duration) -> BoxFuture<'_, Result<Vec<Member>>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn subscribe(&self) -> Option<MemberEvents> {
        None
    }

    fn publish_label(&self, label: &str, _blob: Vec<u8>) -> Result<()> {
        Err(no_directory(label))
    }

    fn fetch_label<'a>(
        &'a self,
        _name: &'a str,
        label: &'a str,
        _timeout: Duration,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>>> {
        Box::pin(async move { Err(no_directory(label)) })
    }

    fn set_listed(&self, _listed: bool) -> Result<()> {
        // Peers find this member by its address, from itself: there is no entry to take out.
        Ok(())
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

fn no_directory(label: &str) -> MetaError {
    MetaError::Invalid(format!(
        "labelled metadata (`{label}`) needs a directory: set `metadata` to etcd://host:port/namespace, or hand the blob to the peer yourself"
    ))
}

/// Opens the store a [`MetadataUrl`] names and registers `name` at `address` in it.
pub async fn open(
    url: &MetadataUrl,
    config: EtcdConfig,
    name: &str,
    address: &str,
    record: Vec<u8>,
) -> Result<std::sync::Arc<dyn MetadataStore>> {
    Ok(match url {
        MetadataUrl::Embedded => std::sync::Arc::new(Embedded),
        #[cfg(feature = "etcd")]
        MetadataUrl::Etcd { .. } => {
            std::sync::Arc::new(EtcdStore::start(url, config, name, address, record).await?)
        }
        #[cfg(not(feature = "etcd"))]
        MetadataUrl::Etcd { .. } => {
            let _ = (config, name, address, record);
            return Err(MetaError::Invalid(format!(
                "{url} needs the etcd store, which this build leaves out (cargo feature \
                 `etcd` of hmc-meta, and of hmc-engine, a default one); rebuild with it, or \
                 use the embedded store (metadata=embedded)"
            )));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_embedded_store_resolves_a_name_to_itself_and_watches_nothing() {
        let e = Embedded;
        let m = e
            .resolve("127.0.0.1:5000", Duration::from_secs(1))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(m.address, "127.0.0.1:5000");
        assert!(e.subscribe().is_none());
        assert!(e.publish(vec![1; 10]).is_ok());
        assert_eq!(e.describe(), "embedded");
    }
}
