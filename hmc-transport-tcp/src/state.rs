//! The state a TCP communicator shares with its responder and its staging pool: the
//! registrations peers reach (`region.rs`), the notification queue, the responder's tasks
//! and counters ([`Shared`]). Kept apart from `comm.rs` so that the responder and the
//! staging code depend on this state, not on the communicator that owns it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hmc_core::{Error, Notification, PeerAddr, Result};
use hmc_transport_kit::registry::Registry;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::TcpConfig;
use crate::region::RegEntry;
use crate::staged::StagingPool;
use crate::wait::Watched;

#[derive(Default)]
pub(crate) struct Notifications {
    pub(crate) closed: bool,
    pub(crate) queue: std::collections::VecDeque<Notification>,
    /// Bytes of the messages in `queue`.
    pub(crate) bytes: usize,
}

/// The responder's counters behind [`TcpStats`].
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) accepted: AtomicU64,
    pub(crate) open: AtomicU64,
    pub(crate) hello_timeouts: AtomicU64,
    pub(crate) idle_timeouts: AtomicU64,
    pub(crate) request_timeouts: AtomicU64,
    pub(crate) refused_notifications: AtomicU64,
    pub(crate) auth_failures: AtomicU64,
}

impl Counters {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The responder's connection tasks, aborted when the communicator closes.
#[derive(Default)]
pub(crate) struct Tasks {
    pub(crate) closed: bool,
    pub(crate) next: u64,
    pub(crate) running: HashMap<u64, AbortHandle>,
}

/// What the communicator, its responder and its staging share: the registrations, the
/// notification queue, the responder's tasks and counters.
pub(crate) struct Shared {
    pub(crate) config: TcpConfig,
    pub(crate) addr: PeerAddr,
    pub(crate) regions: Registry<RegEntry>,
    pub(crate) registered_bytes: Mutex<u64>,
    pub(crate) next_endpoint: AtomicU64,
    pub(crate) notifications: Watched<Notifications>,
    pub(crate) tasks: Mutex<Tasks>,
    pub(crate) counters: Counters,
    pub(crate) staging: Arc<StagingPool>,
    pub(crate) closed: watch::Sender<bool>,
    /// The served data connections' apply gates, for ABANDON requests.
    pub(crate) gates: crate::abandon::Gates,
}

impl Shared {
    pub(crate) fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }

    pub(crate) fn check_open(&self) -> Result<()> {
        if self.is_closed() {
            Err(Error::Closed(format!(
                "the TcpCommunicator at {} was closed",
                self.addr
            )))
        } else {
            Ok(())
        }
    }
}
