//! What to run: a [`Job`] names the program, its inputs, its workspace and its [`Limits`].
//!
//! A job is built by host code (or parsed from a host-side document) and handed to a tier.
//! Every field that ends up in an `execve` call or an environment block is checked here:
//! no NUL bytes, no `=` in variable names, and counts and sizes under named bounds.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::limits::Limits;

/// Most stdin bytes a job may carry: 16 MiB.
///
/// Stdin is held in host memory for the whole run.
pub const MAX_STDIN_BYTES: usize = 16 << 20;
/// Most environment variables a job may grant: 128.
pub const MAX_ENV_VARS: usize = 128;
/// Most arguments a job may pass: 4096.
pub const MAX_ARGS: usize = 4096;
/// Longest single argument, program name, variable name or value: 128 KiB (Linux's `MAX_ARG_STRLEN`).
pub const MAX_ARG_BYTES: usize = 128 << 10;

/// How the workspace is granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// The guest may read the workspace and write nothing in it.
    ReadOnly,
    /// The guest may read, create, modify and delete inside the workspace.
    ReadWrite,
}

/// What a run does when another run holds its workspace: a read-write run holds its
/// workspace and every directory inside it alone (and keeps read-write runs of a directory
/// above it out), from the moment it opens the workspace until its sweep is done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Busy {
    /// Wait until the other run is done (the default: a shell's second command waits for
    /// the first, as `flock(1)` does).
    #[default]
    Wait,
    /// Refuse the run at once, naming the held workspace (`stockade run --no-wait`).
    Refuse,
}

impl Busy {
    fn is_wait(&self) -> bool {
        *self == Self::Wait
    }
}

/// Paths inside a read-write workspace that a tier never lets the guest create or change on
/// the host, because the host would later run or trust what they say: git's hooks and
/// configuration (not its history: objects, refs, the index and `HEAD` stay writable, so
/// `git commit` works), shell and direnv start-up files, tool configuration that runs code
/// or holds credentials, editor and agent settings, and credential directories. Reviewed
/// against sandbox-runtime's and Codex's lists. Each tier enforces it its own way (see
/// `stockade-hostfs`); the list is here so that they agree.
pub const PROTECTED_PATHS: &[&str] = &[
    // git: what runs or configures.
    ".git/hooks",
    ".git/config",
    ".git/config.worktree",
    ".git/info",
    ".git/modules",
    ".git/worktrees",
    ".gitmodules",
    ".gitconfig",
    // Shells and direnv.
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zprofile",
    ".zshenv",
    ".zlogin",
    ".envrc",
    // Tools that run code or read credentials from the project.
    ".ripgreprc",
    ".npmrc",
    ".yarnrc",
    ".yarnrc.yml",
    ".pypirc",
    ".netrc",
    // Editors and agents.
    ".vscode",
    ".idea",
    ".claude",
    ".codex",
    ".cursor",
    ".mcp.json",
    // Credentials and cluster configuration.
    ".aws",
    ".ssh",
    ".docker",
    ".kube",
    // Other version control, build and toolchain configuration that runs code
    // (Mercurial hooks, cargo's build settings and runners, dev containers' commands,
    // mise and asdf's tool lists and tasks).
    ".hg/hgrc",
    ".cargo/config",
    ".cargo/config.toml",
    ".devcontainer",
    "mise.toml",
    ".mise.toml",
    ".tool-versions",
];

/// The top-level entries of a pinned `.git` directory that the guest may create and change:
/// what `git commit`, `git checkout`, `git merge` and `git fetch` of a local remote write
/// (history, refs, the index, the head and their lock files). Every other new top-level
/// entry of `.git` is protected: git reads names there that redirect it elsewhere or run
/// code (`commondir` points git at another directory's `config` and `hooks`), so the list
/// of what may be written is closed, not the list of what may not. A name ending in `.lock`
/// (git's lock files, renamed over their target once written) is writable too.
pub const GIT_WRITABLE: &[&str] = &[
    "objects",
    "refs",
    "logs",
    "HEAD",
    "index",
    "ORIG_HEAD",
    "FETCH_HEAD",
    "COMMIT_EDITMSG",
    "packed-refs",
    "MERGE_HEAD",
    "MERGE_MSG",
    "MERGE_MODE",
    "MERGE_RR",
    "AUTO_MERGE",
    "CHERRY_PICK_HEAD",
    "REVERT_HEAD",
    "REBASE_HEAD",
    "rebase-merge",
    "rebase-apply",
    "sequencer",
    "rr-cache",
    "description",
    "branches",
    "shallow",
    "gc.pid",
    "gc.log",
    "lfs",
];

