//! The docker tier against a real engine (`cargo xtask images` builds the test image; CI
//! starts a private dockerd when none is reachable).
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly on broken invariants")]

mod docker;
mod engine;
mod faults;
