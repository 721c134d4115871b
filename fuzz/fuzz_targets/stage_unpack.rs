//! The docker tier's apply-back: the tar a guest controls, applied to a host directory.
//! Arbitrary bytes must never panic, never write outside the destination (a sibling
//! directory and a symlink to it are watched), never write under `.git`, through the
//! in-workspace link to `.git`, or onto a host symlink, and never leave a setuid bit.
#![no_main]

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use stockade_hostfs::stage::{StageError, unpack};

fn base() -> &'static PathBuf {
    static BASE: OnceLock<PathBuf> = OnceLock::new();
    BASE.get_or_init(|| {
        // `cargo xtask fuzz` names a scratch directory it removes when the run ends (libFuzzer
        // exits without running destructors). Otherwise a tmpfs when there is one: every
        // input gets a fresh destination.
        let tmp = std::env::var_os("STOCKADE_FUZZ_SCRATCH").map(PathBuf::from).unwrap_or_else(|| {
            Some(PathBuf::from("/dev/shm")).filter(|p| p.is_dir()).unwrap_or_else(std::env::temp_dir)
        });
        let b = tmp.join(format!("stockade-fuzz-unpack-{}", std::process::id()));
        let _ = fs::remove_dir_all(&b);
        fs::create_dir_all(b.join("outside")).expect("outside");
        fs::write(b.join("outside/canary"), "canary").expect("canary");
        b
    })
}

fn fresh_dest(base: &Path) -> PathBuf {
    let dest = base.join("dest");
    let _ = fs::remove_dir_all(&dest);
    fs::create_dir_all(dest.join(".git/hooks")).expect("dest");
    fs::write(dest.join(".git/config"), "host").expect("config");
    fs::write(dest.join("same.txt"), "same").expect("same");
    symlink("../outside", dest.join("out")).expect("link");
    symlink(".git", dest.join("alias")).expect("alias");
    symlink("../outside/victim", dest.join("victim")).expect("victim");
    dest
}

/// Every entry below `dir`, without following links: (path, is a link, mode).
fn walk(dir: &Path, out: &mut Vec<(PathBuf, bool, u32)>) {
    for e in fs::read_dir(dir).expect("read_dir") {
        let e = e.expect("entry");
        let m = fs::symlink_metadata(e.path()).expect("meta");
        out.push((e.path(), m.file_type().is_symlink(), m.permissions().mode()));
        if m.is_dir() {
            walk(&e.path(), out);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let base = base();
    let dest = fresh_dest(base);
    match unpack(data, &dest) {
        Ok(_) | Err(StageError::Archive(_)) => {}
        Err(e) => panic!("unexpected error kind: {e}"),
    }
    let outside: Vec<_> = fs::read_dir(base.join("outside")).expect("outside").collect();
    assert_eq!(outside.len(), 1, "something was written outside the destination");
    assert_eq!(fs::read_to_string(base.join("outside/canary")).expect("canary"), "canary");
    assert_eq!(fs::read_dir(base).expect("base").count(), 2, "a sibling of the destination appeared");
    assert_eq!(fs::read_to_string(dest.join(".git/config")).expect("config"), "host");
    assert_eq!(fs::read_dir(dest.join(".git/hooks")).expect("hooks").count(), 0, "a hook was written");
    let mut all = Vec::new();
    walk(&dest, &mut all);
    for (path, link, mode) in all {
        let name = path.strip_prefix(&dest).expect("below").to_string_lossy().into_owned();
        if link {
            assert!(["out", "alias", "victim"].contains(&name.as_str()), "a symlink was created: {name}");
        }
        assert_eq!(mode & 0o7000, 0, "{name} has mode {mode:o}");
    }
});
