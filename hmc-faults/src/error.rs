//! [`FaultError`]: this crate's one error type, for a spec that cannot be used.

use crate::grammar::GRAMMAR;

/// Why a fault spec was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FaultError {
    /// A spec's item that does not follow the grammar (printed after the message).
    #[error("fault spec item `{token}` {why}; write it as the grammar says:\n{GRAMMAR}")]
    Malformed {
        /// The item, as written.
        token: String,
        /// What is wrong with it.
        why: String,
    },
}

impl From<FaultError> for hmc_core::Error {
    fn from(e: FaultError) -> Self {
        hmc_core::Error::InvalidArgument(e.to_string())
    }
}
