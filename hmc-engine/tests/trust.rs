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

mod common;

use common::wire::{
    EngineInfo, Hello, METHOD_INFO, METHOD_NOTIFY, NotifyAck, NotifyMsg, named_client,
};
use common::{comm_register, register_rw};

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
    if name == "rdma-standin" {
        return common::standin::rdma_standin();
    }
    hmc_engine::open_transport(name.parse().unwrap(), [127, 0, 0, 1].into()).unwrap()
}

async fn engine_over(name: &str, config: EngineConfig) -> Engine<AnyCommunicator> {
    common::engine_over(Arc::new(transport(name)), config).await
}

/// What a peer that is not an engine gets from the metadata service: the data plane and
/// every region descriptor.
async fn fetch_info(engine: &str) -> Result<EngineInfo, hmc_rpc::CallError> {
    let addr: hmc_core::PeerAddr = engine.parse().unwrap();
    let rpc = hmc_rpc::Client::connect(&addr, hmc_rpc::ClientConfig::default()).await?;
    rpc.call_typed(
        METHOD_INFO,
        &Hello {
            version: 3,
            from: "intruder".into(),
        },
    )
    .await
}

/// A peer that skips the engine's checks writes 16 bytes into memory registered read-only,
/// with the descriptor's access bits forged to READ | WRITE: over tcp and shm the target's
/// transport refuses it (before a byte moves, and without faulting); against the RDMA
/// stand-in the forged descriptor is refused earlier, by the initiator's import (it checks
/// descriptors against what the target exported), so the target's MR rights are not what
/// that case exercises. The genuine read-only key's WRITE is refused too.
#[rstest]
#[case::tcp("tcp")]
#[case::shm("shm")]
#[case::rdma_standin("rdma-standin")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_write_to_read_only_memory_is_refused_by_the_target(#[case] name: &str) {
    let target = engine_over(name, EngineConfig::default()).await;
    let ro = ReadOnlyPages::new(1 << 16, 0x5a);
    // SAFETY: the pages outlive the engine (dropped at the end of the test, after it).
    unsafe { target.register_mem(ro.desc(), MemType::Host, Access::READ) }.unwrap();
    let info = fetch_info(target.name()).await.unwrap();
    let genuine = RemoteRegion::decode(&info.regions[0]).unwrap();
    assert_eq!(genuine.access, Access::READ, "exported as registered");
    let mut region = genuine.clone();
    region.access = Access::READ_WRITE;
    let intruder = transport(name);
    let ep = intruder
        .connect(&info.data_plane.parse().unwrap(), Deadline::after(T))
        .await
        .unwrap();
    // RDMA's descriptors are integrity-checked: the forged one is refused at import.
    let forged = intruder.import(&ep, &region);
    if let Err(e) = &forged {
        assert!(matches!(e, hmc_core::Error::InvalidKey(_)), "{e}");
    }
    let src = [0xffu8; 16];
    // `src` outlives its registration (dropped at the end of this scope).
    let local = comm_register(&intruder, &src, Access::READ);
    // The genuine key, and the forged one where it was accepted: WRITEs through either
    // are refused by the target.
    let key = intruder.import(&ep, &genuine).unwrap();
    let keys: Vec<_> = [Some(key), forged.ok()].into_iter().flatten().collect();
    for key in &keys {
        let batch = [TransferDesc::new(&local, 0, key, 0, 16)];
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
    }
    assert!(ro.bytes().iter().all(|b| *b == 0x5a), "not a byte changed");
    let key = &keys[0];
    // The target is alive and still serves READs of it.
    let dst = vec![0u8; 16];
    // As above.
    let local = comm_register(&intruder, &dst, Access::WRITE);
    let batch = [TransferDesc::new(&local, 0, key, 0, 16)];
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
    unsafe { b.register_mem(ro.desc(), MemType::Host, Access::READ) }.unwrap();
    register_rw(&a, &rw);
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

fn secret(s: &str) -> Option<hmc_rpc::AuthSecret> {
    Some(hmc_rpc::AuthSecret::new(s.as_bytes().to_vec()).unwrap())
}

