//! Handles and arguments at the boundary.
//!
//! A handle given to C (`hmc_engine *`, `hmc_request *`, …) is never a pointer to Rust
//! memory: it is a number (a kind tag in the top bits, a counter below) looked up in a
//! table of that kind. So a handle used after it was closed or released, released twice,
//! passed where another kind is expected, or made up, is found missing and reported as
//! `HMC_ERR_INVALID_ARGUMENT` with a message, never dereferenced. Numbers are never reused
//! within a process.
//!
//! The rest of this module reads C arguments: strings, `struct_size`-prefixed structs,
//! arrays with a length, and output buffers.

use std::collections::HashMap;
use std::ffi::{CStr, c_char};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use crate::error::{Error, Result};

/// Declares the opaque C types of handles: zero-sized, never made in Rust (a handle is a
/// number cast to a pointer of one of these), so C sees an incomplete struct.
macro_rules! opaque {
    ($($(#[$doc:meta])* $name:ident;)*) => {$(
        $(#[$doc])*
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
        }
    )*};
}
pub(crate) use opaque;

/// The next handle number, shared by every kind so that no two handles are equal.
static NEXT: AtomicU64 = AtomicU64::new(1);

/// Bits of a handle below its kind tag.
const TAG_SHIFT: u32 = 48;

/// A table of open handles of one kind.
pub(crate) struct Table<T> {
    kind: &'static str,
    tag: u64,
    map: RwLock<Option<HashMap<u64, Arc<T>>>>,
}

/// The kind a handle's tag says, for messages about a handle of the wrong kind.
fn kind_of(id: u64) -> &'static str {
    match id >> TAG_SHIFT {
        1 => "an engine",
        2 => "a memory registration",
        3 => "a request",
        4 => "a notification list",
        5 => "an RPC server",
        6 => "an RPC client",
        7 => "an RPC call",
        8 => "a byte buffer",
        9 => "an RPC pending call",
        10 => "a KV service",
        11 => "a KV cache",
        12 => "a prepared list",
        13 => "a prepared transfer",
        _ => "no handle this library made",
    }
}

impl<T> Table<T> {
    /// An empty table of `kind` (`"engine"`) with tag `tag` (see [`kind_of`]).
    pub(crate) const fn new(kind: &'static str, tag: u64) -> Self {
        Table {
            kind,
            tag,
            map: RwLock::new(None),
        }
    }

    /// Adds `value` and returns its handle.
    pub(crate) fn insert(&self, value: T) -> u64 {
        let id = (self.tag << TAG_SHIFT) | NEXT.fetch_add(1, Ordering::Relaxed);
        self.map
            .write()
            .get_or_insert_with(HashMap::new)
            .insert(id, Arc::new(value));
        id
    }

    fn missing(&self, id: u64) -> Error {
        if id == 0 {
            return Error::Null(self.kind);
        }
        if id >> TAG_SHIFT == self.tag {
            Error::Handle(format!(
                "this {} handle ({id:#x}) was closed or released (or never made); \
                 a handle is invalid once closed, released or its engine closed",
                self.kind
            ))
        } else {
            Error::Handle(format!(
                "the {} handle ({id:#x}) is {} handle; pass an {} handle",
                self.kind,
                kind_of(id),
                self.kind
            ))
        }
    }

    /// The open handle `id`.
    pub(crate) fn get(&self, id: u64) -> Result<Arc<T>> {
        self.map
            .read()
            .as_ref()
            .and_then(|m| m.get(&id).cloned())
            .ok_or_else(|| self.missing(id))
    }

    /// Removes the open handle `id` (closing it to every later call).
    pub(crate) fn remove(&self, id: u64) -> Result<Arc<T>> {
        self.map
            .write()
            .as_mut()
            .and_then(|m| m.remove(&id))
            .ok_or_else(|| self.missing(id))
    }

    /// Removes every handle for which `pick` is true, and returns them.
    pub(crate) fn remove_where(&self, pick: impl Fn(&T) -> bool) -> Vec<Arc<T>> {
        let mut map = self.map.write();
        let Some(m) = map.as_mut() else {
            return Vec::new();
        };
        let ids: Vec<u64> = m.iter().filter(|(_, v)| pick(v)).map(|(k, _)| *k).collect();
        ids.iter().filter_map(|id| m.remove(id)).collect()
    }
}

