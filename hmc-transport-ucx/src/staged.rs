//! Device memory that peers reach although the loaded UCX cannot move it: regions
//! registered with their memory backend ([`hmc_core::Communicator::register_memory`]) of a
//! kind outside UCX's memory types are served over the control connection, staged through
//! host chunks at the target, as the TCP transport serves its device regions.
//!
//! Why the control connection and not UCX: a UCX without a device's support cannot
//! register its memory, so a peer's one-sided get or put has nothing to land on; the
//! target's CPU must copy between the device and host memory, and the control connection
//! is the target's own thread per initiator. UCX is left untouched by these regions.
//!
//! # Protocol (frames of `control.rs`)
//!
//! - `STAGED_READ` (initiator → target): request id, region id, offset, length, each
//!   `u64`. The target answers with `STAGED_DATA` frames (request id, then at most
//!   [`STAGED_CHUNK`] bytes) in order, then one `STAGED_DONE`.
//! - `STAGED_WRITE` (initiator → target): request id, region id, offset `u64`, a `last`
//!   byte, then at most [`STAGED_CHUNK`] bytes. The target answers one `STAGED_DONE` per
//!   request: at the first refusal (later frames of that request are dropped unread into
//!   the device), or after the frame marked last.
//! - `STAGED_DONE`: request id `u64`, a status byte (0 done; else [`Refusal`]'s code),
//!   then for a limit the value and maximum (`u64` each), and the message as UTF-8.
//!
//! # What the target checks and holds
//!
//! A request names a region the connection imported (the target confirmed the
//! descriptor to it byte for byte), within its bounds and rights; nothing else is read or
//! written. A READ holds one chunk of the communicator's pool
//! ([`hmc_transport_kit::staging`], bounded by [`crate::UcxConfig::max_staging_bytes`])
//! while it runs and waits at most `control_timeout` for one, else it is refused with
//! `LimitExceeded { limit: "max_staging_bytes" }`. Chunks are page-locked memory of the device's driver where its
//! backend allocates it ([`hmc_core::Memory::pinned_host`]), else plain host memory; the
//! device copy of chunk *k + 1* runs while the socket still sends chunk *k* from its
//! buffer. A WRITE frame is copied to the device from the frame the connection read it
//! into (one at a time per connection, at most [`STAGED_CHUNK`] bytes). Every copy runs
//! under the region's liveness lock: deregistration waits for at most one chunk's copy,
//! and none starts after it. A connection that dies mid-request (the initiator killed)
//! ends its thread, and the chunk goes back to the pool.
//!
//! # The initiator
//!
//! One thread per batch moves the staged descriptors (`run`): the bytes of a READ are
//! copied into local memory by that thread only, so once a transfer has returned (done,
//! failed, timed out or dropped) no late byte lands in it. A WRITE that stops early ends
//! its request with an empty last frame and waits (at most `drain_timeout`) for the
//! target's answer, so nothing it sent is still applied after the caller heard back; a
//! target that does not answer is disconnected.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use hmc_core::{
    Access, AnyMemory, Device, Error, MemSpan, MemSpanMut, Memory, Op, Region, Result, check_bounds,
};
use hmc_transport_kit::staging;
use parking_lot::RwLock;

/// Control frame kinds of staged transfers (the control connection's table, `control.rs`).
pub(crate) const STAGED_READ: u8 = 7;
pub(crate) const STAGED_DATA: u8 = 8;
pub(crate) const STAGED_DONE: u8 = 9;
pub(crate) const STAGED_WRITE: u8 = 10;

/// What a staged run needs of its endpoint's control connection (`control::Link`): kept
/// as a trait so that this module, which the connection's target side calls into, does not
/// name the connection back.
pub(crate) trait StagedLink: Send + Sync {
    /// A fresh request id on this connection.
    fn next_req(&self) -> u64;
    /// Writes one frame of `parts`.
    fn send(&self, kind: u8, parts: &[&[u8]]) -> std::io::Result<()>;
    /// Routes the frames of request `req` to `to`; `Err` (why) once the connection died.
    fn add_staged(
        &self,
        req: u64,
        to: mpsc::SyncSender<StagedEvent>,
    ) -> std::result::Result<(), String>;
    /// Stops routing frames of `req` (later ones are dropped).
    fn remove_staged(&self, req: u64);
    /// Why the connection died, if it did.
    fn dead_reason(&self) -> Option<String>;
    /// Cuts the connection (its reader then reports the peer gone).
    fn disconnect(&self);
}

