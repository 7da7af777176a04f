//! Engines that find each other through etcd (`metadata=etcd://…`), against a real etcd:
//! connecting by name, etcd going down and coming back, and a hung peer process whose
//! lease lapses while a transfer with it is in flight.

mod common;

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{T, checksum, desc, engine, register_rw, serve};
use hmc_engine::{Engine, EngineConfig, EngineError, TransferOp, TransferOpDesc};
use hmc_meta::testing::EtcdProcess;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_find_each_other_by_name_through_etcd() {
    let etcd = EtcdProcess::start();
    let url = etcd.url("job").to_string();
    let a = engine(&url, Some("prefill-0")).await;
    let b = engine(&url, Some("decode-0")).await;
    assert_eq!(b.name(), "decode-0");
    let src = vec![9u8; 1 << 20];
    let dst = vec![0u8; 1 << 20];
    // Both buffers outlive the engines (finalized below, before they drop).
    register_rw(&a, &src);
    register_rw(&b, &dst);
    a.connect("decode-0", T).await.unwrap();
    assert_eq!(a.peers(), ["decode-0"]);
    a.transfer("decode-0", TransferOp::Write, &[desc(&src, &dst)], T)
        .await
        .unwrap();
    assert_eq!(dst, src);
    let e = a.connect("nobody", T).await.unwrap_err().to_string();
    assert!(
        e.contains("no engine of that name is registered in etcd://"),
        "{e}"
    );
    // Without a directory, a name cannot be found.
    let o: HashMap<String, String> = [("name".to_string(), "x".to_string())].into();
    let e = Engine::initialize_with("127.0.0.1", EngineConfig::from_options(&o).unwrap())
        .await
        .err()
        .expect("a name needs etcd")
        .to_string();
    assert!(e.contains("set `metadata` to etcd://"), "{e}");
    a.finalize().await;
    b.finalize().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_down_keeps_connections_and_fails_new_lookups_until_it_is_back() {
    let mut etcd = EtcdProcess::start();
    let url = etcd.url("outage").to_string();
    let a = engine(&url, Some("a")).await;
    let b = engine(&url, Some("b")).await;
    let c = engine(&url, Some("c")).await;
    let src = vec![3u8; 1 << 20];
    let dst = vec![0u8; 1 << 20];
    // The buffers outlive the engines (finalized below).
    register_rw(&a, &src);
    register_rw(&b, &dst);
    a.connect("b", T).await.unwrap();
    etcd.kill();
    // The connection made before the outage keeps moving bytes.
    a.transfer("b", TransferOp::Write, &[desc(&src, &dst)], T)
        .await
        .unwrap();
    assert_eq!(dst, src);
    let t = Instant::now();
    let e = a.connect("c", Duration::from_secs(2)).await.unwrap_err();
    assert!(matches!(e, EngineError::Store(_)), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains(&etcd.endpoint()) && msg.contains("unreachable"),
        "{msg}"
    );
    println!(
        "lookup with etcd down failed after {:?}: {msg}",
        t.elapsed()
    );
    etcd.restart();
    a.connect("c", Duration::from_secs(30)).await.unwrap();
    a.transfer("b", TransferOp::Read, &[desc(&src, &dst)], T)
        .await
        .unwrap();
    for e in [a, b, c] {
        e.finalize().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_peer_is_gone_within_its_lease_and_its_transfer_in_flight_fails() {
    let etcd = EtcdProcess::start();
    let url = etcd.url("hang").to_string();
    let (mut child, _out) = serve(&url, "target", 32);
    let a = engine(&url, None).await;
    a.connect("target", T).await.unwrap();
    let found = a.lookup("target", "buffer", T).await.unwrap().unwrap();
    let found = String::from_utf8(found).unwrap();
    let v: Vec<u64> = found.split(' ').map(|x| x.parse().unwrap()).collect();
    let (addr, len, want) = (v[0], v[1] as usize, v[2]);
    let mem = vec![0u8; len];
    // `mem` outlives the engine (finalized below).
    register_rw(&a, &mem);
    let read = TransferOpDesc {
        local_addr: mem.as_ptr() as u64,
        remote_addr: addr,
        len,
    };
    a.transfer("target", TransferOp::Read, &[read], T)
        .await
        .unwrap();
    assert_eq!(checksum(&mem), want);

    // Hang the target (SIGSTOP) and read from it with a timeout far beyond its lease.
    let pid = child.id().to_string();
    let long = Duration::from_secs(120);
    let stopped = Command::new("kill").args(["-STOP", &pid]).status().unwrap();
    assert!(stopped.success());
    let t = Instant::now();
    let e = a
        .transfer("target", TransferOp::Read, &[read], long)
        .await
        .unwrap_err();
    let took = t.elapsed();
    println!("hung peer declared gone after {took:?} (lease_ttl 2 s): {e}");
    assert!(
        matches!(&e, EngineError::PeerGone { peer, .. } if peer == "target"),
        "{e:?}"
    );
    assert!(e.to_string().contains("lease"), "{e}");
    assert!(took < long, "failed by its timeout, not by the lease");
    assert!(a.peers().is_empty(), "the gone peer is disconnected");

    // Resumed, it registers again and is reachable by name once more.
    Command::new("kill").args(["-CONT", &pid]).status().unwrap();
    let t = Instant::now();
    loop {
        match a.connect("target", T).await {
            Ok(()) => break,
            Err(e) if t.elapsed() < Duration::from_secs(30) => {
                tracing_note(&e);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("target not back: {e}"),
        }
    }
    let mem2 = vec![0u8; len];
    // As above.
    register_rw(&a, &mem2);
    let read2 = TransferOpDesc {
        local_addr: mem2.as_ptr() as u64,
        ..read
    };
    a.transfer("target", TransferOp::Read, &[read2], T)
        .await
        .unwrap();
    assert_eq!(checksum(&mem2), want);
    drop(child.stdin.take());
    let _ = child.wait();
    a.finalize().await;
}

fn tracing_note(e: &EngineError) {
    eprintln!("not back yet: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_restarted_under_its_name_is_dropped_and_found_again() {
    let etcd = EtcdProcess::start();
    let url = etcd.url("restart").to_string();
    let (mut child, _out) = serve(&url, "target", 1);
    let a = engine(&url, None).await;
    a.connect("target", T).await.unwrap();
    child.kill().unwrap();
    let _ = child.wait();
    // Restarted at once: it registers once the old instance's lease lapsed (the name is
    // held until then), and its record replaces the old one.
    let t = Instant::now();
    let (mut child, _out) = serve(&url, "target", 1);
    while !a.peers().is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the old instance is still connected"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("restarted peer dropped after {:?}", t.elapsed());
    // The engine dropped it: the caller's own disconnect finds it gone and succeeds (twice
    // too); a name never connected is still NotConnected.
    a.disconnect("target").await.unwrap();
    a.disconnect("target").await.unwrap();
    assert!(matches!(
        a.disconnect("never-connected").await,
        Err(EngineError::NotConnected(_))
    ));
    a.connect("target", T).await.unwrap();
    // The new instance answers (its own table and directory).
    let second = a.lookup("target", "buffer", T).await.unwrap();
    assert_eq!(second.map(|v| !v.is_empty()), Some(true));
    drop(child.stdin.take());
    let _ = child.wait();
    a.finalize().await;
}

/// A second engine cannot take a live engine's name (it used to replace it, then delete
/// the original's key when it left): it fails to start naming the holder, and the first
/// stays reachable by that name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_engine_s_name_cannot_be_taken() {
    let etcd = EtcdProcess::start();
    let url = etcd.url("names").to_string();
    let a = engine(&url, Some("prefill-0")).await;
    let o: HashMap<String, String> = [
        ("metadata", url.as_str()),
        ("transport", "tcp"),
        ("name", "prefill-0"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let e = Engine::initialize_with("127.0.0.1", EngineConfig::from_options(&o).unwrap())
        .await
        .err()
        .expect("the name is taken");
    let msg = e.to_string();
    assert!(
        msg.contains("`prefill-0` is in use")
            && msg.contains("by a live member at tcp://127.0.0.1:"),
        "{msg}"
    );
    let b = engine(&url, Some("decode-0")).await;
    b.connect("prefill-0", T).await.unwrap();
    drop(a);
}
