//! A directory watch of the files API ([`Files::watch`](crate::files::Files::watch), envd's `CreateWatcher`): inotify on
//! the host directories the guest's path names, read by whoever owns the [`Watch`] when its
//! descriptor is readable ([`Watch::fd`], [`Watch::process`]).
//!
//! Each directory is opened beneath its served root the way every files call opens one
//! (cap-std, the last component `O_NOFOLLOW | O_DIRECTORY`), and the watch is added on that
//! open directory through `/proc/self/fd/N`, never by a path the guest could swap for a
//! symlink in between. A recursive watch adds each subdirectory as it appears, and reports
//! what a new one already holds as created (so a file made in it before its watch was added
//! is not missed). The files API's own writes (a new file renamed over the name) read as
//! envd's: the name created and written; the temporary file is not reported.
//!
//! Bounds: at most [`MAX_WATCH_DIRS`] directories per watch, and [`MAX_EVENTS`] events
//! waiting to be taken; past that, the watch is over ([`WatchError::Overflow`]) and its
//! owner drops it. The kernel's own queue overflowing (`IN_Q_OVERFLOW`) ends it the same way.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use cap_std::fs::Dir;
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};

use crate::files::{FilesError, Kind};

/// Most directories one watch holds.
pub const MAX_WATCH_DIRS: usize = 1024;

/// Most events waiting to be taken from one watch.
pub const MAX_EVENTS: usize = 4096;

/// What happened to an entry (envd's `EventType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// It was made (or moved in).
    Create,
    /// Its content changed.
    Write,
    /// It was removed.
    Remove,
    /// It was moved away (renamed).
    Rename,
    /// Its attributes changed.
    Chmod,
}

/// One event: the entry's path relative to the watched directory (`sub/file.txt`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    /// The entry, relative to the watched directory.
    pub name: String,
    /// What happened.
    pub kind: EventKind,
}

/// Why a watch ended.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WatchError {
    /// More events came than a client took, or than the kernel queued.
    #[error("the watch fell behind: more than {MAX_EVENTS} events waited to be taken")]
    Overflow,
    /// More directories than a watch holds.
    #[error("the watch holds at most {MAX_WATCH_DIRS} directories")]
    TooManyDirs,
    /// Reading the watch failed.
    #[error("reading the watch: {0}")]
    Io(#[from] io::Error),
}

/// A directory watch ([`Files::watch`](crate::files::Files::watch)).
pub struct Watch {
    fd: OwnedFd,
    // Each watched directory by its watch descriptor: its path relative to the watched one,
    // and the directory itself (to open what appears under it).
    dirs: HashMap<i32, (String, Dir)>,
    recursive: bool,
    queue: VecDeque<WatchEvent>,
    // Cookies of the files API's own temporary files moved away (their move-in is a write).
    own_moves: Vec<u32>,
    failed: Option<WatchError>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch").field("dirs", &self.dirs.len()).field("queued", &self.queue.len()).finish()
    }
}

const MASK: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::MODIFY)
    .union(WatchFlags::ATTRIB)
    .union(WatchFlags::DELETE)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::ONLYDIR);

