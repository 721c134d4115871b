//! The helper: a single-threaded process that builds the sandbox and execs the guest. It is
//! a fresh exec of a helper binary, or a fork of a single-threaded supervisor (`launch`).
//!
//! Process tree of one run (host pid namespace on the left):
//!
//! ```text
//! supervisor ── helper ── init (pid 1 of the run) ── guest (pid 2) ── ...
//!               unshares user, mount, pid, net,      builds the view, enters landlock,
//!               ipc, uts; waits for init              installs seccomp, spawns the guest
//!                                                     (`start_guest`), reaps, reports
//! ```
//!
//! The helper dies with the supervisor (parent-death SIGKILL), init dies with the helper
//! (parent-death SIGKILL plus a keep-alive pipe checked after the signal is armed), and when
//! init dies the kernel kills every process left in the run's pid namespace, including any
//! `setsid` daemon. Killing the helper is therefore enough to end the whole tree.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::{Path, PathBuf};

use stockade_protocol::Mechanism;

use crate::confine;
use crate::spec::{Msg, PooledJob, SPEC_VAR, Spec, SpecLimits};
use crate::sys::{caps, fs as sysfs, mount, process};

/// The uid the guest runs as when stockade itself runs as root: `nobody`.
pub const NOBODY: u32 = 65534;

/// Every process of a run has this `oom_score_adj`, the kernel's maximum: under memory
/// pressure the out-of-memory killer picks among them first, so the guest dies and the
/// supervisor, its other runs and the rest of the host go on.
const OOM_SCORE_ADJ: i32 = 1000;

/// Runs the helper if this process was started as one, and never returns in that case.
/// Otherwise returns at once. Binaries that use [`crate::Helper::current_exe`] call this
/// first thing in `main`.
pub fn helper_main() {
    let Some(spec) = std::env::var_os(SPEC_VAR) else { return };
    let code = match serde_json::from_slice::<Spec>(spec.as_encoded_bytes()) {
        Ok(spec) => run(spec),
        Err(e) => {
            let _ = writeln!(io::stderr(), "stockade helper: bad spec: {e}");
            125
        }
    };
    process::exit_now(code);
}

/// Writes report lines on a status pipe. Each write is one or more whole lines, at most
/// `PIPE_BUF` bytes: atomic on a pipe, so lines from the processes that share it (init, and
/// the exec's guest) never interleave.
pub(crate) struct Reporter {
    file: File,
    /// Lines not yet written, while a guest confines itself: its enforcement lines go to the
    /// supervisor in one write just before the exec (or with the error that stops it), not
    /// one write (and one wake-up of the supervisor's reader) each.
    held: Option<Vec<u8>>,
}

impl Reporter {
    pub(crate) fn new(file: File) -> Self {
        Self { file, held: None }
    }

    /// Holds every line from now on until [`flush`](Self::flush). Called where no fork
    /// comes before the flush (lines held across a fork would be written by both
    /// processes): in init around the spawn of a guest, whose child writes no line.
    pub(crate) fn hold(&mut self) {
        self.held.get_or_insert_with(Vec::new);
    }

    /// Writes the held lines, in writes of whole lines of at most `PIPE_BUF` bytes each, and
    /// holds no more.
    pub(crate) fn flush(&mut self) {
        let Some(held) = self.held.take() else { return };
        let (mut start, mut end) = (0, 0);
        for line in held.split_inclusive(|b| *b == b'\n') {
            if end > start && end - start + line.len() > libc::PIPE_BUF {
                let _ = self.file.write_all(&held[start..end]);
                start = end;
            }
            end += line.len();
        }
        let _ = self.file.write_all(&held[start..end]);
    }

    pub(crate) fn send(&mut self, msg: &Msg) {
        if let Ok(mut line) = serde_json::to_vec(msg) {
            line.push(b'\n');
            match self.held.as_mut() {
                Some(held) => held.extend_from_slice(&line),
                // One write of a short line: atomic on a pipe (PIPE_BUF).
                None => {
                    let _ = self.file.write_all(&line);
                }
            }
        }
    }

    fn enforced(&mut self, mechanism: Mechanism, detail: impl Into<String>) {
        self.send(&Msg::Enforced { mechanism, detail: detail.into() });
    }

    pub(crate) fn fail(&mut self, stage: &str, unsupported: bool, message: impl std::fmt::Display) -> i32 {
        self.send(&Msg::Error { stage: stage.into(), unsupported, message: message.to_string() });
        self.flush();
        126
    }

    pub(crate) fn into_file(self) -> File {
        self.file
    }
}

/// The helper proper: runs in a freshly exec'd helper binary, or in a single-threaded fork
/// of the supervisor (see `launch`). Returns the exit code for the helper process.
pub(crate) fn run(spec: Spec) -> i32 {
    let Ok(status) = sysfs::adopt(spec.status_fd) else { return 125 };
    let _ = sysfs::set_cloexec(spec.status_fd);
    let mut rep = Reporter::new(status);
    match prepare(&spec, &mut rep) {
        Ok(ready) => start_init(&spec, &mut rep, ready),
        Err(code) => code,
    }
}

/// What the helper holds once it is in the run's namespaces, for init.
struct InNamespaces {
    /// The guest's ids inside.
    ids: (u32, u32),
    /// A root supervisor's id-mapped workspace and session home.
    trees: Trees,
    /// The model grant's listener, held here for the supervisor to take.
    listener: Option<std::net::TcpListener>,
}

/// The helper's phases before init: the OOM score and the cgroups, the workspace opened and
/// root dropped, then the namespaces, each reported as enforced. `Err` is the exit code of a
/// failed phase (already reported).
fn prepare(spec: &Spec, rep: &mut Reporter) -> Result<InNamespaces, i32> {
    join_limits(spec, rep)?;
    let (uid, gid) = process::ids();
    // The host id a root supervisor's guest runs as: a session's own, or `nobody`.
    let host_id = spec.guest_id.unwrap_or(NOBODY);
    // As root, the workspace is opened now, before the drop to `nobody`, and id-mapped so
    // that the invoking user's files are the guest's own (see `idmapped_workspace`).
    let ws_tree = match (&spec.workspace, uid) {
        (Some((host, writable)), 0) => match idmapped_workspace(host, *writable, host_id) {
            Ok(tree) => Some(tree),
            Err((unsupported, e)) => return Err(rep.fail("workspace", unsupported, e)),
        },
        _ => None,
    };
    // A session's home, the same way: the guest owns what root owns there.
    let home_tree = match (&spec.home, uid) {
        (Some(host), 0) => match idmapped_workspace(host, true, host_id) {
            Ok(tree) => Some(tree),
            Err((unsupported, e)) => return Err(rep.fail("home", unsupported, e)),
        },
        _ => None,
    };
    let dropped_root = uid == 0;
    // Host ids, then the ids inside: a root supervisor's guest is `nobody` inside whatever
    // host id it has; another's keeps its own.
    let (outside, inside) = if dropped_root {
        if let Err(e) = process::become_user(host_id, host_id).and_then(|()| caps::set_dumpable()) {
            return Err(rep.fail("credentials", false, format!("dropping root to {host_id}: {e}")));
        }
        ((host_id, host_id), (NOBODY, NOBODY))
    } else {
        ((uid, gid), (uid, gid))
    };
    if caps::set_parent_death_kill().is_err() || process::parent_pid() != spec.supervisor_pid {
        return Err(125);
    }
    if let Err(e) = process::setsid() {
        return Err(rep.fail("setsid", false, e));
    }
    enter_namespaces(rep, outside, inside, dropped_root)?;
    let listener = listen_for_model(spec, rep)?;
    Ok(InNamespaces { ids: inside, trees: Trees { workspace: ws_tree, home: home_tree }, listener })
}

