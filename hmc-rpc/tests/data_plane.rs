//! HMC_BUFFER over real data planes (the TCP communicator; UCX where it loads): verified
//! echo round trips, fallback to TCP_STREAM, forged and stale descriptors, a client that
//! dies mid-call, many large calls at once, and request payloads written in place
//! (`ClientDataPlane::request_buffer`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::data_plane::{
    client_mid_call, one_worker_runtime, pattern, pool_in_use_after, slow_echo_dispatcher, tcp_comm,
};
use common::frames::{descriptor, read_frame_within, send_buffer_request};
use hmc_core::{Access, Communicator, PeerAddr, RegisteredBuffer, RemoteRegion};
use hmc_rpc::frame::{FrameHeader, PayloadMode};
use hmc_rpc::{
    CallOptions, Client, ClientConfig, ClientDataPlane, DataPlaneConfig, Dispatcher, PoolConfig,
    RunningServer, Server, ServerConfig, Status, demo,
};
use hmc_transport_tcp::{TcpCommunicator, TcpConfig};
use rstest::rstest;
use tokio::net::TcpStream;

const CONSTANT: u32 = 201;

fn dispatcher() -> Dispatcher {
    let mut d = slow_echo_dispatcher();
    // A large response that is not a slice of the request (the pooled-copy path).
    d.register_raw_blocking(CONSTANT, |_ctx, b: Bytes| {
        Ok(Bytes::from(vec![0xA5u8; b.len() * 2]))
    });
    d
}

async fn server<C: Communicator>(dp: Option<Arc<C>>, cfg: DataPlaneConfig) -> RunningServer {
    let s = Server::new(dispatcher(), ServerConfig::default());
    let addr = "tcp://127.0.0.1:0".parse().unwrap();
    match dp {
        Some(dp) => {
            s.with_data_plane(dp)
                .data_plane_config(cfg)
                .bind(&addr)
                .await
        }
        None => s.bind(&addr).await,
    }
    .unwrap()
}

async fn client<C: Communicator>(s: &RunningServer, dp: Arc<C>, cfg: DataPlaneConfig) -> Client<C> {
    Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap()
        .with_data_plane_config(dp, cfg)
}

