//! Region tickets: a peer's address and one of its region descriptors as one line of text, to hand a region to another process on a command line or through a metadata store.
//!
//! A [`RemoteRegion`] alone is bytes and says nothing about where its owner listens; a
//! [`PeerAddr`] alone names no memory. A [`RegionTicket`] carries both, and its text form
//! is `hmc-region:<peer address>#<descriptor>`, the descriptor being the
//! [`RemoteRegion::encode`] bytes in unpadded base64url (RFC 4648 §5), for example
//! `hmc-region:tcp://10.0.0.7:7000#AQEAAwAAAAAAAH8...`. The address stays readable; the
//! descriptor carries its own version byte, so a future descriptor version needs no new
//! ticket form. A ticket grants what the descriptor's key grants: treat it like the key.

use std::fmt;
use std::str::FromStr;

use crate::{Error, PeerAddr, RemoteRegion, Result};

/// A peer's address and a region it exported: everything another process needs to
/// [`Communicator::connect`](crate::Communicator::connect) and
/// [`Communicator::import`](crate::Communicator::import).
///
/// ```
/// use hmc_core::{Access, Device, Region, RegionTicket, RemoteRegion, TransportId};
///
/// let region = RemoteRegion {
///     transport: TransportId::TCP,
///     region: Region { device: Device::HOST, addr: 0x7f00_0000, len: 4096 },
///     access: Access::READ,
///     key: vec![7; 16],
/// };
/// let ticket = RegionTicket::new("tcp://127.0.0.1:7000".parse()?, region);
/// let text = ticket.to_string();
/// assert!(text.starts_with("hmc-region:tcp://127.0.0.1:7000#"));
/// assert_eq!(text.parse::<RegionTicket>()?, ticket);
/// # Ok::<(), hmc_core::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RegionTicket {
    /// Where the region's owner listens.
    pub peer: PeerAddr,
    /// The owner's descriptor of the region.
    pub region: RemoteRegion,
}

impl RegionTicket {
    /// What every ticket's text starts with.
    pub const PREFIX: &'static str = "hmc-region:";

    /// A ticket for `region`, owned by the peer listening at `peer`.
    pub fn new(peer: PeerAddr, region: RemoteRegion) -> Self {
        RegionTicket { peer, region }
    }
}

impl fmt::Display for RegionTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}#", Self::PREFIX, self.peer)?;
        f.write_str(&base64url::encode(&self.region.encode()))
    }
}

impl FromStr for RegionTicket {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = |why: String| {
            Error::InvalidArgument(format!(
                "`{}` is not a region ticket ({}<peer address>#<base64url descriptor>, as \
                 RegionTicket's Display writes it): {why}",
                shorten(s),
                Self::PREFIX
            ))
        };
        let rest = s
            .strip_prefix(Self::PREFIX)
            .ok_or_else(|| bad(format!("it does not start with `{}`", Self::PREFIX)))?;
        // base64url has no `#`, so the last one ends the address (a Unix path may hold one).
        let (peer, descriptor) = rest
            .rsplit_once('#')
            .ok_or_else(|| bad("no `#` before the descriptor".into()))?;
        // A descriptor is at most its header plus the largest key: refuse longer text
        // before decoding any of it.
        let max_text = (RemoteRegion::MAX_KEY_LEN + 64).div_ceil(3) * 4;
        if descriptor.len() > max_text {
            return Err(bad(format!(
                "the descriptor is {} characters, more than the {max_text} of the largest one",
                descriptor.len()
            )));
        }
        let peer = peer.parse::<PeerAddr>().map_err(|e| bad(e.to_string()))?;
        let bytes = base64url::decode(descriptor).map_err(bad)?;
        let region = RemoteRegion::decode(&bytes).map_err(|e| bad(e.to_string()))?;
        Ok(RegionTicket { peer, region })
    }
}

