//! The report's figures: which columns of which bench table are plotted against which
//! peer, the issues' targets as reference marks, and the SVG drawing (`plotters`' SVG
//! backend, which writes labels as `<text>` elements: no font files are read).

use std::ops::Range;

use plotters::coord::ranged1d::{KeyPointHint, NoDefaultFormatting, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::{Run, Table};
use crate::Result;

/// A figure ready to draw.
#[derive(Clone, Debug, PartialEq)]
pub struct Plot {
    /// Part of the file name.
    pub id: String,
    pub title: String,
    pub y_label: String,
    /// What the groups or the x values are (the table's columns).
    pub x_label: String,
    pub x: XAxis,
    pub series: Vec<Series>,
    pub references: Vec<Reference>,
}

/// What runs along the bottom.
#[derive(Clone, Debug, PartialEq)]
pub enum XAxis {
    /// One group of bars per name (the table's rows); x values are the indices.
    Categories(Vec<String>),
    /// A count on a base-2 log scale (the connection sweep), drawn as lines.
    Log2(String),
}

/// One system's values: (x, y).
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A target or a peer's single figure: horizontal marks (x from, x to, y).
#[derive(Clone, Debug, PartialEq)]
pub struct Reference {
    pub name: String,
    pub marks: Vec<(f64, f64, f64)>,
    /// One level across the whole figure (dashed), rather than a mark per group.
    pub level: bool,
    /// A peer's figure (drawn grey) rather than a target (drawn red).
    pub peer: bool,
}

/// The sizes a target applies to, in bytes (the table's `size` column); empty for all.
type Sizes = &'static [f64];

const KIB: f64 = 1024.0;
const MIB: f64 = 1024.0 * 1024.0;

/// How a figure's reference is made from its table.
#[derive(Clone, Copy, Debug)]
enum Target {
    /// `factor` times series `of`, per group (a target relative to a peer).
    Times(f64, usize, &'static str),
    /// The same, only over the groups whose size is one of `Sizes`.
    TimesAt(f64, usize, Sizes, &'static str),
    /// Series `of` plus a constant (an allowance in the figure's unit), over the groups
    /// whose size is one of `Sizes`.
    Plus(f64, usize, Sizes, &'static str),
    /// One value, in the figure's y unit.
    Level(f64, &'static str),
    /// One value over the groups whose size is one of `Sizes`.
    LevelAt(f64, Sizes, &'static str),
    /// `share` of the highest value of series `of`.
    ShareOfPeak(f64, usize, &'static str),
    /// `factor` times the number after the `:` of the run's note that starts with the
    /// prefix; a peer's figure when `factor` is 1, else a target relative to it.
    FromNote(&'static str, f64, &'static str),
}

/// Which table a figure comes from and what it shows.
struct Spec {
    /// The benches whose tables it applies to, space-separated.
    bench: &'static str,
    /// The table's title starts with this ("" for any title).
    table: &'static str,
    id: &'static str,
    title: &'static str,
    /// Only rows whose column has this cell.
    filter: Option<(&'static str, &'static str)>,
    /// Columns naming each group of bars; or, with `log2_x`, the numeric x column.
    x: &'static [&'static str],
    log2_x: bool,
    /// (column, legend): the first is ours, the rest the peers. The table must have them all.
    series: &'static [(&'static str, &'static str)],
    y_label: &'static str,
    targets: &'static [Target],
}

const RPC_ECHO: &str = "hmc-rpc echo vs tonic";
/// `hmc-rpc-bench --vs-iperf3`'s table of medians.
const RPC_VS_IPERF3: &str = "echo vs iperf3 --bidir, medians";
const UCX_SERIES: [(&str, &str); 2] = [("hmc GB/s", "hmc"), ("ucx_perftest GB/s", "ucx_perftest")];

/// Issue 17's targets for the Python bench's sync ops, over either of hmc's transports.
const PYTHON_TARGETS: &[Target] = &[
    Target::TimesAt(
        3.0,
        1,
        &[4.0 * KIB, 64.0 * KIB],
        "target: 3x Mooncake (4, 64 KiB)",
    ),
    Target::TimesAt(2.0, 1, &[MIB], "target: 2x Mooncake (1 MiB)"),
];

/// The y label of the CPU figures (issue 60).
const CPU_PER_GIB: &str = "CPU-seconds per GiB, every process (lower is better)";

/// The UCX bench's CPU figure of one like-for-like row kind (`row`).
const fn ucx_cpu(id: &'static str, title: &'static str, row: &'static str) -> Spec {
    Spec {
        bench: "ucx",
        table: "CPU per GiB moved",
        id,
        title,
        filter: Some(("row", row)),
        x: &["op", "size"],
        log2_x: false,
        series: &[
            ("hmc CPU-s/GiB", "hmc"),
            ("ucx_perftest CPU-s/GiB", "ucx_perftest"),
        ],
        y_label: CPU_PER_GIB,
        targets: &[],
    }
}

const SPECS: &[Spec] = &[
    Spec {
        bench: "rpc",
        table: RPC_ECHO,
        id: "echo-64b",
        title: "RPC echo 64 B: hmc-rpc vs tonic",
        filter: Some(("payload", "64 B")),
        x: &["clients", "in flight"],
        log2_x: false,
        series: &[("hmc RPC/s", "hmc-rpc"), ("tonic RPC/s", "tonic")],
        y_label: "RPC/s",
        targets: &[Target::Times(5.0, 1, "target: 5x tonic (at 8 x 8)")],
    },
    Spec {
        bench: "rpc",
        table: RPC_ECHO,
        id: "echo-4k",
        title: "RPC echo 4 KiB: hmc-rpc vs tonic",
        filter: Some(("payload", "4 KiB")),
        x: &["clients", "in flight"],
        log2_x: false,
        series: &[("hmc RPC/s", "hmc-rpc"), ("tonic RPC/s", "tonic")],
        y_label: "RPC/s",
        targets: &[Target::Times(3.0, 1, "target: 3x tonic (at 8 x 8)")],
    },
    Spec {
        bench: "rpc",
        table: RPC_ECHO,
        id: "echo-1m",
        title: "RPC echo 1 MiB: hmc-rpc vs tonic",
        filter: Some(("payload", "1 MiB")),
        x: &["clients", "in flight"],
        log2_x: false,
        series: &[("hmc MB/s", "hmc-rpc"), ("tonic MB/s", "tonic")],
        y_label: "MB/s",
        targets: &[Target::Times(2.0, 1, "target: 2x tonic (at 8 x 8)")],
    },
    Spec {
        bench: "rpc",
        table: "idle connections",
        id: "idle-conns",
        title: "Server memory per idle connection: hmc-rpc vs tonic",
        filter: None,
        x: &[],
        log2_x: false,
        series: &[("hmc-rpc KiB/conn", "hmc-rpc"), ("tonic KiB/conn", "tonic")],
        y_label: "KiB of server RSS per connection",
        targets: &[Target::Level(16.0, "target: 16 KiB (issue 22)")],
    },
    Spec {
        bench: "rpc",
        table: "raw TCP ping-pong baseline",
        id: "one-call-p50",
        title: "One call in flight, p50: hmc-rpc vs raw TCP ping-pong",
        filter: None,
        x: &["payload"],
        log2_x: false,
        series: &[
            ("hmc-rpc 1x1 p50 us", "hmc-rpc"),
            ("DirectClient p50 us", "hmc-rpc DirectClient"),
            ("p50 us", "raw TCP, one process"),
            ("two processes: p50 us", "raw TCP, two processes"),
        ],
        y_label: "p50 latency, µs (lower is better)",
        targets: &[Target::Times(1.25, 2, "target: at most 1.25x raw TCP")],
    },
    Spec {
        bench: "rpc",
        table: "pipelining on one connection",
        id: "pipelining",
        title: "Pipelining on one connection: depth 8 vs depth 1",
        filter: None,
        x: &["payload"],
        log2_x: false,
        series: &[("depth 8 RPC/s", "depth 8"), ("depth 1 RPC/s", "depth 1")],
        y_label: "RPC/s",
        targets: &[Target::Times(4.0, 1, "target: 4x depth 1")],
    },
    Spec {
        bench: "shm",
        table: "HMC_BUFFER echo",
        id: "hmc-buffer-shm",
        title: "HMC_BUFFER echo 1 MiB over the shared-memory data plane vs TCP_STREAM",
        filter: Some(("data plane", "Shm")),
        x: &["clients", "in flight"],
        log2_x: false,
        series: &[
            ("bytes moved MB/s", "HMC_BUFFER, shared memory"),
            ("TCP_STREAM MB/s", "TCP_STREAM"),
        ],
        y_label: "MB/s moved",
        targets: &[Target::Times(3.0, 1, "target: 3x TCP_STREAM")],
    },
    Spec {
        bench: "rpc",
        table: "HMC_BUFFER echo",
        id: "hmc-buffer",
        title: "HMC_BUFFER echo 1 MiB vs TCP_STREAM and ucx_perftest tag_bw",
        filter: None,
        x: &["data plane", "clients", "in flight"],
        log2_x: false,
        series: &[
            ("bytes moved MB/s", "HMC_BUFFER"),
            ("TCP_STREAM MB/s", "TCP_STREAM"),
            ("tag_bw MB/s median", "ucx_perftest tag_bw"),
        ],
        y_label: "MB/s moved",
        targets: &[Target::Times(0.7, 2, "target: 70% of tag_bw")],
    },
    Spec {
        bench: "rpc",
        table: "connection sweep (",
        id: "sweep-rps",
        title: "Connection sweep: 64 B echo RPC/s by connections",
        filter: None,
        x: &["connections"],
        log2_x: true,
        series: &[("RPC/s", "hmc-rpc")],
        y_label: "RPC/s",
        targets: &[Target::ShareOfPeak(
            0.8,
            0,
            "target at 1,024: 80% of the peak",
        )],
    },
    Spec {
        bench: "rpc",
        table: "connection sweep (",
        id: "sweep-memory",
        title: "Connection sweep: server memory per connection",
        filter: None,
        x: &["connections"],
        log2_x: true,
        series: &[
            ("server KiB/idle conn", "idle"),
            ("server KiB/conn after load", "after the load"),
        ],
        y_label: "KiB of server RSS per connection",
        targets: &[Target::Level(64.0, "target: 64 KiB idle")],
    },
    Spec {
        bench: "rpc",
        table: "connection sweep (",
        id: "sweep-cpu",
        title: "Connection sweep: CPU per call by connections",
        filter: None,
        x: &["connections"],
        log2_x: true,
        series: &[("CPU us/op", "hmc-rpc, client and server")],
        y_label: "CPU µs per call, client and server (lower is better)",
        targets: &[],
    },
    // The 1 MiB echo beside iperf3 moving bytes both ways (issue 60, part 3): medians of
    // alternated rounds.
    Spec {
        bench: "rpc",
        table: RPC_VS_IPERF3,
        id: "echo-vs-iperf3",
        title: "RPC echo 1 MiB vs iperf3 --bidir: MB/s moved, medians of alternated rounds",
        filter: Some(("payload", "1 MiB")),
        x: &["clients", "in flight"],
        log2_x: false,
        series: &[
            ("hmc MB/s moved", "hmc-rpc"),
            ("tonic MB/s moved", "tonic"),
            ("iperf3 MB/s moved", "iperf3 --bidir"),
        ],
        y_label: "MB/s moved (request + response)",
        targets: &[Target::Times(0.8, 2, "target: 80% of iperf3")],
    },
    Spec {
        bench: "rpc",
        table: RPC_VS_IPERF3,
        id: "echo-vs-iperf3-cpu",
        title: "RPC echo 1 MiB vs iperf3 --bidir: CPU per GiB, medians of alternated rounds",
        filter: Some(("payload", "1 MiB")),
        x: &["clients", "in flight"],
        log2_x: false,
        series: &[
            ("hmc CPU-s/GiB", "hmc-rpc"),
            ("tonic CPU-s/GiB", "tonic"),
            ("iperf3 CPU-s/GiB", "iperf3 --bidir"),
        ],
        y_label: CPU_PER_GIB,
        targets: &[],
    },
    Spec {
        bench: "engine",
        table: "engine connection sweep (",
        id: "engine-sweep-ops",
        title: "Engine connection sweep: 64 B sync WRITE ops/s by connected engines",
        filter: None,
        x: &["connections"],
        log2_x: true,
        series: &[("WRITE ops/s", "hmc-engine")],
        y_label: "WRITE ops/s",
        targets: &[Target::ShareOfPeak(
            0.8,
            0,
            "target at 1,024: 80% of the peak",
        )],
    },
    Spec {
        bench: "engine",
        table: "engine connection sweep (",
        id: "engine-sweep-memory",
        title: "Engine connection sweep: target memory per connected engine",
        filter: None,
        x: &["connections"],
        log2_x: true,
        series: &[
            ("server KiB/idle conn", "idle"),
            ("server KiB/conn after load", "after the load"),
        ],
        y_label: "KiB of target RSS per engine",
        targets: &[Target::Level(64.0, "target: 64 KiB idle")],
    },
    Spec {
        bench: "transfer",
        table: "",
        id: "tcp-vs-iperf3",
        title: "One-sided TCP transfers (target in another process) vs iperf3",
        filter: None,
        x: &["size"],
        log2_x: false,
        series: &[("WRITE GB/s", "hmc WRITE"), ("READ GB/s", "hmc READ")],
        y_label: "GB/s",
        targets: &[
            Target::FromNote("iperf3 loopback", 1.0, "iperf3, one stream"),
            Target::FromNote(
                "iperf3 loopback",
                0.7,
                "target: 70% of iperf3 (1 MiB and up)",
            ),
        ],
    },
    // ucx_perftest allocates its buffers through UCX, so the `-ucxmem` rows are the like for
    // like ones (the target's); the user-memory rows have no perftest counterpart.
    Spec {
        bench: "ucx",
        table: "",
        id: "ucx-tcp-ucxmem",
        title: "UCX put/get over TCP vs ucx_perftest, like for like (UCX-allocated memory)",
        filter: Some(("row", "tcp-ucxmem")),
        x: &["op", "size"],
        log2_x: false,
        series: &UCX_SERIES,
        y_label: "GB/s (median)",
        targets: &[Target::Times(
            0.9,
            1,
            "target: 90% of ucx_perftest (64 KiB+)",
        )],
    },
    Spec {
        bench: "ucx",
        table: "",
        id: "ucx-shm-ucxmem",
        title: "UCX put/get over shared memory vs ucx_perftest, like for like (UCX-allocated memory)",
        filter: Some(("row", "shm-ucxmem")),
        x: &["op", "size"],
        log2_x: false,
        series: &UCX_SERIES,
        y_label: "GB/s (median)",
        targets: &[Target::Times(
            0.9,
            1,
            "target: 90% of ucx_perftest (64 KiB+)",
        )],
    },
    Spec {
        bench: "ucx",
        table: "",
        id: "ucx-tcp-user",
        title: "UCX put/get over TCP from user memory, ucx_perftest (its own memory) beside",
        filter: Some(("row", "tcp")),
        x: &["op", "size"],
        log2_x: false,
        series: &UCX_SERIES,
        y_label: "GB/s (median)",
        targets: &[],
    },
    Spec {
        bench: "ucx",
        table: "",
        id: "ucx-shm-user",
        title: "UCX put/get over shared memory from user memory, ucx_perftest (its own memory) beside",
        filter: Some(("row", "shm")),
        x: &["op", "size"],
        log2_x: false,
        series: &UCX_SERIES,
        y_label: "GB/s (median)",
        targets: &[],
    },
    Spec {
        bench: "shm",
        table: "Same-host one-sided transfers",
        id: "shm-vs-memcpy",
        title: "Same-host transfers vs memcpy and UCX shared memory",
        filter: None,
        x: &["op", "size"],
        log2_x: false,
        series: &[
            ("shm GB/s", "shm (attach)"),
            ("shared mem GB/s", "shm (shared memory)"),
            ("memcpy GB/s", "memcpy, one thread"),
            ("UCX user mem GB/s", "UCX, user memory"),
            ("UCX own mem GB/s", "UCX, its own memory"),
        ],
        y_label: "GB/s",
        targets: &[
            // 300k ops/s of 4 KiB, as GB/s (the bench's GB/s are 1e9 bytes).
            Target::LevelAt(
                0.3e6 * 4.0 * KIB / 1e9,
                &[4.0 * KIB],
                "target: 300k ops/s at 4 KiB",
            ),
            Target::TimesAt(
                0.8,
                2,
                &[64.0 * KIB, MIB],
                "target: 80% of memcpy (64 KiB, 1 MiB)",
            ),
        ],
    },
    Spec {
        bench: "engine",
        table: "hmc-engine",
        id: "engine-vs-mooncake",
        title: "Engine sync ops vs Mooncake Transfer Engine",
        filter: None,
        x: &["op", "size"],
        log2_x: false,
        series: &[("hmc ops/s", "hmc-engine"), ("Mooncake ops/s", "Mooncake")],
        y_label: "ops/s",
        targets: &[
            Target::TimesAt(
                3.0,
                1,
                &[4.0 * KIB, 64.0 * KIB],
                "target: 3x Mooncake (4, 64 KiB)",
            ),
            Target::TimesAt(
                2.0,
                1,
                &[MIB, 16.0 * MIB],
                "target: 2x Mooncake (1, 16 MiB)",
            ),
        ],
    },
    Spec {
        bench: "engine",
        table: "facade overhead",
        id: "engine-facade",
        title: "Engine facade vs the bare Communicator",
        filter: None,
        x: &["size"],
        log2_x: false,
        series: &[
            ("engine us/op", "engine"),
            ("bare us/op", "bare Communicator"),
        ],
        y_label: "µs per op (lower is better)",
        targets: &[
            Target::TimesAt(
                1.05,
                1,
                &[64.0 * KIB, MIB, 16.0 * MIB],
                "target: at most 5% over bare (64 KiB+)",
            ),
            Target::Plus(
                2.0,
                1,
                &[4.0 * KIB],
                "target: at most 2 µs over bare (4 KiB)",
            ),
        ],
    },
    Spec {
        bench: "python",
        table: "Python API",
        id: "python-vs-mooncake",
        title: "Python API vs Mooncake's Python API, sync single ops",
        filter: None,
        x: &["op", "size"],
        log2_x: false,
        series: &[("hmc ops/s", "hmc"), ("Mooncake ops/s", "Mooncake")],
        y_label: "ops/s",
        targets: PYTHON_TARGETS,
    },
    Spec {
        bench: "python",
        table: "hmc with the default options",
        id: "python-default-vs-mooncake",
        title: "Python API, default transport (same host) vs Mooncake (tcp), sync single ops",
        filter: None,
        x: &["op", "size"],
        log2_x: false,
        series: &[("hmc ops/s", "hmc (auto)"), ("Mooncake ops/s", "Mooncake")],
        y_label: "ops/s",
        targets: PYTHON_TARGETS,
    },
    Spec {
        bench: "python",
        table: "Python overhead per sync op",
        id: "python-overhead",
        title: "What Python adds per sync op over the same call from Rust",
        filter: None,
        x: &["op", "call"],
        log2_x: false,
        series: &[
            ("Python loop us/op", "from Python"),
            ("Rust loop us/op", "from Rust"),
        ],
        y_label: "µs per op (lower is better)",
        targets: &[Target::Plus(3.0, 1, &[], "target: at most 3 µs over Rust")],
    },
    Spec {
        bench: "plugin",
        table: "",
        id: "plugin-vs-static",
        title: "A transport as a plugin vs linked statically (median per op)",
        filter: None,
        x: &["op", "size"],
        log2_x: false,
        series: &[
            ("plugin median", "plugin"),
            ("static median", "linked statically"),
        ],
        y_label: "median µs per op (lower is better)",
        targets: &[Target::Times(1.05, 1, "target: at most 5% over static")],
    },
    Spec {
        bench: "rdma",
        table: "",
        id: "rdma-cpu",
        title: "RDMA transport: our CPU per batch vs the stand-in's wall time (no NIC)",
        filter: None,
        x: &["op", "descriptors x size"],
        log2_x: false,
        series: &[
            ("our CPU per batch", "our CPU per batch"),
            ("wall per batch", "wall per batch (the libibverbs stand-in)"),
        ],
        y_label: "µs per batch",
        // The target (90% of ib_write_bw) needs a NIC.
        targets: &[],
    },
    Spec {
        bench: "rdma",
        table: "",
        id: "rdma-standin-bw",
        title: "RDMA transport through the libibverbs stand-in: 16 MiB batches (no NIC)",
        filter: None,
        x: &["op", "descriptor size"],
        log2_x: false,
        series: &[("GB/s", "through the stand-in")],
        y_label: "GB/s",
        targets: &[],
    },
    // CPU per byte beside each rate (issue 60): every process of each system, per GiB
    // moved (per call for the small RPC payloads); no targets yet.
    Spec {
        bench: "transfer",
        table: "",
        id: "tcp-cpu",
        title: "One-sided TCP transfers: CPU per GiB, both processes, vs iperf3's",
        filter: None,
        x: &["size"],
        log2_x: false,
        series: &[
            ("WRITE CPU-s/GiB", "hmc WRITE"),
            ("READ CPU-s/GiB", "hmc READ"),
        ],
        y_label: CPU_PER_GIB,
        targets: &[Target::FromNote(
            "iperf3 CPU",
            1.0,
            "iperf3, client and server",
        )],
    },
    Spec {
        bench: "engine",
        table: "hmc-engine",
        id: "engine-cpu",
        title: "Engine sync ops vs Mooncake: CPU per GiB",
        filter: None,
        x: &["op", "size"],
        log2_x: false,
        series: &[
            ("hmc CPU-s/GiB", "hmc-engine"),
            ("Mooncake CPU-s/GiB", "Mooncake"),
        ],
        y_label: CPU_PER_GIB,
        targets: &[],
    },
    Spec {
        bench: "engine python",
        table: "the same sync ops vs this machine's TCP floor",
        id: "cpu-vs-floor",
        title: "Sync ops: CPU per GiB beside the TCP floor's",
        filter: None,
        x: &["op", "size"],
        log2_x: false,
        series: &[
            ("hmc CPU-s/GiB", "hmc"),
            ("Mooncake CPU-s/GiB", "Mooncake"),
            ("floor CPU-s/GiB", "TCP floor"),
        ],
        y_label: CPU_PER_GIB,
        targets: &[],
    },
    Spec {
        bench: "shm",
        table: "CPU per GiB moved",
        id: "shm-cpu",
        title: "Same-host transfers: CPU per GiB vs memcpy and UCX shared memory",
        filter: None,
        x: &["op", "size"],
        log2_x: false,
        series: &[
            ("shm CPU-s/GiB", "shm (attach)"),
            ("shared mem CPU-s/GiB", "shm (shared memory)"),
            ("memcpy CPU-s/GiB", "memcpy, one thread"),
            ("UCX user mem CPU-s/GiB", "UCX, user memory"),
            ("UCX own mem CPU-s/GiB", "UCX, its own memory"),
        ],
        y_label: CPU_PER_GIB,
        targets: &[],
    },
    ucx_cpu(
        "ucx-tcp-ucxmem-cpu",
        "UCX put/get over TCP: CPU per GiB vs ucx_perftest's (UCX-allocated memory)",
        "tcp-ucxmem",
    ),
    ucx_cpu(
        "ucx-shm-ucxmem-cpu",
        "UCX put/get over shared memory: CPU per GiB vs ucx_perftest's (UCX-allocated memory)",
        "shm-ucxmem",
    ),
    Spec {
        bench: "rpc",
        table: RPC_ECHO,
        id: "echo-cpu-64b",
        title: "RPC echo 64 B: CPU per call, hmc-rpc vs tonic",
        filter: Some(("payload", "64 B")),
        x: &["clients", "in flight"],
        log2_x: false,
        series: &[
            ("hmc CPU us/call", "hmc-rpc"),
            ("tonic CPU us/call", "tonic"),
        ],
        y_label: "CPU µs per call, client and server (lower is better)",
        targets: &[],
    },
    Spec {
        bench: "rpc",
        table: RPC_ECHO,
        id: "echo-cpu-1m",
        title: "RPC echo 1 MiB: CPU per GiB, hmc-rpc vs tonic",
        filter: Some(("payload", "1 MiB")),
        x: &["clients", "in flight"],
        log2_x: false,
        series: &[("hmc CPU-s/GiB", "hmc-rpc"), ("tonic CPU-s/GiB", "tonic")],
        y_label: CPU_PER_GIB,
        targets: &[],
    },
    Spec {
        bench: "rpc shm",
        table: "HMC_BUFFER echo",
        id: "hmc-buffer-cpu",
        title: "HMC_BUFFER echo 1 MiB: CPU per GiB vs TCP_STREAM and ucx_perftest tag_bw",
        filter: None,
        x: &["data plane", "clients", "in flight"],
        log2_x: false,
        series: &[
            ("CPU-s/GiB", "HMC_BUFFER"),
            ("TCP_STREAM CPU-s/GiB", "TCP_STREAM"),
            (
                "tag_bw CPU-s/GiB",
                "ucx_perftest tag_bw (start-up included)",
            ),
        ],
        y_label: CPU_PER_GIB,
        targets: &[],
    },
    Spec {
        bench: "python",
        table: "Python API",
        id: "python-cpu",
        title: "Python API vs Mooncake's: CPU per GiB, sync single ops",
        filter: None,
        x: &["op", "size"],
        log2_x: false,
        series: &[("hmc CPU-s/GiB", "hmc"), ("Mooncake CPU-s/GiB", "Mooncake")],
        y_label: CPU_PER_GIB,
        targets: &[],
    },
    Spec {
        bench: "python",
        table: "hmc with the default options",
        id: "python-default-cpu",
        title: "Python API, default transport vs Mooncake (tcp): CPU per GiB",
        filter: None,
        x: &["op", "size"],
        log2_x: false,
        series: &[
            ("hmc CPU-s/GiB", "hmc (auto)"),
            ("Mooncake CPU-s/GiB", "Mooncake"),
        ],
        y_label: CPU_PER_GIB,
        targets: &[],
    },
];

/// The figures of `table`, a table of `run` of `bench`.
pub fn plots_for(bench: &str, run: &Run, table: &Table) -> Vec<Plot> {
    SPECS
        .iter()
        .filter(|s| s.bench.split(' ').any(|b| b == bench) && table.title.starts_with(s.table))
        .filter_map(|s| plot(s, run, table))
        .collect()
}

fn plot(spec: &Spec, run: &Run, t: &Table) -> Option<Plot> {
    let cols: Vec<usize> = spec
        .series
        .iter()
        .map(|(c, _)| t.column(c))
        .collect::<Option<_>>()?;
    let x_cols: Vec<usize> = spec.x.iter().map(|c| t.column(c)).collect::<Option<_>>()?;
    let rows: Vec<usize> = (0..t.rows.len())
        .filter(|&r| {
            spec.filter
                .is_none_or(|(c, v)| t.column(c).is_some_and(|c| t.rows[r][c] == v))
        })
        .collect();
    if rows.is_empty() {
        return None;
    }
    let x_of = |i: usize, r: usize| -> Option<f64> {
        if spec.log2_x {
            t.values[r][x_cols[0]]
        } else {
            Some(i as f64)
        }
    };
    let series: Vec<Series> = spec
        .series
        .iter()
        .zip(&cols)
        .map(|((_, name), &c)| Series {
            name: name.to_string(),
            points: rows
                .iter()
                .enumerate()
                .filter_map(|(i, &r)| Some((x_of(i, r)?, t.values[r][c]?)))
                .collect(),
        })
        .collect();
    if series.iter().all(|s| s.points.is_empty()) {
        return None;
    }
    let x = if spec.log2_x {
        XAxis::Log2(spec.x[0].to_string())
    } else {
        XAxis::Categories(
            rows.iter()
                .map(|&r| {
                    let name: Vec<String> = x_cols
                        .iter()
                        .map(|&c| match t.columns[c].contains("size") {
                            true => size_label(&t.rows[r][c]),
                            false => t.rows[r][c].clone(),
                        })
                        .collect();
                    if name.is_empty() {
                        "this run".to_string()
                    } else {
                        name.join(" x ")
                    }
                })
                .collect(),
        )
    };
    let span = match &x {
        XAxis::Categories(n) => (-0.5, n.len() as f64 - 0.5),
        XAxis::Log2(_) => {
            let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
            let (lo, hi) = xs.fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
            (lo, hi)
        }
    };
    let level = |y: f64, name: &str, peer: bool| Reference {
        name: name.to_string(),
        marks: vec![(span.0, span.1, y)],
        level: true,
        peer,
    };
    // Whether the group at `x` (an index into `rows`) has one of `sizes` (empty: any).
    let size_col = t.column("size");
    let at = |sizes: Sizes, x: f64| {
        sizes.is_empty()
            || (!spec.log2_x
                && rows
                    .get(x as usize)
                    .and_then(|&r| t.values[r][size_col?])
                    .is_some_and(|v| sizes.contains(&v)))
    };
    let marks = |name: &str, marks: Vec<(f64, f64, f64)>| Reference {
        name: name.to_string(),
        marks,
        level: false,
        peer: false,
    };
    let relative = |of: usize, sizes: Sizes, f: &dyn Fn(f64) -> f64| -> Vec<(f64, f64, f64)> {
        series[of]
            .points
            .iter()
            .filter(|p| at(sizes, p.0))
            .map(|&(x, y)| (x - 0.4, x + 0.4, f(y)))
            .collect()
    };
    let references = spec
        .targets
        .iter()
        .filter_map(|target| match *target {
            Target::Times(factor, of, name) => {
                Some(marks(name, relative(of, &[], &|y| factor * y)))
            }
            Target::TimesAt(factor, of, sizes, name) => {
                Some(marks(name, relative(of, sizes, &|y| factor * y)))
            }
            Target::Plus(add, of, sizes, name) => {
                Some(marks(name, relative(of, sizes, &|y| y + add)))
            }
            Target::Level(y, name) => Some(level(y, name, false)),
            Target::LevelAt(y, sizes, name) => Some(marks(
                name,
                (0..rows.len())
                    .map(|i| i as f64)
                    .filter(|&x| at(sizes, x))
                    .map(|x| (x - 0.4, x + 0.4, y))
                    .collect(),
            )),
            Target::ShareOfPeak(share, of, name) => {
                let peak = series[of].points.iter().map(|p| p.1).fold(0.0, f64::max);
                Some(level(share * peak, name, false))
            }
            Target::FromNote(prefix, factor, name) => run
                .notes
                .iter()
                .find(|n| n.starts_with(prefix))
                .and_then(|n| super::cell_value(n.rsplit_once(':')?.1))
                .map(|y| level(factor * y, name, factor == 1.0)),
        })
        .collect();
    Some(Plot {
        id: spec.id.to_string(),
        title: if t.title.contains("UCX_TLS=") {
            let tls = t.title.rsplit_once("UCX_TLS=").map_or("", |(_, v)| v);
            format!("{} (UCX_TLS={}", spec.title, tls)
        } else {
            spec.title.to_string()
        },
        y_label: spec.y_label.to_string(),
        x_label: spec.x.join(" x "),
        x,
        series,
        references,
    })
}

/// A size cell as a category label in its largest whole unit (`65536` as the Python bench
/// prints it, `1024 KiB` as the RDMA bench does: `64 KiB`, `1 MiB`); anything else as
/// printed.
fn size_label(cell: &str) -> String {
    let whole = |unit: &str| {
        let n = cell.strip_suffix(unit)?.trim_end();
        n.parse::<u64>().ok()
    };
    let bytes = cell
        .parse::<u64>()
        .ok()
        .or_else(|| whole(" KiB").map(|n| n << 10))
        .or_else(|| whole(" MiB").map(|n| n << 20));
    match bytes {
        Some(n) if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        Some(n) if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        _ => cell.to_string(),
    }
}

/// Category names along x, one tick per group.
struct CategoryAxis(Vec<String>);

impl Ranged for CategoryAxis {
    type FormatOption = NoDefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let n = self.0.len().max(1) as f64;
        let frac = (v + 0.5) / n;
        limit.0 + (frac * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, _hint: H) -> Vec<f64> {
        (0..self.0.len()).map(|i| i as f64).collect()
    }

    fn range(&self) -> Range<f64> {
        -0.5..self.0.len() as f64 - 0.5
    }
}

impl ValueFormatter<f64> for CategoryAxis {
    fn format_ext(&self, v: &f64) -> String {
        self.0
            .get(v.round().max(0.0) as usize)
            .cloned()
            .unwrap_or_default()
    }
}

/// 1234567 → "1.235M", 45000 → "45k", 950 → "950", 0.5 → "0.5".
fn compact(v: f64) -> String {
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    let a = v.abs();
    if a >= 1e6 {
        format!("{}M", trim(format!("{:.3}", v / 1e6)))
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 10.0 || a == 0.0 {
        format!("{v:.0}")
    } else {
        trim(format!("{v:.2}"))
    }
}

/// The colours of the series: ours first (blue), then the peers.
const COLOURS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];
const TARGET: RGBColor = RGBColor(214, 39, 40);
/// A peer's single figure (iperf3's bandwidth) drawn as a level.
const PEER_LEVEL: RGBColor = RGBColor(90, 90, 90);

const SIZE: (u32, u32) = (860, 440);

/// The figure's size: wider than [`SIZE`] when its group names would not fit side by side.
fn size_of(plot: &Plot) -> (u32, u32) {
    let XAxis::Categories(names) = &plot.x else {
        return SIZE;
    };
    let longest = names.iter().map(|n| n.chars().count()).max().unwrap_or(0) as u32;
    // About 7 px a character at 12 px, a gap, and the y axis's labels.
    let needed = 90 + names.len() as u32 * (longest * 7 + 16);
    (needed.clamp(SIZE.0, 1600), SIZE.1)
}

/// The share of the plot's height the legend takes: about 16 px an entry and its margins,
/// over a plot about 300 px high; at most half.
fn legend_share(plot: &Plot) -> f64 {
    let series = plot.series.iter().filter(|s| !s.points.is_empty()).count();
    let references = plot
        .references
        .iter()
        .filter(|r| !r.marks.is_empty())
        .count();
    (((series + references) * 16 + 30) as f64 / 300.0).min(0.5)
}

/// The figure as SVG text, `caption` (when, how loaded) under it.
pub fn render_svg(plot: &Plot, caption: &str) -> Result<String> {
    let ys = plot
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .chain(
            plot.references
                .iter()
                .flat_map(|r| r.marks.iter().map(|m| m.2)),
        );
    let (lo, hi) = ys.fold((f64::MAX, 0.0f64), |(a, b), v| (a.min(v), b.max(v)));
    let hi = if hi > 0.0 { hi } else { 1.0 };
    let log_y = lo > 0.0 && hi / lo > 30.0;
    // Room at the top for the legend (drawn inside the plot), so that it hides no bar.
    let share = legend_share(plot);
    let y_lin: RangedCoordf64 = (0.0..(hi / (1.0 - share)).max(hi * 1.25)).into();
    let y_log = || -> LogCoord<f64> {
        let lo = lo / 1.5;
        let top = hi * (hi / lo).powf(share / (1.0 - share));
        (lo..top.max(hi * 2.0)).log_scale().into()
    };
    match &plot.x {
        XAxis::Categories(names) => {
            let x = CategoryAxis(names.clone());
            if log_y {
                draw(plot, caption, x, y_log())
            } else {
                draw(plot, caption, x, y_lin)
            }
        }
        XAxis::Log2(_) => {
            let xs = plot
                .series
                .iter()
                .flat_map(|s| s.points.iter().map(|p| p.0));
            let (a, b) = xs.fold((f64::MAX, 1.0f64), |(a, b), v| (a.min(v), b.max(v)));
            let x: LogCoord<f64> = (a.clamp(0.5, 1.0)..b * 1.5).log_scale().base(2.0).into();
            if log_y {
                draw(plot, caption, x, y_log())
            } else {
                draw(plot, caption, x, y_lin)
            }
        }
    }
}

fn draw<X, Y>(plot: &Plot, caption: &str, x: X, y: Y) -> Result<String>
where
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let e = |e: DrawingAreaErrorKind<_>| format!("drawing {}: {e}", plot.title);
    let categories = match &plot.x {
        XAxis::Categories(n) => Some(n.len()),
        XAxis::Log2(_) => None,
    };
    let y_base = y.range().start;
    let mut svg = String::new();
    {
        let size = size_of(plot);
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(e)?;
        let (main, foot) = root.split_vertically(size.1 - 24);
        foot.draw(&Text::new(
            caption.to_string(),
            (12, 4),
            ("sans-serif", 12).into_font().color(&RGBColor(90, 90, 90)),
        ))
        .map_err(e)?;
        let mut chart = ChartBuilder::on(&main)
            .caption(&plot.title, ("sans-serif", 17))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(x, y)
            .map_err(e)?;
        let x_fmt = |v: &f64| match &plot.x {
            XAxis::Categories(n) => n
                .get(v.round().max(0.0) as usize)
                .cloned()
                .unwrap_or_default(),
            XAxis::Log2(_) => format!("{v:.0}"),
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .y_desc(plot.y_label.as_str())
            .x_desc(plot.x_label.as_str())
            .y_max_light_lines(1)
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&|v| compact(*v))
            .label_style(("sans-serif", 12))
            .draw()
            .map_err(e)?;
        // A peer missing from this run (no tonic binary, no Mooncake) gets no legend entry
        // and no room in the groups; each series keeps its colour.
        let drawn: Vec<(usize, &Series)> = plot
            .series
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.points.is_empty())
            .collect();
        let k = drawn.len().max(1) as f64;
        for (slot, &(j, s)) in drawn.iter().enumerate() {
            let colour = COLOURS[j % COLOURS.len()];
            let anno = if categories.is_some() {
                let w = 0.8 / k;
                chart
                    .draw_series(s.points.iter().map(|&(cx, v)| {
                        let x0 = cx - 0.4 + slot as f64 * w;
                        Rectangle::new([(x0, y_base), (x0 + w * 0.92, v)], colour.filled())
                    }))
                    .map_err(e)?
            } else {
                chart
                    .draw_series(PointSeries::of_element(
                        s.points.clone(),
                        4,
                        colour.filled(),
                        &|c, size, style| Circle::new(c, size, style),
                    ))
                    .map_err(e)?;
                chart
                    .draw_series(LineSeries::new(s.points.clone(), colour.stroke_width(2)))
                    .map_err(e)?
            };
            anno.label(s.name.clone()).legend(move |(lx, ly)| {
                Rectangle::new([(lx, ly - 5), (lx + 12, ly + 5)], colour.filled())
            });
        }
        for r in plot.references.iter().filter(|r| !r.marks.is_empty()) {
            let style = if r.peer { PEER_LEVEL } else { TARGET }.stroke_width(2);
            let anno = if r.level {
                let (x0, x1, yv) = r.marks[0];
                chart
                    .draw_series(DashedLineSeries::new([(x0, yv), (x1, yv)], 8, 5, style))
                    .map_err(e)?
            } else {
                chart
                    .draw_series(
                        r.marks
                            .iter()
                            .map(|&(x0, x1, yv)| PathElement::new(vec![(x0, yv), (x1, yv)], style)),
                    )
                    .map_err(e)?
            };
            anno.label(r.name.clone())
                .legend(move |(lx, ly)| PathElement::new(vec![(lx, ly), (lx + 14, ly)], style));
        }
        // Bars start low on the left more often than not; the sweeps' lines fall to the right.
        let legend_at = match categories {
            Some(_) => SeriesLabelPosition::UpperLeft,
            None => SeriesLabelPosition::UpperRight,
        };
        chart
            .configure_series_labels()
            .position(legend_at)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(160, 160, 160))
            .label_font(("sans-serif", 12))
            .draw()
            .map_err(e)?;
        root.present().map_err(e)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::super::{
        parse_output,
        tests::{FIXTURES, RPC_OUTPUT},
    };
    use super::*;
    use rstest::rstest;

    fn run_of(text: &str) -> Run {
        let (tables, notes) = parse_output(text);
        Run {
            command: "bench".into(),
            started_unix_s: 0,
            wall_s: 1.0,
            cpus: 2,
            load_before: None,
            load_after: None,
            ok: true,
            tables,
            notes,
        }
    }

    /// The SVG parsed as XML: its `<text>` contents, and the fills of its `<rect>`s.
    fn parse_svg(svg: &str) -> (Vec<String>, Vec<String>) {
        let doc = roxmltree::Document::parse(svg).expect("well-formed SVG");
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        let texts = root
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .map(|n| n.text().unwrap_or_default().trim().to_string())
            .collect();
        let fills = root
            .descendants()
            .filter(|n| n.has_tag_name("rect"))
            .filter_map(|n| n.attribute("fill").map(str::to_string))
            .collect();
        (texts, fills)
    }

    fn hex(c: RGBColor) -> String {
        format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
    }

    #[test]
    fn the_rpc_echo_figure_has_ours_the_peer_and_the_target_for_each_cell() {
        let run = run_of(RPC_OUTPUT);
        let plots = plots_for("rpc", &run, &run.tables[0]);
        let ids: Vec<&str> = plots.iter().map(|p| p.id.as_str()).collect();
        // No 1 MiB rows in this table: no 1 MiB figure.
        assert_eq!(ids, ["echo-64b", "echo-4k"]);
        let p = &plots[0];
        assert_eq!(p.x, XAxis::Categories(vec!["1 x 1".into(), "8 x 8".into()]));
        assert_eq!(p.series[0].points, [(0.0, 20000.0), (1.0, 400000.0)]);
        assert_eq!(p.series[1].points, [(0.0, 9000.0), (1.0, 50000.0)]);
        // The target is 5x tonic over each group.
        assert_eq!(
            p.references[0].marks,
            [(-0.4, 0.4, 45000.0), (0.6, 1.4, 250000.0)]
        );
        let svg = render_svg(p, "2026-12-01 22:00 UTC, load average 7").unwrap();
        let (texts, fills) = parse_svg(&svg);
        for want in [
            "RPC echo 64 B: hmc-rpc vs tonic",
            "hmc-rpc",
            "tonic",
            "target: 5x tonic (at 8 x 8)",
            "1 x 1",
            "8 x 8",
            "2026-12-01 22:00 UTC, load average 7",
        ] {
            assert!(
                texts.iter().any(|t| t == want),
                "no text {want:?} in {texts:?}"
            );
        }
        // Two bars per series (plus its legend swatch).
        for c in [COLOURS[0], COLOURS[1]] {
            assert_eq!(
                fills.iter().filter(|f| **f == hex(c)).count(),
                3,
                "{fills:?}"
            );
        }
        assert!(texts.iter().any(|t| t == "clients x in flight"));
        // The 4 KiB figure has no tonic values: ours is drawn, the absent peer and a target
        // relative to it are not in the legend.
        let (texts, fills) = parse_svg(&render_svg(&plots[1], "").unwrap());
        assert_eq!(fills.iter().filter(|f| **f == hex(COLOURS[0])).count(), 2);
        assert_eq!(fills.iter().filter(|f| **f == hex(COLOURS[1])).count(), 0);
        assert!(texts.iter().any(|t| t == "hmc-rpc"));
        assert!(
            !texts
                .iter()
                .any(|t| t == "tonic" || t.starts_with("target")),
            "{texts:?}"
        );
    }

    const SWEEP: &str = "\
## connection sweep (64 B echo, 1 in flight per connection)

| connections | RPC/s | p50 us | p99 us | share of peak | CPU us/op (both sides) | server KiB/idle conn | server KiB/conn after load |
| --- | --- | --- | --- | --- | --- | --- | --- |
| 1 | 10000 | 90 | 200 | 20% | 30.5 | 4.0 | 8.0 |
| 64 | 50000 | 900 | 2000 | 100% | 21.0 | 9.5 | 20.0 |
| 1024 | 42000 | 9000 | 20000 | 84% | - | 7.5 | 30.0 |
";

    #[test]
    fn the_sweep_figures_plot_by_connections_with_the_peak_and_memory_targets() {
        let run = run_of(SWEEP);
        let plots = plots_for("rpc", &run, &run.tables[0]);
        assert_eq!(plots.len(), 3);
        // CPU per call at every step that has it, by connections.
        let cpu = &plots[2];
        assert_eq!(cpu.id, "sweep-cpu");
        assert_eq!(cpu.x, XAxis::Log2("connections".into()));
        assert_eq!(cpu.series[0].points, [(1.0, 30.5), (64.0, 21.0)]);
        let rps = &plots[0];
        assert_eq!(rps.x, XAxis::Log2("connections".into()));
        assert_eq!(
            rps.series[0].points,
            [(1.0, 10000.0), (64.0, 50000.0), (1024.0, 42000.0)]
        );
        assert_eq!(rps.references[0].marks, [(1.0, 1024.0, 40000.0)]);
        let mem = &plots[1];
        assert_eq!(mem.series.len(), 2);
        assert_eq!(mem.references[0].marks[0].2, 64.0);
        let svg = render_svg(rps, "").unwrap();
        let (texts, _) = parse_svg(&svg);
        assert!(
            texts
                .iter()
                .any(|t| t == "target at 1,024: 80% of the peak")
        );
        assert!(texts.iter().any(|t| t == "1024"), "{texts:?}");
        let doc = roxmltree::Document::parse(&svg).unwrap();
        // The series is a line; the target a dashed line of its own.
        let lines = doc
            .descendants()
            .filter(|n| n.has_tag_name("polyline"))
            .filter(|n| n.attribute("stroke") == Some(&hex(COLOURS[0])))
            .count();
        assert!(lines >= 1, "{svg}");
        assert!(
            doc.descendants()
                .any(|n| n.attribute("stroke") == Some(&hex(TARGET)))
        );
    }

    #[test]
    fn the_rpc_echo_cpu_figures_are_per_call_at_64_b_and_per_gib_at_1_mib() {
        let run = run_of(
            "\
## hmc-rpc echo vs tonic (same run)

| payload | clients | in flight | hmc RPC/s | tonic RPC/s | hmc MB/s | tonic MB/s | hmc CPU us/call | tonic CPU us/call | hmc CPU-s/GiB | tonic CPU-s/GiB |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
| 64 B | 1 | 1 | 20000 | 9000 | 1.3 | 0.6 | 21.5 | 60.2 | 176.1 | 493.2 |
| 1 MiB | 1 | 1 | 900 | 400 | 943.7 | 419.4 | 700.0 | 2100.0 | 0.342 | 1.025 |
",
        );
        let plots = plots_for("rpc", &run, &run.tables[0]);
        let ids: Vec<&str> = plots.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["echo-64b", "echo-1m", "echo-cpu-64b", "echo-cpu-1m"]);
        assert_eq!(plots[2].series[0].points, [(0.0, 21.5)]);
        assert_eq!(plots[2].series[1].points, [(0.0, 60.2)]);
        assert_eq!(plots[3].series[0].points, [(0.0, 0.342)]);
        assert_eq!(plots[3].series[1].points, [(0.0, 1.025)]);
        assert!(plots[3].references.is_empty());
    }

    #[test]
    fn the_iperf3_figures_take_the_medians_with_the_80_percent_target() {
        let run = run_of(
            "\
## echo vs iperf3 --bidir, each round (2 s per cell)

| round | payload | clients | in flight | hmc MB/s moved | tonic MB/s moved | iperf3 MB/s moved | hmc CPU-s/GiB | tonic CPU-s/GiB | iperf3 CPU-s/GiB |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
| 1 | 1 MiB | 1 | 1 | 900 | 500 | 5000 | 0.500 | 1.500 | 0.300 |

## echo vs iperf3 --bidir, medians of 5 alternated rounds (min–max)

| payload | clients | in flight | hmc MB/s moved | tonic MB/s moved | iperf3 MB/s moved | hmc / iperf3 (target ≥ 80%) | hmc CPU-s/GiB | tonic CPU-s/GiB | iperf3 CPU-s/GiB |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
| 1 MiB | 1 | 1 | 1000 (900–1100) | 500 (400–600) | 5000 (4000–6000) | 0.20 (0.18–0.22) | 0.500 (0.4–0.6) | 1.500 (1.4–1.6) | 0.300 (0.2–0.4) |
| 1 MiB | 8 | 8 | 3000 (2000–3300) | 1500 (1400–1600) | 5000 (4000–6000) | 0.60 (0.5–0.7) | 0.400 (0.3–0.5) | 1.800 (1.7–1.9) | 0.300 (0.2–0.4) |
",
        );
        // The per-round table has no figure of its own.
        assert!(plots_for("rpc", &run, &run.tables[0]).is_empty());
        let plots = plots_for("rpc", &run, &run.tables[1]);
        let ids: Vec<&str> = plots.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["echo-vs-iperf3", "echo-vs-iperf3-cpu"]);
        let rate = &plots[0];
        assert_eq!(
            rate.x,
            XAxis::Categories(vec!["1 x 1".into(), "8 x 8".into()])
        );
        assert_eq!(rate.series[0].points, [(0.0, 1000.0), (1.0, 3000.0)]);
        assert_eq!(rate.series[2].points, [(0.0, 5000.0), (1.0, 5000.0)]);
        assert_eq!(
            rate.references[0].marks,
            [(-0.4, 0.4, 4000.0), (0.6, 1.4, 4000.0)]
        );
        let cpu = &plots[1];
        assert_eq!(cpu.series[1].points, [(0.0, 1.5), (1.0, 1.8)]);
        assert_eq!(cpu.series[2].points, [(0.0, 0.3), (1.0, 0.3)]);
        assert!(cpu.references.is_empty());
    }

    #[test]
    fn the_hmc_buffer_cpu_figure_sets_tag_bw_beside_where_perftest_ran() {
        let run = run_of(
            "\
## HMC_BUFFER echo vs TCP_STREAM and ucx_perftest tag_bw (bytes moved = request + response; UCX_TLS=tcp)

| data plane | payload | clients | in flight | bytes moved MB/s | TCP_STREAM MB/s | tag_bw MB/s median (range) | CPU-s/GiB | TCP_STREAM CPU-s/GiB | tag_bw CPU-s/GiB |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
| Tcp | 1 MiB | 1 | 1 | 2344.7 | 5021.4 | - | 0.454 | 0.303 | - |
| Ucx | 1 MiB | 1 | 1 | 1605.5 | 5021.4 | 4470.0 (2554–6259) | 0.851 | 0.303 | 0.547 |
",
        );
        for bench in ["rpc", "shm"] {
            let plots = all_plots(bench, &run);
            let p = plots.iter().find(|p| p.id == "hmc-buffer-cpu").unwrap();
            assert_eq!(p.series[0].points, [(0.0, 0.454), (1.0, 0.851)]);
            assert_eq!(p.series[1].points, [(0.0, 0.303), (1.0, 0.303)]);
            // perftest runs beside the UCX rows only.
            assert_eq!(p.series[2].points, [(1.0, 0.547)]);
            assert!(p.title.ends_with("(UCX_TLS=tcp)"), "{}", p.title);
        }
    }

    #[test]
    fn the_engine_sweep_has_its_own_figures_and_the_rpc_ones_do_not_take_it() {
        let text = SWEEP
            .replace("## connection sweep", "## engine connection sweep")
            .replace("| RPC/s |", "| WRITE ops/s |");
        let run = run_of(&text);
        let ids: Vec<String> = plots_for("engine", &run, &run.tables[0])
            .into_iter()
            .map(|p| p.id)
            .collect();
        assert_eq!(ids, ["engine-sweep-ops", "engine-sweep-memory"]);
        assert!(plots_for("rpc", &run, &run.tables[0]).is_empty());
    }

    #[test]
    fn a_peer_figure_from_a_note_becomes_a_level() {
        let run = run_of(
            "iperf3 loopback, one stream, best of two runs: 3.01 GB/s\n\
             | size | WRITE GB/s | READ GB/s |\n| ---: | ---: | ---: |\n| 1 MiB | 2.5 | 2.4 |\n",
        );
        let plots = plots_for("transfer", &run, &run.tables[0]);
        assert_eq!(plots[0].references[0].marks, [(-0.5, 0.5, 3.01)]);
        assert_eq!(plots[0].references[0].name, "iperf3, one stream");
    }

    fn fixture(bench: &str) -> Run {
        let text = FIXTURES
            .iter()
            .find(|(b, _)| *b == bench)
            .expect("a fixture")
            .1;
        run_of(text)
    }

    fn all_plots(bench: &str, run: &Run) -> Vec<Plot> {
        let plots = run.tables.iter().flat_map(|t| plots_for(bench, run, t));
        plots.collect()
    }

    #[rstest]
    #[case::transfer("transfer", &["tcp-vs-iperf3", "tcp-cpu"])]
    #[case::ucx(
        "ucx",
        &[
            "ucx-tcp-ucxmem",
            "ucx-shm-ucxmem",
            "ucx-tcp-user",
            "ucx-shm-user",
            "ucx-tcp-ucxmem-cpu",
            "ucx-shm-ucxmem-cpu"
        ]
    )]
    #[case::shm("shm", &["shm-vs-memcpy", "shm-cpu"])]
    #[case::rdma("rdma", &["rdma-cpu", "rdma-standin-bw"])]
    #[case::plugin("plugin", &["plugin-vs-static"])]
    #[case::python(
        "python",
        &[
            "python-vs-mooncake",
            "python-cpu",
            "cpu-vs-floor",
            "python-default-vs-mooncake",
            "python-default-cpu",
            "python-overhead"
        ]
    )]
    #[case::engine(
        "engine",
        &["engine-vs-mooncake", "engine-cpu", "cpu-vs-floor", "engine-facade"]
    )]
    fn each_bench_gives_its_figures_with_every_series_and_target_in_the_legend(
        #[case] bench: &str,
        #[case] ids: &[&str],
    ) {
        let run = fixture(bench);
        let plots = all_plots(bench, &run);
        let got: Vec<&str> = plots.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(got, ids);
        for p in &plots {
            for s in &p.series {
                assert!(!s.points.is_empty(), "{}: no values for {}", p.id, s.name);
            }
            for r in &p.references {
                assert!(!r.marks.is_empty(), "{}: no marks for {}", p.id, r.name);
            }
            let (texts, _) = parse_svg(&render_svg(p, "when and how loaded").unwrap());
            let names = p.series.iter().map(|s| &s.name);
            for want in names
                .chain(p.references.iter().map(|r| &r.name))
                .chain([&p.title])
            {
                assert!(texts.contains(want), "{}: no {want:?} in {texts:?}", p.id);
            }
        }
    }

    #[test]
    fn the_transfer_figure_has_iperf3_as_a_grey_level_and_the_target_at_70_percent_of_it() {
        let run = fixture("transfer");
        let p = &all_plots("transfer", &run)[0];
        let iperf3 = run.notes[0].rsplit_once(':').unwrap().1;
        let iperf3 = super::super::cell_value(iperf3).unwrap();
        let (peer, target) = (&p.references[0], &p.references[1]);
        assert!(peer.level && peer.peer && !target.peer);
        assert_eq!(peer.marks[0].2, iperf3);
        assert!((target.marks[0].2 - 0.7 * iperf3).abs() < 1e-9);
        let svg = render_svg(p, "").unwrap();
        let doc = roxmltree::Document::parse(&svg).unwrap();
        let stroked = |c: RGBColor| {
            doc.descendants()
                .any(|n| n.attribute("stroke") == Some(&hex(c)))
        };
        assert!(stroked(PEER_LEVEL) && stroked(TARGET));
    }

    /// The groups (category names) a reference has marks over.
    fn marked(p: &Plot, reference: usize) -> Vec<String> {
        let XAxis::Categories(names) = &p.x else {
            panic!("{} has no categories", p.id)
        };
        let r = &p.references[reference];
        r.marks
            .iter()
            .map(|m| names[((m.0 + m.1) / 2.0).round() as usize].clone())
            .collect()
    }

    #[test]
    fn size_bound_targets_mark_only_the_groups_of_their_sizes() {
        let run = fixture("shm");
        let p = &all_plots("shm", &run)[0];
        // 300k ops/s at 4 KiB, as GB/s; 80% of memcpy at 64 KiB and 1 MiB.
        assert_eq!(marked(p, 0), ["Write x 4 KiB", "Read x 4 KiB"]);
        assert!((p.references[0].marks[0].2 - 1.2288).abs() < 1e-9);
        assert_eq!(
            marked(p, 1),
            [
                "Write x 64 KiB",
                "Write x 1 MiB",
                "Read x 64 KiB",
                "Read x 1 MiB"
            ]
        );
        let memcpy = &p.series[2].points;
        assert_eq!(p.references[1].marks[0].2, 0.8 * memcpy[1].1);

        // The Python bench prints sizes in bytes: the groups say KiB and MiB.
        let run = fixture("python");
        let p = &all_plots("python", &run)[0];
        assert_eq!(
            marked(p, 0),
            [
                "write x 4 KiB",
                "write x 64 KiB",
                "read x 4 KiB",
                "read x 64 KiB"
            ]
        );
        assert_eq!(marked(p, 1), ["write x 1 MiB", "read x 1 MiB"]);
        let mooncake = &p.series[1].points;
        assert_eq!(p.references[0].marks[0].2, 3.0 * mooncake[0].1);
        // Python's allowance is 3 µs over the same call from Rust, per group.
        let plots = all_plots("python", &run);
        let p = plots.iter().find(|p| p.id == "python-overhead").unwrap();
        let rust = &p.series[1].points;
        assert_eq!(p.references[0].marks[1].2, rust[1].1 + 3.0);
    }

    #[test]
    fn the_ucx_figures_take_one_row_kind_each_and_only_like_for_like_has_the_target() {
        let run = fixture("ucx");
        let plots = all_plots("ucx", &run);
        for p in &plots {
            let XAxis::Categories(names) = &p.x else {
                panic!("{} has no categories", p.id)
            };
            assert_eq!(names.len(), 6, "{}: {names:?}", p.id);
            assert_eq!(names[0], "put x 64 KiB");
            assert_eq!(
                p.references.is_empty(),
                !p.id.ends_with("-ucxmem"),
                "{}",
                p.id
            );
        }
        // The first figure is the tcp-ucxmem rows: put 64 KiB is the table's 7th row.
        assert_eq!(
            plots[0].series[0].points[0],
            (0.0, run.tables[0].values[6][3].unwrap())
        );
    }

    #[test]
    fn a_figure_widens_when_its_group_names_would_not_fit() {
        let mut p = all_plots("transfer", &fixture("transfer")).remove(0);
        assert_eq!(size_of(&p), SIZE);
        p.x = XAxis::Categories(
            (0..12)
                .map(|i| format!("tcp-ucxmem x put x {i} KiB"))
                .collect(),
        );
        let (w, h) = size_of(&p);
        assert!(w > SIZE.0 && w <= 1600 && h == SIZE.1, "{w}");
        let svg = render_svg(&p, "").unwrap();
        assert!(svg.contains(&format!("width=\"{w}\"")), "{}", &svg[..200]);
    }

    #[rstest]
    #[case::shm("shm")]
    #[case::python("python")]
    #[case::transfer("transfer")]
    fn no_bar_reaches_into_the_legend(#[case] bench: &str) {
        let run = fixture(bench);
        for p in all_plots(bench, &run) {
            let svg = render_svg(&p, "").unwrap();
            let doc = roxmltree::Document::parse(&svg).unwrap();
            let num =
                |n: &roxmltree::Node, a: &str| -> i64 { n.attribute(a).unwrap().parse().unwrap() };
            let legend = doc
                .descendants()
                .find(|n| n.has_tag_name("rect") && n.attribute("stroke") == Some("#A0A0A0"))
                .expect("a legend box");
            let (left, right) = (num(&legend, "x"), num(&legend, "x") + num(&legend, "width"));
            let bottom = num(&legend, "y") + num(&legend, "height");
            let bars = doc.descendants().filter(|n| {
                n.has_tag_name("rect")
                    && COLOURS
                        .iter()
                        .any(|c| n.attribute("fill") == Some(&hex(*c)))
                    && num(n, "height") > 12 // not a legend swatch
            });
            for bar in bars {
                let (x0, x1) = (num(&bar, "x"), num(&bar, "x") + num(&bar, "width"));
                if x1 > left && x0 < right {
                    assert!(num(&bar, "y") > bottom, "{}: a bar under the legend", p.id);
                }
            }
        }
    }

    #[test]
    fn the_shm_bench_plots_its_shared_memory_hmc_buffer_rows_against_3x_tcp_stream() {
        // `hmc-rpc-bench --data-planes shm,tcp` as `cargo xtask bench shm` runs it.
        let run = run_of(include_str!("fixtures/shm-hmc-buffer.md"));
        let plots = all_plots("shm", &run);
        let p = &plots[0];
        assert_eq!(plots.len(), 1);
        assert_eq!(p.id, "hmc-buffer-shm");
        let groups = ["1 x 1", "1 x 8", "8 x 1", "8 x 8"].map(String::from);
        assert_eq!(p.x, XAxis::Categories(groups.to_vec()));
        assert_eq!(p.series[0].points[0], (0.0, 4491.3));
        let tcp_stream = p.series[1].points[0].1;
        assert_eq!(p.references[0].marks[0], (-0.4, 0.4, 3.0 * tcp_stream));
        // The RPC bench's figure of this table has every data plane, and no tag_bw here.
        let rpc = &all_plots("rpc", &run)[0];
        assert_eq!(rpc.id, "hmc-buffer");
        assert!(rpc.series[2].points.is_empty() && rpc.references[0].marks.is_empty());
        // An absent peer takes no room: the figure is the one drawn without it.
        let mut without = rpc.clone();
        without.series.remove(2);
        assert_eq!(
            render_svg(rpc, "").unwrap(),
            render_svg(&without, "").unwrap()
        );
    }

    #[test]
    fn the_engine_facade_allows_2_us_at_4_kib_and_5_percent_from_64_kib() {
        let run = fixture("engine");
        let plots = all_plots("engine", &run);
        let p = plots.iter().find(|p| p.id == "engine-facade").unwrap();
        assert_eq!(marked(p, 0), ["64 KiB", "1 MiB", "16 MiB"]);
        assert_eq!(marked(p, 1), ["4 KiB"]);
        let bare = &p.series[1].points;
        assert!((p.references[0].marks[0].2 - 1.05 * bare[1].1).abs() < 1e-9);
        assert!((p.references[1].marks[0].2 - (bare[0].1 + 2.0)).abs() < 1e-9);
    }

    #[test]
    fn the_plugin_figure_puts_the_5_percent_allowance_over_static() {
        let run = fixture("plugin");
        let p = &all_plots("plugin", &run)[0];
        assert_eq!(p.series[0].name, "plugin");
        let stat = &p.series[1].points;
        assert_eq!(p.references[0].marks.len(), stat.len());
        for (m, s) in p.references[0].marks.iter().zip(stat) {
            assert!((m.2 - 1.05 * s.1).abs() < 1e-9);
        }
    }

    #[rstest]
    #[case("65536", "64 KiB")]
    #[case("1048576", "1 MiB")]
    #[case("4096", "4 KiB")]
    #[case("1000", "1000")]
    #[case("64 B", "64 B")]
    #[case("Write", "Write")]
    #[case("1024 KiB", "1 MiB")]
    #[case("16384 KiB", "16 MiB")]
    #[case("64 KiB", "64 KiB")]
    #[case("1 x 1048576 B", "1 x 1048576 B")]
    fn sizes_in_bytes_read_as_kib_or_mib(#[case] cell: &str, #[case] label: &str) {
        assert_eq!(size_label(cell), label);
    }

    #[test]
    fn tables_without_a_figure_or_without_its_columns_give_none() {
        let run = run_of("## something else\n\n| a | b |\n| - | - |\n| 1 | 2 |\n");
        assert!(plots_for("rpc", &run, &run.tables[0]).is_empty());
        assert!(plots_for("transfer", &run, &run.tables[0]).is_empty());
    }

    #[test]
    fn axis_numbers_are_compact() {
        assert_eq!(compact(1_234_567.0), "1.235M");
        assert_eq!(compact(2_000_000.0), "2M");
        assert_eq!(compact(45_000.0), "45k");
        assert_eq!(compact(950.0), "950");
        assert_eq!(compact(0.5), "0.5");
        assert_eq!(compact(0.0), "0");
    }
}
