//! HIXL's quick-start flow between two processes: the target registers memory and waits;
//! the initiator registers host memory, connects, WRITEs it into the target's memory
//! (HIXL's H2RD: host to remote device), tells the target with a notification carrying a
//! checksum, and READs it back. Here the target's memory is host memory standing in for a
//! device's (no accelerator on CI machines); on a GPU machine the same calls take
//! `MemType::Device` memory through a transport that can register it.
//!
//! `cargo run -p hmc-engine --example quickstart [-- --mib N]` runs both processes.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_engine::{Engine, EngineConfig, MemDesc, MemType, TransferOp, TransferOpDesc};
use hmc_transport_tcp::TcpCommunicator;

const T: Duration = Duration::from_secs(30);

fn checksum(b: &[u8]) -> u64 {
    // FNV-1a: cheap, order-sensitive, and the same on both sides.
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
    })
}

async fn engine() -> Engine<TcpCommunicator> {
    let comm = TcpCommunicator::bind(&"tcp://127.0.0.1:0".parse().unwrap(), Default::default())
        .expect("TCP transport");
    Engine::initialize(Arc::new(comm), "127.0.0.1", EngineConfig::default())
        .await
        .expect("engine")
}

async fn target(len: usize) {
    let e = engine().await;
    let mem = vec![0u8; len];
    // SAFETY: `mem` lives until this function returns, after deregistration.
    let h = unsafe {
        e.register_mem(
            MemDesc {
                addr: mem.as_ptr() as u64,
                len,
            },
            MemType::Host,
            hmc_engine::Access::READ_WRITE,
        )
        .unwrap()
    };
    println!("READY {} {}", e.name(), mem.as_ptr() as u64);
    std::io::stdout().flush().unwrap();
    // Wait for the initiator's notification.
    let start = Instant::now();
    let note = loop {
        if let Some(n) = e.get_notifies().into_iter().next() {
            break n;
        }
        assert!(start.elapsed() < T, "no notification within {T:?}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let want = u64::from_str_radix(std::str::from_utf8(&note.msg).unwrap(), 16).unwrap();
    let got = checksum(&mem);
    println!(
        "[target] notification `{}` from {}: checksum {want:016x}; memory holds {got:016x}",
        note.name, note.from
    );
    assert_eq!(got, want, "the written bytes arrived intact");
    println!("[target] checksums match");
    std::io::stdout().flush().unwrap();
    // Stay up for the read-back, until the initiator closes our stdin.
    tokio::task::spawn_blocking(|| {
        let mut s = String::new();
        let _ = std::io::stdin().read_line(&mut s);
    })
    .await
    .unwrap();
    e.deregister_mem(h).await.unwrap();
}

async fn initiator(len: usize) {
    let me = std::env::current_exe().unwrap();
    let mut child = Command::new(me)
        .args(["--role", "target", "--bytes", &len.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(f.first(), Some(&"READY"), "target said `{line}`");
    let (name, remote) = (f[1].to_string(), f[2].parse::<u64>().unwrap());

    let e = engine().await;
    let src: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(13) ^ 0x5a)
        .collect();
    let back = vec![0u8; len];
    // SAFETY: both buffers outlive their registrations (the engine is dropped first).
    unsafe {
        for b in [&src, &back] {
            e.register_mem(
                MemDesc {
                    addr: b.as_ptr() as u64,
                    len,
                },
                MemType::Host,
                hmc_engine::Access::READ_WRITE,
            )
            .unwrap();
        }
    }
    e.connect(&name, T).await.unwrap();
    let t = Instant::now();
    e.transfer(
        &name,
        TransferOp::Write,
        &[TransferOpDesc {
            local_addr: src.as_ptr() as u64,
            remote_addr: remote,
            len,
        }],
        T,
    )
    .await
    .unwrap();
    let w = t.elapsed();
    let sum = checksum(&src);
    println!(
        "[initiator] WRITE {len} bytes (host -> remote, H2RD with host memory standing in for the device) in {w:?}: checksum {sum:016x}"
    );
    e.send_notify(&name, "h2rd-done", format!("{sum:x}").as_bytes(), T)
        .await
        .unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    print!("{line}");
    line.clear();
    out.read_line(&mut line).unwrap();
    print!("{line}");
    let t = Instant::now();
    e.transfer(
        &name,
        TransferOp::Read,
        &[TransferOpDesc {
            local_addr: back.as_ptr() as u64,
            remote_addr: remote,
            len,
        }],
        T,
    )
    .await
    .unwrap();
    println!(
        "[initiator] READ back {len} bytes in {:?}: checksum {:016x}",
        t.elapsed(),
        checksum(&back)
    );
    assert_eq!(back, src);
    println!("quickstart: every byte checked on both sides");
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success(), "the target failed");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let len = match (arg("--bytes"), arg("--mib")) {
        (Some(b), _) => b.parse().unwrap(),
        (None, Some(m)) => m.parse::<usize>().unwrap() << 20,
        _ => 16 << 20,
    };
    match arg("--role").as_deref() {
        Some("target") => target(len).await,
        _ => initiator(len).await,
    }
}
