//! The KV-cache API through C (`hmc_datadist_*`), in LLM-DataDist's model: a cluster's
//! [`DataDist`] with a role over an open engine, linked to other clusters; caches
//! allocated (host) or registered (host or device memory the caller owns), published
//! under request keys and a blocks key; whole caches and blocks pulled and pushed, blocks
//! copied within a cache. Over [`hmc_engine::kv`].

use std::ffi::c_char;
use std::ops::Range;
use std::sync::Arc;

use hmc_core::{AnyCommunicator, DeviceKind};
use hmc_engine::MemType;
use hmc_engine::kv::{BlocksCacheKey, Cache, CacheDesc, CacheKey, DataDist, DataType, Role};

use crate::block_on;
use crate::engine::{HmcEngine, device_memory, engine_arg};
use crate::error::{Error, Result, Status, guard};
use crate::handles::{
    Table, id, need_out, opaque, optional_arg, ptr, same_engine, sized_arg, slice_arg, str_arg,
    write_out,
};

opaque! {
    /// `hmc_datadist`: an opaque KV service handle.
    HmcDataDist;
    /// `hmc_kv_cache`: an opaque cache handle.
    HmcKvCache;
}

/// `hmc_cache_key`: a request's whole cache at a prompt cluster. Fixed layout.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct CacheKeyC {
    /// The cluster that holds the cache.
    pub prompt_cluster_id: u64,
    /// The request.
    pub req_id: u64,
    /// The model.
    pub model_id: u64,
    /// The prefix (0: none).
    pub prefix_id: u64,
}

/// `hmc_blocks_key`: a paged cache's blocks at a cluster. Fixed layout.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct BlocksKeyC {
    /// The cluster that holds the cache.
    pub prompt_cluster_id: u64,
    /// The model.
    pub model_id: u64,
}

/// `hmc_cache_desc`: what a cache is.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CacheDescC {
    /// `sizeof(hmc_cache_desc)`.
    pub struct_size: usize,
    /// `HMC_MEM_HOST` or `HMC_MEM_DEVICE`.
    pub mem_type: u32,
    /// For device memory: `HMC_DEVICE_*`.
    pub device_kind: u32,
    /// For device memory: the ordinal.
    pub device_id: u32,
    /// Tensors in the cache (2 per layer: K and V).
    pub num_tensors: u32,
    /// `HMC_DTYPE_*`.
    pub dtype: u32,
    /// Dimensions of `shape`.
    pub num_dims: u32,
    /// Every tensor's shape; for a blocks cache `shape[0]` is the block count.
    pub shape: *const u64,
}

impl Default for CacheDescC {
    fn default() -> Self {
        CacheDescC {
            struct_size: 0,
            mem_type: 0,
            device_kind: 0,
            device_id: 0,
            num_tensors: 0,
            dtype: 0,
            num_dims: 0,
            shape: std::ptr::null(),
        }
    }
}

/// `hmc_kv_layers`: which layers a blocks transfer covers.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct KvLayersC {
    /// `sizeof(hmc_kv_layers)`.
    pub struct_size: usize,
    /// First layer.
    pub layer_begin: u32,
    /// One past the last layer.
    pub layer_end: u32,
    /// Tensors per layer (2 for K and V).
    pub tensors_per_layer: u32,
}

struct DataDistObj {
    engine: u64,
    dd: DataDist<AnyCommunicator>,
}

struct CacheObj {
    datadist: u64,
    cache: Cache,
}

static DATADISTS: Table<DataDistObj> = Table::new("KV service", 10);
static CACHES: Table<CacheObj> = Table::new("KV cache", 11);

fn datadist_arg(d: *const HmcDataDist) -> Result<Arc<DataDistObj>> {
    let dd = DATADISTS.get(id(d))?;
    // Its engine must still be open.
    engine_arg(ptr::<HmcEngine>(dd.engine))?;
    Ok(dd)
}

