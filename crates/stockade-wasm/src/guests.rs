//! Where the prebuilt guests live.
//!
//! `cargo xtask guests` builds the JavaScript guest (QuickJS-ng for WASI, from source, with
//! Debian's clang) and installs it as `quickjs-eval.wasm` in the guest directory:
//! `$STOCKADE_GUESTS_DIR` if set, else `$XDG_CACHE_HOME/stockade/guests`, else
//! `~/.cache/stockade/guests`. A guest is WebAssembly, so a tampered file can only make
//! its own runs wrong; it is still compiled by this crate and sandboxed like any module.

use std::path::{Path, PathBuf};

use crate::WasmError;

/// The JavaScript guest's file name in the guest directory.
pub const JAVASCRIPT_FILE: &str = "quickjs-eval.wasm";

/// The JavaScript guest's entry point: `run() -> i32`, the exit code.
pub const JAVASCRIPT_ENTRY: &str = "run";

/// The guest directory (see the module docs), if one can be named.
#[must_use]
pub fn dir() -> Option<PathBuf> {
    let abs = |v: std::ffi::OsString| Path::new(&v).is_absolute().then(|| PathBuf::from(v));
    if let Some(d) = std::env::var_os("STOCKADE_GUESTS_DIR").and_then(abs) {
        return Some(d);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .and_then(abs)
        .or_else(|| std::env::var_os("HOME").and_then(abs).map(|h| h.join(".cache")))?;
    Some(base.join("stockade").join("guests"))
}

/// The JavaScript guest, if it has been built.
pub fn javascript() -> Result<PathBuf, WasmError> {
    let Some(dir) = dir() else {
        return Err(WasmError::Unsupported {
            mechanism: "javascript guest".into(),
            reason: "no guest directory: set STOCKADE_GUESTS_DIR or HOME".into(),
        });
    };
    let path = dir.join(JAVASCRIPT_FILE);
    if path.is_file() {
        Ok(path)
    } else {
        Err(WasmError::Unsupported {
            mechanism: "javascript guest".into(),
            reason: format!("{} is missing: build it with `cargo xtask guests`", path.display()),
        })
    }
}
