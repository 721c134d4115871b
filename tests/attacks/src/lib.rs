//! Shared plumbing for the attack programs: argument parsing and one-line reports.
//!
//! An attack prints `ATTEMPT <what> <ok|ERRNO>` for each thing it tries and may print data it
//! obtained. The harness never trusts these lines for the verdict: it checks the world (canary
//! files, listeners, host processes) itself. The lines only say how an attempt failed.
//!
//! # Position in the stack
//! Depends on: libc. Used by: the attack binaries, run by `stockade-escape`; `stockade-test-support`
//! re-exports its TLS ClientHello builders.
//! API boundary: no (publish = false).
//!
//! # Threat model
//! These programs are the attacker.
//!
//! # Guarantees
//! None: this crate attacks; the harness judges.
//!
//! # Non-guarantees
//! The programs' own output is never evidence of containment.
//!
//! # Failure behaviour
//! Every attempt reports its errno and continues.
//!
//! # Unsafe
//! Raw syscalls through libc, in the attack programs; allow-listed in `xtask/unsafe-allowlist.txt`.
//!
//! # Ambient authority
//! All of it, on purpose.
//!
//! # Feature flags
//! None.
//!
//! # Invariants
//! Network attacks aim only at the addresses the harness passes: listeners it opened on
//! 127.0.0.x, or sockets it created, directly or through the run's own proxy.

use std::collections::BTreeMap;
use std::io::Error;

pub mod net;

/// The `key=value` arguments the harness passes.
#[must_use]
pub fn args() -> BTreeMap<String, String> {
    std::env::args().skip(1).filter_map(|a| a.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned()))).collect()
}

/// The argument `key`, or an empty string.
#[must_use]
pub fn arg(key: &str) -> String {
    args().get(key).cloned().unwrap_or_default()
}

/// The name of an OS error (`EPERM`, `ENOENT`, ...).
#[must_use]
pub fn errno_name(e: &Error) -> String {
    let names = [
        (libc::EPERM, "EPERM"),
        (libc::ENOENT, "ENOENT"),
        (libc::ESRCH, "ESRCH"),
        (libc::EACCES, "EACCES"),
        (libc::EROFS, "EROFS"),
        (libc::ENOSYS, "ENOSYS"),
        (libc::EINVAL, "EINVAL"),
        (libc::ENETUNREACH, "ENETUNREACH"),
        (libc::ECONNREFUSED, "ECONNREFUSED"),
        (libc::EAGAIN, "EAGAIN"),
        (libc::EMFILE, "EMFILE"),
        (libc::ENOSPC, "ENOSPC"),
        (libc::EFBIG, "EFBIG"),
        (libc::EBADF, "EBADF"),
        (libc::ENOTTY, "ENOTTY"),
        (libc::EAFNOSUPPORT, "EAFNOSUPPORT"),
        (libc::ENOMEM, "ENOMEM"),
        (libc::EADDRNOTAVAIL, "EADDRNOTAVAIL"),
        (libc::EOPNOTSUPP, "EOPNOTSUPP"),
        (libc::ENODEV, "ENODEV"),
        (libc::EEXIST, "EEXIST"),
        (libc::EBUSY, "EBUSY"),
    ];
    let code = e.raw_os_error().unwrap_or(0);
    names.iter().find(|(c, _)| *c == code).map_or_else(|| format!("errno{code}"), |(_, n)| (*n).to_owned())
}

/// Prints one attempt's result.
pub fn report<T>(what: &str, r: Result<T, Error>) {
    match r {
        Ok(_) => println!("ATTEMPT {what} ok"),
        Err(e) => println!("ATTEMPT {what} {}", errno_name(&e)),
    }
}

/// A raw syscall's result as a `Result`.
pub fn sys(ret: libc::c_long) -> Result<libc::c_long, Error> {
    if ret < 0 { Err(Error::last_os_error()) } else { Ok(ret) }
}

/// Reads a file and prints what it got, so a leak shows up in the captured output.
pub fn read_and_show(what: &str, path: &str) {
    match std::fs::read(path) {
        Ok(bytes) => {
            println!("ATTEMPT {what} ok");
            println!("DATA {}", String::from_utf8_lossy(&bytes));
        }
        Err(e) => println!("ATTEMPT {what} {}", errno_name(&e)),
    }
}

/// A raw system call with up to six integer (or pointer) arguments.
pub fn syscall(nr: libc::c_long, a: [u64; 6]) -> Result<libc::c_long, Error> {
    #[allow(unsafe_code, reason = "attacks make raw system calls on purpose")]
    // SAFETY: callers pass integers, or pointers to live buffers of the sizes the call
    // expects; the kernel checks every user pointer and fails with EFAULT otherwise.
    let r = unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) };
    sys(r)
}

/// Forks; `Ok(0)` in the child.
pub fn fork() -> Result<libc::c_long, Error> {
    syscall(libc::SYS_fork, [0; 6])
}

/// Connects to the run's grants broker (`$STOCKADE_BROKER`, or `path` when given).
pub fn broker(path: Option<&str>) -> Result<std::os::unix::net::UnixStream, Error> {
    let p = match path {
        Some(p) => p.to_owned(),
        None => std::env::var("STOCKADE_BROKER").unwrap_or_default(),
    };
    let s = std::os::unix::net::UnixStream::connect(p)?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(3)))?;
    Ok(s)
}

/// Sends one broker call (`args` is raw JSON) and returns the reply's text, or the error.
pub fn grant_call(s: &mut std::os::unix::net::UnixStream, grant: &str, args: &str) -> Result<String, Error> {
    use std::io::{Read, Write};
    let body = format!("{{\"type\":\"call\",\"id\":1,\"grant\":\"{grant}\",\"args\":{args}}}");
    let len = u32::try_from(body.len()).map_err(|_| Error::from_raw_os_error(libc::E2BIG))?;
    s.write_all(&len.to_be_bytes())?;
    s.write_all(body.as_bytes())?;
    let mut n = [0u8; 4];
    s.read_exact(&mut n)?;
    let mut reply = vec![0u8; u32::from_be_bytes(n).min(1 << 22) as usize];
    s.read_exact(&mut reply)?;
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

/// Prints whether a grant call succeeded: `ok` only if the broker answered with a result.
pub fn report_grant(what: &str, r: Result<String, Error>) {
    match r {
        Ok(reply) if reply.contains("\"result\":") => println!("ATTEMPT {what} ok"),
        Ok(reply) => println!("ATTEMPT {what} EPERM {}", reply.chars().take(160).collect::<String>()),
        Err(e) => println!("ATTEMPT {what} {}", errno_name(&e)),
    }
}
