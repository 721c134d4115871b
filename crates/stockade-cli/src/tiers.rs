//! The tiers as the CLI builds them, in one place: `--tier` as a typed value, the helper every
//! process-tier sandbox launches, and each tier's sandbox as `run`, `agent` and `mcp` make it.

use std::sync::Arc;

use anyhow::{Context as _, Result};
use stockade_runtime::Sandbox;

use crate::{docker, process, wasm};

/// `--tier`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum TierKind {
    /// A confined Linux process.
    Process,
    /// A WebAssembly guest in wasmtime.
    Wasm,
    /// A hardened throwaway container.
    Docker,
}

/// How this binary's process-tier runs start their helper: forked by the fork server `main`
/// started (or, without one, by this process while it is single-threaded); this binary is
/// executed as the helper otherwise.
pub(crate) fn helper() -> Result<process::Helper> {
    Ok(process::Helper::current_exe().context("locating the stockade binary for the sandbox helper")?.prefer_fork())
}

/// The process tier over [`helper`], with the cgroup v2 directory delegated to stockade in
/// `STOCKADE_CGROUP_V2_DIR` if there is one (the container image's entrypoint sets it where
/// the host has cgroup v2; docs/deploy.md). Without it, cgroup v1 controllers or rlimits.
pub(crate) fn process_tier() -> Result<process::ProcessTier> {
    let tier = process::ProcessTier::new(helper()?);
    Ok(match std::env::var_os("STOCKADE_CGROUP_V2_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => tier.cgroup_v2_dir(std::path::PathBuf::from(dir)),
        None => tier,
    })
}

/// A process-tier sandbox that keeps `n` sandboxes built ahead of its runs (G15 of
/// stockade-process).
pub(crate) fn process_pool(n: usize) -> Result<Arc<Sandbox>> {
    Ok(Arc::new(Sandbox::builder().tier(process_tier()?.pool(n)).build()?))
}

/// A wasm-tier sandbox.
pub(crate) fn wasm() -> Result<Arc<Sandbox>> {
    Ok(Arc::new(Sandbox::builder().tier(wasm::WasmTier::new()?).build()?))
}

/// A docker-tier sandbox over the engine `DOCKER_HOST` (or the default socket) names.
pub(crate) async fn docker() -> Result<Arc<Sandbox>, docker::RunError> {
    let tier = docker::DockerTier::connect().await?;
    Sandbox::builder().tier(tier).build().map(Arc::new).map_err(|e| docker::RunError::Internal(e.to_string()))
}