fn cache_arg(d: *const HmcDataDist, c: *const HmcKvCache) -> Result<Arc<CacheObj>> {
    let cache = CACHES.get(id(c))?;
    same_engine("KV cache", id(c), cache.datadist, id(d))?;
    Ok(cache)
}

fn dtype_arg(v: u32) -> Result<DataType> {
    Ok(match v {
        0 => DataType::Fp8,
        1 => DataType::F16,
        2 => DataType::Bf16,
        3 => DataType::F32,
        4 => DataType::I8,
        5 => DataType::U8,
        6 => DataType::I32,
        v => {
            return Err(Error::InvalidArgument(format!(
                "unknown dtype {v}; use HMC_DTYPE_FP8 ... HMC_DTYPE_I32"
            )));
        }
    })
}

/// Reads a `hmc_cache_desc`.
///
/// # Safety
/// `d` is NULL or a valid `hmc_cache_desc` whose `shape` holds `num_dims` values.
unsafe fn desc_arg(d: *const CacheDescC) -> Result<CacheDesc> {
    // SAFETY: forwarded contract.
    let d = unsafe { sized_arg(d, "hmc_cache_desc", size_of::<CacheDescC>()) }?;
    // SAFETY: forwarded contract; the count is bounded first.
    let shape = unsafe { slice_arg(d.shape, d.num_dims as usize, 16, "shape", "dimensions") }?;
    if shape.is_empty() || d.num_tensors == 0 {
        return Err(Error::InvalidArgument(
            "a cache needs at least one tensor and one dimension".into(),
        ));
    }
    let placement = match (d.mem_type, d.device_kind) {
        (0, 0) => MemType::Host,
        (1, k @ 1..=5) => MemType::Device {
            kind: [
                DeviceKind::CUDA,
                DeviceKind::ROCM,
                DeviceKind::MLU,
                DeviceKind::MUSA,
                DeviceKind::ASCEND,
            ][k as usize - 1],
            ordinal: d.device_id,
        },
        (t, k) => {
            return Err(Error::InvalidArgument(format!(
                "mem_type {t} with device_kind {k}; use HMC_MEM_HOST with 0, or HMC_MEM_DEVICE with HMC_DEVICE_*"
            )));
        }
    };
    Ok(CacheDesc {
        placement,
        num_tensors: d.num_tensors,
        dtype: dtype_arg(d.dtype)?,
        shape: shape.to_vec(),
    })
}

/// Reads the keys of a cache.
///
/// # Safety
/// `keys` holds `n` keys; `blocks` is NULL or a key.
unsafe fn keys_arg(
    keys: *const CacheKeyC,
    n: usize,
    blocks: *const BlocksKeyC,
) -> Result<(Vec<CacheKey>, Option<BlocksCacheKey>)> {
    // SAFETY: forwarded contract; bounded first.
    let keys = unsafe { slice_arg(keys, n, 1 << 16, "keys", "keys") }?
        .iter()
        .map(|k| CacheKey {
            prompt_cluster_id: k.prompt_cluster_id,
            req_id: k.req_id,
            model_id: k.model_id,
            prefix_id: k.prefix_id,
        })
        .collect();
    // SAFETY: forwarded contract.
    let blocks = unsafe { blocks.as_ref() }.map(blocks_key);
    Ok((keys, blocks))
}

fn blocks_key(k: &BlocksKeyC) -> BlocksCacheKey {
    BlocksCacheKey {
        prompt_cluster_id: k.prompt_cluster_id,
        model_id: k.model_id,
    }
}

fn cache_key(k: &CacheKeyC) -> CacheKey {
    CacheKey {
        prompt_cluster_id: k.prompt_cluster_id,
        req_id: k.req_id,
        model_id: k.model_id,
        prefix_id: k.prefix_id,
    }
}

