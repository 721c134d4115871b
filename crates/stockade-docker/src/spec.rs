//! The container a job becomes: validated host-side, before any call to the engine, and
//! turned into the create body bollard sends. Pure: no I/O, unit-tested without a daemon.

use std::collections::HashMap;
use std::path::{Component, Path};
use std::time::Duration;

use bollard::models::{
    ContainerCreateBody, HostConfig, HostConfigLogConfig, Mount, MountType, MountVolumeOptions,
    MountVolumeOptionsDriverConfig, ResourcesUlimits,
};
use stockade_protocol::{Access, Job, JobKind, Limits};

/// What a started container that waits for execs runs (a pool's and a session's): a sleep
/// that outlives any container's age, under the engine's init.
pub const KEEPER: [&str; 2] = ["sleep", "2147483647"];

/// The default image: a `docker import` of Debian's busybox-static (`cargo xtask images`).
pub const DEFAULT_IMAGE: &str = "stockade-busybox:local";

/// The uid and gid the job runs as: `nobody`.
pub const JOB_UID: u32 = 65534;

/// Size of the private `/tmp` tmpfs.
pub const TMP_BYTES: u64 = 64 << 20;

/// CPUs a container may use.
pub const NANO_CPUS: i64 = 1_000_000_000;

/// The gVisor runtime's usual name.
pub const RUNSC: &str = "runsc";

/// Host tasks the pids limit allows gVisor's sandbox kernel on top of the job's processes.
pub const RUNSC_HOST_TASKS: i64 = 512;

/// Where a run's grants directory appears inside the container (read-only).
pub const GRANTS: &str = "/broker";

/// The read-only bind of a run's grants directory at [`GRANTS`]: absolute, normalised, and
/// neither inside nor around the job's workspace.
pub fn grants_bind(dir: &Path, job: &Job) -> Result<String, SpecError> {
    let bad = |why: &'static str| SpecError::Grants { path: dir.display().to_string(), why };
    if !dir.is_absolute() || dir.components().any(|c| !matches!(c, Component::RootDir | Component::Normal(_))) {
        return Err(bad("a grants directory must be an absolute, normalised path"));
    }
    if let Some(ws) = job.workspace()
        && (ws.path().starts_with(dir) || dir.starts_with(ws.path()))
    {
        return Err(bad("the grants directory and the workspace must be separate trees"));
    }
    let text = dir.to_str().filter(|t| !t.contains(':')).ok_or_else(|| bad("not UTF-8, or contains ':'"))?;
    Ok(format!("{text}:{GRANTS}:ro"))
}

/// Where the workspace appears inside the container.
pub const WORKSPACE: &str = "/workspace";

/// The label every stockade container carries, with the run's id.
pub const LABEL_RUN: &str = "stockade.run-id";

/// The label with the Unix time after which a container is an orphan to reap.
pub const LABEL_EXPIRES: &str = "stockade.expires";

/// The label naming the process that created a container, as
/// `BOOT_ID/PID_NAMESPACE/PID/START_TIME` (see [`owner`]), so that the containers of a
/// supervisor that died (SIGKILL, a crash) are reaped at the next connect instead of at
/// their expiry, and those of a live one never are.
pub const LABEL_OWNER: &str = "stockade.owner";

/// This process as an owner: the kernel's boot id, the inode of its pid namespace, its pid
/// and its start time in clock ticks since boot (`/proc/self/stat` field 22, which tells a
/// reused pid apart). `None` if `/proc` cannot say, and then containers carry no owner
/// label and are reaped by expiry alone.
#[must_use]
pub fn owner() -> Option<&'static str> {
    static OWNER: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    OWNER
        .get_or_init(|| {
            let (boot, ns) = here()?;
            let pid = std::process::id();
            Some(format!("{boot}/{ns}/{pid}/{}", stockade_sys::proc::start_time("self")?))
        })
        .as_deref()
}

/// This boot's id and this process's pid namespace inode.
fn here() -> Option<(String, u64)> {
    Some((stockade_sys::proc::boot_id()?, stockade_sys::proc::pid_namespace()?))
}

