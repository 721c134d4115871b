use std::path::PathBuf;

use super::{interpreter_of, objects_in};

/// A minimal ELF64 header with one program header of type `p_type` whose bytes are `interp`.
fn elf(p_type: u32, interp: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 64 + 56];
    b[..4].copy_from_slice(b"\x7fELF");
    b[4] = 2;
    b[5] = 1;
    b[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
    b[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
    b[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
    b[64..68].copy_from_slice(&p_type.to_le_bytes());
    b[64 + 8..64 + 16].copy_from_slice(&(120u64).to_le_bytes());
    b[64 + 0x20..64 + 0x28].copy_from_slice(&(interp.len() as u64).to_le_bytes());
    b.extend_from_slice(interp);
    b
}

#[test]
fn the_interpreter_is_read_from_pt_interp_and_anything_else_is_none_or_an_error() {
    assert_eq!(
        interpreter_of(&elf(3, b"/lib64/ld-linux-x86-64.so.2\0")),
        Ok(Some(PathBuf::from("/lib64/ld-linux-x86-64.so.2")))
    );
    assert_eq!(interpreter_of(&elf(1, b"")), Ok(None), "no PT_INTERP: a static program");
    assert_eq!(interpreter_of(b"#!/bin/sh\necho hi\n"), Ok(None), "a script");
    assert!(interpreter_of(&elf(3, b"ld.so\0")).unwrap_err().contains("not an absolute path"));
    let mut big_endian = elf(3, b"/x\0");
    big_endian[5] = 2;
    assert!(interpreter_of(&big_endian).unwrap_err().contains("little-endian"));
    // Offsets past the end, or that overflow, are refused, never read.
    let mut cut = elf(3, b"/lib64/ld.so\0");
    cut[64 + 8..64 + 16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(interpreter_of(&cut).unwrap_err().contains("cut short"));
    assert!(interpreter_of(&elf(3, b"/x\0")[..70]).unwrap_err().contains("cut short"));
    // This test's own executable has one (the workspace builds dynamically linked tests).
    let own = super::interpreter(&std::env::current_exe().unwrap()).unwrap();
    assert!(own.is_some_and(|p| p.is_absolute()));
}

#[test]
fn the_loaders_list_gives_each_soname_and_file_and_a_missing_library_is_an_error() {
    let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f1)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f3)\n";
    assert_eq!(
        objects_in(text).unwrap(),
        [
            ("libgcc_s.so.1".to_owned(), PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1")),
            ("libc.so.6".to_owned(), PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6")),
        ]
    );
    assert_eq!(objects_in("\tlibfoo.so.1 => not found\n").unwrap_err(), "the loader does not find libfoo.so.1");
}
