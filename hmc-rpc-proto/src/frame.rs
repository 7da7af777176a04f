//! Protocol v1 framing: the 48-byte big-endian header, frame kinds, payload modes, flags,
//! status codes, and header validation (see `docs/protocol.md`).

use std::fmt;

/// `"HM"`, the first two bytes of every frame.
pub const MAGIC: u16 = 0x484D;
/// The only protocol version this crate speaks.
pub const VERSION: u8 = 1;
/// Length of the fixed v1 header.
pub const HEADER_LEN: usize = 48;
/// Largest payload that travels INLINE as the body of its REQUEST/RESPONSE frame.
pub const INLINE_MAX: usize = 4096;

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// A call from client to server.
    Request = 1,
    /// The answer to a request, with a status.
    Response = 2,
    /// The client no longer wants the answer to `request_id`.
    Cancel = 3,
    /// Keepalive probe; answered by [`FrameKind::Pong`] with the same request id.
    Ping = 4,
    /// Keepalive answer.
    Pong = 5,
    /// The sender closes the connection; the body says why (UTF-8).
    GoAway = 6,
    /// One chunk of a TCP_STREAM payload.
    Data = 7,
}

impl FrameKind {
    /// From the wire byte.
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Request,
            2 => Self::Response,
            3 => Self::Cancel,
            4 => Self::Ping,
            5 => Self::Pong,
            6 => Self::GoAway,
            7 => Self::Data,
            _ => return None,
        })
    }
}

/// How a frame's payload travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PayloadMode {
    /// The payload (at most [`INLINE_MAX`] bytes) is the body of this frame.
    Inline = 0,
    /// The payload follows in DATA frames of bounded size.
    TcpStream = 1,
    /// The body describes a registered region that the peer pulls or pushes one-sided
    /// (reserved for the data-plane issue; refused by this version with `DATA_PLANE`).
    HmcBuffer = 2,
}

impl PayloadMode {
    /// From the wire byte.
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::Inline,
            1 => Self::TcpStream,
            2 => Self::HmcBuffer,
            _ => return None,
        })
    }
}

/// Frame flags (byte 5). `Debug` names them: `Flags(END | ONE_WAY)`, `Flags(NONE)`, and
/// bits v1 does not define in hex (`Flags(END | 0x80)`).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Flags(pub u8);

impl Flags {
    /// Last chunk of a stream.
    pub const END: Flags = Flags(1);
    /// No response wanted.
    pub const ONE_WAY: Flags = Flags(2);
    /// Bits that v1 defines; all others must be zero.
    pub const KNOWN: u8 = 0b11;

    /// True when every bit of `other` is set.
    pub fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl fmt::Debug for Flags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names = [(Flags::END, "END"), (Flags::ONE_WAY, "ONE_WAY")]
            .into_iter()
            .filter(|(flag, _)| self.contains(*flag))
            .map(|(_, name)| name.to_string())
            .collect::<Vec<_>>();
        if self.0 & !Self::KNOWN != 0 {
            names.push(format!("{:#x}", self.0 & !Self::KNOWN));
        }
        if names.is_empty() {
            names.push("NONE".into());
        }
        write!(f, "Flags({})", names.join(" | "))
    }
}

impl std::ops::BitOr for Flags {
    type Output = Flags;
    fn bitor(self, rhs: Flags) -> Flags {
        Flags(self.0 | rhs.0)
    }
}

/// A response status. 0..=11 are defined by the protocol; 1000 and up belong to applications.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status(pub u32);

impl Status {
    /// Success.
    pub const OK: Status = Status(0);
    /// No handler is registered for the method id.
    pub const UNKNOWN_METHOD: Status = Status(1);
    /// The payload could not be decoded.
    pub const BAD_PAYLOAD: Status = Status(2);
    /// The deadline passed before the answer was ready.
    pub const DEADLINE_EXCEEDED: Status = Status(3);
    /// The client cancelled the call.
    pub const CANCELLED: Status = Status(4);
    /// A connection or server in-flight limit is reached; retry later.
    pub const OVERLOADED: Status = Status(5);
    /// The payload exceeds `max_payload_len`.
    pub const PAYLOAD_TOO_LARGE: Status = Status(6);
    /// The handler failed or panicked.
    pub const INTERNAL: Status = Status(7);
    /// The server is shutting down and takes no new calls.
    pub const SHUTTING_DOWN: Status = Status(8);
    /// The large-payload data plane failed or is not available.
    pub const DATA_PLANE: Status = Status(9);
    /// The peer broke the protocol.
    pub const PROTOCOL: Status = Status(10);
    /// The caller is not allowed to call.
    pub const UNAUTHENTICATED: Status = Status(11);
    /// First code available to applications.
    pub const APPLICATION_BASE: u32 = 1000;

