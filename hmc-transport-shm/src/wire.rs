//! The side channel's messages and their framing: a `u32` little-endian length, then a
//! body whose first byte is the message type.
//!
//! Initiator to target: [`Msg::Hello`], [`Msg::Grant`], [`Msg::Notify`], [`Msg::Released`].
//! Target to initiator: [`Msg::Welcome`], [`Msg::Granted`], [`Msg::Ok`], [`Msg::Refused`],
//! [`Msg::Revoke`], [`Msg::Forget`]. Requests carry an id that their answer repeats; `Revoke` and
//! `Released` carry lease ids instead.

use std::io::{self, Read, Write};

use hmc_core::{Access, DeviceKind, Error, IpcDescriptor, Op, PeerAddr};

/// Version of the side-channel protocol, checked in `Hello`/`Welcome` (3: `Granted` may
/// carry a vendor IPC descriptor).
pub(crate) const VERSION: u8 = 3;
/// Bytes of a key's random token.
pub(crate) const TOKEN_LEN: usize = 16;
// The registrations hold the kit's tokens; the wire's length is fixed here (docs/wire.md).
const _: () = assert!(TOKEN_LEN == hmc_transport_kit::key_token::KEY_TOKEN_LEN);
/// Bytes of a packed remote key: registration id (`u64`) then token.
pub(crate) const KEY_LEN: usize = 8 + TOKEN_LEN;
/// Largest frame an initiator accepts from a target (answers and lease lists).
pub(crate) const MAX_FRAME: usize = 1 << 20;
/// Room for a frame's header and lease lists beyond a notification's bytes: what a target
/// accepts is `ShmConfig::max_notify_len` plus this.
pub(crate) const FRAME_SLACK: usize = 64 << 10;

/// `Granted::map`: cross-memory attach reaches the registration.
pub(crate) const MAP_NONE: u8 = 0;
/// `Granted::map`: the registration's memfd is attached to the frame; map it.
pub(crate) const MAP_FD: u8 = 1;
/// `Granted::map`: the registration's memfd was attached to an earlier `Granted`.
pub(crate) const MAP_KNOWN: u8 = 2;
/// `Granted::map`: the registration is device memory; `Granted::ipc` is its vendor IPC
/// descriptor, which the initiator opens with a memory backend of that kind.
pub(crate) const MAP_IPC: u8 = 3;

/// Why a target refused a request, as a code on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    InvalidKey = 1,
    AccessDenied = 2,
    OutOfBounds = 3,
    Limit = 4,
    Closed = 5,
}

/// One side-channel message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Msg {
    /// First message of a connection: the initiator's own listening address (for
    /// notifications' `from`). Its pid comes from `SO_PEERCRED`, never from here.
    Hello { version: u8, addr: String },
    /// The target's answer: the address of a byte in the target that the initiator reads
    /// once to prove cross-memory attach works.
    Welcome { version: u8, probe_addr: u64 },
    /// Asks for a lease on registration `id` for a first access `[offset, offset+len)` by `op`.
    Grant {
        req: u64,
        id: u64,
        token: [u8; TOKEN_LEN],
        op: Op,
        offset: u64,
        len: u64,
    },
    /// A lease: the whole registration, at `addr` in the target, with its access rights.
    /// `map` says whether the registration is shared memory the initiator maps instead:
    /// [`MAP_NONE`], [`MAP_FD`] (its memfd is attached to this frame) or [`MAP_KNOWN`] (sent
    /// earlier on this connection, and not forgotten since), or device memory whose vendor
    /// IPC descriptor is `ipc` ([`MAP_IPC`]; present exactly then).
    Granted {
        req: u64,
        lease: u64,
        addr: u64,
        len: u64,
        access: Access,
        map: u8,
        ipc: Option<IpcDescriptor>,
    },
    /// These registrations are gone: unmap them (target to initiator, no answer).
    Forget { regs: Vec<u64> },
    /// A notification.
    Notify { req: u64, tag: u64, msg: Vec<u8> },
    /// Request `req` succeeded (notifications).
    Ok { req: u64 },
    /// Request `req` was refused; `limit` is the bound or maximum where one applies.
    Refused {
        req: u64,
        why: Refusal,
        limit: u64,
        text: String,
    },
    /// The target revokes these leases; the initiator answers `Released` once no copy
    /// under them is in progress.
    Revoke { leases: Vec<u64> },
    /// The initiator no longer uses these leases.
    Released { leases: Vec<u64> },
}

fn op_byte(op: Op) -> u8 {
    match op {
        Op::Read => 0,
        Op::Write => 1,
    }
}

fn put_list(out: &mut Vec<u8>, ids: &[u64]) {
    out.extend_from_slice(&(ids.len() as u32).to_le_bytes());
    ids.iter()
        .for_each(|i| out.extend_from_slice(&i.to_le_bytes()));
}

