//! Rust errors as the Python exceptions of `hmc._errors`: `hmc.HmcError` and its
//! subclasses, each also deriving from the matching built-in exception.

use hmc_engine::EngineError;
use hmc_rpc::{CallError, Status};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyModule, PyType};

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The class `name` of `hmc._errors`.
fn class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyType>> {
    let m = ERRORS.get_or_try_init(py, || {
        PyModule::import(py, "hmc._errors").map(Bound::unbind)
    })?;
    Ok(m.bind(py).getattr(name)?.cast_into::<PyType>()?)
}

/// An exception of class `name` with `msg`.
pub(crate) fn new(name: &str, msg: impl Into<String>) -> PyErr {
    let msg = msg.into();
    Python::attach(|py| match class(py, name) {
        Ok(c) => PyErr::from_type(c, msg),
        Err(e) => e,
    })
}

/// `hmc.StateError`.
pub(crate) fn state(msg: impl Into<String>) -> PyErr {
    new("StateError", msg)
}

/// `hmc.InvalidArgumentError`.
pub(crate) fn invalid(msg: impl Into<String>) -> PyErr {
    new("InvalidArgumentError", msg)
}

/// `hmc.UnsupportedError`.
pub(crate) fn unsupported(msg: impl Into<String>) -> PyErr {
    new("UnsupportedError", msg)
}

/// The class of an engine error.
fn engine_class(e: &EngineError) -> &'static str {
    match e {
        EngineError::Timeout { .. } => "TimeoutError",
        EngineError::NotConnected(_) => "NotConnectedError",
        EngineError::AlreadyConnected(_) | EngineError::Finalized => "StateError",
        EngineError::NotRegistered { .. }
        | EngineError::Straddles { .. }
        | EngineError::ListInvalid(_) => "NotRegisteredError",
        EngineError::Overlaps { .. } | EngineError::InvalidArgument(_) | EngineError::Layout(_) => {
            "InvalidArgumentError"
        }
        EngineError::Limit { .. } => "LimitError",
        EngineError::Metadata { .. } => "UnavailableError",
        EngineError::PeerGone { .. } => "PeerGoneError",
        EngineError::BadMetadata(_) => "MismatchError",
        EngineError::UnknownKey { .. } => "UnknownKeyError",
        EngineError::Cancelled(_) => "CancelledError",
        EngineError::Transport(t) => core_class(t),
        _ => "HmcError",
    }
}

/// The class of a transport (core) error.
fn core_class(e: &hmc_core::Error) -> &'static str {
    use hmc_core::Error as E;
    match e {
        // A library or device missing here, not the peer.
        E::Unavailable { .. } => "BackendUnavailableError",
        E::Peer { .. } | E::Closed(_) => "UnavailableError",
        E::OutOfBounds { .. } | E::InvalidArgument(_) | E::AccessDenied(_) => {
            "InvalidArgumentError"
        }
        E::InvalidKey(_) => "NotRegisteredError",
        E::LimitExceeded { .. } => "LimitError",
        E::DeadlineExceeded { .. } => "TimeoutError",
        E::Cancelled(_) => "CancelledError",
        E::Unsupported(_) | E::UnsupportedMemory { .. } => "UnsupportedError",
        // A refused connect keeps its io::Error (one shape across crates): nobody listens.
        _ if e.is_connection_refused() => "PeerGoneError",
        _ => "HmcError",
    }
}

/// An engine error as its Python exception.
pub(crate) fn engine(e: EngineError) -> PyErr {
    new(engine_class(&e), e.to_string())
}

/// A shared engine error (a failed asynchronous request's) as its Python exception.
pub(crate) fn engine_ref(e: &EngineError) -> PyErr {
    new(engine_class(e), e.to_string())
}

/// An RPC call error as its Python exception; a non-OK answer is `hmc.RpcError` with the
/// status.
pub(crate) fn call(e: CallError) -> PyErr {
    let name = match &e {
        CallError::Status { status, .. } if *status == Status::DEADLINE_EXCEEDED => "TimeoutError",
        CallError::Status { status, message } => {
            let (code, text) = (status.0, status.to_string());
            let msg = format!("server answered {status}: {message}");
            return Python::attach(|py| {
                let made = class(py, "RpcError").and_then(|c| c.call1((msg, code, text)));
                match made {
                    Ok(v) => PyErr::from_value(v),
                    Err(e) => e,
                }
            });
        }
        CallError::DeadlineExceeded(_) => "TimeoutError",
        CallError::ConnectionLost(_) => "PeerGoneError",
        CallError::Connect(_) => "UnavailableError",
        CallError::Refused(_) => "LimitError",
        CallError::Codec(_) => "InvalidArgumentError",
        _ => "HmcError",
    };
    new(name, e.to_string())
}
