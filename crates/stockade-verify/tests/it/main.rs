//! Integration tests for stockade-verify.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly on broken invariants")]
mod ui;
mod verify;