/// Checks that a handle of `kind` owned by engine `owner` is used with that engine, not
/// with `engine`.
pub(crate) fn same_engine(kind: &str, handle: u64, owner: u64, engine: u64) -> Result<()> {
    if owner == engine {
        return Ok(());
    }
    Err(Error::Handle(format!(
        "the {kind} {handle:#x} belongs to engine {owner:#x}, not to {engine:#x}; use it with its own engine"
    )))
}

/// A handle's number from its pointer.
pub(crate) fn id<P>(p: *const P) -> u64 {
    p as usize as u64
}

/// A handle's pointer from its number.
pub(crate) fn ptr<P>(id: u64) -> *mut P {
    id as usize as *mut P
}

/// Moves up to `cap` handles from `queue` (completed requests or calls) to `out`, skipping
/// those no longer in `table` (released meanwhile); returns how many.
///
/// # Safety
/// `out` is writable for `cap` handles.
pub(crate) unsafe fn drain_completed<T, P>(
    queue: &mut std::collections::VecDeque<u64>,
    table: &Table<T>,
    out: *mut *mut P,
    cap: usize,
) -> usize {
    let mut n = 0;
    while n < cap {
        let Some(h) = queue.pop_front() else { break };
        if table.get(h).is_err() {
            continue;
        }
        // SAFETY: `n < cap` entries are writable by the caller's contract.
        unsafe { out.add(n).write(ptr(h)) };
        n += 1;
    }
    n
}

/// Reads the NUL-terminated UTF-8 string `p`, the argument `name`.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays valid during the call.
pub(crate) unsafe fn str_arg<'a>(p: *const c_char, name: &'static str) -> Result<&'a str> {
    if p.is_null() {
        return Err(Error::Null(name));
    }
    // SAFETY: non-null, and NUL-terminated by the caller's contract.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map_err(|e| Error::InvalidArgument(format!("`{name}` is not UTF-8: {e}")))
}

/// Reads `n` elements at `p`, the argument `name`, after checking `n` against `max` (so a
/// huge count is refused before any memory is touched).
///
/// # Safety
/// When `n` is within `max`, `p` must point to `n` readable elements.
pub(crate) unsafe fn slice_arg<'a, T>(
    p: *const T,
    n: usize,
    max: usize,
    name: &'static str,
    limit: &'static str,
) -> Result<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if n > max {
        return Err(Error::Engine(hmc_engine::EngineError::Limit {
            limit,
            value: n as u64,
            max: max as u64,
            hint: "pass fewer elements per call (or raise the option of that name)",
        }));
    }
    if p.is_null() {
        return Err(Error::Null(name));
    }
    if !p.is_aligned() {
        return Err(Error::InvalidArgument(format!("`{name}` is misaligned")));
    }
    // SAFETY: non-null, aligned, and `n` readable elements by the caller's contract; `n` is
    // bounded by `max`, far below isize::MAX bytes.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// Reads a `struct_size`-prefixed struct of type `T` (whose first field is that `size_t`):
/// a caller built against an older header passes a shorter struct, whose missing fields
/// read as zero; a newer one a longer struct, accepted when the bytes past `T` are zero
/// (fields this library does not know, left unset). `min` is the first version's size.
///
/// # Safety
/// `p` is NULL or points to at least `struct_size` readable bytes.
pub(crate) unsafe fn sized_arg<T: Copy + Default>(
    p: *const T,
    name: &'static str,
    min: usize,
) -> Result<T> {
    if p.is_null() {
        return Err(Error::Null(name));
    }
    // SAFETY: every such struct starts with a size_t; the caller's pointer is readable for
    // at least that much (its struct_size, which is at least a size_t for any valid one).
    let got = unsafe { p.cast::<usize>().read_unaligned() };
    let known = size_of::<T>();
    let bad = || Error::StructSize {
        name,
        got,
        min,
        known,
    };
    if got < min || got > (1 << 16) {
        return Err(bad());
    }
    let bytes = p.cast::<u8>();
    if got > known {
        // SAFETY: `got` bytes are readable by the caller's contract.
        let extra = unsafe { std::slice::from_raw_parts(bytes.add(known), got - known) };
        if extra.iter().any(|&b| b != 0) {
            return Err(bad());
        }
    }
    let mut out = T::default();
    // SAFETY: copies min(got, known) bytes into a T whose fields are all plain data (integers,
    // pointers, optional function pointers), for which any prefix over defaults is valid.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes, (&mut out as *mut T).cast::<u8>(), got.min(known))
    };
    Ok(out)
}

