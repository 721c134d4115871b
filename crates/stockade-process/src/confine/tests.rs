//! The seccomp program, run by an emulator of the classic-BPF instructions it uses on every
//! syscall number and on swept arguments, checked against the lists it was built from; and
//! the kernel's cost of installing it, counted in instructions.

use seccompiler::sock_filter;

use super::program::*;
use super::*;

/// A `seccomp_data`: the number, the architecture and the six arguments.
#[derive(Clone, Copy)]
struct Call {
    arch: u32,
    nr: u32,
    args: [u64; 6],
}

impl Call {
    fn new(nr: i64, args: &[u64]) -> Self {
        let mut a = [0; 6];
        a[..args.len()].copy_from_slice(args);
        Self { arch: AUDIT_ARCH_X86_64, nr: u32::try_from(nr).unwrap_or(u32::MAX), args: a }
    }

    /// The 32-bit word at `offset` of the structure, as the kernel's absolute load reads it.
    fn word(&self, offset: u32) -> Option<u32> {
        match offset {
            0 => Some(self.nr),
            4 => Some(self.arch),
            16..=63 if offset.is_multiple_of(4) => {
                let arg = self.args[usize::try_from((offset - 16) / 8).ok()?];
                Some(if offset.is_multiple_of(8) { arg as u32 } else { (arg >> 32) as u32 })
            }
            _ => None,
        }
    }
}

/// Runs the classic-BPF instructions the program uses (absolute word loads, AND with a
/// constant, JA, JEQ/JGE/JSET against constants, constant returns) on `call`, as the kernel
/// would: the return value and how many instructions ran; `None` for anything else.
fn run(p: &[sock_filter], call: &Call) -> Option<(u32, usize)> {
    let (mut pc, mut acc, mut steps) = (0usize, 0u32, 0usize);
    while let Some(i) = p.get(pc) {
        steps += 1;
        let jump = |taken: bool| pc + 1 + usize::from(if taken { i.jt } else { i.jf });
        pc = match i.code {
            LD_W_ABS => {
                acc = call.word(i.k)?;
                pc + 1
            }
            ALU_AND_K => {
                acc &= i.k;
                pc + 1
            }
            JA => pc + 1 + usize::try_from(i.k).ok()?,
            JEQ_K => jump(acc == i.k),
            JGE_K => jump(acc >= i.k),
            JSET_K => jump(acc & i.k != 0),
            RET_K => return Some((i.k, steps)),
            _ => return None,
        };
    }
    None
}

fn verdict(p: &[sock_filter], nr: i64, args: &[u64]) -> u32 {
    run(p, &Call::new(nr, args)).expect("an instruction the emulator knows").0
}

/// The calls with argument rules.
fn narrowed(nr: i64) -> bool {
    [libc::SYS_clone, libc::SYS_socket, libc::SYS_ioctl, libc::SYS_personality].contains(&nr)
        || SETID_MODE_ARG.iter().any(|(_, n, _)| *n == nr)
}

/// Every syscall number (and its x32 twin) gets its list's verdict: allowed, EPERM for the
/// refused ones, ENOSYS for the rest, whatever the arguments; another architecture is
/// killed. The narrowed calls are allowed with arguments their rules let through.
#[test]
fn the_program_gives_every_call_its_lists_verdict() {
    let p = seccomp_program().unwrap();
    for nr in 0..1024i64 {
        let listed = |list: &[(&str, i64)]| list.iter().any(|(_, a)| *a == nr);
        let want = if listed(ALLOWED) {
            RET_ALLOW
        } else if listed(DENIED) {
            RET_EPERM
        } else {
            RET_ENOSYS
        };
        if narrowed(nr) {
            assert_eq!(want, RET_ALLOW, "a narrowed call is on the allowlist: {nr}");
        } else {
            assert_eq!(verdict(&p, nr, &[]), want, "syscall {nr}");
            assert_eq!(verdict(&p, nr, &[u64::MAX; 6]), want, "syscall {nr} with arguments");
        }
        // The x32 ABI's numbers are refused, whatever the base number.
        let x32 = Call { nr: u32::try_from(nr).unwrap() | X32_SYSCALL_BIT, ..Call::new(nr, &[]) };
        assert_eq!(run(&p, &x32).map(|r| r.0), Some(RET_ENOSYS), "x32 syscall {nr}");
    }
    assert_eq!(run(&p, &Call { nr: u32::MAX, ..Call::new(0, &[]) }).map(|r| r.0), Some(RET_ENOSYS));
    // Another architecture (i386 through the compat entry) kills the process.
    assert_eq!(run(&p, &Call { arch: 0x4000_0003, ..Call::new(0, &[]) }).map(|r| r.0), Some(RET_KILL_PROCESS));
}

