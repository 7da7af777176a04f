//! The memory half of the Rust plugin glue: an `hmc_core::Memory` behind the table's `memory_open` … `memory_copy`.
//!
//! The host has checked lengths, devices and the declared `max_alloc` before it calls
//! (`PluginMemory`); the backend's own `Memory::copy` checks again, so a host that does
//! not check still gets an error, never a wild copy of the wrong length.

use hmc_core::{DeviceBuffer, Error, MemSpan, MemSpanMut, Memory, Result};

use super::{
    Config, at, config_from, fail, guard, guard_void, hand_out, region_of, status, write_sized,
};
use crate::abi::*;

/// A Rust device memory backend exported as a plugin; implemented by
/// [`export_plugin!`](crate::export_plugin).
pub trait PluginMemoryBackend: 'static {
    /// The memory backend type.
    type Memory: Memory;
    /// Opens the backend of one device from the host's configuration (hosts pass
    /// `ordinal=N`).
    fn open(config: &Config) -> Result<Self::Memory>;
}

/// Sets the memory functions of `M` in `api` and `HMC_PLUGIN_PROVIDES_MEMORY`;
/// [`export_plugin!`](crate::export_plugin) calls it.
pub fn fill_memory<M: PluginMemoryBackend>(api: &mut HmcPluginApi) {
    api.header.capabilities |= HMC_PLUGIN_PROVIDES_MEMORY;
    api.memory_open = Some(memory_open::<M>);
    api.memory_destroy = Some(memory_destroy::<M>);
    api.memory_info = Some(memory_info::<M>);
    api.memory_alloc = Some(memory_alloc::<M>);
    api.memory_free = Some(memory_free::<M>);
    api.memory_copy = Some(memory_copy::<M>);
}

type Buf<M> = <<M as PluginMemoryBackend>::Memory as Memory>::Buffer;

unsafe extern "C" fn memory_open<M: PluginMemoryBackend>(
    config: *const u8,
    len: usize,
    out: *mut *mut HmcMemory,
) -> i32 {
    guard(|| {
        // SAFETY: the host passes `len` readable bytes.
        let opened = unsafe { config_from(config, len) }.and_then(|c| M::open(&c));
        // SAFETY: `out` is writable.
        unsafe { hand_out(opened, out) }
    })
}

unsafe extern "C" fn memory_destroy<M: PluginMemoryBackend>(mem: *mut HmcMemory) {
    guard_void(|| {
        // SAFETY: made by memory_open, destroyed once, after every buffer of it (ABI).
        drop(unsafe { Box::from_raw(mem.cast::<M::Memory>()) });
    })
}

unsafe extern "C" fn memory_info<M: PluginMemoryBackend>(
    mem: *mut HmcMemory,
    out: *mut HmcMemoryInfo,
) -> i32 {
    guard(|| {
        // SAFETY: a live memory backend of this glue.
        let m = unsafe { at::<M::Memory, _>(mem) };
        let device = m.device();
        let info = HmcMemoryInfo {
            struct_size: std::mem::size_of::<HmcMemoryInfo>(),
            device_kind: u32::from(device.kind.wire_id()),
            device_ordinal: device.ordinal,
            max_alloc: u64::try_from(m.max_alloc()).unwrap_or(u64::MAX),
        };
        // SAFETY: the host's struct is writable for its struct_size, its first field.
        unsafe { write_sized(info, out) };
        HMC_OK
    })
}

unsafe extern "C" fn memory_alloc<M: PluginMemoryBackend>(
    mem: *mut HmcMemory,
    len: u64,
    out: *mut *mut HmcBuffer,
    addr: *mut u64,
) -> i32 {
    guard(|| {
        // SAFETY: a live memory backend of this glue.
        let m = unsafe { at::<M::Memory, _>(mem) };
        let result = usize::try_from(len)
            .map_err(|_| Error::OutOfMemory {
                device: m.device(),
                len,
            })
            .and_then(|len| m.alloc(len));
        match result {
            Ok(buf) => {
                let start = buf.region().addr;
                // SAFETY: both out-parameters are writable.
                unsafe {
                    *addr = start;
                    *out = Box::into_raw(Box::new(buf)).cast();
                }
                HMC_OK
            }
            Err(e) => fail(&e),
        }
    })
}

unsafe extern "C" fn memory_free<M: PluginMemoryBackend>(mem: *mut HmcMemory, buf: *mut HmcBuffer) {
    let _ = mem;
    guard_void(|| {
        // SAFETY: made by memory_alloc of this backend, freed once.
        drop(unsafe { Box::from_raw(buf.cast::<Buf<M>>()) });
    })
}

unsafe extern "C" fn memory_copy<M: PluginMemoryBackend>(
    mem: *mut HmcMemory,
    dst: *const HmcRegion,
    src: *const HmcRegion,
) -> i32 {
    guard(|| {
        // SAFETY: a live memory backend of this glue; both regions readable for the call.
        let (m, d, s) = unsafe { (at::<M::Memory, _>(mem), *dst, *src) };
        status(region_of(&d).and_then(|d| {
            let s = region_of(&s)?;
            // SAFETY: the host passes regions it holds borrowed for the call (the spans
            // of `Memory::copy` on its side), live and of the devices they name.
            let (mut d, s) = unsafe { (MemSpanMut::from_region(d), MemSpan::from_region(s)) };
            m.copy(&mut d, &s)
        }))
    })
}
