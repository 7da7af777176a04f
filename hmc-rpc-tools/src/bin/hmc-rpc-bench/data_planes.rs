//! The HMC_BUFFER rows: the data-plane servers and `ucx_perftest -t tag_bw` beside them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use hmc_bench_kit::cpu::{self, Process, ProcessCpu};
use hmc_core::PeerAddr;
use hmc_rpc::{ClientDataPlane, DataPlaneConfig};
use hmc_rpc_tools::plane::{DataPlaneChoice, DataPlaneKind, PlaneOptions, open_data_plane_choice};

use crate::Args;
use crate::baselines::{Proc, free_port, start_server};
use crate::hmc::bench_hmc_dp;
use crate::measure::{Cell, CpuProbe, core_to_core_ns, fmt_size};

/// Messages per `ucx_perftest -t tag_bw` run.
const TAG_BW_ITERS: usize = 2000;

/// [`ucx_tag_bw_once`] with the CPU-seconds per GiB of its processes: the server, the
/// client and the client's retries while the server starts, all reaped children of this
/// process (`RUSAGE_CHILDREN`), over their whole lives (UCX's start-up included, so an
/// upper bound on what the messages themselves cost).
pub(crate) fn ucx_tag_bw(
    bin: &PathBuf,
    size: usize,
    peer_errors: bool,
) -> Result<(f64, Option<f64>), String> {
    let meter = ProcessCpu::start(&[Process::WaitedChildren]);
    let bw = ucx_tag_bw_once(bin, size, peer_errors)?;
    let bytes = (TAG_BW_ITERS * size) as u64;
    Ok((bw, meter.used().and_then(|u| cpu::cpu_s_per_gib(u, bytes))))
}

/// `ucx_perftest -t tag_bw -s SIZE` as two child processes (server without an address,
/// client with 127.0.0.1) on the current `UCX_TLS`; the overall bandwidth in bytes/s.
/// `peer_errors` adds `-e`: endpoints with peer error handling (`UCP_ERR_HANDLING_MODE_PEER`),
/// as `UcxCommunicator` creates them, with `UCX_MM_ERROR_HANDLING=y` as it sets for shared
/// memory (unless the environment says otherwise). UCX 1.13 then avoids its zero-copy
/// rendezvous over tcp (measured in docs/design.md, "UCX: peer error handling").
fn ucx_tag_bw_once(bin: &PathBuf, size: usize, peer_errors: bool) -> Result<f64, String> {
    let size = size.to_string();
    let e: &[&str] = if peer_errors { &["-e"] } else { &[] };
    // The environment's own choice wins, for both kinds of run.
    let mm_errors: &[(&str, &str)] =
        if peer_errors && std::env::var_os("UCX_MM_ERROR_HANDLING").is_none() {
            &[("UCX_MM_ERROR_HANDLING", "y")]
        } else {
            &[]
        };
    let iters = &TAG_BW_ITERS.to_string();
    // The same UCX_TCP_TX_SEG_SIZE as our UCX communicators apply (unless the environment
    // sets one for both).
    let seg = std::env::var("UCX_TCP_TX_SEG_SIZE")
        .unwrap_or_else(|_| hmc_transport_ucx::TCP_TX_SEG_SIZE.to_string());
    let mut last = String::new();
    // perftest takes a port we choose by bind-and-close, which another socket may take
    // first: a server that exits at once gets another port.
    for _attempt in 0..3 {
        let port = free_port().to_string();
        let server = Command::new(bin)
            .env("UCX_TCP_TX_SEG_SIZE", &seg)
            .envs(mm_errors.iter().copied())
            .args(["-t", "tag_bw", "-s", &size, "-n", iters, "-p", &port])
            .args(e)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", bin.display()))?;
        let mut server = Proc(server);
        for _ in 0..50 {
            std::thread::sleep(Duration::from_millis(100));
            if let Ok(Some(status)) = server.0.try_wait() {
                last = format!("the ucx_perftest server on port {port} exited ({status})");
                break;
            }
            let out = Command::new(bin)
                .env("UCX_TCP_TX_SEG_SIZE", &seg)
                .envs(mm_errors.iter().copied())
                .args([
                    "127.0.0.1",
                    "-t",
                    "tag_bw",
                    "-s",
                    &size,
                    "-n",
                    iters,
                    "-p",
                    &port,
                ])
                .args(e)
                .output()
                .map_err(|e| e.to_string())?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            if let Some(line) = text.lines().find(|l| l.starts_with("Final:")) {
                // Final: iterations, 50%ile, avg, overall (usec), bandwidth avg, overall
                // (MB/s), …
                let f: Vec<&str> = line.split_whitespace().collect();
                let mbps: f64 = f
                    .get(6)
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| format!("unexpected ucx_perftest line `{line}`"))?;
                return Ok(mbps * 1024.0 * 1024.0);
            }
            last = format!("{text}{}", String::from_utf8_lossy(&out.stderr));
        }
    }
    Err(format!("ucx_perftest client never reported: {last}"))
}

