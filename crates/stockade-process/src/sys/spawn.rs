//! A vfork-style spawn for a session's execs: `clone(CLONE_VM | CLONE_VFORK)` onto a stack
//! of its own, the child taking the guest's steps with raw system calls on a [`Plan`] the
//! parent (the session's init) built beforehand, then `execve`. It is how `posix_spawn(3)`
//! and Go's `forkExec` start a program: no copy of the parent's page tables, no
//! copy-on-write faults, and nothing for the exec to tear down, where a `fork` cost the
//! session's init most of an exec's time. The parent is suspended until the child has
//! exec'd or exited, so the child may read the parent's memory (the plan) and write one
//! word of it (the failed step), and touches nothing else of it.
//!
//! Between the clone and the exec only the system-call wrappers of this module run: no
//! allocation, no lock, no formatting, nothing user-supplied (STYLE §5.4). Every signal is
//! blocked in the parent across the clone, so no handler of the parent's can run on the
//! child's stack with the parent's memory; the child resets every disposition to the
//! default before it unblocks them, just before the exec.

use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{caps, check, fs, process, tty};

/// The steps of the child, in order; a failed one is reported with its errno.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Step {
    /// Moving the exec's descriptors onto 0–2.
    Stdio = 1,
    /// `setsid`.
    Setsid,
    /// `TIOCSCTTY` on the exec's pty.
    Terminal,
    /// Dropping every capability.
    Capabilities,
    /// Capabilities still held after dropping them (errno is 0).
    CapabilitiesRemain,
    /// `no_new_privs`.
    NoNewPrivs,
    /// One of the plan's rlimits (the failed one's index is reported beside the errno).
    Rlimit,
    /// The working directory.
    Chdir,
    /// Closing every descriptor past 2.
    Fds,
    /// Resetting signal dispositions and the mask.
    Signals,
    /// `execve` itself.
    Exec,
}

impl Step {
    fn from_u8(v: u8) -> Option<Self> {
        [
            Self::Stdio,
            Self::Setsid,
            Self::Terminal,
            Self::Capabilities,
            Self::CapabilitiesRemain,
            Self::NoNewPrivs,
            Self::Rlimit,
            Self::Chdir,
            Self::Fds,
            Self::Signals,
            Self::Exec,
        ]
        .into_iter()
        .find(|s| *s as u8 == v)
    }
}

/// Everything the child does, worked out by the parent. Built with [`Plan::new`]; the
/// strings are C strings and the pointer arrays end with null, so the child allocates
/// nothing.
pub(crate) struct Plan {
    stdio: [RawFd; 3],
    controlling_tty: bool,
    rlimits: Vec<(libc::__rlimit_resource_t, libc::rlimit)>,
    cwd: CString,
    program: CString,
    _argv: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    _envp: Vec<CString>,
    envp_ptrs: Vec<*const libc::c_char>,
    /// A step the child fails, as if its call had returned `EPERM`, after taking it (0:
    /// none): the tests' way to see every step's failure reported the same on every path.
    fail_at: u8,
}

impl Plan {
    /// A plan for `program` (the path to exec, found by the parent) with `argv` and `env`,
    /// started in `cwd` with `stdio` as its descriptors 0–2 (each at least 3), the pty on
    /// them as its controlling terminal if `controlling_tty`, and `rlimits` as (resource,
    /// soft, hard). `Err` names an argument with a NUL byte.
    pub(crate) fn new(
        program: &str,
        argv: &[String],
        env: &[(String, String)],
        cwd: &str,
        stdio: [RawFd; 3],
        controlling_tty: bool,
        rlimits: &[(libc::__rlimit_resource_t, u64, u64)],
    ) -> io::Result<Self> {
        let c = |s: String, what: &str| {
            CString::new(s).map_err(|_| io::Error::other(format!("{what} contains a NUL byte")))
        };
        let argv: Vec<CString> = argv.iter().map(|a| c(a.clone(), "an argument")).collect::<io::Result<_>>()?;
        let envp: Vec<CString> =
            env.iter().map(|(k, v)| c(format!("{k}={v}"), "an environment variable")).collect::<io::Result<_>>()?;
        let ptrs = |v: &[CString]| v.iter().map(|s| s.as_ptr()).chain([std::ptr::null()]).collect();
        Ok(Self {
            stdio,
            controlling_tty,
            rlimits: rlimits
                .iter()
                .map(|(r, soft, hard)| (*r, libc::rlimit { rlim_cur: *soft, rlim_max: *hard }))
                .collect(),
            cwd: c(cwd.to_owned(), "the working directory")?,
            program: c(program.to_owned(), "the program")?,
            argv_ptrs: ptrs(&argv),
            _argv: argv,
            envp_ptrs: ptrs(&envp),
            _envp: envp,
            fail_at: 0,
        })
    }

