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
         machine and that every library and symbol it needs resolves (`ldd -r {path}` lists \
         what is missing)"
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
        "{path}: not loaded: {reason}; plugins run inside this process, so only root or this user may be able to change them (chmod go-w, chown)"
    )]
    Unsafe {
        /// The file.
        path: PathBuf,
        /// What is writable, or by whom it is owned.
        reason: String,
    },
    /// The plugin's name is one of the built-in transports'.
    #[error(
        "{path}: the plugin is named `{name}`, the name of a built-in transport; rename the plugin (built-in names: {builtins})"
    )]
    Reserved {
        /// The file.
        path: PathBuf,
        /// The name.
        name: String,
        /// The names no plugin may take.
        builtins: String,
    },
    /// A folder's file promised one plugin by its name (`lib<name>.so`) and held another.
    #[error(
        "{path}: the file is named for plugin `{file_name}` but holds plugin `{name}`; a \
         folder's plugins are loaded by file name, so rename it lib{name}.so (or name the \
         file itself on HMC_PLUGIN_PATH)"
    )]
    Misnamed {
        /// The file.
        path: PathBuf,
        /// The name its file gives.
        file_name: String,
        /// The name inside.
        name: String,
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
    let detail = match &message {
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
        HMC_ERR_LIMIT => limit_error(plugin, function, message.as_deref(), detail),
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

/// `HMC_ERR_LIMIT`'s message, `NAME: VALUE > MAX; how to raise it` (hmc_plugin.h), as
/// `Error::LimitExceeded`; another form stays a message, with a note of the expected one.
fn limit_error(plugin: &str, function: &str, message: Option<&str>, detail: String) -> Error {
    match message.and_then(parse_limit) {
        Some((limit, value, max, hint)) => Error::LimitExceeded {
            limit,
            value,
            max,
            hint: format!("plugin `{plugin}`: {function}: {hint}"),
        },
        None => Error::InvalidArgument(format!(
            "limit reached: {detail} (HMC_ERR_LIMIT's message should read `NAME: VALUE > MAX; \
             how to raise it`, so that hosts see which limit)"
        )),
    }
}

/// Splits `NAME: VALUE > MAX; HINT`. The name is interned: limits are few and named in
/// code, so the set stays small (past 64 distinct names, the message stays text).
fn parse_limit(message: &str) -> Option<(&'static str, u64, u64, String)> {
    let (name, rest) = message.split_once(": ")?;
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    {
        return None;
    }
    let (numbers, hint) = rest.split_once("; ").unwrap_or((rest, ""));
    let (value, max) = numbers.split_once(" > ")?;
    let (value, max) = (value.trim().parse().ok()?, max.trim().parse().ok()?);
    static NAMES: parking_lot::Mutex<Vec<&'static str>> = parking_lot::Mutex::new(Vec::new());
    let mut names = NAMES.lock();
    let interned = match names.iter().find(|n| **n == name) {
        Some(n) => *n,
        None if names.len() < 64 => {
            let n: &'static str = Box::leak(name.to_string().into_boxed_str());
            names.push(n);
            n
        }
        None => return None,
    };
    Some((interned, value, max, hint.to_string()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[rstest::rstest]
    #[case::named("max_pending_notifications: 4097 > 4096; receive first", Some(("max_pending_notifications", 4097, 4096, "receive first")))]
    #[case::no_hint("max_batch_len: 5 > 4", Some(("max_batch_len", 5, 4, "")))]
    #[case::prose("loopmem: the queue is full", None)]
    #[case::no_numbers("max_batch_len: too many", None)]
    #[case::spaces_in_name("a limit: 1 > 0; x", None)]
    fn limit_messages(#[case] message: &str, #[case] wanted: Option<(&str, u64, u64, &str)>) {
        let got = parse_limit(message);
        assert_eq!(
            got.as_ref().map(|(n, v, m, h)| (*n, *v, *m, h.as_str())),
            wanted
        );
    }

    #[test]
    fn hmc_err_limit_becomes_the_named_limit() {
        let e = status_error(
            "p",
            TransportId::from_wire_id(200),
            "notify",
            HMC_ERR_LIMIT,
            Some("max_pending_notifications: 9 > 8; receive some first".into()),
            std::time::Instant::now(),
        );
        assert!(
            matches!(
                e,
                Error::LimitExceeded {
                    limit: "max_pending_notifications",
                    value: 9,
                    max: 8,
                    ..
                }
            ),
            "{e:?}"
        );
        let e = status_error(
            "p",
            TransportId::from_wire_id(200),
            "notify",
            HMC_ERR_LIMIT,
            Some("the queue is full".into()),
            std::time::Instant::now(),
        );
        assert!(
            e.to_string().contains("should read `NAME: VALUE > MAX"),
            "{e}"
        );
    }
}
