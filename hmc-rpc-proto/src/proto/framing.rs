//! Framing shared by both roles: parsing received bytes into frames, reassembling
//! TCP_STREAM payloads (into host buffers, in place, or through a [`StreamSink`]), and
//! scheduling what to send (small frames coalesced, stream chunks interleaved by turns).

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;

use crate::frame::{
    Flags, FrameError, FrameHeader, FrameKind, HEADER_LEN, INLINE_MAX, PayloadMode,
    check_payload_crc, encode_frame, payload_crc,
};

use super::{ConnConfig, IdMap, StagedPayload, StreamSink};

/// A complete message: the first frame's header and the reassembled payload (empty when a
/// sink took the bytes; its product is `staged`).
pub(super) struct Message {
    pub(super) header: FrameHeader,
    pub(super) payload: Bytes,
    pub(super) staged: Option<StagedPayload>,
}

pub(super) struct InStream {
    pub(super) header: FrameHeader,
    pub(super) buf: Vec<u8>,
    /// Takes the bytes instead of `buf`.
    pub(super) sink: Option<Box<dyn StreamSink>>,
    /// Running CRC32C of the payload when a sink takes it and the header carries a CRC.
    pub(super) crc: u32,
    /// Data is read and dropped (refused or abandoned request).
    pub(super) discard: bool,
    pub(super) received: u64,
    /// When the header or the last DATA chunk arrived (`stream_idle_timeout`).
    pub(super) last_data: Instant,
}

pub(super) struct OutStream {
    pub(super) header: FrameHeader,
    /// Payload bytes ready to send, in order: the whole payload, or the pieces a producer
    /// has fed so far (see [`Framing::feed`]).
    pub(super) pieces: VecDeque<Bytes>,
    /// Payload length announced in the header.
    pub(super) total: usize,
    pub(super) sent: usize,
    /// Bytes this stream may still send before the next stream's turn.
    pub(super) turn_left: usize,
}

/// Parsing, reassembly and transmit scheduling shared by both roles.
pub(super) struct Framing {
    pub(super) cfg: ConnConfig,
    pub(super) inbuf: Vec<u8>,
    pub(super) in_pos: usize,
    pub(super) partial_since: Option<Instant>,
    pub(super) streams_in: IdMap<u64, InStream>,
    /// Bytes to send, in order: small frames coalesced into owned buffers, stream chunks
    /// as zero-copy slices of their payload.
    pub(super) tx: VecDeque<Bytes>,
    /// Small frames being coalesced; moved to `tx` before anything else is queued.
    pub(super) tx_small: Vec<u8>,
    /// Bytes of `tx.front()` already written.
    pub(super) tx_pos: usize,
    pub(super) streams_out: VecDeque<OutStream>,
    pub(super) last_rx: Instant,
    /// End of the received bytes in `inbuf` (the rest is spare, zeroed space).
    pub(super) in_end: usize,
    /// The DATA chunk whose body is being read straight into its stream's buffer.
    pub(super) direct: Option<DirectBody>,
    /// The last frame belonged to a large stream: the next read takes one header only, so
    /// that the body after it can be read in place instead of through `inbuf`.
    pub(super) header_first: bool,
    /// What the last [`Framing::read_target`] or [`Framing::input_space`] handed out.
    pub(super) target: TargetKind,
    /// Bytes written so far (for the write-stall check).
    pub(super) tx_written: u64,
}

/// A DATA chunk being received straight into its stream's reassembly buffer (the socket
/// copies the body there once; nothing copies it again).
pub(super) struct DirectBody {
    pub(super) header: FrameHeader,
    /// Where the chunk starts in the stream's buffer.
    pub(super) start: usize,
    /// Body bytes still to come.
    pub(super) left: usize,
}

