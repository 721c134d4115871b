//! Integration tests for the `stockade` binary.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly on broken invariants")]
mod agent;
mod cli;
mod confined;
mod e2b;
mod grants;
mod mcp;
mod mcp_grant;
mod net;
mod readme;
mod session;
mod stdio;
mod workspace;
