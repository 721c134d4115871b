//! No ambient authority (G1). The host checks the world (files on disk), not the guest's word.

use stockade_protocol::{Access, Status};

use crate::limits::tempdir;
use crate::support::{run, wasi_module, wat_job};

/// Prints the errno of `path_open(3, path, oflags, rights)`, then of writing to the fd.
fn open_and_write(path: &str, oflags: u32, rights: u64) -> String {
    wasi_module(&format!(
        r#"(data (i32.const 1024) "{path}")
           (data (i32.const 1536) "pwned")
           (func (export "_start") (local $e i32)
             (local.set $e (call $path_open (i32.const 3) (i32.const 0) (i32.const 1024) (i32.const {len})
               (i32.const {oflags}) (i64.const {rights}) (i64.const 0) (i32.const 0) (i32.const 16)))
             (call $num (local.get $e))
             (if (i32.eqz (local.get $e)) (then
               (call $num (call $write (i32.load (i32.const 16)) (i32.const 1536) (i32.const 5))))))"#,
        len = path.len()
    ))
}

fn errnos(report: &stockade_protocol::Report) -> Vec<u32> {
    assert_eq!(report.status, Status::Exited { code: 0 }, "{report:?}");
    String::from_utf8_lossy(&report.stdout.bytes).lines().map(|l| l.parse().unwrap()).collect()
}

const O_CREAT: u32 = 1;
const RIGHT_READ: u64 = 1 << 1;
const RIGHT_WRITE: u64 = 1 << 6;
const EBADF: u32 = 8;
const ENOTCAPABLE: u32 = 76;
const EPERM: u32 = 63;

#[test]
fn g1_without_a_workspace_there_is_no_directory_to_open() {
    let report = run(&wat_job(&open_and_write("etc/passwd", 0, RIGHT_READ), "_start"));
    assert_eq!(errnos(&report), [EBADF]);
    // fd 3 is not a preopen either.
    let probe =
        wasi_module(r#"(func (export "_start") (call $num (call $fd_prestat_get (i32.const 3) (i32.const 16))))"#);
    assert_eq!(errnos(&run(&wat_job(&probe, "_start"))), [EBADF]);
}

#[test]
fn g1_environment_and_arguments_are_only_what_the_job_grants() {
    let wat = wasi_module(
        r#"(func (export "_start")
             (drop (call $environ_sizes_get (i32.const 16) (i32.const 20))) (call $num (i32.load (i32.const 16)))
             (drop (call $args_sizes_get (i32.const 16) (i32.const 20))) (call $num (i32.load (i32.const 16))))"#,
    );
    // The premise: the harness itself has a non-empty environment.
    assert!(std::env::vars_os().next().is_some());
    assert_eq!(errnos(&run(&wat_job(&wat, "_start"))), [0, 1]);
    let job = wat_job(&wat, "_start").with_env("ONLY", "this").unwrap();
    assert_eq!(errnos(&run(&job)), [1, 1]);
}

#[test]
fn g1_a_read_only_workspace_cannot_be_written_or_escaped() {
    let ws = tempdir("g1-ro");
    std::fs::write(ws.join("in.txt"), b"data").unwrap();
    let outside = ws.parent().unwrap().join(format!("g1-outside-{}", std::process::id()));
    let _ = std::fs::remove_file(&outside);
    let ro = |path: &str, oflags, rights| {
        let job =
            wat_job(&open_and_write(path, oflags, rights), "_start").with_workspace(&ws, Access::ReadOnly).unwrap();
        errnos(&run(&job))
    };
    // Reading inside works; the write through a read-only fd fails.
    assert_eq!(ro("in.txt", 0, RIGHT_READ)[0], 0);
    assert_ne!(ro("new.txt", O_CREAT, RIGHT_WRITE), [0, 5]);
    assert!(!ws.join("new.txt").exists());
    assert_ne!(ro("in.txt", 0, RIGHT_WRITE), [0, 5]);
    assert_eq!(std::fs::read(ws.join("in.txt")).unwrap(), b"data");
    // `..` and absolute paths do not leave the preopen.
    let name = outside.file_name().unwrap().to_str().unwrap().to_owned();
    let e = ro(&format!("../{name}"), O_CREAT, RIGHT_WRITE);
    assert!(e[0] == ENOTCAPABLE || e[0] == EPERM, "{e:?}");
    assert!(!outside.exists());
}

