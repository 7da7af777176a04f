//! Why a plugin was refused (`PluginError`), and how a plugin's status codes and last-error strings become `hmc_core::Error`.

use std::path::PathBuf;
use std::time::Duration;

use hmc_core::{Device, Error, TransportId};

use crate::abi::*;

/// Why a candidate plugin file was not loaded. Every message names the file and says what
/// to change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PluginError {
    /// `dlopen` failed (not a shared library, missing dependency, wrong architecture).
    #[error(
        "{path}: cannot be loaded: {reason}; check that it is a shared library for this \
         machine and that its dependencies resolve (ldd {path})"
    )]
    Open {
        /// The file.
        path: PathBuf,
        /// The loader's message.
        reason: String,
    },
    /// The library has no `hmc_plugin_init` symbol.
    #[error(
        "{path}: no `hmc_plugin_init` symbol, so it is not an HMC plugin; export it as \
         include/hmc_plugin.h declares (Rust: hmc_plugin::export_plugin!)"
    )]
    NoEntry {
        /// The file.
        path: PathBuf,
    },
    /// The plugin was built for another ABI major version.
    #[error(
        "{path}: built for HMC plugin ABI {plugin_major}.{plugin_minor}, this host speaks \
         {host_major}.{host_minor}; rebuild the plugin against the hmc_plugin.h of ABI \
         {host_major}"
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// The plugin's ABI major.
        plugin_major: u32,
        /// The plugin's ABI minor.
        plugin_minor: u32,
        /// The host's ABI major.
        host_major: u32,
        /// The host's ABI minor.
        host_minor: u32,
    },
    /// `hmc_plugin_init` returned an error.
    #[error("{path}: hmc_plugin_init failed with {code} ({}): {message}", status_name(*code))]
    Init {
        /// The file.
        path: PathBuf,
        /// The status code.
        code: i32,
        /// The plugin's last-error message, or a note that it set none.
        message: String,
    },
    /// The table the plugin filled is malformed (too short, a required function missing,
    /// no name).
    #[error("{path}: the plugin's HmcPluginApi table is unusable: {problem}")]
    Table {
        /// The file.
        path: PathBuf,
        /// What is wrong and what the plugin must do.
        problem: String,
    },
    /// The file, or the folder it is in, could be changed by someone else than this
    /// process's user or root (OpenSSH's StrictModes rule): loading it would run their
    /// code. Checked before the file is opened.
    #[error(
        "{path}: not loaded: {reason}; plugins run inside this process, so only root or this          user may be able to change them (chmod go-w, chown)"
    )]
    Unsafe {
        /// The file.
        path: PathBuf,
        /// What is writable, or by whom it is owned.
        reason: String,
    },
    /// The plugin's name is one of the built-in transports'.
    #[error(
        "{path}: the plugin is named `{name}`, the name of a built-in transport; rename the          plugin (built-in names: {builtins})"
    )]
    Reserved {
        /// The file.
        path: PathBuf,
        /// The name.
        name: String,
        /// The names no plugin may take.
        builtins: String,
    },
    /// Another plugin of the same name was found first on the search path.
    #[error(
        "{path}: a plugin named `{name}` was already loaded from {first}; the first on the \
         search path wins (reorder HMC_PLUGIN_PATH, or rename one)"
    )]
    Duplicate {
        /// The file refused.
        path: PathBuf,
        /// The name both claim.
        name: String,
        /// The file loaded under that name.
        first: PathBuf,
    },
}

impl From<PluginError> for Error {
    fn from(e: PluginError) -> Self {
        Error::Unavailable {
            what: "an HMC transport plugin".into(),
            reason: e.to_string(),
            hint: "run `hmc-rpc-server --list-transports` to see what was found and why each \
                   candidate was refused"
                .into(),
        }
    }
}

/// A failed call into plugin `plugin`: `function` returned `code` with `message` (the
/// plugin's last-error string, `None` when it set none).
pub(crate) fn status_error(
    plugin: &str,
    transport: TransportId,
    function: &'static str,
    code: i32,
    message: Option<String>,
    started: std::time::Instant,
) -> Error {
    let detail = match message {
        Some(m) if !m.is_empty() => format!("plugin `{plugin}`: {function}: {m}"),
        _ => format!(
            "plugin `{plugin}`: {function} returned {code} ({}) without a message; the \
             plugin must set its last-error string with every error (hmc_plugin.h, \
             last_error)",
            status_name(code)
        ),
    };
    match code {
        HMC_ERR_OUT_OF_BOUNDS => Error::InvalidArgument(format!("out of bounds: {detail}")),
        HMC_ERR_ACCESS_DENIED => Error::AccessDenied(detail),
        HMC_ERR_INVALID_KEY => Error::InvalidKey(detail),
        HMC_ERR_DEADLINE => {
            tracing::debug!(%detail, "plugin transfer ended by its deadline");
            Error::DeadlineExceeded {
                during: function,
                elapsed: started.elapsed(),
            }
        }
        HMC_ERR_CANCELLED => Error::Cancelled(detail),
        HMC_ERR_PEER => Error::Peer {
            peer: format!("of plugin `{plugin}`"),
            reason: detail,
        },
        HMC_ERR_CLOSED => Error::Closed(detail),
        HMC_ERR_PROTOCOL => Error::Protocol(detail),
        HMC_ERR_UNSUPPORTED => Error::Unsupported(detail),
        HMC_ERR_UNSUPPORTED_MEMORY => Error::UnsupportedMemory {
            transport,
            device: Device::HOST,
            reason: detail,
        },
        HMC_ERR_OUT_OF_MEMORY => Error::device(
            hmc_core::DeviceErrorKind::OutOfMemory,
            "an HMC plugin (transport or memory)",
            function,
            code as i64,
            detail,
        ),
        // The plugin's message names the limit and how to raise it; no numbers cross.
        HMC_ERR_LIMIT => Error::InvalidArgument(format!("limit reached: {detail}")),
        HMC_ERR_IO => Error::io(detail, std::io::Error::other("reported by the plugin")),
        HMC_ERR_UNAVAILABLE => Error::Unavailable {
            what: format!("plugin `{plugin}`"),
            reason: detail,
            hint: "see the plugin's documentation for what it needs on this machine".into(),
        },
        HMC_ERR_INVALID_ARGUMENT => Error::InvalidArgument(detail),
        _ => Error::Protocol(format!(
            "{detail} (status {code}, {}: a plugin bug; report it to the plugin's authors)",
            status_name(code)
        )),
    }
}

/// An `Error::DeadlineExceeded` the host raises when a plugin left a transfer pending past
/// its deadline.
pub(crate) fn overran(plugin: &str, started: std::time::Instant) -> Error {
    tracing::warn!(
        plugin,
        "a plugin transfer was still pending at its deadline; the host cancelled it \
         (plugins must end transfers by their deadline themselves)"
    );
    Error::DeadlineExceeded {
        during: "a plugin transfer the plugin did not end by its deadline",
        elapsed: started.elapsed().max(Duration::ZERO),
    }
}
