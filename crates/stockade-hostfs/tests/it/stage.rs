//! G5: what `pack` puts in the archive and what `unpack` lets out of it.

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use stockade_protocol::Access;

use stockade_hostfs::stage::{MAX_ENTRIES, StageError, pack, unpack, unpack_snapshot};

/// A fresh directory under the temp dir, removed with everything in it when the test ends
/// (passed or failed), so the suite leaves nothing behind.
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn scratch(name: &str) -> Scratch {
    let d = std::env::temp_dir().join(format!("stockade-stage-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    Scratch(d)
}

/// (path, kind, mode, uid, link target) of every entry.
fn listing(tar_bytes: &[u8]) -> Vec<(String, char, u32, u64, String)> {
    let mut ar = tar::Archive::new(tar_bytes);
    ar.entries()
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let h = e.header();
            let kind = match h.entry_type() {
                tar::EntryType::Directory => 'd',
                tar::EntryType::Regular => 'f',
                tar::EntryType::Symlink => 'l',
                _ => '?',
            };
            let link = e.link_name().unwrap().map(|l| l.display().to_string()).unwrap_or_default();
            (e.path().unwrap().display().to_string(), kind, h.mode().unwrap(), h.uid().unwrap(), link)
        })
        .collect()
}

fn host_tree(name: &str) -> Scratch {
    let d = scratch(name);
    fs::create_dir(d.join("sub")).unwrap();
    fs::write(d.join("sub/a.txt"), "hello").unwrap();
    fs::write(d.join("run.sh"), "#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(d.join("run.sh"), fs::Permissions::from_mode(0o4755)).unwrap();
    symlink("/etc/shadow", d.join("shadow-link")).unwrap();
    d
}

#[test]
fn g5_pack_read_only_is_root_owned_and_unwritable() {
    let d = host_tree("ro");
    let p = pack(&d, Access::ReadOnly, 65534, 65534, 1 << 20).unwrap();
    assert_eq!((p.files, p.bytes), (2, 5 + 18));
    let l = listing(&p.tar);
    assert!(l.contains(&("run.sh".into(), 'f', 0o555, 0, String::new())), "{l:?}");
    assert!(l.contains(&("sub".into(), 'd', 0o555, 0, String::new())), "{l:?}");
    assert!(l.contains(&("sub/a.txt".into(), 'f', 0o444, 0, String::new())), "{l:?}");
    // The symlink travels as a link: its target is never read on the host.
    assert!(l.contains(&("shadow-link".into(), 'l', 0o777, 0, "/etc/shadow".into())), "{l:?}");
}

#[test]
fn g5_pack_read_write_belongs_to_the_job_user_without_setuid() {
    let d = host_tree("rw");
    let l = listing(&pack(&d, Access::ReadWrite, 65534, 65534, 1 << 20).unwrap().tar);
    assert!(l.contains(&("run.sh".into(), 'f', 0o755, 65534, String::new())), "{l:?}");
    assert!(l.contains(&("sub/a.txt".into(), 'f', 0o644, 65534, String::new())), "{l:?}");
}

#[test]
fn g5_pack_refuses_oversize_specials_and_a_linked_root() {
    let d = host_tree("limits");
    fs::write(d.join("big"), vec![0u8; 8192]).unwrap();
    assert!(matches!(pack(&d, Access::ReadOnly, 1, 1, 4096), Err(StageError::TooLarge { limit: 4096, .. })));
    let fifo = d.join("fifo");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    assert!(matches!(pack(&d, Access::ReadOnly, 1, 1, 1 << 20), Err(StageError::Refused { path, .. }) if path == fifo));
    let parent = scratch("linked-root");
    let link = parent.join("ws");
    symlink(&d, &link).unwrap();
    assert!(matches!(pack(&link, Access::ReadOnly, 1, 1, 1 << 20), Err(StageError::Refused { .. })));
}

/// An archive entry with a raw name (the `tar` builder refuses `..`, which is the point).
fn raw_entry(b: &mut tar::Builder<Vec<u8>>, name: &str, kind: tar::EntryType, mode: u32, data: &[u8], link: &str) {
    let mut h = tar::Header::new_gnu();
    h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(data.len() as u64);
    if !link.is_empty() {
        h.set_link_name(link).unwrap();
    }
    h.set_cksum();
    b.append(&h, data).unwrap();
}

#[test]
fn g5_unpack_writes_only_plain_files_inside_and_never_follows_links() {
    let dest = scratch("dest");
    let outside = scratch("outside");
    fs::write(dest.join("same.txt"), "same").unwrap();
    fs::create_dir(dest.join(".git")).unwrap();
    fs::write(dest.join(".git/config"), "host config").unwrap();
    symlink(&outside, dest.join("hostlink")).unwrap();
    symlink(outside.join("victim"), dest.join("victim")).unwrap();
    let mut b = tar::Builder::new(Vec::new());
    use tar::EntryType::{Directory, Regular, Symlink};
    raw_entry(&mut b, "workspace/", Directory, 0o755, b"", "");
    raw_entry(&mut b, "workspace/same.txt", Regular, 0o644, b"same", "");
    raw_entry(&mut b, "workspace/new/deep.txt", Regular, 0o644, b"result", "");
    raw_entry(&mut b, "workspace/setuid", Regular, 0o4755, b"#!/bin/sh\n", "");
    raw_entry(&mut b, "workspace/../escape.txt", Regular, 0o644, b"pwn", "");
    raw_entry(&mut b, "workspace/.git/config", Regular, 0o644, b"[core]\nhooksPath=/tmp/evil", "");
    raw_entry(&mut b, "workspace/hostlink/pwn", Regular, 0o644, b"pwn", "");
    raw_entry(&mut b, "workspace/victim", Regular, 0o644, b"pwn", "");
    raw_entry(&mut b, "workspace/evil-link", Symlink, 0o777, b"", "/etc/passwd");
    raw_entry(&mut b, "other/file", Regular, 0o644, b"pwn", "");
    let archive = b.into_inner().unwrap();

    let applied = unpack(&archive, &dest).unwrap();
    assert_eq!((applied.written, applied.unchanged, applied.skipped), (2, 1, 6), "{applied:?}");
    assert_eq!(fs::read_to_string(dest.join("new/deep.txt")).unwrap(), "result");
    assert_eq!(fs::metadata(dest.join("setuid")).unwrap().permissions().mode() & 0o7777, 0o755);
    assert_eq!(fs::read_to_string(dest.join(".git/config")).unwrap(), "host config");
    assert!(!dest.join("evil-link").exists() && fs::symlink_metadata(dest.join("evil-link")).is_err());
    // Nothing reached the directory outside, through either host symlink or `..`.
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0, "{applied:?}");
    assert!(!dest.parent().unwrap().join("escape.txt").exists());
    for why in ["protected path", "not a plain relative name", "not a regular file or directory", "outside /workspace"]
    {
        assert!(applied.skipped_names.iter().any(|n| n.contains(why)), "{why}: {applied:?}");
    }
}