/// Whether `name` is one of the files API's temporary files (`.NAME.stockade-PID`).
pub(crate) fn is_write_temp(name: &str) -> bool {
    name.starts_with('.')
        && name
            .rsplit_once(".stockade-")
            .is_some_and(|(_, pid)| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

impl Watch {
    /// A watch of `dir` (and, `recursive`, of every directory under it).
    pub(crate) fn new(dir: Dir, recursive: bool, path: &str) -> Result<Self, FilesError> {
        let io_err = |e: io::Error| FilesError::Io { path: path.to_owned(), source: e };
        let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK).map_err(|e| io_err(e.into()))?;
        let mut w =
            Self { fd, dirs: HashMap::new(), recursive, queue: VecDeque::new(), own_moves: Vec::new(), failed: None };
        w.add(dir, String::new(), false).map_err(|e| match e {
            WatchError::Io(e) => io_err(e),
            other => FilesError::Invalid { path: path.to_owned(), why: other.to_string() },
        })?;
        Ok(w)
    }

    /// The inotify descriptor: readable when [`process`](Self::process) has events to read.
    #[must_use]
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Watches `dir` at `rel`; with `report`, what it holds is reported as created. A
    /// recursive watch adds its subdirectories too.
    fn add(&mut self, dir: Dir, rel: String, report: bool) -> Result<(), WatchError> {
        if self.dirs.len() >= MAX_WATCH_DIRS {
            return Err(WatchError::TooManyDirs);
        }
        let wd = inotify::add_watch(&self.fd, format!("/proc/self/fd/{}", dir.as_raw_fd()), MASK)
            .map_err(io::Error::from)?;
        let mut subdirs = Vec::new();
        if self.recursive || report {
            for item in dir.entries()?.flatten() {
                let name = item.file_name().to_string_lossy().into_owned();
                let is_dir = item.file_type().is_ok_and(|t| t.is_dir());
                if report && !is_write_temp(&name) {
                    self.push(join(&rel, &name), EventKind::Create);
                }
                if self.recursive && is_dir {
                    subdirs.push(name);
                }
            }
        }
        for name in subdirs {
            if let Ok(sub) = crate::stage::open_dir_nofollow(&dir, name.as_ref()) {
                self.add(sub, join(&rel, &name), report)?;
            }
        }
        self.dirs.insert(wd, (rel, dir));
        Ok(())
    }

    fn push(&mut self, name: String, kind: EventKind) {
        if self.queue.len() >= MAX_EVENTS {
            self.failed.get_or_insert(WatchError::Overflow);
            return;
        }
        self.queue.push_back(WatchEvent { name, kind });
    }

    /// Reads every event the kernel has queued (never waiting) into the watch's queue.
    /// Blocking in the way every files call is (a new directory is opened and listed):
    /// call it off the async workers.
    pub fn process(&mut self) -> Result<(), WatchError> {
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 16 << 10];
        let mut raw = Vec::new();
        {
            let mut reader = inotify::Reader::new(&self.fd, &mut buf);
            loop {
                match reader.next() {
                    Ok(ev) => raw.push((
                        ev.wd(),
                        ev.events(),
                        ev.cookie(),
                        ev.file_name().map(|n| n.to_string_lossy().into_owned()),
                    )),
                    Err(rustix::io::Errno::AGAIN) => break,
                    Err(e) => return Err(WatchError::Io(e.into())),
                }
            }
        }
        for (wd, flags, cookie, name) in raw {
            self.one(wd, flags, cookie, name);
        }
        match self.failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn one(&mut self, wd: i32, flags: ReadFlags, cookie: u32, name: Option<String>) {
        if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
            self.failed.get_or_insert(WatchError::Overflow);
            return;
        }
        if flags.contains(ReadFlags::IGNORED) {
            self.dirs.remove(&wd);
            return;
        }
        let (Some(name), Some((rel, _))) = (name, self.dirs.get(&wd)) else { return };
        let path = join(rel, &name);
        if is_write_temp(&name) {
            // The files API's own temporary file: only its move over the name is told.
            if flags.contains(ReadFlags::MOVED_FROM) {
                self.own_moves.push(cookie);
                if self.own_moves.len() > 64 {
                    self.own_moves.remove(0);
                }
            }
            return;
        }
        if flags.contains(ReadFlags::MOVED_TO)
            && let Some(i) = self.own_moves.iter().position(|c| *c == cookie)
        {
            self.own_moves.remove(i);
            self.push(path.clone(), EventKind::Create);
            self.push(path, EventKind::Write);
            return;
        }
        let kind = if flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
            EventKind::Create
        } else if flags.contains(ReadFlags::MODIFY) {
            EventKind::Write
        } else if flags.contains(ReadFlags::DELETE) {
            EventKind::Remove
        } else if flags.contains(ReadFlags::MOVED_FROM) {
            EventKind::Rename
        } else if flags.contains(ReadFlags::ATTRIB) {
            EventKind::Chmod
        } else {
            return;
        };
        self.push(path.clone(), kind);
        if kind == EventKind::Create && flags.contains(ReadFlags::ISDIR) && self.recursive {
            let opened = self.dirs.get(&wd).and_then(|(_, d)| crate::stage::open_dir_nofollow(d, name.as_ref()).ok());
            if let Some(sub) = opened
                && let Err(e) = self.add(sub, path, true)
            {
                self.failed.get_or_insert(e);
            }
        }
    }

    /// The events read so far, oldest first, taken.
    pub fn take(&mut self) -> Vec<WatchEvent> {
        self.queue.drain(..).collect()
    }
}

fn join(rel: &str, name: &str) -> String {
    if rel.is_empty() { name.to_owned() } else { format!("{rel}/{name}") }
}

impl crate::files::Files {
    /// Watches the directory at `path` (and, `recursive`, every directory under it) for
    /// changes ([`Watch`]). A path that is not a directory is refused.
    pub fn watch(&self, path: &str, recursive: bool) -> Result<Watch, FilesError> {
        let entry = self.stat(path)?;
        if entry.kind != Kind::Dir {
            return Err(FilesError::Invalid { path: path.to_owned(), why: "not a directory".into() });
        }
        let dir = self.open_dir(path)?;
        Watch::new(dir, recursive, path)
    }
}
