//! Unit tests of the protocol core: a client and a server driven against each other over
//! an in-memory wire, every race between cancel, timeout and completion deterministic.

use super::*;

#[allow(unused_imports)]
use std::collections::{BTreeSet, VecDeque};
#[allow(unused_imports)]
use std::sync::Arc;
#[allow(unused_imports)]
use std::time::{Duration, Instant};

#[allow(unused_imports)]
use bytes::Bytes;

#[allow(unused_imports)]
use super::client::*;
#[allow(unused_imports)]
use super::framing::*;
#[allow(unused_imports)]
use super::server::*;
#[allow(unused_imports)]
use crate::budget::{Event, HeldBudget, SETTLE_SLACK, SKIPPED_STREAM_COST};
#[allow(unused_imports)]
use crate::frame::{
    Flags, FrameError, FrameHeader, FrameKind, FrameLimits, HEADER_LEN, INLINE_MAX, PayloadMode,
    Status, check_payload_crc, encode_frame, payload_crc,
};

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
            None => Ok(hmc_core::AnyBuffer::new(HostBytes(self.bytes))),
        }
    }
}

/// The test sink's product: the bytes, as a (host) device buffer.
#[derive(Debug)]
struct HostBytes(Vec<u8>);

impl hmc_core::DeviceBuffer for HostBytes {
    fn region(&self) -> hmc_core::Region {
        hmc_core::Region {
            device: hmc_core::Device::HOST,
            addr: self.0.as_ptr() as u64,
            len: self.0.len(),
        }
    }
}

fn staged_bytes(p: Option<StagedPayload>) -> Result<Vec<u8>, hmc_core::Error> {
    let p = p.expect("a sink took this payload")?;
    Ok(p.downcast::<HostBytes>().expect("the sink's type").0)
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
            reason: "server shutting down: calls in flight finish, new calls are refused".into()
        })
    );
    let r = responses(&mut c);
    assert_eq!((r[0].0, r[0].1), (a, Status::OK));
    assert!(matches!(
        c.start_call(1, Bytes::new(), None, false, now),
        Err(StartError::Closed(_))
    ));
}
