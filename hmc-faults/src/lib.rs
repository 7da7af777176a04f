//! Fault injection that any HMC user can switch on for their own tests.
//!
//! A [`FaultSpec`] (one line of text, [`GRAMMAR`]) says which faults to inject and how
//! often; a [`FaultPlan`] draws its decisions deterministically from the spec's seed, one
//! stream per fault kind; [`Faulty`] wraps any [`hmc_core::Communicator`] and injects them.
//! Programs switch it on by name (`faulty:tcp`, `faulty:shm`, `faulty:<plugin>`) or by
//! the option `faults=SPEC` through `hmc-transports` (the engine's `faults` option, the
//! RPC tools' `--faults`, `HMC_FAULTS`, and `HMC_CONFIG`'s `faults` key for `hmc.nixl`
//! and `hmc.mooncake`). It is never on by default, and the first plan of a process logs
//! at warn that it is on. docs/faults.md has the whole story, with examples.
//!
//! Where each fault acts:
//!
//! | fault | side | acts in |
//! | --- | --- | --- |
//! | `connect.refuse`, `connect.delay` | initiator | [`Faulty`]'s `connect` |
//! | `xfer.stall`, `xfer.fail`, `xfer.cut` | initiator | [`Faulty`]'s `transfer` |
//! | `disconnect.after`, `restart.after` | initiator | every operation on a [`Faulty`] endpoint |
//! | `notify.drop`, `notify.delay`, `notify.dup` | `notify.at` (sender by default) | [`Faulty`]'s `notify`/`recv_notification`; the engine asks [`FaultPlan::notify_send`]/[`FaultPlan::notify_recv`] |
//! | `meta.slow`, `meta.gone` | initiator (the one looking up) | `FaultyStore` (feature `meta`), or [`FaultPlan::meta_call`] |
//! | `register.slow` | local | [`Faulty`]'s `register*` and `alloc_registered` |
//!
//! # Example
//!
//! A plan's decisions, as [`Faulty`] asks for them; a second plan of the same spec makes
//! the same ones:
//!
//! ```
//! use hmc_faults::{FaultPlan, FaultSpec, TransferEnd};
//!
//! let spec: FaultSpec = "seed=7;xfer.fail=first:1;connect.refuse=0.5".parse()?;
//! let plan = FaultPlan::new(spec.clone());
//! assert_eq!(plan.transfer().end, TransferEnd::Fail);
//! assert_eq!(plan.transfer().end, TransferEnd::Complete);
//! let twin = FaultPlan::new(spec);
//! let refused: Vec<bool> = (0..8).map(|_| plan.connect().refuse).collect();
//! assert_eq!(refused, (0..8).map(|_| twin.connect().refuse).collect::<Vec<_>>());
//! # Ok::<(), hmc_faults::FaultError>(())
//! ```

mod error;
mod faulty;
mod grammar;
#[cfg(feature = "meta")]
mod meta;
mod plan;
mod spec;

pub use error::FaultError;
pub use faulty::{Faulty, FaultyEndpoint, FaultyKey};
pub use grammar::GRAMMAR;
#[cfg(feature = "meta")]
pub use meta::FaultyStore;
pub use plan::{ConnectFault, FaultPlan, MetaFault, NotifyFault, TransferEnd, TransferFault};
pub use spec::{Cut, FaultSpec, NotifySide, Timed, When};

/// The environment variable whose value is a [`FaultSpec`] that programs reading the
/// environment (`hmc_transports::Options::from_env`) apply to every transport they open.
pub const ENV: &str = "HMC_FAULTS";