/// The OOM score and the run's cgroups, first, so that init and the guest inherit them.
fn join_limits(spec: &Spec, rep: &mut Reporter) -> Result<(), i32> {
    // G16: a host short of memory loses this run's processes before the supervisor or any
    // other process. Raising one's own score needs no privilege; it fails only where `/proc`
    // is missing or read-only.
    match fs::write("/proc/self/oom_score_adj", OOM_SCORE_ADJ.to_string()) {
        Ok(()) => rep.enforced(
            Mechanism::OomScore,
            format!("oom_score_adj {OOM_SCORE_ADJ}: the kernel's first out-of-memory victims, before any host process"),
        ),
        Err(e) if spec.hard => {
            let unsupported = matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::ReadOnlyFilesystem);
            return Err(rep.fail("oom_score_adj", unsupported, format!("writing /proc/self/oom_score_adj: {e}")));
        }
        Err(e) => rep.send(&Msg::Missing { mechanism: "oom_score_adj".into(), reason: e.to_string() }),
    }
    // `0` is the writer itself: on v1 its one thread, without the kernel's global lock
    // (see `Cgroup::join_files`).
    for file in &spec.cgroup_join {
        if let Err(e) = fs::write(file, "0") {
            return Err(rep.fail("cgroup", false, format!("joining {}: {e}", file.display())));
        }
    }
    Ok(())
}

/// A user namespace mapping only `ids`, with fresh mount, pid, net, ipc and uts namespaces.
fn enter_namespaces(
    rep: &mut Reporter,
    (uid, gid): (u32, u32),
    (in_uid, in_gid): (u32, u32),
    dropped_root: bool,
) -> Result<(), i32> {
    let flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWNET
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS;
    if let Err(e) = mount::unshare(flags) {
        return Err(rep.fail("namespaces", true, format!("unshare(user, mount, pid, net, ipc, uts): {e}")));
    }
    let maps = fs::write("/proc/self/setgroups", "deny")
        .and_then(|()| fs::write("/proc/self/uid_map", format!("{in_uid} {uid} 1")))
        .and_then(|()| fs::write("/proc/self/gid_map", format!("{in_gid} {gid} 1")));
    if let Err(e) = maps {
        return Err(rep.fail("namespaces", true, format!("writing the user namespace id maps: {e}")));
    }
    // A root supervisor's helper runs as host uid 65534 (or a session's own) from here, which other processes of
    // the host may share, while it holds the model grant's listener and (forked) a copy of
    // the supervisor's memory: not dumpable, its memory and descriptors are for root alone
    // (the supervisor takes the listener with CAP_SYS_PTRACE). It had to be dumpable until
    // now, to write its own maps.
    if dropped_root && let Err(e) = caps::set_not_dumpable() {
        return Err(rep.fail("credentials", false, format!("PR_SET_DUMPABLE 0: {e}")));
    }
    let host = if (in_uid, in_gid) == (uid, gid) { String::new() } else { format!(" (host uid {uid}, gid {gid})") };
    rep.enforced(Mechanism::UserNamespace, format!("guest runs as uid {in_uid}, gid {in_gid}{host} (not host root)"));
    Ok(())
}

/// The model grant's listener: created here, in the run's network namespace, and held by
/// this process (never by init or the guest) for the supervisor to take. Reports the
/// namespaces as enforced, the network one with what it holds.
fn listen_for_model(spec: &Spec, rep: &mut Reporter) -> Result<Option<std::net::TcpListener>, i32> {
    let (listener, net) = match spec.model_port {
        Some(port) => match model_listener(port) {
            Ok(l) => {
                rep.send(&Msg::Listening { fd: l.as_raw_fd() });
                let net =
                    format!("empty network namespace; loopback up for the model grant's listener on 127.0.0.1:{port}");
                (Some(l), net)
            }
            Err(e) => return Err(rep.fail("model listener", false, e)),
        },
        // A session's execs start servers and query them: its loopback is up, its
        // namespace's only interface.
        None if spec.session => match crate::sys::net::loopback_up() {
            Ok(()) => (None, "empty network namespace; loopback up for the session's own servers".into()),
            Err(e) => return Err(rep.fail("loopback", false, format!("bringing up the session's loopback: {e}"))),
        },
        None => (None, "empty network namespace (loopback down)".into()),
    };
    for (m, d) in [
        (Mechanism::PidNamespace, "fresh pid namespace; pid 1 is stockade's init".into()),
        (Mechanism::NetNamespace, net),
        (Mechanism::IpcNamespace, "private System V IPC and POSIX queues".into()),
        (Mechanism::UtsNamespace, "hostname `stockade`".into()),
    ] {
        rep.enforced(m, d);
    }
    Ok(listener)
}

/// Forks init (pid 1 of the run's pid namespace), lets go of the guest's stdio, and waits
/// for it: its exit code is the helper's.
fn start_init(spec: &Spec, rep: &mut Reporter, ready: InNamespaces) -> i32 {
    let InNamespaces { ids, trees, listener } = ready;
    let Ok((keep_r, keep_w)) = sysfs::pipe() else { return rep.fail("init", false, "pipe") };
    match process::fork() {
        Err(e) => rep.fail("init", false, format!("fork: {e}")),
        Ok(process::Fork::Child) => {
            drop(keep_w);
            drop(listener);
            let code = init(spec, rep, &keep_r, ids, trees);
            process::exit_now(code)
        }
        Ok(process::Fork::Parent(pid)) => {
            drop(keep_r);
            drop(trees);
            release_stdio(spec);
            let code = match process::wait(pid) {
                Ok(e) => {
                    rep.send(&Msg::Ended);
                    e.code.unwrap_or(128 + e.signal.unwrap_or(0))
                }
                Err(_) => 125,
            };
            drop(keep_w);
            drop(listener);
            code
        }
    }
}

