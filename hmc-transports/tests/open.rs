//! Opening transports by name, as the engine, the binaries and the Python package do: what
//! opens, what the settings every transport shares reach, and what a name this build
//! cannot open says.

use std::net::IpAddr;

#[cfg(feature = "tcp")]
use hmc_core::{Communicator, Deadline, TransportId};
#[cfg(feature = "plugin")]
use hmc_transports::BUILTINS;
use hmc_transports::{Options, TransportName, open};

const LO: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

#[cfg(feature = "tcp")]
#[tokio::test]
async fn tcp_listens_on_the_ip_it_is_given() {
    let c = open(&TransportName::Tcp, LO, &Options::default()).unwrap();
    assert_eq!(c.transport(), TransportId::TCP);
    assert!(
        c.address().to_string().starts_with("tcp://127.0.0.1:"),
        "{}",
        c.address()
    );
}

/// The shared setting overrides the transport's own: a program that reads no notifications
/// has a peer's refused rather than queued.
#[cfg(feature = "tcp")]
#[tokio::test]
async fn a_shared_notification_limit_reaches_the_transport() {
    // Peers sharing a secret may NOTIFY without a region's key.
    let mut chatty = Options::default();
    chatty.tcp.auth_secret =
        Some(hmc_transport_tcp::AuthSecret::new(*b"0123456789abcdef0123").unwrap());
    let quiet = Options {
        max_pending_notifications: Some(0),
        ..chatty.clone()
    };
    let a = open(&TransportName::Tcp, LO, &chatty).unwrap();
    let b = open(&TransportName::Tcp, LO, &quiet).unwrap();
    let ep = a.connect(&b.address(), Deadline::default()).await.unwrap();
    let e = a
        .notify(&ep, 1, b"x", Deadline::default())
        .await
        .expect_err("a queue of 0 refuses");
    assert!(e.to_string().contains("max_pending_notifications"), "{e}");
    // The default queue takes it.
    let ep = b.connect(&a.address(), Deadline::default()).await.unwrap();
    b.notify(&ep, 1, b"x", Deadline::default()).await.unwrap();
}

#[cfg(all(feature = "tcp", feature = "shm"))]
#[tokio::test]
async fn auto_is_shared_memory_first_over_the_network() {
    let c = open(&TransportName::Auto, LO, &Options::default()).unwrap();
    assert_eq!(c.transport(), TransportId::LOCAL_FIRST);
    // TCP for the network half when the program asks (an authenticated data plane).
    let tcp_only = Options {
        auto_prefers_ucx: false,
        ..Options::default()
    };
    let c = open(&TransportName::Auto, LO, &tcp_only).unwrap();
    assert_eq!(c.transport(), TransportId::LOCAL_FIRST);
}

#[cfg(all(feature = "tcp", not(feature = "shm")))]
#[tokio::test]
async fn auto_without_shared_memory_is_the_network_alone() {
    let c = open(&TransportName::Auto, LO, &Options::default()).unwrap();
    assert!(matches!(c.transport(), TransportId::TCP | TransportId::UCX));
}

#[cfg(feature = "plugin")]
#[tokio::test]
async fn an_unknown_name_lists_every_transport_and_where_plugins_come_from() {
    let options = Options {
        plugin_search_hint: Some("see the `plugin_path` option".into()),
        ..Options::default()
    };
    let e = open(&"nosuch".parse().unwrap(), LO, &options)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no transport named `nosuch`; known: tcp, ucx, shm, rdma, auto")
            && e.contains("`plugin_path` option"),
        "{e}"
    );
    let names = hmc_transports::registry(&options).names();
    for (builtin, _) in BUILTINS {
        assert!(
            names.iter().any(|n| n == builtin),
            "{builtin} not in {names:?}"
        );
    }
}

/// The registry opens a built-in through the same code as a name does.
#[cfg(all(feature = "plugin", feature = "tcp"))]
#[tokio::test]
async fn the_registry_opens_builtins_as_names_do() {
    let r = hmc_transports::registry(&Options::default());
    let c = r.open("tcp", &hmc_plugin_options()).unwrap();
    assert_eq!(c.transport(), TransportId::TCP);
}

#[cfg(all(feature = "plugin", feature = "tcp"))]
fn hmc_plugin_options() -> hmc_transports::PluginOpenOptions {
    hmc_transports::PluginOpenOptions::new(LO)
}

#[cfg(all(
    not(feature = "plugin"),
    any(feature = "tcp", feature = "ucx", feature = "shm", feature = "rdma")
))]
#[test]
fn without_plugins_a_name_says_which_feature_loads_them() {
    let e = open(&"nosuch".parse().unwrap(), LO, &Options::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`plugin`") && e.contains("tcp, ucx, shm, rdma, auto"),
        "{e}"
    );
}

#[cfg(all(
    not(feature = "rdma"),
    any(feature = "tcp", feature = "ucx", feature = "shm", feature = "plugin")
))]
#[test]
fn a_builtin_left_out_names_its_feature() {
    let e = open(&TransportName::Rdma, LO, &Options::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("cargo feature `rdma`"), "{e}");
}

/// A build with no transport at all (`--no-default-features`) refuses every name, naming
/// each feature that would open one.
#[cfg(not(any(
    feature = "tcp",
    feature = "ucx",
    feature = "shm",
    feature = "rdma",
    feature = "plugin"
)))]
#[test]
fn a_build_without_transports_names_every_feature() {
    assert!(hmc_transports::compiled_in().is_empty());
    for name in ["tcp", "auto", "faulty:shm", "nosuch"] {
        let name: TransportName = name.parse().unwrap();
        let e = open(&name, LO, &Options::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("has no transport")
                && ["`tcp`", "`ucx`", "`shm`", "`rdma`", "`plugin`"]
                    .iter()
                    .all(|f| e.contains(f)),
            "{name}: {e}"
        );
    }
}

/// Shared memory alone reaches no other host: `auto` is refused saying so, not as if
/// only `tcp` were missing.
#[cfg(all(feature = "shm", not(any(feature = "tcp", feature = "ucx"))))]
#[test]
fn auto_without_a_network_transport_says_which_features_it_needs() {
    let e = open(&TransportName::Auto, LO, &Options::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`auto`") && e.contains("`tcp` or `ucx`") && e.contains("shm"),
        "{e}"
    );
}

/// Without a verbs device (no RDMA stack here, or the stand-in not named), opening RDMA
/// fails and says why rather than falling back.
#[cfg(feature = "rdma")]
#[test]
fn rdma_without_a_device_fails_with_a_reason() {
    let mut options = Options::default();
    options.rdma.library = Some("/nonexistent/libibverbs.so.1".into());
    let e = open(&TransportName::Rdma, LO, &options)
        .unwrap_err()
        .to_string();
    assert!(e.contains("libibverbs"), "{e}");
}
