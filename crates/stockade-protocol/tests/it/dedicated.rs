//! G10: the one rule for which host directories may be granted.

use std::path::Path;

use stockade_protocol::dedicated::check_dedicated;

fn refused(p: &str) -> String {
    match check_dedicated(Path::new(p), &[Path::new("/srv/engine/sock.d")]) {
        Err(e) => e.to_string(),
        Ok(()) => panic!("{p} was accepted"),
    }
}

#[test]
fn g10_system_trees_and_everything_under_them_are_refused() {
    for p in [
        "/etc",
        "/etc/ssh",
        "/usr",
        "/usr/local/src",
        "/bin",
        "/sbin",
        "/lib",
        "/lib64",
        "/boot",
        "/dev",
        "/dev/shm",
        "/proc",
        "/proc/1",
        "/sys",
        "/run",
        "/run/user/1000",
        "/var/run",
        "/var/lib",
        "/var/lib/docker/volumes",
    ] {
        let e = refused(p);
        assert!(e.starts_with(&format!("{p} cannot be granted: it is")), "{e}");
        assert!(e.contains("system directory"), "{e}");
    }
}

#[test]
fn g10_root_shared_dirs_homes_and_their_ancestors_are_refused() {
    assert!(refused("/").contains("root directory"));
    for p in ["/tmp", "/var/tmp", "/root", "/home", "/opt", "/var", "/mnt"] {
        assert!(refused(p).contains("shared directory itself"), "{p}: {}", refused(p));
    }
    for p in ["/home/alice", "/home/bob/"] {
        assert!(refused(p).contains("home directory itself"), "{p}");
    }
    // The caller's own protected directory (the docker socket's), and its ancestors.
    assert!(refused("/srv/engine/sock.d").contains("which stockade protects"));
    assert!(refused("/srv/engine").contains("it contains /srv/engine/sock.d"));
    assert!(refused("/srv").contains("shared directory itself"));
    // Not resolved: refused rather than guessed at.
    assert!(refused("relative/dir").contains("not absolute and resolved"));
    assert!(refused("/tmp/x/../../etc").contains("not absolute and resolved"));
}

/// The audit's list (hold-the-line, finding 13): logs, spools, caches and a home's hidden
/// directories (credentials, start-up settings) were accepted, and as root id-mapped.
#[test]
fn g10_logs_spools_caches_and_a_homes_hidden_directories_are_refused() {
    for p in ["/var/log", "/var/log/apt", "/var/spool/cron/crontabs", "/var/cache", "/var/cache/job"] {
        assert!(refused(p).contains("system directory"), "{p}: {}", refused(p));
    }
    for p in ["/root/.cache", "/root/.ssh", "/home/alice/.aws", "/home/alice/.gnupg"] {
        let e = refused(p);
        assert!(e.contains("it is a home directory's hidden directory"), "{p}: {e}");
    }
    for (p, dot) in [("/home/alice/.config/autostart", "/home/alice/.config"), ("/root/.cache/x/y", "/root/.cache")] {
        let e = refused(p);
        assert!(e.contains(&format!("it is inside {dot}, a home directory's hidden directory")), "{p}: {e}");
    }
}

#[test]
fn g10_dedicated_directories_are_accepted() {
    for p in [
        "/tmp/job",
        "/tmp/tmp.abc123/deeper",
        "/var/tmp/build",
        "/root/project",
        "/home/alice/src/app",
        "/work/main",
        "/opt/myapp",
        "/srv/www",
        "/srv/engine/other",
        "/mnt/data",
        "/home/alice/src/.hidden-project",
        "/root/src/.hidden-inside-a-project",
    ] {
        assert_eq!(check_dedicated(Path::new(p), &[Path::new("/srv/engine/sock.d")]), Ok(()), "{p}");
    }
}

#[test]
fn g10_the_message_is_one_line_naming_the_path_and_the_way_out() {
    let e = refused("/etc");
    assert!(!e.contains('\n'));
    assert!(e.contains("mktemp -d"), "{e}");
}
