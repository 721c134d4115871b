//! stockade-egress: the proxy driven over real loopback sockets, every upstream a listener
//! this test starts on 127.0.0.x, every verdict taken from what the upstream saw.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod path_differential;
mod proxy;