    /// The protocol's name of this status (`"APP(1234)"` for application codes).
    pub fn name(self) -> String {
        let s = match self.0 {
            0 => "OK",
            1 => "UNKNOWN_METHOD",
            2 => "BAD_PAYLOAD",
            3 => "DEADLINE_EXCEEDED",
            4 => "CANCELLED",
            5 => "OVERLOADED",
            6 => "PAYLOAD_TOO_LARGE",
            7 => "INTERNAL",
            8 => "SHUTTING_DOWN",
            9 => "DATA_PLANE",
            10 => "PROTOCOL",
            11 => "UNAUTHENTICATED",
            n if n >= Self::APPLICATION_BASE => return format!("APP({n})"),
            n => return format!("RESERVED({n})"),
        };
        s.to_string()
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The decoded, validated 48-byte header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// What the frame is.
    pub kind: FrameKind,
    /// How the payload travels.
    pub mode: PayloadMode,
    /// END / ONE_WAY.
    pub flags: Flags,
    /// Client-chosen id, unique per connection while in flight.
    pub request_id: u64,
    /// The method called.
    pub method_id: u32,
    /// Response status (0 in requests).
    pub status: Status,
    /// Total payload length in bytes.
    pub payload_len: u64,
    /// Bytes of this frame after the header.
    pub body_len: u32,
    /// Deadline budget in microseconds from receipt (0 = none).
    pub deadline_us: u32,
    /// CRC32C of the body (INLINE, DATA) or of the whole payload (TCP_STREAM header);
    /// 0 = not computed.
    pub payload_crc: u32,
}

impl FrameHeader {
    /// A header with every field zero except `kind` (INLINE, no flags).
    pub fn new(kind: FrameKind, request_id: u64) -> Self {
        FrameHeader {
            kind,
            mode: PayloadMode::Inline,
            flags: Flags(0),
            request_id,
            method_id: 0,
            status: Status::OK,
            payload_len: 0,
            body_len: 0,
            deadline_us: 0,
            payload_crc: 0,
        }
    }

    /// Encodes the header, computing the header CRC.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&MAGIC.to_be_bytes());
        b[2] = VERSION;
        b[3] = self.kind as u8;
        b[4] = self.mode as u8;
        b[5] = self.flags.0;
        b[6..8].copy_from_slice(&(HEADER_LEN as u16).to_be_bytes());
        b[8..16].copy_from_slice(&self.request_id.to_be_bytes());
        b[16..20].copy_from_slice(&self.method_id.to_be_bytes());
        b[20..24].copy_from_slice(&self.status.0.to_be_bytes());
        b[24..32].copy_from_slice(&self.payload_len.to_be_bytes());
        b[32..36].copy_from_slice(&self.body_len.to_be_bytes());
        b[36..40].copy_from_slice(&self.deadline_us.to_be_bytes());
        b[40..44].copy_from_slice(&self.payload_crc.to_be_bytes());
        let crc = crc32c(&b[0..44]);
        b[44..48].copy_from_slice(&crc.to_be_bytes());
        b
    }

    /// Decodes and validates a header against `limits`. Checks, in order: magic, version,
    /// header length, header CRC, kind, mode, reserved flag bits, body length against
    /// `max_body_len`, and the per-kind consistency rules of `docs/protocol.md`.
    ///
    /// The payload length against `max_payload_len` is *not* a header error: the protocol
    /// core answers such a request with `PAYLOAD_TOO_LARGE` and keeps the connection.
    pub fn decode(b: &[u8], limits: &FrameLimits) -> Result<Self, FrameError> {
        if b.len() < HEADER_LEN {
            return Err(FrameError::Truncated { have: b.len() });
        }
        let be16 = |at: usize| u16::from_be_bytes([b[at], b[at + 1]]);
        let be32 = |at: usize| u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let be64 = |at: usize| u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let magic = be16(0);
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        if b[2] != VERSION {
            return Err(FrameError::BadVersion(b[2]));
        }
        let header_len = be16(6);
        if header_len as usize != HEADER_LEN {
            return Err(FrameError::BadHeaderLen(header_len));
        }
        let want = be32(44);
        let got = crc32c(&b[0..44]);
        if want != got {
            return Err(FrameError::HeaderCrc { want, got });
        }
        let kind = FrameKind::from_u8(b[3]).ok_or(FrameError::UnknownKind(b[3]))?;
        let mode = PayloadMode::from_u8(b[4]).ok_or(FrameError::UnknownMode(b[4]))?;
        if b[5] & !Flags::KNOWN != 0 {
            return Err(FrameError::ReservedFlags(b[5]));
        }
        let h = FrameHeader {
            kind,
            mode,
            flags: Flags(b[5]),
            request_id: be64(8),
            method_id: be32(16),
            status: Status(be32(20)),
            payload_len: be64(24),
            body_len: be32(32),
            deadline_us: be32(36),
            payload_crc: be32(40),
        };
        if h.body_len > limits.max_body_len {
            return Err(FrameError::BodyTooLarge {
                len: h.body_len,
                max: limits.max_body_len,
            });
        }
        h.check_consistency()?;
        Ok(h)
    }

