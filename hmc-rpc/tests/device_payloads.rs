//! Device-resident RPC payloads: `Client::call_device` and `Dispatcher::register_device`, with "device" memory from the ROCm backend loaded over its ABI shim.
//!
//! The shim (`hmc-backend-rocm/tests/shim/hip_shim.c`, built here with the C compiler)
//! exports the HIP symbols over host memory and checks every copy's direction against its
//! allocation table, so a payload that skipped staging, or a copy issued with the wrong
//! direction or device, fails here. It checks our staging path, not a GPU.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use hmc_backend_rocm::RocmMemory;
use hmc_core::{Device, DeviceBuffer, DeviceKind, MemSpan, MemSpanMut, Memory};
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
            if buf.region().device.kind != DeviceKind::ROCM {
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
            .call_device(INVERT_ON_DEVICE, &mem, &MemSpan::of(&request))
            .await
            .unwrap();
        assert_eq!(client.data_plane_stats().map(|s| s.failures), Some(0));
        out
    } else {
        client
            .call_device(INVERT_ON_DEVICE, &mem, &MemSpan::of(&request))
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

/// A payload on a device the memory does not own: a small one is refused before anything
/// is sent; a streamed one fails its first device copy after the header went, which
/// cancels the call. Either way the connection serves the next call.
#[rstest]
#[case::before_sending(64)]
#[case::while_streaming(2 << 20)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_on_another_device_fails_the_call_not_the_connection(#[case] len: usize) {
    let mem = device();
    let s = server(mem.clone(), false).await;
    let client = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    let other = RocmMemory::with_library(hip_shim(), 2).unwrap();
    let foreign = upload(&other, &pattern(len));
    let err = client
        .call_device(INVERT_ON_DEVICE, &mem, &MemSpan::of(&foreign))
        .await
        .unwrap_err();
    assert!(matches!(err, CallError::Device(_)), "{err}");
    let ok = upload(&mem, &pattern(len));
    let out = client
        .call_device(INVERT_ON_DEVICE, &mem, &MemSpan::of(&ok))
        .await
        .unwrap();
    assert!(
        download(&mem, &out)
            .iter()
            .zip(pattern(len))
            .all(|(g, b)| *g == !b)
    );
}

/// ROCm memory (over the shim) that records the length of every copy it makes, to show
/// that large payloads cross between host and device in chunks, never whole.
struct CountingMemory {
    inner: RocmMemory,
    copies: Mutex<Vec<usize>>,
}

impl CountingMemory {
    fn new() -> Arc<Self> {
        Arc::new(CountingMemory {
            inner: RocmMemory::with_library(hip_shim(), 1).expect("the ABI shim loads"),
            copies: Mutex::new(Vec::new()),
        })
    }

    fn take_copies(&self) -> Vec<usize> {
        std::mem::take(&mut *self.copies.lock().unwrap())
    }
}

impl Memory for CountingMemory {
    type Buffer = <RocmMemory as Memory>::Buffer;

    fn device(&self) -> Device {
        self.inner.device()
    }

    fn alloc(&self, len: usize) -> hmc_core::Result<Self::Buffer> {
        self.inner.alloc(len)
    }

    fn copy(&self, dst: &mut MemSpanMut<'_>, src: &MemSpan<'_>) -> hmc_core::Result<()> {
        self.copies.lock().unwrap().push(src.len());
        self.inner.copy(dst, src)
    }
}

/// Over TCP_STREAM both sides stage in chunks (the client's producer and sink, the
/// server's sink and producer). Over the data plane (HMC_BUFFER) the client copies once
/// each way between the device and its pooled registered buffers, and the server pulls
/// and pushes chunk by chunk through the device.
#[rstest]
#[case::tcp_stream(false)]
#[case::hmc_buffer(true)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_device_payloads_cross_in_chunks_both_ways(#[case] data_plane: bool) {
    let server_mem = CountingMemory::new();
    let client_mem = CountingMemory::new();
    let mut d = Dispatcher::new();
    let m = server_mem.clone();
    d.register_device(INVERT_ON_DEVICE, server_mem.clone(), move |_ctx, buf| {
        let m = m.clone();
        async move {
            // The handler's own copies go to `inner`, uncounted.
            let mut host = vec![0u8; buf.len()];
            m.inner
                .copy(&mut MemSpanMut::host(&mut host), &MemSpan::of(&buf))
                .unwrap();
            host.iter_mut().for_each(|b| *b = !*b);
            let mut out = m.inner.alloc(host.len()).unwrap();
            m.inner
                .copy(&mut MemSpanMut::of(&mut out), &MemSpan::host(&host))
                .unwrap();
            Ok(out)
        }
    });
    let any = "tcp://127.0.0.1:0".parse().unwrap();
    let server = Server::new(d, ServerConfig::default());
    let s = if data_plane {
        let comm = TcpCommunicator::bind(&any, TcpConfig::default()).unwrap();
        server
            .with_data_plane(Arc::new(comm))
            .bind(&any)
            .await
            .unwrap()
    } else {
        server.bind(&any).await.unwrap()
    };
    let client = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    if data_plane {
        let comm = TcpCommunicator::bind(&any, TcpConfig::default()).unwrap();
        let client = client.with_data_plane(Arc::new(comm));
        round_trips_in_chunks(&client, &client_mem, &server_mem, true).await;
        let stats = client.data_plane_stats().unwrap();
        assert_eq!(stats.failures, 0);
        assert!(stats.lent_requests >= 3, "{stats:?}");
        let served = s.data_plane_stats().unwrap();
        assert!(served.buffer_responses >= 3, "{served:?}");
    } else {
        round_trips_in_chunks(&client, &client_mem, &server_mem, false).await;
    }
}

async fn round_trips_in_chunks<C: hmc_core::Communicator>(
    client: &Client<C>,
    client_mem: &Arc<CountingMemory>,
    server_mem: &Arc<CountingMemory>,
    data_plane: bool,
) {
    let len = (3 << 20) + 123;
    let bytes = pattern(len);
    let request = upload(&client_mem.inner, &bytes);
    for round in 0..3 {
        let response = client
            .call_device(INVERT_ON_DEVICE, client_mem, &MemSpan::of(&request))
            .await
            .unwrap();
        let got = download(&client_mem.inner, &response);
        assert!(
            got.iter().zip(&bytes).all(|(g, b)| *g == !*b),
            "round {round}: device response differs"
        );
        for (side, mem) in [("client", client_mem), ("server", server_mem)] {
            let copies = mem.take_copies();
            let staged: usize = copies.iter().sum();
            assert_eq!(
                staged,
                2 * len,
                "{side}: every byte staged once each way ({copies:?})"
            );
            if side == "client" && data_plane {
                assert_eq!(copies.len(), 2, "one copy each way: {copies:?}");
                continue;
            }
            let largest = copies.iter().max().copied().unwrap_or(0);
            assert!(
                largest <= hmc_rpc::DEFAULT_DEVICE_STAGING.chunk,
                "{side}: a copy of {largest} bytes: the payload crossed whole"
            );
            assert!(
                copies.len() >= 2 * len.div_ceil(1 << 20),
                "{side}: {copies:?}"
            );
        }
    }
}
