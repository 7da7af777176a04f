//! The environment variables that change how transports open, read in one place, once.
//!
//! A library reading the environment behind its embedder's back is invisible to that
//! embedder, so nothing here is read unless a program asks for it
//! ([`Environment::read`], which [`crate::Options::from_env`] calls). The engine and the
//! binaries both do, so a variable reaches every program alike. Library paths
//! (`HMC_UCX_LIB`, `HMC_IBVERBS_LIB`) and `HMC_PLUGIN_PATH` stay with the loaders that use
//! them.

/// `0` turns UCX's direct mapping of same-host peers' memory off
/// (`UcxConfig::direct_mapped`); any other value, or none, leaves it on.
pub const UCX_DIRECT: &str = "HMC_UCX_DIRECT";

/// A fault spec (`hmc_faults::GRAMMAR`) injected into every transport opened, as if each
/// were named `faulty:NAME` with that spec. Unset: no faults. Malformed: `open` refuses
/// it, naming the item.
pub const FAULTS: &str = hmc_faults::ENV;

/// What the environment says about opening transports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Environment {
    /// [`UCX_DIRECT`]: `Some(false)` when set to `0`, `Some(true)` when set otherwise.
    pub ucx_direct: Option<bool>,
    /// [`FAULTS`], as written (parsed when a transport opens).
    pub faults: Option<String>,
}

impl Environment {
    /// Reads every variable this crate knows, now.
    pub fn read() -> Self {
        Environment {
            ucx_direct: std::env::var_os(UCX_DIRECT).map(|v| v != "0"),
            faults: std::env::var(FAULTS).ok(),
        }
    }
}
