//! libhmc's C ABI beside the Rust API, in one run (issue 57, part 7):
//!
//! - a 4 KiB sync WRITE and READ over TCP: `hmc_transfer_sync` against the Rust engine's
//!   `transfer` driven by `block_on` (what `BlockingEngine` does); target: C within 3%;
//! - a 64 B RPC echo: `hmc_rpc_call_sync` (+ `hmc_bytes_free`) against the Rust
//!   `Client::call` driven by `block_on`, both to one Rust server; target: C within 5%;
//! - an async 4 KiB WRITE's completion: waiting on the engine's descriptor (`poll`, then
//!   `hmc_engine_poll_completed`) against polling `hmc_request_status`; target: the
//!   descriptor no slower.
//!
//! The C functions are called as `extern "C"` functions of the rlib: the code a C program
//! runs, without the PLT hop. Each round measures every variant back to back (the order
//! alternating), so the host's drift hits all; printed are the medians of the rounds'
//! per-op times and, as the verdict, the median of the per-round ratios. The RPC server
//! runs on a runtime of its own, the Rust engines and client on another (two workers, as
//! the library's), the C side on the library's.
//!
//! `cargo bench -p hmc-capi --bench capi [-- --rounds N --ops N]`

use std::ffi::{CStr, CString};
use std::ptr::{null, null_mut};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc::engine::{
    EngineOptions, HmcEngine, HmcMem, HmcOption, MemDescC, XferDesc, hmc_connect, hmc_engine_name,
    hmc_engine_open, hmc_register_mem, hmc_transfer_sync,
};
use hmc::request::{
    HmcRequest, hmc_engine_poll_completed, hmc_request_release, hmc_request_status,
    hmc_transfer_async,
};
use hmc::rpc::{HmcBytes, HmcRpcClient, hmc_bytes_free, hmc_rpc_call_sync, hmc_rpc_client_connect};
use hmc_engine::{Access, Engine, EngineConfig, MemDesc, MemType, TransferOp, TransferOpDesc};

const LEN: usize = 4096;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ok(s: hmc::Status, what: &str) {
    if s != hmc::Status::Ok {
        // SAFETY: the library's message for this thread.
        let m = unsafe { CStr::from_ptr(hmc::hmc_last_error()) };
        panic!("{what}: {s:?}: {}", m.to_string_lossy());
    }
}

