//! KV-cache transfer for prefill/decode disaggregation, in the model of LLM-DataDist: a
//! [`DataDist`] per cluster with a role, caches described by [`CacheDesc`] and found by
//! [`CacheKey`] (a request's whole cache) or [`BlocksCacheKey`] (a paged cache's blocks),
//! pulled or pushed over an [`Engine`].
//!
//! A cache is `num_tensors` tensors of one `shape` and `dtype`, each at its own address
//! (for a model of L layers, usually 2L: K and V per layer). For a paged (blocks) cache the
//! first dimension is the block count, so a block of a tensor is
//! `shape[1..].product() * dtype.size()` bytes. A cache made with a key is published in the
//! engine's directory (layout and tensor addresses); the other side looks it up, checks
//! that both layouts match (an error names both sides' values before any byte moves),
//! and moves the bytes one-sided: runs of consecutive blocks on both sides become one
//! descriptor.

use std::collections::HashMap;
use std::ops::Range;
use std::time::Duration;

use hmc_core::Communicator;
use hmc_rpc::RpcCodec;
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};

use crate::engine::{Engine, MemDesc, MemHandle, MemType, TransferOp, TransferOpDesc};
use crate::error::{EngineError, Result};

/// A cluster's role in disaggregated serving.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Runs prefill and produces KV caches.
    Prompt,
    /// Runs decode and consumes them.
    Decoder,
}

/// Element type of a cache's tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DataType {
    /// 8-bit float (either FP8 format: only the size matters here).
    Fp8,
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// IEEE single.
    F32,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
}

impl DataType {
    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            DataType::Fp8 | DataType::I8 | DataType::U8 => 1,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::F32 | DataType::I32 => 4,
        }
    }
}

/// What a cache is: where it lives, how many tensors, of which type and shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheDesc {
    /// Host or device memory.
    pub placement: MemType,
    /// Tensors in the cache (2 per layer for K and V).
    pub num_tensors: u32,
    /// Element type.
    pub dtype: DataType,
    /// Shape of every tensor; for a blocks cache, `shape[0]` is the block count.
    pub shape: Vec<u64>,
}

impl CacheDesc {
    fn layout(&self) -> Layout {
        Layout {
            num_tensors: self.num_tensors,
            dtype: self.dtype,
            shape: self.shape.clone(),
        }
    }
}

/// The part of a [`CacheDesc`] both sides must agree on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Layout {
    num_tensors: u32,
    dtype: DataType,
    shape: Vec<u64>,
}

impl Layout {
    fn tensor_bytes(&self) -> Result<u64> {
        self.shape
            .iter()
            .try_fold(self.dtype.size(), |a, &d| a.checked_mul(d))
            .filter(|&b| b > 0)
            .ok_or_else(|| {
                EngineError::InvalidArgument(format!(
                    "shape {:?} of {:?} is empty or too large",
                    self.shape, self.dtype
                ))
            })
    }

    fn num_blocks(&self) -> u64 {
        self.shape.first().copied().unwrap_or(0)
    }

    fn block_bytes(&self) -> Result<u64> {
        Ok(self.tensor_bytes()? / self.num_blocks().max(1))
    }

    /// Both sides' values, for a layout error.
    fn check_same(&self, remote: &Layout, what: &str) -> Result<()> {
        let mut diffs = Vec::new();
        if self.dtype != remote.dtype {
            diffs.push(format!(
                "dtype local {:?}, remote {:?}",
                self.dtype, remote.dtype
            ));
        }
        if self.num_tensors != remote.num_tensors {
            diffs.push(format!(
                "tensor count local {}, remote {}",
                self.num_tensors, remote.num_tensors
            ));
        }
        let (ls, rs) = match what {
            // Blocks caches may differ in block count; the block's shape must match.
            "blocks" => (
                &self.shape[1.min(self.shape.len())..],
                &remote.shape[1.min(remote.shape.len())..],
            ),
            _ => (&self.shape[..], &remote.shape[..]),
        };
        if ls != rs {
            diffs.push(format!(
                "{} shape local {:?}, remote {:?}",
                if what == "blocks" { "block" } else { "tensor" },
                ls,
                rs
            ));
        }
        if diffs.is_empty() {
            Ok(())
        } else {
            Err(EngineError::Layout(diffs.join("; ")))
        }
    }
}

