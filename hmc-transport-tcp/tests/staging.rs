//! Device staging through registered host bounce buffers (`hmc_core::Stager`) over the TCP transport, with `HostMemory` standing in for the device side.
//!
//! The pipelining logic (chunking, alternating bounce buffers, overlap of copy and transfer,
//! partial last chunk) is device-independent; on a machine with a GPU the CUDA backend's
//! memory takes the place of the "device" here.

use std::sync::Arc;
use std::time::Duration;

use hmc_backend_cpu::HostMemory;
use hmc_core::testing::pattern;
use hmc_core::{
    Access, Communicator, ConnBuffer, Deadline, DeviceBuffer, Error, MemSpan, MemSpanMut, Memory,
    PeerAddr, RegisteredBuffer, Stager, StagingConfig,
};
use hmc_transport_tcp::{TcpCommunicator, TcpConfig};
use rstest::rstest;

fn bind() -> Arc<TcpCommunicator> {
    let addr: PeerAddr = "tcp://127.0.0.1:0".parse().unwrap();
    Arc::new(TcpCommunicator::bind(&addr, TcpConfig::default()).expect("bind"))
}

#[rstest]
#[case::smaller_than_one_chunk(1000, 4096)]
#[case::exact_chunks(64 << 10, 16 << 10)]
#[case::partial_last_chunk((1 << 20) + 13, 64 << 10)]
#[case::many_chunks(8 << 20, 1 << 20)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_write_and_read_move_every_byte(#[case] len: usize, #[case] chunk: usize) {
    let (a, b) = (bind(), bind());
    let host = Arc::new(HostMemory::new());
    let ep = a.connect(&b.address(), Deadline::default()).await.unwrap();
    let target =
        RegisteredBuffer::new(host.clone(), b.clone(), len + 8, Access::READ_WRITE).unwrap();
    let key = a.import(&ep, &target.export().unwrap()).unwrap();

    // The "device" buffer: not registered with the transport at all.
    let device = HostMemory::new();
    let mut src = device.alloc(len).unwrap();
    let bytes = pattern(len as u64, len);
    device
        .copy(&mut MemSpanMut::of(&mut src), &MemSpan::host(&bytes))
        .unwrap();

    let mut stager =
        Stager::new(host.clone(), a.clone(), StagingConfig { chunk, depth: 2 }).unwrap();
    stager
        .write_from(
            &device,
            &ep,
            &MemSpan::of(&src),
            &key,
            8,
            Deadline::default(),
        )
        .await
        .unwrap();
    let mut at_target = vec![0u8; len];
    target
        .read_at(8, &mut MemSpanMut::host(&mut at_target))
        .unwrap();
    assert!(at_target == bytes, "staged write corrupted bytes");

    let mut dst = device.alloc(len).unwrap();
    stager
        .read_into(
            &device,
            &ep,
            &mut MemSpanMut::of(&mut dst),
            &key,
            8,
            Deadline::default(),
        )
        .await
        .unwrap();
    let mut back = vec![0u8; len];
    device
        .copy(&mut MemSpanMut::host(&mut back), &MemSpan::of(&dst))
        .unwrap();
    assert!(back == bytes, "staged read corrupted bytes");
    assert_eq!(dst.len(), len);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staging_refuses_bad_configuration_and_out_of_range_targets() {
    let a = bind();
    let host = Arc::new(HostMemory::new());
    for (chunk, depth) in [(0, 2), (4096, 1)] {
        let err = Stager::new(host.clone(), a.clone(), StagingConfig { chunk, depth }).err();
        assert!(
            matches!(err, Some(Error::InvalidArgument(_))),
            "chunk {chunk} depth {depth}: {err:?}"
        );
    }
    let b = bind();
    let ep = a.connect(&b.address(), Deadline::default()).await.unwrap();
    let target = RegisteredBuffer::new(host.clone(), b.clone(), 4096, Access::READ_WRITE).unwrap();
    let key = a.import(&ep, &target.export().unwrap()).unwrap();
    let mut stager = Stager::new(
        host.clone(),
        a.clone(),
        StagingConfig {
            chunk: 1024,
            depth: 2,
        },
    )
    .unwrap();
    let data = vec![1u8; 5000];
    let err = stager
        .write_from(
            &*host,
            &ep,
            &MemSpan::host(&data),
            &key,
            0,
            Deadline::after(Duration::from_secs(5)),
        )
        .await;
    assert!(matches!(err, Err(Error::OutOfBounds { .. })), "{err:?}");
}

