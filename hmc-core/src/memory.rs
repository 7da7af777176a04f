//! Devices, regions of their memory, borrowed spans, and the `Memory` trait every device backend implements.

use std::fmt;
use std::marker::PhantomData;
use std::os::fd::OwnedFd;

use crate::{BoxFuture, DeviceKind, Error, MemoryCapabilities, Result};

/// One device: a family and an ordinal within it. The host is `Device::HOST`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Device {
    /// The family.
    pub kind: DeviceKind,
    /// The ordinal within the family (0 for the host).
    pub ordinal: u32,
}

impl Device {
    /// Host memory.
    pub const HOST: Device = Device {
        kind: DeviceKind::HOST,
        ordinal: 0,
    };

    /// A device of `kind` with `ordinal`.
    pub const fn new(kind: DeviceKind, ordinal: u32) -> Self {
        Device { kind, ordinal }
    }

    /// True for host memory, which the CPU can read and write directly.
    pub fn is_host(&self) -> bool {
        self.kind == DeviceKind::HOST
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            DeviceKind::HOST => f.write_str("host"),
            kind => write!(f, "{kind}:{}", self.ordinal),
        }
    }
}

/// A contiguous range of one device's memory: where it is, not who owns it.
///
/// A `Region` is plain data (it may be sent to a peer inside a descriptor); holding one
/// grants no access. Access goes through [`MemSpan`]s, which borrow the owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    /// The device the memory lives on.
    pub device: Device,
    /// Start address in that device's address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: usize,
}

impl Region {
    /// The sub-range `[offset, offset + len)`, bounds-checked.
    pub fn slice(&self, offset: usize, len: usize) -> Result<Region> {
        crate::check_bounds("region", offset as u64, len as u64, self.len as u64)?;
        Ok(Region {
            device: self.device,
            addr: self.addr + offset as u64,
            len,
        })
    }
}

/// A borrowed, read-only view of memory on some device.
///
/// Made from a host slice or from a [`DeviceBuffer`]; the borrow keeps the memory alive
/// and unchanged by safe code for as long as the span exists.
#[derive(Clone, Copy, Debug)]
pub struct MemSpan<'a> {
    region: Region,
    _borrow: PhantomData<&'a [u8]>,
}

/// A borrowed, writable view of memory on some device.
#[derive(Debug)]
pub struct MemSpanMut<'a> {
    region: Region,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> MemSpan<'a> {
    /// A span over host bytes.
    pub fn host(bytes: &'a [u8]) -> Self {
        MemSpan {
            region: Region {
                device: Device::HOST,
                addr: bytes.as_ptr() as u64,
                len: bytes.len(),
            },
            _borrow: PhantomData,
        }
    }

    /// A span over a whole device buffer.
    pub fn of<B: DeviceBuffer + ?Sized>(buf: &'a B) -> Self {
        MemSpan {
            region: buf.region(),
            _borrow: PhantomData,
        }
    }

    /// A span over raw memory.
    ///
    /// # Safety
    /// `region` must describe memory that stays allocated, and is not written through any
    /// other path, for `'a`.
    pub unsafe fn from_region(region: Region) -> Self {
        MemSpan {
            region,
            _borrow: PhantomData,
        }
    }

    /// The sub-span `[offset, offset + len)`, bounds-checked.
    pub fn slice(&self, offset: usize, len: usize) -> Result<MemSpan<'a>> {
        Ok(MemSpan {
            region: self.region.slice(offset, len)?,
            _borrow: PhantomData,
        })
    }

    /// Where the span is.
    pub fn region(&self) -> Region {
        self.region
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.region.len
    }

    /// True when the span is empty.
    pub fn is_empty(&self) -> bool {
        self.region.len == 0
    }

    /// The bytes, when the span is host memory.
    pub fn as_host_slice(&self) -> Option<&'a [u8]> {
        if !self.region.device.is_host() {
            return None;
        }
        if self.region.len == 0 {
            return Some(&[]);
        }
        // SAFETY: a host span is built from a live borrow (`host`, `of`) or under the
        // `from_region` contract, so the range is allocated and not mutated for `'a`.
        Some(unsafe { std::slice::from_raw_parts(self.region.addr as *const u8, self.region.len) })
    }
}

