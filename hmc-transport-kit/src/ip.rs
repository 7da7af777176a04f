//! Addresses compared as the kernel reports them: an IPv4 peer of a dual-stack socket is an
//! IPv4-mapped IPv6 address, which is the same host as its IPv4 form.

use std::net::IpAddr;

/// IPv4-mapped IPv6 addresses as IPv4.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}
