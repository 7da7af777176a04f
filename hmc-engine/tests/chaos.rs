//! The chaos matrix: every fault kind of `hmc_faults` x transport x operation, each case two
//! engines in this process, the initiator's transport wrapped by its `faults` option.
//! Each case checks that
//!
//! - every operation ends within its deadline plus [`SLACK`];
//! - after an operation ends in error, canary bytes written at once into the memory it
//!   would have written (the target's for a WRITE, ours for a READ) are still there after
//!   a delay: nothing of it lands after its terminal state;
//! - a post's notification is seen once when the post completed, never as a success when
//!   it failed (its failure notice at most);
//! - an operation after the last fault succeeds, with at most a reconnect (no restart);
//! - file descriptors and threads come back to their count before the case;
//! - over tcp and ucx, whose targets serve device regions through pinned bounce chunks,
//!   no chunk stays leased at the target once the case's operations ended (the plain
//!   operations' odd rounds go to a device region of the HIP ABI shim, so the chunks are
//!   used, and the case says so if none were);
//! - resident memory grows by at most [`RSS_BOUND`] from the end of the case's warm-up
//!   (its first tenth of operations, under the same faults) to its last operation.
//!
//! `cargo test` runs the quick matrix (`HMC_CHAOS` unset or `quick`): tcp and shm, one seed,
//! 12 operations a case. `cargo xtask chaos` runs it and prints the table;
//! `cargo xtask chaos --long` (`HMC_CHAOS=full`) adds UCX (run with `UCX_TLS=tcp`, then
//! with shared memory), the RDMA stand-in and the example C plugin: on each transport
//! first the leak cases, [`LEAK_FAULTS`] (faults that fire again and again) x every
//! operation, one seed, [`LEAK_OPS`] operations a case, then every fault x operation for
//! [`FULL_SEEDS`] seeds of [`FULL_OPS`] operations (`HMC_CHAOS_TRANSPORTS=a,b` runs only those, in
//! either mode; `HMC_CHAOS_ONLY=TEXT` only the cases whose "fault / operation" contains
//! TEXT). `HMC_CHAOS_JSON=FILE` writes the table as JSON.

#[path = "../../hmc-plugin/tests/common/mod.rs"]
mod plugins;

mod common;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_backend_rocm::RocmMemory;
use hmc_core::{
    AnyCommunicator, AnyMemory, DeviceBuffer, DynCommunicator, MemSpan, MemSpanMut, Memory,
};
use hmc_engine::kv::{Cache, CacheDesc, CacheKey, DataDist, DataType, Role};
use hmc_engine::{
    Access, Engine, EngineConfig, EngineError, MemDesc, MemType, TransferOp, TransferOpDesc,
    TransferStatus,
};
use hmc_transport_tcp::TcpCommunicator;
use hmc_transport_ucx::UcxCommunicator;

/// Each operation's deadline (and the engine's no-progress timeout).
const OP_TIMEOUT: Duration = Duration::from_millis(300);
/// How late past its deadline an operation may end.
const SLACK: Duration = Duration::from_millis(700);
/// Bytes each side registers; every operation moves all of them.
const LEN: usize = 256 << 10;
const CANARY: u8 = 0xC5;
/// The tests of this file run one at a time: the matrix counts the process's file
/// descriptors and threads, which another test's engines would change.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
/// How long a case's file descriptors and threads may take to come back once its engines
/// are finalized.
const LEAK_WAIT: Duration = Duration::from_secs(3);
/// How much resident memory may grow from the end of a case's warm-up to its end. The
/// process's allocator keeps freed memory and grows its arenas in steps, so a few MiB of
/// noise is normal; a leak of a staging chunk (1 MiB), an operation's buffer (256 KiB) or
/// even 10 KiB per faulted operation exceeds it within a leak case's operations.
const RSS_BOUND: u64 = 8 << 20;
/// `--long`: operations of each fault x operation x seed case.
const FULL_OPS: usize = 40;
/// `--long`: the seeds of each fault x operation case.
const FULL_SEEDS: &[u64] = &[1, 2];
/// `--long`: operations of each leak case.
const LEAK_OPS: usize = 1000;

/// Fault kinds: each one's name and spec items (without the seed).
type Faults = &'static [(&'static str, &'static str)];

/// `--long`'s leak cases: faults that fire on a share of all the operations (or again on
/// every new connection), so each of a case's [`LEAK_OPS`] operations runs under them and
/// many end faulted; stalls short but past the deadline.
const LEAK_FAULTS: Faults = &[
    ("leak: transfer failed, repeatedly", "xfer.fail=10%"),
    ("leak: transfer cut, repeatedly", "xfer.cut=0.5@10%"),
    ("leak: peer disconnected, repeatedly", "disconnect.after=20"),
    ("leak: transfer stalled, repeatedly", "xfer.stall=350ms@2%"),
];

