//! The engine over a transport plugin chosen by name (`transport = loopmem`, `plugin_path`): the example C plugin of hmc-plugin, built here, moves an engine's WRITE unchanged.

#[path = "../../hmc-plugin/tests/common/mod.rs"]
mod plugins;

mod common;

use std::time::Duration;

use common::{engine_from, register_rw};
use hmc_engine::{TransferOp, TransferOpDesc};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_choose_the_c_plugin_by_name_and_move_bytes() {
    let lib = plugins::build_c_plugin("loopmem", &[]);
    let lib = lib.display().to_string();
    let o = [("transport", "loopmem"), ("plugin_path", lib.as_str())];
    let (a, b) = (engine_from(&o).await, engine_from(&o).await);
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
