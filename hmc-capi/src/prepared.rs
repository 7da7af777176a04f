//! Prepared descriptor lists and the transfers made of them through C (NIXL's shape):
//! `hmc_prep_local` / `hmc_prep_remote` resolve blocks (single or strided) once;
//! `hmc_make_xfer` pairs entries of a local and a remote list by index, with an optional
//! notification; `hmc_xfer_post` runs it (again and again), `hmc_xfer_status` / `_wait`
//! / `_telemetry` report each post, `hmc_xfer_release` ends it. A post's end also makes
//! the engine's descriptor readable. Over [`hmc_engine::PreparedList`] and
//! [`hmc_engine::PreparedTransfer`].

use std::ffi::c_char;
use std::sync::Arc;
use std::time::Duration;

use hmc_core::AnyCommunicator;
use hmc_engine::{BlockDesc, PreparedList, TransferStatus};

use crate::engine::{HmcEngine, engine_arg, op_arg};
use crate::engine_tables::{PREPPED, PreppedObj, XFERS, XferObj, outcome_of};
use crate::error::{Error, Result, Status, guard, guard_with};
use crate::handles::{
    id, need_out, opaque, ptr, same_engine, sized_arg, slice_arg, str_arg, write_out,
};
use crate::request::TelemetryC;
use crate::{block_on, runtime};

opaque! {
    /// `hmc_prepped`: an opaque prepared descriptor list.
    HmcPrepped;
    /// `hmc_xfer`: an opaque prepared transfer.
    HmcXfer;
}

/// `hmc_block_desc`: `count` blocks of `len` bytes, `stride` apart from `addr` (count 1:
/// one block). Fixed layout.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct BlockDescC {
    /// First block's address.
    pub addr: u64,
    /// Bytes per block.
    pub len: u64,
    /// Bytes from one block's start to the next's (ignored when `count` is 1).
    pub stride: u64,
    /// Blocks (at least 1).
    pub count: u64,
}

/// Most entries of one prepared list (a list of 1,000,000 KV blocks is the bench's case).
const MAX_ENTRIES: usize = 1 << 24;

/// Reads block descriptors.
///
/// # Safety
/// `blocks` holds `n` descriptors (when `n` is within [`MAX_ENTRIES`]).
unsafe fn blocks_arg(blocks: *const BlockDescC, n: usize) -> Result<Vec<BlockDesc>> {
    // SAFETY: forwarded contract; bounded first.
    let b = unsafe { slice_arg(blocks, n, MAX_ENTRIES, "blocks", "prepared list entries") }?;
    b.iter()
        .map(|d| {
            let len = usize::try_from(d.len)
                .map_err(|_| Error::InvalidArgument(format!("block len {} is too large", d.len)))?;
            if d.count == 0 {
                return Err(Error::InvalidArgument(
                    "a block descriptor with count 0; use 1 for one block".into(),
                ));
            }
            Ok(if d.count == 1 {
                BlockDesc::block(d.addr, len)
            } else {
                BlockDesc::strided(d.addr, len, d.stride, d.count)
            })
        })
        .collect()
}

fn add_list(
    engine: *mut HmcEngine,
    list: PreparedList<AnyCommunicator>,
    out: *mut *mut HmcPrepped,
) -> Result<()> {
    let p = PREPPED.insert(PreppedObj {
        engine: id(engine),
        list,
    });
    // SAFETY: the callers checked `out` writable before the work.
    unsafe { write_out(out, "out", ptr(p)) }
}

/// `hmc_prep_local`: see `hmc.h`.
///
/// # Safety
/// `blocks` holds `num_blocks` descriptors; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_prep_local(
    engine: *mut HmcEngine,
    blocks: *const BlockDescC,
    num_blocks: usize,
    out: *mut *mut HmcPrepped,
) -> Status {
    guard("hmc_prep_local", || {
        need_out(out, "out")?;
        let e = engine_arg(engine)?;
        // SAFETY: forwarded contract.
        let b = unsafe { blocks_arg(blocks, num_blocks) }?;
        let list = e.engine.prepare_local(&b)?;
        add_list(engine, list, out)
    })
}

