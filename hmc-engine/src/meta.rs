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

/// The metadata format version this engine speaks.
pub(crate) const VERSION: u32 = 1;

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

/// A notification (HIXL's NotifyDesc: a name and a message).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct NotifyMsg {
    /// The sender's own name: still sent (the format is unchanged), never believed; the
    /// receiver names the sender by its connection.
    pub from: String,
    pub name: String,
    pub msg: Vec<u8>,
}

/// A directory lookup: the value an engine published under `name`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Lookup {
    pub name: String,
}