#[rstest]
#[case::at_threshold(64 << 10)]
#[case::one_mib(1 << 20)]
#[case::sixteen_mib(16 << 20)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_round_trips_over_the_tcp_data_plane(#[case] len: usize) {
    let s = server(Some(tcp_comm()), DataPlaneConfig::default()).await;
    let c = client(&s, tcp_comm(), DataPlaneConfig::default()).await;
    for seed in 0..3 {
        let p = pattern(len, seed);
        let r = c.call(demo::ECHO, p.clone()).await.unwrap();
        assert!(r == p, "echo of {len} bytes differs");
    }
    let ss = s.data_plane_stats().unwrap();
    let cs = c.data_plane_stats().unwrap();
    assert_eq!(
        (ss.buffer_calls, ss.buffer_responses, ss.failures),
        (3, 3, 0)
    );
    assert_eq!(
        (cs.buffer_calls, cs.buffer_responses, cs.fallbacks),
        (3, 3, 0)
    );
    assert_eq!(
        cs.pool.registrations, 2,
        "request and response buffers, reused"
    );
    assert_eq!(
        cs.pool.transport_allocations, 0,
        "TCP has no transport-allocated memory: the pool registers host memory"
    );
    // Below the threshold: INLINE/TCP_STREAM, not counted.
    let small = pattern(1000, 9);
    assert_eq!(c.call(demo::ECHO, small.clone()).await.unwrap(), small);
    assert_eq!(c.data_plane_stats().unwrap().buffer_calls, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_that_is_not_the_request_is_pushed_from_a_pooled_copy() {
    let s = server(Some(tcp_comm()), DataPlaneConfig::default()).await;
    let c = client(&s, tcp_comm(), DataPlaneConfig::default()).await;
    let p = pattern(256 << 10, 1);
    // Twice the request: does not fit the default response region, comes back TCP_STREAM.
    let r = c.call(CONSTANT, p.clone()).await.unwrap();
    assert_eq!(r.len(), 512 << 10);
    assert!(r.iter().all(|b| *b == 0xA5));
    assert_eq!(s.data_plane_stats().unwrap().fallbacks, 1);
    // With a large enough response region it is written one-sided.
    let opts = CallOptions {
        response_capacity: Some(1 << 20),
        ..CallOptions::default()
    };
    let r = c.call_with(CONSTANT, p, opts).await.unwrap();
    assert_eq!(r.len(), 512 << 10);
    assert!(r.iter().all(|b| *b == 0xA5));
    assert_eq!(s.data_plane_stats().unwrap().buffer_responses, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_pool_falls_back_to_tcp_stream() {
    let s = server(Some(tcp_comm()), DataPlaneConfig::default()).await;
    let cfg = DataPlaneConfig {
        pool: PoolConfig {
            max_total_bytes: 256 << 10,
            ..PoolConfig::default()
        },
        ..DataPlaneConfig::default()
    };
    let c = client(&s, tcp_comm(), cfg).await;
    let p = pattern(1 << 20, 3);
    assert_eq!(c.call(demo::ECHO, p.clone()).await.unwrap(), p);
    let cs = c.data_plane_stats().unwrap();
    assert_eq!((cs.buffer_calls, cs.fallbacks), (0, 1));
    assert_eq!(s.data_plane_stats().unwrap().buffer_calls, 0);
    // 128 KiB fits the pool (request and response buffers): HMC_BUFFER again.
    let p = pattern(100 << 10, 4);
    assert_eq!(c.call(demo::ECHO, p.clone()).await.unwrap(), p);
    assert_eq!(c.data_plane_stats().unwrap().buffer_calls, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_a_data_plane_streams_to_a_server_with_one() {
    let s = server(Some(tcp_comm()), DataPlaneConfig::default()).await;
    let c = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    let p = pattern(1 << 20, 5);
    assert_eq!(c.call(demo::ECHO, p.clone()).await.unwrap(), p);
    assert_eq!(s.data_plane_stats().unwrap().buffer_calls, 0);
}

// ---- forged and stale descriptors, on a raw connection ------------------------------------

/// An HMC_BUFFER descriptor body as `docs/protocol.md` specifies it.
/// One frame from `raw`, within 10 s.
async fn read_frame(raw: &mut TcpStream) -> (FrameHeader, Vec<u8>) {
    read_frame_within(raw, Duration::from_secs(10)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_and_stale_descriptors_are_refused_and_the_server_lives_on() {
    let s = server(Some(tcp_comm()), DataPlaneConfig::default()).await;
    let PeerAddr::Tcp(sa) = s.local_addr().clone() else {
        panic!("tcp server")
    };
    let mut raw = TcpStream::connect(sa).await.unwrap();
    let mine = tcp_comm();
    let mem = Arc::new(hmc_backend_cpu::HostMemory::new());
    let good = RegisteredBuffer::new(mem.clone(), mine.clone(), 1 << 20, Access::READ).unwrap();
    let good_desc = good.export().unwrap();

    // 1. Not a descriptor at all.
    send_buffer_request(&mut raw, 1, 1 << 20, b"garbage").await;
    let (h, body) = read_frame(&mut raw).await;
    assert_eq!(
        (h.request_id, h.status),
        (1, Status::BAD_PAYLOAD),
        "{}",
        String::from_utf8_lossy(&body)
    );

    // 2. A payload length past the region's end.
    let d = descriptor(&mine.address(), &good_desc.encode(), None);
    send_buffer_request(&mut raw, 2, 2 << 20, &d).await;
    let (h, _) = read_frame(&mut raw).await;
    assert_eq!((h.request_id, h.status), (2, Status::BAD_PAYLOAD));

    // 3. A forged key for a real peer: the READ is refused by the peer.
    let mut forged = good_desc.clone();
    for b in forged.key.iter_mut() {
        *b ^= 0x5A;
    }
    let d = descriptor(&mine.address(), &forged.encode(), None);
    send_buffer_request(&mut raw, 3, 1 << 20, &d).await;
    let (h, body) = read_frame(&mut raw).await;
    assert_eq!(
        (h.request_id, h.status),
        (3, Status::DATA_PLANE),
        "{}",
        String::from_utf8_lossy(&body)
    );

    // 4. A stale descriptor: the region has been deregistered since.
    let stale = RegisteredBuffer::new(mem.clone(), mine.clone(), 1 << 20, Access::READ).unwrap();
    let stale_desc = stale.export().unwrap();
    drop(stale);
    let d = descriptor(&mine.address(), &stale_desc.encode(), None);
    send_buffer_request(&mut raw, 4, 1 << 20, &d).await;
    let (h, _) = read_frame(&mut raw).await;
    assert_eq!((h.request_id, h.status), (4, Status::DATA_PLANE));

    // 5. A data-plane address nobody listens on.
    let dead: PeerAddr = "tcp://127.0.0.1:1".parse().unwrap();
    let d = descriptor(&dead, &good_desc.encode(), None);
    send_buffer_request(&mut raw, 5, 1 << 20, &d).await;
    let (h, _) = read_frame(&mut raw).await;
    assert_eq!((h.request_id, h.status), (5, Status::DATA_PLANE));

    // 6. A descriptor of another transport.
    let mut ucx = good_desc.clone();
    ucx.transport = hmc_core::TransportId::UCX;
    let d = descriptor(&mine.address(), &ucx.encode(), None);
    send_buffer_request(&mut raw, 6, 1 << 20, &d).await;
    let (h, _) = read_frame(&mut raw).await;
    assert_eq!((h.request_id, h.status), (6, Status::DATA_PLANE));

    // The genuine descriptor works on the same connection (the payload is zeros).
    let d = descriptor(&mine.address(), &good_desc.encode(), None);
    send_buffer_request(&mut raw, 7, 1 << 20, &d).await;
    let (h, _) = read_frame(&mut raw).await;
    assert_eq!(
        (h.request_id, h.status, h.mode),
        (7, Status::OK, PayloadMode::TcpStream)
    );
    assert_eq!(h.payload_len, 1 << 20);
    drop(raw);

    let stats = s.data_plane_stats().unwrap();
    assert_eq!(stats.failures, 6);
    let c = client(&s, tcp_comm(), DataPlaneConfig::default()).await;
    let p = pattern(1 << 20, 7);
    assert_eq!(c.call(demo::ECHO, p.clone()).await.unwrap(), p);
    assert_eq!(
        RemoteRegion::decode(&good_desc.encode()).unwrap(),
        good_desc
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_dies_mid_call_leaves_the_server_healthy() {
    let server_comm = tcp_comm();
    let s = server(Some(server_comm.clone()), DataPlaneConfig::default()).await;
    let addr = s.local_addr().clone();
    // The client lives in its own runtime, which is torn down while its call runs.
    let client_comm_bytes = std::thread::spawn(move || {
        let rt = one_worker_runtime();
        let comm = rt.block_on(async { tcp_comm() });
        let c = client_mid_call(&rt, &addr, comm.clone());
        comm.close();
        drop(c);
        drop(rt);
        comm.registered_bytes()
    })
    .join()
    .unwrap();
    assert_eq!(
        client_comm_bytes, 0,
        "the client's registrations were released"
    );
    // The server's push fails, its buffers return to the pool, and it serves on.
    let in_use = pool_in_use_after(&s, 100).await;
    assert_eq!(in_use, 0, "every server buffer went back to the pool");
    let st = s.data_plane_stats().unwrap();
    // Either the push failed (a failure) or the lost connection cancelled the call first.
    assert_eq!(st.buffer_responses, 0, "{st:?}");
    assert_eq!(
        server_comm.registered_bytes(),
        st.pool.registered_bytes as u64,
        "registered exactly what the pool holds"
    );
    let c = client(&s, tcp_comm(), DataPlaneConfig::default()).await;
    let p = pattern(1 << 20, 9);
    assert_eq!(c.call(demo::ECHO, p.clone()).await.unwrap(), p);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_large_calls_from_many_connections_at_once() {
    let s = Arc::new(server(Some(tcp_comm()), DataPlaneConfig::default()).await);
    let mut tasks = Vec::new();
    for k in 0..6u32 {
        let c = client(&s, tcp_comm(), DataPlaneConfig::default()).await;
        for j in 0..4u32 {
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..3u32 {
                    let p = pattern(1 << 20, k * 100 + j * 10 + i);
                    let r = c.call(demo::ECHO, p.clone()).await.unwrap();
                    assert!(r == p);
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let st = s.data_plane_stats().unwrap();
    assert_eq!(
        (st.buffer_calls, st.buffer_responses, st.failures),
        (72, 72, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_lives_while_a_connection_from_its_client_is_open() {
    let s = server(Some(tcp_comm()), DataPlaneConfig::default()).await;
    let comm = tcp_comm();
    for _ in 0..3 {
        let a = client(&s, comm.clone(), DataPlaneConfig::default()).await;
        let b = client(&s, comm.clone(), DataPlaneConfig::default()).await;
        let p = pattern(1 << 20, 1);
        assert_eq!(a.call(demo::ECHO, p.clone()).await.unwrap(), p);
        assert_eq!(b.call(demo::ECHO, p.clone()).await.unwrap(), p);
        assert_eq!(s.data_plane_stats().unwrap().endpoints, 1, "shared by both");
        drop(a);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            s.data_plane_stats().unwrap().endpoints,
            1,
            "b still uses it"
        );
        drop(b);
        let mut left = usize::MAX;
        for _ in 0..50 {
            left = s.data_plane_stats().unwrap().endpoints;
            if left == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(left, 0, "dropped with its last connection");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_a_data_plane_gets_tcp_stream_from_the_first_call() {
    let s = server::<TcpCommunicator>(None, DataPlaneConfig::default()).await;
    let c = client(&s, tcp_comm(), DataPlaneConfig::default()).await;
    let p = pattern(1 << 20, 6);
    // The settings exchange said there is no data plane: no call is refused for it.
    for _ in 0..2 {
        assert_eq!(c.call(demo::ECHO, p.clone()).await.unwrap(), p);
    }
    let cs = c.data_plane_stats().unwrap();
    assert_eq!((cs.buffer_calls, cs.failures), (0, 0));
    assert_eq!(cs.pool.in_use_bytes, 0);
}

#[tokio::test]
async fn a_server_without_a_data_plane_reports_none() {
    let s = server::<TcpCommunicator>(None, DataPlaneConfig::default()).await;
    assert!(s.data_plane_stats().is_none());
}

/// A client sharing `dp`, so the test can ask it for request buffers.
async fn client_on<C: Communicator>(s: &RunningServer, dp: &Arc<ClientDataPlane<C>>) -> Client<C> {
    Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap()
        .with_client_data_plane(dp.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_buffer_is_lent_as_is_and_reused() {
    let s = server(Some(tcp_comm()), DataPlaneConfig::default()).await;
    let dp = Arc::new(ClientDataPlane::new(tcp_comm(), DataPlaneConfig::default()));
    let c = client_on(&s, &dp).await;
    for seed in 0..3 {
        let p = pattern(1 << 20, seed);
        let mut rb = dp.request_buffer(p.len()).unwrap();
        assert_eq!((rb.len(), rb.is_empty()), (p.len(), false));
        rb.as_mut_slice().copy_from_slice(&p);
        let body = rb.freeze();
        assert!(body == p);
        let r = c.call(demo::ECHO, body.clone()).await.unwrap();
        assert!(r == p, "echo {seed} differs");
        assert!(body == p, "the lent payload is unchanged");
    }
    let cs = dp.stats();
    assert_eq!(
        (cs.buffer_calls, cs.lent_requests, cs.buffer_responses),
        (3, 3, 3)
    );
    assert_eq!((cs.fallbacks, cs.failures), (0, 0));
    // One request buffer and one response buffer, both reused; where the transport cannot
    // rekey, `request_buffer` (which does not know the server) retires a request buffer
    // lent to a server and registers a fresh one in its place (quarantine).
    assert_eq!(
        cs.pool.registrations,
        2 + cs.pool.quarantine_drops,
        "{:?}",
        cs.pool
    );
    assert!(
        cs.pool.registered_bytes <= 2 << 20,
        "bounded: {:?}",
        cs.pool
    );
    assert_eq!(cs.pool.in_use_bytes, 0, "both back in the pool");
    assert_eq!(s.data_plane_stats().unwrap().buffer_calls, 3);

    // A slice of a lent payload is not the lent payload: it is copied, as any other.
    let mut rb = dp.request_buffer(1 << 20).unwrap();
    rb.as_mut_slice().copy_from_slice(&pattern(1 << 20, 7));
    let body = rb.freeze();
    let part = body.slice(0..(512 << 10));
    assert!(c.call(demo::ECHO, part.clone()).await.unwrap() == part);
    let cs = dp.stats();
    assert_eq!((cs.buffer_calls, cs.lent_requests), (4, 3));
    // Below the threshold the same bytes travel INLINE.
    let mut small = dp.request_buffer(1000).unwrap();
    small.as_mut_slice().fill(0x3C);
    let small = small.freeze();
    assert_eq!(c.call(demo::ECHO, small.clone()).await.unwrap(), small);
    assert_eq!(dp.stats().buffer_calls, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_buffer_lent_to_a_failed_call_is_discarded_not_reused() {
    let s = server(Some(tcp_comm()), DataPlaneConfig::default()).await;
    // The client's data plane listens on another loopback IP than its RPC connection
    // comes from: the server refuses to dial it, and the call fails DATA_PLANE.
    let other_ip = Arc::new(
        TcpCommunicator::bind(&"tcp://127.0.0.2:0".parse().unwrap(), TcpConfig::default()).unwrap(),
    );
    let dp = Arc::new(ClientDataPlane::new(other_ip, DataPlaneConfig::default()));
    let c = client_on(&s, &dp).await;
    let mut rb = dp.request_buffer(1 << 20).unwrap();
    rb.as_mut_slice().fill(0x5A);
    let body = rb.freeze();
    let e = c.call(demo::ECHO, body.clone()).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::DATA_PLANE), "{e}");
    assert_eq!(dp.stats().lent_requests, 1);
    let before = dp.stats().pool.deregistrations;
    // The bytes stay readable while the caller holds them.
    assert!(body.iter().all(|&b| b == 0x5A));
    drop(body);
    let cs = dp.stats();
    assert_eq!(
        cs.pool.deregistrations,
        before + 1,
        "a server may still read a buffer lent to a failed call: deregistered, not pooled"
    );
    assert_eq!(cs.pool.in_use_bytes, 0);
}
