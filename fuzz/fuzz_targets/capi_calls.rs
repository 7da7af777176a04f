//! Fuzzes libhmc's C ABI (crate hmc-capi) with random call sequences: engines opened and
//! closed, memory registered and deregistered, connects, sync and async transfers with
//! random descriptors, request status/wait/cancel/release, notifications, and handles
//! that are stale, of another kind, of another engine or made up, with random
//! `struct_size`s. Every call must return a status the header defines, with a message when
//! it fails, and never crash. Memory is only ever registered inside this target's own
//! buffers, so a transfer the engine accepts cannot touch anything else.
#![no_main]

use std::ffi::{CStr, CString, c_char};
use std::ptr::{null, null_mut};
use std::sync::OnceLock;

use hmc::engine::{
    EngineOptions, HmcEngine, HmcMem, HmcNotifyList, HmcOption, MemDescC, NotifyC, XferDesc,
};
use hmc::request::{HmcRequest, TelemetryC, TransferArgs};
use libfuzzer_sys::fuzz_target;

const BUF: usize = 64 << 10;

/// The buffers memory is registered in: 4 per engine slot, never freed.
struct Buffers(Vec<Box<[u8]>>);

fn buffers() -> &'static Buffers {
    static B: OnceLock<Buffers> = OnceLock::new();
    B.get_or_init(|| Buffers((0..16).map(|_| vec![0u8; BUF].into_boxed_slice()).collect()))
}

/// Two engines that live for the whole run, connected to each other (opening engines per
/// input would make each run slow).
struct Pair {
    engines: [usize; 2],
    names: [CString; 2],
}

fn check(s: hmc::Status) -> hmc::Status {
    let code = s as i32;
    assert!((0..=18).contains(&code), "status {code} is not in hmc.h");
    if code >= 2 {
        // SAFETY: the library's thread-local message, valid until the next failing call.
        let msg = unsafe { CStr::from_ptr(hmc::hmc_last_error()) };
        assert!(!msg.to_bytes().is_empty(), "a failure without a message");
    }
    s
}

fn open(local: &str) -> Option<usize> {
    let key = c"transport";
    let value = c"tcp";
    let opts = [HmcOption {
        key: key.as_ptr(),
        value: value.as_ptr(),
    }];
    let o = EngineOptions {
        struct_size: size_of::<EngineOptions>(),
        options: opts.as_ptr(),
        num_options: 1,
    };
    let local = CString::new(local).unwrap();
    let mut e: *mut HmcEngine = null_mut();
    // SAFETY: valid strings, options and output.
    let s = check(unsafe { hmc::engine::hmc_engine_open(local.as_ptr(), &o, &mut e) });
    (s == hmc::Status::Ok).then_some(e as usize)
}

fn name(e: usize) -> CString {
    let mut buf = [0 as c_char; 256];
    // SAFETY: a buffer of 256 bytes.
    unsafe {
        hmc::engine::hmc_engine_name(e as *const HmcEngine, buf.as_mut_ptr(), 256, null_mut())
    };
    // SAFETY: NUL-terminated by the call (or zeroed).
    unsafe { CStr::from_ptr(buf.as_ptr()) }.to_owned()
}

fn pair() -> &'static Pair {
    static P: OnceLock<Pair> = OnceLock::new();
    P.get_or_init(|| {
        let a = open("127.0.0.1:0").expect("an engine opens");
        let b = open("127.0.0.1:0").expect("an engine opens");
        let (na, nb) = (name(a), name(b));
        // SAFETY: open engines and a valid name.
        unsafe {
            hmc::engine::hmc_connect(a as *mut HmcEngine, nb.as_ptr(), 5000);
            hmc::engine::hmc_connect(b as *mut HmcEngine, na.as_ptr(), 5000);
        }
        Pair {
            engines: [a, b],
            names: [na, nb],
        }
    })
}

/// Reads the input a byte or a word at a time (zeros once it runs out).
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else {
            return 0;
        };
        self.0 = rest;
        b
    }
    fn u64(&mut self) -> u64 {
        (0..8).fold(0, |a, _| (a << 8) | u64::from(self.u8()))
    }
    fn pick<T: Copy>(&mut self, from: &[T]) -> Option<T> {
        (!from.is_empty()).then(|| from[self.u8() as usize % from.len()])
    }
}

/// What one input made, released at its end.
#[derive(Default)]
struct Made {
    engines: Vec<usize>,
    mems: Vec<(usize, usize)>,
    reqs: Vec<(usize, usize)>,
    lists: Vec<usize>,
    /// Handles closed or released during the input (used again on purpose).
    dead: Vec<usize>,
}

