//! Issue 18: over a data plane that maps the client's memory (shared memory), a handler
//! registered with `register_raw_in_place` gets a view of the client's request buffer
//! instead of a copy READ into a server buffer, and a large response is copied straight
//! into the client's mapped response region. Where nothing is mapped (the first use of a
//! buffer, another transport) the server READs and WRITEs as before. A payload a handler
//! keeps past its call holds the client's buffer off reuse: the client's rekey fails and
//! the buffer is dropped, so the kept bytes never change.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::data_plane::{demo_dispatcher, pattern};
use hmc_core::Communicator;
use hmc_rpc::{Client, ClientConfig, DataPlaneConfig, RunningServer, Server, ServerConfig, demo};
use hmc_transport_shm::{ShmCommunicator, ShmConfig};
use hmc_transport_tcp::{TcpCommunicator, TcpConfig};
use tokio::sync::mpsc;

/// Echo registered with plain `register_raw`: its request is always READ.
const COPYING_ECHO: u32 = 50;
/// Takes its request in place and keeps it past the call (sends it to the test).
const KEEPER: u32 = 51;

const LEN: usize = 1 << 20;

fn shm(revoke: Duration) -> Arc<ShmCommunicator> {
    Arc::new(
        ShmCommunicator::bind(ShmConfig {
            revoke_timeout: revoke,
            ..ShmConfig::default()
        })
        .unwrap(),
    )
}

async fn server<C: Communicator>(dp: Arc<C>, kept: mpsc::UnboundedSender<Bytes>) -> RunningServer {
    let mut d = demo_dispatcher();
    d.register_raw(COPYING_ECHO, |_ctx, b: Bytes| async move { Ok(b) });
    d.register_raw_in_place(KEEPER, move |_ctx, b: Bytes| {
        let kept = kept.clone();
        async move {
            let _ = kept.send(b);
            Ok(Bytes::from_static(b"kept"))
        }
    });
    Server::new(d, ServerConfig::default())
        .with_data_plane(dp)
        .bind(&"tcp://127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

async fn client<C: Communicator>(s: &RunningServer, dp: Arc<C>) -> Client<C> {
    Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap()
        .with_data_plane_config(dp, DataPlaneConfig::default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_takes_its_request_in_place_once_the_clients_buffer_is_mapped() {
    let (tx, _rx) = mpsc::unbounded_channel();
    let s = server(shm(Duration::from_secs(2)), tx).await;
    let c = client(&s, shm(Duration::from_secs(2))).await;
    for seed in 0..4 {
        let p = pattern(LEN, seed);
        assert!(
            c.call(demo::ECHO, p.clone()).await.unwrap() == p,
            "call {seed}"
        );
    }
    let st = s.data_plane_stats().unwrap();
    assert_eq!(
        (st.buffer_calls, st.buffer_responses),
        (4, 4),
        "all over the data plane: {st:?}"
    );
    // The first call maps the client's two pooled buffers (READ and WRITE, each granted
    // with its memfd); the next three use them in place.
    assert_eq!((st.viewed_requests, st.viewed_responses), (3, 3), "{st:?}");
    // A handler that did not ask for its request in place gets a copy; its response still
    // goes straight into the mapped response region.
    for seed in 4..6 {
        let p = pattern(LEN, seed);
        assert!(c.call(COPYING_ECHO, p.clone()).await.unwrap() == p);
    }
    let st = s.data_plane_stats().unwrap();
    assert_eq!((st.viewed_requests, st.viewed_responses), (3, 5), "{st:?}");
    assert_eq!(st.failures, 0, "{st:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transport_that_maps_nothing_reads_and_writes_as_before() {
    let tcp = || {
        Arc::new(
            TcpCommunicator::bind(&"tcp://127.0.0.1:0".parse().unwrap(), TcpConfig::default())
                .unwrap(),
        )
    };
    let (tx, _rx) = mpsc::unbounded_channel();
    let s = server(tcp(), tx).await;
    let c = client(&s, tcp()).await;
    for seed in 0..3 {
        let p = pattern(LEN, seed);
        assert!(c.call(demo::ECHO, p.clone()).await.unwrap() == p);
    }
    let st = s.data_plane_stats().unwrap();
    assert_eq!((st.buffer_calls, st.buffer_responses), (3, 3), "{st:?}");
    assert_eq!((st.viewed_requests, st.viewed_responses), (0, 0), "{st:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_kept_past_its_call_is_never_reused_under_it() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let s = server(shm(Duration::from_secs(2)), tx).await;
    // The client owns the buffers: its revoke timeout bounds the wait for the kept view.
    let c = client(&s, shm(Duration::from_millis(200))).await;
    let warm = pattern(LEN, 0);
    assert!(c.call(demo::ECHO, warm.clone()).await.unwrap() == warm);
    let p1 = pattern(LEN, 1);
    assert_eq!(&c.call(KEEPER, p1.clone()).await.unwrap()[..], b"kept");
    let kept = rx.recv().await.unwrap();
    assert_eq!(s.data_plane_stats().unwrap().viewed_requests, 1);
    let before = c.data_plane_stats().unwrap().pool;
    // The next calls need a request buffer: the kept one failed its rekey and was dropped,
    // not lent again, so nothing the client writes reaches the kept bytes.
    for seed in 2..4 {
        let p = pattern(LEN, seed);
        assert!(c.call(demo::ECHO, p.clone()).await.unwrap() == p);
        assert!(kept == p1, "the kept payload changed under the handler");
    }
    let after = c.data_plane_stats().unwrap().pool;
    assert!(
        after.registrations > before.registrations,
        "a fresh buffer replaced the kept one: {before:?} -> {after:?}"
    );
    drop(kept);
    let st = s.data_plane_stats().unwrap();
    assert_eq!(st.failures, 0, "{st:?}");
}