#[test]
fn g1_a_read_write_workspace_is_writable_but_symlinks_do_not_lead_out() {
    let ws = tempdir("g1-rw");
    let secret = ws.parent().unwrap().join(format!("g1-secret-{}", std::process::id()));
    std::fs::write(&secret, b"host secret").unwrap();
    std::os::unix::fs::symlink(&secret, ws.join("link")).unwrap();
    let rw = |path: &str, oflags, rights| {
        let job =
            wat_job(&open_and_write(path, oflags, rights), "_start").with_workspace(&ws, Access::ReadWrite).unwrap();
        errnos(&run(&job))
    };
    assert_eq!(rw("out.txt", O_CREAT, RIGHT_WRITE), [0, 0]);
    assert_eq!(std::fs::read(ws.join("out.txt")).unwrap(), b"pwned");
    let e = rw("link", 0, RIGHT_WRITE | RIGHT_READ);
    assert!(e[0] != 0, "followed a symlink out of the workspace: {e:?}");
    assert_eq!(std::fs::read(&secret).unwrap(), b"host secret");
    std::fs::remove_file(&secret).unwrap();
}

#[test]
fn g11_protected_paths_in_a_read_write_workspace() {
    let ws = tempdir("g11-rw");
    let rw = |path: &str| {
        let job = wat_job(&open_and_write(path, O_CREAT, RIGHT_WRITE), "_start")
            .with_workspace(&ws, Access::ReadWrite)
            .unwrap();
        run(&job)
    };
    // None present: ordinary files stay, and a planted `.envrc` is gone after the run.
    let r = rw("out.txt");
    assert_eq!(errnos(&r), [0, 0]);
    assert_eq!(std::fs::read(ws.join("out.txt")).unwrap(), b"pwned");
    let r = rw(".envrc");
    assert_eq!(errnos(&r), [0, 0], "the guest could not even create it");
    assert!(!ws.join(".envrc").exists(), "the planted .envrc is still on the host");
    let details: Vec<&str> = r
        .enforcement
        .iter()
        .filter(|e| e.mechanism == stockade_protocol::Mechanism::WasmWorkspace)
        .map(|e| e.detail.as_str())
        .collect();
    assert!(details.iter().any(|d| d.ends_with("where a protected path was absent: .envrc")), "{details:?}");
    assert_eq!(r.swept, [".envrc"], "{details:?}");
    // One present: the grant is refused before the guest runs, naming it.
    std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
    let job = wat_job(&open_and_write("after.txt", O_CREAT, RIGHT_WRITE), "_start")
        .with_workspace(&ws, Access::ReadWrite)
        .unwrap();
    let err = crate::support::block_on(crate::support::tier().run(&job)).unwrap_err();
    assert!(
        matches!(&err, stockade_wasm::RunError::Unsupported { reason, .. } if reason.contains("holds .git .git/hooks")),
        "{err}"
    );
    assert!(!ws.join("after.txt").exists());
    // Read-only, the same directory is fine.
    let ro =
        wat_job(&open_and_write("out.txt", 0, RIGHT_READ), "_start").with_workspace(&ws, Access::ReadOnly).unwrap();
    assert_eq!(errnos(&run(&ro))[0], 0);
    std::fs::remove_dir_all(&ws).unwrap();
}

/// The workspace lock every tier shares (wasmtime-wasi opens the preopen by name): a run
/// inside a workspace that a read-write run holds is refused before the guest runs when it
/// asks not to wait, and runs once the holder is done. Judged by the host's file.
#[test]
fn g11_a_workspace_inside_a_held_one_waits_or_is_refused() {
    let ws = tempdir("g11-held");
    std::fs::create_dir(ws.join("sub")).unwrap();
    let opened = stockade_hostfs::open_workspace(&ws).unwrap();
    let held = crate::support::block_on(opened.lock(true, stockade_protocol::Busy::Refuse, || async {})).unwrap();
    let job = wat_job(&open_and_write("made.txt", O_CREAT, RIGHT_WRITE), "_start")
        .with_workspace_when_busy(ws.join("sub"), Access::ReadWrite, stockade_protocol::Busy::Refuse)
        .unwrap();
    let err = crate::support::block_on(crate::support::tier().run(&job)).unwrap_err();
    assert!(matches!(&err, stockade_wasm::RunError::Busy(m) if m.contains("held by another run")), "{err}");
    assert!(!ws.join("sub/made.txt").exists());
    drop(held);
    assert_eq!(errnos(&run(&job)), [0, 0]);
    assert_eq!(std::fs::read(ws.join("sub/made.txt")).unwrap(), b"pwned");
}
