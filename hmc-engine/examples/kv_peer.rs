//! A KV-cache holder in its own process, driven line by line on standard input: the
//! other side of the prepared-list tests (`tests/prepared.rs`) and a model of a prefill or
//! decode engine's memory.
//!
//! It registers `--layers` regions of `--blocks` blocks of `--block` bytes, filled with
//! [`pattern`] of `--seed`, and prints `READY <name> <hex metadata blob> <region addrs…>`.
//! With `--alloc 1` the regions are the engine's own ([`Engine::alloc_mem`]: shared memory
//! under `shm` and `auto`) instead of this process's heap.
//! Commands, one per line, each answered with one line:
//!
//! - `sums`: `SUMS <checksum of every block, layer by layer>`;
//! - `fill SEED`: refills every region (`OK`);
//! - `dereg LAYER`: deregisters that layer's region (`OK`);
//! - `notifs`: `NOTIFS <n>` and, on the same line, `name:failed` of each (`-` when
//!   not a failure notice);
//! - `verify`: takes notifications until one arrives, then checks at once the block
//!   checksums its message lists (`LAYER:BLOCK:SUM,…`): `VERIFIED <name> ok|bad <failed>`;
//! - `blob`: `BLOB <hex of the full metadata blob>`;
//! - `memfd`: `MEMFD <how many regions lie in a memfd mapping>` (per `/proc/self/maps`);
//! - `quit`.
//!
//! `cargo run -p hmc-engine --example kv_peer -- --transport shm --layers 4`

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::time::Duration;

use hmc_core::AnyCommunicator;
use hmc_engine::{Access, Engine, EngineConfig, MemDesc, MemHandle, MemType};

/// The byte at `offset` of region `layer` filled with `seed` (the tests compute the same).
pub fn pattern(seed: u64, layer: u64, offset: u64) -> u8 {
    (offset
        .wrapping_mul(2_654_435_761)
        .wrapping_add(layer.wrapping_mul(40_503))
        .wrapping_add(seed.wrapping_mul(97))
        >> 7) as u8
}

fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn say(line: String) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

fn flags() -> HashMap<String, String> {
    let mut it = std::env::args().skip(1);
    let mut f = HashMap::new();
    while let Some(k) = it.next() {
        f.insert(
            k.trim_start_matches("--").to_string(),
            it.next().expect("every flag takes a value"),
        );
    }
    f
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let f = flags();
    let get = |k: &str, d: &str| f.get(k).cloned().unwrap_or_else(|| d.to_string());
    let num = |k: &str, d: u64| get(k, &d.to_string()).parse::<u64>().expect("a number");
    let (layers, blocks, block) = (num("layers", 4), num("blocks", 64), num("block", 4096));
    let e = open_engine(&f).await;
    let len = (blocks * block) as usize;
    let mut regions = Regions::new(&e, layers as usize, len, get("alloc", "0") == "1");
    regions.fill(num("seed", 1));
    let addrs: Vec<String> = regions.starts.iter().map(u64::to_string).collect();
    let blob = e.local_metadata().expect("metadata");
    say(format!(
        "READY {} {} {}",
        e.name(),
        hex(&blob),
        addrs.join(" ")
    ));
    let mut rx = stdin_lines();
    let block = block as usize;
    while let Some(line) = rx.recv().await {
        let mut w = line.split_whitespace();
        match w.next().unwrap_or("") {
            "sums" => {
                let sums: Vec<String> = (0..layers as usize)
                    .filter_map(|l| regions.bytes(l))
                    .flat_map(|m| m.chunks(block).map(|b| checksum(b).to_string()))
                    .collect();
                say(format!("SUMS {}", sums.join(" ")));
            }
            "fill" => {
                regions.fill(w.next().unwrap().parse().unwrap());
                say("OK".into());
            }
            "dereg" => {
                let l: usize = w.next().unwrap().parse().unwrap();
                if let Some(h) = regions.handles[l].take() {
                    e.deregister_mem(h).await.expect("deregister");
                }
                say("OK".into());
            }
            "notifs" => {
                let n = e.get_notifies();
                let each: Vec<String> = n
                    .iter()
                    .map(|n| format!("{}:{}", n.name, n.failed.is_some()))
                    .collect();
                say(format!("NOTIFS {} {}", n.len(), each.join(" ")));
            }
            "verify" => verify(&e, &regions, block).await,
            "blob" => say(format!("BLOB {}", hex(&e.local_metadata().unwrap()))),
            "memfd" => say(format!("MEMFD {}", regions.in_memfd())),
            "quit" | "" => break,
            other => say(format!("ERR unknown command {other}")),
        }
    }
    e.finalize().await;
    for h in std::mem::take(&mut regions.handles).into_iter().flatten() {
        e.deregister_mem(h).await.expect("deregister");
    }
    drop(regions);
}

