//! Two engines over the TCP transport on loopback: transfers by address in both
//! directions, bad descriptors refused before any byte moves, tables kept current across
//! register/deregister, asynchronous requests and their timeouts, notifications and
//! their bound, and the blocking API.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{engine_over, register_rw};
use hmc_engine::{
    BlockingEngine, Engine, EngineConfig, EngineError, MemDesc, MemType, Side, TransferOp,
    TransferOpDesc, TransferStatus,
};
use hmc_transport_tcp::TcpCommunicator;

const T: Duration = Duration::from_secs(10);

fn open() -> hmc_core::Result<TcpCommunicator> {
    TcpCommunicator::bind(&"tcp://127.0.0.1:0".parse().unwrap(), Default::default())
}

async fn engine(config: EngineConfig) -> Engine<TcpCommunicator> {
    engine_over(Arc::new(open().unwrap()), config).await
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn addr(b: &[u8]) -> u64 {
    b.as_ptr() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_and_reads_by_address_across_several_regions() {
    let a = engine(EngineConfig::default()).await;
    let b = engine(EngineConfig::default()).await;
    let src1 = pattern(1 << 20, 1);
    let src2 = pattern(64 << 10, 2);
    let dst1 = vec![0u8; 1 << 20];
    let dst2 = vec![0u8; 256 << 10];
    for buf in [&src1, &src2] {
        register_rw(&a, buf);
    }
    for buf in [&dst1, &dst2] {
        register_rw(&b, buf);
    }
    a.connect(b.name(), T).await.unwrap();
    // src1 in 4 KiB pieces, contiguous on both sides (merged into one run), plus src2
    // scattered into dst2 at odd offsets.
    let mut descs: Vec<TransferOpDesc> = (0..256)
        .map(|i| TransferOpDesc {
            local_addr: addr(&src1) + i * 4096,
            remote_addr: addr(&dst1) + i * 4096,
            len: 4096,
        })
        .collect();
    descs.push(TransferOpDesc {
        local_addr: addr(&src2),
        remote_addr: addr(&dst2) + 4097,
        len: 30_000,
    });
    descs.push(TransferOpDesc {
        local_addr: addr(&src2) + 30_000,
        remote_addr: addr(&dst2) + 200_001,
        len: (64 << 10) - 30_000,
    });
    a.transfer(b.name(), TransferOp::Write, &descs, T)
        .await
        .unwrap();
    assert_eq!(dst1, src1);
    assert_eq!(&dst2[4097..4097 + 30_000], &src2[..30_000]);
    assert_eq!(
        &dst2[200_001..200_001 + (64 << 10) - 30_000],
        &src2[30_000..]
    );
    // Read it back into a fresh local buffer.
    let back = vec![0u8; 1 << 20];
    register_rw(&a, &back);
    let read = [TransferOpDesc {
        local_addr: addr(&back),
        remote_addr: addr(&dst1),
        len: 1 << 20,
    }];
    a.transfer(b.name(), TransferOp::Read, &read, T)
        .await
        .unwrap();
    assert_eq!(back, src1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_descriptors_are_refused_before_any_byte_moves() {
    let a = engine(EngineConfig::default()).await;
    let b = engine(EngineConfig::default()).await;
    let src = pattern(8192, 3);
    let dst1 = vec![0u8; 4096];
    let dst2 = vec![0u8; 4096];
    let unregistered = [0u8; 64];
    register_rw(&a, &src);
    register_rw(&b, &dst1);
    register_rw(&b, &dst2);
    a.connect(b.name(), T).await.unwrap();
    let good = TransferOpDesc {
        local_addr: addr(&src),
        remote_addr: addr(&dst1),
        len: 4096,
    };
    // A second descriptor outside every remote region: nothing moves, not even the first.
    let outside = TransferOpDesc {
        local_addr: addr(&src),
        remote_addr: addr(&unregistered),
        len: 64,
    };
    let e = a
        .transfer(b.name(), TransferOp::Write, &[good, outside], T)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            EngineError::NotRegistered {
                side: Side::Remote,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("register"), "{e}");
    assert!(
        dst1.iter().all(|&x| x == 0),
        "the good descriptor moved nothing"
    );
    // Straddling the end of a remote region.
    let straddle = TransferOpDesc {
        local_addr: addr(&src),
        remote_addr: addr(&dst1) + 4000,
        len: 200,
    };
    let e = a
        .transfer(b.name(), TransferOp::Write, &[straddle], T)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            EngineError::Straddles {
                side: Side::Remote,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("split the descriptor"), "{e}");
    // Local memory that is not registered.
    let e = a
        .transfer(
            b.name(),
            TransferOp::Read,
            &[TransferOpDesc {
                local_addr: addr(&unregistered),
                remote_addr: addr(&dst1),
                len: 64,
            }],
            T,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            EngineError::NotRegistered {
                side: Side::Local,
                ..
            }
        ),
        "{e}"
    );
    // Zero-length descriptors and overlapping registrations.
    let zero = TransferOpDesc { len: 0, ..good };
    assert!(matches!(
        a.transfer(b.name(), TransferOp::Write, &[zero], T).await,
        Err(EngineError::InvalidArgument(_))
    ));
    // SAFETY: `src` is alive; the call is refused anyway.
    let overlap = unsafe {
        a.register_mem(
            MemDesc {
                addr: addr(&src) + 100,
                len: 10,
            },
            MemType::Host,
            hmc_engine::Access::READ_WRITE,
        )
    };
    assert!(
        matches!(overlap, Err(EngineError::Overlaps { .. })),
        "{overlap:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_table_follows_registrations_and_deregistrations() {
    let a = engine(EngineConfig::default()).await;
    let b = engine(EngineConfig::default()).await;
    let src = pattern(4096, 4);
    register_rw(&a, &src);
    a.connect(b.name(), T).await.unwrap();
    // Registered after the connect: found by fetching the table again.
    let late = vec![0u8; 4096];
    let h = register_rw(&b, &late);
    let d = [TransferOpDesc {
        local_addr: addr(&src),
        remote_addr: addr(&late),
        len: 4096,
    }];
    a.transfer(b.name(), TransferOp::Write, &d, T)
        .await
        .unwrap();
    assert_eq!(late, src);
    // Deregistered: the next transfer fails and names the address; the memory (still
    // allocated here) is not written.
    b.deregister_mem(h).await.unwrap();
    let src2 = pattern(4096, 99);
    register_rw(&a, &src2);
    let d2 = [TransferOpDesc {
        local_addr: addr(&src2),
        remote_addr: addr(&late),
        len: 4096,
    }];
    let e = a
        .transfer(b.name(), TransferOp::Write, &d2, T)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            EngineError::NotRegistered {
                side: Side::Remote,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(late, src, "deregistered memory was not written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_async_requests_complete_and_a_timeout_really_ends_one() {
    let a = engine(EngineConfig::default()).await;
    let b = engine(EngineConfig::default()).await;
    let src = pattern(16 << 20, 5);
    let dst = vec![0u8; 16 << 20];
    register_rw(&a, &src);
    register_rw(&b, &dst);
    a.connect(b.name(), T).await.unwrap();
    let reqs: Vec<_> = (0..16u64)
        .map(|i| {
            let off = i * (1 << 20);
            a.transfer_async(
                b.name(),
                TransferOp::Write,
                vec![TransferOpDesc {
                    local_addr: addr(&src) + off,
                    remote_addr: addr(&dst) + off,
                    len: 1 << 20,
                }],
                T,
            )
            .unwrap()
        })
        .collect();
    for r in &reqs {
        assert!(matches!(r.wait().await, TransferStatus::Completed));
        assert!(r.status().is_done());
    }
    assert_eq!(dst, src);
    // 16 MiB in one microsecond: timed out, reported as such.
    let r = a
        .transfer_async(
            b.name(),
            TransferOp::Read,
            vec![TransferOpDesc {
                local_addr: addr(&src),
                remote_addr: addr(&dst),
                len: 16 << 20,
            }],
            Duration::from_micros(1),
        )
        .unwrap();
    assert!(
        matches!(r.wait().await, TransferStatus::TimedOut),
        "{:?}",
        r.status()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_request_ends_failed_and_a_finished_one_keeps_its_status() {
    let a = engine(EngineConfig::default()).await;
    let b = engine(EngineConfig::default()).await;
    let src = pattern(64 << 20, 3);
    let dst = vec![0u8; 64 << 20];
    register_rw(&a, &src);
    register_rw(&b, &dst);
    a.connect(b.name(), T).await.unwrap();
    let d = TransferOpDesc {
        local_addr: addr(&src),
        remote_addr: addr(&dst),
        len: 64 << 20,
    };
    // Cancelled before the runtime even starts it: the stored signal is not lost.
    let r = a
        .transfer_async(b.name(), TransferOp::Write, vec![d], T)
        .unwrap();
    r.cancel();
    match r.wait().await {
        TransferStatus::Failed(e) => {
            assert!(matches!(*e, EngineError::Cancelled(_)), "{e}");
            assert!(e.to_string().contains("was cancelled"), "{e}");
        }
        other => panic!("expected a cancelled transfer, got {other:?}"),
    }
    // The engine is still usable, and cancelling a finished request changes nothing.
    let small = TransferOpDesc { len: 4096, ..d };
    let r = a
        .transfer_async(b.name(), TransferOp::Write, vec![small], T)
        .unwrap();
    assert!(matches!(r.wait().await, TransferStatus::Completed));
    r.cancel();
    assert!(matches!(r.status(), TransferStatus::Completed));
    assert_eq!(dst[..4096], src[..4096]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_a_silent_peer_times_out() {
    // Accepts connections and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let a = engine(EngineConfig::default()).await;
    let e = a
        .connect(&addr.to_string(), Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(e, EngineError::Timeout { .. }), "{e}");
    assert!(e.to_string().contains("pass a longer timeout"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_arrive_in_order_and_are_bounded() {
    let a = engine(EngineConfig::default()).await;
    let b = engine(EngineConfig {
        max_pending_notifies: 2,
        ..EngineConfig::default()
    })
    .await;
    a.connect(b.name(), T).await.unwrap();
    a.send_notify(b.name(), "kv", b"one", T).await.unwrap();
    a.send_notify(b.name(), "kv", b"two", T).await.unwrap();
    let e = a
        .send_notify(b.name(), "kv", b"three", T)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("max_pending_notifies"), "{e}");
    let got = b.get_notifies();
    assert_eq!(got.len(), 2);
    assert_eq!(
        (got[0].msg.as_slice(), got[1].msg.as_slice()),
        (&b"one"[..], &b"two"[..])
    );
    assert_eq!(got[0].from, a.name());
    assert!(b.get_notifies().is_empty());
    a.send_notify(b.name(), "kv", b"again", T).await.unwrap();
    assert_eq!(b.get_notifies().len(), 1);
    // Over the sender's own max_notify_len: refused before it is sent, naming the limit
    // (a bad argument of the caller's, not a failed peer), and nothing arrives.
    let big = vec![7u8; EngineConfig::default().max_notify_len + 1];
    let e = a.send_notify(b.name(), "kv", &big, T).await.unwrap_err();
    assert!(
        matches!(
            e,
            EngineError::Limit {
                limit: "max_notify_len",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(b.get_notifies().is_empty());
}

/// Lengths whose sum overflows 64 bits (found by the C API's fuzz target, where they
/// panicked in the transfer counters under overflow checks) are refused as an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptor_lengths_that_overflow_their_sum_are_an_error() {
    let a = engine(EngineConfig::default()).await;
    let b = engine(EngineConfig::default()).await;
    a.connect(b.name(), T).await.unwrap();
    let huge = TransferOpDesc {
        local_addr: 0x1000,
        remote_addr: 0x1000,
        len: usize::MAX,
    };
    let e = a
        .transfer(b.name(), TransferOp::Write, &[huge, huge], T)
        .await
        .unwrap_err();
    assert!(!e.to_string().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_rules() {
    let a = engine(EngineConfig::default()).await;
    let b = engine(EngineConfig::default()).await;
    let e = a
        .transfer(b.name(), TransferOp::Write, &[], T)
        .await
        .unwrap_err();
    assert!(matches!(e, EngineError::NotConnected(_)), "{e}");
    a.connect(b.name(), T).await.unwrap();
    assert!(matches!(
        a.connect(b.name(), T).await,
        Err(EngineError::AlreadyConnected(_))
    ));
    assert_eq!(a.peers().len(), 1);
    a.disconnect(b.name()).await.unwrap();
    assert!(matches!(
        a.disconnect(b.name()).await,
        Err(EngineError::NotConnected(_))
    ));
    // Nobody listens there.
    let e = a
        .connect("127.0.0.1:1", Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(e.is_connection_refused() && e.is_retryable(), "{e:?}");
    b.finalize().await;
    assert!(matches!(
        b.connect(a.name(), T).await,
        Err(EngineError::Finalized)
    ));
}

#[test]
fn the_blocking_api_from_plain_threads() {
    let a = BlockingEngine::initialize(open, "127.0.0.1", EngineConfig::default()).unwrap();
    let b = BlockingEngine::initialize(open, "127.0.0.1", EngineConfig::default()).unwrap();
    let src = pattern(256 << 10, 6);
    let dst = vec![0u8; 256 << 10];
    // SAFETY: both buffers outlive the engines' registrations (deregistered below).
    let (ha, hb) = unsafe {
        (
            a.register_mem(
                MemDesc {
                    addr: addr(&src),
                    len: src.len(),
                },
                MemType::Host,
                hmc_engine::Access::READ_WRITE,
            )
            .unwrap(),
            b.register_mem(
                MemDesc {
                    addr: addr(&dst),
                    len: dst.len(),
                },
                MemType::Host,
                hmc_engine::Access::READ_WRITE,
            )
            .unwrap(),
        )
    };
    a.connect(b.name(), T).unwrap();
    let d = TransferOpDesc {
        local_addr: addr(&src),
        remote_addr: addr(&dst),
        len: src.len(),
    };
    a.transfer_sync(b.name(), TransferOp::Write, &[d], T)
        .unwrap();
    assert_eq!(dst, src);
    let r = a
        .transfer_async(b.name(), TransferOp::Read, vec![d], T)
        .unwrap();
    assert!(matches!(a.wait(&r), TransferStatus::Completed));
    a.send_notify(b.name(), "done", b"1", T).unwrap();
    assert_eq!(b.get_notifies()[0].name, "done");
    a.deregister_mem(ha).unwrap();
    b.deregister_mem(hb).unwrap();
    a.finalize();
    b.finalize();
}
