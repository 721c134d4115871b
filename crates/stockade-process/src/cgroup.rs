//! Per-run cgroups for memory and process limits, with out-of-memory detection.
//!
//! stockade uses the memory and pids controllers where this process can create child
//! cgroups: cgroup v1 controllers mounted under `/sys/fs/cgroup/<controller>` (as on the
//! project's machines), or a cgroup v2 directory delegated to us through
//! `STOCKADE_CGROUP_V2_DIR` handed to [`crate::ProcessTier::cgroup_v2_dir`]. Elsewhere the
//! tier falls back to `RLIMIT_AS` and `RLIMIT_NPROC`, and the report says so.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

static NEXT: AtomicU64 = AtomicU64::new(0);

/// One run's cgroup directories.
#[derive(Debug)]
pub(crate) struct Cgroup {
    kind: Kind,
    memory: PathBuf,
    pids: PathBuf,
    /// A session's freezer: the v1 `freezer` cgroup of the same name, or (v2) the same
    /// directory, whose `cgroup.freeze` pauses every process in it.
    freezer: Option<PathBuf>,
    /// The memory and process limits it was created with.
    created: (u64, u64),
    /// The file [`Cgroup::oom_kills`] reads, opened at its first read and read again from
    /// its start each time (a session's every exec reads it twice).
    oom_file: std::sync::OnceLock<Option<fs::File>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    V1,
    V2,
}

/// What the cgroup saw when the run ended.
pub(crate) struct Usage {
    pub(crate) oom_killed: bool,
    pub(crate) peak_bytes: Option<u64>,
}

/// Whether the supervisor that named a cgroup `stockade-PID-START-N` is gone: no process
/// PID, or one that started at another time (the pid was reused). Names of another form are
/// not stockade's, and are never judged stale.
fn owner_gone(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("stockade-") else { return false };
    let parts: Vec<&str> = rest.split('-').collect();
    if parts.is_empty() || !parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())) {
        return false;
    }
    match parts.as_slice() {
        [pid, start, _] => start.parse().is_ok_and(|start| stockade_sys::proc::gone(pid, start)),
        // An earlier release named them `stockade-PID-N`: stale once that pid is gone.
        [pid, _] => stockade_sys::proc::start_time(pid).is_none(),
        _ => false,
    }
}

/// The parent directories where this process creates per-run cgroups: the delegated v2
/// directory, or its own v1 memory and pids cgroups.
fn parents(v2_dir: Option<&Path>) -> Vec<PathBuf> {
    match v2_dir {
        Some(d) => vec![d.to_path_buf()],
        None => ["memory", "pids", "freezer"].iter().filter_map(|c| stockade_sys::cgroup::v1_dir("self", c)).collect(),
    }
}

