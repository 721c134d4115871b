//! G1 and G2 without a daemon: validation, and the create body every container gets.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on broken invariants")]

use std::path::Path;

use stockade_protocol::{Access, Job, Limits};

use crate::spec::{self, Hardening, SpecError, check_image, check_mounts, check_name, named_by_stockade};

fn job() -> Job {
    Job::image("stockade-busybox:local", ["sh", "-c", "echo hi"]).unwrap()
}

#[test]
fn g1_image_references_are_checked() {
    for ok in ["stockade-busybox:local", "registry.example/ns/img:1.2@sha256:abc", "busybox"] {
        check_image(ok).unwrap();
    }
    for bad in ["", "-v", "--privileged", "img name", "img\n", "img:tag;rm", "a//b", &"x".repeat(256)] {
        assert!(matches!(check_image(bad), Err(SpecError::Image(..))), "{bad:?}");
    }
}

#[test]
fn g1_a_workspace_the_containers_user_cannot_use_is_refused_with_the_fix() {
    let check =
        |access, mode, owner| spec::check_workspace_access(Path::new("/srv/ws"), access, 65534, 65534, mode, owner);
    let (ro, rw, root, nobody) = (Access::ReadOnly, Access::ReadWrite, (0, 0), (65534, 65534));
    // Refused: what the mode bits deny whatever ACL the directory has.
    for (access, mode, owner) in [
        (ro, 0o700, root),         // a root `mktemp -d`
        (rw, 0o755, root),         // a root-owned project
        (rw, 0o700, (1000, 1000)), // a user's `mktemp -d`
        (ro, 0o075, nobody),       // the owner's bits decide for the owner
        (rw, 0o707, (0, 65534)),   // the group's bits decide for the group
        (rw, 0o1755, root),        // sticky, other r-x: not writable
    ] {
        let Err(err) = check(access, mode, owner) else { panic!("{access:?} {mode:o} {owner:?} was allowed") };
        let m = err.to_string();
        assert!(m.starts_with("workspace /srv/ws: the container's user 65534:65534 cannot "), "{m}");
        assert!(m.contains(&format!("mode {:04o}", mode)) && m.contains("process tier"), "{m}");
    }
    let m = check(rw, 0o755, root).unwrap_err().to_string();
    assert!(m.contains("cannot read and write it (owner 0:0, mode 0755)") && m.contains("chown 65534:65534"), "{m}");
    // Allowed: the user's bits grant it, or an ACL could (the group bits are its mask).
    for (access, mode, owner) in [
        (ro, 0o755, root),
        (rw, 0o777, root),
        (rw, 0o700, nobody),
        (rw, 0o770, (0, 65534)),
        (rw, 0o775, (1000, 1000)), // a named-user ACL entry could grant it
        (ro, 0o705, (1000, 1000)),
    ] {
        check(access, mode, owner).unwrap_or_else(|e| panic!("{access:?} {mode:o} {owner:?}: {e}"));
    }
}

#[test]
fn g1_names_users_mounts_and_limits_are_checked() {
    check_name("stockade-1a2b").unwrap();
    for bad in ["", "-x", "a b", "a/b", &"x".repeat(129)] {
        assert!(check_name(bad).is_err(), "{bad:?}");
    }
    let root = Hardening { uid: 0, gid: 0, runtime: None };
    assert!(matches!(spec::spec(&job(), &root, "r1", 0), Err(SpecError::Root { .. })));
    let gid0 = Hardening { uid: 1000, gid: 0, runtime: None };
    assert!(matches!(spec::spec(&job(), &gid0, "r1", 0), Err(SpecError::Root { .. })));
    for bad in ["/", "/etc", "/home", "/var/run", "/run/docker.sock", "/srv/a/../b", "/srv/a:b"] {
        assert!(check_mounts(&[Path::new(bad)]).is_err(), "{bad}");
    }
    check_mounts(&[Path::new("/srv/work/job-1")]).unwrap();
    assert!(check_mounts(&[Path::new("/srv/work"), Path::new("/srv/work/inner")]).is_err(), "nested");
    let tiny = job().with_limits(Limits::new().with_memory(1 << 20).unwrap());
    assert!(matches!(spec::spec(&tiny, &Hardening::default(), "r1", 0), Err(SpecError::Limit { name: "memory", .. })));
    let ws = job().with_workspace("/etc", Access::ReadOnly).unwrap();
    let refused = spec::spec(&ws, &Hardening::default(), "r1", 0);
    assert!(matches!(&refused, Err(SpecError::NotDedicated(_))), "{refused:?}");
    let text = refused.unwrap_err().to_string();
    assert!(text.starts_with("workspace /etc cannot be granted: it is a system directory"), "{text}");
    let cmd = Job::wasm("/m.wasm", "_start", Vec::<String>::new()).unwrap();
    assert_eq!(spec::spec(&cmd, &Hardening::default(), "r1", 0), Err(SpecError::NotAnImageJob));
}

