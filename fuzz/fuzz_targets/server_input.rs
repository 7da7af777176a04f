//! Fuzzes the sans-IO server core with arbitrary bytes split at arbitrary points: it never
//! panics, and a connection it closes says why with a GOAWAY.
#![no_main]

use std::time::{Duration, Instant};

use hmc_rpc::proto::{ConnConfig, ServerConn, ServerEvent};
use hmc_rpc::Status;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let now = Instant::now();
    let mut s = ServerConn::new(ConnConfig::default(), now);
    let step = usize::from(split).max(1);
    for (i, piece) in rest.chunks(step).enumerate() {
        let t = now + Duration::from_millis(i as u64);
        s.handle_input(piece, t);
        while let Some(ev) = s.poll_event() {
            if let ServerEvent::Call(c) = ev {
                s.respond(c.request_id, c.method_id, Status::OK, c.payload, t);
            }
        }
        s.handle_timeout(t);
        while !s.pending_tx().is_empty() {
            let n = s.pending_tx().len();
            s.advance_tx(n);
        }
    }
});
