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
//! Depends on: `stockade-protocol` (the lists), `cap-std`, `tar` (the staged archive),
//! `serde_json` (the sweep record).
//! Used by: `stockade-process`, `stockade-docker`, `stockade-wasm`.
//! API boundary: yes; [`Guarded`], [`specials`], [`open_workspace`], [`OpenedWorkspace::lock`], [`resolve_workspace`], [`finish_killed_sweeps`], [`stage`].
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
//!     path that was absent and now exists, any symlink or non-directory the guest put on
//!     the way to one (a planted `.git` symlink or gitfile), and each new top-level entry of
//!     `.git` that git does not write (`.git/commondir`); it never follows a symlink, never
//!     touches a path outside the workspace, never removes what was present (a gitfile the
//!     user had stays), never stops at an error (a tree deeper than the descriptor limit, a
//!     directory its owner took the rights of: each path is tried, and every failure is
//!     returned with its path), and holds at most [`MAX_SWEEP_FDS`] descriptors.
//!     [`Guarded::sweep_planted`] does the same while the guest may still run (a live
//!     session), keeping the sweep record; two sweeps of one workspace never overlap.
//!     (pinned by: tests/it/guard.rs::g2_*)
//! G3. [`specials`] finds every unix socket and fifo in a granted tree, however deep and
//!     whatever the bytes of their names, without following a symlink, and refuses a tree
//!     larger than its entry cap rather than guess.
//!     (pinned by: tests/it/guard.rs::g3_*)
//! G4. [`open_workspace`] takes only a path with no symlink on it (one that leads through a
//!     symlink is judged by where it leads, then refused, naming it: a concurrent run's
//!     guest could swap a directory on it for a symlink as this run starts, the audit's
//!     escape), opens it from `/` without following any symlink (a component swapped for
//!     one in between refuses the grant), and applies the protocol's dedicated-directory
//!     rule to it, so every tier judges the directory it holds, and can check by device and
//!     inode that what it mounts is that directory; each refusal names the path and the
//!     reason. (`stockade run` resolves the path a user typed once, before the run.)
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
//!     copy, renamed over it. [`stage::unpack_snapshot`] (a session's home) also restores
//!     symlinks, each made only where nothing is and never followed by a later entry.
//!     (pinned by: tests/it/stage.rs::g5_*)
//! G6. When `.git` is a directory at inspection, [`Guarded::sweep`] also lists in
//!     [`Swept::refs_moved`] every ref the run created, moved or deleted (`HEAD`, loose refs
//!     under `refs/`, `packed-refs`), each name and value escaped so that no control byte
//!     reaches a terminal, read without following a symlink and within [`MAX_REFS`] and
//!     [`MAX_PACKED_BYTES`] (past them it says the comparison was partial), or why the refs
//!     could not be compared: a guest's commit of a protected file survives the sweep, and
//!     the user's `git checkout` would restore it, so the user is told what to review.
//!     (pinned by: tests/it/guard.rs::g6_*)
//! G7. [`OpenedWorkspace::lock`] gives a read-write run its workspace alone (`flock` on the
//!     descriptors [`open_workspace`] opened, not on names): no other run, in this process
//!     or another, of any tier, holds it or a directory inside it meanwhile, nor runs
//!     read-write on a directory above it, so no read-write guest can swap a directory on
//!     the path another run's engine binds by name; read-only runs share. A run waits for
//!     the holder, or, asked not to, is refused with [`WorkspaceError::Busy`].
//!     (pinned by: tests/it/guard.rs::g7_*)
//! G8. A run whose supervisor is killed before it sweeps still gets its sweep:
//!     [`Guarded::record_in`] writes what the inspection found to stockade's state directory
//!     ([`sweeps_dir`]) before the guest starts, [`Guarded::heartbeat`] keeps it fresh, and
//!     the sweep removes it. [`finish_killed_sweeps`] finishes each record whose workspace
//!     lock it can take (so no run holds it: the record's run is dead), in the directory
//!     with the recorded device and inode only, removing what [`Guarded::sweep`] would and
//!     leaving, listed in [`Swept::left`], any such path whose inode changed more than
//!     [`RECORD_GRACE`] after the record was last touched (the user may have made it since).
//!     (pinned by: tests/it/guard.rs::g8_*)
//! G9. [`files::Files`], a session's files API, reaches only the directories it serves, by
//!     the path the guest sees: a path with `..`, or outside them, is refused before any
//!     lookup; a symlink the guest planted that leads out (absolute, or climbing with `..`)
//!     fails the call (cap-std resolves beneath the descriptor opened when the session was
//!     made); a file opened to be streamed out is a regular file, its size checked against
//!     the cap first, and the open never waits (`O_NONBLOCK`: a fifo, socket or device the
//!     guest made, or a link to one, is refused by its type at once); a write streams into a new file and renames it over the name, so it never
//!     writes through a hard link the guest made, and over its cap changes nothing; a
//!     read-only root takes no change, and a guarded one (a read-write workspace) never a
//!     change to a protected path. Every failure is one typed line naming the path.
//!     (pinned by: tests/it/files.rs::g9_*)
//!
//! # Non-guarantees
//! Which of the moved refs' commits touch a protected path is not computed: that would
//! parse objects the guest wrote (zlib streams, packs) in the supervisor; the user reviews
//! them with git (`git diff OLD NEW -- PATHS`).
//! Between the guest creating an absent protected path and the sweep, the path exists on the
//! host: a host process that reads it during the run (direnv on `cd`, an editor watching
//! `.vscode`) sees it. No kernel mechanism here blocks the creation of one name in a
//! writable directory without a mount point, and a mount point would be an empty file left
//! in the user's directory (sandbox-runtime's approach, whose users report those files).
//! Only the workspace's top level is covered: a `.envrc` the guest creates in a subdirectory
//! stays. A unix socket or fifo a host process creates in the workspace after [`specials`] ran
//! is not covered.
//! A path the user makes, where a protected path was absent, between the moment a run's
//! supervisor is killed and [`RECORD_GRACE`] after its record's last heartbeat, is removed
//! with the guest's by a finished sweep: the file's times cannot tell the two apart. A
//! record is not synced to disk: a machine that crashes during a run may lose it.
//! The lock binds stockade's runs only: a host process that is not a stockade run can still
//! rename directories above a workspace while the docker or wasm tier opens it by name (the
//! process tier mounts the descriptor it judged, whatever the name says later).
//!
//! # Failure behaviour
//! Every error is a [`HostFsError`] naming the path and the reason; a sweep that cannot
//! remove a planted path says which.
//!
//! # Unsafe
//! None: `#![forbid(unsafe_code)]`.
//!
//! # Ambient authority
//! [`open_workspace`], [`Guarded::inspect`], [`specials`], [`stage::pack`] and [`stage::unpack`] each open the
//! one directory they are given (`cap_std::ambient_authority`); every later access is
//! relative to that descriptor, except that [`Guarded::sweep`] climbs back up a planted tree
//! it walked down with `Dir::open_parent_dir` (`..`), and uses what it opened only if its
//! device and inode are those of the directory it came down through. [`Guarded::record_in`]
//! and [`finish_killed_sweeps`] use the records' directory by path (stockade's own state,
//! from the environment: [`state_dir`]), and the latter opens each recorded workspace as
//! [`open_workspace`] does.
//!
//! # Feature flags
//! None.
//!
//! # Invariants
//! Stated as absences: never follows a symlink below the workspace; writes a file only in
//! [`stage::unpack`] and, outside any workspace, a sweep record in [`sweeps_dir`]; removes
//! only paths on the protected list that were absent at inspection.

