//! Pre-built sandboxes ([`crate::ProcessTier::pool`]).
//!
//! A pre-built sandbox is a helper started before its job exists, with everything that does
//! not depend on the job already done: it has joined its per-run cgroup, unshared the user,
//! pid, mount, net, ipc and uts namespaces, forked the run's init, which has built and pivoted
//! into the view; and init has forked the guest process, which has started its session,
//! dropped every capability, set `no_new_privs` and applied landlock and seccomp. The guest
//! process then blocks reading its job pipe. At run time the supervisor sets the cgroup's
//! limits to the job's, writes the job (program, arguments, environment, limits) into the
//! pipe and closes it; the guest applies the job's rlimits, changes directory, closes every
//! descriptor but 0–2 and execs. Stdin, stdout and stderr are pipes made when the sandbox
//! was built; the supervisor keeps its ends, so the job's stdin (or a streamed one) is
//! written, or closed at once, exactly as for a one-shot run.
//!
//! Each sandbox serves exactly one run: the pool hands it out once, and its replacement is
//! built in the background when the run ends, or 20 ms after its job was handed over if the
//! run is still going (so that building it does not compete with a short run's guest for
//! the cores; the replacement builds itself in its own processes). A sandbox left in the
//! pool when the pool is dropped is killed (its helper takes init and the guest with it)
//! and reaped, and its cgroup removed; when the owning process is SIGKILLed, parent-death signals end the sandboxes'
//! processes, their mounts end with their mount namespaces, and their cgroups, named after
//! the owner's pid and start time, are removed by the next run of any supervisor
//! (`reap_stale_cgroups`, `stockade gc`).
//!
//! Which jobs a pool serves: those run with [`crate::ProcessTier::run`] or `run_live`
//! without grants or a loopback, on a tier without a terminal. The sandbox depends on the
//! workspace, so the pool keeps a queue per workspace (none, or a directory and its access),
//! for the [`MAX_KEYS`] most recently used: an agent that runs every command in one project
//! finds its sandboxes ready after its first run. A waiting sandbox's view is judged against
//! the workspace as the run starts, not as it was when the sandbox was built: the run
//! inspects the workspace as a one-shot run does (the directory's identity, the unix sockets
//! to cover, and for read-write the protected paths and pinned directories, G1 and G10), and
//! takes a waiting sandbox only if its view was built from the same inspection; otherwise the
//! sandbox is killed and the run's own is built then. So a pooled run's view is exactly the
//! one a one-shot run started at the same moment would have, and the sweep after a
//! read-write run judges what the guest created against that same inspection.

use std::collections::VecDeque;
use std::fs::File;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

use crate::cgroup::Cgroup;
use crate::launch::{self, Started};
use crate::spec::{Spec, SpecLimits};
use crate::{ProcessTier, RunError};

/// A queue's key: the resolved workspace and whether it is writable, or none.
pub(crate) type Key = Option<(PathBuf, bool)>;

/// What the pool's thread is asked: build for this tier and key.
type Request = (ProcessTier, Key);

/// Most workspaces the pool keeps sandboxes for; the least recently used one's sandboxes go
/// when another is needed.
pub(crate) const MAX_KEYS: usize = 4;

/// A sandbox's view of the host, as inspected when it was built or when a run starts: two
/// equal views build the same sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct View {
    /// The resolved workspace and whether it is writable (the pool's key).
    pub(crate) workspace: Key,
    /// The workspace directory's device and inode: a directory replaced at the same path is
    /// another workspace.
    pub(crate) identity: Option<(u64, u64)>,
    /// The unix sockets and fifos in the workspace, for a pooled run's view only: the helper
    /// covers each one it finds itself, and a sandbox built before one appeared is not taken.
    pub(crate) specials: Vec<PathBuf>,
    pub(crate) pinned: Vec<String>,
    pub(crate) protected: Vec<String>,
    pub(crate) protected_detail: String,
}

impl View {
    /// Inspects the workspace a queue's key names, opened and judged again.
    pub(crate) fn inspect_key(key: &Key) -> Result<(Self, Option<stockade_hostfs::Guarded>), RunError> {
        let opened = match key {
            Some((path, writable)) => Some((stockade_hostfs::open_workspace(path)?, *writable)),
            None => None,
        };
        Self::inspect(opened.as_ref().map(|(ws, rw)| (ws, *rw)), true)
    }