impl<'a> MemSpanMut<'a> {
    /// A writable span over host bytes.
    pub fn host(bytes: &'a mut [u8]) -> Self {
        MemSpanMut {
            region: Region {
                device: Device::HOST,
                addr: bytes.as_mut_ptr() as u64,
                len: bytes.len(),
            },
            _borrow: PhantomData,
        }
    }

    /// A writable span over a whole device buffer.
    pub fn of<B: DeviceBuffer + ?Sized>(buf: &'a mut B) -> Self {
        MemSpanMut {
            region: buf.region(),
            _borrow: PhantomData,
        }
    }

    /// A writable span over raw memory.
    ///
    /// # Safety
    /// `region` must describe memory that stays allocated, and is not accessed through any
    /// other path, for `'a`.
    pub unsafe fn from_region(region: Region) -> Self {
        MemSpanMut {
            region,
            _borrow: PhantomData,
        }
    }

    /// The writable sub-span `[offset, offset + len)`, bounds-checked. Borrows `self`.
    pub fn slice_mut(&mut self, offset: usize, len: usize) -> Result<MemSpanMut<'_>> {
        Ok(MemSpanMut {
            region: self.region.slice(offset, len)?,
            _borrow: PhantomData,
        })
    }

    /// A read-only view of the same memory.
    pub fn as_span(&self) -> MemSpan<'_> {
        MemSpan {
            region: self.region,
            _borrow: PhantomData,
        }
    }

    /// Where the span is.
    pub fn region(&self) -> Region {
        self.region
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.region.len
    }

    /// True when the span is empty.
    pub fn is_empty(&self) -> bool {
        self.region.len == 0
    }

    /// The bytes, when the span is host memory.
    pub fn as_host_slice_mut(&mut self) -> Option<&mut [u8]> {
        if !self.region.device.is_host() {
            return None;
        }
        if self.region.len == 0 {
            return Some(&mut []);
        }
        // SAFETY: a host span is built from a live exclusive borrow or under the
        // `from_region` contract; `&mut self` keeps this slice unique.
        Some(unsafe {
            std::slice::from_raw_parts_mut(self.region.addr as *mut u8, self.region.len)
        })
    }
}

/// An owned allocation on some device; freed when dropped.
pub trait DeviceBuffer: Send + Sync + 'static {
    /// Where the allocation is. Stable for the buffer's life.
    fn region(&self) -> Region;

    /// Length in bytes.
    fn len(&self) -> usize {
        self.region().len
    }

    /// True for a zero-length buffer.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A device's allocator and copy engine.