/// The faults, as spec items without the seed. Each fires early in a case and then stops
/// (`first:N`), or by chance under the seed (`N%`), so the case also shows recovery.
const FAULTS: &[(&str, &str)] = &[
    ("none", ""),
    ("connect refused", "connect.refuse=first:2"),
    ("connect delayed", "connect.delay=100ms@first:2"),
    ("transfer stalled", "xfer.stall=1s@first:3"),
    ("transfer failed", "xfer.fail=first:3"),
    ("transfer failed by chance", "xfer.fail=25%"),
    ("transfer cut", "xfer.cut=0.5@first:3"),
    ("peer disconnected", "disconnect.after=4"),
    ("peer restarted", "restart.after=4"),
    ("notification dropped", "notify.drop=first:2"),
    ("notification late", "notify.delay=600ms@first:2"),
    ("notification doubled", "notify.dup=first:3"),
    (
        "notification dropped at the target",
        "notify.at=receiver;notify.drop=first:2",
    ),
    ("registration slow", "register.slow=50ms@first:2"),
    ("metadata service slow", "meta.slow=100ms@first:3"),
    ("metadata service gone", "meta.gone=first:2"),
];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Operation {
    SyncRead,
    SyncWrite,
    AsyncWrite,
    PostWithNotification,
    /// LLM-DataDist's pull of a whole cache the target published (writes here).
    KvPull,
    /// Its push of a cache here into one the target published (writes there).
    KvPush,
}

const OPERATIONS: &[Operation] = &[
    Operation::SyncRead,
    Operation::SyncWrite,
    Operation::AsyncWrite,
    Operation::PostWithNotification,
    Operation::KvPull,
    Operation::KvPush,
];

impl Operation {
    fn name(self) -> &'static str {
        match self {
            Operation::SyncRead => "sync READ",
            Operation::SyncWrite => "sync WRITE",
            Operation::AsyncWrite => "async WRITE",
            Operation::PostWithNotification => "post + notification",
            Operation::KvPull => "KV pull",
            Operation::KvPush => "KV push",
        }
    }

    fn writes_here(self) -> bool {
        matches!(self, Operation::SyncRead | Operation::KvPull)
    }
}

/// Every transport the matrix knows.
const ALL_TRANSPORTS: &[&str] = &["tcp", "shm", "ucx", "rdma-standin", "plugin"];

/// How big a run is.
struct Scale {
    transports: Vec<&'static str>,
    seeds: &'static [u64],
    ops: usize,
    /// The leak cases, after the others on each transport (none in the quick matrix).
    leak_faults: Faults,
    leak_ops: usize,
    /// How long canaries must survive.
    settle: Duration,
}

fn scale() -> Scale {
    let mut s = match std::env::var("HMC_CHAOS").as_deref() {
        Ok("full") => Scale {
            transports: ALL_TRANSPORTS.to_vec(),
            seeds: FULL_SEEDS,
            ops: FULL_OPS,
            leak_faults: LEAK_FAULTS,
            leak_ops: LEAK_OPS,
            settle: Duration::from_millis(100),
        },
        _ => Scale {
            transports: vec!["tcp", "shm"],
            seeds: &[1],
            ops: 12,
            leak_faults: &[],
            leak_ops: 0,
            settle: Duration::from_millis(30),
        },
    };
    // `cargo xtask chaos` runs UCX once more with its shared-memory transports.
    if let Ok(only) = std::env::var("HMC_CHAOS_TRANSPORTS") {
        s.transports = ALL_TRANSPORTS
            .iter()
            .copied()
            .filter(|t| only.split(',').any(|o| o == *t))
            .collect();
    }
    s
}

/// One case's outcome.
#[derive(Default)]
struct Outcome {
    ok: usize,
    failed: usize,
    connects_failed: usize,
    /// The longest any operation took past its deadline.
    worst_late: Duration,
    /// Resident memory from the end of the warm-up to the end of the operations, bytes.
    rss_growth: i64,
    /// Bytes the target's bounce chunks moved (tcp and ucx).
    staged_bytes: u64,
    problems: Vec<String>,
}

struct Pair {
    init: Engine<AnyCommunicator>,
    target: Engine<AnyCommunicator>,
    mine: Vec<u8>,
    theirs: Vec<u8>,
    kv: Option<KvPair>,
    staged: Option<Staged>,
}

/// tcp and ucx: the target's transport, whose staging counters this test reads, and a
/// device region (the HIP ABI shim's: host memory behind HIP's C ABI) the plain
/// operations' odd rounds move, which the target serves through its bounce chunks.
struct Staged {
    comm: StagingComm,
    mem: RocmMemory,
    buf: <RocmMemory as Memory>::Buffer,
}

