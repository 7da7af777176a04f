//! `export_plugin!` with a memory backend alone, called through the C table as a host would: what the table provides, the author's errors as status codes with their text, panics caught at the boundary, and `memory_info` within a smaller host struct.

use std::ffi::CStr;

use hmc_backend_cpu::{HostBuffer, HostMemory};
use hmc_core::{
    Device, DeviceBuffer, DeviceKind, Error, MemSpan, MemSpanMut, Memory, Region, Result,
    check_copy,
};
use hmc_plugin::abi::*;
use hmc_plugin::export::Config;

/// The device kind of the test backend: a third-party wire number.
const KIND: DeviceKind = DeviceKind::from_wire_id(201);
/// An allocation of this many bytes panics inside the backend.
const PANIC_LEN: u64 = 13;

/// Host memory under a third-party device kind; panics on a chosen length.
struct TestMemory {
    host: HostMemory,
    device: Device,
}

struct TestBuffer {
    host: HostBuffer,
    device: Device,
}

impl DeviceBuffer for TestBuffer {
    fn region(&self) -> Region {
        Region {
            device: self.device,
            ..self.host.region()
        }
    }
}

impl Memory for TestMemory {
    type Buffer = TestBuffer;

    fn device(&self) -> Device {
        self.device
    }

    fn max_alloc(&self) -> usize {
        1 << 20
    }

    fn alloc(&self, len: usize) -> Result<TestBuffer> {
        assert_ne!(len as u64, PANIC_LEN, "the test backend panics on 13 bytes");
        if len > self.max_alloc() {
            return Err(Error::OutOfMemory {
                device: self.device,
                len: len as u64,
            });
        }
        Ok(TestBuffer {
            host: self.host.alloc(len)?,
            device: self.device,
        })
    }

    fn copy(&self, dst: &mut MemSpanMut<'_>, src: &MemSpan<'_>) -> Result<()> {
        check_copy(self.device, dst, src)?;
        // Host memory underneath: relabel both spans as host memory for HostMemory's copy.
        // SAFETY: the spans borrow live memory for this call; only the label changes.
        let (mut d, s) = unsafe {
            (
                MemSpanMut::from_region(Region {
                    device: Device::HOST,
                    ..dst.region()
                }),
                MemSpan::from_region(Region {
                    device: Device::HOST,
                    ..src.region()
                }),
            )
        };
        self.host.copy(&mut d, &s)
    }
}

fn open_memory(config: &Config) -> Result<TestMemory> {
    let ordinal = config
        .get("ordinal")
        .unwrap_or("0")
        .parse()
        .map_err(|e| Error::InvalidArgument(format!("ordinal: {e}")))?;
    Ok(TestMemory {
        host: HostMemory::new(),
        device: Device::new(KIND, ordinal),
    })
}

hmc_plugin::export_plugin! {
    name: "testmem",
    memory: TestMemory,
    open_memory: open_memory,
}

fn table() -> HmcPluginApi {
    // SAFETY: all-zero is a valid table; the entry point fills at most its size.
    let mut api: HmcPluginApi = unsafe { std::mem::zeroed() };
    // SAFETY: `api` is writable for its size; no host table.
    let code = unsafe {
        hmc_plugin_init(
            HMC_PLUGIN_ABI_MAJOR,
            HMC_PLUGIN_ABI_MINOR,
            std::ptr::null(),
            &mut api,
            std::mem::size_of::<HmcPluginApi>(),
        )
    };
    assert_eq!(code, HMC_OK);
    api
}

fn last_error(api: &HmcPluginApi) -> String {
    // SAFETY: the glue's last-error string is NUL-terminated and lives until the next call.
    unsafe { CStr::from_ptr(api.last_error.unwrap()()) }
        .to_string_lossy()
        .into_owned()
}

fn open(api: &HmcPluginApi, config: &str) -> *mut HmcMemory {
    let mut mem = std::ptr::null_mut();
    // SAFETY: `config` is readable for its length; `mem` is written.
    let code = unsafe { api.memory_open.unwrap()(config.as_ptr(), config.len(), &mut mem) };
    assert_eq!(code, HMC_OK, "{}", last_error(api));
    mem
}

#[test]
fn a_memory_only_plugin_fills_the_memory_functions_alone() {
    let api = table();
    assert_eq!(api.header.capabilities, HMC_PLUGIN_PROVIDES_MEMORY);
    // SAFETY: the name is a static NUL-terminated string.
    assert_eq!(unsafe { CStr::from_ptr(api.header.name) }, c"testmem");
    assert_eq!(api.header.struct_size, std::mem::size_of::<HmcPluginApi>());
    assert!(api.comm_open.is_none() && api.transfer_start.is_none());
    assert!(
        api.memory_open.is_some()
            && api.memory_destroy.is_some()
            && api.memory_info.is_some()
            && api.memory_alloc.is_some()
            && api.memory_free.is_some()
            && api.memory_copy.is_some()
    );
}

