//! Pure pieces without verbs calls: the versioned connection record peers exchange, the exported key's bytes, GID ranking, and splitting a batch into work requests.

use hmc_core::{Error, Result};

/// What one side tells the other about one of its QPs: enough to walk the peer's QP to RTR.
///
/// Encoded (version 1, big-endian, 29 bytes): version `u8`, port `u8`, gid `[u8; 16]`,
/// lid `u16`, qpn `u32`, psn `u32` (24 bits used), mtu `u8` (`enum ibv_mtu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnRecord {
    /// The sender's port number.
    pub port: u8,
    /// The GID its QP sends from (what the peer puts in its address vector).
    pub gid: [u8; 16],
    /// Its LID (InfiniBand link layer; 0 on RoCE).
    pub lid: u16,
    /// Its QP number (24 bits).
    pub qpn: u32,
    /// The first PSN it sends with (24 bits).
    pub psn: u32,
    /// The largest path MTU it accepts (`enum ibv_mtu`: 1 = 256 … 5 = 4096).
    pub mtu: u8,
}

impl ConnRecord {
    /// The record format version.
    pub const VERSION: u8 = 1;
    /// Encoded length.
    pub const LEN: usize = 1 + 1 + 16 + 2 + 4 + 4 + 1;

    /// Encodes the record.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[0] = Self::VERSION;
        out[1] = self.port;
        out[2..18].copy_from_slice(&self.gid);
        out[18..20].copy_from_slice(&self.lid.to_be_bytes());
        out[20..24].copy_from_slice(&self.qpn.to_be_bytes());
        out[24..28].copy_from_slice(&self.psn.to_be_bytes());
        out[28] = self.mtu;
        out
    }

    /// Decodes and validates a record: known version, 24-bit QPN and PSN, an MTU from 256
    /// to 4096.
    pub fn decode(b: &[u8]) -> Result<Self> {
        let bad = |why: String| Error::Protocol(format!("RDMA connection record: {why}"));
        if b.len() != Self::LEN {
            return Err(bad(format!("{} bytes, expected {}", b.len(), Self::LEN)));
        }
        if b[0] != Self::VERSION {
            return Err(bad(format!(
                "version {} is not supported (expected {}); run the same hmc-transport-rdma \
                 version on both sides",
                b[0],
                Self::VERSION
            )));
        }
        let be32 = |at: usize| u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let r = ConnRecord {
            port: b[1],
            gid: b[2..18].try_into().expect("16 bytes"),
            lid: u16::from_be_bytes([b[18], b[19]]),
            qpn: be32(20),
            psn: be32(24),
            mtu: b[28],
        };
        if r.qpn > 0xff_ffff || r.psn > 0xff_ffff {
            return Err(bad(format!(
                "qpn {:#x} or psn {:#x} exceeds 24 bits",
                r.qpn, r.psn
            )));
        }
        if !(1..=5).contains(&r.mtu) {
            return Err(bad(format!(
                "mtu code {} is not 1 (256) to 5 (4096)",
                r.mtu
            )));
        }
        Ok(r)
    }
}

/// The packed remote key of an exported region: magic `HRDM`, version `u8`, the
/// registration's random id `u64`, rkey `u32` (big-endian).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyBytes {
    /// Random per registration: the target confirms it at import, so a key cannot be
    /// guessed from another registration's.
    pub reg_id: u64,
    /// The NIC's remote key.
    pub rkey: u32,
}

const KEY_MAGIC: &[u8; 4] = b"HRDM";
const KEY_VERSION: u8 = 1;

impl KeyBytes {
    /// Encoded length.
    pub const LEN: usize = 4 + 1 + 8 + 4;

    /// Encodes the key.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::LEN);
        out.extend_from_slice(KEY_MAGIC);
        out.push(KEY_VERSION);
        out.extend_from_slice(&self.reg_id.to_be_bytes());
        out.extend_from_slice(&self.rkey.to_be_bytes());
        out
    }

    /// Decodes a key, refusing anything this crate did not export.
    pub fn decode(b: &[u8]) -> Result<Self> {
        if b.len() != Self::LEN || &b[..4] != KEY_MAGIC || b[4] != KEY_VERSION {
            return Err(Error::InvalidKey(
                "not an RDMA key exported by hmc-transport-rdma (bad magic, version or length)"
                    .into(),
            ));
        }
        Ok(KeyBytes {
            reg_id: u64::from_be_bytes(b[5..13].try_into().expect("8 bytes")),
            rkey: u32::from_be_bytes(b[13..17].try_into().expect("4 bytes")),
        })
    }
}