/// Whether the path `rel`, relative to a workspace's root, is protected: on or under a
/// [`PROTECTED_PATHS`] entry, or under `.git` but not under one of its [`GIT_WRITABLE`]
/// entries (or a lock file). `.git` itself is not: it is pinned. The one rule every tier
/// and the staged apply-back use.
#[must_use]
pub fn is_protected(rel: &std::path::Path) -> bool {
    use std::path::Component;
    if PROTECTED_PATHS.iter().any(|p| rel.starts_with(p)) {
        return true;
    }
    let mut parts = rel.components();
    match (parts.next(), parts.next()) {
        (Some(Component::Normal(git)), Some(Component::Normal(top))) if git == ".git" => !git_writable(top),
        _ => false,
    }
}

/// Whether `name`, a top-level entry of `.git`, is one the guest may write ([`GIT_WRITABLE`]).
#[must_use]
pub fn git_writable(name: &std::ffi::OsStr) -> bool {
    GIT_WRITABLE.iter().any(|w| name == *w) || name.as_encoded_bytes().ends_with(b".lock")
}

/// Directories that hold [`PROTECTED_PATHS`]: a tier pins each one that exists in place
/// (writable, but not removable or renamable), so the guest cannot move it aside and put its
/// own in its place. A `.git` that is a file (a gitfile) is protected whole instead.
pub const PINNED_DIRS: &[&str] = &[".git"];

/// The host directory granted to the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workspace {
    path: PathBuf,
    access: Access,
    #[serde(default, skip_serializing_if = "Busy::is_wait")]
    busy: Busy,
}

impl Workspace {
    /// A grant of the host directory `path` (absolute) with `access`, and what a run does if
    /// another run holds it: what [`Job::with_workspace_when_busy`] grants, for a holder
    /// that is not one job (a session).
    pub fn new(path: impl Into<PathBuf>, access: Access, busy: Busy) -> Result<Self, JobError> {
        let path = path.into();
        if !path.is_absolute() {
            return Err(JobError::RelativeWorkspace { path });
        }
        let text = path.to_str().ok_or(JobError::NotUtf8 { field: "workspace" })?;
        check_str("workspace", text, false)?;
        Ok(Self { path, access, busy })
    }

    /// The host path of the workspace. A tier opens it; this crate never touches it.
    #[must_use]
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
    /// The access granted.
    #[must_use]
    pub fn access(&self) -> Access {
        self.access
    }
    /// What the run does when another run holds the workspace.
    #[must_use]
    pub fn busy(&self) -> Busy {
        self.busy
    }
}

/// One environment variable granted to the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvVar {
    key: String,
    value: String,
}

impl EnvVar {
    /// The variable's name.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }
    /// The variable's value.
    #[must_use]
    pub fn value(&self) -> &str {
        &self.value
    }
}

/// What kind of program the job runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum JobKind {
    /// A host executable, for the process tier.
    Command {
        /// The program (a path, or a name the tier resolves inside the sandbox view).
        program: String,
        /// Its arguments, without `argv[0]`.
        args: Vec<String>,
    },
    /// A WebAssembly module, for the wasm tier.
    Wasm {
        /// The module file on the host.
        module: PathBuf,
        /// The exported function to call (`_start` for a WASI command).
        entry: String,
        /// Its arguments, without `argv[0]`.
        args: Vec<String>,
    },
    /// A command in a container image, for the docker tier.
    Image {
        /// The image reference.
        image: String,
        /// The command and its arguments.
        command: Vec<String>,
    },
}

