//! The dial rule: which data-plane addresses a server connects to for a client (the RPC
//! peer's own IP, on this host its own user's socket, or `--data-plane-allow`).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use hmc_core::PeerAddr;

/// Who is at the other end of an RPC connection, as the socket says.
#[derive(Clone, Debug, Default)]
pub(crate) enum RpcPeer {
    /// A TCP connection: the peer's address and ours.
    Tcp { peer: SocketAddr, local: SocketAddr },
    /// A Unix socket connection: the peer process's uid (SO_PEERCRED), when known.
    Unix { uid: Option<u32> },
    /// Not known: only allow-listed data-plane addresses are dialled.
    #[default]
    Unknown,
}

/// One `--data-plane-allow` entry: data-plane addresses the server dials for any client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataPlaneAllow {
    /// `tcp://` addresses whose IP is in this network (`10.0.0.0/8`, `::1/128`, `10.1.2.3`),
    /// any port, privileged ones included.
    Net {
        /// The network's address.
        ip: IpAddr,
        /// Leading bits that must match.
        prefix: u8,
    },
    /// `unix://` paths under this directory (whole path components; `/run/hmc`).
    UnixPrefix(PathBuf),
    /// A transport's own addresses (`<transport id>:<hex>`, what plugins and UCX give):
    /// `opaque:<id>` admits every address of that transport, `opaque:<id>:<hex>` those
    /// whose bytes start with the hex prefix.
    Opaque {
        /// The transport's wire number.
        transport: u8,
        /// Leading address bytes that must match.
        prefix: Vec<u8>,
    },
}

impl std::str::FromStr for DataPlaneAllow {
    type Err = String;
    /// `CIDR` (`10.0.0.0/8`, `fd00::/8`), a bare IP (`/32` or `/128`), an absolute Unix
    /// path prefix (`/run/hmc`, or `unix:///run/hmc`), or `opaque:<transport id>[:<hex>]`.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if let Some(rest) = s.strip_prefix("opaque:") {
            let (id, hex) = rest.split_once(':').unwrap_or((rest, ""));
            let transport = id.parse::<u8>().ok().filter(|id| *id != 0).ok_or_else(|| {
                format!(
                    "`{s}`: `opaque:` takes a transport wire number 1..=255, then `:HEX` optionally"
                )
            })?;
            let prefix = (0..hex.len())
                .step_by(2)
                .map(|i| {
                    hex.get(i..i + 2)
                        .and_then(|b| u8::from_str_radix(b, 16).ok())
                })
                .collect::<Option<Vec<u8>>>()
                .ok_or_else(|| format!("`{s}`: `{hex}` is not an even number of hex digits"))?;
            return Ok(DataPlaneAllow::Opaque { transport, prefix });
        }
        let t = s.strip_prefix("unix://").unwrap_or(s);
        if t.starts_with('/') {
            return Ok(DataPlaneAllow::UnixPrefix(PathBuf::from(t)));
        }
        let (ip, bits) = match s.split_once('/') {
            Some((ip, bits)) => (ip, Some(bits)),
            None => (s, None),
        };
        let ip: IpAddr = ip.parse().map_err(|_| {
            format!("`{s}` is not a data-plane allow entry; use CIDR (10.0.0.0/8), an absolute unix path prefix, or opaque:<transport id>[:<hex prefix>]")
        })?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = match bits {
            None => max,
            Some(b) => b
                .parse::<u8>()
                .ok()
                .filter(|b| *b <= max)
                .ok_or_else(|| format!("`{s}`: the prefix length must be 0..={max}"))?,
        };
        Ok(DataPlaneAllow::Net {
            ip: canonical_ip(ip),
            prefix,
        })
    }
}

impl DataPlaneAllow {
    /// Whether this entry admits `addr`.
    pub fn admits(&self, addr: &PeerAddr) -> bool {
        match (self, addr) {
            (DataPlaneAllow::Net { ip, prefix }, PeerAddr::Tcp(a)) => {
                in_net(canonical_ip(a.ip()), *ip, *prefix)
            }
            (DataPlaneAllow::UnixPrefix(dir), PeerAddr::Unix(p)) => {
                // Whole components, and no `..` that could climb out of `dir`.
                p.is_absolute()
                    && p.starts_with(dir)
                    && !p
                        .components()
                        .any(|c| matches!(c, std::path::Component::ParentDir))
            }
            (
                DataPlaneAllow::Opaque { transport, prefix },
                PeerAddr::Opaque {
                    transport: t,
                    bytes,
                },
            ) => t.wire_id() == *transport && bytes.starts_with(prefix),
            _ => false,
        }
    }
}

pub(super) use hmc_transport_kit::owner::canonical_ip;

