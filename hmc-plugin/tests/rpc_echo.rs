//! An hmc-rpc echo whose HMC_BUFFER data plane is the example C plugin (loopmem) on both sides, loaded through the loader: hmc-rpc runs over a plugin unchanged.

mod common;

use bytes::Bytes;
use hmc_rpc::{Client, ClientConfig, DataPlaneConfig, Dispatcher, Server, ServerConfig, demo};

fn pattern(len: usize, seed: u32) -> Bytes {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
        .collect::<Vec<u8>>()
        .into()
}

#[rstest::rstest]
#[case::at_threshold(64 << 10)]
#[case::one_mib(1 << 20)]
#[case::sixteen_mib(16 << 20)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_round_trips_over_the_c_plugin_data_plane(#[case] len: usize) {
    let mut d = Dispatcher::new();
    demo::register_demo(&mut d);
    let s = Server::new(d, ServerConfig::default())
        .with_data_plane(common::open_loopmem())
        .data_plane_config(DataPlaneConfig::default())
        .bind(&"tcp://127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let c = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap()
        .with_data_plane_config(common::open_loopmem(), DataPlaneConfig::default());
    for seed in 0..3 {
        let p = pattern(len, seed);
        let r = c.call(demo::ECHO, p.clone()).await.unwrap();
        assert!(r == p, "echo of {len} bytes differs");
    }
    let ss = s.data_plane_stats().unwrap();
    let cs = c.data_plane_stats().unwrap();
    assert_eq!(
        (ss.buffer_calls, ss.buffer_responses, ss.failures),
        (3, 3, 0),
        "{ss:?}"
    );
    assert_eq!(
        (cs.buffer_calls, cs.buffer_responses, cs.fallbacks),
        (3, 3, 0),
        "{cs:?}"
    );
}
