//! Device memory a peer reaches: this process registers device regions (of the HIP ABI
//! shim, `hmc-backend-rocm/tests/shim/hip_shim.c`, loaded by the ROCm backend's real
//! loader) with `register_device_mem`, and another process READs and WRITEs them over
//! `tcp`, `ucx` (a UCX without HIP support: staged over its control connection) and
//! `auto`, from host memory and from a device region of its own, with checksums
//! on both sides. The target's staging counters show each byte crossed its bounce chunks
//! once per direction over tcp, and that over auto (same host) the transfers of an
//! initiator with a backend of the kind bypass them (vendor IPC through the shared-memory
//! half), unless it cannot open the IPC handle (it then falls back to the staged TCP path
//! and says why once); an initiator killed mid-transfer leaves no chunk held. The
//! shim's "device" is host memory behind HIP's C ABI: this checks the staging path and
//! the binding, not a GPU.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{engine_from, engine_over, register_rw};
use hmc_backend_rocm::RocmMemory;
use hmc_core::{
    AnyMemory, Communicator, DeviceBuffer, DeviceMemoryPath, MemSpan, MemSpanMut, Memory,
};
use hmc_engine::{Engine, EngineConfig, MemDesc, TransferOp, TransferOpDesc};
use hmc_transport_shm::{LocalFirst, ShmCommunicator, ShmConfig};
use hmc_transport_tcp::{StagingStats, TcpCommunicator, TcpConfig};
use hmc_transport_ucx::{UcxCommunicator, UcxConfig};
use rstest::rstest;

const T: Duration = Duration::from_secs(20);
/// More than a few 1 MiB staging chunks, with a ragged end.
const LEN: usize = (5 << 20) + 4099;
const CHILD: &str = "HMC_DEVICE_PEER_CHILD";

