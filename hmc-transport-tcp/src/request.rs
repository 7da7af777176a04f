//! The initiator's request: a batch checked before anything moves, then sent and answered
//! on one connection checked out of the endpoint's pool (the wire format is in
//! [`crate::wire`]).
//!
//! The request path is generic over the communicator type of its descriptors only to name
//! the registration and key types ([`TcpRegistration`], [`TcpRemoteKey`]) rather than the
//! communicator that owns it; `TcpCommunicator` is its one instance.

use std::time::{Duration, Instant};

use hmc_core::{
    Communicator, Deadline, Error, Memory, Op, PeerAddr, RemoteFacts, Result, TransferDesc,
    TransportId, check_desc,
};
use tokio::io::AsyncWriteExt;

use crate::endpoint::{EndpointInner, Unfinished};
use crate::net::Stream;
use crate::registration::{TcpRegistration, TcpRemoteKey};
use crate::state::Shared;
use crate::wire::{self, WireDesc};

/// The communicators whose descriptors the request path takes: `TcpCommunicator`'s.
pub(crate) trait TcpKeys:
    Communicator<Registration = TcpRegistration, RemoteKey = TcpRemoteKey>
{
}

impl<C: Communicator<Registration = TcpRegistration, RemoteKey = TcpRemoteKey> + ?Sized> TcpKeys
    for C
{
}