/// A request's whole cache at a prompt cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// The cluster that holds the cache.
    pub prompt_cluster_id: u64,
    /// The request.
    pub req_id: u64,
    /// The model.
    pub model_id: u64,
    /// The prefix (0 for none).
    pub prefix_id: u64,
}

/// A paged cache's blocks at a cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlocksCacheKey {
    /// The cluster that holds the cache.
    pub prompt_cluster_id: u64,
    /// The model.
    pub model_id: u64,
}

impl CacheKey {
    fn name(&self) -> String {
        format!(
            "kv/cache/{}/{}/{}",
            self.req_id, self.model_id, self.prefix_id
        )
    }
}

impl BlocksCacheKey {
    fn name(&self) -> String {
        format!("kv/blocks/{}", self.model_id)
    }
}

/// What a peer publishes for a key.
#[derive(Debug, Serialize, Deserialize)]
struct Published {
    layout: Layout,
    tensor_addrs: Vec<u64>,
}

/// A cache registered with a [`DataDist`]; give it back with [`DataDist::deallocate_cache`].
#[derive(Debug)]
pub struct Cache {
    id: u64,
    desc: CacheDesc,
    tensor_addrs: Vec<u64>,
}

impl Cache {
    /// The cache's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Its description.
    pub fn desc(&self) -> &CacheDesc {
        &self.desc
    }

    /// Where each tensor starts.
    pub fn tensor_addrs(&self) -> &[u64] {
        &self.tensor_addrs
    }
}

/// What a [`DataDist`] keeps per cache.
struct Record {
    handles: Vec<MemHandle>,
    names: Vec<String>,
}

/// One cluster's KV-cache service over an [`Engine`].
pub struct DataDist<C: Communicator> {
    engine: Engine<C>,
    cluster_id: u64,
    role: Role,
    links: RwLock<HashMap<u64, String>>,
    caches: Mutex<HashMap<u64, Record>>,
    next_id: Mutex<u64>,
}

/// A cache still registered when its `DataDist` goes (no `deallocate_cache`): the engine,
/// which may outlive the `DataDist` (it is cheap to clone), keeps its registrations, so
/// peers may still read and write the cache's memory; memory `allocate_cache` made is the
/// engine's and is freed only when the engine goes. Said in a warning that says how to
/// avoid it.
impl<C: Communicator> Drop for DataDist<C> {
    fn drop(&mut self) {
        let caches = std::mem::take(&mut *self.caches.lock());
        if !caches.is_empty() {
            tracing::warn!(
                caches = caches.len(),
                "a DataDist was dropped with caches still registered: they stay registered with its engine (peers may still reach them) until the engine goes; deallocate_cache each cache first"
            );
        }
    }
}

/// Runs of consecutive block pairs: `(src_start, dst_start, count)`.
pub(crate) fn block_runs(src: &[u64], dst: &[u64]) -> Vec<(u64, u64, u64)> {
    let mut runs: Vec<(u64, u64, u64)> = Vec::new();
    for (&s, &d) in src.iter().zip(dst) {
        if let Some(r) = runs.last_mut()
            && r.0 + r.2 == s
            && r.1 + r.2 == d
        {
            r.2 += 1;
        } else {
            runs.push((s, d, 1));
        }
    }
    runs
}

impl<C: Communicator> DataDist<C> {
    /// A KV service for cluster `cluster_id` in `role`, over `engine`.
    pub fn new(engine: Engine<C>, cluster_id: u64, role: Role) -> Self {
        DataDist {
            engine,
            cluster_id,
            role,
            links: RwLock::new(HashMap::new()),
            caches: Mutex::new(HashMap::new()),
            next_id: Mutex::new(1),
        }
    }