/// Per-run cgroups whose supervisor is gone (it was SIGKILLed, so it could not remove them).
pub(crate) fn stale(v2_dir: Option<&Path>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for parent in parents(v2_dir) {
        // The name first, and the type from the directory entry: a cgroup directory holds
        // dozens of control files, and a stat of each was most of this scan's cost.
        for e in fs::read_dir(&parent).into_iter().flatten().flatten() {
            if e.file_name().to_str().is_some_and(owner_gone) && e.file_type().is_ok_and(|t| t.is_dir()) {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// Removes the stale per-run cgroups (killing anything left in them first) and returns the
/// ones removed.
pub(crate) fn reap_stale(v2_dir: Option<&Path>) -> Vec<PathBuf> {
    let kind = if v2_dir.is_some() { Kind::V2 } else { Kind::V1 };
    stale(v2_dir)
        .into_iter()
        .filter(|dir| {
            let cg = Cgroup {
                kind,
                memory: dir.clone(),
                pids: dir.clone(),
                freezer: Some(dir.clone()),
                created: (0, 0),
                oom_file: std::sync::OnceLock::new(),
            };
            cg.remove();
            !dir.exists()
        })
        .collect()
}

impl Cgroup {
    /// Creates the run's cgroups with the given limits, or `None` if this host offers no
    /// usable controllers to this process. (The supervisor reaps stale cgroups of dead
    /// supervisors first, so a `kill -9` leaves them behind only until the next run; the
    /// probe does not, so `stockade doctor` can report them.)
    pub(crate) fn create(v2_dir: Option<&Path>, memory_bytes: u64, processes: u64) -> Option<Self> {
        let start = stockade_sys::proc::start_time("self").unwrap_or(0);
        let name = format!("stockade-{}-{start}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        if let Some(base) = v2_dir {
            let dir = base.join(&name);
            fs::create_dir(&dir).ok()?;
            let cg = Self {
                kind: Kind::V2,
                memory: dir.clone(),
                pids: dir,
                freezer: None,
                created: (memory_bytes, processes),
                oom_file: std::sync::OnceLock::new(),
            };
            let ok = fs::write(cg.memory.join("memory.max"), memory_bytes.to_string()).is_ok()
                && fs::write(cg.pids.join("pids.max"), processes.to_string()).is_ok();
            // Swap must not extend the limit; the file exists only with swap accounting.
            let _ = fs::write(cg.memory.join("memory.swap.max"), "0");
            return if ok {
                Some(cg)
            } else {
                cg.remove();
                None
            };
        }
        let memory = stockade_sys::cgroup::v1_dir("self", "memory")?.join(&name);
        let pids = stockade_sys::cgroup::v1_dir("self", "pids")?.join(&name);
        fs::create_dir(&memory).ok()?;
        if fs::create_dir(&pids).is_err() {
            let _ = fs::remove_dir(&memory);
            return None;
        }
        let cg = Self {
            kind: Kind::V1,
            memory,
            pids,
            freezer: None,
            created: (memory_bytes, processes),
            oom_file: std::sync::OnceLock::new(),
        };
        let ok = fs::write(cg.memory.join("memory.limit_in_bytes"), memory_bytes.to_string()).is_ok()
            && fs::write(cg.pids.join("pids.max"), processes.to_string()).is_ok();
        // Swap must not extend the limit; the file exists only with swap accounting.
        let _ = fs::write(cg.memory.join("memory.memsw.limit_in_bytes"), memory_bytes.to_string());
        if ok {
            Some(cg)
        } else {
            cg.remove();
            None
        }
    }

    /// Sets the limits of a cgroup created ahead of its run (a pre-built sandbox's), where they
    /// differ from those it was created with, and on v1 resets the peak usage, so the report's
    /// peak is the run's. The swap limit follows the memory limit; on v1 the kernel requires
    /// memory <= memory+swap at every step, so the order depends on the direction.
    pub(crate) fn set_limits(&self, memory_bytes: u64, processes: u64) -> std::io::Result<()> {
        let memory = memory_bytes.to_string();
        let (created_memory, created_processes) = self.created;
        match self.kind {
            Kind::V2 if memory_bytes != created_memory => fs::write(self.memory.join("memory.max"), &memory)?,
            Kind::V2 => {}
            Kind::V1 => {
                if memory_bytes != created_memory {
                    let limit = self.memory.join("memory.limit_in_bytes");
                    let swap = self.memory.join("memory.memsw.limit_in_bytes");
                    if fs::write(&limit, &memory).is_err() {
                        // Raising: memory+swap first.
                        let _ = fs::write(&swap, &memory);
                        fs::write(&limit, &memory)?;
                    }
                    let _ = fs::write(&swap, &memory);
                }
                let _ = fs::write(self.memory.join("memory.max_usage_in_bytes"), "0");
            }
        }
        if processes == created_processes {
            return Ok(());
        }
        fs::write(self.pids.join("pids.max"), processes.to_string())
    }

    /// The files the helper joins by writing `0` (itself) to each, before it starts anything:
    /// on v1 each hierarchy's `tasks`, on v2 the directory's `cgroup.procs`.
    ///
    /// On v1 the helper moves only its calling thread. The kernel migrates the writer's own thread
    /// under `cgroup_mutex` alone, while a process move (`cgroup.procs`, or any pid but the
    /// writer's) takes the global `cgroup_threadgroup_rwsem` for writing, which waits for an RCU
    /// grace period whenever no such move happened within the last one: about 13 ms on this
    /// project's 2-core VM when quiet (up to 19 ms under load) for a run that comes on its own,
    /// more than the rest of a one-shot run (`docs/benchmarks.md`). A thread's move is the
    /// process's here: the helper is single-threaded (forked from one thread, or just executed),
    /// and a child takes the cgroups of the thread that makes it, so init, the guest and everything
    /// the guest starts descend from the moved thread. v2 refuses a thread's move between domain
    /// cgroups, so there the helper moves its process; `CLONE_INTO_CGROUP` would spare that wait,
    /// and needs a v2 host to be shown on.
    pub(crate) fn join_files(&self) -> Vec<PathBuf> {
        match (self.kind, &self.freezer) {
            (Kind::V1, Some(f)) => vec![self.memory.join("tasks"), self.pids.join("tasks"), f.join("tasks")],
            (Kind::V1, None) => vec![self.memory.join("tasks"), self.pids.join("tasks")],
            (Kind::V2, _) => vec![self.memory.join("cgroup.procs")],
        }
    }

    /// Adds a freezer (a session's, for pause and resume): the v1 `freezer` cgroup of the
    /// same name, or the v2 directory's own `cgroup.freeze`. Before the helper joins.
    pub(crate) fn add_freezer(&mut self) -> std::io::Result<()> {
        let dir = match self.kind {
            Kind::V2 => self.memory.clone(),
            Kind::V1 => {
                let name = self.memory.file_name().ok_or_else(|| std::io::Error::other("a cgroup without a name"))?;
                let parent = stockade_sys::cgroup::v1_dir("self", "freezer")
                    .ok_or_else(|| std::io::Error::other("no v1 freezer hierarchy for this process"))?;
                let dir = parent.join(name);
                fs::create_dir(&dir)?;
                dir
            }
        };
        self.freezer = Some(dir);
        Ok(())
    }

    /// Freezes (`true`) or thaws every process of the cgroup, and waits until the kernel says
    /// it is done (v1 `freezer.state` reads `FROZEN` or `THAWED`; v2 `cgroup.events` says
    /// `frozen 1` or `frozen 0`), at most 5 s.
    pub(crate) fn freeze(&self, frozen: bool) -> std::io::Result<()> {
        let dir = self.freezer.as_ref().ok_or_else(|| std::io::Error::other("this cgroup has no freezer"))?;
        let done = || -> std::io::Result<bool> {
            Ok(match self.kind {
                Kind::V1 => {
                    fs::read_to_string(dir.join("freezer.state"))?.trim() == if frozen { "FROZEN" } else { "THAWED" }
                }
                Kind::V2 => fs::read_to_string(dir.join("cgroup.events"))?
                    .lines()
                    .any(|l| l == if frozen { "frozen 1" } else { "frozen 0" }),
            })
        };
        match self.kind {
            Kind::V1 => fs::write(dir.join("freezer.state"), if frozen { "FROZEN" } else { "THAWED" })?,
            Kind::V2 => fs::write(dir.join("cgroup.freeze"), if frozen { "1" } else { "0" })?,
        }
        for _ in 0..500 {
            if done()? {
                return Ok(());
            }
            // v1 reads `FREEZING` while a task is not yet frozen: asking again retries it.
            if self.kind == Kind::V1 && frozen {
                let _ = fs::write(dir.join("freezer.state"), "FROZEN");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the freezer did not settle within 5 s"))
    }

    /// Whether it has a freezer ([`Cgroup::add_freezer`]).
    pub(crate) fn has_freezer(&self) -> bool {
        self.freezer.is_some()
    }

    /// Thaws the freezer, if any (a frozen process cannot die: kills and removal come after).
    pub(crate) fn thaw(&self) {
        if let Some(dir) = &self.freezer {
            let _ = fs::write(dir.join("freezer.state"), "THAWED");
            let _ = fs::write(dir.join("cgroup.freeze"), "0");
        }
    }

    /// A description for the report.
    pub(crate) fn detail(&self, memory_bytes: u64, processes: u64) -> String {
        let v = if self.kind == Kind::V1 { "v1" } else { "v2" };
        format!("cgroup {v}: memory {memory_bytes} bytes (no swap), pids {processes}")
    }

    /// Kills every process left in the cgroup (v2 `cgroup.kill`; v1 by pid list), thawing
    /// a frozen one so that the kills land.
    pub(crate) fn kill_all(&self) {
        self.thaw();
        match self.kind {
            Kind::V2 => {
                let _ = fs::write(self.pids.join("cgroup.kill"), "1");
            }
            Kind::V1 => {
                // cgroup v1 has no cgroup.kill: each pid listed is signalled. A pid read here
                // may be reused by an unrelated process before the signal, so it is opened
                // as a pidfd first (which names that one process for good), checked to be
                // in this cgroup while the pidfd holds it, and signalled through the pidfd.
                let Some(name) = self.pids.file_name().map(|n| n.to_string_lossy().into_owned()) else { return };
                if let Ok(list) = fs::read_to_string(self.pids.join("cgroup.procs")) {
                    for pid in list.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                        let Ok(fd) = crate::sys::process::pidfd_open(pid) else { continue };
                        if in_pids_cgroup(pid, &name) {
                            let _ = crate::sys::process::pidfd_kill(std::os::fd::AsFd::as_fd(&fd), libc::SIGKILL);
                        }
                    }
                }
            }
        }
    }

    /// Reads the out-of-memory count and the peak usage.
    pub(crate) fn usage(&self) -> Usage {
        let read = |p: PathBuf| fs::read_to_string(p).unwrap_or_default();
        let peak = match self.kind {
            Kind::V1 => "memory.max_usage_in_bytes",
            Kind::V2 => "memory.peak",
        };
        Usage { oom_killed: self.oom_kills() > 0, peak_bytes: read(self.memory.join(peak)).trim().parse().ok() }
    }

    /// Its usage files, to read on another thread ([`Meter::read`]).
    pub(crate) fn meter(&self) -> Meter {
        Meter { kind: self.kind, memory: self.memory.clone() }
    }
}

/// A cgroup's usage files, read by [`Meter::read`].
#[derive(Debug, Clone)]
pub(crate) struct Meter {
    kind: Kind,
    memory: PathBuf,
}

impl Meter {
    /// Memory in use now, and the page cache within it (bytes; 0 where unreadable), and on
    /// cgroup v2 the CPU time of every process it has held (`cpu.stat`'s `usage_usec`, ns).
    pub(crate) fn read(&self) -> (u64, u64, Option<u64>) {
        let read = |f: &str| fs::read_to_string(self.memory.join(f)).unwrap_or_default();
        let (current, cache_key) = match self.kind {
            Kind::V1 => ("memory.usage_in_bytes", "cache"),
            Kind::V2 => ("memory.current", "file"),
        };
        let used = read(current).trim().parse().unwrap_or(0);
        let stat = read("memory.stat");
        let key = |text: &str, k: &str| {
            text.lines().find_map(|l| l.strip_prefix(k)?.strip_prefix(' ')?.trim().parse::<u64>().ok())
        };
        let cache = key(&stat, cache_key).unwrap_or(0);
        let cpu = match self.kind {
            Kind::V1 => None,
            Kind::V2 => key(&read("cpu.stat"), "usage_usec").map(|us| us.saturating_mul(1000)),
        };
        (used, cache, cpu)
    }
}

impl Cgroup {
    /// How many processes the kernel's out-of-memory killer took in this cgroup so far (a
    /// session's exec compares the count before and after).
    pub(crate) fn oom_kills(&self) -> u64 {
        let file = match self.kind {
            Kind::V1 => "memory.oom_control",
            Kind::V2 => "memory.events",
        };
        let Some(f) = self.oom_file.get_or_init(|| fs::File::open(self.memory.join(file)).ok()) else { return 0 };
        // Both files are a few short lines; a read at offset 0 makes the kernel write them anew.
        let mut buf = [0u8; 1024];
        let n = std::os::unix::fs::FileExt::read_at(f, &mut buf, 0).unwrap_or(0);
        stockade_sys::cgroup::oom_kills(&String::from_utf8_lossy(&buf[..n])).unwrap_or(0)
    }

    /// Removes the cgroups, retrying while the last processes finish exiting.
    pub(crate) fn remove(&self) {
        self.thaw();
        for _ in 0..50 {
            let a = !self.memory.exists() || fs::remove_dir(&self.memory).is_ok();
            let b = self.pids == self.memory || !self.pids.exists() || fs::remove_dir(&self.pids).is_ok();
            let c = match &self.freezer {
                Some(f) if *f != self.memory => !f.exists() || fs::remove_dir(f).is_ok(),
                _ => true,
            };
            if a && b && c {
                return;
            }
            self.kill_all();
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Whether process `pid` is in the v1 pids cgroup whose directory is named `name` (per-run
/// cgroup names are unique: the supervisor's pid, start time and a counter).
fn in_pids_cgroup(pid: i32, name: &str) -> bool {
    stockade_sys::cgroup::path_of(&pid.to_string(), Some("pids")).is_some_and(|p| p.rsplit('/').next() == Some(name))
}
