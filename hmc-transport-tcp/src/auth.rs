//! Optional peer authentication with a pre-shared secret ([`AuthSecret`], from `hmc-transport-kit`), and the HMAC-SHA256 challenge both planes run at HELLO.
//!
//! # The exchange
//!
//! When a [`crate::ControlPlaneConfig::auth_secret`] or [`crate::TcpConfig::auth_secret`]
//! is set, each side of a new connection proves that it knows the secret before anything
//! else is accepted on it:
//!
//! 1. The dialler sends its HELLO (version 2 of that plane's HELLO) followed by a fresh
//!    32-byte random nonce `Nd`.
//! 2. The listener answers with status 2 ("authenticate") carrying its own fresh nonce
//!    `Nl` and its proof `Pl = HMAC-SHA256(secret, context | "L" | Nd | Nl | identity)`.
//! 3. The dialler checks `Pl`, then sends its proof
//!    `Pd = HMAC-SHA256(secret, context | "D" | Nd | Nl | identity)`.
//! 4. The listener checks `Pd` and only then admits or refuses the connection as usual.
//!
//! `context` names the plane (`hmc-tcp control v1` or `hmc-tcp data v1`); `identity`
//! binds what the dialler claimed in its HELLO (its rank and the listener's rank on the
//! control plane, its announced address on the data plane), so a proof cannot be replayed
//! for another claim. Proofs are compared in constant time. Both nonces are fresh per
//! connection, so a recorded exchange cannot be replayed, and the role byte keeps the
//! listener's proof from being reflected back as the dialler's.
//!
//! A dialler that finds the listener's proof wrong still sends its own (so the listener
//! can report the failure too), then gives up. A listener with a secret refuses a
//! version-1 HELLO (a dialler without one); a listener without one refuses a version-2
//! HELLO. Each refusal says which setting to change.
//!
//! # What it does not do
//!
//! Nothing is encrypted, and an attacker on the network path can still relay or alter a
//! connection after the exchange. Authentication keeps processes that do not hold the
//! secret from joining (claiming a rank, reading keys, sending requests); a network that
//! is not trusted needs a tunnel (WireGuard, TLS) as well.

pub use hmc_transport_kit::auth::{AuthSecret, MIN_SECRET_LEN};
pub(crate) use hmc_transport_kit::auth::{NONCE_LEN, PROOF_LEN, nonce};
