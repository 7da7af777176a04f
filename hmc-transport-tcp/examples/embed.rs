//! The README's "Embedding" program: a region handed over as ticket text and written one-sided.
use std::sync::Arc;

use hmc_backend_cpu::HostMemory;
use hmc_core::{Access, Communicator, ConnBuffer, Deadline, MemSpan, MemSpanMut, Op};
use hmc_core::{RegionTicket, RegisteredBuffer, TransferDesc};
use hmc_transport_tcp::{TcpCommunicator, TcpConfig};

#[tokio::main]
async fn main() -> Result<(), hmc_core::Error> {
    let (host, len) = (Arc::new(HostMemory::new()), 1 << 20);
    let bind = || TcpCommunicator::bind(&"tcp://127.0.0.1:0".parse()?, TcpConfig::default());
    let (owner, user) = (Arc::new(bind()?), Arc::new(bind()?));
    // The owner registers memory and hands out a ticket: one line of text.
    let target = RegisteredBuffer::new(host.clone(), owner.clone(), len, Access::WRITE)?;
    let text = RegionTicket::new(owner.address(), target.export()?).to_string();
    // Given only that text (a command line, a metadata store), a peer writes into it.
    let ticket: RegionTicket = text.parse()?;
    let ep = user.connect(&ticket.peer, Deadline::default()).await?;
    let remote = user.import(&ep, &ticket.region)?;
    let src = RegisteredBuffer::new(host, user.clone(), len, Access::READ)?;
    src.write_at(0, &MemSpan::host(&vec![7u8; len]))?;
    let batch = [TransferDesc::new(src.registration(), 0, &remote, 0, len)];
    user.transfer(&ep, Op::Write, &batch, Deadline::default())
        .await?;
    let mut seen = vec![0u8; len];
    target.read_at(0, &mut MemSpanMut::host(&mut seen))?;
    assert!(seen.iter().all(|b| *b == 7));
    println!("wrote {len} bytes through {text}");
    Ok(())
}