/// Checks a whole batch before anything moves, and turns it into wire descriptors.
pub(crate) fn check_batch<C: TcpKeys + ?Sized>(
    ep: &EndpointInner,
    op: Op,
    batch: &[TransferDesc<'_, C>],
) -> Result<Vec<WireDesc>> {
    batch
        .iter()
        .map(|d| {
            if let Some(memory) = &d.local.entry.memory {
                return Err(Error::UnsupportedMemory {
                    transport: TransportId::TCP,
                    device: memory.device(),
                    reason: "device memory registered with register_memory is served to \
                             peers; as the local side of this side's own transfer, stage it \
                             through registered host memory (hmc_core::Stager, as hmc-engine \
                             does)"
                        .into(),
                });
            }
            let remote = RemoteFacts {
                len: d.remote.len,
                access: d.remote.access,
                on_endpoint: d.remote.endpoint == ep.id,
            };
            check_desc(op, d, remote)?;
            Ok(WireDesc {
                id: d.remote.id,
                token: d.remote.token,
                offset: d.remote_offset,
                len: d.len as u64,
            })
        })
        .collect()
}

/// Runs a checked batch (`wire_descs` from [`check_batch`]) over one connection of `ep`,
/// `max_batch_descs` descriptors per request. `started`: the caller's clock read, for the
/// pool's idle check and the error's time. Ended early (an error, or the future dropped),
/// the connection does what [`Unfinished::of`] `op` says; the refusal of a request ends
/// the batch with the connection back in the pool. A future made here rather than an
/// `async fn`: the future keeps its arguments once, not also as locals of its body.
#[allow(clippy::manual_async_fn)]
pub(crate) fn transfer<C: TcpKeys + ?Sized>(
    shared: &Shared,
    ep: &EndpointInner,
    op: Op,
    (batch, wire_descs): (&[TransferDesc<'_, C>], &[WireDesc]),
    deadline: Deadline,
    started: Instant,
) -> impl Future<Output = Result<()>> {
    async move {
        let peer = &ep.peer; // formatted only into an error
        let mut lease = ep
            .checkout(shared, deadline, started, Unfinished::of(op))
            .await?;
        let stream = lease.stream();
        let per = shared.config.max_batch_descs.max(1);
        for (descs, wire_descs) in batch.chunks(per).zip(wire_descs.chunks(per)) {
            match run_request(
                stream,
                peer,
                op,
                descs,
                wire_descs,
                deadline.instant(),
                shared.config.busy_poll,
            )
            .await
            {
                // Mid-stream: the connection is out of step and is dropped.
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    return Err(Error::DeadlineExceeded {
                        during: "transfer",
                        elapsed: started.elapsed(),
                    });
                }
                Err(e) => return Err(broken(peer, e)),
                Ok(Err(refused)) => {
                    lease.checkin(true);
                    return Err(refused);
                }
                Ok(Ok(())) => {}
            }
        }
        lease.checkin(false);
        Ok(())
    }
}

/// The local bytes of descriptor `d`. The batch was bounds-checked and the registration is
/// borrowed by the batch for the whole transfer.
fn local_ptr<C: TcpKeys + ?Sized>(d: &TransferDesc<'_, C>) -> *mut u8 {
    (d.local.entry.region.addr as usize + d.local_offset) as *mut u8
}

/// Runs one request of a batch. The outer error means the connection is broken; the inner
/// one is a refusal the target reported with the connection still in step.
async fn run_request<C: TcpKeys + ?Sized>(
    stream: &mut Stream,
    peer: &PeerAddr,
    op: Op,
    descs: &[TransferDesc<'_, C>],
    wire_descs: &[WireDesc],
    until: Instant,
    poll: Duration,
) -> std::io::Result<Result<()>> {
    // Room for the padding too (a byte and up to 63), so no push reallocates.
    let mut header = Vec::with_capacity(5 + wire_descs.len() * WireDesc::LEN + 64);
    header.push(match op {
        Op::Write => wire::REQ_WRITE,
        Op::Read => wire::REQ_READ,
    });
    header.extend_from_slice(&(wire_descs.len() as u32).to_be_bytes());
    wire_descs.iter().for_each(|d| d.encode(&mut header));
    let total: usize = descs.iter().map(|d| d.len).sum();
    match op {
        Op::Write
            if total <= wire::COALESCE_LEN && descs.iter().filter(|d| d.len > 0).count() != 1 =>
        {
            // Small batches travel in one write: one segment, one wakeup at the target (one
            // descriptor's bytes leave with the header below, in one `sendmsg`, uncopied).
            header.push(0);
            for d in descs.iter().filter(|d| d.len > 0) {
                // SAFETY: `check_batch` proved [local_offset, local_offset+len) lies in the
                // registration, whose memory the caller keeps allocated while registered
                // (the `register` contract), and `descs` borrows the registration for the
                // whole transfer.
                header
                    .extend_from_slice(unsafe { std::slice::from_raw_parts(local_ptr(d), d.len) });
            }
            stream.write_all(&header).await?;
            stream.poll_readable(poll, 0).await;
            wire::read_status(stream, peer).await
        }
        Op::Write => {
            // `total` > 0 here, so there is a first descriptor with bytes.
            let first = descs
                .iter()
                .find(|d| d.len > 0)
                .map_or(0, |d| local_ptr(d) as usize);
            let pad = wire::align_pad(header.len() + 1, first);
            header.push(pad);
            header.resize(header.len() + pad as usize, 0);
            let bytes = |d: &TransferDesc<'_, C>| {
                // SAFETY: as above.
                unsafe { std::slice::from_raw_parts(local_ptr(d), d.len) }
            };
            // The header leaves with the first bytes, and a batch's descriptors leave
            // gathered (one `sendmsg` per piece, as for one contiguous transfer).
            let mut with_bytes = descs.iter().filter(|d| d.len > 0);
            match (with_bytes.next(), with_bytes.next()) {
                (Some(d), None) => stream.write_all_eager(&header, bytes(d), until).await?,
                _ => {
                    let bufs: Vec<&[u8]> = descs.iter().filter(|d| d.len > 0).map(bytes).collect();
                    stream.write_all_gather_eager(&header, &bufs, until).await?;
                }
            }
            stream.poll_readable(poll, 0).await;
            wire::read_status(stream, peer).await
        }
        Op::Read => {
            stream.write_all(&header).await?;
            // The whole answer of a small READ (status, padding, data) in one `recv`.
            let small = total <= wire::COALESCE_LEN;
            stream
                .poll_readable(poll, if small { 2 + 63 + total } else { 0 })
                .await;
            let status = wire::read_status(stream, peer).await?;
            if status.is_ok() {
                wire::skip_pad(stream).await?;
                // Scattered into the descriptors' bytes, up to `MAX_GATHER` per `recvmsg`.
                let pieces: Vec<crate::net::Piece> = descs
                    .iter()
                    .map(|d| (local_ptr(d) as usize, d.len))
                    .collect();
                // SAFETY: as for WRITE; peers and local code that touch the same bytes
                // concurrently accepted DMA semantics when registering.
                unsafe { stream.read_exact_scatter_eager(&pieces, until, poll) }.await?;
            }
            Ok(status)
        }
    }
}

pub(crate) fn broken(peer: &PeerAddr, e: std::io::Error) -> Error {
    if crate::net::is_disconnect(&e) {
        Error::peer(peer, format!("connection lost mid-transfer: {e}"))
    } else {
        Error::io(format!("transfer with {peer}"), e)
    }
}