/// Whether an owner label names a process that is gone. Judged only for a label of this
/// boot and this pid namespace (elsewhere the pid means nothing here): `false` otherwise,
/// and for a label that does not parse.
#[must_use]
pub fn owner_gone(label: &str) -> bool {
    let Some((boot, ns)) = here() else { return false };
    let mut parts = label.split('/');
    let (Some(b), Some(n), Some(pid), Some(start), None) =
        (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let (Ok(n), Ok(pid), Ok(start)) = (n.parse::<u64>(), pid.parse::<u32>(), start.parse::<u64>()) else {
        return false;
    };
    b == boot && n == ns && stockade_sys::proc::gone(&pid.to_string(), start)
}

/// Whether a container with these engine names and run label is one stockade created: the
/// engine copies labels from an image (and `docker commit` copies a stockade container's
/// into one), so a label proves nothing; stockade also names each container after its run
/// id (`stockade-ID`, `stockade-pool-ID`, `stockade-session-ID`, `stockade-ID-netns`), and a
/// container started from a labelled image has a name of its own.
#[must_use]
pub fn named_by_stockade(names: &[String], run_id: &str) -> bool {
    let ours = [
        format!("/stockade-{run_id}"),
        format!("/stockade-pool-{run_id}"),
        format!("/stockade-session-{run_id}"),
        format!("/stockade-{run_id}-netns"),
    ];
    !run_id.is_empty() && names.iter().any(|n| ours.contains(n))
}

/// The labels of a container for run `run_id`, reaped after `expires` (Unix seconds) or
/// once its owner is gone.
pub(crate) fn labels(run_id: &str, expires: u64) -> HashMap<String, String> {
    let mut l =
        HashMap::from([(LABEL_RUN.to_owned(), run_id.to_owned()), (LABEL_EXPIRES.to_owned(), expires.to_string())]);
    if let Some(o) = owner() {
        l.insert(LABEL_OWNER.to_owned(), o.to_owned());
    }
    l
}

/// Grace added to a run's deadline before its container counts as an orphan.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(60);

/// The container's seccomp profile: the process tier's policy in the OCI format (the
/// allowed calls, `clone`, `socket`, `personality` and the mode-setting calls narrowed by
/// argument, `io_uring_*`, `clone3` and `openat2` ENOSYS, everything else EPERM), in place
/// of the engine's default, which allows io_uring. A test of stockade-process keeps this copy
/// equal to what that tier generates.
pub const SECCOMP_PROFILE: &str = include_str!("seccomp.json");

/// [`SECCOMP_PROFILE`] without its whitespace, as it is sent to the engine.
#[must_use]
pub fn seccomp_profile() -> &'static str {
    static COMPACT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        serde_json::from_str::<serde_json::Value>(SECCOMP_PROFILE).map(|v| v.to_string()).unwrap_or_default()
    });
    &COMPACT
}

/// A job that cannot become a container is the job's fault (misconfigured).
impl From<SpecError> for stockade_protocol::RunError {
    fn from(e: SpecError) -> Self {
        Self::Misconfigured(e.to_string())
    }
}

/// Why a job cannot become a container.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// The job is not an image job.
    #[error("the docker tier runs only image jobs")]
    NotAnImageJob,
    /// The image reference is malformed.
    #[error("invalid image reference {0:?}: {1}")]
    Image(String, &'static str),
    /// A container name is malformed.
    #[error("invalid container name {0:?}")]
    Name(String),
    /// The job would run as root.
    #[error("the container user must be non-root, got uid {uid} gid {gid}")]
    Root {
        /// The uid.
        uid: u32,
        /// The gid.
        gid: u32,
    },
    /// A mount directory is unusable.
    #[error("workspace {path:?}: {why}")]
    Mount {
        /// The host path.
        path: String,
        /// Why.
        why: &'static str,
    },
    /// The workspace is not a dedicated directory (the rule every tier shares).
    #[error("workspace {0}")]
    NotDedicated(#[from] stockade_protocol::NotDedicated),
    /// The workspace cannot be resolved on the host (missing, unreadable, not a directory).
    #[error("{0}")]
    Unusable(String),
    /// The resolved workspace cannot be put in the job.
    #[error("workspace {path}: {why}")]
    Workspace {
        /// The host path, as given.
        path: String,
        /// Why, from the host.
        why: String,
    },
    /// A protected path of a read-write workspace cannot be kept (a symlink on the way).
    #[error("{0}")]
    Protected(String),
    /// A grants directory is unusable.
    #[error("grants directory {path:?}: {why}")]
    Grants {
        /// The host path.
        path: String,
        /// Why.
        why: &'static str,
    },
    /// A limit is out of the range the engine can enforce.
    #[error("{name} = {value} is out of range ({why})")]
    Limit {
        /// The limit.
        name: &'static str,
        /// Its value.
        value: u64,
        /// The range.
        why: &'static str,
    },
    /// The command is empty.
    #[error("the command is empty")]
    EmptyCommand,
    /// The job does not fit the pool it was given to.
    #[error("the job does not fit the pool: {0}")]
    Pool(String),
}

/// Checks an image reference: non-empty, at most 255 bytes, no leading `-` (it would read
/// as a flag to a CLI), no whitespace or control characters, and only the characters of a
/// `name[:tag][@digest]` reference.
pub fn check_image(image: &str) -> Result<(), SpecError> {
    let bad = |why| Err(SpecError::Image(image.to_owned(), why));
    if image.is_empty() || image.len() > 255 {
        return bad("must be 1 to 255 bytes");
    }
    if image.starts_with('-') {
        return bad("must not start with '-'");
    }
    if image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return bad("must not contain whitespace or control characters");
    }
    if !image.chars().all(|c| c.is_ascii_alphanumeric() || "._-/:@".contains(c)) {
        return bad("only letters, digits and . _ - / : @ are allowed");
    }
    if image.split('/').any(str::is_empty) {
        return bad("empty path component");
    }
    Ok(())
}

