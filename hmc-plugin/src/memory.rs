//! `PluginMemory`: a loaded plugin's device memory backend as an `hmc_core::Memory`, so the memory kit and every generic user run over it unchanged.
//!
//! The host checks copy lengths and devices (`check_copy`) and the allocation limit the
//! plugin declared before calling it.

use std::sync::Arc;
use std::time::Instant;

use hmc_core::{
    Device, DeviceBuffer, DeviceKind, Error, MemSpan, MemSpanMut, Memory, Region, Result,
    check_copy,
};

use crate::abi::*;
use crate::load::Plugin;

struct MemInner {
    plugin: Arc<Plugin>,
    mem: *mut HmcMemory,
    device: Device,
    max_alloc: usize,
}

// SAFETY: the ABI makes an HmcMemory usable from any thread at once.
unsafe impl Send for MemInner {}
// SAFETY: as above.
unsafe impl Sync for MemInner {}

impl MemInner {
    fn check(&self, function: &'static str, code: i32) -> Result<()> {
        if code == HMC_OK {
            return Ok(());
        }
        Err(self.plugin.call_error(function, code, Instant::now()))
    }
}

impl Drop for MemInner {
    fn drop(&mut self) {
        // SAFETY: every buffer holds an Arc to this, so none is left.
        unsafe { self.plugin.api.memory_destroy.expect("checked at load")(self.mem) };
    }
}

/// A device memory backend of a plugin.
pub struct PluginMemory {
    inner: Arc<MemInner>,
}

/// One allocation of a [`PluginMemory`]; freed when dropped.
pub struct PluginBuffer {
    inner: Arc<MemInner>,
    buf: *mut HmcBuffer,
    region: Region,
}

// SAFETY: the ABI makes an HmcBuffer usable from any thread at once.
unsafe impl Send for PluginBuffer {}
// SAFETY: as above.
unsafe impl Sync for PluginBuffer {}

impl DeviceBuffer for PluginBuffer {
    fn region(&self) -> Region {
        self.region
    }
}

impl Drop for PluginBuffer {
    fn drop(&mut self) {
        // SAFETY: made by memory_alloc of this backend, freed once.
        unsafe { self.inner.plugin.api.memory_free.expect("checked")(self.inner.mem, self.buf) };
    }
}

/// `region` as the ABI passes regions (`memory_copy`, `register_mem`, `import`).
pub(crate) fn abi_region(region: Region) -> HmcRegion {
    HmcRegion {
        addr: region.addr,
        len: region.len as u64,
        device_kind: region.device.kind.wire_id() as u32,
        device_ordinal: region.device.ordinal,
    }
}

impl PluginMemory {
    /// Opens the memory backend of `plugin` with `config` (`key=value` lines; hosts pass
    /// `ordinal=N`).
    pub fn open(plugin: Arc<Plugin>, config: &str) -> Result<Self> {
        if !plugin.provides_memory() {
            return Err(Error::Unsupported(format!(
                "plugin `{}` ({}) provides no memory backend",
                plugin.name(),
                plugin.path().display()
            )));
        }
        let api = plugin.api;
        let mem = plugin.open_handle("memory_open", api.memory_open.expect("checked"), config)?;
        let mut inner = MemInner {
            plugin,
            mem,
            device: Device::HOST,
            max_alloc: 0,
        };
        // SAFETY: all-zero is a valid HmcMemoryInfo.
        let mut info: HmcMemoryInfo = unsafe { std::mem::zeroed() };
        info.struct_size = std::mem::size_of::<HmcMemoryInfo>();
        // SAFETY: `info` is writable for its struct_size.
        let code = unsafe { api.memory_info.expect("checked")(mem, &mut info) };
        inner.check("memory_info", code)?;
        let kind = u8::try_from(info.device_kind).map_err(|_| {
            Error::Protocol(format!(
                "plugin `{}`: device kind {} is not a wire number",
                inner.plugin.name(),
                info.device_kind
            ))
        })?;
        inner.device = Device::new(DeviceKind::from_wire_id(kind), info.device_ordinal);
        inner.max_alloc = usize::try_from(info.max_alloc).unwrap_or(usize::MAX);
        Ok(PluginMemory {
            inner: Arc::new(inner),
        })
    }
}

impl Memory for PluginMemory {
    type Buffer = PluginBuffer;

    fn device(&self) -> Device {
        self.inner.device
    }

    fn max_alloc(&self) -> usize {
        self.inner.max_alloc
    }

    fn alloc(&self, len: usize) -> Result<PluginBuffer> {
        if len > self.inner.max_alloc {
            return Err(Error::OutOfMemory {
                device: self.inner.device,
                len: len as u64,
            });
        }
        let mut buf: *mut HmcBuffer = std::ptr::null_mut();
        let mut addr = 0u64;
        // SAFETY: `buf` and `addr` are written.
        let code = unsafe {
            self.inner.plugin.api.memory_alloc.expect("checked")(
                self.inner.mem,
                len as u64,
                &mut buf,
                &mut addr,
            )
        };
        self.inner.check("memory_alloc", code)?;
        if buf.is_null() {
            return Err(Error::Protocol(format!(
                "plugin `{}`: memory_alloc returned HMC_OK without a buffer (a plugin bug)",
                self.inner.plugin.name()
            )));
        }
        Ok(PluginBuffer {
            inner: self.inner.clone(),
            buf,
            region: Region {
                device: self.inner.device,
                addr,
                len,
            },
        })
    }

    fn copy(&self, dst: &mut MemSpanMut<'_>, src: &MemSpan<'_>) -> Result<()> {
        check_copy(self.inner.device, dst, src)?;
        if dst.is_empty() {
            return Ok(());
        }
        let (d, s) = (abi_region(dst.region()), abi_region(src.region()));
        // SAFETY: both spans borrow live memory for the call (their owners' borrows), of
        // equal lengths and allowed devices (checked above).
        let code =
            unsafe { self.inner.plugin.api.memory_copy.expect("checked")(self.inner.mem, &d, &s) };
        self.inner.check("memory_copy", code)
    }
}
