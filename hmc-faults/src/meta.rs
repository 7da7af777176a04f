//! [`FaultyStore`]: an [`hmc_meta::MetadataStore`] with the plan's metadata faults
//! (`meta.slow`, `meta.gone`) on its lookups.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_meta::{BoxFuture, Member, MemberEvents, MetaError, MetadataStore, Result};

use crate::plan::FaultPlan;

/// `inner` whose lookups ([`MetadataStore::resolve`], [`MetadataStore::members`],
/// [`MetadataStore::fetch_label`]) each ask [`FaultPlan::meta_call`]: a slow one waits
/// first (within its timeout), and a gone service fails the lookup once its timeout has
/// passed, as [`MetaError::Unavailable`], the shape an unreachable etcd has. Publishing,
/// listing and closing are local (the store's background task does the talking) and pass
/// through.
pub struct FaultyStore {
    inner: Arc<dyn MetadataStore>,
    plan: FaultPlan,
}

impl FaultyStore {
    /// `inner` with `plan`'s metadata faults.
    pub fn new(inner: Arc<dyn MetadataStore>, plan: FaultPlan) -> Self {
        FaultyStore { inner, plan }
    }

    /// Applies the next metadata decision within `timeout`: `Ok(left)`, the time left to
    /// the lookup, or the error of a gone (or too slow) service.
    async fn decide(&self, timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        let gone = |why: &str| MetaError::Unavailable {
            endpoints: self.inner.describe(),
            after: start.elapsed(),
            attempts: 1,
            why: format!(
                "{why} (injected fault; fault injection is on: HMC_FAULTS or the `faults` \
                 option, turn it off to stop these)"
            ),
        };
        self.plan.meta_lookup(timeout).await.map_err(gone)
    }
}

impl MetadataStore for FaultyStore {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn publish(&self, record: Vec<u8>) -> Result<()> {
        self.inner.publish(record)
    }

    fn resolve<'a>(
        &'a self,
        name: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Option<Member>>> {
        Box::pin(async move {
            let left = self.decide(timeout).await?;
            self.inner.resolve(name, left).await
        })
    }

    fn members(&self, timeout: Duration) -> BoxFuture<'_, Result<Vec<Member>>> {
        Box::pin(async move {
            let left = self.decide(timeout).await?;
            self.inner.members(left).await
        })
    }

    fn subscribe(&self) -> Option<MemberEvents> {
        self.inner.subscribe()
    }

    fn publish_label(&self, label: &str, blob: Vec<u8>) -> Result<()> {
        self.inner.publish_label(label, blob)
    }

    fn fetch_label<'a>(
        &'a self,
        name: &'a str,
        label: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>>> {
        Box::pin(async move {
            let left = self.decide(timeout).await?;
            self.inner.fetch_label(name, label, left).await
        })
    }

    fn set_listed(&self, listed: bool) -> Result<()> {
        self.inner.set_listed(listed)
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        self.inner.close()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(spec: &str) -> FaultyStore {
        FaultyStore::new(
            Arc::new(hmc_meta::Embedded),
            FaultPlan::new(spec.parse().unwrap()),
        )
    }

    #[tokio::test]
    async fn a_slow_service_answers_late_and_a_gone_one_fails_at_the_timeout() {
        let s = store("meta.slow=50ms@first:1;meta.gone=after:1");
        let t = Instant::now();
        let m = s.resolve("peer", Duration::from_secs(5)).await.unwrap();
        assert_eq!(m.unwrap().name, "peer");
        assert!(t.elapsed() >= Duration::from_millis(50));
        let t = Instant::now();
        let e = s.members(Duration::from_millis(80)).await.unwrap_err();
        assert!(t.elapsed() >= Duration::from_millis(80));
        assert!(matches!(e, MetaError::Unavailable { .. }), "{e:?}");
        assert!(e.to_string().contains("meta.gone"), "{e}");
    }

    #[tokio::test]
    async fn slower_than_the_timeout_is_unavailable() {
        let s = store("meta.slow=10s");
        let e = s.resolve("p", Duration::from_millis(20)).await.unwrap_err();
        assert!(e.to_string().contains("meta.slow"), "{e}");
    }
}