/// Lets go of the guest's stdin, stdout and stderr, which this process (the helper, or init)
/// holds as descriptors 0–2 only to hand them down: `/dev/null` takes their place. Then the
/// guest's side is the only one left, so the supervisor reads the end of the guest's output
/// as soon as the guest and what it started close it (not when the helper exits, which a
/// pooled run's report no longer waits for), and a stdin writer meets `EPIPE` as soon as
/// they stop reading. A terminal is left as it is: it is not pooled, and the supervisor reads
/// its master until the last slave closes. If `/dev/null` cannot be opened, nothing changes
/// but that timing.
pub(crate) fn release_stdio(spec: &Spec) {
    if spec.tty {
        return;
    }
    let Ok(null) = fs::OpenOptions::new().read(true).write(true).open("/dev/null") else { return };
    for fd in 0..=2 {
        let _ = sysfs::dup_onto(null.as_raw_fd(), fd);
    }
}

/// Brings the run's loopback up and listens on `127.0.0.1:port` in it.
fn model_listener(port: u16) -> Result<std::net::TcpListener, String> {
    crate::sys::net::loopback_up().map_err(|e| format!("bringing up the run's loopback: {e}"))?;
    std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port))
        .map_err(|e| format!("listening on 127.0.0.1:{port} in the run's network namespace: {e}"))
}

/// The workspace of a root supervisor, as a detached mount: opened while still root (so a
/// 0700 directory, or one under `/root`, is reachable), then id-mapped through a user
/// namespace whose map reads `0 GUEST 1` (`GUEST` the guest's host id, 65534 or a
/// session's own): an idmapped mount treats on-disk ids as ids of that namespace and maps
/// them down, so files of host uid and gid 0 (the invoking user) appear as the guest's, and
/// the guest's writes land as 0 on disk. The guest still runs as its host id; only this mount translates, so
/// the guest owns what root owns there, and what it creates belongs to root on the host.
/// Nosuid and nodev, read-only unless granted read-write. Errors carry whether the kernel or
/// filesystem lacks the mechanism (`true`) or the path itself is the problem (`false`).
fn idmapped_workspace(host: &Path, writable: bool, guest: u32) -> Result<OwnedFd, (bool, String)> {
    let tree = mount::open_tree_clone(host).map_err(|e| (false, format!("workspace {}: {e}", host.display())))?;
    let userns = idmap_userns(0, guest).map_err(|e| {
        (true, format!("creating the user namespace that id-maps the workspace {}: {e}", host.display()))
    })?;
    mount::set_idmapped(tree.as_fd(), userns.as_fd(), writable).map_err(|e| {
        let fs = if e.raw_os_error() == Some(libc::EINVAL) { " (the filesystem does not support it)" } else { "" };
        (true, format!("id-mapping the workspace {} (mount_setattr MOUNT_ATTR_IDMAP){fs}: {e}", host.display()))
    })?;
    Ok(tree)
}

/// A user namespace whose only mapping is its `inside` → host `outside` (uid and gid), held by
/// the returned descriptor: a child unshares it, this process writes the maps (it holds
/// CAP_SETUID and CAP_SETGID on the host), opens `/proc/CHILD/ns/user`, and lets the child go.
fn idmap_userns(inside: u32, outside: u32) -> io::Result<File> {
    let (ready_r, ready_w) = sysfs::pipe()?;
    let (hold_r, hold_w) = sysfs::pipe()?;
    match process::fork()? {
        process::Fork::Child => {
            drop((ready_r, hold_w));
            let ok = mount::unshare(libc::CLONE_NEWUSER).is_ok();
            let _ = (&ready_w).write_all(&[u8::from(ok)]);
            let _ = (&hold_r).read(&mut [0u8; 1]);
            process::exit_now(0)
        }
        process::Fork::Parent(pid) => {
            drop((ready_w, hold_r));
            let mut ok = [0u8; 1];
            let result = (&ready_r).read_exact(&mut ok).and_then(|()| {
                if ok[0] != 1 {
                    return Err(io::Error::other("unshare(CLONE_NEWUSER) failed in the child"));
                }
                fs::write(format!("/proc/{pid}/uid_map"), format!("{inside} {outside} 1"))?;
                fs::write(format!("/proc/{pid}/gid_map"), format!("{inside} {outside} 1"))?;
                File::open(format!("/proc/{pid}/ns/user"))
            });
            drop(hold_w);
            let _ = process::wait(pid);
            result
        }
    }
}

/// A root supervisor's id-mapped trees, attached in the view by init.
#[derive(Default)]
pub(crate) struct Trees {
    workspace: Option<OwnedFd>,
    home: Option<OwnedFd>,
}

/// Pid 1 of the run: builds the view, starts the guest (or, in a session, one guest per exec
/// request), reaps everything, reports the exit.
fn init(spec: &Spec, rep: &mut Reporter, keep: &File, (uid, gid): (u32, u32), trees: Trees) -> i32 {
    if caps::set_parent_death_kill().is_err() || sysfs::peer_closed(keep.as_raw_fd()) {
        return 125;
    }
    // Pid 1 is visible to the guest. Not dumpable, its memory and environment (a copy of the
    // supervisor's when the helper was forked) stay unreadable even without landlock's
    // ptrace scoping; the guest's exec makes the guest itself dumpable again.
    if let Err(e) = caps::set_not_dumpable() {
        return rep.fail("init", false, format!("PR_SET_DUMPABLE 0: {e}"));
    }
    let covered = match build_view(spec, uid, gid, trees) {
        Ok(covered) => covered,
        Err(ViewError::Path(e)) => return rep.fail("workspace", false, e),
        Err(ViewError::Mechanism(e)) => return rep.fail("mount", true, e),
    };
    let mut protected =
        if spec.protected_detail.is_empty() { String::new() } else { format!("; {}", spec.protected_detail) };
    if !covered.is_empty() {
        // Bounded, so the line stays under the report's line cap however many there are.
        let shown: Vec<String> = covered.iter().take(8).map(|p| p.to_string_lossy().into_owned()).collect();
        let more = if covered.len() > shown.len() {
            format!(" and {} more", covered.len() - shown.len())
        } else {
            String::new()
        };
        protected.push_str(&format!("; unix sockets and fifos covered: {}{more}", shown.join(" ")));
    }
    rep.enforced(Mechanism::MountNamespace, format!("{}{protected}", view_detail(spec)));
    let _ = mount::set_hostname("stockade");
    if spec.session {
        let Some(fd) = spec.job_fd else { return rep.fail("session", false, "no session socket") };
        return crate::session_init::serve(spec, rep, fd);
    }
    run_guest(spec, rep)
}

