//! The engine through C (`hmc_engine_*`, `hmc_register_mem`, `hmc_connect`,
//! `hmc_transfer_sync`, notifications, metadata blobs): [`hmc_engine::Engine`] over the
//! transport its options name, on the library's runtime.

use std::collections::{HashMap, VecDeque};
use std::ffi::{CString, c_char, c_int};
use std::os::fd::AsRawFd;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hmc_core::{AnyCommunicator, AnyMemory, DeviceKind};
use hmc_engine::{Engine, EngineConfig, MemType, TransferOp, TransferOpDesc};
use hmc_transport_kit::wake::WakeFd;
use parking_lot::Mutex;

use crate::error::{Error, Result, Status, guard};
use crate::handles::{
    Table, id, need_out, opaque, ptr, same_engine, sized_arg, slice_arg, str_arg, write_buf,
    write_out,
};
use crate::{block_on, runtime};

opaque! {
    /// `hmc_engine`: an opaque engine handle.
    HmcEngine;
    /// `hmc_mem`: an opaque memory registration handle.
    HmcMem;
    /// `hmc_notify_list`: an opaque list of received notifications.
    HmcNotifyList;
}

/// `hmc_option`: one key/value option (HIXL's option map, one entry).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HmcOption {
    /// The option's name (`"transport"`, `"max_regions"`, …).
    pub key: *const c_char,
    /// Its value as text.
    pub value: *const c_char,
}

/// `hmc_engine_options`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EngineOptions {
    /// `sizeof(hmc_engine_options)` as the caller compiled it.
    pub struct_size: usize,
    /// `num_options` options (may be NULL when `num_options` is 0).
    pub options: *const HmcOption,
    /// How many.
    pub num_options: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            struct_size: 0,
            options: std::ptr::null(),
            num_options: 0,
        }
    }
}

/// `hmc_mem_desc`: memory to register.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct MemDescC {
    /// `sizeof(hmc_mem_desc)`.
    pub struct_size: usize,
    /// Start address (host or device).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// `HMC_MEM_HOST` (0) or `HMC_MEM_DEVICE` (1).
    pub mem_type: u32,
    /// For device memory: `HMC_DEVICE_CUDA` (1), `_ROCM` (2), `_MLU` (3), `_MUSA` (4),
    /// `_ASCEND` (5).
    pub device_kind: u32,
    /// For device memory: the device's ordinal.
    pub device_id: u32,
    /// `HMC_MEM_READ_ONLY` (1): peers may only read it, and it may only be a WRITE's
    /// source. 0: read and write.
    pub flags: u32,
}

/// `hmc_xfer_desc`: one element of a transfer (HIXL's `TransferOpDesc`). Fixed layout:
/// it never grows (a new descriptor would be a new type).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct XferDesc {
    /// Address in this engine's registered memory.
    pub local_addr: u64,
    /// Address in the peer's registered memory.
    pub remote_addr: u64,
    /// Bytes to move.
    pub len: u64,
}

/// `hmc_notify`: one received notification; the strings and bytes belong to its list.
#[repr(C)]
pub struct NotifyC {
    /// `sizeof(hmc_notify)` of this library (fields are only ever added at the end).
    pub struct_size: usize,
    /// The sending engine's name.
    pub from: *const c_char,
    /// The notification's name.
    pub name: *const c_char,
    /// Its message.
    pub msg: *const u8,
    /// The message's length.
    pub msg_len: usize,
    /// NULL, or why the transfer it was attached to failed.
    pub failed: *const c_char,
}

/// An open engine.
pub(crate) struct EngineObj {
    pub(crate) engine: Engine<AnyCommunicator>,
    pub(crate) config: EngineConfig,
    /// Readable when a request completes or a notification arrives.
    pub(crate) wake: Arc<WakeFd>,
    /// Requests completed since the last `hmc_engine_poll_completed`.
    pub(crate) completed: Arc<Mutex<VecDeque<u64>>>,
}

