//! Process facts from `/proc`.

use std::os::unix::fs::MetadataExt;

/// The fields of `/proc/PID/stat` (`pid` may be `self`) after the command name: the name is
/// in parentheses and may itself hold spaces and parentheses, so the fields start after its
/// last `)`; the first one returned is field 3 (the state), so field N is at index N - 3.
#[must_use]
pub fn stat_fields(pid: &str) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat.rsplit_once(')')?.1.split_whitespace().map(str::to_owned).collect())
}

/// A process's start time (`/proc/PID/stat` field 22, clock ticks after boot), if it exists;
/// `pid` may be `self`. With the pid, it names one process in a way a reused pid cannot fake.
#[must_use]
pub fn start_time(pid: &str) -> Option<u64> {
    stat_fields(pid)?.get(22 - 3)?.parse().ok()
}

/// Whether the process that had `pid` and started at `start` is gone: no such pid, one
/// that started at another time (the pid was reused), or one that has exited and waits only
/// to be reaped (a zombie: its memory, descriptors and children are already gone, so it can
/// use nothing of what it owned).
#[must_use]
pub fn gone(pid: &str, start: u64) -> bool {
    let Some(fields) = stat_fields(pid) else { return true };
    let exited = matches!(fields.first().map(String::as_str), Some("Z" | "X"));
    exited || fields.get(22 - 3).and_then(|s| s.parse::<u64>().ok()) != Some(start)
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`).
#[must_use]
pub fn boot_id() -> Option<String> {
    Some(std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?.trim().to_owned())
}

/// The inode of this process's pid namespace (`/proc/self/ns/pid`).
#[must_use]
pub fn pid_namespace() -> Option<u64> {
    Some(std::fs::metadata("/proc/self/ns/pid").ok()?.ino())
}

/// Whether this process runs as root (the owner of `/proc/self`, its effective uid), or why
/// that cannot be read.
pub fn is_root() -> std::io::Result<bool> {
    Ok(std::fs::metadata("/proc/self")?.uid() == 0)
}

/// The value after `key` in a `/proc` file of `Key:\tvalue` lines (`/proc/PID/status`,
/// `/proc/self/fdinfo/FD`), trimmed.
pub fn field(path: &str, key: &str) -> std::io::Result<String> {
    let text = std::fs::read_to_string(path)?;
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|v| v.trim().to_owned())
        .ok_or_else(|| std::io::Error::other(format!("no {key} line in {path}")))
}

/// The pid of host process `pid` in its own (innermost) pid namespace: the last field of
/// the `NSpid:` line of `/proc/PID/status`; `None` if it is gone or the line is missing.
#[must_use]
pub fn ns_pid(pid: u32) -> Option<u32> {
    field(&format!("/proc/{pid}/status"), "NSpid:").ok()?.split_whitespace().last()?.parse().ok()
}

/// The first child of host process `pid` (`/proc/PID/task/PID/children`; for a run's
/// helper, whose one child is the run's init, that init); `None` if it has none or is gone.
#[must_use]
pub fn first_child(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?.split_whitespace().next()?.parse().ok()
}

/// Every host process in the pid namespace of host process `pid` (itself included), by a
/// scan of `/proc`; empty if `pid` is gone.
#[must_use]
pub fn pids_in_namespace_of(pid: u32) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt;
    let ns_of = |p: u32| std::fs::metadata(format!("/proc/{p}/ns/pid")).map(|m| m.ino()).ok();
    let Some(ns) = ns_of(pid) else { return Vec::new() };
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|p| ns_of(*p) == Some(ns))
        .collect()
}

/// The paths of the unix sockets bound in this process's network namespace
/// (`/proc/net/unix`, its last column; abstract sockets, shown with `@`, are left out). A
/// socket file whose path is not among them has no socket behind it: its owner is gone.
#[must_use]
pub fn unix_socket_paths() -> std::collections::HashSet<std::path::PathBuf> {
    let text = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    unix_socket_paths_in(&text)
}

/// [`unix_socket_paths`] of a `/proc/net/unix` text.
#[must_use]
pub fn unix_socket_paths_in(text: &str) -> std::collections::HashSet<std::path::PathBuf> {
    text.lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(7))
        .filter(|p| p.starts_with('/'))
        .map(std::path::PathBuf::from)
        .collect()
}

/// The mount points of this process's mount namespace at or under `dir` (`/proc/self/mountinfo`,
/// its fifth field, with the kernel's octal escapes undone), deepest first, so that unmounting
/// them in order never meets a busy parent.
#[must_use]
pub fn mount_points_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mount_points_under_in(&text, dir)
}

/// [`mount_points_under`] of a `/proc/PID/mountinfo` text.
#[must_use]
pub fn mount_points_under_in(text: &str, dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let mut points: Vec<std::path::PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| std::path::PathBuf::from(std::ffi::OsString::from_vec(unescape_octal(p))))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    points
}

/// Undoes the kernel's `\NNN` octal escapes of a mountinfo path (space, tab, newline, `\`).
fn unescape_octal(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .and_then(|d| u8::try_from(d.iter().fold(0u16, |v, c| v * 8 + u16::from(c - b'0'))).ok());
        match (b[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}
