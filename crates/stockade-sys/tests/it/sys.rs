//! The /proc and cgroup readers, against this machine's own processes.

use std::process::Command;

use stockade_sys::{cgroup, proc};

#[test]
fn g1_a_start_time_names_one_process_and_a_reaped_one_is_gone() {
    let own = proc::start_time("self").expect("this process's start time");
    assert_eq!(proc::start_time(&std::process::id().to_string()), Some(own));
    assert!(!proc::gone("self", own));
    assert!(proc::gone("self", own + 1), "another start time is another process");
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = child.id().to_string();
    let start = proc::start_time(&pid).expect("a live child's start time");
    assert!(start >= own);
    assert!(!proc::gone(&pid, start));
    child.kill().unwrap();
    // Exited and not yet reaped (a zombie): gone already, as an owner that was SIGKILLed
    // and whose parent has not waited for it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while proc::stat_fields(&pid).is_some_and(|f| f[0] != "Z") {
        assert!(std::time::Instant::now() < deadline, "the killed child never became a zombie");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(proc::start_time(&pid), Some(start), "still there, unreaped");
    assert!(proc::gone(&pid, start), "a zombie is gone");
    child.wait().unwrap();
    assert!(proc::gone(&pid, start), "a reaped child is gone");
    assert_eq!(proc::start_time("no-such-pid"), None);
    // Field N of `stat` is at index N - 3; a `Key:` line of `status` is read by its key.
    let fields = proc::stat_fields("self").unwrap();
    assert_eq!(fields[22 - 3], own.to_string());
    assert_eq!(proc::field("/proc/self/status", "Pid:").unwrap(), std::process::id().to_string());
    assert!(proc::field("/proc/self/status", "NoSuchKey:").is_err());
}

#[test]
fn g1_a_command_name_with_spaces_and_parentheses_does_not_move_the_fields() {
    // The kernel takes a process's name from the file it executes: run a copy of `sleep`
    // named `) 1 2 (x`.
    let dir = std::env::temp_dir().join(format!("stockade-sys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let odd = dir.join(") 1 2 (x");
    std::fs::copy("/bin/sleep", &odd).unwrap();
    // Another test's thread may fork while the copy's write descriptor is still open, and
    // the child holds it until it execs: exec then fails with ETXTBSY for a moment.
    let mut tries = 0;
    let mut child = loop {
        match Command::new(&odd).arg("30").spawn() {
            Err(e) if e.raw_os_error() == Some(26) && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            spawned => break spawned.unwrap(),
        }
    };
    let pid = child.id().to_string();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    assert!(stat.contains(") 1 2 (x)"), "{stat}");
    let start = proc::start_time(&pid).unwrap();
    assert!(start >= proc::start_time("self").unwrap());
    child.kill().unwrap();
    child.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn g1_boot_and_namespace_are_readable_and_stable() {
    assert_eq!(proc::boot_id(), proc::boot_id());
    assert_eq!(proc::boot_id().map(|b| b.len()), Some(36), "a uuid");
    assert!(proc::pid_namespace().is_some());
    assert!(proc::is_root().is_ok());
}

#[test]
fn g2_cgroup_lines_are_found_by_exact_controller() {
    let v1 = "12:pids:/user.slice\n11:memory:/stockade/a\n4:cpu,cpuacct:/x\n1:name=systemd:/y\n";
    assert_eq!(cgroup::find(v1, Some("memory")).as_deref(), Some("/stockade/a"));
    assert_eq!(cgroup::find(v1, Some("cpu")).as_deref(), Some("/x"));
    assert_eq!(cgroup::find(v1, Some("mem")), None, "a prefix is not a controller");
    assert_eq!(cgroup::find(v1, None), None, "no v2 line");
    let v2 = "0::/system.slice/docker-abc.scope\n";
    assert_eq!(cgroup::find(v2, None).as_deref(), Some("/system.slice/docker-abc.scope"));
    assert_eq!(cgroup::find("garbage", Some("memory")), None);
    // This process's own: one of the two forms exists.
    assert!(cgroup::path_of("self", Some("memory")).is_some() || cgroup::path_of("self", None).is_some());
}

#[test]
fn g2_the_oom_kill_counter_is_read_by_its_exact_key() {
    let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
    assert_eq!(cgroup::oom_kills(v1), Some(3));
    let v2 = "low 0\nhigh 0\nmax 5\noom 2\noom_kill 1\noom_group_kill 0\n";
    assert_eq!(cgroup::oom_kills(v2), Some(1));
    assert_eq!(cgroup::oom_kills("oom_kill_disable 0\n"), None, "a longer key is not the counter");
    assert_eq!(cgroup::oom_kills("oom_kill x\n"), None);
    // A live process of this machine has a readable counter where a memory cgroup exists.
    if let Some(n) = cgroup::memory_oom_kills("self") {
        assert!(n < u64::MAX);
    }
}

#[test]
fn g3_a_bound_socket_is_listed_and_a_socket_file_left_behind_is_not() {
    let dir = std::env::temp_dir().join(format!("stockade-sys-g3-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (live, dead) = (dir.join("live.sock"), dir.join("dead.sock"));
    let listener = std::os::unix::net::UnixListener::bind(&live).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
    assert!(dead.exists(), "the closed socket's file stays");
    let paths = proc::unix_socket_paths();
    assert!(paths.contains(&live), "the bound socket is listed");
    assert!(!paths.contains(&dead), "a socket file with no socket behind it is not");
    drop(listener);
    assert!(!proc::unix_socket_paths().contains(&live));
    // The last column only, and never an abstract name.
    let text = "Num       RefCount Protocol Flags    Type St Inode Path\n\
                0000000000000000: 00000002 00000000 00010000 0001 01 1 /run/a.sock\n\
                0000000000000000: 00000002 00000000 00010000 0001 01 2 @abstract\n\
                0000000000000000: 00000002 00000000 00000000 0001 03 3\n";
    assert_eq!(proc::unix_socket_paths_in(text), [std::path::PathBuf::from("/run/a.sock")].into());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn g4_mount_points_under_a_directory_are_read_unescaped_and_deepest_first() {
    use std::path::{Path, PathBuf};
    let text = "22 1 0:21 / / rw - ext4 /dev/vda rw\n\
                90 22 0:50 / /var/s/a\\040b rw,nosuid - tmpfs tmpfs rw,size=1024k\n\
                91 90 0:51 / /var/s/a\\040b/deep rw - tmpfs tmpfs rw\n\
                92 22 0:52 / /var/sx rw - tmpfs tmpfs rw\n\
                93 22 0:53 / /var/s/odd\\777 rw - tmpfs tmpfs rw\n";
    let got = stockade_sys::proc::mount_points_under_in(text, Path::new("/var/s"));
    assert_eq!(
        got,
        [PathBuf::from("/var/s/a b/deep"), PathBuf::from("/var/s/a b"), PathBuf::from("/var/s/odd\\777")],
        "a sibling with the same prefix (/var/sx) is not under it; an escape past a byte is kept as written"
    );
    // This process's own table: its root is a mount point under /.
    assert!(stockade_sys::proc::mount_points_under(Path::new("/")).contains(&PathBuf::from("/")));
}
