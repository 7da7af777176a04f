//! Unit tests of the side channel: hung peers and revocation.
