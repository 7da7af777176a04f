//! One-sided data movement: peers, access rights, portable remote descriptors, deadlines, and the `Communicator` trait.

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, Instant};

use crate::{CommCapabilities, Error, Region, Result, TransportId};

/// What a peer may do to a registered region. Local code can always read and write it.
///
/// Rights combine with `|` (`Access::READ | Access::WRITE == Access::READ_WRITE`); `Debug`
/// and `Display` name them (`Access(READ | WRITE)`, `READ | WRITE`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Access(u8);

impl Access {
    /// Peers may READ (get) from the region.
    pub const READ: Access = Access(1);
    /// Peers may WRITE (put) into the region.
    pub const WRITE: Access = Access(2);
    /// Peers may READ and WRITE.
    pub const READ_WRITE: Access = Access(3);

    /// True when every right in `other` is granted by `self`.
    pub const fn allows(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// The right an operation needs at the target.
    pub const fn required_by(op: Op) -> Access {
        match op {
            Op::Read => Access::READ,
            Op::Write => Access::WRITE,
        }
    }

    /// The bits, for descriptors.
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// From bits; unknown bits are refused.
    pub fn from_bits(bits: u8) -> Result<Self> {
        if bits == 0 || bits & !3 != 0 {
            return Err(Error::InvalidArgument(format!(
                "invalid access bits {bits:#x}"
            )));
        }
        Ok(Access(bits))
    }

    const NAMES: [(Access, &'static str); 2] = [(Access::READ, "READ"), (Access::WRITE, "WRITE")];
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        for (right, name) in Self::NAMES {
            if self.allows(right) {
                write!(f, "{sep}{name}")?;
                sep = " | ";
            }
        }
        // `from_bits` refuses other bits, so only an empty value (never constructed) is left.
        if sep.is_empty() {
            f.write_str("NONE")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Access({self})")
    }
}

/// The direction of a one-sided transfer, seen from the initiator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Remote bytes are copied into local memory (get).
    Read,
    /// Local bytes are copied into remote memory (put). Complete when visible at the target.
    Write,
}

/// Where a peer listens. Text form: `tcp://127.0.0.1:7000`, `tcp://[::1]:7000`,
/// `unix:///run/hmc.sock`, or `<transport>:<hex bytes>` for opaque transport addresses.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PeerAddr {
    /// A TCP socket address.
    Tcp(SocketAddr),
    /// A Unix domain socket path.
    Unix(PathBuf),
    /// A transport-specific address (for example a UCX worker address).
    Opaque {
        /// The transport the bytes belong to.
        transport: TransportId,
        /// The address bytes.
        bytes: Vec<u8>,
    },
}

impl fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerAddr::Tcp(a) => write!(f, "tcp://{a}"),
            PeerAddr::Unix(p) => write!(f, "unix://{}", p.display()),
            PeerAddr::Opaque { transport, bytes } => {
                write!(f, "{}:", transport.wire_id())?;
                bytes.iter().try_for_each(|b| write!(f, "{b:02x}"))
            }
        }
    }
}

impl FromStr for PeerAddr {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        if let Some(rest) = s.strip_prefix("tcp://") {
            return rest.parse().map(PeerAddr::Tcp).map_err(|e| {
                Error::InvalidArgument(format!("`{s}` is not tcp://HOST:PORT with an IP host: {e}"))
            });
        }
        if let Some(rest) = s.strip_prefix("unix://") {
            if rest.is_empty() {
                return Err(Error::InvalidArgument("unix:// needs a socket path".into()));
            }
            return Ok(PeerAddr::Unix(PathBuf::from(rest)));
        }
        // The opaque form `Display` writes: `<transport wire id>:<hex bytes>`.
        if let Some((id, hex)) = s.split_once(':')
            && let Ok(id) = id.parse::<u8>()
            && hex.len() % 2 == 0
            && hex.bytes().all(|b| b.is_ascii_hexdigit())
        {
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("checked hex digits"))
                .collect();
            return Ok(PeerAddr::Opaque {
                transport: TransportId::from_wire_id(id),
                bytes,
            });
        }
        Err(Error::InvalidArgument(format!(
            "`{s}` is not a peer address; use tcp://IP:PORT, unix:///path or <transport id>:<hex>"
        )))
    }
}

