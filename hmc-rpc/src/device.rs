//! Device-resident RPC payloads: host staging buffers leased in a ring, the producer that copies a device payload out chunk by chunk while earlier chunks are on the wire, and the sink that copies received chunks to the device as they arrive.
//!
//! A TCP_STREAM payload in device memory never exists whole in host memory: the sender
//! copies chunk *i + 1* device-to-host into a leased staging buffer while chunk *i* is
//! being written to the socket (the lease returns to the ring when the socket has taken
//! its bytes, which bounds the memory to `depth` chunks), and the receiver copies each DATA
//! chunk host-to-device straight from its input buffer while the kernel receives the
//! next. The staging buffers should be pinned memory of the device's backend (for CUDA,
//! `CudaMemory::pinned()`), so the device's DMA engine copies at full speed; any host
//! [`Memory`] works.

use std::sync::Arc;

use bytes::Bytes;
use hmc_core::{
    AnyBuffer, DeviceBuffer, Error, MemSpan, MemSpanMut, Memory, Result, StagingConfig,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::proto::{StagedPayload, StreamSink};

/// The default staging of device payloads: 1 MiB chunks (one stream turn), 3 of them (one
/// being filled, one queued, one on the wire).
pub const DEFAULT_DEVICE_STAGING: StagingConfig = StagingConfig {
    chunk: 1 << 20,
    depth: 3,
};

/// Host staging buffers of `chunk` bytes, shared by every device payload a client or a
/// method sends. Each payload in flight leases at most `depth` of them at once (its
/// backpressure between the device copies and the socket), so a slow peer holds back only
/// its own calls. Buffers are allocated on demand and reused; at most `IDLE_PER_DEPTH` x
/// `depth` idle ones are kept, the rest freed, so a burst does not pin memory for good.
pub struct StagingRing<H: Memory> {
    host: Arc<H>,
    chunk: usize,
    depth: usize,
    free: parking_lot::Mutex<Vec<H::Buffer>>,
}

/// Idle buffers kept per unit of depth (a few payloads' worth).
const IDLE_PER_DEPTH: usize = 4;

impl<H: Memory> StagingRing<H> {
    /// A ring over `host` memory (which must be host memory; pinned for best speed).
    pub fn new(host: Arc<H>, config: StagingConfig) -> Result<Arc<Self>> {
        config.check("device staging", host.device())?;
        Ok(Arc::new(StagingRing {
            host,
            chunk: config.chunk,
            depth: config.depth,
            free: parking_lot::Mutex::new(Vec::new()),
        }))
    }

    /// Bytes per staging buffer.
    pub fn chunk(&self) -> usize {
        self.chunk
    }

    /// Staging buffers allocated and now idle (a measure for tests).
    pub fn idle_buffers(&self) -> usize {
        self.free.lock().len()
    }

    fn lease(self: &Arc<Self>, slot: OwnedSemaphorePermit) -> Result<Lease<H>> {
        let buf = match self.free.lock().pop() {
            Some(b) => b,
            None => self.host.alloc(self.chunk)?,
        };
        Ok(Lease {
            buf: Some(buf),
            len: 0,
            ring: self.clone(),
            _slot: slot,
        })
    }
}

/// One staging buffer out of the ring, holding one of its payload's `depth` slots; both go
/// back when it is dropped (when the socket has written the last [`Bytes`] made of it).
struct Lease<H: Memory> {
    buf: Option<H::Buffer>,
    /// Bytes filled.
    len: usize,
    ring: Arc<StagingRing<H>>,
    _slot: OwnedSemaphorePermit,
}

impl<H: Memory> AsRef<[u8]> for Lease<H> {
    fn as_ref(&self) -> &[u8] {
        let buf = self.buf.as_ref().expect("present until dropped");
        let all = MemSpan::of(buf)
            .as_host_slice()
            .expect("the ring checked that its memory is host memory");
        &all[..self.len]
    }
}

impl<H: Memory> Drop for Lease<H> {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            let mut free = self.ring.free.lock();
            if free.len() < IDLE_PER_DEPTH * self.ring.depth {
                free.push(b);
            }
        }
    }
}