///
/// Implementations must accept zero-length allocations and copies, and must refuse (never
/// perform) a copy whose spans differ in length or touch a device they do not own.
pub trait Memory: Send + Sync + 'static {
    /// The owned allocation type.
    type Buffer: DeviceBuffer;

    /// The device this allocator serves.
    fn device(&self) -> Device;

    /// Allocates `len` bytes on [`Memory::device`]. Contents are unspecified.
    fn alloc(&self, len: usize) -> Result<Self::Buffer>;

    /// Copies `src` into `dst` (host to device, device to host, device to device, or host to
    /// host). Both spans must have the same length; each must be host memory or memory of
    /// this device. Returns when the bytes are in `dst`.
    fn copy(&self, dst: &mut MemSpanMut<'_>, src: &MemSpan<'_>) -> Result<()>;

    /// Largest single allocation this backend accepts (default: `isize::MAX`).
    fn max_alloc(&self) -> usize {
        isize::MAX as usize
    }

    /// What this backend can do beyond [`Memory::alloc`] and [`Memory::copy`]. The default
    /// claims nothing optional: no asynchronous copy, DMA-BUF or IPC. A backend that
    /// overrides one of the provided methods below says so here, so a caller can ask first.
    fn capabilities(&self) -> MemoryCapabilities {
        MemoryCapabilities::new(self.device(), self.max_alloc())
    }

    /// Starts copying `src` into `dst` and returns a future that resolves when the bytes
    /// are in `dst`, without blocking the calling thread while the device works. Same
    /// preconditions as [`Memory::copy`], checked before anything starts.
    ///
    /// Cancellation: dropping the future before it resolves must leave no copy running on
    /// either span once the drop returns (an implementation waits for the device in its
    /// `Drop`), so the caller may free or reuse both as soon as it regains them.
    ///
    /// Default: [`Error::Unsupported`]; [`MemoryCapabilities::async_copy`] says whether a
    /// backend overrides it. Use [`Memory::copy`] otherwise.
    ///
    /// # Safety
    /// The returned future must be polled to completion or dropped, never leaked
    /// (`mem::forget`): a leaked future would let the device keep writing `dst` after its
    /// borrow ends.
    unsafe fn copy_async<'a>(
        &'a self,
        dst: &'a mut MemSpanMut<'_>,
        src: &'a MemSpan<'_>,
    ) -> Result<BoxFuture<'a, Result<()>>> {
        let _ = (dst, src);
        Err(unsupported(
            self.device(),
            "asynchronous copies",
            "use Memory::copy",
        ))
    }

    /// A host allocator whose buffers this device copies to and from at full speed
    /// (page-locked memory of its driver), for the bounce buffers a transport stages this
    /// device's memory through. `None` (the default): plain host memory serves, slower on
    /// hardware whose copies from pageable memory go through a driver bounce of their own.
    fn pinned_host(&self) -> Option<crate::AnyMemory> {
        None
    }

    /// Exports the memory under `span` as a DMA-BUF: a file descriptor, and where `span`
    /// starts inside it. What `ibv_reg_dmabuf_mr(pd, offset, len, iova, fd, access)` needs
    /// to register device memory with an RDMA NIC. The exported range may be wider than
    /// `span` (rounded out to whole pages); `offset`/`len` address `span` within it.
    ///
    /// The descriptor stays valid after `span` ends, but the memory behind it does not:
    /// deregister from the NIC before freeing the buffer.
    ///
    /// Default: [`Error::Unsupported`]; see [`MemoryCapabilities::dma_buf`].
    fn export_dmabuf(&self, span: &MemSpan<'_>) -> Result<DmaBuf> {
        let _ = span;
        Err(unsupported(
            self.device(),
            "DMA-BUF export",
            "register host memory, or stage device memory through host buffers",
        ))
    }

    /// Exports `buf` for another process on this host; the descriptor is valid while `buf`
    /// lives. Default: [`Error::Unsupported`]; see [`MemoryCapabilities::ipc`].
    fn export_ipc(&self, buf: &Self::Buffer) -> Result<IpcDescriptor> {
        let _ = buf;
        Err(unsupported(
            self.device(),
            "IPC export",
            "send the bytes through a transport instead",
        ))
    }

    /// Exports, for another process on this host, the device allocation that holds
    /// `span`, naming only `span` inside it: [`Memory::open_ipc`] of the descriptor maps
    /// exactly `span`'s bytes. This is how memory a framework allocated (a tensor inside a
    /// caching allocator's block, where no `Self::Buffer` exists) is shared by vendor IPC;
    /// the backend finds the allocation's base itself. The descriptor is valid while the
    /// allocation lives. Default: [`Error::Unsupported`].
    fn export_ipc_span(&self, span: &MemSpan<'_>) -> Result<IpcDescriptor> {
        let _ = span;
        Err(unsupported(
            self.device(),
            "IPC export of a range",
            "stage the bytes through host memory, or send them through a transport",
        ))
    }

    /// Maps memory another process exported with [`Memory::export_ipc`] (or
    /// [`Memory::export_ipc_span`]) of the same backend as a buffer of this device;
    /// unmapped when the buffer drops.
    /// Default: [`Error::Unsupported`].
    ///
    /// # Safety
    /// `ipc` must come from `export_ipc` in a process that keeps the exported buffer alive
    /// while the mapping lives; its length cannot be checked and is trusted.
    unsafe fn open_ipc(&self, ipc: &IpcDescriptor) -> Result<Box<dyn DeviceBuffer>> {
        let _ = ipc;
        Err(unsupported(
            self.device(),
            "IPC mappings",
            "send the bytes through a transport instead",
        ))
    }
}

