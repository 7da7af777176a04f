//! The one error type every HMC crate returns at its boundary with `hmc-core`.

use std::time::Duration;

/// Result alias used throughout HMC.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, phrased so the user knows what to do next.
///
/// Backends map their vendor errors into these variants; a vendor error keeps the library,
/// the function and the vendor's own message in [`Error::Device`].
///
/// # Telling conditions apart
///
/// Without matching on message text: each condition has one shape across the HMC crates.
///
/// | condition | shape | helper |
/// | --- | --- | --- |
/// | a deadline passed | [`Error::DeadlineExceeded`] | [`Error::is_deadline`] |
/// | nobody listens at the address | [`Error::Io`] whose source is `ConnectionRefused` | [`Error::is_connection_refused`], [`Error::io_kind`] |
/// | the peer went away, or is not connected | [`Error::Peer`] | [`Error::is_retryable`] |
/// | a budget of the peer or of this process is full | [`Error::LimitExceeded`] | its `limit` names it |
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A vendor library, device or transport is not present on this machine.
    ///
    /// `what` names the library or device that was looked for; `hint` says how to point HMC
    /// elsewhere (for example `set HMC_UCX_LIB to the path of libucp.so.0`).
    #[error("{what} is unavailable: {reason} ({hint})")]
    Unavailable {
        /// The library, device or transport that was looked for.
        what: String,
        /// Why it could not be used.
        reason: String,
        /// How to make it available.
        hint: String,
    },

    /// An offset/length pair falls outside the region or buffer it addresses.
    #[error(
        "out of bounds: {what} [{offset}, {offset}+{len}) does not fit in {limit} bytes; \
         keep offset+len within the registered length"
    )]
    OutOfBounds {
        /// What was addressed (`"remote region"`, `"conn buffer"`, …).
        what: &'static str,
        /// Start of the access.
        offset: u64,
        /// Length of the access.
        len: u64,
        /// Size of the thing addressed.
        limit: u64,
    },

    /// A configured limit was reached. Every limit has a name, a default and a way to raise it.
    #[error("limit `{limit}` exceeded: {value} > {max}; {hint}")]
    LimitExceeded {
        /// The limit's name as it appears in configuration (`max_frame_len`, …).
        limit: &'static str,
        /// The value that was asked for.
        value: u64,
        /// The configured maximum.
        max: u64,
        /// How to raise it.
        hint: String,
    },

    /// The region exists but does not allow this kind of access (e.g. a READ of a region
    /// registered write-only).
    #[error("access denied: {0}")]
    AccessDenied(String),

    /// A remote key is unknown, forged, or refers to a region that has been deregistered.
    #[error("invalid remote key: {0}; re-export the region from the peer and import it again")]
    InvalidKey(String),

    /// An argument was malformed (mismatched devices, wrong descriptor version, …).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The operation's deadline passed before it completed.
    #[error(
        "deadline exceeded after {elapsed:?} during {during}; pass a later Deadline to allow more time"
    )]
    DeadlineExceeded {
        /// What was in progress.
        during: &'static str,
        /// How long the operation had run.
        elapsed: Duration,
    },

    /// The operation was cancelled (its future dropped or its owner closed).
    #[error("cancelled: {0}")]
    Cancelled(String),

    /// The peer is unknown, already connected, or went away.
    #[error("peer {peer}: {reason}")]
    Peer {
        /// The peer's rank or address.
        peer: String,
        /// What happened.
        reason: String,
    },

    /// The local object (communicator, channel) has been closed.
    #[error("closed: {0}")]
    Closed(String),

    /// The peer sent bytes that do not follow the protocol.
    #[error("protocol violation: {0}")]
    Protocol(String),

    /// This backend or transport cannot do what was asked (e.g. copy between two devices it
    /// does not own).
    #[error("unsupported: {0}")]
    Unsupported(String),

    /// A device allocation failed because the device is out of memory.
    #[error("out of memory on {device}: could not allocate {len} bytes")]
    OutOfMemory {
        /// The device.
        device: crate::Device,
        /// Bytes asked for.
        len: u64,
    },

    /// A transport cannot use memory of this device kind (TCP and device memory). Ask
    /// [`Communicator::capabilities`](crate::Communicator::capabilities) first.
    #[error(
        "the {transport} transport cannot use memory on {device}: {reason}; stage it through \
         host buffers or pick a transport whose capabilities list that memory kind"
    )]
    UnsupportedMemory {
        /// The transport.
        transport: crate::TransportId,
        /// The device of the memory that was refused.
        device: crate::Device,
        /// Why.
        reason: String,
    },

    /// A vendor library call failed. `kind` classifies it; the vendor detail stays in the
    /// other fields.
    #[error("{library}: {function} failed with {code}: {message}{}", kind.advice())]
    Device {
        /// What kind of failure it is (out of memory, …).
        kind: DeviceErrorKind,
        /// The library (`libcuda.so`, `libucp.so.0`, …).
        library: &'static str,
        /// The function that failed.
        function: &'static str,
        /// The vendor's numeric status.
        code: i64,
        /// The vendor's own error string.
        message: String,
    },

    /// An operating system I/O error, with what HMC was doing.
    #[error("{context}: {source}")]
    Io {
        /// What HMC was doing.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// What kind of failure an [`Error::Device`] is, across vendors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeviceErrorKind {
    /// The device (or the pinned host memory the driver manages) is out of memory.
    OutOfMemory,
    /// Any other failure; the vendor's code and message say what.
    Other,
}

