//! Length-prefixed frames for a side channel: a 12-byte header (`u32` body length, `u64` request id, big-endian) and the body, with a named size limit checked from the header, before any of the body is read.

use hmc_core::{Deadline, Error, Result};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Bytes of a frame header.
pub const HEADER_LEN: usize = 12;

/// The default `max_frame_len`.
pub const DEFAULT_MAX_FRAME_LEN: usize = 1 << 20;

fn io(what: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::io(format!("side channel: {what}"), e)
}

/// Writes one frame (`id`, `body`).
pub async fn write_frame(w: &mut (impl AsyncWrite + Unpin), id: u64, body: &[u8]) -> Result<()> {
    let len = u32::try_from(body.len()).map_err(|_| Error::LimitExceeded {
        limit: "frame length",
        value: body.len() as u64,
        max: u32::MAX as u64,
        hint: "a frame body is at most 4 GiB; send larger data with a transfer".into(),
    })?;
    let mut header = [0u8; HEADER_LEN];
    header[..4].copy_from_slice(&len.to_be_bytes());
    header[4..].copy_from_slice(&id.to_be_bytes());
    w.write_all(&header).await.map_err(io("writing a header"))?;
    w.write_all(body).await.map_err(io("writing a body"))?;
    w.flush().await.map_err(io("flushing"))
}

/// Reads one frame, refusing from its header one whose body exceeds `max_frame_len`.
/// `Ok(None)`: the peer closed cleanly between frames.
pub async fn read_frame(
    r: &mut (impl AsyncRead + Unpin),
    max_frame_len: usize,
) -> Result<Option<(u64, Vec<u8>)>> {
    let mut header = [0u8; HEADER_LEN];
    match r.read_exact(&mut header).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(io("reading a header")(e)),
    }
    let len = u32::from_be_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    let id = u64::from_be_bytes(header[4..].try_into().expect("8 bytes"));
    if len > max_frame_len {
        return Err(Error::LimitExceeded {
            limit: "max_frame_len",
            value: len as u64,
            max: max_frame_len as u64,
            hint:
                "raise max_frame_len on the receiving side (the frame was refused from its header)"
                    .into(),
        });
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)
        .await
        .map_err(io("reading a body"))?;
    Ok(Some((id, body)))
}

/// [`read_frame`] that ends with `DeadlineExceeded` at `deadline`.
pub async fn read_frame_by(
    r: &mut (impl AsyncRead + Unpin),
    max_frame_len: usize,
    deadline: Deadline,
) -> Result<Option<(u64, Vec<u8>)>> {
    let start = std::time::Instant::now();
    tokio::time::timeout_at(deadline.instant().into(), read_frame(r, max_frame_len))
        .await
        .map_err(|_| Error::DeadlineExceeded {
            during: "reading a side-channel frame",
            elapsed: start.elapsed(),
        })?
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn frames_round_trip_and_oversized_ones_are_refused_from_the_header() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        write_frame(&mut a, 7, b"hello").await.unwrap();
        write_frame(&mut a, 8, &[1u8; 100]).await.unwrap();
        assert_eq!(
            read_frame(&mut b, 64).await.unwrap(),
            Some((7, b"hello".to_vec()))
        );
        let e = read_frame(&mut b, 64).await.unwrap_err();
        assert!(
            matches!(
                e,
                Error::LimitExceeded {
                    limit: "max_frame_len",
                    value: 100,
                    max: 64,
                    ..
                }
            ),
            "{e:?}"
        );
        drop(a);
        let (mut c, mut d) = tokio::io::duplex(64);
        drop(c.shutdown().await);
        drop(c);
        assert_eq!(read_frame(&mut d, 64).await.unwrap(), None, "a clean close");
    }

    #[tokio::test]
    async fn a_silent_peer_ends_the_read_by_its_deadline() {
        let (_a, mut b) = tokio::io::duplex(64);
        let e = read_frame_by(&mut b, 64, Deadline::after(Duration::from_millis(50)))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::DeadlineExceeded { .. }), "{e:?}");
    }
}