/// A job was malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JobError {
    /// A string contains a NUL byte, which cannot cross `execve`.
    #[error("{field} contains a NUL byte")]
    #[non_exhaustive]
    Nul {
        /// Which field.
        field: &'static str,
    },
    /// A path is not valid UTF-8, so it cannot be carried in a job document.
    #[error("{field} is not valid utf-8")]
    #[non_exhaustive]
    NotUtf8 {
        /// Which field.
        field: &'static str,
    },
    /// A required string is empty.
    #[error("{field} is empty")]
    #[non_exhaustive]
    Empty {
        /// Which field.
        field: &'static str,
    },
    /// An environment variable name contains `=`.
    #[error("environment variable name {key:?} contains '='")]
    #[non_exhaustive]
    EnvKey {
        /// The offending name.
        key: String,
    },
    /// The same environment variable was granted twice.
    #[error("environment variable {key:?} is granted twice")]
    #[non_exhaustive]
    DuplicateEnv {
        /// The repeated name.
        key: String,
    },
    /// A count or size is over its bound.
    #[error("{field} has {len}, more than the maximum of {max}")]
    #[non_exhaustive]
    TooLarge {
        /// Which field.
        field: &'static str,
        /// The count or size.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// The workspace path is not absolute.
    #[error("workspace path {path:?} is not absolute")]
    #[non_exhaustive]
    RelativeWorkspace {
        /// The path.
        path: PathBuf,
    },
}

/// One unit of untrusted work. Defaults: no stdin (`/dev/null`), an empty environment, no
/// workspace, and [`Limits::new`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "JobWire", into = "JobWire")]
pub struct Job {
    kind: JobKind,
    stdin: Vec<u8>,
    env: Vec<EnvVar>,
    workspace: Option<Workspace>,
    limits: Limits,
}

fn check_str(field: &'static str, s: &str, allow_empty: bool) -> Result<(), JobError> {
    if !allow_empty && s.is_empty() {
        return Err(JobError::Empty { field });
    }
    if s.len() > MAX_ARG_BYTES {
        return Err(JobError::TooLarge { field, len: s.len(), max: MAX_ARG_BYTES });
    }
    if s.contains('\0') {
        return Err(JobError::Nul { field });
    }
    Ok(())
}

fn check_args(field: &'static str, args: &[String]) -> Result<(), JobError> {
    if args.len() > MAX_ARGS {
        return Err(JobError::TooLarge { field, len: args.len(), max: MAX_ARGS });
    }
    args.iter().try_for_each(|a| check_str(field, a, true))
}

fn check_kind(kind: &JobKind) -> Result<(), JobError> {
    match kind {
        JobKind::Command { program, args } => {
            check_str("program", program, false)?;
            check_args("args", args)
        }
        JobKind::Wasm { module, entry, args } => {
            let module = module.to_str().ok_or(JobError::NotUtf8 { field: "module" })?;
            check_str("module", module, false)?;
            check_str("entry", entry, false)?;
            check_args("args", args)
        }
        JobKind::Image { image, command } => {
            check_str("image", image, false)?;
            check_args("command", command)
        }
    }
}

