//! What the data-plane tests share: a TCP communicator on loopback, the payload pattern
//! they check byte for byte, the demo methods (and a slow echo), and the plumbing of a client that lives in
//! its own runtime.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hmc_core::{Communicator, PeerAddr};
use hmc_rpc::{Client, ClientConfig, Dispatcher, RpcError, demo};
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