#![forbid(unsafe_code)]

use std::io;
use std::path::{Path, PathBuf};

use cap_std::fs::Dir;
use stockade_protocol::{PINNED_DIRS, PROTECTED_PATHS};

pub mod files;
mod record;
mod refs;
pub use record::{Finished, HEARTBEAT, RECORD_GRACE, finish_killed_sweeps, state_dir, sweeps_dir};
pub use refs::{MAX_PACKED_BYTES, MAX_REFS};
pub mod stage;
pub mod watch;

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
    /// A run's sweep record could not be written (see [`Guarded::record_in`]).
    #[error("the sweep record in {}: {source}; set STOCKADE_STATE_DIR to a writable directory", path.display())]
    Record {
        /// The records' directory.
        path: PathBuf,
        /// Why.
        source: io::Error,
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

/// The one mapping every tier makes: a workspace another run holds is
/// [`RunError::Busy`](stockade_protocol::RunError::Busy), a lock the kernel refused is a
/// stockade bug, and every other reason is the job's fault (misconfigured).
impl From<WorkspaceError> for stockade_protocol::RunError {
    fn from(e: WorkspaceError) -> Self {
        match e {
            WorkspaceError::Busy { .. } => Self::Busy(e.to_string()),
            WorkspaceError::Lock { .. } => Self::Internal(e.to_string()),
            e => Self::Misconfigured(e.to_string()),
        }
    }
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
    /// The path leads through a symlink: it is refused rather than followed, since another
    /// run's guest could swap a directory on it for a symlink while this run starts.
    #[error("workspace {} leads through a symlink to {}; name the directory itself (a symlink on the way could be swapped for another while the run starts)", path.display(), resolved.display())]
    ThroughSymlink {
        /// The path, as given.
        path: PathBuf,
        /// Where it led when it was resolved.
        resolved: PathBuf,
    },
    /// Another run holds the workspace (or, for a read-write run, a directory above or below
    /// it), and the run asked not to wait ([`stockade_protocol::Busy::Refuse`]).
    #[error("workspace {} is held by another run (a read-write run holds its workspace and every directory inside it alone until its sweep is done); refused instead of waiting", path.display())]
    Busy {
        /// The resolved path.
        path: PathBuf,
    },
    /// The workspace's lock could not be taken (the kernel refused `flock`).
    #[error("workspace {}: locking it: {source}", path.display())]
    Lock {
        /// The resolved path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A directory on the resolved path was replaced (by a symlink or a file) while it was
    /// being opened: something is changing the tree, and nothing is mounted.
    #[error("workspace {}: a directory on the path changed while it was opened (a symlink or a file replaced it); refusing", path.display())]
    Changed {
        /// The resolved path.
        path: PathBuf,
    },
}

/// The workspace path, if it names a directory with no symlink on the way and the
/// protocol's rule ([`stockade_protocol::check_dedicated`]) lets a tier grant it: the one
/// check every tier makes before it mounts or preopens a workspace. The path returned is the
/// one judged; see [`open_workspace`] for the directory itself, held.
pub fn resolve_workspace(path: &Path) -> Result<PathBuf, WorkspaceError> {
    open_workspace(path).map(|w| w.path)
}

/// A workspace directory judged and held: the path it had when it was opened, the open
/// directory, its device and inode, and the directories above it (for [`OpenedWorkspace::lock`]).
#[derive(Debug)]
pub struct OpenedWorkspace {
    path: PathBuf,
    dir: Dir,
    id: (u64, u64),
    /// Each directory from the one below `/` to the workspace's parent, as opened on the way.
    above: Vec<std::fs::File>,
}

/// How long a run waits between tries for a workspace another run holds: 20 ms (the
/// `pause` every tier passes to [`OpenedWorkspace::lock`]).
pub const LOCK_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// A workspace's lock, taken by [`OpenedWorkspace::lock`]: released when dropped.
#[derive(Debug)]
pub struct WorkspaceLock {
    /// Copies of the locked descriptors (each shares its lock with the original).
    held: Vec<std::fs::File>,
}

impl Drop for WorkspaceLock {
    fn drop(&mut self) {
        for f in self.held.iter().rev() {
            let _ = f.unlock();
        }
    }
}

impl OpenedWorkspace {
    /// The path the directory had when it was opened, symlinks resolved, and judged.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory itself.
    #[must_use]
    pub fn dir(&self) -> &Dir {
        &self.dir
    }

    /// Its device and inode: a mount of another directory has another pair.
    #[must_use]
    pub fn id(&self) -> (u64, u64) {
        self.id
    }

    /// Takes the workspace's lock for a run: the workspace itself exclusively for a
    /// read-write run (shared for a read-only one), and every directory above it shared
    /// (`flock(2)` on the descriptors opened, so a rename of any of them does not escape it).
    /// So a read-write run excludes every other run of its workspace or of a directory below
    /// it (whose path its guest could swap for a symlink while another tier binds it by
    /// name), and every read-write run of a directory above it, while read-only runs share.
    /// Two runs in one process exclude each other as two processes do.
    ///
    /// Another run holding a conflicting lock is waited for, `pause().await` between tries,
    /// or refused with [`WorkspaceError::Busy`] when `busy` is
    /// [`stockade_protocol::Busy::Refuse`]. Locks are tried top down and all released
    /// between tries, so two runs never hold each other's next lock.
    pub async fn lock<F: std::future::Future<Output = ()>>(
        &self,
        writable: bool,
        busy: stockade_protocol::Busy,
        mut pause: impl FnMut() -> F,
    ) -> Result<WorkspaceLock, WorkspaceError> {
        loop {
            if let Some(lock) = self.try_lock(writable)? {
                return Ok(lock);
            }
            if busy == stockade_protocol::Busy::Refuse {
                return Err(WorkspaceError::Busy { path: self.path.clone() });
            }
            pause().await;
        }
    }

    fn try_lock(&self, writable: bool) -> Result<Option<WorkspaceLock>, WorkspaceError> {
        let failed = |source| WorkspaceError::Lock { path: self.path.clone(), source };
        let own = self.dir.try_clone().map_err(failed)?.into_std_file();
        let mut lock = WorkspaceLock { held: Vec::with_capacity(self.above.len() + 1) };
        for (i, f) in self.above.iter().chain(std::iter::once(&own)).enumerate() {
            let exclusive = writable && i == self.above.len();
            let got = if exclusive { f.try_lock() } else { f.try_lock_shared() };
            match got {
                Ok(()) => lock.held.push(f.try_clone().map_err(failed)?),
                Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
                Err(std::fs::TryLockError::Error(e)) => return Err(failed(e)),
            }
        }
        Ok(Some(lock))
    }
}

/// Opens the workspace at `path` and judges the directory it opened, not a name: the path
/// must name the directory itself (a path that resolves elsewhere, through a symlink, is
/// judged by where it leads and then refused with [`WorkspaceError::ThroughSymlink`]: a run
/// holding a directory on it could have swapped one for a symlink), and is opened from `/`
/// one component at a time, each `O_NOFOLLOW | O_DIRECTORY`, so a component swapped for a
/// symlink after the check fails the open instead of being followed; the path is judged by
/// [`stockade_protocol::check_dedicated`]. What a tier mounts must be this
/// directory: it compares the device and inode ([`OpenedWorkspace::id`]) with what it mounted.
///
/// # Ambient Authority
/// Resolves `path` in the host's global filesystem namespace.
pub fn open_workspace(path: &Path) -> Result<OpenedWorkspace, WorkspaceError> {
    use cap_std::fs::MetadataExt;
    use std::path::Component;
    let unreachable = |source| WorkspaceError::Unreachable { path: path.to_path_buf(), source };
    let resolved = std::fs::canonicalize(path).map_err(unreachable)?;
    if !resolved.is_dir() {
        return Err(WorkspaceError::NotADirectory { path: resolved });
    }
    if resolved != path {
        // Judged by where it leads first (the more useful refusal), then refused as a path
        // whose resolution another run's guest could change between two runs' starts.
        stockade_protocol::check_dedicated(&resolved, &[])?;
        return Err(WorkspaceError::ThroughSymlink { path: path.to_path_buf(), resolved });
    }
    let mut dir = Dir::open_ambient_dir("/", cap_std::ambient_authority()).map_err(unreachable)?;
    let mut above = Vec::new();
    let mut at_root = true;
    for part in resolved.components() {
        match part {
            Component::RootDir => {}
            Component::Normal(name) => {
                let next = stage::open_dir_nofollow(&dir, name).map_err(|e| {
                    if e.raw_os_error() == Some(20) || e.raw_os_error() == Some(40) {
                        // ENOTDIR or ELOOP: not a directory now, or a symlink swapped in.
                        WorkspaceError::Changed { path: resolved.clone() }
                    } else {
                        unreachable(e)
                    }
                })?;
                // `/` itself is never locked: no workspace is `/`, so no run holds it alone.
                let parent = std::mem::replace(&mut dir, next);
                if !at_root {
                    above.push(parent.into_std_file());
                }
                at_root = false;
            }
            _ => return Err(WorkspaceError::Changed { path: resolved }),
        }
    }
    let meta = dir.dir_metadata().map_err(unreachable)?;
    if !meta.is_dir() {
        return Err(WorkspaceError::NotADirectory { path: resolved });
    }
    stockade_protocol::check_dedicated(&resolved, &[])?;
    Ok(OpenedWorkspace { id: (meta.dev(), meta.ino()), path: resolved, dir, above })
}

/// What one protected path looked like at inspection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    Present,
    Absent,
    /// A file stands on the way (a gitfile `.git`): nothing below it exists to protect, and
    /// the file itself is protected as present.
    Blocked,
}

/// A read-write workspace, inspected before a run.
#[derive(Debug)]
pub struct Guarded {
    root: PathBuf,
    dir: Dir,
    /// The workspace's device and inode.
    id: (u64, u64),
    present: Vec<String>,
    absent: Vec<&'static str>,
    pinned: Vec<&'static str>,
    /// The top-level names of `.git` at inspection, if it was a directory then (or none if
    /// it was absent): a new name there that git does not write ([`stockade_protocol::GIT_WRITABLE`])
    /// is swept.
    git_before: Option<std::collections::HashSet<std::ffi::OsString>>,
    /// `.git`'s refs at inspection (if `.git` was a directory then), compared after the run
    /// (G6); or why they could not be read.
    refs_before: Option<Result<refs::Refs, String>>,
    /// This run's record on disk ([`Guarded::record_in`]), removed by the sweep.
    record: Option<record::Record>,
    /// For a sweep finished after its supervisor was killed: the latest moment the run could
    /// have written; what changed later is left ([`Swept::left`]).
    written_by: Option<std::time::SystemTime>,
    /// Held by every sweep, so that a live session's sweeps never run two at once.
    sweeping: std::sync::Mutex<()>,
}

/// What a sweep did: every path it removed, and every path it could not remove with the
/// reason. A sweep never stops at an error: each protected path is tried.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Swept {
    /// What the guest planted and the sweep removed, relative to the root.
    pub removed: Vec<String>,
    /// What the sweep could not remove, each naming the path and the reason.
    pub errors: Vec<HostFsError>,
    /// Every git ref the run created, moved or deleted in the workspace's `.git`, one
    /// escaped line each (`refs/heads/main 1f2e3d4c5b6a..0a1b2c3d4e5f`), or why the refs
    /// could not be compared: a commit can bring back what the sweep removed (G6).
    pub refs_moved: Vec<String>,
    /// For a sweep finished after its run's supervisor was killed ([`finish_killed_sweeps`]):
    /// what it would have removed but left, because it changed after the run could have
    /// written it (the user may have made it since).
    pub left: Vec<String>,
}

