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
use std::time::Duration;

use hmc_core::AnyCommunicator;
use hmc_engine::{Engine, EngineConfig, MemDesc, TransferOpDesc};

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
