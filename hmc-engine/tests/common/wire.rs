//! The engine's metadata wire forms as a peer that is not an engine writes them (the
//! engine's own are crate-private): for tests that play a hostile or faulty sender.

use serde::{Deserialize, Serialize};

pub const METHOD_INFO: u32 = 0x454E_0001;
pub const METHOD_NOTIFY: u32 = 0x454E_0002;
pub const METHOD_RETRACT: u32 = 0x454E_0005;
/// The metadata format these forms are.
pub const VERSION: u32 = 3;

/// The metadata request.
#[derive(Serialize)]
pub struct Hello {
    pub version: u32,
    pub from: String,
}

/// The metadata answer.
#[derive(Deserialize)]
pub struct EngineInfo {
    pub _version: u32,
    pub _instance: u64,
    pub data_plane: String,
    pub _generation: u64,
    pub regions: Vec<Vec<u8>>,
}

/// A notification: `id` is the sender's instance and the send's number.
#[derive(Serialize, Clone)]
pub struct NotifyMsg {
    pub from: String,
    pub name: String,
    pub msg: Vec<u8>,
    pub failed: Option<String>,
    pub id: (u64, u64),
}

/// A sender giving up on a notification.
#[derive(Serialize)]
pub struct Retract {
    pub id: (u64, u64),
}

/// The receiver's answer to a notification or a retraction.
#[derive(Deserialize, Debug, PartialEq)]
pub enum NotifyAck {
    Queued,
    Duplicate,
    Retracted,
    AlreadyTaken,
}

/// A metadata connection to the engine at `target` that named itself `from` (as an
/// engine's does before it may notify).
pub async fn named_client(target: &str, from: &str) -> hmc_rpc::Client {
    let addr: hmc_core::PeerAddr = target.parse().unwrap();
    let rpc = hmc_rpc::Client::connect(&addr, hmc_rpc::ClientConfig::default())
        .await
        .unwrap();
    let _: EngineInfo = rpc
        .call_typed(
            METHOD_INFO,
            &Hello {
                version: VERSION,
                from: from.into(),
            },
        )
        .await
        .unwrap();
    rpc
}
