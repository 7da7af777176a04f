//! One engine of a cluster that finds its peers through a metadata store (etcd), for the
//! discovery tests and `cargo xtask cluster-test`:
//!
//! - `serve`: registers a buffer of `--mib` MiB filled from `--seed`, publishes where it is
//!   (`buffer` = address, length, checksum), prints `READY <name> <address>`, and stays up
//!   until its standard input closes;
//! - `pull`: finds `--peer` by name, READs its whole buffer `--rounds` times (0: until
//!   stdin closes), checking the checksum each time. A failure is printed with how long
//!   after the last good round it came (`FAIL <ms> <error>`); it then connects again by
//!   name until the peer is back (`RESUMED <ms>`). Ends with `SUMMARY ok=… failed=…
//!   resumed=… bytes_verified=…`.
//!
//! `cargo run -p hmc-engine --example cluster_node -- serve --metadata
//! etcd://127.0.0.1:2379/job --name a`

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hmc_core::{AnyCommunicator, Communicator};
use hmc_engine::{Engine, EngineConfig, MemDesc, MemType, TransferOp, TransferOpDesc};

fn checksum(b: &[u8]) -> u64 {
    // FNV-1a: cheap, order-sensitive, and the same on both sides.
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
    })
}

struct Args {
    role: String,
    flags: HashMap<String, String>,
}

impl Args {
    fn parse() -> Args {
        let mut it = std::env::args().skip(1);
        let role = it.next().unwrap_or_default();
        let mut flags = HashMap::new();
        while let Some(k) = it.next() {
            let k = k.trim_start_matches("--").to_string();
            flags.insert(k, it.next().expect("every flag takes a value"));
        }
        Args { role, flags }
    }
    fn get(&self, k: &str, default: &str) -> String {
        self.flags
            .get(k)
            .cloned()
            .unwrap_or_else(|| default.to_string())
    }
    fn num(&self, k: &str, default: u64) -> u64 {
        self.get(k, &default.to_string()).parse().expect("a number")
    }
}

fn say(line: String) {
    println!("{line}");
    std::io::stdout().flush().unwrap();
}

/// Set when standard input closes (the parent's way of saying "stop").
fn watch_stdin() -> Arc<AtomicBool> {
    let closed = Arc::new(AtomicBool::new(false));
    let c = closed.clone();
    std::thread::spawn(move || {
        let mut s = String::new();
        while std::io::stdin()
            .read_line(&mut s)
            .map(|n| n > 0)
            .unwrap_or(false)
        {}
        c.store(true, Ordering::Release);
    });
    closed
}

async fn engine(args: &Args) -> Engine<AnyCommunicator> {
    let mut options: HashMap<String, String> = HashMap::new();
    options.insert("metadata".into(), args.get("metadata", "embedded"));
    options.insert("transport".into(), args.get("transport", "tcp"));
    options.insert("lease_ttl_ms".into(), args.get("lease-ttl-ms", "2000"));
    options.insert("etcd_retry_max_ms".into(), "500".into());
    if let Some(n) = args.flags.get("name") {
        options.insert("name".into(), n.clone());
    }
    // The job's shared secret, from a file (never on the command line).
    if let Some(f) = args.flags.get("auth-secret-file") {
        options.insert("auth_secret_file".into(), f.clone());
    }
    let config = EngineConfig::from_options(&options).expect("options");
    Engine::initialize_with(&args.get("ip", "127.0.0.1"), config)
        .await
        .expect("engine")
}