/// What kind of GID a table entry is, as far as choosing one goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidKind {
    /// InfiniBand (or a RoCE v1 entry, which the verbs report alike).
    IbOrRoceV1,
    /// RoCE v2 (routable UDP/IP).
    RoceV2,
}

/// The rank of a GID table entry in RoCEv2-first order (lower is better), `None` for an
/// empty entry: RoCE v2 with an IPv4-mapped address, then RoCE v2 with a global IPv6
/// address, then RoCE v2 link-local, then anything else (RoCE v1, InfiniBand), lowest
/// index first within a rank.
pub fn gid_rank(gid: &[u8; 16], kind: GidKind) -> Option<u8> {
    if gid.iter().all(|&b| b == 0) {
        return None;
    }
    let v4_mapped = gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff;
    let link_local = gid[0] == 0xfe && gid[1] & 0xc0 == 0x80;
    Some(match (kind, v4_mapped, link_local) {
        (GidKind::RoceV2, true, _) => 0,
        (GidKind::RoceV2, false, false) => 1,
        (GidKind::RoceV2, false, true) => 2,
        (GidKind::IbOrRoceV1, ..) => 3,
    })
}

/// Picks the GID index in RoCEv2-first order from `(index, gid, kind)` entries.
pub fn choose_gid(entries: &[(u32, [u8; 16], GidKind)]) -> Option<(u32, [u8; 16])> {
    entries
        .iter()
        .filter_map(|(i, g, k)| gid_rank(g, *k).map(|r| (r, *i, *g)))
        .min_by_key(|(r, i, _)| (*r, *i))
        .map(|(_, i, g)| (i, g))
}

/// `enum ibv_mtu` for a byte count (rounded down to a power of two from 256 to 4096).
pub fn mtu_code(bytes: u32) -> u8 {
    match bytes {
        0..=511 => 1,
        512..=1023 => 2,
        1024..=2047 => 3,
        2048..=4095 => 4,
        _ => 5,
    }
}

/// One work request of a batch: `len` bytes between local offset and remote offset of
/// descriptor `desc`, on QP `qp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The descriptor it comes from.
    pub desc: usize,
    /// Offset into the local registration.
    pub local: u64,
    /// Remote address.
    pub remote: u64,
    /// Bytes (at most the message limit).
    pub len: u32,
    /// The QP of the endpoint that carries it.
    pub qp: usize,
}

/// Splits descriptors `(local offset, remote address, len)` into work requests of at most
/// `max_msg` bytes (the port's `max_msg_sz`; a `u32` in the verbs, so a larger descriptor
/// is never truncated into one WR) and stripes them over `qps` QPs: pieces of one
/// descriptor go round-robin in stripes of `stripe` bytes, and small descriptors
/// rotate too, so every QP gets a share of a batch.
pub fn split(descs: &[(u64, u64, u64)], max_msg: u32, stripe: u64, qps: usize) -> Vec<Piece> {
    assert!(max_msg > 0 && qps > 0 && stripe > 0);
    let unit = stripe.min(u64::from(max_msg));
    let mut out = Vec::with_capacity(descs.len());
    let mut next_qp = 0;
    for (i, &(local, remote, len)) in descs.iter().enumerate() {
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(unit);
            out.push(Piece {
                desc: i,
                local: local + done,
                remote: remote + done,
                len: n as u32,
                qp: next_qp,
            });
            next_qp = (next_qp + 1) % qps;
            done += n;
        }
    }
    out
}

/// Packs and unpacks `wr_id`s: (QP generation `u32`, slab slot `u31`, last-of-chain bit).
/// The generation changes whenever a QP is (re-)established, so a completion of an old
/// incarnation or of another endpoint never matches a live slot.
pub mod wr_id {
    /// Packs a `wr_id`.
    pub fn pack(generation: u32, slot: u32, last: bool) -> u64 {
        debug_assert!(slot < 1 << 31);
        (u64::from(generation) << 32) | (u64::from(slot) << 1) | u64::from(last)
    }