/// An absolute point in time by which an operation must finish.
///
/// Every operation takes one; [`Deadline::default`] is [`Deadline::DEFAULT_TIMEOUT`] from now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deadline(Instant);

impl Deadline {
    /// The timeout used when the caller does not choose one.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

    /// `timeout` from now (saturating far in the future).
    pub fn after(timeout: Duration) -> Self {
        let now = Instant::now();
        Deadline(
            now.checked_add(timeout)
                .unwrap_or(now + Duration::from_secs(86_400 * 365)),
        )
    }

    /// At `instant`.
    pub fn at(instant: Instant) -> Self {
        Deadline(instant)
    }

    /// The instant.
    pub fn instant(&self) -> Instant {
        self.0
    }

    /// Time left, zero once passed.
    pub fn remaining(&self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }

    /// True once passed.
    pub fn is_expired(&self) -> bool {
        Instant::now() >= self.0
    }

    /// The earlier of two deadlines.
    pub fn min(self, other: Deadline) -> Deadline {
        if self.0 <= other.0 { self } else { other }
    }
}

impl Default for Deadline {
    fn default() -> Self {
        Deadline::after(Self::DEFAULT_TIMEOUT)
    }
}

/// A portable description of a registered region: what a peer needs to reach it.
///
/// Encoded (version 1, big-endian) as: version `u8`, transport `u8`, device kind `u8`,
/// access `u8`, device ordinal `u32`, address `u64`, length `u64`, key length `u32`, key.
/// Any transport and device-kind number decodes (they are open identifiers); the
/// importing transport refuses one it does not own ([`RemoteRegion::check_transport`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RemoteRegion {
    /// The transport that can reach it.
    pub transport: TransportId,
    /// The device and address range at the owner.
    pub region: Region,
    /// What the owner allows peers to do.
    pub access: Access,
    /// The transport's packed remote key (opaque to everyone else).
    pub key: Vec<u8>,
}

impl RemoteRegion {
    /// Current descriptor version.
    pub const VERSION: u8 = 1;
    /// Largest packed key accepted when decoding.
    pub const MAX_KEY_LEN: usize = 64 * 1024;
    const FIXED_LEN: usize = 1 + 1 + 1 + 1 + 4 + 8 + 8 + 4;

    /// Encodes the descriptor.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::FIXED_LEN + self.key.len());
        out.push(Self::VERSION);
        out.push(self.transport.wire_id());
        out.push(self.region.device.kind.wire_id());
        out.push(self.access.bits());
        out.extend_from_slice(&self.region.device.ordinal.to_be_bytes());
        out.extend_from_slice(&self.region.addr.to_be_bytes());
        out.extend_from_slice(&(self.region.len as u64).to_be_bytes());
        out.extend_from_slice(&(self.key.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.key);
        out
    }

    /// Decodes and validates a descriptor; refuses unknown versions, access bits, and
    /// lengths that do not match the bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let bad = |why: String| Error::InvalidArgument(format!("remote region descriptor: {why}"));
        if bytes.len() < Self::FIXED_LEN {
            return Err(bad(format!(
                "{} bytes is shorter than the {} byte header",
                bytes.len(),
                Self::FIXED_LEN
            )));
        }
        if bytes[0] != Self::VERSION {
            return Err(bad(format!(
                "version {} is not supported (expected {})",
                bytes[0],
                Self::VERSION
            )));
        }
        let be_u32 = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
        let be_u64 = |at: usize| u64::from_be_bytes(bytes[at..at + 8].try_into().unwrap());
        let transport = TransportId::from_wire_id(bytes[1]);
        let kind = crate::DeviceKind::from_wire_id(bytes[2]);
        let access = Access::from_bits(bytes[3])?;
        let ordinal = be_u32(4);
        let addr = be_u64(8);
        let len = usize::try_from(be_u64(16))
            .map_err(|_| bad("length does not fit this platform".into()))?;
        let key_len = be_u32(24) as usize;
        if key_len > Self::MAX_KEY_LEN {
            return Err(bad(format!(
                "key length {key_len} exceeds {}",
                Self::MAX_KEY_LEN
            )));
        }
        if bytes.len() != Self::FIXED_LEN + key_len {
            return Err(bad(format!(
                "key length {key_len} does not match the {} bytes that follow",
                bytes.len() - Self::FIXED_LEN
            )));
        }
        if addr.checked_add(len as u64).is_none() {
            return Err(bad("address + length overflows".into()));
        }
        Ok(RemoteRegion {
            transport,
            region: Region {
                device: crate::Device::new(kind, ordinal),
                addr,
                len,
            },
            access,
            key: bytes[Self::FIXED_LEN..].to_vec(),
        })
    }
}

