//! [`TcpConfig`]: the limits and timings of a [`crate::TcpCommunicator`], each with a
//! default.

use std::time::Duration;

use crate::AuthSecret;

/// Limits of a [`crate::TcpCommunicator`]. Every field has a default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpConfig {
    /// Descriptors per request on the wire (default 65 536). Larger batches are sent as
    /// several requests on one connection; a target refuses requests over its own limit.
    pub max_batch_descs: usize,
    /// Largest `notify` message in bytes (default 64 KiB).
    pub max_notify_len: usize,
    /// Notifications held until [`hmc_core::Communicator::recv_notification`] takes them
    /// (default 4096); past it, `notify` fails at the sender with `LimitExceeded`. Zero
    /// means this communicator takes no notifications at all: every NOTIFY is refused, and
    /// its sender gets `LimitExceeded { limit: "max_pending_notifications", max: 0 }` (for
    /// a data plane that never calls `recv_notification`).
    pub max_pending_notifications: usize,
    /// Bytes of notification messages held until received (default 16 MiB); past it,
    /// `notify` fails at the sender with `LimitExceeded` naming
    /// `max_pending_notification_bytes`.
    pub max_pending_notification_bytes: usize,
    /// Connections this communicator's responder serves at once (default 1024).
    pub max_accepted_connections: usize,
    /// Transfers in flight per endpoint, one connection each (default 16); more wait.
    pub max_connections_per_endpoint: usize,
    /// Idle connections an endpoint keeps for reuse (default 16, as many as
    /// `max_connections_per_endpoint`): an endpoint that runs that many transfers at once
    /// reuses its connections instead of closing some after every round and dialing them
    /// again (a connect and a HELLO per transfer). Idle ones close after `idle_timeout`.
    pub max_idle_per_endpoint: usize,
    /// How long an accepted connection may take to send its HELLO, and to finish the
    /// authentication exchange when [`TcpConfig::auth_secret`] is set (default 5 s).
    pub hello_timeout: Duration,
    /// Busy-poll for a request's answer, a responder for the next request on its
    /// connection, and a READ's bulk data each time the socket runs dry mid-way, for up to
    /// this long before sleeping (`busy_poll`, default 50 µs; zero turns it off). On idle
    /// cores a small op finishes well within it, and a sleeping thread takes longer to wake
    /// than the op takes; the price is that CPU while ops flow.
    pub busy_poll: Duration,
    /// How long an accepted connection may sit between requests (default 60 s); then the
    /// responder closes it. Initiators drop pooled connections idle for half of their own
    /// `idle_timeout` and probe the others before reuse, so peers with the same setting
    /// never send a request into a connection that is being closed.
    pub idle_timeout: Duration,
    /// How long a request may take to arrive once its first byte is in (default 10 s):
    /// its header, and a NOTIFY's message, must arrive whole within it, and the bulk bytes
    /// of a WRITE (or the initiator's reading of a READ's answer) must make progress at
    /// least once per `request_timeout`. Past it the responder closes the connection.
    pub request_timeout: Duration,
    /// Bytes registered at once (default 64 GiB).
    pub max_registered_bytes: u64,
    /// A pre-shared secret for peer authentication (default `None`: off). When set, every
    /// data-plane connection starts with an HMAC-SHA256 challenge in both directions (see
    /// [`crate::AuthSecret`]); a peer without the same secret is refused before any
    /// request is read, and so is a peer that has one when this side has none. Both
    /// peers need the same setting.
    pub auth_secret: Option<AuthSecret>,
    /// Without an `auth_secret`: refuse data-plane connections from processes of this host
    /// that run as another user (Unix sockets by `SO_PEERCRED`, TCP by the socket's owner
    /// in `/proc/net/tcp`), counted in `auth_failures`; peers on other hosts are admitted
    /// (default false; the engine turns it on).
    pub same_user_only: bool,
    /// Bytes of one host bounce chunk through which device regions
    /// ([`hmc_core::Communicator::register_memory`]) are served to peers (default 1 MiB).
    /// A READ copies chunk *k + 1* from the device while chunk *k* is sent; a WRITE the
    /// reverse.
    pub staging_chunk: usize,
    /// Bytes of bounce chunks held at once for device regions, over every request
    /// (default 64 MiB; each request being served takes two chunks). A request that finds
    /// none free within `request_timeout` is refused with `LimitExceeded { limit:
    /// "max_staging_bytes" }`: peers cannot make this side hold more. At least two
    /// chunks.
    pub max_staging_bytes: usize,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            max_batch_descs: 65_536,
            max_notify_len: 64 << 10,
            max_pending_notifications: 4096,
            max_pending_notification_bytes: 16 << 20,
            max_accepted_connections: 1024,
            max_connections_per_endpoint: 16,
            max_idle_per_endpoint: 16,
            hello_timeout: Duration::from_secs(5),
            busy_poll: Duration::from_micros(50),
            idle_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(10),
            max_registered_bytes: 64 << 30,
            auth_secret: None,
            same_user_only: false,
            staging_chunk: 1 << 20,
            max_staging_bytes: 64 << 20,
        }
    }
}