/// `hmc_prep_remote`: see `hmc.h`.
///
/// # Safety
/// `remote` is a NUL-terminated string; `blocks` holds `num_blocks` descriptors; `out`
/// is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_prep_remote(
    engine: *mut HmcEngine,
    remote: *const c_char,
    blocks: *const BlockDescC,
    num_blocks: usize,
    timeout_ms: u32,
    out: *mut *mut HmcPrepped,
) -> Status {
    guard("hmc_prep_remote", || {
        need_out(out, "out")?;
        let e = engine_arg(engine)?;
        // SAFETY: forwarded contract.
        let remote = unsafe { str_arg(remote, "remote_engine") }?;
        // SAFETY: forwarded contract.
        let b = unsafe { blocks_arg(blocks, num_blocks) }?;
        let list = block_on(e.engine.prepare_remote(remote, &b, e.timeout(timeout_ms)))??;
        add_list(engine, list, out)
    })
}

/// The open list `p` of engine `e`.
fn prepped_arg(e: *const HmcEngine, p: *const HmcPrepped) -> Result<Arc<PreppedObj>> {
    engine_arg(e)?;
    let l = PREPPED.get(id(p))?;
    same_engine("prepared list", id(p), l.engine, id(e))?;
    Ok(l)
}

/// `hmc_prepped_len`: see `hmc.h`.
///
/// # Safety
/// `entries` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_prepped_len(
    engine: *const HmcEngine,
    list: *const HmcPrepped,
    entries: *mut u64,
) -> Status {
    guard("hmc_prepped_len", || {
        let l = prepped_arg(engine, list)?;
        // SAFETY: forwarded contract.
        unsafe { write_out(entries, "entries", l.list.len()) }
    })
}

/// `hmc_prepped_release`: see `hmc.h`.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_prepped_release(engine: *mut HmcEngine, list: *mut HmcPrepped) -> Status {
    guard("hmc_prepped_release", || {
        prepped_arg(engine, list)?;
        PREPPED.remove(id(list))?;
        Ok(())
    })
}

/// `hmc_make_xfer`: see `hmc.h`.
///
/// # Safety
/// `local_idx` and `remote_idx` hold `num` indices each; `notify_name` is NULL or a
/// NUL-terminated string; `notify_msg` is readable for `notify_len` bytes; `out` is
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_make_xfer(
    engine: *mut HmcEngine,
    op: u32,
    local: *const HmcPrepped,
    local_idx: *const u64,
    remote: *const HmcPrepped,
    remote_idx: *const u64,
    num: usize,
    notify_name: *const c_char,
    notify_msg: *const u8,
    notify_len: usize,
    out: *mut *mut HmcXfer,
) -> Status {
    guard("hmc_make_xfer", || {
        need_out(out, "out")?;
        let e = engine_arg(engine)?;
        let op = op_arg(op)?;
        let (l, r) = (prepped_arg(engine, local)?, prepped_arg(engine, remote)?);
        let lim = "prepared list entries";
        // SAFETY: forwarded contract; bounded first.
        let (li, ri) = unsafe {
            (
                slice_arg(local_idx, num, MAX_ENTRIES, "local_idx", lim)?,
                slice_arg(remote_idx, num, MAX_ENTRIES, "remote_idx", lim)?,
            )
        };
        let notify = if notify_name.is_null() {
            None
        } else {
            // SAFETY: forwarded contract.
            let name = unsafe { str_arg(notify_name, "notify_name") }?.to_string();
            let max = e.config.max_notify_len;
            // SAFETY: forwarded contract; bounded first.
            let msg =
                unsafe { slice_arg(notify_msg, notify_len, max, "notify_msg", "max_notify_len") }?;
            Some((name, msg.to_vec()))
        };
        let xfer = e
            .engine
            .make_transfer(op, &l.list, li, &r.list, ri, notify)?;
        let x = XFERS.insert(XferObj {
            engine: id(engine),
            xfer,
        });
        // SAFETY: checked writable above.
        unsafe { write_out(out, "out", ptr(x)) }
    })
}