impl EngineObj {
    /// A call's timeout: `ms`, or the engine's `default_timeout_ms` for 0.
    pub(crate) fn timeout(&self, ms: u32) -> Duration {
        if ms == 0 {
            self.config.default_timeout
        } else {
            Duration::from_millis(u64::from(ms))
        }
    }
}

/// A registration and the engine it belongs to.
struct MemObj {
    engine: u64,
    handle: hmc_engine::MemHandle,
}

/// Received notifications, in C's shape, with the strings they point into.
struct NotifyList {
    items: Vec<NotifyC>,
    _strings: Vec<CString>,
    _msgs: Vec<Vec<u8>>,
}

// SAFETY: the raw pointers of `items` point into `_strings` and `_msgs`, owned by the same
// list and never changed after it is made; reading them from any thread is safe.
unsafe impl Send for NotifyList {}
// SAFETY: as above; the list is immutable once made.
unsafe impl Sync for NotifyList {}

pub(crate) static ENGINES: Table<EngineObj> = Table::new("engine", 1);
static MEMS: Table<MemObj> = Table::new("memory registration", 2);
static NOTIFY_LISTS: Table<NotifyList> = Table::new("notification list", 4);

/// The open engine `e`.
pub(crate) fn engine_arg(e: *const HmcEngine) -> Result<Arc<EngineObj>> {
    ENGINES.get(id(e))
}

/// Reads the options of `hmc_engine_options` into a map.
///
/// # Safety
/// As `hmc_engine_open`'s `options`.
unsafe fn read_options(opts: *const EngineOptions) -> Result<HashMap<String, String>> {
    let mut map = HashMap::new();
    if opts.is_null() {
        return Ok(map);
    }
    // SAFETY: forwarded contract.
    let o = unsafe { sized_arg(opts, "hmc_engine_options", size_of::<EngineOptions>()) }?;
    // SAFETY: `num_options` entries by the caller's contract, bounded first.
    let entries = unsafe { slice_arg(o.options, o.num_options, 4096, "options", "options") }?;
    for (i, kv) in entries.iter().enumerate() {
        // SAFETY: NUL-terminated strings by the caller's contract.
        let (k, v) = unsafe {
            (
                str_arg(kv.key, "option key")?,
                str_arg(kv.value, "option value")?,
            )
        };
        if k.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "option {i} has an empty key"
            )));
        }
        map.insert(k.to_string(), v.to_string());
    }
    Ok(map)
}

/// `hmc_engine_open`: see `hmc.h`.
///
/// # Safety
/// `local` is a NUL-terminated string; `options` is NULL or a valid `hmc_engine_options`
/// whose arrays and strings are valid; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_engine_open(
    local: *const c_char,
    options: *const EngineOptions,
    out: *mut *mut HmcEngine,
) -> Status {
    guard("hmc_engine_open", || {
        need_out(out, "out")?;
        // SAFETY: forwarded contract.
        let local = unsafe { str_arg(local, "local_engine") }?;
        // SAFETY: forwarded contract.
        let map = unsafe { read_options(options) }?;
        let config = EngineConfig::from_options(&map)?;
        let engine = block_on(Engine::initialize_with(local, config.clone()))??;
        let wake = Arc::new(WakeFd::new("the engine's completion eventfd")?);
        let w = wake.clone();
        engine.on_notify(move || w.signal());
        let obj = EngineObj {
            engine,
            config,
            wake,
            completed: Arc::default(),
        };
        let e = ENGINES.insert(obj);
        // SAFETY: checked writable above.
        unsafe { write_out(out, "out", ptr(e)) }
    })
}

/// `hmc_engine_close`: see `hmc.h`.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_engine_close(engine: *mut HmcEngine) -> Status {
    guard("hmc_engine_close", || {
        let e = ENGINES.remove(id(engine))?;
        let me = id(engine);
        MEMS.remove_where(|m| m.engine == me);
        crate::engine_tables::forget_engine(me);
        let fin = e.engine.clone();
        if tokio::runtime::Handle::try_current().is_ok() {
            runtime()?.spawn(async move { fin.finalize().await });
        } else {
            block_on(fin.finalize())?;
        }
        Ok(())
    })
}

