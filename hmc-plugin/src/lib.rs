//! Third-party HMC transports and memory backends loaded at run time: a versioned C plugin ABI, the loader, host adapters that make a plugin an `hmc_core::Communicator` or an `hmc_core::Memory`, a transport registry by name, and `export_plugin!` for Rust plugins.
//!
//! ```no_run
//! use hmc_plugin::{OpenOptions, PluginConfig, TransportRegistry};
//!
//! // Plugins on HMC_PLUGIN_PATH (and the config's own path), loaded and checked.
//! let registry = TransportRegistry::discover(&PluginConfig::default());
//! print!("{}", registry.report()); // what was found, what loaded, why others were refused
//! // Any plugin by its name, as an AnyCommunicator the kit, hmc-rpc and the engine take.
//! let comm = registry.open("loopmem", &OpenOptions::new([127, 0, 0, 1].into()))?;
//! # Ok::<(), hmc_core::Error>(())
//! ```
//!
//! # What this crate is for
//!
//! A transport written outside this repository, in C, C++ or Rust, built with any
//! compiler, shipped as one shared library: `hmc_plugin.h` (in `include/`, generated from
//! [`abi`] by cbindgen and checked in) is the whole contract. The host loads it with
//! `dlopen(RTLD_NOW | RTLD_LOCAL)` and never unloads it, calls its one entry symbol
//! `hmc_plugin_init` with the host's ABI version, and wraps what it opens in
//! [`PluginCommunicator`], which implements `Communicator`, so the conformance kit, the
//! RPC data plane and the engine run over a plugin unchanged. [`TransportRegistry`] maps
//! names to built-in transports and plugins (`--data-plane NAME`, the engine's
//! `transport` option).
//!
//! A plugin provides a communicator (`HMC_PLUGIN_PROVIDES_COMMUNICATOR`), a device memory
//! backend (`HMC_PLUGIN_PROVIDES_MEMORY`, wrapped by [`PluginMemory`], which implements
//! `hmc_core::Memory`), or both; a Rust crate exports either or both with
//! [`export_plugin!`].
//!
//! # The ABI in short
//!
//! - Every table starts with `{struct_size, abi_major, abi_minor, name, capabilities}`;
//!   fields are only appended; the host reads only up to `struct_size`; another major is
//!   refused naming both versions.
//! - Only opaque handles, `(pointer, length)` slices and integer status codes cross, and a
//!   per-thread last-error string says what went wrong.
//! - Transfers are asynchronous without a runtime: `transfer_start`, then `transfer_poll`
//!   whenever the communicator's eventfd signals; a plugin needs no tokio.
//! - Deadlines are absolute `CLOCK_MONOTONIC` nanoseconds; the plugin ends a transfer by
//!   its deadline (the host also cancels one left pending past it).
//!
//! docs/backend-guide.md is the implementer's guide: the contract, the kit's cases and
//! expected errors, id ranges, versioning and shipping.
//!
//! # Safety story
//!
//! Loading a plugin runs its code in this process: it is trusted as much as any linked
//! library. What the host can check, it checks before calling the plugin (handles of
//! another communicator, bounds against sizes it knows, access rights, declared limits,
//! table sizes and required functions at load), so a plugin's omissions there do not
//! reach memory. `unsafe` is confined to the calls through the table (the `comm` and `load` modules)
//! and, for Rust plugins, to the glue of [`export`]: the author's code needs none.

pub mod abi;
mod comm;
mod error;
mod events;
pub mod export;
mod load;
mod memory;
mod registry;

pub use comm::{PluginCommunicator, PluginEndpoint, PluginRegistration, PluginRemoteKey};
pub use error::PluginError;
/// Re-exported for [`export_plugin!`]'s expansion.
pub use hmc_core;
pub use load::{Discovery, Plugin, PluginConfig, RESERVED_NAMES};
pub use memory::{PluginBuffer, PluginMemory};
pub use registry::{Factory, OpenOptions, TransportRegistry};
