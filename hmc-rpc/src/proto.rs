//! The sans-IO protocol core: frame parsing and stream reassembly, the request tables,
//! deadlines, in-flight credits, cancel, keepalive and GOAWAY, driven by bytes and `now`.
//!
//! Like `quinn-proto`, nothing here touches a socket or reads a clock: the runtime feeds
//! received bytes with [`ServerConn::handle_input`] / [`ClientConn::handle_input`], takes
//! bytes to send from `pending_tx`/`advance_tx`, asks `poll_timeout` when to call
//! `handle_timeout`, and reacts to events. Every race between cancel, timeout and
//! completion is therefore a deterministic unit test.

use std::any::Any;
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::budget::{Event, HeldBudget, SETTLE_SLACK, SKIPPED_STREAM_COST};
use crate::frame::{
    Flags, FrameError, FrameHeader, FrameKind, FrameLimits, HEADER_LEN, INLINE_MAX, PayloadMode,
    Status, check_payload_crc, encode_frame, payload_crc,
};

/// Hashes the integer keys of the per-call tables (request ids, method ids) with one
/// multiplication instead of SipHash: every call inserts and removes several entries, and
/// SipHash was about 1.5% of the CPU of a pipelined 4 KiB echo (`docs/benchmarks.md`).
/// Hash flooding is not a concern here: these tables hold at most a connection's
/// in-flight calls (`max_inflight`) or the dispatcher's methods, so even ids chosen to
/// collide cost a probe over a few dozen entries.
#[derive(Clone, Copy, Default)]
pub(crate) struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only integer keys use this hasher; stay correct for any other anyway.
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing: an odd multiplier spreads consecutive ids over the low bits
        // (the bucket) and the high bits (hashbrown's tag byte) alike.
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A map keyed by request or method id (see [`IdHasher`]).
pub(crate) type IdMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<IdHasher>>;
/// A set of request ids (see [`IdHasher`]).
pub(crate) type IdSet = HashSet<u64, std::hash::BuildHasherDefault<IdHasher>>;

/// The DATA_PLANE answer of a server without a data plane.
const NO_DATA_PLANE_TEXT: &str = "HMC_BUFFER payloads need a data plane, which this server has not configured; send INLINE or TCP_STREAM";

/// The part of [`NO_DATA_PLANE_TEXT`] a client recognises (it then stops sending HMC_BUFFER
/// on that connection).
pub(crate) const NO_DATA_PLANE_MARK: &str = "which this server has not configured";

/// Limits and timers of one connection, shared by both roles.
#[derive(Clone, Debug)]
pub struct ConnConfig {
    /// Frame and payload size limits.
    pub limits: FrameLimits,
    /// Requests in flight on this connection (`max_inflight_per_conn`, default 64).
    pub max_inflight: usize,
    /// Bytes per DATA chunk of a TCP_STREAM payload (`stream_chunk_len`, default 256 KiB,
    /// the default `max_body_len`: fewer frames and reads per payload; small frames still
    /// overtake between chunks).
    pub chunk_len: usize,
    /// Compute a CRC32C for every DATA chunk sent (`stream_crc`, default false: chunks
    /// carry payload CRC 0, "not computed", and TCP's own checksum applies, as with gRPC).
    /// Received CRCs are always checked when present. Turning this on costs one pass over
    /// large payloads on each side (a 1 MiB echo, 8 in flight: 2–37% more CPU per call in
    /// alternated runs, `docs/benchmarks.md`); frame headers and INLINE bodies always carry
    /// their CRCs.
    pub stream_crc: bool,
    /// Bytes one TCP_STREAM payload sends before the next stream's turn
    /// (`stream_turn_len`, default 1 MiB).
    pub stream_turn_len: usize,
    /// Close after this long with nothing in flight and no call made or answered
    /// (`idle_timeout`, default 60 s; server role). PINGs do not count: a connection that
    /// only pings is idle.
    pub idle_timeout: Duration,
    /// Server role: bytes one connection may make the server hold (`max_conn_held_bytes`,
    /// default 128 MiB): request payloads of its admitted calls until they are answered,
    /// responses queued or streaming out, and the bookkeeping of refused streams still
    /// being skipped (see [`crate::budget`]). A call that would pass it is answered
    /// OVERLOADED.
    pub max_conn_held_bytes: u64,
    /// Server role: stop reading from a connection while this many response bytes wait to
    /// be written to it, streamed bodies included (`max_tx_backlog`, default 8 MiB):
    /// backpressure on a peer that sends requests but does not read its answers.
    pub max_tx_backlog: u64,
    /// Server role: close a connection whose peer has read nothing of its waiting
    /// responses for this long (`write_stall_timeout`, default 30 s).
    pub write_stall_timeout: Duration,
    /// Server role: fail a request whose TCP_STREAM body sends no DATA for this long,
    /// and forget a skipped (refused) stream as quietly (`stream_idle_timeout`, default
    /// 30 s).
    pub stream_idle_timeout: Duration,
    /// Close when a started frame stays incomplete this long (`frame_timeout`, default 10 s).
    pub frame_timeout: Duration,
    /// Client role: send a PING when calls are in flight and nothing arrived for this long
    /// (`keepalive_interval`, default 10 s); the connection is lost when the PONG does not
    /// come within another interval.
    pub keepalive_interval: Duration,
    /// Bounded, adaptive busy-polling (`busy_poll`, default 50 us; zero turns it off).
    /// Right after a message of at most 64 KiB, while a connection waits for exactly one
    /// message (a client's answer to its only call in flight; a server's next request
    /// once it has answered and written all), its task asks the socket directly, yielding
    /// to every other ready task in between, for up to this long before parking on the
    /// poller. An answer that comes within it skips the poller's and the scheduler's
    /// wake-ups: a much shorter one-call round trip on a machine with idle cores, for that
    /// CPU. A client with several small calls in flight (no TCP_STREAM payload under way)
    /// polls for the next answer the same way. When the wait includes an HMC_BUFFER call's data-plane work (the server's READ
    /// and WRITE; the client's use of the response and its next request), the window grows
    /// by that work's expected time at 8 GB/s, up to 500 us. Only one connection per
    /// process polls, and only while no other is inside a window; polling backs off (up to
    /// 4096 waits) when the kernel preempts the poller, when windows run out, or when a
    /// few waits that park now and then prove faster (compared by medians). A connection
    /// without traffic never polls.
    pub busy_poll: Duration,
}

impl Default for ConnConfig {
    fn default() -> Self {
        ConnConfig {
            limits: FrameLimits::default(),
            max_inflight: 64,
            chunk_len: 256 * 1024,
            stream_turn_len: 1 << 20,
            stream_crc: false,
            idle_timeout: Duration::from_secs(60),
            max_conn_held_bytes: 128 << 20,
            max_tx_backlog: 8 << 20,
            write_stall_timeout: Duration::from_secs(30),
            stream_idle_timeout: Duration::from_secs(30),
            frame_timeout: Duration::from_secs(10),
            keepalive_interval: Duration::from_secs(10),
            busy_poll: Duration::from_micros(50),
        }
    }
}

/// What a [`StreamSink`] made of a streamed payload: the runtime downcasts it to the type
/// its sink produces (a device buffer), or the reason staging failed.
pub type StagedPayload = Result<Box<dyn Any + Send>, hmc_core::Error>;

/// Where a TCP_STREAM payload goes, chunk by chunk as its DATA frames arrive, instead of a
/// reassembled host buffer: a device-resident payload is copied to the device while the
/// kernel already receives the next chunk.
///
/// A sink keeps its first error and reports it from [`StreamSink::finish`]; the protocol
/// goes on reading the stream either way, so the connection stays in step.
pub trait StreamSink: Send {
    /// Takes the payload bytes at `offset` (chunks arrive in order, without gaps).
    fn write(&mut self, offset: u64, bytes: &[u8]);
    /// Every byte arrived: the product, or the first error.
    fn finish(self: Box<Self>) -> StagedPayload;
}

/// A complete message: the first frame's header and the reassembled payload (empty when a
/// sink took the bytes; its product is `staged`).
struct Message {
    header: FrameHeader,
    payload: Bytes,
    staged: Option<StagedPayload>,
}

struct InStream {
    header: FrameHeader,
    buf: Vec<u8>,
    /// Takes the bytes instead of `buf`.
    sink: Option<Box<dyn StreamSink>>,
    /// Running CRC32C of the payload when a sink takes it and the header carries a CRC.
    crc: u32,
    /// Data is read and dropped (refused or abandoned request).
    discard: bool,
    received: u64,
    /// When the header or the last DATA chunk arrived (`stream_idle_timeout`).
    last_data: Instant,
}

struct OutStream {
    header: FrameHeader,
    /// Payload bytes ready to send, in order: the whole payload, or the pieces a producer
    /// has fed so far (see [`Framing::feed`]).
    pieces: VecDeque<Bytes>,
    /// Payload length announced in the header.
    total: usize,
    sent: usize,
    /// Bytes this stream may still send before the next stream's turn.
    turn_left: usize,
}

/// Parsing, reassembly and transmit scheduling shared by both roles.
struct Framing {
    cfg: ConnConfig,
    inbuf: Vec<u8>,
    in_pos: usize,
    partial_since: Option<Instant>,
    streams_in: IdMap<u64, InStream>,
    /// Bytes to send, in order: small frames coalesced into owned buffers, stream chunks
    /// as zero-copy slices of their payload.
    tx: VecDeque<Bytes>,
    /// Small frames being coalesced; moved to `tx` before anything else is queued.
    tx_small: Vec<u8>,
    /// Bytes of `tx.front()` already written.
    tx_pos: usize,
    streams_out: VecDeque<OutStream>,
    last_rx: Instant,
    /// End of the received bytes in `inbuf` (the rest is spare, zeroed space).
    in_end: usize,
    /// The DATA chunk whose body is being read straight into its stream's buffer.
    direct: Option<DirectBody>,
    /// The last frame belonged to a large stream: the next read takes one header only, so
    /// that the body after it can be read in place instead of through `inbuf`.
    header_first: bool,
    /// What the last [`Framing::read_target`] or [`Framing::input_space`] handed out.
    target: TargetKind,
    /// Bytes written so far (for the write-stall check).
    tx_written: u64,
}

/// A DATA chunk being received straight into its stream's reassembly buffer (the socket
/// copies the body there once; nothing copies it again).
struct DirectBody {
    header: FrameHeader,
    /// Where the chunk starts in the stream's buffer.
    start: usize,
    /// Body bytes still to come.
    left: usize,
}

/// DATA bodies from this many bytes are read in place when their stream reassembles into
/// host memory; smaller ones go through the input buffer.
const DIRECT_MIN: usize = 16 * 1024;

#[derive(Clone, Copy, PartialEq, Eq)]
enum TargetKind {
    Input,
    Append,
}