    fn check_consistency(&self) -> Result<(), FrameError> {
        let bad = |why: &'static str| Err(FrameError::Inconsistent(why));
        match self.kind {
            FrameKind::Request | FrameKind::Response => match self.mode {
                PayloadMode::Inline => {
                    if self.payload_len != u64::from(self.body_len) {
                        return bad(
                            "INLINE frame whose body length differs from its payload length",
                        );
                    }
                    if self.body_len as usize > INLINE_MAX {
                        return bad("INLINE payload over 4096 bytes (use TCP_STREAM)");
                    }
                }
                PayloadMode::TcpStream => {
                    if self.body_len != 0 {
                        return bad(
                            "TCP_STREAM header frame with a body (the payload goes in DATA frames)",
                        );
                    }
                }
                PayloadMode::HmcBuffer => {}
            },
            FrameKind::Data => {
                if self.mode != PayloadMode::TcpStream {
                    return bad("DATA frame whose mode is not TCP_STREAM");
                }
                if u64::from(self.body_len) > self.payload_len {
                    return bad("DATA chunk longer than its payload");
                }
            }
            FrameKind::Cancel | FrameKind::Ping | FrameKind::Pong => {
                if self.body_len != 0 || self.payload_len != 0 {
                    return bad("CANCEL/PING/PONG frame with a body");
                }
            }
            FrameKind::GoAway => {
                if self.payload_len != u64::from(self.body_len) {
                    return bad("GOAWAY whose body length differs from its payload length");
                }
            }
        }
        Ok(())
    }
}

/// Size limits applied while decoding frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameLimits {
    /// Largest body of one frame (`max_body_len`, default 256 KiB).
    pub max_body_len: u32,
    /// Largest payload of one call (`max_payload_len`, default 64 MiB).
    pub max_payload_len: u64,
}

impl FrameLimits {
    /// Default `max_body_len`.
    pub const DEFAULT_MAX_BODY_LEN: u32 = 256 * 1024;
    /// Default `max_payload_len`.
    pub const DEFAULT_MAX_PAYLOAD_LEN: u64 = 64 * 1024 * 1024;
}

impl Default for FrameLimits {
    fn default() -> Self {
        FrameLimits {
            max_body_len: Self::DEFAULT_MAX_BODY_LEN,
            max_payload_len: Self::DEFAULT_MAX_PAYLOAD_LEN,
        }
    }
}

/// Why a frame was refused. Each of these closes the connection with a GOAWAY whose body
/// is this error's text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// Fewer than 48 bytes.
    #[error("truncated header: {have} of 48 bytes")]
    Truncated {
        /// Bytes present.
        have: usize,
    },
    /// First two bytes are not `HM`.
    #[error("bad magic {0:#06x} (expected 0x484d \"HM\"); is the peer speaking HMC RPC?")]
    BadMagic(u16),
    /// Unsupported version.
    #[error("unsupported protocol version {0} (this peer speaks version 1)")]
    BadVersion(u8),
    /// Header length field is not 48.
    #[error("header length {0} is not 48 (protocol v1)")]
    BadHeaderLen(u16),
    /// Header CRC mismatch.
    #[error("header CRC32C mismatch: header says {want:#010x}, bytes give {got:#010x}")]
    HeaderCrc {
        /// CRC carried in the header.
        want: u32,
        /// CRC computed over bytes 0..44.
        got: u32,
    },
    /// Unknown frame kind.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// Unknown payload mode.
    #[error("unknown payload mode {0}")]
    UnknownMode(u8),
    /// Reserved flag bits set.
    #[error("reserved flag bits set in {0:#04x} (only END=1 and ONE_WAY=2 are defined)")]
    ReservedFlags(u8),
    /// Body longer than `max_body_len`.
    #[error(
        "limit `max_body_len` exceeded: body of {len} bytes > {max}; raise FrameLimits::max_body_len on both peers"
    )]
    BodyTooLarge {
        /// Body length announced.
        len: u32,
        /// The limit.
        max: u32,
    },
    /// Payload CRC mismatch.
    #[error(
        "payload CRC32C mismatch on request {request_id}: header says {want:#010x}, bytes give {got:#010x}"
    )]
    PayloadCrc {
        /// Request the payload belongs to.
        request_id: u64,
        /// CRC carried.
        want: u32,
        /// CRC computed.
        got: u32,
    },
    /// Fields that contradict each other.
    #[error("inconsistent frame: {0}")]
    Inconsistent(&'static str),
}