    /// The engine underneath.
    pub fn engine(&self) -> &Engine<C> {
        &self.engine
    }

    /// This cluster's id.
    pub fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    /// This cluster's role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Links to other clusters, each `(cluster_id, engine name)`; one result per cluster,
    /// in order (a failed link does not undo the others).
    pub async fn link_clusters(
        &self,
        clusters: &[(u64, String)],
        timeout: Duration,
    ) -> Vec<Result<()>> {
        let mut out = Vec::with_capacity(clusters.len());
        for (id, name) in clusters {
            let r = self.engine.connect(name, timeout).await;
            if r.is_ok() {
                self.links.write().insert(*id, name.clone());
            }
            out.push(r);
        }
        out
    }

    /// Unlinks clusters; one result per cluster.
    pub async fn unlink_clusters(&self, ids: &[u64]) -> Vec<Result<()>> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let name = self.links.write().remove(id);
            out.push(match name {
                Some(n) => self.engine.disconnect(&n).await,
                None => Err(EngineError::NotConnected(format!("cluster {id}"))),
            });
        }
        out
    }

    fn engine_of(&self, cluster: u64) -> Result<String> {
        self.links.read().get(&cluster).cloned().ok_or_else(|| {
            EngineError::NotConnected(format!("cluster {cluster} (link_clusters first)"))
        })
    }

    fn next_id(&self) -> u64 {
        let mut n = self.next_id.lock();
        *n += 1;
        *n - 1
    }

    /// Allocates a host cache of `desc`, registers it, and publishes it under `keys` (a
    /// request's cache) and `blocks_key` (a paged cache). Device caches are allocated by
    /// the framework that owns the device and registered with
    /// [`DataDist::register_kv_cache`].
    pub async fn allocate_cache(
        &self,
        desc: CacheDesc,
        keys: &[CacheKey],
        blocks_key: Option<BlocksCacheKey>,
    ) -> Result<Cache> {
        if desc.placement != MemType::Host {
            return Err(EngineError::InvalidArgument(
                "allocate_cache makes host caches; allocate device memory with its framework and register_kv_cache it".into(),
            ));
        }
        let bytes = desc.layout().tensor_bytes()?;
        self.check_keys(keys)?;
        let bytes = usize::try_from(bytes).map_err(|_| {
            EngineError::InvalidArgument(format!(
                "a tensor of {bytes} bytes does not fit this host"
            ))
        })?;
        // Engine-owned memory (shared memory under `shm` and `auto`, so that a peer on this
        // host copies blocks with memcpy): freed when deregistered, or with the engine.
        let mut handles = Vec::with_capacity(desc.num_tensors as usize);
        let mut addrs = Vec::with_capacity(desc.num_tensors as usize);
        for _ in 0..desc.num_tensors {
            match self.engine.alloc_mem(bytes, hmc_core::Access::READ_WRITE) {
                Ok((h, mem)) => {
                    handles.push(h);
                    addrs.push(mem.addr);
                }
                Err(e) => {
                    self.deregister_all(handles).await;
                    return Err(e);
                }
            }
        }
        self.publish_cache(desc, addrs, keys, blocks_key, handles)
            .await
    }

    /// Registers a cache in memory the caller owns (one address per tensor) and publishes
    /// it under `keys` and `blocks_key`.
    ///
    /// # Safety
    /// Each tensor (`desc.shape` of `desc.dtype` at its address, in `desc.placement`) must
    /// stay allocated until [`DataDist::deallocate_cache`] has returned; peers may read and
    /// write it until then.
    pub async unsafe fn register_kv_cache(
        &self,
        desc: CacheDesc,
        tensor_addrs: Vec<u64>,
        keys: &[CacheKey],
        blocks_key: Option<BlocksCacheKey>,
    ) -> Result<Cache> {
        // SAFETY: forwarded contract.
        unsafe {
            self.register(desc, tensor_addrs, keys, blocks_key, None)
                .await
        }
    }

    /// Registers a cache in device memory of `memory`'s device (one address per tensor)
    /// with [`Engine::register_device_mem`]'s rule, so that over a transport that stages
    /// device memory (TCP) peers pull and push it as they do host caches, and publishes it
    /// under `keys` and `blocks_key`. `desc.placement` must name `memory`'s device.
    ///
    /// # Safety
    /// As for [`DataDist::register_kv_cache`].
    pub async unsafe fn register_device_kv_cache(
        &self,
        desc: CacheDesc,
        tensor_addrs: Vec<u64>,
        keys: &[CacheKey],
        blocks_key: Option<BlocksCacheKey>,
        memory: hmc_core::AnyMemory,
    ) -> Result<Cache> {
        let device = hmc_core::Memory::device(&memory);
        let want = MemType::Device {
            kind: device.kind,
            ordinal: device.ordinal,
        };
        if desc.placement != want {
            return Err(EngineError::InvalidArgument(format!(
                "the CacheDesc places the cache on {:?} but the memory backend is {device}; give the backend of the cache's device",
                desc.placement
            )));
        }
        // SAFETY: forwarded contract.
        unsafe {
            self.register(desc, tensor_addrs, keys, blocks_key, Some(memory))
                .await
        }
    }

    async unsafe fn register(
        &self,
        desc: CacheDesc,
        tensor_addrs: Vec<u64>,
        keys: &[CacheKey],
        blocks_key: Option<BlocksCacheKey>,
        memory: Option<hmc_core::AnyMemory>,
    ) -> Result<Cache> {
        let bytes = desc.layout().tensor_bytes()?;
        if tensor_addrs.len() != desc.num_tensors as usize {
            return Err(EngineError::InvalidArgument(format!(
                "{} tensor addresses for a cache of {} tensors",
                tensor_addrs.len(),
                desc.num_tensors
            )));
        }
        self.check_keys(keys)?;
        let mut handles = Vec::with_capacity(tensor_addrs.len());
        for &addr in &tensor_addrs {
            // SAFETY: the caller keeps the tensor alive until `deallocate_cache`, which
            // deregisters first.
            let mem = MemDesc {
                addr,
                len: bytes as usize,
            };
            let h = unsafe {
                match &memory {
                    Some(m) => self.engine.register_device_mem(mem, m.clone()),
                    None => {
                        self.engine
                            .register_mem(mem, desc.placement, hmc_core::Access::READ_WRITE)
                    }
                }
            };
            match h {
                Ok(h) => handles.push(h),
                Err(e) => {
                    // Leave nothing half-registered.
                    self.deregister_all(handles).await;
                    return Err(e);
                }
            }
        }
        self.publish_cache(desc, tensor_addrs, keys, blocks_key, handles)
            .await
    }

    /// Refuses keys of another cluster.
    fn check_keys(&self, keys: &[CacheKey]) -> Result<()> {
        for k in keys {
            if k.prompt_cluster_id != self.cluster_id {
                return Err(EngineError::InvalidArgument(format!(
                    "key {k:?} names cluster {}, but this is cluster {}",
                    k.prompt_cluster_id, self.cluster_id
                )));
            }
        }
        Ok(())
    }

    /// Deregisters `handles`, for a cache that could not be made whole.
    async fn deregister_all(&self, handles: Vec<MemHandle>) {
        for h in handles {
            let _ = self.engine.deregister_mem(h).await;
        }
    }

    /// Publishes a cache whose tensors (at `tensor_addrs`) are registered as `handles`
    /// under `keys` and `blocks_key`, and records it; on failure deregisters `handles`.
    async fn publish_cache(
        &self,
        desc: CacheDesc,
        tensor_addrs: Vec<u64>,
        keys: &[CacheKey],
        blocks_key: Option<BlocksCacheKey>,
        handles: Vec<MemHandle>,
    ) -> Result<Cache> {
        let layout = desc.layout();
        let published = RpcCodec::encode(&Published {
            layout,
            tensor_addrs: tensor_addrs.clone(),
        })
        .map_err(|e| EngineError::InvalidArgument(e.to_string()))?;
        let mut names: Vec<String> = keys.iter().map(CacheKey::name).collect();
        names.extend(blocks_key.map(|k| k.name()));
        for (i, n) in names.iter().enumerate() {
            if let Err(e) = self.engine.publish(n, published.to_vec()) {
                for done in &names[..i] {
                    self.engine.unpublish(done);
                }
                self.deregister_all(handles).await;
                return Err(e);
            }
        }
        let id = self.next_id();
        self.caches.lock().insert(id, Record { handles, names });
        Ok(Cache {
            id,
            desc,
            tensor_addrs,
        })
    }

    /// Unpublishes and deregisters a cache (waiting for transfers still using it), then
    /// frees it if this DataDist allocated it.
    pub async fn deallocate_cache(&self, cache: Cache) -> Result<()> {
        let rec = self.caches.lock().remove(&cache.id).ok_or_else(|| {
            EngineError::InvalidArgument(format!("cache {} is not registered here", cache.id))
        })?;
        for n in &rec.names {
            self.engine.unpublish(n);
        }
        for h in rec.handles {
            self.engine.deregister_mem(h).await?;
        }
        Ok(())
    }

    async fn remote_cache(&self, engine: &str, name: &str, timeout: Duration) -> Result<Published> {
        let bytes = self
            .engine
            .lookup(engine, name, timeout)
            .await?
            .ok_or_else(|| EngineError::UnknownKey {
                key: name.to_string(),
                peer: engine.to_string(),
            })?;
        let p: Published = RpcCodec::decode(&bytes).map_err(|e| EngineError::Metadata {
            peer: engine.to_string(),
            why: format!("published cache `{name}` does not decode: {e}"),
        })?;
        if p.tensor_addrs.len() != p.layout.num_tensors as usize {
            return Err(EngineError::Metadata {
                peer: engine.to_string(),
                why: format!(
                    "published cache `{name}` has {} addresses for {} tensors",
                    p.tensor_addrs.len(),
                    p.layout.num_tensors
                ),
            });
        }
        Ok(p)
    }

    /// Pulls the whole cache `src` (at its prompt cluster) into `dst`.
    pub async fn pull_kv_cache(
        &self,
        src: &CacheKey,
        dst: &Cache,
        timeout: Duration,
    ) -> Result<()> {
        let engine = self.engine_of(src.prompt_cluster_id)?;
        let remote = self.remote_cache(&engine, &src.name(), timeout).await?;
        let local = dst.desc.layout();
        local.check_same(&remote.layout, "cache")?;
        let bytes = local.tensor_bytes()? as usize;
        let descs: Vec<TransferOpDesc> = dst
            .tensor_addrs
            .iter()
            .zip(&remote.tensor_addrs)
            .map(|(&l, &r)| TransferOpDesc {
                local_addr: l,
                remote_addr: r,
                len: bytes,
            })
            .collect();
        self.engine
            .transfer(&engine, TransferOp::Read, &descs, timeout)
            .await
    }

    /// Pushes the whole cache `src` into the cache published under `dst` at cluster
    /// `dst_cluster`.
    pub async fn push_kv_cache(
        &self,
        src: &Cache,
        dst_cluster: u64,
        dst: &CacheKey,
        timeout: Duration,
    ) -> Result<()> {
        let engine = self.engine_of(dst_cluster)?;
        let remote = self.remote_cache(&engine, &dst.name(), timeout).await?;
        let local = src.desc.layout();
        local.check_same(&remote.layout, "cache")?;
        let bytes = local.tensor_bytes()? as usize;
        let descs: Vec<TransferOpDesc> = src
            .tensor_addrs
            .iter()
            .zip(&remote.tensor_addrs)
            .map(|(&l, &r)| TransferOpDesc {
                local_addr: l,
                remote_addr: r,
                len: bytes,
            })
            .collect();
        self.engine
            .transfer(&engine, TransferOp::Write, &descs, timeout)
            .await
    }

    /// Descriptors moving `src_blocks` of one side's tensors to `dst_blocks` of the
    /// other's, for the tensors of `layers` (`tensors_per_layer` each; all when `None`).
    /// `local_is_src`: whether the local cache holds the source blocks.
    #[allow(clippy::too_many_arguments)]
    fn block_descs(
        local: &Cache,
        remote: &Published,
        local_is_src: bool,
        src_blocks: &[u64],
        dst_blocks: &[u64],
        layers: Option<Range<u32>>,
        tensors_per_layer: u32,
    ) -> Result<Vec<TransferOpDesc>> {
        let ll = local.desc.layout();
        ll.check_same(&remote.layout, "blocks")?;
        if src_blocks.len() != dst_blocks.len() {
            return Err(EngineError::Layout(format!(
                "{} source blocks for {} destination blocks",
                src_blocks.len(),
                dst_blocks.len()
            )));
        }
        let (src_n, dst_n) = if local_is_src {
            (ll.num_blocks(), remote.layout.num_blocks())
        } else {
            (remote.layout.num_blocks(), ll.num_blocks())
        };
        let side = |src: bool| {
            if src == local_is_src {
                "local"
            } else {
                "remote"
            }
        };
        for (ids, n, src) in [(src_blocks, src_n, true), (dst_blocks, dst_n, false)] {
            if let Some(&bad) = ids.iter().find(|&&b| b >= n) {
                return Err(EngineError::Layout(format!(
                    "{} block id {bad} is out of range: the {} cache has {n} blocks",
                    if src { "source" } else { "destination" },
                    side(src)
                )));
            }
        }
        let tpl = tensors_per_layer.max(1);
        let tensors = match layers {
            None => 0..ll.num_tensors,
            Some(r) => {
                let t = r.start * tpl..r.end * tpl;
                if t.end > ll.num_tensors || r.start > r.end {
                    return Err(EngineError::Layout(format!(
                        "layers {r:?} x {tpl} tensors per layer do not fit a cache of {} tensors",
                        ll.num_tensors
                    )));
                }
                t
            }
        };
        let block = ll.block_bytes()?;
        let runs = block_runs(src_blocks, dst_blocks);
        let mut descs = Vec::with_capacity(runs.len() * tensors.len());
        for t in tensors {
            let (l, r) = (
                local.tensor_addrs[t as usize],
                remote.tensor_addrs[t as usize],
            );
            for &(s, d, n) in &runs {
                let (lb, rb) = if local_is_src { (s, d) } else { (d, s) };
                descs.push(TransferOpDesc {
                    local_addr: l + lb * block,
                    remote_addr: r + rb * block,
                    len: (n * block) as usize,
                });
            }
        }
        Ok(descs)
    }

    /// Pulls blocks of the paged cache `src` (at its cluster) into blocks of `dst`:
    /// `src_blocks[i]` into `dst_blocks[i]`, for the tensors of `layers`.
    #[allow(clippy::too_many_arguments)]
    pub async fn pull_kv_blocks(
        &self,
        src: &BlocksCacheKey,
        dst: &Cache,
        src_blocks: &[u64],
        dst_blocks: &[u64],
        layers: Option<Range<u32>>,
        tensors_per_layer: u32,
        timeout: Duration,
    ) -> Result<()> {
        let engine = self.engine_of(src.prompt_cluster_id)?;
        let remote = self.remote_cache(&engine, &src.name(), timeout).await?;
        let descs = Self::block_descs(
            dst,
            &remote,
            false,
            src_blocks,
            dst_blocks,
            layers,
            tensors_per_layer,
        )?;
        self.engine
            .transfer(&engine, TransferOp::Read, &descs, timeout)
            .await
    }

    /// Pushes blocks of `src` into blocks of the paged cache published under `dst` at
    /// cluster `dst_cluster`.
    #[allow(clippy::too_many_arguments)]
    pub async fn push_kv_blocks(
        &self,
        src: &Cache,
        dst_cluster: u64,
        dst: &BlocksCacheKey,
        src_blocks: &[u64],
        dst_blocks: &[u64],
        layers: Option<Range<u32>>,
        tensors_per_layer: u32,
        timeout: Duration,
    ) -> Result<()> {
        let engine = self.engine_of(dst_cluster)?;
        let remote = self.remote_cache(&engine, &dst.name(), timeout).await?;
        let descs = Self::block_descs(
            src,
            &remote,
            true,
            src_blocks,
            dst_blocks,
            layers,
            tensors_per_layer,
        )?;
        self.engine
            .transfer(&engine, TransferOp::Write, &descs, timeout)
            .await
    }

    /// Copies blocks within one local host cache: `src_blocks[i]` to `dst_blocks[i]` in
    /// every tensor. (Device caches copy their blocks with their framework's copy.)
    pub fn copy_kv_blocks(
        &self,
        cache: &Cache,
        src_blocks: &[u64],
        dst_blocks: &[u64],
    ) -> Result<()> {
        if cache.desc.placement != MemType::Host {
            return Err(EngineError::InvalidArgument(
                "copy_kv_blocks copies host caches; copy device blocks with the device framework's copy".into(),
            ));
        }
        let me = Published {
            layout: cache.desc.layout(),
            tensor_addrs: cache.tensor_addrs.clone(),
        };
        let descs = Self::block_descs(cache, &me, true, src_blocks, dst_blocks, None, 1)?;
        for d in descs {
            if d.local_addr == d.remote_addr {
                continue;
            }
            // SAFETY: both ranges lie in the cache's registered tensors (checked against
            // its block count above), which the caller keeps allocated while the cache is
            // registered; `copy` allows overlap.
            unsafe {
                std::ptr::copy(d.local_addr as *const u8, d.remote_addr as *mut u8, d.len);
            }
        }
        Ok(())
    }

    /// The engines of the linked clusters.
    pub fn links(&self) -> Vec<(u64, String)> {
        self.links
            .read()
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_block_pairs_become_runs() {
        assert_eq!(
            block_runs(&[0, 1, 2, 7, 8, 3], &[10, 11, 12, 4, 5, 6]),
            vec![(0, 10, 3), (7, 4, 2), (3, 6, 1)]
        );
        assert_eq!(block_runs(&[5, 6], &[1, 9]), vec![(5, 1, 1), (6, 9, 1)]);
        assert!(block_runs(&[], &[]).is_empty());
    }

    #[test]
    fn layout_errors_name_both_sides() {
        let a = Layout {
            num_tensors: 4,
            dtype: DataType::F16,
            shape: vec![8, 16, 128],
        };
        let b = Layout {
            num_tensors: 2,
            dtype: DataType::Bf16,
            shape: vec![4, 32, 128],
        };
        let e = a.check_same(&b, "blocks").unwrap_err().to_string();
        assert!(e.contains("dtype local F16, remote Bf16"), "{e}");
        assert!(e.contains("tensor count local 4, remote 2"), "{e}");
        assert!(
            e.contains("block shape local [16, 128], remote [32, 128]"),
            "{e}"
        );
        // Block caches may differ in block count only.
        let c = Layout {
            shape: vec![64, 16, 128],
            ..a.clone()
        };
        a.check_same(&c, "blocks").unwrap();
        assert!(a.check_same(&c, "cache").is_err());
        assert_eq!(a.block_bytes().unwrap(), 16 * 128 * 2);
    }
}
