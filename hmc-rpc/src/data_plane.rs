//! The HMC_BUFFER data plane: `Server<C>`/`Client<C>` take an optional `C: Communicator`
//! that moves large payloads one-sided; [`NoDataPlane`] is the always-built empty one.
//!
//! Who does what (normative text in `docs/protocol.md`, "HMC_BUFFER"): the client copies a
//! request payload of at least [`DataPlaneConfig::threshold`] bytes into a pooled registered
//! buffer, lends a second pooled buffer for the response, and sends only a descriptor (its
//! data-plane address and both regions). The server connects to that address if the dial
//! rule allows it (`check_dial`: the RPC peer's own IP, on this host its own user's
//! socket, or `--data-plane-allow`; one cached endpoint per client address), READs the
//! payload into its own pooled buffer within `data_plane_timeout`, runs the
//! handler, WRITEs a large response into the client's response region and answers
//! RESPONSE/HMC_BUFFER with the length. A response that does not fit goes back as
//! TCP_STREAM. No tag matching, and no lock is held across a transfer.
//!
//! Copies per call: the server's READ and WRITE move the bytes once each way. The client
//! copies the request into a pooled buffer, unless the caller wrote it there in the first
//! place ([`ClientDataPlane::request_buffer`]); the response reaches the caller as a view
//! of the pooled response buffer, without a copy.
//!
//! Device methods ([`crate::Dispatcher::register_device`]) take a pipelined path on the
//! server: the payload is READ a chunk at a time into one of two pooled bounce buffers
//! while the previous chunk is copied to the device, and a large response is copied off
//! the device a chunk at a time while the previous chunk is WRITTEN, so device copies and
//! transfers overlap and two chunk-sized buffers serve any payload size.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hmc_core::{
    Access, BoxFuture, Communicator, Deadline, Error, LocalRegistration, Notification, Op,
    PeerAddr, Region, RemoteRegion, Result, TransferDesc, TransportId,
};
use parking_lot::Mutex;

use crate::device::DEFAULT_DEVICE_STAGING;
use crate::dispatch::{CallContext, DeviceRequest, DeviceRoute, HandlerResult, RpcError};
use crate::frame::Status;
use crate::pool::{
    BufferPool, LentBuffers, PoolConfig, PoolStats, PooledBuffer, RequestBuffer, mark_lent,
};

/// Data-plane settings shared by server and client. Every limit has a default and a name.
#[derive(Clone, Debug)]
pub struct DataPlaneConfig {
    /// Payloads of at least this many bytes move over the data plane (`ucx_threshold`,
    /// default 64 KiB; `--ucx-threshold`). Smaller ones travel INLINE or TCP_STREAM.
    pub threshold: usize,
    /// The registered buffer pool (`max_pool_bytes`, …).
    pub pool: PoolConfig,
    /// Server: cached data-plane endpoints, one per client data-plane address
    /// (`max_data_plane_peers`, default 1024); the cache is cleared when it is full.
    pub max_peers: usize,
    /// Server: imported remote keys cached per endpoint (`max_keys_per_peer`, default 256).
    pub max_keys_per_peer: usize,
    /// Server: the longest one call's data-plane work may hold its in-flight slot
    /// (`data_plane_timeout`, default 5 s; `--data-plane-timeout-ms`): connecting, importing,
    /// READing the request and WRITING the response together end by the earlier of the
    /// call's deadline and this much data-plane time (the handler's own time not counted).
    /// A data-plane peer that stays silent fails that call with DATA_PLANE.
    pub timeout: Duration,
    /// Server: data-plane addresses dialled without the default rule (`data_plane_allow`,
    /// default none; `--data-plane-allow`, repeatable). By default a descriptor's address
    /// is dialled only when it is the RPC peer's own IP (and, on this host, a socket of
    /// the RPC peer's user); see [`DataPlaneAllow`] and `docs/protocol.md`, "HMC_BUFFER".
    pub allow: Vec<DataPlaneAllow>,
}

impl Default for DataPlaneConfig {
    fn default() -> Self {
        DataPlaneConfig {
            threshold: 64 << 10,
            pool: PoolConfig::default(),
            max_peers: 1024,
            max_keys_per_peer: 256,
            timeout: Duration::from_secs(5),
            allow: Vec::new(),
        }
    }
}

/// Data-plane counters of a server or client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataPlaneStats {
    /// Calls whose request moved over the data plane.
    pub buffer_calls: u64,
    /// Client: of those, calls whose payload was a [`RequestBuffer`] lent as is (no copy).
    pub lent_requests: u64,
    /// Responses written one-sided into a client's region.
    pub buffer_responses: u64,
    /// Client: large calls sent TCP_STREAM because the data plane could not be prepared.
    /// Server: large responses sent TCP_STREAM (no region, too small, pool exhausted).
    pub fallbacks: u64,
    /// Calls that failed on the data plane (answered DATA_PLANE or BAD_PAYLOAD).
    pub failures: u64,
    /// Server: data-plane endpoints cached now (one per client address in use).
    pub endpoints: usize,
    /// The buffer pool.
    pub pool: PoolStats,
}

#[derive(Default)]
pub(crate) struct Counters {
    buffer_calls: AtomicU64,
    lent_requests: AtomicU64,
    buffer_responses: AtomicU64,
    fallbacks: AtomicU64,
    failures: AtomicU64,
}