/// Where the runtime's next read should put the bytes (from `read_target`); report how
/// many arrived with `handle_read`.
pub enum ReadTarget<'a> {
    /// Into this spare input space.
    Input(&'a mut [u8]),
    /// Appended to this buffer, at most this many bytes: the rest of a DATA chunk, read
    /// straight into its payload's reassembly buffer (the buffer has the capacity).
    Append(&'a mut Vec<u8>, usize),
}

enum Parsed {
    /// A frame whose body is `inbuf[range]` until the next `push_input`.
    Frame(FrameHeader, std::ops::Range<usize>),
    /// A DATA chunk read in place is complete; its body starts at this offset of its
    /// stream's buffer.
    DirectDone(FrameHeader, usize),
    Need,
}

impl Framing {
    fn new(cfg: ConnConfig, now: Instant) -> Self {
        Framing {
            cfg,
            inbuf: Vec::new(),
            in_pos: 0,
            partial_since: None,
            streams_in: IdMap::default(),
            tx: VecDeque::new(),
            tx_small: Vec::new(),
            tx_pos: 0,
            streams_out: VecDeque::new(),
            last_rx: now,
            in_end: 0,
            direct: None,
            header_first: false,
            target: TargetKind::Input,
            tx_written: 0,
        }
    }

    /// Spare space at the end of the input buffer, at least `min` bytes, for a read
    /// straight into it (see [`Framing::commit_input`]).
    fn input_space(&mut self, min: usize) -> &mut [u8] {
        self.target = TargetKind::Input;
        if self.in_pos == self.in_end {
            self.in_pos = 0;
            self.in_end = 0;
        } else if self.in_pos > 0 && self.inbuf.len() - self.in_end < min {
            self.inbuf.copy_within(self.in_pos..self.in_end, 0);
            self.in_end -= self.in_pos;
            self.in_pos = 0;
        }
        if self.inbuf.is_empty() {
            self.inbuf = crate::input_pool::take(min);
        }
        if self.inbuf.len() - self.in_end < min {
            self.inbuf.resize(self.in_end + min, 0);
        }
        &mut self.inbuf[self.in_end..]
    }

    /// Gives the input buffer back to the shared pool when no received byte waits in it
    /// (see [`crate::input_pool`]); the next read takes one again.
    fn release_input(&mut self) {
        if self.in_pos == self.in_end && self.direct.is_none() && !self.inbuf.is_empty() {
            self.in_pos = 0;
            self.in_end = 0;
            crate::input_pool::give(std::mem::take(&mut self.inbuf));
        }
    }

    /// Where the next read goes: the rest of a DATA body read in place, one header after
    /// a large stream's frame, or up to `max` bytes of input space.
    fn read_target(&mut self, max: usize) -> ReadTarget<'_> {
        if let Some(d) = &self.direct
            && d.left > 0
        {
            let (id, left) = (d.header.request_id, d.left);
            if self
                .streams_in
                .get(&id)
                .is_some_and(|s| !s.discard && s.sink.is_none())
            {
                self.target = TargetKind::Append;
                let s = self.streams_in.get_mut(&id).expect("checked above");
                return ReadTarget::Append(&mut s.buf, left);
            }
            // The stream was abandoned meanwhile: read the rest and drop it.
            let n = left.min(max);
            return ReadTarget::Input(&mut self.input_space(n)[..n]);
        }
        let n = if self.header_first && self.in_pos == self.in_end {
            HEADER_LEN
        } else {
            max
        };
        ReadTarget::Input(&mut self.input_space(n)[..n])
    }

    /// `n` bytes arrived where the last `read_target`/`input_space` said.
    fn commit_read(&mut self, n: usize, now: Instant) {
        match self.target {
            TargetKind::Input => self.commit_input(n, now),
            TargetKind::Append => {
                if n > 0 {
                    self.last_rx = now;
                }
                if let Some(d) = &mut self.direct {
                    d.left -= n.min(d.left);
                }
            }
        }
    }

    fn commit_input(&mut self, n: usize, now: Instant) {
        if n > 0 {
            self.last_rx = now;
        }
        self.in_end = (self.in_end + n).min(self.inbuf.len());
        self.drain_into_direct();
    }

    fn push_input(&mut self, bytes: &[u8], now: Instant) {
        self.input_space(bytes.len())[..bytes.len()].copy_from_slice(bytes);
        self.commit_input(bytes.len(), now);
    }

    /// Moves input bytes that belong to the body being read in place into its stream
    /// (dropped when the stream was abandoned meanwhile).
    fn drain_into_direct(&mut self) {
        let Some(d) = &mut self.direct else {
            return;
        };
        let k = d.left.min(self.in_end - self.in_pos);
        if k == 0 {
            return;
        }
        if let Some(s) = self.streams_in.get_mut(&d.header.request_id)
            && !s.discard
            && s.sink.is_none()
        {
            s.buf
                .extend_from_slice(&self.inbuf[self.in_pos..self.in_pos + k]);
        }
        self.in_pos += k;
        d.left -= k;
    }

    /// Starts reading the body of the DATA frame `h` (its header parsed, its body not
    /// complete in `inbuf`) in place, when its stream reassembles into host memory and
    /// the frame is consistent with it (otherwise it is parsed whole, which reports the
    /// problem). Returns whether it did.
    fn start_direct(&mut self, h: &FrameHeader) -> bool {
        let body_len = h.body_len as usize;
        if h.kind != FrameKind::Data || body_len < DIRECT_MIN {
            return false;
        }
        let Some(s) = self.streams_in.get_mut(&h.request_id) else {
            return false;
        };
        let after = s.received + body_len as u64;
        if s.discard
            || s.sink.is_some()
            || h.payload_len != s.header.payload_len
            || after > s.header.payload_len
            || h.flags.contains(Flags::END) != (after == s.header.payload_len)
        {
            return false;
        }
        s.buf.reserve(body_len);
        let start = s.buf.len();
        self.in_pos += HEADER_LEN;
        self.direct = Some(DirectBody {
            header: *h,
            start,
            left: body_len,
        });
        self.drain_into_direct();
        true
    }

    fn next_frame(&mut self, now: Instant) -> Result<Parsed, FrameError> {
        if let Some(d) = &self.direct {
            if d.left > 0 {
                self.partial_since.get_or_insert(now);
                return Ok(Parsed::Need);
            }
            let d = self.direct.take().expect("checked above");
            self.partial_since = None;
            self.mark_partial(now);
            return Ok(Parsed::DirectDone(d.header, d.start));
        }
        let avail = &self.inbuf[self.in_pos..self.in_end];
        if avail.len() < HEADER_LEN {
            self.mark_partial(now);
            return Ok(Parsed::Need);
        }
        let h = FrameHeader::decode(&avail[..HEADER_LEN], &self.cfg.limits)?;
        let total = HEADER_LEN + h.body_len as usize;
        self.header_first = if h.kind == FrameKind::Data {
            h.body_len as usize >= DIRECT_MIN
        } else {
            h.mode == PayloadMode::TcpStream && h.payload_len >= DIRECT_MIN as u64
        };
        if avail.len() < total {
            if self.start_direct(&h) {
                self.partial_since = None;
                return self.next_frame(now);
            }
            self.mark_partial(now);
            return Ok(Parsed::Need);
        }
        let body = self.in_pos + HEADER_LEN..self.in_pos + total;
        self.in_pos += total;
        self.partial_since = None;
        self.mark_partial(now);
        Ok(Parsed::Frame(h, body))
    }

    fn mark_partial(&mut self, now: Instant) {
        if self.in_pos < self.in_end {
            self.partial_since.get_or_insert(now);
        } else {
            self.partial_since = None;
        }
    }

    fn stall_deadline(&self) -> Option<Instant> {
        self.partial_since.map(|t| t + self.cfg.frame_timeout)
    }

    /// Queues a control or inline frame ahead of any stream chunk not yet scheduled.
    fn send_frame(&mut self, h: &FrameHeader, body: &[u8]) {
        encode_frame(&mut self.tx_small, h, body);
    }

    fn flush_small(&mut self) {
        if !self.tx_small.is_empty() {
            let b = std::mem::take(&mut self.tx_small);
            self.tx.push_back(Bytes::from(b));
        }
    }

    /// Queues a REQUEST/RESPONSE with its payload, INLINE or as a TCP_STREAM.
    fn send_message(&mut self, mut h: FrameHeader, payload: Bytes) {
        h.payload_len = payload.len() as u64;
        if payload.len() <= INLINE_MAX {
            h.payload_crc = payload_crc(&payload);
            h.mode = PayloadMode::Inline;
            h.body_len = payload.len() as u32;
            self.send_frame(&h, &payload);
        } else {
            // A whole-payload CRC would cost a second pass over the bytes on both sides, so
            // the header frame says "not computed" (DATA chunks carry theirs when
            // `stream_crc` is set).
            h.payload_crc = 0;
            h.mode = PayloadMode::TcpStream;
            h.body_len = 0;
            self.send_frame(&h, &[]);
            let total = payload.len();
            self.streams_out.push_back(OutStream {
                header: h,
                pieces: VecDeque::from([payload]),
                total,
                sent: 0,
                turn_left: self.cfg.stream_turn_len,
            });
        }
    }

    /// Queues the header of a `total`-byte TCP_STREAM message whose bytes a producer feeds
    /// later, piece by piece, with [`Framing::feed`] (a device payload staged in chunks).
    /// `total` must exceed [`INLINE_MAX`].
    fn send_message_fed(&mut self, mut h: FrameHeader, total: usize) {
        debug_assert!(
            total > INLINE_MAX,
            "fed streams are for TCP_STREAM payloads"
        );
        h.payload_len = total as u64;
        h.payload_crc = 0;
        h.mode = PayloadMode::TcpStream;
        h.body_len = 0;
        self.send_frame(&h, &[]);
        self.streams_out.push_back(OutStream {
            header: h,
            pieces: VecDeque::new(),
            total,
            sent: 0,
            turn_left: self.cfg.stream_turn_len,
        });
    }

    /// Appends the next piece of a fed stream. False (and the piece dropped) when the
    /// stream is gone (cancelled, answered, connection closing) or the piece would pass
    /// the announced length.
    fn feed(&mut self, request_id: u64, piece: Bytes) -> bool {
        let Some(s) = self
            .streams_out
            .iter_mut()
            .find(|s| s.header.request_id == request_id)
        else {
            return false;
        };
        let queued: usize = s.pieces.iter().map(Bytes::len).sum();
        if s.sent + queued + piece.len() > s.total {
            tracing::warn!(
                request_id,
                "a producer fed more bytes than its stream announced; piece dropped"
            );
            return false;
        }
        if !piece.is_empty() {
            s.pieces.push_back(piece);
        }
        true
    }

    fn drop_out_stream(&mut self, request_id: u64) {
        self.streams_out
            .retain(|s| s.header.request_id != request_id);
    }

    /// Moves queued small frames, then (when nothing else waits) the next round of stream
    /// chunks into `tx`. Chunks are scheduled a few at a time, round robin, so control
    /// frames and small messages queued meanwhile overtake a large payload.
    fn refill(&mut self) {
        self.flush_small();
        if self.tx.is_empty() {
            self.schedule_chunks();
        }
    }

    /// The next contiguous bytes to write (empty when nothing is queued).
    fn pending_tx(&mut self) -> &[u8] {
        if self.tx.is_empty() {
            self.refill();
        }
        match self.tx.front() {
            Some(b) => &b[self.tx_pos..],
            None => &[],
        }
    }

    /// Fills `out` with the queued bytes for a vectored write; returns how many slices.
    fn tx_slices<'a>(&'a mut self, out: &mut [std::io::IoSlice<'a>]) -> usize {
        self.refill();
        let mut n = 0;
        for (i, b) in self.tx.iter().enumerate() {
            if n == out.len() {
                break;
            }
            let from = if i == 0 { self.tx_pos } else { 0 };
            out[n] = std::io::IoSlice::new(&b[from..]);
            n += 1;
        }
        n
    }

    fn schedule_chunks(&mut self) {
        // A few chunks per refill keep syscalls large. Streams take turns of
        // `stream_turn_len` bytes: a payload of up to one turn completes without waiting
        // for the others (so its answer can start while later ones still arrive), and a
        // huge payload cannot hold back the rest for longer than one turn. Small frames
        // overtake between refills regardless. A fed stream whose next piece has not
        // been produced yet steps aside.
        let mut budget = 4;
        let mut waiting = 0;
        while budget > 0 && waiting < self.streams_out.len() {
            let Some(mut s) = self.streams_out.pop_front() else {
                return;
            };
            let Some(piece) = s.pieces.front_mut() else {
                self.streams_out.push_back(s);
                waiting += 1;
                continue;
            };
            waiting = 0;
            let n = piece
                .len()
                .min(self.cfg.chunk_len)
                .min(self.cfg.limits.max_body_len as usize)
                .max(1);
            let chunk = piece.split_to(n);
            if piece.is_empty() {
                s.pieces.pop_front();
            }
            let mut h = s.header;
            h.kind = FrameKind::Data;
            h.mode = PayloadMode::TcpStream;
            h.body_len = n as u32;
            h.payload_crc = if self.cfg.stream_crc {
                payload_crc(&chunk)
            } else {
                0
            };
            h.deadline_us = 0;
            h.payload_len = s.total as u64;
            s.sent += n;
            if s.sent == s.total {
                h.flags = h.flags | Flags::END;
            }
            self.tx.push_back(Bytes::copy_from_slice(&h.encode()));
            self.tx.push_back(chunk);
            s.turn_left = s.turn_left.saturating_sub(n);
            if s.sent < s.total {
                if s.turn_left == 0 {
                    s.turn_left = self.cfg.stream_turn_len;
                    self.streams_out.push_back(s);
                } else {
                    self.streams_out.push_front(s);
                }
            }
            budget -= 1;
        }
    }

    fn advance_tx(&mut self, mut n: usize) {
        self.tx_written += n as u64;
        while n > 0 {
            let Some(front) = self.tx.front() else {
                return;
            };
            let left = front.len() - self.tx_pos;
            if n < left {
                self.tx_pos += n;
                return;
            }
            n -= left;
            self.tx.pop_front();
            self.tx_pos = 0;
        }
    }

    fn has_tx(&self) -> bool {
        !self.tx.is_empty()
            || !self.tx_small.is_empty()
            || self.streams_out.iter().any(|s| !s.pieces.is_empty())
    }

    /// Bytes queued in `tx` (not counting streams not yet scheduled).
    fn queued_len(&self) -> usize {
        self.tx.iter().map(|b| b.len()).sum::<usize>() - self.tx_pos + self.tx_small.len()
    }

    /// Bytes waiting to go out: queued frames and chunks, and the unscheduled rest of every
    /// outgoing stream (a fed stream's whole announced remainder, produced or not).
    fn tx_held(&self) -> u64 {
        let streams: usize = self.streams_out.iter().map(|s| s.total - s.sent).sum();
        (self.queued_len() + streams) as u64
    }

    /// Streams whose DATA is read and dropped.
    fn skipped_streams(&self) -> usize {
        self.streams_in.values().filter(|s| s.discard).count()
    }

    /// Starts reassembly of a TCP_STREAM payload (into `sink` when one is given).
    fn open_in_stream(
        &mut self,
        header: FrameHeader,
        discard: bool,
        sink: Option<Box<dyn StreamSink>>,
        now: Instant,
    ) {
        let cap = if discard || sink.is_some() {
            0
        } else {
            header.payload_len.min(1 << 20) as usize
        };
        self.streams_in.insert(
            header.request_id,
            InStream {
                header,
                buf: Vec::with_capacity(cap),
                sink: if discard { None } else { sink },
                crc: 0,
                discard,
                received: 0,
                last_data: now,
            },
        );
    }

    /// The body of a parsed frame, copied out of the input buffer.
    fn body(&self, range: std::ops::Range<usize>) -> Bytes {
        Bytes::copy_from_slice(&self.inbuf[range])
    }

    /// Feeds one DATA frame (its body still in the input buffer, appended to the stream
    /// without an intermediate copy); returns the complete message when END arrives.
    fn data_frame(
        &mut self,
        h: FrameHeader,
        range: std::ops::Range<usize>,
    ) -> Result<Option<Message>, String> {
        let body = &self.inbuf[range];
        let Some(s) = self.streams_in.get_mut(&h.request_id) else {
            return Err(format!(
                "DATA frame for request {} which has no open stream",
                h.request_id
            ));
        };
        check_payload_crc(h.request_id, h.payload_crc, body).map_err(|e| e.to_string())?;
        if h.payload_len != s.header.payload_len {
            return Err(format!(
                "DATA frame of request {} announces {} payload bytes, its header frame {}",
                h.request_id, h.payload_len, s.header.payload_len
            ));
        }
        let offset = s.received;
        s.received += body.len() as u64;
        if s.received > s.header.payload_len {
            return Err(format!(
                "request {}: DATA beyond the announced {} payload bytes",
                h.request_id, s.header.payload_len
            ));
        }
        if !s.discard {
            match &mut s.sink {
                Some(sink) => {
                    if s.header.payload_crc != 0 {
                        s.crc = crate::frame::crc32c_append(s.crc, body);
                    }
                    sink.write(offset, body);
                }
                None => s.buf.extend_from_slice(body),
            }
        }
        self.end_of_chunk(h)
    }

    /// Ends a DATA chunk read in place ([`Parsed::DirectDone`]): checks its CRC and
    /// returns the complete message when it was the last.
    fn direct_done(&mut self, h: FrameHeader, start: usize) -> Result<Option<Message>, String> {
        let Some(s) = self.streams_in.get_mut(&h.request_id) else {
            return Ok(None); // dropped meanwhile
        };
        if !s.discard {
            check_payload_crc(h.request_id, h.payload_crc, &s.buf[start..])
                .map_err(|e| e.to_string())?;
        }
        // `start_direct` checked the length and END against the stream.
        s.received += u64::from(h.body_len);
        self.end_of_chunk(h)
    }

    /// After a DATA chunk's bytes went to its stream: checks END against the count and
    /// returns the complete message when END arrives.
    fn end_of_chunk(&mut self, h: FrameHeader) -> Result<Option<Message>, String> {
        let s = self.streams_in.get_mut(&h.request_id).expect("present");
        // The chunk arrived with the last read.
        s.last_data = self.last_rx;
        let end = h.flags.contains(Flags::END);
        let full = s.received == s.header.payload_len;
        if end != full {
            return Err(format!(
                "request {}: END flag {} after {} of {} payload bytes",
                h.request_id,
                if end { "set" } else { "missing" },
                s.received,
                s.header.payload_len
            ));
        }
        if !end {
            return Ok(None);
        }
        let s = self.streams_in.remove(&h.request_id).expect("present");
        if s.discard {
            return Ok(None);
        }
        let staged = match s.sink {
            Some(sink) => {
                let got = if s.crc == 0 { u32::MAX } else { s.crc };
                if s.header.payload_crc != 0 && got != s.header.payload_crc {
                    return Err(FrameError::PayloadCrc {
                        request_id: h.request_id,
                        want: s.header.payload_crc,
                        got,
                    }
                    .to_string());
                }
                Some(sink.finish())
            }
            None => {
                check_payload_crc(h.request_id, s.header.payload_crc, &s.buf)
                    .map_err(|e| e.to_string())?;
                None
            }
        };
        Ok(Some(Message {
            header: s.header,
            payload: Bytes::from(s.buf),
            staged,
        }))
    }
}