/// The open transfer `x` of engine `e`.
fn xfer_arg(e: *const HmcEngine, x: *const HmcXfer) -> Result<Arc<XferObj>> {
    engine_arg(e)?;
    let t = XFERS.get(id(x))?;
    same_engine("prepared transfer", id(x), t.engine, id(e))?;
    Ok(t)
}

/// `hmc_xfer_post`: see `hmc.h`.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_xfer_post(engine: *mut HmcEngine, xfer: *mut HmcXfer) -> Status {
    guard("hmc_xfer_post", || {
        let e = engine_arg(engine)?;
        let x = xfer_arg(engine, xfer)?;
        x.xfer.post()?;
        // The post's end makes the engine's descriptor readable.
        let (t, wake) = (x.xfer.clone(), e.wake.clone());
        runtime()?.spawn(async move {
            t.wait().await;
            wake.signal();
        });
        Ok(())
    })
}

/// A post's status as the request calls report it.
fn reported(s: Option<TransferStatus>, state: *mut u32) -> Result<Status> {
    let s = s.ok_or_else(|| {
        Error::State("the transfer was never posted; hmc_xfer_post it first".into())
    })?;
    let o = outcome_of(&s, Duration::ZERO);
    if !state.is_null() {
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { state.write(o.state) };
    }
    o.into_result()
}

/// `hmc_xfer_status`: see `hmc.h`.
///
/// # Safety
/// `state` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_xfer_status(
    engine: *mut HmcEngine,
    xfer: *mut HmcXfer,
    state: *mut u32,
) -> Status {
    guard_with("hmc_xfer_status", || {
        reported(xfer_arg(engine, xfer)?.xfer.status(), state)
    })
}

/// `hmc_xfer_wait`: see `hmc.h`.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_xfer_wait(
    engine: *mut HmcEngine,
    xfer: *mut HmcXfer,
    timeout_ms: u32,
) -> Status {
    guard_with("hmc_xfer_wait", || {
        let x = xfer_arg(engine, xfer)?;
        let wait = Duration::from_millis(u64::from(timeout_ms));
        let s = block_on(async {
            match tokio::time::timeout(wait, x.xfer.wait()).await {
                Ok(s) => s,
                Err(_) => Some(TransferStatus::Waiting),
            }
        })?;
        reported(s, std::ptr::null_mut())
    })
}

/// `hmc_xfer_telemetry`: see `hmc.h`.
///
/// # Safety
/// `out` points to a `hmc_telemetry` whose `struct_size` is set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_xfer_telemetry(
    engine: *mut HmcEngine,
    xfer: *mut HmcXfer,
    out: *mut TelemetryC,
) -> Status {
    guard_with("hmc_xfer_telemetry", || {
        let x = xfer_arg(engine, xfer)?;
        // SAFETY: forwarded contract (reads its struct_size).
        let shape = unsafe { sized_arg(out, "hmc_telemetry", size_of::<TelemetryC>()) }?;
        let Some(t) = x.xfer.telemetry() else {
            return Ok(Status::Pending);
        };
        let v = TelemetryC {
            struct_size: shape.struct_size,
            posted_at_unix_ns: t
                .posted_at
                .duration_since(std::time::SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
            duration_ns: t.duration.as_nanos() as u64,
            bytes: t.bytes,
            descs: t.descs,
        };
        // SAFETY: writable for its struct_size, at least ours (checked by sized_arg).
        unsafe { out.write(v) };
        Ok(Status::Ok)
    })
}

/// `hmc_xfer_release`: see `hmc.h`.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_xfer_release(engine: *mut HmcEngine, xfer: *mut HmcXfer) -> Status {
    guard("hmc_xfer_release", || {
        xfer_arg(engine, xfer)?;
        let x = XFERS.remove(id(xfer))?;
        // Cancels a post in progress and waits until the transport is done with it.
        if tokio::runtime::Handle::try_current().is_ok() {
            runtime()?.spawn(async move { x.xfer.release().await });
        } else {
            block_on(x.xfer.release())?;
        }
        Ok(())
    })
}
