//! The data-plane wire format of `TcpCommunicator`: HELLO, batch requests, notifications, and errors that cross the wire.
//!
//! All integers are big-endian. A connection opens with
//! `HELLO = "HMTC" | version u8 | addr_len u16 | addr` from the initiator (its listening
//! address, for notifications) and the same shape back with a status byte after the
//! version (0 admitted; otherwise the address field carries the reason). Then requests
//! follow one at a time:
//!
//! | request | layout | answer |
//! | --- | --- | --- |
//! | WRITE (1) | `count u32`, `count` × [`WireDesc`], `pad u8`, `pad` zero bytes, then the bytes of every descriptor in order | status |
//! | READ (2) | `count u32`, `count` × [`WireDesc`] | status; if 0, then `pad u8`, `pad` zero bytes and the bytes of every descriptor in order |
//! | NOTIFY (3) | `tag u64`, `len u32`, `len` bytes | status |
//! | KEYED NOTIFY (4) | `id u64`, `token [u8; 16]` (a key of one of the target's live registrations), `tag u64`, `len u32`, `len` bytes | status |
//! | ABANDON (5) | `len u8` (at most 64), `len` bytes: another of the initiator's connections as text ([`crate::conn_name::ConnName`]: `IP:PORT`, or `unix:@` and an abstract address in hex) | status: 0 once that connection applies no more bytes (also when it is gone); `AccessDenied` when it is from another IP address or kind of socket |
//!
//! A NOTIFY (3) carries no proof of access and is taken only over an authenticated
//! connection; an initiator that imported a region of the target on the endpoint sends
//! KEYED NOTIFY (4) with that key instead, which the target checks like a READ/WRITE key
//! (any access right will do). KEYED NOTIFY is new in this version: a target of an older
//! version closes the connection with "unknown request kind 4".
//!
//! ABANDON (5) is what `Communicator::settle` sends for each connection the initiator
//! reset in the middle of a WRITE: the target answers only once the named connection's
//! receiver has stopped applying bytes into registered memory (see `crate::abandon`), so
//! no more of that WRITE lands after the answer, even bytes already in the target's
//! socket. A connection may name only one from its own IP address (over Unix sockets: of its
//! own user). ABANDON is new in this
//! version: a target of an older version closes the connection with "unknown request
//! kind 5", and `settle` reports that the early end is not final there.
//!
//! # Authentication (HELLO version 2)
//!
//! With `TcpConfig::auth_secret` set, the initiator's HELLO has version 2 and is followed
//! by a 32-byte nonce; the target answers with status 2 and a 64-byte field (its nonce,
//! then its HMAC-SHA256 proof), the initiator sends its 32-byte proof, and the target
//! then sends the usual answer (version 2, status 0 and its address, or a refusal). The
//! exchange is described in `crate::auth`. Without a secret nothing changes: version 1,
//! byte for byte as before, and a peer with a secret refuses it (and vice versa) with a
//! reason that names the setting.
//!
//! A status is one byte, 0 for success; any other value is an error code followed by
//! `a u64 | b u64 | c u64 | msg_len u16 | msg` (see [`encode_error`]). A refused WRITE is
//! still followed by its bytes, which the target reads and discards, so the connection
//! stays usable after a refusal.
//!
//! The padding (`pad` < 64, see [`align_pad`]) puts the first data byte at the same
//! offset modulo 64 in the sender's socket buffer as in the memory it comes from: the
//! kernel's copy into the socket buffer is much slower when the two differ by a few bytes.

use std::io;

use hmc_core::Error;
use tokio::io::{AsyncRead, AsyncReadExt};

pub(crate) const HELLO_MAGIC: [u8; 4] = *b"HMTC";
/// The HELLO version without authentication.
pub(crate) const VERSION: u8 = 1;
/// The HELLO version of a dialler that authenticates (followed by its nonce).
pub(crate) const VERSION_AUTH: u8 = 2;
/// The HELLO-answer status that starts the authentication exchange.
pub(crate) const STATUS_AUTHENTICATE: u8 = 2;
/// Longest address or refusal reason in a HELLO.
pub(crate) const MAX_HELLO_TEXT: usize = 4096;
/// Longest error message carried in a status.
const MAX_ERROR_MSG: usize = 4096;

