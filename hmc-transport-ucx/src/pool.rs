//! Pools of registered buffers (user memory, or UCX-allocated), so data planes (the RPC's HMC_BUFFER mode) register memory once and reuse it instead of registering per call.
//!
//! Buffers come in power-of-two size classes from [`PoolConfig::min_len`]; a returned buffer
//! goes back to its class's free list unless that would keep more than
//! [`PoolConfig::max_cached_bytes`] idle, in which case it is deregistered and freed. Only
//! the free lists are locked (briefly); buffers in use are owned by their [`PooledBuffer`].
//! The pool is generic over any `Memory` and `Communicator`.

use std::ops::Deref;
use std::sync::Arc;

use hmc_core::{Access, Communicator, Error, Memory, RegisteredBuffer, Result};
use parking_lot::Mutex;

/// Limits of a [`BufferPool`].
#[derive(Clone, Copy, Debug)]
pub struct PoolConfig {
    /// Smallest buffer handed out (default 64 KiB); smaller requests get this size.
    pub min_len: usize,
    /// Largest buffer handed out (default 256 MiB); larger requests fail with `LimitExceeded`.
    pub max_len: usize,
    /// Idle bytes kept registered for reuse (default 256 MiB).
    pub max_cached_bytes: usize,
    /// What peers may do to pooled buffers.
    pub access: Access,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            min_len: 64 << 10,
            max_len: 256 << 20,
            max_cached_bytes: 256 << 20,
            access: Access::READ_WRITE,
        }
    }
}

struct Free<M: Memory, C: Communicator> {
    classes: Vec<Vec<RegisteredBuffer<M, C>>>,
    cached_bytes: usize,
}

struct Inner<M: Memory, C: Communicator> {
    memory: Arc<M>,
    comm: Arc<C>,
    config: PoolConfig,
    free: Mutex<Free<M, C>>,
}

/// Registered buffers by size class. Cheap to clone (shared).
pub struct BufferPool<M: Memory, C: Communicator>(Arc<Inner<M, C>>);

impl<M: Memory, C: Communicator> Clone for BufferPool<M, C> {
    fn clone(&self) -> Self {
        BufferPool(self.0.clone())
    }
}

impl<M: Memory, C: Communicator> BufferPool<M, C> {
    /// An empty pool allocating from `memory` and registering with `comm`.
    pub fn new(memory: Arc<M>, comm: Arc<C>, config: PoolConfig) -> Self {
        let config = PoolConfig {
            min_len: config.min_len.max(1).next_power_of_two(),
            ..config
        };
        BufferPool(Arc::new(Inner {
            memory,
            comm,
            config,
            free: Mutex::new(Free {
                classes: Vec::new(),
                cached_bytes: 0,
            }),
        }))
    }

    fn class_of(&self, len: usize) -> (usize, usize) {
        let size = len.max(self.0.config.min_len).next_power_of_two();
        let class = (size.trailing_zeros() - self.0.config.min_len.trailing_zeros()) as usize;
        (class, size)
    }

    /// A registered buffer of at least `len` bytes, reused when one is idle.
    pub fn get(&self, len: usize) -> Result<PooledBuffer<M, C>> {
        if len > self.0.config.max_len {
            return Err(Error::LimitExceeded {
                limit: "max_len",
                value: len as u64,
                max: self.0.config.max_len as u64,
                hint: "raise PoolConfig::max_len or split the payload".into(),
            });
        }
        let (class, size) = self.class_of(len);
        let reused = {
            let mut free = self.0.free.lock();
            let buf = free.classes.get_mut(class).and_then(Vec::pop);
            if buf.is_some() {
                free.cached_bytes -= size;
            }
            buf
        };
        let buf = match reused {
            Some(b) => b,
            None => RegisteredBuffer::new(
                self.0.memory.clone(),
                self.0.comm.clone(),
                size,
                self.0.config.access,
            )?,
        };
        Ok(PooledBuffer {
            buf: Some(buf),
            class,
            pool: self.0.clone(),
        })
    }

    /// Idle bytes currently kept registered.
    pub fn cached_bytes(&self) -> usize {
        self.0.free.lock().cached_bytes
    }

    /// Deregisters and frees every idle buffer.
    pub fn trim(&self) {
        let classes = {
            let mut free = self.0.free.lock();
            free.cached_bytes = 0;
            std::mem::take(&mut free.classes)
        };
        drop(classes);
    }
}

/// A buffer checked out of a [`BufferPool`]; returns to it when dropped.
pub struct PooledBuffer<M: Memory, C: Communicator> {
    buf: Option<RegisteredBuffer<M, C>>,
    class: usize,
    pool: Arc<Inner<M, C>>,
}