impl Swept {
    /// Writes this sweep into a run's `report`, the one way every tier does it: what it
    /// removed ([`Report::swept`](stockade_protocol::Report::swept), and the enforcement
    /// record naming `mechanism`), what it could not remove, and the git refs the run moved.
    pub fn record(&self, report: &mut stockade_protocol::Report, mechanism: stockade_protocol::Mechanism) {
        if !self.removed.is_empty() {
            report.enforcement.push(stockade_protocol::Enforced::swept(mechanism, &self.removed));
        }
        report.swept.clone_from(&self.removed);
        report.sweep_errors = self.errors.iter().map(ToString::to_string).collect();
        report.git_refs_moved.clone_from(&self.refs_moved);
    }
}

/// Most directory descriptors one sweep holds open at once, however deep the tree it
/// removes: a guest that plants a tree deeper than the process's descriptor limit would
/// otherwise stop a recursive removal (EMFILE) before the protected paths after it.
pub const MAX_SWEEP_FDS: usize = 16;

impl Guarded {
    /// Opens the read-write workspace `root` and records which protected paths exist.
    pub fn inspect(root: &Path) -> Result<Self, HostFsError> {
        let dir = Dir::open_ambient_dir(root, cap_std::ambient_authority())
            .map_err(|source| HostFsError::Open { path: root.to_path_buf(), source })?;
        Self::inspect_dir(root, dir)
    }

