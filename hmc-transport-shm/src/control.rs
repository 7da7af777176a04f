//! The control page at the end of every shared-memory allocation (`alloc_registered`): the
//! registration's current key and per-process copy counters, so that an initiator that
//! has mapped the memory checks a key itself instead of asking the target for a lease, and
//! the owner revokes keys (rekey, deregistration) without a side-channel round trip.
//!
//! The handshake is Dekker's: an initiator announces a copy (increments its slot), then
//! reads the current key, copies only if its key is the current one, and withdraws the
//! announcement after the copy; the owner replaces the key, then waits until every slot
//! reads zero. Both sides use sequentially consistent operations, so either the initiator
//! sees the new key (and copies nothing) or the owner sees the announcement (and waits for
//! that copy to end). A copy announces itself for one chunk at a time and never across an
//! `.await`, so the owner waits at most for the chunks in progress.
//!
//! A slot is picked by process id; processes that share one add up, which only makes the
//! owner wait for both. A process that dies (or is stopped) mid-chunk leaves its count
//! behind: the owner's wait then ends at `revoke_timeout` and the revocation reports it,
//! as it does for a peer that never releases a lease, so the memory is not reused.
//!
//! Trust is as for leases (`docs/design.md`, "Same host"): a peer that has the memory
//! mapped can write it whatever the page says. The page keeps honest peers holding stale
//! keys (a pooled RPC buffer's earlier call) away from the memory's next use.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use hmc_core::Access;

use crate::wire::TOKEN_LEN;

/// Bytes of the control page that follows the data of a shared allocation.
pub(crate) const CONTROL_LEN: usize = 4096;
/// Marks a control page ("HMCSHMK2": the whole token on the page); a memfd without it is served through leases only.
const MAGIC: u64 = u64::from_le_bytes(*b"HMCSHMK2");
/// Copy counters per page; a process uses slot `pid % SLOTS`.
const SLOTS: usize = 512;

/// The page's layout, shared by every process that maps the memory.
#[repr(C)]
pub(crate) struct Page {
    magic: AtomicU64,
    /// Bytes of the registration (at the start of the mapping, before the page).
    len: AtomicU64,
    /// Access bits of the registration.
    access: AtomicU64,
    /// The current token as two words ([`token_words`]); zeros: no key works
    /// (deregistered). The whole token, so that a key that differs in any byte is stale.
    current: [AtomicU64; 2],
    busy: [AtomicU32; SLOTS],
}

const _: () = assert!(std::mem::size_of::<Page>() <= CONTROL_LEN);

/// A token as the page holds it (never all zeros for a live key: see
/// [`Page::is_current`]).
pub(crate) type KeyWords = [u64; 2];

/// `token` as two words.
pub(crate) fn token_words(token: &[u8; TOKEN_LEN]) -> KeyWords {
    const _: () = assert!(TOKEN_LEN == 16);
    [
        u64::from_le_bytes(token[..8].try_into().expect("8 bytes")),
        u64::from_le_bytes(token[8..].try_into().expect("8 bytes")),
    ]
}

/// This process's slot: its pid's, read once (`getpid` is a system call, and this runs
/// per copied span). A child forked later keeps its parent's slot, which costs only
/// sharing a counter: every announcement is withdrawn from the slot it was made in.
pub(crate) fn my_slot() -> usize {
    static SLOT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *SLOT.get_or_init(|| std::process::id() as usize % SLOTS)
}

impl Page {
    /// Withdraws one announcement of slot `slot` (a [`crate::page_copy::Held`] ending).
    pub(crate) fn withdraw(&self, slot: usize) {
        self.busy[slot].fetch_sub(1, Ordering::SeqCst);
    }