/// Checks a container name: `[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}`.
pub fn check_name(name: &str) -> Result<(), SpecError> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    if first_ok && name.len() <= 128 && chars.all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)) {
        Ok(())
    } else {
        Err(SpecError::Name(name.to_owned()))
    }
}

/// Checks a workspace directory: absolute, normalised (no `.` or `..`), dedicated (the
/// protocol's [`stockade_protocol::check_dedicated`], on a path [`resolve_workspace`] has
/// resolved), and (with several mounts) none nested in another.
pub fn check_mounts(paths: &[&Path]) -> Result<(), SpecError> {
    for p in paths {
        let text = p.to_string_lossy().into_owned();
        let err = |why| Err(SpecError::Mount { path: text.clone(), why });
        if !p.is_absolute() {
            return err("must be absolute");
        }
        if p.components().any(|c| matches!(c, Component::CurDir | Component::ParentDir)) {
            return err("must not contain . or ..");
        }
        if text.contains(':') || text.contains(',') {
            return err("must not contain ':' or ','");
        }
        stockade_protocol::check_dedicated(p, &[])?;
        if text.contains("docker.sock") || text.contains("containerd") {
            return err("must not expose an engine socket");
        }
    }
    for (i, a) in paths.iter().enumerate() {
        for b in &paths[i + 1..] {
            if a.starts_with(b) || b.starts_with(a) {
                return Err(SpecError::Mount {
                    path: a.to_string_lossy().into_owned(),
                    why: "nests with another mount",
                });
            }
        }
    }
    Ok(())
}

/// Settings of the tier that shape every container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hardening {
    /// The user, `uid:gid`; never 0.
    pub uid: u32,
    /// The group.
    pub gid: u32,
    /// An OCI runtime other than the daemon's default (e.g. `runsc` for gVisor).
    pub runtime: Option<String>,
}

impl Default for Hardening {
    fn default() -> Self {
        Self { uid: JOB_UID, gid: JOB_UID, runtime: None }
    }
}

/// A validated container, ready to create.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// The image.
    pub image: String,
    /// The command.
    pub command: Vec<String>,
    /// The create body.
    pub body: ContainerCreateBody,
}

fn limit(name: &'static str, value: u64, min: u64, max: u64, why: &'static str) -> Result<i64, SpecError> {
    if value < min || value > max {
        return Err(SpecError::Limit { name, value, why });
    }
    i64::try_from(value).map_err(|_| SpecError::Limit { name, value, why })
}

