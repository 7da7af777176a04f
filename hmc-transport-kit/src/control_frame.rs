//! Blocking control frames, `kind u8, length u32 (big-endian), payload`: the side channel
//! of the UCX and RDMA transports (their handshakes, key checks, revocations and
//! notifications), read on plain threads. The length is checked against the reader's limit
//! from the 5-byte header, before any of the payload is read or allocated.

use std::io::{self, Read, Write};

/// Bytes of a frame header: the kind and the payload length.
pub const HEADER_LEN: usize = 5;

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, kind: u8, payload: &[u8]) -> io::Result<()> {
    let mut buf = Vec::with_capacity(HEADER_LEN + payload.len());
    buf.push(kind);
    buf.extend_from_slice(&payload_len(payload.len())?.to_be_bytes());
    buf.extend_from_slice(payload);
    w.write_all(&buf)
}

/// Writes one frame whose payload is `parts` one after the other (a data frame's header
/// and its bytes, without copying the bytes into one buffer). A first part of at most 64
/// bytes goes out with the frame header in one write.
pub fn write_frame_parts(w: &mut impl Write, kind: u8, parts: &[&[u8]]) -> io::Result<()> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let mut head = Vec::with_capacity(HEADER_LEN + parts.first().map_or(0, |p| p.len()));
    head.push(kind);
    head.extend_from_slice(&payload_len(len)?.to_be_bytes());
    let rest = match parts.split_first() {
        Some((first, rest)) if first.len() <= 64 => {
            head.extend_from_slice(first);
            rest
        }
        _ => parts,
    };
    w.write_all(&head)?;
    for p in rest {
        w.write_all(p)?;
    }
    Ok(())
}

/// Reads one frame, refusing from its header one whose payload exceeds `max_frame`
/// (`InvalidData`, naming both).
pub fn read_frame(r: &mut impl Read, max_frame: usize) -> io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; HEADER_LEN];
    r.read_exact(&mut head)?;
    let len = u32::from_be_bytes(head[1..5].try_into().expect("4 bytes")) as usize;
    if len > max_frame {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("control frame of {len} bytes exceeds {max_frame}"),
        ));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok((head[0], payload))
}

fn payload_len(len: usize) -> io::Result<u32> {
    u32::try_from(len).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a control frame's payload of {len} bytes exceeds the format's 4 GiB"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_whole_and_in_parts() {
        let mut wire = Vec::new();
        write_frame(&mut wire, 7, b"hello").unwrap();
        write_frame_parts(&mut wire, 9, &[b"head", &[1u8; 100], b""]).unwrap();
        write_frame_parts(&mut wire, 3, &[&[2u8; 65], b"tail"]).unwrap();
        let mut r = &wire[..];
        assert_eq!(read_frame(&mut r, 1 << 10).unwrap(), (7, b"hello".to_vec()));
        let (kind, p) = read_frame(&mut r, 1 << 10).unwrap();
        assert_eq!((kind, p.len(), &p[..4]), (9, 104, &b"head"[..]));
        let (kind, p) = read_frame(&mut r, 1 << 10).unwrap();
        assert_eq!((kind, p.len(), &p[65..]), (3, 69, &b"tail"[..]));
        assert!(r.is_empty());
    }

    #[test]
    fn an_oversized_frame_is_refused_from_its_header() {
        let mut wire = vec![1u8];
        wire.extend_from_slice(&(1025u32).to_be_bytes());
        // No payload follows: the refusal must not wait for it.
        let e = read_frame(&mut &wire[..], 1024).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("1025 bytes exceeds 1024"), "{e}");
    }
}
