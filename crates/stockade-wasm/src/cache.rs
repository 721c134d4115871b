//! The compiled-module cache: the one place this crate uses `unsafe` (STYLE §5.1).
//!
//! `Module::deserialize_open_file` maps a file as machine code and trusts it completely, so
//! a file is loaded only if this crate could have written it and no one else could have:
//!
//! - the directory was created by us with mode 0700, and still is owned by us with no
//!   group or other permission bits;
//! - the name is not a symlink, and the opened file (checked on the descriptor, and the
//!   same inode as the name) is a regular file owned by us, writable by no one else;
//! - its name is the sha256 of (wasmtime's compatibility hash for this engine's
//!   configuration, a format tag, and the module's sha256), so a file compiled for another
//!   version, another configuration or another module is never looked up.
//!
//! Files are written to a temporary name in the same directory and renamed into place, so
//! a reader never sees a partial artifact. Any doubt means "compile instead": the cache is
//! an optimisation, never a requirement.

use std::fs::{self, File, OpenOptions};
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::{Engine, Module};

/// Largest compiled artifact the cache keeps: 64 MiB. A pre-initialized module carries the
/// memory its initializer left (a guest chooses how much), so without a cap one guest could
/// fill the cache's disk with one entry.
pub(crate) const MAX_ARTIFACT_BYTES: u64 = 64 << 20;

/// Most bytes of compiled artifacts kept: 2 GiB (the Python guest alone is about 350 MB).
const MAX_CACHE_BYTES: u64 = 2 << 30;

/// The default cache directory: `$XDG_CACHE_HOME/stockade/wasm` or `~/.cache/stockade/wasm`.
pub(crate) fn default_dir() -> Option<PathBuf> {
    Some(crate::guests::stockade_cache_dir()?.join("wasm"))
}

/// A usable cache directory, or none.
#[derive(Debug)]
pub(crate) struct Cache {
    dir: Option<PathBuf>,
    uid: u32,
}

/// What a cache key is made of.
pub(crate) struct Key {
    name: String,
}

impl Key {
    /// The key of `module_sha256` compiled (after `transform`) by `engine`.
    pub(crate) fn new(engine: &Engine, transform: &str, module_sha256: &[u8; 32]) -> Self {
        let mut h = Sha256::new();
        let mut compat = Sha256Hasher(Sha256::new());
        engine.precompile_compatibility_hash().hash(&mut compat);
        h.update(compat.0.finalize());
        h.update(b"\0stockade-wasm cache v1\0");
        h.update(transform.as_bytes());
        h.update(b"\0");
        h.update(module_sha256);
        Self { name: hex(&h.finalize()) }
    }
}

