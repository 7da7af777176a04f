//! Device memory that peers reach over TCP: regions registered with their memory backend
//! ([`hmc_core::Communicator::register_memory`]) are served through host bounce chunks.
//!
//! A peer's READ of a device run copies chunk *k + 1* from the device into one chunk
//! while chunk *k* is on the wire from the other; a WRITE receives chunk *k + 1* while
//! chunk *k* is copied to the device. The device copies run on tokio's blocking threads
//! (a vendor copy blocks its thread), each under the region's liveness lock, so
//! deregistration waits for at most one chunk's copy and no copy starts after it.
//!
//! The chunks come from one pool per communicator ([`hmc_transport_kit::staging`]),
//! bounded by [`crate::TcpConfig::max_staging_bytes`] in chunks of
//! [`crate::TcpConfig::staging_chunk`] bytes. A request takes its two chunks at once (so
//! two requests cannot each hold one and wait for the other), waits for them at most
//! `request_timeout`, and is refused with `LimitExceeded { limit: "max_staging_bytes" }`
//! after that: no peer makes the target hold more. Chunks are page-locked memory of the
//! device's driver where its backend has an allocator for it, else plain host memory; they
//! return to the pool when a request ends, or when its task is aborted with the
//! connection.
//!
//! Host regions never come here: their bytes move straight between socket and memory.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use hmc_core::{AnyMemory, Error, MemSpan, MemSpanMut, Memory, Region};
use hmc_transport_kit::staging::{self, Lease};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::abandon::Gate;
use crate::net::Stream;
use crate::region::RegEntry;
use crate::wire::WireDesc;

/// A chunk on its way from a staging lease into device memory: the lease comes back
/// with the copy's outcome so the next chunk can reuse it.
type Landing = std::pin::Pin<Box<dyn Future<Output = (Lease, hmc_core::Result<bool>)> + Send>>;

/// What the staging pool has done, from [`crate::TcpCommunicator::staging_stats`].
pub use hmc_transport_kit::staging::StagingStats;

/// The communicator's bounce chunks for device regions: the kit's pool, whose refusals
/// name `TcpConfig::max_staging_bytes`.
pub(crate) struct StagingPool(staging::StagingPool);

impl StagingPool {
    pub(crate) fn new(chunk: usize, max_bytes: usize) -> Arc<StagingPool> {
        Arc::new(StagingPool(staging::StagingPool::new(
            chunk,
            max_bytes,
            "TcpConfig::max_staging_bytes",
        )))
    }
}

impl std::ops::Deref for StagingPool {
    type Target = staging::StagingPool;

    fn deref(&self) -> &staging::StagingPool {
        &self.0
    }
}

/// A run's bytes cut into chunks: each a list of (offset in the region, length).
fn chunks(descs: &[WireDesc], chunk: usize) -> Vec<Vec<(u64, usize)>> {
    let mut out: Vec<Vec<(u64, usize)>> = Vec::new();
    let mut room = 0usize;
    for d in descs {
        let (mut off, mut left) = (d.offset, d.len as usize);
        while left > 0 {
            if room == 0 {
                out.push(Vec::new());
                room = chunk;
            }
            let n = left.min(room);
            out.last_mut().expect("pushed above").push((off, n));
            off += n as u64;
            left -= n;
            room -= n;
        }
    }
    out
}

fn group_len(group: &[(u64, usize)]) -> usize {
    group.iter().map(|&(_, n)| n).sum()
}

/// What moving a staged run came to.
pub(crate) enum StagedMoved {
    /// Every byte moved.
    Done,
    /// Refused before any byte of the answer left (or of the WRITE landed): `error` goes
    /// back to the initiator as the request's status.
    Refused(Error),
    /// The region was deregistered after `moved` bytes; `started` when any byte of the
    /// answer (or of the WRITE) had left (or landed).
    Deregistered { moved: u64, started: bool },
}