/// The [`Error::Unsupported`] of a provided [`Memory`] method a backend does not override.
fn unsupported(device: Device, what: &str, instead: &str) -> Error {
    Error::Unsupported(format!(
        "the memory backend of {device} does not support {what}; {instead} (ask \
         Memory::capabilities() first)"
    ))
}

/// A DMA-BUF exported by [`Memory::export_dmabuf`]: the file descriptor (closed on drop)
/// and where the requested memory lies inside it.
#[derive(Debug)]
#[non_exhaustive]
pub struct DmaBuf {
    /// The DMA-BUF file descriptor, owned: close it after the NIC registration is gone.
    pub fd: OwnedFd,
    /// Where the requested memory starts inside the DMA-BUF (`offset` of
    /// `ibv_reg_dmabuf_mr`).
    pub offset: u64,
    /// Length of the requested memory in bytes.
    pub len: usize,
}

impl DmaBuf {
    /// A descriptor of `len` bytes at `offset` within `fd`.
    pub fn new(fd: OwnedFd, offset: u64, len: usize) -> Self {
        DmaBuf { fd, offset, len }
    }
}

/// A device allocation exported for another process on the same host by
/// [`Memory::export_ipc`]: the device kind and the backend's own handle bytes. Send
/// [`IpcDescriptor::bytes`] to the peer; only a backend of the same kind can open it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct IpcDescriptor {
    /// The family whose backend made it.
    pub kind: DeviceKind,
    /// The backend's wire form of its handle (vendor handle and length).
    pub bytes: Vec<u8>,
}

impl IpcDescriptor {
    /// A descriptor of `kind` with the backend's `bytes`.
    pub fn new(kind: DeviceKind, bytes: Vec<u8>) -> Self {
        IpcDescriptor { kind, bytes }
    }

    /// A descriptor of `span_len` bytes at `offset` inside the allocation that `whole`
    /// (the backend's wire form of the allocation's handle) exports: what
    /// [`Memory::export_ipc_span`] returns, the offset from [`IpcDescriptor::offset_in`].
    /// [`IpcDescriptor::split_span`] reads it back.
    pub fn of_span(kind: DeviceKind, mut whole: Vec<u8>, offset: u64, span_len: u64) -> Self {
        whole.extend_from_slice(&SPAN_TAG);
        whole.extend_from_slice(&offset.to_le_bytes());
        whole.extend_from_slice(&span_len.to_le_bytes());
        IpcDescriptor { kind, bytes: whole }
    }

    /// Where `span` starts in the allocation of `alloc_len` bytes at `base` (what the
    /// vendor's address-range query reported); refused, naming both, when `span` is not
    /// inside it. Backends call it before making the allocation's handle.
    pub fn offset_in(span: Region, base: u64, alloc_len: usize) -> Result<u64> {
        let inside = span.addr >= base
            && span
                .addr
                .checked_add(span.len as u64)
                .is_some_and(|end| end <= base + alloc_len as u64);
        if !inside {
            return Err(Error::InvalidArgument(format!(
                "{:#x}+{} is not inside one allocation of {} (the one at {base:#x} is \
                 {alloc_len} bytes); register each allocation separately",
                span.addr, span.len, span.device
            )));
        }
        Ok(span.addr - base)
    }

