//! The sweep's record on disk (G8): written before a read-write run's guest starts, kept
//! fresh while the run goes on, removed once the sweep ran. A record that outlives its run
//! is the trace of a supervisor that was killed (SIGKILL, a crash, the machine's OOM
//! killer) before it swept; [`finish_killed_sweeps`] finishes that sweep later.
//!
//! Two rules keep a late sweep from touching what is not the guest's:
//! - **the owner is gone**: a record is finished only under the workspace's exclusive lock
//!   ([`crate::OpenedWorkspace::lock`]), which its run held from before the record was written
//!   until after it was removed; a lock the kernel gives means no run holds it, and a run
//!   that ended removed its record first;
//! - **only what the run could have made**: the run's last processes die with its
//!   supervisor, and the supervisor touches the record every [`HEARTBEAT`] while the run
//!   goes on, so the guest wrote nothing later than the record's modification time plus
//!   [`RECORD_GRACE`]. A planted path whose change time (`ctime`, which no program can set)
//!   is later than that is left where it is and listed in [`Swept::left`]: the user may have
//!   made it since.

use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use stockade_protocol::PROTECTED_PATHS;

use crate::{Guarded, HostFsError, Swept, WorkspaceError, open_workspace};

/// How often a run's supervisor touches its record ([`Guarded::heartbeat`]): every second.
pub const HEARTBEAT: Duration = Duration::from_secs(1);

/// How long after the record's last touch a killed run's processes may still have written:
/// one missed heartbeat, and the moments the kernel takes to kill a pid namespace whose
/// supervisor died. 3 s.
pub const RECORD_GRACE: Duration = Duration::from_secs(3);

/// The largest record read back: 1 MiB (a record lists protected paths and `.git`'s names).
const MAX_RECORD_BYTES: u64 = 1 << 20;

/// The record's format version.
const VERSION: u32 = 1;

/// What a record holds: enough to sweep again what the run's inspection found absent.
#[derive(Serialize, Deserialize)]
struct Stored {
    version: u32,
    /// The workspace's path when it was opened, as bytes (a path need not be UTF-8).
    workspace: Vec<u8>,
    dev: u64,
    ino: u64,
    /// The protected paths absent at inspection.
    absent: Vec<String>,
    /// `.git`'s top-level names at inspection, if it was a directory then.
    git_before: Option<Vec<Vec<u8>>>,
}

/// A run's record, held open so the supervisor can touch it.
#[derive(Debug)]
pub(crate) struct Record {
    path: PathBuf,
    file: std::fs::File,
}

impl Record {
    pub(crate) fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Stockade's state directory: `$STOCKADE_STATE_DIR`, else `$XDG_STATE_HOME/stockade`, else
/// `$HOME/.local/state/stockade` (the XDG base directory rule); `None` if none is set.
#[must_use]
pub fn state_dir() -> Option<PathBuf> {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("STOCKADE_STATE_DIR")
        .or_else(|| var("XDG_STATE_HOME").map(|d| d.join("stockade")))
        .or_else(|| var("HOME").map(|d| d.join(".local/state/stockade")))
        .filter(|d| d.is_absolute())
}

/// Where sweep records are kept: `sweeps` in [`state_dir`].
#[must_use]
pub fn sweeps_dir() -> Option<PathBuf> {
    state_dir().map(|d| d.join("sweeps"))
}

impl Guarded {
    /// Writes this run's sweep record in `dir` (created, mode 0700, if missing), before the
    /// guest starts; [`Guarded::sweep`] removes it. Fails if the record cannot be written:
    /// without it, a killed supervisor's sweep could never be finished.
    pub fn record_in(&mut self, dir: &Path) -> Result<(), HostFsError> {
        use std::io::Write;
        use std::os::unix::fs::DirBuilderExt;
        let failed = |source: io::Error| HostFsError::Record { path: dir.to_path_buf(), source };
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(failed)?;
        let stored = Stored {
            version: VERSION,
            workspace: self.root.as_os_str().as_bytes().to_vec(),
            dev: self.id.0,
            ino: self.id.1,
            absent: self.absent.iter().map(|s| (*s).to_owned()).collect(),
            git_before: self.git_before.as_ref().map(|names| names.iter().map(|n| n.as_bytes().to_vec()).collect()),
        };
        let bytes = serde_json::to_vec(&stored).map_err(|e| failed(io::Error::other(e)))?;
        static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_nanos();
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("{}-{nanos}-{n}", std::process::id());
        let (tmp, path) = (dir.join(format!(".{name}.tmp")), dir.join(format!("{name}.json")));
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp).map_err(failed)?;
        let written = file.write_all(&bytes).and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(failed(e));
        }
        self.record = Some(Record { path, file });
        Ok(())
    }

    /// Touches the record (its modification time is the last moment the run was known to
    /// live): the supervisor calls this every [`HEARTBEAT`] while its guest runs.
    pub fn heartbeat(&self) {
        if let Some(r) = &self.record {
            let _ = r.file.set_modified(SystemTime::now());
        }
    }

    /// A second descriptor of the record, for a heartbeat kept apart from this value (a
    /// session's, which beats for as long as the session lives): setting its modification
    /// time is [`Guarded::heartbeat`]. `None` before [`Guarded::record_in`].
    #[must_use]
    pub fn heartbeat_file(&self) -> Option<std::fs::File> {
        self.record.as_ref().and_then(|r| r.file.try_clone().ok())
    }
}