/// Batches of at most this many bytes are copied into one buffer with their header (or,
/// for READ answers, their status) and sent with one write: one segment and one wakeup
/// instead of two, which halves small-transfer latency. Larger ones go zero-copy.
pub(crate) const COALESCE_LEN: usize = 16 << 10;

pub(crate) const REQ_WRITE: u8 = 1;
pub(crate) const REQ_READ: u8 = 2;
pub(crate) const REQ_NOTIFY: u8 = 3;
pub(crate) const REQ_NOTIFY_KEYED: u8 = 4;
pub(crate) const REQ_ABANDON: u8 = 5;

/// Padding that puts data preceded by `before` bytes (counted from a cache-line boundary in
/// the sender's socket buffer, the usual state at the start of a request) at the same
/// offset modulo 64 as its source address.
pub(crate) fn align_pad(before: usize, src_addr: usize) -> u8 {
    (src_addr.wrapping_sub(before) % 64) as u8
}

/// Reads a `pad u8` and the `pad` bytes after it.
pub(crate) async fn skip_pad<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<()> {
    let pad = r.read_u8().await? as usize;
    if pad >= 64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("padding of {pad} bytes; the protocol allows at most 63"),
        ));
    }
    let mut skip = [0u8; 64];
    r.read_exact(&mut skip[..pad]).await?;
    Ok(())
}

/// Bytes of a region key: region id `u64` and a 128-bit random token.
pub(crate) const KEY_LEN: usize = 8 + TOKEN_LEN;
pub(crate) const TOKEN_LEN: usize = 16;
// The registrations hold the kit's tokens; the wire's length is fixed here (docs/wire.md).
const _: () = assert!(TOKEN_LEN == hmc_transport_kit::key_token::KEY_TOKEN_LEN);

/// One descriptor as the target sees it: which region (and proof of the right to it),
/// where, and how much.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WireDesc {
    pub id: u64,
    pub token: [u8; TOKEN_LEN],
    pub offset: u64,
    pub len: u64,
}

impl WireDesc {
    pub(crate) const LEN: usize = 8 + TOKEN_LEN + 8 + 8;

    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.id.to_be_bytes());
        out.extend_from_slice(&self.token);
        out.extend_from_slice(&self.offset.to_be_bytes());
        out.extend_from_slice(&self.len.to_be_bytes());
    }

    /// Decodes `bytes.len() / LEN` descriptors; `bytes` must be a whole number of them.
    pub(crate) fn decode_all(bytes: &[u8]) -> Vec<WireDesc> {
        bytes
            .chunks_exact(Self::LEN)
            .map(|c| WireDesc {
                id: u64::from_be_bytes(c[0..8].try_into().expect("8 bytes")),
                token: c[8..24].try_into().expect("16 bytes"),
                offset: u64::from_be_bytes(c[24..32].try_into().expect("8 bytes")),
                len: u64::from_be_bytes(c[32..40].try_into().expect("8 bytes")),
            })
            .collect()
    }
}

/// A HELLO or HELLO answer: `magic | version | [status] | len u16 | text`.
pub(crate) fn encode_hello(status: Option<u8>, text: &str) -> Vec<u8> {
    encode_hello_v(VERSION, status, text.as_bytes())
}

/// [`encode_hello`] with a version and a payload that need not be text (the nonce and
/// proof of [`STATUS_AUTHENTICATE`]).
pub(crate) fn encode_hello_v(version: u8, status: Option<u8>, text: &[u8]) -> Vec<u8> {
    let text = &text[..text.len().min(MAX_HELLO_TEXT)];
    let mut out = Vec::with_capacity(8 + text.len());
    out.extend_from_slice(&HELLO_MAGIC);
    out.push(version);
    out.extend(status);
    out.extend_from_slice(&(text.len() as u16).to_be_bytes());
    out.extend_from_slice(text);
    out
}