    /// Records which protected paths exist in the read-write workspace `dir`, already open
    /// (from [`open_workspace`]); `root` names it in messages.
    pub fn inspect_dir(root: &Path, dir: Dir) -> Result<Self, HostFsError> {
        let id = dir_id(&dir).map_err(|source| HostFsError::Open { path: root.to_path_buf(), source })?;
        let mut g = Guarded {
            root: root.to_path_buf(),
            dir,
            id,
            present: Vec::new(),
            absent: Vec::new(),
            pinned: Vec::new(),
            git_before: None,
            refs_before: None,
            record: None,
            written_by: None,
            sweeping: std::sync::Mutex::new(()),
        };
        for pin in PINNED_DIRS {
            match g.kind(&g.dir, pin)? {
                Some(Kind::Dir) => g.pinned.push(pin),
                // A gitfile ("gitdir: ...") redirects git elsewhere: protect the file itself.
                Some(Kind::Other) => g.present.push((*pin).to_owned()),
                Some(Kind::Symlink) => return Err(g.symlink(pin)),
                None => {}
            }
        }
        if g.pinned.contains(&".git") {
            let git = stage::open_dir_nofollow(&g.dir, ".git".as_ref()).map_err(|e| g.io(".git", e))?;
            let mut names = std::collections::HashSet::new();
            for entry in git.entries().map_err(|e| g.io(".git", e))? {
                names.insert(entry.map_err(|e| g.io(".git", e))?.file_name());
            }
            g.git_before = Some(names);
            g.refs_before = Some(refs::Refs::read(&git).map_err(|e| e.to_string()));
        }
        for rel in PROTECTED_PATHS {
            match g.find(rel)? {
                Found::Present => g.present.push((*rel).to_owned()),
                Found::Absent => g.absent.push(rel),
                Found::Blocked => {}
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
            "read-only inside the workspace: {}; absent, removed after the run if created: {} and any new .git entry git does not write",
            list(&present),
            list(&self.absent)
        )
    }

    /// After the run, with every guest process gone: removes each protected path that was
    /// absent and now exists, any symlink or non-directory planted on the way to one, and
    /// each new top-level entry of `.git` that git does not write. It never stops at an
    /// error: each path is tried, a directory the owner may not enter is made enterable, a
    /// tree of any depth is removed holding at most [`MAX_SWEEP_FDS`] descriptors, and every
    /// failure is returned, naming its path. It never removes what was present at
    /// inspection.
    #[must_use]
    pub fn sweep(&self) -> Swept {
        let _one = self.sweeping.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out = self.sweep_paths();
        out.refs_moved = self.refs_moved();
        if let Some(r) = &self.record {
            r.remove();
        }
        out
    }

    /// [`Guarded::sweep`] while the guest may still run (a live session, between and during
    /// its execs): removes what was planted so far, by the same descriptor-held walk that
    /// follows no link, so that a planted path exists on the host only until the next one.
    /// It keeps the sweep record (the final [`Guarded::sweep`] removes it) and compares no
    /// refs. Sweeps of one workspace never run two at once.
    #[must_use]
    pub fn sweep_planted(&self) -> Swept {
        let _one = self.sweeping.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.sweep_paths()
    }

    fn sweep_paths(&self) -> Swept {
        let mut out = Swept::default();
        for rel in &self.absent {
            self.sweep_one(rel, &mut out);
        }
        self.sweep_git(&mut out);
        out.removed.sort();
        out.removed.dedup();
        out
    }

    fn sweep_one(&self, rel: &str, out: &mut Swept) {
        let parts: Vec<&str> = rel.split('/').collect();
        let Some((last, parents)) = parts.split_last() else { return };
        let mut dir = match self.dir.try_clone() {
            Ok(d) => d,
            Err(e) => return out.errors.push(self.io(rel, e)),
        };
        let mut walked = String::new();
        for part in parents {
            walked = if walked.is_empty() { (*part).to_owned() } else { format!("{walked}/{part}") };
            match self.kind(&dir, part) {
                Err(e) => return out.errors.push(e),
                Ok(None) => return,
                Ok(Some(Kind::Dir)) => match self.enter(&dir, part.as_ref(), &walked) {
                    Ok(d) => dir = d,
                    Err(e) => return out.errors.push(e),
                },
                Ok(Some(Kind::Symlink | Kind::Other)) => {
                    // Inspection found the way clear or absent (a file on the way makes the
                    // path `Blocked`, never absent, and a symlink refuses the grant), so this
                    // was planted.
                    return self.remove(&dir, part.as_ref(), &walked, out);
                }
            }
        }
        self.remove(&dir, last.as_ref(), rel, out);
    }

    /// What [`Swept::refs_moved`] holds: the refs now against those at inspection.
    fn refs_moved(&self) -> Vec<String> {
        let Some(before) = &self.refs_before else { return Vec::new() };
        let unreadable = |e: &dyn std::fmt::Display| vec![format!("(git refs not compared: {e})")];
        let before = match before {
            Ok(b) => b,
            Err(e) => return unreadable(e),
        };
        let after = match stage::open_dir_nofollow(&self.dir, ".git".as_ref()) {
            Ok(git) => refs::Refs::read(&git),
            // `.git` itself was pinned for the run: gone or replaced, every ref went with it.
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(refs::Refs::default()),
            Err(e) => Err(e),
        };
        match after {
            Ok(after) => before.moved(&after),
            Err(e) => unreadable(&e),
        }
    }

    /// The new top-level entries of `.git` that git does not write.
    fn sweep_git(&self, out: &mut Swept) {
        let git = match self.kind(&self.dir, ".git") {
            Ok(Some(Kind::Dir)) => match self.enter(&self.dir, ".git".as_ref(), ".git") {
                Ok(d) => d,
                Err(e) => return out.errors.push(e),
            },
            Ok(_) => return,
            Err(e) => return out.errors.push(e),
        };
        let names = match list(&git) {
            Ok(n) => n,
            Err(e) => return out.errors.push(self.io(".git", e)),
        };
        for name in names {
            let before = self.git_before.as_ref().is_some_and(|b| b.contains(&name));
            if before || stockade_protocol::git_writable(&name) {
                continue;
            }
            let rel = format!(".git/{}", name.to_string_lossy());
            self.remove(&git, &name, &rel, out);
        }
    }

    /// Opens the directory `name` in `dir` for the sweep: a directory the owner may not enter
    /// (`chmod 0500`, `0000`) is given its owner's rights first.
    fn enter(&self, dir: &Dir, name: &std::ffi::OsStr, rel: &str) -> Result<Dir, HostFsError> {
        self.enter_lazy(dir, name, || rel.to_owned())
    }

    /// [`Guarded::enter`], naming the path (built only for an error) with `rel`.
    fn enter_lazy(&self, dir: &Dir, name: &std::ffi::OsStr, rel: impl Fn() -> String) -> Result<Dir, HostFsError> {
        match stage::open_dir_nofollow(dir, name) {
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                make_owner_rwx(dir, name).map_err(|e| self.io(&rel(), e))?;
                stage::open_dir_nofollow(dir, name).map_err(|e| self.io(&rel(), e))
            }
            r => r.map_err(|e| self.io(&rel(), e)),
        }
    }