/// The rest of a run's init: the guest's confinement built once and entered by init
/// ([`Prepared`]), a pre-built sandbox's job taken, the guest started the one way every guest
/// starts ([`start_guest`], as a session's exec is), the guest's stdio let go, and everything
/// reaped until the guest exits, whose exit is reported.
fn run_guest(spec: &Spec, rep: &mut Reporter) -> i32 {
    let mut pre = match Prepared::build(spec) {
        Ok(p) => p,
        Err((stage, e)) => return rep.fail(stage, true, e),
    };
    let pooled;
    let job = match spec.job_fd {
        None => JobRef {
            program: &spec.program,
            args: &spec.args,
            env: &spec.env,
            limits: spec.limits,
            cwd: None,
            tty: spec.tty,
        },
        Some(fd) => match read_pooled_job(fd) {
            Ok(Some(job)) => {
                pooled = job;
                JobRef {
                    program: &pooled.program,
                    args: &pooled.args,
                    env: &pooled.env,
                    limits: pooled.limits,
                    cwd: None,
                    tty: false,
                }
            }
            // The pool let this sandbox go unused: nothing to report.
            Ok(None) => return 0,
            Err(e) => return rep.fail("job", false, format!("reading the job in a pre-built sandbox: {e}")),
        },
    };
    // The guest's descriptors 0–2 are init's own; the plan takes copies above 2 (close on
    // exec), which the guest moves back onto 0–2. Init's own 0–2 become `/dev/null` before
    // the guest exists, so while it runs they never name its pipes (G5), and init's copies
    // go as soon as the spawn returns, which is once the guest has exec'd.
    let stdio = match [0, 1, 2].map(|fd| sysfs::dup_at_least(fd, 3).and_then(sysfs::adopt)) {
        [Ok(i), Ok(o), Ok(e)] => [i, o, e],
        _ => return rep.fail("guest", false, "copying the guest's descriptors"),
    };
    release_stdio(spec);
    let fds = [stdio[0].as_raw_fd(), stdio[1].as_raw_fd(), stdio[2].as_raw_fd()];
    let Some(guest) = start_guest(spec, &mut pre, &job, fds, rep, false) else { return 126 };
    drop(stdio);
    loop {
        match process::wait(-1) {
            Ok(e) if e.pid == guest => {
                let (cpu_us, max_rss) = process::children_usage();
                rep.send(&Msg::Exit { code: e.code, signal: e.signal, cpu_us, max_rss });
                return e.code.unwrap_or(0);
            }
            Ok(_) => {}
            Err(_) => return 125,
        }
    }
}

fn view_detail(spec: &Spec) -> String {
    let ws = match &spec.workspace {
        Some((_, true)) => ", /workspace read-write",
        Some((_, false)) => ", /workspace read-only",
        None => "",
    };
    let tty = if spec.tty { ", /dev/tty and /dev/pts/N: a private pty, the guest's controlling terminal" } else { "" };
    let grants = if spec.grants_dir.is_some() { ", /run/stockade (grants) read-only" } else { "" };
    let home = if spec.home.is_some() { ", /home/user the session's home, read-write" } else { "" };
    format!(
        "tmpfs root (read-only); system dirs bound read-only, nosuid; fresh /proc; minimal /dev{tty}; /tmp and /dev/shm private tmpfs of {} bytes{ws}{home}{grants}; nothing else of the host",
        spec.limits.tmpfs_bytes
    )
}

/// Paths inside a read-write workspace that stay read-only (the list all tiers share):
/// changing them would plant code the host runs later.
pub const PROTECTED: &[&str] = stockade_protocol::PROTECTED_PATHS;

const RO: libc::c_ulong = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;

fn ctx<T>(r: io::Result<T>, what: impl FnOnce() -> String) -> Result<T, String> {
    r.map_err(|e| format!("{}: {e}", what()))
}

/// Why the view could not be built: a granted path is unusable (its owner can fix it), or
/// a mount the kernel refused (the host cannot build the sandbox).
enum ViewError {
    Path(String),
    Mechanism(String),
}

impl From<String> for ViewError {
    fn from(e: String) -> Self {
        ViewError::Mechanism(e)
    }
}

/// Builds the guest's filesystem view and pivots into it (bubblewrap's sequence). `ws_tree`
/// is the id-mapped workspace of a root supervisor; without it the workspace is bound here,
/// with the rights of the (non-root) user. Returns the unix sockets and fifos it covered in
/// the workspace.
fn build_view(spec: &Spec, uid: u32, gid: u32, trees: Trees) -> Result<Vec<PathBuf>, ViewError> {
    let Trees { workspace: ws_tree, home: home_tree } = trees;
    // The run's terminal, by the name the guest's `ttyname()` reads back from `/proc`
    // (`/dev/pts/N`), read while the host's `/proc` is still in place.
    let pts = if spec.tty { pts_name() } else { None };
    stage()?;
    let old = Path::new("/oldroot");
    let new = Path::new("/newroot");
    mount_root(old, new)?;
    write_etc(old, new, uid, gid, spec.home.is_some())?;
    mount_proc_and_dev(old, new, pts.as_deref())?;
    mount_scratch(new, spec.limits.tmpfs_bytes)?;
    if let Some(host) = &spec.home {
        mount_home(old, new, host, home_tree)?;
    }
    let covered = match &spec.workspace {
        Some((host, writable)) => mount_workspace(spec, old, new, host, *writable, uid, ws_tree)?,
        None => Vec::new(),
    };
    bind_grants(spec, old, new)?;
    enter(new)?;
    Ok(covered)
}

/// The view's phase 1: `/` made private, then a small staging tmpfs pivoted into, with the
/// host root at `/oldroot` and the view's root to be built at `/newroot`.
fn stage() -> Result<(), ViewError> {
    let none = Path::new("");
    ctx(mount::mount(none, Path::new("/"), "", libc::MS_REC | libc::MS_PRIVATE, ""), || "making / private".into())?;
    let base = Path::new("/tmp");
    ctx(
        mount::mount(Path::new("tmpfs"), base, "tmpfs", libc::MS_NOSUID | libc::MS_NODEV, "size=1m,mode=0755"),
        || "mounting the staging tmpfs".into(),
    )?;
    ctx(fs::create_dir(base.join("newroot")), || "mkdir newroot".into())?;
    ctx(fs::create_dir(base.join("oldroot")), || "mkdir oldroot".into())?;
    ctx(mount::pivot_root(base, &base.join("oldroot")), || "pivot_root into staging".into())?;
    ctx(std::env::set_current_dir("/"), || "chdir /".into())?;
    Ok(())
}