/// The kernel's cost of installing the filter, in every run, is in proportion to its length
/// (it converts and JIT-compiles it) and to the instructions it runs for each syscall number
/// (it emulates it for every number, to fill its action cache). seccompiler's two filters
/// were 920 instructions and took about 0.5 ms of every run here; the program is one search
/// (at most 12 instructions for a number without argument rules, about 6,100 over the first
/// 512 numbers, where the old allowlist alone ran about 11,900) and under 200 instructions.
#[test]
fn the_program_is_short_and_quick_to_emulate() {
    let p = seccomp_program().unwrap();
    assert!(p.len() < 200, "{} instructions", p.len());
    let steps = |nr: i64| run(&p, &Call::new(nr, &[])).unwrap().1;
    let deepest = (0..1024).filter(|nr| !narrowed(*nr)).map(steps).max();
    assert!(deepest <= Some(12), "the search runs {deepest:?} instructions for some number");
    let emulated: usize = (0..512).map(steps).sum();
    assert!(emulated < 7_000, "{emulated} instructions emulated over 512 numbers");
}

/// What each argument rule refuses, written from the lists without the program's layout:
/// `None` for a call without rules. Arguments are read as the kernel reads them, 32 bits.
fn refused_by_arguments(nr: i64, args: &[u64; 6]) -> Option<bool> {
    let word = |i: usize| u64::from(args[i] as u32);
    let any = |list: &[(&str, u64)], v: u64| list.iter().any(|(_, x)| *x == v);
    Some(match nr {
        libc::SYS_clone => CLONE_NEW.iter().any(|(_, f)| word(0) & f != 0),
        libc::SYS_socket => match word(0) {
            16 => word(2) != 0,
            2 | 10 => !any(INET_PROTOCOLS, word(2)) || !any(INET_TYPES, word(1) & SOCK_TYPE_MASK),
            family => !any(SOCKET_FAMILIES, family),
        },
        libc::SYS_ioctl => word(1) == TIOCSTI || word(1) == TIOCLINUX,
        libc::SYS_personality => word(0) != 0 && word(0) != PERSONALITY_QUERY,
        _ => {
            let (_, _, mode) = SETID_MODE_ARG.iter().find(|(_, n, _)| *n == nr)?;
            let mode = usize::from(*mode);
            let opens = nr == libc::SYS_open || nr == libc::SYS_openat;
            let reads_mode = !opens || CREATE_FLAGS.iter().any(|f| word(mode - 1) & f != 0);
            reads_mode && SETID_BITS.iter().any(|b| word(mode) & b != 0)
        }
    })
}

/// The argument rules, swept: the program agrees with [`refused_by_arguments`] on every
/// clone flag, every socket family, type and protocol of note, ioctl requests, personalities,
/// and every mode (with the flags that make `open` read it), also with the high half of each
/// argument set, which the kernel ignores.
#[test]
fn the_program_refuses_by_argument_as_the_rules_say() {
    let p = seccomp_program().unwrap();
    let high = 0xdead_beef_0000_0000u64;
    let mut checked = 0;
    let mut check = |nr: i64, args: [u64; 6]| {
        for args in [args, args.map(|a| a | high)] {
            let want = if refused_by_arguments(nr, &args).unwrap() { RET_EPERM } else { RET_ALLOW };
            assert_eq!(verdict(&p, nr, &args), want, "syscall {nr} with {args:x?}");
            checked += 1;
        }
    };
    for bit in 0..32 {
        check(libc::SYS_clone, [1 << bit, 0, 0, 0, 0, 0]);
        check(libc::SYS_clone, [(1 << bit) | 0x003d_0f00, 0, 0, 0, 0, 0]);
    }
    for family in 0..48 {
        for ty in (0..16).flat_map(|t| [t, t | 0o4000, t | 0o2_000_000]) {
            for protocol in [0, 1, 6, 9, 17, 58, 132, 255, 262] {
                check(libc::SYS_socket, [family, ty, protocol, 0, 0, 0]);
            }
        }
    }
    for request in [0x5401, 0x5413, TIOCSTI, TIOCLINUX, TIOCSTI + 1] {
        check(libc::SYS_ioctl, [0, request, 0, 0, 0, 0]);
    }
    for persona in [0, 8, 0x0040_0000, 0x0002_0000, PERSONALITY_QUERY, PERSONALITY_QUERY - 1] {
        check(libc::SYS_personality, [persona, 0, 0, 0, 0, 0]);
    }
    let o_tmpfile = 0o20_200_000;
    for (_, nr, mode) in SETID_MODE_ARG {
        let mode = usize::from(*mode);
        for flags in [0, libc::O_WRONLY | libc::O_TRUNC, libc::O_CREAT, libc::O_CREAT | libc::O_EXCL, o_tmpfile] {
            for bits in 0..0o10000 {
                let mut args = [0; 6];
                args[mode] = bits;
                args[mode - 1] = flags as u64;
                check(*nr, args);
            }
        }
    }
    assert!(checked > 400_000, "{checked}");
}

