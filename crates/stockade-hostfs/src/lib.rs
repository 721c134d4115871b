//! Host-directory authority for the tiers: what a tier checks in a read-write workspace
//! before a run, and repairs after it, and a staged workspace's copy in and out
//! ([`stage`]), all through `cap-std`, so that no walk follows a symlink the guest planted.
//!
//! Protected paths ([`stockade_protocol::PROTECTED_PATHS`]) are files and directories whose
//! change would make the host run code later: git hooks and config, shell start-up files,
//! editor, agent and tool configuration, credentials. A tier keeps each one that exists
//! read-only inside the sandbox (each its own way: a bind mount in the process and docker
//! tiers; the wasm tier cannot, and refuses the grant), pins the directories that hold them
//! ([`stockade_protocol::PINNED_DIRS`], `.git`) so they cannot be renamed away and replaced,
//! and, when the run is over, removes each one that was absent and now exists:
//! [`Guarded::sweep`].
//!
//! # Position in the stack
//! Depends on: `stockade-protocol` (the lists), `cap-std`, `tar` (the staged archive).
//! Used by: `stockade-process`, `stockade-docker`, `stockade-wasm`.
//! API boundary: yes; [`Guarded`], [`sockets`], [`resolve_workspace`], [`stage`].
//!
//! # Threat model
//! Trusted: the host program, and the workspace as it was when [`Guarded::inspect`] ran.
//! Attacker-controlled: everything in the workspace once the run has started: names, file
//! types, symlinks (to anywhere), gitfiles; and every byte of the archive a staged
//! workspace comes back as (names, entry types, modes, sizes, truncation).
//! Out of scope: other host processes acting on the workspace during the run.
//!
//! # Guarantees
//! G1. [`Guarded::inspect`] refuses a workspace in which a protected path, or a directory on
//!     the way to one, is a symlink (the guest could not change it, but the host would follow
//!     it), and reports each protected path as present or absent; a `.git` that is a file (a
//!     gitfile) is itself protected.
//!     (pinned by: tests/it/guard.rs::g1_*)
//! G2. [`Guarded::sweep`], called once every guest process is gone, removes each protected
//!     path that was absent and now exists, and any symlink or non-directory the guest put
//!     on the way to one (a planted `.git` symlink or gitfile); it never follows a symlink,
//!     never touches a path outside the workspace, and never removes what was present.
//!     (pinned by: tests/it/guard.rs::g2_*)
//! G3. [`sockets`] finds every unix socket in a granted tree, however deep, without following
//!     a symlink, and refuses a tree larger than its entry cap rather than guess.
//!     (pinned by: tests/it/guard.rs::g3_*)
//! G4. [`resolve_workspace`] resolves a workspace path and applies the protocol's
//!     dedicated-directory rule to the result, so every tier judges, and then uses, the
//!     real directory; each refusal names the path and the reason.
//!     (pinned by: tests/it/guard.rs::g4_*)
//! G5. [`stage::pack`] follows no symlink (it stores one as a link), reads no file past the
//!     size it was listed at, refuses fifos, sockets and devices, and stops at its byte and
//!     entry caps before anything is returned; [`stage::unpack`] writes only regular files
//!     and directories with plain names below its destination, never through or onto a
//!     host symlink (each directory on the way is opened `O_NOFOLLOW | O_DIRECTORY`, each
//!     file `O_NOFOLLOW`), never under a protected path nor a pinned name as a file, never
//!     a setuid bit, and answers an archive it cannot read with a typed error, never a
//!     panic (also fuzzed: `fuzz/fuzz_targets/stage_unpack.rs`); an entry the host cannot
//!     take (its directory full, a NUL or an overlong name) is skipped and listed with the
//!     reason while the rest is applied, and a host file is replaced only by a complete
//!     copy, renamed over it.
//!     (pinned by: tests/it/stage.rs::g5_*)
//!
//! # Non-guarantees
//! Between the guest creating an absent protected path and the sweep, the path exists on the
//! host: a host process that reads it during the run (direnv on `cd`, an editor watching
//! `.vscode`) sees it. No kernel mechanism here blocks the creation of one name in a
//! writable directory without a mount point, and a mount point would be an empty file left
//! in the user's directory (sandbox-runtime's approach, whose users report those files).
//! Only the workspace's top level is covered: a `.envrc` the guest creates in a subdirectory
//! stays. A unix socket a host daemon creates in the workspace after [`sockets`] ran is not
//! covered.
//!
//! # Failure behaviour
//! Every error is a [`HostFsError`] naming the path and the reason; a sweep that cannot
//! remove a planted path says which.
//!
//! # Unsafe
//! None: `#![forbid(unsafe_code)]`.
//!
//! # Ambient authority
//! [`Guarded::inspect`], [`sockets`], [`stage::pack`] and [`stage::unpack`] each open the
//! one directory they are given (`cap_std::ambient_authority`); every later access is
//! relative to that descriptor.
//!
//! # Feature flags
//! None.
//!
//! # Invariants
//! Stated as absences: never follows a symlink below the workspace; writes a file only in
//! [`stage::unpack`]; removes only paths on the protected list that were absent at
//! inspection.