    /// Removes `name` in `dir` (anything: a file, a link, a tree of any depth), recording it
    /// or every error on the way.
    fn remove(&self, dir: &Dir, name: &std::ffi::OsStr, rel: &str, out: &mut Swept) {
        let before = out.errors.len();
        match dir.symlink_metadata(name) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return,
            Err(e) => return out.errors.push(self.io(rel, e)),
            Ok(m) if self.written_by.is_some_and(|by| changed_at(&m) > by) => return out.left.push(rel.to_owned()),
            Ok(m) if m.is_dir() => self.remove_tree(dir, name, rel, out),
            Ok(_) => {
                if let Err(e) = dir.remove_file(name) {
                    out.errors.push(self.io(rel, e));
                }
            }
        }
        if out.errors.len() == before {
            out.removed.push(rel.to_owned());
        }
    }

    /// Removes the directory `name` in `parent` and everything below it, depth first, with
    /// at most [`MAX_SWEEP_FDS`] descriptors open: a level whose descriptor was closed for
    /// the cap is reopened by name from `parent`. An entry that cannot be removed is
    /// recorded and left, and the walk goes on with the rest.
    fn remove_tree(&self, parent: &Dir, name: &std::ffi::OsStr, rel: &str, out: &mut Swept) {
        let mut stack = vec![Frame { name: name.to_owned(), id: None, dir: None, pending: None, failed: false }];
        while let Some(top) = stack.len().checked_sub(1) {
            if stack[top].dir.is_none() {
                match self.reopen(parent, &stack, rel, out) {
                    Some(d) => {
                        stack[top].id = dir_id(&d).ok();
                        stack[top].dir = Some(d);
                    }
                    None => {
                        // It cannot be entered: left, with its error recorded.
                        stack.pop();
                        if let Some(p) = stack.last_mut() {
                            p.failed = true;
                        }
                        continue;
                    }
                }
                if stack.iter().filter(|f| f.dir.is_some()).count() > MAX_SWEEP_FDS
                    && let Some(oldest) = stack.iter_mut().find(|f| f.dir.is_some())
                {
                    oldest.dir = None;
                }
            }
            if stack[top].pending.is_none() {
                let here = || path_of(rel, &stack);
                let mut subdirs = Vec::new();
                let mut failed = false;
                if let Some(dir) = stack[top].dir.as_ref() {
                    match list_typed(dir) {
                        Ok(entries) => {
                            for (entry, is_dir) in entries {
                                if is_dir {
                                    subdirs.push(entry);
                                } else if let Err(e) = dir.remove_file(&entry) {
                                    out.errors.push(self.io(&format!("{}/{}", here(), entry.to_string_lossy()), e));
                                    failed = true;
                                }
                            }
                        }
                        Err(e) => {
                            out.errors.push(self.io(&here(), e));
                            failed = true;
                        }
                    }
                }
                stack[top].failed |= failed;
                stack[top].pending = Some(subdirs);
            }
            if let Some(sub) = stack[top].pending.as_mut().and_then(Vec::pop) {
                stack.push(Frame { name: sub, id: None, dir: None, pending: None, failed: false });
                continue;
            }
            // Everything below is gone (or recorded): the directory itself.
            let Some(done) = stack.pop() else { break };
            // Climbing back up: a parent whose descriptor was closed for the cap is opened
            // as `..` of this one (and must be the directory walked down through), not
            // again from the top, so a deep tree costs one open per level each way.
            if let (Some(p), Some(d)) = (stack.last_mut(), done.dir.as_ref())
                && p.dir.is_none()
                && let Ok(up) = d.open_parent_dir(cap_std::ambient_authority())
                && dir_id(&up).is_ok_and(|id| Some(id) == p.id)
            {
                p.dir = Some(up);
            }
            drop(done.dir);
            let removed = !done.failed && {
                let holder = match stack.last().and_then(|p| p.dir.as_ref()) {
                    Some(d) => d.try_clone().ok(),
                    None if stack.is_empty() => parent.try_clone().ok(),
                    None => self.reopen(parent, &stack, rel, out),
                };
                match holder.map(|h| h.remove_dir(&done.name)) {
                    Some(Ok(())) => true,
                    Some(Err(e)) => {
                        let mut here = path_of(rel, &stack);
                        if !stack.is_empty() {
                            here.push('/');
                            here.push_str(&done.name.to_string_lossy());
                        }
                        out.errors.push(self.io(&here, e));
                        false
                    }
                    None => false,
                }
            };
            if !removed && let Some(p) = stack.last_mut() {
                p.failed = true;
            }
        }
    }

    /// The directory of the last frame of `stack`, opened from `parent` by name, one level at
    /// a time (`O_NOFOLLOW | O_DIRECTORY`, made enterable where its owner may).
    fn reopen(&self, parent: &Dir, stack: &[Frame], rel: &str, out: &mut Swept) -> Option<Dir> {
        // Start from the deepest frame still open.
        let from = stack.iter().rposition(|f| f.dir.is_some());
        let mut cur = match from {
            Some(i) => stack[i].dir.as_ref()?.try_clone().ok()?,
            None => parent.try_clone().ok()?,
        };
        let first = from.map_or(0, |i| i + 1);
        for i in first..stack.len() {
            cur = self
                .enter_lazy(&cur, &stack[i].name, || path_of(rel, &stack[..=i]))
                .map_err(|e| out.errors.push(e))
                .ok()?;
        }
        Some(cur)
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
                // A file on the way (a gitfile `.git`): nothing below it to protect, and the
                // file is never the sweep's to remove.
                Some(Kind::Other) => return Ok(Found::Blocked),
            }
        }
        Ok(Found::Absent)
    }

    /// The type of `name` in `dir`, without following a symlink. A directory found here is
    /// then opened with `O_NOFOLLOW | O_DIRECTORY`, so a symlink swapped in between fails
    /// the walk instead of being followed (and no guest runs when this crate walks: before
    /// the run, or after its last process died).
    fn kind<N: AsRef<Path> + ?Sized>(&self, dir: &Dir, name: &N) -> Result<Option<Kind>, HostFsError> {
        let name = name.as_ref();
        match dir.symlink_metadata(name) {
            Ok(m) if m.file_type().is_symlink() => Ok(Some(Kind::Symlink)),
            Ok(m) if m.is_dir() => Ok(Some(Kind::Dir)),
            Ok(_) => Ok(Some(Kind::Other)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io(&name.to_string_lossy(), e)),
        }
    }

    fn symlink(&self, rel: &str) -> HostFsError {
        HostFsError::Symlink { root: self.root.clone(), rel: rel.to_owned() }
    }

    fn io(&self, rel: &str, source: io::Error) -> HostFsError {
        HostFsError::Io { root: self.root.clone(), rel: rel.to_owned(), source }
    }
}