/// Largest payload of one `STAGED_DATA` or `STAGED_WRITE` frame, and the size of one
/// staging chunk: half of the control connection's largest frame.
pub(crate) const STAGED_CHUNK: usize = 512 << 10;

/// Bytes of a `STAGED_WRITE` frame before its data.
pub(crate) const WRITE_HEADER: usize = 8 + 8 + 8 + 1;

/// Staged READ requests of one batch outstanding at once.
const READ_WINDOW: usize = 8;

/// Ids of staged registrations carry this bit, so they never meet the progress thread's.
pub(crate) const STAGED_ID_BIT: u64 = 1 << 63;

/// What the staging of device regions has done, from
/// [`crate::UcxCommunicator::staging_stats`]: the kit's counters, as the TCP transport's.
pub use hmc_transport_kit::staging::StagingStats as UcxStagingStats;

/// The setting a staging refusal tells the initiator to raise.
const SETTING: &str = "UcxConfig::max_staging_bytes";

/// A device region served to peers through host chunks.
pub(crate) struct StagedRegion {
    pub region: Region,
    pub access: Access,
    memory: AnyMemory,
    /// False once deregistered; held (read) for each chunk's copy.
    live: RwLock<bool>,
}

impl StagedRegion {
    pub fn new(region: Region, access: Access, memory: AnyMemory) -> Self {
        StagedRegion {
            region,
            access,
            memory,
            live: RwLock::new(true),
        }
    }

    /// Waits for a running chunk copy and lets no other start.
    pub fn retire(&self) {
        *self.live.write() = false;
    }

    /// Copies between `host` and the region at `offset` (`to_device` says which way).
    /// `Ok(false)`: deregistered, nothing copied.
    fn copy(&self, offset: u64, host: Region, to_device: bool) -> Result<bool> {
        let live = self.live.read();
        if !*live {
            return Ok(false);
        }
        let device = Region {
            device: self.region.device,
            addr: self.region.addr + offset,
            len: host.len,
        };
        // SAFETY: the caller checked `offset + host.len` against the region, which stays
        // allocated while registered (`register_memory`'s contract) and `live` (held for
        // the copy) proves it still is; `host` is memory the caller owns for the call.
        // Concurrent access by others follows the DMA rule the registering caller accepted.
        let (src, mut dst) = unsafe {
            if to_device {
                (MemSpan::from_region(host), MemSpanMut::from_region(device))
            } else {
                (MemSpan::from_region(device), MemSpanMut::from_region(host))
            }
        };
        self.memory.copy(&mut dst, &src)?;
        Ok(true)
    }
}

/// Why the target refused a staged request, as `STAGED_DONE` carries it.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// 1: no live region of that id imported on this connection.
    Key(String),
    /// 2: the region does not allow the access.
    Access(String),
    /// 3: outside the region.
    Bounds(String),
    /// 4: no staging chunk became free in time.
    Limit { value: u64, max: u64 },
    /// 5: the device copy failed.
    Copy(String),
}

impl Refusal {
    pub fn encode(&self, req: u64) -> Vec<u8> {
        let mut out = req.to_be_bytes().to_vec();
        let (code, text) = match self {
            Refusal::Key(t) => (1u8, t.as_str()),
            Refusal::Access(t) => (2, t.as_str()),
            Refusal::Bounds(t) => (3, t.as_str()),
            Refusal::Limit { value, max } => {
                out.push(4);
                out.extend_from_slice(&value.to_be_bytes());
                out.extend_from_slice(&max.to_be_bytes());
                return out;
            }
            Refusal::Copy(t) => (5, t.as_str()),
        };
        out.push(code);
        out.extend_from_slice(text.as_bytes());
        out
    }

