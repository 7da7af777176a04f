//! The process harness: a transport's peer binary in a child process, SIGKILLed or SIGSTOPped while a transfer to it runs, so peer death and a hung peer are tested for real, not modelled by `close()`.
//!
//! The peer binary's contract: started with the arguments the test gives, it registers a
//! region of at least the size the test needs for READ and WRITE, prints one line
//! `ADDRESS DESCRIPTOR_HEX` (its `PeerAddr` text and the region's encoded `RemoteRegion` in
//! hex) to stdout, and serves until killed. `cargo xtask new-backend` scaffolds one.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use super::*;
use crate::{PeerAddr, RemoteRegion};

/// A peer binary running in a child process; killed when dropped.
pub struct PeerProcess {
    child: Child,
    /// Where it listens.
    pub address: PeerAddr,
    /// The region it serves.
    pub region: RemoteRegion,
}

impl PeerProcess {
    /// Starts `cmd` and reads its `ADDRESS DESCRIPTOR_HEX` line.
    pub fn spawn(mut cmd: Command) -> PeerProcess {
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting the peer binary {cmd:?}: {e}"));
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("the peer's first line");
        let mut parts = line.split_whitespace();
        let (Some(addr), Some(hex)) = (parts.next(), parts.next()) else {
            let _ = child.kill();
            panic!("the peer printed `{line}`, not `ADDRESS DESCRIPTOR_HEX`");
        };
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("descriptor hex"))
            .collect();
        PeerProcess {
            address: addr.parse().expect("the peer's address"),
            region: RemoteRegion::decode(&bytes).expect("the peer's descriptor"),
            child,
        }
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (`KILL`, `STOP`, `CONT`) with kill(1).
    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{signal} {} failed", self.pid());
        if signal == "STOP" {
            self.wait_stopped();
        }
    }

    /// Waits (up to 5 s) until every thread of the peer is stopped: `kill` returns once the
    /// signal is queued, and a thread running on another CPU may still answer a request
    /// before it stops.
    fn wait_stopped(&self) {
        let task_dir = format!("/proc/{}/task", self.pid());
        let stopped = || {
            let Ok(tasks) = std::fs::read_dir(&task_dir) else {
                return false;
            };
            tasks.flatten().all(|t| {
                std::fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
                    // The state follows the parenthesised command name.
                    stat.rsplit_once(") ")
                        .is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
                })
            })
        };
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while !stopped() {
            assert!(
                std::time::Instant::now() < until,
                "peer {} did not stop within 5 s of SIGSTOP",
                self.pid()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Connects to `peer`, imports its region and registers a local buffer of `len` bytes.
async fn attach<C: Communicator, M: Memory>(
    comm: &Arc<C>,
    memory: Arc<M>,
    peer: &PeerProcess,
    len: usize,
) -> (C::Endpoint, C::RemoteKey, RegisteredBuffer<M, C>) {
    let ep = comm
        .connect(&peer.address, Deadline::default())
        .await
        .expect("connect to the peer process");
    let key = comm.import(&ep, &peer.region).expect("import");
    let local =
        RegisteredBuffer::new(memory, comm.clone(), len, Access::READ_WRITE).expect("register");
    (ep, key, local)
}

/// Repeated `len`-byte WRITEs and READs to `peer`'s region; the peer is SIGKILLed after
/// a few: the transfers end with an error (not `DeadlineExceeded`) before their deadline,
/// and a later transfer on the endpoint fails too.
pub async fn peer_killed_mid_transfer<C: Communicator, M: Memory>(
    comm: Arc<C>,
    memory: Arc<M>,
    peer: PeerProcess,
    len: usize,
) {
    let (ep, key, local) = attach(&comm, memory, &peer, len).await;
    let limit = Duration::from_secs(20);
    let start = Instant::now();
    let d = [TransferDesc::<C> {
        local: local.registration(),
        local_offset: 0,
        remote: &key,
        remote_offset: 0,
        len,
    }];
    let mut result = Ok(());
    for i in 0..10_000 {
        if i == 3 {
            peer.signal("KILL");
        }
        let op = if i % 2 == 0 { Op::Write } else { Op::Read };
        result = comm.transfer(&ep, op, &d, Deadline::after(limit)).await;
        if result.is_err() {
            break;
        }
    }
    let err = result.expect_err("transfers to a killed peer must fail");
    assert!(
        !matches!(err, Error::DeadlineExceeded { .. }),
        "a killed peer must be detected, not timed out: {err}"
    );
    assert!(start.elapsed() < limit, "the error came after the deadline");
    let again = comm
        .transfer(&ep, Op::Read, &d, Deadline::after(Duration::from_secs(5)))
        .await;
    assert!(again.is_err(), "a transfer to a killed peer must fail");
}

/// The peer is SIGSTOPped: a transfer to it ends with `DeadlineExceeded` by its deadline
/// (a stopped peer looks alive to the kernel); after SIGCONT the endpoint, or a new one,
/// moves bytes again.
pub async fn peer_stopped_mid_transfer<C: Communicator, M: Memory>(
    comm: Arc<C>,
    memory: Arc<M>,
    peer: PeerProcess,
    len: usize,
) {
    let (ep, key, local) = attach(&comm, memory, &peer, len).await;
    let d = [TransferDesc::<C> {
        local: local.registration(),
        local_offset: 0,
        remote: &key,
        remote_offset: 0,
        len,
    }];
    comm.transfer(&ep, Op::Write, &d, Deadline::default())
        .await
        .expect("a transfer before the stop");
    peer.signal("STOP");
    let limit = Duration::from_millis(500);
    let start = Instant::now();
    let r = comm
        .transfer(&ep, Op::Read, &d, Deadline::after(limit))
        .await;
    let waited = start.elapsed();
    peer.signal("CONT");
    assert!(
        matches!(r, Err(Error::DeadlineExceeded { .. })),
        "a stopped peer must time out: {r:?}"
    );
    assert!(
        waited < limit + Duration::from_secs(3),
        "the deadline overran by {:?}",
        waited - limit
    );
    // Resumed: the same endpoint, or a fresh one where the transport retired it.
    let again = comm.transfer(&ep, Op::Read, &d, Deadline::default()).await;
    if again.is_err() {
        let ep = comm
            .connect(&peer.address, Deadline::default())
            .await
            .expect("reconnect after SIGCONT");
        let key = comm.import(&ep, &peer.region).expect("import again");
        let d = [TransferDesc::<C> {
            local: local.registration(),
            local_offset: 0,
            remote: &key,
            remote_offset: 0,
            len,
        }];
        comm.transfer(&ep, Op::Read, &d, Deadline::default())
            .await
            .expect("a transfer after SIGCONT");
    }
}