/// `hmc_engine_name`: see `hmc.h`.
///
/// # Safety
/// `buf` is NULL or writable for `cap` bytes; `len` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_engine_name(
    engine: *const HmcEngine,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> Status {
    guard("hmc_engine_name", || {
        let e = engine_arg(engine)?;
        // SAFETY: forwarded contract.
        unsafe {
            write_buf(
                e.engine.name().as_bytes(),
                true,
                buf.cast(),
                cap,
                len,
                "the name",
            )
        }
    })
}

/// `hmc_engine_fd`: see `hmc.h`.
///
/// # Safety
/// `fd` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_engine_fd(engine: *const HmcEngine, fd: *mut c_int) -> Status {
    guard("hmc_engine_fd", || {
        let e = engine_arg(engine)?;
        // SAFETY: forwarded contract.
        unsafe { write_out(fd, "fd", e.wake.as_raw_fd()) }
    })
}

/// `hmc_engine_fd_drain`: see `hmc.h`.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_engine_fd_drain(engine: *const HmcEngine) -> Status {
    guard("hmc_engine_fd_drain", || {
        engine_arg(engine)?.wake.drain();
        Ok(())
    })
}

/// The backend of device `ordinal` of `kind`, opened on first use and kept for the
/// process (every registration of a device shares its context).
pub(crate) fn device_memory(kind: DeviceKind, ordinal: u32) -> Result<AnyMemory> {
    static OPEN: OnceLock<Mutex<HashMap<(DeviceKind, u32), AnyMemory>>> = OnceLock::new();
    let mut open = OPEN.get_or_init(Default::default).lock();
    if let Some(m) = open.get(&(kind, ordinal)) {
        return Ok(m.clone());
    }
    let m = if kind == DeviceKind::CUDA {
        AnyMemory::new(hmc_backend_cuda::CudaMemory::new(ordinal)?)
    } else if kind == DeviceKind::ROCM {
        AnyMemory::new(hmc_backend_rocm::RocmMemory::new(ordinal)?)
    } else if kind == DeviceKind::MLU {
        AnyMemory::new(hmc_backend_mlu::MluMemory::new(ordinal)?)
    } else if kind == DeviceKind::MUSA {
        AnyMemory::new(hmc_backend_musa::MusaMemory::new(ordinal)?)
    } else {
        AnyMemory::new(hmc_backend_ascend::AscendMemory::new(ordinal)?)
    };
    open.insert((kind, ordinal), m.clone());
    Ok(m)
}