/// Feeds `Hash` output into sha256, so the key is stable across processes (unlike
/// `DefaultHasher`, whose seed is per process).
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn finish(&self) -> u64 {
        0
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

impl Cache {
    /// Opens (creating with mode 0700 if missing) `dir`; unusable directories disable the cache.
    pub(crate) fn open(dir: Option<PathBuf>) -> Self {
        let Some(dir) = dir else { return Self { dir: None, uid: 0 } };
        let _ = fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir);
        // Our uid, learnt from a file we create: std has no geteuid.
        let probe = dir.join(format!(".uid-probe-{}", std::process::id()));
        let uid = File::create(&probe).and_then(|f| f.metadata()).map(|m| m.uid());
        let _ = fs::remove_file(&probe);
        match (uid, fs::symlink_metadata(&dir)) {
            (Ok(uid), Ok(meta)) if meta.is_dir() && meta.uid() == uid && meta.permissions().mode() & 0o077 == 0 => {
                Self { dir: Some(dir), uid }
            }
            _ => Self { dir: None, uid: 0 },
        }
    }

    pub(crate) fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The module cached under `key`, if there is a trustworthy one.
    pub(crate) fn load(&self, engine: &Engine, key: &Key) -> Option<Module> {
        let file = self.open_trusted(key)?;
        // SAFETY: `deserialize_open_file` trusts the file's contents as machine code for
        // this engine. `open_trusted` returned it only if it is a regular file (not reached
        // through a symlink, checked on the open descriptor) owned by the current user and
        // writable by no one else, inside a directory owned by the current user with no
        // group or other access. Only this module writes there, and only the output of
        // `Module::serialize` for the engine configuration, wasmtime version and module
        // sha256 that the file name (`key`) commits to; wasmtime also rejects an artifact
        // from another version or configuration. So the bytes are ones this crate's own
        // compiler produced for this engine.
        #[allow(unsafe_code, reason = "the one allowed unsafe of stockade-wasm, STYLE §5.1")]
        let module = unsafe { Module::deserialize_open_file(engine, file) };
        module.ok()
    }

    fn open_trusted(&self, key: &Key) -> Option<File> {
        self.open_trusted_name(&format!("{}.cwasm", key.name))
    }

    fn open_trusted_name(&self, name: &str) -> Option<File> {
        let dir = self.dir.as_deref()?;
        let meta = fs::symlink_metadata(dir).ok()?;
        if !meta.is_dir() || meta.uid() != self.uid || meta.permissions().mode() & 0o077 != 0 {
            return None;
        }
        // lstat the name, open it, and require the opened file to be the same inode: a
        // symlink, or a swap between the two steps, is refused (std has no O_NOFOLLOW).
        let path = dir.join(name);
        let named = fs::symlink_metadata(&path).ok()?;
        if !named.is_file() {
            return None;
        }
        let file = File::open(&path).ok()?;
        let meta = file.metadata().ok()?;
        let same = meta.dev() == named.dev() && meta.ino() == named.ino();
        (same && meta.is_file() && meta.uid() == self.uid && meta.permissions().mode() & 0o022 == 0).then_some(file)
    }

    /// The module sha256 remembered under `index` (see `remember`), if any.
    pub(crate) fn recall(&self, index: &str) -> Option<[u8; 32]> {
        let file = self.open_trusted_name(&format!("{index}.sha256"))?;
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::Read::take(file, 128), &mut text).ok()?;
        let text = text.trim();
        if text.len() != 64 {
            return None;
        }
        let mut sha = [0u8; 32];
        for (i, byte) in sha.iter_mut().enumerate() {
            *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(sha)
    }

    /// Remembers that the file identified by `index` has the sha256 `sha`. A wrong entry
    /// can only make a run use another module this crate compiled, never foreign code.
    pub(crate) fn remember(&self, index: &str, sha: &[u8; 32]) {
        let Some(dir) = self.dir.as_deref() else { return };
        let tmp = dir.join(format!(".{index}.{}.tmp", std::process::id()));
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| f.write_all(hex(sha).as_bytes()));
        if written.is_err() || fs::rename(&tmp, dir.join(format!("{index}.sha256"))).is_err() {
            let _ = fs::remove_file(&tmp);
        }
    }

    /// Stores `module` under `key`. Failures are ignored: the next run compiles again.
    pub(crate) fn store(&self, key: &Key, module: &Module) {
        let Some(dir) = self.dir.as_deref() else { return };
        let Ok(bytes) = module.serialize() else { return };
        // A guest's pre-initialized memory is in its artifact: one over the cap is not kept
        // (the next run pre-initializes again, under its own limits).
        if bytes.len() as u64 > MAX_ARTIFACT_BYTES {
            return;
        }
        let tmp = dir.join(format!(".{}.{}.tmp", key.name, std::process::id()));
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| f.write_all(&bytes).and_then(|()| f.sync_data()));
        if written.is_err() || fs::rename(&tmp, dir.join(format!("{}.cwasm", key.name))).is_err() {
            let _ = fs::remove_file(&tmp);
        }
        self.evict(MAX_CACHE_BYTES);
    }

    /// Removes the least recently written artifacts until the directory holds at most
    /// `max` bytes of them (the newest one always stays).
    fn evict(&self, max: u64) {
        let Some(dir) = self.dir.as_deref() else { return };
        let Ok(entries) = fs::read_dir(dir) else { return };
        let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".cwasm"))
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((m.modified().ok()?, m.len(), e.path()))
            })
            .collect();
        files.sort();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        let keep_newest = files.len().saturating_sub(1);
        for (_, len, path) in files.into_iter().take(keep_newest) {
            if total <= max {
                break;
            }
            if fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on broken invariants")]
mod tests {
    //! G8: only files this crate could have written are mapped as code.

    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn engine() -> Engine {
        crate::engine::Shared::new(1, false).unwrap().engine.clone()
    }

    fn fresh(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("stockade-wasm-cache-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn compiled(engine: &Engine) -> (Module, Key) {
        let wasm = b"\0asm\x01\0\0\0";
        let module = Module::new(engine, wasm).unwrap();
        (module, Key::new(engine, "plain", &Sha256::digest(wasm).into()))
    }

    #[test]
    fn g8_a_full_cache_filesystem_leaves_no_partial_artifact() {
        let engine = engine();
        let dir = fresh("full");
        fs::create_dir_all(&dir).unwrap();
        let Some(fs) = stockade_test_support::Tmpfs::mount(&dir, "size=4k,mode=0700", "g8_a_full_cache_filesystem")
        else {
            return;
        };
        let cache = Cache::open(Some(dir.clone()));
        assert!(cache.dir().is_some(), "a private tmpfs is a usable cache directory");
        let (module, key) = compiled(&engine);
        assert!(module.serialize().unwrap().len() > 4096, "the artifact must not fit, or nothing is tested");
        cache.store(&key, &module);
        let left: Vec<_> = fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        drop(fs);
        assert!(left.is_empty(), "a partial artifact or temp file was left: {left:?}");
        assert!(cache.load(&engine, &key).is_none());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn g8_a_stored_module_loads_back_from_a_private_directory() {
        let engine = engine();
        let dir = fresh("ok");
        let cache = Cache::open(Some(dir.clone()));
        assert_eq!(fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        let (module, key) = compiled(&engine);
        assert!(cache.load(&engine, &key).is_none());
        cache.store(&key, &module);
        assert!(cache.load(&engine, &key).is_some());
        let file = dir.join(format!("{}.cwasm", key.name));
        assert_eq!(fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn g8_a_directory_others_can_access_is_not_used() {
        let dir = fresh("shared");
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(Cache::open(Some(dir.clone())).dir().is_none());
        // A cache opened while private stops loading once the directory is opened up.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        let engine = engine();
        let cache = Cache::open(Some(dir.clone()));
        let (module, key) = compiled(&engine);
        cache.store(&key, &module);
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o770)).unwrap();
        assert!(cache.load(&engine, &key).is_none());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn g8_writable_files_and_symlinks_are_not_loaded() {
        let engine = engine();
        let dir = fresh("files");
        let cache = Cache::open(Some(dir.clone()));
        let (module, key) = compiled(&engine);
        cache.store(&key, &module);
        let file = dir.join(format!("{}.cwasm", key.name));
        fs::set_permissions(&file, fs::Permissions::from_mode(0o666)).unwrap();
        assert!(cache.load(&engine, &key).is_none(), "group/other-writable file was loaded");
        fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
        let real = dir.join("real.cwasm");
        fs::rename(&file, &real).unwrap();
        std::os::unix::fs::symlink(&real, &file).unwrap();
        assert!(cache.load(&engine, &key).is_none(), "followed a symlink");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn g8_a_truncated_or_foreign_owned_artifact_is_compiled_again() {
        // Faults of issue 14: a cache file cut short (a full disk, a copy that stopped) and a
        // file whose owner was swapped. Neither may be mapped; the run compiles instead.
        let engine = engine();
        let dir = fresh("faults");
        let cache = Cache::open(Some(dir.clone()));
        let (module, key) = compiled(&engine);
        cache.store(&key, &module);
        let file = dir.join(format!("{}.cwasm", key.name));
        let len = fs::metadata(&file).unwrap().len();
        OpenOptions::new().write(true).open(&file).unwrap().set_len(len / 2).unwrap();
        assert!(cache.load(&engine, &key).is_none(), "a truncated artifact was loaded");
        OpenOptions::new().write(true).open(&file).unwrap().set_len(0).unwrap();
        assert!(cache.load(&engine, &key).is_none(), "an empty artifact was loaded");
        // Stored again, it loads; owned by someone else (as root we can hand it over), not.
        cache.store(&key, &module);
        assert!(cache.load(&engine, &key).is_some());
        if std::os::unix::fs::chown(&file, Some(65534), Some(65534)).is_ok() {
            assert!(cache.load(&engine, &key).is_none(), "a file owned by uid 65534 was loaded");
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn g8_the_cache_stays_under_its_size_bound() {
        let engine = engine();
        let dir = fresh("evict");
        let cache = Cache::open(Some(dir.clone()));
        let (module, key) = compiled(&engine);
        cache.store(&key, &module);
        let other = Key::new(&engine, "plain", &[9u8; 32]);
        std::thread::sleep(std::time::Duration::from_millis(20));
        cache.store(&other, &module);
        cache.evict(1);
        assert!(cache.load(&engine, &key).is_none(), "the older artifact stayed");
        assert!(cache.load(&engine, &other).is_some(), "the newest artifact was evicted");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn g8_the_key_covers_configuration_transform_and_module() {
        let a = engine();
        let mut other = crate::engine::config(1, false);
        other.consume_fuel(false);
        let b = Engine::new(&other).unwrap();
        let sha = [7u8; 32];
        let names = [
            Key::new(&a, "plain", &sha).name,
            Key::new(&b, "plain", &sha).name,
            Key::new(&a, "wizer", &sha).name,
            Key::new(&a, "plain", &[8u8; 32]).name,
        ];
        for (i, x) in names.iter().enumerate() {
            assert!(names[i + 1..].iter().all(|y| y != x), "{names:?}");
        }
        assert_eq!(Key::new(&a, "plain", &sha).name, names[0], "stable within a configuration");
    }
}
