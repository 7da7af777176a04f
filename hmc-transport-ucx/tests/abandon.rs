//! A WRITE abandoned at a stopped target (SIGSTOP) never lands once the target runs again,
//! and the next WRITE over the same endpoint and key works without connecting again.
//!
//! The target is a child process (this binary, `child_target`), driven over its stdin and
//! stdout: it serves one region filled with a canary and answers `check` with how many of
//! its bytes are not the canary and `fill` by writing the canary again.

use std::io::{BufRead, BufReader, Lines, Write};
use std::process::{ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_backend_cpu::HostMemory;
use hmc_core::{
    Access, Communicator, ConnBuffer, Deadline, MemSpan, MemSpanMut, Op, PeerAddr,
    RegisteredBuffer, RemoteRegion,
};
use hmc_transport_ucx::{UcxCommunicator, UcxConfig};
mod common;
use common::{desc, hex, unhex};
use rstest::rstest;

const CHILD_ENV: &str = "HMC_UCX_TEST_ABANDON_TLS";
const LEN: usize = 1 << 20;
const CANARY: u8 = 0x5A;
const PATTERN: u8 = 0xC3;
/// The initiator's drain limit in this test: how long a failed WRITE waits for its flush
/// before the endpoint's generation is abandoned (short, so that the test is quick).
const DRAIN: Duration = Duration::from_secs(2);
/// How long after the target runs again a late byte would have landed, were it to.
const LATE_WAIT: Duration = Duration::from_millis(500);

fn config(tls: &str) -> UcxConfig {
    UcxConfig {
        drain_timeout: DRAIN,
        ..UcxConfig::with_tls(tls)
    }
}

/// Not a test of its own: the body of the target process. Serves a `LEN`-byte region
/// holding the canary and answers the parent's commands until told to exit (or orphaned).
#[test]
fn child_target() {
    let Ok(tls) = std::env::var(CHILD_ENV) else {
        return;
    };
    let c = Arc::new(UcxCommunicator::new(config(&tls)).expect("UCX available"));
    let mut mem = vec![CANARY; LEN].into_boxed_slice();
    let region = hmc_core::Region {
        device: hmc_core::Device::HOST,
        addr: mem.as_mut_ptr() as u64,
        len: LEN,
    };
    // SAFETY: `mem` outlives the registration (dropped at the end of this function first).
    let reg = unsafe { c.register(region, Access::READ_WRITE) }.expect("register");
    println!(
        "READY {} {}",
        c.address(),
        hex(&c.export(&reg).expect("export").encode())
    );
    let parent = std::os::unix::process::parent_id();
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let p = mem.as_mut_ptr();
        match line.trim() {
            "check" => {
                // SAFETY: reading our own registered buffer; peers' writes race like DMA,
                // and the parent asks only when none should be running.
                let bytes = unsafe { std::slice::from_raw_parts(p, LEN) };
                let off = bytes.iter().filter(|&&b| b != CANARY).count();
                let pat = bytes.iter().filter(|&&b| b == PATTERN).count();
                println!("CHECK {off} {pat}");
            }
            "fill" => {
                // SAFETY: as above; the parent asks only when no transfer is running.
                unsafe { std::ptr::write_bytes(p, CANARY, LEN) };
                println!("FILLED");
            }
            _ => break,
        }
        if std::os::unix::process::parent_id() != parent {
            break;
        }
    }
    drop(reg);
}

/// The target process: SIGCONTed (if stopped), killed and reaped however the test ends.
struct Target {
    child: std::process::Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Target {
    fn start(tls: &str) -> (Target, PeerAddr, RemoteRegion) {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "child_target", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, tls)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the target process");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut t = Target { child, lines };
        let ready = t.expect("READY ");
        let (addr, d) = ready.split_once(' ').expect("address and descriptor");
        let remote = RemoteRegion::decode(&unhex(d)).expect("descriptor");
        (t, addr.parse().expect("address"), remote)
    }

    /// The rest of the first output line holding `prefix`.
    fn expect(&mut self, prefix: &str) -> String {
        loop {
            let line = self
                .lines
                .next()
                .expect("the target process exited")
                .expect("reading the target's output");
            // The harness may print "test child_target ... " on the same line first.
            if let Some(at) = line.find(prefix) {
                return line[at + prefix.len()..].to_string();
            }
        }
    }

    fn ask(&mut self, cmd: &str, answer: &str) -> String {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{cmd}").expect("write to the target");
        stdin.flush().expect("flush");
        self.expect(answer)
    }

    /// (bytes that are not the canary, bytes that are the WRITE's pattern) at the target.
    fn check(&mut self) -> (usize, usize) {
        let r = self.ask("check", "CHECK ");
        let (a, b) = r.split_once(' ').expect("two counts");
        (a.parse().expect("count"), b.parse().expect("count"))
    }

