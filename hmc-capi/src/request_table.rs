//! The table of asynchronous requests, apart from the calls on them (`request`) so that
//! closing an engine (`engine`) can forget its requests without the two modules reaching
//! each other's items.

use std::time::{Duration, SystemTime};

use hmc_engine::TransferRequest;
use parking_lot::Mutex;

use crate::error::Status;
use crate::handles::Table;

/// How a request ended: its status and message.
#[derive(Clone)]
pub(crate) struct Outcome {
    pub(crate) status: Status,
    pub(crate) message: String,
    pub(crate) state: u32,
    pub(crate) duration: Duration,
}

/// An asynchronous transfer and the engine it belongs to.
pub(crate) struct ReqObj {
    pub(crate) engine: u64,
    pub(crate) req: TransferRequest,
    pub(crate) posted_at: SystemTime,
    pub(crate) bytes: u64,
    pub(crate) descs: u64,
    pub(crate) outcome: Mutex<Option<Outcome>>,
}

pub(crate) static REQUESTS: Table<ReqObj> = Table::new("request", 3);

/// Forgets the requests of a closed engine (the engine's finalize cancels them).
pub(crate) fn forget_engine(engine: u64) {
    for r in REQUESTS.remove_where(|r| r.engine == engine) {
        r.req.cancel();
    }
}