#[test]
fn g5_a_snapshot_restores_its_links_as_links_and_nothing_through_them() {
    let home = scratch("snap-home");
    let outside = scratch("snap-outside");
    let mut b = tar::Builder::new(Vec::new());
    use tar::EntryType::{Directory, Regular, Symlink};
    raw_entry(&mut b, "venv/", Directory, 0o755, b"", "");
    raw_entry(&mut b, "venv/bin/python", Symlink, 0o777, b"", "/usr/bin/python3");
    raw_entry(&mut b, "rel", Symlink, 0o777, b"", "venv/bin/python");
    raw_entry(&mut b, "dangling", Symlink, 0o777, b"", "no/such/thing");
    // A link out, then entries through it and over it: neither is followed.
    raw_entry(&mut b, "out", Symlink, 0o777, b"", outside.to_str().unwrap());
    raw_entry(&mut b, "out/planted", Regular, 0o644, b"pwn", "");
    raw_entry(&mut b, "rel", Regular, 0o644, b"over a link", "");
    let applied = unpack_snapshot(&b.into_inner().unwrap(), &home).unwrap();
    assert_eq!((applied.links, applied.written, applied.skipped), (4, 0, 2), "{applied:?}");
    for (name, target) in [
        ("venv/bin/python", "/usr/bin/python3"),
        ("rel", "venv/bin/python"),
        ("dangling", "no/such/thing"),
        ("out", outside.to_str().unwrap()),
    ] {
        assert!(fs::symlink_metadata(home.join(name)).unwrap().file_type().is_symlink(), "{name}");
        assert_eq!(fs::read_link(home.join(name)).unwrap(), Path::new(target), "{name}");
    }
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0, "an entry went through a restored link: {applied:?}");
    // A workspace's apply-back still restores no link at all.
    let mut b = tar::Builder::new(Vec::new());
    raw_entry(&mut b, "workspace/l", Symlink, 0o777, b"", "/etc");
    let ws = scratch("snap-ws");
    assert_eq!(unpack(&b.into_inner().unwrap(), &ws).unwrap().links, 0);
    assert!(fs::symlink_metadata(ws.join("l")).is_err());
}

#[test]
fn g5_unpack_refuses_a_destination_that_is_a_link() {
    let real = scratch("real-dest");
    let parent = scratch("link-dest-parent");
    let link = parent.join("ws");
    symlink(&real, &link).unwrap();
    assert!(matches!(unpack(&[0u8; 1024], Path::new(&link)), Err(StageError::Refused { .. })));
}

#[test]
fn g5_pack_refuses_more_entries_than_the_volume_holds() {
    let d = scratch("entries");
    for i in 0..=MAX_ENTRIES {
        fs::File::create(d.join(format!("f{i}"))).unwrap();
    }
    assert!(matches!(pack(&d, Access::ReadOnly, 1, 1, 1 << 30), Err(StageError::TooManyEntries(_))));
    fs::remove_file(d.join("f0")).unwrap();
    let p = pack(&d, Access::ReadOnly, 1, 1, 1 << 30).unwrap();
    assert_eq!(p.files, MAX_ENTRIES);
}