/// `hmc_register_mem`: see `hmc.h`.
///
/// # Safety
/// `desc` points to a valid `hmc_mem_desc`; the memory it names stays allocated until
/// `hmc_deregister_mem` of the handle (or `hmc_engine_close`) has returned; `out` is
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_register_mem(
    engine: *mut HmcEngine,
    desc: *const MemDescC,
    out: *mut *mut HmcMem,
) -> Status {
    guard("hmc_register_mem", || {
        need_out(out, "out")?;
        let e = engine_arg(engine)?;
        // SAFETY: forwarded contract.
        let d = unsafe { sized_arg(desc, "hmc_mem_desc", size_of::<MemDescC>()) }?;
        let len = usize::try_from(d.len)
            .ok()
            .filter(|&l| l <= isize::MAX as usize)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("len {} is past the address space", d.len))
            })?;
        if d.addr.checked_add(d.len).is_none() {
            return Err(Error::InvalidArgument(format!(
                "{:#x}+{} wraps around the address space",
                d.addr, d.len
            )));
        }
        if d.flags & !1 != 0 {
            return Err(Error::InvalidArgument(format!(
                "unknown flags {:#x}; pass 0 or HMC_MEM_READ_ONLY",
                d.flags
            )));
        }
        let access = if d.flags & 1 != 0 {
            hmc_engine::Access::READ
        } else {
            hmc_engine::Access::READ_WRITE
        };
        let mdesc = hmc_engine::MemDesc { addr: d.addr, len };
        let handle = match d.mem_type {
            0 => {
                if d.device_kind != 0 || d.device_id != 0 {
                    return Err(Error::InvalidArgument(
                        "host memory with a device_kind or device_id; set mem_type = HMC_MEM_DEVICE for device memory".into(),
                    ));
                }
                // SAFETY: the caller keeps the memory allocated until deregistration.
                unsafe { e.engine.register_mem(mdesc, MemType::Host, access) }?
            }
            1 => {
                let kind = match d.device_kind {
                    1 => DeviceKind::CUDA,
                    2 => DeviceKind::ROCM,
                    3 => DeviceKind::MLU,
                    4 => DeviceKind::MUSA,
                    5 => DeviceKind::ASCEND,
                    k => {
                        return Err(Error::InvalidArgument(format!(
                            "unknown device_kind {k}; use HMC_DEVICE_CUDA, _ROCM, _MLU, _MUSA or _ASCEND"
                        )));
                    }
                };
                if access != hmc_engine::Access::READ_WRITE {
                    return Err(Error::InvalidArgument(
                        "device memory registers read-write only; leave flags 0".into(),
                    ));
                }
                let memory = device_memory(kind, d.device_id)?;
                // SAFETY: the caller keeps the memory allocated until deregistration.
                unsafe { e.engine.register_device_mem(mdesc, memory) }?
            }
            t => {
                return Err(Error::InvalidArgument(format!(
                    "unknown mem_type {t}; use HMC_MEM_HOST or HMC_MEM_DEVICE"
                )));
            }
        };
        let m = MEMS.insert(MemObj {
            engine: id(engine),
            handle,
        });
        // SAFETY: checked writable above.
        unsafe { write_out(out, "out", ptr(m)) }
    })
}

/// `hmc_deregister_mem`: see `hmc.h`.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_deregister_mem(engine: *mut HmcEngine, mem: *mut HmcMem) -> Status {
    guard("hmc_deregister_mem", || {
        let e = engine_arg(engine)?;
        let m = MEMS.get(id(mem))?;
        same_engine("registration", id(mem), m.engine, id(engine))?;
        // Taken out first, so two racing calls deregister once.
        let m = MEMS.remove(id(mem))?;
        block_on(e.engine.deregister_mem(m.handle))??;
        Ok(())
    })
}

/// `hmc_connect`: see `hmc.h`.
///
/// # Safety
/// `remote` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_connect(
    engine: *mut HmcEngine,
    remote: *const c_char,
    timeout_ms: u32,
) -> Status {
    guard("hmc_connect", || {
        let e = engine_arg(engine)?;
        // SAFETY: forwarded contract.
        let remote = unsafe { str_arg(remote, "remote_engine") }?;
        block_on(e.engine.connect(remote, e.timeout(timeout_ms)))??;
        Ok(())
    })
}

/// `hmc_disconnect`: see `hmc.h`.
///
/// # Safety
/// `remote` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_disconnect(engine: *mut HmcEngine, remote: *const c_char) -> Status {
    guard("hmc_disconnect", || {
        let e = engine_arg(engine)?;
        // SAFETY: forwarded contract.
        let remote = unsafe { str_arg(remote, "remote_engine") }?;
        block_on(e.engine.disconnect(remote))??;
        Ok(())
    })
}

/// A transfer's direction from C.
pub(crate) fn op_arg(op: u32) -> Result<TransferOp> {
    match op {
        0 => Ok(TransferOp::Read),
        1 => Ok(TransferOp::Write),
        o => Err(Error::InvalidArgument(format!(
            "unknown op {o}; use HMC_READ or HMC_WRITE"
        ))),
    }
}

