//! The tables of handles that belong to an engine (asynchronous requests, prepared lists
//! and transfers) and how a request's end is reported, apart from the calls on them
//! (`request`, `prepared`), so that closing an engine (`engine`) forgets them without
//! those modules reaching each other's items.

use std::time::{Duration, SystemTime};

use hmc_core::AnyCommunicator;
use hmc_engine::{PreparedList, PreparedTransfer, TransferRequest, TransferStatus};
use parking_lot::Mutex;

use crate::error::{Error, Result, Status, engine_status};
use crate::handles::Table;

/// `hmc_request_state` values (HIXL's `TransferStatus` order).
const WAITING: u32 = 0;
const COMPLETED: u32 = 1;
const TIMED_OUT: u32 = 2;
const FAILED: u32 = 3;

/// How a request ended: its status and message.
#[derive(Clone)]
pub(crate) struct Outcome {
    pub(crate) status: Status,
    pub(crate) message: String,
    pub(crate) state: u32,
    pub(crate) duration: Duration,
}

/// How a transfer with status `s` ended (or that it has not), after `duration`.
pub(crate) fn outcome_of(s: &TransferStatus, duration: Duration) -> Outcome {
    let (status, message, state) = match s {
        TransferStatus::Waiting => (Status::Pending, String::new(), WAITING),
        TransferStatus::Completed => (Status::Ok, String::new(), COMPLETED),
        TransferStatus::TimedOut => (
            Status::Deadline,
            "the transfer's timeout passed; its memory is no longer touched".into(),
            TIMED_OUT,
        ),
        TransferStatus::Failed(e) => (engine_status(e), e.to_string(), FAILED),
    };
    Outcome {
        status,
        message,
        state,
        duration,
    }
}

impl Outcome {
    /// What the status and wait calls return: `HMC_PENDING`, `HMC_OK`, or the failure.
    pub(crate) fn into_result(self) -> Result<Status> {
        match self.state {
            WAITING => Ok(Status::Pending),
            COMPLETED => Ok(Status::Ok),
            _ => Err(Error::Request {
                status: self.status,
                message: self.message,
            }),
        }
    }
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

/// A prepared list and the engine it belongs to.
pub(crate) struct PreppedObj {
    pub(crate) engine: u64,
    pub(crate) list: PreparedList<AnyCommunicator>,
}

/// A prepared transfer and the engine it belongs to.
pub(crate) struct XferObj {
    pub(crate) engine: u64,
    pub(crate) xfer: PreparedTransfer<AnyCommunicator>,
}

pub(crate) static PREPPED: Table<PreppedObj> = Table::new("prepared list", 12);
pub(crate) static XFERS: Table<XferObj> = Table::new("prepared transfer", 13);

/// Forgets the requests, lists and transfers of a closed engine (the engine's finalize
/// cancels what is running).
pub(crate) fn forget_engine(engine: u64) {
    for r in REQUESTS.remove_where(|r| r.engine == engine) {
        r.req.cancel();
    }
    PREPPED.remove_where(|p| p.engine == engine);
    XFERS.remove_where(|x| x.engine == engine);
}
