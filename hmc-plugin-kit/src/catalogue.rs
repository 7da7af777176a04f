//! Every case the kit knows, by group, with what it checks and expects: hmc-core's kit tables (`hmc_core::testing::cases`) for communicators, memory and two processes, and this crate's ABI and plugin checks.

use hmc_backend_cpu::HostMemory;
use hmc_core::testing::cases::{self, About};
use hmc_plugin::{PluginCommunicator, PluginMemory};

use crate::abi_checks;

pub use crate::needs::Needs;

/// One case, as the runner lists and reports it.
#[derive(Clone, Debug)]
pub struct Entry {
    /// `group::name`.
    pub name: String,
    /// What it checks and expects.
    pub about: About,
    /// What the plugin must provide.
    pub needs: Needs,
}

/// Every case, in the order the runner starts them: the ABI first (a plugin that fails
/// there fails most others too).
pub fn entries() -> Vec<Entry> {
    let mut out = Vec::new();
    for (name, about, needs) in abi_checks::CHECKS {
        out.push(Entry {
            name: (*name).to_string(),
            about: *about,
            needs: *needs,
        });
    }
    for c in cases::communicator_cases::<PluginCommunicator, HostMemory>() {
        out.push(Entry {
            name: format!("communicator::{}", c.name),
            about: c.about,
            needs: Needs::Communicator,
        });
    }
    for c in cases::process_cases::<PluginCommunicator, HostMemory>() {
        out.push(Entry {
            name: format!("process::{}", c.name),
            about: c.about,
            needs: Needs::OtherProcesses,
        });
    }
    for c in cases::memory_cases::<PluginMemory>() {
        out.push(Entry {
            name: format!("memory::{}", c.name),
            about: c.about,
            needs: Needs::Memory,
        });
    }
    out
}

/// True when `pattern` (a full name, a group, or a prefix ending in `::`) selects `name`.
pub fn selects(pattern: &str, name: &str) -> bool {
    name == pattern
        || (pattern.ends_with("::") && name.starts_with(pattern))
        || name
            .strip_prefix(pattern)
            .is_some_and(|rest| rest.starts_with("::"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_grouped() {
        let all = entries();
        for (i, e) in all.iter().enumerate() {
            assert!(e.name.contains("::"), "{}", e.name);
            assert!(
                all[i + 1..].iter().all(|o| o.name != e.name),
                "{} twice",
                e.name
            );
        }
        assert!(all.iter().any(|e| e.needs == Needs::Memory));
    }

    #[rstest::rstest]
    #[case("memory", "memory::out_of_bounds_is_refused", true)]
    #[case("memory::", "memory::out_of_bounds_is_refused", true)]
    #[case(
        "communicator::write_then_read_round_trip",
        "communicator::write_then_read_round_trip::page",
        true
    )]
    #[case(
        "communicator::write_then_read",
        "communicator::write_then_read_round_trip::page",
        false
    )]
    #[case("abi::loads_through_the_loader", "abi::loads_through_the_loader", true)]
    #[case("mem", "memory::out_of_bounds_is_refused", false)]
    fn patterns(#[case] pattern: &str, #[case] name: &str, #[case] wanted: bool) {
        assert_eq!(selects(pattern, name), wanted);
    }
}