/// Turns `job` into the create body, with every hardening default. `run_id` and `expires`
/// (Unix seconds) become labels.
pub fn spec(job: &Job, hardening: &Hardening, run_id: &str, expires: u64) -> Result<Spec, SpecError> {
    let JobKind::Image { image, command } = job.kind() else {
        return Err(SpecError::NotAnImageJob);
    };
    check_image(image)?;
    check_name(run_id)?;
    if command.is_empty() {
        return Err(SpecError::EmptyCommand);
    }
    if hardening.uid == 0 || hardening.gid == 0 {
        return Err(SpecError::Root { uid: hardening.uid, gid: hardening.gid });
    }
    let l: &Limits = job.limits();
    let memory = limit("memory", l.memory_bytes(), 6 << 20, 64 << 30, "6 MiB to 64 GiB")?;
    let mut pids = limit("processes", u64::from(l.processes()), 1, 4096, "1 to 4096")?;
    if hardening.runtime.as_deref() == Some(RUNSC) {
        // Under gVisor the pids limit counts the sandbox kernel's own host threads (about a
        // hundred), not the guest's processes, which only the memory limit bounds.
        pids += RUNSC_HOST_TASKS;
    }
    let nofile = limit("open files", u64::from(l.open_files()), 16, 65536, "16 to 65536")?;
    // RLIMIT_CPU has whole seconds: round up, so a job never gets less than it asked for.
    let cpu =
        limit("cpu seconds", l.cpu().as_secs() + u64::from(l.cpu().subsec_nanos() > 0), 1, 86_400, "1 s to 24 h")?;
    let mut binds = Vec::new();
    if let Some(ws) = job.workspace() {
        check_mounts(&[ws.path()])?;
        let mode = match ws.access() {
            Access::ReadOnly => "ro",
            Access::ReadWrite => "rw",
        };
        // Docker's bind syntax takes no nosuid or nodev (the engine refuses the create with
        // "invalid mode"); no-new-privileges makes set-user-ID inert, and the engine's device
        // cgroup and the empty capability sets keep device nodes unusable.
        binds.push(format!("{}:{WORKSPACE}:{mode}", ws.path().display()));
    }
    if let Some(rt) = &hardening.runtime {
        check_name(rt)?;
    }
    let env: Vec<String> = job.env().iter().map(|v| format!("{}={}", v.key(), v.value())).collect();
    let stdin = !job.stdin().is_empty();
    let host = HostConfig {
        memory: Some(memory),
        memory_swap: Some(memory),
        nano_cpus: Some(NANO_CPUS),
        pids_limit: Some(pids),
        ulimits: Some(vec![
            ResourcesUlimits { name: Some("nofile".into()), soft: Some(nofile), hard: Some(nofile) },
            ResourcesUlimits { name: Some("core".into()), soft: Some(0), hard: Some(0) },
            ResourcesUlimits { name: Some("cpu".into()), soft: Some(cpu), hard: Some(cpu) },
        ]),
        tmpfs: Some(HashMap::from([("/tmp".to_owned(), format!("rw,noexec,nosuid,nodev,size={TMP_BYTES}"))])),
        init: Some(true),
        binds: (!binds.is_empty()).then_some(binds),
        runtime: hardening.runtime.clone(),
        ..hardened_host()
    };
    let body = ContainerCreateBody {
        image: Some(image.clone()),
        cmd: Some(command.clone()),
        entrypoint: Some(Vec::new()),
        user: Some(format!("{}:{}", hardening.uid, hardening.gid)),
        env: Some(env),
        working_dir: Some(if job.workspace().is_some() { WORKSPACE.into() } else { "/".into() }),
        network_disabled: Some(true),
        attach_stdin: Some(stdin),
        open_stdin: Some(stdin),
        stdin_once: Some(stdin),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        labels: Some(labels(run_id, expires)),
        host_config: Some(host),
        ..Default::default()
    };
    Ok(Spec { image: image.clone(), command: command.clone(), body })
}

/// The `/workspace` mount of a container whose workspace is staged (see [`crate::stage`]): an
/// anonymous volume of the local driver backed by tmpfs, `bytes` large, with at most
/// [`crate::stage::MAX_ENTRIES`] entries, nosuid and nodev; its root belongs to the job user
/// for a read-write grant and to root (0755) for a read-only one, so a read-only guest can
/// add nothing. Anonymous, it is removed with its container; labelled like the container.
pub fn staged_workspace_mount(
    access: Access,
    bytes: u64,
    hardening: &Hardening,
    run_id: &str,
) -> Result<Mount, SpecError> {
    staged_volume(WORKSPACE, access, bytes, hardening, run_id)
}

