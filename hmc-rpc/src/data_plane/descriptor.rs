//! The descriptor an HMC_BUFFER REQUEST carries: the client's data-plane address, the
//! request region and the optional response region (`docs/protocol.md`).

use hmc_core::{PeerAddr, RemoteRegion};

/// The body of an HMC_BUFFER REQUEST (see `docs/protocol.md`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BufferDescriptor {
    /// The client's data-plane address (text form, e.g. `tcp://127.0.0.1:40123`).
    pub reply_to: PeerAddr,
    /// The request payload's region (the server READs it).
    pub request: RemoteRegion,
    /// Where the server may WRITE the response.
    pub response: Option<RemoteRegion>,
}

/// Descriptor body version.
pub(super) const DESC_VERSION: u8 = 1;
pub(super) const DESC_HAS_RESPONSE: u8 = 1;

impl BufferDescriptor {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let addr = self.reply_to.to_string();
        let req = self.request.encode();
        let mut out = Vec::with_capacity(64 + addr.len() + 2 * req.len());
        out.push(DESC_VERSION);
        out.push(if self.response.is_some() {
            DESC_HAS_RESPONSE
        } else {
            0
        });
        out.extend_from_slice(&(addr.len() as u16).to_be_bytes());
        out.extend_from_slice(addr.as_bytes());
        out.extend_from_slice(&(req.len() as u32).to_be_bytes());
        out.extend_from_slice(&req);
        if let Some(r) = &self.response {
            let r = r.encode();
            out.extend_from_slice(&(r.len() as u32).to_be_bytes());
            out.extend_from_slice(&r);
        }
        out
    }

    pub(crate) fn decode(b: &[u8]) -> std::result::Result<Self, String> {
        let mut at = 0usize;
        let mut take = |n: usize, what: &str| -> std::result::Result<&[u8], String> {
            let end = at
                .checked_add(n)
                .filter(|e| *e <= b.len())
                .ok_or_else(|| format!("HMC_BUFFER descriptor: {what} runs past the body's end"))?;
            let s = &b[at..end];
            at = end;
            Ok(s)
        };
        let head = take(2, "the header")?;
        if head[0] != DESC_VERSION {
            return Err(format!(
                "HMC_BUFFER descriptor version {} is not supported (expected {DESC_VERSION})",
                head[0]
            ));
        }
        let flags = head[1];
        if flags & !DESC_HAS_RESPONSE != 0 {
            return Err(format!("HMC_BUFFER descriptor: unknown flags {flags:#x}"));
        }
        let n = u16::from_be_bytes(take(2, "the address length")?.try_into().unwrap()) as usize;
        let addr = std::str::from_utf8(take(n, "the address")?)
            .map_err(|_| "HMC_BUFFER descriptor: the address is not UTF-8".to_string())?;
        let reply_to: PeerAddr = addr
            .parse()
            .map_err(|e| format!("HMC_BUFFER descriptor: {e}"))?;
        let mut region = |what: &str| -> std::result::Result<RemoteRegion, String> {
            let n = u32::from_be_bytes(take(4, what)?.try_into().unwrap()) as usize;
            RemoteRegion::decode(take(n, what)?).map_err(|e| format!("HMC_BUFFER {what}: {e}"))
        };
        let request = region("request region")?;
        let response = if flags & DESC_HAS_RESPONSE != 0 {
            Some(region("response region")?)
        } else {
            None
        };
        if at != b.len() {
            return Err(format!(
                "HMC_BUFFER descriptor: {} trailing bytes",
                b.len() - at
            ));
        }
        Ok(BufferDescriptor {
            reply_to,
            request,
            response,
        })
    }
}
