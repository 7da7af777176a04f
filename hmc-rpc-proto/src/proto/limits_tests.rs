//! The server core's resource bounds, step by step with simulated time: held-byte
//! accounting and its budgets, backpressure on streamed answers, write stalls, stalled and
//! refused request streams, call-based idleness, and half-close.

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

fn header(kind: FrameKind, id: u64) -> FrameHeader {
    let mut h = FrameHeader::new(kind, id);
    h.method_id = 1;
    h
}

/// An INLINE request.
fn request(id: u64, body: &[u8]) -> Vec<u8> {
    let mut h = header(FrameKind::Request, id);
    h.mode = PayloadMode::Inline;
    h.payload_len = body.len() as u64;
    h.body_len = body.len() as u32;
    h.payload_crc = payload_crc(body);
    let mut v = Vec::new();
    encode_frame(&mut v, &h, body);
    v
}

/// The header frame of a TCP_STREAM request of `len` bytes (no DATA yet).
fn stream_request(id: u64, len: u64) -> Vec<u8> {
    let mut h = header(FrameKind::Request, id);
    h.mode = PayloadMode::TcpStream;
    h.payload_len = len;
    let mut v = Vec::new();
    encode_frame(&mut v, &h, &[]);
    v
}

/// One DATA chunk of a `total`-byte stream.
fn data(id: u64, total: u64, chunk: &[u8], end: bool) -> Vec<u8> {
    let mut h = header(FrameKind::Data, id);
    h.mode = PayloadMode::TcpStream;
    h.payload_len = total;
    h.body_len = chunk.len() as u32;
    if end {
        h.flags = Flags::END;
    }
    let mut v = Vec::new();
    encode_frame(&mut v, &h, chunk);
    v
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

/// Every RESPONSE frame queued so far, with its status and INLINE body.
fn answers(s: &mut ServerConn) -> Vec<(u64, Status, String)> {
    let mut out = Vec::new();
    loop {
        let b = s.pending_tx().to_vec();
        if b.is_empty() {
            break;
        }
        s.advance_tx(b.len());
        out.extend_from_slice(&b);
    }
    let mut v = vec![];
    let mut at = 0;
    let limits = FrameLimits::default();
    while at + HEADER_LEN <= out.len() {
        let h = FrameHeader::decode(&out[at..at + HEADER_LEN], &limits).unwrap();
        let body = &out[at + HEADER_LEN..at + HEADER_LEN + h.body_len as usize];
        if h.kind == FrameKind::Response || h.kind == FrameKind::GoAway {
            v.push((
                h.request_id,
                h.status,
                String::from_utf8_lossy(body).into_owned(),
            ));
        }
        at += HEADER_LEN + h.body_len as usize;
    }
    v
}

fn cfg() -> ConnConfig {
    ConnConfig {
        max_conn_held_bytes: 10 << 20,
        max_tx_backlog: 4 << 20,
        ..ConnConfig::default()
    }
}

#[test]
fn streamed_answers_count_toward_the_backlog_and_stop_reads() {
    let now = Instant::now();
    let mut s = ServerConn::new(cfg(), now);
    for id in 1..=5 {
        s.handle_input(&request(id, b"x"), now);
    }
    assert_eq!(calls(&mut s).len(), 5);
    // Three 1 MiB answers queued, none written: 3 MiB of the 4 MiB backlog.
    for id in 1..=3 {
        s.respond(id, 1, Status::OK, Bytes::from(vec![7u8; 1 << 20]), now);
    }
    assert!(s.tx_backlog() >= 3 << 20, "unscheduled stream bytes count");
    assert!(s.may_read());
    s.respond(4, 1, Status::OK, Bytes::from(vec![7u8; 1 << 20]), now);
    assert!(!s.may_read(), "4 MiB waiting: reading stops");
    assert!(s.held_bytes() >= 4 << 20);
    // The peer reads: the backlog drains and reading resumes.
    let _ = answers(&mut s);
    assert!(s.may_read());
    assert_eq!(s.tx_backlog(), 0);
}

#[test]
fn incomplete_streams_are_admitted_only_within_the_connection_budget_and_expire() {
    let now = Instant::now();
    let budget = Arc::new(HeldBudget::new(u64::MAX));
    let mut s = ServerConn::with_budget(cfg(), now, budget.clone());
    // Two 4 MiB bodies fit the 10 MiB budget; the third is refused before any DATA.
    for id in 1..=3 {
        s.handle_input(&stream_request(id, 4 << 20), now);
    }
    s.handle_input(&data(1, 4 << 20, &[1u8; 1000], false), now);
    let a = answers(&mut s);
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!((a[0].0, a[0].1), (3, Status::OVERLOADED));
    assert!(a[0].2.contains("max_conn_held_bytes"), "{}", a[0].2);
    assert!(
        a[0].2.contains("ConnConfig::max_conn_held_bytes"),
        "{}",
        a[0].2
    );
    s.settle(now);
    assert!(budget.held() >= 8 << 20, "both admitted bodies are charged");
    assert_eq!(budget.stats().refused_conn_budget, 1);
    // Stream 1 sent a chunk at `now`; nothing more comes. Both stall and are failed.
    let idle = ConnConfig::default().stream_idle_timeout;
    assert!(s.poll_timeout().unwrap() <= now + idle);
    s.handle_timeout(now + idle - Duration::from_millis(1));
    assert!(answers(&mut s).is_empty());
    s.handle_timeout(now + idle);
    let a = answers(&mut s);
    let failed: Vec<_> = a.iter().filter(|x| x.0 != 3).collect();
    assert_eq!(failed.len(), 2, "{a:?}");
    for (_, st, why) in failed {
        assert_eq!(*st, Status::DEADLINE_EXCEEDED);
        assert!(why.contains("stream_idle_timeout"), "{why}");
    }
    s.settle(now + idle);
    assert_eq!(budget.held(), 0, "every held byte is released");
    assert_eq!(budget.stats().streams_stalled, 2);
    // The refused stream 3 was forgotten too: nothing is left to time out but idleness.
    assert_eq!(s.f.streams_in.len(), 0);
}

#[test]
fn a_call_whose_deadline_passes_mid_body_is_freed() {
    let now = Instant::now();
    let mut s = ServerConn::new(cfg(), now);
    let mut h = stream_request(1, 8 << 20);
    // Deadline budget of one second.
    let mut hd = FrameHeader::decode(&h[..HEADER_LEN], &FrameLimits::default()).unwrap();
    hd.deadline_us = 1_000_000;
    h.clear();
    encode_frame(&mut h, &hd, &[]);
    s.handle_input(&h, now);
    s.handle_input(&data(1, 8 << 20, &[0u8; 64 << 10], false), now);
    assert!(s.held_bytes() >= 8 << 20);
    s.handle_timeout(now + Duration::from_secs(1));
    let a = answers(&mut s);
    assert_eq!((a[0].0, a[0].1), (1, Status::DEADLINE_EXCEEDED));
    assert!(
        s.held_bytes() <= SKIPPED_STREAM_COST,
        "only the skipped stream's entry is left: {}",
        s.held_bytes()
    );
    // Its remaining DATA is still read and dropped; then the entry goes.
    let chunk = vec![0u8; 256 << 10];
    let mut sent = 64 << 10;
    while sent < 8 << 20 {
        let n = chunk.len().min((8 << 20) - sent);
        sent += n;
        s.handle_input(&data(1, 8 << 20, &chunk[..n], sent == 8 << 20), now);
    }
    assert_eq!(s.held_bytes(), 0);
    assert!(s.close_reason().is_none());
}

#[test]
fn refused_streams_are_bounded_like_calls() {
    let now = Instant::now();
    let c = ConnConfig {
        max_inflight: 4,
        ..cfg()
    };
    let mut s = ServerConn::new(c, now);
    // Payloads over max_payload_len are refused; each leaves a skipped stream.
    for id in 1..=4 {
        s.handle_input(&stream_request(id, 1 << 40), now);
    }
    let a = answers(&mut s);
    assert_eq!(a.len(), 4);
    assert!(a.iter().all(|x| x.1 == Status::PAYLOAD_TOO_LARGE));
    assert_eq!(s.held_bytes(), 4 * SKIPPED_STREAM_COST);
    assert!(s.close_reason().is_none());
    // A fifth unfinished refusal closes the connection instead of growing the table.
    s.handle_input(&stream_request(5, 1 << 40), now);
    let why = s.close_reason().expect("closed").to_string();
    assert!(why.contains("max_inflight_per_conn"), "{why}");
    let a = answers(&mut s);
    assert_eq!(a.last().unwrap().1, Status::OVERLOADED);
}

#[test]
fn a_peer_that_reads_nothing_is_dropped_after_the_write_stall_timeout() {
    let now = Instant::now();
    let budget = Arc::new(HeldBudget::default());
    let mut s = ServerConn::with_budget(cfg(), now, budget.clone());
    s.handle_input(&request(1, b"x"), now);
    assert_eq!(calls(&mut s).len(), 1);
    s.respond(1, 1, Status::OK, Bytes::from(vec![1u8; 1 << 20]), now);
    s.settle(now);
    let stall = ConnConfig::default().write_stall_timeout;
    assert_eq!(s.poll_timeout(), Some(now + stall));
    // Some bytes go out halfway: the clock restarts from there.
    let half = now + stall / 2;
    let n = s.pending_tx().len().min(1000);
    s.advance_tx(n);
    s.settle(half);
    s.handle_timeout(now + stall);
    assert!(s.close_reason().is_none());
    s.handle_timeout(half + stall);
    let why = s.close_reason().expect("closed").to_string();
    assert!(why.contains("write_stall_timeout"), "{why}");
    assert_eq!(budget.stats().closed_write_stall, 1);
}

#[test]
fn the_process_budget_is_shared_by_connections() {
    let now = Instant::now();
    let budget = Arc::new(HeldBudget::new(6 << 20));
    let mut a = ServerConn::with_budget(cfg(), now, budget.clone());
    let mut b = ServerConn::with_budget(cfg(), now, budget.clone());
    a.handle_input(&stream_request(1, 4 << 20), now);
    a.settle(now);
    b.handle_input(&stream_request(1, 4 << 20), now);
    let got = answers(&mut b);
    assert_eq!(got[0].1, Status::OVERLOADED);
    assert!(got[0].2.contains("max_held_bytes"), "{}", got[0].2);
    assert!(
        got[0].2.contains("ServerConfig::max_held_bytes"),
        "{}",
        got[0].2
    );
    assert_eq!(budget.stats().refused_process_budget, 1);
    // Connection a goes away: its bytes are released and b's next call is admitted.
    drop(a);
    assert_eq!(budget.held(), SKIPPED_STREAM_COST.min(budget.held()));
    b.handle_input(&stream_request(3, 4 << 20), now);
    b.settle(now);
    assert!(answers(&mut b).is_empty());
    assert!(budget.held() >= 4 << 20);
    assert_eq!(budget.stats().held_bytes_peak, budget.held().max(4 << 20));
}

#[test]
fn half_close_answers_the_calls_received_then_finishes() {
    let now = Instant::now();
    let budget = Arc::new(HeldBudget::default());
    let mut s = ServerConn::with_budget(cfg(), now, budget.clone());
    s.handle_input(&request(1, b"a"), now);
    s.handle_input(&stream_request(2, 1 << 20), now);
    s.handle_input(&data(2, 1 << 20, &[0u8; 1000], false), now);
    let got = calls(&mut s);
    assert_eq!(got.len(), 1);
    s.handle_eof(now);
    assert!(!s.may_read());
    assert!(!s.finished(), "call 1 is still to be answered");
    s.respond(1, 1, Status::OK, Bytes::from(vec![9u8; 3 << 20]), now);
    assert!(!s.finished(), "its answer is still to be written");
    let a = answers(&mut s);
    // Call 2's body can never complete: failed, not left hanging.
    let two = a.iter().find(|x| x.0 == 2).expect("call 2 answered");
    assert_eq!(two.1, Status::CANCELLED);
    assert!(s.finished());
    assert_eq!(budget.stats().half_closed, 1);
}

#[test]
fn idle_connection_is_closed_and_pings_do_not_keep_it_but_calls_do() {
    let now = Instant::now();
    let cfg = ConnConfig {
        idle_timeout: Duration::from_secs(5),
        ..ConnConfig::default()
    };
    let mut s = ServerConn::new(cfg.clone(), now);
    // A PING is answered, but liveness counts calls: a peer that only pings is idle.
    let t1 = now + Duration::from_secs(4);
    let mut ping = Vec::new();
    encode_frame(&mut ping, &FrameHeader::new(FrameKind::Ping, 9), &[]);
    s.handle_input(&ping, t1);
    let out = s.pending_tx().to_vec();
    s.advance_tx(out.len());
    let pong = FrameHeader::decode(&out, &FrameLimits::default()).unwrap();
    assert_eq!((pong.kind, pong.request_id), (FrameKind::Pong, 9));
    s.handle_timeout(now + Duration::from_secs(4));
    assert!(s.close_reason().is_none());
    s.handle_timeout(now + Duration::from_secs(5));
    assert!(
        s.close_reason().unwrap().contains("idle"),
        "a pinging peer is idle"
    );

    // A call answered at t1 restarts the clock from its answer.
    let mut s = ServerConn::new(cfg, now);
    s.handle_input(&request(1, b"hi"), t1);
    assert_eq!(calls(&mut s).len(), 1);
    s.respond(1, 1, Status::OK, Bytes::from_static(b"hi"), t1);
    s.handle_timeout(now + Duration::from_secs(6));
    assert!(s.close_reason().is_none());
    s.handle_timeout(t1 + Duration::from_secs(5));
    assert!(s.close_reason().unwrap().contains("idle"));
}

#[test]
fn after_a_fin_running_calls_probe_the_peer_with_pings() {
    let now = Instant::now();
    let mut s = ServerConn::new(cfg(), now);
    s.handle_input(&request(1, b"slow"), now);
    assert_eq!(calls(&mut s).len(), 1);
    s.handle_eof(now);
    assert!(!s.has_tx());
    let t = s.poll_timeout().expect("a probe is due");
    assert!(t <= now + PROBE_INTERVAL);
    s.handle_timeout(t);
    let out = s.pending_tx().to_vec();
    let h = FrameHeader::decode(&out[..HEADER_LEN], &FrameLimits::default()).unwrap();
    assert_eq!(
        h.kind,
        FrameKind::Ping,
        "a vanished peer resets on this write"
    );
    s.advance_tx(out.len());
    // Once the call is answered there is nothing left to probe for.
    s.respond(1, 1, Status::OK, Bytes::from_static(b"done"), t);
    let _ = answers(&mut s);
    assert!(s.finished());
}
