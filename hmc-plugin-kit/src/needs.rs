//! [`Needs`]: what a plugin must provide for a case or an ABI check to apply, shared by the
//! catalogue and the checks it lists.

/// What a plugin must provide for a case to apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    /// Any plugin.
    Nothing,
    /// `HMC_PLUGIN_PROVIDES_COMMUNICATOR`.
    Communicator,
    /// `HMC_PLUGIN_PROVIDES_MEMORY`.
    Memory,
    /// A communicator that reaches other processes (no `HMC_CAP_SAME_PROCESS_ONLY`).
    OtherProcesses,
}
