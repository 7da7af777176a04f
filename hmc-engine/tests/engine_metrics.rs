//! The engine's counters through the `metrics` facade, read from a Prometheus recorder
//! installed in this test process (its own binary: the recorder is global): connects, a
//! peer dropped as gone, and the connect that finds it again counted as a reconnect.

mod common;

use std::time::{Duration, Instant};

use common::{T, engine, serve};
use hmc_meta::testing::EtcdProcess;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// The sample `name` on the page, 0 when nothing was recorded under it yet.
fn sample(metrics: &PrometheusHandle, name: &str) -> f64 {
    let page = metrics.render();
    let line = page.lines().find(|l| l.split(' ').next() == Some(name));
    line.and_then(|l| l.split(' ').nth(1))
        .map_or(0.0, |v| v.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_found_again_after_it_was_gone_counts_as_a_reconnect() {
    let metrics = PrometheusBuilder::new().install_recorder().unwrap();
    let etcd = EtcdProcess::start();
    let url = etcd.url("metrics").to_string();
    let (mut child, _out) = serve(&url, "target", 1);
    let a = engine(&url, None).await;
    a.connect("target", T).await.unwrap();
    assert_eq!(sample(&metrics, "hmc_engine_connects_total"), 1.0);
    assert_eq!(sample(&metrics, "hmc_engine_reconnects_total"), 0.0);

    // Killed and restarted under its name: dropped as gone, then found again.
    child.kill().unwrap();
    let _ = child.wait();
    let (mut child, _out) = serve(&url, "target", 1);
    let t = Instant::now();
    while !a.peers().is_empty() {
        assert!(t.elapsed() < Duration::from_secs(20), "never dropped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(sample(&metrics, "hmc_engine_peers_gone_total"), 1.0);
    a.connect("target", T).await.unwrap();
    assert_eq!(sample(&metrics, "hmc_engine_connects_total"), 2.0);
    assert_eq!(sample(&metrics, "hmc_engine_reconnects_total"), 1.0);

    // Leaving a peer by choice and coming back is a connect, not a reconnect.
    a.disconnect("target").await.unwrap();
    a.connect("target", T).await.unwrap();
    assert_eq!(sample(&metrics, "hmc_engine_connects_total"), 3.0);
    assert_eq!(sample(&metrics, "hmc_engine_reconnects_total"), 1.0);

    drop(child.stdin.take());
    let _ = child.wait();
    a.finalize().await;
}
