//! What the tests of engines in a metadata namespace share: an engine registered in etcd,
//! the `cluster_node` example serving memory under a name, descriptors and checksums.

// Each test binary uses part of this module.
#![allow(dead_code)]

pub mod kv_peer;
pub mod standin;
pub mod wire;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use hmc_core::{Access, AnyCommunicator, Communicator};
use hmc_engine::{Engine, EngineConfig, MemDesc, MemHandle, MemType, TransferOpDesc};

/// How long a connect or transfer may take.
pub const T: Duration = Duration::from_secs(10);

/// An engine over TCP registered in the etcd namespace `url`, lease 2 s.
pub async fn engine(url: &str, name: Option<&str>) -> Engine<AnyCommunicator> {
    let mut o: HashMap<String, String> = [
        ("metadata", url),
        ("transport", "tcp"),
        ("lease_ttl_ms", "2000"),
        ("etcd_retry_max_ms", "500"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    if let Some(n) = name {
        o.insert("name".into(), n.into());
    }
    Engine::initialize_with("127.0.0.1", EngineConfig::from_options(&o).unwrap())
        .await
        .expect("engine registered in etcd")
}

/// The engine configuration that the string options `o` give, as a deployment writes
/// them (`transport`, `auth_secret_file`, ...); a later key overrides an earlier one.
pub fn config_from(o: &[(&str, &str)]) -> EngineConfig {
    let o: HashMap<String, String> = o
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    EngineConfig::from_options(&o).unwrap()
}

/// An engine on loopback opened from the string options `o` (see [`config_from`]).
pub async fn engine_from(o: &[(&str, &str)]) -> Engine<AnyCommunicator> {
    Engine::initialize_with("127.0.0.1", config_from(o))
        .await
        .unwrap()
}

/// An engine on loopback over the communicator `c`, configured by `config`.
pub async fn engine_over<C: Communicator>(c: Arc<C>, config: EngineConfig) -> Engine<C> {
    Engine::initialize(c, "127.0.0.1", config).await.unwrap()
}

/// An engine on loopback over the built-in transport `transport`, with the further
/// string options `extra`.
pub async fn engine_on(transport: &str, extra: &[(&str, &str)]) -> Engine<AnyCommunicator> {
    let o: Vec<(&str, &str)> = [("transport", transport)]
        .iter()
        .chain(extra)
        .copied()
        .collect();
    engine_from(&o).await
}

/// One descriptor from `local` to `remote`, as long as `local`.
pub fn desc(local: &[u8], remote: &[u8]) -> TransferOpDesc {
    TransferOpDesc {
        local_addr: local.as_ptr() as u64,
        remote_addr: remote.as_ptr() as u64,
        len: local.len(),
    }
}

/// `b` as memory to register.
pub fn host(b: &[u8]) -> MemDesc {
    MemDesc {
        addr: b.as_ptr() as u64,
        len: b.len(),
    }
}

/// `m` registered with `e` as host memory that peers may read and write.
///
/// The caller keeps `m` alive (and unmoved) until `e` is finalized and dropped, or `m`
/// is deregistered: that is the promise `register_mem` asks for.
pub fn register_rw<C: Communicator>(e: &Engine<C>, m: &[u8]) -> MemHandle {
    register_as(e, m, Access::READ_WRITE)
}

/// `m` registered with `e` as host memory that peers may reach with `access`; the caller
/// keeps `m` as for [`register_rw`].
pub fn register_as<C: Communicator>(e: &Engine<C>, m: &[u8], access: Access) -> MemHandle {
    // SAFETY: every caller keeps `m` until its engine is finalized and dropped (or `m` is
    // deregistered), as the tests' buffers are.
    unsafe { e.register_mem(host(m), MemType::Host, access) }.expect("host memory registered")
}

/// `m` registered with the communicator `c` itself (host memory, `access`), as a peer that
/// goes around the engine does; the caller keeps `m` as for [`register_rw`].
pub fn comm_register<C: Communicator>(c: &C, m: &[u8], access: Access) -> C::Registration {
    let region = hmc_core::Region {
        device: hmc_core::Device::HOST,
        addr: m.as_ptr() as u64,
        len: m.len(),
    };
    // SAFETY: as in `register_as`, the caller keeps `m` while `c` may reach it.
    unsafe { c.register(region, access) }.expect("host memory registered with the transport")
}

/// The runtime a test's child process runs its engines on: multi-threaded, two workers,
/// I/O and timers enabled.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// `target/<profile>/examples/<name>`, which `cargo test` builds with the tests.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(|d| d.parent()).unwrap();
    profile.join("examples").join(name)
}

/// `cluster_node serve` as `name` in `url` with `mib` MiB of memory, once it said READY.
pub fn serve(url: &str, name: &str, mib: u32) -> (Child, BufReader<ChildStdout>) {
    let mut child = Command::new(example("cluster_node"))
        .args(["serve", "--metadata", url, "--name", name])
        .args(["--mib", &mib.to_string(), "--lease-ttl-ms", "2000"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("cluster_node example (built by `cargo test -p hmc-engine`)");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("READY"), "{line}");
    (child, out)
}

/// FNV-1a, as `cluster_node` prints it.
pub fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
    })
}
