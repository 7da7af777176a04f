//! Every hmc transport by one name, opened by one function.
//!
//! Programs choose a transport by a string (`transport=tcp` in an engine's option map,
//! `--data-plane ucx` on a command line, `{"transport": "auto"}` from Python). This crate
//! is the one place that string becomes a communicator:
//!
//! - [`TransportName`] parses `tcp | ucx | shm | rdma | auto | <plugin>` (or
//!   `<plugin>://IP`), and [`BUILTINS`] lists the built-in names with what each is.
//! - [`open`] opens one over [`AnyCommunicator`] with its data plane on an IP (the port
//!   chosen by the system), from [`Options`]: each built-in's own config, the settings
//!   every transport shares, and [`Environment`], read once.
//! - `faulty:NAME`, [`Options::faults`] or `HMC_FAULTS` ([`FAULTS`]) wraps what opens in
//!   `hmc_faults::Faulty`, injecting the faults of a spec ([`fault_plan`] says which;
//!   docs/faults.md). Never on otherwise; the first plan logs at warn.
//! - [`registry`] is hmc-plugin's registry with the built-ins in it, for programs that
//!   list what there is (`--list-transports`).
//! - [`Defaults`] holds the defaults of the settings a program sets on whichever transport
//!   it opens (staging limits, copy threads, UCX's drain timeouts), each filled by the
//!   compiled-in transport that reads it: a program (the engine) takes its defaults from
//!   here and names no transport crate, so it builds with any one of them.
//!
//! Each built-in is a cargo feature (`tcp` on by default; `ucx`, `shm`, `rdma`, `plugin`):
//! a name whose feature this build leaves out is refused as unavailable, naming the
//! feature, and a build with none of them refuses every name, naming all five
//! ([`compiled_in`] lists those on). Vendor libraries (libucp, libibverbs) are loaded at run
//! time, so turning a feature on needs no SDK to build.

mod defaults;
mod env;
mod name;
mod open;
mod options;

pub use defaults::{Defaults, compiled_in};
pub use env::{Environment, FAULTS, UCX_DIRECT};
pub use hmc_core::AnyCommunicator;
pub use hmc_faults::{FaultPlan, FaultSpec};
/// What a plugin factory is asked to open (hmc-plugin's `OpenOptions`).
#[cfg(feature = "plugin")]
pub use hmc_plugin::OpenOptions as PluginOpenOptions;
pub use name::{BUILTINS, FAULTY_PREFIX, TransportName};
#[cfg(feature = "plugin")]
pub use open::registry;
pub use open::{fault_plan, open};
pub use options::Options;
