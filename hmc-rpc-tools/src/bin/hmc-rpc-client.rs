//! `hmc-rpc-client`: calls a demo method of `hmc-rpc-server` and prints each answer as
//! `response[i]=...`, then `Completed N <method> RPC call(s)`.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use hmc_core::Communicator;
use hmc_core::PeerAddr;
use hmc_rpc::demo::{COMPLEX, ComplexRequest, ComplexResponse, ECHO, UPPERCASE};
use hmc_rpc::{CallOptions, Client, ClientConfig, ClientDataPlane, DataPlaneConfig};
use hmc_rpc_tools::plane::CommonArgs;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Method {
    Echo,
    Uppercase,
    Complex,
}

#[derive(Parser, Debug)]
#[command(about = "HMC RPC demo client")]
struct Args {
    /// Server IP address (IPv4 or IPv6).
    #[arg(long, default_value = "127.0.0.1")]
    server_address: IpAddr,
    /// Server TCP port.
    #[arg(long, default_value_t = 18080)]
    port: u16,
    /// Connect to this Unix socket instead of TCP.
    #[arg(long)]
    uds_path: Option<PathBuf>,
    /// Which method to call.
    #[arg(long, value_enum, default_value = "echo")]
    method: Method,
    /// The message (echo, uppercase) or label (complex).
    #[arg(long, default_value = "hello hmc rpc")]
    message: String,
    /// Comma-separated integers for `complex`, e.g. 3,5,8.
    #[arg(long, default_value = "")]
    values: String,
    /// How many calls to make, one after the other on one connection.
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// Deadline of each call in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    timeout_ms: u64,
    /// Echo only: send this many pattern bytes instead of --message and verify the answer.
    #[arg(long)]
    payload_bytes: Option<usize>,
    /// Connect, make --repeat calls, disconnect: this many times.
    #[arg(long, default_value_t = 1)]
    cycles: u32,
    #[command(flatten)]
    common: CommonArgs,
    /// Payloads from this many bytes go HMC_BUFFER.
    /// (`--ucx-threshold` is the former name, still accepted.)
    #[arg(long, alias = "ucx-threshold", default_value_t = 64 * 1024)]
    data_plane_threshold: usize,
    /// IP address the data plane listens on (the server connects there).
    #[arg(long, default_value = "127.0.0.1")]
    data_plane_bind: IpAddr,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    // Warnings (a data-plane fallback, a refused plugin) on stderr; RUST_LOG for more.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    if let Some(report) = args.common.transports_report() {
        print!("{report}");
        return std::process::ExitCode::SUCCESS;
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(&args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn pattern(len: usize, seed: u32) -> Bytes {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
        .collect::<Vec<u8>>()
        .into()
}

async fn run(args: &Args) -> Result<(), String> {
    let addr = match &args.uds_path {
        Some(p) => PeerAddr::Unix(p.clone()),
        None => PeerAddr::Tcp(SocketAddr::new(args.server_address, args.port)),
    };
    let dp_config = DataPlaneConfig {
        threshold: args.data_plane_threshold,
        ..DataPlaneConfig::default()
    };
    // One data plane (one pool of registered buffers) for every connection cycle.
    let dp = args
        .common
        .open_data_plane(args.data_plane_bind)
        .map_err(|e| e.to_string())?
        .map(|c| std::sync::Arc::new(ClientDataPlane::new(std::sync::Arc::new(c), dp_config)));
    let name = match args.method {
        Method::Echo => "echo",
        Method::Uppercase => "uppercase",
        Method::Complex => "complex",
    };
    let auth_secret = args.common.rpc_auth_secret().map_err(|e| e.to_string())?;
    for cycle in 0..args.cycles {
        let config = ClientConfig {
            auth_secret: auth_secret.clone(),
            ..ClientConfig::default()
        };
        let client = Client::connect(&addr, config)
            .await
            .map_err(|e| e.to_string())?;
        match &dp {
            Some(dp) => {
                let c = client.with_client_data_plane(dp.clone());
                calls(args, &c, cycle).await?;
            }
            None => calls(args, &client, cycle).await?,
        }
    }
    let n = u64::from(args.repeat) * u64::from(args.cycles);
    if let Some(dp) = &dp {
        let s = dp.stats();
        println!(
            "data plane: {} HMC_BUFFER calls, {} responses in buffer, {} fallbacks, {} registrations",
            s.buffer_calls, s.buffer_responses, s.fallbacks, s.pool.registrations
        );
    }
    if args.cycles > 1 {
        println!(
            "Completed {n} {name} RPC call(s) in {} connection cycles, 0 errors",
            args.cycles
        );
    } else {
        println!("Completed {n} {name} RPC call(s)");
    }
    Ok(())
}

async fn calls<C: Communicator>(args: &Args, client: &Client<C>, cycle: u32) -> Result<(), String> {
    let values: Vec<i64> = args
        .values
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse()
                .map_err(|e| format!("--values: `{s}` is not an integer: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let opts = CallOptions {
        timeout: Some(Duration::from_millis(args.timeout_ms)),
        ..CallOptions::default()
    };
    for i in 1..=args.repeat {
        let line = match args.method {
            Method::Echo => match args.payload_bytes {
                Some(n) => {
                    let p = pattern(n, cycle.wrapping_mul(7919).wrapping_add(i));
                    let r = client
                        .call_with(ECHO, p.clone(), opts)
                        .await
                        .map_err(|e| format!("cycle {cycle} call {i}: {e}"))?;
                    if r != p {
                        return Err(format!(
                            "cycle {cycle} call {i}: the echo of {n} bytes differs"
                        ));
                    }
                    format!("{n} bytes verified")
                }
                None => {
                    let r = client
                        .call_with(ECHO, Bytes::from(args.message.clone()), opts)
                        .await
                        .map_err(|e| e.to_string())?;
                    String::from_utf8_lossy(&r).into_owned()
                }
            },
            Method::Uppercase => {
                let req = hmc_rpc::RpcCodec::encode(&args.message).map_err(|e| e.to_string())?;
                let r = client
                    .call_with(UPPERCASE, req, opts)
                    .await
                    .map_err(|e| e.to_string())?;
                hmc_rpc::RpcCodec::decode::<String>(&r).map_err(|e| e.to_string())?
            }
            Method::Complex => {
                let req = ComplexRequest {
                    label: args.message.clone(),
                    values: values.clone(),
                };
                let req = hmc_rpc::RpcCodec::encode(&req).map_err(|e| e.to_string())?;
                let r = client
                    .call_with(COMPLEX, req, opts)
                    .await
                    .map_err(|e| e.to_string())?;
                hmc_rpc::RpcCodec::decode::<ComplexResponse>(&r)
                    .map_err(|e| e.to_string())?
                    .to_string()
            }
        };
        if args.cycles == 1 {
            println!("response[{i}]={line}");
        }
    }
    Ok(())
}
