//! Run-time choice of memory backend: `DynMemory`, an object-safe mirror of `Memory`, and `AnyMemory`, which implements `Memory` over any of them.
//!
//! The counterpart of [`AnyCommunicator`](crate::AnyCommunicator) for allocators: code that
//! picks its device from a flag (`--device cuda:0|host`) wraps the chosen backend in
//! [`AnyMemory`] and passes it wherever an `M: Memory` is expected. Buffers are
//! type-erased ([`AnyBuffer`]); a buffer of another backend passed to
//! [`Memory::export_ipc`] is refused with [`Error::InvalidArgument`], never a crash.

use std::any::Any;
use std::sync::Arc;

use crate::{
    BoxFuture, Device, DeviceBuffer, DmaBuf, Error, IpcDescriptor, MemSpan, MemSpanMut, Memory,
    MemoryCapabilities, Region, Result,
};

/// A type-erased buffer of an [`AnyMemory`]; freed when dropped.
pub struct AnyBuffer {
    inner: Box<dyn Any + Send + Sync>,
    region: Region,
    /// The address of the backend that allocated it.
    owner: usize,
}

impl std::fmt::Debug for AnyBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnyBuffer")
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

impl AnyBuffer {
    /// Erases `buf` without naming the memory that allocated it (an opened IPC buffer, a
    /// test's); [`AnyMemory`] then treats it as another backend's.
    pub fn new<B: DeviceBuffer>(buf: B) -> AnyBuffer {
        AnyBuffer {
            region: buf.region(),
            owner: 0,
            inner: Box::new(buf),
        }
    }

    /// Erases `buf`, a buffer `memory` allocated (so that [`AnyMemory`] over the same
    /// backend accepts it where it checks ownership).
    pub fn of<M: Memory>(memory: &M, buf: M::Buffer) -> AnyBuffer {
        AnyBuffer {
            region: buf.region(),
            owner: identity(memory),
            inner: Box::new(buf),
        }
    }

    /// The concrete buffer back, when it is a `B`; otherwise the buffer, unchanged.
    pub fn downcast<B: DeviceBuffer>(self) -> std::result::Result<B, AnyBuffer> {
        let AnyBuffer {
            inner,
            region,
            owner,
        } = self;
        inner
            .downcast::<B>()
            .map(|b| *b)
            .map_err(|inner| AnyBuffer {
                inner,
                region,
                owner,
            })
    }
}

impl DeviceBuffer for AnyBuffer {
    fn region(&self) -> Region {
        self.region
    }
}

fn identity<M: ?Sized>(mem: &M) -> usize {
    mem as *const M as *const () as usize
}