/// Phase 2: the view's root tmpfs, with the host's system directories bound read-only (or
/// recreated as the links they are).
fn mount_root(old: &Path, new: &Path) -> Result<(), ViewError> {
    ctx(mount::mount(Path::new("tmpfs"), new, "tmpfs", libc::MS_NOSUID | libc::MS_NODEV, "size=4m,mode=0755"), || {
        "mounting the root tmpfs".into()
    })?;
    for dir in ["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
        let src = old.join(dir);
        match fs::symlink_metadata(&src) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = ctx(fs::read_link(&src), || format!("readlink /{dir}"))?;
                ctx(symlink(target, new.join(dir)), || format!("symlink /{dir}"))?;
            }
            Ok(m) if m.is_dir() => bind(&src, &new.join(dir), false)?,
            _ => {}
        }
    }
    Ok(())
}

/// Phase 3: `/etc`.
fn write_etc(old: &Path, new: &Path, uid: u32, gid: u32, session: bool) -> Result<(), ViewError> {
    let etc = new.join("etc");
    ctx(fs::create_dir(&etc), || "mkdir /etc".into())?;
    // A session's guest is `user`, at home in its home directory (the layout E2B's guests
    // expect); a one-shot guest is `sandbox`, with `/tmp` for a home.
    let (name, home, shell) =
        if session { ("user", crate::SESSION_HOME, "/bin/sh") } else { ("sandbox", "/tmp", "/usr/sbin/nologin") };
    let passwd =
        format!("root:x:0:0:root:/root:/usr/sbin/nologin\n{name}:x:{uid}:{gid}:stockade guest:{home}:{shell}\n");
    let group = format!("root:x:0:\n{name}:x:{gid}:\n");
    for (name, text) in [
        ("passwd", passwd.as_str()),
        ("group", group.as_str()),
        ("hostname", "stockade\n"),
        ("hosts", "127.0.0.1 localhost\n::1 localhost\n"),
        ("nsswitch.conf", "passwd: files\ngroup: files\nhosts: files\n"),
    ] {
        ctx(fs::write(etc.join(name), text), || format!("writing /etc/{name}"))?;
    }
    // Small files are copied into the root tmpfs, which is remounted read-only with the rest
    // of the root, and a link is recreated as a link: `/etc/localtime` is one, to an absolute
    // path under `/usr`, which resolves in the view but not from the staging root, so
    // binding it through its target skipped it and the guest had no time zone. A copy also
    // saves a bind's three syscalls and a mount to tear down (not measurable here: see
    // docs/benchmarks.md).
    for name in ["ld.so.cache", "ld.so.conf", "localtime", "mime.types"] {
        copy_if_small(&old.join("etc").join(name), &etc.join(name))?;
    }
    for name in ["ld.so.conf.d", "alternatives", "ssl"] {
        bind_if_exists(&old.join("etc").join(name), &etc.join(name))?;
    }
    if let Ok(entries) = fs::read_dir(old.join("etc")) {
        for e in entries.flatten() {
            let name = e.file_name();
            if name.to_string_lossy().starts_with("python3") {
                bind_if_exists(&e.path(), &etc.join(&name))?;
            }
        }
    }
    Ok(())
}

/// Phase 4: a fresh `/proc` and a `/dev` of harmless devices (and the run's terminal).
fn mount_proc_and_dev(old: &Path, new: &Path, pts: Option<&str>) -> Result<(), ViewError> {
    // /proc: a fresh procfs of the run's pid namespace.
    let proc_dir = new.join("proc");
    ctx(fs::create_dir(&proc_dir), || "mkdir /proc".into())?;
    ctx(
        mount::mount(Path::new("proc"), &proc_dir, "proc", libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC, ""),
        || "mounting /proc".into(),
    )?;
    // /dev: a tmpfs holding only the harmless devices, bound from the host.
    let dev = new.join("dev");
    ctx(fs::create_dir(&dev), || "mkdir /dev".into())?;
    ctx(
        mount::mount(Path::new("tmpfs"), &dev, "tmpfs", libc::MS_NOSUID | libc::MS_NOEXEC, "size=64k,mode=0755"),
        || "mounting /dev".into(),
    )?;
    // `/dev/tty` is there with or without a terminal, as in bubblewrap's and Codex's views:
    // the guest's session has no controlling terminal (the helper and the guest each call
    // `setsid`), so its open fails with ENXIO, as a program expects with no terminal, not
    // ENOENT; with `tty` it is the run's own pty.
    for node in ["null", "zero", "full", "random", "urandom", "tty"] {
        let target = dev.join(node);
        ctx(File::create(&target), || format!("creating /dev/{node}"))?;
        ctx(mount::mount(&old.join("dev").join(node), &target, "", libc::MS_BIND, ""), || {
            format!("binding /dev/{node}")
        })?;
    }
    if let Some(name) = pts {
        name_terminal(old, &dev, name)?;
    }
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        ctx(symlink(target, dev.join(link)), || format!("symlink /dev/{link}"))?;
    }
    Ok(())
}

/// Phase 5: `/tmp` and `/dev/shm`, tmpfs of the job's size.
fn mount_scratch(new: &Path, size: u64) -> Result<(), ViewError> {
    let tmp_opts = format!("size={size},mode=1777");
    for dir in ["dev/shm", "tmp"] {
        let d = new.join(dir);
        ctx(fs::create_dir(&d), || format!("mkdir /{dir}"))?;
        ctx(mount::mount(Path::new("tmpfs"), &d, "tmpfs", libc::MS_NOSUID | libc::MS_NODEV, &tmp_opts), || {
            format!("mounting /{dir}")
        })?;
    }
    Ok(())
}

/// A session's home at [`crate::SESSION_HOME`], read-write, nosuid and nodev: the host
/// directory the supervisor made for the session (in stockade's own state directory, which no
/// guest reaches but through this mount), attached id-mapped for a root supervisor.
fn mount_home(old: &Path, new: &Path, host: &Path, tree: Option<OwnedFd>) -> Result<(), ViewError> {
    let home = new.join(crate::SESSION_HOME.trim_start_matches('/'));
    ctx(fs::create_dir_all(&home), || format!("mkdir {}", crate::SESSION_HOME))?;
    match tree {
        Some(tree) => ctx(mount::move_mount_onto(tree.as_fd(), &home), || "attaching the id-mapped home".into())?,
        None => bind(&old.join(host.strip_prefix("/").unwrap_or(host)), &home, true)?,
    }
    Ok(())
}

