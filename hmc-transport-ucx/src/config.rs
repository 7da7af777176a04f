//! `UcxConfig`: every tunable and limit of a UCX communicator, with its default.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[cfg(doc)]
use hmc_core::Communicator;

#[cfg(doc)]
use crate::UcxCommunicator;

/// The `UCX_TCP_TX_SEG_SIZE` this transport applies unless the user set one (UCX's default
/// is 8K).
pub const TCP_TX_SEG_SIZE: &str = "64K";

/// The least `abandon_timeout` in effect: it must exceed the stall a target's progress
/// thread notices (the engine's `generations`), with room for scheduling.
pub(crate) const MIN_ABANDON_TIMEOUT: Duration = Duration::from_millis(250);

/// Environment variable that [`UcxConfig::from_env`] reads: `0` turns
/// [`UcxConfig::direct_mapped`] off.
pub const DIRECT_ENV: &str = "HMC_UCX_DIRECT";

/// Configuration of a [`UcxCommunicator`]. Every limit has a default here.
#[derive(Clone, Debug)]
pub struct UcxConfig {
    /// The `libucp` to open; `None`: `$HMC_UCX_LIB`, else `libucp.so.0`.
    pub library: Option<PathBuf>,
    /// Where the control listener binds (peers connect here). Default `127.0.0.1:0`.
    pub bind: SocketAddr,
    /// UCX transports (`UCX_TLS`), e.g. `"tcp"` or `"posix,cma,self"`. `None`: the `UCX_TLS`
    /// environment variable, else UCX's default. Set per communicator, so several transports
    /// can run side by side in one process.
    pub tls: Option<String>,
    /// Further UCX options as `(name without the UCX_ prefix, value)`, e.g. `("NET_DEVICES", "lo")`.
    pub ucx_options: Vec<(String, String)>,
    /// Largest piece one put/get request moves (default 4 MiB). Bounds how long a cancelled
    /// transfer takes to drain.
    pub chunk_size: usize,
    /// Pieces of one transfer in flight at once (default 8).
    pub max_inflight_chunks: usize,
    /// How long the progress thread polls after the last event before it parks (default 50 µs).
    pub spin: Duration,
    /// Park on the worker's event fd (`UCP_FEATURE_WAKEUP`, default true). UCX then selects
    /// only transports that can signal events. `false` drops the feature: the progress
    /// thread then polls while requests are in flight and sleeps `park_max` between polls
    /// when idle (idle CPU stays low, not zero). Measured on UCX 1.13 it changes nothing for
    /// shared memory (see the crate docs: RMA on user memory is emulated there either way).
    pub wakeup: bool,
    /// Longest park without a wake-up (default 100 ms): a safety net for transports whose
    /// events do not reach the worker's event fd.
    pub park_max: Duration,
    /// How long a cancelled or failed transfer may take to drain (`drain_timeout`,
    /// default 10 s). Past it the peer is taken to make no progress (stopped, or hung):
    /// the UCX endpoint's generation is abandoned (the peer drops what it still holds of
    /// it, see [`UcxConfig::abandon_timeout`]) and replaced by a new UCX endpoint with the
    /// same keys, and only then does the transfer report its end. Where that cannot be
    /// done (no peer failure handling) the endpoint is force-closed and fails.
    pub drain_timeout: Duration,
    /// How long an initiator abandoning an endpoint generation waits for the peer to
    /// answer that it dropped it (`abandon_timeout`, default 1 s, at least 250 ms). A peer
    /// that does not answer does not run; it drops the generation before it runs again, so
    /// the transfer reports its end once the peer's host has acknowledged the request
    /// (waited for at most as long again; past that a warning says bytes may still land).
    pub abandon_timeout: Duration,
    /// How long an unused UCX endpoint to a peer worker is kept for the next `connect` to
    /// the same peer (default 30 s). Reuse keeps connect/disconnect churn from building a new
    /// transport connection per cycle (UCX 1.13 keeps the passive side's until its worker
    /// goes away).
    pub ep_linger: Duration,
    /// Timeout of control-connection steps: handshake replies, import confirmations
    /// (default 10 s).
    pub control_timeout: Duration,
    /// How long deregistration waits for each importing peer to confirm a revocation
    /// (default 5 s); a peer that does not is disconnected.
    pub revoke_timeout: Duration,
    /// Largest `notify` message (default 64 KiB).
    pub max_notify_len: usize,
    /// Received notifications kept until [`Communicator::recv_notification`] takes them
    /// (`max_pending_notifications`, default 4096, each at most `max_notify_len`); more are
    /// dropped with a warning. 0: none are kept, for a communicator that never reads them.
    pub max_pending_notifications: usize,
    /// Move bytes with a plain memcpy on the calling thread when UCX maps the remote region
    /// into this process (`ucp_rkey_ptr`; default true). UCX does so over shared memory
    /// (`posix`, `sysv`) for regions the target got from
    /// [`UcxCommunicator::alloc_registered`], which is also what UCX itself does inside
    /// `ucp_put_nbx`/`ucp_get_nbx` for them: the transfer then skips the hand-off to the
    /// progress thread and its wake-ups. Other regions (user memory, TCP) always go through
    /// the progress thread. Bounds, rights, deadlines and revocation are checked as on the
    /// other path; deregistration waits for running copies. A direct transfer runs to the
    /// end once started (it is one memcpy per descriptor), so keep very large batches off
    /// latency-sensitive async executor threads, or set this to false. Default true
    /// ([`UcxConfig::from_env`] maps `HMC_UCX_DIRECT=0` to false, for the binaries).
    pub direct_mapped: bool,
    /// Host memory this side holds to serve peers' READs of device regions the loaded UCX
    /// cannot move (`max_staging_bytes`, default 64 MiB, in 512 KiB chunks; one per READ
    /// being served). Such regions, registered with `register_memory` and their backend,
    /// are staged over the control connection; a READ that finds no chunk free within
    /// `control_timeout` is refused with `LimitExceeded { limit: "max_staging_bytes" }`:
    /// peers cannot make this side hold more.
    pub max_staging_bytes: usize,
}

