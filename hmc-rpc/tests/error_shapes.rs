//! One error shape per condition, over real sockets: an expired call is always
//! `CallError::DeadlineExceeded` whichever side noticed first, a refused connection keeps
//! its `io::ErrorKind` from the RPC client and the TCP communicator alike, and a cancelled
//! async handler always sees its token before it is dropped (`handler_cancel_grace`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hmc_core::{Communicator, Deadline, PeerAddr};
use hmc_rpc::{
    CallError, CallOptions, Client, ClientConfig, DirectClient, Dispatcher, RpcError,
    RunningServer, Server, ServerConfig, Status,
};
use hmc_transport_tcp::{TcpCommunicator, TcpConfig};
use rstest::rstest;

/// Sleeps the requested milliseconds, or returns CANCELLED when its call is cancelled
/// first, counting the cancel branches it ran.
const SLEEP_OR_CANCEL: u32 = 1;
/// Sleeps without looking at its token; counts the times its future was dropped unfinished.
const SLEEP_IGNORING_CANCEL: u32 = 2;

/// Counts drops of a handler future that did not finish.
struct DropCounter(Arc<AtomicUsize>, bool);

impl Drop for DropCounter {
    fn drop(&mut self) {
        if !self.1 {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

struct Counters {
    cancel_branches: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
}

async fn server(config: ServerConfig) -> (RunningServer, Counters) {
    let counters = Counters {
        cancel_branches: Arc::new(AtomicUsize::new(0)),
        dropped: Arc::new(AtomicUsize::new(0)),
    };
    let mut d = Dispatcher::new();
    let seen = counters.cancel_branches.clone();
    d.register(SLEEP_OR_CANCEL, move |ctx, ms: u64| {
        let seen = seen.clone();
        async move {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(ms)) => Ok(ms),
                _ = ctx.cancel.cancelled() => {
                    seen.fetch_add(1, Ordering::SeqCst);
                    Err(RpcError::new(Status::CANCELLED, "saw the cancel"))
                }
            }
        }
    });
    let dropped = counters.dropped.clone();
    d.register(SLEEP_IGNORING_CANCEL, move |_ctx, ms: u64| {
        let guard = DropCounter(dropped.clone(), false);
        async move {
            // Moved in whole (a field assignment alone would capture only the field).
            let mut guard = guard;
            tokio::time::sleep(Duration::from_millis(ms)).await;
            guard.1 = true;
            Ok(ms)
        }
    });
    let s = Server::new(d, config)
        .bind(&"tcp://127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    (s, counters)
}

fn within(ms: u64) -> CallOptions {
    CallOptions {
        timeout: Some(Duration::from_millis(ms)),
        ..CallOptions::default()
    }
}

/// Waits (bounded) until `counter` reaches `n`.
async fn settle(counter: &AtomicUsize, n: usize) -> usize {
    for _ in 0..500 {
        if counter.load(Ordering::SeqCst) >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    counter.load(Ordering::SeqCst)
}

const CALLS: usize = 64;
const IN_FLIGHT: usize = 8;

/// Client and server deadlines expire at nearly the same instant, so either side may
/// notice first: the variant must not depend on which did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_expired_call_is_deadline_exceeded_and_every_handler_sees_its_cancel() {
    let (s, counters) = server(ServerConfig::default()).await;
    let c = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    let mut shapes = Vec::new();
    for _ in 0..CALLS / IN_FLIGHT {
        let batch = (0..IN_FLIGHT).map(|_| {
            let c = c.clone();
            tokio::spawn(async move {
                c.call_typed_with::<u64, u64>(SLEEP_OR_CANCEL, &5_000, within(20))
                    .await
            })
        });
        for call in futures::future::join_all(batch).await {
            shapes.push(call.unwrap().unwrap_err());
        }
    }
    let other: Vec<_> = shapes
        .iter()
        .filter(|e| !matches!(e, CallError::DeadlineExceeded(_)))
        .collect();
    assert!(other.is_empty(), "{} of {CALLS}: {other:?}", other.len());
    assert!(shapes.iter().all(|e| e.is_deadline() && e.may_have_run()));
    assert_eq!(
        settle(&counters.cancel_branches, CALLS).await,
        CALLS,
        "every expired handler ran its cancel branch"
    );
    s.shutdown().await;
}

#[test]
fn the_direct_client_reports_expiry_the_same_way() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (s, _counters) = rt.block_on(server(ServerConfig::default()));
    let c = DirectClient::connect(s.local_addr(), ClientConfig::default()).unwrap();
    for _ in 0..CALLS {
        let e = c
            .call_with(
                SLEEP_OR_CANCEL,
                hmc_rpc::RpcCodec::encode(&5_000u64).unwrap(),
                within(10),
            )
            .unwrap_err();
        assert!(matches!(e, CallError::DeadlineExceeded(_)), "{e:?}");
    }
    rt.block_on(s.shutdown());
}

/// A handler that ignores its token is dropped once `handler_cancel_grace` passes, so its
/// cleanup belongs in `Drop`; one that finishes within the grace is not dropped.
#[rstest]
#[case::outlives_the_grace(5_000, CALLS)]
#[case::finishes_within_the_grace(60, 0)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_ignoring_its_token_is_dropped_only_after_the_grace(
    #[case] sleep_ms: u64,
    #[case] dropped: usize,
) {
    let config = ServerConfig {
        handler_cancel_grace: Duration::from_millis(200),
        ..ServerConfig::default()
    };
    let (s, counters) = server(config).await;
    let c = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    let calls = (0..CALLS).map(|_| {
        let c = c.clone();
        tokio::spawn(async move {
            c.call_typed_with::<u64, u64>(SLEEP_IGNORING_CANCEL, &sleep_ms, within(10))
                .await
        })
    });
    for r in futures::future::join_all(calls).await {
        assert!(r.unwrap().unwrap_err().is_deadline());
    }
    // Wait past every grace, then count.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(settle(&counters.dropped, dropped).await, dropped);
    s.shutdown().await;
}