/// Phase 6: the workspace at `/workspace`, checked to be the directory the supervisor
/// judged; in a read-write one, the protected paths pinned or made read-only; then its unix
/// sockets and fifos covered. Returns what was covered.
fn mount_workspace(
    spec: &Spec,
    old: &Path,
    new: &Path,
    host: &Path,
    writable: bool,
    uid: u32,
    ws_tree: Option<OwnedFd>,
) -> Result<Vec<PathBuf>, ViewError> {
    let ws = new.join("workspace");
    ctx(fs::create_dir(&ws), || "mkdir /workspace".into())?;
    match &ws_tree {
        Some(tree) => ctx(mount::move_mount_onto(tree.as_fd(), &ws), || "attaching the id-mapped workspace".into())?,
        None => {
            let src = old.join(host.strip_prefix("/").unwrap_or(host));
            if let Err(e) = fs::metadata(&src).and_then(|m| fs::read_dir(&src).map(|_| m)) {
                return Err(ViewError::Path(format!(
                    "workspace {}: {e} (the sandbox runs as uid {uid}, which must be able to open it)",
                    host.display()
                )));
            }
            bind(&src, &ws, writable)?;
        }
    }
    drop(ws_tree);
    // What is mounted must be the directory the supervisor opened and judged, not
    // whatever the path names now: a directory on it swapped for a symlink in between
    // (by a concurrent run's guest) would otherwise mount its target.
    if let Some(want) = spec.workspace_id {
        let m = ctx(fs::metadata(&ws), || "stat /workspace".into())?;
        let got = (std::os::unix::fs::MetadataExt::dev(&m), std::os::unix::fs::MetadataExt::ino(&m));
        if got != want {
            return Err(ViewError::Path(format!(
                "workspace {}: the directory at this path is no longer the one that was checked (something replaced a directory on the path since); nothing was run",
                host.display()
            )));
        }
    }
    if writable {
        // The directories that hold protected paths (`.git`) are pinned: bound writable
        // onto themselves, so they cannot be renamed aside and replaced (EBUSY). Then the
        // paths whose change would outlive the run and run code on the host later (git
        // hooks and config, shell rc files, editor and agent settings): read-only, each
        // bound onto itself, so they can be neither written, removed nor renamed. The
        // supervisor inspected them (no symlink anywhere on the way) and sweeps what the
        // guest creates among the absent ones after the run.
        for (rel, writable) in spec.pinned.iter().map(|p| (p, true)).chain(spec.protected.iter().map(|p| (p, false))) {
            let p = ws.join(rel);
            match fs::symlink_metadata(&p) {
                // Inspected without a symlink on the way; one now is another run's doing.
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(ViewError::Path(format!(
                        "{rel} in the workspace became a symlink after it was checked; nothing was run"
                    )));
                }
                Ok(_) => bind(&p, &p, writable)?,
                Err(_) => {}
            }
        }
    }
    // A host daemon's unix socket or a host reader's fifo in the workspace: landlock ABI 7
    // cannot stop a connect to the one, and neither can a read-only bind, nor a write into
    // the other, so `/dev/null` covers each (a connect then fails with ECONNREFUSED; a
    // write goes nowhere). Found here, by a walk of what is mounted (names as bytes, no
    // list in the spec however many there are); one made after this walk is not covered.
    let found = stockade_hostfs::specials(&ws, stockade_hostfs::MAX_WALK_ENTRIES)
        .map_err(|e| ViewError::Path(format!("finding the unix sockets and fifos to cover: {e}")))?;
    for rel in &found {
        let p = ws.join(rel);
        ctx(mount::mount(&old.join("dev/null"), &p, "", libc::MS_BIND, ""), || {
            format!("covering {} in the workspace", rel.display())
        })?;
    }
    Ok(found)
}

/// Phase 7: the broker's directory at [`crate::GRANTS_GUEST_DIR`].
fn bind_grants(spec: &Spec, old: &Path, new: &Path) -> Result<(), ViewError> {
    if let Some(host) = &spec.grants_dir {
        // The broker's directory: its socket, its client and the data grants, read-only
        // (connecting to a socket needs no write access to the mount), never the workspace.
        let run = new.join("run");
        ctx(fs::create_dir(&run), || "mkdir /run".into())?;
        let dst = new.join(crate::GRANTS_GUEST_DIR.trim_start_matches('/'));
        ctx(fs::create_dir(&dst), || format!("mkdir {}", crate::GRANTS_GUEST_DIR))?;
        bind(&old.join(host.strip_prefix("/").unwrap_or(host)), &dst, false)?;
    }
    Ok(())
}

/// Phase 8: pivot into the view, detach the host root, and remount `/` read-only.
fn enter(new: &Path) -> Result<(), ViewError> {
    let none = Path::new("");
    ctx(std::env::set_current_dir(new), || "chdir /newroot".into())?;
    ctx(mount::pivot_root(Path::new("."), Path::new(".")), || "pivot_root into the view".into())?;
    ctx(mount::umount(Path::new("."), libc::MNT_DETACH), || "detaching the host root".into())?;
    ctx(std::env::set_current_dir("/"), || "chdir /".into())?;
    ctx(mount::mount(none, Path::new("/"), "", libc::MS_REMOUNT | libc::MS_BIND | RO, ""), || {
        "remounting / read-only".into()
    })?;
    Ok(())
}

/// The number of the pty on this process's stdin, from its `/dev/pts/N` name; `None` when
/// the name has another form (the terminal then has no name in the view).
fn pts_name() -> Option<String> {
    let link = fs::read_link("/proc/self/fd/0").ok()?;
    let name = link.strip_prefix("/dev/pts").ok()?.to_str()?;
    (!name.is_empty() && name.bytes().all(|b| b.is_ascii_digit())).then(|| name.to_owned())
}

/// Puts the run's terminal at its name, `/dev/pts/NAME` under `dev`, so that `ttyname()`
/// (`tty`, `ssh`, `gpg`) finds it as under `docker run -t`. The pty's own mount is the host
/// namespace's, which a bind here cannot take, so the node is bound by its path in this
/// namespace's copy of the host's `/dev/pts`, and only if that is the very file on this
/// process's stdin (the run's pty, whose number the supervisor's open master keeps from
/// reuse): never another terminal. A host whose `/dev/pts` does not hold it (a pty of
/// another devpts instance) gets no name, as before; the terminal works the same.
fn name_terminal(old: &Path, dev: &Path, name: &str) -> Result<(), String> {
    let same = |a: &fs::Metadata, b: &fs::Metadata| (a.dev(), a.ino(), a.rdev()) == (b.dev(), b.ino(), b.rdev());
    let src = old.join("dev/pts").join(name);
    let mine = ctx(fs::metadata(old.join("proc/self/fd/0")), || "stat of the run's terminal".into())?;
    if !fs::metadata(&src).is_ok_and(|m| same(&m, &mine)) {
        return Ok(());
    }
    let dir = dev.join("pts");
    ctx(fs::create_dir(&dir), || "mkdir /dev/pts".into())?;
    let target = dir.join(name);
    ctx(File::create(&target), || format!("creating /dev/pts/{name}"))?;
    ctx(mount::mount(&src, &target, "", libc::MS_BIND, ""), || {
        format!("binding the run's terminal at /dev/pts/{name}")
    })?;
    // Checked again on the bound node, in case the host's node changed in between.
    if !fs::metadata(&target).is_ok_and(|m| same(&m, &mine)) {
        ctx(mount::umount(&target, libc::MNT_DETACH), || {
            format!("/dev/pts/{name} is not the run's terminal: unmounting it")
        })?;
        ctx(fs::remove_file(&target), || format!("removing /dev/pts/{name}"))?;
    }
    Ok(())
}

