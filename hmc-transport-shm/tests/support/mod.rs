//! What the process tests share: descriptors as hex on a child's standard output, and a
//! peer process (this test binary run again as one of its tests) driven by lines on its
//! standard input. Each test binary uses a part of it.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;

use hmc_backend_cpu::HostMemory;
use hmc_core::RegisteredBuffer;
use hmc_core::testing::pattern;
use hmc_core::{
    Access, Communicator, DeviceBuffer, LocalRegistration, MemSpan, MemSpanMut, Memory, PeerAddr,
    RemoteRegion,
};
use hmc_transport_shm::{ShmCommunicator, ShmConfig};

/// `b` as lowercase hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The bytes of a hex string written by [`hex`].
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digits"))
        .collect()
}

/// A hash of `b` that any change to a byte changes: what peers answer to `check`.
pub fn checksum(b: &[u8]) -> u64 {
    b.chunks(8).fold(0xcbf2_9ce4_8422_2325u64, |h, c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        (h ^ u64::from_le_bytes(w))
            .wrapping_mul(0x100_0000_01b3)
            .rotate_left(5)
    })
}

/// A peer process: this test binary running its test `child_peer` with `env`, which
/// prints `READY <addr> <descriptor hex>` and then answers commands, one per line.
/// Killed when dropped.
pub struct Peer {
    pub child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub addr: PeerAddr,
    pub desc: RemoteRegion,
}

impl Peer {
    pub fn spawn(env: &[(&str, &OsStr)]) -> Peer {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["child_peer", "--exact", "--nocapture", "--test-threads=1"])
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let ready = answer(&mut stdout, "READY ");
        let (a, d) = ready.split_once(' ').unwrap();
        Peer {
            child,
            stdin,
            stdout,
            addr: a.parse().unwrap(),
            desc: RemoteRegion::decode(&unhex(d)).unwrap(),
        }
    }

    /// Sends `command`; the rest of the answer line after `prefix`.
    pub fn ask(&mut self, command: &str, prefix: &str) -> String {
        writeln!(self.stdin, "{command}").unwrap();
        answer(&mut self.stdout, prefix)
    }

    /// The peer's checksum of its registered memory (`check`, answered `SUM <n>`).
    pub fn sum(&mut self) -> u64 {
        self.ask("check", "SUM ").parse().unwrap()
    }
}

/// The rest of the peer's next output line that contains `prefix` (libtest may print its
/// "test child_peer ... " before the first one, on the same line).
fn answer(stdout: &mut BufReader<ChildStdout>, prefix: &str) -> String {
    loop {
        let mut line = String::new();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "the peer exited before answering {prefix:?}"
        );
        if let Some((_, rest)) = line.trim().split_once(prefix) {
            return rest.to_string();
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The runtime of a `child_peer` test when this process runs as the peer (`var` is set),
/// else `None`: then the test is the parent's own run of it and does nothing.
pub fn child_runtime(var: &str) -> Option<tokio::runtime::Runtime> {
    std::env::var_os(var)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    Some(rt)
}

/// Copies `data` into the memory of `reg` (registered host memory).
pub fn fill(reg: &impl LocalRegistration, data: &[u8]) {
    let r = reg.region();
    assert_eq!(r.len, data.len());
    // SAFETY: host memory the transport keeps mapped while `reg` lives; the tests touch it
    // only between transfers.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), r.addr as *mut u8, r.len) }
}

/// The bytes of `reg`'s memory.
pub fn contents(reg: &impl LocalRegistration) -> Vec<u8> {
    let r = reg.region();
    // SAFETY: as in `fill`.
    unsafe { std::slice::from_raw_parts(r.addr as *const u8, r.len) }.to_vec()
}

/// The peer of the device tests (inside a runtime): `len` bytes of `pattern(seed)` on
/// `mem`, registered by IPC with `register_device`; prints `READY <addr> <desc>`, then
/// answers `check` (`SUM <checksum>`), `rekey` (`DESC <desc>`) and `drop` (`DROPPED <leases
/// still outstanding>`, once the registration's drop returned); exits at end of input.
pub fn serve_device_peer<M: Memory + Clone>(mem: M, len: usize, seed: u64) {
    let comm = ShmCommunicator::bind(ShmConfig::default()).unwrap();
    // With HMC_SHM_DEVICE_SPAN set, the region peers reach is `len` bytes at that offset of
    // a larger allocation, registered as a region (`register_memory`), as a framework's
    // tensor inside a caching allocator's block is.
    let at: usize = std::env::var("HMC_SHM_DEVICE_SPAN").map_or(0, |v| v.parse().unwrap());
    let whole = mem.alloc(len + 2 * at).unwrap();
    let region = whole.region().slice(at, len).unwrap();
    // SAFETY: `region` lies in `whole`, borrowed mutably for the copy only.
    let mut span = unsafe { MemSpanMut::from_region(region) };
    mem.copy(&mut span, &MemSpan::host(&pattern(seed, len)))
        .unwrap();
    let mut reg = Some(if at == 0 {
        // SAFETY: `whole` outlives the registration (dropped first, below or at the end).
        unsafe { comm.register_device(&mem, &whole, Access::READ_WRITE) }.unwrap()
    } else {
        let any = hmc_core::AnyMemory::new(mem.clone());
        // SAFETY: as above; `region` is memory of `mem`'s device, inside `whole`.
        unsafe { comm.register_memory(region, Access::READ_WRITE, &any) }.unwrap()
    });
    let desc = |reg: &Option<_>| hex(&comm.export(reg.as_ref().unwrap()).unwrap().encode());
    println!("READY {} {}", comm.address(), desc(&reg));
    for line in std::io::stdin().lines() {
        match line.unwrap().trim() {
            "check" => {
                let mut out = vec![0u8; len];
                // SAFETY: `region` lies in `whole`, alive here.
                let src = unsafe { MemSpan::from_region(region) };
                mem.copy(&mut MemSpanMut::host(&mut out), &src).unwrap();
                println!("SUM {}", checksum(&out));
            }
            "rekey" => {
                assert!(comm.rekey(reg.as_ref().unwrap()).unwrap());
                println!("DESC {}", desc(&reg));
            }
            "drop" => {
                reg = None;
                println!("DROPPED {}", comm.outstanding_leases());
            }
            other => panic!("unknown command {other:?}"),
        }
    }
    drop(reg);
}

/// `len` bytes of host memory registered with `comm` for READ and WRITE.
pub fn host_buffer(
    comm: &Arc<ShmCommunicator>,
    len: usize,
) -> RegisteredBuffer<HostMemory, ShmCommunicator> {
    let memory = Arc::new(HostMemory::new());
    RegisteredBuffer::new(memory, comm.clone(), len, Access::READ_WRITE).unwrap()
}