    /// The error an initiator reports for a `STAGED_DONE` status of `body` (after the
    /// request id) from `peer`; `Ok` for status 0.
    pub fn decode(peer: SocketAddr, body: &[u8]) -> Result<()> {
        let text = |at: usize| String::from_utf8_lossy(body.get(at..).unwrap_or(&[])).into_owned();
        match body.first() {
            Some(0) => Ok(()),
            Some(1) => Err(Error::InvalidKey(text(1))),
            Some(2) => Err(Error::AccessDenied(text(1))),
            Some(3) => Err(Error::InvalidArgument(text(1))),
            Some(4) if body.len() >= 17 => Err(staging::refusal(
                u64::from_be_bytes(body[1..9].try_into().expect("8 bytes")),
                u64::from_be_bytes(body[9..17].try_into().expect("8 bytes")),
                SETTING,
            )),
            Some(5) => Err(Error::peer(
                peer,
                format!("the device copy at the target failed: {}", text(1)),
            )),
            _ => Err(Error::Protocol(format!(
                "a malformed STAGED_DONE from {peer}"
            ))),
        }
    }
}

/// The communicator's bounce chunks for peers' READs of device regions: the kit's pool,
/// in chunks of [`STAGED_CHUNK`] bytes.
pub(crate) struct StagingPool(staging::StagingPool);

impl StagingPool {
    pub fn new(max_bytes: usize) -> StagingPool {
        StagingPool(staging::StagingPool::new(STAGED_CHUNK, max_bytes, SETTING))
    }
}

impl std::ops::Deref for StagingPool {
    type Target = staging::StagingPool;

    fn deref(&self) -> &staging::StagingPool {
        &self.0
    }
}

/// Checks a staged request for `need` of `len` bytes at `offset` of `region`.
pub(crate) fn admit(
    region: Option<&Arc<StagedRegion>>,
    need: Access,
    offset: u64,
    len: u64,
) -> std::result::Result<Arc<StagedRegion>, Refusal> {
    let Some(r) = region else {
        return Err(Refusal::Key(
            "no live device region of this id was imported on this connection \
             (deregistered, or never exported)"
                .into(),
        ));
    };
    if !r.access.allows(need) {
        return Err(Refusal::Access(format!(
            "the target registered this device region for {:?} only; this needs {need:?}",
            r.access
        )));
    }
    check_bounds("remote device region", offset, len, r.region.len as u64)
        .map_err(|e| Refusal::Bounds(e.to_string()))?;
    Ok(r.clone())
}

/// Serves one admitted READ: the region's bytes in chunks through `send_data`, which
/// writes one `STAGED_DATA` frame. `Err` (an I/O error of the connection) ends it.
pub(crate) fn serve_read(
    pool: &StagingPool,
    region: &StagedRegion,
    offset: u64,
    len: u64,
    wait: Duration,
    mut send_data: impl FnMut(&[u8]) -> std::io::Result<()>,
) -> std::io::Result<std::result::Result<(), Refusal>> {
    let [lease] = match pool.take_blocking(&region.memory, wait) {
        Ok(l) => l,
        Err(Error::LimitExceeded { value, max, .. }) => {
            return Ok(Err(Refusal::Limit { value, max }));
        }
        Err(e) => {
            return Ok(Err(Refusal::Copy(format!(
                "allocating a pinned chunk: {e}"
            ))));
        }
    };
    let mut done = 0u64;
    while done < len {
        let n = STAGED_CHUNK.min((len - done) as usize);
        match region.copy(offset + done, lease.region(0, n), false) {
            Ok(true) => {}
            Ok(false) => {
                return Ok(Err(Refusal::Key(
                    "the target deregistered this device region during the READ".into(),
                )));
            }
            Err(e) => return Ok(Err(Refusal::Copy(e.to_string()))),
        }
        send_data(lease.bytes(n))?;
        pool.add_bytes_to_peers(n as u64);
        done += n as u64;
    }
    Ok(Ok(()))
}

/// Copies one admitted WRITE frame's `data` into the region at `offset`.
pub(crate) fn serve_write(
    pool: &StagingPool,
    region: &StagedRegion,
    offset: u64,
    data: &[u8],
) -> std::result::Result<(), Refusal> {
    let host = Region {
        device: Device::HOST,
        addr: data.as_ptr() as u64,
        len: data.len(),
    };
    match region.copy(offset, host, true) {
        Ok(true) => {
            pool.add_bytes_from_peers(data.len() as u64);
            Ok(())
        }
        Ok(false) => Err(Refusal::Key(
            "the target deregistered this device region during the WRITE".into(),
        )),
        Err(e) => Err(Refusal::Copy(e.to_string())),
    }
}

