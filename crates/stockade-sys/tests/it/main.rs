//! Integration tests for stockade-sys: G1, G2.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly on broken invariants")]

mod sys;
