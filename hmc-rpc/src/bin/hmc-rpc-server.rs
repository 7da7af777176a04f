//! `hmc-rpc-server`: serves the demo methods echo (1), uppercase (2) and complex (3) over
//! TCP and, with `--uds-path`, a Unix socket too. SIGINT/SIGTERM shut it down gracefully.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use hmc_core::PeerAddr;
use hmc_rpc::{ConnConfig, Dispatcher, Server, ServerConfig, demo};

#[derive(Parser, Debug)]
#[command(about = "HMC RPC demo server: echo (1), uppercase (2), complex (3)")]
struct Args {
    /// IP address to listen on (IPv4 or IPv6, e.g. 127.0.0.1 or ::1).
    #[arg(long, default_value = "127.0.0.1")]
    bind_address: IpAddr,
    /// TCP port (0 picks a free one; the chosen address is printed).
    #[arg(long, default_value_t = 18080)]
    port: u16,
    /// Also listen on this Unix socket path.
    #[arg(long)]
    uds_path: Option<PathBuf>,
    /// Threads of the runtime and of the blocking-handler pool.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Open connections per listener before new ones get GOAWAY(OVERLOADED).
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Calls in flight per connection before OVERLOADED answers.
    #[arg(long, default_value_t = 64)]
    max_inflight: usize,
    /// Calls in flight per listener before OVERLOADED answers.
    #[arg(long, default_value_t = 4096)]
    max_inflight_total: usize,
    /// CRC32C on every DATA chunk sent (received CRCs are always checked).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    stream_crc: bool,
    /// Close connections idle this long (seconds).
    #[arg(long, default_value_t = 60)]
    idle_timeout_secs: u64,
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    hmc_rpc::tuning::tune_allocator();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.workers.max(1))
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> hmc_core::Result<()> {
    let mut d = Dispatcher::new();
    demo::register_demo(&mut d);
    let config = ServerConfig {
        conn: ConnConfig {
            max_inflight: args.max_inflight,
            idle_timeout: Duration::from_secs(args.idle_timeout_secs),
            stream_crc: args.stream_crc,
            ..ConnConfig::default()
        },
        max_connections: args.max_connections,
        max_inflight_total: args.max_inflight_total,
        workers: args.workers.max(1),
        ..ServerConfig::default()
    };
    let mut servers = Vec::new();
    let tcp = PeerAddr::Tcp(SocketAddr::new(args.bind_address, args.port));
    servers.push(Server::new(d.clone(), config.clone()).bind(&tcp).await?);
    if let Some(p) = &args.uds_path {
        servers.push(
            Server::new(d, config)
                .bind(&PeerAddr::Unix(p.clone()))
                .await?,
        );
    }
    for s in &servers {
        println!("hmc-rpc-server listening on {}", s.local_addr());
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| hmc_core::Error::io("installing the SIGTERM handler", e))?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    eprintln!("hmc-rpc-server: shutting down (calls in flight finish)");
    for s in &servers {
        s.shutdown_handle().shutdown();
    }
    for s in &servers {
        s.wait().await;
    }
    eprintln!("hmc-rpc-server: stopped");
    Ok(())
}
