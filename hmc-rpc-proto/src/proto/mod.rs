//! The sans-IO protocol core: frame parsing and stream reassembly, the request tables,
//! deadlines, in-flight credits, cancel, keepalive and GOAWAY, driven by bytes and `now`.
//!
//! Like `quinn-proto`, nothing here touches a socket or reads a clock: the runtime feeds
//! received bytes with [`ServerConn::handle_input`] / [`ClientConn::handle_input`], takes
//! bytes to send from `pending_tx`/`advance_tx`, asks `poll_timeout` when to call
//! `handle_timeout`, and reacts to events. Every race between cancel, timeout and
//! completion is therefore a deterministic unit test.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::frame::{FrameHeader, FrameKind, FrameLimits, Status};

mod client;
mod framing;
mod server;

pub use client::{ClientConn, ClientEvent, ResponseSink, StartError};
pub use framing::ReadTarget;
pub use server::{IncomingCall, ServerConn, ServerEvent, SinkFactory};

/// Hashes the integer keys of the per-call tables (request ids, method ids) with one
/// multiplication instead of SipHash: every call inserts and removes several entries, and
/// SipHash showed up in profiles of pipelined echoes (`docs/log/2026-12-01-benchmark-history.md`).
/// Hash flooding is not a concern here: these tables hold at most a connection's
/// in-flight calls (`max_inflight`) or the dispatcher's methods, so even ids chosen to
/// collide cost a probe over a few dozen entries.
#[derive(Clone, Copy, Default)]
#[doc(hidden)]
pub struct IdHasher(u64);

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
#[doc(hidden)]
pub type IdMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<IdHasher>>;
/// A set of request ids (see [`IdHasher`]).
#[doc(hidden)]
pub type IdSet = HashSet<u64, std::hash::BuildHasherDefault<IdHasher>>;

/// The DATA_PLANE answer of a server without a data plane.
const NO_DATA_PLANE_TEXT: &str = "HMC_BUFFER payloads need a data plane, which this server has not configured; send INLINE or TCP_STREAM";

/// The part of [`NO_DATA_PLANE_TEXT`] a client recognises (it then stops sending HMC_BUFFER
/// on that connection).
#[doc(hidden)]
pub const NO_DATA_PLANE_MARK: &str = "which this server has not configured";

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
    /// large payloads on each side (measured in `docs/log/2026-12-01-benchmark-history.md`);
    /// frame headers and INLINE bodies always carry
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

/// What a [`StreamSink`] made of a streamed payload: a device buffer in core's erased form
/// ([`hmc_core::AnyBuffer`], which the runtime turns back into its memory's buffer type),
/// or the reason staging failed.
pub type StagedPayload = Result<hmc_core::AnyBuffer, hmc_core::Error>;

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
#[doc(hidden)]
pub trait TxQueue {
    /// See [`ServerConn::tx_slices`].
    fn tx_slices<'a>(&'a mut self, out: &mut [std::io::IoSlice<'a>]) -> usize;
    /// See [`ServerConn::advance_tx`].
    fn advance_tx(&mut self, n: usize);
}

#[cfg(test)]
mod limits_tests;

#[cfg(test)]
mod tests;