pub(super) fn in_net(ip: IpAddr, net: IpAddr, prefix: u8) -> bool {
    let mask = |bits: u32, len: u32| -> u128 {
        if bits == 0 {
            0
        } else {
            (!0u128 << (len - bits)) & (!0u128 >> (128 - len))
        }
    };
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let m = mask(prefix as u32, 32);
            (u32::from(a) as u128 & m) == (u32::from(n) as u128 & m)
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let m = mask(prefix as u32, 128);
            (u128::from(a) & m) == (u128::from(n) & m)
        }
        _ => false,
    }
}

/// The hint every dial refusal ends with.
pub(super) const ALLOW_HINT: &str = "if this address is meant, add it to the server's DataPlaneConfig::allow (--data-plane-allow: a CIDR, a Unix socket path prefix, or opaque:<transport id>[:<hex prefix>])";

/// The dial rule: may the server connect to `addr`, named by a descriptor that came over
/// the RPC connection from `peer`? Nothing is sent anywhere to decide. `Err` says which
/// rule refused it.
pub(crate) fn check_dial(
    peer: &RpcPeer,
    addr: &PeerAddr,
    allow: &[DataPlaneAllow],
) -> std::result::Result<(), String> {
    if allow.iter().any(|a| a.admits(addr)) {
        return Ok(());
    }
    let refuse = |why: String| Err(format!("refusing to dial {addr}: {why}; {ALLOW_HINT}"));
    match addr {
        PeerAddr::Tcp(a) => {
            let ip = canonical_ip(a.ip());
            if a.port() < 1024 {
                return refuse(format!(
                    "port {} is privileged (< 1024) and not allow-listed",
                    a.port()
                ));
            }
            let peer_uid = match peer {
                RpcPeer::Tcp { peer: p, local } => {
                    let pip = canonical_ip(p.ip());
                    if ip != pip {
                        return refuse(format!(
                            "the data-plane address must be the RPC peer's own IP ({pip})"
                        ));
                    }
                    if !pip.is_loopback() {
                        return Ok(());
                    }
                    // On this host: the listener must be the RPC peer's user's.
                    match hmc_transport_kit::owner::connection_uid(*p, *local) {
                        Some(u) => u,
                        None => return refuse("cannot tell which user the RPC peer on this host is (no /proc/net/tcp entry)".into()),
                    }
                }
                RpcPeer::Unix { uid: Some(u) } => {
                    if !ip.is_loopback() {
                        return refuse(
                            "a client on a Unix socket may only name a loopback data-plane address"
                                .into(),
                        );
                    }
                    *u
                }
                RpcPeer::Unix { uid: None } | RpcPeer::Unknown => {
                    return refuse("the RPC peer's identity is unknown".into());
                }
            };
            match hmc_transport_kit::owner::listener_uid(*a) {
                Some(u) if u == peer_uid => Ok(()),
                Some(u) => refuse(format!(
                    "the listener there belongs to uid {u}, the RPC peer is uid {peer_uid}"
                )),
                None => refuse("no listening socket there on this host".into()),
            }
        }
        PeerAddr::Unix(path) => {
            let peer_uid = match peer {
                RpcPeer::Unix { uid: Some(u) } => *u,
                RpcPeer::Tcp { peer: p, local } if canonical_ip(p.ip()).is_loopback() => {
                    match hmc_transport_kit::owner::connection_uid(*p, *local) {
                        Some(u) => u,
                        None => return refuse("cannot tell which user the RPC peer on this host is (no /proc/net/tcp entry)".into()),
                    }
                }
                _ => {
                    return refuse(
                        "a unix:// data-plane address is only dialled for a client on this host"
                            .into(),
                    );
                }
            };
            socket_owned_by(path, peer_uid).or_else(refuse)
        }
        _ => refuse(
            "a transport's own (<id>:<hex>) data-plane address is dialled only when allow-listed, \
             since its owner cannot be checked"
                .into(),
        ),
    }
}

