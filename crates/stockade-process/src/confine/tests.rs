//! The compact allowlist program, checked against the list it was built from.

use super::*;

/// Runs a classic-BPF program of the shapes built here (absolute word loads, JEQ/JGT/JGE
/// against constants, constant returns) on a `seccomp_data` with `arch` and `nr`, for tests.
fn run_program(p: &[sock_filter], arch: u32, nr: u32) -> Option<u32> {
    let (mut pc, mut acc) = (0usize, 0u32);
    while let Some(i) = p.get(pc) {
        let jump = |taken: bool| pc + 1 + usize::from(if taken { i.jt } else { i.jf });
        pc = match i.code {
            LD_W_ABS => {
                acc = match i.k {
                    0 => nr,
                    4 => arch,
                    _ => return None,
                };
                pc + 1
            }
            JEQ_K => jump(acc == i.k),
            JGT_K => jump(acc > i.k),
            JGE_K => jump(acc >= i.k),
            RET_K => return Some(i.k),
            _ => return None,
        };
    }
    None
}

#[test]
fn allowlist_program_allows_exactly_the_list() {
    let p = allowlist_program();
    assert!(p.len() < 400, "{} instructions", p.len());
    let enosys = RET_ERRNO | libc::ENOSYS as u32;
    for nr in 0..1024u32 {
        let listed = ALLOWED.iter().any(|(_, a)| *a == i64::from(nr));
        let want = if listed { RET_ALLOW } else { enosys };
        assert_eq!(run_program(&p, AUDIT_ARCH_X86_64, nr), Some(want), "syscall {nr}");
        // The x32 ABI's numbers are refused, whatever the base number.
        assert_eq!(run_program(&p, AUDIT_ARCH_X86_64, nr | X32_SYSCALL_BIT), Some(enosys), "x32 syscall {nr}");
    }
    assert_eq!(run_program(&p, AUDIT_ARCH_X86_64, u32::MAX), Some(enosys));
    // Another architecture (i386 through the compat entry) kills the process.
    assert_eq!(run_program(&p, 0x4000_0003, 0), Some(RET_KILL_PROCESS));
}

#[test]
fn no_call_is_both_allowed_and_refused() {
    for (name, nr) in DENIED.iter().chain(NOT_IMPLEMENTED) {
        assert!(!ALLOWED.iter().any(|(_, a)| a == nr), "{name} is allowed and refused");
    }
    let mut names: Vec<&str> = ALLOWED.iter().map(|(n, _)| *n).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), ALLOWED.len(), "duplicate names in ALLOWED");
}
