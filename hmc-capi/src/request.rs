//! Asynchronous transfers through C: `hmc_transfer_async` and the request's status, wait,
//! cancel, telemetry and release; completion reaches the caller three ways, all optional:
//! polling the status, the engine's descriptor (`hmc_engine_fd`, then
//! `hmc_engine_poll_completed`), and a callback.

use std::ffi::{c_char, c_void};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use hmc_engine::TransferStatus;
use parking_lot::Mutex;

use crate::engine::{HmcEngine, XferDesc, descs_arg, engine_arg, op_arg};
use crate::engine_tables::{Outcome, REQUESTS, ReqObj, outcome_of};
use crate::error::{Result, Status, guard, guard_with};
use crate::handles::{
    drain_completed, id, need_out, opaque, optional_arg, ptr, same_engine, sized_arg, str_arg,
    write_out,
};
use crate::{block_on, runtime};

opaque! {
    /// `hmc_request`: an opaque request handle.
    HmcRequest;
}

/// `hmc_request_callback`: called once, on a library thread, when a request ends.
pub type RequestCallback =
    Option<unsafe extern "C" fn(user_data: *mut c_void, req: *mut HmcRequest, status: i32)>;

/// `hmc_transfer_args`: optional arguments of `hmc_transfer_async` (HIXL's
/// `TransferArgs`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TransferArgs {
    /// `sizeof(hmc_transfer_args)`.
    pub struct_size: usize,
    /// NULL, or called once when the request ends.
    pub callback: RequestCallback,
    /// Passed to `callback`.
    pub user_data: *mut c_void,
}

impl Default for TransferArgs {
    fn default() -> Self {
        TransferArgs {
            struct_size: 0,
            callback: None,
            user_data: std::ptr::null_mut(),
        }
    }
}

/// `hmc_telemetry`: what one request did.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct TelemetryC {
    /// `sizeof(hmc_telemetry)` as the caller compiled it.
    pub struct_size: usize,
    /// When it was posted, in nanoseconds since the Unix epoch.
    pub posted_at_unix_ns: u64,
    /// How long it ran, in nanoseconds.
    pub duration_ns: u64,
    /// Bytes it was asked to move.
    pub bytes: u64,
    /// Descriptors it was given.
    pub descs: u64,
}

/// The caller's callback data, carried to the runtime thread that calls it.
struct UserData(*mut c_void);
// SAFETY: the pointer is only handed back to the caller's callback, which the caller
// documented as callable from any thread (hmc.h).
unsafe impl Send for UserData {}

/// The open request `r` of engine `e`.
fn request_arg(e: *const HmcEngine, r: *const HmcRequest) -> Result<Arc<ReqObj>> {
    engine_arg(e)?;
    let req = REQUESTS.get(id(r))?;
    same_engine("request", id(r), req.engine, id(e))?;
    Ok(req)
}

/// `hmc_transfer_async`: see `hmc.h`.
///
/// # Safety
/// `remote` is a NUL-terminated string; `descs` points to `num_descs` descriptors; `args`
/// is NULL or a valid `hmc_transfer_args`; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_transfer_async(
    engine: *mut HmcEngine,
    remote: *const c_char,
    op: u32,
    descs: *const XferDesc,
    num_descs: usize,
    timeout_ms: u32,
    args: *const TransferArgs,
    out: *mut *mut HmcRequest,
) -> Status {
    guard("hmc_transfer_async", || {
        need_out(out, "out")?;
        let e = engine_arg(engine)?;
        // SAFETY: forwarded contract.
        let remote = unsafe { str_arg(remote, "remote_engine") }?;
        let op = op_arg(op)?;
        // SAFETY: forwarded contract.
        let d = unsafe { descs_arg(&e, descs, num_descs) }?;
        // SAFETY: forwarded contract.
        let args = unsafe { optional_arg(args, "hmc_transfer_args") }?;
        let rt = runtime()?;
        let bytes = d.iter().map(|x| x.len as u64).sum();
        let n = d.len() as u64;
        let started = Instant::now();
        let posted_at = SystemTime::now();
        let req = {
            // transfer_async spawns on the runtime it finds: enter ours.
            let _in = rt.enter();
            e.engine
                .transfer_async(remote, op, d, e.timeout(timeout_ms))?
        };
        let obj = ReqObj {
            engine: id(engine),
            req: req.clone(),
            posted_at,
            bytes,
            descs: n,
            outcome: Mutex::new(None),
        };
        let rid = REQUESTS.insert(obj);
        // Taken before the handle is given out (another thread could release it at once).
        let obj = REQUESTS.get(rid)?;
        // SAFETY: checked writable above. Written before the waiter can call back with it.
        unsafe { write_out(out, "out", ptr(rid)) }?;
        let wake = e.wake.clone();
        let completed = e.completed.clone();
        let (callback, user) = (args.callback, UserData(args.user_data));
        rt.spawn(async move {
            let st = req.wait().await;
            let outcome = outcome_of(&st, started.elapsed());
            let status = outcome.status;
            *obj.outcome.lock() = Some(outcome);
            drop(obj);
            completed.lock().push_back(rid);
            wake.signal();
            if let Some(cb) = callback {
                let user = user;
                // SAFETY: the caller's callback with the caller's data, as documented.
                unsafe { cb(user.0, ptr(rid), status as i32) };
            }
        });
        Ok(())
    })
}