    /// Inspects the workspace (opened and judged by `stockade_hostfs::open_workspace`) as a
    /// run about to start does, returning the view and, for a read-write workspace, the
    /// inspection whose sweep follows the run. The sockets and fifos are listed only for a
    /// view a pool compares (`pooled`): the helper finds and covers them itself, so a
    /// one-shot run does not walk the tree twice.
    pub(crate) fn inspect(
        workspace: Option<(&stockade_hostfs::OpenedWorkspace, bool)>,
        pooled: bool,
    ) -> Result<(Self, Option<stockade_hostfs::Guarded>), RunError> {
        let bad = |e: &dyn std::fmt::Display| RunError::Misconfigured(e.to_string());
        let Some((ws, writable)) = workspace else {
            let view = Self {
                workspace: None,
                identity: None,
                specials: Vec::new(),
                pinned: Vec::new(),
                protected: Vec::new(),
                protected_detail: String::new(),
            };
            return Ok((view, None));
        };
        let clone = || ws.dir().try_clone().map_err(|e| bad(&format!("workspace {}: {e}", ws.path().display())));
        let specials = if pooled {
            stockade_hostfs::specials_in(ws.path(), clone()?, stockade_hostfs::MAX_WALK_ENTRIES).map_err(|e| bad(&e))?
        } else {
            Vec::new()
        };
        let guard = if writable {
            Some(stockade_hostfs::Guarded::inspect_dir(ws.path(), clone()?).map_err(|e| bad(&e))?)
        } else {
            None
        };
        let view = Self {
            identity: Some(ws.id()),
            specials,
            pinned: guard.as_ref().map(|g| g.pinned().iter().map(|p| (*p).to_owned()).collect()).unwrap_or_default(),
            protected: guard.as_ref().map(|g| g.present().to_vec()).unwrap_or_default(),
            protected_detail: guard.as_ref().map(stockade_hostfs::Guarded::describe).unwrap_or_default(),
            workspace: Some((ws.path().to_path_buf(), writable)),
        };
        Ok((view, guard))
    }
}

/// One pre-built sandbox: the helper and its pipes, the write end of its job pipe, and its
/// cgroup. Dropped unused, it is killed and reaped (by [`Started`]), then its cgroup removed.
pub(crate) struct Prebuilt {
    // Field order is drop order: the processes go before their cgroup is removed.
    pub(crate) started: Started,
    view: View,
    pub(crate) job: File,
    pub(crate) cgroup: CgroupGuard,
}

/// A cgroup removed when dropped.
pub(crate) struct CgroupGuard(pub(crate) Option<Cgroup>);

impl CgroupGuard {
    pub(crate) fn get(&self) -> Option<&Cgroup> {
        self.0.as_ref()
    }
}

impl Drop for CgroupGuard {
    fn drop(&mut self) {
        if let Some(cg) = self.0.take() {
            cg.remove();
        }
    }
}

/// The pool: up to `size` sandboxes waiting per workspace. It serves tiers of one
/// configuration only: a builder call on a tier that has a pool gives it a new pool
/// (`ProcessTier::repool`), so every tier that shares this one builds the same sandboxes.
#[derive(Debug)]
pub(crate) struct Pool {
    size: usize,
    state: Mutex<State>,
    /// The pool's own thread, which builds replacements ([`Pool::refill_later`]). Its own,
    /// because a helper's parent-death signal follows the thread that started it: a
    /// sandbox built on a runtime's blocking thread would die when that thread retires, and
    /// one built here dies with the pool.
    refiller: std::sync::OnceLock<std::sync::mpsc::Sender<Request>>,
    this: std::sync::Weak<Pool>,
}

#[derive(Default)]
struct State {
    /// One queue per workspace, most recently used last.
    queues: Vec<Queue>,
    /// The next queue's [`Queue::id`].
    next_id: u64,
}

struct Queue {
    /// This queue's own number, never reused: a refill that started building for a queue
    /// since evicted (and perhaps made again for the same key) finds it gone by this, and
    /// its count of builds is not charged to the new queue.
    id: u64,
    key: Key,
    ready: VecDeque<Prebuilt>,
    /// Sandboxes being built by a refill now.
    building: usize,
}

impl State {
    /// The queue for `key`, made the most recently used (created if needed, evicting the
    /// least recently used beyond [`MAX_KEYS`]); evicted sandboxes are returned to be killed
    /// outside the lock.
    fn queue(&mut self, key: &Key) -> (&mut Queue, Vec<Prebuilt>) {
        let mut evicted = Vec::new();
        match self.queues.iter().position(|q| q.key == *key) {
            Some(i) => {
                let q = self.queues.remove(i);
                self.queues.push(q);
            }
            None => {
                if self.queues.len() >= MAX_KEYS {
                    evicted.extend(self.queues.remove(0).ready);
                }
                let id = self.next_id;
                self.next_id += 1;
                self.queues.push(Queue { id, key: key.clone(), ready: VecDeque::new(), building: 0 });
            }
        }
        let last = self.queues.len() - 1;
        (&mut self.queues[last], evicted)
    }

