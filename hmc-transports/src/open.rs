//! [`open`]: a [`TransportName`] and [`Options`] to a communicator; [`registry`]: the same
//! built-ins in hmc-plugin's registry, beside the plugins.

use std::net::IpAddr;
#[cfg(any(feature = "tcp", feature = "ucx", feature = "rdma"))]
use std::net::SocketAddr;

use hmc_core::{AnyCommunicator, Error, Result};
use hmc_faults::{FaultPlan, FaultSpec, Faulty};

use crate::name::TransportName;
use crate::options::Options;

/// Opens the transport `name` names with its data plane on `ip` (port chosen by the
/// system). TCP, UCX and plugins start their tasks on the caller's tokio runtime, so call
/// it inside one.
///
/// A built-in whose cargo feature this build leaves out is refused with
/// [`Error::Unavailable`] naming the feature; an unknown name's error lists every name
/// there is and where plugins are searched. A build with none of the five features
/// (`tcp`, `ucx`, `shm`, `rdma`, `plugin`) refuses every name, naming them all.
///
/// With faults asked for ([`fault_plan`]: `faulty:NAME`, [`Options::faults`] or
/// `HMC_FAULTS`), the transport is wrapped in [`hmc_faults::Faulty`].
pub fn open(name: &TransportName, ip: IpAddr, options: &Options) -> Result<AnyCommunicator> {
    if crate::compiled_in().is_empty() {
        return Err(no_transport(name));
    }
    // The spec first: a malformed one opens nothing.
    let plan = fault_plan(name, options)?;
    let comm = open_plain(name.without_faults().0, ip, options)?;
    Ok(match plan {
        Some(plan) => AnyCommunicator::new(Faulty::new(comm, plan)),
        None => comm,
    })
}

/// The faults [`open`] injects into `name`: [`Options::faults`] (the same plan, shared),
/// else a new plan of `HMC_FAULTS` ([`crate::Environment::faults`]), else for a
/// `faulty:NAME` a plan of [`FaultSpec::DEFAULT_TEXT`]; `None` (no faults) otherwise. A
/// malformed `HMC_FAULTS` is refused naming the variable, the item and the grammar.
pub fn fault_plan(name: &TransportName, options: &Options) -> Result<Option<FaultPlan>> {
    if let Some(plan) = &options.faults {
        return Ok(Some(plan.clone()));
    }
    if let Some(text) = &options.environment.faults {
        let spec: FaultSpec = text
            .parse()
            .map_err(|e| Error::InvalidArgument(format!("{}={text}: {e}", crate::env::FAULTS)))?;
        return Ok(Some(FaultPlan::new(spec)));
    }
    let (_, faulty) = name.without_faults();
    Ok(faulty.then(|| FaultPlan::new(FaultSpec::default_faults())))
}

fn open_plain(name: &TransportName, ip: IpAddr, options: &Options) -> Result<AnyCommunicator> {
    match name {
        TransportName::Tcp => tcp(ip, options),
        TransportName::Ucx => ucx(ip, options),
        TransportName::Shm => shm(options),
        TransportName::Rdma => rdma(ip, options),
        TransportName::Auto => auto(ip, options),
        TransportName::Named(spec) => plugin(spec, ip, options),
        // `open` took the prefix off; a nested one is refused by the parser.
        TransportName::Faulty(inner) => open_plain(inner, ip, options),
    }
}

/// The error for a built-in this build leaves out.
#[allow(dead_code)] // Every feature on: nothing is left out.
fn left_out(name: &str, feature: &str) -> Error {
    Error::Unavailable {
        what: format!("the `{name}` transport"),
        reason: format!("this build leaves out its cargo feature `{feature}`"),
        hint: format!(
            "build with hmc-transports' `{feature}` feature (hmc-engine's `{feature}`, a \
             default one), or choose another transport"
        ),
    }
}