/// Copies `group` between the region and `lease` on a blocking thread, in the direction
/// `to_device` says, under the region's liveness lock. `Ok(false)`: deregistered.
async fn copy_group(
    entry: Arc<RegEntry>,
    memory: AnyMemory,
    lease: Lease,
    group: Vec<(u64, usize)>,
    to_device: bool,
    gate: Option<Gate>,
) -> (Lease, hmc_core::Result<bool>) {
    let task = tokio::task::spawn_blocking(move || {
        let result = (|| {
            // A WRITE's copy into the device runs under its connection's apply gate, held
            // for the copy (a blocking thread; an ABANDON waits for it on one too): once
            // an ABANDON is answered, no chunk of the WRITE lands.
            let flag = gate.as_ref().map(|g| g.lock());
            if flag.as_deref() == Some(&true) {
                return Err(Error::Cancelled(
                    "the initiator abandoned this WRITE; the rest of it is not applied".into(),
                ));
            }
            let live = entry.live.read();
            if !*live {
                return Ok(false);
            }
            let mut at = 0usize;
            for &(off, len) in &group {
                let device = Region {
                    device: entry.region.device,
                    addr: entry.region.addr + off,
                    len,
                };
                let host = lease.region(at, len);
                // SAFETY: `admit` checked the descriptor against the region, which stays
                // allocated while registered (`register_memory`'s contract) and `live` (held
                // for the copy) proves it still is; `host` lies inside the chunk this task
                // owns. Concurrent access by others follows the DMA rule the registering
                // caller accepted.
                let (src, mut dst) = unsafe {
                    if to_device {
                        (MemSpan::from_region(host), MemSpanMut::from_region(device))
                    } else {
                        (MemSpan::from_region(device), MemSpanMut::from_region(host))
                    }
                };
                memory.copy(&mut dst, &src)?;
                at += len;
            }
            Ok(true)
        })();
        (lease, result)
    });
    match task.await {
        Ok(r) => r,
        // The copy panicked: the lease went down with it (back to the pool).
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// Sends `prefix` (a READ's success status) and then the bytes of `descs` (one device
/// region) from host chunks, the device copy of the next chunk overlapping the send of
/// this one. `stall` bounds each step's progress.
pub(crate) async fn send_staged(
    stream: &mut Stream,
    pool: &Arc<StagingPool>,
    entry: &Arc<RegEntry>,
    memory: &AnyMemory,
    descs: &[WireDesc],
    mut prefix: &[u8],
    stall: Duration,
) -> io::Result<StagedMoved> {
    let groups = chunks(descs, pool.chunk());
    if groups.is_empty() {
        if !prefix.is_empty() {
            within(stall, stream.write_all(prefix)).await?;
        }
        return Ok(StagedMoved::Done);
    }
    let [a, b] = match pool.take(memory, stall).await {
        Ok(two) => two,
        Err(e) if !prefix.is_empty() => return Ok(StagedMoved::Refused(e)),
        Err(e) => return Err(io::Error::other(e.to_string())),
    };
    let mut spare = Some(b);
    let (mut ready, first) = copy_group(
        entry.clone(),
        memory.clone(),
        a,
        groups[0].clone(),
        false,
        None,
    )
    .await;
    let mut sent = 0u64;
    let failed = |e: Error, sent: u64, prefix: &[u8]| {
        if sent == 0 && !prefix.is_empty() {
            Ok(StagedMoved::Refused(e))
        } else {
            Err(io::Error::other(e.to_string()))
        }
    };
    match first {
        Ok(true) => {}
        Ok(false) => {
            return Ok(StagedMoved::Deregistered {
                moved: 0,
                started: false,
            });
        }
        Err(e) => return failed(e, sent, prefix),
    }
    for k in 0..groups.len() {
        let len = group_len(&groups[k]);
        let next = groups.get(k + 1).map(|g| {
            let lease = spare
                .take()
                .expect("one chunk is free while the other is sent");
            copy_group(entry.clone(), memory.clone(), lease, g.clone(), false, None)
        });
        let send = async {
            if !prefix.is_empty() {
                within(stall, stream.write_all(prefix)).await?;
            }
            within(stall, stream.write_all(ready.bytes(len))).await
        };
        let (wrote, copied) = match next {
            Some(copy) => {
                let (w, c) = tokio::join!(send, copy);
                (w, Some(c))
            }
            None => (send.await, None),
        };
        wrote?;
        prefix = &[];
        sent += len as u64;
        pool.add_bytes_to_peers(len as u64);
        if let Some((lease, result)) = copied {
            spare = Some(std::mem::replace(&mut ready, lease));
            match result {
                Ok(true) => {}
                Ok(false) => {
                    return Ok(StagedMoved::Deregistered {
                        moved: sent,
                        started: true,
                    });
                }
                Err(e) => return failed(e, sent, prefix),
            }
        }
    }
    Ok(StagedMoved::Done)
}

/// Receives the bytes of `descs` (one device region) into host chunks and copies each to
/// the device while the next arrives. Before a chunk is applied the target checks that
/// the initiator has not abandoned the WRITE (a reset, or an ABANDON: `gate`'s flag, also
/// checked by the copy under the gate's lock), so none of an abandoned WRITE's bytes land
/// after the initiator reported its end.
pub(crate) async fn recv_staged(
    stream: &mut Stream,
    pool: &Arc<StagingPool>,
    entry: &Arc<RegEntry>,
    memory: &AnyMemory,
    descs: &[WireDesc],
    stall: Duration,
    gate: &Gate,
) -> io::Result<StagedMoved> {
    let groups = chunks(descs, pool.chunk());
    if groups.is_empty() {
        return Ok(StagedMoved::Done);
    }
    let [a, b] = match pool.take(memory, stall).await {
        Ok(two) => two,
        Err(e) => return Ok(StagedMoved::Refused(e)),
    };
    let mut spare = Some(b);
    let mut filling = a;
    let mut landing: Option<Landing> = None;
    let mut received = 0u64;
    let mut landed = 0u64;
    for group in &groups {
        let len = group_len(group);
        let recv = within(stall, stream.read_exact(filling.bytes_mut(len)));
        let (read, done) = match landing.take() {
            Some(copy) => {
                let (r, c) = tokio::join!(recv, copy);
                (r, Some(c))
            }
            None => (recv.await, None),
        };
        read?;
        received += len as u64;
        if let Some((lease, result)) = done {
            spare = Some(lease);
            match result {
                Ok(true) => {}
                Ok(false) => {
                    return Ok(StagedMoved::Deregistered {
                        moved: received,
                        started: landed > 0,
                    });
                }
                Err(e) => return Err(io::Error::other(e.to_string())),
            }
            landed = received - len as u64;
        }
        if *gate.lock() || stream.abandoned_by_peer() {
            return Err(crate::abandon::abandoned());
        }
        let lease = std::mem::replace(
            &mut filling,
            spare
                .take()
                .expect("one chunk is free while the other lands"),
        );
        pool.add_bytes_from_peers(len as u64);
        landing = Some(Box::pin(copy_group(
            entry.clone(),
            memory.clone(),
            lease,
            group.clone(),
            true,
            Some(gate.clone()),
        )));
    }
    if let Some(copy) = landing {
        let (_lease, result) = copy.await;
        match result {
            Ok(true) => {}
            Ok(false) => {
                return Ok(StagedMoved::Deregistered {
                    moved: received,
                    started: landed > 0,
                });
            }
            Err(e) => return Err(io::Error::other(e.to_string())),
        }
    }
    Ok(StagedMoved::Done)
}

async fn within<T>(stall: Duration, io: impl Future<Output = io::Result<T>>) -> io::Result<T> {
    tokio::time::timeout(stall, io).await.map_err(|_| {
        io::Error::new(
            io::ErrorKind::TimedOut,
            "no progress within request_timeout",
        )
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(offset: u64, len: u64) -> WireDesc {
        WireDesc {
            id: 1,
            token: [0; crate::wire::TOKEN_LEN],
            offset,
            len,
        }
    }

    #[test]
    fn runs_cut_into_chunks_cover_every_byte_once() {
        let descs = [desc(0, 5), desc(100, 7), desc(200, 0), desc(300, 2)];
        let groups = chunks(&descs, 4);
        assert_eq!(
            groups,
            vec![
                vec![(0, 4)],
                vec![(4, 1), (100, 3)],
                vec![(103, 4)],
                vec![(300, 2)]
            ]
        );
        assert!(groups.iter().all(|g| group_len(g) <= 4));
        assert!(chunks(&[desc(0, 0)], 4).is_empty());
    }

    #[tokio::test]
    async fn the_pool_refuses_naming_max_staging_bytes_and_tcp_config() {
        let pool = StagingPool::new(1024, 3 * 1024);
        let host = AnyMemory::new(hmc_backend_cpu::HostMemory::new());
        let wait = Duration::from_millis(10);
        let two: [Lease; 2] = pool.take(&host, wait).await.unwrap();
        let err = pool
            .take::<2>(&host, wait)
            .await
            .err()
            .expect("one chunk is left");
        assert!(
            matches!(
                err,
                Error::LimitExceeded {
                    limit: "max_staging_bytes",
                    max: 3072,
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string().contains("TcpConfig::max_staging_bytes"),
            "{err}"
        );
        drop(two);
        assert_eq!(pool.stats().chunks_held, 0);
    }
}