impl From<FrameError> for hmc_core::Error {
    fn from(e: FrameError) -> Self {
        hmc_core::Error::Protocol(e.to_string())
    }
}

/// Appends one complete frame (header + body) to `out`.
pub fn encode_frame(out: &mut Vec<u8>, header: &FrameHeader, body: &[u8]) {
    debug_assert_eq!(header.body_len as usize, body.len());
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(body);
}

/// CRC32C (Castagnoli, the protocol's checksum) of `bytes`.
///
/// `crc-fast` folds with carry-less multiplication (VPCLMULQDQ/AVX-512 where the CPU has
/// it, PCLMULQDQ or the SSE4.2 `crc32` instruction otherwise): faster than the `crc32c`
/// crate on this project's machines, which halved the CRCs' share of a pipelined 4 KiB
/// echo's CPU (the measurement is in `docs/log/2026-12-01-benchmark-history.md`).
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(bytes)
}

/// The CRC32C of `a ++ bytes`, given `crc = crc32c(a)`: checks a payload that arrives in
/// pieces without keeping them.
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    // crc-fast keeps the register before the final inversion: CRC-32C's final XOR is
    // all ones, so the register after `a` is `!crc32c(a)`.
    let mut d =
        crc_fast::Digest::new_with_init_state(crc_fast::CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    d.update(bytes);
    d.finalize() as u32
}

/// CRC32C of a payload as carried in the header: never 0, so that 0 keeps meaning
/// "not computed" (a real CRC of 0 is sent as 0xFFFF_FFFF, documented in protocol.md).
pub fn payload_crc(bytes: &[u8]) -> u32 {
    match crc32c(bytes) {
        0 => u32::MAX,
        c => c,
    }
}

