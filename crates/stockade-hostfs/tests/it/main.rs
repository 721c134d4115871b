//! Integration tests for stockade-hostfs.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly on broken invariants")]
mod files;
mod guard;
mod stage;
