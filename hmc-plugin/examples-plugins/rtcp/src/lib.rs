//! rtcp: hmc-transport-tcp's `TcpCommunicator` and hmc-backend-cpu's `HostMemory` exported as one HMC plugin (a transport and a memory backend) with `hmc_plugin::export_plugin!`, and not one `unsafe` here.
//!
//! It shows that any Rust `Communicator` and any `Memory` become a plugin with one macro
//! call, and it is
//! the plugin side of the plugin-versus-static measurement (the same transport, linked
//! statically, is the other). The TCP transport runs on tokio, so the plugin owns a
//! runtime and asks the glue to run every call inside it (`Exported::with_scope`); the
//! host needs no tokio of its own for that.
//!
//! Transport configuration lines: `bind=IP` (from every host), `auth_secret=TEXT` (at
//! least 16 bytes; both peers need the same), `max_pending_notifications=N`. Memory
//! configuration lines: `ordinal=0` (from every host; host memory has no other),
//! `huge_pages=true`, `mlock=true`.

use std::net::{IpAddr, SocketAddr};
use std::sync::LazyLock;

use hmc_backend_cpu::{HostMemory, HostMemoryConfig};
use hmc_core::{Error, PeerAddr, Result, TransportId};
use hmc_plugin::export::{Config, Exported};
use hmc_transport_tcp::{AuthSecret, TcpCommunicator, TcpConfig};

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("rtcp-plugin")
        .enable_all()
        .build()
        .expect("the rtcp plugin's tokio runtime")
});

fn open(config: &Config) -> Result<Exported<TcpCommunicator>> {
    let ip: IpAddr = config
        .get("bind")
        .unwrap_or("127.0.0.1")
        .parse()
        .map_err(|e| Error::InvalidArgument(format!("rtcp: bind: {e}")))?;
    let mut tcp = TcpConfig::default();
    if let Some(secret) = config.get("auth_secret") {
        tcp.auth_secret = Some(AuthSecret::new(secret.as_bytes())?);
    }
    if let Some(n) = config.get("max_pending_notifications") {
        tcp.max_pending_notifications = n
            .parse()
            .map_err(|e| Error::InvalidArgument(format!("rtcp: max_pending_notifications: {e}")))?;
    }
    let addr = PeerAddr::Tcp(SocketAddr::new(ip, 0));
    let comm = {
        let _in_runtime = RUNTIME.enter();
        TcpCommunicator::bind(&addr, tcp)?
    };
    Ok(Exported::new(comm).with_scope(|run| {
        let _in_runtime = RUNTIME.enter();
        run()
    }))
}

fn flag(config: &Config, key: &str) -> Result<bool> {
    config.get(key).map_or(Ok(false), |v| {
        v.parse()
            .map_err(|_| Error::InvalidArgument(format!("rtcp: {key}={v}: say true or false")))
    })
}

fn open_memory(config: &Config) -> Result<HostMemory> {
    if let Some(n) = config.get("ordinal").filter(|n| *n != "0") {
        return Err(Error::InvalidArgument(format!(
            "rtcp: ordinal={n}: its memory is host memory, which has ordinal 0 only"
        )));
    }
    Ok(HostMemory::with_config(HostMemoryConfig {
        huge_pages: flag(config, "huge_pages")?,
        mlock: flag(config, "mlock")?,
    }))
}

hmc_plugin::export_plugin! {
    name: "rtcp",
    transport: TransportId::TCP,
    comm: TcpCommunicator,
    open: open,
    memory: HostMemory,
    open_memory: open_memory,
}