fn goaway(status: Status, reason: &str) -> (FrameHeader, Vec<u8>) {
    let body = reason.as_bytes()[..reason.len().min(1024)].to_vec();
    let mut h = FrameHeader::new(FrameKind::GoAway, 0);
    h.status = status;
    h.body_len = body.len() as u32;
    h.payload_len = body.len() as u64;
    (h, body)
}

fn budget_us(deadline: Instant, now: Instant) -> u32 {
    let us = deadline.saturating_duration_since(now).as_micros();
    us.clamp(1, u128::from(u32::MAX)) as u32
}

// ------------------------------------------------------------------------------------------
// Server role
// ------------------------------------------------------------------------------------------

/// A call the runtime should run.
#[derive(Clone, Debug)]
pub struct IncomingCall {
    /// Request id (unique on this connection while in flight).
    pub request_id: u64,
    /// Method id.
    pub method_id: u32,
    /// The request payload; for [`PayloadMode::HmcBuffer`], the data-plane descriptor
    /// (the payload itself is pulled one-sided, see `docs/protocol.md`).
    pub payload: Bytes,
    /// How the payload travelled: INLINE, TCP_STREAM (both reassembled into `payload`) or
    /// HMC_BUFFER (`payload` is the descriptor).
    pub mode: PayloadMode,
    /// The payload length the header announced.
    pub payload_len: u64,
    /// Absolute deadline, if the client sent a budget.
    pub deadline: Option<Instant>,
    /// No response is wanted.
    pub one_way: bool,
}

/// What the server core asks of its runtime.
#[derive(Clone, Debug)]
pub enum ServerEvent {
    /// Run this call, then [`ServerConn::respond`].
    Call(IncomingCall),
    /// The call was cancelled or its deadline passed; it has been answered already. Signal
    /// the handler to stop; its result will be dropped.
    Abandon {
        /// The request.
        request_id: u64,
        /// CANCELLED or DEADLINE_EXCEEDED.
        why: Status,
    },
}

struct ServerInFlight {
    deadline: Option<Instant>,
    one_way: bool,
    /// Still receiving its TCP_STREAM payload.
    receiving: bool,
    /// Request bytes charged to the connection until the call is answered.
    held: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum ServerState {
    Open,
    /// GOAWAY(SHUTTING_DOWN) sent: new requests are answered SHUTTING_DOWN.
    Draining,
    /// A GOAWAY closing the connection is queued; close once it is written.
    Closing(String),
}

/// After a peer's FIN, how often the server checks with a PING that the peer is still
/// there while calls run (see [`ServerConn::handle_eof`]).
const PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// Chooses a [`StreamSink`] for a streamed request from its method id and payload length
/// (`None`: reassemble in host memory).
pub type SinkFactory = Box<dyn FnMut(u32, u64) -> Option<Box<dyn StreamSink>> + Send>;

/// The server side of one connection.
pub struct ServerConn {
    f: Framing,
    inflight: IdMap<u64, ServerInFlight>,
    deadlines: BTreeSet<(Instant, u64)>,
    events: VecDeque<ServerEvent>,
    state: ServerState,
    /// HMC_BUFFER requests are passed to the runtime (it has a data plane).
    hmc_buffer: bool,
    sinks: Option<SinkFactory>,
    /// What sinks made of the requests of calls handed to the runtime, until it takes them.
    staged: IdMap<u64, StagedPayload>,
    /// The process-wide budget this connection settles its held bytes with.
    budget: Arc<HeldBudget>,
    /// Request bytes of admitted calls not yet answered.
    req_held: u64,
    /// Held bytes as last settled with `budget`.
    settled: u64,
    /// The last call activity (a REQUEST, DATA or CANCEL received, an answer queued): the
    /// idle timeout counts from here, so PINGs alone do not keep a connection.
    last_activity: Instant,
    /// The peer closed its sending side: answer what was received, then close.
    peer_closed: bool,
    /// After the peer's FIN, with calls still running: when to send the next PING that
    /// finds out whether the peer still reads (a vanished peer answers it with a reset,
    /// and the runtime's next write fails).
    next_probe: Option<Instant>,
    /// Bytes written as of the instant: the write-stall clock.
    tx_progress: (u64, Instant),
}

impl ServerConn {
    /// A new connection accepted at `now`, with a process budget of its own (no limit
    /// beyond `max_conn_held_bytes`).
    pub fn new(cfg: ConnConfig, now: Instant) -> Self {
        Self::with_budget(cfg, now, Arc::new(HeldBudget::default()))
    }

    /// A new connection accepted at `now` that charges what it holds to `budget`, shared
    /// with the server's other connections (see [`crate::budget`]).
    pub fn with_budget(cfg: ConnConfig, now: Instant, budget: Arc<HeldBudget>) -> Self {
        ServerConn {
            f: Framing::new(cfg, now),
            inflight: IdMap::default(),
            deadlines: BTreeSet::new(),
            events: VecDeque::new(),
            state: ServerState::Open,
            hmc_buffer: false,
            sinks: None,
            staged: IdMap::default(),
            budget,
            req_held: 0,
            settled: 0,
            last_activity: now,
            peer_closed: false,
            next_probe: None,
            tx_progress: (0, now),
        }
    }

    /// Bytes this connection makes the server hold now: admitted requests until answered,
    /// responses waiting to be written (streamed bodies whole), skipped streams' entries.
    pub fn held_bytes(&self) -> u64 {
        self.req_held + self.f.tx_held() + self.f.skipped_streams() as u64 * SKIPPED_STREAM_COST
    }

    /// Response bytes waiting to be written (queued frames and the rest of every outgoing
    /// stream).
    pub fn tx_backlog(&self) -> u64 {
        self.f.tx_held()
    }

    /// Whether the runtime should read from the socket now: not closing, the peer has not
    /// closed its side, and the answers waiting for it are under `max_tx_backlog`.
    pub fn may_read(&self) -> bool {
        !self.peer_closed
            && !matches!(self.state, ServerState::Closing(_))
            && self.f.tx_held() < self.f.cfg.max_tx_backlog
    }

    /// Books what changed since the last turn: settles the held bytes with the process
    /// budget (in steps of [`SETTLE_SLACK`]) and restarts the write-stall clock when bytes
    /// were written or nothing waits. The runtime calls it once per turn of its loop,
    /// after writing.
    pub fn settle(&mut self, now: Instant) {
        let held = self.held_bytes();
        if held.abs_diff(self.settled) >= SETTLE_SLACK || (held == 0 && self.settled != 0) {
            self.budget.settle(self.settled, held);
            self.settled = held;
        }
        let written = self.f.tx_written;
        if written != self.tx_progress.0 || !self.f.has_tx() {
            self.tx_progress = (written, now);
        }
    }

    /// The peer closed its sending side (a read returned 0). Calls already received are
    /// still answered; request bodies still arriving can never complete and are failed.
    /// Once [`ServerConn::finished`], close the connection.
    pub fn handle_eof(&mut self, now: Instant) {
        if self.peer_closed {
            return;
        }
        self.peer_closed = true;
        // A partial frame can never complete either.
        self.f.in_pos = self.f.in_end;
        self.f.partial_since = None;
        if matches!(self.state, ServerState::Closing(_)) {
            return;
        }
        if !self.inflight.is_empty() || self.f.has_tx() {
            self.budget.bump(Event::HalfClosed);
        }
        let ids: Vec<u64> = self.f.streams_in.keys().copied().collect();
        for id in ids {
            self.f.streams_in.remove(&id);
            self.abandon(
                id,
                Status::CANCELLED,
                "the client closed its sending side before this request's body was complete",
            );
        }
        self.last_activity = now;
        self.next_probe = Some(now + PROBE_INTERVAL);
    }

    /// Gives the input buffer back to a pool shared by all connections when no received
    /// byte waits in it: call it before waiting for the socket, so that a quiet connection
    /// holds no input buffer.
    pub fn release_input(&mut self) {
        self.f.release_input();
    }

    /// True once the peer closed its side and every call it sent is answered and written.
    pub fn finished(&self) -> bool {
        self.peer_closed && self.inflight.is_empty() && !self.f.has_tx()
    }

    /// Streams the requests `factory` picks into its sinks instead of host memory (the
    /// runtime's device methods). A call so received comes with an empty payload; take its
    /// sink's product with [`ServerConn::take_staged`].
    pub fn set_sink_factory(&mut self, factory: SinkFactory) {
        self.sinks = Some(factory);
    }

    /// The sink's product for a call's request (once; `None` if it was reassembled in host
    /// memory).
    pub fn take_staged(&mut self, request_id: u64) -> Option<StagedPayload> {
        self.staged.remove(&request_id)
    }

    /// Passes HMC_BUFFER requests to the runtime as calls (their payload is the
    /// descriptor) instead of answering them DATA_PLANE: the runtime has a data plane.
    pub fn enable_hmc_buffer(&mut self) {
        self.hmc_buffer = true;
    }

    /// Feeds received bytes.
    pub fn handle_input(&mut self, bytes: &[u8], now: Instant) {
        if matches!(self.state, ServerState::Closing(_)) {
            return;
        }
        self.f.push_input(bytes, now);
        self.process_input(now);
    }

    /// `n` bytes were read where [`ServerConn::read_target`] or [`ServerConn::input_space`]
    /// said.
    pub fn handle_read(&mut self, n: usize, now: Instant) {
        if matches!(self.state, ServerState::Closing(_)) {
            return;
        }
        self.f.commit_read(n, now);
        self.process_input(now);
    }

    fn process_input(&mut self, now: Instant) {
        loop {
            match self.f.next_frame(now) {
                Ok(Parsed::Need) => break,
                Ok(Parsed::DirectDone(h, start)) => {
                    let r = self
                        .f
                        .direct_done(h, start)
                        .map(|m| self.on_stream_message(m));
                    if let Err(why) = r {
                        self.close(Status::PROTOCOL, &why);
                        break;
                    }
                }
                Ok(Parsed::Frame(h, body)) => {
                    if let Err(why) = self.on_frame(h, body, now) {
                        self.close(Status::PROTOCOL, &why);
                        break;
                    }
                    if matches!(self.state, ServerState::Closing(_)) {
                        break;
                    }
                }
                Err(e) => {
                    self.close(Status::PROTOCOL, &e.to_string());
                    break;
                }
            }
        }
    }

    fn on_frame(
        &mut self,
        h: FrameHeader,
        range: std::ops::Range<usize>,
        now: Instant,
    ) -> Result<(), String> {
        if matches!(
            h.kind,
            FrameKind::Request | FrameKind::Data | FrameKind::Cancel
        ) {
            self.last_activity = now;
        }
        if h.kind == FrameKind::Data {
            return self.on_data(h, range);
        }
        let body = self.f.body(range);
        match h.kind {
            FrameKind::Request => self.on_request(h, body, now),
            FrameKind::Data => unreachable!("handled above"),
            FrameKind::Cancel => {
                self.abandon(h.request_id, Status::CANCELLED, "cancelled by the client");
                // The client sends no DATA for a call after cancelling it (frames queued
                // before the CANCEL arrived before it), so a half-received request's
                // stream is done with.
                self.f.streams_in.remove(&h.request_id);
                Ok(())
            }
            FrameKind::Ping => {
                let pong = FrameHeader::new(FrameKind::Pong, h.request_id);
                self.f.send_frame(&pong, &[]);
                Ok(())
            }
            FrameKind::Pong => Ok(()),
            FrameKind::GoAway => {
                let reason = String::from_utf8_lossy(&body).into_owned();
                tracing::debug!(%reason, "client sent GOAWAY");
                self.state = ServerState::Closing(format!("client went away: {reason}"));
                Ok(())
            }
            FrameKind::Response => Err("a client sent a RESPONSE frame".into()),
        }
    }

    fn on_data(&mut self, h: FrameHeader, range: std::ops::Range<usize>) -> Result<(), String> {
        let m = self.f.data_frame(h, range)?;
        self.on_stream_message(m);
        Ok(())
    }

