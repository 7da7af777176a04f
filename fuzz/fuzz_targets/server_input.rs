//! Fuzzes the sans-IO server core: arbitrary frames (header CRCs fixed up so that the
//! fuzzer reaches the protocol logic), split at arbitrary points, with time advancing. It
//! never panics, answers every call at most once, and bounds what it queues.
#![no_main]

use std::time::{Duration, Instant};

use hmc_rpc_proto::Status;
use hmc_rpc_proto::proto::{ConnConfig, ServerConn, ServerEvent};
use libfuzzer_sys::fuzz_target;

/// Turns the input into frames: 44 header bytes, a correct header CRC, then the body
/// the header announces (as far as the input goes, at most 8 KiB).
fn frames(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while data.len() >= 44 {
        let start = out.len();
        out.extend_from_slice(&data[..44]);
        out.extend_from_slice(&crc32c::crc32c(&data[..44]).to_be_bytes());
        data = &data[44..];
        let body_len = u32::from_be_bytes(out[start + 32..start + 36].try_into().unwrap()) as usize;
        let n = body_len.min(data.len()).min(8192);
        out.extend_from_slice(&data[..n]);
        data = &data[n..];
    }
    out.extend_from_slice(data);
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let wire = if mode & 1 == 1 {
        frames(rest)
    } else {
        rest.to_vec()
    };
    let now = Instant::now();
    let cfg = ConnConfig {
        max_inflight: 4,
        ..ConnConfig::default()
    };
    let mut s = ServerConn::new(cfg, now);
    let step = usize::from(mode >> 1).max(1);
    for (i, piece) in wire.chunks(step).enumerate() {
        let t = now + Duration::from_millis(i as u64 * 7);
        s.handle_input(piece, t);
        while let Some(ev) = s.poll_event() {
            if let ServerEvent::Call(c) = ev {
                if c.request_id % 3 != 0 {
                    s.respond(c.request_id, c.method_id, Status::OK, c.payload, t);
                }
            }
        }
        s.handle_timeout(t);
        assert!(s.inflight_len() <= 4);
        while !s.pending_tx().is_empty() {
            let n = s.pending_tx().len();
            s.advance_tx(n);
        }
    }
});
