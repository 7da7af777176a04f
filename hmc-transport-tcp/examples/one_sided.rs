//! One-sided WRITE and READ between two processes over the TCP transport, the target's region handed to the initiator as a `RegionTicket` on the command line.
//!
//! ```text
//! cargo run -p hmc-transport-tcp --example one_sided                  # both roles: starts the target itself
//! cargo run -p hmc-transport-tcp --example one_sided -- target        # prints `ticket hmc-region:...`, waits
//! cargo run -p hmc-transport-tcp --example one_sided -- initiator 'hmc-region:...'
//! ```
//!
//! The target registers a buffer and prints a ticket for it. The initiator READs the
//! buffer and checks it, WRITEs new bytes over it, and notifies the target, which checks
//! what arrived and exits. Add `--mib N` to either role for the buffer size (default 8).

use std::io::{BufRead, BufReader};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use hmc_backend_cpu::HostMemory;
use hmc_core::{
    Access, Communicator, ConnBuffer, Deadline, MemSpan, MemSpanMut, Op, RegionTicket,
    RegisteredBuffer, TransferDesc,
};
use hmc_transport_tcp::{TcpCommunicator, TcpConfig};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The tag of the initiator's "done".
const DONE: u64 = 1;

fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn communicator() -> Result<Arc<TcpCommunicator>> {
    let addr = "tcp://127.0.0.1:0".parse()?;
    Ok(Arc::new(TcpCommunicator::bind(
        &addr,
        TcpConfig::default(),
    )?))
}

fn soon() -> Deadline {
    Deadline::after(Duration::from_secs(30))
}

async fn target(len: usize) -> Result<()> {
    let comm = communicator()?;
    let host = Arc::new(HostMemory::new());
    let buf = RegisteredBuffer::new(host, comm.clone(), len, Access::READ | Access::WRITE)?;
    buf.write_at(0, &MemSpan::host(&bytes(1, len)))?;
    // Everything a peer needs, as one line of text.
    let ticket = RegionTicket::new(comm.address(), buf.export()?);
    println!("ticket {ticket}");

    let done = comm
        .recv_notification(Deadline::after(Duration::from_secs(60)))
        .await?;
    let mut now = vec![0u8; len];
    buf.read_at(0, &mut MemSpanMut::host(&mut now))?;
    if now != bytes(2, len) {
        return Err("the initiator's WRITE did not arrive intact".into());
    }
    println!(
        "[target] {} said {:?}; all {len} bytes it wrote arrived intact",
        done.from,
        String::from_utf8_lossy(&done.msg)
    );
    Ok(())
}

async fn initiator(ticket: &str, len: usize) -> Result<()> {
    let ticket: RegionTicket = ticket.parse()?;
    if ticket.region.region.len != len {
        return Err(format!(
            "the ticket's region is {} bytes, not {len}: pass the same --mib to both roles",
            ticket.region.region.len
        )
        .into());
    }
    let comm = communicator()?;
    let ep = comm.connect(&ticket.peer, soon()).await?;
    let remote = comm.import(&ep, &ticket.region)?;
    let host = Arc::new(HostMemory::new());
    let local = RegisteredBuffer::new(host, comm.clone(), len, Access::READ)?;

    let whole = [TransferDesc::new(local.registration(), 0, &remote, 0, len)];
    comm.transfer(&ep, Op::Read, &whole, soon()).await?;
    let mut got = vec![0u8; len];
    local.read_at(0, &mut MemSpanMut::host(&mut got))?;
    if got != bytes(1, len) {
        return Err("READ returned other bytes than the target holds".into());
    }
    println!("[initiator] READ {len} bytes, checked");

    local.write_at(0, &MemSpan::host(&bytes(2, len)))?;
    comm.transfer(&ep, Op::Write, &whole, soon()).await?;
    // A notification is accepted from a peer that holds a live key of the target's.
    comm.notify(&ep, DONE, b"written", soon()).await?;
    println!("[initiator] WROTE {len} bytes and notified the target");
    Ok(())
}

/// Starts this program again as the target and runs the initiator against it.
async fn both(len: usize, mib: &str) -> Result<()> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(["target", "--mib", mib])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let ticket = loop {
        match lines.next() {
            Some(line) => {
                if let Some(t) = line?.strip_prefix("ticket ") {
                    break t.to_string();
                }
            }
            None => return Err("the target exited before printing its ticket".into()),
        }
    };
    let forward =
        std::thread::spawn(move || lines.map_while(|l| l.ok()).for_each(|l| println!("{l}")));
    initiator(&ticket, len).await?;
    let status = child.wait()?;
    forward.join().expect("forwarding thread");
    if !status.success() {
        return Err(format!("the target failed: {status}").into());
    }
    println!("every byte checked on both sides");
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mib = args
        .iter()
        .position(|a| a == "--mib")
        .and_then(|i| args.get(i + 1))
        .map_or("8", String::as_str);
    let Some(len) = mib
        .parse::<usize>()
        .ok()
        .filter(|m| *m > 0)
        .map(|m| m << 20)
    else {
        eprintln!("--mib takes a whole number of MiB, at least 1");
        return ExitCode::from(2);
    };
    let r = match args.first().map(String::as_str) {
        Some("target") => target(len).await,
        Some("initiator") => match args.get(1) {
            Some(ticket) => initiator(ticket, len).await,
            None => Err("initiator needs the target's ticket".into()),
        },
        _ => both(len, mib).await,
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("one_sided: {e}");
            ExitCode::FAILURE
        }
    }
}
