//! The UCX callbacks. They run only on the engine thread, inside `ucp_worker_progress` (or
//! an `_nbx` call made there), and do one thing: queue an [`Event`] in a thread-local list
//! that the loop drains, so no callback touches the engine's state.

use std::cell::RefCell;
use std::ffi::c_void;

use super::RawNote;
use crate::sys;

/// The active-message id notifications use.
pub(super) const AM_ID: u32 = 0x484D;

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