/// The object-safe form of [`Memory`]. Implemented for every `Memory`; its methods carry a
/// `dyn_` prefix so they never shadow the generic ones.
pub trait DynMemory: Send + Sync + 'static {
    /// See [`Memory::device`].
    fn dyn_device(&self) -> Device;
    /// See [`Memory::capabilities`].
    fn dyn_capabilities(&self) -> MemoryCapabilities;
    /// See [`Memory::max_alloc`].
    fn dyn_max_alloc(&self) -> usize;
    /// See [`Memory::alloc`].
    fn dyn_alloc(&self, len: usize) -> Result<AnyBuffer>;
    /// See [`Memory::copy`].
    fn dyn_copy(&self, dst: &mut MemSpanMut<'_>, src: &MemSpan<'_>) -> Result<()>;
    /// See [`Memory::copy_async`].
    ///
    /// # Safety
    /// As for [`Memory::copy_async`]: the future must not be leaked.
    unsafe fn dyn_copy_async<'a>(
        &'a self,
        dst: &'a mut MemSpanMut<'_>,
        src: &'a MemSpan<'_>,
    ) -> Result<BoxFuture<'a, Result<()>>>;
    /// See [`Memory::pinned_host`].
    fn dyn_pinned_host(&self) -> Option<AnyMemory>;
    /// See [`Memory::export_dmabuf`].
    fn dyn_export_dmabuf(&self, span: &MemSpan<'_>) -> Result<DmaBuf>;
    /// See [`Memory::export_ipc`]; refuses another backend's buffer.
    fn dyn_export_ipc(&self, buf: &AnyBuffer) -> Result<IpcDescriptor>;
    /// See [`Memory::export_ipc_span`].
    fn dyn_export_ipc_span(&self, span: &MemSpan<'_>) -> Result<IpcDescriptor>;
    /// See [`Memory::open_ipc`].
    ///
    /// # Safety
    /// As for [`Memory::open_ipc`].
    unsafe fn dyn_open_ipc(&self, ipc: &IpcDescriptor) -> Result<Box<dyn DeviceBuffer>>;
}

impl<M: Memory> DynMemory for M {
    fn dyn_device(&self) -> Device {
        Memory::device(self)
    }

    fn dyn_capabilities(&self) -> MemoryCapabilities {
        Memory::capabilities(self)
    }

    fn dyn_max_alloc(&self) -> usize {
        Memory::max_alloc(self)
    }

    fn dyn_alloc(&self, len: usize) -> Result<AnyBuffer> {
        Ok(AnyBuffer::of(self, Memory::alloc(self, len)?))
    }

    fn dyn_copy(&self, dst: &mut MemSpanMut<'_>, src: &MemSpan<'_>) -> Result<()> {
        Memory::copy(self, dst, src)
    }

    unsafe fn dyn_copy_async<'a>(
        &'a self,
        dst: &'a mut MemSpanMut<'_>,
        src: &'a MemSpan<'_>,
    ) -> Result<BoxFuture<'a, Result<()>>> {
        // SAFETY: the caller upholds `Memory::copy_async`'s contract, forwarded as is.
        unsafe { Memory::copy_async(self, dst, src) }
    }

    fn dyn_pinned_host(&self) -> Option<AnyMemory> {
        Memory::pinned_host(self)
    }

    fn dyn_export_dmabuf(&self, span: &MemSpan<'_>) -> Result<DmaBuf> {
        Memory::export_dmabuf(self, span)
    }

    fn dyn_export_ipc(&self, buf: &AnyBuffer) -> Result<IpcDescriptor> {
        let foreign = || {
            Error::InvalidArgument(format!(
                "this buffer ({}) was allocated by another memory backend than the {} one; \
                 export it with the backend that allocated it",
                buf.region.device,
                Memory::device(self)
            ))
        };
        if buf.owner != identity(self) {
            return Err(foreign());
        }
        let buf = buf.inner.downcast_ref::<M::Buffer>().ok_or_else(foreign)?;
        Memory::export_ipc(self, buf)
    }

    fn dyn_export_ipc_span(&self, span: &MemSpan<'_>) -> Result<IpcDescriptor> {
        Memory::export_ipc_span(self, span)
    }

    unsafe fn dyn_open_ipc(&self, ipc: &IpcDescriptor) -> Result<Box<dyn DeviceBuffer>> {
        // SAFETY: forwarded contract.
        unsafe { Memory::open_ipc(self, ipc) }
    }
}

/// A `Memory` chosen at run time. Cheap to clone.
#[derive(Clone)]
pub struct AnyMemory(Arc<dyn DynMemory>);

impl AnyMemory {
    /// Wraps a concrete backend.
    pub fn new<M: Memory>(mem: M) -> Self {
        AnyMemory(Arc::new(mem))
    }

    /// Wraps a shared backend.
    pub fn from_arc(mem: Arc<dyn DynMemory>) -> Self {
        AnyMemory(mem)
    }
}

impl std::fmt::Debug for AnyMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AnyMemory({})", self.0.dyn_device())
    }
}

impl Memory for AnyMemory {
    type Buffer = AnyBuffer;

    fn device(&self) -> Device {
        self.0.dyn_device()
    }

    fn alloc(&self, len: usize) -> Result<AnyBuffer> {
        self.0.dyn_alloc(len)
    }

    fn copy(&self, dst: &mut MemSpanMut<'_>, src: &MemSpan<'_>) -> Result<()> {
        self.0.dyn_copy(dst, src)
    }

    fn max_alloc(&self) -> usize {
        self.0.dyn_max_alloc()
    }

    fn capabilities(&self) -> MemoryCapabilities {
        self.0.dyn_capabilities()
    }