impl Made {
    fn all_engines(&self) -> Vec<usize> {
        let mut v = pair().engines.to_vec();
        v.extend(&self.engines);
        v
    }
    /// A handle to pass: mostly a live one of the wanted kind, sometimes a dead one, one
    /// of another kind, NULL or a made-up number.
    fn handle(&self, inp: &mut Input, live: &[usize]) -> usize {
        match inp.u8() % 8 {
            0 => self.dead.first().copied().unwrap_or(0),
            1 => 0,
            2 => inp.u64() as usize,
            3 => self.all_engines()[0],
            4 => self.mems.first().map_or(1, |m| m.1),
            _ => inp.pick(live).unwrap_or(0),
        }
    }
}

fn mem_desc(inp: &mut Input, slot: usize) -> MemDescC {
    let buf = &buffers().0[slot % 16];
    let off = (inp.u64() as usize) % BUF;
    let len = (inp.u64() as usize) % (BUF - off + 1);
    MemDescC {
        struct_size: match inp.u8() % 16 {
            0 => inp.u64() as usize % 128,
            _ => size_of::<MemDescC>(),
        },
        addr: buf.as_ptr() as u64 + off as u64,
        len: len as u64,
        mem_type: u32::from(inp.u8() % 16 == 0),
        device_kind: 0,
        device_id: 0,
        flags: u32::from(inp.u8() % 4 == 0),
    }
}

fn descs(inp: &mut Input) -> Vec<XferDesc> {
    let n = 1 + inp.u8() as usize % 4;
    let bufs = &buffers().0;
    (0..n)
        .map(|_| {
            let near = |inp: &mut Input| {
                let b = &bufs[inp.u8() as usize % bufs.len()];
                b.as_ptr() as u64 + inp.u64() % (BUF as u64 + 64)
            };
            XferDesc {
                local_addr: near(inp),
                remote_addr: near(inp),
                len: match inp.u8() % 8 {
                    0 => inp.u64(),
                    _ => inp.u64() % 8192,
                },
            }
        })
        .collect()
}