impl<M: Memory, C: Communicator> Deref for PooledBuffer<M, C> {
    type Target = RegisteredBuffer<M, C>;
    fn deref(&self) -> &Self::Target {
        self.buf.as_ref().expect("present until drop")
    }
}

impl<M: Memory, C: Communicator> Drop for PooledBuffer<M, C> {
    fn drop(&mut self) {
        let Some(buf) = self.buf.take() else { return };
        let size = buf.len();
        let spare = {
            let mut free = self.pool.free.lock();
            if free.cached_bytes + size > self.pool.config.max_cached_bytes {
                Some(buf)
            } else {
                if free.classes.len() <= self.class {
                    free.classes.resize_with(self.class + 1, Vec::new);
                }
                free.classes[self.class].push(buf);
                free.cached_bytes += size;
                None
            }
        };
        // Deregistration may wait for peers; never under the lock.
        drop(spare);
    }
}

struct UcxFree {
    classes: Vec<Vec<crate::UcxRegistration>>,
    cached_bytes: usize,
}

struct UcxInner {
    comm: Arc<crate::UcxCommunicator>,
    config: PoolConfig,
    free: Mutex<UcxFree>,
}

/// Like [`BufferPool`], but the buffers are UCX-allocated
/// ([`crate::UcxCommunicator::alloc_registered`]): over shared memory, peers reach them at
/// memcpy speed. What a data plane that owns its staging buffers should use.
#[derive(Clone)]
pub struct UcxBufferPool(Arc<UcxInner>);

impl UcxBufferPool {
    /// An empty pool over `comm`.
    pub fn new(comm: Arc<crate::UcxCommunicator>, config: PoolConfig) -> Self {
        let config = PoolConfig {
            min_len: config.min_len.max(1).next_power_of_two(),
            ..config
        };
        UcxBufferPool(Arc::new(UcxInner {
            comm,
            config,
            free: Mutex::new(UcxFree {
                classes: Vec::new(),
                cached_bytes: 0,
            }),
        }))
    }

    /// A UCX-allocated registration of at least `len` bytes, reused when one is idle.
    pub fn get(&self, len: usize) -> Result<UcxPooled> {
        let cfg = self.0.config;
        if len > cfg.max_len {
            return Err(Error::LimitExceeded {
                limit: "max_len",
                value: len as u64,
                max: cfg.max_len as u64,
                hint: "raise PoolConfig::max_len or split the payload".into(),
            });
        }
        let size = len.max(cfg.min_len).next_power_of_two();
        let class = (size.trailing_zeros() - cfg.min_len.trailing_zeros()) as usize;
        let reused = {
            let mut free = self.0.free.lock();
            let reg = free.classes.get_mut(class).and_then(Vec::pop);
            if reg.is_some() {
                free.cached_bytes -= size;
            }
            reg
        };
        let reg = match reused {
            Some(r) => r,
            None => self.0.comm.alloc_registered(size, cfg.access)?,
        };
        Ok(UcxPooled {
            reg: Some(reg),
            class,
            size,
            pool: self.0.clone(),
        })
    }

    /// Idle bytes currently kept registered.
    pub fn cached_bytes(&self) -> usize {
        self.0.free.lock().cached_bytes
    }

    /// Releases every idle registration.
    pub fn trim(&self) {
        let classes = {
            let mut free = self.0.free.lock();
            free.cached_bytes = 0;
            std::mem::take(&mut free.classes)
        };
        drop(classes);
    }
}

/// A registration checked out of a [`UcxBufferPool`]; returns to it when dropped.
pub struct UcxPooled {
    reg: Option<crate::UcxRegistration>,
    class: usize,
    size: usize,
    pool: Arc<UcxInner>,
}

impl Deref for UcxPooled {
    type Target = crate::UcxRegistration;
    fn deref(&self) -> &Self::Target {
        self.reg.as_ref().expect("present until drop")
    }
}

impl Drop for UcxPooled {
    fn drop(&mut self) {
        let Some(reg) = self.reg.take() else { return };
        let spare = {
            let mut free = self.pool.free.lock();
            if free.cached_bytes + self.size > self.pool.config.max_cached_bytes {
                Some(reg)
            } else {
                if free.classes.len() <= self.class {
                    free.classes.resize_with(self.class + 1, Vec::new);
                }
                free.classes[self.class].push(reg);
                free.cached_bytes += self.size;
                None
            }
        };
        // Deregistration may wait for peers; never under the lock.
        drop(spare);
    }
}
