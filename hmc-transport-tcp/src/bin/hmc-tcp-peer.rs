//! `hmc-tcp-peer`: two processes, one control plane, one-sided WRITE and READ of a buffer over TCP, with checksums printed on both sides.
//!
//! ```text
//! hmc-tcp-peer serve  --listen tcp://127.0.0.1:7000 --len 16777216 [--exit-after 1] [--rank 1] [--data tcp://127.0.0.1:0]
//! hmc-tcp-peer client --connect tcp://127.0.0.1:7000 --len 16777216 [--rank 1] [--data tcp://127.0.0.1:0]
//! ```
//!
//! The server (rank 0) registers a buffer and, for each client session, sends its data
//! address and the buffer's `RemoteRegion` over the control plane. The client WRITEs a
//! pattern into it one-sided and sends the CRC32C it computed; the server checks the
//! bytes it holds against it, inverts them, and sends the new CRC; the client READs them
//! back one-sided and checks that they are the inverse of what it wrote. Both sides print
//! `checksum=0x…`; the last such line of each side is the same value when all went well.
//! `--rank` is the client's rank (default 1; the server waits for that rank).
//! `--exit-after 0` serves until killed. Addresses may also be `unix:///path`.
//!
//! Limits and trust (both roles):
//!
//! - `--auth-secret-file PATH`: authenticate every control-plane and data-plane
//!   connection with the pre-shared secret in PATH (at least 16 bytes; a trailing newline
//!   is ignored). A file rather than an argument, so the secret does not show in `ps`.
//!   Off by default; both sides need the same secret.
//! - `--max-queued-bytes N`, `--max-queued-bytes-per-peer N`, `--departed-retention-ms N`:
//!   the control plane's receive budgets (`ControlPlaneConfig` fields of the same names).
//! - `--idle-timeout-ms N`, `--request-timeout-ms N`, `--max-pending-notifications N`,
//!   `--max-pending-notification-bytes N`: the data plane's (`TcpConfig`).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_backend_cpu::HostMemory;
use hmc_core::{
    Access, Communicator, ConnBuffer, Deadline, Error, MemSpan, MemSpanMut, Op, PeerAddr,
    RegisteredBuffer, RemoteRegion, Result, TransferDesc,
};
use hmc_transport_tcp::{
    AuthSecret, ControlMessage, ControlPlane, ControlPlaneConfig, Rank, TcpCommunicator, TcpConfig,
};

const SERVER_RANK: Rank = 0;
const STEP: Duration = Duration::from_secs(60);

/// A checksum report between the two sides: which step and the CRC32C of the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Checksum {
    step: u8,
    crc: u32,
}

const STEP_WRITTEN: u8 = 1;
const STEP_INVERTED: u8 = 2;
const STEP_READ: u8 = 3;
const STEP_DONE: u8 = 4;

impl ControlMessage for Checksum {
    const KIND: u16 = 256;
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.step);
        out.extend_from_slice(&self.crc.to_be_bytes());
    }
    fn decode(bytes: &[u8]) -> Result<Self> {
        match bytes {
            [step, a, b, c, d] => Ok(Checksum {
                step: *step,
                crc: u32::from_be_bytes([*a, *b, *c, *d]),
            }),
            _ => Err(Error::Protocol(format!(
                "a checksum message is 5 bytes, got {}",
                bytes.len()
            ))),
        }
    }
}

struct Args {
    role: String,
    addr: PeerAddr,
    data: PeerAddr,
    len: usize,
    exit_after: u64,
    rank: Rank,
    control: ControlPlaneConfig,
    tcp: TcpConfig,
}

const USAGE: &str = "usage: hmc-tcp-peer serve --listen ADDR --len BYTES [--exit-after N] [--rank N] [--data ADDR] [LIMITS]\n       \
                     hmc-tcp-peer client --connect ADDR --len BYTES [--rank N] [--data ADDR] [LIMITS]\n\
                     ADDR is tcp://IP:PORT or unix:///path\n\
                     LIMITS: [--auth-secret-file PATH] [--max-queued-bytes N] [--max-queued-bytes-per-peer N]\n        \
                     [--departed-retention-ms N] [--idle-timeout-ms N] [--request-timeout-ms N]\n        \
                     [--max-pending-notifications N] [--max-pending-notification-bytes N]";

