//! `cargo xtask bindings`: builds the Python wheel (maturin, pinned, from PyPI) and the Node
//! addon (cargo alone: no npm tool is needed), each with the process tier's helper binary it
//! carries, and runs each package's own tests the way a user meets it: pytest against the
//! installed wheel, `tsc --strict` over a usage file against `index.d.ts`, and `node --test`
//! (with the seeds' examples: the steward loop in Python and in TypeScript, and airlock's
//! `run` in Node).

use std::fs;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// maturin, pinned: the wheel's build backend.
const MATURIN: &str = "maturin==1.16.0";
/// pytest, pinned.
const PYTEST: &str = "pytest==8.3.4";

/// Builds both packages and runs their tests.
pub(crate) fn run(root: &Path, target: &Path) -> Result<()> {
    let helper = helper(target)?;
    let python = wheel(root, target, &helper, "dev")?;
    // The real-model steward runs in `cargo xtask llm --test` (CI's agent-llm step), where
    // the model is: deselected here rather than skipped.
    pytest(root, target, &python, &["-k", "not real_model"], &[])?;
    node(root, target, &helper)
}

/// Release builds of both packages, for `cargo xtask bench bindings`: the bindings venv's
/// interpreter (the release wheel installed) and the release addon's path.
pub(crate) fn release(root: &Path, target: &Path) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    let helper = helper(target)?;
    let python = wheel(root, target, &helper, "release")?;
    crate::run(&mut crate::cargo(&["build", "--release", "--package", "stockade-node"]))?;
    let addon = target.join("release/stockade.node");
    fs::copy(target.join("release/libstockade_node.so"), &addon).context("copying the addon")?;
    Ok((python, addon))
}

/// The Python steward (examples/steward/steward.py) against the real local model at `url`
/// (`cargo xtask llm --test`): the wheel is built and installed first.
pub(crate) fn real_model(root: &Path, target: &Path, url: &str) -> Result<()> {
    let python = wheel(root, target, &helper(target)?, "dev")?;
    let env = [("STOCKADE_LLM_URL", url), ("STOCKADE_REQUIRE_LLM", "1")];
    pytest(root, target, &python, &["-k", "real_model", "-s"], &env)
}

/// The process tier's helper binary, which both packages carry.
fn helper(target: &Path) -> Result<std::path::PathBuf> {
    crate::run(&mut crate::cargo(&["build", "--package", "stockade-process", "--bin", "stockade-process-helper"]))?;
    Ok(target.join("debug/stockade-process-helper"))
}

/// Builds the wheel with maturin (`profile`: dev or release) and installs it into the
/// bindings venv; its interpreter.
fn wheel(root: &Path, target: &Path, helper: &Path, profile: &str) -> Result<std::path::PathBuf> {
    let python = crate::llm::pinned_venv("bindings-venv", &[MATURIN, PYTEST])?;
    let bin = python.parent().context("the venv's bin directory")?;
    let package = root.join("bindings/stockade-python");
    fs::copy(helper, package.join("python/stockade/stockade-process-helper")).context("copying the helper")?;
    let wheels = target.join("wheels");
    let _ = fs::remove_dir_all(&wheels);
    crate::run(
        Command::new(bin.join("maturin"))
            .args(["build", "--profile", profile, "--out"])
            .arg(&wheels)
            .current_dir(&package),
    )?;
    let wheel = fs::read_dir(&wheels)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .context("maturin built no wheel")?;
    crate::run(
        Command::new(bin.join("pip")).args(["install", "--quiet", "--force-reinstall", "--no-deps"]).arg(&wheel),
    )?;
    Ok(python)
}

/// The package's pytest suite (with `args`, and `env` set), from the installed wheel.
fn pytest(root: &Path, target: &Path, python: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<()> {
    let package = root.join("bindings/stockade-python");
    let state = target.join("bindings-state");
    let _ = fs::remove_dir_all(&state);
    fs::create_dir_all(&state)?;
    // Tests run from the installed wheel, not the source tree (its directory is not on the path).
    let mut pytest = Command::new(python);
    pytest
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
        .args(args)
        .env("STOCKADE_STATE_DIR", &state)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir(&package);
    for (k, v) in env {
        pytest.env(k, v);
    }
    crate::run(&mut pytest)
}

fn node(root: &Path, target: &Path, helper: &Path) -> Result<()> {
    crate::run(&mut crate::cargo(&["build", "--package", "stockade-node"]))?;
    let package = root.join("bindings/stockade-node");
    fs::copy(target.join("debug/libstockade_node.so"), package.join("stockade.node")).context("copying the addon")?;
    fs::copy(helper, package.join("stockade-process-helper")).context("copying the helper")?;
    if Command::new("tsc").arg("--version").output().is_err() {
        bail!("tsc is missing: install Debian's node-typescript");
    }
    crate::run(
        Command::new("tsc")
            .args(["--noEmit", "--strict", "--target", "es2020", "--moduleResolution", "node", "test/usage.ts"])
            .current_dir(&package),
    )?;
    // The seed's steward, as it wrote it in TypeScript, compiled beside its source for the test.
    crate::run(
        Command::new("tsc")
            .args(["--strict", "--target", "es2022", "--module", "commonjs", "--moduleResolution", "node"])
            .args(["steward.ts", "node-shim.d.ts"])
            .current_dir(root.join("examples/steward")),
    )?;
    let state = target.join("bindings-state-node");
    let _ = fs::remove_dir_all(&state);
    fs::create_dir_all(&state)?;
    crate::run(Command::new("node").args(["--test", "test/"]).env("STOCKADE_STATE_DIR", &state).current_dir(&package))
}