pub(crate) struct DpRow {
    pub(crate) plane: DataPlaneChoice,
    pub(crate) buffer: Cell,
    pub(crate) stream: Option<Cell>,
    /// tag_bw in bytes/s (median, min, max over `--tag-bw-runs`): perftest's default
    /// endpoints, and endpoints with peer error handling (`-e`) as ours.
    pub(crate) tag_bw: Option<(TagBw, Option<TagBw>)>,
    /// CPU-seconds per GiB of perftest's default runs (the median; see [`ucx_tag_bw`]).
    pub(crate) tag_bw_cpu: Option<f64>,
}

/// [`ucx_tag_bw_runs`]' figures: bandwidths (default, `-e`) and the default runs' CPU.
pub(crate) struct TagBwRuns {
    pub(crate) bw: (TagBw, Option<TagBw>),
    pub(crate) cpu_s_per_gib: Option<f64>,
}

/// Median, min and max in bytes/s.
pub(crate) type TagBw = (f64, f64, f64);

/// `ucx_perftest -t tag_bw` over `runs` runs each without and with `-e`, alternated so
/// that both see the same host states: (default, peer error handling). A failing `-e` run
/// drops only the second figure (with a note).
pub(crate) fn ucx_tag_bw_runs(
    bin: &PathBuf,
    size: usize,
    runs: usize,
) -> Result<TagBwRuns, String> {
    let (mut plain, mut peer, mut cpus) = (Vec::new(), Some(Vec::new()), Vec::new());
    for _ in 0..runs.max(1) {
        let (bw, c) = ucx_tag_bw(bin, size, false)?;
        plain.push(bw);
        cpus.push(c);
        if let Some(v) = &mut peer {
            match ucx_tag_bw(bin, size, true) {
                Ok((b, _)) => v.push(b),
                Err(e) => {
                    eprintln!("note: ucx_perftest -e: {e}");
                    peer = None;
                }
            }
        }
    }
    let stats = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    let cpu = cpus
        .into_iter()
        .collect::<Option<Vec<f64>>>()
        .map(|v| stats(v).0);
    Ok(TagBwRuns {
        bw: (stats(plain), peer.map(stats)),
        cpu_s_per_gib: cpu,
    })
}

/// HMC_BUFFER rows: a server with `--data-plane`, clients with the same data plane.
pub(crate) async fn bench_data_planes(
    args: &Args,
    server_bin: &Path,
    stream_cells: &[(Cell, Option<Cell>)],
) -> Result<Vec<DpRow>, String> {
    let mut rows = Vec::new();
    for plane in args.data_planes.iter().cloned() {
        let (_server, port) = match start_server(
            server_bin,
            args,
            "1024",
            &[
                "--data-plane",
                &plane.cli_name(),
                "--data-plane-threshold",
                &args.data_plane_threshold.to_string(),
            ],
        ) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("note: {e}; skipping --data-plane {plane:?}");
                continue;
            }
        };
        let comm = match open_data_plane_choice(
            &plane,
            [127, 0, 0, 1].into(),
            &PlaneOptions::default(),
            &hmc_plugin::PluginConfig::default(),
        ) {
            Ok(Some(c)) => Arc::new(c),
            Ok(None) => continue,
            Err(e) => {
                eprintln!("note: data plane {plane:?} unavailable here ({e}); skipping it");
                continue;
            }
        };
        let dp = Arc::new(ClientDataPlane::new(
            comm,
            DataPlaneConfig {
                threshold: args.data_plane_threshold,
                ..DataPlaneConfig::default()
            },
        ));
        let addr = PeerAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], port)));
        for &size in &args.dp_sizes {
            let tag_bw = if plane == DataPlaneChoice::Builtin(DataPlaneKind::Ucx) {
                match ucx_tag_bw_runs(&args.ucx_perftest, size, args.tag_bw_runs) {
                    Ok(b) => Some(b),
                    Err(e) => {
                        eprintln!("note: ucx_perftest: {e}");
                        None
                    }
                }
            } else {
                None
            };
            for &clients in &args.clients {
                for &depth in &args.depths {
                    eprintln!(
                        "HMC_BUFFER over {plane:?}: {} x {clients} client(s) x {depth} in flight",
                        fmt_size(size)
                    );
                    let before = core_to_core_ns();
                    let cpu = CpuProbe::start(_server.0.id(), false);
                    let mut buffer = bench_hmc_dp(
                        &addr,
                        size,
                        clients,
                        depth,
                        args.seconds,
                        args.stream_crc,
                        Some((dp.clone(), args.dp_request_buffers)),
                    )
                    .await?;
                    buffer.cpu_us_per_call = cpu.per_call(buffer.calls);
                    buffer.c2c_ns = before.zip(core_to_core_ns());
                    let stream = stream_cells
                        .iter()
                        .find(|(h, _)| h.size == size && h.clients == clients && h.depth == depth)
                        .map(|(h, _)| h.clone());
                    rows.push(DpRow {
                        plane: plane.clone(),
                        buffer,
                        stream,
                        tag_bw: tag_bw.as_ref().map(|t| t.bw),
                        tag_bw_cpu: tag_bw.as_ref().and_then(|t| t.cpu_s_per_gib),
                    });
                }
            }
        }
        let st = dp.stats();
        eprintln!(
            "  client data plane: {} HMC_BUFFER calls, {} fallbacks, {} failures, {} registrations",
            st.buffer_calls, st.fallbacks, st.failures, st.pool.registrations
        );
    }
    Ok(rows)
}
