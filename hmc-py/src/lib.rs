//! `hmc-py`: the Python package `hmc` (its extension module `hmc._hmc`), a thin layer over
//! [`hmc_engine`] and [`hmc_rpc`]: the one-sided engine with HIXL's calls in snake_case
//! ([`engine`]), the KV-cache API of [`hmc_engine::kv`] ([`kv`]), and the RPC client and
//! server ([`rpc`]).
//!
//! # What this crate does and does not do
//!
//! It converts arguments, holds Python objects alive while their memory is registered,
//! and drives the Rust futures; every engine rule (descriptor checks, tables, timeouts,
//! limits) stays in `hmc-engine`. Memory is used in place: a buffer-protocol object's
//! `Py_buffer` (or a DLPack capsule) is held from `register_mem` to `deregister_mem`,
//! because peers may read or write registered memory at any time, as a DMA engine would.
//!
//! # Threads and signals
//!
//! One tokio runtime per process (two workers, made on first use) runs every engine,
//! client and server. Blocking calls detach from the interpreter (the GIL is released)
//! and wake every [`SIGNAL_CHECK`] to run Python's signal handlers, so Ctrl-C raises
//! `KeyboardInterrupt` and drops the Rust future, which cancels the operation (the
//! transport's cancellation contract: its memory is no longer touched). All classes are
//! frozen and `Sync`: calls from many Python threads at once are safe, with or without a
//! GIL. A process forked after the runtime started cannot use it (use multiprocessing's
//! `spawn` start method); calls there raise `hmc.StateError` saying so.
//!
//! # Safety
//!
//! `register_mem((addr, length))` trusts the caller as the Rust `register_mem` does. Every
//! other registration derives its range from an object it keeps alive, and refuses
//! read-only memory as the target of a READ.

use std::future::Future;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use pyo3::prelude::*;

mod buffer;
mod devices;
mod dlpack;
pub mod engine;
mod errors;
pub mod kv;
mod prepared;
pub mod rpc;

/// How often a blocking call wakes to run Python's signal handlers (Ctrl-C).
pub const SIGNAL_CHECK: Duration = Duration::from_millis(50);

static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();

/// Set in a child forked after the runtime started (its threads did not come along).
static FORKED: AtomicBool = AtomicBool::new(false);

extern "C" fn mark_forked() {
    FORKED.store(true, Ordering::Relaxed);
}

/// The process's runtime, started on first use.
pub(crate) fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    let rt = RUNTIME.get_or_init(|| {
        // SAFETY: registers a handler that only stores to an atomic (async-signal-safe,
        // as a fork child handler must be).
        unsafe { libc::pthread_atfork(None, None, Some(mark_forked)) };
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("hmc-py")
            .enable_all()
            .build()
            .expect("a tokio runtime starts")
    });
    if FORKED.load(Ordering::Relaxed) {
        return Err(errors::state(
            "this process was forked from one that had already used hmc, and the runtime's threads do not survive a fork; start worker processes with multiprocessing's 'spawn' (or 'forkserver') start method",
        ));
    }
    Ok(rt)
}

/// Runs `fut` to completion on the runtime with the interpreter detached, waking every
/// [`SIGNAL_CHECK`] to run signal handlers. An exception from a handler (Ctrl-C's
/// `KeyboardInterrupt`) drops `fut`, cancelling what it was doing, and is returned.
pub(crate) fn wait<F>(py: Python<'_>, fut: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let rt = runtime()?;
    let mut fut = std::pin::pin!(fut);
    loop {
        let step = py.detach(|| {
            rt.block_on(async { tokio::time::timeout(SIGNAL_CHECK, fut.as_mut()).await })
        });
        match step {
            Ok(out) => return Ok(out),
            Err(_) => py.check_signals()?,
        }
    }
}

/// Runs clean-up `fut` to its end: blocking, with the interpreter detached, or as a task
/// of its own on a thread inside the runtime (where blocking is not allowed: an object
/// dropped there).
pub(crate) fn finish<F>(fut: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    Python::attach(|py| {
        let Ok(rt) = runtime() else { return };
        if tokio::runtime::Handle::try_current().is_ok() {
            rt.spawn(fut);
        } else {
            py.detach(|| rt.block_on(fut));
        }
    });
}

/// Milliseconds from Python as a `Duration`.
pub(crate) fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// The extension module `hmc._hmc`; the package `hmc` re-exports it.
#[pymodule]
fn _hmc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    engine::add(m)?;
    kv::add(m)?;
    prepared::add(m)?;
    rpc::add(m)?;
    m.add("SIGNAL_CHECK_MS", SIGNAL_CHECK.as_millis() as u64)?;
    Ok(())
}
