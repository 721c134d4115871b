//! Integration tests for stockade-agent: the loop against a deterministic mock server on
//! 127.0.0.1, judged by what the tools did (their side-effect logs), never by the model's text.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly on broken invariants")]
mod config;
mod confine;
mod endpoint;
mod hostile;
mod loop_;
mod proxy;
#[cfg(feature = "wasm")]
mod run_code;
mod support;
mod ui;