fn step(inp: &mut Input, made: &mut Made) {
    let p = pair();
    let engines = made.all_engines();
    let e = made.handle(inp, &engines);
    let ep = e as *mut HmcEngine;
    let peer = &p.names[inp.u8() as usize % 2];
    // SAFETY (every call below): pointers are NULL or point to live values of the right
    // type; handles may be anything, which is what is being tested.
    unsafe {
        match inp.u8() % 14 {
            0 if made.engines.len() < 2 => {
                if let Some(e) = open("127.0.0.1") {
                    made.engines.push(e);
                }
            }
            1 => {
                let victim = inp.pick(&made.engines).unwrap_or(e);
                if !p.engines.contains(&victim) {
                    check(hmc::engine::hmc_engine_close(victim as *mut HmcEngine));
                    made.engines.retain(|&x| x != victim);
                    made.dead.push(victim);
                }
            }
            2 => {
                let slot =
                    engines.iter().position(|&x| x == e).unwrap_or(0) * 4 + inp.u8() as usize % 4;
                let d = mem_desc(inp, slot);
                let mut m: *mut HmcMem = null_mut();
                if check(hmc::engine::hmc_register_mem(ep, &d, &mut m)) == hmc::Status::Ok {
                    made.mems.push((e, m as usize));
                }
            }
            3 => {
                let mems: Vec<usize> = made.mems.iter().map(|m| m.1).collect();
                let m = made.handle(inp, &mems);
                if check(hmc::engine::hmc_deregister_mem(ep, m as *mut HmcMem)) == hmc::Status::Ok {
                    made.mems.retain(|x| x.1 != m);
                    made.dead.push(m);
                }
            }
            4 => {
                check(hmc::engine::hmc_connect(ep, peer.as_ptr(), 2000));
            }
            5 => {
                let d = descs(inp);
                // A count past the array is only ever one over the engine's limit (refused
                // before anything is read); anything between would be the caller's bug.
                let n = match inp.u8() % 16 {
                    0 => usize::MAX - inp.u8() as usize,
                    1 => 0,
                    _ => d.len(),
                };
                let dp = if inp.u8() % 16 == 0 {
                    null()
                } else {
                    d.as_ptr()
                };
                let op = u32::from(inp.u8() % 3);
                check(hmc::engine::hmc_transfer_sync(
                    ep,
                    peer.as_ptr(),
                    op,
                    dp,
                    n,
                    2000,
                ));
            }
            6 => {
                let d = descs(inp);
                let args = TransferArgs {
                    struct_size: if inp.u8() % 8 == 0 {
                        3
                    } else {
                        size_of::<TransferArgs>()
                    },
                    ..TransferArgs::default()
                };
                let mut r: *mut HmcRequest = null_mut();
                let s = hmc::request::hmc_transfer_async(
                    ep,
                    peer.as_ptr(),
                    u32::from(inp.u8() % 2),
                    d.as_ptr(),
                    d.len(),
                    2000,
                    &args,
                    &mut r,
                );
                if check(s) == hmc::Status::Ok {
                    made.reqs.push((e, r as usize));
                }
            }
            7 => {
                let reqs: Vec<usize> = made.reqs.iter().map(|r| r.1).collect();
                let r = made.handle(inp, &reqs) as *mut HmcRequest;
                let mut state = 0u32;
                match inp.u8() % 5 {
                    0 => check(hmc::request::hmc_request_status(ep, r, &mut state)),
                    1 => check(hmc::request::hmc_request_wait(
                        ep,
                        r,
                        u32::from(inp.u8() % 3),
                    )),
                    2 => check(hmc::request::hmc_request_cancel(ep, r)),
                    3 => {
                        let mut t = TelemetryC {
                            struct_size: size_of::<TelemetryC>(),
                            ..TelemetryC::default()
                        };
                        check(hmc::request::hmc_request_telemetry(ep, r, &mut t))
                    }
                    _ => {
                        let s = check(hmc::request::hmc_request_release(ep, r));
                        if s == hmc::Status::Ok {
                            made.reqs.retain(|x| x.1 != r as usize);
                            made.dead.push(r as usize);
                        }
                        s
                    }
                };
            }
            8 => {
                let mut done = [null_mut::<HmcRequest>(); 8];
                let mut n = 0usize;
                check(hmc::request::hmc_engine_poll_completed(
                    ep,
                    done.as_mut_ptr(),
                    8,
                    &mut n,
                ));
                assert!(n <= 8);
            }
            9 => {
                let msg = [inp.u8(); 16];
                // Past the array only beyond max_notify_len (refused before it is read).
                let len = if inp.u8() % 8 == 0 {
                    1 << 30
                } else {
                    msg.len()
                };
                check(hmc::engine::hmc_send_notify(
                    ep,
                    peer.as_ptr(),
                    c"n".as_ptr(),
                    msg.as_ptr(),
                    len,
                    2000,
                ));
            }
            10 => {
                let mut l: *mut HmcNotifyList = null_mut();
                let mut n = 0usize;
                if check(hmc::engine::hmc_get_notifies(ep, &mut l, &mut n)) == hmc::Status::Ok {
                    for i in 0..n + 1 {
                        let mut item: *const NotifyC = null();
                        if check(hmc::engine::hmc_notify_list_get(l, i, &mut item))
                            == hmc::Status::Ok
                        {
                            assert!(i < n && !(*item).name.is_null());
                        }
                    }
                    made.lists.push(l as usize);
                }
            }
            11 => {
                let l = made.handle(inp, &made.lists.clone());
                if check(hmc::engine::hmc_notify_list_free(l as *mut HmcNotifyList))
                    == hmc::Status::Ok
                {
                    made.lists.retain(|&x| x != l);
                    made.dead.push(l);
                }
            }
            12 => {
                let mut len = 0usize;
                let mut buf = [0u8; 64];
                check(hmc::engine::hmc_local_metadata(
                    ep,
                    buf.as_mut_ptr(),
                    64,
                    &mut len,
                ));
                check(hmc::engine::hmc_engine_name(ep, null_mut(), 0, &mut len));
            }
            _ => {
                check(hmc::engine::hmc_disconnect(ep, peer.as_ptr()));
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input(data);
    let mut made = Made::default();
    for _ in 0..64 {
        if inp.0.is_empty() {
            break;
        }
        step(&mut inp, &mut made);
    }
    // Leave the pair as it was: release what this input made.
    // SAFETY: handles made above (released ones fail with a status, which is fine).
    unsafe {
        for (e, r) in made.reqs.drain(..) {
            hmc::request::hmc_request_release(e as *mut HmcEngine, r as *mut HmcRequest);
        }
        for (e, m) in made.mems.drain(..) {
            hmc::engine::hmc_deregister_mem(e as *mut HmcEngine, m as *mut HmcMem);
        }
        for l in made.lists.drain(..) {
            hmc::engine::hmc_notify_list_free(l as *mut HmcNotifyList);
        }
        for e in made.engines.drain(..) {
            hmc::engine::hmc_engine_close(e as *mut HmcEngine);
        }
        for e in pair().engines {
            let mut l: *mut HmcNotifyList = null_mut();
            let mut n = 0usize;
            if hmc::engine::hmc_get_notifies(e as *mut HmcEngine, &mut l, &mut n) == hmc::Status::Ok
            {
                hmc::engine::hmc_notify_list_free(l);
            }
        }
    }
});
