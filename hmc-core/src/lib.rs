//! The vocabulary of HMC: devices, regions, the `Memory`, `ConnBuffer` and `Communicator`
//! traits, the error type, and the backend conformance kit.
//!
//! ```
//! use hmc_core::{
//!     Communicator, Device, DeviceBuffer, DeviceKind, Error, MemSpan, MemSpanMut, Memory,
//!     NoCommunicator, Region, Result, check_copy,
//! };
//!
//! // A minimal host-memory backend: buffers are `Vec`s, copies are memcpy.
//! struct VecMemory;
//! struct VecBuffer(Vec<u8>);
//! impl DeviceBuffer for VecBuffer {
//!     fn region(&self) -> Region {
//!         Region { device: Device::HOST, addr: self.0.as_ptr() as u64, len: self.0.len() }
//!     }
//! }
//! impl Memory for VecMemory {
//!     type Buffer = VecBuffer;
//!     fn device(&self) -> Device { Device::HOST }
//!     fn alloc(&self, len: usize) -> Result<VecBuffer> { Ok(VecBuffer(vec![0; len])) }
//!     fn copy(&self, dst: &mut MemSpanMut<'_>, src: &MemSpan<'_>) -> Result<()> {
//!         check_copy(Device::HOST, dst, src)?;
//!         dst.as_host_slice_mut().unwrap().copy_from_slice(src.as_host_slice().unwrap());
//!         Ok(())
//!     }
//! }
//!
//! // Round trip through the backend.
//! let mem = VecMemory;
//! let mut buf = mem.alloc(5)?;
//! mem.copy(&mut MemSpanMut::of(&mut buf), &MemSpan::host(b"bytes"))?;
//! let mut back = [0u8; 5];
//! mem.copy(&mut MemSpanMut::host(&mut back), &MemSpan::of(&buf))?;
//! assert_eq!(&back, b"bytes");
//!
//! // Optional features are asked for, not discovered by failing.
//! assert!(!mem.capabilities().dma_buf);
//! assert!(matches!(mem.export_dmabuf(&MemSpan::of(&buf)), Err(Error::Unsupported(_))));
//!
//! // The always-built empty communicator: it registers nothing, and says so up front.
//! let comm = NoCommunicator;
//! assert!(!comm.capabilities().local_memory.contains(DeviceKind::HOST));
//! // SAFETY: `buf` outlives the (refused) registration.
//! let refused = unsafe { comm.register(buf.region(), hmc_core::Access::READ) };
//! assert!(matches!(refused, Err(Error::Unavailable { .. })));
//! # Ok::<(), Error>(())
//! ```
//!
//! # What this layer is for
//!
//! HMC moves bytes between CPU, GPU and accelerator memories, across processes and hosts.
//! This crate says *what* that means and nothing about *how*: it has no I/O, no vendor code
//! and no async runtime (only `futures`). Device backends (`hmc-backend-cpu`,
//! `hmc-backend-cuda`, …) implement [`Memory`]; transports (`hmc-transport-tcp`,
//! `hmc-transport-ucx`, …) implement [`Communicator`]; `hmc-rpc` is generic over both.
//! This crate never depends on any of them, the way `rustls` never depends on a provider.
//!
//! # The three traits
//!
//! - [`Memory`]: one device's allocator and copy engine (host↔device, device↔device), with
//!   optional asynchronous copies, DMA-BUF and IPC export behind
//!   [`Memory::capabilities`].
//! - [`Communicator`]: one-sided READ/WRITE between registered regions of two peers, small
//!   notifications, and registration of local memory. A transfer is a batch of
//!   [`TransferDesc`]s against one endpoint with a [`Deadline`]; the remote application
//!   does nothing while it runs.
//! - [`ConnBuffer`]: a registered staging buffer on any device; [`RegisteredBuffer`] is the
//!   generic implementation over any `Memory` + `Communicator` pair.
//!
//! All three use associated types, and communicator methods return `impl Future + Send`,
//! so the hot path is statically dispatched and nothing is boxed per operation.
//!
//! # Who checks what
//!
//! - Bounds: every offset/length pair is checked with overflow-safe arithmetic before any
//!   byte moves ([`check_bounds`]); a target checks remote requests against its own
//!   registration table and never trusts the initiator's view.
//! - Time: every operation takes a [`Deadline`] (default [`Deadline::DEFAULT_TIMEOUT`]), and
//!   ends by it.
//! - Cancellation: dropping a transfer future cancels it; when the drop returns, the
//!   transport no longer touches that batch's local memory.
//!
//! # Safety story
//!
//! Registered memory is shared with hardware and with peers, like DMA memory. Registering a
//! raw [`Region`] is therefore `unsafe` ([`Communicator::register`]): the caller promises it
//! stays allocated while registered. [`RegisteredBuffer`] owns both allocation and
//! registration and drops them in the right order, so safe code never needs the raw call.
//! [`MemSpan`]/[`MemSpanMut`] borrow what they point at, so a copy cannot outlive its source.
//!
//! # Conformance
//!
//! With feature `testing`, `hmc_core::testing` holds generic checks that every backend's tests run
//! through `memory_conformance!` and `communicator_conformance!`; a third-party backend
//! runs the same kit.

mod batch;
mod caps;
mod comm;
mod conn_buffer;
mod dyn_memory;
mod dynamic;
mod error;
mod ids;
mod memory;
mod no_comm;
mod staging;
#[cfg(feature = "testing")]
pub mod testing;
mod ticket;
mod view;

pub use batch::{RemoteFacts, check_desc};
pub use caps::{CommCapabilities, DeviceMemoryPath, MemoryCapabilities, MemoryKinds};
pub use comm::{
    Access, Communicator, Deadline, LocalRegistration, Notification, Op, PeerAddr, RemoteRegion,
    TransferDesc,
};
pub use conn_buffer::{ConnBuffer, RegisteredBuffer};
pub use dyn_memory::{AnyBuffer, AnyMemory, DynMemory};
pub use dynamic::{
    AnyCommunicator, BoxFuture, DynCommunicator, DynEndpoint, DynRegistration, DynRemoteKey,
};
pub use error::{DeviceErrorKind, Error, Result, check_bounds};
pub use ids::{DeviceKind, TransportId};
pub use memory::{
    Device, DeviceBuffer, DmaBuf, IpcDescriptor, IpcSpan, IpcSpanMapping, MemSpan, MemSpanMut,
    Memory, Region, check_copy,
};
pub use no_comm::{NoCommunicator, NoRegistration};
pub use staging::{StagedRun, Stager, StagingConfig};
pub use ticket::RegionTicket;
pub use view::RemoteView;
