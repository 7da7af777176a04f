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

/// The metadata format version this engine speaks.
pub(crate) const VERSION: u32 = 2;

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
}

/// A directory lookup: the value an engine published under `name`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Lookup {
    pub name: String,
}
