//! The crate's one error type, its `hmc_status` code, this thread's last message
//! (`hmc_last_error`), and the guard every exported function runs its body in: a panic
//! becomes `HMC_ERR_INTERNAL` with its message instead of unwinding into C.

use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use hmc_engine::EngineError;
use hmc_rpc::CallError;

/// `hmc_status`: what every call of the C API returns (values fixed by `hmc.h`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// `HMC_OK`.
    Ok = 0,
    /// `HMC_PENDING`: not an error; the request (or call) is still running.
    Pending = 1,
    /// `HMC_ERR_INVALID_ARGUMENT`: a NULL, zero, out-of-range or unknown argument or
    /// option, or a handle that is closed, released or of another engine.
    InvalidArgument = 2,
    /// `HMC_ERR_STRUCT_SIZE`: a struct's `struct_size` this library cannot read.
    StructSize = 3,
    /// `HMC_ERR_NOT_CONNECTED`.
    NotConnected = 4,
    /// `HMC_ERR_ALREADY_CONNECTED`.
    AlreadyConnected = 5,
    /// `HMC_ERR_NOT_REGISTERED`: an address in no registered region (or straddling two).
    NotRegistered = 6,
    /// `HMC_ERR_DEADLINE`: the call's or request's deadline passed.
    Deadline = 7,
    /// `HMC_ERR_CANCELLED`.
    Cancelled = 8,
    /// `HMC_ERR_PEER_GONE`: the peer went away or restarted.
    PeerGone = 9,
    /// `HMC_ERR_LIMIT`: a configured limit was reached (the message names it).
    Limit = 10,
    /// `HMC_ERR_UNSUPPORTED_MEMORY`: the transport cannot use memory of that kind.
    UnsupportedMemory = 11,
    /// `HMC_ERR_UNSUPPORTED`: not supported by this transport or build.
    Unsupported = 12,
    /// `HMC_ERR_AUTH`: authentication failed or was refused.
    Auth = 13,
    /// `HMC_ERR_UNAVAILABLE`: a backend, transport, peer or service cannot be reached.
    Unavailable = 14,
    /// `HMC_ERR_STATE`: not allowed now (engine finalized, a blocking call from a
    /// callback, a process forked after the library started).
    State = 15,
    /// `HMC_ERR_REMOTE`: an RPC server answered with a non-OK status.
    Remote = 16,
    /// `HMC_ERR_BUFFER_TOO_SMALL`: the output buffer is too small; the length needed was
    /// written.
    BufferTooSmall = 17,
    /// `HMC_ERR_INTERNAL`: a bug (a caught panic included).
    Internal = 18,
}

impl Status {
    /// The constant's name in `hmc.h`, for `hmc_status_name`.
    pub fn name(code: i32) -> &'static str {
        const NAMES: [&str; 19] = [
            "HMC_OK",
            "HMC_PENDING",
            "HMC_ERR_INVALID_ARGUMENT",
            "HMC_ERR_STRUCT_SIZE",
            "HMC_ERR_NOT_CONNECTED",
            "HMC_ERR_ALREADY_CONNECTED",
            "HMC_ERR_NOT_REGISTERED",
            "HMC_ERR_DEADLINE",
            "HMC_ERR_CANCELLED",
            "HMC_ERR_PEER_GONE",
            "HMC_ERR_LIMIT",
            "HMC_ERR_UNSUPPORTED_MEMORY",
            "HMC_ERR_UNSUPPORTED",
            "HMC_ERR_AUTH",
            "HMC_ERR_UNAVAILABLE",
            "HMC_ERR_STATE",
            "HMC_ERR_REMOTE",
            "HMC_ERR_BUFFER_TOO_SMALL",
            "HMC_ERR_INTERNAL",
        ];
        usize::try_from(code)
            .ok()
            .and_then(|i| NAMES.get(i))
            .copied()
            .unwrap_or("HMC_UNKNOWN_STATUS")
    }
}

