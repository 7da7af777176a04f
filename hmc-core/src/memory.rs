//! Devices, regions of their memory, borrowed spans, and the `Memory` trait every device backend implements.

use std::fmt;
use std::marker::PhantomData;

use crate::{Error, Result};

/// The family of a device. New families are added without a breaking change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DeviceKind {
    /// Host (CPU) memory.
    Host,
    /// NVIDIA CUDA.
    Cuda,
    /// AMD ROCm, and HIP-compatible Hygon DCUs.
    Rocm,
    /// Cambricon MLU (CNRT).
    Mlu,
    /// Moore Threads MUSA.
    Musa,
}

impl DeviceKind {
    /// Stable numeric id used in wire descriptors.
    pub const fn wire_id(self) -> u8 {
        match self {
            DeviceKind::Host => 0,
            DeviceKind::Cuda => 1,
            DeviceKind::Rocm => 2,
            DeviceKind::Mlu => 3,
            DeviceKind::Musa => 4,
        }
    }

    /// Inverse of [`DeviceKind::wire_id`].
    pub fn from_wire_id(id: u8) -> Result<Self> {
        Ok(match id {
            0 => DeviceKind::Host,
            1 => DeviceKind::Cuda,
            2 => DeviceKind::Rocm,
            3 => DeviceKind::Mlu,
            4 => DeviceKind::Musa,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unknown device kind id {other}"
                )));
            }
        })
    }
}

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
        kind: DeviceKind::Host,
        ordinal: 0,
    };

    /// A device of `kind` with `ordinal`.
    pub const fn new(kind: DeviceKind, ordinal: u32) -> Self {
        Device { kind, ordinal }
    }

    /// True for host memory, which the CPU can read and write directly.
    pub fn is_host(&self) -> bool {
        self.kind == DeviceKind::Host
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            DeviceKind::Host => f.write_str("host"),
            kind => write!(f, "{kind:?}:{}", self.ordinal),
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
            device: Device::new(DeviceKind::Cuda, 1),
            addr: 0x1000,
            len: 4,
        };
        let mut c = [0u8; 4];
        // SAFETY: the span is never dereferenced; only its device is inspected.
        let src = unsafe { MemSpan::from_region(foreign) };
        let err = check_copy(
            Device::new(DeviceKind::Cuda, 0),
            &MemSpanMut::host(&mut c),
            &src,
        );
        assert!(matches!(err, Err(Error::Unsupported(_))));
    }

    #[test]
    fn device_kind_wire_ids_round_trip() {
        for k in [
            DeviceKind::Host,
            DeviceKind::Cuda,
            DeviceKind::Rocm,
            DeviceKind::Mlu,
            DeviceKind::Musa,
        ] {
            assert_eq!(DeviceKind::from_wire_id(k.wire_id()).unwrap(), k);
        }
        assert!(DeviceKind::from_wire_id(200).is_err());
    }
}