/// One directory on the sweep's way down a planted tree.
struct Frame {
    name: std::ffi::OsString,
    /// Its device and inode, once opened: a level reopened from below must be this one.
    id: Option<(u64, u64)>,
    /// Its descriptor, unless closed to keep within [`MAX_SWEEP_FDS`].
    dir: Option<Dir>,
    /// Subdirectories still to remove; `None` until the directory was listed.
    pending: Option<Vec<std::ffi::OsString>>,
    /// Something below could not be removed, so neither can this directory.
    failed: bool,
}

/// The path of the last frame of `stack`, relative to the workspace (`rel` names the first).
fn path_of(rel: &str, stack: &[Frame]) -> String {
    let mut r = rel.to_owned();
    for f in stack.iter().skip(1) {
        r.push('/');
        r.push_str(&f.name.to_string_lossy());
    }
    r
}

/// When `m`'s inode last changed (`ctime`: set by the kernel on every write, rename or
/// change of mode, and by no call a program can make with a time of its choosing).
fn changed_at(m: &cap_std::fs::Metadata) -> std::time::SystemTime {
    use cap_std::fs::MetadataExt;
    let secs = u64::try_from(m.ctime()).unwrap_or(0);
    let nanos = u32::try_from(m.ctime_nsec()).unwrap_or(0);
    std::time::SystemTime::UNIX_EPOCH + std::time::Duration::new(secs, nanos)
}