/// The error of every name in a build that has no transport at all.
fn no_transport(name: &TransportName) -> Error {
    Error::Unavailable {
        what: format!("the `{name}` transport"),
        reason: "this build has no transport: it leaves out every one of hmc-transports' \
                 cargo features `tcp`, `ucx`, `shm`, `rdma` and `plugin`"
            .into(),
        hint: "build with at least one of them (hmc-engine's features of the same names, \
               all default ones), or hand the engine a communicator of your own \
               (`Engine::initialize`)"
            .into(),
    }
}

#[cfg(feature = "tcp")]
fn tcp(ip: IpAddr, options: &Options) -> Result<AnyCommunicator> {
    let config = hmc_transport_tcp::TcpConfig {
        max_pending_notifications: options.notifications(options.tcp.max_pending_notifications),
        max_staging_bytes: options.staging(options.tcp.max_staging_bytes),
        ..options.tcp.clone()
    };
    let bind = hmc_core::PeerAddr::Tcp(SocketAddr::new(ip, 0));
    Ok(AnyCommunicator::new(
        hmc_transport_tcp::TcpCommunicator::bind(&bind, config)?,
    ))
}

#[cfg(not(feature = "tcp"))]
fn tcp(_: IpAddr, _: &Options) -> Result<AnyCommunicator> {
    Err(left_out("tcp", "tcp"))
}

#[cfg(feature = "ucx")]
fn ucx(ip: IpAddr, options: &Options) -> Result<AnyCommunicator> {
    let config = hmc_transport_ucx::UcxConfig {
        bind: SocketAddr::new(ip, 0),
        max_pending_notifications: options.notifications(options.ucx.max_pending_notifications),
        max_staging_bytes: options.staging(options.ucx.max_staging_bytes),
        direct_mapped: options
            .environment
            .ucx_direct
            .unwrap_or(options.ucx.direct_mapped),
        ..options.ucx.clone()
    };
    Ok(AnyCommunicator::new(
        hmc_transport_ucx::UcxCommunicator::new(config)?,
    ))
}

#[cfg(not(feature = "ucx"))]
fn ucx(_: IpAddr, _: &Options) -> Result<AnyCommunicator> {
    Err(left_out("ucx", "ucx"))
}

#[cfg(feature = "shm")]
fn shm_communicator(options: &Options) -> Result<hmc_transport_shm::ShmCommunicator> {
    hmc_transport_shm::ShmCommunicator::bind(hmc_transport_shm::ShmConfig {
        max_pending_notifications: options.notifications(options.shm.max_pending_notifications),
        ..options.shm.clone()
    })
}

#[cfg(feature = "shm")]
fn shm(options: &Options) -> Result<AnyCommunicator> {
    Ok(AnyCommunicator::new(shm_communicator(options)?))
}

#[cfg(not(feature = "shm"))]
fn shm(_: &Options) -> Result<AnyCommunicator> {
    Err(left_out("shm", "shm"))
}

#[cfg(feature = "rdma")]
fn rdma(ip: IpAddr, options: &Options) -> Result<AnyCommunicator> {
    let config = hmc_transport_rdma::RdmaConfig {
        bind: hmc_core::PeerAddr::Tcp(SocketAddr::new(ip, 0)),
        max_pending_notifications: options.notifications(options.rdma.max_pending_notifications),
        ..options.rdma.clone()
    };
    Ok(AnyCommunicator::new(
        hmc_transport_rdma::RdmaCommunicator::new(config)?,
    ))
}

#[cfg(not(feature = "rdma"))]
fn rdma(_: IpAddr, _: &Options) -> Result<AnyCommunicator> {
    Err(left_out("rdma", "rdma"))
}

/// `auto`'s network half: UCX where it loads (unless the options say TCP), TCP otherwise.
#[cfg(any(feature = "tcp", feature = "ucx"))]
fn network(ip: IpAddr, options: &Options) -> Result<AnyCommunicator> {
    if !options.auto_prefers_ucx {
        return tcp(ip, options);
    }
    ucx(ip, options).or_else(|e| {
        tracing::info!(reason = %e, "UCX unavailable; peers on other hosts go over TCP");
        tcp(ip, options)
    })
}