impl Counters {
    fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
    fn stats(&self, pool: PoolStats) -> DataPlaneStats {
        DataPlaneStats {
            buffer_calls: self.buffer_calls.load(Ordering::Relaxed),
            lent_requests: self.lent_requests.load(Ordering::Relaxed),
            buffer_responses: self.buffer_responses.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            endpoints: 0,
            pool,
        }
    }
}

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
const DESC_VERSION: u8 = 1;
const DESC_HAS_RESPONSE: u8 = 1;

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

fn dp_error(why: impl std::fmt::Display) -> RpcError {
    RpcError::new(Status::DATA_PLANE, format!("data plane: {why}"))
}

/// How the server answers an HMC_BUFFER call.
pub(crate) enum Served {
    /// An ordinary answer (INLINE or TCP_STREAM, or an error status).
    Answer(HandlerResult),
    /// The response (this many bytes) is in the client's response region.
    InBuffer(u64),
}

/// The data-plane time one call may still spend (`data_plane_timeout`), and its deadline.
struct DpClock {
    call: Deadline,
    left: Duration,
}

/// One stretch of a call's data-plane work: it ends by `deadline`.
struct Phase {
    deadline: Deadline,
    started: Instant,
    /// `data_plane_timeout`, not the call's deadline, is what ends this phase.
    limited: bool,
}

impl DpClock {
    fn new(call: Deadline, timeout: Duration) -> Self {
        DpClock {
            call,
            left: timeout,
        }
    }

    /// Starts a phase that ends by the call's deadline or when the data-plane time left
    /// runs out, whichever is first.
    fn phase(&self) -> Phase {
        let dp = Deadline::after(self.left);
        Phase {
            deadline: self.call.min(dp),
            started: Instant::now(),
            limited: dp.instant() < self.call.instant(),
        }
    }

    /// `ph` is over: its time is spent.
    fn spent(&mut self, ph: &Phase) {
        self.left = self.left.saturating_sub(ph.started.elapsed());
    }
}

impl Phase {
    /// The DATA_PLANE answer for `e` while `what`; one that ran into `data_plane_timeout`
    /// says so and names the flag.
    fn error(&self, config: &DataPlaneConfig, what: impl std::fmt::Display, e: Error) -> RpcError {
        if self.limited && matches!(e, Error::DeadlineExceeded { .. }) {
            dp_error(format!(
                "{what}: the call's data-plane time reached `data_plane_timeout` ({} ms); \
                 raise --data-plane-timeout-ms (DataPlaneConfig::timeout) if the client's data \
                 plane is that slow ({e})",
                config.timeout.as_millis()
            ))
        } else {
            dp_error(format!("{what}: {e}"))
        }
    }
}

/// One transfer between the start of a bounce buffer and `remote` at `offset`.
fn bounce_desc<'a, C: Communicator>(
    bounce: &'a PooledBuffer<C>,
    remote: &'a C::RemoteKey,
    offset: usize,
    len: usize,
) -> [TransferDesc<'a, C>; 1] {
    [TransferDesc {
        local: bounce.registration(),
        local_offset: 0,
        remote,
        remote_offset: offset as u64,
        len,
    }]
}

/// A call's checked descriptor, the client's endpoint and the imported request region.
struct OpenCall<C: Communicator> {
    d: BufferDescriptor,
    peer: Arc<Peer<C>>,
    rkey: Arc<C::RemoteKey>,
    len: usize,
}

/// Runs the handler on the pulled payload.
pub(crate) type RunHandler = Box<dyn FnOnce(Bytes) -> BoxFuture<'static, HandlerResult> + Send>;

/// What an HMC_BUFFER call runs on its payload.
pub(crate) enum Work {
    /// A handler of host bytes: the payload is pulled whole into a pooled buffer.
    Bytes(RunHandler),
    /// A device method: the payload is pulled chunk by chunk, each chunk copied to the
    /// device while the next is read, and a large response is copied out chunk by chunk,
    /// each chunk WRITTEN while the next is copied.
    Device(CallContext, Arc<dyn DeviceRoute>),
}

/// The data-plane addresses one RPC connection's calls used. A cached endpoint lives while
/// some open RPC connection uses it, so connect/call/disconnect cycles leave nothing behind.
/// It also carries who is at the other end of the RPC connection, for the dial rule.
#[derive(Default)]
pub(crate) struct ConnUse {
    /// `None` once the connection has closed. An address in the set passed the dial rule
    /// for this connection.
    addrs: Mutex<Option<std::collections::HashSet<PeerAddr>>>,
    peer: RpcPeer,
}

impl ConnUse {
    /// For an RPC connection whose other end is `peer` ([`crate::net`]'s `rpc_peer`).
    pub(crate) fn for_peer(peer: RpcPeer) -> Self {
        ConnUse {
            addrs: Mutex::new(Some(Default::default())),
            peer,
        }
    }
}

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
}