/// The device and inode of the open directory `dir`.
fn dir_id(dir: &Dir) -> io::Result<(u64, u64)> {
    use cap_std::fs::MetadataExt;
    dir.dir_metadata().map(|m| (m.dev(), m.ino()))
}

/// The names in `dir`.
fn list(dir: &Dir) -> io::Result<Vec<std::ffi::OsString>> {
    dir.entries()?.map(|e| e.map(|e| e.file_name())).collect()
}

/// The names in `dir`, each with whether it is a directory (not following a symlink).
fn list_typed(dir: &Dir) -> io::Result<Vec<(std::ffi::OsString, bool)>> {
    let mut out = Vec::new();
    for entry in dir.entries()? {
        let entry = entry?;
        let is_dir = entry.file_type()?.is_dir();
        out.push((entry.file_name(), is_dir));
    }
    Ok(out)
}

/// Gives the owner read, write and search rights on the directory `name` in `dir` (what a
/// guest took away with `chmod` so a sweep could not enter it). Only the owner, or root,
/// may; anyone else gets the error.
fn make_owner_rwx(dir: &Dir, name: &std::ffi::OsStr) -> io::Result<()> {
    use cap_std::fs::PermissionsExt;
    let mode = dir.symlink_metadata(name)?.permissions().mode() | 0o700;
    dir.set_permissions(name, cap_std::fs::Permissions::from_mode(mode))
}