/// Copies `src` (memory of `memory`, usually a device) out through `ring` chunk by chunk,
/// handing each filled chunk to `feed` as soon as it is copied. Returns `Ok(true)` when
/// every byte was fed, `Ok(false)` when `feed` refused one (the receiver is gone), and the
/// copy or allocation error otherwise. While `feed`'s consumer writes chunk *i*, this
/// copies chunk *i + 1*; at most the ring's depth of this payload is out at once.
pub(crate) async fn produce<M: Memory, H: Memory>(
    memory: &M,
    src: &MemSpan<'_>,
    ring: &Arc<StagingRing<H>>,
    mut feed: impl FnMut(Bytes) -> bool,
) -> Result<bool> {
    let slots = Arc::new(Semaphore::new(ring.depth));
    let mut off = 0;
    while off < src.len() {
        let n = ring.chunk.min(src.len() - off);
        let slot = slots
            .clone()
            .acquire_owned()
            .await
            .expect("this semaphore is never closed");
        let mut lease = ring.lease(slot)?;
        {
            let buf = lease.buf.as_mut().expect("present until dropped");
            let mut whole = MemSpanMut::of(buf);
            let mut dst = whole.slice_mut(0, n)?;
            memory.copy(&mut dst, &src.slice(off, n)?)?;
        }
        lease.len = n;
        if !feed(Bytes::from_owner(lease)) {
            return Ok(false);
        }
        off += n;
    }
    Ok(true)
}

/// Receives a streamed payload into a new device buffer of `memory`, one host-to-device
/// copy per DATA chunk. Its product is the `M::Buffer`.
pub(crate) struct DeviceSink<M: Memory> {
    memory: Arc<M>,
    buf: Result<M::Buffer>,
}

impl<M: Memory> DeviceSink<M> {
    /// A sink for a `len`-byte payload (allocation failures are reported by `finish`).
    pub(crate) fn new(memory: Arc<M>, len: u64) -> Self {
        let buf = usize::try_from(len)
            .map_err(|_| Error::InvalidArgument(format!("{len} bytes do not fit in memory")))
            .and_then(|len| memory.alloc(len));
        DeviceSink { memory, buf }
    }

    pub(crate) fn boxed(memory: Arc<M>, len: u64) -> Box<dyn StreamSink> {
        Box::new(Self::new(memory, len))
    }
}

impl<M: Memory> StreamSink for DeviceSink<M> {
    fn write(&mut self, offset: u64, bytes: &[u8]) {
        let Ok(buf) = &mut self.buf else {
            return; // the first error is kept
        };
        let r = (|| {
            let mut whole = MemSpanMut::of(buf);
            let mut dst = whole.slice_mut(offset as usize, bytes.len())?;
            self.memory.copy(&mut dst, &MemSpan::host(bytes))
        })();
        if let Err(e) = r {
            tracing::debug!(offset, len = bytes.len(), device = %self.memory.device(), error = %e, "staging a received chunk failed");
            self.buf = Err(e);
        }
    }

    fn finish(self: Box<Self>) -> StagedPayload {
        let memory = self.memory;
        self.buf.map(|b| AnyBuffer::of(&*memory, b))
    }
}

/// The device buffer a [`DeviceSink`] of `M` made.
pub(crate) fn take_staged<M: Memory>(p: StagedPayload) -> Result<M::Buffer> {
    p.and_then(|b| {
        b.downcast::<M::Buffer>().map_err(|b| {
            Error::InvalidArgument(format!(
                "a staged payload on {} is not a buffer of this method's memory",
                b.region().device
            ))
        })
    })
}

/// Copies host bytes into a new device buffer of `memory` (payloads that arrived whole:
/// INLINE, or pulled over the data plane).
pub(crate) fn upload<M: Memory>(memory: &M, bytes: &[u8]) -> Result<M::Buffer> {
    let mut buf = memory.alloc(bytes.len())?;
    memory.copy(&mut MemSpanMut::of(&mut buf), &MemSpan::host(bytes))?;
    Ok(buf)
}