/// Checks a payload CRC carried in a header (`0` = not computed = accepted).
pub fn check_payload_crc(request_id: u64, want: u32, bytes: &[u8]) -> Result<(), FrameError> {
    if want == 0 {
        return Ok(());
    }
    let got = payload_crc(bytes);
    if got != want {
        return Err(FrameError::PayloadCrc {
            request_id,
            want,
            got,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn sample() -> FrameHeader {
        FrameHeader {
            kind: FrameKind::Request,
            mode: PayloadMode::Inline,
            flags: Flags(0),
            request_id: 0x0102_0304_0506_0708,
            method_id: 2,
            status: Status::OK,
            payload_len: 5,
            body_len: 5,
            deadline_us: 1_000_000,
            payload_crc: payload_crc(b"hello"),
        }
    }

    #[test]
    fn header_round_trips_big_endian() {
        let h = sample();
        let b = h.encode();
        assert_eq!(&b[0..3], &[0x48, 0x4D, 1]);
        assert_eq!(&b[8..16], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(FrameHeader::decode(&b, &FrameLimits::default()), Ok(h));
    }

    fn recrc(b: &mut [u8; 48]) {
        let c = crc32c(&b[0..44]);
        b[44..48].copy_from_slice(&c.to_be_bytes());
    }

    #[rstest]
    #[case::magic(0, 0x00, "bad magic")]
    #[case::version(2, 2, "version")]
    #[case::kind(3, 9, "unknown frame kind")]
    #[case::kind_zero(3, 0, "unknown frame kind")]
    #[case::mode(4, 3, "payload mode")]
    #[case::flags(5, 0x04, "reserved flag")]
    #[case::header_len(7, 64, "header length")]
    fn malformed_field_is_refused_with_its_reason(
        #[case] at: usize,
        #[case] value: u8,
        #[case] reason: &str,
    ) {
        let mut b = sample().encode();
        b[at] = value;
        recrc(&mut b);
        let e = FrameHeader::decode(&b, &FrameLimits::default()).unwrap_err();
        assert!(e.to_string().contains(reason), "{e}");
    }

    #[test]
    fn header_crc_mismatch_is_refused() {
        let mut b = sample().encode();
        b[17] ^= 1;
        let e = FrameHeader::decode(&b, &FrameLimits::default()).unwrap_err();
        assert!(matches!(e, FrameError::HeaderCrc { .. }), "{e}");
    }

    #[test]
    fn truncated_header_is_refused() {
        let b = sample().encode();
        assert_eq!(
            FrameHeader::decode(&b[..47], &FrameLimits::default()),
            Err(FrameError::Truncated { have: 47 })
        );
    }

    #[test]
    fn body_over_limit_names_the_limit() {
        let mut h = sample();
        h.mode = PayloadMode::TcpStream;
        h.kind = FrameKind::Data;
        h.payload_len = 1 << 30;
        h.body_len = 300_000;
        let e = FrameHeader::decode(&h.encode(), &FrameLimits::default()).unwrap_err();
        assert!(e.to_string().contains("max_body_len"), "{e}");
    }

    #[rstest]
    #[case::inline_mismatch(FrameKind::Request, PayloadMode::Inline, 6, 5)]
    #[case::inline_too_big(FrameKind::Request, PayloadMode::Inline, 5000, 5000)]
    #[case::stream_with_body(FrameKind::Response, PayloadMode::TcpStream, 10_000, 10)]
    #[case::data_not_stream(FrameKind::Data, PayloadMode::Inline, 10, 10)]
    #[case::data_longer_than_payload(FrameKind::Data, PayloadMode::TcpStream, 10, 11)]
    #[case::ping_with_body(FrameKind::Ping, PayloadMode::Inline, 1, 1)]
    fn inconsistent_lengths_are_refused(
        #[case] kind: FrameKind,
        #[case] mode: PayloadMode,
        #[case] payload_len: u64,
        #[case] body_len: u32,
    ) {
        let mut h = sample();
        h.kind = kind;
        h.mode = mode;
        h.payload_len = payload_len;
        h.body_len = body_len;
        let e = FrameHeader::decode(&h.encode(), &FrameLimits::default()).unwrap_err();
        assert!(matches!(e, FrameError::Inconsistent(_)), "{e}");
    }

    #[test]
    fn crc_is_castagnoli() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    /// Against an independent implementation (the `crc32c` crate): every length below 600
    /// bytes and a few around the SIMD kernels' block sizes, whole and split at eight cut
    /// points (empty halves, odd offsets, the middle).
    #[test]
    fn crc_matches_an_independent_implementation_whole_and_in_pieces() {
        let data: Vec<u8> = (0..70_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in (0..600).chain([1023, 1024, 1025, 4095, 4096, 4097, 65_536, 70_000]) {
            let d = &data[..len];
            let want = ::crc32c::crc32c(d);
            assert_eq!(crc32c(d), want, "length {len}");
            for cut in [0, 1, 7, 64, 255, len / 2, len.saturating_sub(1), len] {
                let cut = cut.min(len);
                let (a, b) = d.split_at(cut);
                assert_eq!(
                    crc32c_append(crc32c(a), b),
                    want,
                    "length {len} cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn payload_crc_zero_means_not_computed() {
        assert!(check_payload_crc(1, 0, b"anything").is_ok());
        assert!(check_payload_crc(1, payload_crc(b"abc"), b"abc").is_ok());
        assert!(check_payload_crc(1, payload_crc(b"abc"), b"abd").is_err());
        assert_ne!(payload_crc(b""), 0);
    }

    #[test]
    fn status_names_follow_the_protocol() {
        assert_eq!(Status::OVERLOADED.to_string(), "OVERLOADED");
        assert_eq!(Status(1234).to_string(), "APP(1234)");
        assert_eq!(Status(50).to_string(), "RESERVED(50)");
    }

    #[rstest]
    #[case::none(Flags(0), "Flags(NONE)")]
    #[case::end(Flags::END, "Flags(END)")]
    #[case::both(Flags::END | Flags::ONE_WAY, "Flags(END | ONE_WAY)")]
    #[case::unknown_bits(Flags(0x81), "Flags(END | 0x80)")]
    fn flags_debug_names_the_bits(#[case] flags: Flags, #[case] debug: &str) {
        assert_eq!(format!("{flags:?}"), debug);
    }
}