/// [`staged_workspace_mount`] at `target` (a docker session's home is one, read-write).
pub fn staged_volume(
    target: &str,
    access: Access,
    bytes: u64,
    hardening: &Hardening,
    run_id: &str,
) -> Result<Mount, SpecError> {
    let bytes = limit("workspace bytes", bytes, 1 << 20, 16 << 30, "1 MiB to 16 GiB")?;
    let (uid, gid) = match access {
        Access::ReadOnly => (0, 0),
        Access::ReadWrite => (hardening.uid, hardening.gid),
    };
    let o = format!("size={bytes},{},mode=0755,uid={uid},gid={gid},nosuid,nodev", entry_count_option());
    Ok(Mount {
        target: Some(target.into()),
        typ: Some(MountType::VOLUME),
        read_only: Some(false),
        volume_options: Some(MountVolumeOptions {
            no_copy: Some(true),
            labels: Some(HashMap::from([(LABEL_RUN.to_owned(), run_id.to_owned())])),
            driver_config: Some(MountVolumeOptionsDriverConfig {
                name: Some("local".into()),
                options: Some(HashMap::from([
                    ("type".to_owned(), "tmpfs".to_owned()),
                    ("device".to_owned(), "tmpfs".to_owned()),
                    ("o".to_owned(), o),
                ])),
            }),
            subpath: None,
        }),
        ..Default::default()
    })
}

/// The extra binds of a read-write workspace: each pinned directory (`.git`) bound writable
/// onto itself at `/workspace/<path>`, so it can be neither removed nor renamed (a mount
/// point is busy), then each present [`PROTECTED_PATHS`] entry bound read-only onto itself,
/// so it can be neither changed, removed nor renamed. The engine mounts parents first. Both
/// lists come from the host (`stockade_hostfs::Guarded`, see [`crate::DockerTier::run`]).
///
/// [`PROTECTED_PATHS`]: stockade_protocol::PROTECTED_PATHS
#[must_use]
pub fn protected_binds(host: &Path, pinned: &[&str], present: &[String]) -> Vec<String> {
    let pins = pinned.iter().map(|rel| format!("{}:{WORKSPACE}/{rel}:rw", host.join(rel).display()));
    pins.chain(present.iter().map(|rel| format!("{}:{WORKSPACE}/{rel}:ro", host.join(rel).display()))).collect()
}

/// The bind that covers the unix socket or fifo at `rel` in the workspace with `/dev/null`,
/// so that a connect to it is refused and a write into it goes nowhere.
#[must_use]
pub fn socket_cover_bind(rel: &str) -> String {
    format!("/dev/null:{WORKSPACE}/{rel}:ro")
}

/// Most unix sockets and fifos a one-shot container's workspace may hold: 256. Each is a
/// bind of its own in the container's configuration, so a workspace with thousands would
/// make every later run's create request huge; above this the grant is refused, naming the
/// count.
pub const MAX_SPECIAL_COVERS: usize = 256;

/// The binds that cover `specials` (from `stockade_hostfs::specials`), or a refusal naming
/// the path that a bind string cannot carry (a name that is not UTF-8, or holds `:` or `,`,
/// the bind syntax's separators) or the count over [`MAX_SPECIAL_COVERS`].
pub fn special_cover_binds(specials: &[std::path::PathBuf]) -> Result<Vec<String>, SpecError> {
    if specials.len() > MAX_SPECIAL_COVERS {
        return Err(SpecError::Protected(format!(
            "the workspace holds {} unix sockets and fifos, over the docker tier's {MAX_SPECIAL_COVERS} (each is covered by a bind of its own); remove them or use the process tier",
            specials.len()
        )));
    }
    specials
        .iter()
        .map(|p| match p.to_str() {
            Some(rel) if !rel.contains([':', ',']) => Ok(socket_cover_bind(rel)),
            _ => Err(SpecError::Protected(format!(
                "the unix socket or fifo {} in the workspace has a name a docker bind cannot carry (not UTF-8, or with ':' or ','), so it cannot be covered; remove or rename it, or use the process tier",
                p.display()
            ))),
        })
        .collect()
}

/// The `oom_score_adj` of every container: the kernel's maximum, so that a host short of
/// memory loses a container's processes before the supervisor, the engine or any other host
/// process.
pub const OOM_SCORE_ADJ: i64 = 1000;