/// `hmc_datadist_new`: see `hmc.h`.
///
/// # Safety
/// `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_datadist_new(
    engine: *mut HmcEngine,
    cluster_id: u64,
    role: u32,
    out: *mut *mut HmcDataDist,
) -> Status {
    guard("hmc_datadist_new", || {
        need_out(out, "out")?;
        let e = engine_arg(engine)?;
        let role = match role {
            0 => Role::Prompt,
            1 => Role::Decoder,
            r => {
                return Err(Error::InvalidArgument(format!(
                    "unknown role {r}; use HMC_ROLE_PROMPT or HMC_ROLE_DECODER"
                )));
            }
        };
        let d = DATADISTS.insert(DataDistObj {
            engine: id(engine),
            dd: DataDist::new(e.engine.clone(), cluster_id, role),
        });
        // SAFETY: checked writable above.
        unsafe { write_out(out, "out", ptr(d)) }
    })
}

/// `hmc_datadist_close`: see `hmc.h`.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_datadist_close(datadist: *mut HmcDataDist) -> Status {
    guard("hmc_datadist_close", || {
        let d = DATADISTS.remove(id(datadist))?;
        let me = id(datadist);
        for c in CACHES.remove_where(|c| c.datadist == me) {
            if let Ok(c) = Arc::try_unwrap(c) {
                // The engine may be closed already; then its registrations are gone too.
                let _ = block_on(d.dd.deallocate_cache(c.cache));
            }
        }
        Ok(())
    })
}

/// `hmc_datadist_link`: see `hmc.h`.
///
/// # Safety
/// `remote_engine` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_datadist_link(
    datadist: *mut HmcDataDist,
    cluster_id: u64,
    remote_engine: *const c_char,
    timeout_ms: u32,
) -> Status {
    guard("hmc_datadist_link", || {
        let d = datadist_arg(datadist)?;
        let e = engine_arg(ptr::<HmcEngine>(d.engine))?;
        // SAFETY: forwarded contract.
        let remote = unsafe { str_arg(remote_engine, "remote_engine") }?.to_string();
        let links = [(cluster_id, remote)];
        let mut r = block_on(d.dd.link_clusters(&links, e.timeout(timeout_ms)))?;
        r.pop().unwrap_or(Ok(())).map_err(Error::from)
    })
}

/// `hmc_datadist_unlink`: see `hmc.h`.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_datadist_unlink(datadist: *mut HmcDataDist, cluster_id: u64) -> Status {
    guard("hmc_datadist_unlink", || {
        let d = datadist_arg(datadist)?;
        let mut r = block_on(d.dd.unlink_clusters(&[cluster_id]))?;
        r.pop().unwrap_or(Ok(())).map_err(Error::from)
    })
}

fn add_cache(datadist: *mut HmcDataDist, cache: Cache, out: *mut *mut HmcKvCache) -> Result<()> {
    let c = CACHES.insert(CacheObj {
        datadist: id(datadist),
        cache,
    });
    // SAFETY: the callers checked `out` writable before the work.
    unsafe { write_out(out, "out", ptr(c)) }
}

/// `hmc_datadist_allocate_cache`: see `hmc.h`.
///
/// # Safety
/// `desc` is a valid `hmc_cache_desc`; `keys` holds `num_keys` keys; `blocks_key` is NULL
/// or a key; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_datadist_allocate_cache(
    datadist: *mut HmcDataDist,
    desc: *const CacheDescC,
    keys: *const CacheKeyC,
    num_keys: usize,
    blocks_key: *const BlocksKeyC,
    out: *mut *mut HmcKvCache,
) -> Status {
    guard("hmc_datadist_allocate_cache", || {
        need_out(out, "out")?;
        let d = datadist_arg(datadist)?;
        // SAFETY: forwarded contract.
        let desc = unsafe { desc_arg(desc) }?;
        // SAFETY: forwarded contract.
        let (keys, blocks) = unsafe { keys_arg(keys, num_keys, blocks_key) }?;
        let cache = block_on(d.dd.allocate_cache(desc, &keys, blocks))??;
        add_cache(datadist, cache, out)
    })
}