fn bind_if_exists(src: &Path, dst: &Path) -> Result<(), String> {
    match fs::metadata(src) {
        Ok(m) if m.is_dir() => {
            ctx(fs::create_dir(dst), || format!("mkdir {}", dst.display()))?;
            bind(src, dst, false)
        }
        Ok(_) => {
            ctx(File::create(dst), || format!("creating {}", dst.display()))?;
            bind(src, dst, false)
        }
        Err(_) => Ok(()),
    }
}

/// The most of one `/etc` file that is copied into the view; a larger one is bound.
const ETC_COPY_MAX: u64 = 256 * 1024;

/// Copies the host's `src` (an `/etc` file: the host's, trusted) to `dst` in the view: a
/// symbolic link as a link with the same target, a regular file of at most
/// [`ETC_COPY_MAX`] bytes as a copy, anything larger bound read-only; nothing if absent.
fn copy_if_small(src: &Path, dst: &Path) -> Result<(), String> {
    match fs::symlink_metadata(src) {
        Ok(m) if m.file_type().is_symlink() => {
            let target = ctx(fs::read_link(src), || format!("readlink {}", src.display()))?;
            ctx(symlink(target, dst), || format!("symlink {}", dst.display()))
        }
        Ok(m) if m.is_file() && m.len() <= ETC_COPY_MAX => {
            ctx(fs::copy(src, dst), || format!("copying {}", src.display())).map(|_| ())
        }
        Ok(_) => bind_if_exists(src, dst),
        Err(_) => Ok(()),
    }
}

/// Bind-mounts `src` on `dst` (which must exist), then remounts it nosuid, nodev and, unless
/// `writable`, read-only, keeping the flags the kernel locks in a user namespace.
fn bind(src: &Path, dst: &Path, writable: bool) -> Result<(), String> {
    if !dst.exists() {
        ctx(fs::create_dir(dst), || format!("mkdir {}", dst.display()))?;
    }
    ctx(mount::mount(src, dst, "", libc::MS_BIND, ""), || format!("binding {}", src.display()))?;
    let locked = ctx(mount::mount_flags(dst), || format!("statvfs {}", dst.display()))?;
    let mut flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_NOSUID | libc::MS_NODEV | locked;
    if !writable {
        flags |= libc::MS_RDONLY;
    }
    ctx(mount::mount(Path::new(""), dst, "", flags, ""), || format!("remounting {}", dst.display()))
}

/// What a guest reports of its capabilities once they are dropped.
const CAPABILITIES_DROPPED: &str = "bounding, ambient, effective, permitted and inheritable sets empty";
/// What a guest reports of `no_new_privs`.
const NO_NEW_PRIVS: &str = "no_new_privs set; new session without a controlling tty";

/// Reports a landlock outcome: enforced when the kernel enforces the whole ruleset, else missing.
fn report_landlock(rep: &mut Reporter, o: &confine::LandlockOutcome) {
    if o.full {
        rep.enforced(Mechanism::Landlock, o.detail.clone());
    } else {
        rep.send(&Msg::Missing { mechanism: "landlock".into(), reason: o.detail.clone() });
    }
}

/// The guest's confinement that no job changes, made by init once, for a run's one guest or
/// for every exec of a session: the landlock domain of the view and the seccomp filter,
/// which init enters and installs itself so that every guest it starts inherits them (execs
/// of a session can then signal each other's processes and reach each other's abstract
/// sockets, as processes of one machine do, while landlock still scopes both to the run).
/// Each guest still drops its capabilities and sets `no_new_privs` itself, which the filter
/// allows ([`start_guest`]). Init is then as confined as the guests it serves (so a pre-built
/// sandbox's init is confined before its job exists), and the kernel checks and compiles
/// the filter once per run or session rather than once per guest.
pub(crate) struct Prepared {
    landlock: confine::LandlockOutcome,
    seccomp: String,
    /// The stack every exec's guest starts on (`sys::spawn`).
    stack: crate::sys::spawn::Stack,
}

impl Prepared {
    /// Builds them in the view (init has pivoted into it) and confines init with them: the
    /// landlock domain first, then the filter (init's own calls after this point, `poll`,
    /// `recvmsg`, `clone`, `pidfd_open`, `wait4`, `kill` and `write`, are all on the
    /// allowlist). `Err` is (stage, message).
    pub(crate) fn build(spec: &Spec) -> Result<Self, (&'static str, String)> {
        let ws = spec.workspace.as_ref().map(|(_, w)| *w);
        let grants = spec.grants_dir.is_some();
        let program = confine::seccomp_program().map_err(|e| ("seccomp", e))?;
        let landlock =
            confine::apply_landlock(ws, grants, spec.tty, confine::Tcp::of(spec), spec.hard, spec.landlock_abi)
                .map_err(|e| ("landlock", e))?;
        let landlock = confine::LandlockOutcome {
            detail: format!("{}; {}", landlock.detail, Self::whose(spec, "one domain", "entered by")),
            full: landlock.full,
        };
        let seccomp = confine::apply_compiled_seccomp(&program).map_err(|e| ("seccomp", e))?;
        let seccomp = format!("{seccomp}; {}", Self::whose(spec, "installed once", "by"));
        let stack = crate::sys::spawn::Stack::new().map_err(|e| ("guest", format!("the guests' stack: {e}")))?;
        Ok(Self { landlock, seccomp, stack })
    }

    /// How a report line says whose domain or filter a guest is in: `what` for the whole
    /// session or run, `how` its init.
    fn whose(spec: &Spec, what: &str, how: &str) -> String {
        if spec.session {
            format!("{what} for the whole session, {how} its init, inherited by every exec")
        } else {
            format!("{what} for the run, {how} its init, inherited by the guest")
        }
    }
}

