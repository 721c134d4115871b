//! The local session API's messages (`stockade serve` on its unix socket, `stockade
//! session ...` as its client): one request frame, one reply frame, each a JSON object
//! with no unknown keys, in [`SESSION_CODEC`]'s length-prefixed frames.

use serde::{Deserialize, Serialize};

use crate::Report;

/// Largest file the session API's `write` and `read` move in one call: 8 MiB.
pub const MAX_FILE_BYTES: u64 = 8 << 20;

/// The frames of the session API: up to 40 MiB, enough for a file of [`MAX_FILE_BYTES`]
/// whose bytes are not UTF-8 (each byte then a JSON number and a comma).
pub const SESSION_CODEC: crate::FrameCodec = crate::FrameCodec::new(40 << 20);

/// A request to the session owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum SessionCall {
    /// Make a session.
    Create {
        /// The session's memory, bytes.
        memory_bytes: Option<u64>,
        /// The session's processes.
        processes: Option<u32>,
        /// A host workspace: its path and whether it is writable.
        workspace: Option<(String, bool)>,
        /// Idle timeout, seconds.
        idle_timeout_secs: Option<u64>,
        /// Maximum lifetime, seconds.
        max_lifetime_secs: Option<u64>,
        /// A snapshot file whose files the home starts with.
        #[serde(default)]
        from_snapshot: Option<String>,
        /// The docker tier with this image (local), instead of the process tier.
        #[serde(default)]
        docker_image: Option<String>,
        /// The network grant's rules (`HOST[:PORT]`, as `stockade run --allow-net`).
        #[serde(default)]
        allow_net: Vec<String>,
        /// Names pinned to addresses for the network grant (`NAME:PORT:IP`, as
        /// `--net-resolve`).
        #[serde(default)]
        net_resolve: Vec<String>,
        /// The session's environment: every exec's, unless it sets the variable itself.
        #[serde(default)]
        env: Vec<(String, String)>,
        /// The size of the session's home, bytes (a write past it fails).
        #[serde(default)]
        disk_bytes: Option<u64>,
    },
    /// Run a command in a session.
    Exec {
        /// The session.
        id: String,
        /// Program and arguments.
        argv: Vec<String>,
        /// Environment (the exec's alone).
        env: Vec<(String, String)>,
        /// Working directory in the view.
        cwd: Option<String>,
        /// Bytes for stdin.
        #[serde(with = "crate::bytes_repr", default)]
        stdin: Vec<u8>,
        /// Wall-clock deadline, milliseconds.
        timeout_ms: Option<u64>,
    },
    /// Start a command in the background of a session: the reply is `started` with its pid
    /// as soon as it runs; `attach` streams its output, `input`, `signal` and `resize` act
    /// on it.
    Start {
        /// The session.
        id: String,
        /// Program and arguments.
        argv: Vec<String>,
        /// Environment (the exec's alone).
        env: Vec<(String, String)>,
        /// Working directory in the view.
        cwd: Option<String>,
        /// Wall-clock deadline, milliseconds.
        timeout_ms: Option<u64>,
        /// A pseudo-terminal of this size (rows, columns) as its stdio.
        #[serde(default)]
        pty: Option<(u16, u16)>,
        /// Keep its stdin open for `input` (else it reads `/dev/null`; a pty always takes
        /// input).
        #[serde(default)]
        stdin: bool,
        /// A name for it, listed with it.
        #[serde(default)]
        tag: Option<String>,
    },
    /// Stream a background exec's output (its latest output first if `replay`), as
    /// `stdout` and `stderr` frames, then its end: `ran`.
    Attach {
        /// The session.
        id: String,
        /// The exec.
        pid: u32,
        /// Send what it wrote before (its latest 1 MiB) first.
        #[serde(default)]
        replay: bool,
    },
    /// Write to a background exec's stdin, or close it.
    Input {
        /// The session.
        id: String,
        /// The exec.
        pid: u32,
        /// The bytes.
        #[serde(with = "crate::bytes_repr", default)]
        data: Vec<u8>,
        /// Close its stdin after these bytes.
        #[serde(default)]
        close: bool,
    },
    /// Send a signal to a background exec's process group.
    Signal {
        /// The session.
        id: String,
        /// The exec.
        pid: u32,
        /// The signal's number.
        signal: i32,
    },
    /// Set a background exec's terminal size.
    Resize {
        /// The session.
        id: String,
        /// The exec.
        pid: u32,
        /// Rows.
        rows: u16,
        /// Columns.
        cols: u16,
    },
    /// List a session's background execs, running and ended.
    Jobs {
        /// The session.
        id: String,
    },
    /// List the live sessions.
    List,
    /// End a session.
    Kill {
        /// The session.
        id: String,
    },
    /// List a session's processes.
    Ps {
        /// The session.
        id: String,
    },
    /// Pause a session (every process frozen; no exec until it resumes).
    Pause {
        /// The session.
        id: String,
    },
    /// Resume a paused session.
    Resume {
        /// The session.
        id: String,
    },
    /// Write a session's filesystem-only snapshot (its home) to a new file.
    Snapshot {
        /// The session.
        id: String,
        /// The file to write (absolute; it must not exist).
        path: String,
    },
    /// Read a file of a session.
    Read {
        /// The session.
        id: String,
        /// The path in the guest's view.
        path: String,
    },
    /// Write a file of a session.
    Write {
        /// The session.
        id: String,
        /// The path in the guest's view.
        path: String,
        /// The file's bytes.
        #[serde(with = "crate::bytes_repr")]
        data: Vec<u8>,
    },
}