impl Msg {
    /// The frame (length prefix included).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; 4];
        match self {
            Msg::Hello { version, addr } => {
                b.extend_from_slice(&[1, *version]);
                b.extend_from_slice(addr.as_bytes());
            }
            Msg::Grant {
                req,
                id,
                token,
                op,
                offset,
                len,
            } => {
                b.push(2);
                b.extend_from_slice(&req.to_le_bytes());
                b.extend_from_slice(&id.to_le_bytes());
                b.extend_from_slice(token);
                b.push(op_byte(*op));
                b.extend_from_slice(&offset.to_le_bytes());
                b.extend_from_slice(&len.to_le_bytes());
            }
            Msg::Notify { req, tag, msg } => {
                b.push(3);
                b.extend_from_slice(&req.to_le_bytes());
                b.extend_from_slice(&tag.to_le_bytes());
                b.extend_from_slice(msg);
            }
            Msg::Released { leases } => {
                b.push(4);
                put_list(&mut b, leases);
            }
            Msg::Welcome {
                version,
                probe_addr,
            } => {
                b.extend_from_slice(&[0x81, *version]);
                b.extend_from_slice(&probe_addr.to_le_bytes());
            }
            Msg::Granted {
                req,
                lease,
                addr,
                len,
                access,
                map,
                ipc,
            } => {
                b.push(0x82);
                for v in [req, lease, addr, len] {
                    b.extend_from_slice(&v.to_le_bytes());
                }
                b.extend_from_slice(&[access.bits(), *map]);
                if let Some(ipc) = ipc {
                    b.push(ipc.kind.wire_id());
                    b.extend_from_slice(&ipc.bytes);
                }
            }
            Msg::Forget { regs } => {
                b.push(0x86);
                put_list(&mut b, regs);
            }
            Msg::Ok { req } => {
                b.push(0x83);
                b.extend_from_slice(&req.to_le_bytes());
            }
            Msg::Refused {
                req,
                why,
                limit,
                text,
            } => {
                b.push(0x84);
                b.extend_from_slice(&req.to_le_bytes());
                b.push(*why as u8);
                b.extend_from_slice(&limit.to_le_bytes());
                b.extend_from_slice(text.as_bytes());
            }
            Msg::Revoke { leases } => {
                b.push(0x85);
                put_list(&mut b, leases);
            }
        }
        let len = (b.len() - 4) as u32;
        b[..4].copy_from_slice(&len.to_le_bytes());
        b
    }

    /// Decodes one frame body; anything malformed is a protocol error.
    pub(crate) fn decode(body: &[u8]) -> Result<Msg, Error> {
        let bad = || {
            Error::Protocol(format!(
                "malformed side-channel message ({} bytes)",
                body.len()
            ))
        };
        let mut r = Reader { b: body, at: 0 };
        let kind = r.u8().ok_or_else(bad)?;
        let msg = match kind {
            1 => Msg::Hello {
                version: r.u8().ok_or_else(bad)?,
                addr: r.text(),
            },
            2 => Msg::Grant {
                req: r.u64().ok_or_else(bad)?,
                id: r.u64().ok_or_else(bad)?,
                token: r
                    .take(TOKEN_LEN)
                    .ok_or_else(bad)?
                    .try_into()
                    .map_err(|_| bad())?,
                op: match r.u8().ok_or_else(bad)? {
                    0 => Op::Read,
                    1 => Op::Write,
                    _ => return Err(bad()),
                },
                offset: r.u64().ok_or_else(bad)?,
                len: r.u64().ok_or_else(bad)?,
            },
            3 => Msg::Notify {
                req: r.u64().ok_or_else(bad)?,
                tag: r.u64().ok_or_else(bad)?,
                msg: r.rest().to_vec(),
            },
            4 => Msg::Released {
                leases: r.list().ok_or_else(bad)?,
            },
            0x81 => Msg::Welcome {
                version: r.u8().ok_or_else(bad)?,
                probe_addr: r.u64().ok_or_else(bad)?,
            },
            0x82 => {
                let (req, lease, addr, len) = (r.u64(), r.u64(), r.u64(), r.u64());
                let access = Access::from_bits(r.u8().ok_or_else(bad)?)?;
                let (map, ipc) = match r.u8().ok_or_else(bad)? {
                    m @ (MAP_NONE | MAP_FD | MAP_KNOWN) => (m, None),
                    MAP_IPC => {
                        let kind = DeviceKind::from_wire_id(r.u8().ok_or_else(bad)?);
                        let bytes = r.rest().to_vec();
                        (MAP_IPC, Some(IpcDescriptor::new(kind, bytes)))
                    }
                    _ => return Err(bad()),
                };
                Msg::Granted {
                    req: req.ok_or_else(bad)?,
                    lease: lease.ok_or_else(bad)?,
                    addr: addr.ok_or_else(bad)?,
                    len: len.ok_or_else(bad)?,
                    access,
                    map,
                    ipc,
                }
            }
            0x83 => Msg::Ok {
                req: r.u64().ok_or_else(bad)?,
            },
            0x84 => Msg::Refused {
                req: r.u64().ok_or_else(bad)?,
                why: match r.u8().ok_or_else(bad)? {
                    1 => Refusal::InvalidKey,
                    2 => Refusal::AccessDenied,
                    3 => Refusal::OutOfBounds,
                    4 => Refusal::Limit,
                    5 => Refusal::Closed,
                    _ => return Err(bad()),
                },
                limit: r.u64().ok_or_else(bad)?,
                text: r.text(),
            },
            0x85 => Msg::Revoke {
                leases: r.list().ok_or_else(bad)?,
            },
            0x86 => Msg::Forget {
                regs: r.list().ok_or_else(bad)?,
            },
            _ => return Err(bad()),
        };
        Ok(msg)
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|s| s[0])
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|s| u64::from_le_bytes(s.try_into().unwrap()))
    }
    fn rest(&mut self) -> &'a [u8] {
        let s = &self.b[self.at..];
        self.at = self.b.len();
        s
    }
    fn text(&mut self) -> String {
        String::from_utf8_lossy(self.rest()).into_owned()
    }
    fn list(&mut self) -> Option<Vec<u64>> {
        let n = u32::from_le_bytes(self.take(4)?.try_into().unwrap()) as usize;
        if n > (self.b.len() - self.at) / 8 {
            return None;
        }
        (0..n).map(|_| self.u64()).collect()
    }
}

