//! A read-write workspace's git refs, read before and after a run, so that what the guest
//! committed is reported (G6).
//!
//! The sweep removes a protected file the guest planted, but a guest may also commit it
//! (`git add -f .envrc && git commit`): the user's own `git checkout -- .` or `git reset
//! --hard` would then bring it back. Telling the user's commits from the guest's inside one
//! commit graph is not possible from the files alone, and reading the objects the guest
//! wrote would mean parsing hostile zlib streams and packs in the supervisor. So the refs
//! are compared instead: every ref the run created, moved or deleted is reported with its
//! old and new value, and the user is told how to review them (`git diff OLD NEW` over the
//! protected paths) before checking anything out.
//!
//! Read: `HEAD`, every file under `refs/` (a walk that never follows a symlink and holds
//! one descriptor per level), and `packed-refs` (a loose ref wins over a packed one, as in
//! git). Bounded: at most [`MAX_REFS`] refs, each value at most 256 bytes, `packed-refs` at
//! most [`MAX_PACKED_BYTES`]; past a bound the snapshot is marked incomplete and the
//! comparison says so instead of guessing. Every name and value shown is guest-written,
//! so it is shown escaped: no control byte reaches a terminal.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;

use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt};

/// Most refs a snapshot holds; a repository with more is compared as far as that.
pub const MAX_REFS: usize = 4096;

/// Largest `packed-refs` read.
pub const MAX_PACKED_BYTES: u64 = 8 << 20;

/// Largest value of one loose ref (or `HEAD`) read.
const MAX_VALUE: u64 = 256;

/// Deepest directory under `refs/` walked.
const MAX_DEPTH: usize = 32;

/// The refs of one `.git` at one moment.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Refs {
    refs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// A bound was reached: refs beyond it were not read.
    incomplete: bool,
}

impl Refs {
    /// Reads the refs of the git directory `git` (opened without following a symlink).
    pub(crate) fn read(git: &Dir) -> io::Result<Self> {
        let mut out = Self::default();
        if let Some(packed) = read_regular(git, OsStr::new("packed-refs"), MAX_PACKED_BYTES, &mut out.incomplete)? {
            for line in packed.split(|b| *b == b'\n') {
                if line.starts_with(b"#") || line.starts_with(b"^") {
                    continue;
                }
                if let Some(space) = line.iter().position(|b| *b == b' ') {
                    out.insert(line[space + 1..].to_vec(), line[..space].to_vec());
                }
            }
        }
        if let Some(head) = read_regular(git, OsStr::new("HEAD"), MAX_VALUE, &mut out.incomplete)? {
            out.insert(b"HEAD".to_vec(), head);
        }
        let refs = match super::stage::open_dir_nofollow(git, OsStr::new("refs")) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e),
        };
        // One entry per level: the directory and the names left in it.
        let mut stack: Vec<(Dir, Vec<u8>, Vec<std::ffi::OsString>)> = Vec::new();
        let names = super::list(&refs)?;
        stack.push((refs, b"refs".to_vec(), names));
        loop {
            let depth = stack.len();
            let Some((dir, prefix, names)) = stack.last_mut() else { break };
            let Some(name) = names.pop() else {
                stack.pop();
                continue;
            };
            let mut full = prefix.clone();
            full.push(b'/');
            full.extend_from_slice(name.as_bytes());
            let kind = dir.symlink_metadata(&name)?;
            if kind.is_dir() {
                if depth >= MAX_DEPTH {
                    out.incomplete = true;
                    continue;
                }
                let sub = super::stage::open_dir_nofollow(dir, &name)?;
                let names = super::list(&sub)?;
                stack.push((sub, full, names));
            } else if kind.is_file() {
                let mut cut = false;
                if let Some(value) = read_regular(dir, &name, MAX_VALUE, &mut cut)? {
                    out.incomplete |= cut;
                    out.insert(full, value);
                }
            } else {
                // A symlink (git's oldest symbolic refs) or anything else: its existence is
                // what is compared, never its target.
                out.insert(full, b"(not a regular file)".to_vec());
            }
        }
        Ok(out)
    }

    fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) {
        if self.refs.len() >= MAX_REFS && !self.refs.contains_key(&name) {
            self.incomplete = true;
            return;
        }
        let value = value.trim_ascii().to_vec();
        self.refs.insert(name, value);
    }

    /// Every ref created, moved or deleted between `self` (before the run) and `after`, one
    /// line each (`refs/heads/main 1f2e3d4c5b6a..0a1b2c3d4e5f`), escaped; and one more line
    /// if either snapshot stopped at a bound.
    pub(crate) fn moved(&self, after: &Self) -> Vec<String> {
        let mut out = Vec::new();
        let names: std::collections::BTreeSet<&Vec<u8>> = self.refs.keys().chain(after.refs.keys()).collect();
        for name in names {
            let (old, new) = (self.refs.get(name), after.refs.get(name));
            if old == new {
                continue;
            }
            let show = |v: Option<&Vec<u8>>| v.map_or_else(|| "(none)".to_owned(), |v| short(v));
            out.push(format!("{} {}..{}", escape(name), show(old), show(new)));
        }
        if self.incomplete || after.incomplete {
            out.push(format!(
                "(more than {MAX_REFS} refs, a ref directory deeper than {MAX_DEPTH}, or a ref file over its size cap: only what fits was compared)"
            ));
        }
        out
    }
}

/// A value as shown: a 40- or 64-digit object id cut to 12 digits, anything else escaped.
fn short(v: &[u8]) -> String {
    if (v.len() == 40 || v.len() == 64) && v.iter().all(u8::is_ascii_hexdigit) {
        return String::from_utf8_lossy(&v[..12]).into_owned();
    }
    escape(v)
}

/// Guest-written bytes, printable: ASCII graphic characters and spaces as they are,
/// anything else (controls, non-ASCII, a backslash) as `\xNN`, at most 200 characters.
fn escape(v: &[u8]) -> String {
    let mut s = String::new();
    for b in v.iter().take(200) {
        if (b.is_ascii_graphic() || *b == b' ') && *b != b'\\' {
            s.push(char::from(*b));
        } else {
            s.push_str(&format!("\\x{b:02x}"));
        }
    }
    if v.len() > 200 {
        s.push('…');
    }
    s
}

/// The contents of the regular file `name` in `dir`, read without following a symlink, at
/// most `cap` bytes (setting `cut` if there was more); none if it is absent or is not a
/// regular file.
fn read_regular(dir: &Dir, name: &OsStr, cap: u64, cut: &mut bool) -> io::Result<Option<Vec<u8>>> {
    let file = match dir.open_with(name, OpenOptions::new().read(true).custom_flags(super::stage::O_NOFOLLOW)) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        // ELOOP (Linux's 40): a symlink, which is never followed.
        Err(e) if e.raw_os_error() == Some(40) => return Ok(None),
        Err(e) => return Err(e),
    };
    if !file.metadata()?.is_file() {
        return Ok(None);
    }
    let mut buf = Vec::new();
    file.into_std().take(cap + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > cap {
        buf.truncate(usize::try_from(cap).unwrap_or(usize::MAX));
        *cut = true;
    }
    Ok(Some(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_shows_no_control_byte() {
        assert_eq!(escape(b"refs/heads/\x1b]52;c;x\x07"), "refs/heads/\\x1b]52;c;x\\x07");
        assert_eq!(short(b"0123456789abcdef0123456789abcdef01234567"), "0123456789ab");
        assert_eq!(short(b"ref: refs/heads/main"), "ref: refs/heads/main");
    }
}