/// A transfer's descriptors from C, checked against the engine's limit first.
///
/// # Safety
/// When `n` is within `max_descs_per_transfer`, `descs` points to `n` descriptors.
pub(crate) unsafe fn descs_arg(
    e: &EngineObj,
    descs: *const XferDesc,
    n: usize,
) -> Result<Vec<TransferOpDesc>> {
    if n == 0 {
        return Err(Error::InvalidArgument(
            "a transfer of 0 descriptors; pass at least one".into(),
        ));
    }
    let max = e.config.max_descs_per_transfer;
    // SAFETY: forwarded contract.
    let s = unsafe { slice_arg(descs, n, max, "descs", "max_descs_per_transfer") }?;
    // No transfer moves 2^64 bytes; refusing here also keeps every later sum of the lengths
    // (the engine's byte counters, the request's telemetry) from overflowing.
    if s.iter()
        .try_fold(0u64, |a, d| a.checked_add(d.len))
        .is_none()
    {
        return Err(Error::InvalidArgument(
            "the descriptors' lengths add up past 2^64 bytes; pass the lengths of registered memory"
                .into(),
        ));
    }
    s.iter()
        .map(|d| {
            let len = usize::try_from(d.len)
                .map_err(|_| Error::InvalidArgument(format!("len {} is too large", d.len)))?;
            Ok(TransferOpDesc {
                local_addr: d.local_addr,
                remote_addr: d.remote_addr,
                len,
            })
        })
        .collect()
}

/// `hmc_transfer_sync`: see `hmc.h`.
///
/// # Safety
/// `remote` is a NUL-terminated string; `descs` points to `num_descs` descriptors.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_transfer_sync(
    engine: *mut HmcEngine,
    remote: *const c_char,
    op: u32,
    descs: *const XferDesc,
    num_descs: usize,
    timeout_ms: u32,
) -> Status {
    guard("hmc_transfer_sync", || {
        let e = engine_arg(engine)?;
        // SAFETY: forwarded contract.
        let remote = unsafe { str_arg(remote, "remote_engine") }?;
        let op = op_arg(op)?;
        // SAFETY: forwarded contract.
        let d = unsafe { descs_arg(&e, descs, num_descs) }?;
        block_on(e.engine.transfer(remote, op, &d, e.timeout(timeout_ms)))??;
        Ok(())
    })
}

/// `hmc_send_notify`: see `hmc.h`.
///
/// # Safety
/// `remote` and `name` are NUL-terminated strings; `msg` is readable for `msg_len` bytes
/// (or NULL with 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_send_notify(
    engine: *mut HmcEngine,
    remote: *const c_char,
    name: *const c_char,
    msg: *const u8,
    msg_len: usize,
    timeout_ms: u32,
) -> Status {
    guard("hmc_send_notify", || {
        let e = engine_arg(engine)?;
        // SAFETY: forwarded contract.
        let (remote, name) = unsafe { (str_arg(remote, "remote_engine")?, str_arg(name, "name")?) };
        let max = e.config.max_notify_len;
        // SAFETY: forwarded contract; the length is bounded by the limit first.
        let msg = unsafe { slice_arg(msg, msg_len, max, "msg", "max_notify_len") }?;
        block_on(
            e.engine
                .send_notify(remote, name, msg, e.timeout(timeout_ms)),
        )??;
        Ok(())
    })
}

/// `hmc_get_notifies`: see `hmc.h`.
///
/// # Safety
/// `out` and `count` are writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_get_notifies(
    engine: *mut HmcEngine,
    out: *mut *mut HmcNotifyList,
    count: *mut usize,
) -> Status {
    guard("hmc_get_notifies", || {
        need_out(out, "out")?;
        need_out(count, "count")?;
        let e = engine_arg(engine)?;
        let notes = e.engine.get_notifies();
        let mut strings = Vec::new();
        let mut msgs = Vec::new();
        let mut items = Vec::with_capacity(notes.len());
        let cstr = |s: &str| CString::new(s.replace('\0', "\\0")).unwrap_or_default();
        for n in notes {
            let (from, name) = (cstr(&n.from), cstr(&n.name));
            let failed = n.failed.as_deref().map(cstr);
            items.push(NotifyC {
                struct_size: size_of::<NotifyC>(),
                from: from.as_ptr(),
                name: name.as_ptr(),
                msg: n.msg.as_ptr(),
                msg_len: n.msg.len(),
                failed: failed.as_ref().map_or(std::ptr::null(), |f| f.as_ptr()),
            });
            // Moving a CString or Vec keeps its heap buffer where the pointers point.
            strings.extend([from, name]);
            strings.extend(failed);
            msgs.push(n.msg);
        }
        let n = items.len();
        let list = NOTIFY_LISTS.insert(NotifyList {
            items,
            _strings: strings,
            _msgs: msgs,
        });
        // SAFETY: checked writable above.
        unsafe {
            write_out(count, "count", n)?;
            write_out(out, "out", ptr(list))
        }
    })
}

