//! Connection settings: what a server tells a client on request (its data-plane
//! transports, limits and protocol features), so that a client chooses how to send
//! instead of learning from refusals. Optional in both directions: a v1 peer that never
//! asks keeps working unchanged, and a v1 server answers the request UNKNOWN_METHOD, which
//! tells the client there is nothing to negotiate (normative text: `docs/protocol.md`,
//! "Connection settings").
//!
//! The exchange is an ordinary INLINE call on the reserved method [`SETTINGS_METHOD`];
//! its request and response bodies are [`Settings`] encoded as entries of `u16` key,
//! `u16` length and value (big-endian). Keys are only ever added; a receiver ignores keys
//! it does not know, so the format needs no version of its own.

/// Method ids from this one up belong to the protocol, not to services.
pub const RESERVED_METHODS: u32 = 0xFFFF_FF00;

/// The settings exchange's method id (the first reserved one).
pub const SETTINGS_METHOD: u32 = RESERVED_METHODS;

/// Protocol feature bits ([`Settings::features`]).
pub mod features {
    /// The sender understands the settings exchange.
    pub const SETTINGS: u64 = 1 << 0;
    /// The server answers every call received before a client's FIN (half-close).
    pub const HALF_CLOSE: u64 = 1 << 1;
    /// The server charges held bytes against budgets and answers OVERLOADED beyond them.
    pub const HELD_BYTE_BUDGETS: u64 = 1 << 2;
}

const KEY_FEATURES: u16 = 1;
const KEY_DATA_PLANES: u16 = 2;
const KEY_DATA_PLANE_THRESHOLD: u16 = 3;
const KEY_MAX_PAYLOAD_LEN: u16 = 4;
const KEY_MAX_INFLIGHT: u16 = 5;
const KEY_MAX_BODY_LEN: u16 = 6;

/// One side's settings. Fields a peer did not send are `None` (or empty).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// Bits of [`features`].
    pub features: u64,
    /// Wire ids of the transports the sender's data plane speaks (the server: what its
    /// HMC_BUFFER path can pull from; empty: no data plane).
    pub data_planes: Vec<u16>,
    /// Payloads from this many bytes move over the data plane (`data_plane_threshold`).
    pub data_plane_threshold: Option<u64>,
    /// The largest payload the sender accepts (`max_payload_len`).
    pub max_payload_len: Option<u64>,
    /// Calls in flight the sender accepts on the connection (`max_inflight_per_conn`).
    pub max_inflight: Option<u32>,
    /// The largest frame body the sender accepts (`max_body_len`).
    pub max_body_len: Option<u32>,
}

impl Settings {
    /// The entries, in key order.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut put = |key: u16, value: &[u8]| {
            out.extend_from_slice(&key.to_be_bytes());
            out.extend_from_slice(&(value.len() as u16).to_be_bytes());
            out.extend_from_slice(value);
        };
        put(KEY_FEATURES, &self.features.to_be_bytes());
        let planes: Vec<u8> = self
            .data_planes
            .iter()
            .flat_map(|t| t.to_be_bytes())
            .collect();
        put(KEY_DATA_PLANES, &planes);
        if let Some(v) = self.data_plane_threshold {
            put(KEY_DATA_PLANE_THRESHOLD, &v.to_be_bytes());
        }
        if let Some(v) = self.max_payload_len {
            put(KEY_MAX_PAYLOAD_LEN, &v.to_be_bytes());
        }
        if let Some(v) = self.max_inflight {
            put(KEY_MAX_INFLIGHT, &v.to_be_bytes());
        }
        if let Some(v) = self.max_body_len {
            put(KEY_MAX_BODY_LEN, &v.to_be_bytes());
        }
        out
    }

    /// Decodes entries; unknown keys are skipped, a known key of the wrong length, a
    /// repeated key or a truncated entry is refused.
    pub fn decode(mut b: &[u8]) -> Result<Settings, String> {
        let mut s = Settings::default();
        let mut seen = std::collections::BTreeSet::new();
        while !b.is_empty() {
            if b.len() < 4 {
                return Err(format!(
                    "settings: {} bytes left, an entry needs 4",
                    b.len()
                ));
            }
            let key = u16::from_be_bytes([b[0], b[1]]);
            let len = u16::from_be_bytes([b[2], b[3]]) as usize;
            let v = b.get(4..4 + len).ok_or_else(|| {
                format!(
                    "settings: key {key} announces {len} bytes, {} remain",
                    b.len() - 4
                )
            })?;
            b = &b[4 + len..];
            if !seen.insert(key) {
                return Err(format!("settings: key {key} appears twice"));
            }
            let fixed = |n: usize| {
                if v.len() == n {
                    Ok(v)
                } else {
                    Err(format!(
                        "settings: key {key} has {} bytes, not {n}",
                        v.len()
                    ))
                }
            };
            let u64_of = |v: &[u8]| u64::from_be_bytes(v.try_into().expect("8 bytes"));
            let u32_of = |v: &[u8]| u32::from_be_bytes(v.try_into().expect("4 bytes"));
            match key {
                KEY_FEATURES => s.features = u64_of(fixed(8)?),
                KEY_DATA_PLANES => {
                    if v.len() % 2 != 0 {
                        return Err("settings: data-plane ids are 2 bytes each".into());
                    }
                    s.data_planes = v
                        .chunks_exact(2)
                        .map(|c| u16::from_be_bytes([c[0], c[1]]))
                        .collect();
                }
                KEY_DATA_PLANE_THRESHOLD => s.data_plane_threshold = Some(u64_of(fixed(8)?)),
                KEY_MAX_PAYLOAD_LEN => s.max_payload_len = Some(u64_of(fixed(8)?)),
                KEY_MAX_INFLIGHT => s.max_inflight = Some(u32_of(fixed(4)?)),
                KEY_MAX_BODY_LEN => s.max_body_len = Some(u32_of(fixed(4)?)),
                _ => {} // a newer peer's key
            }
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip_and_unknown_keys_are_skipped() {
        let s = Settings {
            features: features::SETTINGS | features::HALF_CLOSE,
            data_planes: vec![1, 300],
            data_plane_threshold: Some(64 << 10),
            max_payload_len: Some(64 << 20),
            max_inflight: Some(64),
            max_body_len: Some(256 << 10),
        };
        let mut b = s.encode();
        assert_eq!(Settings::decode(&b).unwrap(), s);
        // A newer peer's key 99 with 3 bytes, in the middle.
        b.splice(12..12, [0, 99, 0, 3, 1, 2, 3]);
        assert_eq!(Settings::decode(&b).unwrap(), s);
        assert_eq!(Settings::decode(&[]).unwrap(), Settings::default());
    }

    #[test]
    fn malformed_settings_are_refused() {
        let e = Settings::decode(&[0, 1, 0, 4, 0, 0, 0, 0]).unwrap_err();
        assert!(e.contains("not 8"), "{e}");
        assert!(Settings::decode(&[0, 1, 0, 8, 0]).is_err(), "truncated");
        assert!(Settings::decode(&[0, 2]).is_err(), "short entry");
        assert!(
            Settings::decode(&[0, 2, 0, 1, 7]).is_err(),
            "odd data-plane list"
        );
        let twice = [Settings::default().encode(), Settings::default().encode()].concat();
        assert!(Settings::decode(&twice).unwrap_err().contains("twice"));
    }
}
