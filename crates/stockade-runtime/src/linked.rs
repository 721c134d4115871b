//! What a dynamically linked host program needs to run in an image that lacks it: its
//! dynamic loader (the ELF `PT_INTERP`) and the shared objects that loader resolves for it,
//! as the loader itself lists them (`LOADER --list PROGRAM`, which maps the objects and runs
//! none of the program's code: `ldd`'s own method).

use std::io::{self, Read as _};
use std::path::{Path, PathBuf};

/// The most bytes of a program read to find its interpreter: the ELF header and program
/// headers sit at its start.
const MAX_HEADERS: u64 = 64 << 10;

/// The most bytes of `--list` output read.
const MAX_LIST: u64 = 64 << 10;

/// A program's runtime: its loader and each shared object it needs, by the name the loader
/// looks for (the `DT_NEEDED` soname) and the host file behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Linked {
    pub(crate) loader: PathBuf,
    pub(crate) objects: Vec<(String, PathBuf)>,
}

/// The interpreter of the ELF file at `path`, or `None` if it has none (a static program) or
/// is not an ELF file (a script, which its `#!` line runs).
pub(crate) fn interpreter(path: &Path) -> io::Result<Option<PathBuf>> {
    let mut head = Vec::new();
    std::fs::File::open(path)?.take(MAX_HEADERS).read_to_end(&mut head)?;
    interpreter_of(&head).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// [`interpreter`] of a file's first bytes.
pub(crate) fn interpreter_of(head: &[u8]) -> Result<Option<PathBuf>, String> {
    if !head.starts_with(b"\x7fELF") {
        return Ok(None);
    }
    // 64-bit, little-endian: the only kind this host's loader runs.
    if head.get(4..6) != Some(&[2, 1]) {
        return Err("not a 64-bit little-endian ELF file".into());
    }
    let u16_at = |at: usize| head.get(at..at + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |at: usize| head.get(at..at + 4).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes);
    let u64_at = |at: usize| head.get(at..at + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
    let short = || "the ELF headers are cut short".to_owned();
    let phoff = usize::try_from(u64_at(0x20).ok_or_else(short)?).map_err(|_| short())?;
    let phentsize = usize::from(u16_at(0x36).ok_or_else(short)?);
    let phnum = usize::from(u16_at(0x38).ok_or_else(short)?);
    for i in 0..phnum {
        let at = phoff.checked_add(i.checked_mul(phentsize).ok_or_else(short)?).ok_or_else(short)?;
        const PT_INTERP: u32 = 3;
        if u32_at(at).ok_or_else(short)? != PT_INTERP {
            continue;
        }
        let offset = usize::try_from(u64_at(at + 8).ok_or_else(short)?).map_err(|_| short())?;
        let size = usize::try_from(u64_at(at + 0x20).ok_or_else(short)?).map_err(|_| short())?;
        let bytes = head.get(offset..offset.checked_add(size).ok_or_else(short)?).ok_or_else(short)?;
        let name = bytes.split(|b| *b == 0).next().unwrap_or_default();
        let name = std::str::from_utf8(name).map_err(|_| "the ELF interpreter is not UTF-8".to_owned())?;
        if !name.starts_with('/') {
            return Err(format!("the ELF interpreter {name:?} is not an absolute path"));
        }
        return Ok(Some(PathBuf::from(name)));
    }
    Ok(None)
}

/// The runtime of the program at `path`, or `None` if it needs none: the host's loader asked
/// to list it, in an empty environment (no `LD_*` variable of the caller's steers it).
pub(crate) fn resolve(path: &Path) -> io::Result<Option<Linked>> {
    let Some(loader) = interpreter(path)? else { return Ok(None) };
    let out = std::process::Command::new(&loader)
        .arg("--list")
        .arg(path)
        .env_clear()
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("running its loader {}: {e}", loader.display())))?;
    let text = String::from_utf8_lossy(&out.stdout[..out.stdout.len().min(MAX_LIST as usize)]);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(io::Error::other(format!(
            "its loader {} cannot load it ({}): {}",
            loader.display(),
            out.status,
            err.trim()
        )));
    }
    let objects = objects_in(&text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok(Some(Linked { loader, objects }))
}

/// The `NAME => PATH` pairs of a loader's `--list` output; the loader's own line and the
/// kernel's vDSO have no `=>` and are left out. A library the loader did not find is an error.
pub(crate) fn objects_in(text: &str) -> Result<Vec<(String, PathBuf)>, String> {
    let mut objects = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let Some((name, rest)) = line.split_once(" => ") else { continue };
        let path = rest.rsplit_once(" (0x").map_or(rest, |(p, _)| p).trim();
        if path == "not found" || !path.starts_with('/') {
            return Err(format!("the loader does not find {name}"));
        }
        objects.push((name.to_owned(), PathBuf::from(path)));
    }
    Ok(objects)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly")]
mod tests;
