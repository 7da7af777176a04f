//! Copies straight through a peer's shared memory mapped here, checked against the
//! registration's control page (`control.rs`): a use of a mapping held for as long as a
//! view lives ([`Held`]), a batch's descriptors as such copies ([`spans`]) and the copies
//! themselves, one announced chunk at a time ([`copy`]). The page's layout and handshake
//! are `control.rs`'s; the mappings are `mapped.rs`'s.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use hmc_core::{Access, Deadline, Error, Op, Region, Result};

use crate::control::{CONTROL_LEN, KeyWords, Page, my_slot, token_words};
use crate::mapped::Mapping;
use crate::wire::TOKEN_LEN;

/// A use of a peer's mapping announced on its control page for as long as this value
/// lives (a [`hmc_core::RemoteView`]), not one chunk: the owner's rekey waits for it.
pub(crate) struct Held {
    map: Arc<Mapping>,
    slot: usize,
}

impl Held {
    /// Announces a use of `map` under the key `words`; `None` when the key is not current
    /// (or the mapping has no control page).
    pub(crate) fn enter(map: Arc<Mapping>, words: KeyWords) -> Option<Held> {
        let announced = map.control()?.enter(words)?;
        // The count stays up until `Held` drops and takes it down itself.
        std::mem::forget(announced);
        Some(Held {
            map,
            slot: my_slot(),
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // SAFETY: `enter` found a control page in this mapping, so it is at least
        // CONTROL_LEN long, page aligned, and alive as long as `self.map`.
        let page = unsafe { Page::raw(self.map.ptr(), self.map.len()) };
        page.withdraw(self.slot);
    }
}

/// One descriptor of a batch that goes through a peer's mapping under a checked key.
pub(crate) struct Span {
    /// The peer's memory, mapped here; its control page was found.
    pub(crate) map: Arc<Mapping>,
    /// The key's [`token_words`].
    pub(crate) word: KeyWords,
    /// Local address of the descriptor's first byte.
    pub(crate) local: u64,
    /// Offset in the peer's registration.
    pub(crate) at: usize,
    pub(crate) len: usize,
}

/// What [`spans`] looked up for the registration of a run of descriptors: its remote key,
/// mapping, key words and the end no span may pass.
type RunKey = ((u64, [u8; TOKEN_LEN]), Arc<Mapping>, KeyWords, u64);

/// One descriptor of a batch as [`spans`] sees it.
pub(crate) struct Want {
    /// The remote key: registration id and token.
    pub(crate) key: (u64, [u8; TOKEN_LEN]),
    /// The local registration's memory.
    pub(crate) local: Region,
    pub(crate) local_offset: usize,
    pub(crate) remote_offset: u64,
    pub(crate) len: usize,
}

/// The batch as copies through the peer's shared memory mapped here (`maps`, by
/// registration id), when every descriptor's registration has a control page that says
/// its key is current and allows `need` within bounds, and its local memory is host
/// memory. `None`: take the lease path (which also gives the errors).
pub(crate) fn spans(
    maps: &HashMap<u64, Arc<Mapping>>,
    need: Access,
    batch: impl Iterator<Item = Want>,
) -> Option<Vec<Span>> {
    // A block table's descriptors come in runs of one registration: its mapping, key and
    // page (bounds and rights) are looked up once per run, not per descriptor.
    let mut last: Option<RunKey> = None;
    batch
        .map(|d| {
            if last.as_ref().is_none_or(|(key, ..)| *key != d.key) {
                let map = maps.get(&d.key.0)?.clone();
                let word = token_words(&d.key.1);
                let page = map.control()?;
                let (len, access) = page.describe();
                // The page is the peer's to write: bound by the mapping too (its data part).
                let data = (map.len() - CONTROL_LEN) as u64;
                if !(page.is_current(word) && access?.allows(need)) {
                    return None;
                }
                last = Some((d.key, map, word, len.min(data)));
            }
            let (_, map, word, bound) = last.as_ref().expect("set above");
            let end = d.remote_offset.checked_add(d.len as u64)?;
            (end <= *bound && d.local.device.is_host()).then(|| Span {
                word: *word,
                local: d.local.addr + d.local_offset as u64,
                at: d.remote_offset as usize,
                len: d.len,
                map: map.clone(),
            })
        })
        .collect()
}

/// Copies `spans` through the peer's mappings, consecutive spans of one mapping under one
/// announcement of at most `chunk` bytes (yielding after each full chunk), each only while
/// its key is current. The deadline and `gone` (the error to end with when the peer went
/// away) are checked before each announcement.
///
/// # Safety
/// Each span's local range lies in a registration the caller keeps alive for the call,
/// and its remote range in the registration its page describes (`at + len` at most the
/// page's length, checked by the caller).
pub(crate) async unsafe fn copy(
    op: Op,
    spans: &[Span],
    chunk: usize,
    deadline: Deadline,
    gone: impl Fn() -> Option<Error>,
) -> Result<()> {
    let started = Instant::now();
    let chunk = chunk.max(1);
    // One announcement covers consecutive spans of one mapping under one key, up to a
    // chunk's worth of bytes (the rekey waits for at most that); the deadline and the peer
    // are checked per announcement, not per span (a block table's spans are small, and the
    // clock and the page's atomics cost more than a memcpy of one).
    let mut i = 0;
    let mut off = 0usize; // into spans[i]
    let mut budget;
    while i < spans.len() {
        if deadline.is_expired() {
            return Err(Error::DeadlineExceeded {
                during: "transfer",
                elapsed: started.elapsed(),
            });
        }
        if let Some(e) = gone() {
            return Err(e);
        }
        let first = &spans[i];
        let page = first.map.control().expect("spans are built from pages");
        {
            let Some(_copying) = page.enter(first.word) else {
                return Err(Error::InvalidKey(
                    "the region was deregistered or rekeyed during the transfer".into(),
                ));
            };
            budget = chunk;
            while i < spans.len() && budget > 0 {
                let s = &spans[i];
                if !Arc::ptr_eq(&s.map, &first.map) || s.word != first.word {
                    break;
                }
                let n = budget.min(s.len - off);
                let local = (s.local as usize + off) as *mut u8;
                // SAFETY: the local range is inside a live registration (the caller's
                // contract); the remote one inside the mapping's data part, which stays
                // mapped while `s.map` lives and may be touched while the announcement
                // holds the owner's rekey and deregistration off.
                unsafe {
                    let remote = s.map.ptr().add(s.at + off);
                    match op {
                        Op::Write => std::ptr::copy_nonoverlapping(local, remote, n),
                        Op::Read => std::ptr::copy_nonoverlapping(remote, local, n),
                    }
                }
                budget -= n;
                off += n;
                if off == s.len {
                    i += 1;
                    off = 0;
                }
            }
        }
        // A whole chunk copied: let the executor's other tasks run before the next.
        if budget == 0 && i < spans.len() {
            tokio::task::yield_now().await;
        }
    }
    Ok(())
}