/// One descriptor of a batch whose remote side is a peer's staged region.
pub(crate) struct StagedDesc {
    /// Local host memory (checked against its registration).
    pub local: u64,
    pub len: usize,
    pub region: u64,
    pub offset: u64,
}

/// What the control connection's reader hands a staged transfer.
pub(crate) enum StagedEvent {
    /// A `STAGED_DATA` frame: its payload, request id first.
    Data(Vec<u8>),
    /// A `STAGED_DONE` frame: request id, then status.
    Done(Vec<u8>),
    /// The control connection died.
    Gone,
    /// The caller dropped the transfer.
    Cancel,
}

/// What a staged batch needs from its endpoint.
pub(crate) struct StagedRun {
    pub link: Arc<dyn StagedLink>,
    pub peer: SocketAddr,
    pub op: Op,
    pub descs: Vec<StagedDesc>,
    pub deadline: Instant,
    pub drain_timeout: Duration,
    pub events: mpsc::Receiver<StagedEvent>,
    pub cancelled: Arc<AtomicBool>,
}

fn req_of(payload: &[u8]) -> Option<u64> {
    payload
        .get(..8)
        .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
}

fn cancelled() -> Error {
    Error::Cancelled("the staged transfer was dropped".into())
}

fn expired() -> Error {
    Error::DeadlineExceeded {
        during: "ucx staged transfer of a peer's device region",
        elapsed: Duration::ZERO,
    }
}

impl StagedRun {
    /// Moves the batch, its events arriving through the link with `sender`; returns once
    /// no byte of it moves any more.
    pub fn run(self, sender: mpsc::SyncSender<StagedEvent>) -> Result<()> {
        let reqs: Vec<u64> = self.descs.iter().map(|_| self.link.next_req()).collect();
        let added = reqs
            .iter()
            .try_for_each(|&r| self.link.add_staged(r, sender.clone()));
        drop(sender);
        let result = added
            .map_err(|why| Error::peer(self.peer, why))
            .and_then(|()| match self.op {
                Op::Read => self.read(&reqs),
                Op::Write => self.write(&reqs),
            });
        for &r in &reqs {
            self.link.remove_staged(r);
        }
        result
    }

