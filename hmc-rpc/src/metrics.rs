//! Counters, gauges and histograms through the `metrics` facade: free when no recorder is
//! installed (a library never installs one; `hmc-rpc-server --metrics-addr` does, with a
//! Prometheus exporter).
//!
//! Names (all prefixed `hmc_rpc_`): `server_calls_total` and `server_errors_total`
//! (label `status`), `server_bytes_received_total`, `server_bytes_sent_total`,
//! `server_inflight`, `server_connections`, `server_handler_seconds`;
//! `client_calls_total`, `client_errors_total` (label `kind`), `client_bytes_sent_total`,
//! `client_bytes_received_total`, `client_inflight`, `client_call_seconds`,
//! `client_connects_total` and `client_reconnects_total`.
//!
//! Gauges of what peers make a process hold: `server_held_bytes` (the held-byte budget in
//! use, all servers of the process together, moved when a connection settles, see
//! [`crate::budget`]) and `server_held_bytes_limit` (their `max_held_bytes`, summed);
//! `pool_registered_bytes` and `pool_in_use_bytes` (the HMC_BUFFER data plane's pools of
//! registered buffers, client and server alike: registered now, and lent to calls now).

use std::time::Instant;

use crate::frame::Status;

/// An admitted server call: in flight until dropped, when the handler's time is recorded.
pub(crate) struct ServerCall<P> {
    _permit: P,
    start: Instant,
}

impl<P> ServerCall<P> {
    pub(crate) fn admit(permit: P, payload_len: u64) -> Self {
        metrics::counter!("hmc_rpc_server_calls_total").increment(1);
        metrics::counter!("hmc_rpc_server_bytes_received_total").increment(payload_len);
        metrics::gauge!("hmc_rpc_server_inflight").increment(1.0);
        ServerCall {
            _permit: permit,
            start: Instant::now(),
        }
    }
}

impl<P> Drop for ServerCall<P> {
    fn drop(&mut self) {
        metrics::gauge!("hmc_rpc_server_inflight").decrement(1.0);
        metrics::histogram!("hmc_rpc_server_handler_seconds")
            .record(self.start.elapsed().as_secs_f64());
    }
}

/// A call answered by the server, with its status and answer length.
pub(crate) fn server_answered(status: Status, len: usize) {
    metrics::counter!("hmc_rpc_server_bytes_sent_total").increment(len as u64);
    if status != Status::OK {
        metrics::counter!("hmc_rpc_server_errors_total", "status" => status_name(status))
            .increment(1);
    }
}

/// An open server connection, counted until dropped.
pub(crate) struct ServerConnection(());

impl ServerConnection {
    pub(crate) fn open() -> Self {
        metrics::gauge!("hmc_rpc_server_connections").increment(1.0);
        ServerConnection(())
    }
}

impl Drop for ServerConnection {
    fn drop(&mut self) {
        metrics::gauge!("hmc_rpc_server_connections").decrement(1.0);
    }
}

fn status_name(s: Status) -> String {
    s.name().to_lowercase()
}

/// A client call in flight until dropped.
pub(crate) struct ClientCall {
    start: Instant,
}

impl ClientCall {
    pub(crate) fn start(payload_len: usize) -> Self {
        metrics::counter!("hmc_rpc_client_calls_total").increment(1);
        metrics::counter!("hmc_rpc_client_bytes_sent_total").increment(payload_len as u64);
        metrics::gauge!("hmc_rpc_client_inflight").increment(1.0);
        ClientCall {
            start: Instant::now(),
        }
    }

    /// Records the outcome: the answer's length, or the error's kind.
    pub(crate) fn finish(&self, result: Result<usize, &crate::CallError>) {
        metrics::histogram!("hmc_rpc_client_call_seconds")
            .record(self.start.elapsed().as_secs_f64());
        match result {
            Ok(n) => metrics::counter!("hmc_rpc_client_bytes_received_total").increment(n as u64),
            Err(e) => {
                metrics::counter!("hmc_rpc_client_errors_total", "kind" => e.kind()).increment(1)
            }
        }
    }
}

impl Drop for ClientCall {
    fn drop(&mut self) {
        metrics::gauge!("hmc_rpc_client_inflight").decrement(1.0);
    }
}

/// Moves a gauge up or down by `n`.
fn moved(g: metrics::Gauge, up: bool, n: u64) {
    if up {
        g.increment(n as f64)
    } else {
        g.decrement(n as f64)
    }
}

/// A server connection settled its held bytes from `from` to `to` (a
/// [`crate::budget::SettleObserver`]).
pub(crate) fn held_bytes_settled(from: u64, to: u64) {
    moved(
        metrics::gauge!("hmc_rpc_server_held_bytes"),
        to >= from,
        to.abs_diff(from),
    );
}

/// A running server's `max_held_bytes`, counted in `server_held_bytes_limit` until
/// dropped.
pub(crate) struct HeldLimit(u64);

impl HeldLimit {
    pub(crate) fn open(limit: u64) -> Self {
        metrics::gauge!("hmc_rpc_server_held_bytes_limit").increment(limit as f64);
        HeldLimit(limit)
    }
}

impl Drop for HeldLimit {
    fn drop(&mut self) {
        metrics::gauge!("hmc_rpc_server_held_bytes_limit").decrement(self.0 as f64);
    }
}

/// A buffer pool registered (`up`) or deregistered `n` bytes.
pub(crate) fn pool_registered(up: bool, n: usize) {
    moved(
        metrics::gauge!("hmc_rpc_pool_registered_bytes"),
        up,
        n as u64,
    );
}

/// A buffer pool lent (`up`) or took back `n` bytes.
pub(crate) fn pool_in_use(up: bool, n: usize) {
    moved(metrics::gauge!("hmc_rpc_pool_in_use_bytes"), up, n as u64);
}

/// A client connection made; `again` when it replaces a lost one.
pub(crate) fn client_connected(again: bool) {
    metrics::counter!("hmc_rpc_client_connects_total").increment(1);
    if again {
        metrics::counter!("hmc_rpc_client_reconnects_total").increment(1);
    }
}