enum StagingComm {
    Tcp(Arc<TcpCommunicator>),
    Ucx(Arc<UcxCommunicator>),
}

impl Staged {
    /// Chunks leased now, and the bytes they have moved.
    fn stats(&self) -> (usize, u64) {
        match &self.comm {
            StagingComm::Tcp(c) => {
                let s = c.staging_stats();
                (s.chunks_held, s.bytes_to_peers + s.bytes_from_peers)
            }
            StagingComm::Ucx(c) => {
                let s = c.staging_stats();
                (s.chunks_held, s.bytes_to_peers + s.bytes_from_peers)
            }
        }
    }

    fn addr(&self) -> u64 {
        self.buf.region().addr
    }

    fn fill(&mut self, byte: u8) {
        let bytes = vec![byte; LEN];
        self.mem
            .copy(&mut MemSpanMut::of(&mut self.buf), &MemSpan::host(&bytes))
            .expect("write the device region");
    }

    fn first_not(&self, byte: u8) -> Option<usize> {
        let mut bytes = vec![0u8; LEN];
        self.mem
            .copy(&mut MemSpanMut::host(&mut bytes), &MemSpan::of(&self.buf))
            .expect("read the device region");
        bytes.iter().position(|&b| b != byte)
    }
}

/// The HIP ABI shim, built once.
fn hip_shim() -> std::path::PathBuf {
    static SHIM: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    SHIM.get_or_init(|| {
        let src = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../hmc-backend-rocm/tests/shim/hip_shim.c");
        let out = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("chaos-hip");
        hmc_testshim::build_shim(&src, "hip_shim", &out).expect("build the HIP ABI shim")
    })
    .clone()
}

/// Whether round `round` of `op` moves the target's device region.
fn staged_round(p: &Pair, op: Operation, round: usize) -> bool {
    p.staged.is_some() && p.kv.is_none() && op != Operation::KvPull && round % 2 == 1
}

/// The KV API's two sides: the target publishes a cache under [`KV_KEY`], the initiator
/// holds one of the same layout and links the target's cluster.
struct KvPair {
    here: DataDist<AnyCommunicator>,
    /// Owns the target's cache memory: kept for the case.
    _there: DataDist<AnyCommunicator>,
    mine: Cache,
    theirs: Cache,
}

const TARGET_CLUSTER: u64 = 1;
const KV_KEY: CacheKey = CacheKey {
    prompt_cluster_id: TARGET_CLUSTER,
    req_id: 7,
    model_id: 1,
    prefix_id: 0,
};

impl KvPair {
    async fn new(init: &Engine<AnyCommunicator>, target: &Engine<AnyCommunicator>) -> KvPair {
        let desc = CacheDesc {
            placement: MemType::Host,
            num_tensors: 4,
            dtype: DataType::F16,
            shape: vec![64, 512],
        };
        let there = DataDist::new(target.clone(), TARGET_CLUSTER, Role::Prompt);
        let theirs = there
            .allocate_cache(desc.clone(), &[KV_KEY], None)
            .await
            .unwrap();
        let here = DataDist::new(init.clone(), 2, Role::Decoder);
        let mine = here.allocate_cache(desc, &[], None).await.unwrap();
        KvPair {
            here,
            _there: there,
            mine,
            theirs,
        }
    }

    /// Fills every tensor of `cache` with `byte`.
    fn fill(cache: &Cache, byte: u8) {
        for (addr, len) in Self::tensors(cache) {
            // SAFETY: a tensor of `len` bytes the KV API allocated, alive until the case
            // ends (its DataDist is kept); written only while no transfer of it runs,
            // which is what the case checks.
            unsafe { std::ptr::write_bytes(addr as *mut u8, byte, len) };
        }
    }

    /// The first offset in `cache`'s tensors that does not hold `byte`.
    fn first_not(cache: &Cache, byte: u8) -> Option<usize> {
        Self::tensors(cache).into_iter().find_map(|(addr, len)| {
            // SAFETY: as in `fill`, read only.
            let t = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
            t.iter().position(|&b| b != byte)
        })
    }

    /// Each tensor's address and length.
    fn tensors(cache: &Cache) -> Vec<(u64, usize)> {
        let len = cache.desc().shape.iter().product::<u64>() as usize
            * cache.desc().dtype.size() as usize;
        cache.tensor_addrs().iter().map(|&a| (a, len)).collect()
    }
}

fn options(transport: &str, faults: Option<&str>) -> HashMap<String, String> {
    let timeout = OP_TIMEOUT.as_millis().to_string();
    let mut o: HashMap<String, String> = [
        ("no_progress_timeout_ms".to_string(), timeout),
        ("transport".to_string(), transport.to_string()),
    ]
    .into();
    if let Some(f) = faults {
        o.insert("faults".into(), f.into());
    }
    o
}