/// Why a call of the C API failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The engine refused or failed.
    Engine(EngineError),
    /// A transport or backend failed outside an engine call (opening a device).
    Core(hmc_core::Error),
    /// An RPC call failed.
    Call(CallError),
    /// A pointer argument that must not be NULL was.
    Null(&'static str),
    /// An argument is out of range, unknown or malformed.
    InvalidArgument(String),
    /// A handle is not an open one of the kind expected (closed, released, never made, of
    /// another kind or another engine).
    Handle(String),
    /// A struct's `struct_size` cannot be read by this library.
    StructSize {
        /// The struct's C name.
        name: &'static str,
        /// What the caller set.
        got: usize,
        /// The smallest this library accepts (the first version's size).
        min: usize,
        /// The size this library knows.
        known: usize,
    },
    /// An output buffer is too small for `need` bytes.
    BufferTooSmall {
        /// What the output is.
        what: &'static str,
        /// Bytes needed (with the terminating NUL for strings).
        need: usize,
        /// Bytes given.
        cap: usize,
    },
    /// Not allowed in this state.
    State(String),
    /// An asynchronous request or call ended without success.
    Request {
        /// How it ended.
        status: Status,
        /// Why.
        message: String,
    },
    /// A panic caught at the boundary.
    Panic(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Engine(e) => write!(f, "{e}"),
            Error::Core(e) => write!(f, "{e}"),
            Error::Call(e) => write!(f, "{e}"),
            Error::Null(arg) => write!(f, "`{arg}` is NULL; pass a valid pointer"),
            Error::InvalidArgument(m) | Error::Handle(m) | Error::State(m) => f.write_str(m),
            Error::StructSize {
                name,
                got,
                min,
                known,
            } => write!(
                f,
                "`{name}.struct_size` is {got}, but this library reads {min} to {known} bytes \
                 (or more whose extra bytes are zero); set it with sizeof({name}) or its \
                 _INIT macro, and link the libhmc the program was built against or a newer one"
            ),
            Error::BufferTooSmall { what, need, cap } => write!(
                f,
                "the buffer for {what} holds {cap} bytes and {need} are needed (the length was \
                 written to the length argument); pass a larger buffer"
            ),
            Error::Request { message, .. } => f.write_str(message),
            Error::Panic(m) => write!(f, "internal error (a bug in libhmc; please report it): {m}"),
        }
    }
}

impl From<EngineError> for Error {
    fn from(e: EngineError) -> Self {
        Error::Engine(e)
    }
}

impl From<hmc_core::Error> for Error {
    fn from(e: hmc_core::Error) -> Self {
        Error::Core(e)
    }
}

impl From<CallError> for Error {
    fn from(e: CallError) -> Self {
        Error::Call(e)
    }
}

/// Whether a message is an authentication failure (the transports and the metadata
/// exchange report those as I/O or metadata errors whose text says so).
fn mentions_auth(m: &str) -> bool {
    let m = m.to_ascii_lowercase();
    m.contains("authenticat") || m.contains("unauthenticated")
}

/// The status of an engine error.
pub(crate) fn engine_status(e: &EngineError) -> Status {
    match e {
        EngineError::NotConnected(_) => Status::NotConnected,
        EngineError::AlreadyConnected(_) => Status::AlreadyConnected,
        EngineError::NotRegistered { .. }
        | EngineError::Straddles { .. }
        | EngineError::ListInvalid(_)
        | EngineError::UnknownKey { .. } => Status::NotRegistered,
        EngineError::BadMetadata(why) if mentions_auth(why) => Status::Auth,
        EngineError::Overlaps { .. }
        | EngineError::InvalidArgument(_)
        | EngineError::Layout(_)
        | EngineError::BadMetadata(_) => Status::InvalidArgument,
        EngineError::Timeout { .. } => Status::Deadline,
        EngineError::Limit { .. } => Status::Limit,
        EngineError::Metadata { why, .. } if mentions_auth(why) => Status::Auth,
        EngineError::Metadata { .. } | EngineError::Store(_) => Status::Unavailable,
        EngineError::PeerGone { .. } => Status::PeerGone,
        EngineError::Cancelled(_) => Status::Cancelled,
        EngineError::Finalized => Status::State,
        EngineError::Transport(t) => core_status(t),
        _ => Status::Internal,
    }
}