fn refused_addr() -> PeerAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    PeerAddr::Tcp(addr)
}

fn assert_no_binary_named(msg: &str) {
    for bin in ["hmc-rpc-server", "hmc-rpc-client", "hmc-tcp-peer", "--"] {
        assert!(!msg.contains(bin), "a library message names `{bin}`: {msg}");
    }
}

#[rstest]
#[case::pipelined_client("client")]
#[case::direct_client("direct")]
#[case::tcp_communicator("communicator")]
#[tokio::test]
async fn a_refused_connection_keeps_its_io_kind_everywhere(#[case] who: &str) {
    let addr = refused_addr();
    let msg = match who {
        "client" => {
            let e = Client::connect(&addr, ClientConfig::default())
                .await
                .err()
                .unwrap();
            assert!(e.is_connection_refused() && e.is_retryable(), "{e:?}");
            assert!(!e.may_have_run(), "{e:?}");
            e.to_string()
        }
        "direct" => {
            let e = DirectClient::connect(&addr, ClientConfig::default())
                .err()
                .unwrap();
            assert_eq!(e.io_kind(), Some(std::io::ErrorKind::ConnectionRefused));
            e.to_string()
        }
        _ => {
            let comm =
                TcpCommunicator::bind(&"tcp://127.0.0.1:0".parse().unwrap(), TcpConfig::default())
                    .unwrap();
            let e = comm
                .connect(&addr, Deadline::after(Duration::from_secs(5)))
                .await
                .err()
                .unwrap();
            assert!(e.is_connection_refused() && e.is_retryable(), "{e:?}");
            let source = std::error::Error::source(&e).expect("the io::Error is the source");
            let io = source.downcast_ref::<std::io::Error>().unwrap();
            assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
            e.to_string()
        }
    };
    assert!(msg.contains(&addr.to_string()), "{msg}");
    assert_no_binary_named(&msg);
}

#[tokio::test]
async fn overload_has_one_shape_and_is_retryable() {
    let config = ServerConfig {
        max_inflight_total: 1,
        ..ServerConfig::default()
    };
    let (s, _counters) = server(config).await;
    let c = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    let busy = {
        let c = c.clone();
        tokio::spawn(async move {
            c.call_typed_with::<u64, u64>(SLEEP_OR_CANCEL, &300, within(5_000))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let e = c
        .call_typed_with::<u64, u64>(SLEEP_OR_CANCEL, &1, within(5_000))
        .await
        .unwrap_err();
    assert!(
        e.is_overloaded() && e.is_retryable() && !e.may_have_run(),
        "{e:?}"
    );
    assert_no_binary_named(&e.to_string());
    assert_eq!(busy.await.unwrap().unwrap(), 300);
    s.shutdown().await;
}