fn with_secret(s: Option<&str>) -> EngineConfig {
    EngineConfig {
        auth_secret: s.and_then(secret),
        ..EngineConfig::default()
    }
}

async fn engine_for(config: EngineConfig) -> Engine<AnyCommunicator> {
    Engine::initialize_with("127.0.0.1", config).await.unwrap()
}

/// With an `auth_secret`, an engine tells nothing to a peer without it: no region table
/// to a raw RPC client, no connection to an engine with none or another, and its TCP data
/// plane refuses a transport without the secret; an engine with the same secret connects
/// and moves bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_with_a_secret_serves_only_engines_that_hold_it() {
    let mut config = with_secret(Some("the-job-secret-0123"));
    config.transport = hmc_engine::EngineTransport::Tcp;
    let target = engine_for(config.clone()).await;
    let mem = vec![7u8; 4096];
    // `mem` outlives the engine.
    register_rw(&target, &mem);
    let e = fetch_info(target.name()).await.err().expect("refused");
    let e = e.to_string();
    assert!(
        e.contains("closed") || e.contains("reset") || e.contains("lost"),
        "{e}"
    );
    for other in [None, Some("another-secret-4567")] {
        let mut c = with_secret(other);
        c.transport = hmc_engine::EngineTransport::Tcp;
        let intruder = engine_for(c).await;
        let e = intruder
            .connect(target.name(), Duration::from_secs(3))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("auth_secret"), "{other:?}: {e}");
    }
    // The data plane: a TCP communicator without the secret is refused at its HELLO.
    let intruder = transport("tcp");
    let dp = target.communicator().address();
    let refused = intruder
        .connect(&dp, Deadline::after(Duration::from_secs(3)))
        .await;
    assert!(
        refused.is_err(),
        "a data-plane connection without the secret"
    );
    let friend = engine_for(config).await;
    friend.connect(target.name(), T).await.unwrap();
    let dst = vec![0u8; 4096];
    // `dst` outlives the engine.
    register_rw(&friend, &dst);
    let d = TransferOpDesc {
        local_addr: dst.as_ptr() as u64,
        remote_addr: mem.as_ptr() as u64,
        len: 4096,
    };
    friend
        .transfer(target.name(), TransferOp::Read, &[d], T)
        .await
        .unwrap();
    assert_eq!(dst, mem);
}

/// How many bytes a process running as `uid` gets back from `port` on loopback after
/// sending 64 bytes of garbage: 0 when the listener closes at once (refused before
/// reading), more when it answers (a GOAWAY, a HELLO refusal).
fn garbage_answered_as(uid: u32, port: u16) -> usize {
    use std::os::unix::process::CommandExt;
    let script = format!(
        "import socket\ns=socket.create_connection(('127.0.0.1',{port}))\ns.sendall(b'x'*64)\ns.settimeout(5)\nn=0\ntry:\n    while True:\n        b=s.recv(4096)\n        if not b: break\n        n+=len(b)\nexcept Exception: pass\nprint(n)"
    );
    let out = std::process::Command::new("python3")
        .args(["-c", &script])
        .uid(uid)
        .gid(uid)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

fn port_of(addr: &str) -> u16 {
    match addr.parse::<hmc_core::PeerAddr>().unwrap() {
        hmc_core::PeerAddr::Tcp(a) => a.port(),
        other => panic!("{other}"),
    }
}

/// Without a secret, the metadata service and the TCP data plane close at once on a
/// process of this host that runs as another user (root runs this test as uid 65534);
/// this process's own user gets answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_secret_another_local_user_is_refused() {
    if hmc_transport_kit::owner::euid() != 0 {
        eprintln!("skipped: needs root to run a client as another user");
        return;
    }
    let mut c = with_secret(None);
    c.transport = hmc_engine::EngineTransport::Tcp;
    let target = engine_for(c).await;
    let meta = port_of(target.name());
    let dp = port_of(&target.communicator().address().to_string());
    let (m, d, own) = tokio::task::spawn_blocking(move || {
        (
            garbage_answered_as(65534, meta),
            garbage_answered_as(65534, dp),
            garbage_answered_as(0, meta),
        )
    })
    .await
    .unwrap();
    assert_eq!((m, d), (0, 0), "refused before reading");
    assert!(
        own > 0,
        "the same user is answered (a GOAWAY for the garbage)"
    );
}