/// Microseconds per op of `ops` runs of `f`.
fn per_op(ops: usize, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..ops {
        f();
    }
    t.elapsed().as_secs_f64() * 1e6 / ops as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Two C engines over TCP with a registered 4 KiB buffer each, the first connected to
/// the second; returns (engine, peer name, local buffer, remote buffer address).
fn c_engines() -> (usize, CString, Box<[u8]>, Box<[u8]>) {
    let opts = [HmcOption {
        key: c"transport".as_ptr(),
        value: c"tcp".as_ptr(),
    }];
    let o = EngineOptions {
        struct_size: size_of::<EngineOptions>(),
        options: opts.as_ptr(),
        num_options: 1,
    };
    let (mut a, mut b): (*mut HmcEngine, *mut HmcEngine) = (null_mut(), null_mut());
    let src = vec![1u8; LEN].into_boxed_slice();
    let dst = vec![0u8; LEN].into_boxed_slice();
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: valid strings, options, outputs and buffers that live for the whole run.
    unsafe {
        ok(hmc_engine_open(c"127.0.0.1".as_ptr(), &o, &mut a), "open");
        ok(hmc_engine_open(c"127.0.0.1:0".as_ptr(), &o, &mut b), "open");
        for (e, buf) in [(a, &src), (b, &dst)] {
            let d = MemDescC {
                struct_size: size_of::<MemDescC>(),
                addr: buf.as_ptr() as u64,
                len: LEN as u64,
                ..MemDescC::default()
            };
            let mut m: *mut HmcMem = null_mut();
            ok(hmc_register_mem(e, &d, &mut m), "register");
        }
        ok(
            hmc_engine_name(b, name.as_mut_ptr(), 256, null_mut()),
            "name",
        );
        ok(hmc_connect(a, name.as_ptr(), 5000), "connect");
        (
            a as usize,
            CStr::from_ptr(name.as_ptr()).to_owned(),
            src,
            dst,
        )
    }
}

fn main() {
    let rounds = arg("--rounds", 9);
    let ops = arg("--ops", 2000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    // The Rust engines, on a runtime of two workers as the library's.
    let config = || {
        let o: std::collections::HashMap<String, String> =
            [("transport".to_string(), "tcp".to_string())].into();
        EngineConfig::from_options(&o).unwrap()
    };
    let (ra, rb) = rt.block_on(async {
        let a = Engine::initialize_with("127.0.0.1", config())
            .await
            .unwrap();
        let b = Engine::initialize_with("127.0.0.1:0", config())
            .await
            .unwrap();
        (a, b)
    });
    let rsrc = vec![1u8; LEN];
    let rdst = vec![0u8; LEN];
    // SAFETY: both buffers outlive the engines (dropped at the end of main, after them).
    unsafe {
        let d = |b: &Vec<u8>| MemDesc {
            addr: b.as_ptr() as u64,
            len: LEN,
        };
        ra.register_mem(d(&rsrc), MemType::Host, Access::READ_WRITE)
            .unwrap();
        rb.register_mem(d(&rdst), MemType::Host, Access::READ_WRITE)
            .unwrap();
    }
    let t = Duration::from_secs(5);
    rt.block_on(ra.connect(rb.name(), t)).unwrap();
    let rdesc = [TransferOpDesc {
        local_addr: rsrc.as_ptr() as u64,
        remote_addr: rdst.as_ptr() as u64,
        len: LEN,
    }];

    let (ca, cpeer, csrc, cdst) = c_engines();
    let cdesc = [XferDesc {
        local_addr: csrc.as_ptr() as u64,
        remote_addr: cdst.as_ptr() as u64,
        len: LEN as u64,
    }];
    let ce = ca as *mut HmcEngine;

    // An RPC server with the demo methods on a runtime of its own (so that neither client
    // shares the server's runtime), a Rust client and a C client.
    let srv_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = srv_rt.block_on(async {
        let mut d = hmc_rpc::Dispatcher::new();
        hmc_rpc::demo::register_demo(&mut d);
        hmc_rpc::Server::new(d, hmc_rpc::ServerConfig::default())
            .bind(&"tcp://127.0.0.1:0".parse().unwrap())
            .await
            .unwrap()
    });
    let addr = server.local_addr().clone();
    let rclient = Arc::new(
        rt.block_on(hmc_rpc::Client::connect(
            &addr,
            hmc_rpc::ClientConfig::default(),
        ))
        .unwrap(),
    );
    let caddr = CString::new(addr.to_string()).unwrap();
    let mut cclient: *mut HmcRpcClient = null_mut();
    // SAFETY: a valid address and output.
    ok(
        unsafe { hmc_rpc_client_connect(caddr.as_ptr(), null(), &mut cclient) },
        "rpc connect",
    );
    let payload = bytes::Bytes::from(vec![7u8; 64]);
    let mut fd = 0;
    // SAFETY: an open engine and a valid output.
    ok(unsafe { hmc::engine::hmc_engine_fd(ce, &mut fd) }, "fd");

    // An async 4 KiB WRITE posted through the C ABI.
    let post = || {
        let mut r: *mut HmcRequest = null_mut();
        // SAFETY: registered buffers, an open engine, a valid name and output.
        ok(
            unsafe {
                hmc_transfer_async(
                    ce,
                    cpeer.as_ptr(),
                    1,
                    cdesc.as_ptr(),
                    1,
                    5000,
                    null(),
                    &mut r,
                )
            },
            "post",
        );
        r
    };

    let mut rows: Vec<(&str, Vec<f64>)> = [
        "rust write 4 KiB",
        "c write 4 KiB",
        "rust read 4 KiB",
        "c read 4 KiB",
        "rust rpc echo 64 B",
        "c rpc echo 64 B",
        "c async, status polling",
        "c async, fd",
    ]
    .into_iter()
    .map(|n| (n, Vec::new()))
    .collect();
    for round in 0..rounds {
        let mut results = [0f64; 8];
        // Alternate which of each pair goes first.
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for pair in 0..4 {
            for &which in &order {
                let slot = pair * 2 + which;
                results[slot] = match slot {
                    0 | 2 => {
                        let op = if slot == 0 {
                            TransferOp::Write
                        } else {
                            TransferOp::Read
                        };
                        per_op(ops, || {
                            rt.block_on(ra.transfer(rb.name(), op, &rdesc, t)).unwrap()
                        })
                    }
                    1 | 3 => {
                        let op = if slot == 1 { 1 } else { 0 };
                        // SAFETY: registered buffers, an open engine, a valid name.
                        per_op(ops, || unsafe {
                            ok(
                                hmc_transfer_sync(ce, cpeer.as_ptr(), op, cdesc.as_ptr(), 1, 5000),
                                "transfer",
                            )
                        })
                    }
                    4 => per_op(ops, || {
                        let c = rclient.clone();
                        let p = payload.clone();
                        rt.block_on(async move { c.call(hmc_rpc::demo::ECHO, p).await })
                            .unwrap();
                    }),
                    5 => per_op(ops, || {
                        let mut b: *mut HmcBytes = null_mut();
                        // SAFETY: an open client, 64 readable bytes, a valid output.
                        unsafe {
                            ok(
                                hmc_rpc_call_sync(
                                    cclient,
                                    1,
                                    payload.as_ptr(),
                                    64,
                                    5000,
                                    &mut b,
                                    null_mut(),
                                ),
                                "rpc",
                            );
                            hmc_bytes_free(b);
                        }
                    }),
                    6 => per_op(ops, || {
                        let r = post();
                        // SAFETY: an open engine and a request of it, released once ended.
                        unsafe {
                            while hmc_request_status(ce, r, null_mut()) == hmc::Status::Pending {
                                std::hint::spin_loop();
                            }
                            // The completion queue keeps released requests' ids: drain it.
                            let mut done = [null_mut::<HmcRequest>(); 4];
                            let mut n = 0;
                            hmc_engine_poll_completed(ce, done.as_mut_ptr(), 4, &mut n);
                            hmc_request_release(ce, r);
                        }
                    }),
                    _ => per_op(ops, || {
                        let r = post();
                        // SAFETY: as above.
                        unsafe {
                            let mut n = 0;
                            while n == 0 {
                                let mut p = libc::pollfd {
                                    fd,
                                    events: libc::POLLIN,
                                    revents: 0,
                                };
                                libc::poll(&mut p, 1, 1000);
                                hmc::engine::hmc_engine_fd_drain(ce);
                                let mut done = [null_mut::<HmcRequest>(); 4];
                                hmc_engine_poll_completed(ce, done.as_mut_ptr(), 4, &mut n);
                            }
                            hmc_request_release(ce, r);
                        }
                    }),
                };
            }
        }
        for (row, v) in rows.iter_mut().zip(results) {
            row.1.push(v);
        }
        eprintln!("round {}/{rounds}: {results:.1?}", round + 1);
    }
    // The host's load moves both sides of a pair together within a round (they run back
    // to back), so the verdict is the median of the per-round ratios.
    let med: Vec<f64> = rows.iter().map(|r| median(r.1.clone())).collect();
    let ratio = |a: usize, b: usize| {
        median(
            rows[a]
                .1
                .iter()
                .zip(&rows[b].1)
                .map(|(x, y)| x / y)
                .collect(),
        )
    };
    println!(
        "\n{ops} ops x {rounds} rounds: medians of the rounds (us per op), and the median of the per-round ratios"
    );
    println!("| path | us/op | ratio | target |");
    println!("| --- | --- | --- | --- |");
    let line = |name: &str, v: f64, r: Option<f64>, target: &str| {
        let ratio = r.map_or("".to_string(), |r| format!("{r:.3}"));
        println!("| {name} | {v:.2} | {ratio} | {target} |");
    };
    line(rows[0].0, med[0], None, "");
    line(rows[1].0, med[1], Some(ratio(1, 0)), "C / Rust ≤ 1.03");
    line(rows[2].0, med[2], None, "");
    line(rows[3].0, med[3], Some(ratio(3, 2)), "C / Rust ≤ 1.03");
    line(rows[4].0, med[4], None, "");
    line(rows[5].0, med[5], Some(ratio(5, 4)), "C / Rust ≤ 1.05");
    line(rows[6].0, med[6], None, "");
    line(rows[7].0, med[7], Some(ratio(7, 6)), "fd / polling ≤ 1.00");
    // The per-round ratios, to show the spread.
    for (a, b, name) in [
        (1, 0, "write"),
        (3, 2, "read"),
        (5, 4, "rpc"),
        (7, 6, "fd/poll"),
    ] {
        let r: Vec<String> = rows[a]
            .1
            .iter()
            .zip(&rows[b].1)
            .map(|(x, y)| format!("{:.3}", x / y))
            .collect();
        println!("per-round ratio {name}: {}", r.join(" "));
    }
}
