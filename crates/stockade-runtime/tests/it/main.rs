//! Integration tests for stockade-runtime.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly on broken invariants")]
mod grants;
mod mcp;
mod runtime;
