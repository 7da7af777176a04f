//! What the data-plane tests share: a TCP communicator on loopback, the payload pattern
//! they check byte for byte, the demo methods (and a slow echo), and the plumbing of a client that lives in
//! its own runtime.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hmc_core::{Communicator, PeerAddr};
use hmc_rpc::{Client, ClientConfig, Dispatcher, RpcError, RunningServer, demo};
use hmc_transport_tcp::{TcpCommunicator, TcpConfig};

/// A TCP communicator bound to an ephemeral loopback port, default settings.
pub fn tcp_comm() -> Arc<TcpCommunicator> {
    Arc::new(
        TcpCommunicator::bind(&"tcp://127.0.0.1:0".parse().unwrap(), TcpConfig::default()).unwrap(),
    )
}

/// `len` bytes that differ with `seed` and along their length (so a misplaced chunk shows).
pub fn pattern(len: usize, seed: u32) -> Bytes {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// A dispatcher serving the demo methods (`demo::ECHO` and the rest) and nothing else yet.
pub fn demo_dispatcher() -> Dispatcher {
    let mut d = Dispatcher::new();
    demo::register_demo(&mut d);
    d
}

/// A method that echoes its payload after 400 ms: a call still in flight when a test
/// tears its client down.
pub const SLOW_ECHO: u32 = 200;

/// [`demo_dispatcher`] plus [`SLOW_ECHO`].
pub fn slow_echo_dispatcher() -> Dispatcher {
    let mut d = demo_dispatcher();
    d.register_raw(SLOW_ECHO, |_ctx, b| async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        Ok::<_, RpcError>(b)
    });
    d
}

/// A runtime of one worker, for a client that lives (and is torn down) in its own thread.
pub fn one_worker_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// A client of the server at `addr` with default settings, using `comm` as its data plane.
pub async fn client_over<C: Communicator>(addr: &PeerAddr, comm: Arc<C>) -> Client<C> {
    Client::connect(addr, ClientConfig::default())
        .await
        .unwrap()
        .with_data_plane(comm)
}

/// A client over `comm`, in `rt`, whose 1 MiB [`SLOW_ECHO`] call has been running for
/// 150 ms: what a test tears down mid-call.
pub fn client_mid_call<C: Communicator>(
    rt: &tokio::runtime::Runtime,
    addr: &PeerAddr,
    comm: Arc<C>,
) -> Client<C> {
    let c = rt.block_on(client_over(addr, comm));
    let c2 = c.clone();
    rt.spawn(async move { c2.call(SLOW_ECHO, pattern(1 << 20, 8)).await });
    std::thread::sleep(Duration::from_millis(150));
    c
}

/// The bytes of `s`'s data-plane pool in use, polled every 50 ms until none are, or
/// `tries` polls have passed.
pub async fn pool_in_use_after(s: &RunningServer, tries: u32) -> usize {
    let mut in_use = usize::MAX;
    for _ in 0..tries {
        in_use = s.data_plane_stats().unwrap().pool.in_use_bytes;
        if in_use == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    in_use
}
