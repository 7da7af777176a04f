//! `--metadata` values: `embedded`, or `etcd://host:port[,host:port]/namespace`.

use std::fmt;
use std::str::FromStr;

use crate::error::MetaError;

/// Which metadata store, as the `--metadata` flag and the engine's `metadata` option
/// spell it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum MetadataUrl {
    /// No service: peers exchange records directly (`embedded`, the default).
    #[default]
    Embedded,
    /// etcd v3 at these endpoints (`host:port`), records under `namespace`.
    Etcd {
        /// `host:port` of each etcd member.
        endpoints: Vec<String>,
        /// The namespace (a path without leading or trailing `/`).
        namespace: String,
    },
}

#[cfg_attr(not(feature = "etcd"), allow(dead_code))] // The key layout is the etcd store's.
impl MetadataUrl {
    /// The key prefix of members' labelled blobs (`<prefix><name>/<label>`).
    pub(crate) fn labels_prefix(&self) -> String {
        match self {
            MetadataUrl::Embedded => String::new(),
            MetadataUrl::Etcd { namespace, .. } => format!("/{namespace}/labels/"),
        }
    }

    /// The key prefix of members' records.
    pub(crate) fn members_prefix(&self) -> String {
        match self {
            MetadataUrl::Embedded => String::new(),
            MetadataUrl::Etcd { namespace, .. } => format!("/{namespace}/members/"),
        }
    }
}

impl FromStr for MetadataUrl {
    type Err = MetaError;
    fn from_str(s: &str) -> Result<Self, MetaError> {
        let bad = |why: &str| {
            MetaError::Invalid(format!(
                "`{s}`: {why}; use `embedded` or etcd://host:port[,host:port]/namespace"
            ))
        };
        if s == "embedded" {
            return Ok(MetadataUrl::Embedded);
        }
        let rest = s
            .strip_prefix("etcd://")
            .ok_or_else(|| bad("unknown scheme"))?;
        let (hosts, namespace) = rest.split_once('/').ok_or_else(|| bad("no namespace"))?;
        let namespace = namespace.trim_end_matches('/');
        if namespace.is_empty() {
            return Err(bad("empty namespace"));
        }
        if namespace
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..")
        {
            return Err(bad("namespace has an empty, `.` or `..` part"));
        }
        let mut endpoints = Vec::new();
        for h in hosts.split(',') {
            let (host, port) = h
                .rsplit_once(':')
                .ok_or_else(|| bad("an endpoint without a port"))?;
            if host.is_empty() || port.parse::<u16>().is_err() {
                return Err(bad("an endpoint that is not host:port"));
            }
            endpoints.push(h.to_string());
        }
        Ok(MetadataUrl::Etcd {
            endpoints,
            namespace: namespace.to_string(),
        })
    }
}

impl fmt::Display for MetadataUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetadataUrl::Embedded => f.write_str("embedded"),
            MetadataUrl::Etcd {
                endpoints,
                namespace,
            } => write!(f, "etcd://{}/{namespace}", endpoints.join(",")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("embedded", Some("embedded"))]
    #[case("etcd://127.0.0.1:2379/job", Some("etcd://127.0.0.1:2379/job"))]
    #[case("etcd://a:1,b:2/x/y/", Some("etcd://a:1,b:2/x/y"))]
    #[case("etcd://a:1", None)]
    #[case("etcd://a/ns", None)]
    #[case("etcd://a:99999/ns", None)]
    #[case("etcd://a:1/", None)]
    #[case("etcd://a:1/x/../y", None)]
    #[case("redis://a:1/ns", None)]
    fn metadata_urls_parse(#[case] s: &str, #[case] want: Option<&str>) {
        let got = s.parse::<MetadataUrl>().ok().map(|u| u.to_string());
        assert_eq!(got.as_deref(), want);
    }

    #[test]
    fn a_bad_url_says_what_to_write() {
        let e = "etcd://a:1".parse::<MetadataUrl>().unwrap_err().to_string();
        assert!(e.contains("etcd://host:port"), "{e}");
    }
}