/// Most entries [`specials`] walks before it gives up (and the grant is refused): a million.
pub const MAX_WALK_ENTRIES: usize = 1_000_000;

/// Every unix socket and fifo in the tree at `root` (relative paths, names as the host has
/// them, UTF-8 or not), found by a walk that follows no symlink and stops with an error after
/// `max_entries` entries. A tier covers each one in the guest's view: landlock before its
/// pathname-socket scope cannot stop a `connect` to a socket inside a granted directory, a
/// read-only bind does not either, and a fifo's reader on the host would take what the guest
/// writes into it.
pub fn specials(root: &Path, max_entries: usize) -> Result<Vec<PathBuf>, HostFsError> {
    let dir = Dir::open_ambient_dir(root, cap_std::ambient_authority())
        .map_err(|source| HostFsError::Open { path: root.to_path_buf(), source })?;
    specials_in(root, dir, max_entries)
}

/// [`specials`] in the directory `dir`, already open; `root` names it in messages.
pub fn specials_in(root: &Path, dir: Dir, max_entries: usize) -> Result<Vec<PathBuf>, HostFsError> {
    use cap_std::fs::FileTypeExt;
    let io = |rel: &Path, source| HostFsError::Io { root: root.to_path_buf(), rel: rel.display().to_string(), source };
    let (mut found, mut seen) = (Vec::new(), 0usize);
    let mut stack = vec![(dir, PathBuf::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let at = if prefix.as_os_str().is_empty() { Path::new(".") } else { prefix.as_path() };
        for entry in dir.entries().map_err(|e| io(at, e))? {
            let entry = entry.map_err(|e| io(at, e))?;
            seen += 1;
            if seen > max_entries {
                return Err(io(
                    at,
                    io::Error::other(format!(
                        "more than {max_entries} entries to check for unix sockets and fifos; grant a smaller directory"
                    )),
                ));
            }
            let rel = prefix.join(entry.file_name());
            let kind = entry.file_type().map_err(|e| io(&rel, e))?;
            if kind.is_socket() || kind.is_fifo() {
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
