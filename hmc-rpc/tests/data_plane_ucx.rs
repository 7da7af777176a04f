//! HMC_BUFFER over the UCX communicator with `UCX_TLS=tcp` and with shared memory
//! (`posix,cma,self`): verified echo round trips, many calls at once, a forged descriptor,
//! request payloads written in place, and direct copies through UCX's shared-memory mapping.
//! (The two-process echo and soak over UCX are in `data_plane_processes.rs`.) UCX must be
//! installed (`libucx0`); these tests never skip.

mod common;

use std::sync::Arc;

use common::data_plane::{
    client_mid_call, one_worker_runtime, pattern, pool_in_use_after, slow_echo_dispatcher,
};
use common::frames::{descriptor, read_frame_within, send_buffer_request};
use hmc_rpc::{
    Client, ClientConfig, ClientDataPlane, DataPlaneConfig, RunningServer, Server, ServerConfig,
    demo,
};
use hmc_transport_ucx::{UcxCommunicator, UcxConfig};
use rstest::rstest;

fn ucx(tls: &str) -> Arc<UcxCommunicator> {
    Arc::new(UcxCommunicator::new(UcxConfig::with_tls(tls)).expect("UCX (libucx0) is installed"))
}

async fn server(tls: &str) -> RunningServer {
    server_on(ucx(tls)).await
}