impl std::str::FromStr for DataPlaneAllow {
    type Err = String;
    /// `CIDR` (`10.0.0.0/8`, `fd00::/8`), a bare IP (`/32` or `/128`), or an absolute Unix
    /// path prefix (`/run/hmc`, or `unix:///run/hmc`).
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let t = s.strip_prefix("unix://").unwrap_or(s);
        if t.starts_with('/') {
            return Ok(DataPlaneAllow::UnixPrefix(PathBuf::from(t)));
        }
        let (ip, bits) = match s.split_once('/') {
            Some((ip, bits)) => (ip, Some(bits)),
            None => (s, None),
        };
        let ip: IpAddr = ip.parse().map_err(|_| {
            format!("`{s}` is not a data-plane allow entry; use CIDR (10.0.0.0/8) or an absolute unix path prefix")
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
            _ => false,
        }
    }
}

/// IPv4-mapped IPv6 addresses as IPv4.
fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

fn in_net(ip: IpAddr, net: IpAddr, prefix: u8) -> bool {
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
const ALLOW_HINT: &str = "if this address is meant, start the server with --data-plane-allow CIDR|unix-path-prefix (DataPlaneConfig::allow)";

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
                    match proc_net::connection_uid(*p, *local) {
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
            match proc_net::listener_uid(*a) {
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
                    match proc_net::connection_uid(*p, *local) {
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
        _ => refuse("only tcp:// and unix:// data-plane addresses are dialled".into()),
    }
}

/// `path` (symbolic links followed, as `connect` follows them) is a socket owned by `uid`.
fn socket_owned_by(path: &Path, uid: u32) -> std::result::Result<(), String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let m = std::fs::metadata(path).map_err(|e| format!("cannot stat the socket file: {e}"))?;
    if !m.file_type().is_socket() {
        return Err("it is not a socket".into());
    }
    if m.uid() != uid {
        return Err(format!(
            "the socket file belongs to uid {}, the RPC peer is uid {uid}",
            m.uid()
        ));
    }
    Ok(())
}

/// Socket owners from `/proc/net/tcp{,6}` (Linux): which user a local TCP socket is.
mod proc_net {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

    const ESTABLISHED: &str = "01";
    const LISTEN: &str = "0A";

    fn parse_addr(s: &str) -> Option<SocketAddr> {
        let (ip, port) = s.split_once(':')?;
        let port = u16::from_str_radix(port, 16).ok()?;
        let word = |i: usize| -> Option<[u8; 4]> {
            Some(
                u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16)
                    .ok()?
                    .to_ne_bytes(),
            )
        };
        let ip = match ip.len() {
            8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
            32 => {
                let mut b = [0u8; 16];
                for i in 0..4 {
                    b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
                }
                IpAddr::V6(Ipv6Addr::from(b))
            }
            _ => return None,
        };
        Some(SocketAddr::new(super::canonical_ip(ip), port))
    }

    /// (local, remote, state, uid) of every TCP socket.
    fn sockets() -> Vec<(SocketAddr, SocketAddr, String, u32)> {
        let mut out = Vec::new();
        for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
            let Ok(text) = std::fs::read_to_string(f) else {
                continue;
            };
            for line in text.lines().skip(1) {
                let cols: Vec<&str> = line.split_whitespace().collect();
                let (Some(l), Some(r), Some(st), Some(uid)) =
                    (cols.get(1), cols.get(2), cols.get(3), cols.get(7))
                else {
                    continue;
                };
                if let (Some(l), Some(r), Ok(uid)) = (parse_addr(l), parse_addr(r), uid.parse()) {
                    out.push((l, r, st.to_string(), uid));
                }
            }
        }
        out
    }

    fn canon(a: SocketAddr) -> SocketAddr {
        SocketAddr::new(super::canonical_ip(a.ip()), a.port())
    }

    /// The uid of the process end of a TCP connection from `peer` to our `local`.
    pub(super) fn connection_uid(peer: SocketAddr, local: SocketAddr) -> Option<u32> {
        let (peer, local) = (canon(peer), canon(local));
        sockets()
            .into_iter()
            .find(|(l, r, st, _)| st == ESTABLISHED && *l == peer && *r == local)
            .map(|s| s.3)
    }

    /// The uid of the socket listening at `at` (bound to its IP or to the wildcard).
    pub(super) fn listener_uid(at: SocketAddr) -> Option<u32> {
        let at = canon(at);
        sockets()
            .into_iter()
            .find(|(l, _, st, _)| {
                st == LISTEN
                    && l.port() == at.port()
                    && (l.ip() == at.ip() || l.ip().is_unspecified())
            })
            .map(|s| s.3)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn parses_the_kernels_hex_form() {
            assert_eq!(
                parse_addr("0100007F:1F90"),
                Some("127.0.0.1:8080".parse().unwrap())
            );
            assert_eq!(
                parse_addr("00000000000000000000000001000000:0016"),
                Some("[::1]:22".parse().unwrap())
            );
            assert_eq!(
                parse_addr("0000000000000000FFFF00000100007F:0050"),
                Some("127.0.0.1:80".parse().unwrap()),
                "IPv4-mapped, as IPv4"
            );
        }

        #[test]
        fn finds_our_own_listener_and_connection() {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let at = l.local_addr().unwrap();
            #[allow(unsafe_code)]
            // SAFETY: geteuid has no preconditions.
            let me = unsafe { libc::geteuid() };
            assert_eq!(listener_uid(at), Some(me));
            let c = std::net::TcpStream::connect(at).unwrap();
            assert_eq!(connection_uid(c.local_addr().unwrap(), at), Some(me));
        }
    }
}

