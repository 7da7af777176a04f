//! What engines tell each other over their metadata service (an `hmc-rpc` server beside
//! the data plane): the data-plane address and the table of registered regions, and
//! notifications. Encoded with `RpcCodec`; a field is only ever appended, with a version
//! bump.

use serde::{Deserialize, Serialize};

/// Method id of [`EngineInfo`] (request: [`Hello`]).
pub(crate) const METHOD_INFO: u32 = 0x454E_0001;
/// Method id of a [`NotifyMsg`] (response: unit).
pub(crate) const METHOD_NOTIFY: u32 = 0x454E_0002;

/// Method id of a directory lookup (request: [`Lookup`], response: `Option<Vec<u8>>`).
pub(crate) const METHOD_LOOKUP: u32 = 0x454E_0003;

/// Method id of an [`Instance`] (request: [`Hello`]): who answers, without the table.
pub(crate) const METHOD_HELLO: u32 = 0x454E_0004;

/// Method id of a [`Retract`] (response: [`NotifyAck`]): the sender gave up on a
/// notification it could not see queued.
pub(crate) const METHOD_RETRACT: u32 = 0x454E_0005;

/// The metadata format version this engine speaks (3: notifications carry a [`NotifyId`]
/// and are answered with a [`NotifyAck`]).
pub(crate) const VERSION: u32 = 3;

/// Who asks.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Hello {
    pub version: u32,
    /// The asking engine's own name (its metadata address).
    pub from: String,
}

/// An engine's answer to [`Hello`]: where its data plane listens and what peers may
/// reach.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct EngineInfo {
    pub version: u32,
    /// Random per engine instance: a restarted engine at the same address is another.
    pub instance: u64,
    /// The data plane's address (`Communicator::address`).
    pub data_plane: String,
    /// Bumped on every register and deregister.
    pub generation: u64,
    /// Every registered region, `RemoteRegion`-encoded.
    pub regions: Vec<Vec<u8>>,
}

/// An engine's answer to a [`Hello`] on [`METHOD_HELLO`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Instance {
    pub version: u32,
    pub instance: u64,
}

/// A metadata blob ([`crate::Engine::local_metadata`]): what [`EngineInfo`] says, with the
/// engine's name and metadata address, for peers that exchange it themselves.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Blob {
    pub magic: [u8; 4],
    pub version: u32,
    /// The engine's name (what `connect` takes) and its metadata service's address.
    pub name: String,
    pub address: String,
    /// A partial blob adds regions to a peer already added.
    pub partial: bool,
    pub info: EngineInfo,
}

/// A blob as sent: its encoding, and with a pre-shared secret, a MAC of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SignedBlob {
    pub body: Vec<u8>,
    pub mac: Option<Vec<u8>>,
}

/// A notification (HIXL's NotifyDesc: a name and a message).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct NotifyMsg {
    /// The sender's own name: still sent (the format is unchanged), never believed; the
    /// receiver names the sender by its connection.
    pub from: String,
    pub name: String,
    pub msg: Vec<u8>,
    /// Set on a failure notice: the attached transfer failed, and why (version 2).
    pub failed: Option<String>,
    /// Which send this is (version 3): a notification arriving again under an id the
    /// receiver has seen is not queued again, and a failure notice under the id of a
    /// queued notification takes its place.
    pub id: NotifyId,
}

/// One send of a notification: the sending engine's instance and a number it never
/// reuses. A transfer's every post, and every [`crate::Engine::send_notify`], takes a new
/// one; a resend of the same message (the metadata connection dialled again) and the
/// failure notice of the same post keep it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct NotifyId {
    pub instance: u64,
    pub seq: u64,
}

/// What the receiver did with a [`NotifyMsg`] or a [`Retract`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum NotifyAck {
    /// Queued for `get_notifies` (a failure notice: queued, or put in place of the
    /// notification of the same id that was still waiting).
    Queued,
    /// Seen before under this id and queued then: not queued again.
    Duplicate,
    /// This id was retracted, or its failure notice came first: nothing of it is queued,
    /// and nothing arriving under it later will be.
    Retracted,
    /// The receiver's program had already taken the notification of this id, so a
    /// failure notice or a retraction came too late to change what it saw.
    AlreadyTaken,
}

/// The sender gave up on the notification `id` (its call failed without an answer): the
/// receiver drops it if still waiting, and whatever arrives under it later.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Retract {
    pub id: NotifyId,
}

/// A directory lookup: the value an engine published under `name`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Lookup {
    pub name: String,
}
