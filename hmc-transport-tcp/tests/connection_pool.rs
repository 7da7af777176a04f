//! An endpoint's connection pool: transfers in flight at once reuse the connections of
//! earlier rounds instead of dialing new ones.

use std::sync::Arc;
use std::time::Duration;

use hmc_backend_cpu::HostMemory;
use hmc_core::{
    Access, Communicator, ConnBuffer, Deadline, Op, PeerAddr, RegisteredBuffer, TransferDesc,
};
use hmc_transport_tcp::{TcpCommunicator, TcpConfig};
use rstest::rstest;

const IN_FLIGHT: usize = 8;
const ROUNDS: usize = 20;
const PIECE: usize = 4096;

fn comm() -> Arc<TcpCommunicator> {
    let any: PeerAddr = "tcp://127.0.0.1:0".parse().unwrap();
    Arc::new(TcpCommunicator::bind(&any, TcpConfig::default()).unwrap())
}

/// Before: the pool kept 4 idle connections while 16 transfers could run at once, so
/// rounds of 8 concurrent transfers closed 4 connections after each round and dialed 4
/// new ones in the next (84 connections for 20 rounds instead of 8).
#[rstest]
#[case::write(Op::Write)]
#[case::read(Op::Read)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_rounds_reuse_their_connections(#[case] op: Op) {
    let target = comm();
    let initiator = comm();
    let len = IN_FLIGHT * PIECE;
    let remote = RegisteredBuffer::new(
        Arc::new(HostMemory::new()),
        target.clone(),
        len,
        Access::READ_WRITE,
    )
    .unwrap();
    let local = RegisteredBuffer::new(
        Arc::new(HostMemory::new()),
        initiator.clone(),
        len,
        Access::READ_WRITE,
    )
    .unwrap();
    let deadline = || Deadline::after(Duration::from_secs(10));
    let ep = initiator
        .connect(&target.address(), deadline())
        .await
        .unwrap();
    let key = initiator.import(&ep, &remote.export().unwrap()).unwrap();
    for _ in 0..ROUNDS {
        let batches: Vec<[TransferDesc<'_, TcpCommunicator>; 1]> = (0..IN_FLIGHT)
            .map(|i| {
                [TransferDesc {
                    local: local.registration(),
                    local_offset: i * PIECE,
                    remote: &key,
                    remote_offset: (i * PIECE) as u64,
                    len: PIECE,
                }]
            })
            .collect();
        let transfers = batches
            .iter()
            .map(|b| initiator.transfer(&ep, op, b, deadline()));
        for r in futures::future::join_all(transfers).await {
            r.unwrap();
        }
    }
    let accepted = target.stats().accepted_connections;
    assert!(
        accepted <= IN_FLIGHT as u64,
        "{ROUNDS} rounds of {IN_FLIGHT} concurrent transfers opened {accepted} connections; \
         at most {IN_FLIGHT} should be dialed and then reused"
    );
}