/// The server's data plane, type-erased so the server's shared state stays non-generic.
pub(crate) trait ServerPlane: Send + Sync + 'static {
    /// Pulls the payload `desc` describes, runs `work` on it, pushes a large response.
    fn serve(
        self: Arc<Self>,
        conn: Arc<ConnUse>,
        desc: Bytes,
        len: u64,
        deadline: Deadline,
        work: Work,
    ) -> BoxFuture<'static, Served>;
    /// Counters.
    fn stats(&self) -> DataPlaneStats;
    /// The connection closed: endpoints no other open connection uses are dropped.
    fn release(&self, conn: &ConnUse);
}

struct Peer<C: Communicator> {
    ep: C::Endpoint,
    keys: Mutex<HashMap<Vec<u8>, Arc<C::RemoteKey>>>,
    /// Open RPC connections whose calls used this endpoint.
    users: AtomicU64,
}

/// The server half of HMC_BUFFER over any communicator.
pub(crate) struct ServerDp<C: Communicator> {
    comm: Arc<C>,
    pool: BufferPool<C>,
    config: DataPlaneConfig,
    peers: Mutex<HashMap<PeerAddr, Arc<Peer<C>>>>,
    counters: Counters,
}

impl<C: Communicator> ServerDp<C> {
    pub(crate) fn new(comm: Arc<C>, config: DataPlaneConfig) -> Self {
        ServerDp {
            pool: BufferPool::new(comm.clone(), Access::READ, config.pool),
            comm,
            config,
            peers: Mutex::new(HashMap::new()),
            counters: Counters::default(),
        }
    }

    async fn peer(
        &self,
        conn: &ConnUse,
        addr: &PeerAddr,
        deadline: Deadline,
    ) -> Result<Arc<Peer<C>>> {
        let cached = self.peers.lock().get(addr).cloned();
        let p = match cached {
            Some(p) => p,
            None => self.connect(conn, addr, deadline).await?,
        };
        // Count this connection as a user of the endpoint (once).
        let mut addrs = conn.addrs.lock();
        if let Some(set) = addrs.as_mut()
            && set.insert(addr.clone())
        {
            p.users.fetch_add(1, Ordering::AcqRel);
        }
        Ok(p)
    }

    async fn connect(
        &self,
        conn: &ConnUse,
        addr: &PeerAddr,
        deadline: Deadline,
    ) -> Result<Arc<Peer<C>>> {
        // The transport ends a connect by its deadline; the timer is a second guard, so
        // that a silent listener never holds the call's slot past it.
        let started = Instant::now();
        let ep =
            tokio::time::timeout_at(deadline.instant().into(), self.comm.connect(addr, deadline))
                .await
                .map_err(|_| Error::DeadlineExceeded {
                    during: "connecting to the client's data plane",
                    elapsed: started.elapsed(),
                })??;
        let p = Arc::new(Peer {
            ep,
            keys: Mutex::new(HashMap::new()),
            users: AtomicU64::new(0),
        });
        if conn.addrs.lock().is_none() {
            // The RPC connection is gone: use the endpoint for this call only.
            return Ok(p);
        }
        let mut peers = self.peers.lock();
        if peers.len() >= self.config.max_peers {
            tracing::debug!(
                max_data_plane_peers = self.config.max_peers,
                "data-plane endpoint cache full; clearing it"
            );
            peers.clear();
        }
        Ok(peers.entry(addr.clone()).or_insert(p).clone())
    }

    fn forget_peer(&self, addr: &PeerAddr) {
        self.peers.lock().remove(addr);
    }

    fn key(&self, peer: &Peer<C>, region: &RemoteRegion) -> Result<Arc<C::RemoteKey>> {
        let id = region.encode();
        if let Some(k) = peer.keys.lock().get(&id) {
            return Ok(k.clone());
        }
        let k = Arc::new(crate::pool::blocking(|| {
            self.comm.import(&peer.ep, region)
        })?);
        let mut keys = peer.keys.lock();
        if keys.len() >= self.config.max_keys_per_peer {
            keys.clear();
        }
        keys.insert(id, k.clone());
        Ok(k)
    }

    fn forget_key(&self, peer: &Peer<C>, region: &RemoteRegion) {
        peer.keys.lock().remove(&region.encode());
    }

    fn check_region(
        &self,
        r: &RemoteRegion,
        need: Access,
        what: &str,
    ) -> std::result::Result<(), RpcError> {
        if r.transport != self.comm.transport() {
            return Err(dp_error(format!(
                "the {what} region is a {:?} region but this server's data plane is {:?};                  start both peers with the same --data-plane",
                r.transport,
                self.comm.transport()
            )));
        }
        if !r.access.allows(need) {
            return Err(RpcError::bad_payload(format!(
                "HMC_BUFFER {what} region allows {:?}, the server needs {need:?}",
                r.access
            )));
        }
        Ok(())
    }

