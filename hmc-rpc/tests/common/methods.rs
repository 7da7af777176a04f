//! Test methods served by in-process servers: the demo methods plus a sleeping, a
//! panicking, a blocking and a cancel-observing one.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use hmc_rpc::{Dispatcher, RpcError, demo};

pub const SLEEP: u32 = 100;
pub const PANIC: u32 = 101;
pub const BLOCKING_SLEEP: u32 = 102;
pub const WAIT_CANCEL: u32 = 103;

/// The demo methods and the test methods; `cancelled` counts handlers of
/// [`WAIT_CANCEL`] that ended (saw the cancel, or were dropped by the server).
pub fn dispatcher(cancelled: Arc<AtomicUsize>) -> Dispatcher {
    let mut d = Dispatcher::new();
    demo::register_demo(&mut d);
    d.register(SLEEP, |_ctx, ms: u64| async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok::<_, RpcError>(ms)
    });
    d.register_raw(PANIC, |_ctx, _b| async move {
        if true {
            panic!("handler bug");
        }
        Ok(Bytes::new())
    });
    d.register_blocking(BLOCKING_SLEEP, |ctx, ms: u64| {
        std::thread::sleep(Duration::from_millis(ms));
        Ok::<_, RpcError>(ctx.remaining().map_or(0, |r| r.as_millis() as u64))
    });
    d.register_raw(WAIT_CANCEL, move |ctx, _b| {
        let cancelled = cancelled.clone();
        async move {
            // Observes the cancel signal from inside the handler.
            let token = ctx.cancel.clone();
            let guard = CountOnDrop(cancelled);
            token.cancelled().await;
            drop(guard);
            Ok(Bytes::new())
        }
    });
    d
}

pub struct CountOnDrop(Arc<AtomicUsize>);
impl Drop for CountOnDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// The `complex` demo request both clients' tests send, and the answer it must get.
pub fn complex_request() -> demo::ComplexRequest {
    demo::ComplexRequest {
        label: "x".into(),
        values: vec![3, 5, 8],
    }
}

/// Checks the answer to [`complex_request`].
pub fn assert_complex_answer(r: &demo::ComplexResponse) {
    assert_eq!((r.sum, r.count, r.max), (16, 3, Some(8)));
}
