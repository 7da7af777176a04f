//! Two real processes: this test binary runs itself as the peer (`HMC_SHM_CHILD=1`), which
//! registers 64 MiB and prints its address and descriptor. The parent reads and writes all
//! of it with checksums, survives the peer being killed mid-transfer, and runs 1,000
//! connect/transfer/disconnect cycles with a flat fd count.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_backend_cpu::HostMemory;
use hmc_core::testing::pattern;
use hmc_core::{
    Access, Communicator, ConnBuffer, Deadline, Error, MemSpan, MemSpanMut, Op, PeerAddr,
    RegisteredBuffer, RemoteRegion, TransferDesc,
};
use hmc_transport_shm::{ShmCommunicator, ShmConfig};

const LEN: usize = 64 << 20;

fn checksum(b: &[u8]) -> u64 {
    b.chunks(8).fold(0xcbf2_9ce4_8422_2325u64, |h, c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        (h ^ u64::from_le_bytes(w))
            .wrapping_mul(0x100_0000_01b3)
            .rotate_left(5)
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The peer process: registers `LEN` bytes of `pattern(5)`, prints `READY <addr> <desc>`,
/// answers `check` with `SUM <checksum>`, exits at end of input.
#[test]
fn child_peer() {
    if std::env::var_os("HMC_SHM_CHILD").is_none() {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let comm = Arc::new(ShmCommunicator::bind(ShmConfig::default()).unwrap());
    let buf = RegisteredBuffer::new(
        Arc::new(HostMemory::new()),
        comm.clone(),
        LEN,
        Access::READ_WRITE,
    )
    .unwrap();
    buf.write_at(0, &MemSpan::host(&pattern(5, LEN))).unwrap();
    println!(
        "READY {} {}",
        comm.address(),
        hex(&buf.export().unwrap().encode())
    );
    for line in std::io::stdin().lines() {
        if line.unwrap().trim() == "check" {
            let mut out = vec![0u8; LEN];
            buf.read_at(0, &mut MemSpanMut::host(&mut out)).unwrap();
            println!("SUM {}", checksum(&out));
        }
    }
}

struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    addr: PeerAddr,
    desc: RemoteRegion,
}

impl Peer {
    fn spawn() -> Peer {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["child_peer", "--exact", "--nocapture", "--test-threads=1"])
            .env("HMC_SHM_CHILD", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let (addr, desc) = loop {
            let mut line = String::new();
            assert!(
                stdout.read_line(&mut line).unwrap() > 0,
                "peer exited before READY"
            );
            // libtest prints "test child_peer ... " on the same line before the output.
            if let Some((_, rest)) = line.trim().split_once("READY ") {
                let (a, d) = rest.split_once(' ').unwrap();
                break (a.parse().unwrap(), RemoteRegion::decode(&unhex(d)).unwrap());
            }
        };
        Peer {
            child,
            stdin,
            stdout,
            addr,
            desc,
        }
    }

    fn sum(&mut self) -> u64 {
        writeln!(self.stdin, "check").unwrap();
        loop {
            let mut line = String::new();
            assert!(self.stdout.read_line(&mut line).unwrap() > 0, "peer exited");
            if let Some(s) = line.trim().strip_prefix("SUM ") {
                return s.parse().unwrap();
            }
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn local(comm: &Arc<ShmCommunicator>) -> RegisteredBuffer<HostMemory, ShmCommunicator> {
    RegisteredBuffer::new(
        Arc::new(HostMemory::new()),
        comm.clone(),
        LEN,
        Access::READ_WRITE,
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_mib_each_way_between_two_processes() {
    let mut peer = Peer::spawn();
    let me = Arc::new(ShmCommunicator::bind(ShmConfig::default()).unwrap());
    let ep = me
        .connect(&peer.addr, Deadline::after(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(ep.peer_pid() as u32, peer.child.id());
    let key = me.import(&ep, &peer.desc).unwrap();
    let buf = local(&me);
    let d = [TransferDesc {
        local: buf.registration(),
        local_offset: 0,
        remote: &key,
        remote_offset: 0,
        len: LEN,
    }];
    let deadline = || Deadline::after(Duration::from_secs(20));
    me.transfer(&ep, Op::Read, &d, deadline()).await.unwrap();
    let mut got = vec![0u8; LEN];
    buf.read_at(0, &mut MemSpanMut::host(&mut got)).unwrap();
    assert_eq!(
        checksum(&got),
        checksum(&pattern(5, LEN)),
        "read 64 MiB from the peer"
    );
    let mine = pattern(7, LEN);
    buf.write_at(0, &MemSpan::host(&mine)).unwrap();
    me.transfer(&ep, Op::Write, &d, deadline()).await.unwrap();
    assert_eq!(peer.sum(), checksum(&mine), "wrote 64 MiB into the peer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_killed_mid_transfer_fails_the_transfer_before_the_deadline() {
    let mut peer = Peer::spawn();
    let me = Arc::new(
        ShmCommunicator::bind(ShmConfig {
            chunk_len: 1 << 20,
            ..ShmConfig::default()
        })
        .unwrap(),
    );
    let ep = me
        .connect(&peer.addr, Deadline::after(Duration::from_secs(5)))
        .await
        .unwrap();
    let key = me.import(&ep, &peer.desc).unwrap();
    let buf = local(&me);
    let d = [TransferDesc {
        local: buf.registration(),
        local_offset: 0,
        remote: &key,
        remote_offset: 0,
        len: LEN,
    }];
    let limit = Duration::from_secs(15);
    let start = Instant::now();
    let transfers = async {
        loop {
            if let Err(e) = me
                .transfer(&ep, Op::Write, &d, Deadline::after(limit))
                .await
            {
                return e;
            }
        }
    };
    let killer = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        peer.child.kill().unwrap();
    };
    let (err, ()) = tokio::join!(transfers, killer);
    assert!(
        matches!(err, Error::Peer { .. }),
        "peer loss must be a Peer error: {err}"
    );
    assert!(start.elapsed() < limit);
    let again = me
        .transfer(&ep, Op::Read, &d, Deadline::after(Duration::from_secs(5)))
        .await;
    assert!(again.is_err(), "a dead endpoint must fail");
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_connect_transfer_disconnect_cycles_keep_the_fd_count_flat() {
    let (a, b) = (
        Arc::new(ShmCommunicator::bind(ShmConfig::default()).unwrap()),
        Arc::new(ShmCommunicator::bind(ShmConfig::default()).unwrap()),
    );
    let mem = Arc::new(HostMemory::new());
    let target = RegisteredBuffer::new(mem.clone(), b.clone(), 4096, Access::READ_WRITE).unwrap();
    let src = RegisteredBuffer::new(mem, a.clone(), 4096, Access::READ_WRITE).unwrap();
    let desc = target.export().unwrap();
    let cycle = || async {
        let ep = a
            .connect(&b.address(), Deadline::after(Duration::from_secs(5)))
            .await
            .unwrap();
        let key = a.import(&ep, &desc).unwrap();
        let d = [TransferDesc {
            local: src.registration(),
            local_offset: 0,
            remote: &key,
            remote_offset: 0,
            len: 4096,
        }];
        a.transfer(&ep, Op::Write, &d, Deadline::after(Duration::from_secs(5)))
            .await
            .unwrap();
    };
    for _ in 0..10 {
        cycle().await;
    }
    let settle = |want: usize| async move {
        let until = Instant::now() + Duration::from_secs(3);
        loop {
            let n = open_fds();
            if n <= want || Instant::now() > until {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let before = settle(0).await;
    let start = Instant::now();
    for _ in 0..1000 {
        cycle().await;
    }
    let after = settle(before).await;
    assert!(after <= before, "fds grew from {before} to {after}");
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(
        b.outstanding_leases(),
        0,
        "closed connections released their leases"
    );
}
