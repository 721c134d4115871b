//! Which host directories may be granted: the one rule every tier applies to a workspace
//! (and to any other host directory it binds into a guest) before it mounts anything.
//!
//! A grant is safe only if the directory is *dedicated* to the job: a project directory or a
//! fresh directory, never a place the system, another user or a daemon relies on. The rule
//! is lexical, so the caller resolves symlinks first (`std::fs::canonicalize`) and passes the
//! result; this crate never touches the filesystem.

use std::path::{Component, Path, PathBuf};

/// System trees: the directory and everything under it are refused.
pub const SYSTEM_TREES: &[&str] = &[
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/run",
    "/sbin",
    "/sys",
    "/usr",
    "/var/cache",
    "/var/lib",
    "/var/log",
    "/var/run",
    "/var/spool",
];

/// Shared directories: refused themselves, while a directory inside one is fine (`/tmp/job`,
/// `/root/project`). `/home/*` (every user's home) is matched by [`check_dedicated`] itself.
pub const SHARED_DIRS: &[&str] = &["/home", "/media", "/mnt", "/opt", "/root", "/srv", "/tmp", "/var", "/var/tmp"];

/// Why a host directory cannot be granted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} cannot be granted: {why}; grant a dedicated directory instead (a project directory, or a new one made with mktemp -d)", path.display())]
pub struct NotDedicated {
    /// The (resolved) path that was refused.
    pub path: PathBuf,
    /// Why, in a few words.
    pub why: String,
}

/// The hidden directory of a home (`/root/.NAME` or `/home/USER/.NAME`) that `path` is, or is
/// inside: `~/.ssh`, `~/.aws`, `~/.config/autostart`, `~/.cache`.
fn home_dot_dir(path: &Path) -> Option<PathBuf> {
    let parts: Vec<Component<'_>> = path.components().collect();
    let home_len = match parts.as_slice() {
        [Component::RootDir, Component::Normal(root), ..] if *root == "root" => 2,
        [Component::RootDir, Component::Normal(home), Component::Normal(_), ..] if *home == "home" => 3,
        _ => return None,
    };
    match parts.get(home_len) {
        Some(Component::Normal(name)) if name.as_encoded_bytes().starts_with(b".") => {
            Some(parts[..=home_len].iter().collect())
        }
        _ => None,
    }
}

/// Checks that `resolved` (absolute, symlinks already resolved) is a dedicated directory:
/// not `/`, not inside a [`SYSTEM_TREES`] entry, not a [`SHARED_DIRS`] entry or a home
/// directory (`/home/NAME`) itself, not one of `also` (directories the caller protects, such
/// as the docker socket's), and not an ancestor of any of these.
pub fn check_dedicated(resolved: &Path, also: &[&Path]) -> Result<(), NotDedicated> {
    let refuse = |why: String| Err(NotDedicated { path: resolved.to_path_buf(), why });
    if !resolved.is_absolute() || resolved.components().any(|c| matches!(c, Component::CurDir | Component::ParentDir)) {
        return refuse("the path is not absolute and resolved".into());
    }
    let path: PathBuf = resolved.components().collect();
    if path == Path::new("/") {
        return refuse("it is the root directory".into());
    }
    if let Some(tree) = SYSTEM_TREES.iter().find(|t| path.starts_with(t)) {
        return refuse(if path == Path::new(tree) {
            "it is a system directory".into()
        } else {
            format!("it is inside the system directory {tree}")
        });
    }
    if SHARED_DIRS.iter().any(|d| path == Path::new(d)) {
        return refuse("it is a shared directory itself (a directory inside it is fine)".into());
    }
    if path.parent() == Some(Path::new("/home")) {
        return refuse("it is a home directory itself (a project directory inside it is fine)".into());
    }
    if let Some(dot) = home_dot_dir(&path) {
        return refuse(if dot == path {
            "it is a home directory's hidden directory, where credentials, caches and start-up settings live".into()
        } else {
            format!(
                "it is inside {}, a home directory's hidden directory, where credentials, caches and start-up settings live",
                dot.display()
            )
        });
    }
    if let Some(a) = also.iter().find(|a| path == **a) {
        return refuse(format!("it is {}, which stockade protects", a.display()));
    }
    let protected = SYSTEM_TREES.iter().chain(SHARED_DIRS).map(Path::new).chain(also.iter().copied());
    if let Some(inner) = protected.filter(|p| p.starts_with(&path)).min() {
        return refuse(format!("it contains {}", inner.display()));
    }
    Ok(())
}
