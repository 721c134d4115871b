//! Integration tests for stockade-protocol, one module per guarantee family.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly on broken invariants")]
mod alloc_count;
mod capture;
mod chat;
mod completion;
mod dedicated;
mod e2b;
mod frame;
mod json;
mod protected;
mod schema;
mod turn;