/// The start of a long input, for error messages.
fn shorten(s: &str) -> String {
    const SHOWN: usize = 80;
    match s.char_indices().nth(SHOWN) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

/// Unpadded base64url (RFC 4648 §5), strict on decode: no padding, no whitespace, and the
/// unused bits of the last character must be zero, so every text has one decoding and
/// every byte string one text.
mod base64url {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

    pub(super) fn encode(bytes: &[u8]) -> String {
        let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
        for chunk in bytes.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
            // 1, 2 or 3 bytes make 2, 3 or 4 characters.
            for i in 0..=chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            }
        }
        out
    }

    fn value(c: u8) -> Option<u32> {
        Some(u32::from(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return None,
        }))
    }

    pub(super) fn decode(text: &str) -> Result<Vec<u8>, String> {
        if text.len() % 4 == 1 {
            return Err(format!(
                "the descriptor's {} characters cannot be base64url (one too many or too few)",
                text.len()
            ));
        }
        let mut out = Vec::with_capacity(text.len() / 4 * 3 + 2);
        for chunk in text.as_bytes().chunks(4) {
            let mut n = 0u32;
            for (i, c) in chunk.iter().enumerate() {
                let v = value(*c).ok_or_else(|| {
                    format!(
                        "`{}` is not a base64url character (A-Z a-z 0-9 - _, no padding)",
                        c.escape_ascii()
                    )
                })?;
                n |= v << (18 - 6 * i);
            }
            let len = chunk.len() - 1;
            // The bits below the last whole byte must be zero, or two texts would decode
            // to the same bytes.
            if n & ((1 << (24 - 8 * len)) - 1) != 0 {
                return Err("the descriptor's last character has stray bits".into());
            }
            out.extend((0..len).map(|i| (n >> (16 - 8 * i)) as u8));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Access, Device, DeviceKind, Region, TransportId};
    use rstest::rstest;

    fn region(key_len: usize) -> RemoteRegion {
        RemoteRegion {
            transport: TransportId::UCX,
            region: Region {
                device: Device::new(DeviceKind::CUDA, 2),
                addr: 0x7f12_3456_0000,
                len: 64 << 20,
            },
            access: Access::READ_WRITE,
            key: (0..key_len).map(|i| (i * 37) as u8).collect(),
        }
    }

    #[rstest]
    #[case::tcp_v4("tcp://10.0.0.7:7000")]
    #[case::tcp_v6("tcp://[::1]:9")]
    #[case::unix("unix:///run/hmc/peer.sock")]
    #[case::unix_with_hash("unix:///tmp/a#b.sock")]
    #[case::opaque("2:00ff10")]
    fn tickets_round_trip_through_text(
        #[case] peer: &str,
        #[values(0, 1, 2, 3, 40, 4096)] key_len: usize,
    ) {
        let ticket = RegionTicket::new(peer.parse().unwrap(), region(key_len));
        let text = ticket.to_string();
        assert!(text.starts_with(&format!("hmc-region:{peer}#")), "{text}");
        assert!(!text.contains('='), "no padding: {text}");
        assert_eq!(text.parse::<RegionTicket>().unwrap(), ticket);
    }

    #[test]
    fn base64url_matches_rfc_4648_vectors() {
        for (bytes, text) in [
            (&b""[..], ""),
            (b"f", "Zg"),
            (b"fo", "Zm8"),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg"),
            (b"fooba", "Zm9vYmE"),
            (b"foobar", "Zm9vYmFy"),
            (&[0xfb, 0xff, 0xbf], "-_-_"),
        ] {
            assert_eq!(base64url::encode(bytes), text);
            assert_eq!(base64url::decode(text).unwrap(), bytes);
        }
    }

    #[rstest]
    #[case::no_prefix("tcp://10.0.0.7:7000#AQ", "does not start with")]
    #[case::no_hash("hmc-region:tcp://10.0.0.7:7000", "no `#`")]
    #[case::bad_peer("hmc-region:10.0.0.7:7000#AQ", "not a peer address")]
    #[case::padding("hmc-region:tcp://10.0.0.7:7000#AQ==", "not a base64url character")]
    #[case::standard_alphabet("hmc-region:tcp://10.0.0.7:7000#A+/A", "not a base64url character")]
    #[case::whitespace("hmc-region:tcp://10.0.0.7:7000#AQ B", "not a base64url character")]
    #[case::one_char_too_many("hmc-region:tcp://10.0.0.7:7000#AQIDB", "one too many")]
    #[case::stray_bits("hmc-region:tcp://10.0.0.7:7000#AR", "stray bits")]
    #[case::short_descriptor("hmc-region:tcp://10.0.0.7:7000#AQID", "shorter than")]
    fn malformed_tickets_are_refused_saying_why(#[case] text: &str, #[case] why: &str) {
        let err = text.parse::<RegionTicket>().unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
        assert!(
            msg.contains(why) && msg.contains("hmc-region:<peer address>"),
            "{msg}"
        );
    }

    #[test]
    fn a_damaged_descriptor_is_refused_by_the_descriptor_check() {
        let text = RegionTicket::new("tcp://10.0.0.7:7000".parse().unwrap(), region(8)).to_string();
        // Drop the last four characters (three key bytes): the key length no longer matches.
        let err = text[..text.len() - 4].parse::<RegionTicket>().unwrap_err();
        assert!(err.to_string().contains("key length 8"), "{err}");
    }

    #[test]
    fn an_oversized_descriptor_is_refused_before_decoding() {
        let text = format!("hmc-region:tcp://10.0.0.7:7000#{}", "A".repeat(200_000));
        let err = text.parse::<RegionTicket>().unwrap_err().to_string();
        assert!(err.contains("more than the") && err.contains('…'), "{err}");
    }
}
