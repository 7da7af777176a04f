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
    /// The ABI minor whose rule the case checks: a plugin that declares an older minor
    /// never promised it, so the case is skipped for it and reported as not promised.
    pub since_minor: u32,
}

/// Cases (by name prefix) that check a rule a later ABI minor stated, with that minor.
/// Rules that only narrowed what was already allowed are checked by the case itself
/// against the declared minor (`plugin::a_full_notification_queue_fails_with_a_named_limit`,
/// 1.2); a rule a plugin of an older minor may break outright is listed here.
const RULES_SINCE: &[(&str, u32)] = &[(
    // 1.3: no byte of a transfer lands in either side's memory after its end.
    cases::ABANDONED_WRITE,
    3,
)];

fn since_minor(case: &str) -> u32 {
    RULES_SINCE
        .iter()
        .find(|(prefix, _)| case.starts_with(prefix))
        .map_or(0, |(_, minor)| *minor)
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
            since_minor: since_minor(name),
        });
    }
    for c in cases::communicator_cases::<PluginCommunicator, HostMemory>() {
        out.push(Entry {
            name: format!("communicator::{}", c.name),
            about: c.about,
            needs: Needs::Communicator,
            since_minor: since_minor(&c.name),
        });
    }
    for c in cases::process_cases::<PluginCommunicator, HostMemory>() {
        out.push(Entry {
            name: format!("process::{}", c.name),
            about: c.about,
            needs: Needs::OtherProcesses,
            since_minor: since_minor(c.name),
        });
    }
    for c in cases::memory_cases::<PluginMemory>() {
        out.push(Entry {
            name: format!("memory::{}", c.name),
            about: c.about,
            needs: Needs::Memory,
            since_minor: since_minor(&c.name),
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

    #[test]
    fn the_terminal_state_rule_applies_from_abi_1_3() {
        let all = entries();
        let since: Vec<(&str, u32)> = all
            .iter()
            .filter(|e| e.since_minor > 0)
            .map(|e| (e.name.as_str(), e.since_minor))
            .collect();
        assert_eq!(
            since,
            [
                (
                    "communicator::an_abandoned_write_lands_nothing_after_settle::dropped",
                    3
                ),
                (
                    "communicator::an_abandoned_write_lands_nothing_after_settle::deadline",
                    3
                ),
            ]
        );
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
