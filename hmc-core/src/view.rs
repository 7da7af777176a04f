//! `RemoteView`: a peer's registered memory mapped into this process, from
//! [`Communicator::view`](crate::Communicator::view), for a caller that reads or writes it
//! in place instead of copying it through a local registration.

use crate::{Access, Error, Result, check_bounds};

/// A range of a peer's registered region, mapped here and usable in place while this
/// value lives. From [`Communicator::view`](crate::Communicator::view).
///
/// While a view lives, the transport holds the key it was made with as *in use*: the
/// owner's `rekey` or deregistration of that memory waits for the view to drop (bounded
/// by the transport's revocation timeout, after which the owner's `rekey` fails and the
/// memory is not reused). So a view is for the length of one use (an RPC call), not for
/// keeping: hold it longer and the owner's next rekey stalls.
///
/// The bytes are the peer's: an honest peer does not change memory it lent for a use
/// while the use lasts, and the same trust model as the transport's copies applies (a
/// peer that has the memory mapped can write it whatever the keys say).
pub struct RemoteView {
    ptr: *mut u8,
    len: usize,
    access: Access,
    /// What keeps the mapping alive and the key announced; released on drop.
    _hold: Box<dyn Send + Sync>,
}

// SAFETY: the pointer is into a shared mapping that `_hold` keeps alive; reads go through
// `&self` and writes through `write`, which copies with `ptr::copy` (no reference to the
// mapped bytes is created for writing), so sharing a view between threads is as safe as
// sharing the mapping.
unsafe impl Send for RemoteView {}
// SAFETY: as above.
unsafe impl Sync for RemoteView {}

impl std::fmt::Debug for RemoteView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteView")
            .field("len", &self.len)
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

impl RemoteView {
    /// A view of `len` bytes at `ptr`, allowing `access`, kept valid by `hold`.
    ///
    /// # Safety
    /// `ptr..ptr + len` is mapped in this process and stays mapped, and its owner does not
    /// reuse it for another use, until `hold` drops.
    pub unsafe fn new(
        ptr: *mut u8,
        len: usize,
        access: Access,
        hold: Box<dyn Send + Sync>,
    ) -> Self {
        RemoteView {
            ptr,
            len,
            access,
            _hold: hold,
        }
    }

    /// Bytes in the view.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a view of no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What the view allows.
    pub fn access(&self) -> Access {
        self.access
    }

    /// The bytes, for a view that allows READ.
    pub fn as_slice(&self) -> Result<&[u8]> {
        if !self.access.allows(Access::READ) {
            return Err(Error::AccessDenied(format!(
                "this view allows {:?}; ask Communicator::view for READ",
                self.access
            )));
        }
        if self.len == 0 {
            return Ok(&[]);
        }
        // SAFETY: mapped and kept for its use while `self` lives (`new`'s contract).
        Ok(unsafe { std::slice::from_raw_parts(self.ptr, self.len) })
    }

    /// Copies `src` into the view at `offset`, for a view that allows WRITE. `src` may
    /// overlap the view (a slice of another view of the same memory).
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        if !self.access.allows(Access::WRITE) {
            return Err(Error::AccessDenied(format!(
                "this view allows {:?}; ask Communicator::view for WRITE",
                self.access
            )));
        }
        check_bounds("view", offset as u64, src.len() as u64, self.len as u64)?;
        // SAFETY: the destination lies in the view (bounds checked), mapped while `self`
        // lives; `ptr::copy` allows the source to overlap it.
        unsafe { std::ptr::copy(src.as_ptr(), self.ptr.add(offset), src.len()) };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_view_reads_and_writes_within_its_rights_and_releases_on_drop() {
        let mut mem = vec![1u8; 64];
        let released = Arc::new(AtomicBool::new(false));
        // SAFETY: `mem` outlives the view.
        let view = unsafe {
            RemoteView::new(
                mem.as_mut_ptr(),
                64,
                Access::READ_WRITE,
                Box::new(Flag(released.clone())),
            )
        };
        view.write(60, &[9, 9, 9, 9]).unwrap();
        assert_eq!(&view.as_slice().unwrap()[58..], &[1, 1, 9, 9, 9, 9]);
        let e = view.write(61, &[0; 4]).unwrap_err();
        assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
        assert!(!released.load(Ordering::SeqCst));
        drop(view);
        assert!(
            released.load(Ordering::SeqCst),
            "the hold drops with the view"
        );
        assert_eq!(mem[63], 9);
    }

    #[test]
    fn a_view_refuses_what_its_access_does_not_allow() {
        let mut mem = vec![0u8; 8];
        // SAFETY: `mem` outlives both views.
        let (r, w) = unsafe {
            (
                RemoteView::new(mem.as_mut_ptr(), 8, Access::READ, Box::new(())),
                RemoteView::new(mem.as_mut_ptr(), 8, Access::WRITE, Box::new(())),
            )
        };
        assert!(matches!(r.write(0, &[1]), Err(Error::AccessDenied(_))));
        assert!(matches!(w.as_slice(), Err(Error::AccessDenied(_))));
    }
}