/// `hmc_datadist_register_cache`: see `hmc.h`.
///
/// # Safety
/// As `hmc_datadist_allocate_cache`; `tensor_addrs` holds `num_tensors` addresses of
/// memory that stays allocated until the cache is deallocated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_datadist_register_cache(
    datadist: *mut HmcDataDist,
    desc: *const CacheDescC,
    tensor_addrs: *const u64,
    keys: *const CacheKeyC,
    num_keys: usize,
    blocks_key: *const BlocksKeyC,
    out: *mut *mut HmcKvCache,
) -> Status {
    guard("hmc_datadist_register_cache", || {
        need_out(out, "out")?;
        let d = datadist_arg(datadist)?;
        // SAFETY: forwarded contract.
        let desc = unsafe { desc_arg(desc) }?;
        let n = desc.num_tensors as usize;
        // SAFETY: forwarded contract; bounded first.
        let addrs = unsafe { slice_arg(tensor_addrs, n, 1 << 20, "tensor_addrs", "tensors") }?;
        // SAFETY: forwarded contract.
        let (keys, blocks) = unsafe { keys_arg(keys, num_keys, blocks_key) }?;
        let addrs = addrs.to_vec();
        // Device caches are registered with their device's backend, so that over a
        // transport that stages device memory (TCP) peers reach them too.
        let cache = match desc.placement {
            MemType::Device { kind, ordinal } => {
                let memory = device_memory(kind, ordinal)?;
                // SAFETY: the caller keeps the tensors allocated until the cache is
                // deallocated.
                let fut = unsafe {
                    d.dd.register_device_kv_cache(desc, addrs, &keys, blocks, memory)
                };
                block_on(fut)??
            }
            MemType::Host => {
                // SAFETY: as above.
                let fut = unsafe { d.dd.register_kv_cache(desc, addrs, &keys, blocks) };
                block_on(fut)??
            }
        };
        add_cache(datadist, cache, out)
    })
}

/// `hmc_kv_cache_tensor_addrs`: see `hmc.h`.
///
/// # Safety
/// `addrs` is NULL or writable for `cap` values; `count` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_kv_cache_tensor_addrs(
    datadist: *const HmcDataDist,
    cache: *const HmcKvCache,
    addrs: *mut u64,
    cap: usize,
    count: *mut usize,
) -> Status {
    guard("hmc_kv_cache_tensor_addrs", || {
        need_out(count, "count")?;
        let c = cache_arg(datadist, cache)?;
        let a = c.cache.tensor_addrs();
        // SAFETY: checked writable above.
        unsafe { write_out(count, "count", a.len()) }?;
        if addrs.is_null() || cap < a.len() {
            return Err(Error::BufferTooSmall {
                what: "the tensor addresses",
                need: a.len() * 8,
                cap: cap * 8,
            });
        }
        // SAFETY: `addrs` is writable for `cap >= a.len()` values by the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(a.as_ptr(), addrs, a.len()) };
        Ok(())
    })
}

/// `hmc_datadist_deallocate_cache`: see `hmc.h`.
#[unsafe(no_mangle)]
pub extern "C" fn hmc_datadist_deallocate_cache(
    datadist: *mut HmcDataDist,
    cache: *mut HmcKvCache,
) -> Status {
    guard("hmc_datadist_deallocate_cache", || {
        let d = datadist_arg(datadist)?;
        cache_arg(datadist, cache)?;
        let c = CACHES.remove(id(cache))?;
        let c = Arc::try_unwrap(c).map_err(|_| {
            Error::State("the cache is in use by a transfer on another thread; retry".into())
        })?;
        block_on(d.dd.deallocate_cache(c.cache))??;
        Ok(())
    })
}

