//! The UCX callbacks. They run only on the engine thread, inside `ucp_worker_progress` (or
//! an `_nbx` call made there), and do one thing: queue an [`Event`] in a thread-local list
//! that the loop drains, so no callback touches the engine's state.

use std::cell::RefCell;
use std::ffi::c_void;

use super::RawNote;
use crate::sys;

/// The active-message id notifications use.
pub(super) const AM_ID: u32 = 0x484D;
/// The active-message id of the endpoint-generation handshake (`generations`): a header
/// of one kind byte ([`BIND`] or [`BOUND`]) and a token (`u64`, big-endian), no data.
pub(super) const GEN_AM_ID: u32 = 0x484E;
/// Initiator to target, sent with `UCP_AM_SEND_FLAG_REPLY` first on every new UCX
/// endpoint: the target learns which of its UCX endpoints carries that generation.
pub(super) const BIND: u8 = 1;
/// Target to initiator, on the endpoint a BIND arrived on: the generation is known there.
pub(super) const BOUND: u8 = 2;

/// What a callback reported.
pub(super) enum Event {
    /// The request of a slot completed.
    Req {
        slot: usize,
        status: sys::ucs_status_t,
    },
    /// UCX reported the physical endpoint with this id failed.
    EpError { ep: u64, status: sys::ucs_status_t },
    /// A notification arrived.
    Note(RawNote),
    /// A peer's BIND: its endpoint generation `token` arrives on our UCX endpoint `reply_ep`.
    Bind { token: u64, reply_ep: sys::ucp_ep_h },
    /// A target's BOUND: it knows the generation `token` of one of our UCX endpoints.
    Bound { token: u64 },
}

thread_local! {
    static EVENTS: RefCell<Vec<Event>> = const { RefCell::new(Vec::new()) };
}

/// The events queued since the last call, oldest first.
pub(super) fn take_events() -> Vec<Event> {
    EVENTS.with(|e| std::mem::take(&mut *e.borrow_mut()))
}

/// Forgets queued events (tear-down: nobody is left to handle them).
pub(super) fn clear_events() {
    EVENTS.with(|e| e.borrow_mut().clear());
}

fn push(event: Event) {
    EVENTS.with(|e| e.borrow_mut().push(event));
}

/// A request's completion; `user` is its slot.
pub(super) unsafe extern "C" fn on_request(
    _req: *mut c_void,
    status: sys::ucs_status_t,
    user: *mut c_void,
) {
    push(Event::Req {
        slot: user as usize,
        status,
    });
}

/// A physical endpoint's failure; `arg` is its id.
pub(super) unsafe extern "C" fn on_ep_error(
    arg: *mut c_void,
    _ep: sys::ucp_ep_h,
    status: sys::ucs_status_t,
) {
    push(Event::EpError {
        ep: arg as u64,
        status,
    });
}

/// A notification: an eager active message whose header is the tag (8 bytes, big-endian)
/// and the sender's address text.
pub(super) unsafe extern "C" fn on_am(
    _arg: *mut c_void,
    header: *const c_void,
    header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: UCX passes a valid parameter block for the duration of the callback.
    let attr = unsafe { (*param).recv_attr };
    if attr & sys::UCP_AM_RECV_ATTR_FLAG_RNDV != 0 || header_length < 8 {
        tracing::warn!(
            header_length,
            length,
            "dropping a malformed or rendezvous notification (notifications are sent eager)"
        );
        return sys::UCS_OK;
    }
    // SAFETY: UCX guarantees `header`/`data` point at `header_length`/`length` readable
    // bytes during the callback; we copy them out.
    let (h, d) = unsafe {
        (
            std::slice::from_raw_parts(header as *const u8, header_length),
            if length == 0 {
                &[][..]
            } else {
                std::slice::from_raw_parts(data as *const u8, length)
            },
        )
    };
    push(Event::Note(RawNote {
        tag: u64::from_be_bytes(h[..8].try_into().expect("8 bytes")),
        from: h[8..].to_vec(),
        msg: d.to_vec(),
    }));
    sys::UCS_OK
}

/// The endpoint-generation handshake's messages ([`BIND`], [`BOUND`]); anything else is
/// dropped.
pub(super) unsafe extern "C" fn on_gen_am(
    _arg: *mut c_void,
    header: *const c_void,
    header_length: usize,
    _data: *mut c_void,
    _length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    if header_length != 9 {
        tracing::warn!(
            header_length,
            "dropping a malformed endpoint-generation message"
        );
        return sys::UCS_OK;
    }
    // SAFETY: UCX guarantees `header` points at `header_length` readable bytes, and passes
    // a valid parameter block, for the duration of the callback.
    let (h, p) = unsafe {
        (
            std::slice::from_raw_parts(header as *const u8, header_length),
            &*param,
        )
    };
    let token = u64::from_be_bytes(h[1..9].try_into().expect("8 bytes"));
    match h[0] {
        BIND if p.recv_attr & sys::UCP_AM_RECV_ATTR_FIELD_REPLY_EP != 0
            && !p.reply_ep.is_null() =>
        {
            push(Event::Bind {
                token,
                reply_ep: p.reply_ep,
            })
        }
        BOUND => push(Event::Bound { token }),
        kind => tracing::warn!(
            kind,
            "dropping an endpoint-generation message of unknown kind"
        ),
    }
    sys::UCS_OK
}
