//! The control connection beside every RDMA endpoint (TCP or a Unix socket): the handshake that exchanges connection records, re-establishing one QP after an error or a cancel, key confirmation at import, and notifications.
//!
//! Frames are `kind u8, length u32 (big-endian), payload`, initiator → target unless said:
//!
//! | kind | payload | answer |
//! | --- | --- | --- |
//! | 1 HELLO | version `u8`, QP count `u8`, the initiator's address (`u16` length, text), one [`ConnRecord`] per QP | 2 HELLO_ACK: the target's records (its QPs already in RTS), or 3 REFUSED: a reason |
//! | 4 RESET_QP | QP index `u8`, the initiator's new record | 5 RESET_ACK: the target's new record, or REFUSED |
//! | 6 VALIDATE | registration id `u64`, the descriptor as exported | 7 VALID: verdict `u8` (0 live, 1 unknown or deregistered, 2 differs from the export) |
//! | 8 NOTIFY | tag `u64`, message | none |
//!
//! EOF on the connection ends the endpoint at both sides: the target destroys its QPs.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use hmc_core::{Error, PeerAddr, Result};

use crate::wire::ConnRecord;

pub(crate) const HELLO: u8 = 1;
pub(crate) const HELLO_ACK: u8 = 2;
pub(crate) const REFUSED: u8 = 3;
pub(crate) const RESET_QP: u8 = 4;
pub(crate) const RESET_ACK: u8 = 5;
pub(crate) const VALIDATE: u8 = 6;
pub(crate) const VALID: u8 = 7;
pub(crate) const NOTIFY: u8 = 8;
pub(crate) const VERSION: u8 = 1;
/// Largest control frame accepted: records, descriptors and notifications are far smaller.
pub(crate) const MAX_FRAME: usize = 1 << 20;

/// A control stream of either family.
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    pub fn connect(addr: &PeerAddr, timeout: Duration) -> std::io::Result<Stream> {
        match addr {
            PeerAddr::Tcp(sa) => {
                let s = TcpStream::connect_timeout(sa, timeout.max(Duration::from_millis(1)))?;
                s.set_nodelay(true)?;
                Ok(Stream::Tcp(s))
            }
            PeerAddr::Unix(p) => Ok(Stream::Unix(UnixStream::connect(p)?)),
            other => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "the RDMA transport's control plane dials tcp:// or unix:// addresses, not {other}"
                ),
            )),
        }
    }

    pub fn try_clone(&self) -> std::io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    pub fn set_timeouts(&self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
            Stream::Unix(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
        }
    }

    pub fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
        }
    }
}

pub(crate) use hmc_transport_kit::control_frame::write_frame;

/// Reads one control frame, refusing one over [`MAX_FRAME`] from its header.
pub(crate) fn read_frame(r: &mut impl Read) -> std::io::Result<(u8, Vec<u8>)> {
    hmc_transport_kit::control_frame::read_frame(r, MAX_FRAME)
}

/// The error for a REFUSED answer from `peer`: its reason, as the target wrote it.
pub(crate) fn refused(peer: &PeerAddr, reason: &[u8]) -> Error {
    Error::peer(
        peer,
        format!("refused: {}", String::from_utf8_lossy(reason)),
    )
}

/// Answers REFUSED with `e` as the reason, at the target; best effort, as the caller
/// ends the connection or goes on with it either way.
pub(crate) fn refuse(s: &mut impl Write, e: &Error) {
    let _ = write_frame(s, REFUSED, e.to_string().as_bytes());
}

/// HELLO's payload.
pub(crate) fn encode_hello(from: &PeerAddr, records: &[ConnRecord]) -> Vec<u8> {
    let from = from.to_string();
    let mut out = vec![VERSION, records.len() as u8];
    out.extend_from_slice(&(from.len() as u16).to_be_bytes());
    out.extend_from_slice(from.as_bytes());
    for r in records {
        out.extend_from_slice(&r.encode());
    }
    out
}

/// Decodes HELLO: the sender's address text and its records.
pub(crate) fn decode_hello(b: &[u8]) -> Result<(String, Vec<ConnRecord>)> {
    let bad = |why: &str| Error::Protocol(format!("RDMA HELLO: {why}"));
    if b.len() < 4 {
        return Err(bad("too short"));
    }
    if b[0] != VERSION {
        return Err(bad(&format!(
            "control protocol version {} (this side speaks {VERSION})",
            b[0]
        )));
    }
    let count = b[1] as usize;
    let alen = u16::from_be_bytes([b[2], b[3]]) as usize;
    let rest = b.get(4..).ok_or_else(|| bad("truncated"))?;
    if rest.len() != alen + count * ConnRecord::LEN {
        return Err(bad("length does not match the QP count"));
    }
    let from = String::from_utf8_lossy(&rest[..alen]).into_owned();
    let records = rest[alen..]
        .chunks(ConnRecord::LEN)
        .map(ConnRecord::decode)
        .collect::<Result<Vec<_>>>()?;
    Ok((from, records))
}

/// Decodes a list of records (HELLO_ACK).
pub(crate) fn decode_records(b: &[u8]) -> Result<Vec<ConnRecord>> {
    if !b.len().is_multiple_of(ConnRecord::LEN) {
        return Err(Error::Protocol(
            "RDMA HELLO_ACK: not a whole number of records".into(),
        ));
    }
    b.chunks(ConnRecord::LEN).map(ConnRecord::decode).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_and_refuses_mismatched_counts() {
        let r = ConnRecord {
            port: 1,
            gid: [3; 16],
            lid: 0,
            qpn: 77,
            psn: 5,
            mtu: 3,
        };
        let from: PeerAddr = "tcp://127.0.0.1:9".parse().unwrap();
        let b = encode_hello(&from, &[r, r]);
        let (text, recs) = decode_hello(&b).unwrap();
        assert_eq!(text, "tcp://127.0.0.1:9");
        assert_eq!(recs, vec![r, r]);
        let mut wrong = b.clone();
        wrong[1] = 3;
        assert!(decode_hello(&wrong).is_err());
        let mut v2 = b;
        v2[0] = 2;
        assert!(
            decode_hello(&v2)
                .unwrap_err()
                .to_string()
                .contains("version 2")
        );
    }

    #[test]
    fn oversized_frames_are_refused_from_their_header() {
        let mut head = vec![NOTIFY];
        head.extend_from_slice(&((MAX_FRAME + 1) as u32).to_be_bytes());
        let err = read_frame(&mut head.as_slice()).unwrap_err();
        assert!(err.to_string().contains("exceeds"), "{err}");
    }
}