impl Default for UcxConfig {
    fn default() -> Self {
        UcxConfig {
            library: None,
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            tls: None,
            ucx_options: Vec::new(),
            chunk_size: 4 << 20,
            max_inflight_chunks: 8,
            spin: Duration::from_micros(50),
            wakeup: true,
            park_max: Duration::from_millis(100),
            drain_timeout: Duration::from_secs(10),
            abandon_timeout: Duration::from_secs(1),
            ep_linger: Duration::from_secs(30),
            control_timeout: Duration::from_secs(10),
            revoke_timeout: Duration::from_secs(5),
            max_notify_len: 64 << 10,
            max_pending_notifications: 4096,
            direct_mapped: true,
            max_staging_bytes: 64 << 20,
        }
    }
}

impl UcxConfig {
    /// The default configuration with the environment's say applied: `HMC_UCX_DIRECT=0`
    /// turns [`UcxConfig::direct_mapped`] off. The one place this crate reads the
    /// environment for its configuration; binaries call it, the library's defaults do not.
    pub fn from_env() -> Self {
        UcxConfig {
            direct_mapped: std::env::var_os(DIRECT_ENV).is_none_or(|v| v != "0"),
            ..UcxConfig::default()
        }
    }

    /// The default configuration with `UCX_TLS` set to `tls`.
    pub fn with_tls(tls: &str) -> Self {
        UcxConfig {
            tls: Some(tls.to_string()),
            ..UcxConfig::default()
        }
    }
    /// This configuration with the floors the progress engine runs with: at least one
    /// chunk in flight, a park of at least 1 ms, and an `abandon_timeout` of at least
    /// [`MIN_ABANDON_TIMEOUT`].
    pub(crate) fn floored(&self) -> UcxConfig {
        UcxConfig {
            max_inflight_chunks: self.max_inflight_chunks.max(1),
            park_max: self.park_max.max(Duration::from_millis(1)),
            abandon_timeout: self.abandon_timeout.max(MIN_ABANDON_TIMEOUT),
            ..self.clone()
        }
    }
}
