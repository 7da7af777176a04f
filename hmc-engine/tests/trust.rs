//! The engine's trust boundaries, tried as a hostile peer would: read-only memory stays
//! read-only whatever a peer's descriptor claims, unmapped memory is refused at
//! registration, notifications are bounded in count and bytes and say who really sent
//! them, and a peer without the shared secret (or of another user) learns nothing.

use std::sync::Arc;
use std::time::Duration;

use hmc_core::{Access, AnyCommunicator, Communicator, Deadline, Op, RemoteRegion, TransferDesc};
use hmc_engine::{Engine, EngineConfig, EngineError, MemDesc, MemType, TransferOp, TransferOpDesc};
use rstest::rstest;
use serde::{Deserialize, Serialize};

const T: Duration = Duration::from_secs(10);

/// The engine's metadata request and answer, as a peer that is not an engine writes them.
#[derive(Serialize)]
struct Hello {
    version: u32,
    from: String,
}

#[derive(Deserialize)]
struct EngineInfo {
    _version: u32,
    _instance: u64,
    data_plane: String,
    _generation: u64,
    regions: Vec<Vec<u8>>,
}

const METHOD_INFO: u32 = 0x454E_0001;
const METHOD_NOTIFY: u32 = 0x454E_0002;

#[derive(Serialize)]
struct NotifyMsg {
    from: String,
    name: String,
    msg: Vec<u8>,
}

/// A page-aligned anonymous mapping of `len` bytes filled with `fill`, then made read-only.
struct ReadOnlyPages {
    ptr: *mut u8,
    len: usize,
}

impl ReadOnlyPages {
    fn new(len: usize, fill: u8) -> Self {
        // SAFETY: a fresh private anonymous mapping; checked for MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        // SAFETY: the mapping is `len` writable bytes; then it loses its write right.
        unsafe {
            std::ptr::write_bytes(ptr as *mut u8, fill, len);
            assert_eq!(libc::mprotect(ptr, len, libc::PROT_READ), 0);
        }
        ReadOnlyPages {
            ptr: ptr as *mut u8,
            len,
        }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping stays readable for `len` bytes until drop.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn desc(&self) -> MemDesc {
        MemDesc {
            addr: self.ptr as u64,
            len: self.len,
        }
    }
}

impl Drop for ReadOnlyPages {
    fn drop(&mut self) {
        // SAFETY: unmapping what `new` mapped, once.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

fn transport(name: &str) -> AnyCommunicator {
    hmc_engine::open_transport(name.parse().unwrap(), [127, 0, 0, 1].into()).unwrap()
}

async fn engine_over(name: &str, config: EngineConfig) -> Engine<AnyCommunicator> {
    Engine::initialize(Arc::new(transport(name)), "127.0.0.1", config)
        .await
        .unwrap()
}

/// What a peer that is not an engine gets from the metadata service: the data plane and
/// every region descriptor.
async fn fetch_info(engine: &str) -> Result<EngineInfo, hmc_rpc::CallError> {
    let addr: hmc_core::PeerAddr = engine.parse().unwrap();
    let rpc = hmc_rpc::Client::connect(&addr, hmc_rpc::ClientConfig::default()).await?;
    rpc.call_typed(
        METHOD_INFO,
        &Hello {
            version: 1,
            from: "intruder".into(),
        },
    )
    .await
}

/// A peer that skips the engine's checks writes 16 bytes into memory registered read-only,
/// with the descriptor's access bits forged to READ | WRITE: the target's transport refuses
/// it (before a byte moves, and without faulting), on every transport that can tell.
#[rstest]
#[case::tcp("tcp")]
#[case::shm("shm")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_write_to_read_only_memory_is_refused_by_the_target(#[case] name: &str) {
    let target = engine_over(name, EngineConfig::default()).await;
    let ro = ReadOnlyPages::new(1 << 16, 0x5a);
    // SAFETY: the pages outlive the engine (dropped at the end of the test, after it).
    unsafe { target.register_mem(ro.desc(), MemType::Host, Access::READ) }.unwrap();
    let info = fetch_info(target.name()).await.unwrap();
    let mut region = RemoteRegion::decode(&info.regions[0]).unwrap();
    assert_eq!(region.access, Access::READ, "exported as registered");
    region.access = Access::READ_WRITE;
    let intruder = transport(name);
    let ep = intruder
        .connect(&info.data_plane.parse().unwrap(), Deadline::after(T))
        .await
        .unwrap();
    let key = intruder.import(&ep, &region).unwrap();
    let src = vec![0xffu8; 16];
    // SAFETY: `src` outlives its registration (dropped at the end of this scope).
    let local = unsafe {
        intruder.register(
            hmc_core::Region {
                device: hmc_core::Device::HOST,
                addr: src.as_ptr() as u64,
                len: src.len(),
            },
            Access::READ,
        )
    }
    .unwrap();
    let batch = [TransferDesc::new(&local, 0, &key, 0, 16)];
    let e = intruder
        .transfer(&ep, Op::Write, &batch, Deadline::after(T))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            hmc_core::Error::AccessDenied(_) | hmc_core::Error::InvalidKey(_)
        ),
        "{e}"
    );
    assert!(ro.bytes().iter().all(|b| *b == 0x5a), "not a byte changed");
    // The target is alive and still serves READs of it.
    let dst = vec![0u8; 16];
    // SAFETY: as above.
    let local = unsafe {
        intruder.register(
            hmc_core::Region {
                device: hmc_core::Device::HOST,
                addr: dst.as_ptr() as u64,
                len: dst.len(),
            },
            Access::WRITE,
        )
    }
    .unwrap();
    let batch = [TransferDesc::new(&local, 0, &key, 0, 16)];
    intruder
        .transfer(&ep, Op::Read, &batch, Deadline::after(T))
        .await
        .unwrap();
    assert_eq!(dst, vec![0x5a; 16]);
    drop(target);
}