impl RemoteRegion {
    /// Refuses a descriptor that transport `own` did not make, naming both transports:
    /// what every `import` does first.
    pub fn check_transport(&self, own: TransportId) -> Result<()> {
        if self.transport == own {
            return Ok(());
        }
        Err(Error::InvalidArgument(format!(
            "a region descriptor of the {} transport (wire id {}) cannot be imported by the \
             {own} transport (wire id {}); import it with the communicator of the transport \
             that exported it",
            self.transport,
            self.transport.wire_id(),
            own.wire_id()
        )))
    }
}

/// One element of a transfer batch: `len` bytes between a local registration at
/// `local_offset` and an imported remote region at `remote_offset`.
pub struct TransferDesc<'a, C: Communicator + ?Sized> {
    /// Local registered memory.
    pub local: &'a C::Registration,
    /// Offset into the local registration.
    pub local_offset: usize,
    /// Imported remote region.
    pub remote: &'a C::RemoteKey,
    /// Offset into the remote region.
    pub remote_offset: u64,
    /// Bytes to move.
    pub len: usize,
}

impl<'a, C: Communicator + ?Sized> TransferDesc<'a, C> {
    /// `len` bytes between `local` at `local_offset` and `remote` at `remote_offset`.
    ///
    /// The same as the struct literal; prefer it inside `async` blocks and closures,
    /// where naming the associated-type fields in a literal (or struct-update syntax) has
    /// tripped the compiler.
    pub fn new(
        local: &'a C::Registration,
        local_offset: usize,
        remote: &'a C::RemoteKey,
        remote_offset: u64,
        len: usize,
    ) -> Self {
        TransferDesc {
            local,
            local_offset,
            remote,
            remote_offset,
            len,
        }
    }
}

impl<C: Communicator + ?Sized> Clone for TransferDesc<'_, C> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<C: Communicator + ?Sized> Copy for TransferDesc<'_, C> {}

impl<C: Communicator + ?Sized> fmt::Debug for TransferDesc<'_, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransferDesc")
            .field("local_offset", &self.local_offset)
            .field("remote_offset", &self.remote_offset)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// A small message received from a peer with [`Communicator::notify`].
///
/// There is no reply channel on the connection it came on. To answer, connect to `from`
/// and notify back; a transport may accept that only from a peer it trusts (the TCP
/// transport: one that holds a live key of one of its regions, or that shares its
/// authentication secret), so hand the sender a ticket of a region of yours first, or
/// give both sides the same secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notification {
    /// The sender's listening address, as it announced it.
    pub from: PeerAddr,
    /// The sender's tag.
    pub tag: u64,
    /// The message.
    pub msg: Vec<u8>,
}

/// Local memory known to a transport.
pub trait LocalRegistration: Send + Sync + 'static {
    /// The registered memory.
    fn region(&self) -> Region;
    /// What peers may do to it.
    fn access(&self) -> Access;
}

