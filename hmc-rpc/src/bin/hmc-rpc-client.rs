//! `hmc-rpc-client`: calls a demo method of `hmc-rpc-server` and prints each answer as
//! `response[i]=...`, then `Completed N <method> RPC call(s)`.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use hmc_core::PeerAddr;
use hmc_rpc::demo::{COMPLEX, ComplexRequest, ComplexResponse, ECHO, UPPERCASE};
use hmc_rpc::{BlockingClient, CallError, CallOptions, ClientConfig};

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
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    let addr = match &args.uds_path {
        Some(p) => PeerAddr::Unix(p.clone()),
        None => PeerAddr::Tcp(SocketAddr::new(args.server_address, args.port)),
    };
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
    let client =
        BlockingClient::connect(&addr, ClientConfig::default()).map_err(|e| e.to_string())?;
    let opts = CallOptions {
        response_capacity: None,
        timeout: Some(Duration::from_millis(args.timeout_ms)),
    };
    let name = match args.method {
        Method::Echo => "echo",
        Method::Uppercase => "uppercase",
        Method::Complex => "complex",
    };
    for i in 1..=args.repeat {
        let line = match args.method {
            Method::Echo => {
                let r = client
                    .call_with(ECHO, Bytes::from(args.message.clone()), opts)
                    .map_err(|e: CallError| e.to_string())?;
                String::from_utf8_lossy(&r).into_owned()
            }
            Method::Uppercase => {
                let req = hmc_rpc::RpcCodec::encode(&args.message).map_err(|e| e.to_string())?;
                let r = client
                    .call_with(UPPERCASE, req, opts)
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
                    .map_err(|e| e.to_string())?;
                hmc_rpc::RpcCodec::decode::<ComplexResponse>(&r)
                    .map_err(|e| e.to_string())?
                    .to_string()
            }
        };
        println!("response[{i}]={line}");
    }
    println!("Completed {} {name} RPC call(s)", args.repeat);
    Ok(())
}