fn shim() -> PathBuf {
    let src =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../hmc-backend-rocm/tests/shim/hip_shim.c");
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("device-peers-hip");
    hmc_testshim::build_shim(&src, "hip_shim", &out).expect("build the HIP ABI shim")
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

fn crc(bytes: &[u8]) -> u64 {
    // FNV-1a: enough to tell one pattern from another.
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn download(mem: &RocmMemory, buf: &impl DeviceBuffer) -> Vec<u8> {
    let mut out = vec![0u8; buf.len()];
    mem.copy(&mut MemSpanMut::host(&mut out), &MemSpan::of(buf))
        .unwrap();
    out
}

/// The target side: an engine whose transport this test can ask for its staging counters.
enum Target {
    Tcp(Engine<TcpCommunicator>, Arc<TcpCommunicator>),
    Auto(
        Engine<LocalFirst<TcpCommunicator>>,
        Arc<LocalFirst<TcpCommunicator>>,
    ),
    Shm(Engine<ShmCommunicator>),
    Ucx(Engine<UcxCommunicator>, Arc<UcxCommunicator>),
    AutoUcx(
        Engine<LocalFirst<UcxCommunicator>>,
        Arc<LocalFirst<UcxCommunicator>>,
    ),
}

impl Target {
    async fn new(transport: &str) -> Target {
        let tcp =
            TcpCommunicator::bind(&"tcp://127.0.0.1:0".parse().unwrap(), TcpConfig::default())
                .unwrap();
        match transport {
            "tcp" => {
                let c = Arc::new(tcp);
                let e = engine_over(c.clone(), EngineConfig::default()).await;
                Target::Tcp(e, c)
            }
            "ucx" => {
                let c = Arc::new(UcxCommunicator::new(UcxConfig::with_tls("tcp")).unwrap());
                let e = engine_over(c.clone(), EngineConfig::default()).await;
                Target::Ucx(e, c)
            }
            "auto-ucx" => {
                let ucx = UcxCommunicator::new(UcxConfig::with_tls("tcp")).unwrap();
                let shm = ShmCommunicator::bind(ShmConfig::default()).unwrap();
                let c = Arc::new(LocalFirst::new(ucx, shm));
                let e = engine_over(c.clone(), EngineConfig::default()).await;
                Target::AutoUcx(e, c)
            }
            "shm" => {
                let c = Arc::new(ShmCommunicator::bind(ShmConfig::default()).unwrap());
                let e = engine_over(c, EngineConfig::default()).await;
                Target::Shm(e)
            }
            _ => {
                let shm = ShmCommunicator::bind(ShmConfig::default()).unwrap();
                let c = Arc::new(LocalFirst::new(tcp, shm));
                let e = engine_over(c.clone(), EngineConfig::default()).await;
                Target::Auto(e, c)
            }
        }
    }

    fn stats(&self) -> StagingStats {
        match self {
            Target::Tcp(_, c) => c.staging_stats(),
            Target::Auto(_, c) => c.net().staging_stats(),
            // No TCP half: nothing is staged.
            Target::Shm(_) => StagingStats::default(),
            Target::Ucx(_, _) | Target::AutoUcx(_, _) => {
                let s = match self {
                    Target::Ucx(_, c) => c.staging_stats(),
                    Target::AutoUcx(_, c) => c.net().staging_stats(),
                    _ => unreachable!(),
                };
                let mut out = StagingStats::default();
                out.chunks_held = s.chunks_held;
                out.chunks_allocated = s.chunks_allocated;
                out.bytes_to_peers = s.bytes_to_peers;
                out.bytes_from_peers = s.bytes_from_peers;
                out
            }
        }
    }

    fn path(&self) -> DeviceMemoryPath {
        let caps = match self {
            Target::Tcp(e, _) => e.capabilities(),
            Target::Auto(e, _) => e.capabilities(),
            Target::Shm(e) => e.capabilities(),
            Target::Ucx(e, _) => e.capabilities(),
            Target::AutoUcx(e, _) => e.capabilities(),
        };
        caps.memory_path(hmc_core::DeviceKind::ROCM)
    }

    /// Registers `buf` as device memory and returns this engine's metadata blob.
    fn register(&self, mem: &RocmMemory, buf: &impl DeviceBuffer) -> Vec<u8> {
        let desc = MemDesc {
            addr: buf.region().addr,
            len: buf.len(),
        };
        let any = AnyMemory::new(mem.clone());
        match self {
            Target::Tcp(e, _) => register_device(e, desc, any),
            Target::Auto(e, _) => register_device(e, desc, any),
            Target::Shm(e) => register_device(e, desc, any),
            Target::Ucx(e, _) => register_device(e, desc, any),
            Target::AutoUcx(e, _) => register_device(e, desc, any),
        }
    }
}

/// `desc` registered with `e` as device memory of `mem`, then `e`'s metadata blob. The
/// caller keeps the buffer under `desc` until `e` is dropped.
fn register_device<C: Communicator>(e: &Engine<C>, desc: MemDesc, mem: AnyMemory) -> Vec<u8> {
    // SAFETY: the buffers of these tests outlive both engines (dropped at the end of each).
    unsafe { e.register_device_mem(desc, mem) }.unwrap();
    e.local_metadata().unwrap()
}

/// The initiator, in a child process: `HMC_DEVICE_PEER_CHILD=<transport>`, the target's
/// blob in hex and its device address on stdin.
/// With `auto` the child runs without UCX (`HMC_UCX_LIB` names no library), so its
/// `auto` is shared memory first over TCP, as this side's target is; with `auto-ucx` its
/// `auto` is shared memory over UCX, whose device regions (a UCX without HIP support) are
/// staged over UCX's control connection.
/// With `ipc_refused` the child's HIP shim refuses to open peers' IPC handles (as a
/// runtime in another container does).
fn spawn_initiator(
    transport: &str,
    mode: &str,
    blob: &[u8],
    addr: u64,
    ipc_refused: bool,
) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    if transport == "auto" {
        cmd.env("HMC_UCX_LIB", "/nonexistent/libucp.so.0");
    }
    if ipc_refused {
        cmd.env("HMC_SHIM_IPC_REFUSE", "1");
    }
    let transport = if transport == "auto-ucx" {
        "auto"
    } else {
        transport
    };
    let mut child = cmd
        .stderr(Stdio::piped())
        .args(["initiator_child", "--exact", "--ignored", "--nocapture"])
        .env(CHILD, format!("{transport}:{mode}"))
        .env("HMC_HIP_LIB", shim())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{} {addr}", hmc_testshim::to_hex(blob)).unwrap();
    child
}

/// Bytes this process's engine moved through its host bounce buffers, by op.
fn staged_bytes(metrics: &metrics_exporter_prometheus::PrometheusHandle, op: &str) -> u64 {
    let name = format!("hmc_engine_staged_bytes_total{{op=\"{op}\"}}");
    metrics
        .render()
        .lines()
        .find(|l| l.split(' ').next() == Some(name.as_str()))
        .and_then(|l| l.split(' ').nth(1))
        .map_or(0, |v| v.parse().unwrap())
}

/// The child's next line that starts with `key`, its rest.
fn expect_line(lines: &mut impl Iterator<Item = std::io::Result<String>>, key: &str) -> String {
    for line in lines {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix(key) {
            return rest.trim().to_string();
        }
    }
    panic!("the child ended before printing `{key}`");
}

#[rstest]
#[case::tcp("tcp", false)]
#[case::auto("auto", false)]
#[case::auto_ipc_refused("auto", true)]
#[case::shm("shm", false)]
#[case::ucx("ucx", false)]
#[case::auto_over_ucx("auto-ucx", false)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_reads_and_writes_device_regions_staged_over_tcp_and_by_ipc_on_one_host(
    #[case] transport: &str,
    #[case] ipc_refused: bool,
) {
    let mem = RocmMemory::with_library(shim(), 0).unwrap();
    let target = Target::new(transport).await;
    // Shared memory alone moves device memory itself (vendor IPC); tcp and auto's
    // network half stage it.
    let path = if transport == "shm" {
        DeviceMemoryPath::Direct
    } else {
        DeviceMemoryPath::Staged
    };
    assert_eq!(target.path(), path);
    let mut kv = mem.alloc(LEN).unwrap();
    let original = pattern(LEN, 7);
    mem.copy(&mut MemSpanMut::of(&mut kv), &MemSpan::host(&original))
        .unwrap();
    let blob = target.register(&mem, &kv);
    let child = spawn_initiator(transport, "check", &blob, kv.region().addr, ipc_refused);
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "the initiator failed:\n{text}\n{log}");
    // A refused IPC open is said once for the peer, however many transfers follow.
    let said = log
        .matches("cannot open the same-host peer's device memory")
        .count();
    assert_eq!(said, usize::from(ipc_refused), "{log}");
    let mut lines = text.lines().map(|l| Ok(l.to_string()));
    // READ into host memory and into the child's own device region: the target's bytes.
    assert_eq!(
        expect_line(&mut lines, "read-host"),
        crc(&original).to_string()
    );
    for key in ["read-device", "read-device-again"] {
        assert_eq!(expect_line(&mut lines, key), crc(&original).to_string());
    }
    // WRITE from the child's device region: its pattern lands in this device region.
    let written: u64 = expect_line(&mut lines, "wrote").parse().unwrap();
    assert_eq!(crc(&download(&mem, &kv)), written);
    assert_eq!(written, crc(&pattern(LEN, 99)));
    // The child's own bounce buffers: over tcp (and without IPC) both device READs and the
    // WRITE go through them; over auto only the first READ, which opened the IPC handle.
    // Over shm the child's device region is registered with the transport: none.
    let direct = transport.starts_with("auto") && !ipc_refused;
    let bounced = expect_line(&mut lines, "bounced");
    let want = if transport == "shm" {
        "0 0".to_string()
    } else if direct {
        format!("{LEN} 0")
    } else {
        format!("{} {LEN}", 2 * LEN)
    };
    assert_eq!(
        bounced, want,
        "bytes through the child's bounce buffers (read, write)"
    );
    let s = target.stats();
    // Three READs of the region out, one WRITE in: over tcp every byte through the chunks
    // once each. Over auto the child is on this host: its first READ (into host memory,
    // before it has a HIP backend) takes the staged TCP path; once it registered device
    // memory of its own, its shared-memory side opens the region's IPC handle, and the
    // device READ and the WRITE go by vendor IPC, past the chunks. An initiator that cannot
    // open the IPC handle falls back to the staged TCP path for all of them.
    let (reads, writes) = if transport == "tcp" || transport == "ucx" || ipc_refused {
        (3, 1)
    } else if transport == "shm" {
        (0, 0)
    } else {
        (1, 0)
    };
    assert_eq!(s.bytes_to_peers, reads * LEN as u64, "{s:?}");
    assert_eq!(s.bytes_from_peers, writes * LEN as u64, "{s:?}");
    assert_eq!(s.chunks_held, 0, "{s:?}");
    assert!(
        s.chunks_allocated <= 64,
        "bounded by max_staging_bytes: {s:?}"
    );
}