impl DeviceErrorKind {
    fn advice(self) -> &'static str {
        match self {
            DeviceErrorKind::OutOfMemory => {
                "; free device buffers you no longer need, or allocate smaller ones"
            }
            DeviceErrorKind::Other => "",
        }
    }
}

impl Error {
    /// An [`Error::Device`].
    pub fn device(
        kind: DeviceErrorKind,
        library: &'static str,
        function: &'static str,
        code: i64,
        message: impl Into<String>,
    ) -> Self {
        Error::Device {
            kind,
            library,
            function,
            code,
            message: message.into(),
        }
    }

    /// True for [`Error::OutOfMemory`] and for a vendor's out-of-memory
    /// [`Error::Device`].
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self,
            Error::OutOfMemory { .. }
                | Error::Device {
                    kind: DeviceErrorKind::OutOfMemory,
                    ..
                }
        )
    }

    /// An [`Error::Io`] with context.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// An [`Error::Peer`].
    pub fn peer(peer: impl std::fmt::Display, reason: impl Into<String>) -> Self {
        Error::Peer {
            peer: peer.to_string(),
            reason: reason.into(),
        }
    }

    /// True for errors after which retrying the same call cannot succeed without a change
    /// (bad arguments, bad keys, missing libraries).
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            Error::Unavailable { .. }
                | Error::OutOfBounds { .. }
                | Error::AccessDenied(_)
                | Error::InvalidKey(_)
                | Error::InvalidArgument(_)
                | Error::Unsupported(_)
                | Error::UnsupportedMemory { .. }
        )
    }
}

