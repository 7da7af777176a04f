//! RPC with an HMC_BUFFER data plane: the client lends its 1 MiB request in registered memory and the server pulls it one-sided over a TCP communicator, instead of the bytes streaming through the RPC connection.
//!
//! ```text
//! cargo run -p hmc-rpc --example buffer_data_plane [-- --mib N]
//! ```
//!
//! One line on each side attaches the data plane (`with_data_plane`); any
//! `hmc_core::Communicator` works (the UCX one for shared memory or InfiniBand). Payloads
//! from `DataPlaneConfig::threshold` (64 KiB) go HMC_BUFFER; smaller ones stay INLINE.

use std::process::ExitCode;
use std::sync::Arc;

use bytes::Bytes;
use hmc_rpc::{Client, ClientConfig, Dispatcher, Server, ServerConfig};
use hmc_transport_tcp::{TcpCommunicator, TcpConfig};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const CHECKSUM: u32 = 1;

fn communicator() -> Result<Arc<TcpCommunicator>> {
    let addr = "tcp://127.0.0.1:0".parse()?;
    Ok(Arc::new(TcpCommunicator::bind(
        &addr,
        TcpConfig::default(),
    )?))
}

fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ u64::from(*x)).wrapping_mul(0x100_0000_01b3)
    })
}

async fn run(len: usize) -> Result<()> {
    let mut d = Dispatcher::new();
    // Raw bytes in, raw bytes out: no codec on the data path.
    d.register_raw(CHECKSUM, |_ctx, request: Bytes| async move {
        Ok(Bytes::copy_from_slice(&checksum(&request).to_be_bytes()))
    });
    let server = Server::new(d, ServerConfig::default())
        .with_data_plane(communicator()?)
        .bind(&"tcp://127.0.0.1:0".parse()?)
        .await?;

    let client = Client::connect(server.local_addr(), ClientConfig::default())
        .await?
        .with_data_plane(communicator()?);
    let request: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    for _ in 0..3 {
        let answer = client.call(CHECKSUM, request.clone()).await?;
        if answer[..] != checksum(&request).to_be_bytes() {
            return Err("the server saw other bytes than were sent".into());
        }
    }
    let stats = client.data_plane_stats().expect("a data plane is attached");
    println!(
        "3 calls of {len} bytes checked; {} went HMC_BUFFER (the server pulled the request)",
        stats.buffer_calls
    );
    if stats.buffer_calls != 3 {
        return Err(format!("expected 3 HMC_BUFFER calls, stats say {stats:?}").into());
    }
    server.shutdown().await;
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mib = args
        .iter()
        .position(|a| a == "--mib")
        .and_then(|i| args.get(i + 1))
        .map_or(Ok(1), |n| n.parse::<usize>());
    let Ok(mib @ 1..) = mib else {
        eprintln!("--mib takes a whole number of MiB, at least 1");
        return ExitCode::from(2);
    };
    match run(mib << 20).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("buffer_data_plane: {e}");
            ExitCode::FAILURE
        }
    }
}