/// DATA bodies from this many bytes are read in place when their stream reassembles into
/// host memory; smaller ones go through the input buffer.
pub(super) const DIRECT_MIN: usize = 16 * 1024;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum TargetKind {
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

pub(super) enum Parsed {
    /// A frame whose body is `inbuf[range]` until the next `push_input`.
    Frame(FrameHeader, std::ops::Range<usize>),
    /// A DATA chunk read in place is complete; its body starts at this offset of its
    /// stream's buffer.
    DirectDone(FrameHeader, usize),
    Need,
}

impl Framing {
    pub(super) fn new(cfg: ConnConfig, now: Instant) -> Self {
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
    pub(super) fn input_space(&mut self, min: usize) -> &mut [u8] {
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
    pub(super) fn release_input(&mut self) {
        if self.in_pos == self.in_end && self.direct.is_none() && !self.inbuf.is_empty() {
            self.in_pos = 0;
            self.in_end = 0;
            crate::input_pool::give(std::mem::take(&mut self.inbuf));
        }
    }

    /// Where the next read goes: the rest of a DATA body read in place, one header after
    /// a large stream's frame, or up to `max` bytes of input space.
    pub(super) fn read_target(&mut self, max: usize) -> ReadTarget<'_> {
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
    pub(super) fn commit_read(&mut self, n: usize, now: Instant) {
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

    pub(super) fn commit_input(&mut self, n: usize, now: Instant) {
        if n > 0 {
            self.last_rx = now;
        }
        self.in_end = (self.in_end + n).min(self.inbuf.len());
        self.drain_into_direct();
    }

    pub(super) fn push_input(&mut self, bytes: &[u8], now: Instant) {
        self.input_space(bytes.len())[..bytes.len()].copy_from_slice(bytes);
        self.commit_input(bytes.len(), now);
    }

    /// Moves input bytes that belong to the body being read in place into its stream
    /// (dropped when the stream was abandoned meanwhile).
    pub(super) fn drain_into_direct(&mut self) {
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
    pub(super) fn start_direct(&mut self, h: &FrameHeader) -> bool {
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

    pub(super) fn next_frame(&mut self, now: Instant) -> Result<Parsed, FrameError> {
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

    pub(super) fn mark_partial(&mut self, now: Instant) {
        if self.in_pos < self.in_end {
            self.partial_since.get_or_insert(now);
        } else {
            self.partial_since = None;
        }
    }

    pub(super) fn stall_deadline(&self) -> Option<Instant> {
        self.partial_since.map(|t| t + self.cfg.frame_timeout)
    }

    /// Queues a control or inline frame ahead of any stream chunk not yet scheduled.
    pub(super) fn send_frame(&mut self, h: &FrameHeader, body: &[u8]) {
        encode_frame(&mut self.tx_small, h, body);
    }

    pub(super) fn flush_small(&mut self) {
        if !self.tx_small.is_empty() {
            let b = std::mem::take(&mut self.tx_small);
            self.tx.push_back(Bytes::from(b));
        }
    }

    /// Queues a REQUEST/RESPONSE with its payload, INLINE or as a TCP_STREAM.
    pub(super) fn send_message(&mut self, mut h: FrameHeader, payload: Bytes) {
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
    pub(super) fn send_message_fed(&mut self, mut h: FrameHeader, total: usize) {
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
    pub(super) fn feed(&mut self, request_id: u64, piece: Bytes) -> bool {
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

    pub(super) fn drop_out_stream(&mut self, request_id: u64) {
        self.streams_out
            .retain(|s| s.header.request_id != request_id);
    }

    /// Moves queued small frames, then (when nothing else waits) the next round of stream
    /// chunks into `tx`. Chunks are scheduled a few at a time, round robin, so control
    /// frames and small messages queued meanwhile overtake a large payload.
    pub(super) fn refill(&mut self) {
        self.flush_small();
        if self.tx.is_empty() {
            self.schedule_chunks();
        }
    }

    /// The next contiguous bytes to write (empty when nothing is queued).
    pub(super) fn pending_tx(&mut self) -> &[u8] {
        if self.tx.is_empty() {
            self.refill();
        }
        match self.tx.front() {
            Some(b) => &b[self.tx_pos..],
            None => &[],
        }
    }

    /// Fills `out` with the queued bytes for a vectored write; returns how many slices.
    pub(super) fn tx_slices<'a>(&'a mut self, out: &mut [std::io::IoSlice<'a>]) -> usize {
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

    pub(super) fn schedule_chunks(&mut self) {
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

    pub(super) fn advance_tx(&mut self, mut n: usize) {
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

    pub(super) fn has_tx(&self) -> bool {
        !self.tx.is_empty()
            || !self.tx_small.is_empty()
            || self.streams_out.iter().any(|s| !s.pieces.is_empty())
    }

    /// Bytes queued in `tx` (not counting streams not yet scheduled).
    pub(super) fn queued_len(&self) -> usize {
        self.tx.iter().map(|b| b.len()).sum::<usize>() - self.tx_pos + self.tx_small.len()
    }

    /// Bytes waiting to go out: queued frames and chunks, and the unscheduled rest of every
    /// outgoing stream (a fed stream's whole announced remainder, produced or not).
    pub(super) fn tx_held(&self) -> u64 {
        let streams: usize = self.streams_out.iter().map(|s| s.total - s.sent).sum();
        (self.queued_len() + streams) as u64
    }

    /// Streams whose DATA is read and dropped.
    pub(super) fn skipped_streams(&self) -> usize {
        self.streams_in.values().filter(|s| s.discard).count()
    }

    /// Starts reassembly of a TCP_STREAM payload (into `sink` when one is given).
    pub(super) fn open_in_stream(
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
    pub(super) fn body(&self, range: std::ops::Range<usize>) -> Bytes {
        Bytes::copy_from_slice(&self.inbuf[range])
    }

    /// Feeds one DATA frame (its body still in the input buffer, appended to the stream
    /// without an intermediate copy); returns the complete message when END arrives.
    pub(super) fn data_frame(
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
    pub(super) fn direct_done(
        &mut self,
        h: FrameHeader,
        start: usize,
    ) -> Result<Option<Message>, String> {
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
    pub(super) fn end_of_chunk(&mut self, h: FrameHeader) -> Result<Option<Message>, String> {
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