#[rstest]
#[case::tcp("tcp")]
#[case::ucx("ucx")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_initiator_killed_mid_transfer_leaves_no_chunk_held(#[case] transport: &str) {
    let mem = RocmMemory::with_library(shim(), 0).unwrap();
    let target = Target::new(transport).await;
    let kv = mem.alloc(LEN).unwrap();
    let blob = target.register(&mem, &kv);
    let mut child = spawn_initiator(transport, "loop", &blob, kv.region().addr, false);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    expect_line(&mut lines, "looping");
    let until = Instant::now() + T;
    while target.stats().chunks_held == 0 {
        assert!(Instant::now() < until, "no READ was being served");
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let until = Instant::now() + T;
    while target.stats().chunks_held != 0 {
        assert!(
            Instant::now() < until,
            "chunks still held after the initiator died: {:?}",
            target.stats()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The pool serves the next peer.
    let child = spawn_initiator(transport, "check-read", &blob, kv.region().addr, false);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The initiator process (run by the tests above; returns at once otherwise).
#[test]
#[ignore = "a child process of the tests above"]
fn initiator_child() {
    let Ok(what) = std::env::var(CHILD) else {
        return;
    };
    let (transport, mode) = what.split_once(':').unwrap();
    // This engine's bounce-buffer counters (`hmc_engine_staged_bytes_total`).
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .unwrap();
    // Warnings to stderr, where the test reads what the transports said.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter("warn")
        .try_init();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let (hex, addr) = line.trim().split_once(' ').unwrap();
    let (blob, remote_addr) = (hmc_testshim::from_hex(hex), addr.parse::<u64>().unwrap());
    let rt = common::runtime();
    rt.block_on(async move {
        let e = engine_from(&[("transport", transport)]).await;
        let peer = e.add_remote(&blob, T).await.unwrap();
        let host = vec![0u8; LEN];
        // `host` (LEN bytes) outlives the engine's use of it (deregistered below).
        let h = register_rw(&e, &host);
        let one = |local: u64| TransferOpDesc {
            local_addr: local,
            remote_addr,
            len: LEN,
        };
        if mode == "loop" {
            println!("looping");
            loop {
                e.transfer(&peer, TransferOp::Read, &[one(host.as_ptr() as u64)], T)
                    .await
                    .unwrap();
            }
        }
        let mem = RocmMemory::with_library(std::env::var("HMC_HIP_LIB").unwrap(), 1).unwrap();
        let dev = mem.alloc(LEN).unwrap();
        let register_dev = || {
            // SAFETY: `dev` outlives its registration (deregistered below).
            unsafe {
                e.register_device_mem(
                    MemDesc {
                        addr: dev.region().addr,
                        len: LEN,
                    },
                    AnyMemory::new(mem.clone()),
                )
            }
            .unwrap()
        };
        // Shared memory alone reaches the peer's device memory only with a backend of its
        // kind, which registering device memory of that kind gives it.
        let early = (transport == "shm").then(register_dev);
        e.transfer(&peer, TransferOp::Read, &[one(host.as_ptr() as u64)], T)
            .await
            .unwrap();
        println!("read-host {}", crc(&host));
        if mode == "check-read" {
            return;
        }
        // Into a device region of this process (over tcp staged through its own bounce
        // buffers).
        let d = early.unwrap_or_else(register_dev);
        e.transfer(&peer, TransferOp::Read, &[one(dev.region().addr)], T)
            .await
            .unwrap();
        println!("read-device {}", crc(&download(&mem, &dev)));
        // Again, into a cleared region: over auto the first READ opened the target's IPC
        // handle, so this one goes device to device (no bounce through this engine's host
        // buffers).
        let mut dev = dev;
        mem.copy(
            &mut MemSpanMut::of(&mut dev),
            &MemSpan::host(&vec![0u8; LEN]),
        )
        .unwrap();
        e.transfer(&peer, TransferOp::Read, &[one(dev.region().addr)], T)
            .await
            .unwrap();
        println!("read-device-again {}", crc(&download(&mem, &dev)));
        // A WRITE from the device region.
        let mine = pattern(LEN, 99);
        mem.copy(&mut MemSpanMut::of(&mut dev), &MemSpan::host(&mine))
            .unwrap();
        e.transfer(&peer, TransferOp::Write, &[one(dev.region().addr)], T)
            .await
            .unwrap();
        println!("wrote {}", crc(&mine));
        println!(
            "bounced {} {}",
            staged_bytes(&metrics, "read"),
            staged_bytes(&metrics, "write")
        );
        e.deregister_mem(d).await.unwrap();
        e.deregister_mem(h).await.unwrap();
        drop(dev);
    });
}