#[rstest]
#[case::many_small_runs(&[4096; 64], 16 << 10)]
#[case::ragged_runs(&[1000, 7, 4096, 16384, 3, 9000, 12000], 16 << 10)]
#[case::an_oversized_run_between_small_ones(&[5000, 40_000, 100, 100, 70_000, 16], 16 << 10)]
#[case::one_run(&[12345], 4096)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gathered_runs_land_where_each_one_belongs(#[case] lens: &[usize], #[case] chunk: usize) {
    use hmc_core::StagedRun;

    let (a, b) = (bind(), bind());
    let host = Arc::new(HostMemory::new());
    let ep = a.connect(&b.address(), Deadline::default()).await.unwrap();
    let total: usize = lens.iter().sum();
    // The remote runs go in reverse order, each 3 bytes apart, so no run lands where a
    // plain copy of the packed buffer would put it.
    let target = RegisteredBuffer::new(
        host.clone(),
        b.clone(),
        total + 3 * lens.len() + 64,
        Access::READ_WRITE,
    )
    .unwrap();
    let key = a.import(&ep, &target.export().unwrap()).unwrap();
    let mut remote_at = Vec::new();
    let mut at = 64u64;
    for &l in lens.iter().rev() {
        remote_at.push(at);
        at += l as u64 + 3;
    }
    remote_at.reverse();
    let device = HostMemory::new();
    let bytes = pattern(7, total);
    let mut src = device.alloc(total).unwrap();
    device
        .copy(&mut MemSpanMut::of(&mut src), &MemSpan::host(&bytes))
        .unwrap();
    let mut offs = Vec::new();
    let mut o = 0usize;
    for &l in lens {
        offs.push(o);
        o += l;
    }
    let all = MemSpan::of(&src);
    let runs: Vec<_> = lens
        .iter()
        .zip(&offs)
        .zip(&remote_at)
        .map(|((&l, &off), &r)| StagedRun {
            local: all.slice(off, l).unwrap(),
            remote: &key,
            remote_offset: r,
        })
        .collect();
    let mut stager =
        Stager::new(host.clone(), a.clone(), StagingConfig { chunk, depth: 2 }).unwrap();
    stager
        .write_gather(&device, &ep, &runs, Deadline::default())
        .await
        .unwrap();
    for ((&l, &off), &r) in lens.iter().zip(&offs).zip(&remote_at) {
        let mut got = vec![0u8; l];
        target
            .read_at(r as usize, &mut MemSpanMut::host(&mut got))
            .unwrap();
        assert!(got[..] == bytes[off..off + l], "run at {off} of {l} bytes");
    }
    // And back, scattered into a cleared "device" buffer.
    let mut dst = device.alloc(total).unwrap();
    device
        .copy(
            &mut MemSpanMut::of(&mut dst),
            &MemSpan::host(&vec![0u8; total]),
        )
        .unwrap();
    {
        let region = dst.region();
        let mut runs: Vec<_> = lens
            .iter()
            .zip(&offs)
            .zip(&remote_at)
            .map(|((&l, &off), &r)| StagedRun {
                // SAFETY: disjoint slices of `dst`, which outlives them.
                local: unsafe { MemSpanMut::from_region(region.slice(off, l).unwrap()) },
                remote: &key,
                remote_offset: r,
            })
            .collect();
        stager
            .read_scatter(&device, &ep, &mut runs, Deadline::default())
            .await
            .unwrap();
    }
    let mut back = vec![0u8; total];
    device
        .copy(&mut MemSpanMut::host(&mut back), &MemSpan::of(&dst))
        .unwrap();
    assert!(back == bytes, "scattered READ");
}
