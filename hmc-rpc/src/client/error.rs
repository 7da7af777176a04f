//! Why a call failed: `CallError`, with one shape per condition and helpers to tell them apart.

use std::time::Duration;

use hmc_core::Error;

use crate::codec::CodecError;
use crate::frame::Status;
use crate::proto::StartError;

/// Why a call failed.
///
/// # One shape per condition
///
/// | condition | shape | helper |
/// | --- | --- | --- |
/// | the call's deadline passed (at the client, or the server said so) | [`CallError::DeadlineExceeded`], never `Status { DEADLINE_EXCEEDED }` | [`CallError::is_deadline`] |
/// | nobody listens at the server's address | [`CallError::Connect`] holding an [`Error::Io`] whose source is `ConnectionRefused` | [`CallError::is_connection_refused`], [`CallError::io_kind`] |
/// | the server went away with the call in flight | [`CallError::ConnectionLost`] | [`CallError::may_have_run`] |
/// | the server refused the call for load (the call did not run) | `Status { OVERLOADED }` | [`CallError::is_overloaded`] |
///
/// A server that closes the whole connection for load (GOAWAY(OVERLOADED), e.g. at
/// `max_connections`) fails the calls in flight as [`CallError::ConnectionLost`]: the
/// client cannot tell which of them the server read. [`CallError::is_retryable`] says
/// whether the same call may succeed later; [`CallError::may_have_run`] whether retrying
/// could run it twice.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The server answered with a non-OK status. Never `DEADLINE_EXCEEDED`: that comes as
    /// [`CallError::DeadlineExceeded`].
    #[error("server answered {status}: {message}")]
    Status {
        /// The status.
        status: Status,
        /// The server's explanation.
        message: String,
    },
    /// The deadline passed before the answer came; a CANCEL was sent.
    #[error("deadline exceeded after {0:?}; pass a longer timeout in CallOptions")]
    DeadlineExceeded(Duration),
    /// The connection was lost after the call was sent: it may or may not have run, and
    /// it is not replayed. The next call reconnects.
    #[error(
        "connection lost while the call was in flight ({0}); it may have run and is not replayed"
    )]
    ConnectionLost(String),
    /// Could not connect.
    #[error("connect failed: {0}")]
    Connect(#[source] Error),
    /// The call could not be started (payload over the limit, …).
    #[error("call refused locally: {0}")]
    Refused(#[from] StartError),
    /// The request could not be encoded or the response decoded.
    #[error("codec: {0}")]
    Codec(#[from] CodecError),
    /// Staging a device-resident payload or response through host memory failed.
    #[error("device staging: {0}")]
    Device(#[source] Error),
}

impl CallError {
    /// A short name of the failure's kind (a metrics label): the server's status in lower
    /// case, or `deadline_exceeded`, `connection_lost`, `connect`, `refused`, `codec`,
    /// `device`.
    pub fn kind(&self) -> String {
        match self {
            CallError::Status { status, .. } => status.name().to_lowercase(),
            CallError::DeadlineExceeded(_) => "deadline_exceeded".into(),
            CallError::ConnectionLost(_) => "connection_lost".into(),
            CallError::Connect(_) => "connect".into(),
            CallError::Refused(_) => "refused".into(),
            CallError::Codec(_) => "codec".into(),
            CallError::Device(_) => "device".into(),
        }
    }

    /// The error for a non-OK answer: `DEADLINE_EXCEEDED` becomes
    /// [`CallError::DeadlineExceeded`] (the caller fills in the time the call took), so an
    /// expired call has one shape whichever side noticed first.
    pub(crate) fn answered(status: Status, message: &[u8]) -> CallError {
        if status == Status::DEADLINE_EXCEEDED {
            tracing::debug!(
                server_said = %String::from_utf8_lossy(message),
                "the server answered DEADLINE_EXCEEDED"
            );
            return CallError::DeadlineExceeded(Duration::ZERO);
        }
        CallError::Status {
            status,
            message: String::from_utf8_lossy(message).into_owned(),
        }
    }

    /// The server's status, if it answered (`DEADLINE_EXCEEDED` for
    /// [`CallError::DeadlineExceeded`], whichever side noticed).
    pub fn status(&self) -> Option<Status> {
        match self {
            CallError::Status { status, .. } => Some(*status),
            CallError::DeadlineExceeded(_) => Some(Status::DEADLINE_EXCEEDED),
            _ => None,
        }
    }

    /// True for [`CallError::DeadlineExceeded`], and for a connect that ran out of
    /// `ClientConfig::connect_timeout`.
    pub fn is_deadline(&self) -> bool {
        match self {
            CallError::DeadlineExceeded(_) => true,
            CallError::Connect(e) => e.is_deadline(),
            _ => false,
        }
    }

    /// The OS error's kind when connecting failed (`ConnectionRefused` when nobody
    /// listens there).
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        match self {
            CallError::Connect(e) => e.io_kind(),
            _ => None,
        }
    }

    /// True when nobody listens at the server's address.
    pub fn is_connection_refused(&self) -> bool {
        self.io_kind() == Some(std::io::ErrorKind::ConnectionRefused)
    }

    /// True when the server refused the call for load (`OVERLOADED`); the call did not run.
    pub fn is_overloaded(&self) -> bool {
        self.status() == Some(Status::OVERLOADED)
    }

    /// True when the call may have run at the server although it failed here: its
    /// deadline passed or the connection was lost with it in flight. Retry such a call
    /// only if running it twice is harmless.
    pub fn may_have_run(&self) -> bool {
        matches!(
            self,
            CallError::DeadlineExceeded(_) | CallError::ConnectionLost(_)
        )
    }

    /// True when the same call may succeed if made again later, unchanged: the server was
    /// overloaded or shutting down (a restarted or other server may take it), the
    /// connection could not be made or was lost, or the deadline passed. Check
    /// [`CallError::may_have_run`] before retrying a call that is not idempotent.
    pub fn is_retryable(&self) -> bool {
        match self {
            CallError::DeadlineExceeded(_) | CallError::ConnectionLost(_) => true,
            CallError::Connect(e) => e.is_retryable(),
            CallError::Status { status, .. } => {
                *status == Status::OVERLOADED || *status == Status::SHUTTING_DOWN
            }
            _ => false,
        }
    }
}

impl From<CallError> for Error {
    fn from(e: CallError) -> Self {
        match e {
            CallError::Connect(e) => e,
            CallError::DeadlineExceeded(d) => Error::DeadlineExceeded {
                during: "RPC call",
                elapsed: d,
            },
            CallError::Status { status, message } if status == Status::CANCELLED => {
                Error::Cancelled(message)
            }
            CallError::ConnectionLost(why) => Error::peer("rpc server", why),
            CallError::Device(e) => e,
            other => Error::Protocol(other.to_string()),
        }
    }
}
