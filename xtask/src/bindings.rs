//! `cargo xtask bindings`: builds the Python wheel (maturin, pinned, from PyPI) and the Node
//! addon (cargo alone: no npm tool is needed), each with the process tier's helper binary it
//! carries, and runs each package's own tests the way a user meets it: pytest against the
//! installed wheel, `tsc --strict` over a usage file against `index.d.ts`, and `node --test`.

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
    crate::run(&mut crate::cargo(&["build", "--package", "stockade-process", "--bin", "stockade-process-helper"]))?;
    let helper = target.join("debug/stockade-process-helper");
    python(root, target, &helper)?;
    node(root, target, &helper)
}

fn python(root: &Path, target: &Path, helper: &Path) -> Result<()> {
    let python = crate::llm::pinned_venv("bindings-venv", &[MATURIN, PYTEST])?;
    let bin = python.parent().context("the venv's bin directory")?;
    let package = root.join("bindings/stockade-python");
    fs::copy(helper, package.join("python/stockade/stockade-process-helper")).context("copying the helper")?;
    let wheels = target.join("wheels");
    let _ = fs::remove_dir_all(&wheels);
    crate::run(
        Command::new(bin.join("maturin"))
            .args(["build", "--profile", "dev", "--out"])
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
    let state = target.join("bindings-state");
    let _ = fs::remove_dir_all(&state);
    fs::create_dir_all(&state)?;
    // Tests run from the installed wheel, not the source tree (its directory is not on the path).
    crate::run(
        Command::new(&python)
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
            .env("STOCKADE_STATE_DIR", &state)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .current_dir(&package),
    )
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
    crate::run(Command::new("node").args(["--test", "test/"]).current_dir(&package))
}