fn parse_args() -> std::result::Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let role = it.next().ok_or(USAGE)?;
    if role != "serve" && role != "client" {
        return Err(format!("unknown role `{role}`\n{USAGE}"));
    }
    let mut args = Args {
        role,
        addr: PeerAddr::Tcp(([127, 0, 0, 1], 0).into()),
        data: PeerAddr::Tcp(([127, 0, 0, 1], 0).into()),
        len: 16 << 20,
        exit_after: 1,
        rank: 1,
        control: ControlPlaneConfig::default(),
        tcp: TcpConfig::default(),
    };
    let ms = |v: u64| Duration::from_millis(v);
    let mut have_addr = false;
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value\n{USAGE}"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--listen" | "--connect" => {
                args.addr = value.parse().map_err(|e| bad(&e))?;
                have_addr = true;
            }
            "--data" => args.data = value.parse().map_err(|e| bad(&e))?,
            "--len" => args.len = value.parse().map_err(|e| bad(&e))?,
            "--exit-after" => args.exit_after = value.parse().map_err(|e| bad(&e))?,
            "--rank" => args.rank = value.parse().map_err(|e| bad(&e))?,
            "--auth-secret-file" => {
                let secret = AuthSecret::from_file(value.as_ref()).map_err(|e| bad(&e))?;
                args.control.auth_secret = Some(secret.clone());
                args.tcp.auth_secret = Some(secret);
            }
            "--max-queued-bytes" => {
                args.control.max_queued_bytes = value.parse().map_err(|e| bad(&e))?;
            }
            "--max-queued-bytes-per-peer" => {
                args.control.max_queued_bytes_per_peer = value.parse().map_err(|e| bad(&e))?;
            }
            "--departed-retention-ms" => {
                args.control.departed_retention = ms(value.parse().map_err(|e| bad(&e))?);
            }
            "--idle-timeout-ms" => {
                args.tcp.idle_timeout = ms(value.parse().map_err(|e| bad(&e))?)
            }
            "--request-timeout-ms" => {
                args.tcp.request_timeout = ms(value.parse().map_err(|e| bad(&e))?);
            }
            "--max-pending-notifications" => {
                args.tcp.max_pending_notifications = value.parse().map_err(|e| bad(&e))?;
            }
            "--max-pending-notification-bytes" => {
                args.tcp.max_pending_notification_bytes = value.parse().map_err(|e| bad(&e))?;
            }
            _ => return Err(format!("unknown option {flag}\n{USAGE}")),
        }
    }
    if !have_addr {
        return Err(format!("--listen or --connect is required\n{USAGE}"));
    }
    if args.len == 0 {
        return Err("--len must be at least 1".into());
    }
    Ok(args)
}

fn deadline() -> Deadline {
    Deadline::after(STEP)
}

type Buffer = RegisteredBuffer<HostMemory, TcpCommunicator>;

fn contents(buf: &Buffer) -> Result<Vec<u8>> {
    let mut out = vec![0u8; buf.len()];
    buf.read_at(0, &mut MemSpanMut::host(&mut out))?;
    Ok(out)
}

fn gbps(len: usize, t: Duration) -> f64 {
    len as f64 / t.as_secs_f64() / 1e9
}