/// A notification's sender is the connection's peer as it named itself at its metadata
/// request (checked against the connection's IP), not what the message says; a connection
/// that never asked for the metadata cannot notify.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_s_sender_comes_from_its_connection() {
    let target = engine_over("tcp", EngineConfig::default()).await;
    let addr: hmc_core::PeerAddr = target.name().parse().unwrap();
    let rpc = hmc_rpc::Client::connect(&addr, hmc_rpc::ClientConfig::default())
        .await
        .unwrap();
    let spoof = NotifyMsg {
        from: "prefill-0".into(),
        name: "n".into(),
        msg: b"m".to_vec(),
        failed: None,
        id: (1, 1),
    };
    let e = rpc
        .call_typed::<_, NotifyAck>(METHOD_NOTIFY, &spoof)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("connect"), "{e}");
    // Claims an address on another host at its metadata request: named by its socket.
    let _: EngineInfo = rpc
        .call_typed(
            METHOD_INFO,
            &Hello {
                version: 3,
                from: "10.9.9.9:5000".into(),
            },
        )
        .await
        .unwrap();
    let ack: NotifyAck = rpc.call_typed(METHOD_NOTIFY, &spoof).await.unwrap();
    assert_eq!(ack, NotifyAck::Queued);
    let got = target.get_notifies();
    assert_eq!(got.len(), 1);
    assert!(
        got[0].from.starts_with("tcp://127.0.0.1:"),
        "{}",
        got[0].from
    );
    // An engine's notifications carry its own name.
    let a = engine_over("tcp", EngineConfig::default()).await;
    a.connect(target.name(), T).await.unwrap();
    a.send_notify(target.name(), "done", b"7", T).await.unwrap();
    let got = target.get_notifies();
    assert_eq!(got[0].from, a.name());
}

/// Every byte of a notification counts (a large `from` included), and queued ones are
/// bounded in bytes as well as in number; taking them frees the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_are_bounded_in_bytes() {
    let config = EngineConfig {
        max_notify_len: 16 << 10,
        max_pending_notify_bytes: 40 << 10,
        ..EngineConfig::default()
    };
    let target = engine_over("tcp", config).await;
    let a = engine_over("tcp", EngineConfig::default()).await;
    a.connect(target.name(), T).await.unwrap();
    let big = vec![1u8; 15 << 10];
    a.send_notify(target.name(), "a", &big, T).await.unwrap();
    a.send_notify(target.name(), "b", &big, T).await.unwrap();
    let e = a
        .send_notify(target.name(), "c", &big, T)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("max_pending_notify_bytes"), "{e}");
    assert_eq!(target.get_notifies().len(), 2);
    a.send_notify(target.name(), "c", &big, T).await.unwrap();
    let e = a
        .send_notify(target.name(), "d", &vec![0u8; 16 << 10], T)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("max_notify_len"), "{e}");
    // A raw peer's 1 MiB `from` is refused from its size, not queued.
    let rpc = named_client(target.name(), "x").await;
    let fat = NotifyMsg {
        from: "f".repeat(1 << 20),
        name: "n".into(),
        msg: Vec::new(),
        failed: None,
        id: (1, 2),
    };
    assert!(
        rpc.call_typed::<_, NotifyAck>(METHOD_NOTIFY, &fat)
            .await
            .is_err()
    );
    assert_eq!(target.get_notifies().len(), 1);
}