/// The engine, on `--ip`:`--port` over `--transport`, with `--options k=v,k=v`.
async fn open_engine(f: &HashMap<String, String>) -> Engine<AnyCommunicator> {
    let get = |k: &str, d: &str| f.get(k).cloned().unwrap_or_else(|| d.to_string());
    let mut options: HashMap<String, String> = HashMap::new();
    options.insert("transport".into(), get("transport", "tcp"));
    if let Some(o) = f.get("options") {
        for kv in o.split(',').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').expect("options are k=v,k=v");
            options.insert(k.into(), v.into());
        }
    }
    let config = EngineConfig::from_options(&options).expect("options");
    let local = format!("{}:{}", get("ip", "127.0.0.1"), get("port", "0"));
    Engine::initialize_with(&local, config)
        .await
        .expect("engine")
}

/// Standard input's lines, read on a thread of their own (the runtime's threads must
/// not block on it).
fn stdin_lines() -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// `verify`: waits for a notification, then checks at once the block checksums its
/// message lists (`LAYER:BLOCK:SUM,…`) against the regions' blocks of `block` bytes.
async fn verify(e: &Engine<AnyCommunicator>, regions: &Regions, block: usize) {
    let n = loop {
        if let Some(n) = e.get_notifies().into_iter().next() {
            break n;
        }
        tokio::time::sleep(Duration::from_micros(100)).await;
    };
    // Checked before anything else happens: were the bytes there when the
    // notification was?
    let msg = String::from_utf8_lossy(&n.msg).to_string();
    let ok = msg.split(',').filter(|s| !s.is_empty()).all(|item| {
        let v: Vec<u64> = item.split(':').map(|x| x.parse().unwrap()).collect();
        let (l, b, sum) = (v[0] as usize, v[1] as usize, v[2]);
        let at = b * block;
        regions
            .bytes(l)
            .is_some_and(|m| checksum(&m[at..at + block]) == sum)
    });
    say(format!(
        "VERIFIED {} {} {}",
        n.name,
        if ok { "ok" } else { "bad" },
        n.failed.is_some()
    ));
}

/// The regions' memory: this process's heap (`heap`), or the engine's (`alloc_mem`),
/// freed by its deregistration.
struct Regions {
    heap: Vec<Vec<u8>>,
    handles: Vec<Option<MemHandle>>,
    starts: Vec<u64>,
    len: usize,
}

impl Regions {
    /// `layers` regions of `len` bytes, registered with `e` (`alloc`: allocated by it).
    fn new(e: &Engine<AnyCommunicator>, layers: usize, len: usize, alloc: bool) -> Regions {
        let mut r = Regions {
            heap: Vec::new(),
            handles: Vec::new(),
            starts: Vec::new(),
            len,
        };
        for _ in 0..layers {
            let (h, start) = if alloc {
                let (h, m) = e.alloc_mem(len, Access::READ_WRITE).expect("alloc_mem");
                (h, m.addr)
            } else {
                let m = vec![0u8; len];
                let start = m.as_ptr() as u64;
                // SAFETY: every region outlives its registration: `heap` is dropped after
                // the engine is finalized and every handle deregistered (end of `main`),
                // and never resized.
                let h = unsafe {
                    e.register_mem(
                        MemDesc { addr: start, len },
                        MemType::Host,
                        Access::READ_WRITE,
                    )
                }
                .expect("register");
                r.heap.push(m);
                (h, start)
            };
            r.handles.push(Some(h));
            r.starts.push(start);
        }
        r
    }

    /// Region `l`'s bytes while it is registered (an allocated one is freed at `dereg`).
    #[allow(clippy::mut_from_ref)]
    fn bytes(&self, l: usize) -> Option<&mut [u8]> {
        self.handles[l].is_some().then(|| {
            // SAFETY: the region is registered, so allocated (heap memory lives in `heap`;
            // engine memory until its deregistration); peers' transfers into it race with
            // this access as a DMA engine's would, which the tests order by their commands.
            unsafe { std::slice::from_raw_parts_mut(self.starts[l] as *mut u8, self.len) }
        })
    }

    /// Fills every registered region with [`pattern`] of `seed`.
    fn fill(&mut self, seed: u64) {
        for l in 0..self.handles.len() {
            if let Some(m) = self.bytes(l) {
                for (o, b) in m.iter_mut().enumerate() {
                    *b = pattern(seed, l as u64, o as u64);
                }
            }
        }
    }

    /// How many regions lie in a memfd mapping (per `/proc/self/maps`).
    fn in_memfd(&self) -> usize {
        let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
        let memfd: Vec<(u64, u64)> = maps
            .lines()
            .filter(|l| l.contains("/memfd:"))
            .filter_map(|l| {
                let (lo, hi) = l.split_whitespace().next()?.split_once('-')?;
                Some((
                    u64::from_str_radix(lo, 16).ok()?,
                    u64::from_str_radix(hi, 16).ok()?,
                ))
            })
            .collect();
        self.starts
            .iter()
            .filter(|&&a| memfd.iter().any(|&(lo, hi)| (lo..hi).contains(&a)))
            .count()
    }
}