async fn server_on(comm: Arc<UcxCommunicator>) -> RunningServer {
    Server::new(slow_echo_dispatcher(), ServerConfig::default())
        .with_data_plane(comm)
        .bind(&"tcp://127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

async fn client(s: &RunningServer, tls: &str) -> Client<UcxCommunicator> {
    Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap()
        .with_data_plane_config(ucx(tls), DataPlaneConfig::default())
}

#[rstest]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_round_trips_over_ucx(
    #[values("tcp", "posix,cma,self")] tls: &str,
    #[values(64 << 10, 1 << 20, 16 << 20)] len: usize,
) {
    let s = server(tls).await;
    let c = client(&s, tls).await;
    for seed in 0..3 {
        let p = pattern(len, seed);
        let r = c.call(demo::ECHO, p.clone()).await.unwrap();
        assert!(r == p, "echo of {len} bytes over UCX_TLS={tls} differs");
    }
    let ss = s.data_plane_stats().unwrap();
    assert_eq!(
        (ss.buffer_calls, ss.buffer_responses, ss.failures),
        (3, 3, 0)
    );
    let cp = c.data_plane_stats().unwrap().pool;
    assert_eq!(cp.registrations, 2);
    assert_eq!(
        (cp.transport_allocations, ss.pool.transport_allocations),
        (cp.registrations, ss.pool.registrations),
        "every UCX pool buffer is memory UCX allocated itself (the shared-memory fast path)"
    );
}

#[rstest]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_calls_at_once_over_ucx(#[values("tcp", "posix,cma,self")] tls: &str) {
    let s = Arc::new(server(tls).await);
    let mut tasks = Vec::new();
    for k in 0..4u32 {
        let c = client(&s, tls).await;
        for j in 0..4u32 {
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..4u32 {
                    let p = pattern(1 << 20, k * 100 + j * 10 + i);
                    assert!(c.call(demo::ECHO, p.clone()).await.unwrap() == p);
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let st = s.data_plane_stats().unwrap();
    assert_eq!((st.buffer_calls, st.failures), (64, 0));
}

#[rstest]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_and_stale_ucx_descriptors_get_data_plane(
    #[values("tcp", "posix,cma,self")] tls: &str,
) {
    use hmc_core::{Access, Communicator, RegisteredBuffer};
    use hmc_rpc::Status;
    use hmc_rpc::frame::FrameHeader;

    let s = server(tls).await;
    let hmc_core::PeerAddr::Tcp(sa) = s.local_addr().clone() else {
        panic!("tcp server")
    };
    let mut raw = tokio::net::TcpStream::connect(sa).await.unwrap();
    let mine = ucx(tls);
    let mem = Arc::new(hmc_backend_cpu::HostMemory::new());
    // The body of an HMC_BUFFER request whose payload is `region`, answered at `mine`.
    let body = |region: hmc_core::RemoteRegion| descriptor(&mine.address(), &region.encode(), None);
    async fn answer(raw: &mut tokio::net::TcpStream) -> FrameHeader {
        read_frame_within(raw, std::time::Duration::from_secs(20))
            .await
            .0
    }
    let good = RegisteredBuffer::new(mem.clone(), mine.clone(), 1 << 20, Access::READ).unwrap();
    let mut forged = good.export().unwrap();
    let n = forged.key.len();
    forged.key[n - 1] ^= 0xFF;
    send_buffer_request(&mut raw, 1, 1 << 20, &body(forged)).await;
    let h = answer(&mut raw).await;
    assert_eq!((h.request_id, h.status), (1, Status::DATA_PLANE));
    let stale = RegisteredBuffer::new(mem.clone(), mine.clone(), 1 << 20, Access::READ).unwrap();
    let stale_desc = stale.export().unwrap();
    drop(stale);
    send_buffer_request(&mut raw, 2, 1 << 20, &body(stale_desc)).await;
    let h = answer(&mut raw).await;
    assert_eq!((h.request_id, h.status), (2, Status::DATA_PLANE));
    send_buffer_request(&mut raw, 3, 1 << 20, &body(good.export().unwrap())).await;
    let h = answer(&mut raw).await;
    assert_eq!((h.request_id, h.status), (3, Status::OK));
    // A real client is served afterwards.
    let c = client(&s, tls).await;
    let p = pattern(1 << 20, 3);
    assert!(c.call(demo::ECHO, p.clone()).await.unwrap() == p);
}

#[rstest]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_dies_mid_call_over_ucx_leaves_the_server_healthy(
    #[values("tcp", "posix,cma,self")] tls: &str,
) {
    let server_comm = ucx(tls);
    let s = server_on(server_comm.clone()).await;
    let addr = s.local_addr().clone();
    let tls2 = tls.to_string();
    let client_stats = std::thread::spawn(move || {
        let rt = one_worker_runtime();
        let comm = ucx(&tls2);
        let c = client_mid_call(&rt, &addr, comm.clone());
        drop(c);
        drop(rt);
        let st = comm.stats();
        drop(comm);
        st
    })
    .join()
    .unwrap();
    assert_eq!(
        client_stats.registered, client_stats.deregistered,
        "the dead client's registrations were released exactly once: {client_stats:?}"
    );
    let in_use = pool_in_use_after(&s, 200).await;
    assert_eq!(in_use, 0, "every server buffer went back to the pool");
    let pool = s.data_plane_stats().unwrap().pool;
    let ucx_stats = server_comm.stats();
    assert_eq!(
        ucx_stats.registered - ucx_stats.deregistered,
        pool.registrations - pool.deregistrations,
        "the server holds exactly the pool's registrations"
    );
    let c = client(&s, tls).await;
    let p = pattern(1 << 20, 9);
    assert!(c.call(demo::ECHO, p.clone()).await.unwrap() == p);
}

#[rstest]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_buffers_over_ucx_and_direct_copies_on_shared_memory(
    #[values("tcp", "posix,cma,self")] tls: &str,
) {
    let server_comm = ucx(tls);
    let s = server_on(server_comm.clone()).await;
    let dp = Arc::new(ClientDataPlane::new(ucx(tls), DataPlaneConfig::default()));
    let c = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap()
        .with_client_data_plane(dp.clone());
    for seed in 0..3 {
        let p = pattern(1 << 20, seed);
        let mut rb = dp.request_buffer(p.len()).unwrap();
        rb.as_mut_slice().copy_from_slice(&p);
        let r = c.call(demo::ECHO, rb.freeze()).await.unwrap();
        assert!(r == p, "echo {seed} over UCX_TLS={tls} differs");
    }
    let cs = dp.stats();
    assert_eq!(
        (cs.buffer_calls, cs.lent_requests, cs.buffer_responses),
        (3, 3, 3)
    );
    let direct = server_comm.stats().direct_transfers;
    if tls == "tcp" {
        assert_eq!(
            direct, 0,
            "TCP maps nothing: every transfer uses the progress thread"
        );
    } else {
        assert_eq!(
            direct, 6,
            "each call's READ and WRITE are memcpys through UCX's mapping of the client's buffers"
        );
    }
}
