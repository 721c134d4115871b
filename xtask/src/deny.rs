//! `cargo xtask deny`: cargo-deny, offline, against the RustSec snapshot in `../shared`.
//!
//! cargo-deny reads an advisory database only as a git checkout named after its URL, so
//! the snapshot is materialised as `<target>/advisory-dbs/advisory-db-3157b0e258782691`,
//! committed with the snapshot's date, and cargo-deny runs with `--offline`.

use std::fs;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The directory name cargo-deny derives from the default advisory-db URL.
const DB_DIR: &str = "advisory-db-3157b0e258782691";

pub(crate) fn run(root: &Path, target: &Path) -> Result<()> {
    crate::ensure_tool("deny", "cargo-deny")?;
    let dbs = target.join("advisory-dbs");
    materialise(root, &dbs.join(DB_DIR))?;
    // `--offline` also stops cargo-deny's `cargo metadata` from downloading crates for other
    // platforms, so fetch every crate in the lock file first.
    crate::run(&mut crate::cargo(&["fetch", "--locked"]))?;
    crate::run(
        crate::cargo(&["deny", "--offline", "check", "advisories", "bans", "licenses", "sources"])
            .env("STOCKADE_ADVISORY_DBS", &dbs),
    )
}

/// Copies the snapshot into a fresh git repository with one commit, unless the same
/// snapshot is already there.
fn materialise(root: &Path, db: &Path) -> Result<()> {
    let snapshot = root.join("../shared/advisory-db");
    let stamp_src = snapshot.join("SNAPSHOT");
    let stamp = fs::read_to_string(&stamp_src)
        .with_context(|| format!("reading {} (the RustSec snapshot)", stamp_src.display()))?;
    if fs::read_to_string(db.join("SNAPSHOT")).is_ok_and(|s| s == stamp) && db.join(".git").is_dir() {
        return Ok(());
    }
    if db.exists() {
        fs::remove_dir_all(db)?;
    }
    fs::create_dir_all(db)?;
    // The snapshot may be read-only (CI's copy of shared/ is); the copy must be writable so a
    // later snapshot can replace it.
    crate::run(Command::new("cp").args(["-R", "--no-preserve=mode"]).arg(snapshot.join(".")).arg(db))?;
    let date =
        stamp.split(['(', ')']).nth(1).filter(|d| d.len() == 10).context("SNAPSHOT names no (YYYY-MM-DD) date")?;
    let when = format!("{date}T00:00:00Z");
    let git = |args: &[&str]| -> Result<()> {
        let status = Command::new("git")
            .args(["-c", "user.name=stockade-xtask", "-c", "user.email=xtask@localhost", "-c", "commit.gpgsign=false"])
            .args(args)
            .current_dir(db)
            .env("GIT_AUTHOR_DATE", &when)
            .env("GIT_COMMITTER_DATE", &when)
            .status()?;
        if !status.success() {
            bail!("git {args:?} failed in {}", db.display());
        }
        Ok(())
    };
    git(&["init", "--quiet", "--initial-branch=main"])?;
    git(&["add", "--all"])?;
    git(&["commit", "--quiet", "--message", stamp.trim()])?;
    Ok(())
}