/// `hmc_datadist_pull_cache`: see `hmc.h`.
///
/// # Safety
/// `src` is a valid key.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_datadist_pull_cache(
    datadist: *mut HmcDataDist,
    src: *const CacheKeyC,
    dst: *mut HmcKvCache,
    timeout_ms: u32,
) -> Status {
    guard("hmc_datadist_pull_cache", || {
        let (d, c, t) = transfer_args(datadist, dst, timeout_ms)?;
        // SAFETY: forwarded contract.
        let src = unsafe { src.as_ref() }.ok_or(Error::Null("src"))?;
        block_on(d.dd.pull_kv_cache(&cache_key(src), &c.cache, t))??;
        Ok(())
    })
}

/// `hmc_datadist_push_cache`: see `hmc.h`.
///
/// # Safety
/// `dst` is a valid key.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_datadist_push_cache(
    datadist: *mut HmcDataDist,
    src: *mut HmcKvCache,
    dst_cluster: u64,
    dst: *const CacheKeyC,
    timeout_ms: u32,
) -> Status {
    guard("hmc_datadist_push_cache", || {
        let (d, c, t) = transfer_args(datadist, src, timeout_ms)?;
        // SAFETY: forwarded contract.
        let dst = unsafe { dst.as_ref() }.ok_or(Error::Null("dst"))?;
        block_on(d.dd.push_kv_cache(&c.cache, dst_cluster, &cache_key(dst), t))??;
        Ok(())
    })
}

type TransferArgs = (Arc<DataDistObj>, Arc<CacheObj>, std::time::Duration);

/// The service, a cache of it and the timeout of a transfer.
fn transfer_args(
    datadist: *mut HmcDataDist,
    cache: *mut HmcKvCache,
    timeout_ms: u32,
) -> Result<TransferArgs> {
    let d = datadist_arg(datadist)?;
    let c = cache_arg(datadist, cache)?;
    let t = engine_arg(ptr::<HmcEngine>(d.engine))?.timeout(timeout_ms);
    Ok((d, c, t))
}

/// A blocks transfer's source blocks, destination blocks, layers and tensors per layer.
type BlocksArgs = (Vec<u64>, Vec<u64>, Option<Range<u32>>, u32);

/// The block lists and layers of a blocks transfer.
///
/// # Safety
/// `src` and `dst` hold `n` values each; `layers` is NULL or a valid `hmc_kv_layers`.
unsafe fn blocks_args(
    src: *const u64,
    dst: *const u64,
    n: usize,
    layers: *const KvLayersC,
) -> Result<BlocksArgs> {
    // SAFETY: forwarded contract; bounded first.
    let (s, d) = unsafe {
        (
            slice_arg(src, n, 1 << 24, "src_blocks", "blocks")?,
            slice_arg(dst, n, 1 << 24, "dst_blocks", "blocks")?,
        )
    };
    // SAFETY: forwarded contract.
    let l = unsafe { optional_arg(layers, "hmc_kv_layers") }?;
    let range = (!layers.is_null()).then_some(l.layer_begin..l.layer_end);
    Ok((s.to_vec(), d.to_vec(), range, l.tensors_per_layer.max(1)))
}

/// A blocks transfer's arguments, read: the service, the local cache, the key of the
/// peer's blocks cache, the block lists, the layers and the timeout.
struct BlocksTransfer {
    d: Arc<DataDistObj>,
    cache: Arc<CacheObj>,
    key: BlocksCacheKey,
    blocks: BlocksArgs,
    timeout: std::time::Duration,
}