/// One live session, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionInfo {
    /// Its id.
    pub id: String,
    /// Seconds since it was made.
    pub age_secs: u64,
    /// Seconds since its last exec or files call.
    pub idle_secs: u64,
    /// Whether it is paused.
    pub paused: bool,
}

/// One process of a session, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionProcessInfo {
    /// Its pid inside the session.
    pub pid: u32,
    /// Its command line.
    pub cmd: String,
}

/// One background exec of a session, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecInfo {
    /// Its pid inside the session.
    pub pid: u32,
    /// Its command.
    pub argv: Vec<String>,
    /// Its tag.
    pub tag: Option<String>,
    /// Its working directory, if one was named.
    pub cwd: Option<String>,
    /// Whether it has a terminal.
    pub pty: bool,
    /// Whether it is still running.
    pub running: bool,
}

/// The owner's reply: one frame, except for an exec and an attach, whose `stdout` and
/// `stderr` chunks come as they are written, each its own frame, before the `ran` frame that
/// ends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum SessionReply {
    /// A session was made.
    Created {
        /// Its id.
        id: String,
    },
    /// An exec wrote this to its stdout (as it came).
    Stdout(#[serde(with = "crate::bytes_repr")] Vec<u8>),
    /// An exec wrote this to its stderr (as it came).
    Stderr(#[serde(with = "crate::bytes_repr")] Vec<u8>),
    /// An exec ended: its report (whose stdout and stderr repeat what the chunks carried).
    Ran(Box<Report>),
    /// A background exec runs, with this pid in the session.
    Started {
        /// Its pid.
        pid: u32,
    },
    /// A session's background execs.
    Execs(Vec<ExecInfo>),
    /// The live sessions.
    Sessions(Vec<SessionInfo>),
    /// A session's processes.
    Processes(Vec<SessionProcessInfo>),
    /// Done, nothing to return.
    Done,
    /// A file's bytes.
    Data(#[serde(with = "crate::bytes_repr")] Vec<u8>),
    /// The call failed: one line.
    Error {
        /// What kind of failure: `not_found`, `invalid`, `denied`, `busy`, `unsupported`
        /// or `internal`.
        kind: String,
        /// The line.
        message: String,
    },
}