/// `comm` under `config`'s faults, as the engine opens a transport.
async fn engine_over(comm: AnyCommunicator, config: EngineConfig) -> Engine<AnyCommunicator> {
    let comm = match &config.faults {
        Some(plan) => AnyCommunicator::new(hmc_faults::Faulty::new(comm, plan.clone())),
        None => comm,
    };
    Engine::initialize(Arc::new(comm), "127.0.0.1", config)
        .await
        .unwrap()
}

/// A tcp or ucx engine whose transport this test keeps, opened with the options the engine
/// gives its transport (`transport_options`).
async fn staging_engine(
    transport: &str,
    faults: Option<&str>,
) -> (Engine<AnyCommunicator>, StagingComm) {
    let config = EngineConfig::from_options(&options(transport, faults)).unwrap();
    let opts = hmc_engine::transport_options(&config);
    let notifications = opts.max_pending_notifications.unwrap_or(0);
    let (comm, staging): (Arc<dyn DynCommunicator>, StagingComm) = if transport == "tcp" {
        let c = Arc::new(
            TcpCommunicator::bind(
                &"tcp://127.0.0.1:0".parse().unwrap(),
                hmc_transport_tcp::TcpConfig {
                    max_pending_notifications: notifications,
                    max_staging_bytes: config.max_staging_bytes,
                    ..opts.tcp.clone()
                },
            )
            .unwrap(),
        );
        (c.clone(), StagingComm::Tcp(c))
    } else {
        let c = Arc::new(
            UcxCommunicator::new(hmc_transport_ucx::UcxConfig {
                bind: "127.0.0.1:0".parse().unwrap(),
                max_pending_notifications: notifications,
                max_staging_bytes: config.max_staging_bytes,
                ..opts.ucx.clone()
            })
            .unwrap(),
        );
        (c.clone(), StagingComm::Ucx(c))
    };
    let engine = engine_over(AnyCommunicator::from_arc(comm), config).await;
    (engine, staging)
}

async fn engine(transport: &str, faults: Option<&str>) -> Engine<AnyCommunicator> {
    let mut o = options(transport, faults);
    match transport {
        "rdma-standin" => {
            let comm = common::standin::rdma_standin();
            o.remove("transport");
            engine_over(comm, EngineConfig::from_options(&o).unwrap()).await
        }
        "plugin" => {
            let lib = plugins::build_c_plugin("loopmem", &[]);
            o.insert("transport".into(), "loopmem".into());
            o.insert("plugin_path".into(), lib.display().to_string());
            Engine::initialize_with("127.0.0.1", EngineConfig::from_options(&o).unwrap())
                .await
                .unwrap()
        }
        _ => Engine::initialize_with("127.0.0.1", EngineConfig::from_options(&o).unwrap())
            .await
            .unwrap(),
    }
}

fn register(e: &Engine<AnyCommunicator>, m: &mut [u8]) {
    // SAFETY: each case keeps its buffers until its engines are finalized.
    unsafe {
        e.register_mem(
            MemDesc {
                addr: m.as_mut_ptr() as u64,
                len: m.len(),
            },
            MemType::Host,
            Access::READ_WRITE,
        )
        .unwrap();
    }
}

/// Connects, through refused and delayed connects, within a bounded number of tries.
async fn connect(p: &Pair, out: &mut Outcome) -> bool {
    for _ in 0..10 {
        let start = Instant::now();
        let r = p.init.connect(p.target.name(), OP_TIMEOUT * 2).await;
        late(out, start, OP_TIMEOUT * 2);
        match r {
            Ok(()) | Err(EngineError::AlreadyConnected(_)) => return true,
            Err(_) => out.connects_failed += 1,
        }
    }
    out.problems.push("no connect succeeded in 10 tries".into());
    false
}

fn late(out: &mut Outcome, start: Instant, deadline: Duration) {
    let over = start.elapsed().saturating_sub(deadline);
    out.worst_late = out.worst_late.max(over);
    if over > SLACK {
        out.problems
            .push(format!("an operation ended {over:?} past its deadline"));
    }
}

/// How an operation ended.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ended {
    Completed,
    Failed,
    /// Failed, saying the peer or its connection is gone: a user connects again.
    PeerLost,
}

impl Ended {
    fn of(r: Result<(), &EngineError>) -> Ended {
        match r {
            Ok(()) => Ended::Completed,
            Err(
                EngineError::PeerGone { .. }
                | EngineError::NotConnected(_)
                | EngineError::Transport(hmc_core::Error::Peer { .. }),
            ) => Ended::PeerLost,
            Err(_) => Ended::Failed,
        }
    }