/// An engine refuses its own WRITE to a peer's read-only region and its own READ into a
/// local read-only one, naming the access, before any byte moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_refuse_writes_into_read_only_registrations_on_both_sides() {
    let a = engine_over("tcp", EngineConfig::default()).await;
    let b = engine_over("tcp", EngineConfig::default()).await;
    let ro = ReadOnlyPages::new(4096, 3);
    let rw = vec![9u8; 4096];
    // SAFETY: both outlive the engines.
    unsafe {
        b.register_mem(ro.desc(), MemType::Host, Access::READ)
            .unwrap();
        a.register_mem(
            MemDesc {
                addr: rw.as_ptr() as u64,
                len: rw.len(),
            },
            MemType::Host,
            Access::READ_WRITE,
        )
        .unwrap();
    }
    a.connect(b.name(), T).await.unwrap();
    let d = TransferOpDesc {
        local_addr: rw.as_ptr() as u64,
        remote_addr: ro.ptr as u64,
        len: 16,
    };
    let e = a
        .transfer(b.name(), TransferOp::Write, &[d], T)
        .await
        .unwrap_err();
    assert!(
        matches!(e, EngineError::Transport(hmc_core::Error::AccessDenied(_))),
        "{e}"
    );
    assert!(ro.bytes().iter().all(|x| *x == 3));
    a.transfer(b.name(), TransferOp::Read, &[d], T)
        .await
        .unwrap();
    assert_eq!(&rw[..16], &[3u8; 16]);
    // The other way: b READs into its own read-only memory.
    b.connect(a.name(), T).await.unwrap();
    let back = TransferOpDesc {
        local_addr: ro.ptr as u64,
        remote_addr: rw.as_ptr() as u64,
        len: 16,
    };
    let e = b
        .transfer(a.name(), TransferOp::Read, &[back], T)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("read-only"), "{e}");
}

/// Registration checks the process's mappings: read-only pages cannot be registered
/// writable, and ranges with nothing mapped (the zero page, a made-up address, a range
/// running past its mapping) are refused instead of faulting later.
#[rstest]
#[case::zero_page(0, 4096)]
#[case::made_up(0x7fff_0000_0000, 4096)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmapped_memory_is_refused_at_registration(#[case] addr: u64, #[case] len: usize) {
    let e = engine_over("tcp", EngineConfig::default()).await;
    // SAFETY: refused before anything could touch it.
    let err =
        unsafe { e.register_mem(MemDesc { addr, len }, MemType::Host, Access::READ) }.unwrap_err();
    assert!(err.to_string().contains("not mapped"), "{err}");
    let ro = ReadOnlyPages::new(4096, 1);
    // SAFETY: refused (read-only pages asked for WRITE), or past the mapping's end.
    let err = unsafe { e.register_mem(ro.desc(), MemType::Host, Access::READ_WRITE) }.unwrap_err();
    assert!(err.to_string().contains("read-only"), "{err}");
    assert_eq!(
        hmc_engine::host_range_access(ro.ptr as u64, 4096).unwrap(),
        Access::READ
    );
}