/// What [`finish_killed_sweeps`] did with one record.
#[derive(Debug)]
#[non_exhaustive]
pub enum Finished {
    /// The run's sweep was finished: what it removed, what it left as newer than the run
    /// ([`Swept::left`]), and every error.
    Swept {
        /// The workspace.
        workspace: PathBuf,
        /// What the sweep did.
        swept: Swept,
    },
    /// The record no longer describes a workspace that can be swept (it is gone, was
    /// replaced by another directory, or is no longer grantable): nothing was touched, and
    /// the record was removed.
    Stale {
        /// The workspace the record names.
        workspace: PathBuf,
        /// Why.
        why: String,
    },
    /// The record could not be read or parsed: nothing was touched, and it was removed.
    Unreadable {
        /// The record.
        record: PathBuf,
        /// Why.
        why: String,
    },
}

impl std::fmt::Display for Finished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |v: &[String]| if v.is_empty() { "nothing".to_owned() } else { v.join(" ") };
        match self {
            Finished::Swept { workspace, swept } => {
                write!(
                    f,
                    "finished the sweep of a killed run in {}: removed {}",
                    workspace.display(),
                    list(&swept.removed)
                )?;
                if !swept.left.is_empty() {
                    write!(f, "; left {} (changed after the run ended: review them)", swept.left.join(" "))?;
                }
                for e in &swept.errors {
                    write!(f, "; could not remove {e}")?;
                }
                Ok(())
            }
            Finished::Stale { workspace, why } => {
                write!(f, "dropped the sweep record of a killed run in {}: {why}", workspace.display())
            }
            Finished::Unreadable { record, why } => {
                write!(f, "removed an unreadable sweep record {}: {why}", record.display())
            }
        }
    }
}

/// Finishes the sweep of every run recorded in `dir` whose supervisor was killed before it
/// swept: each record whose workspace lock can be taken at once (a record whose workspace is
/// held belongs to a live run, or waits for the next call). Under that lock the workspace is
/// opened again without following a symlink and must be the directory the run had (device
/// and inode); then each path that was absent at inspection is removed as
/// [`Guarded::sweep`] removes it, unless it changed after the run could have written it
/// (the module's rules). A missing `dir` has nothing to finish.
///
/// # Ambient Authority
/// Reads `dir` and opens each recorded workspace from `/`.
#[must_use]
pub fn finish_killed_sweeps(dir: &Path) -> Vec<Finished> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut records: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    records.sort();
    records.into_iter().filter_map(|r| finish_one(&r)).collect()
}

fn finish_one(record: &Path) -> Option<Finished> {
    let unreadable = |why: String| {
        let _ = std::fs::remove_file(record);
        Some(Finished::Unreadable { record: record.to_path_buf(), why })
    };
    let stored = match read(record) {
        Ok(Some(s)) => s,
        // Removed meanwhile: its run swept.
        Ok(None) => return None,
        Err(why) => return unreadable(why),
    };
    if stored.version != VERSION {
        return unreadable(format!("format version {} (this stockade reads {VERSION})", stored.version));
    }
    let workspace = PathBuf::from(std::ffi::OsString::from_vec(stored.workspace.clone()));
    let stale = |why: String| {
        let _ = std::fs::remove_file(record);
        Some(Finished::Stale { workspace: workspace.clone(), why })
    };
    let opened = match open_workspace(&workspace) {
        Ok(w) => w,
        Err(WorkspaceError::Unreachable { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            return stale("the directory is gone".into());
        }
        Err(e) => return stale(e.to_string()),
    };
    // (`open_workspace` takes only the path itself, so it opened `workspace`, not a target.)
    if opened.id() != (stored.dev, stored.ino) {
        return stale("another directory is at that path now".into());
    }
    // Held: a live run (this record's, or a later one that will sweep for itself).
    let lock = opened.try_lock(true).ok()??;
    // Read again under the lock: a run that ended removed its record before letting go.
    let stored = match read(record) {
        Ok(Some(s)) => s,
        Ok(None) => return None,
        Err(why) => return unreadable(why),
    };
    let touched = std::fs::metadata(record).and_then(|m| m.modified()).ok()?;
    let file = std::fs::File::open(record).ok()?;
    let absent = stored.absent.iter().filter_map(|a| PROTECTED_PATHS.iter().copied().find(|p| p == a)).collect();
    let guarded = Guarded {
        root: workspace.clone(),
        dir: opened.dir().try_clone().ok()?,
        id: opened.id(),
        present: Vec::new(),
        absent,
        pinned: Vec::new(),
        git_before: stored.git_before.map(|n| n.into_iter().map(std::ffi::OsString::from_vec).collect()),
        refs_before: None,
        record: Some(Record { path: record.to_path_buf(), file }),
        written_by: Some(touched + RECORD_GRACE),
        sweeping: std::sync::Mutex::new(()),
    };
    let swept = guarded.sweep();
    drop(lock);
    Some(Finished::Swept { workspace, swept })
}

/// The record at `path`, `None` if it is gone, or why it cannot be read.
fn read(path: &Path) -> Result<Option<Stored>, String> {
    use std::io::Read;
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let mut bytes = Vec::new();
    file.take(MAX_RECORD_BYTES + 1).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return Err(format!("over {MAX_RECORD_BYTES} bytes"));
    }
    serde_json::from_slice(&bytes).map(Some).map_err(|e| e.to_string())
}