    /// Stops the target and waits until every thread of it is stopped, so that none is
    /// still taking in what is sent next.
    fn stop(&self) {
        self.signal(libc::SIGSTOP);
        let until = Instant::now() + Duration::from_secs(10);
        let tasks = format!("/proc/{}/task", self.child.id());
        loop {
            let stopped = std::fs::read_dir(&tasks)
                .expect("the target's threads")
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("stat")).ok())
                .all(|stat| {
                    // The state follows the command name's closing parenthesis.
                    let state = stat.rsplit_once(')').map(|(_, r)| r.trim_start());
                    state.is_some_and(|r| r.starts_with('T') || r.starts_with('t'))
                });
            if stopped {
                return;
            }
            assert!(Instant::now() < until, "the target did not stop");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child process, which we have not reaped yet.
        let r = unsafe { libc::kill(self.child.id() as i32, sig) };
        assert_eq!(r, 0, "kill({sig})");
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Aborts the test binary, rather than hanging CI, if a test runs past `limit`.
fn watchdog(name: &'static str, limit: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        eprintln!("{name}: still running after {limit:?}; aborting the test binary");
        std::process::abort();
    });
}

/// The canary of the local READ destination.
const LOCAL_CANARY: u8 = 0x11;

#[rstest]
#[case::tcp("tcp")]
#[case::shared_memory("sm,self")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_abandoned_at_a_stopped_target_never_lands_and_the_next_one_works(
    #[case] tls: &str,
) {
    watchdog(
        "a_write_abandoned_at_a_stopped_target",
        Duration::from_secs(120),
    );
    let (mut target, addr, remote) = Target::start(tls);
    let a = Arc::new(UcxCommunicator::new(config(tls)).expect("UCX available"));
    let ep = a
        .connect(&addr, Deadline::after(Duration::from_secs(20)))
        .await
        .expect("connect");
    let key = a.import(&ep, &remote).expect("import");
    let buffer = || {
        RegisteredBuffer::new(
            Arc::new(HostMemory::new()),
            a.clone(),
            LEN,
            Access::READ_WRITE,
        )
        .expect("local buffer")
    };
    let (src, dst) = (buffer(), buffer());
    src.write_at(0, &MemSpan::host(&vec![PATTERN; LEN]))
        .expect("fill the source");
    let fill_dst = || {
        dst.write_at(0, &MemSpan::host(&vec![LOCAL_CANARY; LEN]))
            .expect("fill the READ's destination")
    };
    let dst_bytes = |b: u8| {
        let mut out = vec![0u8; LEN];
        dst.read_at(0, &mut MemSpanMut::host(&mut out))
            .expect("read the READ's destination");
        out.iter().filter(|&&x| x == b).count()
    };
    let transfer = |op: Op, limit: Duration| {
        let (a, ep, key) = (&a, &ep, &key);
        let local = if op == Op::Write { &src } else { &dst };
        async move {
            a.transfer(ep, op, &[desc(local, key, 0, LEN)], Deadline::after(limit))
                .await
        }
    };

    // The endpoint has moved bytes before the stop (a first WRITE wires UCX up).
    transfer(Op::Write, Duration::from_secs(20))
        .await
        .expect("a first WRITE");
    assert_eq!(target.check(), (LEN, LEN), "the first WRITE landed");
    target.ask("fill", "FILLED");
    fill_dst();

    // A WRITE and a READ at once to the stopped target: both end in error.
    target.stop();
    let t0 = Instant::now();
    let (w, r) = futures::join!(
        transfer(Op::Write, Duration::from_secs(1)),
        transfer(Op::Read, Duration::from_secs(1))
    );
    let took = t0.elapsed();
    assert!(w.is_err(), "a WRITE to a stopped target completed: {w:?}");
    assert!(r.is_err(), "a READ from a stopped target completed: {r:?}");
    assert!(
        took < Duration::from_secs(1) + DRAIN + Duration::from_secs(10),
        "the abandoned transfers ended after {took:?}"
    );
    target.signal(libc::SIGCONT);
    std::thread::sleep(LATE_WAIT);
    let (off, _) = target.check();
    assert_eq!(
        off, 0,
        "{off} bytes of a WRITE that ended {w:?} landed after the target ran again"
    );
    assert_eq!(
        dst_bytes(LOCAL_CANARY),
        LEN,
        "bytes of a READ that ended {r:?} landed here"
    );

    // The same endpoint and key, without connecting or importing again.
    transfer(Op::Write, Duration::from_secs(20))
        .await
        .expect("the next WRITE over the same endpoint and key");
    assert_eq!(
        target.check(),
        (LEN, LEN),
        "the next WRITE moved every byte"
    );
    transfer(Op::Read, Duration::from_secs(20))
        .await
        .expect("the next READ over the same endpoint and key");
    assert_eq!(dst_bytes(PATTERN), LEN, "the next READ moved every byte");
}