async fn serve(args: &Args) -> Result<()> {
    let control = ControlPlane::bind(
        SERVER_RANK,
        std::slice::from_ref(&args.addr),
        args.control.clone(),
    )
    .await?;
    control.register_kind::<Checksum>();
    let comm = Arc::new(TcpCommunicator::bind(&args.data, args.tcp.clone())?);
    let buf = RegisteredBuffer::new(
        Arc::new(HostMemory::new()),
        comm.clone(),
        args.len,
        Access::READ_WRITE,
    )?;
    println!(
        "serving {} bytes: control plane at {}, data plane at {}",
        args.len,
        control.local_addrs()[0],
        comm.address()
    );
    let mut session = 0u64;
    while args.exit_after == 0 || session < args.exit_after {
        session += 1;
        let client = args.rank;
        control
            .wait_for_peer(client, Deadline::after(Duration::from_secs(86_400)))
            .await?;
        match serve_session(&control, &comm, &buf, client, session).await {
            Ok(()) => {}
            // Serving until killed: one client's failure does not end the others' service.
            Err(e) if args.exit_after == 0 => {
                eprintln!("hmc-tcp-peer serve: session {session} ended early: {e}");
                let _ = control.disconnect(client);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One client session: offer the buffer, check the WRITE, invert, check the READ.
async fn serve_session(
    control: &ControlPlane,
    comm: &TcpCommunicator,
    buf: &Buffer,
    client: Rank,
    session: u64,
) -> Result<()> {
    println!("session {session}: rank {client} connected");
    control.send(client, &comm.address(), deadline()).await?;
    control
        .send(client, &buf.export().unwrap(), deadline())
        .await?;

    let written: Checksum = control
        .recv(client, Deadline::after(Duration::from_secs(600)))
        .await?;
    let mut bytes = contents(buf)?;
    let crc = crc32c::crc32c(&bytes);
    println!(
        "after the client's one-sided WRITE: {} bytes checksum={crc:#010x} ({})",
        bytes.len(),
        if crc == written.crc && written.step == STEP_WRITTEN {
            "matches the client's"
        } else {
            "DIFFERS from the client's"
        }
    );
    if crc != written.crc {
        return Err(Error::Protocol(format!(
            "the WRITE landed wrong: the client sent {:#010x}, the buffer holds {crc:#010x}",
            written.crc
        )));
    }
    bytes.iter_mut().for_each(|b| *b = !*b);
    buf.write_at(0, &MemSpan::host(&bytes))?;
    let inverted = crc32c::crc32c(&bytes);
    println!("inverted the buffer for the client's one-sided READ: checksum={inverted:#010x}");
    control
        .send(
            client,
            &Checksum {
                step: STEP_INVERTED,
                crc: inverted,
            },
            deadline(),
        )
        .await?;
    let read: Checksum = control
        .recv(client, Deadline::after(Duration::from_secs(600)))
        .await?;
    if read.step != STEP_READ || read.crc != inverted {
        return Err(Error::Protocol(format!(
            "the client READ {:#010x}, the buffer holds {inverted:#010x}",
            read.crc
        )));
    }
    println!("session {session}: the client READ the same bytes: checksum={inverted:#010x}");
    control
        .send(
            client,
            &Checksum {
                step: STEP_DONE,
                crc: inverted,
            },
            deadline(),
        )
        .await?;
    // The client hangs up once it has the acknowledgement; wait for that, so the next
    // session's rank is free.
    let _ = control.recv::<Checksum>(client, deadline()).await;
    Ok(())
}

async fn client(args: &Args) -> Result<()> {
    let control = ControlPlane::bind(args.rank, &[], args.control.clone()).await?;
    control.register_kind::<Checksum>();
    control.connect(SERVER_RANK, &args.addr, deadline()).await?;
    let comm = Arc::new(TcpCommunicator::bind(&args.data, args.tcp.clone())?);
    let data_addr: PeerAddr = control.recv(SERVER_RANK, deadline()).await?;
    let region: RemoteRegion = control.recv(SERVER_RANK, deadline()).await?;
    if region.region.len < args.len {
        return Err(Error::InvalidArgument(format!(
            "the server's buffer is {} bytes, smaller than --len {}",
            region.region.len, args.len
        )));
    }
    let ep = comm.connect(&data_addr, deadline()).await?;
    let key = comm.import(&ep, &region)?;
    let memory = Arc::new(HostMemory::new());
    let src = RegisteredBuffer::new(memory.clone(), comm.clone(), args.len, Access::READ)?;
    let pattern: Vec<u8> = (0..args.len)
        .map(|i| (i as u64).wrapping_mul(0x9E37_79B9) as u8 ^ (i >> 13) as u8)
        .collect();
    src.write_at(0, &MemSpan::host(&pattern))?;
    let crc = crc32c::crc32c(&pattern);
    let whole = |local| TransferDesc::<TcpCommunicator> {
        local,
        local_offset: 0,
        remote: &key,
        remote_offset: 0,
        len: args.len,
    };
    let start = Instant::now();
    comm.transfer(&ep, Op::Write, &[whole(src.registration())], deadline())
        .await?;
    let took = start.elapsed();
    println!(
        "one-sided WRITE of {} bytes in {:.1} ms ({:.2} GB/s): checksum={crc:#010x}",
        args.len,
        took.as_secs_f64() * 1e3,
        gbps(args.len, took)
    );
    control
        .send(
            SERVER_RANK,
            &Checksum {
                step: STEP_WRITTEN,
                crc,
            },
            deadline(),
        )
        .await?;
    let inverted: Checksum = control.recv(SERVER_RANK, deadline()).await?;
    let dst = RegisteredBuffer::new(memory, comm.clone(), args.len, Access::WRITE)?;
    let start = Instant::now();
    comm.transfer(&ep, Op::Read, &[whole(dst.registration())], deadline())
        .await?;
    let took = start.elapsed();
    let got = contents(&dst)?;
    let got_crc = crc32c::crc32c(&got);
    let is_inverse = got.iter().zip(&pattern).all(|(g, p)| *g == !*p);
    println!(
        "one-sided READ of {} bytes in {:.1} ms ({:.2} GB/s): checksum={got_crc:#010x} ({})",
        args.len,
        took.as_secs_f64() * 1e3,
        gbps(args.len, took),
        if is_inverse && got_crc == inverted.crc {
            "the inverse of what was written, as the server said"
        } else {
            "WRONG"
        }
    );
    control
        .send(
            SERVER_RANK,
            &Checksum {
                step: STEP_READ,
                crc: got_crc,
            },
            deadline(),
        )
        .await?;
    if !is_inverse || got_crc != inverted.crc {
        return Err(Error::Protocol(format!(
            "READ returned {got_crc:#010x}, the server holds {:#010x}",
            inverted.crc
        )));
    }
    // The server's acknowledgement proves it got the last report before we hang up.
    let done: Checksum = control.recv(SERVER_RANK, deadline()).await?;
    if done.step != STEP_DONE {
        return Err(Error::Protocol(format!(
            "expected the server's acknowledgement, got step {}",
            done.step
        )));
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("hmc-tcp-peer: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("hmc-tcp-peer: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        if args.role == "serve" {
            serve(&args).await
        } else {
            client(&args).await
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hmc-tcp-peer {}: {e}", args.role);
            ExitCode::FAILURE
        }
    }
}
