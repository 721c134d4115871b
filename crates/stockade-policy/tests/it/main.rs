//! Integration tests for stockade-policy.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly on broken invariants")]
mod allow;
mod document;
mod mark;
mod ui;
mod url_differential;