impl Error {
    /// The OS error's kind, for an [`Error::Io`] (a refused connection is
    /// `Some(io::ErrorKind::ConnectionRefused)`).
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        match self {
            Error::Io { source, .. } => Some(source.kind()),
            _ => None,
        }
    }

    /// True when nothing listens at the address that was dialled.
    pub fn is_connection_refused(&self) -> bool {
        self.io_kind() == Some(std::io::ErrorKind::ConnectionRefused)
    }

    /// True for [`Error::DeadlineExceeded`].
    pub fn is_deadline(&self) -> bool {
        matches!(self, Error::DeadlineExceeded { .. })
    }

    /// True when the same operation may succeed if tried again later, unchanged: its
    /// deadline passed, the peer went away or refused the connection (it may be
    /// restarting), or a transient OS error. A transfer whose deadline passed may have
    /// moved some of its bytes; a retry moves them again, which one-sided READ/WRITE
    /// allows. Never true for what [`Error::is_permanent`] covers.
    pub fn is_retryable(&self) -> bool {
        use std::io::ErrorKind as K;
        match self {
            Error::DeadlineExceeded { .. } | Error::Peer { .. } => true,
            Error::Io { source, .. } => matches!(
                source.kind(),
                K::ConnectionRefused
                    | K::ConnectionReset
                    | K::ConnectionAborted
                    | K::BrokenPipe
                    | K::NotConnected
                    | K::UnexpectedEof
                    | K::TimedOut
                    | K::Interrupted
                    | K::WouldBlock
            ),
            _ => false,
        }
    }
}

/// Checks that `offset + len` fits within `limit`, without overflow.
pub fn check_bounds(what: &'static str, offset: u64, len: u64, limit: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= limit => Ok(()),
        _ => Err(Error::OutOfBounds {
            what,
            offset,
            len,
            limit,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_accept_exact_fit_and_refuse_overflow() {
        assert!(check_bounds("x", 0, 10, 10).is_ok());
        assert!(check_bounds("x", 10, 0, 10).is_ok());
        assert!(check_bounds("x", 1, 10, 10).is_err());
        assert!(check_bounds("x", u64::MAX, 2, u64::MAX).is_err());
    }

    #[test]
    fn vendor_out_of_memory_keeps_its_detail_and_says_what_to_do() {
        let e = Error::device(
            DeviceErrorKind::OutOfMemory,
            "libcuda.so",
            "cuMemAlloc",
            2,
            "CUDA_ERROR_OUT_OF_MEMORY: out of memory",
        );
        let s = e.to_string();
        assert!(e.is_out_of_memory());
        assert!(
            s.contains("cuMemAlloc") && s.contains("CUDA_ERROR_OUT_OF_MEMORY"),
            "{s}"
        );
        assert!(s.contains("free device buffers"), "{s}");
        let other = Error::device(DeviceErrorKind::Other, "libx.so", "f", 1, "boom");
        assert!(!other.is_out_of_memory());
    }

    #[test]
    fn unsupported_memory_names_transport_device_and_the_way_out() {
        let e = Error::UnsupportedMemory {
            transport: crate::TransportId::TCP,
            device: crate::Device::new(crate::DeviceKind::CUDA, 1),
            reason: "the CPU moves the bytes".into(),
        };
        let s = e.to_string();
        assert!(
            s.contains("Tcp") && s.contains("Cuda:1") && s.contains("stage"),
            "{s}"
        );
        assert!(e.is_permanent());
    }

    #[test]
    fn helpers_classify_without_reading_messages() {
        let refused = Error::io(
            "connecting to tcp://127.0.0.1:1",
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        );
        assert!(refused.is_connection_refused() && refused.is_retryable());
        assert!(!refused.is_permanent() && !refused.is_deadline());
        let late = Error::DeadlineExceeded {
            during: "transfer",
            elapsed: Duration::from_millis(1),
        };
        assert!(late.is_deadline() && late.is_retryable() && late.io_kind().is_none());
        assert!(Error::peer("rank 3", "went away").is_retryable());
        let denied = Error::io(
            "opening a file",
            std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        );
        assert!(!denied.is_retryable());
        assert!(!Error::InvalidArgument("x".into()).is_retryable());
    }

    #[test]
    fn limit_error_names_the_limit_and_the_way_to_raise_it() {
        let e = Error::LimitExceeded {
            limit: "max_frame_len",
            value: 10,
            max: 5,
            hint: "raise ControlPlaneConfig::max_frame_len".into(),
        };
        let s = e.to_string();
        assert!(s.contains("max_frame_len") && s.contains("raise"), "{s}");
    }
}
