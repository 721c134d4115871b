//! The seccomp filter as one classic-BPF program, assembled here from the lists in
//! [`super`]: the architecture check, a binary search over the syscall numbers, and a short
//! block of argument checks for each call narrowed by argument.
//!
//! Written here rather than by seccompiler's rule compiler because of what the kernel does
//! with a filter at install, in every run: it converts and JIT-compiles it (in proportion to
//! its length) and emulates it for every syscall number to fill its action cache (in
//! proportion to the instructions run per number). seccompiler's two filters (a 151-instruction
//! allowlist and a 769-instruction EPERM filter, which compiles each condition to several
//! instructions and each rule separately) took about 0.5 ms of every run to install on the
//! test VM; this program is about a fifth of their length and one install. The tests run it
//! in an emulator on every syscall number and on swept arguments against the lists.

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, sock_filter};

use super::{ALLOWED, CLONE_NEW, CREATE_FLAGS, DENIED, INET_PROTOCOLS, INET_TYPES, NOT_IMPLEMENTED, PERSONALITY_QUERY};
use super::{SETID_BITS, SETID_MODE_ARG, SOCK_TYPE_MASK, SOCKET_FAMILIES, TIOCLINUX, TIOCSTI, narrowed};

pub(crate) const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
pub(crate) const X32_SYSCALL_BIT: u32 = 0x4000_0000;
pub(crate) const RET_ALLOW: u32 = 0x7fff_0000;
pub(crate) const RET_KILL_PROCESS: u32 = 0x8000_0000;
pub(crate) const RET_ERRNO: u32 = 0x0005_0000;
pub(crate) const RET_ENOSYS: u32 = RET_ERRNO | libc::ENOSYS as u32;
pub(crate) const RET_EPERM: u32 = RET_ERRNO | libc::EPERM as u32;
pub(crate) const LD_W_ABS: u16 = 0x20;
pub(crate) const ALU_AND_K: u16 = 0x54;
pub(crate) const JA: u16 = 0x05;
pub(crate) const JEQ_K: u16 = 0x15;
pub(crate) const JGE_K: u16 = 0x35;
pub(crate) const JSET_K: u16 = 0x45;
pub(crate) const RET_K: u16 = 0x06;

/// Offsets in `struct seccomp_data`.
const NR: u32 = 0;
const ARCH: u32 = 4;
/// The low 32 bits of argument `i` (x86_64 is little-endian). Every argument checked here is
/// read by the kernel as 32 bits (`int` and `unsigned int` parameters, and `clone`'s flags,
/// of which the kernel keeps the low 32 bits), so the high half is never the kernel's.
const fn arg(i: u8) -> u32 {
    16 + 8 * i as u32
}

/// Where a jump goes: the next instruction, or a label bound later in the program.
#[derive(Clone, Copy)]
enum To {
    Next,
    Label(usize),
}

/// A classic-BPF program with forward jumps to labels, resolved by [`Asm::finish`].
#[derive(Default)]
struct Asm {
    code: Vec<(u16, To, To, u32)>,
    bound: Vec<Option<usize>>,
}

impl Asm {
    fn label(&mut self) -> usize {
        self.bound.push(None);
        self.bound.len() - 1
    }

    fn bind(&mut self, label: usize) {
        self.bound[label] = Some(self.code.len());
    }

    fn op(&mut self, code: u16, k: u32) {
        self.code.push((code, To::Next, To::Next, k));
    }

    fn jump(&mut self, code: u16, k: u32, taken: To, not: To) {
        self.code.push((code, taken, not, k));
    }

    /// `JA` to `to` (a label; `Next` needs no jump).
    fn go_to(&mut self, to: To) {
        if let To::Label(_) = to {
            self.code.push((JA, to, To::Next, 0));
        }
    }

    /// The program, each label's jump an offset; `Err` for a jump backwards, to a label never
    /// bound, or too far for its field (a policy that outgrew the layout: the run is refused).
    fn finish(self) -> Result<BpfProgram, String> {
        let offset = |pc: usize, to: To| -> Result<usize, String> {
            match to {
                To::Next => Ok(0),
                To::Label(l) => self.bound[l]
                    .and_then(|at| at.checked_sub(pc + 1))
                    .ok_or_else(|| format!("seccomp program bug: label {l} is not ahead of instruction {pc}")),
            }
        };
        let short = |n: usize| u8::try_from(n).map_err(|_| format!("seccomp program bug: a jump of {n} instructions"));
        let mut out = Vec::with_capacity(self.code.len());
        for (pc, (code, taken, not, k)) in self.code.iter().copied().enumerate() {
            out.push(if code == JA {
                let far = u32::try_from(offset(pc, taken)?).map_err(|e| e.to_string())?;
                sock_filter { code, jt: 0, jf: 0, k: far }
            } else {
                sock_filter { code, jt: short(offset(pc, taken)?)?, jf: short(offset(pc, not)?)?, k }
            });
        }
        Ok(out)
    }
}