async fn serve(args: &Args) {
    let e = engine(args).await;
    let len = (args.num("mib", 16) as usize) << 20;
    let seed = args.num("seed", 1);
    let mem: Vec<u8> = (0..len)
        .map(|i| (i as u64).wrapping_mul(2_654_435_761).wrapping_add(seed) as u8)
        .collect();
    // SAFETY: `mem` outlives the registration: the process ends with it registered, and
    // the engine's last clone drops before `mem` (declared after it).
    let _h = unsafe {
        e.register_mem(
            MemDesc {
                addr: mem.as_ptr() as u64,
                len,
            },
            MemType::Host,
            hmc_engine::Access::READ_WRITE,
        )
        .expect("register")
    };
    let published = format!("{} {} {}", mem.as_ptr() as u64, len, checksum(&mem));
    e.publish("buffer", published.into_bytes()).unwrap();
    say(format!("READY {} {}", e.name(), e.communicator().address()));
    let closed = watch_stdin();
    while !closed.load(Ordering::Acquire) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    e.finalize().await;
}

/// Connects to `peer` by name (retrying until `within`) and reads where its buffer is.
async fn attach(e: &Engine<AnyCommunicator>, peer: &str, within: Duration) -> (u64, usize, u64) {
    let start = Instant::now();
    loop {
        let _ = e.disconnect(peer).await;
        let r = async {
            e.connect(peer, Duration::from_secs(5)).await?;
            e.lookup(peer, "buffer", Duration::from_secs(5)).await
        }
        .await;
        match r {
            Ok(Some(v)) => {
                let v = String::from_utf8(v).unwrap();
                let mut p = v.split(' ').map(|x| x.parse::<u64>().unwrap());
                let (a, l, c) = (p.next().unwrap(), p.next().unwrap(), p.next().unwrap());
                return (a, l as usize, c);
            }
            // Registered, but not published yet (it is starting): as not back yet.
            Ok(None) => {
                assert!(
                    start.elapsed() < within,
                    "{peer} published no buffer in time"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(err) => {
                assert!(
                    start.elapsed() < within,
                    "{peer} not back within {within:?}: {err}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

async fn pull(args: &Args) {
    let e = engine(args).await;
    let peer = args.get("peer", "");
    let rounds = args.num("rounds", 0);
    let timeout = Duration::from_millis(args.num("timeout-ms", 30_000));
    let within = Duration::from_millis(args.num("recover-within-ms", 60_000));
    let (mut addr, len, mut want) = attach(&e, &peer, within).await;
    let mut mem = vec![0u8; len];
    // SAFETY: `mem` outlives the registration (the engine is finalized first).
    let _h = unsafe {
        e.register_mem(
            MemDesc {
                addr: mem.as_ptr() as u64,
                len,
            },
            MemType::Host,
            hmc_engine::Access::READ_WRITE,
        )
        .expect("register")
    };
    say(format!("ATTACHED {peer}"));
    let closed = watch_stdin();
    let (mut ok, mut failed, mut resumed, mut verified) = (0u64, 0u64, 0u64, 0u64);
    let mut last_ok = Instant::now();
    while (rounds == 0 || ok < rounds) && !closed.load(Ordering::Acquire) {
        mem.fill(0);
        let d = TransferOpDesc {
            local_addr: mem.as_ptr() as u64,
            remote_addr: addr,
            len,
        };
        match e.transfer(&peer, TransferOp::Read, &[d], timeout).await {
            Ok(()) => {
                assert_eq!(checksum(&mem), want, "round {ok}: the bytes read differ");
                ok += 1;
                verified += len as u64;
                last_ok = Instant::now();
                say(format!("OK {ok}"));
            }
            Err(err) => {
                failed += 1;
                say(format!("FAIL {} {err}", last_ok.elapsed().as_millis()));
                let t = Instant::now();
                (addr, _, want) = attach(&e, &peer, within).await;
                resumed += 1;
                say(format!("RESUMED {}", t.elapsed().as_millis()));
            }
        }
    }
    say(format!(
        "SUMMARY ok={ok} failed={failed} resumed={resumed} bytes_verified={verified}"
    ));
    e.finalize().await;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    match args.role.as_str() {
        "serve" => serve(&args).await,
        "pull" => pull(&args).await,
        other => panic!("role `{other}`: use serve or pull"),
    }
}
