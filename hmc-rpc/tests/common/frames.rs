//! Frames written and read by hand, for the tests that speak the wire protocol as a raw
//! client over a plain TCP connection.

use std::time::Duration;

use hmc_core::PeerAddr;
use hmc_rpc::demo;
use hmc_rpc::frame::{FrameHeader, FrameKind, FrameLimits, HEADER_LEN, PayloadMode, payload_crc};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A request frame as a raw client writes it: header (with the body's CRC), then `body`.
pub fn request(id: u64, method: u32, body: &[u8]) -> Vec<u8> {
    let mut h = FrameHeader::new(FrameKind::Request, id);
    h.method_id = method;
    h.payload_len = body.len() as u64;
    h.body_len = body.len() as u32;
    h.payload_crc = payload_crc(body);
    let mut v = h.encode().to_vec();
    v.extend_from_slice(body);
    v
}

/// An HMC_BUFFER descriptor body as `docs/protocol.md` specifies it: the address to
/// answer at, then the request region's encoding (and the response region's, if any), each
/// as given (a test may pass bytes that are no region at all).
pub fn descriptor(reply_to: &PeerAddr, request: &[u8], response: Option<&[u8]>) -> Vec<u8> {
    let addr = reply_to.to_string();
    let mut b = vec![1, u8::from(response.is_some())];
    b.extend_from_slice(&(addr.len() as u16).to_be_bytes());
    b.extend_from_slice(addr.as_bytes());
    for r in std::iter::once(request).chain(response) {
        b.extend_from_slice(&(r.len() as u32).to_be_bytes());
        b.extend_from_slice(r);
    }
    b
}

/// Writes `h`, then `body`, to a raw connection.
pub async fn send_frame(raw: &mut TcpStream, h: FrameHeader, body: &[u8]) {
    let mut b = h.encode().to_vec();
    b.extend_from_slice(body);
    raw.write_all(&b).await.unwrap();
}

/// Sends a `demo::ECHO` request whose payload of `len` bytes goes by HMC_BUFFER, with
/// `body` (a descriptor, or whatever the test forges) as its body.
pub async fn send_buffer_request(raw: &mut TcpStream, id: u64, len: u64, body: &[u8]) {
    let mut h = FrameHeader::new(FrameKind::Request, id);
    h.method_id = demo::ECHO;
    h.mode = PayloadMode::HmcBuffer;
    h.payload_len = len;
    h.body_len = body.len() as u32;
    send_frame(raw, h, body).await;
}

/// One frame (header, then body) from a raw connection; panics unless it comes `within`.
pub async fn read_frame_within(raw: &mut TcpStream, within: Duration) -> (FrameHeader, Vec<u8>) {
    let mut hb = [0u8; HEADER_LEN];
    tokio::time::timeout(within, raw.read_exact(&mut hb))
        .await
        .unwrap_or_else(|_| panic!("a frame within {within:?}"))
        .unwrap();
    let h = FrameHeader::decode(&hb, &FrameLimits::default()).unwrap();
    let mut body = vec![0u8; h.body_len as usize];
    raw.read_exact(&mut body).await.unwrap();
    (h, body)
}
