//! A confined agent's channel: one conversation's history and one workspace, kept on the
//! host under `ROOT/channels/NAME/` (`ROOT` is stockade's state directory in the CLI).
//!
//! ```text
//! ROOT/channels/NAME/            0700
//!                    state.json  0600  the history (the host's; never in a mount)
//!                    workspace/  0700  the loop's workspace, bound read-write at /workspace
//! ```
//!
//! The loop sees its workspace and nothing else of the channel: the state file is beside the
//! workspace, never inside it, which [`Channel::open`] checks on the real paths (the workspace
//! a directory, not a symlink; the state file, resolved, not under the workspace, resolved),
//! and reads and writes without following a symlink. Another channel's files are in no run's
//! view. The history is bounded ([`MAX_HISTORY`]), the oldest dropped first, and written
//! whole to a new file renamed over the old one, so a crash leaves the old or the new.

use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use stockade_protocol::turn::{MAX_HISTORY, MAX_TURN_TEXT, Role, Said};

/// Longest state file read: the history's bound, with room for JSON's escapes.
const MAX_STATE_BYTES: u64 = (MAX_HISTORY * MAX_TURN_TEXT * 6 + 4096) as u64;

/// A channel could not be opened, read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChannelError {
    /// The name is not `[a-zA-Z0-9_.-]{1,64}`, or starts with a dot.
    #[error("invalid channel name {0:?}: 1-64 bytes of [a-zA-Z0-9_.-], not starting with a dot")]
    Name(String),
    /// The state file would be visible to the loop, or a path is not what it must be.
    #[error("channel {name}: {reason}")]
    Layout {
        /// The channel.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A file operation failed.
    #[error("channel {name}: {path}: {source}")]
    Io {
        /// The channel.
        name: String,
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// One channel, opened.
#[derive(Debug, Clone)]
pub struct Channel {
    name: String,
    dir: PathBuf,
}

impl Channel {
    /// Opens (creating, mode 0700) the channel `name` under `root/channels`, and checks that
    /// its state file is outside its workspace.
    pub fn open(root: &Path, name: &str) -> Result<Self, ChannelError> {
        let ok = !name.is_empty()
            && name.len() <= 64
            && !name.starts_with('.')
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !ok {
            return Err(ChannelError::Name(name.to_owned()));
        }
        let channel = Self { name: name.to_owned(), dir: root.join("channels").join(name) };
        let workspace = channel.workspace();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&workspace)
            .map_err(|e| channel.io(&workspace, e))?;
        channel.check()?;
        Ok(channel)
    }

    /// The channel's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The loop's workspace (bound read-write into each turn's run).
    #[must_use]
    pub fn workspace(&self) -> PathBuf {
        self.dir.join("workspace")
    }

    /// The history's file (never in any run's view).
    #[must_use]
    pub fn state_path(&self) -> PathBuf {
        self.dir.join("state.json")
    }

    fn io(&self, path: &Path, source: std::io::Error) -> ChannelError {
        ChannelError::Io { name: self.name.clone(), path: path.to_path_buf(), source }
    }

    fn layout(&self, reason: impl Into<String>) -> ChannelError {
        ChannelError::Layout { name: self.name.clone(), reason: reason.into() }
    }

    /// The path rule: the workspace is a directory of its own (no symlink), and the state
    /// file, resolved, is not under the workspace, resolved.
    fn check(&self) -> Result<(), ChannelError> {
        let workspace = self.workspace();
        for p in [&self.dir, &workspace] {
            let meta = std::fs::symlink_metadata(p).map_err(|e| self.io(p, e))?;
            if !meta.is_dir() {
                return Err(self.layout(format!("{} is not a directory (a symlink?)", p.display())));
            }
        }
        let real_dir = std::fs::canonicalize(&self.dir).map_err(|e| self.io(&self.dir, e))?;
        let real_workspace = std::fs::canonicalize(&workspace).map_err(|e| self.io(&workspace, e))?;
        let state = real_dir.join("state.json");
        if state.starts_with(&real_workspace) || real_workspace == real_dir || !real_workspace.starts_with(&real_dir) {
            return Err(self.layout(format!(
                "the state file {} would be inside the workspace {}",
                state.display(),
                real_workspace.display()
            )));
        }
        Ok(())
    }

    /// The conversation so far, oldest first (empty for a new channel).
    pub fn history(&self) -> Result<Vec<Said>, ChannelError> {
        let path = self.state_path();
        // The channel's directory is in no run's view and only its user can enter it; a
        // symlink there is still refused, not followed.
        if std::fs::symlink_metadata(&path).is_ok_and(|m| !m.is_file()) {
            return Err(self.layout("the state file is not a regular file"));
        }
        let file = std::fs::File::open(&path);
        let mut file = match file {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(self.io(&path, e)),
        };
        let mut bytes = Vec::new();
        Read::by_ref(&mut file).take(MAX_STATE_BYTES + 1).read_to_end(&mut bytes).map_err(|e| self.io(&path, e))?;
        if bytes.len() as u64 > MAX_STATE_BYTES {
            return Err(self.layout("the state file is over its bound"));
        }
        let history: Vec<Said> =
            serde_json::from_slice(&bytes).map_err(|e| self.layout(format!("the state file: {e}")))?;
        Ok(history)
    }

    /// Appends one exchange (the message, the answer) to the history, keeping the latest
    /// [`MAX_HISTORY`] entries, each cut to [`MAX_TURN_TEXT`] bytes. `untrusted`: the turn
    /// read untrusted output (the host's word), so the answer is kept as untrusted, and every
    /// later turn of the channel starts as having read untrusted data.
    pub fn record(&self, message: &str, answer: &str, untrusted: bool) -> Result<(), ChannelError> {
        let mut history = self.history()?;
        history.push(Said::new(Role::User, stockade_protocol::completion::cut(message, MAX_TURN_TEXT)));
        let said = Said::new(Role::Assistant, stockade_protocol::completion::cut(answer, MAX_TURN_TEXT));
        history.push(if untrusted { said.untrusted() } else { said });
        let drop = history.len().saturating_sub(MAX_HISTORY);
        history.drain(..drop);
        self.check()?;
        let path = self.state_path();
        let tmp = self.dir.join(format!(".state.{}.tmp", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let write = || -> std::io::Result<()> {
            // `create_new` is O_EXCL: never through a symlink.
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
            f.write_all(&serde_json::to_vec(&history).unwrap_or_default())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            self.io(&path, e)
        })
    }

    /// Gives the workspace (the directory itself; what the loop writes in it is the loop's)
    /// to the user a tier runs the loop as: a one-shot docker run binds the directory into a
    /// container of that uid and gid, which must be able to write it. The channel's own
    /// directory must be its owner's alone (no access for group or others), so no host
    /// process of that uid reaches the workspace through it; the state file stays the
    /// owner's. Needs the right to chown (root). [`reset`](Self::reset) gives it back.
    pub fn share_workspace(&self, uid: u32, gid: u32) -> Result<(), ChannelError> {
        self.check()?;
        let mode = std::fs::symlink_metadata(&self.dir).map_err(|e| self.io(&self.dir, e))?.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(self.layout(format!(
                "{} has mode {:o}: a channel's directory is its owner's alone before its workspace is shared",
                self.dir.display(),
                mode & 0o777
            )));
        }
        let workspace = self.workspace();
        // `check` saw a directory, not a symlink; lchown never follows one planted since.
        std::os::unix::fs::lchown(&workspace, Some(uid), Some(gid)).map_err(|e| self.io(&workspace, e))
    }

    /// Starts the channel over: the history and everything in the workspace are removed.
    pub fn reset(&self) -> Result<(), ChannelError> {
        let path = self.state_path();
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(self.io(&path, e)),
            _ => {}
        }
        let workspace = self.workspace();
        // remove_dir_all does not follow symlinks inside the tree (it removes the links).
        std::fs::remove_dir_all(&workspace).map_err(|e| self.io(&workspace, e))?;
        std::fs::DirBuilder::new().mode(0o700).create(&workspace).map_err(|e| self.io(&workspace, e))?;
        self.check()
    }
}