/// `hmc_notify_list_get`: see `hmc.h`.
///
/// # Safety
/// `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_notify_list_get(
    list: *const HmcNotifyList,
    index: usize,
    out: *mut *const NotifyC,
) -> Status {
    guard("hmc_notify_list_get", || {
        need_out(out, "out")?;
        let l = NOTIFY_LISTS.get(id(list))?;
        let item = l.items.get(index).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "index {index} is past the list's {} notification(s)",
                l.items.len()
            ))
        })?;
        // The pointer stays valid after `l` drops: the table holds the list until
        // hmc_notify_list_free.
        let p: *const NotifyC = item;
        // SAFETY: checked writable above.
        unsafe { write_out(out, "out", p) }
    })
}

/// `hmc_notify_list_free`: see `hmc.h`.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_notify_list_free(list: *mut HmcNotifyList) -> Status {
    guard("hmc_notify_list_free", || {
        NOTIFY_LISTS.remove(id(list))?;
        Ok(())
    })
}

/// `hmc_local_metadata`: see `hmc.h`.
///
/// # Safety
/// `buf` is NULL or writable for `cap` bytes; `len` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_local_metadata(
    engine: *const HmcEngine,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
) -> Status {
    guard("hmc_local_metadata", || {
        need_out(len, "len")?;
        let e = engine_arg(engine)?;
        let blob = e.engine.local_metadata()?;
        // SAFETY: forwarded contract.
        unsafe { write_buf(&blob, false, buf, cap, len, "the metadata blob") }
    })
}

/// `hmc_add_remote`: see `hmc.h`.
///
/// # Safety
/// `blob` is readable for `blob_len` bytes; `name` is NULL or writable for `cap` bytes;
/// `name_len` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_add_remote(
    engine: *mut HmcEngine,
    blob: *const u8,
    blob_len: usize,
    timeout_ms: u32,
    name: *mut c_char,
    cap: usize,
    name_len: *mut usize,
) -> Status {
    guard("hmc_add_remote", || {
        let e = engine_arg(engine)?;
        let max = e.config.max_metadata_blob_len;
        // SAFETY: forwarded contract; the length is bounded by the limit first.
        let blob = unsafe { slice_arg(blob, blob_len, max, "blob", "max_metadata_blob_len") }?;
        if blob.is_empty() {
            return Err(Error::InvalidArgument("an empty metadata blob".into()));
        }
        let peer = block_on(e.engine.add_remote(blob, e.timeout(timeout_ms)))??;
        if name.is_null() && name_len.is_null() {
            return Ok(());
        }
        // SAFETY: forwarded contract.
        unsafe {
            write_buf(
                peer.as_bytes(),
                true,
                name.cast(),
                cap,
                name_len,
                "the peer's name",
            )
        }
    })
}

/// `hmc_remove_remote`: see `hmc.h`.
///
/// # Safety
/// `remote` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_remove_remote(
    engine: *mut HmcEngine,
    remote: *const c_char,
) -> Status {
    guard("hmc_remove_remote", || {
        let e = engine_arg(engine)?;
        // SAFETY: forwarded contract.
        let remote = unsafe { str_arg(remote, "remote_engine") }?;
        block_on(e.engine.remove_remote(remote))??;
        Ok(())
    })
}
