//! What the tests that speak the data-plane wire by hand share: the HELLO exchange and reading a target's status.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Says a version-1 HELLO on `s` and checks that the target admitted it.
pub async fn hello(s: &mut (impl AsyncRead + AsyncWrite + Unpin)) {
    let me = b"tcp://127.0.0.1:9";
    let mut hello = b"HMTC\x01".to_vec();
    hello.extend_from_slice(&(me.len() as u16).to_be_bytes());
    hello.extend_from_slice(me);
    s.write_all(&hello).await.unwrap();
    let mut head = [0u8; 8];
    s.read_exact(&mut head).await.unwrap();
    assert_eq!(&head[..5], b"HMTC\x01");
    assert_eq!(head[5], 0, "HELLO admitted");
    let mut addr = vec![0u8; u16::from_be_bytes([head[6], head[7]]) as usize];
    s.read_exact(&mut addr).await.unwrap();
}

/// Reads a status: `None` for success, else the error code and message.
pub async fn status(s: &mut (impl AsyncRead + Unpin)) -> Option<(u8, String)> {
    let code = s.read_u8().await.unwrap();
    if code == 0 {
        return None;
    }
    let mut nums = [0u8; 24];
    s.read_exact(&mut nums).await.unwrap();
    let mut msg = vec![0u8; s.read_u16().await.unwrap() as usize];
    s.read_exact(&mut msg).await.unwrap();
    Some((code, String::from_utf8_lossy(&msg).into_owned()))
}
