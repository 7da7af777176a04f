//! Input buffers shared by connections: a connection takes one when bytes arrive and gives
//! it back when it goes quiet, so an idle connection holds no input buffer at all.
//!
//! Each buffer is [`INPUT_BUF_LEN`] bytes, allocated (and zeroed) once. A small cache per
//! thread serves the common take-after-give of one busy connection without a lock; the
//! shared list behind it keeps at most [`MAX_POOLED`] buffers, and frees the rest.

use std::cell::RefCell;

use parking_lot::Mutex;

/// Bytes of one pooled input buffer: one read's worth (`READ_CHUNK` of the runtime).
pub(crate) const INPUT_BUF_LEN: usize = 256 << 10;

/// Buffers kept in the shared list; more are freed when given back.
const MAX_POOLED: usize = 64;

/// Buffers kept per thread before the shared list.
const PER_THREAD: usize = 2;

static SHARED: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

thread_local! {
    static LOCAL: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// A buffer of at least `min` bytes (its whole length usable).
pub(crate) fn take(min: usize) -> Vec<u8> {
    if min <= INPUT_BUF_LEN {
        let local = LOCAL.try_with(|l| l.borrow_mut().pop()).ok().flatten();
        if let Some(b) = local.or_else(|| SHARED.lock().pop()) {
            return b;
        }
    }
    vec![0; min.max(INPUT_BUF_LEN)]
}

/// Gives a buffer back (freed when it is not a pooled size or the pool is full).
pub(crate) fn give(buf: Vec<u8>) {
    if buf.len() != INPUT_BUF_LEN {
        return;
    }
    let rest = LOCAL
        .try_with(|l| {
            let mut l = l.borrow_mut();
            if l.len() < PER_THREAD {
                l.push(buf);
                None
            } else {
                Some(buf)
            }
        })
        .unwrap_or_else(|e| {
            // The thread is exiting; its cache is gone.
            let _ = e;
            None
        });
    if let Some(buf) = rest {
        let mut shared = SHARED.lock();
        if shared.len() < MAX_POOLED {
            shared.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_and_odd_sizes_are_not_pooled() {
        let a = take(100);
        assert_eq!(a.len(), INPUT_BUF_LEN);
        let p = a.as_ptr();
        give(a);
        let b = take(INPUT_BUF_LEN);
        assert_eq!(b.as_ptr(), p, "the thread's cache serves the next take");
        let big = take(INPUT_BUF_LEN + 1);
        assert_eq!(big.len(), INPUT_BUF_LEN + 1);
        give(big); // freed, not pooled
        let c = take(10);
        assert_eq!(c.len(), INPUT_BUF_LEN);
        give(b);
        give(c);
    }
}
