//! The engine over a transport plugin chosen by name (`transport = loopmem`, `plugin_path`): the example C plugin of hmc-plugin, built here, moves an engine's WRITE unchanged.

#[path = "../../hmc-plugin/tests/common/mod.rs"]
mod plugins;

mod common;

use std::time::Duration;

use common::{engine_from, register_rw};
use hmc_core::AnyCommunicator;
use hmc_engine::{Engine, TransferOp, TransferOpDesc};

/// Two engines over the example C plugin `loopmem`, built here.
async fn loopmem_pair() -> (Engine<AnyCommunicator>, Engine<AnyCommunicator>) {
    let lib = plugins::build_c_plugin("loopmem", &[]);
    let lib = lib.display().to_string();
    let o = [("transport", "loopmem"), ("plugin_path", lib.as_str())];
    (engine_from(&o).await, engine_from(&o).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_choose_the_c_plugin_by_name_and_move_bytes() {
    let (a, b) = loopmem_pair().await;
    assert_eq!(
        a.capabilities().transport.wire_id(),
        200,
        "the plugin's transport id"
    );
    let src: Vec<u8> = (0..1 << 20).map(|i| (i * 7) as u8).collect();
    let dst = vec![0u8; 1 << 20];
    // Both buffers outlive the engines' registrations (the engines drop first).
    register_rw(&a, &src);
    register_rw(&b, &dst);
    let t = Duration::from_secs(10);
    a.connect(b.name(), t).await.unwrap();
    let d = TransferOpDesc {
        local_addr: src.as_ptr() as u64,
        remote_addr: dst.as_ptr() as u64,
        len: src.len(),
    };
    a.transfer(b.name(), TransferOp::Write, &[d], t)
        .await
        .unwrap();
    assert!(dst == src, "the peer's memory holds the written bytes");
}

/// A one-shot transfer of more descriptors than the transport takes in one batch
/// (`loopmem`'s `max_batch_len` is 4,096) goes in several batches, under its one deadline,
/// instead of being refused by the transport.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_shot_transfer_longer_than_the_transports_batch_goes_in_several() {
    let (a, b) = loopmem_pair().await;
    let max = a.capabilities().max_batch_len;
    assert_eq!(max, 4096, "loopmem's declared batch limit");
    // Every other 16-byte slot, so that no two descriptors merge into one run.
    let (n, len, stride) = (max + 904, 16usize, 32usize);
    let src: Vec<u8> = (0..n * stride).map(|i| (i * 13 + 1) as u8).collect();
    let dst = vec![0u8; n * stride];
    register_rw(&a, &src);
    register_rw(&b, &dst);
    let t = Duration::from_secs(10);
    a.connect(b.name(), t).await.unwrap();
    let descs: Vec<TransferOpDesc> = (0..n)
        .map(|i| TransferOpDesc {
            local_addr: src.as_ptr() as u64 + (i * stride) as u64,
            remote_addr: dst.as_ptr() as u64 + (i * stride) as u64,
            len,
        })
        .collect();
    a.transfer(b.name(), TransferOp::Write, &descs, t)
        .await
        .expect("a WRITE of more descriptors than one batch takes");
    for i in 0..n {
        let (at, gap) = (i * stride, i * stride + len);
        assert_eq!(dst[at..gap], src[at..gap], "descriptor {i} landed");
        assert!(
            dst[gap..gap + len].iter().all(|b| *b == 0),
            "gap {i} untouched"
        );
    }
}