/// The job's rlimits (memory and processes where the spec asks for them), as (resource,
/// soft, hard), and the report's detail for them.
fn rlimits(spec: &Spec, l: SpecLimits) -> (Vec<(libc::__rlimit_resource_t, u64, u64)>, String) {
    let mut limits = vec![
        (libc::RLIMIT_CPU, l.cpu_secs, l.cpu_secs.saturating_add(1)),
        (libc::RLIMIT_NOFILE, l.open_files, l.open_files),
        (libc::RLIMIT_FSIZE, l.file_size_bytes, l.file_size_bytes),
        (libc::RLIMIT_CORE, 0, 0),
    ];
    if spec.rlimit_memory {
        limits.push((libc::RLIMIT_AS, l.memory_bytes, l.memory_bytes));
    }
    if spec.rlimit_processes {
        // Counted per real uid on the host, and init and the helper count too.
        limits.push((libc::RLIMIT_NPROC, l.processes + 2, l.processes + 2));
    }
    let detail = format!(
        "cpu {}s, nofile {}, fsize {}, core 0{}{}",
        l.cpu_secs,
        l.open_files,
        l.file_size_bytes,
        if spec.rlimit_memory { format!(", as {}", l.memory_bytes) } else { String::new() },
        if spec.rlimit_processes { format!(", nproc {}", l.processes + 2) } else { String::new() },
    );
    (limits, detail)
}

/// The job's working directory in the view: its own, else the home, the workspace or `/tmp`.
fn working_dir<'a>(spec: &Spec, job: &JobRef<'a>) -> &'a str {
    match (job.cwd, &spec.home, &spec.workspace) {
        (Some(cwd), _, _) => cwd,
        (None, Some(_), _) => crate::SESSION_HOME,
        (None, None, Some(_)) => "/workspace",
        (None, None, None) => "/tmp",
    }
}

/// The job-specific part of a run, from the spec or from a pre-built sandbox's job message.
pub(crate) struct JobRef<'a> {
    pub(crate) program: &'a str,
    pub(crate) args: &'a [String],
    pub(crate) env: &'a [(String, String)],
    pub(crate) limits: SpecLimits,
    /// The working directory in the view (a session's exec may name one).
    pub(crate) cwd: Option<&'a str>,
    /// Descriptors 0–2 are a pseudo-terminal's slave, which becomes the guest's controlling
    /// terminal (a run's `spec.tty`, or a session exec's own).
    pub(crate) tty: bool,
}

/// Starts a guest, the one way every guest starts: a run's one guest and each exec of a
/// session alike. Init spawns it (`sys::spawn`, a vfork-style clone whose child takes the
/// guest's steps with raw system calls on a plan built here: `stdio` as its descriptors
/// 0–2, its own session and terminal, capabilities dropped and checked, `no_new_privs`, the
/// job's rlimits and working directory, every other descriptor closed, signals reset, then
/// the exec; landlock and seccomp are inherited from init, [`Prepared`]). Then it reports
/// on `rep` in one write: `Started` with the guest's pid (a session's exec: `announce`),
/// each step that held, and the one that failed, if one did, with the same stage and text
/// on both paths (that guest has exited 126, and init reaps it as any other). `None` when
/// no guest was started (reported).
pub(crate) fn start_guest(
    spec: &Spec,
    pre: &mut Prepared,
    job: &JobRef<'_>,
    stdio: [std::os::fd::RawFd; 3],
    rep: &mut Reporter,
    announce: bool,
) -> Option<libc::pid_t> {
    use crate::sys::spawn::{Plan, Step, spawn};
    rep.hold();
    let Some(program) = resolve(job.program) else {
        rep.fail("exec", false, format!("{}: not found in the sandbox view", job.program));
        return None;
    };
    let cwd = working_dir(spec, job);
    let (limits, rlimits_detail) = rlimits(spec, job.limits);
    let mut argv = vec![job.program.to_owned()];
    argv.extend(job.args.iter().cloned());
    let plan = match Plan::new(&program.to_string_lossy(), &argv, job.env, cwd, stdio, job.tty, &limits) {
        Ok(plan) => plan.fail_at(spec.fail_step),
        Err(e) => {
            rep.fail("exec", false, format!("{}: {e}", job.program));
            return None;
        }
    };
    let spawned = match spawn(&plan, &mut pre.stack) {
        Ok(s) => s,
        Err(e) => {
            rep.fail("guest", false, format!("clone: {e}"));
            return None;
        }
    };
    if announce {
        rep.send(&Msg::Started { pid: spawned.pid });
    }
    let failed = spawned.failed.map(|(step, errno, index)| (step, io::Error::from_raw_os_error(errno), index));
    let held = |past: Step| failed.as_ref().is_none_or(|(step, _, _)| *step as u8 > past as u8);
    if held(Step::CapabilitiesRemain) {
        rep.enforced(Mechanism::CapabilitiesDropped, CAPABILITIES_DROPPED);
    }
    if held(Step::NoNewPrivs) {
        rep.enforced(Mechanism::NoNewPrivs, NO_NEW_PRIVS);
        report_landlock(rep, &pre.landlock);
        rep.enforced(Mechanism::Seccomp, pre.seccomp.clone());
    }
    if held(Step::Rlimit) {
        rep.enforced(Mechanism::Rlimits, rlimits_detail);
    }
    match failed {
        None => rep.flush(),
        Some((step, e, index)) => {
            let (stage, unsupported, message) = match step {
                Step::Stdio => ("guest", false, format!("moving the exec's descriptors onto 0-2: {e}")),
                Step::Setsid => ("setsid", false, e.to_string()),
                Step::Terminal => ("terminal", false, format!("TIOCSCTTY: {e}")),
                Step::Capabilities => ("capabilities", true, e.to_string()),
                Step::CapabilitiesRemain => {
                    ("capabilities", false, "capabilities remain after dropping them all".into())
                }
                Step::NoNewPrivs => ("no_new_privs", true, e.to_string()),
                Step::Rlimit => {
                    let res = limits.get(usize::from(index)).map_or(-1, |(r, _, _)| i64::from(*r));
                    ("rlimits", false, format!("setrlimit({res}): {e}"))
                }
                Step::Chdir => ("guest", false, format!("chdir {cwd}: {e}")),
                Step::Fds => ("fds", false, e.to_string()),
                Step::Signals => ("signals", false, e.to_string()),
                Step::Exec => ("exec", false, format!("{}: {e}", job.program)),
            };
            rep.fail(stage, unsupported, message);
        }
    }
    Some(spawned.pid)
}

/// Reads a pre-built sandbox's job from `fd` to its end: `None` when it ends with no byte
/// (the pool dropped the sandbox), else the job, at most [`crate::spec::MAX_SPEC`]
/// bytes of JSON.
fn read_pooled_job(fd: i32) -> io::Result<Option<PooledJob>> {
    let file = sysfs::adopt(fd)?;
    let mut bytes = Vec::new();
    file.take(crate::spec::MAX_SPEC as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.is_empty() {
        return Ok(None);
    }
    if bytes.len() > crate::spec::MAX_SPEC {
        return Err(io::Error::other("the job is over the spec limit"));
    }
    serde_json::from_slice(&bytes).map(Some).map_err(io::Error::other)
}

/// Resolves a bare program name against the view's standard directories.
fn resolve(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Some(PathBuf::from(program));
    }
    ["/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"]
        .iter()
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}
