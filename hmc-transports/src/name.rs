//! [`TransportName`]: what a program's `transport` setting names.

use std::fmt;
use std::str::FromStr;

/// A transport by name: a built-in, or a transport plugin's name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum TransportName {
    /// `tcp`: `hmc-transport-tcp`, host memory (device memory staged), any network.
    Tcp,
    /// `ucx`: `hmc-transport-ucx`, UCX's own transports (`UCX_TLS`), loaded at run time.
    Ucx,
    /// `shm`: `hmc-transport-shm` alone, cross-memory attach and vendor IPC; peers on this
    /// host only.
    Shm,
    /// `rdma`: `hmc-transport-rdma`, native verbs (`libibverbs.so.1` or
    /// `$HMC_IBVERBS_LIB`, the first device with an active port), loaded at run time.
    Rdma,
    /// `auto`: shared memory to peers on this host, and to the others UCX where it loads,
    /// TCP otherwise (`hmc_transport_shm::LocalFirst`). Every member of a job must use the
    /// same setting.
    #[default]
    Auto,
    /// A transport plugin by its name (or `NAME://IP`), found on `HMC_PLUGIN_PATH` or the
    /// program's plugin path.
    Named(String),
    /// `faulty:NAME`: NAME wrapped in `hmc_faults::Faulty`, with the faults of the
    /// `faults` option or `HMC_FAULTS`, or `hmc_faults::FaultSpec::DEFAULT_TEXT` without
    /// either (docs/faults.md).
    Faulty(Box<TransportName>),
}

/// The prefix that injects faults into the transport it names.
pub const FAULTY_PREFIX: &str = "faulty:";

/// The built-in names, in the order programs list them, with what each is.
pub const BUILTINS: &[(&str, &str)] = &[
    (
        "tcp",
        "hmc-transport-tcp: one-sided READ/WRITE over TCP sockets",
    ),
    (
        "ucx",
        "hmc-transport-ucx: UCX loaded at run time (UCX_TLS chooses)",
    ),
    (
        "shm",
        "hmc-transport-shm: cross-memory attach and shared memory, this host only",
    ),
    (
        "rdma",
        "hmc-transport-rdma: RDMA verbs (libibverbs.so.1 loaded at run time)",
    ),
    (
        "auto",
        "shm to peers on this host, ucx (or tcp) to the others",
    ),
];

impl TransportName {
    /// The transport's own name (`tcp`, a plugin's name), without a `faulty:` prefix
    /// (`Display` writes the whole name).
    pub fn as_str(&self) -> &str {
        match self {
            TransportName::Tcp => "tcp",
            TransportName::Ucx => "ucx",
            TransportName::Shm => "shm",
            TransportName::Rdma => "rdma",
            TransportName::Auto => "auto",
            TransportName::Named(n) => n,
            TransportName::Faulty(inner) => inner.as_str(),
        }
    }

    /// Whether this is one of [`BUILTINS`] (with or without `faulty:`).
    pub fn is_builtin(&self) -> bool {
        match self {
            TransportName::Named(_) => false,
            TransportName::Faulty(inner) => inner.is_builtin(),
            _ => true,
        }
    }

    /// The name without its `faulty:` prefix, and whether it had one.
    pub fn without_faults(&self) -> (&TransportName, bool) {
        match self {
            TransportName::Faulty(inner) => (inner, true),
            other => (other, false),
        }
    }
}

impl FromStr for TransportName {
    type Err = hmc_core::Error;

    /// A built-in's name (exactly, lower case), `faulty:NAME`, any other non-empty name
    /// as a plugin's.
    fn from_str(s: &str) -> hmc_core::Result<Self> {
        if let Some(inner) = s.strip_prefix(FAULTY_PREFIX) {
            if inner.starts_with(FAULTY_PREFIX) {
                return Err(hmc_core::Error::InvalidArgument(format!(
                    "`{s}` says faulty: twice; write it once (faulty:tcp)"
                )));
            }
            if inner.is_empty() {
                return Err(hmc_core::Error::InvalidArgument(
                    "`faulty:` needs the transport to inject faults into: faulty:tcp, \
                     faulty:shm, faulty:ucx or faulty:<plugin>"
                        .into(),
                ));
            }
            return Ok(TransportName::Faulty(Box::new(inner.parse()?)));
        }
        Ok(match s {
            "tcp" => TransportName::Tcp,
            "ucx" => TransportName::Ucx,
            "shm" => TransportName::Shm,
            "rdma" => TransportName::Rdma,
            "auto" => TransportName::Auto,
            "" => {
                return Err(hmc_core::Error::InvalidArgument(
                    "an empty transport name: use tcp, ucx, shm, rdma, auto, a transport \
                     plugin's name, or faulty:<name> for one with faults injected"
                        .into(),
                ));
            }
            other => TransportName::Named(other.to_string()),
        })
    }
}

impl fmt::Display for TransportName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let TransportName::Faulty(_) = self {
            f.write_str(FAULTY_PREFIX)?;
        }
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rstest::rstest]
    #[case("tcp", TransportName::Tcp)]
    #[case("ucx", TransportName::Ucx)]
    #[case("shm", TransportName::Shm)]
    #[case("rdma", TransportName::Rdma)]
    #[case("auto", TransportName::Auto)]
    #[case("loopmem", TransportName::Named("loopmem".into()))]
    #[case("loopmem://127.0.0.1", TransportName::Named("loopmem://127.0.0.1".into()))]
    #[case("faulty:tcp", TransportName::Faulty(Box::new(TransportName::Tcp)))]
    #[case("faulty:shm", TransportName::Faulty(Box::new(TransportName::Shm)))]
    #[case("faulty:loopmem", TransportName::Faulty(Box::new(TransportName::Named("loopmem".into()))))]
    fn names_parse_and_print_back(#[case] text: &str, #[case] want: TransportName) {
        let got: TransportName = text.parse().unwrap();
        assert_eq!(got, want);
        assert_eq!(got.to_string(), text);
    }

    #[test]
    fn every_builtin_parses_as_a_builtin_and_an_empty_name_is_refused() {
        for (name, about) in BUILTINS {
            let n: TransportName = name.parse().unwrap();
            assert!(n.is_builtin(), "{name}");
            assert!(about.len() > 10, "{name}: say what it is");
        }
        let e = "".parse::<TransportName>().unwrap_err().to_string();
        assert!(
            e.contains("tcp, ucx, shm, rdma, auto") && e.contains("faulty:<name>"),
            "{e}"
        );
    }

    #[rstest::rstest]
    #[case::nothing_after("faulty:", "faulty:tcp")]
    #[case::twice("faulty:faulty:tcp", "twice")]
    fn a_faulty_name_needs_one_transport(#[case] text: &str, #[case] said: &str) {
        let e = text.parse::<TransportName>().unwrap_err().to_string();
        assert!(e.contains(said), "{e}");
    }

    #[test]
    fn faulty_names_keep_their_transport() {
        let n: TransportName = "faulty:tcp".parse().unwrap();
        assert_eq!(n.as_str(), "tcp");
        assert!(n.is_builtin());
        assert_eq!(n.without_faults(), (&TransportName::Tcp, true));
        assert_eq!(
            TransportName::Ucx.without_faults(),
            (&TransportName::Ucx, false)
        );
    }
}