    /// A streamed request is complete (`Some`): pass it on as a call.
    fn on_stream_message(&mut self, m: Option<Message>) {
        if let Some(m) = m {
            let id = m.header.request_id;
            if let Some(e) = self.inflight.get_mut(&id) {
                e.receiving = false;
                if let Some(staged) = m.staged {
                    self.staged.insert(id, staged);
                }
                let call = IncomingCall {
                    request_id: id,
                    method_id: m.header.method_id,
                    mode: PayloadMode::TcpStream,
                    payload_len: m.header.payload_len,
                    payload: m.payload,
                    deadline: e.deadline,
                    one_way: e.one_way,
                };
                self.events.push_back(ServerEvent::Call(call));
            }
        }
    }

    fn on_request(&mut self, h: FrameHeader, body: Bytes, now: Instant) -> Result<(), String> {
        let id = h.request_id;
        if self.inflight.contains_key(&id) || self.f.streams_in.contains_key(&id) {
            return Err(format!("duplicate request id {id} while it is in flight"));
        }
        let streaming = h.mode == PayloadMode::TcpStream;
        let refuse = |me: &mut Self, status: Status, why: &str| {
            if streaming {
                // A refused body is still read (and dropped) to keep the connection in
                // step; each such stream costs an entry, so they are bounded like calls.
                let skipped = me.f.skipped_streams();
                if skipped >= me.f.cfg.max_inflight {
                    me.budget.bump(Event::ClosedSkippedStreams);
                    let why = format!(
                        "limit `max_inflight_per_conn` ({}) reached by refused request bodies still unfinished; send or CANCEL their DATA before new calls",
                        me.f.cfg.max_inflight
                    );
                    me.close(Status::OVERLOADED, &why);
                    return;
                }
                me.f.open_in_stream(h, true, None, now);
            }
            me.answer(id, h.method_id, status, Bytes::from(why.to_string()));
        };
        if self.state == ServerState::Draining {
            refuse(
                self,
                Status::SHUTTING_DOWN,
                "the server is shutting down; call another server or retry later",
            );
            return Ok(());
        }
        if h.payload_len > self.f.cfg.limits.max_payload_len {
            let why = format!(
                "limit `max_payload_len` exceeded: {} > {}; raise the server's max_payload_len or send less",
                h.payload_len, self.f.cfg.limits.max_payload_len
            );
            refuse(self, Status::PAYLOAD_TOO_LARGE, &why);
            return Ok(());
        }
        if self.inflight.len() >= self.f.cfg.max_inflight {
            let why = format!(
                "limit `max_inflight_per_conn` reached ({}); wait for answers or raise --max-inflight",
                self.f.cfg.max_inflight
            );
            refuse(self, Status::OVERLOADED, &why);
            return Ok(());
        }
        // The bytes this request makes us hold until it is answered: its whole body, even
        // while it is still arriving.
        let need = if streaming {
            h.payload_len
        } else {
            body.len() as u64
        };
        let held = self.held_bytes();
        let conn_limit = self.f.cfg.max_conn_held_bytes;
        if held.saturating_add(need) > conn_limit {
            self.budget.bump(Event::RefusedConnBudget);
            let why = format!(
                "limit `max_conn_held_bytes` ({conn_limit}) reached: this connection's calls and unread answers hold {held} bytes and this request needs {need}; read the answers, wait for calls to finish, or raise the server's --max-conn-held-bytes"
            );
            refuse(self, Status::OVERLOADED, &why);
            return Ok(());
        }
        let total = self.budget.held().saturating_sub(self.settled) + held;
        if total.saturating_add(need) > self.budget.limit() {
            self.budget.bump(Event::RefusedProcessBudget);
            let why = format!(
                "limit `max_held_bytes` ({}) reached: the server holds {total} bytes for its clients and this request needs {need}; retry later or raise the server's --max-held-bytes",
                self.budget.limit()
            );
            refuse(self, Status::OVERLOADED, &why);
            return Ok(());
        }
        if h.mode == PayloadMode::HmcBuffer && h.body_len == 0 {
            self.answer(
                id,
                h.method_id,
                Status::BAD_PAYLOAD,
                Bytes::from_static(
                    b"an HMC_BUFFER request needs its data-plane descriptor as the body",
                ),
            );
            return Ok(());
        }
        if h.mode == PayloadMode::HmcBuffer && !self.hmc_buffer {
            self.answer(
                id,
                h.method_id,
                Status::DATA_PLANE,
                Bytes::from_static(NO_DATA_PLANE_TEXT.as_bytes()),
            );
            return Ok(());
        }
        let deadline =
            (h.deadline_us != 0).then(|| now + Duration::from_micros(h.deadline_us.into()));
        let one_way = h.flags.contains(Flags::ONE_WAY);
        if let Some(d) = deadline {
            self.deadlines.insert((d, id));
        }
        self.inflight.insert(
            id,
            ServerInFlight {
                deadline,
                one_way,
                receiving: streaming,
                held: need,
            },
        );
        self.req_held += need;
        if streaming {
            let sink = self
                .sinks
                .as_mut()
                .and_then(|make| make(h.method_id, h.payload_len));
            self.f.open_in_stream(h, false, sink, now);
        } else {
            if h.mode == PayloadMode::Inline {
                check_payload_crc(id, h.payload_crc, &body).map_err(|e| e.to_string())?;
            }
            self.events.push_back(ServerEvent::Call(IncomingCall {
                request_id: id,
                method_id: h.method_id,
                mode: h.mode,
                payload_len: h.payload_len,
                payload: body,
                deadline,
                one_way,
            }));
        }
        Ok(())
    }

    /// Queues a response outside the request table (refusals).
    fn answer(&mut self, id: u64, method: u32, status: Status, payload: Bytes) {
        let mut h = FrameHeader::new(FrameKind::Response, id);
        h.method_id = method;
        h.status = status;
        self.f.send_message(h, payload);
    }

    fn abandon(&mut self, id: u64, why: Status, text: &str) {
        let Some(e) = self.inflight.remove(&id) else {
            return; // already answered: cancel is idempotent
        };
        self.req_held -= e.held;
        if let Some(d) = e.deadline {
            self.deadlines.remove(&(d, id));
        }
        if e.receiving
            && let Some(s) = self.f.streams_in.get_mut(&id)
        {
            s.discard = true;
            s.buf = Vec::new();
            s.sink = None;
        }
        self.staged.remove(&id);
        if !e.one_way {
            self.answer(id, 0, why, Bytes::from(text.to_string()));
        }
        self.events.push_back(ServerEvent::Abandon {
            request_id: id,
            why,
        });
    }

    /// The runtime's answer to a call. Dropped when the call was already answered
    /// (cancelled or timed out); replaced by DEADLINE_EXCEEDED when it comes too late.
    pub fn respond(
        &mut self,
        request_id: u64,
        method_id: u32,
        status: Status,
        payload: Bytes,
        now: Instant,
    ) {
        self.staged.remove(&request_id);
        let Some(e) = self.inflight.remove(&request_id) else {
            return;
        };
        self.req_held -= e.held;
        self.last_activity = now;
        let mut status = status;
        let mut payload = payload;
        if let Some(d) = e.deadline {
            self.deadlines.remove(&(d, request_id));
            if now >= d {
                status = Status::DEADLINE_EXCEEDED;
                payload = Bytes::from_static(b"the handler finished after the call's deadline");
            }
        }
        if e.one_way {
            return;
        }
        let mut h = FrameHeader::new(FrameKind::Response, request_id);
        h.method_id = method_id;
        h.status = status;
        self.f.send_message(h, payload);
    }

    /// Answers a call OK with a `total`-byte TCP_STREAM response whose bytes the runtime
    /// feeds with [`ServerConn::feed`] as it produces them (a device buffer staged out in
    /// chunks). True when the answer is on its way; false when the call was already
    /// answered, is one-way, or finished after its deadline (answered DEADLINE_EXCEEDED
    /// instead): then the runtime stops producing. `total` must exceed [`INLINE_MAX`].
    pub fn respond_fed(
        &mut self,
        request_id: u64,
        method_id: u32,
        total: u64,
        now: Instant,
    ) -> bool {
        let Some(e) = self.inflight.get(&request_id) else {
            return false;
        };
        if e.one_way || e.deadline.is_some_and(|d| now >= d) {
            let why = Bytes::from_static(b"the handler finished after the call's deadline");
            self.respond(request_id, method_id, Status::DEADLINE_EXCEEDED, why, now);
            return false;
        }
        if let Some(d) = e.deadline {
            self.deadlines.remove(&(d, request_id));
        }
        let held = e.held;
        self.inflight.remove(&request_id);
        self.req_held -= held;
        self.last_activity = now;
        self.staged.remove(&request_id);
        let mut h = FrameHeader::new(FrameKind::Response, request_id);
        h.method_id = method_id;
        h.status = Status::OK;
        self.f.send_message_fed(h, total as usize);
        true
    }

    /// The next piece of a [`ServerConn::respond_fed`] response. False when the stream is
    /// gone (the connection is closing): stop producing.
    pub fn feed(&mut self, request_id: u64, piece: Bytes) -> bool {
        self.f.feed(request_id, piece)
    }

    /// The producer of a [`ServerConn::respond_fed`] response failed after its header went
    /// out. The stream cannot be completed with correct bytes, so the connection closes
    /// with GOAWAY(INTERNAL) naming `why`; the client fails its calls, never reading
    /// wrong data.
    pub fn abort_fed(&mut self, request_id: u64, why: &str) {
        self.close(
            Status::INTERNAL,
            &format!("the response to request {request_id} could not be produced: {why}"),
        );
    }

    /// Answers an HMC_BUFFER call whose `len`-byte response the runtime has already
    /// written into the client's response region: a RESPONSE with mode HMC_BUFFER, no
    /// body. Like [`ServerConn::respond`], ignored for calls already answered, and
    /// DEADLINE_EXCEEDED when it comes too late.
    pub fn respond_in_buffer(&mut self, request_id: u64, method_id: u32, len: u64, now: Instant) {
        let Some(e) = self.inflight.get(&request_id) else {
            return;
        };
        if e.one_way || e.deadline.is_some_and(|d| now >= d) {
            let why = Bytes::from_static(b"the handler finished after the call's deadline");
            self.respond(request_id, method_id, Status::DEADLINE_EXCEEDED, why, now);
            return;
        }
        if let Some(d) = e.deadline {
            self.deadlines.remove(&(d, request_id));
        }
        let held = e.held;
        self.inflight.remove(&request_id);
        self.req_held -= held;
        self.last_activity = now;
        let mut h = FrameHeader::new(FrameKind::Response, request_id);
        h.method_id = method_id;
        h.status = Status::OK;
        h.mode = PayloadMode::HmcBuffer;
        h.payload_len = len;
        self.f.send_frame(&h, &[]);
    }

    /// Next event for the runtime.
    pub fn poll_event(&mut self) -> Option<ServerEvent> {
        self.events.pop_front()
    }

    /// When [`ServerConn::handle_timeout`] should next run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t = self.deadlines.first().map(|(d, _)| *d);
        let mut take = |x: Option<Instant>| {
            if let Some(x) = x {
                t = Some(t.map_or(x, |t| t.min(x)));
            }
        };
        take(self.f.stall_deadline());
        if self.f.has_tx() {
            take(Some(self.tx_progress.1 + self.f.cfg.write_stall_timeout));
        }
        take(self.stream_idle_deadline());
        if self.idle_applies() {
            take(Some(self.last_activity + self.f.cfg.idle_timeout));
        }
        if !self.inflight.is_empty() {
            take(self.next_probe);
        }
        t
    }

    /// The idle timeout runs while nothing is in flight, no body is arriving and the
    /// connection is open.
    fn idle_applies(&self) -> bool {
        self.inflight.is_empty() && self.f.streams_in.is_empty() && self.state == ServerState::Open
    }

    /// When the quietest incoming stream passes `stream_idle_timeout`.
    fn stream_idle_deadline(&self) -> Option<Instant> {
        self.f
            .streams_in
            .values()
            .map(|s| s.last_data)
            .min()
            .map(|t| t + self.f.cfg.stream_idle_timeout)
    }

    /// Fails request streams that sent no DATA for `stream_idle_timeout` and forgets
    /// skipped ones as quiet.
    fn expire_streams(&mut self, now: Instant) {
        let idle = self.f.cfg.stream_idle_timeout;
        let stalled: Vec<(u64, bool)> = self
            .f
            .streams_in
            .iter()
            .filter(|(_, s)| now >= s.last_data + idle)
            .map(|(id, s)| (*id, s.discard))
            .collect();
        for (id, skipped) in stalled {
            self.f.streams_in.remove(&id);
            if !skipped {
                self.budget.bump(Event::StreamStalled);
                let why = format!(
                    "the request body stalled: no DATA for `stream_idle_timeout` ({idle:?}); send whole bodies promptly or raise the server's --stream-idle-timeout-secs"
                );
                self.abandon(id, Status::DEADLINE_EXCEEDED, &why);
            }
        }
    }