/// The create body, reviewed as data: `UPDATE_EXPECT=1` rewrites the snapshot.
#[test]
fn g2_the_create_body_snapshot() {
    let job = job()
        .with_stdin("input")
        .unwrap()
        .with_env("LANG", "C.UTF-8")
        .unwrap()
        .with_workspace("/srv/work/job-1", Access::ReadOnly)
        .unwrap();
    let spec = spec::spec(&job, &Hardening::default(), "run-1", 1_700_000_000).unwrap();
    let mut value = serde_json::to_value(&spec.body).unwrap();
    // The profile is the process tier's policy, pinned by that tier's own snapshot.
    let opt = &mut value["HostConfig"]["SecurityOpt"][1];
    assert_eq!(opt.as_str().unwrap(), format!("seccomp={}", spec::seccomp_profile()));
    *opt = serde_json::Value::String("seccomp=<SECCOMP_PROFILE, compacted>".into());
    // The owner label names this process (boot id, pid namespace, pid, start time).
    let owner = &mut value["Labels"][spec::LABEL_OWNER];
    assert_eq!(owner.as_str(), spec::owner());
    *owner = serde_json::Value::String("<BOOT_ID/PID_NAMESPACE/PID/START_TIME>".into());
    sort(&mut value);
    let got = serde_json::to_string_pretty(&value).unwrap() + "\n";
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/create_body.json");
    if std::env::var_os("UPDATE_EXPECT").is_some() {
        std::fs::write(&path, &got).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(got, want, "the create body changed: review it, then bless with UPDATE_EXPECT=1");
}

#[test]
fn g2_hardening_defaults_hold_for_any_job() {
    let spec = spec::spec(&job(), &Hardening::default(), "r", 0).unwrap();
    let h = spec.body.host_config.as_ref().unwrap();
    assert_eq!(spec.body.network_disabled, Some(true));
    assert_eq!(h.network_mode.as_deref(), Some("none"));
    assert_eq!(h.readonly_rootfs, Some(true));
    assert_eq!(h.cap_drop.as_deref(), Some(&["ALL".to_owned()][..]));
    let opts = h.security_opt.as_deref().unwrap();
    assert_eq!(opts[0], "no-new-privileges");
    let profile: serde_json::Value = serde_json::from_str(opts[1].strip_prefix("seccomp=").unwrap()).unwrap();
    assert_eq!(profile["defaultAction"], "SCMP_ACT_ERRNO");
    assert_eq!(opts.len(), 2);
    assert_eq!(h.privileged, Some(false));
    assert_eq!(h.auto_remove, Some(false));
    assert_eq!(h.oom_score_adj, Some(1000));
    assert_eq!(h.memory, h.memory_swap);
    assert_eq!(h.log_config.as_ref().and_then(|l| l.typ.as_deref()), Some("none"));
    assert!(h.tmpfs.as_ref().unwrap()["/tmp"].contains("noexec"));
    assert_eq!(spec.body.user.as_deref(), Some("65534:65534"));
    assert!(spec.body.labels.as_ref().unwrap().contains_key(spec::LABEL_RUN));
    assert!(spec.body.labels.as_ref().unwrap().contains_key(spec::LABEL_EXPIRES));
}

fn sort(v: &mut serde_json::Value) {
    if let serde_json::Value::Object(map) = v {
        let mut entries: Vec<_> = std::mem::take(map).into_iter().collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        for (k, mut child) in entries {
            sort(&mut child);
            map.insert(k, child);
        }
    } else if let serde_json::Value::Array(items) = v {
        items.iter_mut().for_each(sort);
    }
}

#[test]
fn g2_under_gvisor_the_pids_limit_leaves_room_for_its_kernel() {
    let runsc = Hardening { runtime: Some(spec::RUNSC.into()), ..Hardening::default() };
    let body = spec::spec(&job(), &runsc, "run-1", 1).unwrap().body;
    let host = body.host_config.unwrap();
    assert_eq!(host.runtime.as_deref(), Some("runsc"));
    assert_eq!(host.pids_limit, Some(i64::from(Limits::new().processes()) + spec::RUNSC_HOST_TASKS));
    let plain = spec::spec(&job(), &Hardening::default(), "run-1", 1).unwrap().body.host_config.unwrap();
    assert_eq!(plain.pids_limit, Some(i64::from(Limits::new().processes())));
}

#[test]
fn g4_the_owner_label_tells_a_dead_supervisor_from_a_live_one() {
    use crate::spec::{owner, owner_gone};
    let me = owner().unwrap();
    assert!(!owner_gone(me), "this process is alive: {me}");
    let parts: Vec<&str> = me.split('/').collect();
    assert_eq!(parts.len(), 4, "{me}");
    // A process that has exited (its pid may be reused: the start time tells them apart).
    let mut child = std::process::Command::new("/bin/true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    assert!(owner_gone(&format!("{}/{}/{pid}/{}", parts[0], parts[1], parts[3])));
    // This pid with another start time: a reused pid, so the owner is gone.
    assert!(owner_gone(&format!("{}/{}/{}/1", parts[0], parts[1], parts[2])));
    // Another boot or another pid namespace: not judged here, never reaped by owner.
    assert!(!owner_gone(&format!("another-boot/{}/{pid}/1", parts[1])));
    assert!(!owner_gone(&format!("{}/1/{pid}/1", parts[0])));
    for garbage in ["", "a/b", "x/y/z/w", "a/b/c/d/e", &format!("{}/{}/-1/1", parts[0], parts[1])] {
        assert!(!owner_gone(garbage), "{garbage:?}");
    }
}

#[test]
fn g4_only_containers_named_after_their_run_label_are_stockade_s() {
    let names = |n: &str| vec![format!("/{n}")];
    for n in ["stockade-r1", "stockade-pool-r1", "stockade-session-r1", "stockade-r1-netns"] {
        assert!(named_by_stockade(&names(n), "r1"), "{n}");
    }
    // A label copied from an image onto a container of another name, or another run's.
    for n in ["mine", "stockade-session-r2", "stockade-sessionr1", "x-stockade-r1"] {
        assert!(!named_by_stockade(&names(n), "r1"), "{n}");
    }
    assert!(!named_by_stockade(&names("stockade-"), ""), "an empty run label names nothing");
}
