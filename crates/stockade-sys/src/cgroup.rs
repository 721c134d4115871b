//! Cgroup facts from `/proc/PID/cgroup` and the cgroup filesystem.

use std::path::PathBuf;

/// Where the cgroup filesystem is mounted.
pub const ROOT: &str = "/sys/fs/cgroup";

/// The cgroup of process `pid` (may be `self`) as `/proc/PID/cgroup` lists it: for a v1
/// `controller` (such as `memory`), the line whose controller list names it; for `None`, the
/// v2 line (no controllers). The path is relative to that hierarchy's root, with its
/// leading `/`.
#[must_use]
pub fn path_of(pid: &str, controller: Option<&str>) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    find(&text, controller)
}

/// [`path_of`], over the text of a `/proc/PID/cgroup` file.
#[must_use]
pub fn find(text: &str, controller: Option<&str>) -> Option<String> {
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        let matches = match controller {
            Some(c) => ctrls.split(',').any(|x| x == c),
            None => ctrls.is_empty(),
        };
        matches.then(|| path.to_owned())
    })
}

/// Whether process `pid` is in a cgroup whose path names `name` (a container's id), in
/// any hierarchy `/proc/PID/cgroup` lists.
#[must_use]
pub fn names(pid: &str, name: &str) -> bool {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    !name.is_empty() && text.lines().filter_map(|l| l.splitn(3, ':').nth(2)).any(|path| path.contains(name))
}

/// The directory of process `pid`'s v1 `controller` cgroup (`/sys/fs/cgroup/CONTROLLER/PATH`).
#[must_use]
pub fn v1_dir(pid: &str, controller: &str) -> Option<PathBuf> {
    let path = path_of(pid, Some(controller))?;
    Some(PathBuf::from(ROOT).join(controller).join(path.trim_start_matches('/')))
}

/// The `oom_kill` counter of a v1 `memory.oom_control` or a v2 `memory.events` text.
#[must_use]
pub fn oom_kills(text: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix("oom_kill "))?.trim().parse().ok()
}

/// How many processes the OOM killer ended in the memory cgroup of process `pid` (v1
/// `memory.oom_control`, else v2 `memory.events`); `None` when this host cannot see it
/// (another pid namespace, an old kernel without the counter).
#[must_use]
pub fn memory_oom_kills(pid: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let file = match find(&text, Some("memory")) {
        Some(path) => format!("{ROOT}/memory{path}/memory.oom_control"),
        None => format!("{ROOT}{}/memory.events", find(&text, None)?),
    };
    oom_kills(&std::fs::read_to_string(file).ok()?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_process_is_in_the_cgroups_its_proc_file_names_and_no_other() {
        let text = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let Some(path) = text.lines().filter_map(|l| l.splitn(3, ':').nth(2)).find(|p| p.len() > 1) else { return };
        assert!(super::names("self", path));
        assert!(!super::names("self", "no-such-container-0123456789abcdef"));
        assert!(!super::names("self", ""));
    }
}