    /// Expires deadlines, stalled frames and idle connections.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&(d, id)) = self.deadlines.first() {
            if d > now {
                break;
            }
            self.abandon(
                id,
                Status::DEADLINE_EXCEEDED,
                "the call's deadline passed before it completed",
            );
        }
        if matches!(self.state, ServerState::Closing(_)) {
            return;
        }
        if self.f.stall_deadline().is_some_and(|t| now >= t) {
            let why = format!(
                "an incomplete frame stalled for longer than `frame_timeout` ({:?}); send whole frames",
                self.f.cfg.frame_timeout
            );
            self.close(Status::PROTOCOL, &why);
            return;
        }
        if self.f.has_tx() && now >= self.tx_progress.1 + self.f.cfg.write_stall_timeout {
            self.budget.bump(Event::ClosedWriteStall);
            let why = format!(
                "the client read none of its answers for `write_stall_timeout` ({:?}); read answers as they come or raise the server's --write-stall-timeout-secs",
                self.f.cfg.write_stall_timeout
            );
            self.close(Status::OVERLOADED, &why);
            return;
        }
        if self.stream_idle_deadline().is_some_and(|t| now >= t) {
            self.expire_streams(now);
        }
        if let Some(t) = self.next_probe
            && now >= t
            && !self.inflight.is_empty()
        {
            // A peer that only closed its sending side ignores or answers this; one that
            // is gone resets the connection, which fails the next write.
            let ping = FrameHeader::new(FrameKind::Ping, 0);
            self.f.send_frame(&ping, &[]);
            self.next_probe = Some(now + PROBE_INTERVAL);
        }
        if self.idle_applies() && now >= self.last_activity + self.f.cfg.idle_timeout {
            self.budget.bump(Event::ClosedIdle);
            let why = format!(
                "idle for `idle_timeout` ({:?}); reconnect to call again",
                self.f.cfg.idle_timeout
            );
            self.close(Status::OK, &why);
        }
    }

    /// Starts a graceful shutdown: sends GOAWAY(SHUTTING_DOWN); calls in flight finish,
    /// new ones are answered SHUTTING_DOWN.
    pub fn begin_shutdown(&mut self) {
        if self.state == ServerState::Open {
            let (h, b) = goaway(
                Status::SHUTTING_DOWN,
                "server shutting down: calls in flight finish, new calls are refused",
            );
            self.f.send_frame(&h, &b);
            self.state = ServerState::Draining;
        }
    }

    fn close(&mut self, status: Status, why: &str) {
        if matches!(self.state, ServerState::Closing(_)) {
            return;
        }
        tracing::debug!(%status, reason = why, "closing connection with GOAWAY");
        let (h, b) = goaway(status, why);
        self.f.send_frame(&h, &b);
        self.f.streams_out.clear();
        self.f.streams_in.clear();
        self.state = ServerState::Closing(why.to_string());
        let ids: Vec<u64> = self.inflight.keys().copied().collect();
        self.req_held = 0;
        for id in ids {
            self.inflight.remove(&id);
            self.events.push_back(ServerEvent::Abandon {
                request_id: id,
                why: Status::CANCELLED,
            });
        }
        self.deadlines.clear();
    }

    /// Calls admitted and not yet answered.
    pub fn inflight_len(&self) -> usize {
        self.inflight.len()
    }

    /// `Some(reason)` once the connection should be closed after flushing.
    pub fn close_reason(&self) -> Option<&str> {
        match &self.state {
            ServerState::Closing(r) => Some(r),
            _ => None,
        }
    }

    /// True when draining and every call has been answered.
    pub fn drained(&self) -> bool {
        self.state == ServerState::Draining && self.inflight.is_empty()
    }
}

impl Drop for ServerConn {
    fn drop(&mut self) {
        self.f.release_input();
        // Whatever this connection still held is no longer held.
        self.budget.settle(self.settled, 0);
    }
}

// ------------------------------------------------------------------------------------------
// Client role
// ------------------------------------------------------------------------------------------

/// What the client core reports to its runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientEvent {
    /// The answer to a call.
    Response {
        /// Which call.
        request_id: u64,
        /// The server's status.
        status: Status,
        /// The payload (for non-OK statuses, the server's explanation).
        payload: Bytes,
    },
    /// The answer to an HMC_BUFFER call whose response the server wrote into the
    /// call's response region (status OK): the first `len` bytes of it are the payload.
    ResponseInBuffer {
        /// Which call.
        request_id: u64,
        /// Bytes written at the start of the response region.
        len: u64,
    },
    /// The call's deadline passed locally; a CANCEL was sent.
    TimedOut {
        /// Which call.
        request_id: u64,
    },
    /// The server will take no new calls on this connection; calls in flight still finish.
    Draining {
        /// The server's reason.
        reason: String,
    },
}

/// Makes the sink of a call's streamed response once its length is known.
pub type ResponseSink = Box<dyn FnOnce(u64) -> Box<dyn StreamSink> + Send>;

/// Why a call could not be started on this connection.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// No credit left.
    #[error(
        "limit `max_inflight_per_conn` reached ({0}); wait for answers or raise ClientConfig::max_inflight"
    )]
    NoCredit(usize),
    /// Payload over `max_payload_len`.
    #[error(
        "limit `max_payload_len` exceeded: {0} > {1}; send less or raise the limit on both peers"
    )]
    TooLarge(u64, u64),
    /// The request id is still in flight (or its cancel not yet acknowledged).
    #[error("request id {0} is already in flight on this connection")]
    DuplicateId(u64),
    /// The connection is closing or draining.
    #[error("connection not usable: {0}")]
    Closed(String),
}

/// What a REQUEST carries.
enum Outgoing {
    /// The payload itself (INLINE or TCP_STREAM).
    Payload(Bytes),
    /// Length and data-plane descriptor of an HMC_BUFFER payload.
    Descriptor(u64, Bytes),
    /// A TCP_STREAM payload of this length, fed later in pieces.
    Fed(u64),
}

/// The client side of one connection.
pub struct ClientConn {
    f: Framing,
    next_id: u64,
    pending: IdMap<u64, Option<Instant>>,
    deadlines: BTreeSet<(Instant, u64)>,
    /// Responses to these ids are dropped (cancelled or timed out; kept until the server's
    /// own answer arrives so a streamed answer can be discarded).
    forgotten: IdSet,
    events: VecDeque<ClientEvent>,
    /// Calls sent as HMC_BUFFER (only these may be answered HMC_BUFFER).
    buffer_calls: IdSet,
    /// Where a call's streamed OK response goes instead of host memory.
    sinks: IdMap<u64, ResponseSink>,
    /// What sinks made of responses delivered, until the runtime takes them.
    staged: IdMap<u64, StagedPayload>,
    ping_sent: Option<Instant>,
    draining: Option<String>,
    closed: Option<String>,
}

impl ClientConn {
    /// A new connection established at `now`.
    pub fn new(cfg: ConnConfig, now: Instant) -> Self {
        ClientConn {
            f: Framing::new(cfg, now),
            next_id: 1,
            pending: IdMap::default(),
            deadlines: BTreeSet::new(),
            forgotten: IdSet::default(),
            events: VecDeque::new(),
            buffer_calls: IdSet::default(),
            sinks: IdMap::default(),
            staged: IdMap::default(),
            ping_sent: None,
            draining: None,
            closed: None,
        }
    }

    /// Queues a call with the next free request id; returns the id.
    pub fn start_call(
        &mut self,
        method_id: u32,
        payload: Bytes,
        deadline: Option<Instant>,
        one_way: bool,
        now: Instant,
    ) -> Result<u64, StartError> {
        while self.pending.contains_key(&self.next_id) || self.forgotten.contains(&self.next_id) {
            self.next_id += 1;
        }
        let id = self.next_id;
        self.start_call_with_id(id, method_id, payload, deadline, one_way, now)?;
        self.next_id += 1;
        Ok(id)
    }

    /// Queues a call under a caller-chosen request id (unique while in flight).
    pub fn start_call_with_id(
        &mut self,
        id: u64,
        method_id: u32,
        payload: Bytes,
        deadline: Option<Instant>,
        one_way: bool,
        now: Instant,
    ) -> Result<(), StartError> {
        self.start_inner(
            id,
            method_id,
            Outgoing::Payload(payload),
            deadline,
            one_way,
            now,
        )
    }

    /// Queues an HMC_BUFFER call: the REQUEST frame carries `descriptor` (the data-plane
    /// descriptor of a `payload_len`-byte payload the server pulls one-sided) as its body.
    /// Its answer is [`ClientEvent::ResponseInBuffer`] or an ordinary
    /// [`ClientEvent::Response`].
    pub fn start_call_in_buffer(
        &mut self,
        id: u64,
        method_id: u32,
        payload_len: u64,
        descriptor: Bytes,
        deadline: Option<Instant>,
        now: Instant,
    ) -> Result<(), StartError> {
        if descriptor.is_empty() || descriptor.len() > self.f.cfg.limits.max_body_len as usize {
            return Err(StartError::TooLarge(
                descriptor.len() as u64,
                self.f.cfg.limits.max_body_len as u64,
            ));
        }
        self.start_inner(
            id,
            method_id,
            Outgoing::Descriptor(payload_len, descriptor),
            deadline,
            false,
            now,
        )?;
        self.buffer_calls.insert(id);
        Ok(())
    }

    /// Queues a call whose `payload_len`-byte TCP_STREAM payload the runtime feeds later,
    /// piece by piece, with [`ClientConn::feed`] (a device payload staged in chunks, the
    /// copy of one chunk overlapping the send of the last). `payload_len` must exceed
    /// [`INLINE_MAX`]. If the producer fails, [`ClientConn::cancel`] the call.
    pub fn start_call_fed(
        &mut self,
        id: u64,
        method_id: u32,
        payload_len: u64,
        deadline: Option<Instant>,
        now: Instant,
    ) -> Result<(), StartError> {
        if payload_len <= INLINE_MAX as u64 {
            return Err(StartError::Closed(format!(
                "a fed payload must be longer than {INLINE_MAX} bytes (got {payload_len}); send it whole"
            )));
        }
        self.start_inner(
            id,
            method_id,
            Outgoing::Fed(payload_len),
            deadline,
            false,
            now,
        )
    }

    /// The next piece of a [`ClientConn::start_call_fed`] payload. False when the call is
    /// gone (cancelled, answered early, connection closed): stop producing.
    pub fn feed(&mut self, request_id: u64, piece: Bytes) -> bool {
        self.f.feed(request_id, piece)
    }

    /// Sends the call's response, if it comes OK as a TCP_STREAM, into the sink `sink`
    /// makes for its length, as it arrives; the [`ClientEvent::Response`] then has an empty payload and the sink's
    /// product is taken with [`ClientConn::take_staged`]. Other answers (INLINE, errors)
    /// arrive as usual and the sink is dropped.
    pub fn set_response_sink(&mut self, request_id: u64, sink: ResponseSink) {
        if self.pending.contains_key(&request_id) {
            self.sinks.insert(request_id, sink);
        }
    }

    /// The response sink's product for a delivered call (once; `None` when the response
    /// came in host memory).
    pub fn take_staged(&mut self, request_id: u64) -> Option<StagedPayload> {
        self.staged.remove(&request_id)
    }

    fn start_inner(
        &mut self,
        id: u64,
        method_id: u32,
        out: Outgoing,
        deadline: Option<Instant>,
        one_way: bool,
        now: Instant,
    ) -> Result<(), StartError> {
        if let Some(r) = self.closed.as_ref().or(self.draining.as_ref()) {
            return Err(StartError::Closed(r.clone()));
        }
        if self.pending.len() >= self.f.cfg.max_inflight {
            return Err(StartError::NoCredit(self.f.cfg.max_inflight));
        }
        if self.pending.contains_key(&id) || self.forgotten.contains(&id) {
            return Err(StartError::DuplicateId(id));
        }
        let len = match &out {
            Outgoing::Payload(p) => p.len() as u64,
            Outgoing::Descriptor(len, _) | Outgoing::Fed(len) => *len,
        };
        let max = self.f.cfg.limits.max_payload_len;
        if len > max {
            return Err(StartError::TooLarge(len, max));
        }
        let mut h = FrameHeader::new(FrameKind::Request, id);
        h.method_id = method_id;
        if one_way {
            h.flags = Flags::ONE_WAY;
        }
        if let Some(d) = deadline {
            h.deadline_us = budget_us(d, now);
            if !one_way {
                self.deadlines.insert((d, id));
            }
        }
        match out {
            Outgoing::Payload(payload) => self.f.send_message(h, payload),
            Outgoing::Descriptor(len, desc) => {
                h.mode = PayloadMode::HmcBuffer;
                h.payload_len = len;
                h.body_len = desc.len() as u32;
                self.f.send_frame(&h, &desc);
            }
            Outgoing::Fed(len) => self.f.send_message_fed(h, len as usize),
        }
        if !one_way {
            self.pending.insert(id, deadline);
        }
        Ok(())
    }

    /// Abandons a call: sends CANCEL, drops its answer when it comes. Idempotent.
    pub fn cancel(&mut self, request_id: u64) {
        if let Some(d) = self.pending.remove(&request_id) {
            if let Some(d) = d {
                self.deadlines.remove(&(d, request_id));
            }
            self.f.drop_out_stream(request_id);
            self.sinks.remove(&request_id);
            self.forgotten.insert(request_id);
            if self.closed.is_none() {
                let c = FrameHeader::new(FrameKind::Cancel, request_id);
                self.f.send_frame(&c, &[]);
            }
        }
    }

    /// Feeds received bytes.
    pub fn handle_input(&mut self, bytes: &[u8], now: Instant) {
        if self.closed.is_some() {
            return;
        }
        self.f.push_input(bytes, now);
        self.process_input(now);
    }

    /// `n` bytes were read where [`ClientConn::read_target`] or [`ClientConn::input_space`]
    /// said.
    pub fn handle_read(&mut self, n: usize, now: Instant) {
        if self.closed.is_some() {
            return;
        }
        self.f.commit_read(n, now);
        self.process_input(now);
    }

    fn process_input(&mut self, now: Instant) {
        self.ping_sent = None;
        loop {
            match self.f.next_frame(now) {
                Ok(Parsed::Need) => break,
                Ok(Parsed::DirectDone(h, start)) => {
                    let r = self
                        .f
                        .direct_done(h, start)
                        .map(|m| self.on_stream_message(m));
                    if let Err(why) = r {
                        self.fail(&why, true);
                        break;
                    }
                }
                Ok(Parsed::Frame(h, body)) => {
                    if let Err(why) = self.on_frame(h, body) {
                        self.fail(&why, true);
                        break;
                    }
                    if self.closed.is_some() {
                        break;
                    }
                }
                Err(e) => {
                    self.fail(&e.to_string(), true);
                    break;
                }
            }
        }
    }

