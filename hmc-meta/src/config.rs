//! [`EtcdConfig`]: the settings and limits of the etcd store, which engines take as options
//! whether or not this build has the store (the `etcd` feature).

use std::time::Duration;

/// Settings and limits of the etcd store (`EtcdStore`, feature `etcd`). Every field is also an engine option.
#[derive(Clone, Debug)]
pub struct EtcdConfig {
    /// The lease's time to live (`lease_ttl_ms`, default 5 s; etcd rounds it up to whole
    /// seconds). A member that stops renewing is gone for everyone within about this long.
    /// The lease is renewed every third of it.
    pub lease_ttl: Duration,
    /// One etcd request, and one connection attempt (`etcd_op_timeout_ms`, default 2 s).
    pub op_timeout: Duration,
    /// First wait between attempts while etcd is unreachable (`etcd_retry_initial_ms`,
    /// default 100 ms); doubled each attempt up to `retry_max`.
    pub retry_initial: Duration,
    /// Longest wait between attempts (`etcd_retry_max_ms`, default 2 s).
    pub retry_max: Duration,
    /// Bytes of one member's value, its own and each one read (`max_value_len`, default
    /// 1 MiB; etcd's own default request limit is 1.5 MiB).
    pub max_value_len: usize,
    /// Members read by one listing of the namespace (`max_members`, default 4096).
    pub max_members: usize,
    /// Labelled blobs this member publishes at once (`max_labels`, default 256; each is
    /// also bounded by `max_value_len`). Replacing a label's blob does not count again.
    pub max_labels: usize,
    /// Membership events queued for one subscriber (`watch_backlog`, default 1024).
    pub watch_backlog: usize,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            lease_ttl: Duration::from_secs(5),
            op_timeout: Duration::from_secs(2),
            retry_initial: Duration::from_millis(100),
            retry_max: Duration::from_secs(2),
            max_value_len: 1 << 20,
            max_members: 4096,
            max_labels: 256,
            watch_backlog: 1024,
        }
    }
}