/// Without `tcp` and `ucx`, `auto` has no network half: refused, saying so (rather than
/// naming `tcp` alone, as its fallback's error would).
#[cfg(not(any(feature = "tcp", feature = "ucx")))]
fn network(_: IpAddr, _: &Options) -> Result<AnyCommunicator> {
    Err(Error::Unavailable {
        what: "the `auto` transport".into(),
        reason: "it reaches peers on other hosts over `ucx` or `tcp`, and this build leaves \
                 out both cargo features"
            .into(),
        hint: format!(
            "build with hmc-transports' `tcp` or `ucx` feature (hmc-engine's, default \
             ones), or choose a transport this build has ({})",
            crate::compiled_in().join(", ")
        ),
    })
}

#[cfg(feature = "shm")]
fn auto(ip: IpAddr, options: &Options) -> Result<AnyCommunicator> {
    let net = network(ip, options)?;
    Ok(AnyCommunicator::new(match shm_communicator(options) {
        Ok(shm) => hmc_transport_shm::LocalFirst::new(net, shm),
        Err(e) => {
            tracing::warn!(reason = %e, "shared memory unavailable; peers on this host use the network transport too");
            hmc_transport_shm::LocalFirst::net_only(net)
        }
    }))
}

/// Without shared memory, `auto` is its network half alone (peers on this host too).
#[cfg(not(feature = "shm"))]
fn auto(ip: IpAddr, options: &Options) -> Result<AnyCommunicator> {
    tracing::info!(
        "this build leaves out the `shm` feature; `auto` reaches peers on this host over the network"
    );
    network(ip, options)
}

/// The search hint of a library's programs, when [`Options::plugin_search_hint`] is unset.
#[cfg(feature = "plugin")]
const DEFAULT_SEARCH_HINT: &str = "transport plugins are found on HMC_PLUGIN_PATH and the \
                                   program's plugin path; hmc-plugin-kit checks one";

/// hmc-plugin's registry holding every built-in (opened as [`open`] opens it, so a
/// registry lookup and a [`TransportName`] reach the same code) and the plugins on
/// `HMC_PLUGIN_PATH` and [`Options::plugins`].
#[cfg(feature = "plugin")]
pub fn registry(options: &Options) -> hmc_plugin::TransportRegistry {
    let mut r = hmc_plugin::TransportRegistry::discover(&options.plugins);
    for (name, about) in crate::name::BUILTINS {
        let builtin: TransportName = name.parse().expect("a built-in name parses");
        let options = options.clone();
        r.register_builtin(name, about, move |o: &hmc_plugin::OpenOptions| {
            open(&builtin, o.bind, &options)
        });
    }
    if let Some(hint) = &options.plugin_search_hint {
        r.set_search_hint(hint);
    } else {
        r.set_search_hint(DEFAULT_SEARCH_HINT);
    }
    r
}

#[cfg(feature = "plugin")]
fn plugin(spec: &str, ip: IpAddr, options: &Options) -> Result<AnyCommunicator> {
    let mut open = hmc_plugin::OpenOptions::new(ip);
    for (k, v) in &options.plugin_settings {
        open = open.with(k, v);
    }
    registry(options).open(spec, &open).map_err(|e| match e {
        Error::InvalidArgument(why) if why.starts_with("no transport named") => {
            Error::InvalidArgument(format!(
                "{why}; each of them also as faulty:<name>, with faults injected \
                 (docs/faults.md)"
            ))
        }
        other => other,
    })
}

#[cfg(not(feature = "plugin"))]
fn plugin(spec: &str, _: IpAddr, _: &Options) -> Result<AnyCommunicator> {
    let known: Vec<&str> = crate::name::BUILTINS.iter().map(|(n, _)| *n).collect();
    Err(Error::Unavailable {
        what: format!("a transport named `{spec}`"),
        reason: format!(
            "it is not a built-in ({}), and this build leaves out the cargo feature \
             `plugin` that loads transport plugins",
            known.join(", ")
        ),
        hint: "choose a built-in (or faulty:<built-in>, with faults injected), or build \
               with hmc-transports' `plugin` feature (hmc-engine's `plugin`, a default one)"
            .into(),
    })
}