    fn on_frame(&mut self, h: FrameHeader, range: std::ops::Range<usize>) -> Result<(), String> {
        let id = h.request_id;
        if h.kind == FrameKind::Data {
            let m = self.f.data_frame(h, range)?;
            self.on_stream_message(m);
            return Ok(());
        }
        let body = self.f.body(range);
        match h.kind {
            FrameKind::Response => {
                if h.mode == PayloadMode::TcpStream {
                    let discard = !self.pending.contains_key(&id);
                    if self.f.streams_in.contains_key(&id) {
                        return Err(format!("second streamed response for request {id}"));
                    }
                    let sink = if h.status == Status::OK {
                        self.sinks.remove(&id).map(|make| make(h.payload_len))
                    } else {
                        None
                    };
                    let now = self.f.last_rx;
                    self.f.open_in_stream(h, discard, sink, now);
                    return Ok(());
                }
                if h.mode == PayloadMode::HmcBuffer {
                    if h.body_len != 0 || h.status != Status::OK {
                        return Err(format!(
                            "HMC_BUFFER response to request {id} with a body or a status other than OK"
                        ));
                    }
                    if !self.buffer_calls.remove(&id) {
                        return Err(format!(
                            "HMC_BUFFER response to request {id}, which was not an HMC_BUFFER call"
                        ));
                    }
                    self.sinks.remove(&id);
                    if let Some(d) = self.pending.remove(&id) {
                        if let Some(d) = d {
                            self.deadlines.remove(&(d, id));
                        }
                        self.events.push_back(ClientEvent::ResponseInBuffer {
                            request_id: id,
                            len: h.payload_len,
                        });
                    } else {
                        self.forgotten.remove(&id);
                    }
                    return Ok(());
                }
                check_payload_crc(id, h.payload_crc, &body).map_err(|e| e.to_string())?;
                self.deliver(h, body);
                Ok(())
            }
            FrameKind::Data => unreachable!("handled above"),
            FrameKind::Ping => {
                let pong = FrameHeader::new(FrameKind::Pong, id);
                self.f.send_frame(&pong, &[]);
                Ok(())
            }
            FrameKind::Pong => Ok(()),
            FrameKind::GoAway => {
                let reason = String::from_utf8_lossy(&body).into_owned();
                if h.status == Status::SHUTTING_DOWN {
                    self.draining = Some(format!("server said: {reason}"));
                    self.events.push_back(ClientEvent::Draining { reason });
                } else {
                    self.fail(
                        &format!("server closed the connection ({}): {reason}", h.status),
                        false,
                    );
                }
                Ok(())
            }
            FrameKind::Request | FrameKind::Cancel => {
                Err(format!("a server sent a {:?} frame", h.kind))
            }
        }
    }

    /// A streamed response is complete (`Some`): deliver it.
    fn on_stream_message(&mut self, m: Option<Message>) {
        if let Some(m) = m {
            if let Some(staged) = m.staged
                && self.pending.contains_key(&m.header.request_id)
            {
                self.staged.insert(m.header.request_id, staged);
            }
            self.deliver(m.header, m.payload);
        }
    }

    fn deliver(&mut self, h: FrameHeader, payload: Bytes) {
        let id = h.request_id;
        self.buffer_calls.remove(&id);
        self.sinks.remove(&id);
        if let Some(d) = self.pending.remove(&id) {
            if let Some(d) = d {
                self.deadlines.remove(&(d, id));
            }
            self.events.push_back(ClientEvent::Response {
                request_id: id,
                status: h.status,
                payload,
            });
        } else {
            // Late answer to a cancelled or timed-out call, or a refusal of a one-way call.
            self.forgotten.remove(&id);
        }
    }

    /// Next event.
    pub fn poll_event(&mut self) -> Option<ClientEvent> {
        self.events.pop_front()
    }

    /// When [`ClientConn::handle_timeout`] should next run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t = self.deadlines.first().map(|(d, _)| *d);
        let ka = self.f.cfg.keepalive_interval;
        let k = if !self.pending.is_empty() {
            Some(match self.ping_sent {
                Some(p) => p + ka,
                None => self.f.last_rx + ka,
            })
        } else {
            None
        };
        for x in [k, self.f.stall_deadline()].into_iter().flatten() {
            t = Some(t.map_or(x, |t| t.min(x)));
        }
        t
    }

    /// Expires deadlines (sending CANCEL) and runs the keepalive.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&(d, id)) = self.deadlines.first() {
            if d > now {
                break;
            }
            self.cancel(id);
            self.events
                .push_back(ClientEvent::TimedOut { request_id: id });
        }
        if self.closed.is_some() {
            return;
        }
        if self.f.stall_deadline().is_some_and(|t| now >= t) {
            self.fail("the server stalled in the middle of a frame", true);
            return;
        }
        if self.pending.is_empty() {
            self.ping_sent = None;
            return;
        }
        let ka = self.f.cfg.keepalive_interval;
        match self.ping_sent {
            Some(p) if now >= p + ka => {
                self.fail(
                    &format!(
                        "no PONG within `keepalive_interval` ({ka:?}); the server is unreachable"
                    ),
                    true,
                );
            }
            None if now >= self.f.last_rx + ka => {
                let p = FrameHeader::new(FrameKind::Ping, self.next_id);
                self.f.send_frame(&p, &[]);
                self.ping_sent = Some(now);
            }
            _ => {}
        }
    }

    fn fail(&mut self, why: &str, send_goaway: bool) {
        if self.closed.is_some() {
            return;
        }
        tracing::debug!(reason = why, "client connection failed");
        self.f.streams_out.clear();
        self.sinks.clear();
        if send_goaway {
            let (h, b) = goaway(Status::PROTOCOL, why);
            self.f.send_frame(&h, &b);
        }
        self.closed = Some(why.to_string());
    }

    /// Closes locally (socket lost); calls in flight are left for the runtime to fail.
    pub fn connection_lost(&mut self, why: &str) {
        if self.closed.is_none() {
            self.closed = Some(why.to_string());
        }
    }

    /// Ids of calls still waiting for an answer.
    pub fn pending_ids(&self) -> Vec<u64> {
        self.pending.keys().copied().collect()
    }

    /// Calls waiting for an answer.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// A TCP_STREAM payload is on its way in either direction (a request still being sent
    /// or a response still arriving).
    pub fn streaming(&self) -> bool {
        !self.f.streams_in.is_empty() || !self.f.streams_out.is_empty()
    }

    /// `Some(reason)` once the connection is unusable.
    pub fn closed_reason(&self) -> Option<&str> {
        self.closed.as_deref()
    }

    /// `Some(reason)` once the server announced a graceful shutdown.
    pub fn draining_reason(&self) -> Option<&str> {
        self.draining.as_deref()
    }
}

/// The byte side of a connection, the same for [`ServerConn`] and [`ClientConn`]: the
/// bytes to write, and where to read.
macro_rules! byte_side {
    ($conn:ident) => {
        impl $conn {
            /// Bytes to write now (empty when nothing is queued).
            pub fn pending_tx(&mut self) -> &[u8] {
                self.f.pending_tx()
            }

            /// `n` bytes of the queued ones were written (from
            #[doc = concat!("[`", stringify!($conn), "::pending_tx`] or [`", stringify!($conn), "::tx_slices`]).")]
            pub fn advance_tx(&mut self, n: usize) {
                self.f.advance_tx(n)
            }

            /// True while something waits to be written.
            pub fn has_tx(&self) -> bool {
                self.f.has_tx()
            }

            /// Fills `out` with queued bytes for a vectored write; returns the number of
            /// slices used. Report what was written with `advance_tx`.
            pub fn tx_slices<'a>(&'a mut self, out: &mut [std::io::IoSlice<'a>]) -> usize {
                self.f.tx_slices(out)
            }

            /// Bytes queued for writing (a backlog measure for read backpressure).
            pub fn queued_tx_len(&self) -> usize {
                self.f.queued_len()
            }

            /// Spare input space of at least `min` bytes to read into; then call
            /// `handle_read(n, now)`.
            pub fn input_space(&mut self, min: usize) -> &mut [u8] {
                self.f.input_space(min)
            }

            /// Where the next read should go (up to `max` bytes): like
            /// [`input_space`](Self::input_space), except that the body of a large DATA
            /// chunk is read straight into its payload's buffer. Then call
            /// `handle_read(n, now)`.
            pub fn read_target(&mut self, max: usize) -> ReadTarget<'_> {
                self.f.read_target(max)
            }
        }

        impl TxQueue for $conn {
            fn tx_slices<'a>(&'a mut self, out: &mut [std::io::IoSlice<'a>]) -> usize {
                self.f.tx_slices(out)
            }

            fn advance_tx(&mut self, n: usize) {
                self.f.advance_tx(n)
            }
        }
    };
}

byte_side!(ServerConn);
byte_side!(ClientConn);

/// Queued bytes of a connection, for the write loop the runtime shares between roles.
pub(crate) trait TxQueue {
    /// See [`ServerConn::tx_slices`].
    fn tx_slices<'a>(&'a mut self, out: &mut [std::io::IoSlice<'a>]) -> usize;
    /// See [`ServerConn::advance_tx`].
    fn advance_tx(&mut self, n: usize);
}

#[cfg(test)]
#[path = "proto_limits_tests.rs"]
mod limits_tests;

#[cfg(test)]
mod tests {
    use super::*;

    /// Moves all queued bytes from one side to the other (a lossless, instant wire).
    fn pump_c2s(c: &mut ClientConn, s: &mut ServerConn, now: Instant) {
        loop {
            let b = c.pending_tx().to_vec();
            if b.is_empty() {
                break;
            }
            c.advance_tx(b.len());
            s.handle_input(&b, now);
        }
    }

    fn pump_s2c(s: &mut ServerConn, c: &mut ClientConn, now: Instant) {
        loop {
            let b = s.pending_tx().to_vec();
            if b.is_empty() {
                break;
            }
            s.advance_tx(b.len());
            c.handle_input(&b, now);
        }
    }

    fn calls(s: &mut ServerConn) -> Vec<IncomingCall> {
        let mut v = vec![];
        while let Some(e) = s.poll_event() {
            if let ServerEvent::Call(c) = e {
                v.push(c);
            }
        }
        v
    }

    fn responses(c: &mut ClientConn) -> Vec<(u64, Status, Bytes)> {
        let mut v = vec![];
        while let Some(e) = c.poll_event() {
            if let ClientEvent::Response {
                request_id,
                status,
                payload,
            } = e
            {
                v.push((request_id, status, payload));
            }
        }
        v
    }

    fn pair(cfg: ConnConfig) -> (ClientConn, ServerConn, Instant) {
        let now = Instant::now();
        (
            ClientConn::new(cfg.clone(), now),
            ServerConn::new(cfg, now),
            now,
        )
    }

    /// A sink that records what it was given, at which offsets, and fails on demand.
    struct RecordingSink {
        bytes: Vec<u8>,
        fail_at: Option<u64>,
        error: Option<hmc_core::Error>,
    }

    impl RecordingSink {
        fn boxed(fail_at: Option<u64>) -> Box<dyn StreamSink> {
            Box::new(RecordingSink {
                bytes: Vec::new(),
                fail_at,
                error: None,
            })
        }
    }

    impl StreamSink for RecordingSink {
        fn write(&mut self, offset: u64, bytes: &[u8]) {
            assert_eq!(offset, self.bytes.len() as u64, "chunks in order, no gaps");
            if self.fail_at.is_some_and(|f| offset >= f) && self.error.is_none() {
                self.error = Some(hmc_core::Error::InvalidArgument(format!(
                    "device copy failed at {offset}"
                )));
            }
            self.bytes.extend_from_slice(bytes);
        }
        fn finish(self: Box<Self>) -> StagedPayload {
            match self.error {
                Some(e) => Err(e),
                None => Ok(Box::new(self.bytes)),
            }
        }
    }

    fn staged_bytes(p: Option<StagedPayload>) -> Result<Vec<u8>, hmc_core::Error> {
        let p = p.expect("a sink took this payload")?;
        Ok(*p.downcast::<Vec<u8>>().expect("the sink's type"))
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n as u32)
            .map(|i| (i.wrapping_mul(31) >> 3) as u8)
            .collect()
    }