/// The outcome of `r` so far (`None`: still running), with its status set as this
/// thread's error when it failed.
fn report(r: &ReqObj) -> Option<Outcome> {
    r.outcome.lock().clone()
}

/// `hmc_request_status`: see `hmc.h`.
///
/// # Safety
/// `state` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_request_status(
    engine: *mut HmcEngine,
    req: *mut HmcRequest,
    state: *mut u32,
) -> Status {
    guard_with("hmc_request_status", || {
        let r = request_arg(engine, req)?;
        let o = report(&r).unwrap_or_else(|| outcome_of(&TransferStatus::Waiting, Duration::ZERO));
        if !state.is_null() {
            // SAFETY: non-null and writable by the caller's contract.
            unsafe { state.write(o.state) };
        }
        o.into_result()
    })
}

/// `hmc_request_wait`: see `hmc.h`.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_request_wait(
    engine: *mut HmcEngine,
    req: *mut HmcRequest,
    timeout_ms: u32,
) -> Status {
    guard_with("hmc_request_wait", || {
        let r = request_arg(engine, req)?;
        if let Some(o) = report(&r) {
            return o.into_result();
        }
        let wait = Duration::from_millis(u64::from(timeout_ms));
        let waited = block_on(async {
            tokio::time::timeout(wait, async {
                // The waiter task records the outcome right after the request ends.
                r.req.wait().await;
                loop {
                    if let Some(o) = report(&r) {
                        return o;
                    }
                    tokio::task::yield_now().await;
                }
            })
            .await
        })?;
        match waited {
            Ok(o) => o.into_result(),
            Err(_) => Ok(Status::Pending),
        }
    })
}

/// `hmc_request_cancel`: see `hmc.h`.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_request_cancel(engine: *mut HmcEngine, req: *mut HmcRequest) -> Status {
    guard("hmc_request_cancel", || {
        request_arg(engine, req)?.req.cancel();
        Ok(())
    })
}

/// `hmc_request_release`: see `hmc.h`.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_request_release(engine: *mut HmcEngine, req: *mut HmcRequest) -> Status {
    guard("hmc_request_release", || {
        request_arg(engine, req)?;
        let r = REQUESTS.remove(id(req))?;
        if r.outcome.lock().is_none() {
            r.req.cancel();
        }
        Ok(())
    })
}

/// `hmc_request_telemetry`: see `hmc.h`.
///
/// # Safety
/// `out` points to a `hmc_telemetry` whose `struct_size` is set, writable for that many
/// bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_request_telemetry(
    engine: *mut HmcEngine,
    req: *mut HmcRequest,
    out: *mut TelemetryC,
) -> Status {
    guard_with("hmc_request_telemetry", || {
        let r = request_arg(engine, req)?;
        // SAFETY: forwarded contract (reads its struct_size).
        let t = unsafe { sized_arg(out, "hmc_telemetry", size_of::<TelemetryC>()) }?;
        let o = report(&r);
        let v = TelemetryC {
            struct_size: t.struct_size,
            posted_at_unix_ns: r
                .posted_at
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
            duration_ns: o.as_ref().map_or(0, |o| o.duration.as_nanos() as u64),
            bytes: r.bytes,
            descs: r.descs,
        };
        // SAFETY: `out` is writable for its struct_size, which is at least ours (checked by
        // sized_arg: a larger one only has zero bytes past ours, left as they are).
        unsafe { out.write(v) };
        Ok(if o.is_some() {
            Status::Ok
        } else {
            Status::Pending
        })
    })
}

/// `hmc_engine_poll_completed`: see `hmc.h`.
///
/// # Safety
/// `reqs` is writable for `cap` handles; `count` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_engine_poll_completed(
    engine: *mut HmcEngine,
    reqs: *mut *mut HmcRequest,
    cap: usize,
    count: *mut usize,
) -> Status {
    guard("hmc_engine_poll_completed", || {
        need_out(count, "count")?;
        if cap > 0 {
            need_out(reqs, "reqs")?;
        }
        let e = engine_arg(engine)?;
        // SAFETY: forwarded contract.
        let n = unsafe { drain_completed(&mut e.completed.lock(), &REQUESTS, reqs, cap) };
        // SAFETY: checked writable above.
        unsafe { write_out(count, "count", n) }
    })
}
