//! Integration tests of the wasm tier: each file pins the guarantees it is named after.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly on broken invariants")]

mod authority;
mod javascript;
mod limits;
mod outcomes;
#[cfg(feature = "python")]
mod python;
mod support;