    /// The page at the end of a mapping of `map_len` bytes starting at `base`, if it has
    /// one (the magic is there and the registration it describes fits before it).
    ///
    /// # Safety
    /// `base..base + map_len` is a live shared mapping, page aligned, that outlives the
    /// returned reference.
    pub(crate) unsafe fn at<'a>(base: *mut u8, map_len: usize) -> Option<&'a Page> {
        let data = map_len.checked_sub(CONTROL_LEN)?;
        // SAFETY: per this function's contract.
        let page = unsafe { Page::raw(base, map_len) };
        let ok = page.magic.load(Ordering::Acquire) == MAGIC
            && page.len.load(Ordering::Acquire) <= data as u64;
        ok.then_some(page)
    }

    /// The last [`CONTROL_LEN`] bytes of a mapping as a page, whatever they hold.
    ///
    /// # Safety
    /// As [`Page::at`], and `map_len >= CONTROL_LEN`.
    pub(crate) unsafe fn raw<'a>(base: *mut u8, map_len: usize) -> &'a Page {
        // SAFETY: the page lies inside the mapping (the contract), 8-byte aligned (base
        // and lengths are multiples of the page size), so the atomics are aligned; it is
        // plain shared memory that any process may change, which atomics tolerate.
        unsafe { &*base.add(map_len - CONTROL_LEN).cast::<Page>() }
    }

    /// Owner: writes a fresh page for a registration of `len` bytes and `access`, whose
    /// key is `token`.
    pub(crate) fn init(&self, len: usize, access: Access, token: &[u8; TOKEN_LEN]) {
        self.len.store(len as u64, Ordering::Relaxed);
        self.access
            .store(u64::from(access.bits()), Ordering::Relaxed);
        self.store_current(token_words(token));
        self.magic.store(MAGIC, Ordering::Release);
    }

    /// Owner: from now on only `token` works (`None`: no key does). Copies announced
    /// before this may still be running: wait for them with [`Page::wait_idle`].
    pub(crate) fn set_current(&self, token: Option<&[u8; TOKEN_LEN]>) {
        self.store_current(token.map_or([0, 0], token_words));
    }

    /// The two words are not written as one: a reader between the stores sees one new and
    /// one old word, which matches neither the stale key nor (but by a 2^-64 chance) the
    /// new one, so it copies nothing; the owner's wait covers whoever read both old words
    /// before the first store.
    fn store_current(&self, words: KeyWords) {
        self.current[0].store(words[0], Ordering::SeqCst);
        self.current[1].store(words[1], Ordering::SeqCst);
    }

    /// Owner: waits until no copy is announced, or `until`. False when some still was
    /// (a peer stopped or dead mid-chunk). Past a short spin, the wait runs through
    /// [`off_worker`], so a stopped peer does not hold a runtime worker.
    pub(crate) fn wait_idle(&self, until: Instant) -> bool {
        let idle = || self.busy.iter().all(|b| b.load(Ordering::SeqCst) == 0);
        for _ in 0..64 {
            if idle() {
                return true;
            }
            std::hint::spin_loop();
        }
        off_worker(|| {
            loop {
                if idle() {
                    return true;
                }
                if Instant::now() >= until {
                    return false;
                }
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        })
    }

    /// The registration's length and access, as its owner wrote them.
    pub(crate) fn describe(&self) -> (u64, Option<Access>) {
        let bits = self.access.load(Ordering::Acquire);
        let access = u8::try_from(bits)
            .ok()
            .and_then(|b| Access::from_bits(b).ok());
        (self.len.load(Ordering::Acquire), access)
    }

    /// Whether `words` ([`token_words`]) are the current key.
    pub(crate) fn is_current(&self, words: KeyWords) -> bool {
        words != [0, 0]
            && self.current[0].load(Ordering::SeqCst) == words[0]
            && self.current[1].load(Ordering::SeqCst) == words[1]
    }

    /// Initiator: announces a copy under the key `word`; `None` (nothing announced) when
    /// the key is not current. The copy must end before the guard drops.
    pub(crate) fn enter(&self, words: KeyWords) -> Option<Announced<'_>> {
        let slot = &self.busy[my_slot()];
        slot.fetch_add(1, Ordering::SeqCst);
        if self.is_current(words) {
            Some(Announced(slot))
        } else {
            slot.fetch_sub(1, Ordering::SeqCst);
            None
        }
    }
}

