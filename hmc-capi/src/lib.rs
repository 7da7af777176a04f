//! `libhmc`: the HMC engine and RPC runtime behind a stable C ABI, for C, C++ and any
//! language with a C FFI (Go, Java, Zig). The header is `include/hmc/hmc.h` (C11); a
//! header-only C++17 layer over it, with HIXL's names in `hmc::hixl`, is
//! `include/hmc/hmc.hpp`; `docs/c-api.md` is the guide.
//!
//! # What it is for, and what not
//!
//! This crate only translates: every call checks its C arguments, runs the Rust API
//! ([`hmc_engine::Engine`], [`hmc_rpc`]'s server and client) on a tokio runtime this library
//! owns (two worker threads, started on first use), and turns the outcome into an
//! `hmc_status` and, on failure, this thread's message (`hmc_last_error`). It adds no
//! transfer or RPC behaviour of its own, except what C needs: a pollable descriptor per
//! engine (an eventfd made readable when an asynchronous request completes or a
//! notification arrives), completion callbacks, and handle tables.
//!
//! # Safety at the boundary
//!
//! - No panic crosses into C: every exported function runs its body in
//!   `error::guard`, which turns a panic into `HMC_ERR_INTERNAL` with its message.
//! - A handle is a number looked up in a table (module `handles`), never a pointer to Rust
//!   memory: a NULL, closed, released, made-up or wrong-kind handle is an error, not a
//!   dereference. Handles are usable from many threads at once.
//! - Pointers to caller memory (strings, descriptor arrays, output buffers) are checked for
//!   NULL and their counts against the engine's limits before a slice is formed; beyond
//!   that, their validity is the caller's contract, written for each function in `hmc.h`.
//!   Registered memory must stay allocated until deregistered, as in the Rust API.
//! - A blocking call made on one of the library's own threads (inside a completion
//!   callback or an RPC handler) would deadlock the runtime: it fails `HMC_ERR_STATE`.
//!
//! Every `unsafe` block carries its `// SAFETY:` reasoning.

use std::ffi::c_char;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

pub mod engine;
mod engine_tables;
pub mod error;
mod handles;
pub mod kv;
pub mod prepared;
pub mod request;
pub mod rpc;

pub use error::{Error, Status};

/// `HMC_API_VERSION_MAJOR` of `hmc.h`: the SONAME's number (`libhmc.so.0`); a change that
/// breaks a program built against an older header bumps it.
pub const API_VERSION_MAJOR: u32 = 0;
/// `HMC_API_VERSION_MINOR` of `hmc.h`: bumped when functions or struct fields are added.
pub const API_VERSION_MINOR: u32 = 1;

static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();

/// Set in a child forked after the runtime started (its threads did not come along).
static FORKED: AtomicBool = AtomicBool::new(false);

extern "C" fn mark_forked() {
    FORKED.store(true, Ordering::Relaxed);
}

/// The library's runtime, started on first use.
pub(crate) fn runtime() -> error::Result<&'static tokio::runtime::Runtime> {
    let rt = RUNTIME.get_or_init(|| {
        // SAFETY: registers a handler that only stores to an atomic (async-signal-safe,
        // as a fork child handler must be).
        unsafe { libc::pthread_atfork(None, None, Some(mark_forked)) };
        ignore_sigpipe();
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("hmc-capi")
            .enable_all()
            .build()
            .expect("a tokio runtime starts")
    });
    if FORKED.load(Ordering::Relaxed) {
        return Err(Error::State(
            "this process was forked from one that had already used libhmc, and the \
             library's threads do not survive a fork; use libhmc only after the fork (or exec)"
                .into(),
        ));
    }
    Ok(rt)
}

/// A write to a socket whose peer has gone raises SIGPIPE, whose default action kills the
/// process; Rust programs ignore it from `main`, a C program does not. So, as a socket
/// library must, libhmc sets SIGPIPE to "ignore" when it starts, if the program left it at
/// the default (a handler the program installed is kept); writes then fail with EPIPE,
/// which the runtime reports as a lost connection. hmc.h says so.
fn ignore_sigpipe() {
    // SAFETY: `sigaction` with a NULL new action only reads the current one into `old`, a
    // zeroed struct of the right type; the second call installs SIG_IGN, which needs no
    // handler code.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGPIPE, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_DFL
        {
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        }
    }
}

/// Runs `fut` to its end on the runtime, blocking the calling thread; refused on one of
/// the runtime's own threads (a callback or handler), where it would deadlock.
pub(crate) fn block_on<F: Future>(fut: F) -> error::Result<F::Output> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(Error::State(
            "a blocking call from a completion callback or RPC handler (a libhmc thread); \
             post an asynchronous call, or hand the work to a thread of your own"
                .into(),
        ));
    }
    Ok(runtime()?.block_on(fut))
}

/// `hmc_api_version`: the library's API version, `(major << 16) | minor`, to compare with
/// the header's `HMC_API_VERSION` (same major, minor at least the header's).
#[unsafe(no_mangle)]
pub extern "C" fn hmc_api_version() -> u32 {
    (API_VERSION_MAJOR << 16) | API_VERSION_MINOR
}

/// `hmc_last_error`: this thread's last error message (empty if none yet). The string is
/// owned by the library and valid until the next failing call on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_last_error() -> *const c_char {
    error::last_error_ptr()
}

/// `hmc_status_name`: the name of a status (`"HMC_ERR_DEADLINE"`); a static string.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_status_name(status: i32) -> *const c_char {
    // Static, NUL-terminated copies of the names.
    static NAMES: OnceLock<Vec<std::ffi::CString>> = OnceLock::new();
    let names = NAMES.get_or_init(|| {
        (0..=Status::Internal as i32 + 1)
            .map(|i| std::ffi::CString::new(Status::name(i)).unwrap_or_default())
            .collect()
    });
    let i = usize::try_from(status)
        .ok()
        .filter(|&i| i < names.len() - 1)
        .unwrap_or(names.len() - 1);
    names[i].as_ptr()
}