/// `path` (symbolic links followed, as `connect` follows them) is a socket owned by `uid`.
pub(super) fn socket_owned_by(path: &Path, uid: u32) -> std::result::Result<(), String> {
    match hmc_transport_kit::owner::socket_file_uid(path)? {
        u if u == uid => Ok(()),
        u => Err(format!(
            "the socket file belongs to uid {u}, the RPC peer is uid {uid}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp_peer(peer: &str) -> RpcPeer {
        RpcPeer::Tcp {
            peer: peer.parse().unwrap(),
            local: "10.0.0.1:18080".parse().unwrap(),
        }
    }

    #[test]
    fn allow_entries_parse_and_admit() {
        let net: DataPlaneAllow = "10.1.0.0/16".parse().unwrap();
        assert!(net.admits(&"tcp://10.1.200.3:80".parse().unwrap()));
        assert!(!net.admits(&"tcp://10.2.0.1:9000".parse().unwrap()));
        assert!(
            net.admits(&"tcp://[::ffff:10.1.0.9]:9000".parse().unwrap()),
            "IPv4-mapped IPv6 is compared as IPv4"
        );
        let one: DataPlaneAllow = "::1".parse().unwrap();
        assert_eq!(
            one,
            DataPlaneAllow::Net {
                ip: "::1".parse().unwrap(),
                prefix: 128
            }
        );
        let all: DataPlaneAllow = "0.0.0.0/0".parse().unwrap();
        assert!(all.admits(&"tcp://192.0.2.1:1".parse().unwrap()));
        let dir: DataPlaneAllow = "unix:///run/hmc".parse().unwrap();
        assert!(dir.admits(&"unix:///run/hmc/a.sock".parse().unwrap()));
        assert!(
            !dir.admits(&"unix:///run/hmcx.sock".parse().unwrap()),
            "whole components"
        );
        assert!(
            !dir.admits(&"unix:///run/hmc/../x.sock".parse().unwrap()),
            "no .."
        );
        assert!(!dir.admits(&"tcp://127.0.0.1:9000".parse().unwrap()));
        for bad in ["10.0.0.0/33", "ten", "::/129", "1.2.3.4/x"] {
            assert!(bad.parse::<DataPlaneAllow>().is_err(), "{bad}");
        }
    }

    #[rstest::rstest]
    #[case::any_address_of_the_transport("opaque:200", "200:0a0b0c", true)]
    #[case::prefix("opaque:200:0a0b", "200:0a0b0c", true)]
    #[case::other_prefix("opaque:200:0a0c", "200:0a0b0c", false)]
    #[case::other_transport("opaque:201", "200:0a0b0c", false)]
    #[case::not_a_tcp_address("opaque:200", "tcp://10.0.0.1:9000", false)]
    fn plugin_addresses_are_allowed_by_transport_and_prefix(
        #[case] entry: &str,
        #[case] addr: &str,
        #[case] admitted: bool,
    ) {
        let a: DataPlaneAllow = entry.parse().unwrap();
        assert_eq!(a.admits(&addr.parse().unwrap()), admitted);
        // Without the entry, such an address is not dialled, and the refusal says how.
        if addr.starts_with("200:") {
            let e =
                check_dial(&tcp_peer("10.0.0.2:4000"), &addr.parse().unwrap(), &[]).unwrap_err();
            assert!(e.contains("opaque:<transport id>"), "{e}");
        }
    }

    #[rstest::rstest]
    #[case("opaque:")]
    #[case("opaque:0")]
    #[case("opaque:300")]
    #[case("opaque:200:abc")]
    #[case("opaque:200:zz")]
    fn malformed_opaque_entries_are_refused(#[case] entry: &str) {
        let e = entry.parse::<DataPlaneAllow>().unwrap_err();
        assert!(e.contains(entry), "{e}");
    }

    #[test]
    fn the_dial_rule_without_an_allow_list() {
        let remote = tcp_peer("192.0.2.7:5555");
        let ok = |p: &RpcPeer, a: &str| check_dial(p, &a.parse().unwrap(), &[]);
        assert!(
            ok(&remote, "tcp://192.0.2.7:40000").is_ok(),
            "the peer's own IP"
        );
        assert!(
            ok(
                &tcp_peer("[::ffff:192.0.2.7]:5555"),
                "tcp://192.0.2.7:40000"
            )
            .is_ok(),
            "an IPv4-mapped peer"
        );
        let e = ok(&remote, "tcp://192.0.2.8:40000").unwrap_err();
        assert!(
            e.contains("RPC peer's own IP") && e.contains("DataPlaneConfig::allow"),
            "{e}"
        );
        let e = ok(&remote, "tcp://192.0.2.7:22").unwrap_err();
        assert!(e.contains("privileged"), "{e}");
        let e = ok(&remote, "unix:///tmp/x.sock").unwrap_err();
        assert!(e.contains("on this host"), "{e}");
        let e = ok(&RpcPeer::Unix { uid: Some(0) }, "tcp://192.0.2.7:40000").unwrap_err();
        assert!(e.contains("loopback"), "{e}");
        assert!(ok(&RpcPeer::Unknown, "tcp://192.0.2.7:40000").is_err());
        let allow = ["192.0.2.0/24".parse().unwrap()];
        assert!(check_dial(&remote, &"tcp://192.0.2.9:22".parse().unwrap(), &allow).is_ok());
    }

    #[test]
    fn a_unix_data_plane_socket_must_be_the_peers_users() {
        #[allow(unsafe_code)]
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dp.sock");
        let _l = std::os::unix::net::UnixListener::bind(&p).unwrap();
        let addr = PeerAddr::Unix(p.clone());
        assert!(check_dial(&RpcPeer::Unix { uid: Some(me) }, &addr, &[]).is_ok());
        let e = check_dial(&RpcPeer::Unix { uid: Some(me + 1) }, &addr, &[]).unwrap_err();
        assert!(e.contains("belongs to uid"), "{e}");
        let file = dir.path().join("plain");
        std::fs::write(&file, b"").unwrap();
        let e =
            check_dial(&RpcPeer::Unix { uid: Some(me) }, &PeerAddr::Unix(file), &[]).unwrap_err();
        assert!(e.contains("not a socket"), "{e}");
    }
}