#[test]
fn info_alloc_copy_and_free_through_the_table() {
    let api = table();
    let mem = open(&api, "ordinal=5\n");
    // SAFETY: all-zero is a valid info struct.
    let mut info: HmcMemoryInfo = unsafe { std::mem::zeroed() };
    info.struct_size = std::mem::size_of::<HmcMemoryInfo>();
    // SAFETY: `mem` is live; `info` is writable for its struct_size.
    assert_eq!(unsafe { api.memory_info.unwrap()(mem, &mut info) }, HMC_OK);
    assert_eq!(
        (info.device_kind, info.device_ordinal, info.max_alloc),
        (201, 5, 1 << 20)
    );
    let (mut buf, mut addr) = (std::ptr::null_mut(), 0u64);
    // SAFETY: `mem` is live; the out-parameters are writable.
    assert_eq!(
        unsafe { api.memory_alloc.unwrap()(mem, 64, &mut buf, &mut addr) },
        HMC_OK
    );
    let src = [0x5Au8; 64];
    let mut back = [0u8; 64];
    let device = HmcRegion {
        addr,
        len: 64,
        device_kind: 201,
        device_ordinal: 5,
    };
    let host = |bytes: *const u8| HmcRegion {
        addr: bytes as u64,
        len: 64,
        device_kind: 0,
        device_ordinal: 0,
    };
    // SAFETY: every region is live memory of its length for the calls.
    unsafe {
        assert_eq!(
            api.memory_copy.unwrap()(mem, &device, &host(src.as_ptr())),
            HMC_OK
        );
        assert_eq!(
            api.memory_copy.unwrap()(mem, &host(back.as_mut_ptr()), &device),
            HMC_OK
        );
    }
    assert_eq!(back, src);
    // A copy of unequal lengths is refused by the backend itself, with its text.
    let short = HmcRegion { len: 8, ..device };
    // SAFETY: as above; nothing is copied.
    let code = unsafe { api.memory_copy.unwrap()(mem, &short, &host(src.as_ptr())) };
    assert_eq!(code, HMC_ERR_INVALID_ARGUMENT, "{}", last_error(&api));
    assert!(!last_error(&api).is_empty());
    // SAFETY: `buf` and `mem` are live and released once, the buffer first.
    unsafe {
        api.memory_free.unwrap()(mem, buf);
        api.memory_destroy.unwrap()(mem);
    }
}

#[test]
fn the_authors_errors_become_status_codes_with_their_text() {
    let api = table();
    let bad = "ordinal=many\n";
    let mut mem = std::ptr::null_mut();
    // SAFETY: as in `open`.
    let code = unsafe { api.memory_open.unwrap()(bad.as_ptr(), bad.len(), &mut mem) };
    assert_eq!(code, HMC_ERR_INVALID_ARGUMENT);
    assert!(last_error(&api).contains("ordinal"), "{}", last_error(&api));
    let mem = open(&api, "");
    let (mut buf, mut addr) = (std::ptr::null_mut(), 0u64);
    // SAFETY: `mem` is live; the out-parameters are writable.
    let code = unsafe { api.memory_alloc.unwrap()(mem, 2 << 20, &mut buf, &mut addr) };
    assert_eq!(code, HMC_ERR_OUT_OF_MEMORY, "{}", last_error(&api));
    // Any length past max_alloc, however large: out of memory.
    // SAFETY: as above.
    let code = unsafe { api.memory_alloc.unwrap()(mem, u64::MAX, &mut buf, &mut addr) };
    assert_eq!(code, HMC_ERR_OUT_OF_MEMORY);
    // SAFETY: `mem` is live and destroyed once.
    unsafe { api.memory_destroy.unwrap()(mem) };
}

#[test]
fn a_panic_in_the_backend_is_an_internal_error_not_an_abort() {
    let api = table();
    let mem = open(&api, "");
    let (mut buf, mut addr) = (std::ptr::null_mut(), 0u64);
    // SAFETY: `mem` is live; the out-parameters are writable.
    let code = unsafe { api.memory_alloc.unwrap()(mem, PANIC_LEN, &mut buf, &mut addr) };
    assert_eq!(code, HMC_ERR_INTERNAL);
    let msg = last_error(&api);
    assert!(
        msg.contains("the plugin panicked") && msg.contains("panics on 13 bytes"),
        "{msg}"
    );
    // The backend is still usable afterwards.
    // SAFETY: as above.
    let code = unsafe { api.memory_alloc.unwrap()(mem, 16, &mut buf, &mut addr) };
    assert_eq!(code, HMC_OK);
    // SAFETY: live handles, released once.
    unsafe {
        api.memory_free.unwrap()(mem, buf);
        api.memory_destroy.unwrap()(mem);
    }
}

#[test]
fn info_fills_no_more_than_an_older_host_struct() {
    let api = table();
    let mem = open(&api, "ordinal=2\n");
    // An older host knows only struct_size and device_kind: 12 bytes, padded to 16.
    let old = std::mem::offset_of!(HmcMemoryInfo, device_ordinal);
    let mut raw = [0xEEu8; std::mem::size_of::<HmcMemoryInfo>()];
    raw[..std::mem::size_of::<usize>()].copy_from_slice(&old.to_ne_bytes());
    // SAFETY: `raw` is writable for the whole struct; the plugin may write `old` bytes.
    let code = unsafe { api.memory_info.unwrap()(mem, raw.as_mut_ptr().cast()) };
    assert_eq!(code, HMC_OK);
    let filled = usize::from_ne_bytes(raw[..8].try_into().unwrap());
    assert_eq!(filled, old);
    assert_eq!(u32::from_ne_bytes(raw[8..12].try_into().unwrap()), 201);
    assert!(
        raw[old..].iter().all(|b| *b == 0xEE),
        "bytes past the host's struct_size were written"
    );
    // SAFETY: `mem` is live and destroyed once.
    unsafe { api.memory_destroy.unwrap()(mem) };
}