#![forbid(unsafe_code)]

use std::io;
use std::path::{Path, PathBuf};

use cap_std::fs::Dir;
use stockade_protocol::{PINNED_DIRS, PROTECTED_PATHS};

pub mod stage;

/// What went wrong with a workspace, naming the path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostFsError {
    /// The workspace itself could not be opened.
    #[error("workspace {}: {source}", path.display())]
    Open {
        /// The workspace.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A protected path is reached through a symlink.
    #[error(
        "{rel} in the read-write workspace {} is a symlink, which the host would follow; grant the workspace read-only or remove the link", root.display()
    )]
    Symlink {
        /// The workspace.
        root: PathBuf,
        /// The path inside it (the symlink).
        rel: String,
    },
    /// A protected path could not be examined or removed.
    #[error("{rel} in the workspace {}: {source}", root.display())]
    Io {
        /// The workspace.
        root: PathBuf,
        /// The path inside it.
        rel: String,
        /// Why.
        source: io::Error,
    },
}

/// Why a host directory cannot be granted as a workspace.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkspaceError {
    /// The path cannot be resolved (missing, unreadable on the way).
    #[error("workspace {}: {source}", path.display())]
    Unreachable {
        /// The path, as given.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The path resolves to something that is not a directory.
    #[error("workspace {} is not a directory", path.display())]
    NotADirectory {
        /// The resolved path.
        path: PathBuf,
    },
    /// The directory is not a dedicated one (the protocol's rule).
    #[error("workspace {0}")]
    NotDedicated(#[from] stockade_protocol::NotDedicated),
}

/// The real directory behind a workspace path (symlinks resolved), if the protocol's rule
/// ([`stockade_protocol::check_dedicated`]) lets a tier grant it: the one check every tier
/// makes before it mounts or preopens a workspace, on the path it will then use.
pub fn resolve_workspace(path: &Path) -> Result<PathBuf, WorkspaceError> {
    let resolved = std::fs::canonicalize(path)
        .map_err(|source| WorkspaceError::Unreachable { path: path.to_path_buf(), source })?;
    if !resolved.is_dir() {
        return Err(WorkspaceError::NotADirectory { path: resolved });
    }
    stockade_protocol::check_dedicated(&resolved, &[])?;
    Ok(resolved)
}

/// What one protected path looked like at inspection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    Present,
    Absent,
}

/// A read-write workspace, inspected before a run.
#[derive(Debug)]
pub struct Guarded {
    root: PathBuf,
    dir: Dir,
    present: Vec<String>,
    absent: Vec<&'static str>,
    pinned: Vec<&'static str>,
}