    /// The whole allocation's handle bytes (`whole_len` of them, the backend's wire size)
    /// and, for a descriptor of [`IpcDescriptor::of_span`], the span's `(offset, len)`.
    /// Refuses bytes of any other length or a span outside `u64`.
    pub fn split_span(&self, whole_len: usize) -> Result<(&[u8], Option<IpcSpan>)> {
        let b = &self.bytes;
        if b.len() == whole_len {
            return Ok((b, None));
        }
        let bad = || {
            Error::Protocol(format!(
                "an IPC descriptor of {} memory is {} bytes, not {whole_len} or {}; it was \
                 not made by this backend's export_ipc or export_ipc_span",
                self.kind,
                b.len(),
                whole_len + SPAN_TRAILER
            ))
        };
        if b.len() != whole_len + SPAN_TRAILER || b[whole_len..whole_len + 4] != SPAN_TAG {
            return Err(bad());
        }
        let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let (offset, len) = (word(whole_len + 4), word(whole_len + 12));
        offset.checked_add(len).ok_or_else(bad)?;
        Ok((&b[..whole_len], Some((offset, len))))
    }

    /// Refuses a descriptor made by a backend of another kind, naming both.
    pub fn check_kind(&self, own: DeviceKind) -> Result<()> {
        if self.kind == own {
            return Ok(());
        }
        Err(Error::InvalidArgument(format!(
            "an IPC descriptor of {} memory cannot be opened by the {own} backend; open it \
             with a {} backend on this host",
            self.kind, self.kind
        )))
    }
}

/// A span's `(offset, len)` inside the allocation an [`IpcDescriptor`] exports.
pub type IpcSpan = (u64, u64);

/// Marks the span trailer of [`IpcDescriptor::of_span`]: the tag, then offset and length.
const SPAN_TAG: [u8; 4] = *b"SPAN";
const SPAN_TRAILER: usize = 4 + 8 + 8;

/// `len` bytes at `offset` of an opened IPC mapping, keeping the mapping (unmapped when
/// this drops): what a backend's [`Memory::open_ipc`] returns for a span descriptor.
pub struct IpcSpanMapping {
    whole: Box<dyn DeviceBuffer>,
    region: Region,
}

impl IpcSpanMapping {
    /// The span `(offset, len)` of `whole`; refused when it does not fit (the exporter
    /// named more than the allocation holds).
    pub fn new(whole: Box<dyn DeviceBuffer>, offset: u64, len: u64) -> Result<Self> {
        let w = whole.region();
        let fits = offset
            .checked_add(len)
            .is_some_and(|end| end <= w.len as u64);
        if !fits || len == 0 {
            return Err(Error::Protocol(format!(
                "an IPC span of {len} bytes at offset {offset} does not fit the {}-byte \
                 allocation it names on {}",
                w.len, w.device
            )));
        }
        let region = w.slice(offset as usize, len as usize)?;
        Ok(IpcSpanMapping { whole, region })
    }
}

impl IpcSpanMapping {
    /// `whole`, an opened mapping, cut to `span` when the descriptor named one (from
    /// [`IpcDescriptor::split_span`]); `whole` itself otherwise.
    pub fn cut(
        whole: Box<dyn DeviceBuffer>,
        span: Option<IpcSpan>,
    ) -> Result<Box<dyn DeviceBuffer>> {
        Ok(match span {
            None => whole,
            Some((offset, len)) => Box::new(IpcSpanMapping::new(whole, offset, len)?),
        })
    }
}

impl DeviceBuffer for IpcSpanMapping {
    fn region(&self) -> Region {
        self.region
    }
}

impl fmt::Debug for IpcSpanMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcSpanMapping")
            .field("region", &self.region)
            .field("mapping", &self.whole.region())
            .finish()
    }
}