    fn of_status(s: Option<TransferStatus>) -> Ended {
        match s {
            Some(TransferStatus::Completed) => Ended::Completed,
            Some(TransferStatus::Failed(e)) => Ended::of(Err(&e)),
            _ => Ended::Failed,
        }
    }
}

/// Runs `op` once (round `round`).
async fn run_op(p: &Pair, op: Operation, round: usize, out: &mut Outcome) -> Ended {
    let desc = TransferOpDesc {
        local_addr: p.mine.as_ptr() as u64,
        remote_addr: match &p.staged {
            Some(st) if staged_round(p, op, round) => st.addr(),
            _ => p.theirs.as_ptr() as u64,
        },
        len: LEN,
    };
    let target = p.target.name();
    let start = Instant::now();
    let ended = match op {
        Operation::SyncRead | Operation::SyncWrite => {
            let dir = if op == Operation::SyncRead {
                TransferOp::Read
            } else {
                TransferOp::Write
            };
            let r = p.init.transfer(target, dir, &[desc], OP_TIMEOUT).await;
            Ended::of(r.as_ref().map(|_| ()))
        }
        Operation::AsyncWrite => {
            match p
                .init
                .transfer_async(target, TransferOp::Write, vec![desc], OP_TIMEOUT)
            {
                Ok(req) => Ended::of_status(Some(req.wait().await)),
                Err(e) => Ended::of(Err(&e)),
            }
        }
        Operation::PostWithNotification => post(p, desc, round).await,
        Operation::KvPull | Operation::KvPush => {
            let kv = p.kv.as_ref().expect("a KV case has its caches");
            let r = if op == Operation::KvPull {
                kv.here.pull_kv_cache(&KV_KEY, &kv.mine, OP_TIMEOUT).await
            } else {
                kv.here
                    .push_kv_cache(&kv.mine, TARGET_CLUSTER, &KV_KEY, OP_TIMEOUT)
                    .await
            };
            Ended::of(r.as_ref().map(|_| ()))
        }
    };
    // A post's deadline is its no-progress timeout per chunk, then its notification's.
    let deadline = if op == Operation::PostWithNotification {
        OP_TIMEOUT * 2
    } else {
        OP_TIMEOUT
    };
    late(out, start, deadline);
    ended
}

async fn post(p: &Pair, desc: TransferOpDesc, round: usize) -> Ended {
    let local = match p
        .init
        .prepare_local(&[hmc_engine::BlockDesc::block(desc.local_addr, LEN)])
    {
        Ok(l) => l,
        Err(e) => return Ended::of(Err(&e)),
    };
    let remote = match p
        .init
        .prepare_remote(
            p.target.name(),
            &[hmc_engine::BlockDesc::block(desc.remote_addr, LEN)],
            OP_TIMEOUT,
        )
        .await
    {
        Ok(r) => r,
        Err(e) => return Ended::of(Err(&e)),
    };
    let x = match p.init.make_transfer(
        TransferOp::Write,
        &local,
        &[0],
        &remote,
        &[0],
        Some(("round".into(), round.to_string().into_bytes())),
    ) {
        Ok(x) => x,
        Err(e) => return Ended::of(Err(&e)),
    };
    if let Err(e) = x.post() {
        return Ended::of(Err(&e));
    }
    let ended = Ended::of_status(x.wait().await);
    x.release().await;
    ended
}

/// After `op` ended in error in `round`: canaries where it would have written, still there
/// after `settle`.
async fn canaries_hold(
    p: &mut Pair,
    op: Operation,
    round: usize,
    settle: Duration,
    out: &mut Outcome,
) {
    if let Some(kv) = &p.kv {
        let cache = if op.writes_here() {
            &kv.mine
        } else {
            &kv.theirs
        };
        KvPair::fill(cache, CANARY);
        tokio::time::sleep(settle).await;
        if let Some(at) = KvPair::first_not(cache, CANARY) {
            out.problems.push(format!(
                "a KV byte landed at offset {at} after the operation ended in error"
            ));
        }
        return;
    }
    if !op.writes_here() && staged_round(p, op, round) {
        let st = p.staged.as_mut().expect("a staged round has its region");
        st.fill(CANARY);
        tokio::time::sleep(settle).await;
        if let Some(at) = st.first_not(CANARY) {
            out.problems.push(format!(
                "a byte landed at offset {at} of the target's device region after the operation ended in error"
            ));
        }
        return;
    }
    let dst = if op.writes_here() {
        &mut p.mine
    } else {
        &mut p.theirs
    };
    dst.fill(CANARY);
    tokio::time::sleep(settle).await;
    let dst = if op.writes_here() { &p.mine } else { &p.theirs };
    if let Some(at) = dst.iter().position(|&b| b != CANARY) {
        out.problems.push(format!(
            "a byte landed at offset {at} after the operation ended in error"
        ));
    }
}

