//! Device-resident RPC payloads: `Client::call_device` and `Dispatcher::register_device`, with "device" memory from the ROCm backend loaded over its ABI shim.
//!
//! The shim (`hmc-backend-rocm/tests/shim/hip_shim.c`, built here with the C compiler)
//! exports the HIP symbols over host memory and checks every copy's direction against its
//! allocation table, so a payload that skipped staging, or a copy issued with the wrong
//! direction or device, fails here. It checks our staging path, not a GPU.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use hmc_backend_rocm::RocmMemory;
use hmc_core::{DeviceBuffer, DeviceKind, MemSpan, MemSpanMut, Memory};
use hmc_rpc::{
    CallError, Client, ClientConfig, DataPlaneConfig, Dispatcher, RpcError, RunningServer, Server,
    ServerConfig, Status,
};
use hmc_transport_tcp::{TcpCommunicator, TcpConfig};
use rstest::rstest;

const INVERT_ON_DEVICE: u32 = 300;

fn hip_shim() -> &'static Path {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| {
        let src =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../hmc-backend-rocm/tests/shim/hip_shim.c");
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("rpc_hip_shim");
        hmc_testshim::build_shim(&src, "hip_shim", &out).expect("build the HIP ABI shim")
    })
}

fn device() -> Arc<RocmMemory> {
    Arc::new(RocmMemory::with_library(hip_shim(), 1).expect("the ABI shim loads"))
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_right(13) as u8)
        .collect()
}

fn upload(mem: &RocmMemory, bytes: &[u8]) -> <RocmMemory as Memory>::Buffer {
    let mut buf = mem.alloc(bytes.len()).unwrap();
    mem.copy(&mut MemSpanMut::of(&mut buf), &MemSpan::host(bytes))
        .unwrap();
    buf
}

fn download(mem: &RocmMemory, buf: &impl DeviceBuffer) -> Vec<u8> {
    let mut out = vec![0u8; buf.len()];
    mem.copy(&mut MemSpanMut::host(&mut out), &MemSpan::of(buf))
        .unwrap();
    out
}

/// A server whose method inverts the request's bytes on the device: it downloads, inverts
/// and uploads into a fresh device buffer, checking that it was handed device memory.
async fn server(mem: Arc<RocmMemory>, data_plane: bool) -> RunningServer {
    let mut d = Dispatcher::new();
    let m = mem.clone();
    d.register_device(INVERT_ON_DEVICE, mem, move |_ctx, buf| {
        let m = m.clone();
        async move {
            if buf.region().device.kind != DeviceKind::Rocm {
                return Err(RpcError::new(
                    Status::INTERNAL,
                    "handler was not given device memory",
                ));
            }
            let inverted: Vec<u8> = download(&m, &buf).iter().map(|b| !b).collect();
            Ok(upload(&m, &inverted))
        }
    });
    let s = Server::new(d, ServerConfig::default());
    let addr = "tcp://127.0.0.1:0".parse().unwrap();
    if data_plane {
        let comm =
            TcpCommunicator::bind(&"tcp://127.0.0.1:0".parse().unwrap(), TcpConfig::default())
                .unwrap();
        s.with_data_plane(Arc::new(comm)).bind(&addr).await.unwrap()
    } else {
        s.bind(&addr).await.unwrap()
    }
}

#[rstest]
#[case::inline(100, false)]
#[case::tcp_stream(1 << 20, false)]
#[case::hmc_buffer(1 << 20, true)]
#[case::empty(0, false)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_payloads_round_trip_through_a_device_handler(
    #[case] len: usize,
    #[case] data_plane: bool,
) {
    let mem = device();
    let s = server(mem.clone(), data_plane).await;
    let client = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    let bytes = pattern(len);
    let request = upload(&mem, &bytes);
    let want: Vec<u8> = bytes.iter().map(|b| !b).collect();
    let response = if data_plane {
        let comm =
            TcpCommunicator::bind(&"tcp://127.0.0.1:0".parse().unwrap(), TcpConfig::default())
                .unwrap();
        let client = client.with_data_plane_config(Arc::new(comm), DataPlaneConfig::default());
        let out = client
            .call_device(INVERT_ON_DEVICE, &*mem, &MemSpan::of(&request))
            .await
            .unwrap();
        assert_eq!(client.data_plane_stats().map(|s| s.failures), Some(0));
        out
    } else {
        client
            .call_device(INVERT_ON_DEVICE, &*mem, &MemSpan::of(&request))
            .await
            .unwrap()
    };
    assert_eq!(
        response.region().device,
        mem.device(),
        "the response lives on the caller's device"
    );
    assert!(download(&mem, &response) == want, "device response differs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_on_another_device_is_refused_before_sending() {
    let mem = device();
    let s = server(mem.clone(), false).await;
    let client = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    let other = RocmMemory::with_library(hip_shim(), 2).unwrap();
    let foreign = upload(&other, &pattern(64));
    let err = client
        .call_device(INVERT_ON_DEVICE, &*mem, &MemSpan::of(&foreign))
        .await
        .unwrap_err();
    assert!(matches!(err, CallError::Device(_)), "{err}");
    // The connection is untouched: the next call works.
    let ok = upload(&mem, &pattern(64));
    client
        .call_device(INVERT_ON_DEVICE, &*mem, &MemSpan::of(&ok))
        .await
        .unwrap();
}
