//! How the target names one of an initiator's data connections in an ABANDON
//! (`crate::abandon`), and who may name it: shared by the sockets (`crate::net`), which
//! read the names, and the gates, which are found by them.

use std::net::SocketAddr;

/// How an ABANDON names one of the initiator's connections: the initiator's side of it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ConnName {
    /// A TCP connection's address and port on the initiator's side ([`canonical`]).
    Tcp(SocketAddr),
    /// A Unix-socket connection's abstract address on the initiator's side (its bytes
    /// after the leading NUL).
    Unix(Vec<u8>),
}

/// The text that starts a Unix-socket [`ConnName`] in an ABANDON; hex digits follow.
const UNIX_PREFIX: &str = "unix:@";

impl ConnName {
    /// A TCP connection's name, canonical.
    pub(crate) fn tcp(addr: SocketAddr) -> ConnName {
        ConnName::Tcp(canonical(addr))
    }

    /// As an ABANDON carries it: `IP:PORT`, or `unix:@` and the abstract address in hex.
    pub(crate) fn to_text(&self) -> String {
        match self {
            ConnName::Tcp(a) => a.to_string(),
            ConnName::Unix(name) => {
                let hex: String = name.iter().map(|b| format!("{b:02x}")).collect();
                format!("{UNIX_PREFIX}{hex}")
            }
        }
    }

    /// [`ConnName::to_text`] read back; `None` for anything else.
    pub(crate) fn parse(text: &str) -> Option<ConnName> {
        let Some(hex) = text.strip_prefix(UNIX_PREFIX) else {
            return text.parse().ok().map(ConnName::tcp);
        };
        if hex.is_empty() || hex.len() % 2 != 0 {
            return None;
        }
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
            .collect::<Option<Vec<u8>>>()?;
        Some(ConnName::Unix(bytes))
    }
}

/// Who may abandon a connection: the peer that holds its other end, as far as the target
/// can tell (the IP address of a TCP connection, the uid of a Unix-socket one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Holder {
    Ip(std::net::IpAddr),
    Uid(u32),
}

/// `addr` with an IPv4-mapped IPv6 address as the IPv4 address it maps: how a dual-stack
/// listener sees an IPv4 peer, and how that peer names its own side.
pub(crate) fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cross_as_text_and_back() {
        let v4: SocketAddr = "127.0.0.1:51234".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:51234".parse().unwrap();
        assert_eq!(
            ConnName::tcp(mapped),
            ConnName::tcp(v4),
            "IPv4-mapped is IPv4"
        );
        for name in [
            ConnName::tcp(v4),
            ConnName::tcp("[::1]:2".parse().unwrap()),
            ConnName::Unix(b"\x00\x01abc".to_vec()),
        ] {
            assert_eq!(ConnName::parse(&name.to_text()), Some(name));
        }
        assert_eq!(ConnName::Unix(vec![0x0a, 0xff]).to_text(), "unix:@0aff");
        for bad in [
            "xyz",
            "unix:@",
            "unix:@abc",
            "unix:@zz",
            "unix:@é1",
            "1.2.3.4",
        ] {
            assert_eq!(ConnName::parse(bad), None, "{bad}");
        }
    }
}