/// The status of a transport or backend error.
pub(crate) fn core_status(e: &hmc_core::Error) -> Status {
    use hmc_core::Error as E;
    match e {
        _ if mentions_auth(&e.to_string()) => Status::Auth,
        E::Unavailable { .. } | E::Closed(_) => Status::Unavailable,
        E::Peer { .. } => Status::PeerGone,
        E::OutOfBounds { .. } | E::InvalidArgument(_) | E::AccessDenied(_) => {
            Status::InvalidArgument
        }
        E::InvalidKey(_) => Status::NotRegistered,
        E::LimitExceeded { .. } | E::OutOfMemory { .. } => Status::Limit,
        E::DeadlineExceeded { .. } => Status::Deadline,
        E::Cancelled(_) => Status::Cancelled,
        E::UnsupportedMemory { .. } => Status::UnsupportedMemory,
        E::Unsupported(_) => Status::Unsupported,
        _ if e.is_connection_refused() => Status::Unavailable,
        E::Io { .. } | E::Device { .. } => Status::Unavailable,
        _ => Status::Internal,
    }
}

/// The status of an RPC call error.
pub(crate) fn call_status(e: &CallError) -> Status {
    use hmc_rpc::Status as S;
    match e {
        CallError::Status { status, .. } if *status == S::UNAUTHENTICATED => Status::Auth,
        CallError::Status { status, .. } if *status == S::CANCELLED => Status::Cancelled,
        CallError::Status { .. } => Status::Remote,
        CallError::DeadlineExceeded(_) => Status::Deadline,
        CallError::ConnectionLost(_) => Status::PeerGone,
        CallError::Connect(c) if mentions_auth(&c.to_string()) => Status::Auth,
        CallError::Connect(_) => Status::Unavailable,
        CallError::Refused(_) => Status::Limit,
        CallError::Codec(_) => Status::InvalidArgument,
        _ => Status::Internal,
    }
}

impl Error {
    /// Its `hmc_status`.
    pub fn status(&self) -> Status {
        match self {
            Error::Engine(e) => engine_status(e),
            Error::Core(e) => core_status(e),
            Error::Call(e) => call_status(e),
            Error::Null(_) | Error::InvalidArgument(_) | Error::Handle(_) => {
                Status::InvalidArgument
            }
            Error::StructSize { .. } => Status::StructSize,
            Error::BufferTooSmall { .. } => Status::BufferTooSmall,
            Error::State(_) => Status::State,
            Error::Request { status, .. } => *status,
            Error::Panic(_) => Status::Internal,
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

thread_local! {
    /// This thread's last error message (what `hmc_last_error` returns).
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `msg` as this thread's last error, prefixed with the function that failed.
pub(crate) fn set_last_error(function: &str, msg: &str) {
    // An interior NUL would cut the message: show it instead.
    let text = format!("{function}: {msg}").replace('\0', "\\0");
    let c = CString::new(text).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = c);
}

/// This thread's last error message; valid until the next failing call on this thread.
pub(crate) fn last_error_ptr() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

/// Runs `body` for the exported function `function`: its error becomes a status and this
/// thread's last message, and a panic becomes `HMC_ERR_INTERNAL` instead of crossing into
/// C. `body` returns the status to give on success (`HMC_OK`, or `HMC_PENDING`).
pub(crate) fn guard_with(function: &'static str, body: impl FnOnce() -> Result<Status>) -> Status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            set_last_error(function, &e.to_string());
            e.status()
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            let e = Error::Panic(what);
            set_last_error(function, &e.to_string());
            e.status()
        }
    }
}

/// [`guard_with`] for a body that returns nothing on success (`HMC_OK`).
pub(crate) fn guard(function: &'static str, body: impl FnOnce() -> Result<()>) -> Status {
    guard_with(function, || body().map(|()| Status::Ok))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_an_internal_status_with_its_message() {
        let s = guard("hmc_test", || panic!("boom {}", 7));
        assert_eq!(s, Status::Internal);
        // SAFETY: the pointer is this thread's last message, read before any other call.
        let msg = unsafe { std::ffi::CStr::from_ptr(last_error_ptr()) };
        let msg = msg.to_str().unwrap();
        assert!(
            msg.starts_with("hmc_test: internal error") && msg.contains("boom 7"),
            "{msg}"
        );
    }

    #[test]
    fn every_status_has_its_header_name() {
        assert_eq!(Status::name(Status::Ok as i32), "HMC_OK");
        assert_eq!(Status::name(Status::Internal as i32), "HMC_ERR_INTERNAL");
        assert_eq!(Status::name(-1), "HMC_UNKNOWN_STATUS");
        assert_eq!(Status::name(19), "HMC_UNKNOWN_STATUS");
    }
}