    /// Unpacks `(generation, slot, last)`.
    pub fn unpack(id: u64) -> (u32, u32, bool) {
        (
            (id >> 32) as u32,
            ((id & 0xffff_ffff) >> 1) as u32,
            id & 1 == 1,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> ConnRecord {
        ConnRecord {
            port: 1,
            gid: [7; 16],
            lid: 0x1234,
            qpn: 0xab_cdef,
            psn: 0x12_3456,
            mtu: 5,
        }
    }

    #[test]
    fn records_round_trip_and_refuse_damage() {
        let r = record();
        let b = r.encode();
        assert_eq!(ConnRecord::decode(&b).unwrap(), r);
        let mut v2 = b;
        v2[0] = 2;
        assert!(
            ConnRecord::decode(&v2)
                .unwrap_err()
                .to_string()
                .contains("version 2")
        );
        assert!(ConnRecord::decode(&b[..ConnRecord::LEN - 1]).is_err());
        let mut big_qpn = b;
        big_qpn[20] = 1;
        assert!(ConnRecord::decode(&big_qpn).is_err());
        let mut mtu = b;
        mtu[28] = 6;
        assert!(ConnRecord::decode(&mtu).is_err());
    }

    #[test]
    fn keys_round_trip_and_foreign_bytes_are_invalid_keys() {
        let k = KeyBytes {
            reg_id: 0xdead_beef_0123_4567,
            rkey: 0x7e11,
        };
        assert_eq!(KeyBytes::decode(&k.encode()).unwrap(), k);
        let forged: Vec<u8> = k.encode().iter().map(|b| b.wrapping_add(0x5b)).collect();
        assert!(matches!(
            KeyBytes::decode(&forged),
            Err(Error::InvalidKey(_))
        ));
        assert!(KeyBytes::decode(&[]).is_err());
    }

    #[test]
    fn gid_choice_prefers_roce_v2_ipv4_then_ipv6_then_v1() {
        let zero = [0u8; 16];
        let mut v4 = [0u8; 16];
        v4[10] = 0xff;
        v4[11] = 0xff;
        v4[12..].copy_from_slice(&[10, 0, 0, 7]);
        let mut ll = [0u8; 16];
        ll[0] = 0xfe;
        ll[1] = 0x80;
        ll[15] = 1;
        let mut global = [0u8; 16];
        global[0] = 0x20;
        global[1] = 0x01;
        global[15] = 9;
        let table = [
            (0, ll, GidKind::IbOrRoceV1),
            (1, ll, GidKind::RoceV2),
            (2, zero, GidKind::RoceV2),
            (3, global, GidKind::RoceV2),
            (4, v4, GidKind::IbOrRoceV1),
            (5, v4, GidKind::RoceV2),
        ];
        assert_eq!(choose_gid(&table), Some((5, v4)));
        assert_eq!(choose_gid(&table[..4]), Some((3, global)));
        assert_eq!(choose_gid(&table[..3]), Some((1, ll)));
        assert_eq!(choose_gid(&table[..1]), Some((0, ll)));
        assert_eq!(choose_gid(&[(0, zero, GidKind::RoceV2)]), None);
    }

    #[rstest::rstest]
    #[case(256, 1)]
    #[case(1000, 2)]
    #[case(1024, 3)]
    #[case(4096, 5)]
    #[case(9000, 5)]
    fn mtu_codes_round_down(#[case] bytes: u32, #[case] code: u8) {
        assert_eq!(mtu_code(bytes), code);
    }

    #[test]
    fn split_caps_each_piece_at_the_message_limit_and_covers_every_byte() {
        // A descriptor past u32::MAX must not be truncated into one WR.
        let huge = (1u64 << 32) + 5;
        let pieces = split(
            &[(0, 1 << 40, huge), (7, 9, 0), (3, 4, 10)],
            1 << 30,
            1 << 20,
            3,
        );
        assert!(pieces.iter().all(|p| p.len as u64 <= 1 << 20 && p.len > 0));
        let total: u64 = pieces.iter().map(|p| p.len as u64).sum();
        assert_eq!(total, huge + 10);
        // Contiguous, in order, per descriptor.
        let mut at = 0;
        for p in pieces.iter().filter(|p| p.desc == 0) {
            assert_eq!((p.local, p.remote), (at, (1 << 40) + at));
            at += p.len as u64;
        }
        assert_eq!(at, huge);
        // Round-robin over the QPs.
        assert_eq!(
            pieces.iter().take(4).map(|p| p.qp).collect::<Vec<_>>(),
            [0, 1, 2, 0]
        );
        let small = split(&[(0, 0, 100)], 16, 1 << 20, 1);
        assert_eq!(small.len(), 7);
        assert_eq!(small.last().unwrap().len, 4);
    }

    #[test]
    fn wr_ids_round_trip_with_generation_slot_and_last_bit() {
        for (g, s, l) in [
            (0, 0, false),
            (u32::MAX, (1 << 31) - 1, true),
            (7, 12345, true),
        ] {
            assert_eq!(wr_id::unpack(wr_id::pack(g, s, l)), (g, s, l));
        }
        assert_ne!(wr_id::pack(1, 5, true), wr_id::pack(2, 5, true));
    }
}
