//! The state a transfer carries: `Engine::transfer` adds a small, fixed amount to the
//! transport's own transfer future. Every op moves its future at least once (into the
//! caller's state, a task, a `select!`), so state that grows with the engine's layering
//! is paid in copied bytes per op; nesting one wrapping future in another copies the
//! inner state each time and once made the engine's op future 15 times the transport's.

use std::sync::Arc;
use std::time::Duration;

use hmc_core::{Access, Communicator, Deadline, Device, Op, Region, TransferDesc};
use hmc_engine::{Engine, EngineConfig, TransferOp, TransferOpDesc};

/// What the engine may add to the transport's future, in bytes.
const ENGINE_STATE: usize = 1024;

async fn check<C: Communicator>(comm: C) {
    let buf = vec![0u8; 4096];
    let region = Region {
        device: Device::HOST,
        addr: buf.as_ptr() as u64,
        len: buf.len(),
    };
    // SAFETY: `buf` outlives the registration (dropped at the end of this function, after
    // it); nothing is transferred.
    let reg = unsafe { comm.register(region, Access::READ_WRITE).unwrap() };
    let exported = comm.export(&reg).unwrap();
    let ep = comm
        .connect(&comm.address(), Deadline::after(Duration::from_secs(10)))
        .await
        .unwrap();
    let key = comm.import(&ep, &exported).unwrap();
    let batch = [TransferDesc {
        local: &reg,
        local_offset: 0,
        remote: &key,
        remote_offset: 0,
        len: 4096,
    }];
    let transport = std::mem::size_of_val(&comm.transfer(
        &ep,
        Op::Write,
        &batch,
        Deadline::after(Duration::from_secs(1)),
    ));
    let engine = Engine::initialize(Arc::new(comm), "127.0.0.1", EngineConfig::default())
        .await
        .unwrap();
    let descs = [TransferOpDesc {
        local_addr: 0,
        remote_addr: 0,
        len: 0,
    }];
    let op = std::mem::size_of_val(&engine.transfer(
        "nobody",
        TransferOp::Write,
        &descs,
        Duration::from_secs(1),
    ));
    assert!(
        op <= transport + ENGINE_STATE,
        "an engine transfer's future is {op} bytes over a transport future of {transport}: \
         more than {ENGINE_STATE} bytes of engine state (a future nested in a wrapper?)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_adds_little_to_a_tcp_transfers_state() {
    check(
        hmc_transport_tcp::TcpCommunicator::bind(
            &"tcp://127.0.0.1:0".parse().unwrap(),
            Default::default(),
        )
        .unwrap(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_adds_little_to_a_shared_memory_transfers_state() {
    check(hmc_transport_shm::ShmCommunicator::bind(Default::default()).unwrap()).await;
}