/// Named cases, so that a slip shared by the program and [`refused_by_arguments`] still shows.
#[test]
fn the_program_refuses_the_named_cases() {
    let p = seccomp_program().unwrap();
    let v = |nr: i64, args: &[u64]| verdict(&p, nr, args);
    let (af_inet, af_inet6, af_unix, af_netlink, af_packet) = (2, 10, 1, 16, 17);
    assert_eq!(v(libc::SYS_clone, &[libc::SIGCHLD as u64]), RET_ALLOW);
    assert_eq!(v(libc::SYS_clone, &[0x003d_0f00]), RET_ALLOW, "pthread_create's flags");
    for (name, flag) in CLONE_NEW {
        assert_eq!(v(libc::SYS_clone, &[*flag | libc::SIGCHLD as u64]), RET_EPERM, "clone {name}");
    }
    assert_eq!(v(libc::SYS_socket, &[af_unix, 1, 0]), RET_ALLOW);
    assert_eq!(v(libc::SYS_socket, &[af_netlink, 3, 0]), RET_ALLOW, "NETLINK_ROUTE");
    assert_eq!(v(libc::SYS_socket, &[af_netlink, 3, 9]), RET_EPERM, "NETLINK_AUDIT");
    assert_eq!(v(libc::SYS_socket, &[af_packet, 3, 0]), RET_EPERM, "AF_PACKET");
    for family in [af_inet, af_inet6] {
        assert_eq!(v(libc::SYS_socket, &[family, 1 | 0o4000 | 0o2_000_000, 6]), RET_ALLOW, "TCP");
        assert_eq!(v(libc::SYS_socket, &[family, 2, 17]), RET_ALLOW, "UDP");
        assert_eq!(v(libc::SYS_socket, &[family, 2, 1]), RET_ALLOW, "ping");
        assert_eq!(v(libc::SYS_socket, &[family, 1, 262]), RET_EPERM, "MPTCP");
        assert_eq!(v(libc::SYS_socket, &[family, 5, 0]), RET_EPERM, "SOCK_SEQPACKET");
        assert_eq!(v(libc::SYS_socket, &[family, 3, 0]), RET_EPERM, "SOCK_RAW");
    }
    assert_eq!(v(libc::SYS_ioctl, &[0, TIOCSTI]), RET_EPERM);
    assert_eq!(v(libc::SYS_ioctl, &[0, TIOCLINUX]), RET_EPERM);
    assert_eq!(v(libc::SYS_ioctl, &[0, 0x5401]), RET_ALLOW, "TCGETS");
    assert_eq!(v(libc::SYS_personality, &[PERSONALITY_QUERY]), RET_ALLOW);
    assert_eq!(v(libc::SYS_personality, &[0]), RET_ALLOW);
    assert_eq!(v(libc::SYS_personality, &[0x0040_0000]), RET_EPERM, "READ_IMPLIES_EXEC");
    assert_eq!(v(libc::SYS_chmod, &[0, 0o4755]), RET_EPERM);
    assert_eq!(v(libc::SYS_fchmodat, &[0, 0, 0o2755]), RET_EPERM);
    assert_eq!(v(libc::SYS_chmod, &[0, 0o755]), RET_ALLOW);
    assert_eq!(v(libc::SYS_openat, &[0, 0, 0, 0o4755]), RET_ALLOW, "no O_CREAT: the mode is not read");
    assert_eq!(v(libc::SYS_openat, &[0, 0, libc::O_CREAT as u64, 0o4755]), RET_EPERM);
    assert_eq!(v(libc::SYS_open, &[0, 0o20_200_000, 0o6000]), RET_EPERM, "O_TMPFILE");
    assert_eq!(v(libc::SYS_ptrace, &[]), RET_EPERM);
    assert_eq!(v(libc::SYS_io_uring_setup, &[]), RET_ENOSYS);
    assert_eq!(v(libc::SYS_clone3, &[]), RET_ENOSYS);
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