#[test]
fn g5_unpack_a_link_to_git_inside_is_no_way_in_and_a_broken_archive_is_typed() {
    let dest = scratch("alias");
    fs::create_dir_all(dest.join(".git/hooks")).unwrap();
    fs::create_dir(dest.join("real")).unwrap();
    // A link that stays inside the workspace, so only the no-follow rule stops it.
    symlink(".git", dest.join("alias")).unwrap();
    symlink("real", dest.join("real-alias")).unwrap();
    let mut b = tar::Builder::new(Vec::new());
    use tar::EntryType::Regular;
    raw_entry(&mut b, "workspace/alias/hooks/pre-commit", Regular, 0o755, b"#!/bin/sh\nevil\n", "");
    raw_entry(&mut b, "workspace/real-alias/file", Regular, 0o644, b"through a link", "");
    raw_entry(&mut b, "workspace/real/file", Regular, 0o644, b"direct", "");
    let archive = b.into_inner().unwrap();
    let applied = unpack(&archive, &dest).unwrap();
    assert_eq!((applied.written, applied.skipped), (1, 2), "{applied:?}");
    assert!(!dest.join(".git/hooks/pre-commit").exists());
    assert_eq!(fs::read_to_string(dest.join("real/file")).unwrap(), "direct");

    // A truncated archive and one with a corrupt header checksum are typed errors; what was
    // applied before the damage stays applied, and nothing panics.
    let mut cut = archive.clone();
    cut.truncate(512 + 100);
    let mut bad = archive;
    bad[148] ^= 0x55; // the first header's checksum field
    for broken in [cut, bad] {
        match unpack(&broken, &dest) {
            Err(StageError::Archive(why)) => assert!(!why.is_empty()),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn g5_unpack_skips_a_nul_or_overlong_name_and_applies_the_rest() {
    let dest = scratch("names");
    let mut b = tar::Builder::new(Vec::new());
    // A PAX path may carry a NUL (found by fuzz/fuzz_targets/stage_unpack.rs: it failed the
    // whole apply-back with EINVAL), and a name may exceed NAME_MAX.
    b.append_pax_extensions([("path", &b"workspace/a\0b"[..])]).unwrap();
    raw_entry(&mut b, "workspace/placeholder", tar::EntryType::Regular, 0o644, b"nul", "");
    let long = format!("workspace/{}", "n".repeat(300));
    b.append_pax_extensions([("path", long.as_bytes())]).unwrap();
    raw_entry(&mut b, "workspace/placeholder2", tar::EntryType::Regular, 0o644, b"long", "");
    raw_entry(&mut b, "workspace/kept.txt", tar::EntryType::Regular, 0o644, b"kept", "");
    let applied = unpack(&b.into_inner().unwrap(), &dest).unwrap();
    assert_eq!((applied.written, applied.skipped), (1, 2), "{applied:?}");
    assert_eq!(fs::read_to_string(dest.join("kept.txt")).unwrap(), "kept");
    assert!(applied.skipped_names.iter().any(|n| n.contains("not a plain relative name")), "{applied:?}");
    assert!(applied.skipped_names.iter().any(|n| n.contains("longer than the host allows")), "{applied:?}");
    assert_eq!(fs::read_dir(&dest).unwrap().count(), 1);
}

#[test]
fn g5_unpack_into_a_full_host_directory_skips_what_does_not_fit_and_loses_nothing() {
    let dest = scratch("full");
    let Some(_fs) =
        stockade_test_support::Tmpfs::mount(&dest, "size=64k,mode=0755", "g5_unpack_into_a_full_host_directory")
    else {
        return;
    };
    fs::write(dest.join("keep.txt"), "original").unwrap();
    let mut b = tar::Builder::new(Vec::new());
    use tar::EntryType::{Directory, Regular};
    raw_entry(&mut b, "workspace/big.bin", Regular, 0o644, &vec![7u8; 200 << 10], "");
    raw_entry(&mut b, "workspace/keep.txt", Regular, 0o644, &vec![b'x'; 100 << 10], "");
    raw_entry(&mut b, "workspace/small.txt", Regular, 0o644, b"fits", "");
    raw_entry(&mut b, "workspace/dir/", Directory, 0o755, b"", "");
    raw_entry(&mut b, "workspace/dir/also.txt", Regular, 0o644, b"fits too", "");
    let applied = unpack(&b.into_inner().unwrap(), &dest).unwrap();
    assert_eq!((applied.written, applied.skipped), (2, 2), "{applied:?}");
    assert_eq!(
        applied.skipped_names.iter().filter(|n| n.contains("No space left on device")).count(),
        2,
        "{applied:?}"
    );
    // The host's own file is as it was, what fit came back, and no partial file is left.
    assert_eq!(fs::read_to_string(dest.join("keep.txt")).unwrap(), "original");
    assert_eq!(fs::read_to_string(dest.join("small.txt")).unwrap(), "fits");
    assert_eq!(fs::read_to_string(dest.join("dir/also.txt")).unwrap(), "fits too");
    let mut names: Vec<String> =
        fs::read_dir(&dest).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["dir", "keep.txt", "small.txt"]);
}