    #[test]
    fn fed_request_goes_out_as_pieces_arrive_and_small_calls_pass_it() {
        let cfg = ConnConfig {
            chunk_len: 1000,
            ..ConnConfig::default()
        };
        let (mut c, mut s, now) = pair(cfg);
        let data = pattern(10_000);
        c.start_call_fed(5, 1, data.len() as u64, None, now)
            .unwrap();
        pump_c2s(&mut c, &mut s, now);
        assert!(!c.has_tx(), "nothing to send before the first piece");
        assert!(calls(&mut s).is_empty());
        // Pieces of uneven sizes, crossing chunk boundaries.
        assert!(c.feed(5, Bytes::copy_from_slice(&data[..2_500])));
        pump_c2s(&mut c, &mut s, now);
        // A small call while the fed stream waits for its next piece is not held back.
        let small = c
            .start_call(2, Bytes::from_static(b"small"), None, false, now)
            .unwrap();
        pump_c2s(&mut c, &mut s, now);
        let got = calls(&mut s);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].request_id, small);
        assert!(c.feed(5, Bytes::copy_from_slice(&data[2_500..2_501])));
        assert!(c.feed(5, Bytes::copy_from_slice(&data[2_501..])));
        assert!(
            !c.feed(5, Bytes::from_static(b"x")),
            "a piece past the announced length is refused"
        );
        pump_c2s(&mut c, &mut s, now);
        let got = calls(&mut s);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].request_id, 5);
        assert_eq!(got[0].payload_len, data.len() as u64);
        assert_eq!(&got[0].payload[..], &data[..]);
        assert!(
            s.take_staged(5).is_none(),
            "no sink: reassembled in host memory"
        );
    }

    #[test]
    fn a_fed_payload_must_be_a_stream() {
        let (mut c, _s, now) = pair(ConnConfig::default());
        let e = c
            .start_call_fed(1, 1, INLINE_MAX as u64, None, now)
            .unwrap_err();
        assert!(e.to_string().contains("longer than"), "{e}");
    }

    #[test]
    fn server_sink_takes_streamed_requests_of_the_methods_it_picks() {
        let cfg = ConnConfig {
            chunk_len: 700,
            ..ConnConfig::default()
        };
        let (mut c, mut s, now) = pair(cfg);
        s.set_sink_factory(Box::new(|method, _len| {
            (method == 9).then(|| RecordingSink::boxed(None))
        }));
        let data = pattern(9_000);
        let to_sink = c
            .start_call(9, Bytes::from(data.clone()), None, false, now)
            .unwrap();
        let to_host = c
            .start_call(8, Bytes::from(data.clone()), None, false, now)
            .unwrap();
        pump_c2s(&mut c, &mut s, now);
        let got = calls(&mut s);
        assert_eq!(got.len(), 2);
        let sunk = got.iter().find(|g| g.request_id == to_sink).unwrap();
        assert!(sunk.payload.is_empty());
        assert_eq!(sunk.payload_len, data.len() as u64);
        assert_eq!(staged_bytes(s.take_staged(to_sink)).unwrap(), data);
        assert!(s.take_staged(to_sink).is_none(), "taken once");
        let host = got.iter().find(|g| g.request_id == to_host).unwrap();
        assert_eq!(&host.payload[..], &data[..]);
    }

    #[test]
    fn a_failing_sink_reports_its_error_and_the_connection_stays_in_step() {
        let (mut c, mut s, now) = pair(ConnConfig {
            chunk_len: 1000,
            ..ConnConfig::default()
        });
        s.set_sink_factory(Box::new(|_, _| Some(RecordingSink::boxed(Some(3_000)))));
        let data = pattern(8_000);
        let id = c
            .start_call(1, Bytes::from(data), None, false, now)
            .unwrap();
        let next = c
            .start_call(1, Bytes::from_static(b"after"), None, false, now)
            .unwrap();
        pump_c2s(&mut c, &mut s, now);
        let got = calls(&mut s);
        assert_eq!(got.len(), 2);
        let e = staged_bytes(s.take_staged(id)).unwrap_err();
        assert!(e.to_string().contains("at 3000"), "{e}");
        assert_eq!(
            &got.iter().find(|g| g.request_id == next).unwrap().payload[..],
            b"after"
        );
        assert!(s.close_reason().is_none());
    }

    #[test]
    fn fed_response_into_a_client_sink() {
        let (mut c, mut s, now) = pair(ConnConfig {
            chunk_len: 1000,
            ..ConnConfig::default()
        });
        let id = c
            .start_call(3, Bytes::from_static(b"give me bytes"), None, false, now)
            .unwrap();
        c.set_response_sink(id, Box::new(|_| RecordingSink::boxed(None)));
        pump_c2s(&mut c, &mut s, now);
        assert_eq!(calls(&mut s).len(), 1);
        let data = pattern(6_500);
        assert!(s.respond_fed(id, 3, data.len() as u64, now));
        pump_s2c(&mut s, &mut c, now);
        assert!(responses(&mut c).is_empty(), "header only so far");
        for piece in data.chunks(1_600) {
            assert!(s.feed(id, Bytes::copy_from_slice(piece)));
            pump_s2c(&mut s, &mut c, now);
        }
        let r = responses(&mut c);
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].0, r[0].1), (id, Status::OK));
        assert!(r[0].2.is_empty());
        assert_eq!(staged_bytes(c.take_staged(id)).unwrap(), data);
        assert_eq!(c.pending_len(), 0);
    }

    #[test]
    fn an_error_answer_bypasses_the_response_sink() {
        let (mut c, mut s, now) = pair(ConnConfig::default());
        let id = c
            .start_call(3, Bytes::from_static(b"x"), None, false, now)
            .unwrap();
        c.set_response_sink(id, Box::new(|_| RecordingSink::boxed(None)));
        pump_c2s(&mut c, &mut s, now);
        calls(&mut s);
        let why = Bytes::from(vec![b'e'; 9_000]);
        s.respond(id, 3, Status::INTERNAL, why.clone(), now);
        pump_s2c(&mut s, &mut c, now);
        let r = responses(&mut c);
        assert_eq!(r, vec![(id, Status::INTERNAL, why)]);
        assert!(c.take_staged(id).is_none());
    }

    #[test]
    fn cancelling_a_half_fed_call_frees_both_sides() {
        let (mut c, mut s, now) = pair(ConnConfig {
            chunk_len: 1000,
            ..ConnConfig::default()
        });
        s.set_sink_factory(Box::new(|_, _| Some(RecordingSink::boxed(None))));
        c.start_call_fed(7, 1, 50_000, None, now).unwrap();
        assert!(c.feed(7, Bytes::from(pattern(4_000))));
        pump_c2s(&mut c, &mut s, now);
        c.cancel(7);
        assert!(!c.feed(7, Bytes::from(pattern(10))), "stop producing");
        pump_c2s(&mut c, &mut s, now);
        assert!(
            s.f.streams_in.is_empty(),
            "the half-received stream is gone"
        );
        assert_eq!(s.inflight_len(), 0);
        // The same id can be used again and goes through whole.
        let data = pattern(5_000);
        c.start_call_with_id(7, 1, Bytes::from(data.clone()), None, false, now)
            .unwrap_err();
        pump_s2c(&mut s, &mut c, now); // the CANCELLED answer clears `forgotten`
        c.start_call_with_id(7, 1, Bytes::from(data.clone()), None, false, now)
            .unwrap();
        pump_c2s(&mut c, &mut s, now);
        assert_eq!(calls(&mut s).len(), 1);
        assert_eq!(staged_bytes(s.take_staged(7)).unwrap(), data);
    }

    #[test]
    fn streaming_is_true_while_a_payload_streams_either_way() {
        let (mut c, mut s, now) = pair(ConnConfig::default());
        c.start_call(1, Bytes::from_static(b"small"), None, false, now)
            .unwrap();
        assert!(!c.streaming(), "INLINE calls do not stream");
        let big = pattern(600_000);
        let id = c
            .start_call(1, Bytes::from(big.clone()), None, false, now)
            .unwrap();
        assert!(c.streaming(), "the request streams out");
        pump_c2s(&mut c, &mut s, now);
        assert!(!c.streaming(), "all of it is on the wire");
        calls(&mut s);
        s.respond(id, 1, Status::OK, Bytes::from(big), now);
        let wire: Vec<u8> = std::iter::from_fn(|| {
            let b = s.pending_tx().to_vec();
            s.advance_tx(b.len());
            (!b.is_empty()).then_some(b)
        })
        .flatten()
        .collect();
        c.handle_input(&wire[..wire.len() / 2], now);
        assert!(c.streaming(), "the response is half in");
        c.handle_input(&wire[wire.len() / 2..], now);
        assert!(!c.streaming(), "the response is complete");
    }

    #[test]
    fn an_aborted_fed_response_closes_the_connection_instead_of_sending_wrong_bytes() {
        let (mut c, mut s, now) = pair(ConnConfig::default());
        let id = c
            .start_call(3, Bytes::from_static(b"x"), None, false, now)
            .unwrap();
        pump_c2s(&mut c, &mut s, now);
        calls(&mut s);
        assert!(s.respond_fed(id, 3, 100_000, now));
        assert!(s.feed(id, Bytes::from(pattern(10_000))));
        s.abort_fed(id, "device copy failed");
        assert!(!s.feed(id, Bytes::from(pattern(10))));
        pump_s2c(&mut s, &mut c, now);
        let why = c.closed_reason().expect("closed").to_string();
        assert!(
            why.contains("INTERNAL") && why.contains("device copy failed"),
            "{why}"
        );
        assert!(responses(&mut c).is_empty());
    }

    #[test]
    fn a_fed_response_after_the_deadline_is_refused() {
        let (mut c, mut s, now) = pair(ConnConfig::default());
        let d = now + Duration::from_millis(5);
        let id = c
            .start_call(3, Bytes::from_static(b"x"), Some(d), false, now)
            .unwrap();
        pump_c2s(&mut c, &mut s, now);
        calls(&mut s);
        let late = now + Duration::from_millis(6);
        assert!(!s.respond_fed(id, 3, 100_000, late));
        pump_s2c(&mut s, &mut c, late);
        assert_eq!(responses(&mut c)[0].1, Status::DEADLINE_EXCEEDED);
    }

    #[test]
    fn responses_out_of_order_are_matched_by_id() {
        let (mut c, mut s, now) = pair(ConnConfig::default());
        let a = c
            .start_call(1, Bytes::from_static(b"slow"), None, false, now)
            .unwrap();
        let b = c
            .start_call(1, Bytes::from_static(b"fast"), None, false, now)
            .unwrap();
        pump_c2s(&mut c, &mut s, now);
        let got = calls(&mut s);
        assert_eq!(got.len(), 2);
        s.respond(b, 1, Status::OK, Bytes::from_static(b"fast"), now);
        s.respond(a, 1, Status::OK, Bytes::from_static(b"slow"), now);
        pump_s2c(&mut s, &mut c, now);
        let r = responses(&mut c);
        assert_eq!(r[0], (b, Status::OK, Bytes::from_static(b"fast")));
        assert_eq!(r[1], (a, Status::OK, Bytes::from_static(b"slow")));
        assert_eq!(c.pending_len(), 0);
    }

    #[test]
    fn large_payload_streams_in_chunks_and_small_calls_overtake_it() {
        let cfg = ConnConfig {
            chunk_len: 1000,
            ..ConnConfig::default()
        };
        let (mut c, mut s, now) = pair(cfg);
        let big: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let big_id = c
            .start_call(1, Bytes::from(big.clone()), None, false, now)
            .unwrap();
        // Write part of the first round of chunks, then start a small call: it must
        // arrive before the big payload completes.
        for _ in 0..3 {
            let seg = c.pending_tx().to_vec();
            c.advance_tx(seg.len());
            s.handle_input(&seg, now);
        }
        let small_id = c
            .start_call(1, Bytes::from_static(b"small"), None, false, now)
            .unwrap();
        let mut got = Vec::new();
        loop {
            let seg = c.pending_tx().to_vec();
            if seg.is_empty() {
                break;
            }
            c.advance_tx(seg.len());
            s.handle_input(&seg, now);
            got.extend(calls(&mut s));
        }
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].request_id, small_id);
        assert_eq!(got[1].request_id, big_id);
        assert_eq!(&got[1].payload[..], &big[..]);
        s.respond(big_id, 1, Status::OK, got[1].payload.clone(), now);
        pump_s2c(&mut s, &mut c, now);
        assert_eq!(&responses(&mut c)[0].2[..], &big[..]);
    }

    /// Carries `wire` to `s` the way the runtime does: through `read_target`, at most
    /// `read_len` bytes per read; returns how many bytes went in place.
    fn read_into_server(s: &mut ServerConn, wire: &[u8], read_len: usize, now: Instant) -> usize {
        let (mut at, mut in_place) = (0, 0);
        while at < wire.len() {
            let n = match s.read_target(read_len) {
                ReadTarget::Input(b) => {
                    let n = b.len().min(wire.len() - at);
                    b[..n].copy_from_slice(&wire[at..at + n]);
                    n
                }
                ReadTarget::Append(v, max) => {
                    let n = max.min(read_len).min(wire.len() - at);
                    v.extend_from_slice(&wire[at..at + n]);
                    in_place += n;
                    n
                }
            };
            at += n;
            s.handle_read(n, now);
        }
        in_place
    }

    fn wire_of(c: &mut ClientConn) -> Vec<u8> {
        let mut wire = Vec::new();
        loop {
            let b = c.pending_tx().to_vec();
            if b.is_empty() {
                return wire;
            }
            c.advance_tx(b.len());
            wire.extend_from_slice(&b);
        }
    }

    #[rstest::rstest]
    #[case::runtime_reads(256 * 1024)]
    #[case::small_reads(7_000)]
    #[case::odd_reads(65_537)]
    fn large_data_bodies_are_read_in_place(#[case] read_len: usize) {
        let (mut c, mut s, now) = pair(ConnConfig::default());
        let big = pattern(700_000);
        let big_id = c
            .start_call(1, Bytes::from(big.clone()), None, false, now)
            .unwrap();
        let small_id = c
            .start_call(1, Bytes::from_static(b"small"), None, false, now)
            .unwrap();
        let big2 = pattern(300_001);
        let big2_id = c
            .start_call(1, Bytes::from(big2.clone()), None, false, now)
            .unwrap();
        let wire = wire_of(&mut c);
        let in_place = read_into_server(&mut s, &wire, read_len, now);
        let got = calls(&mut s);
        let ids: Vec<u64> = got.iter().map(|c| c.request_id).collect();
        assert_eq!(ids, vec![small_id, big_id, big2_id]);
        assert_eq!(&got[1].payload[..], &big[..]);
        assert_eq!(&got[2].payload[..], &big2[..]);
        assert_eq!(&got[0].payload[..], b"small");
        // All but the first read (before any large frame was seen) went straight into
        // place.
        let total = big.len() + big2.len();
        assert!(
            in_place + read_len.min(total) >= total,
            "{in_place} of {total} bytes in place"
        );
        // No partial frame is left waiting (no stall timer; the calls have no deadline).
        assert_eq!(s.poll_timeout(), None);
    }

    #[test]
    fn a_request_abandoned_while_read_in_place_is_dropped_and_the_stream_stays_in_step() {
        let (mut c, mut s, now) = pair(ConnConfig::default());
        let big = pattern(600_000);
        let big_id = c
            .start_call(
                1,
                Bytes::from(big),
                Some(now + Duration::from_millis(10)),
                false,
                now,
            )
            .unwrap();
        let wire = wire_of(&mut c);
        let half = wire.len() / 2;
        read_into_server(&mut s, &wire[..half], 10_000, now);
        // The deadline passes halfway: the server answers DEADLINE_EXCEEDED and drops
        // the rest of the payload as it arrives.
        s.handle_timeout(now + Duration::from_millis(20));
        let in_place = read_into_server(&mut s, &wire[half..], 10_000, now);
        assert_eq!(in_place, 0, "nothing is kept for an abandoned request");
        assert!(calls(&mut s).is_empty());
        let next = c
            .start_call(1, Bytes::from_static(b"after"), None, false, now)
            .unwrap();
        let wire = wire_of(&mut c);
        read_into_server(&mut s, &wire, 10_000, now);
        let got = calls(&mut s);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].request_id, next);
        pump_s2c(&mut s, &mut c, now);
        let r = responses(&mut c);
        assert_eq!(r[0].0, big_id);
        assert_eq!(r[0].1, Status::DEADLINE_EXCEEDED);
    }

    #[test]
    fn a_bad_crc_on_a_chunk_read_in_place_closes_the_connection() {
        let cfg = ConnConfig {
            stream_crc: true,
            ..ConnConfig::default()
        };
        let (mut c, mut s, now) = pair(cfg);
        c.start_call(1, Bytes::from(pattern(100_000)), None, false, now)
            .unwrap();
        let mut wire = wire_of(&mut c);
        let last = wire.len() - 1;
        wire[last] ^= 1;
        read_into_server(&mut s, &wire, 1 << 20, now);
        assert!(calls(&mut s).is_empty());
        assert!(
            s.close_reason().is_some_and(|r| r.contains("CRC")),
            "{:?}",
            s.close_reason()
        );
    }

    #[test]
    fn vectored_slices_cover_exactly_the_queued_bytes() {
        let now = Instant::now();
        let cfg = ConnConfig {
            chunk_len: 1000,
            ..ConnConfig::default()
        };
        let mut c = ClientConn::new(cfg, now);
        c.start_call(1, Bytes::from(vec![5u8; 10_000]), None, false, now)
            .unwrap();
        c.start_call(1, Bytes::from_static(b"x"), None, false, now)
            .unwrap();
        let mut wire = Vec::new();
        loop {
            let mut sl = [std::io::IoSlice::new(&[]); 3];
            let n = c.tx_slices(&mut sl);
            if n == 0 {
                break;
            }
            // Write a little less than offered, as a socket might.
            let mut take = sl[..n].iter().map(|s| s.len()).sum::<usize>();
            take = take.saturating_sub(7).max(1);
            let mut left = take;
            for s in &sl[..n] {
                let k = left.min(s.len());
                wire.extend_from_slice(&s[..k]);
                left -= k;
            }
            c.advance_tx(take);
        }
        let mut s = ServerConn::new(ConnConfig::default(), now);
        s.handle_input(&wire, now);
        let got = calls(&mut s);
        assert_eq!(got.len(), 2);
        assert!(got.iter().any(|c| c.payload.len() == 10_000));
    }

    /// The default leaves DATA chunk CRCs at 0 (not computed) and the receiver accepts
    /// them; `stream_crc: true` sends the chunk's CRC32C, which the receiver checks.
    #[rstest::rstest]
    #[case::default_off(ConnConfig::default().stream_crc, false)]
    #[case::on(true, true)]
    fn stream_crc_is_sent_only_when_set(#[case] stream_crc: bool, #[case] expect_crc: bool) {
        let cfg = ConnConfig {
            stream_crc,
            chunk_len: 1000,
            ..ConnConfig::default()
        };
        let now = Instant::now();
        let mut c = ClientConn::new(cfg, now);
        let mut s = ServerConn::new(ConnConfig::default(), now);
        let payload = vec![3u8; 5000];
        c.start_call(1, Bytes::from(payload.clone()), None, false, now)
            .unwrap();
        let mut data_frames = 0;
        loop {
            let seg = c.pending_tx().to_vec();
            if seg.is_empty() {
                break;
            }
            if seg.len() == HEADER_LEN {
                let h = FrameHeader::decode(&seg, &FrameLimits::default()).unwrap();
                if h.kind == FrameKind::Data {
                    let chunk = &payload[..h.body_len as usize];
                    let want = if expect_crc { payload_crc(chunk) } else { 0 };
                    assert_eq!(h.payload_crc, want);
                    data_frames += 1;
                }
            }
            c.advance_tx(seg.len());
            s.handle_input(&seg, now);
        }
        assert_eq!(data_frames, 5);
        assert_eq!(calls(&mut s).len(), 1);
    }

    #[test]
    fn server_deadline_answers_deadline_exceeded_and_drops_the_late_result() {
        let (mut c, mut s, now) = pair(ConnConfig::default());
        let id = c
            .start_call(
                1,
                Bytes::from_static(b"x"),
                Some(now + Duration::from_millis(100)),
                false,
                now,
            )
            .unwrap();
        pump_c2s(&mut c, &mut s, now);
        let call = calls(&mut s).remove(0);
        assert_eq!(call.deadline, Some(now + Duration::from_millis(100)));
        assert_eq!(s.poll_timeout(), call.deadline);
        let later = now + Duration::from_millis(100);
        s.handle_timeout(later);
        assert!(matches!(
            s.poll_event(),
            Some(ServerEvent::Abandon {
                why: Status::DEADLINE_EXCEEDED,
                ..
            })
        ));
        s.respond(id, 1, Status::OK, Bytes::from_static(b"late"), later);
        pump_s2c(&mut s, &mut c, later);
        let r = responses(&mut c);
        assert_eq!(r.len(), 1, "exactly one completion");
        assert_eq!(r[0].1, Status::DEADLINE_EXCEEDED);
    }

    #[test]
    fn late_result_without_timer_is_still_answered_deadline_exceeded() {
        let (mut c, mut s, now) = pair(ConnConfig::default());
        let id = c
            .start_call(
                1,
                Bytes::new(),
                Some(now + Duration::from_millis(5)),
                false,
                now,
            )
            .unwrap();
        pump_c2s(&mut c, &mut s, now);
        calls(&mut s);
        let later = now + Duration::from_millis(6);
        s.respond(id, 1, Status::OK, Bytes::from_static(b"late"), later);
        pump_s2c(&mut s, &mut c, later);
        assert_eq!(responses(&mut c)[0].1, Status::DEADLINE_EXCEEDED);
    }

    #[test]
    fn cancel_yields_one_completion_and_frees_the_credit() {
        let cfg = ConnConfig {
            max_inflight: 1,
            ..ConnConfig::default()
        };
        let (mut c, mut s, now) = pair(cfg);
        let id = c.start_call(1, Bytes::new(), None, false, now).unwrap();
        assert_eq!(
            c.start_call(1, Bytes::new(), None, false, now),
            Err(StartError::NoCredit(1))
        );
        pump_c2s(&mut c, &mut s, now);
        calls(&mut s);
        c.cancel(id);
        c.cancel(id);
        pump_c2s(&mut c, &mut s, now);
        assert!(matches!(
            s.poll_event(),
            Some(ServerEvent::Abandon {
                why: Status::CANCELLED,
                ..
            })
        ));
        assert!(s.poll_event().is_none());
        assert_eq!(s.inflight_len(), 0);
        // The handler's result arrives after the cancel: dropped.
        s.respond(id, 1, Status::OK, Bytes::new(), now);
        pump_s2c(&mut s, &mut c, now);
        assert!(responses(&mut c).is_empty());
        assert!(c.start_call(1, Bytes::new(), None, false, now).is_ok());
    }

    #[test]
    fn client_deadline_times_out_locally_and_sends_cancel() {
        let (mut c, mut s, now) = pair(ConnConfig::default());
        let d = now + Duration::from_millis(10);
        let id = c.start_call(1, Bytes::new(), Some(d), false, now).unwrap();
        pump_c2s(&mut c, &mut s, now);
        calls(&mut s);
        c.handle_timeout(d);
        assert_eq!(
            c.poll_event(),
            Some(ClientEvent::TimedOut { request_id: id })
        );
        pump_c2s(&mut c, &mut s, d);
        assert_eq!(s.inflight_len(), 0);
    }

    #[test]
    fn per_connection_overload_is_answered_not_dropped() {
        let cfg = ConnConfig {
            max_inflight: 2,
            ..ConnConfig::default()
        };
        let now = Instant::now();
        let mut s = ServerConn::new(cfg, now);
        let mut c = ClientConn::new(ConnConfig::default(), now);
        let ids: Vec<u64> = (0..3)
            .map(|_| c.start_call(1, Bytes::new(), None, false, now).unwrap())
            .collect();
        pump_c2s(&mut c, &mut s, now);
        assert_eq!(calls(&mut s).len(), 2);
        pump_s2c(&mut s, &mut c, now);
        let r = responses(&mut c);
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].0, r[0].1), (ids[2], Status::OVERLOADED));
        assert!(String::from_utf8_lossy(&r[0].2).contains("max_inflight"));
    }

    #[test]
    fn oversized_streamed_request_is_refused_and_its_data_discarded() {
        let cfg = ConnConfig {
            limits: FrameLimits {
                max_payload_len: 10_000,
                ..FrameLimits::default()
            },
            ..ConnConfig::default()
        };
        let now = Instant::now();
        let mut s = ServerConn::new(cfg, now);
        let mut c = ClientConn::new(ConnConfig::default(), now);
        let big = c
            .start_call(1, Bytes::from(vec![1u8; 50_000]), None, false, now)
            .unwrap();
        let ok = c
            .start_call(1, Bytes::from_static(b"ok"), None, false, now)
            .unwrap();
        pump_c2s(&mut c, &mut s, now);
        let got = calls(&mut s);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].request_id, ok);
        assert!(s.close_reason().is_none());
        pump_s2c(&mut s, &mut c, now);
        assert_eq!(responses(&mut c)[0].0, big);
    }

    #[test]
    fn duplicate_request_id_closes_with_goaway() {
        let now = Instant::now();
        let mut s = ServerConn::new(ConnConfig::default(), now);
        let mut h = FrameHeader::new(FrameKind::Request, 7);
        h.method_id = 1;
        let mut bytes = Vec::new();
        encode_frame(&mut bytes, &h, &[]);
        encode_frame(&mut bytes, &h, &[]);
        s.handle_input(&bytes, now);
        assert!(s.close_reason().unwrap().contains("duplicate request id 7"));
        let out = s.pending_tx().to_vec();
        let g = FrameHeader::decode(&out[..48], &FrameLimits::default()).unwrap();
        assert_eq!((g.kind, g.status), (FrameKind::GoAway, Status::PROTOCOL));
    }

    #[test]
    fn bad_header_closes_with_goaway_naming_the_problem() {
        let now = Instant::now();
        let mut s = ServerConn::new(ConnConfig::default(), now);
        let mut b = FrameHeader::new(FrameKind::Request, 1).encode();
        b[0] = b'X';
        s.handle_input(&b, now);
        let out = s.pending_tx().to_vec();
        let g = FrameHeader::decode(&out[..48], &FrameLimits::default()).unwrap();
        assert_eq!(g.kind, FrameKind::GoAway);
        assert!(String::from_utf8_lossy(&out[48..]).contains("bad magic"));
    }

    #[test]
    fn payload_crc_mismatch_closes_the_connection() {
        let now = Instant::now();
        let mut s = ServerConn::new(ConnConfig::default(), now);
        let mut h = FrameHeader::new(FrameKind::Request, 1);
        h.payload_len = 3;
        h.body_len = 3;
        h.payload_crc = payload_crc(b"abc");
        let mut bytes = Vec::new();
        encode_frame(&mut bytes, &h, b"abd");
        s.handle_input(&bytes, now);
        assert!(
            s.close_reason()
                .unwrap()
                .contains("payload CRC32C mismatch")
        );
    }

    #[test]
    fn half_header_stall_is_closed_after_frame_timeout() {
        let now = Instant::now();
        let mut s = ServerConn::new(ConnConfig::default(), now);
        let b = FrameHeader::new(FrameKind::Ping, 1).encode();
        s.handle_input(&b[..20], now);
        let t = s.poll_timeout().unwrap();
        assert_eq!(t, now + Duration::from_secs(10));
        s.handle_timeout(t);
        assert!(s.close_reason().unwrap().contains("frame_timeout"));
    }

    #[test]
    fn bytes_split_anywhere_parse_the_same() {
        let now = Instant::now();
        let mut c = ClientConn::new(ConnConfig::default(), now);
        for i in 0..5u8 {
            c.start_call(2, Bytes::from(vec![i; 3000 * i as usize]), None, false, now)
                .unwrap();
        }
        let mut wire = Vec::new();
        loop {
            let b = c.pending_tx().to_vec();
            if b.is_empty() {
                break;
            }
            c.advance_tx(b.len());
            wire.extend(b);
        }
        let mut s = ServerConn::new(ConnConfig::default(), now);
        for piece in wire.chunks(7) {
            s.handle_input(piece, now);
        }
        let got = calls(&mut s);
        assert_eq!(got.len(), 5);
        for (i, c) in got.iter().enumerate() {
            assert_eq!(c.payload.len(), 3000 * (c.request_id as usize - 1));
            let _ = i;
        }
    }

    #[test]
    fn client_keepalive_pings_then_declares_the_server_lost() {
        let cfg = ConnConfig {
            keepalive_interval: Duration::from_secs(1),
            ..ConnConfig::default()
        };
        let now = Instant::now();
        let mut c = ClientConn::new(cfg, now);
        c.start_call(1, Bytes::new(), None, false, now).unwrap();
        let b = c.pending_tx().len();
        c.advance_tx(b);
        c.handle_timeout(now + Duration::from_secs(1));
        let ping = FrameHeader::decode(c.pending_tx(), &FrameLimits::default()).unwrap();
        assert_eq!(ping.kind, FrameKind::Ping);
        c.handle_timeout(now + Duration::from_secs(2));
        assert!(c.closed_reason().unwrap().contains("PONG"));
    }

    #[test]
    fn graceful_shutdown_finishes_inflight_and_refuses_new_calls() {
        let (mut c, mut s, now) = pair(ConnConfig::default());
        let a = c
            .start_call(1, Bytes::from_static(b"a"), None, false, now)
            .unwrap();
        pump_c2s(&mut c, &mut s, now);
        calls(&mut s);
        s.begin_shutdown();
        assert!(!s.drained());
        // A request sent before the client saw the GOAWAY.
        let mut h = FrameHeader::new(FrameKind::Request, 99);
        h.method_id = 1;
        let mut b = Vec::new();
        encode_frame(&mut b, &h, &[]);
        s.handle_input(&b, now);
        s.respond(a, 1, Status::OK, Bytes::from_static(b"a"), now);
        assert!(s.drained());
        pump_s2c(&mut s, &mut c, now);
        assert_eq!(
            c.poll_event(),
            Some(ClientEvent::Draining {
                reason: "server shutting down: calls in flight finish, new calls are refused"
                    .into()
            })
        );
        let r = responses(&mut c);
        assert_eq!((r[0].0, r[0].1), (a, Status::OK));
        assert!(matches!(
            c.start_call(1, Bytes::new(), None, false, now),
            Err(StartError::Closed(_))
        ));
    }
}