    /// Fails `step` (by its number; see [`Plan::fail_at`]), for tests.
    pub(crate) fn fail_at(mut self, step: Option<u8>) -> Self {
        self.fail_at = step.unwrap_or(0);
        self
    }
}

/// The child's stack: anonymous memory with a guard page below it (a child that overran it
/// would fault and die, not write over the parent's memory). Reused for every spawn: the
/// parent waits for each child to exec or exit before it returns.
pub(crate) struct Stack {
    base: *mut libc::c_void,
    len: usize,
}

/// The child's stack size: its steps are a few frames of plain calls.
const STACK_LEN: usize = 256 * 1024;

impl Stack {
    pub(crate) fn new() -> io::Result<Self> {
        let page = 4096;
        let len = STACK_LEN + page;
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing; no
        // memory of ours is touched. The result is checked against MAP_FAILED.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Self { base, len };
        // SAFETY: the first page of the mapping just made, which nothing uses yet.
        check(unsafe { libc::mprotect(base, page, libc::PROT_NONE) })?;
        Ok(stack)
    }

    /// The top of the stack (it grows down), 16-byte aligned.
    fn top(&self) -> *mut libc::c_void {
        // The mapping's end is page-aligned, so 16-byte aligned too.
        self.base.cast::<u8>().wrapping_add(self.len).cast()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` made, which no child is using (a spawn
        // borrows the stack until its child has exec'd or exited).
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// How a spawn went: the child's pid, and the step that failed (with its errno, and for an
/// rlimit the index of the failed one), if one did; a child whose step failed has exited 126.
#[derive(Debug)]
pub(crate) struct Spawned {
    pub(crate) pid: libc::pid_t,
    pub(crate) failed: Option<(Step, i32, u8)>,
}

/// What the parent hands the child: the plan, and one word the child writes a failure into.
struct Shared<'a> {
    plan: &'a Plan,
    failed: AtomicU64,
}

/// Starts the plan's program in a child. `Err` only when the clone itself fails.
pub(crate) fn spawn(plan: &Plan, stack: &mut Stack) -> io::Result<Spawned> {
    let shared = Shared { plan, failed: AtomicU64::new(0) };
    // SAFETY: an all-zero sigset_t is a valid value; sigfillset makes it the full set.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above, for the set the old mask is written into.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: sigfillset writes into `all`, on this frame.
    unsafe { libc::sigfillset(&mut all) };
    // SAFETY: sigprocmask reads `all` and writes the old mask into `old`, both on this frame.
    check(unsafe { libc::sigprocmask(libc::SIG_SETMASK, &all, &mut old) })?;
    // SAFETY: `child` runs on `stack` (a mapping of its own, borrowed mutably for this call,
    // so no other child uses it) with `shared` as its argument. CLONE_VM shares this
    // process's memory, and CLONE_VFORK suspends this thread until the child has exec'd or
    // exited, so `shared` (on this frame) outlives every access the child makes, and
    // nothing here changes memory while the child runs. The child's descriptor table and
    // signal dispositions are its own (no CLONE_FILES, no CLONE_SIGHAND); every signal is
    // blocked (above), so no handler of ours runs in it before it resets them. This process
    // is single-threaded (a session's init), so no lock can be held by another thread.
    let pid = unsafe {
        libc::clone(
            child,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::from_ref(&shared).cast_mut().cast(),
        )
    };
    let clone_error = io::Error::last_os_error();
    // SAFETY: sigprocmask reads `old`, on this frame.
    let restored = check(unsafe { libc::sigprocmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) });
    if pid == -1 {
        return Err(clone_error);
    }
    restored?;
    let word = shared.failed.load(Ordering::SeqCst);
    let failed = (word != 0).then(|| {
        let step = Step::from_u8((word >> 40) as u8).unwrap_or(Step::Exec);
        (step, (word & 0xffff_ffff) as u32 as i32, (word >> 32) as u8)
    });
    Ok(Spawned { pid, failed })
}

/// The child: the plan's steps with raw system calls, then `execve`. Never returns.
extern "C" fn child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Shared` that `spawn` passed, alive on the suspended parent's
    // frame until this child execs or exits (CLONE_VFORK).
    let shared = unsafe { &*arg.cast::<Shared<'_>>() };
    let fail = |step: Step, index: u8, e: Option<i32>| -> ! {
        let errno = e.unwrap_or(0) as u32;
        shared
            .failed
            .store((u64::from(step as u8) << 40) | (u64::from(index) << 32) | u64::from(errno), Ordering::SeqCst);
        // SAFETY: _exit ends this child at once (no atexit handler, no stdio flush of the
        // parent's buffers, which this child shares).
        unsafe { libc::_exit(126) }
    };
    let plan = shared.plan;
    // A step's outcome: on to the next, or the child's end with the step's errno.
    let took = |step: Step, index: u8, r: io::Result<()>| {
        let e = match r {
            Err(e) => e.raw_os_error(),
            Ok(()) if plan.fail_at == step as u8 => Some(libc::EPERM),
            Ok(()) => return,
        };
        fail(step, index, e)
    };
    for (fd, target) in plan.stdio.iter().zip(0..) {
        took(Step::Stdio, 0, fs::dup_onto(*fd, target));
    }
    took(Step::Setsid, 0, process::setsid());
    if plan.controlling_tty {
        took(Step::Terminal, 0, tty::set_controlling(0));
    }
    took(Step::Capabilities, 0, caps::drop_all());
    match caps::remaining() {
        Ok(0) if plan.fail_at != Step::CapabilitiesRemain as u8 => {}
        Ok(_) => fail(Step::CapabilitiesRemain, 0, None),
        Err(e) => fail(Step::Capabilities, 0, e.raw_os_error()),
    }
    took(Step::NoNewPrivs, 0, caps::set_no_new_privs());
    for (i, (resource, lim)) in plan.rlimits.iter().enumerate() {
        // SAFETY: setrlimit reads one rlimit struct of the plan's, which outlives the call.
        took(
            Step::Rlimit,
            u8::try_from(i).unwrap_or(u8::MAX),
            check(unsafe { libc::setrlimit(*resource, lim) }).map(drop),
        );
    }
    // SAFETY: chdir reads the plan's NUL-terminated path.
    took(Step::Chdir, 0, check(unsafe { libc::chdir(plan.cwd.as_ptr()) }).map(drop));
    took(Step::Fds, 0, fs::close_range(3, u32::MAX));
    took(Step::Signals, 0, process::reset_signals());
    if plan.fail_at == Step::Exec as u8 {
        fail(Step::Exec, 0, Some(libc::EPERM));
    }
    // SAFETY: the program and every pointer of the two arrays point at NUL-terminated
    // strings the plan owns (alive: the parent is suspended), and both arrays end with null.
    unsafe { libc::execve(plan.program.as_ptr(), plan.argv_ptrs.as_ptr(), plan.envp_ptrs.as_ptr()) };
    fail(Step::Exec, 0, io::Error::last_os_error().raw_os_error())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_round_trip_through_their_number() {
        for v in 0..=u8::MAX {
            if let Some(s) = Step::from_u8(v) {
                assert_eq!(s as u8, v);
            }
        }
        assert_eq!(Step::from_u8(Step::Exec as u8), Some(Step::Exec));
        assert_eq!(Step::from_u8(0), None);
    }

    #[test]
    fn a_plan_refuses_a_nul_byte() {
        let refused = Plan::new("/bin/true", &["a\0b".into()], &[], "/", [3, 4, 5], false, &[]).err();
        assert!(refused.is_some_and(|e| e.to_string().contains("an argument contains a NUL byte")));
    }
}