    unsafe fn copy_async<'a>(
        &'a self,
        dst: &'a mut MemSpanMut<'_>,
        src: &'a MemSpan<'_>,
    ) -> Result<BoxFuture<'a, Result<()>>> {
        // SAFETY: forwarded contract.
        unsafe { self.0.dyn_copy_async(dst, src) }
    }

    fn pinned_host(&self) -> Option<AnyMemory> {
        self.0.dyn_pinned_host()
    }

    fn export_dmabuf(&self, span: &MemSpan<'_>) -> Result<DmaBuf> {
        self.0.dyn_export_dmabuf(span)
    }

    fn export_ipc(&self, buf: &AnyBuffer) -> Result<IpcDescriptor> {
        self.0.dyn_export_ipc(buf)
    }

    fn export_ipc_span(&self, span: &MemSpan<'_>) -> Result<IpcDescriptor> {
        self.0.dyn_export_ipc_span(span)
    }

    unsafe fn open_ipc(&self, ipc: &IpcDescriptor) -> Result<Box<dyn DeviceBuffer>> {
        // SAFETY: forwarded contract.
        unsafe { self.0.dyn_open_ipc(ipc) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check_copy;

    /// Host memory over `Vec`, with IPC "export" of the buffer's address for the test.
    struct VecMemory;
    struct VecBuffer(Vec<u8>);

    impl DeviceBuffer for VecBuffer {
        fn region(&self) -> Region {
            Region {
                device: Device::HOST,
                addr: self.0.as_ptr() as u64,
                len: self.0.len(),
            }
        }
    }

    impl Memory for VecMemory {
        type Buffer = VecBuffer;
        fn device(&self) -> Device {
            Device::HOST
        }
        fn alloc(&self, len: usize) -> Result<VecBuffer> {
            Ok(VecBuffer(vec![0; len]))
        }
        fn copy(&self, dst: &mut MemSpanMut<'_>, src: &MemSpan<'_>) -> Result<()> {
            check_copy(Device::HOST, dst, src)?;
            let src = src.as_host_slice().expect("host");
            dst.as_host_slice_mut().expect("host").copy_from_slice(src);
            Ok(())
        }
        fn capabilities(&self) -> MemoryCapabilities {
            let mut caps = MemoryCapabilities::new(Device::HOST, self.max_alloc());
            caps.ipc = true;
            caps
        }
        fn export_ipc(&self, buf: &VecBuffer) -> Result<IpcDescriptor> {
            Ok(IpcDescriptor::new(
                crate::DeviceKind::HOST,
                buf.region().addr.to_be_bytes().to_vec(),
            ))
        }
    }

    #[test]
    fn any_memory_round_trips_and_forwards_capabilities() {
        let mem = AnyMemory::new(VecMemory);
        assert!(mem.capabilities().ipc && mem.capabilities().host_accessible);
        let mut buf = mem.alloc(5).unwrap();
        mem.copy(&mut MemSpanMut::of(&mut buf), &MemSpan::host(b"hello"))
            .unwrap();
        let mut out = [0u8; 5];
        mem.copy(&mut MemSpanMut::host(&mut out), &MemSpan::of(&buf))
            .unwrap();
        assert_eq!(&out, b"hello");
        let ipc = mem.export_ipc(&buf).unwrap();
        assert_eq!(ipc.bytes, buf.region().addr.to_be_bytes());
    }

    #[test]
    fn unsupported_features_are_errors_that_say_what_to_use() {
        let mem = AnyMemory::new(VecMemory);
        let buf = mem.alloc(8).unwrap();
        let err = mem.export_dmabuf(&MemSpan::of(&buf)).unwrap_err();
        assert!(matches!(err, Error::Unsupported(_)), "{err}");
        assert!(err.to_string().contains("capabilities"), "{err}");
        let mut dst = [0u8; 8];
        // SAFETY: the result is an error; no future exists to leak.
        let (mut dst, src) = (MemSpanMut::host(&mut dst), MemSpan::of(&buf));
        let r = unsafe { mem.copy_async(&mut dst, &src) };
        assert!(matches!(r, Err(Error::Unsupported(_))));
        // SAFETY: refused before any mapping is made.
        let r = unsafe { mem.open_ipc(&IpcDescriptor::new(crate::DeviceKind::HOST, vec![])) };
        assert!(matches!(r, Err(Error::Unsupported(_))));
    }

    #[test]
    fn another_backends_buffer_is_refused_not_a_crash() {
        let a = AnyMemory::new(VecMemory);
        let b = AnyMemory::new(VecMemory);
        let buf = a.alloc(4).unwrap();
        let err = b.export_ipc(&buf).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        a.export_ipc(&buf).unwrap();
    }

    #[test]
    fn a_buffer_erased_with_its_memory_downcasts_back_or_stays_whole() {
        let m = VecMemory;
        let buf = AnyBuffer::of(&m, m.alloc(8).unwrap());
        let region = buf.region();
        assert_eq!(region.len, 8);
        // Not an `Other`: the buffer comes back unchanged.
        #[derive(Debug)]
        struct Other;
        impl DeviceBuffer for Other {
            fn region(&self) -> Region {
                unreachable!()
            }
        }
        let buf = buf.downcast::<Other>().unwrap_err();
        assert_eq!(buf.region(), region);
        let Ok(v) = buf.downcast::<VecBuffer>() else {
            panic!("a VecBuffer")
        };
        assert_eq!(v.0.len(), 8);
        // Erased with its memory, it is that memory's for AnyMemory's ownership checks.
        let any = AnyMemory::new(VecMemory);
        let b = any.alloc(4).unwrap();
        assert!(any.export_ipc(&b).is_ok());
    }
}