/// Copies a whole device buffer into host memory (small payloads, and data-plane paths
/// that need the bytes in one piece).
pub(crate) fn download<M: Memory>(memory: &M, src: &MemSpan<'_>) -> Result<Vec<u8>> {
    let mut host = vec![0u8; src.len()];
    memory.copy(&mut MemSpanMut::host(&mut host), src)?;
    Ok(host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hmc_backend_cpu::HostMemory;

    fn host_ring(chunk: usize, depth: usize) -> (Arc<HostMemory>, Arc<StagingRing<HostMemory>>) {
        let host = Arc::new(HostMemory::new());
        let ring = StagingRing::new(host.clone(), StagingConfig { chunk, depth }).unwrap();
        (host, ring)
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n as u32)
            .map(|i| (i.wrapping_mul(7) >> 2) as u8)
            .collect()
    }

    #[tokio::test]
    async fn produce_feeds_every_byte_in_chunks_and_reuses_the_ring() {
        let (host, ring) = host_ring(1000, 2);
        let data = pattern(4_500);
        let mut got = Vec::new();
        let mut sizes = Vec::new();
        let done = produce(&*host, &MemSpan::host(&data), &ring, |b| {
            sizes.push(b.len());
            got.extend_from_slice(&b);
            true // dropped here: the lease goes back at once
        })
        .await
        .unwrap();
        assert!(done);
        assert_eq!(got, data);
        assert_eq!(sizes, vec![1000, 1000, 1000, 1000, 500]);
        assert_eq!(ring.idle_buffers(), 1, "one buffer served every chunk");
    }

    #[tokio::test]
    async fn produce_waits_for_the_socket_when_the_ring_is_out() {
        let (host, ring) = host_ring(100, 2);
        let data = pattern(1_000);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
        let src = MemSpan::host(&data);
        let producer = produce(&*host, &src, &ring, |b| tx.send(b).is_ok());
        tokio::pin!(producer);
        // Nobody takes the chunks: two leases, then the producer waits.
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), &mut producer)
                .await
                .is_err()
        );
        let mut held = Vec::new();
        while let Ok(b) = rx.try_recv() {
            held.push(b);
        }
        assert_eq!(held.len(), 2, "bounded by the ring's depth");
        // A consumer that writes (drops) what it gets lets it finish.
        let consume = async {
            let mut all: Vec<u8> = held.drain(..).flat_map(|b| b.to_vec()).collect();
            while let Some(b) = rx.recv().await {
                all.extend_from_slice(&b);
                if all.len() == data.len() {
                    break;
                }
            }
            all
        };
        let (done, all) = tokio::join!(producer, consume);
        assert!(done.unwrap());
        assert_eq!(all, data);
    }

    #[tokio::test]
    async fn a_stalled_payload_does_not_hold_back_another_and_idle_buffers_are_capped() {
        let (host, ring) = host_ring(100, 2);
        let data = pattern(1_000);
        let src = MemSpan::host(&data);
        // The first payload's consumer never writes: it holds its two slots.
        let mut stuck = Vec::new();
        let stalled = produce(&*host, &src, &ring, |b| {
            stuck.push(b);
            true
        });
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(20), stalled)
                .await
                .is_err()
        );
        // A second payload through the same ring still goes through.
        let mut got = Vec::new();
        let done = produce(&*host, &src, &ring, |b| {
            got.extend_from_slice(&b);
            true
        })
        .await
        .unwrap();
        assert!(done);
        assert_eq!(got, data);
        drop(stuck);
        assert!(ring.idle_buffers() <= IDLE_PER_DEPTH * 2);
    }

    #[tokio::test]
    async fn produce_stops_when_the_consumer_is_gone() {
        let (host, ring) = host_ring(10, 2);
        let data = pattern(100);
        let mut n = 0;
        let done = produce(&*host, &MemSpan::host(&data), &ring, |_| {
            n += 1;
            n < 3
        })
        .await
        .unwrap();
        assert!(!done);
        assert_eq!(n, 3);
    }

    #[test]
    fn the_ring_refuses_bad_settings_and_device_memory_is_checked() {
        let host = Arc::new(HostMemory::new());
        let e = StagingRing::new(host.clone(), StagingConfig { chunk: 0, depth: 2 })
            .err()
            .unwrap();
        assert!(e.to_string().contains("chunk > 0"), "{e}");
        assert!(StagingRing::new(host, StagingConfig { chunk: 8, depth: 1 }).is_err());
    }

    #[test]
    fn device_sink_places_chunks_and_reports_the_first_error() {
        let host = Arc::new(HostMemory::new());
        let data = pattern(3_000);
        let mut sink = DeviceSink::boxed(host.clone(), data.len() as u64);
        for (i, c) in data.chunks(700).enumerate() {
            sink.write((i * 700) as u64, c);
        }
        let buf = take_staged::<HostMemory>(sink.finish()).unwrap();
        assert_eq!(download(&*host, &MemSpan::of(&buf)).unwrap(), data);

        let mut sink = DeviceSink::boxed(host.clone(), 10);
        sink.write(8, b"abcd"); // past the end
        sink.write(0, b"ok");
        let e = take_staged::<HostMemory>(sink.finish()).unwrap_err();
        assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
    }
}