/// What a syscall number gets from the search: a verdict, or the argument block of a call
/// narrowed by argument (its number).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Leaf {
    Ret(u32),
    Args(i64),
}

/// Each syscall number's leaf, as maximal runs of one leaf, `(first number, leaf)`, ascending
/// from 0: allowed for [`ALLOWED`], EPERM for [`DENIED`], its argument block for a narrowed
/// call, ENOSYS for anything else. A run ends where the next begins; the last runs to the x32
/// bit.
fn runs() -> Result<Vec<(u32, Leaf)>, String> {
    let mut listed: BTreeMap<u32, Leaf> = BTreeMap::new();
    let entries = ALLOWED
        .iter()
        .map(|(_, nr)| (*nr, Leaf::Ret(RET_ALLOW)))
        .chain(DENIED.iter().map(|(_, nr)| (*nr, Leaf::Ret(RET_EPERM))))
        .chain(narrowed().map(|nr| (nr, Leaf::Args(nr))));
    for (nr, leaf) in entries {
        let number = u32::try_from(nr).ok().filter(|n| *n < X32_SYSCALL_BIT);
        listed.insert(number.ok_or_else(|| format!("seccomp policy bug: syscall {nr} is out of range"))?, leaf);
    }
    let last = listed.keys().next_back().map_or(0, |nr| nr + 1);
    let mut runs: Vec<(u32, Leaf)> = Vec::new();
    for nr in 0..=last {
        let leaf = listed.get(&nr).copied().unwrap_or(Leaf::Ret(RET_ENOSYS));
        if runs.last().is_none_or(|(_, l)| *l != leaf) {
            runs.push((nr, leaf));
        }
    }
    Ok(runs)
}

/// The whole filter: other architectures killed, the x32 numbers ENOSYS, then the search,
/// whose leaves are the three shared returns and the argument blocks.
pub(crate) fn seccomp_program() -> Result<BpfProgram, String> {
    if let Some((name, _)) = DENIED.iter().chain(NOT_IMPLEMENTED).find(|(_, nr)| ALLOWED.iter().any(|(_, a)| a == nr)) {
        return Err(format!("seccomp policy bug: {name} is both allowed and refused"));
    }
    if let Some(nr) = narrowed().find(|nr| !ALLOWED.iter().any(|(_, a)| a == nr)) {
        return Err(format!("seccomp policy bug: syscall {nr} is narrowed but not allowed"));
    }
    let mut a = Asm::default();
    let (allow, eperm, enosys, kill) = (a.label(), a.label(), a.label(), a.label());
    let mut leaves: BTreeMap<Leaf, usize> =
        [(RET_ALLOW, allow), (RET_EPERM, eperm), (RET_ENOSYS, enosys)].map(|(r, l)| (Leaf::Ret(r), l)).into();
    for nr in narrowed() {
        leaves.insert(Leaf::Args(nr), a.label());
    }
    a.op(LD_W_ABS, ARCH);
    a.jump(JEQ_K, AUDIT_ARCH_X86_64, To::Next, To::Label(kill));
    a.op(LD_W_ABS, NR);
    a.jump(JGE_K, X32_SYSCALL_BIT, To::Label(enosys), To::Next);
    let runs = runs()?;
    let root = subtree(&mut a, &runs, &leaves);
    search(&mut a, &runs, root, &leaves);
    argument_blocks(&mut a, &leaves, allow, eperm)?;
    for (label, ret) in [(allow, RET_ALLOW), (eperm, RET_EPERM), (enosys, RET_ENOSYS), (kill, RET_KILL_PROCESS)] {
        a.bind(label);
        a.op(RET_K, ret);
    }
    a.finish()
}

/// The label a search over `runs` starts at: its leaf's, or a new one for its comparisons.
fn subtree(a: &mut Asm, runs: &[(u32, Leaf)], leaves: &BTreeMap<Leaf, usize>) -> usize {
    match runs {
        [(_, leaf)] => leaves[leaf],
        _ => a.label(),
    }
}