    /// Counts one more build for `key`'s queue if it has fewer than `size` sandboxes ready or
    /// building, and returns the queue's id; none if the queue is gone or full.
    fn begin_build(&mut self, key: &Key, size: usize) -> Option<u64> {
        let queue = self.queues.iter_mut().find(|q| q.key == *key)?;
        if queue.ready.len() + queue.building >= size {
            return None;
        }
        queue.building += 1;
        Some(queue.id)
    }

    /// Ends a build [`begin_build`](Self::begin_build) counted: the queue it was for, if it
    /// still exists (not evicted since), with the build no longer counted.
    fn end_build(&mut self, id: u64) -> Option<&mut Queue> {
        let queue = self.queues.iter_mut().find(|q| q.id == id)?;
        queue.building -= 1;
        Some(queue)
    }
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ready: Vec<usize> = self.queues.iter().map(|q| q.ready.len()).collect();
        f.debug_struct("State").field("ready", &ready).finish()
    }
}

impl Pool {
    pub(crate) fn new(size: usize) -> std::sync::Arc<Self> {
        std::sync::Arc::new_cyclic(|this| Self {
            size,
            state: Mutex::new(State::default()),
            refiller: std::sync::OnceLock::new(),
            this: this.clone(),
        })
    }

    /// Replaces what a run took for `key`, off the run's path: on the pool's thread, or, for
    /// a supervisor that forks itself (single-threaded, no fork server), inline, since a
    /// thread would end its single-threadedness.
    pub(crate) fn refill_later(&self, tier: &ProcessTier, key: Key) {
        if self.builds_inline(tier) {
            self.refill(tier, &key);
            return;
        }
        let tx = self.refiller.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel::<Request>();
            let pool = self.this.clone();
            // Without a thread, requests go nowhere and every take builds its own sandbox.
            let _thread = std::thread::Builder::new().name("stockade-pool".into()).spawn(move || {
                while let Ok((tier, key)) = rx.recv() {
                    let Some(pool) = pool.upgrade() else { break };
                    pool.refill(&tier, &key);
                }
            });
            tx
        });
        let mut owner = tier.clone();
        // The request must not keep the pool alive.
        owner.pool = None;
        let _ = tx.send((owner, key));
    }

    /// Whether [`refill_later`](Self::refill_later) builds in line, on the caller's thread:
    /// for a supervisor that forks itself (single-threaded, no fork server).
    pub(crate) fn builds_inline(&self, tier: &ProcessTier) -> bool {
        matches!(tier.helper, launch::Mode::Fork(_)) && crate::forkserver::running().is_none()
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// How many sandboxes wait for `key` (a workspace, or none).
    pub(crate) fn ready(&self, key: &Key) -> usize {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.queues.iter().find(|q| q.key == *key).map_or(0, |q| q.ready.len())
    }

    /// A sandbox for one run of `tier` with `view` (inspected as the run starts): a waiting
    /// one built from the same view whose helper is still alive, else one started now (whose
    /// setup error, if the host cannot build it, the run then reports). Waiting sandboxes of
    /// another view (the workspace changed since they were built) are killed.
    pub(crate) fn take(&self, tier: &ProcessTier, view: &View) -> Result<Prebuilt, RunError> {
        let found = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let (queue, mut discard) = state.queue(&view.workspace);
            let mut found = None;
            while let Some(p) = queue.ready.pop_front() {
                if p.view == *view && !p.started.exited() {
                    found = Some(p);
                    break;
                }
                discard.push(p);
            }
            (found, discard)
        };
        // Killed outside the lock.
        let (found, discard) = found;
        drop(discard);
        match found {
            Some(p) => Ok(p),
            None => build(tier, view.clone()),
        }
    }

    /// Puts back a sandbox that [`take`](Self::take) handed out and nobody used.
    pub(crate) fn put_back(&self, p: Prebuilt) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let size = self.size;
        let (queue, evicted) = state.queue(&p.view.workspace);
        if queue.ready.len() < size {
            queue.ready.push_back(p);
        }
        drop(state);
        drop(evicted);
    }

    /// Starts sandboxes for `key` until `size` wait (counting those other refills are
    /// building), each from a fresh inspection of the workspace. A failure stops the refill
    /// silently: the next take starts its own sandbox and reports why it could not.
    pub(crate) fn refill(&self, tier: &ProcessTier, key: &Key) {
        loop {
            let id = {
                let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                let Some(id) = state.begin_build(key, self.size) else { return };
                id
            };
            let built = View::inspect_key(key).and_then(|(view, _)| build(tier, view));
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            // An evicted queue's sandbox is killed (outside the lock), not handed to a queue
            // made since for the same key.
            let Some(queue) = state.end_build(id) else {
                drop(state);
                drop(built);
                return;
            };
            let Ok(p) = built else { return };
            if queue.ready.len() >= self.size {
                drop(state);
                drop(p);
                return;
            }
            queue.ready.push_back(p);
        }
    }
}