/// A HELLO or HELLO answer as read.
pub(crate) struct Hello {
    /// [`VERSION`] or [`VERSION_AUTH`].
    pub version: u8,
    /// The answer's status (0 for a HELLO).
    pub status: u8,
    /// The address or reason (UTF-8), or the nonce and proof of an authentication answer.
    pub payload: Vec<u8>,
}

impl Hello {
    /// The payload as text (addresses and refusal reasons).
    pub fn text(&self) -> Result<String, String> {
        String::from_utf8(self.payload.clone()).map_err(|_| "HELLO text is not UTF-8".into())
    }
}

/// Reads a HELLO (`with_status` false) or its answer, of either version.
pub(crate) async fn read_hello_v<R: AsyncRead + Unpin>(
    r: &mut R,
    with_status: bool,
) -> io::Result<Result<Hello, String>> {
    let mut head = [0u8; 5];
    r.read_exact(&mut head).await?;
    if head[..4] != HELLO_MAGIC {
        return Ok(Err(
            "not an HMC TCP data-plane peer (bad HELLO magic)".into()
        ));
    }
    let version = head[4];
    if version != VERSION && version != VERSION_AUTH {
        return Ok(Err(format!(
            "data-plane version {version} is not supported (this side speaks {VERSION}, and \
             {VERSION_AUTH} with authentication)"
        )));
    }
    let status = if with_status { r.read_u8().await? } else { 0 };
    let len = r.read_u16().await? as usize;
    if len > MAX_HELLO_TEXT {
        return Ok(Err(format!(
            "HELLO text of {len} bytes exceeds {MAX_HELLO_TEXT}"
        )));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    Ok(Ok(Hello {
        version,
        status,
        payload,
    }))
}

/// Limits whose errors cross the wire, by index (the wire carries the index).
/// New names go at the end: a peer of an older version shows an index it does not know
/// as "target limit".
const WIRE_LIMITS: [&str; 5] = [
    "max_batch_descs",
    "max_notify_len",
    "max_pending_notifications",
    "max_accepted_connections",
    "max_pending_notification_bytes",
];

/// The status bytes for `e`. Errors without a wire code travel as protocol errors with
/// their message.
pub(crate) fn encode_error(e: &Error) -> Vec<u8> {
    let (code, a, b, c, msg) = match e {
        Error::InvalidKey(m) => (1u8, 0, 0, 0, m.clone()),
        Error::OutOfBounds {
            offset, len, limit, ..
        } => (2, *offset, *len, *limit, String::new()),
        Error::AccessDenied(m) => (3, 0, 0, 0, m.clone()),
        Error::LimitExceeded {
            limit,
            value,
            max,
            hint,
        } => {
            let idx = WIRE_LIMITS.iter().position(|l| l == limit).unwrap_or(0);
            (4, idx as u64, *value, *max, hint.clone())
        }
        Error::Closed(m) => (6, 0, 0, 0, m.clone()),
        other => (5, 0, 0, 0, other.to_string()),
    };
    let msg = &msg.as_bytes()[..msg.len().min(MAX_ERROR_MSG)];
    let mut out = Vec::with_capacity(1 + 24 + 2 + msg.len());
    out.push(code);
    for v in [a, b, c] {
        out.extend_from_slice(&v.to_be_bytes());
    }
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg);
    out
}