impl Guarded {
    /// Opens the read-write workspace `root` and records which protected paths exist.
    pub fn inspect(root: &Path) -> Result<Self, HostFsError> {
        let dir = Dir::open_ambient_dir(root, cap_std::ambient_authority())
            .map_err(|source| HostFsError::Open { path: root.to_path_buf(), source })?;
        let mut g =
            Guarded { root: root.to_path_buf(), dir, present: Vec::new(), absent: Vec::new(), pinned: Vec::new() };
        for pin in PINNED_DIRS {
            match g.kind(&g.dir, pin)? {
                Some(Kind::Dir) => g.pinned.push(pin),
                // A gitfile ("gitdir: ...") redirects git elsewhere: protect the file itself.
                Some(Kind::Other) => g.present.push((*pin).to_owned()),
                Some(Kind::Symlink) => return Err(g.symlink(pin)),
                None => {}
            }
        }
        for rel in PROTECTED_PATHS {
            match g.find(rel)? {
                Found::Present => g.present.push((*rel).to_owned()),
                Found::Absent => g.absent.push(rel),
            }
        }
        Ok(g)
    }

    /// The workspace.
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Protected paths that exist: the tier keeps each read-only (relative to the root).
    #[must_use]
    pub fn present(&self) -> &[String] {
        &self.present
    }

    /// Protected paths that were absent: [`Guarded::sweep`] removes any the guest creates.
    #[must_use]
    pub fn absent(&self) -> &[&'static str] {
        &self.absent
    }

    /// Directories holding protected paths: the tier pins each in place (writable), so the
    /// guest can neither rename nor remove it.
    #[must_use]
    pub fn pinned(&self) -> &[&'static str] {
        &self.pinned
    }

    /// One line for a report: what is read-only and what is removed after the run.
    #[must_use]
    pub fn describe(&self) -> String {
        let list = |v: &[&str]| if v.is_empty() { "none".to_owned() } else { v.join(" ") };
        let present: Vec<&str> = self.present.iter().map(String::as_str).collect();
        format!(
            "read-only inside the workspace: {}; absent, removed after the run if created: {}",
            list(&present),
            list(&self.absent)
        )
    }

    /// After the run, with every guest process gone: removes each protected path that was
    /// absent and now exists, and any symlink or non-directory planted on the way to one.
    /// Returns what it removed, relative to the root.
    pub fn sweep(&self) -> Result<Vec<String>, HostFsError> {
        let mut removed = Vec::new();
        for rel in &self.absent {
            let parts: Vec<&str> = rel.split('/').collect();
            let Some((last, parents)) = parts.split_last() else { continue };
            let mut dir = self.dir.try_clone().map_err(|e| self.io(rel, e))?;
            let mut walked = String::new();
            let mut reached = true;
            for part in parents {
                walked = if walked.is_empty() { (*part).to_owned() } else { format!("{walked}/{part}") };
                match self.kind(&dir, part)? {
                    Some(Kind::Dir) => {
                        dir = stage::open_dir_nofollow(&dir, part.as_ref()).map_err(|e| self.io(&walked, e))?
                    }
                    None => {
                        reached = false;
                        break;
                    }
                    Some(Kind::Symlink | Kind::Other) => {
                        // Was absent or a real directory at inspection (a symlink refused the
                        // grant, and pinned directories cannot be replaced): planted.
                        dir.remove_file(part).map_err(|e| self.io(&walked, e))?;
                        removed.push(walked.clone());
                        reached = false;
                        break;
                    }
                }
            }
            if !reached {
                continue;
            }
            match self.kind(&dir, last)? {
                None => {}
                Some(Kind::Dir) => {
                    dir.remove_dir_all(last).map_err(|e| self.io(rel, e))?;
                    removed.push((*rel).to_owned());
                }
                Some(Kind::Symlink | Kind::Other) => {
                    dir.remove_file(last).map_err(|e| self.io(rel, e))?;
                    removed.push((*rel).to_owned());
                }
            }
        }
        removed.dedup();
        Ok(removed)
    }

