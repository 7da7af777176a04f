//! [`Defaults`]: the defaults of the transport settings a program exposes once for whichever
//! transports it opens (the engine's `max_staging_bytes`, `staging_chunk_bytes`,
//! `copy_threads`, `ucx_drain_timeout_ms`, `ucx_abandon_timeout_ms`), each filled by the
//! compiled-in transport that reads it, so that such a program names no transport crate and
//! builds with any one of them. [`compiled_in`]: which built-ins this build has.

use std::time::Duration;

/// [`Defaults::max_staging_bytes`] in a build with neither `tcp` nor `ucx` (both
/// transports' own default; nothing else reads the setting).
const STAGING_BYTES: usize = 64 << 20;
/// [`Defaults::staging_chunk`] in a build without `tcp` (its own default).
const STAGING_CHUNK: usize = 1 << 20;
/// [`Defaults::copy_threads`] in a build without `shm`: the calling thread alone.
const COPY_THREADS: usize = 1;
/// [`Defaults::ucx_drain_timeout`] in a build without `ucx` (its own default).
const UCX_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// [`Defaults::ucx_abandon_timeout`] in a build without `ucx` (its own default).
const UCX_ABANDON_TIMEOUT: Duration = Duration::from_secs(1);

/// The defaults of the settings a program sets on the transports it opens without naming
/// one: each field is the default of the compiled-in transport that reads it (its config's
/// `Default`, the same value [`crate::Options::default`] holds). A field that no
/// compiled-in transport reads holds the value its doc gives, which is that transport's
/// own default (checked in this crate's tests) where it has one, so a program's defaults do
/// not change with the features it is built with.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Defaults {
    /// Bytes of host chunks held at once to serve peers' requests on staged device memory
    /// ([`crate::Options::max_staging_bytes`]): `TcpConfig::max_staging_bytes` with `tcp`,
    /// else `UcxConfig::max_staging_bytes` with `ucx`, else 64 MiB.
    pub max_staging_bytes: usize,
    /// Bytes of one such chunk over TCP: `TcpConfig::staging_chunk` with `tcp`, else 1 MiB.
    pub staging_chunk: usize,
    /// Threads that copy host memory with a peer on this host: `ShmConfig::copy_threads`
    /// with `shm` (the CPUs this process may use, at most 4), else 1.
    pub copy_threads: usize,
    /// `UcxConfig::drain_timeout` with `ucx`, else 10 s.
    pub ucx_drain_timeout: Duration,
    /// `UcxConfig::abandon_timeout` with `ucx`, else 1 s.
    pub ucx_abandon_timeout: Duration,
}

impl Defaults {
    /// The defaults of the transports this build compiles in (read now: `copy_threads`
    /// counts the CPUs this process may use).
    pub fn of_this_build() -> Self {
        #[allow(unused_mut)] // Some features fill nothing.
        let mut d = Defaults {
            max_staging_bytes: STAGING_BYTES,
            staging_chunk: STAGING_CHUNK,
            copy_threads: COPY_THREADS,
            ucx_drain_timeout: UCX_DRAIN_TIMEOUT,
            ucx_abandon_timeout: UCX_ABANDON_TIMEOUT,
        };
        // UCX first, so that TCP's staging limit wins where both are in (the one setting
        // serves both).
        #[cfg(feature = "ucx")]
        {
            let ucx = hmc_transport_ucx::UcxConfig::default();
            d.max_staging_bytes = ucx.max_staging_bytes;
            d.ucx_drain_timeout = ucx.drain_timeout;
            d.ucx_abandon_timeout = ucx.abandon_timeout;
        }
        #[cfg(feature = "tcp")]
        {
            let tcp = hmc_transport_tcp::TcpConfig::default();
            d.max_staging_bytes = tcp.max_staging_bytes;
            d.staging_chunk = tcp.staging_chunk;
        }
        #[cfg(feature = "shm")]
        {
            d.copy_threads = hmc_transport_shm::default_copy_threads();
        }
        d
    }
}

impl Default for Defaults {
    /// [`Defaults::of_this_build`].
    fn default() -> Self {
        Defaults::of_this_build()
    }
}

/// The cargo features of this crate that this build turns on, of `tcp`, `ucx`, `shm`,
/// `rdma` and `plugin`, in that order: the transports [`crate::open`] can open (`auto`
/// needs `tcp` or `ucx`; a plugin's name needs `plugin`). Empty: it opens none.
pub fn compiled_in() -> Vec<&'static str> {
    [
        ("tcp", cfg!(feature = "tcp")),
        ("ucx", cfg!(feature = "ucx")),
        ("shm", cfg!(feature = "shm")),
        ("rdma", cfg!(feature = "rdma")),
        ("plugin", cfg!(feature = "plugin")),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every fallback is the transport's own default, so that a build without that
    /// transport has the same defaults as one with it.
    #[test]
    fn the_fallbacks_are_the_transports_own_defaults() {
        let tcp = hmc_transport_tcp::TcpConfig::default();
        let ucx = hmc_transport_ucx::UcxConfig::default();
        assert_eq!(
            (STAGING_BYTES, STAGING_CHUNK),
            (tcp.max_staging_bytes, tcp.staging_chunk)
        );
        assert_eq!(STAGING_BYTES, ucx.max_staging_bytes);
        assert_eq!(
            (UCX_DRAIN_TIMEOUT, UCX_ABANDON_TIMEOUT),
            (ucx.drain_timeout, ucx.abandon_timeout)
        );
    }

    #[test]
    fn each_compiled_in_transport_fills_its_defaults() {
        let d = Defaults::of_this_build();
        assert_eq!(d, Defaults::default());
        let tcp = hmc_transport_tcp::TcpConfig::default();
        let ucx = hmc_transport_ucx::UcxConfig::default();
        assert_eq!(
            (d.max_staging_bytes, d.staging_chunk),
            (tcp.max_staging_bytes, tcp.staging_chunk)
        );
        assert_eq!(
            (d.ucx_drain_timeout, d.ucx_abandon_timeout),
            (ucx.drain_timeout, ucx.abandon_timeout)
        );
        if cfg!(feature = "shm") {
            assert_eq!(d.copy_threads, hmc_transport_shm::default_copy_threads());
        } else {
            assert_eq!(d.copy_threads, 1);
        }
        // The options a program starts from hold the same values.
        #[cfg(feature = "tcp")]
        assert_eq!(
            crate::Options::default().tcp.max_staging_bytes,
            d.max_staging_bytes
        );
        #[cfg(feature = "shm")]
        assert_eq!(crate::Options::default().shm.copy_threads, d.copy_threads);
    }

    #[test]
    fn compiled_in_lists_the_features_of_this_build() {
        let on = compiled_in();
        assert_eq!(on.contains(&"tcp"), cfg!(feature = "tcp"));
        assert_eq!(on.contains(&"plugin"), cfg!(feature = "plugin"));
        assert!(on.len() <= 5);
    }
}
