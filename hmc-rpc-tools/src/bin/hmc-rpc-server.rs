//! `hmc-rpc-server`: serves the demo methods echo (1), uppercase (2) and complex (3) over
//! TCP and, with `--uds-path`, a Unix socket too. SIGINT/SIGTERM shut it down gracefully.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use hmc_core::PeerAddr;
use hmc_rpc::{
    ConnConfig, DataPlaneAllow, DataPlaneConfig, Dispatcher, PoolConfig, Server, ServerConfig, demo,
};
use hmc_rpc_tools::plane::CommonArgs;

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
    /// CRC32C on every DATA chunk sent (received CRCs are always checked when present;
    /// off by default, as in the library's `ConnConfig::stream_crc`).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    stream_crc: bool,
    /// Close connections idle this long (seconds).
    #[arg(long, default_value_t = 60)]
    idle_timeout_secs: u64,
    /// Bytes one connection may make the server hold (admitted requests until answered,
    /// unwritten answers); calls beyond it are answered OVERLOADED.
    #[arg(long, default_value_t = 128 << 20)]
    max_conn_held_bytes: u64,
    /// Bytes the server may hold for all clients together; calls beyond it are answered
    /// OVERLOADED.
    #[arg(long, default_value_t = 1 << 30)]
    max_held_bytes: u64,
    /// Stop reading a connection while this many answer bytes wait for its client.
    #[arg(long, default_value_t = 8 << 20)]
    max_tx_backlog: u64,
    /// Close a connection whose client reads none of its answers for this long (seconds).
    #[arg(long, default_value_t = 30)]
    write_stall_timeout_secs: u64,
    /// Fail a request whose streamed body sends no DATA for this long (seconds).
    #[arg(long, default_value_t = 30)]
    stream_idle_timeout_secs: u64,
    #[command(flatten)]
    common: CommonArgs,
    /// Responses from this many bytes are written into the client's region one-sided.
    /// (`--ucx-threshold` is the former name, still accepted.)
    #[arg(long, alias = "ucx-threshold", default_value_t = 64 * 1024)]
    data_plane_threshold: usize,
    /// Bytes the data plane may register at once (`max_pool_bytes`).
    #[arg(long, default_value_t = 1 << 30)]
    max_pool_bytes: usize,
    /// Longest data-plane time (connect, import, READ, WRITE) one HMC_BUFFER call may take
    /// before it fails DATA_PLANE and frees its slot (`data_plane_timeout`), milliseconds.
    #[arg(long, default_value_t = 5000)]
    data_plane_timeout_ms: u64,
    /// Data-plane addresses the server may dial for any client besides the default rule
    /// (the RPC peer's own IP; on this host, a socket of the RPC peer's user; never a port
    /// below 1024): a CIDR (10.0.0.0/8, ::1/128), an absolute unix path prefix, or
    /// `opaque:ID[:HEX]` for a transport's own addresses (`ID:HEX`, plugins' and UCX's:
    /// those of wire number ID whose bytes start with HEX). Repeatable.
    #[arg(long, value_name = "CIDR|unix-path-prefix|opaque:ID[:HEX]")]
    data_plane_allow: Vec<DataPlaneAllow>,
    /// Serve Prometheus metrics (calls, bytes, errors by status, in-flight, handler time,
    /// connections) at http://ADDR/metrics.
    #[arg(long, value_name = "IP:PORT")]
    metrics_addr: Option<SocketAddr>,
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
    if let Some(report) = args.common.transports_report() {
        print!("{report}");
        return std::process::ExitCode::SUCCESS;
    }
    hmc_rpc_tools::tuning::tune_allocator();
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
    if let Some(addr) = args.metrics_addr {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            .install()
            .map_err(|e| {
                hmc_core::Error::InvalidArgument(format!(
                    "--metrics-addr {addr}: {e}; pick a free port"
                ))
            })?;
        eprintln!("hmc-rpc-server metrics at http://{addr}/metrics");
    }
    let mut d = Dispatcher::new();
    demo::register_demo(&mut d);
    let config = ServerConfig {
        conn: ConnConfig {
            max_inflight: args.max_inflight,
            idle_timeout: Duration::from_secs(args.idle_timeout_secs),
            max_conn_held_bytes: args.max_conn_held_bytes,
            max_tx_backlog: args.max_tx_backlog,
            write_stall_timeout: Duration::from_secs(args.write_stall_timeout_secs),
            stream_idle_timeout: Duration::from_secs(args.stream_idle_timeout_secs),
            stream_crc: args.stream_crc,
            ..ConnConfig::default()
        },
        max_connections: args.max_connections,
        max_inflight_total: args.max_inflight_total,
        max_held_bytes: args.max_held_bytes,
        workers: args.workers.max(1),
        auth_secret: args.common.rpc_auth_secret()?,
        ..ServerConfig::default()
    };
    let dp = args
        .common
        .open_data_plane(args.bind_address)?
        .map(std::sync::Arc::new);
    let dp_config = DataPlaneConfig {
        threshold: args.data_plane_threshold,
        pool: PoolConfig {
            max_total_bytes: args.max_pool_bytes,
            ..PoolConfig::default()
        },
        timeout: Duration::from_millis(args.data_plane_timeout_ms),
        allow: args.data_plane_allow.clone(),
        ..DataPlaneConfig::default()
    };
    let mut addrs = vec![PeerAddr::Tcp(SocketAddr::new(args.bind_address, args.port))];
    if let Some(p) = &args.uds_path {
        addrs.push(PeerAddr::Unix(p.clone()));
    }
    let mut servers = Vec::new();
    for a in &addrs {
        let s = Server::new(d.clone(), config.clone());
        servers.push(match &dp {
            Some(dp) => {
                s.with_data_plane(dp.clone())
                    .data_plane_config(dp_config.clone())
                    .bind(a)
                    .await?
            }
            None => s.bind(a).await?,
        });
    }
    if let Some(dp) = &dp {
        eprintln!(
            "hmc-rpc-server data plane {} at {}",
            args.common.data_plane,
            hmc_core::Communicator::address(&**dp)
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