/// Starts one pre-built sandbox for `tier`.
fn build(tier: &ProcessTier, view: View) -> Result<Prebuilt, RunError> {
    let internal = |what: &str, e: std::io::Error| RunError::Internal(format!("{what}: {e}"));
    let defaults = stockade_protocol::Limits::default();
    let (memory, processes) = (defaults.memory_bytes(), u64::from(defaults.processes()));
    let cgroup = run_cgroup(tier, memory, processes);
    let (job_r, job_w) = crate::sys::fs::pipe().map_err(|e| internal("job pipe", e))?;
    // Placeholders for the job's part: its own limits arrive with it.
    let limits = SpecLimits {
        cpu_secs: 1,
        memory_bytes: memory,
        processes,
        open_files: 1,
        file_size_bytes: 0,
        tmpfs_bytes: tier.tmpfs_bytes,
    };
    let spec = sandbox_spec(tier, view.clone(), &cgroup, limits);
    let started = launch::launch(&tier.helper, spec, launch::GuestIo::Pipes { stdin: true }, Some(job_r))?;
    Ok(Prebuilt { started, view, job: job_w, cgroup })
}

/// A run's cgroup with these limits (none for a tier without cgroups, or a host without
/// usable controllers), created after the stale cgroups of dead supervisors are reaped, and
/// removed when the guard drops.
pub(crate) fn run_cgroup(tier: &ProcessTier, memory_bytes: u64, processes: u64) -> CgroupGuard {
    CgroupGuard(
        tier.cgroups
            .then(|| {
                let _ = crate::cgroup::reap_stale(tier.cgroup_v2_dir.as_deref());
                Cgroup::create(tier.cgroup_v2_dir.as_deref(), memory_bytes, processes)
            })
            .flatten(),
    )
}

/// The spec of a sandbox with `view` in `cgroup`, with no job, no grants, no terminal and no
/// loopback: a one-shot run fills those in, a pre-built sandbox gets its job later.
pub(crate) fn sandbox_spec(tier: &ProcessTier, view: View, cgroup: &CgroupGuard, limits: SpecLimits) -> Spec {
    Spec {
        program: String::new(),
        args: Vec::new(),
        env: Vec::new(),
        workspace: view.workspace,
        pinned: view.pinned,
        protected: view.protected,
        protected_detail: view.protected_detail,
        workspace_id: view.identity,
        grants_dir: None,
        status_fd: -1,
        supervisor_pid: std::process::id() as i32,
        cgroup_join: cgroup.get().map(Cgroup::join_files).unwrap_or_default(),
        rlimit_memory: cgroup.get().is_none(),
        rlimit_processes: cgroup.get().is_none(),
        limits,
        hard: !tier.best_effort,
        landlock_abi: tier.landlock_abi,
        tty: false,
        model_port: None,
        job_fd: None,
        session: false,
        home: None,
        guest_id: None,
        fail_step: tier.fail_step,
    }
}

#[cfg(test)]
#[allow(clippy::expect_used, reason = "tests fail loudly on broken invariants")]
mod tests {
    use super::*;

    fn key(name: &str) -> Key {
        Some((PathBuf::from(name), true))
    }

    // The soak's process-pool tier found this: eight workers on eight workspaces evict queues
    // while their refills build, and a refill that finished for an evicted key took one off
    // the count of the queue made since for that key, which was 0 (an overflow panic on the
    // pool's thread, which then built nothing more).
    #[test]
    fn a_build_for_an_evicted_queue_is_not_charged_to_its_successor() {
        let mut state = State::default();
        let _ = state.queue(&key("/a"));
        let old = state.begin_build(&key("/a"), 2).expect("room for a build");
        for other in ["/b", "/c", "/d", "/e"] {
            let _ = state.queue(&key(other));
        }
        assert!(state.queues.iter().all(|q| q.key != key("/a")), "/a is evicted");
        let _ = state.queue(&key("/a"));
        assert!(state.end_build(old).is_none(), "the evicted queue is gone, its successor not found by its id");
        let new = state.queues.iter().find(|q| q.key == key("/a")).expect("made again");
        assert_eq!(new.building, 0);
        let id = state.begin_build(&key("/a"), 2).expect("room");
        assert_eq!(state.end_build(id).map(|q| q.building), Some(0));
    }

    #[test]
    fn builds_stop_at_the_size() {
        let mut state = State::default();
        let _ = state.queue(&key("/a"));
        assert!(state.begin_build(&key("/a"), 2).is_some());
        assert!(state.begin_build(&key("/a"), 2).is_some());
        assert!(state.begin_build(&key("/a"), 2).is_none());
        assert!(state.begin_build(&key("/gone"), 2).is_none());
    }
}