/// Checks the common preconditions of [`Memory::copy`]: equal lengths and devices this
/// backend may touch (`own` and the host).
pub fn check_copy(own: Device, dst: &MemSpanMut<'_>, src: &MemSpan<'_>) -> Result<()> {
    if dst.len() != src.len() {
        return Err(Error::InvalidArgument(format!(
            "copy length mismatch: destination is {} bytes, source is {} bytes",
            dst.len(),
            src.len()
        )));
    }
    for (what, dev) in [
        ("destination", dst.region().device),
        ("source", src.region().device),
    ] {
        if !dev.is_host() && dev != own {
            return Err(Error::Unsupported(format!(
                "the {own} backend cannot copy with a {what} on {dev}; use that device's backend"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_slices_are_bounds_checked() {
        let data = [1u8, 2, 3, 4];
        let span = MemSpan::host(&data);
        assert_eq!(span.slice(1, 2).unwrap().as_host_slice().unwrap(), &[2, 3]);
        assert!(span.slice(3, 2).is_err());
        assert!(span.slice(usize::MAX, 2).is_err());
    }

    #[test]
    fn copy_check_refuses_length_mismatch_and_foreign_devices() {
        let a = [0u8; 4];
        let mut b = [0u8; 3];
        let err = check_copy(Device::HOST, &MemSpanMut::host(&mut b), &MemSpan::host(&a));
        assert!(matches!(err, Err(Error::InvalidArgument(_))));
        let foreign = Region {
            device: Device::new(DeviceKind::CUDA, 1),
            addr: 0x1000,
            len: 4,
        };
        let mut c = [0u8; 4];
        // SAFETY: the span is never dereferenced; only its device is inspected.
        let src = unsafe { MemSpan::from_region(foreign) };
        let err = check_copy(
            Device::new(DeviceKind::CUDA, 0),
            &MemSpanMut::host(&mut c),
            &src,
        );
        assert!(matches!(err, Err(Error::Unsupported(_))));
    }

    struct Whole(Vec<u8>);
    impl DeviceBuffer for Whole {
        fn region(&self) -> Region {
            Region {
                device: Device::new(DeviceKind::ROCM, 0),
                addr: self.0.as_ptr() as u64,
                len: self.0.len(),
            }
        }
    }

    #[test]
    fn span_descriptors_round_trip_and_refuse_what_does_not_fit() {
        let whole = vec![9u8; 72];
        let dev = Device::new(DeviceKind::ROCM, 0);
        let span = |addr, len| Region {
            device: dev,
            addr,
            len,
        };
        let offset = IpcDescriptor::offset_in(span(1 << 20, 100), (1 << 20) - 4096, 8192).unwrap();
        assert_eq!(offset, 4096);
        let d = IpcDescriptor::of_span(DeviceKind::ROCM, whole.clone(), offset, 100);
        let (h, named) = d.split_span(72).unwrap();
        assert_eq!((h, named), (&whole[..], Some((4096, 100))));
        let plain = IpcDescriptor::new(DeviceKind::ROCM, whole.clone());
        assert_eq!(plain.split_span(72).unwrap(), (&whole[..], None));
        assert!(d.split_span(64).is_err(), "another backend's size");
        let mut forged = d.clone();
        forged.bytes[72] = b'X';
        assert!(forged.split_span(72).is_err(), "no tag");
        for (addr, len) in [(4095, 10), (8190, 10), (u64::MAX, 2)] {
            let err = IpcDescriptor::offset_in(span(addr, len), 4096, 4096).unwrap_err();
            assert!(
                err.to_string().contains("not inside one allocation"),
                "{err}"
            );
        }
        let mut overflow = d.clone();
        overflow.bytes[76..84].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(overflow.split_span(72).is_err());

        let m = IpcSpanMapping::new(Box::new(Whole(vec![0; 8192])), 4096, 100).unwrap();
        let base = m.whole.region().addr;
        assert_eq!((m.region().addr, m.len()), (base + 4096, 100));
        for (off, len) in [(8100, 100), (0, 0), (u64::MAX, 1)] {
            let err = IpcSpanMapping::new(Box::new(Whole(vec![0; 8192])), off, len).unwrap_err();
            assert!(err.to_string().contains("does not fit"), "{err}");
        }
    }
}