/// What every container of the tier gets, a guest's or [`crate::netns`]'s holder: no
/// network, a read-only root, no capabilities, no-new-privileges and [`SECCOMP_PROFILE`],
/// unprivileged, [`OOM_SCORE_ADJ`], no logs kept, never auto-removed (the tier removes it).
pub(crate) fn hardened_host() -> HostConfig {
    HostConfig {
        network_mode: Some("none".into()),
        readonly_rootfs: Some(true),
        cap_drop: Some(vec!["ALL".into()]),
        security_opt: Some(vec!["no-new-privileges".into(), format!("seccomp={}", seccomp_profile())]),
        privileged: Some(false),
        log_config: Some(HostConfigLogConfig { typ: Some("none".into()), config: None }),
        auto_remove: Some(false),
        // The container's processes are the host's first out-of-memory victims.
        oom_score_adj: Some(OOM_SCORE_ADJ),
        ..Default::default()
    }
}

/// The job with its workspace path resolved (symlinks followed), so that the dedicated-
/// directory rule judges, and the engine binds, the real directory.
pub fn resolve_workspace(job: &Job) -> Result<std::borrow::Cow<'_, Job>, SpecError> {
    let Some(ws) = job.workspace() else { return Ok(std::borrow::Cow::Borrowed(job)) };
    let bad = |why: String| SpecError::Workspace { path: ws.path().display().to_string(), why };
    let path = match stockade_hostfs::resolve_workspace(ws.path()) {
        Ok(p) => p,
        Err(stockade_hostfs::WorkspaceError::NotDedicated(e)) => return Err(SpecError::NotDedicated(e)),
        Err(e) => return Err(SpecError::Unusable(e.to_string())),
    };
    if path == ws.path() {
        return Ok(std::borrow::Cow::Borrowed(job));
    }
    let (access, busy) = (ws.access(), ws.busy());
    job.clone()
        .with_workspace_when_busy(path, access, busy)
        .map(std::borrow::Cow::Owned)
        .map_err(|e| bad(e.to_string()))
}

/// Whether the container's user can use a bind-mounted workspace: read and search it, and
/// for a read-write grant also write it. A one-shot run bind-mounts the host directory and
/// runs as `uid:gid` (as `docker run --user` does), so a directory that user cannot open
/// (a root-owned `mktemp -d` is mode 0700) would fail inside, as "Permission denied" with
/// no word from stockade; this says it before a container is made, with the fixes.
///
/// It refuses only what the mode bits deny for certain, whatever POSIX ACL the directory
/// may have: for the owner, the owner's bits; for anyone else, access needs the group bits
/// (the group's, or an ACL's mask, which caps every named entry) or the other bits. Only
/// for an engine whose container uids are the host's (no `userns-remap`, not rootless);
/// the caller decides that. Supplementary groups of the image's user are not known here.
pub fn check_workspace_access(
    path: &Path,
    access: Access,
    uid: u32,
    gid: u32,
    mode: u32,
    owner: (u32, u32),
) -> Result<(), SpecError> {
    // r-x, and w for a read-write grant.
    let need = if access == Access::ReadWrite { 0o7 } else { 0o5 };
    let has = |bits: u32| bits & need == need;
    let allowed = if uid == owner.0 {
        has(mode >> 6)
    } else if gid == owner.1 {
        has(mode >> 3)
    } else {
        has(mode >> 3) || has(mode)
    };
    if allowed {
        return Ok(());
    }
    let what = if access == Access::ReadWrite { "read and write" } else { "read" };
    let fix = if access == Access::ReadWrite {
        format!("chown {uid}:{gid} it or chmod o+rwx it")
    } else {
        "chmod o+rx it".to_owned()
    };
    Err(SpecError::Workspace {
        path: path.display().to_string(),
        why: format!(
            "the container's user {uid}:{gid} cannot {what} it (owner {}:{}, mode {:04o}): a one-shot docker run \
             bind-mounts the directory, as `docker run --user` does; {fix}, or use the process tier (it maps \
             the directory to the guest's user) or a `DockerPool` (it copies the workspace in and out)",
            owner.0,
            owner.1,
            mode & 0o7777
        ),
    })
}

/// The tmpfs option that caps the volume's entries (the volume root counts as one).
pub(crate) fn entry_count_option() -> String {
    format!("nr_inodes={}", crate::stage::MAX_ENTRIES + 1)
}