    /// The next event before the deadline.
    fn next(&self) -> Result<StagedEvent> {
        if self.cancelled.load(Ordering::Acquire) {
            return Err(cancelled());
        }
        let left = self.deadline.saturating_duration_since(Instant::now());
        match self.events.recv_timeout(left) {
            Ok(StagedEvent::Cancel) => Err(cancelled()),
            Ok(StagedEvent::Gone) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(self.link_gone())
            }
            Ok(ev) => Ok(ev),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(expired()),
        }
    }

    fn link_gone(&self) -> Error {
        Error::peer(
            self.peer,
            self.link
                .dead_reason()
                .unwrap_or_else(|| "the control connection closed".into()),
        )
    }

    fn read(&self, reqs: &[u64]) -> Result<()> {
        // (descriptor, bytes received) by request id, for requests sent.
        let mut got: HashMap<u64, (usize, usize)> = HashMap::new();
        let mut next = 0usize;
        let mut open = 0usize;
        loop {
            // A window of requests: their frames never fill the target's socket while it
            // waits for us to take its data.
            while next < reqs.len() && open < READ_WINDOW {
                let d = &self.descs[next];
                let mut p = Vec::with_capacity(32);
                for v in [reqs[next], d.region, d.offset, d.len as u64] {
                    p.extend_from_slice(&v.to_be_bytes());
                }
                self.link
                    .send(STAGED_READ, &[&p])
                    .map_err(|e| Error::peer(self.peer, format!("sending STAGED_READ: {e}")))?;
                got.insert(reqs[next], (next, 0));
                next += 1;
                open += 1;
            }
            if open == 0 {
                return Ok(());
            }
            match self.next()? {
                StagedEvent::Data(p) => {
                    let Some(&mut (i, ref mut at)) = req_of(&p).and_then(|r| got.get_mut(&r))
                    else {
                        continue;
                    };
                    let d = &self.descs[i];
                    let bytes = &p[8..];
                    if *at + bytes.len() > d.len {
                        return Err(Error::Protocol(format!(
                            "{} sent more bytes than a staged READ asked for",
                            self.peer
                        )));
                    }
                    // SAFETY: `prepare` checked `[local, local + len)` against the local
                    // registration, which the caller borrows for the whole transfer, and
                    // only this thread writes the batch's READ bytes into it.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            bytes.as_ptr(),
                            (d.local + *at as u64) as *mut u8,
                            bytes.len(),
                        )
                    };
                    *at += bytes.len();
                }
                StagedEvent::Done(p) => {
                    let Some((i, at)) = req_of(&p).and_then(|r| got.remove(&r)) else {
                        continue;
                    };
                    Refusal::decode(self.peer, &p[8..])?;
                    if at != self.descs[i].len {
                        return Err(Error::Protocol(format!(
                            "{} ended a staged READ after {at} of {} bytes",
                            self.peer, self.descs[i].len
                        )));
                    }
                    open -= 1;
                }
                StagedEvent::Gone | StagedEvent::Cancel => {
                    unreachable!("next() maps Gone and Cancel to errors")
                }
            }
        }
    }

    fn write(&self, reqs: &[u64]) -> Result<()> {
        // Requests whose last frame went out: the target answers each exactly once.
        let mut sent = 0usize;
        let mut answered = 0usize;
        let mut first_error = None;
        let mut stopped = None;
        'descs: for (d, &req) in self.descs.iter().zip(reqs) {
            let mut at = 0usize;
            loop {
                if self.cancelled.load(Ordering::Acquire) {
                    stopped = Some(cancelled());
                } else if Instant::now() >= self.deadline {
                    stopped = Some(expired());
                }
                // Stopping mid-request ends it with an empty last frame.
                let n = if stopped.is_some() {
                    0
                } else {
                    STAGED_CHUNK.min(d.len - at)
                };
                let last = stopped.is_some() || at + n == d.len;
                if stopped.is_some() && at == 0 {
                    // Nothing of this request was sent: nothing to end.
                    break 'descs;
                }
                let mut head = Vec::with_capacity(WRITE_HEADER);
                for v in [req, d.region, d.offset + at as u64] {
                    head.extend_from_slice(&v.to_be_bytes());
                }
                head.push(u8::from(last));
                // SAFETY: `prepare` checked `[local, local + len)` against the local
                // registration, which the caller borrows for the whole transfer.
                let data =
                    unsafe { std::slice::from_raw_parts((d.local + at as u64) as *const u8, n) };
                self.link
                    .send(STAGED_WRITE, &[&head, data])
                    .map_err(|e| Error::peer(self.peer, format!("sending STAGED_WRITE: {e}")))?;
                at += n;
                // Take answers as they come, so that they never back up to the target.
                while let Ok(ev) = self.events.try_recv() {
                    self.take_answer(ev, reqs, &mut answered, &mut first_error)?;
                }
                if last {
                    sent += 1;
                    if stopped.is_some() {
                        break 'descs;
                    }
                    break;
                }
            }
        }
        if let Some(why) = stopped {
            return self.drain(sent - answered, reqs, why);
        }
        while answered < sent {
            match self.next() {
                Ok(ev) => self.take_answer(ev, reqs, &mut answered, &mut first_error)?,
                Err(e @ Error::Peer { .. }) => return Err(e),
                // Past the deadline, or dropped: what was sent must still drain.
                Err(e) => return self.drain(sent - answered, reqs, e),
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Counts a WRITE request's answer and keeps its first refusal; `Err` when the link died.
    fn take_answer(
        &self,
        ev: StagedEvent,
        reqs: &[u64],
        answered: &mut usize,
        first_error: &mut Option<Error>,
    ) -> Result<()> {
        match ev {
            StagedEvent::Done(p) if req_of(&p).is_some_and(|r| reqs.contains(&r)) => {
                *answered += 1;
                if let Err(e) = Refusal::decode(self.peer, &p[8..]) {
                    first_error.get_or_insert(e);
                }
                Ok(())
            }
            StagedEvent::Gone => Err(self.link_gone()),
            _ => Ok(()),
        }
    }

    /// Waits up to `drain_timeout` for `left` more answers to `reqs`, then reports `why`;
    /// a target that does not answer in time is disconnected, so that nothing this batch
    /// sent is applied after the caller heard back.
    fn drain(&self, mut left: usize, reqs: &[u64], why: Error) -> Result<()> {
        let until = Instant::now() + self.drain_timeout;
        while left > 0 {
            match self
                .events
                .recv_timeout(until.saturating_duration_since(Instant::now()))
            {
                Ok(StagedEvent::Done(p)) if req_of(&p).is_some_and(|r| reqs.contains(&r)) => {
                    left -= 1
                }
                Ok(StagedEvent::Gone) => break,
                Ok(_) => {}
                Err(_) => {
                    tracing::warn!(
                        peer = %self.peer,
                        "a peer did not answer a stopped staged WRITE within drain_timeout; \
                         disconnecting it"
                    );
                    self.link.disconnect();
                    break;
                }
            }
        }
        Err(why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> SocketAddr {
        "127.0.0.1:9".parse().unwrap()
    }

    #[test]
    fn a_read_that_finds_no_chunk_free_is_refused_naming_max_staging_bytes() {
        let pool = StagingPool::new(STAGED_CHUNK);
        let memory = AnyMemory::new(hmc_backend_cpu::HostMemory::new());
        let held = pool
            .take_blocking::<1>(&memory, Duration::ZERO)
            .map_err(|_| ())
            .expect("one chunk");
        let bytes = [0u8; 16];
        let region = Region {
            device: Device::HOST,
            addr: bytes.as_ptr() as u64,
            len: bytes.len(),
        };
        let refusal = serve_read(
            &pool,
            &StagedRegion::new(region, Access::READ, memory.clone()),
            0,
            1,
            Duration::from_millis(20),
            |_| unreachable!("no chunk to send from"),
        )
        .unwrap()
        .expect_err("the pool holds one chunk");
        let e = Refusal::decode(peer(), &refusal.encode(5)[8..]).unwrap_err();
        assert!(
            matches!(e, Error::LimitExceeded { limit: "max_staging_bytes", value, max, .. }
                if value == 2 * STAGED_CHUNK as u64 && max == STAGED_CHUNK as u64),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("UcxConfig::max_staging_bytes"),
            "{e}"
        );
        assert_eq!(pool.stats().chunks_held, 1);
        drop(held);
        // The chunk is reused, not allocated again.
        let again = pool
            .take_blocking::<1>(&memory, Duration::ZERO)
            .map_err(|_| ())
            .unwrap();
        assert_eq!(pool.stats().chunks_allocated, 1);
        drop(again);
        assert_eq!(pool.stats().chunks_held, 0);
    }

    #[rstest::rstest]
    #[case::key(Refusal::Key("gone".into()), "invalid remote key: gone")]
    #[case::access(Refusal::Access("read only".into()), "access denied: read only")]
    #[case::bounds(Refusal::Bounds("past the end".into()), "invalid argument: past the end")]
    #[case::copy(Refusal::Copy("hipMemcpy failed".into()), "the device copy at the target failed: hipMemcpy failed")]
    fn a_refusal_reaches_the_initiator_as_its_error(#[case] r: Refusal, #[case] text: &str) {
        let body = r.encode(42);
        assert_eq!(req_of(&body), Some(42));
        let e = Refusal::decode(peer(), &body[8..]).unwrap_err();
        assert!(e.to_string().contains(text), "{e}");
    }

    #[test]
    fn a_malformed_answer_is_a_protocol_error() {
        assert!(Refusal::decode(peer(), &[0]).is_ok());
        for body in [&[][..], &[4, 0, 0][..], &[77][..]] {
            let e = Refusal::decode(peer(), body).unwrap_err();
            assert!(matches!(e, Error::Protocol(_)), "{body:?}: {e:?}");
        }
    }
}