    /// Decodes and checks a call's descriptor, checks the dial rule, connects to the
    /// client's data plane and imports the request region.
    async fn open_call(
        &self,
        conn: &ConnUse,
        desc: &Bytes,
        len: u64,
        ph: &Phase,
    ) -> std::result::Result<OpenCall<C>, RpcError> {
        let d = BufferDescriptor::decode(desc).map_err(RpcError::bad_payload)?;
        self.check_region(&d.request, Access::READ, "request")?;
        if len > d.request.region.len as u64 {
            return Err(RpcError::bad_payload(format!(
                "HMC_BUFFER payload length {len} is past the end of its {}-byte request region",
                d.request.region.len
            )));
        }
        let len = len as usize;
        // The dial rule, once per address and RPC connection, before anything is sent.
        let checked = conn
            .addrs
            .lock()
            .as_ref()
            .is_some_and(|s| s.contains(&d.reply_to));
        if !checked {
            check_dial(&conn.peer, &d.reply_to, &self.config.allow).map_err(dp_error)?;
        }
        let peer = self
            .peer(conn, &d.reply_to, ph.deadline)
            .await
            .map_err(|e| {
                ph.error(
                    &self.config,
                    format!("connecting to the client's data plane at {}", d.reply_to),
                    e,
                )
            })?;
        let rkey = self
            .key(&peer, &d.request)
            .map_err(|e| dp_error(format!("importing the request region: {e}")))?;
        Ok(OpenCall { d, peer, rkey, len })
    }

    async fn serve_inner(
        self: Arc<Self>,
        conn: Arc<ConnUse>,
        desc: Bytes,
        len: u64,
        mut clock: DpClock,
        run: RunHandler,
    ) -> std::result::Result<Served, RpcError> {
        let ph = clock.phase();
        let OpenCall { d, peer, rkey, len } = self.open_call(&conn, &desc, len, &ph).await?;
        let buf = self.pool.acquire(len).map_err(dp_error)?;
        let read = self
            .comm
            .transfer(
                &peer.ep,
                Op::Read,
                &[TransferDesc {
                    local: buf.registration(),
                    local_offset: 0,
                    remote: &rkey,
                    remote_offset: 0,
                    len,
                }],
                ph.deadline,
            )
            .await;
        if let Err(e) = read {
            self.on_transfer_error(&d.reply_to, &peer, &d.request, &e);
            return Err(ph.error(&self.config, "reading the request payload", e));
        }
        clock.spent(&ph);
        Counters::bump(&self.counters.buffer_calls);
        let req = Arc::new(buf);
        let payload = Bytes::from_owner(SharedView {
            buf: req.clone(),
            len,
        });
        let resp = run(payload).await?;
        let fits = d
            .response
            .as_ref()
            .is_some_and(|r| r.region.len >= resp.len());
        if resp.len() < self.config.threshold {
            return Ok(Served::Answer(Ok(resp)));
        }
        if !fits {
            Counters::bump(&self.counters.fallbacks);
            return Ok(Served::Answer(Ok(resp)));
        }
        let region = d.response.as_ref().expect("checked by `fits`");
        self.check_region(region, Access::WRITE, "response")?;
        let ph = clock.phase();
        let wkey = self
            .key(&peer, region)
            .map_err(|e| dp_error(format!("importing the response region: {e}")))?;
        // The response is sent from a registered buffer: the request's own when the handler
        // answered with (a slice of) the request bytes, as echo does; else a pooled copy.
        let base = req.region().addr as usize;
        let p = resp.as_ptr() as usize;
        let own;
        let (local, offset) = if p >= base && p + resp.len() <= base + req.len() {
            (req.registration(), p - base)
        } else {
            match self.pool.acquire(resp.len()) {
                Ok(b) => {
                    b.fill(&resp).map_err(dp_error)?;
                    own = b;
                    (own.registration(), 0)
                }
                Err(e) => {
                    tracing::debug!(error = %e, "no buffer for the response; sending it TCP_STREAM");
                    Counters::bump(&self.counters.fallbacks);
                    return Ok(Served::Answer(Ok(resp)));
                }
            }
        };
        let write = self
            .comm
            .transfer(
                &peer.ep,
                Op::Write,
                &[TransferDesc {
                    local,
                    local_offset: offset,
                    remote: &wkey,
                    remote_offset: 0,
                    len: resp.len(),
                }],
                ph.deadline,
            )
            .await;
        if let Err(e) = write {
            self.on_transfer_error(&d.reply_to, &peer, region, &e);
            return Err(ph.error(&self.config, "writing the response", e));
        }
        Counters::bump(&self.counters.buffer_responses);
        Ok(Served::InBuffer(resp.len() as u64))
    }