/// An engine never reads its transport's own notification queue (its notifications go
/// through its metadata service), so the transports it opens take none: a peer holding a
/// live key cannot pin memory there.
#[rstest]
#[case::tcp("tcp")]
#[case::shm("shm")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_s_transport_queues_no_transport_notifications(#[case] name: &str) {
    let config = EngineConfig {
        transport: name.parse().unwrap(),
        ..EngineConfig::default()
    };
    let target = engine_for(config).await;
    let mem = vec![0u8; 4096];
    // `mem` outlives the engine.
    register_rw(&target, &mem);
    let info = fetch_info(target.name()).await.unwrap();
    let intruder = transport(name);
    let ep = intruder
        .connect(&info.data_plane.parse().unwrap(), Deadline::after(T))
        .await
        .unwrap();
    // A key makes the sender one a transport would otherwise queue notifications from.
    let region = RemoteRegion::decode(&info.regions[0]).unwrap();
    let _key = intruder.import(&ep, &region).unwrap();
    let e = intruder
        .notify(&ep, 1, &[0u8; 1024], Deadline::after(T))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("max_pending_notifications"), "{e}");
}

/// The request as a fake engine reads it.
#[derive(Deserialize)]
struct HelloIn {
    _version: u32,
    _from: String,
}

/// What a fake engine answers at its metadata request: a data plane of its choosing.
#[derive(Serialize)]
struct FakeInfo {
    version: u32,
    instance: u64,
    data_plane: String,
    generation: u64,
    regions: Vec<Vec<u8>>,
}

/// A metadata service that names `data_plane` as its data plane.
async fn fake_engine(data_plane: String) -> hmc_rpc::RunningServer {
    let mut d = hmc_rpc::Dispatcher::new();
    d.register(METHOD_INFO, move |_, _: HelloIn| {
        let data_plane = data_plane.clone();
        async move {
            Ok::<_, hmc_rpc::RpcError>(FakeInfo {
                version: 3,
                instance: 1,
                data_plane,
                generation: 1,
                regions: Vec::new(),
            })
        }
    });
    hmc_rpc::Server::new(d, hmc_rpc::ServerConfig::default())
        .bind(&"tcp://127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

/// A peer cannot point an engine at another service of its host: a privileged port, a
/// port where nothing listens, or (root only) a listener of another user are not dialled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_plane_a_peer_names_is_dialled_only_by_the_rule() {
    let e = engine_over("tcp", EngineConfig::default()).await;
    let mut cases = vec![
        ("tcp://127.0.0.1:22".to_string(), "privileged"),
        ("tcp://127.0.0.1:9".to_string(), "privileged"),
    ];
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    cases.push((format!("tcp://127.0.0.1:{port}"), "nothing listens"));
    let mut other_user = None;
    if hmc_transport_kit::owner::euid() == 0 {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("python3")
            .args([
                "-c",
                "import socket,sys,time\ns=socket.socket()\ns.bind(('127.0.0.1',0))\ns.listen(1)\nprint(s.getsockname()[1],flush=True)\ntime.sleep(30)",
            ])
            .uid(65534)
            .gid(65534)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        cases.push((format!("tcp://127.0.0.1:{}", line.trim()), "uid 65534"));
        other_user = Some(child);
    }
    for (dp, why) in cases {
        let fake = fake_engine(dp.clone()).await;
        let err = e
            .connect(&fake.local_addr().to_string(), Duration::from_secs(3))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("not dialled") && err.contains(why),
            "{dp}: {err}"
        );
    }
    if let Some(mut c) = other_user {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// A notification after the metadata connection idled out (the peer closed it; the client
/// dials again) is still delivered, under the sender's name: the new connection is named
/// by a metadata request first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_survive_an_idle_timeout_of_the_metadata_connection() {
    let mut config = EngineConfig::default();
    config.rpc.conn.idle_timeout = Duration::from_millis(200);
    let target = engine_over("tcp", config).await;
    let a = engine_over("tcp", EngineConfig::default()).await;
    a.connect(target.name(), T).await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    a.send_notify(target.name(), "late", b"x", T).await.unwrap();
    let got = target.get_notifies();
    assert_eq!((got.len(), got[0].from.as_str()), (1, a.name()));
}