/// Reads a blocks transfer's arguments.
///
/// # Safety
/// `key` is NULL or a valid key; `src_blocks` and `dst_blocks` hold `n` values each;
/// `layers` is NULL or a valid `hmc_kv_layers`.
#[allow(clippy::too_many_arguments)]
unsafe fn blocks_transfer(
    datadist: *mut HmcDataDist,
    cache: *mut HmcKvCache,
    key: *const BlocksKeyC,
    key_name: &'static str,
    src_blocks: *const u64,
    dst_blocks: *const u64,
    n: usize,
    layers: *const KvLayersC,
    timeout_ms: u32,
) -> Result<BlocksTransfer> {
    let (d, cache, timeout) = transfer_args(datadist, cache, timeout_ms)?;
    // SAFETY: forwarded contract.
    let key = blocks_key(unsafe { key.as_ref() }.ok_or(Error::Null(key_name))?);
    // SAFETY: forwarded contract.
    let blocks = unsafe { blocks_args(src_blocks, dst_blocks, n, layers) }?;
    Ok(BlocksTransfer {
        d,
        cache,
        key,
        blocks,
        timeout,
    })
}

/// `hmc_datadist_pull_blocks`: see `hmc.h`.
///
/// # Safety
/// `src` is a valid key; `src_blocks` and `dst_blocks` hold `num_blocks` values each;
/// `layers` is NULL or a valid `hmc_kv_layers`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_datadist_pull_blocks(
    datadist: *mut HmcDataDist,
    src: *const BlocksKeyC,
    dst: *mut HmcKvCache,
    src_blocks: *const u64,
    dst_blocks: *const u64,
    num_blocks: usize,
    layers: *const KvLayersC,
    timeout_ms: u32,
) -> Status {
    guard("hmc_datadist_pull_blocks", || {
        // SAFETY: forwarded contract.
        let t = unsafe {
            blocks_transfer(
                datadist, dst, src, "src", src_blocks, dst_blocks, num_blocks, layers, timeout_ms,
            )
        }?;
        let (s, b, range, tpl) = t.blocks;
        block_on(
            t.d.dd
                .pull_kv_blocks(&t.key, &t.cache.cache, &s, &b, range, tpl, t.timeout),
        )??;
        Ok(())
    })
}

/// `hmc_datadist_push_blocks`: see `hmc.h`.
///
/// # Safety
/// `dst` is a valid key; `src_blocks` and `dst_blocks` hold `num_blocks` values each;
/// `layers` is NULL or a valid `hmc_kv_layers`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_datadist_push_blocks(
    datadist: *mut HmcDataDist,
    src: *mut HmcKvCache,
    dst_cluster: u64,
    dst: *const BlocksKeyC,
    src_blocks: *const u64,
    dst_blocks: *const u64,
    num_blocks: usize,
    layers: *const KvLayersC,
    timeout_ms: u32,
) -> Status {
    guard("hmc_datadist_push_blocks", || {
        // SAFETY: forwarded contract.
        let t = unsafe {
            blocks_transfer(
                datadist, src, dst, "dst", src_blocks, dst_blocks, num_blocks, layers, timeout_ms,
            )
        }?;
        let (s, b, range, tpl) = t.blocks;
        let (cache, key) = (&t.cache.cache, &t.key);
        block_on(
            t.d.dd
                .push_kv_blocks(cache, dst_cluster, key, &s, &b, range, tpl, t.timeout),
        )??;
        Ok(())
    })
}

/// `hmc_datadist_copy_blocks`: see `hmc.h`.
///
/// # Safety
/// `src_blocks` and `dst_blocks` hold `num_blocks` values each.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hmc_datadist_copy_blocks(
    datadist: *mut HmcDataDist,
    cache: *mut HmcKvCache,
    src_blocks: *const u64,
    dst_blocks: *const u64,
    num_blocks: usize,
) -> Status {
    guard("hmc_datadist_copy_blocks", || {
        let d = datadist_arg(datadist)?;
        let c = cache_arg(datadist, cache)?;
        // SAFETY: forwarded contract.
        let (s, b, _, _) =
            unsafe { blocks_args(src_blocks, dst_blocks, num_blocks, std::ptr::null()) }?;
        d.dd.copy_kv_blocks(&c.cache, &s, &b)?;
        Ok(())
    })
}