/// One-sided data movement between registered regions of two peers.
///
/// # Contract (checked by the conformance kit, `hmc_core::testing`)
/// - `transfer` completes when every descriptor is done; for [`Op::Write`], when the bytes
///   are visible at the target. It ends by `deadline` with [`Error::DeadlineExceeded`] at
///   the latest, and with an error (never a hang) when the peer goes away.
/// - Every descriptor is checked against both regions' bounds and access rights before any
///   byte moves; a refused batch moves nothing.
/// - Dropping a `transfer` future cancels it: once the drop returns, the transport no
///   longer touches the local memory of that batch, and the endpoint stays usable.
/// - All methods may be called from many threads at once.
pub trait Communicator: Send + Sync + 'static {
    /// A connection to one peer. Cheap to clone.
    type Endpoint: Clone + Send + Sync + 'static;
    /// Local memory registered with this transport. Deregistered when dropped.
    type Registration: LocalRegistration;
    /// A peer's region imported for use on one endpoint.
    type RemoteKey: Send + Sync + 'static;

    /// Which transport this is.
    fn transport(&self) -> TransportId;

    /// What this transport can do: memory kinds it registers and reaches, notifications,
    /// limits, zero-copy. Ask before trying. The default is
    /// [`CommCapabilities::new`]'s conservative answer (host memory only); a transport
    /// that can do more overrides it.
    fn capabilities(&self) -> CommCapabilities {
        CommCapabilities::new(self.transport())
    }

    /// The address peers connect to.
    fn address(&self) -> PeerAddr;

    /// Connects to a peer listening at `peer`.
    fn connect(
        &self,
        peer: &PeerAddr,
        deadline: Deadline,
    ) -> impl Future<Output = Result<Self::Endpoint>> + Send;

    /// Registers memory so that this transport (and peers, as `access` allows) can use it.
    ///
    /// # Safety
    /// `region` must stay allocated until the returned registration is dropped, and the
    /// caller accepts that peers with the exported key read or write it at any time (as a
    /// DMA engine would). [`crate::RegisteredBuffer`] is the safe way to get one.
    unsafe fn register(&self, region: Region, access: Access) -> Result<Self::Registration>;

    /// Registers `region`, memory of `memory`'s device, with the backend that owns it, so
    /// that peers reach it whatever the memory kind: a transport that moves the kind
    /// directly registers it as [`Communicator::register`] would; one that stages it
    /// ([`CommCapabilities::memory_path`] says [`Staged`](crate::DeviceMemoryPath::Staged))
    /// serves peers' READs and WRITEs of it through `memory`'s copies and host bounce
    /// buffers of its own. As the local side of this communicator's own
    /// [`Communicator::transfer`], a staged registration is refused: stage it yourself
    /// ([`crate::Stager`]) as an engine does.
    ///
    /// The default: host memory and kinds in `local_memory` go to `register`; other kinds
    /// are refused with [`Error::UnsupportedMemory`].
    ///
    /// # Safety
    /// As for [`Communicator::register`], and `region` must be memory of `memory`'s device.
    unsafe fn register_memory(
        &self,
        region: Region,
        access: Access,
        memory: &crate::AnyMemory,
    ) -> Result<Self::Registration> {
        let _ = memory;
        let caps = self.capabilities();
        if caps.memory_path(region.device.kind) == crate::DeviceMemoryPath::Refused {
            return Err(Error::UnsupportedMemory {
                transport: self.transport(),
                device: region.device,
                reason: format!(
                    "the {} transport neither registers nor stages {} memory; stage it \
                     through registered host memory (hmc_core::Stager), or use a transport \
                     whose capabilities() accept it",
                    self.transport(),
                    region.device.kind
                ),
            });
        }
        // SAFETY: forwarded contract.
        unsafe { self.register(region, access) }
    }

    /// Host memory of `len` bytes that the transport allocates, registers for `access` and
    /// owns until the returned registration drops, for transports where such memory is
    /// faster than user memory passed to [`Communicator::register`] (UCX maps memory it
    /// allocated itself straight into peers on shared memory, while user memory goes
    /// through emulated one-sided transfers).
    ///
    /// `Ok(None)` (the default) means the transport has no such fast path: allocate host
    /// memory and [`Communicator::register`] it yourself. With `Some(reg)`, the bytes are
    /// host memory at `reg.region()` (`len` bytes at least), readable and writable by the
    /// owner like any registered host buffer, under the same DMA rule: peers holding the
    /// exported key may read or write them at any time until `reg` drops.
    fn alloc_registered(&self, len: usize, access: Access) -> Result<Option<Self::Registration>> {
        let _ = (len, access);
        Ok(None)
    }

    /// Makes every key exported for `reg` so far stop working: a peer that kept one from an
    /// earlier [`Communicator::export`] can no longer read or write `reg` through it, and
    /// later exports carry a new key. Used to scope a key to one use of long-lived,
    /// pooled memory (an RPC call's buffer), so a stale key cannot reach the bytes of the
    /// buffer's next use.
    ///
    /// `Ok(true)`: revoked. `Ok(false)` (the default): this transport cannot revoke the
    /// keys of a live registration; a caller that needs it must drop and re-register the
    /// memory, or reuse it only where a stale key reaches nothing new (the same peer).
    /// Transfers already in flight with an old key may still complete or fail; none
    /// starts with it after this returns.
    fn rekey(&self, reg: &Self::Registration) -> Result<bool> {
        let _ = reg;
        Ok(false)
    }

    /// A portable descriptor of `reg` for a peer to [`Communicator::import`].
    ///
    /// Refuses (with [`Error::InvalidArgument`]) a registration this communicator did not
    /// make, including one of another instance of the same transport: the key it would
    /// export belongs to the other instance.
    fn export(&self, reg: &Self::Registration) -> Result<RemoteRegion>;

    /// Imports a peer's descriptor for use on `ep`. Refuses descriptors of another transport
    /// ([`RemoteRegion::check_transport`]).
    fn import(&self, ep: &Self::Endpoint, remote: &RemoteRegion) -> Result<Self::RemoteKey>;

    /// The peer's region `remote`, `len` bytes at `offset`, mapped into this process for
    /// `access` in place, where this transport has it mapped (shared memory): the caller
    /// reads or writes it directly instead of through a [`Communicator::transfer`] into a
    /// local registration, saving a copy. The key is checked as a transfer would check it
    /// (bounds, rights, not revoked); while the view lives the key counts as in use, so the
    /// owner's [`Communicator::rekey`] waits for it, as it waits for a transfer in progress.
    ///
    /// `Ok(None)` (the default): not mappable here (another transport, a region not mapped
    /// yet, user memory); use `transfer`. A caller must handle `None` as the normal case.
    fn view(
        &self,
        ep: &Self::Endpoint,
        remote: &Self::RemoteKey,
        offset: u64,
        len: usize,
        access: Access,
    ) -> Result<Option<crate::RemoteView>> {
        let _ = (ep, remote, offset, len, access);
        Ok(None)
    }

    /// Whether a batch with device memory registered here by
    /// [`Communicator::register_memory`] as its local side (`local`) and `remote` on `ep`
    /// is moved by this communicator itself, device memory to device memory (same-host
    /// vendor IPC). `false` (the default): a caller moves such memory through host buffers
    /// of its own; only a communicator that answers `true` is handed it as a local side.
    fn moves_device_memory(
        &self,
        ep: &Self::Endpoint,
        local: &Self::Registration,
        remote: &Self::RemoteKey,
    ) -> bool {
        let _ = (ep, local, remote);
        false
    }

    /// Runs a batch of descriptors of one direction against one peer.
    fn transfer(
        &self,
        ep: &Self::Endpoint,
        op: Op,
        batch: &[TransferDesc<'_, Self>],
        deadline: Deadline,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Makes sure that no byte of a WRITE on `ep` that ended early (its `transfer` future
    /// dropped, or ended by its deadline or an error) lands at the peer any more.
    ///
    /// Once this returns `Ok`, the peer's memory holds whatever of those WRITEs had landed
    /// and nothing more will: the caller may report their end and the peer may reuse its
    /// memory. An error means that could not be confirmed by `deadline` (a stopped or
    /// unreachable peer, a peer of an older wire version): bytes the peer already received
    /// may still be applied, and the error says which case it is.
    ///
    /// The default returns `Ok` at once, for transports whose dropped `transfer` future
    /// already guarantees this (they copy in the caller's process, or flush before the
    /// drop returns). A transport whose target applies received bytes on its own (TCP)
    /// overrides it. Healthy transfers need no call: a `transfer` that returned `Ok` has
    /// landed all of its bytes.
    fn settle(
        &self,
        ep: &Self::Endpoint,
        deadline: Deadline,
    ) -> impl Future<Output = Result<()>> + Send {
        let _ = (ep, deadline);
        async { Ok(()) }
    }

    /// Sends a small message; messages from one endpoint arrive in order.
    fn notify(
        &self,
        ep: &Self::Endpoint,
        tag: u64,
        msg: &[u8],
        deadline: Deadline,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Waits for the next message any peer sent with [`Communicator::notify`].
    fn recv_notification(
        &self,
        deadline: Deadline,
    ) -> impl Future<Output = Result<Notification>> + Send;

    /// Closes every endpoint and the listener; pending operations end with an error.
    fn close(&self);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, DeviceKind};

    #[test]
    fn remote_region_round_trips_and_refuses_damage() {
        let r = RemoteRegion {
            transport: TransportId::TCP,
            region: Region {
                device: Device::new(DeviceKind::CUDA, 3),
                addr: 0xdead_0000,
                len: 4096,
            },
            access: Access::READ,
            key: vec![1, 2, 3, 4, 5],
        };
        let bytes = r.encode();
        assert_eq!(RemoteRegion::decode(&bytes).unwrap(), r);
        assert!(RemoteRegion::decode(&bytes[..bytes.len() - 1]).is_err());
        let mut v2 = bytes.clone();
        v2[0] = 2;
        assert!(RemoteRegion::decode(&v2).is_err());
        let mut bad_access = bytes.clone();
        bad_access[3] = 0x80;
        assert!(RemoteRegion::decode(&bad_access).is_err());
    }

    /// Bytes encoded by the version-1 code of before open identifiers (transport TCP,
    /// CUDA device 3, read-only, key 1..=5).
    const V1_TCP_CUDA: [u8; 33] = [
        1, 1, 1, 1, 0, 0, 0, 3, 0, 0, 0, 0, 0xde, 0xad, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0,
        5, 1, 2, 3, 4, 5,
    ];

    #[test]
    fn version_1_bytes_decode_and_re_encode_byte_for_byte() {
        let r = RemoteRegion::decode(&V1_TCP_CUDA).unwrap();
        assert_eq!(r.transport, TransportId::TCP);
        assert_eq!(r.region.device, Device::new(DeviceKind::CUDA, 3));
        assert_eq!(r.encode(), V1_TCP_CUDA);
    }

    #[rstest::rstest]
    #[case::third_party_transport(1, 200, 0)]
    #[case::third_party_device(2, 1, 130)]
    #[case::reserved_ascend(2, 2, 5)]
    fn unknown_ids_decode_and_only_a_foreign_import_refuses_them(
        #[case] _case: u8,
        #[case] transport: u8,
        #[case] kind: u8,
    ) {
        let mut bytes = V1_TCP_CUDA;
        bytes[1] = transport;
        bytes[2] = kind;
        let r = RemoteRegion::decode(&bytes).unwrap();
        assert_eq!(r.encode(), bytes);
        assert_eq!(r.region.device.kind, DeviceKind::from_wire_id(kind));
        let own = TransportId::from_wire_id(transport);
        r.check_transport(own).unwrap();
        let other = if own == TransportId::TCP {
            TransportId::UCX
        } else {
            TransportId::TCP
        };
        let err = r.check_transport(other).unwrap_err().to_string();
        assert!(
            err.contains(&format!("wire id {transport}")) && err.contains(&other.to_string()),
            "{err}"
        );
    }

    #[test]
    fn peer_addr_text_form_round_trips() {
        for s in [
            "tcp://127.0.0.1:7000",
            "tcp://[::1]:9",
            "unix:///tmp/x.sock",
        ] {
            assert_eq!(s.parse::<PeerAddr>().unwrap().to_string(), s);
        }
        assert!("127.0.0.1:7000".parse::<PeerAddr>().is_err());
        assert!("tcp://localhost:1".parse::<PeerAddr>().is_err());
        assert!("2:abc".parse::<PeerAddr>().is_err(), "odd hex length");
        let third_party = "200:00ff".parse::<PeerAddr>().unwrap();
        assert_eq!(third_party.to_string(), "200:00ff");
    }

    #[test]
    fn access_rights_compose() {
        assert!(Access::READ_WRITE.allows(Access::READ));
        assert!(!Access::READ.allows(Access::WRITE));
        assert_eq!(Access::required_by(Op::Write), Access::WRITE);
        assert!(Access::from_bits(0).is_err());
        assert_eq!(Access::READ | Access::WRITE, Access::READ_WRITE);
    }

    #[rstest::rstest]
    #[case::read(Access::READ, "Access(READ)")]
    #[case::write(Access::WRITE, "Access(WRITE)")]
    #[case::both(Access::READ_WRITE, "Access(READ | WRITE)")]
    fn access_debug_names_its_rights(#[case] access: Access, #[case] debug: &str) {
        assert_eq!(format!("{access:?}"), debug);
        assert_eq!(
            format!("{{{access}}}"),
            format!("{{{}}}", &debug[7..debug.len() - 1])
        );
    }

    #[test]
    fn deadlines_order_and_expire() {
        let soon = Deadline::after(Duration::ZERO);
        assert!(soon.is_expired());
        let later = Deadline::after(Duration::from_secs(60));
        assert_eq!(soon.min(later), soon);
        assert!(Deadline::after(Duration::MAX).remaining() > Duration::from_secs(1));
    }
}
