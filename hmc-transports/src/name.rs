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
}

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
    /// The name as programs take it (`tcp`, a plugin's name).
    pub fn as_str(&self) -> &str {
        match self {
            TransportName::Tcp => "tcp",
            TransportName::Ucx => "ucx",
            TransportName::Shm => "shm",
            TransportName::Rdma => "rdma",
            TransportName::Auto => "auto",
            TransportName::Named(n) => n,
        }
    }

    /// Whether this is one of [`BUILTINS`].
    pub fn is_builtin(&self) -> bool {
        !matches!(self, TransportName::Named(_))
    }
}

impl FromStr for TransportName {
    type Err = hmc_core::Error;

    /// A built-in's name (exactly, lower case), any other non-empty name as a plugin's.
    fn from_str(s: &str) -> hmc_core::Result<Self> {
        Ok(match s {
            "tcp" => TransportName::Tcp,
            "ucx" => TransportName::Ucx,
            "shm" => TransportName::Shm,
            "rdma" => TransportName::Rdma,
            "auto" => TransportName::Auto,
            "" => {
                return Err(hmc_core::Error::InvalidArgument(
                    "an empty transport name: use tcp, ucx, shm, rdma, auto or a transport \
                     plugin's name"
                        .into(),
                ));
            }
            other => TransportName::Named(other.to_string()),
        })
    }
}

impl fmt::Display for TransportName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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
        assert!(e.contains("tcp, ucx, shm, rdma, auto"), "{e}");
    }
}