    /// The device method's path: READ chunk i into one pooled bounce buffer while chunk
    /// i - 1 goes from the other to the device; run the handler; WRITE chunk i of a large
    /// response from one bounce buffer while chunk i + 1 is copied out of the device into
    /// the other. Two pooled buffers of one chunk each, whatever the payload's size.
    async fn serve_device_inner(
        self: Arc<Self>,
        conn: Arc<ConnUse>,
        desc: Bytes,
        len: u64,
        mut clock: DpClock,
        ctx: CallContext,
        route: Arc<dyn DeviceRoute>,
    ) -> std::result::Result<Served, RpcError> {
        let ph = clock.phase();
        let OpenCall { d, peer, rkey, len } = self.open_call(&conn, &desc, len, &ph).await?;
        let chunk = DEFAULT_DEVICE_STAGING.chunk;
        let bounce = [
            self.pool.acquire(chunk).map_err(dp_error)?,
            self.pool.acquire(chunk).map_err(dp_error)?,
        ];
        let mut sink = route.sink(len as u64);
        let n = len.div_ceil(chunk);
        let piece = |i: usize| (i * chunk, chunk.min(len - i * chunk));
        for i in 0..=n {
            let fetch = async {
                if i < n {
                    let (off, l) = piece(i);
                    let desc = bounce_desc(&bounce[i % 2], &rkey, off, l);
                    self.comm
                        .transfer(&peer.ep, Op::Read, &desc, ph.deadline)
                        .await?;
                }
                Ok::<(), Error>(())
            };
            let drain = async {
                if i > 0 {
                    let (off, l) = piece(i - 1);
                    // A copy error stays in the sink and is reported when it finishes.
                    sink.write(off as u64, bounce[(i - 1) % 2].as_slice(l)?);
                }
                Ok::<(), Error>(())
            };
            let (fetched, drained) = futures::join!(fetch, drain);
            if let Err(e) = fetched {
                self.on_transfer_error(&d.reply_to, &peer, &d.request, &e);
                return Err(ph.error(&self.config, "reading the request payload", e));
            }
            drained.map_err(dp_error)?;
        }
        clock.spent(&ph);
        Counters::bump(&self.counters.buffer_calls);
        let out = route
            .run_raw(ctx, DeviceRequest::Staged(sink.finish()))
            .await?;
        let region = d.response.as_ref().filter(|r| r.region.len >= out.len());
        let Some(region) = region.filter(|_| out.len() >= self.config.threshold) else {
            if out.len() >= self.config.threshold {
                Counters::bump(&self.counters.fallbacks);
            }
            // Small (or no room lent): one copy to host memory, answered on the stream.
            let mut host = vec![0u8; out.len()];
            out.copy_out(0, &mut hmc_core::MemSpanMut::host(&mut host))
                .map_err(|e| dp_error(format!("copying the response off the device: {e}")))?;
            return Ok(Served::Answer(Ok(Bytes::from(host))));
        };
        self.check_region(region, Access::WRITE, "response")?;
        let wkey = self
            .key(&peer, region)
            .map_err(|e| dp_error(format!("importing the response region: {e}")))?;
        let total = out.len();
        let n = total.div_ceil(chunk);
        let piece = |i: usize| (i * chunk, chunk.min(total - i * chunk));
        let copy_out = |i: usize| -> Result<()> {
            let (off, l) = piece(i);
            let r = bounce[i % 2].region().slice(0, l)?;
            #[allow(unsafe_code)]
            // SAFETY: bounce buffer `i % 2` is host memory this call holds (a pooled
            // registered buffer, alive until the call ends), and nothing else touches it
            // now: the WRITE that used it last (chunk i - 2) has completed, and the WRITE
            // running meanwhile reads the other one.
            let mut dst = unsafe { hmc_core::MemSpanMut::from_region(r) };
            out.copy_out(off, &mut dst)
        };
        let ph = clock.phase();
        copy_out(0).map_err(|e| dp_error(format!("copying the response off the device: {e}")))?;
        for i in 0..n {
            let (off, l) = piece(i);
            let desc = bounce_desc(&bounce[i % 2], &wkey, off, l);
            let send = self.comm.transfer(&peer.ep, Op::Write, &desc, ph.deadline);
            let next = async {
                if i + 1 < n {
                    copy_out(i + 1)?;
                }
                Ok::<(), Error>(())
            };
            let (sent, copied) = futures::join!(send, next);
            if let Err(e) = sent {
                self.on_transfer_error(&d.reply_to, &peer, region, &e);
                return Err(ph.error(&self.config, "writing the response", e));
            }
            copied.map_err(|e| dp_error(format!("copying the response off the device: {e}")))?;
        }
        Counters::bump(&self.counters.buffer_responses);
        Ok(Served::InBuffer(total as u64))
    }

    fn on_transfer_error(&self, addr: &PeerAddr, peer: &Peer<C>, region: &RemoteRegion, e: &Error) {
        self.forget_key(peer, region);
        if !matches!(
            e,
            Error::InvalidKey(_) | Error::OutOfBounds { .. } | Error::AccessDenied(_)
        ) {
            self.forget_peer(addr);
        }
    }
}

impl<C: Communicator> ServerPlane for ServerDp<C> {
    fn serve(
        self: Arc<Self>,
        conn: Arc<ConnUse>,
        desc: Bytes,
        len: u64,
        deadline: Deadline,
        work: Work,
    ) -> BoxFuture<'static, Served> {
        Box::pin(async move {
            let me = self.clone();
            let clock = DpClock::new(deadline, self.config.timeout);
            let served = match work {
                Work::Bytes(run) => self.serve_inner(conn, desc, len, clock, run).await,
                Work::Device(ctx, route) => {
                    self.serve_device_inner(conn, desc, len, clock, ctx, route)
                        .await
                }
            };
            served.unwrap_or_else(|e| {
                Counters::bump(&me.counters.failures);
                tracing::debug!(status = %e.status, why = %e.message, "HMC_BUFFER call failed");
                Served::Answer(Err(e))
            })
        })
    }

    fn stats(&self) -> DataPlaneStats {
        DataPlaneStats {
            endpoints: self.peers.lock().len(),
            ..self.counters.stats(self.pool.stats())
        }
    }

    fn release(&self, conn: &ConnUse) {
        let Some(addrs) = conn.addrs.lock().take() else {
            return;
        };
        let mut peers = self.peers.lock();
        for a in addrs {
            if let Some(p) = peers.get(&a) {
                let left = p
                    .users
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                    .map_or(0, |prev| prev - 1);
                if left == 0 {
                    peers.remove(&a);
                }
            }
        }
    }
}