/// [`sized_arg`] of an optional struct of this library's first version (`min` its size):
/// NULL reads as the defaults.
///
/// # Safety
/// As [`sized_arg`].
pub(crate) unsafe fn optional_arg<T: Copy + Default>(p: *const T, name: &'static str) -> Result<T> {
    if p.is_null() {
        return Ok(T::default());
    }
    // SAFETY: forwarded contract.
    unsafe { sized_arg(p, name, size_of::<T>()) }
}

/// Writes `v` to the output argument `out`.
///
/// # Safety
/// `out` is NULL or valid for a write of `T`.
pub(crate) unsafe fn write_out<T>(out: *mut T, name: &'static str, v: T) -> Result<()> {
    if out.is_null() {
        return Err(Error::Null(name));
    }
    // SAFETY: non-null and writable by the caller's contract.
    unsafe { out.write(v) };
    Ok(())
}

/// Checks an output argument before the work that fills it (so that a NULL one fails
/// before anything happens).
pub(crate) fn need_out<T>(out: *mut T, name: &'static str) -> Result<()> {
    if out.is_null() {
        return Err(Error::Null(name));
    }
    Ok(())
}

/// Copies `data` to the caller's buffer `buf` of `cap` bytes, with a NUL after it when
/// `nul`, and writes the length (without the NUL) to `len` when it is not NULL. A buffer
/// too small (NULL with `cap` 0 included: the way to ask for the length) fails
/// `HMC_ERR_BUFFER_TOO_SMALL` after writing the length.
///
/// # Safety
/// `buf` is NULL or writable for `cap` bytes; `len` is NULL or writable.
pub(crate) unsafe fn write_buf(
    data: &[u8],
    nul: bool,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
    what: &'static str,
) -> Result<()> {
    if !len.is_null() {
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { len.write(data.len()) };
    }
    let need = data.len() + usize::from(nul);
    if buf.is_null() || cap < need {
        return Err(Error::BufferTooSmall { what, need, cap });
    }
    // SAFETY: `buf` is writable for `cap >= need` bytes by the caller's contract, and does
    // not overlap `data` (library memory).
    unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), buf, data.len());
        if nul {
            buf.add(data.len()).write(0);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, Default)]
    #[repr(C)]
    struct V2 {
        struct_size: usize,
        a: u64,
        b: u64,
    }

    #[test]
    fn shorter_structs_read_as_zero_and_longer_ones_need_zero_tails() {
        let v1 = [16usize, 7];
        // SAFETY: 16 readable bytes.
        let got = unsafe { sized_arg(v1.as_ptr().cast::<V2>(), "v", 16) }.unwrap();
        assert_eq!((got.a, got.b), (7, 0));
        let v3 = [32usize, 1, 2, 0];
        // SAFETY: 32 readable bytes.
        let got = unsafe { sized_arg(v3.as_ptr().cast::<V2>(), "v", 16) }.unwrap();
        assert_eq!((got.a, got.b), (1, 2));
        let v3 = [32usize, 1, 2, 9];
        // SAFETY: 32 readable bytes.
        let e = unsafe { sized_arg(v3.as_ptr().cast::<V2>(), "v", 16) }.unwrap_err();
        assert!(e.to_string().contains("`v.struct_size` is 32"), "{e}");
        let bad = [8usize];
        // SAFETY: 8 readable bytes.
        let e = unsafe { sized_arg(bad.as_ptr().cast::<V2>(), "v", 16) }.unwrap_err();
        assert_eq!(e.status(), crate::error::Status::StructSize);
    }

    #[test]
    fn handles_of_another_kind_or_closed_ones_are_named() {
        let a: Table<u8> = Table::new("engine", 1);
        let b: Table<u8> = Table::new("request", 3);
        let ea = a.insert(1);
        let eb = b.insert(2);
        let e = a.get(eb).err().unwrap().to_string();
        assert!(e.contains("is a request handle"), "{e}");
        a.remove(ea).unwrap();
        let e = a.remove(ea).err().unwrap().to_string();
        assert!(e.contains("was closed or released"), "{e}");
    }
}