impl Job {
    /// A job that runs `program` with `args` in the process tier.
    pub fn command<I, S>(program: impl Into<String>, args: I) -> Result<Self, JobError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::new(JobKind::Command { program: program.into(), args: args.into_iter().map(Into::into).collect() })
    }

    /// A job that calls `entry` of the WebAssembly module at `module` with `args`.
    pub fn wasm<I, S>(module: impl Into<PathBuf>, entry: impl Into<String>, args: I) -> Result<Self, JobError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::new(JobKind::Wasm {
            module: module.into(),
            entry: entry.into(),
            args: args.into_iter().map(Into::into).collect(),
        })
    }

    /// A job that runs `command` in a container made from `image`.
    pub fn image<I, S>(image: impl Into<String>, command: I) -> Result<Self, JobError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::new(JobKind::Image { image: image.into(), command: command.into_iter().map(Into::into).collect() })
    }

    /// A job of the given kind with every default.
    pub fn new(kind: JobKind) -> Result<Self, JobError> {
        check_kind(&kind)?;
        Ok(Self { kind, stdin: Vec::new(), env: Vec::new(), workspace: None, limits: Limits::new() })
    }

    /// Feeds `bytes` to the guest's stdin (at most [`MAX_STDIN_BYTES`]).
    pub fn with_stdin(mut self, bytes: impl Into<Vec<u8>>) -> Result<Self, JobError> {
        let bytes = bytes.into();
        if bytes.len() > MAX_STDIN_BYTES {
            return Err(JobError::TooLarge { field: "stdin", len: bytes.len(), max: MAX_STDIN_BYTES });
        }
        self.stdin = bytes;
        Ok(self)
    }

    /// Grants one environment variable. Names must be non-empty, free of `=` and NUL, and unique.
    pub fn with_env(mut self, key: impl Into<String>, value: impl Into<String>) -> Result<Self, JobError> {
        let (key, value) = (key.into(), value.into());
        check_str("env key", &key, false)?;
        check_str("env value", &value, true)?;
        if key.contains('=') {
            return Err(JobError::EnvKey { key });
        }
        if self.env.iter().any(|v| v.key == key) {
            return Err(JobError::DuplicateEnv { key });
        }
        if self.env.len() >= MAX_ENV_VARS {
            return Err(JobError::TooLarge { field: "env", len: self.env.len() + 1, max: MAX_ENV_VARS });
        }
        self.env.push(EnvVar { key, value });
        Ok(self)
    }

    /// Grants the host directory `path` (absolute) as the workspace, with `access`.
    pub fn with_workspace(self, path: impl Into<PathBuf>, access: Access) -> Result<Self, JobError> {
        self.with_workspace_when_busy(path, access, Busy::Wait)
    }

    /// Grants the host directory `path` (absolute) as the workspace, with `access`, and says
    /// what the run does if another run holds it.
    pub fn with_workspace_when_busy(
        mut self,
        path: impl Into<PathBuf>,
        access: Access,
        busy: Busy,
    ) -> Result<Self, JobError> {
        self.workspace = Some(Workspace::new(path, access, busy)?);
        Ok(self)
    }

    /// Replaces the limits.
    #[must_use]
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// What to run.
    #[must_use]
    pub fn kind(&self) -> &JobKind {
        &self.kind
    }
    /// The stdin bytes (empty means `/dev/null`).
    #[must_use]
    pub fn stdin(&self) -> &[u8] {
        &self.stdin
    }
    /// The granted environment, in grant order.
    #[must_use]
    pub fn env(&self) -> &[EnvVar] {
        &self.env
    }
    /// The granted workspace, if any.
    #[must_use]
    pub fn workspace(&self) -> Option<&Workspace> {
        self.workspace.as_ref()
    }
    /// The limits.
    #[must_use]
    pub fn limits(&self) -> &Limits {
        &self.limits
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JobWire {
    kind: JobKind,
    #[serde(default, with = "crate::bytes_repr")]
    stdin: Vec<u8>,
    #[serde(default)]
    env: Vec<EnvVar>,
    #[serde(default)]
    workspace: Option<Workspace>,
    #[serde(default)]
    limits: Limits,
}

impl From<Job> for JobWire {
    fn from(j: Job) -> Self {
        Self { kind: j.kind, stdin: j.stdin, env: j.env, workspace: j.workspace, limits: j.limits }
    }
}

impl TryFrom<JobWire> for Job {
    type Error = JobError;
    fn try_from(w: JobWire) -> Result<Self, JobError> {
        let mut job = Job::new(w.kind)?.with_stdin(w.stdin)?.with_limits(w.limits);
        for var in w.env {
            job = job.with_env(var.key, var.value)?;
        }
        if let Some(ws) = w.workspace {
            job = job.with_workspace_when_busy(ws.path, ws.access, ws.busy)?;
        }
        Ok(job)
    }
}