/// After an operation that said its peer is lost: connect again, as a user would (not a
/// restart). Whether connected.
async fn reconnect(p: &Pair, ended: Ended, out: &mut Outcome) -> bool {
    if ended != Ended::PeerLost {
        return true;
    }
    let _ = p.init.disconnect(p.target.name()).await;
    if let Some(kv) = &p.kv {
        let _ = kv.here.unlink_clusters(&[TARGET_CLUSTER]).await;
        for _ in 0..10 {
            let linked = kv
                .here
                .link_clusters(
                    &[(TARGET_CLUSTER, p.target.name().to_string())],
                    OP_TIMEOUT * 2,
                )
                .await;
            if linked.iter().all(|r| r.is_ok()) {
                return true;
            }
            out.connects_failed += 1;
        }
        out.problems.push("no link succeeded in 10 tries".into());
        return false;
    }
    connect(p, out).await
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Resident memory, bytes (`/proc/self/statm`'s second field, in pages).
fn resident() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf reads a constant of the system.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

fn threads() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

async fn run_case(
    transport: &str,
    spec: &str,
    op: Operation,
    seed: u64,
    ops: usize,
    scale: &Scale,
) -> Outcome {
    let mut out = Outcome::default();
    let faults = format!(
        "seed={seed}{}{spec}",
        if spec.is_empty() { "" } else { ";" }
    );
    // Target-side notification faults act in the target's engine; everything else in the
    // initiator's.
    let at_target = spec.contains("notify.at=receiver");
    let init = engine(transport, (!at_target).then_some(faults.as_str())).await;
    let target_faults = at_target.then_some(faults.as_str());
    let (target, staged) = if matches!(transport, "tcp" | "ucx") {
        let (target, comm) = staging_engine(transport, target_faults).await;
        let mem = RocmMemory::with_library(hip_shim(), 0).expect("open the HIP ABI shim");
        let buf = mem.alloc(LEN).expect("a device region of the shim");
        // SAFETY: `buf` is kept in the pair until its engines are finalized.
        unsafe {
            target.register_device_mem(
                MemDesc {
                    addr: buf.region().addr,
                    len: LEN,
                },
                AnyMemory::new(mem.clone()),
            )
        }
        .expect("register the device region");
        (target, Some(Staged { comm, mem, buf }))
    } else {
        (engine(transport, target_faults).await, None)
    };
    let mut p = Pair {
        init,
        target,
        mine: vec![1u8; LEN],
        theirs: vec![2u8; LEN],
        kv: None,
        staged,
    };
    register(&p.init, &mut p.mine);
    register(&p.target, &mut p.theirs);
    if matches!(op, Operation::KvPull | Operation::KvPush) {
        p.kv = Some(KvPair::new(&p.init, &p.target).await);
        // The KV API connects by linking the cluster.
        if !reconnect(&p, Ended::PeerLost, &mut out).await {
            return out;
        }
    } else if !connect(&p, &mut out).await {
        return out;
    }
    let mut completed_rounds = Vec::new();
    let mut failed_since_success = false;
    // The warm-up: the first tenth of the operations, under the same faults.
    let warm_up = (ops / 10).max(1);
    let mut rss_before = resident();
    for round in 0..ops {
        if round == warm_up {
            rss_before = resident();
        }
        p.mine.fill(round as u8);
        let ended = run_op(&p, op, round, &mut out).await;
        if ended == Ended::Completed {
            out.ok += 1;
            failed_since_success = false;
            completed_rounds.push(round);
        } else {
            out.failed += 1;
            failed_since_success = true;
            canaries_hold(&mut p, op, round, scale.settle, &mut out).await;
            if !reconnect(&p, ended, &mut out).await {
                break;
            }
        }
    }
    out.rss_growth = resident() as i64 - rss_before as i64;
    if out.rss_growth > RSS_BOUND as i64 {
        out.problems.push(format!(
            "resident memory grew by {} KiB over operations {warm_up}..{ops} (bound {} KiB)",
            out.rss_growth >> 10,
            RSS_BOUND >> 10
        ));
    }
    // Recovery: once the faults stop (or chance spares one), an operation succeeds.
    if failed_since_success {
        let mut recovered = false;
        for round in ops..ops + 50 {
            let ended = run_op(&p, op, round, &mut out).await;
            if ended == Ended::Completed {
                recovered = true;
                completed_rounds.push(round);
                break;
            }
            if !reconnect(&p, ended, &mut out).await {
                break;
            }
        }
        if !recovered {
            out.problems
                .push("no operation succeeded after the faults".into());
        }
    }
    if op == Operation::PostWithNotification {
        tokio::time::sleep(Duration::from_millis(800)).await;
        check_notifications(&p, &completed_rounds, &mut out);
    }
    if let Some(st) = &p.staged {
        staging_returned(st, staged_round(&p, op, 1), &mut out).await;
    }
    p.init.finalize().await;
    p.target.finalize().await;
    out
}

/// Every bounce chunk the target leased is back within [`LEAK_WAIT`] of the case's last
/// operation; with `used`, some bytes went through them.
async fn staging_returned(st: &Staged, used: bool, out: &mut Outcome) {
    let start = Instant::now();
    loop {
        let (held, bytes) = st.stats();
        out.staged_bytes = bytes;
        if held == 0 {
            break;
        }
        if start.elapsed() > LEAK_WAIT {
            out.problems.push(format!(
                "{LEAK_WAIT:?} after the last operation the target still leases {held} staging chunk(s)"
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if used && out.staged_bytes == 0 {
        out.problems
            .push("the target's device region was never moved through its bounce chunks".into());
    }
}

/// Each completed round's notification seen exactly once, as a success; no other round's
/// seen as a success.
fn check_notifications(p: &Pair, completed: &[usize], out: &mut Outcome) {
    let mut seen: HashMap<usize, (usize, usize)> = HashMap::new();
    for n in p.target.get_notifies() {
        let round: usize = String::from_utf8_lossy(&n.msg)
            .parse()
            .unwrap_or(usize::MAX);
        let e = seen.entry(round).or_default();
        if n.failed.is_none() {
            e.0 += 1;
        } else {
            e.1 += 1;
        }
    }
    for (round, (ok, failed)) in &seen {
        let done = completed.contains(round);
        if done && (*ok != 1 || *failed != 0) {
            out.problems.push(format!(
                "completed round {round}: {ok} notification(s) and {failed} failure notice(s)"
            ));
        }
        if !done && (*ok != 0 || *failed > 1) {
            out.problems.push(format!(
                "failed round {round}: {ok} success notification(s), {failed} failure notice(s)"
            ));
        }
    }
    for round in completed {
        if !seen.contains_key(round) {
            out.problems
                .push(format!("completed round {round}: no notification"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_matrix() {
    let _one = ONE_AT_A_TIME.lock().await;
    let scale = scale();
    let mut table = format!(
        "operations a case: {} ({} seed(s)); leak cases: {} ({} fault kinds, seed 1)\n\n\
         | transport | fault | operation | seed | ops | ok | failed | connects failed | worst past deadline | RSS growth KiB | staged KiB | verdict |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
        scale.ops,
        scale.seeds.len(),
        scale.leak_ops,
        scale.leak_faults.len()
    );
    let run_start = Instant::now();
    // `HMC_CHAOS_ONLY=TEXT`: only the cases whose "fault / operation" contains TEXT.
    let only = std::env::var("HMC_CHAOS_ONLY").ok();
    let mut json = String::from("[");
    let mut red = Vec::new();
    // Warm-up: the first engines of the process start runtimes and threads that stay.
    let warm = engine("tcp", None).await;
    warm.finalize().await;
    // Each transport's leak cases, then its fault x operation x seed cases.
    let groups: [(Faults, &[u64], usize); 2] = [
        (scale.leak_faults, &[1], scale.leak_ops),
        (FAULTS, scale.seeds, scale.ops),
    ];
    for transport in &scale.transports {
        for (faults, seeds, ops) in groups {
            for (fault, spec) in faults {
                for op in OPERATIONS {
                    for seed in seeds {
                        let case = format!("{fault} / {}", op.name());
                        if only.as_ref().is_some_and(|o| !case.contains(o.as_str())) {
                            continue;
                        }
                        let (fds, threads_before) = (open_fds(), threads());
                        let case_start = Instant::now();
                        let mut out = run_case(transport, spec, *op, *seed, ops, &scale).await;
                        // Finalized engines give back their sockets and threads; some wind
                        // down in the background (UCX drains a worker for up to 1 s), so wait
                        // for the counts to come back, within a bound.
                        let start = Instant::now();
                        loop {
                            let (fds_after, threads_after) = (open_fds(), threads());
                            if fds_after <= fds + 4 && threads_after <= threads_before + 8 {
                                break;
                            }
                            if start.elapsed() > LEAK_WAIT {
                                out.problems.push(format!(
                                "{LEAK_WAIT:?} after the engines were finalized: file descriptors {fds} -> {fds_after}, threads {threads_before} -> {threads_after}"
                            ));
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        let verdict = if out.problems.is_empty() {
                            "green".to_string()
                        } else {
                            red.push(format!(
                                "{transport} / {fault} / {} / seed {seed}: {}",
                                op.name(),
                                out.problems.join("; ")
                            ));
                            format!("RED: {}", out.problems.join("; "))
                        };
                        let row = format!(
                            "| {transport} | {fault} | {} | {seed} | {ops} | {} | {} | {} | {:?} | {} | {} | {verdict} |",
                            op.name(),
                            out.ok,
                            out.failed,
                            out.connects_failed,
                            out.worst_late,
                            out.rss_growth >> 10,
                            out.staged_bytes >> 10
                        );
                        // Progress, for runs of many minutes.
                        eprintln!(
                            "chaos {:>6.1}s (case {:.2}s) {row}",
                            run_start.elapsed().as_secs_f64(),
                            case_start.elapsed().as_secs_f64()
                        );
                        let _ = writeln!(table, "{row}");
                        let _ = write!(
                            json,
                            "{}{{\"transport\":\"{transport}\",\"fault\":\"{fault}\",\"spec\":\"{spec}\",\"operation\":\"{}\",\"seed\":{seed},\"ops\":{ops},\"ok\":{},\"failed\":{},\"connects_failed\":{},\"worst_past_deadline_ms\":{:.1},\"rss_growth_bytes\":{},\"staged_bytes\":{},\"seconds\":{:.2},\"green\":{},\"problems\":{:?}}}",
                            if json.len() > 1 { "," } else { "" },
                            op.name(),
                            out.ok,
                            out.failed,
                            out.connects_failed,
                            out.worst_late.as_secs_f64() * 1e3,
                            out.rss_growth,
                            out.staged_bytes,
                            case_start.elapsed().as_secs_f64(),
                            out.problems.is_empty(),
                            out.problems
                        );
                    }
                }
            }
        }
    }
    json.push(']');
    println!("{table}");
    if let Ok(path) = std::env::var("HMC_CHAOS_JSON") {
        std::fs::write(&path, &json).expect("write the chaos JSON");
    }
    assert!(red.is_empty(), "red cases:\n{}", red.join("\n"));
}

/// Bytes of the large WRITE the terminal-state check abandons mid-way.
const BIG: usize = 32 << 20;

/// A large WRITE abandoned mid-way (released, or ended by its deadline), many times: once
/// `release` or the failed wait returns, canaries written at the target stay there, so no
/// byte of it lands after its terminal state. On every transport by default
/// (`HMC_CHAOS_TRANSPORTS` picks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_write_lands_nothing_after_its_end() {
    let _one = ONE_AT_A_TIME.lock().await;
    let scale = scale();
    let rounds = if scale.ops > 100 { 50 } else { 8 };
    let transports = match std::env::var("HMC_CHAOS_TRANSPORTS") {
        Ok(_) => scale.transports.clone(),
        Err(_) => ALL_TRANSPORTS.to_vec(),
    };
    for transport in &transports {
        let init = engine(transport, None).await;
        let target = engine(transport, None).await;
        let mut src = vec![7u8; BIG];
        let mut dst = vec![0u8; BIG];
        register(&init, &mut src);
        register(&target, &mut dst);
        let peer = target.name().to_string();
        init.connect(&peer, OP_TIMEOUT * 4).await.unwrap();
        let local = init
            .prepare_local(&[hmc_engine::BlockDesc::block(src.as_ptr() as u64, BIG)])
            .unwrap();
        let remote = init
            .prepare_remote(
                &peer,
                &[hmc_engine::BlockDesc::block(dst.as_ptr() as u64, BIG)],
                OP_TIMEOUT * 4,
            )
            .await
            .unwrap();
        let mut landed_late = Vec::new();
        for round in 0..rounds {
            let released = round % 2 == 0;
            let x = init
                .make_transfer(TransferOp::Write, &local, &[0], &remote, &[0], None)
                .unwrap();
            x.post().unwrap();
            // Into the transfer, by a varying amount.
            tokio::time::sleep(Duration::from_micros(200 + 300 * round as u64)).await;
            if released {
                x.release().await;
            } else {
                // The sync path's deadline ends it instead.
                let r = init
                    .transfer(
                        &peer,
                        TransferOp::Write,
                        &[TransferOpDesc {
                            local_addr: src.as_ptr() as u64,
                            remote_addr: dst.as_ptr() as u64,
                            len: BIG,
                        }],
                        Duration::from_micros(500 + 100 * round as u64),
                    )
                    .await;
                x.release().await;
                if r.is_ok() {
                    continue;
                }
            }
            dst.fill(CANARY);
            tokio::time::sleep(scale.settle * 3).await;
            if let Some(at) = dst.iter().position(|&b| b != CANARY) {
                landed_late.push(format!(
                    "round {round} ({}): byte {at} of {BIG}",
                    if released { "released" } else { "deadline" }
                ));
            }
        }
        init.finalize().await;
        target.finalize().await;
        assert!(
            landed_late.is_empty(),
            "{transport}: bytes landed after the end: {landed_late:?}"
        );
    }
}