    fn find(&self, rel: &str) -> Result<Found, HostFsError> {
        let parts: Vec<&str> = rel.split('/').collect();
        let mut dir = self.dir.try_clone().map_err(|e| self.io(rel, e))?;
        let mut walked = String::new();
        for (i, part) in parts.iter().enumerate() {
            walked = if walked.is_empty() { (*part).to_owned() } else { format!("{walked}/{part}") };
            let last = i + 1 == parts.len();
            match self.kind(&dir, part)? {
                None => return Ok(Found::Absent),
                Some(Kind::Symlink) => return Err(self.symlink(&walked)),
                Some(_) if last => return Ok(Found::Present),
                Some(Kind::Dir) => {
                    dir = stage::open_dir_nofollow(&dir, part.as_ref()).map_err(|e| self.io(&walked, e))?
                }
                // A file on the way (a gitfile `.git`): nothing below it to protect.
                Some(Kind::Other) => return Ok(Found::Absent),
            }
        }
        Ok(Found::Absent)
    }

    /// The type of `name` in `dir`, without following a symlink. A directory found here is
    /// then opened with `O_NOFOLLOW | O_DIRECTORY`, so a symlink swapped in between fails
    /// the walk instead of being followed (and no guest runs when this crate walks: before
    /// the run, or after its last process died).
    fn kind(&self, dir: &Dir, name: &str) -> Result<Option<Kind>, HostFsError> {
        match dir.symlink_metadata(name) {
            Ok(m) if m.file_type().is_symlink() => Ok(Some(Kind::Symlink)),
            Ok(m) if m.is_dir() => Ok(Some(Kind::Dir)),
            Ok(_) => Ok(Some(Kind::Other)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io(name, e)),
        }
    }

    fn symlink(&self, rel: &str) -> HostFsError {
        HostFsError::Symlink { root: self.root.clone(), rel: rel.to_owned() }
    }

    fn io(&self, rel: &str, source: io::Error) -> HostFsError {
        HostFsError::Io { root: self.root.clone(), rel: rel.to_owned(), source }
    }
}

/// Most entries [`sockets`] walks before it gives up (and the grant is refused): a million.
pub const MAX_WALK_ENTRIES: usize = 1_000_000;

/// Every unix socket in the tree at `root` (relative paths), found by a walk that follows no
/// symlink and stops with an error after `max_entries` entries. A tier covers each one in
/// the guest's view, since landlock before its pathname-socket scope cannot stop a
/// `connect` to a socket inside a granted directory, and a read-only bind does not either.
pub fn sockets(root: &Path, max_entries: usize) -> Result<Vec<String>, HostFsError> {
    use cap_std::fs::FileTypeExt;
    let dir = Dir::open_ambient_dir(root, cap_std::ambient_authority())
        .map_err(|source| HostFsError::Open { path: root.to_path_buf(), source })?;
    let io = |rel: &str, source| HostFsError::Io { root: root.to_path_buf(), rel: rel.to_owned(), source };
    let (mut found, mut seen) = (Vec::new(), 0usize);
    let mut stack = vec![(dir, String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let at = if prefix.is_empty() { "." } else { prefix.as_str() };
        for entry in dir.entries().map_err(|e| io(at, e))? {
            let entry = entry.map_err(|e| io(at, e))?;
            seen += 1;
            if seen > max_entries {
                return Err(io(
                    at,
                    io::Error::other(format!(
                        "more than {max_entries} entries to check for unix sockets; grant a smaller directory"
                    )),
                ));
            }
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let rel = if prefix.is_empty() { name.to_owned() } else { format!("{prefix}/{name}") };
            let kind = entry.file_type().map_err(|e| io(&rel, e))?;
            if kind.is_socket() {
                found.push(rel);
            } else if kind.is_dir() {
                match entry.open_dir() {
                    Ok(sub) => stack.push((sub, rel)),
                    // A directory this user cannot enter is one the guest cannot enter either.
                    Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {}
                    Err(e) => return Err(io(&rel, e)),
                }
            }
        }
    }
    found.sort();
    Ok(found)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    Symlink,
    Other,
}