/// `Bytes` owner over a pooled buffer also used as the response source.
struct SharedView<C: Communicator> {
    buf: Arc<PooledBuffer<C>>,
    len: usize,
}

impl<C: Communicator> AsRef<[u8]> for SharedView<C> {
    fn as_ref(&self) -> &[u8] {
        self.buf.as_slice(self.len).unwrap_or(&[])
    }
}

/// The client half of HMC_BUFFER: the communicator and its buffer pool. Share one among
/// clients ([`crate::Client::with_client_data_plane`]) so that reconnecting clients reuse
/// the same registered buffers.
pub struct ClientDataPlane<C: Communicator> {
    pub(crate) comm: Arc<C>,
    /// Request buffers, exported READ only; key-scoped (see [`BufferPool::key_scoped`]).
    req_pool: BufferPool<C>,
    /// Response buffers, exported WRITE only; key-scoped.
    resp_pool: BufferPool<C>,
    pub(crate) config: DataPlaneConfig,
    counters: Counters,
    lent: Arc<LentBuffers>,
}

/// The buffers of one HMC_BUFFER call. Returned to the pool once the server answered OK;
/// discarded (deregistered, so the server's key dies) otherwise, because a server that
/// gave up may still have a transfer in flight.
pub(crate) struct PreparedCall<C: Communicator> {
    pub(crate) descriptor: Bytes,
    request: Option<PooledBuffer<C>>,
    /// The caller's [`RequestBuffer`] lent as the request: its discard flag.
    lent: Option<Arc<std::sync::atomic::AtomicBool>>,
    response: Option<PooledBuffer<C>>,
    settled: bool,
}

impl<C: Communicator> PreparedCall<C> {
    /// The server answered OK with its response in our region: the bytes, no copy.
    pub(crate) fn take_response(mut self, len: u64) -> Result<Bytes> {
        self.settled = true;
        let resp = self.response.take().ok_or_else(|| {
            Error::Protocol("HMC_BUFFER response to a call that lent no response region".into())
        })?;
        // The call is over: the server's WRITE key must not reach the bytes the caller now
        // holds. Where the transport cannot rekey, only this server holds a live key (the
        // buffer is quarantined to it when it returns to the pool).
        if let Err(e) = resp.revoke_keys() {
            // Not lent on with a live key: deregistered (the key dies) after a copy.
            tracing::debug!(error = %e, "rekeying the response buffer failed; copying the response");
            let out = Bytes::copy_from_slice(resp.as_slice(len as usize)?);
            resp.discard();
            return Ok(out);
        }
        resp.into_bytes(len as usize)
    }

    /// The server answered OK with the response inline or streamed.
    pub(crate) fn settle(mut self) {
        self.settled = true;
    }
}

impl<C: Communicator> Drop for PreparedCall<C> {
    fn drop(&mut self) {
        if !self.settled {
            if let Some(b) = self.request.take() {
                b.discard();
            }
            if let Some(d) = self.lent.take() {
                d.store(true, Ordering::Release);
            }
            if let Some(b) = self.response.take() {
                b.discard();
            }
        }
    }
}

impl<C: Communicator> ClientDataPlane<C> {
    /// A data plane over `comm` with an empty pool.
    pub fn new(comm: Arc<C>, config: DataPlaneConfig) -> Self {
        ClientDataPlane {
            req_pool: BufferPool::key_scoped(comm.clone(), Access::READ, config.pool),
            resp_pool: BufferPool::key_scoped(comm.clone(), Access::WRITE, config.pool),
            comm,
            config,
            counters: Counters::default(),
            lent: Arc::default(),
        }
    }

    /// A pooled registered buffer of `len` bytes to write a request payload into, for
    /// calls without the copy into a pooled buffer (see [`RequestBuffer`]). Fails like
    /// the pool does ([`Error::LimitExceeded`] naming `max_pool_bytes`). Where the
    /// transport cannot rekey, only a buffer no peer holds a live key of is lent (possibly
    /// a fresh registration); [`ClientDataPlane::request_buffer_for`] reuses one of the
    /// same server's.
    pub fn request_buffer(&self, len: usize) -> Result<RequestBuffer<C>> {
        Ok(RequestBuffer::new(
            self.req_pool.acquire(len)?,
            len,
            self.lent.clone(),
        ))
    }

    /// [`ClientDataPlane::request_buffer`] for calls to the server at `server` only: where
    /// the transport cannot rekey, a pooled buffer last lent to that server may be reused
    /// (one lent to another server never is), so the pool need not register a fresh one.
    /// Lending it to another server's call is safe but retires it when it returns.
    pub fn request_buffer_for(&self, len: usize, server: &PeerAddr) -> Result<RequestBuffer<C>> {
        Ok(RequestBuffer::new(
            self.req_pool
                .acquire_for(len, Some(crate::pool::peer_tag(server)))?,
            len,
            self.lent.clone(),
        ))
    }