/// The comparisons of a search over `runs` (non-empty, ascending), at `label`: each splits
/// its runs in halves by the first number of the upper half.
fn search(a: &mut Asm, runs: &[(u32, Leaf)], label: usize, leaves: &BTreeMap<Leaf, usize>) {
    if runs.len() < 2 {
        return;
    }
    a.bind(label);
    let (below, above) = runs.split_at(runs.len() / 2);
    let (lo, hi) = (subtree(a, below, leaves), subtree(a, above, leaves));
    a.jump(JGE_K, above[0].0, To::Label(hi), To::Label(lo));
    search(a, below, lo, leaves);
    search(a, above, hi, leaves);
}

/// Each narrowed call's argument checks, at its leaf's label; each ends at `allow` or `eperm`.
/// `Err` for a narrowed call without a rule here, rather than a label with no code after it.
fn argument_blocks(a: &mut Asm, leaves: &BTreeMap<Leaf, usize>, allow: usize, eperm: usize) -> Result<(), String> {
    let (allow, eperm) = (To::Label(allow), To::Label(eperm));
    let setid = SETID_BITS.iter().fold(0, |m, b| m | b) as u32;
    for (leaf, label) in leaves {
        let Leaf::Args(nr) = *leaf else { continue };
        a.bind(*label);
        match nr {
            libc::SYS_clone => {
                a.op(LD_W_ABS, arg(0));
                a.jump(JSET_K, CLONE_NEW.iter().fold(0, |m, (_, f)| m | f) as u32, eperm, allow);
            }
            libc::SYS_socket => socket_block(a, allow, eperm),
            libc::SYS_ioctl => {
                a.op(LD_W_ABS, arg(1));
                a.jump(JEQ_K, TIOCSTI as u32, eperm, To::Next);
                a.jump(JEQ_K, TIOCLINUX as u32, eperm, allow);
            }
            libc::SYS_personality => {
                a.op(LD_W_ABS, arg(0));
                a.jump(JEQ_K, 0, allow, To::Next);
                a.jump(JEQ_K, PERSONALITY_QUERY as u32, allow, eperm);
            }
            _ => {
                let (_, _, mode) = SETID_MODE_ARG
                    .iter()
                    .find(|(_, n, _)| *n == nr)
                    .ok_or_else(|| format!("seccomp program bug: syscall {nr} is narrowed without a rule"))?;
                if nr == libc::SYS_open || nr == libc::SYS_openat {
                    // The mode is read only with O_CREAT or O_TMPFILE; the flags come before it.
                    a.op(LD_W_ABS, arg(mode - 1));
                    a.jump(JSET_K, CREATE_FLAGS.iter().fold(0, |m, f| m | f) as u32, To::Next, allow);
                }
                a.op(LD_W_ABS, arg(*mode));
                a.jump(JSET_K, setid, eperm, allow);
            }
        }
    }
    Ok(())
}

/// `socket(family, type, protocol)`: a family on [`SOCKET_FAMILIES`]; netlink only as
/// `NETLINK_ROUTE` (protocol 0); inet and inet6 only with a type and protocol on the lists.
fn socket_block(a: &mut Asm, allow: To, eperm: To) {
    let (netlink, inet) = (a.label(), a.label());
    a.op(LD_W_ABS, arg(0));
    for (name, family) in SOCKET_FAMILIES {
        let to = match *name {
            "AF_NETLINK" => To::Label(netlink),
            "AF_INET" | "AF_INET6" => To::Label(inet),
            _ => allow,
        };
        a.jump(JEQ_K, *family as u32, to, To::Next);
    }
    a.go_to(eperm);
    a.bind(netlink);
    a.op(LD_W_ABS, arg(2));
    a.jump(JEQ_K, 0, allow, eperm);
    a.bind(inet);
    let typed = a.label();
    a.op(LD_W_ABS, arg(2));
    for (_, protocol) in INET_PROTOCOLS {
        a.jump(JEQ_K, *protocol as u32, To::Label(typed), To::Next);
    }
    a.go_to(eperm);
    a.bind(typed);
    a.op(LD_W_ABS, arg(1));
    a.op(ALU_AND_K, SOCK_TYPE_MASK as u32);
    for (_, ty) in INET_TYPES {
        a.jump(JEQ_K, *ty as u32, allow, To::Next);
    }
    a.go_to(eperm);
}