/// Runs `f`, a wait on peers (revocation), so that it does not hold a tokio worker: on a
/// multi-thread runtime's worker through `block_in_place` (the worker's other tasks move
/// to another thread meanwhile); elsewhere (a plain thread, a current-thread runtime)
/// directly. `rekey` and deregistration are synchronous and are called in place on
/// workers (`CommCapabilities::key_ops_wait` is false: they rarely wait), so the rare wait
/// for a stopped peer, up to `revoke_timeout`, must not stall the tasks queued there.
pub(crate) fn off_worker<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// A copy in progress, announced on a control page; withdrawn on drop.
pub(crate) struct Announced<'a>(&'a AtomicU32);

impl Drop for Announced<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    /// Two pages of zeroed, 8-byte-aligned memory (leaked: the pages outlive the test)
    /// and the owner's view of the control page at its end.
    fn two_pages() -> (&'static mut [u64], &'static Page) {
        let buf: &'static mut [u64] = Box::leak(vec![0u64; 2 * CONTROL_LEN / 8].into());
        // SAFETY: the leaked buffer, 8-byte aligned, two pages long, lives forever.
        let raw = unsafe { Page::raw(buf.as_mut_ptr().cast(), 2 * CONTROL_LEN) };
        (buf, raw)
    }

    /// The page as an initiator finds it in the mapping `buf`.
    fn found(buf: &mut [u64]) -> Option<&'static Page> {
        let len = buf.len() * 8;
        // SAFETY: the buffer is 8-byte aligned and leaked (see `two_pages`).
        unsafe { Page::at(buf.as_mut_ptr().cast(), len) }
    }

    #[test]
    fn a_page_is_found_only_where_its_owner_wrote_one() {
        let (buf, raw) = two_pages();
        assert!(found(buf).is_none(), "no magic yet");
        let token = [7u8; TOKEN_LEN];
        raw.init(100, Access::READ, &token);
        let p = found(buf).expect("a page");
        assert_eq!(p.describe(), (100, Some(Access::READ)));
        assert!(p.is_current(token_words(&token)));
        let mut forged = token;
        forged[TOKEN_LEN - 1] ^= 1;
        assert!(
            !p.is_current(token_words(&forged)),
            "a key that differs in its last byte is not the current one"
        );
        p.set_current(None);
        assert!(!p.is_current(token_words(&token)));
        assert!(!p.is_current([0, 0]), "zeros are never a key");
    }

    #[test]
    fn a_stale_key_announces_nothing_and_the_owner_waits_for_announced_copies() {
        let (buf, raw) = two_pages();
        let (old, new) = ([1u8; TOKEN_LEN], [2u8; TOKEN_LEN]);
        raw.init(64, Access::READ_WRITE, &old);
        let p = found(buf).expect("a page");
        let copy = p.enter(token_words(&old)).expect("current");
        p.set_current(Some(&new));
        assert!(
            p.enter(token_words(&old)).is_none(),
            "stale after the rekey"
        );
        // The owner's wait ends only once the copy announced before the rekey has ended.
        let done = Arc::new(AtomicBool::new(false));
        let waiter = std::thread::spawn({
            let done = done.clone();
            move || {
                let idle = p.wait_idle(Instant::now() + Duration::from_secs(10));
                done.store(true, Ordering::SeqCst);
                idle
            }
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!done.load(Ordering::SeqCst), "returned during a copy");
        drop(copy);
        assert!(waiter.join().unwrap());
        // A copy that never ends (a stopped peer) bounds the wait, and says so.
        let hung = p.enter(token_words(&new)).expect("current");
        let t = Instant::now();
        assert!(!p.wait_idle(Instant::now() + Duration::from_millis(30)));
        assert!(t.elapsed() >= Duration::from_millis(30));
        drop(hung);
        assert!(p.wait_idle(Instant::now()));
    }
}