    /// Lends `payload` itself when it is a frozen [`RequestBuffer`] of this data plane,
    /// else copies it into a pooled buffer; and lends a response region of `response_len`
    /// bytes (0: none), for a call to the server tagged `peer` ([`crate::pool::peer_tag`]
    /// of its address). Fails (and the caller falls back to TCP_STREAM) when the pool
    /// cannot lend.
    pub(crate) fn prepare(
        &self,
        payload: &[u8],
        response_len: usize,
        peer: u64,
    ) -> Result<PreparedCall<C>> {
        let lent = self.lent.find(payload);
        let r = (|| {
            let (request, export) = match &lent {
                Some(l) => {
                    mark_lent(&l.mark, peer);
                    (None, l.export.clone())
                }
                None => {
                    let request = self.req_pool.acquire_for(payload.len(), Some(peer))?;
                    request.fill(payload)?;
                    mark_lent(request.mark(), peer);
                    let export = request.export();
                    (Some(request), export)
                }
            };
            let response = if response_len > 0 {
                let b = self.resp_pool.acquire_for(response_len, Some(peer))?;
                mark_lent(b.mark(), peer);
                Some(b)
            } else {
                None
            };
            let desc = BufferDescriptor {
                reply_to: self.comm.address(),
                request: export,
                response: response.as_ref().map(|b| b.export()),
            };
            Ok(PreparedCall {
                descriptor: Bytes::from(desc.encode()),
                request,
                lent: None,
                response,
                settled: true,
            })
        })();
        match r {
            Ok(mut p) => {
                p.settled = false;
                if let Some(l) = lent {
                    p.lent = Some(l.discard);
                    Counters::bump(&self.counters.lent_requests);
                }
                Counters::bump(&self.counters.buffer_calls);
                Ok(p)
            }
            Err(e) => {
                Counters::bump(&self.counters.fallbacks);
                Err(e)
            }
        }
    }

    pub(crate) fn failed(&self) {
        Counters::bump(&self.counters.failures);
    }

    pub(crate) fn responded_in_buffer(&self) {
        Counters::bump(&self.counters.buffer_responses);
    }

    /// Counters (shared by every client using this data plane); `pool` sums the request
    /// and response pools.
    pub fn stats(&self) -> DataPlaneStats {
        self.counters
            .stats(self.req_pool.stats().plus(self.resp_pool.stats()))
    }
}

/// A `Communicator` that has no data plane: every operation reports
/// [`Error::Unavailable`]. The default type parameter of the server and client, like
/// wgpu-hal's `empty` backend: it keeps the generic code honest without a transport.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoDataPlane;

/// Never constructed: [`NoDataPlane::register`] always fails.
#[derive(Debug)]
pub enum NoRegistration {}

impl LocalRegistration for NoRegistration {
    fn region(&self) -> Region {
        match *self {}
    }
    fn access(&self) -> Access {
        match *self {}
    }
}

fn unavailable() -> Error {
    Error::Unavailable {
        what: "RPC data plane".into(),
        reason: "no Communicator was configured for HMC_BUFFER payloads".into(),
        hint: "build the Server/Client with_data_plane(communicator), or send payloads INLINE/TCP_STREAM".into(),
    }
}

impl Communicator for NoDataPlane {
    type Endpoint = ();
    type Registration = NoRegistration;
    type RemoteKey = ();

    fn transport(&self) -> TransportId {
        TransportId::TCP
    }
    fn address(&self) -> PeerAddr {
        PeerAddr::Opaque {
            transport: TransportId::TCP,
            bytes: Vec::new(),
        }
    }
    fn connect(&self, _: &PeerAddr, _: Deadline) -> impl Future<Output = Result<()>> + Send {
        std::future::ready(Err(unavailable()))
    }
    // The trait declares `register` unsafe; this one touches no memory and always fails.
    #[allow(unsafe_code)]
    unsafe fn register(&self, _: Region, _: Access) -> Result<NoRegistration> {
        Err(unavailable())
    }
    fn export(&self, reg: &NoRegistration) -> Result<RemoteRegion> {
        match *reg {}
    }
    fn import(&self, _: &(), _: &RemoteRegion) -> Result<()> {
        Err(unavailable())
    }
    fn transfer(
        &self,
        _: &(),
        _: Op,
        _: &[TransferDesc<'_, Self>],
        _: Deadline,
    ) -> impl Future<Output = Result<()>> + Send {
        std::future::ready(Err(unavailable()))
    }
    fn notify(
        &self,
        _: &(),
        _: u64,
        _: &[u8],
        _: Deadline,
    ) -> impl Future<Output = Result<()>> + Send {
        std::future::ready(Err(unavailable()))
    }
    fn recv_notification(&self, _: Deadline) -> impl Future<Output = Result<Notification>> + Send {
        std::future::ready(Err(unavailable()))
    }
    fn close(&self) {}
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
            e.contains("RPC peer's own IP") && e.contains("--data-plane-allow"),
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

    #[tokio::test]
    async fn every_operation_reports_unavailable_with_a_hint() {
        let d = NoDataPlane;
        let e = d
            .connect(&d.address(), Deadline::default())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("with_data_plane"), "{e}");
        assert!(d.recv_notification(Deadline::default()).await.is_err());
    }
}