/// Reads one frame's body of at most `max` bytes. `Ok(None)` at a clean end of stream.
pub(crate) fn read_frame(r: &mut impl Read, max: usize) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len == 0 || len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "side-channel frame of {len} bytes over the limit of {max} (a notification \
                 longer than the receiver's ShmConfig::max_notify_len, or a broken peer)"
            ),
        ));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(Some(body))
}

/// Writes one message.
pub(crate) fn write_msg(w: &mut impl Write, msg: &Msg) -> io::Result<()> {
    w.write_all(&msg.encode())
}

/// The error a refusal of a request for `[offset, offset + len)` stands for.
pub(crate) fn refused(
    peer: &PeerAddr,
    why: Refusal,
    limit: u64,
    text: String,
    offset: u64,
    len: u64,
) -> Error {
    match why {
        Refusal::InvalidKey => Error::InvalidKey(text),
        Refusal::AccessDenied => Error::AccessDenied(text),
        Refusal::OutOfBounds => Error::OutOfBounds {
            what: "remote region",
            offset,
            len,
            limit,
        },
        Refusal::Limit => Error::LimitExceeded {
            limit: if text == "max_notify_len" {
                "max_notify_len"
            } else {
                "max_pending_notifications"
            },
            value: len,
            max: limit,
            hint: "raise the target's ShmConfig limit, or receive notifications sooner".into(),
        },
        Refusal::Closed => Error::peer(peer, text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rstest::rstest]
    #[case(Msg::Hello { version: 1, addr: "unix:///x".into() })]
    #[case(Msg::Welcome { version: 1, probe_addr: 42 })]
    #[case(Msg::Grant { req: 1, id: 2, token: [7; TOKEN_LEN], op: Op::Write, offset: 3, len: 4 })]
    #[case(Msg::Granted { req: 1, lease: 2, addr: 3, len: 4, access: Access::READ, map: MAP_NONE, ipc: None })]
    #[case(Msg::Granted { req: 1, lease: 2, addr: 3, len: 4, access: Access::WRITE, map: MAP_FD, ipc: None })]
    #[case(Msg::Granted {
        req: 1, lease: 2, addr: 3, len: 4, access: Access::READ_WRITE, map: MAP_IPC,
        ipc: Some(IpcDescriptor::new(DeviceKind::ROCM, vec![7; 72])),
    })]
    #[case(Msg::Forget { regs: vec![5, 6] })]
    #[case(Msg::Notify { req: 9, tag: 8, msg: vec![1, 2, 3] })]
    #[case(Msg::Ok { req: 5 })]
    #[case(Msg::Refused { req: 5, why: Refusal::OutOfBounds, limit: 10, text: "no".into() })]
    #[case(Msg::Revoke { leases: vec![1, 2] })]
    #[case(Msg::Released { leases: vec![] })]
    fn messages_round_trip(#[case] m: Msg) {
        let frame = m.encode();
        let body = read_frame(&mut &frame[..], MAX_FRAME).unwrap().unwrap();
        assert_eq!(Msg::decode(&body).unwrap(), m);
    }

    #[test]
    fn damaged_frames_are_refused() {
        assert!(Msg::decode(&[0x99]).is_err());
        assert!(Msg::decode(&[2, 1]).is_err());
        assert!(Msg::decode(&[0x85, 255, 255, 255, 255]).is_err());
        // A `Granted` announcing an IPC descriptor without its device kind.
        let mut granted = vec![0x82];
        granted.extend_from_slice(&[0; 32]);
        granted.extend_from_slice(&[Access::READ.bits(), MAP_IPC]);
        assert!(Msg::decode(&granted).is_err());
        granted.push(DeviceKind::ROCM.wire_id());
        assert!(Msg::decode(&granted).is_ok());
        granted[34] = 9;
        assert!(Msg::decode(&granted).is_err(), "an unknown map kind");
        let huge = ((MAX_FRAME + 1) as u32).to_le_bytes();
        assert!(read_frame(&mut &huge[..], MAX_FRAME).is_err());
    }
}