/// Reads a status; `Ok(Ok(()))` for success, `Ok(Err(e))` for an error the target
/// reported (the connection is still in step), `Err` when the stream failed.
pub(crate) async fn read_status<R: AsyncRead + Unpin>(
    r: &mut R,
    peer: &(impl std::fmt::Display + ?Sized),
) -> io::Result<Result<(), Error>> {
    let code = r.read_u8().await?;
    if code == 0 {
        return Ok(Ok(()));
    }
    let a = r.read_u64().await?;
    let b = r.read_u64().await?;
    let c = r.read_u64().await?;
    let len = r.read_u16().await? as usize;
    let mut msg = vec![0u8; len.min(MAX_ERROR_MSG)];
    r.read_exact(&mut msg).await?;
    let msg = String::from_utf8_lossy(&msg).into_owned();
    Ok(Err(match code {
        1 => Error::InvalidKey(msg),
        2 => Error::OutOfBounds {
            what: "remote region",
            offset: a,
            len: b,
            limit: c,
        },
        3 => Error::AccessDenied(msg),
        4 => Error::LimitExceeded {
            limit: WIRE_LIMITS
                .get(a as usize)
                .copied()
                .unwrap_or("target limit"),
            value: b,
            max: c,
            hint: msg,
        },
        6 => Error::peer(peer, format!("the target is closing: {msg}")),
        _ => Error::Protocol(format!("the target at {peer} reported: {msg}")),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_aligns_the_data_with_its_source() {
        for before in [2usize, 6, 46, 127] {
            for src in [0x1000usize, 0x1001, 0x103f, 0x7fff_0001] {
                let pad = align_pad(before, src) as usize;
                assert!(pad < 64);
                assert_eq!(
                    (before + pad) % 64,
                    src % 64,
                    "before {before} src {src:#x}"
                );
            }
        }
    }

    #[test]
    fn descriptors_round_trip() {
        let d = WireDesc {
            id: 0x0102_0304_0506_0708,
            token: [9; TOKEN_LEN],
            offset: u64::MAX,
            len: 42,
        };
        let mut out = Vec::new();
        d.encode(&mut out);
        d.encode(&mut out);
        assert_eq!(out.len(), 2 * WireDesc::LEN);
        assert_eq!(WireDesc::decode_all(&out), vec![d, d]);
    }

    #[tokio::test]
    async fn errors_cross_the_wire_with_their_kind_and_numbers() {
        let cases = [
            Error::InvalidKey("stale".into()),
            Error::OutOfBounds {
                what: "remote region",
                offset: 1,
                len: 2,
                limit: 3,
            },
            Error::AccessDenied("read-only".into()),
            Error::LimitExceeded {
                limit: "max_notify_len",
                value: 10,
                max: 5,
                hint: "raise it".into(),
            },
        ];
        for e in cases {
            let bytes = encode_error(&e);
            let back = read_status(&mut &bytes[..], "peer")
                .await
                .unwrap()
                .unwrap_err();
            assert_eq!(back.to_string(), e.to_string());
        }
        let ok = read_status(&mut &[0u8][..], "peer").await.unwrap();
        assert!(ok.is_ok());
    }

    #[tokio::test]
    async fn hellos_refuse_bad_magic_versions_and_lengths() {
        let good = encode_hello(None, "tcp://127.0.0.1:1");
        let h = read_hello_v(&mut &good[..], false).await.unwrap().unwrap();
        assert_eq!((h.version, h.status), (VERSION, 0));
        assert_eq!(h.text().unwrap(), "tcp://127.0.0.1:1");
        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(read_hello_v(&mut &bad[..], false).await.unwrap().is_err());
        let mut v3 = good.clone();
        v3[4] = 3;
        assert!(read_hello_v(&mut &v3[..], false).await.unwrap().is_err());
        let mut long = good[..5].to_vec();
        long.extend_from_slice(&u16::MAX.to_be_bytes());
        assert!(read_hello_v(&mut &long[..], false).await.unwrap().is_err());
        // Truncated input is a stream error, not a panic.
        assert!(read_hello_v(&mut &good[..6], false).await.is_err());
        // An authentication answer carries binary bytes.
        let auth = encode_hello_v(VERSION_AUTH, Some(STATUS_AUTHENTICATE), &[0xff; 64]);
        let h = read_hello_v(&mut &auth[..], true).await.unwrap().unwrap();
        assert_eq!(
            (h.version, h.status, h.payload.len()),
            (VERSION_AUTH, 2, 64)
        );
        assert!(h.text().is_err());
    }
}
