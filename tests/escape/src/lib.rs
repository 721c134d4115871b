//! The escape-attempt harness: runs every attack program against every tier and decides each
//! verdict from the world, never from the attack's own report.
//!
//! Expectations are data ([`expect`]): one constant per attack, with a field per stockade
//! tier. `foreach_attack!` is generated from the attack programs, so an attack without a
//! constant, or a constant without a value for some tier, does not compile.

#![allow(non_upper_case_globals, reason = "expectation constants are named exactly like the attack programs")]

pub mod grants;
pub mod net;
pub mod world;

include!(concat!(env!("OUT_DIR"), "/attacks.rs"));

/// What happened to one attack in one tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every attempt failed, and the world is unchanged.
    Denied,
    /// Something worked, but only inside the sandbox; the world is unchanged.
    Contained,
    /// The run was killed by a limit (deadline, memory, output, cpu); the world is unchanged.
    Killed,
    /// The attack does not apply to this tier.
    NotApplicable(&'static str),
    /// The world changed: an escape. The string is the evidence.
    Escaped(String),
    /// The tier could not run here (shown as SKIPPED).
    Skipped(String),
}

impl Outcome {
    /// A short name for tables.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Self::Denied => "Denied",
            Self::Contained => "Contained",
            Self::Killed => "Killed",
            Self::NotApplicable(_) => "n/a",
            Self::Escaped(_) => "ESCAPED",
            Self::Skipped(_) => "SKIPPED",
        }
    }

    /// True if `self` is one of `allowed` (for `NotApplicable`, any reason matches).
    #[must_use]
    pub fn is_one_of(&self, allowed: &[Expect]) -> bool {
        allowed.iter().any(|e| {
            matches!(
                (e, self),
                (Expect::Denied, Self::Denied)
                    | (Expect::Contained, Self::Contained)
                    | (Expect::Killed, Self::Killed)
                    | (Expect::NotApplicable(_), Self::NotApplicable(_))
            )
        })
    }
}

/// An acceptable outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Every attempt fails.
    Denied,
    /// Works only inside the sandbox.
    Contained,
    /// Killed by a limit.
    Killed,
    /// Not applicable, with the reason.
    NotApplicable(&'static str),
}

/// The acceptable outcomes of one attack, per stockade tier.
#[derive(Debug, Clone, Copy)]
pub struct Expectations {
    /// The process tier.
    pub process: &'static [Expect],
    /// The wasm tier (the attack's variant in `tests/attacks/wasm/attacks.c`, or n/a).
    pub wasm: &'static [Expect],
    /// The docker tier (the same static program in the attack image).
    pub docker: &'static [Expect],
}

/// Whether the comparison columns (bwrap, docker) may run an attack: some attacks would harm
/// the host under a wrapper that sets no limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Comparison {
    /// Safe to run under an unlimited wrapper.
    Run,
    /// Not run under wrappers without limits, with the reason.
    Skip(&'static str),
}

/// What the harness prepares for an attack in the stockade tiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setup {
    /// The attack programs as a read-only workspace, and the world.
    Standard,
    /// A read-write workspace holding a git repository and shell rc files, with the attack
    /// program inside; the host checks afterwards that nothing was planted in it.
    RwWorkspace,
    /// A stand-in supervisor process runs the attack and is SIGKILLed mid-run.
    KillSupervisor,
    /// The run has grants (a `log` function that writes the host's side-effect log, data,
    /// and a policy), served by `stockade-runtime`'s broker; the host checks the log, the
    /// report's grants section and the grant's canary key afterwards.
    Grants,
    /// Two runs at once: the attack in a read-write workspace like [`Setup::RwWorkspace`]'s
    /// (with a directory `sub`), and, while it runs, other runs granted `sub` read-only that
    /// print the canary files a swapped-in directory would show; the host checks their
    /// output and the workspace afterwards.
    TwoRuns,
    /// The run has a network grant ([`net`]): a policy allowing one name on one port, pointed
    /// at the harness's upstream on 127.0.0.2, and a careless rule for any host on the
    /// world's port; the host checks its listeners (the upstream's bytes, a listener and a
    /// stand-in resolver no rule allows) and the report's connections afterwards.
    Net,
    /// The wasm column runs a second module (`tests/attacks/wasm/preinit.c`), whose
    /// `wizer-initialize` export is the attack; the host checks the run's wall time and the
    /// compiled-module cache afterwards.
    WasmInitializer,
}

/// One attack's expectations, comparison policy and setup.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// The attack program.
    pub name: &'static str,
    /// Acceptable outcomes per stockade tier.
    pub expect: Expectations,
    /// Whether comparison wrappers run it.
    pub comparison: Comparison,
    /// What the harness prepares for it.
    pub setup: Setup,
}

/// Expectations, one constant per attack program (`tests/attacks/src/bin/<name>.rs`).
#[allow(missing_docs, reason = "each constant is named after the attack program, whose docs say what it tries")]
pub mod expect {
    use super::Comparison::{Run, Skip};
    use super::Expect::{Contained, Denied, Killed, NotApplicable};
    use super::{Comparison, Expectations, Setup};

    type Spec = (Expectations, Comparison, Setup);
    type E = &'static [super::Expect];

    const fn e(process: E, wasm: E, docker: E, c: Comparison) -> Spec {
        (Expectations { process, wasm, docker }, c, Setup::Standard)
    }

    /// An attack with a special setup, which the comparison wrappers do not have.
    const fn special(process: E, wasm: E, setup: Setup, why: &'static str) -> Spec {
        let docker: E = match setup {
            Setup::KillSupervisor => {
                &[NotApplicable("the docker tier's supervisor is the engine, which the harness does not kill")]
            }
            Setup::WasmInitializer => &[NotApplicable(NO_INITIALIZER)],
            Setup::TwoRuns => &[NotApplicable(
                "run in the process columns; the docker tier opens and judges the path with the same stockade-hostfs call (refusing one through a symlink) and takes the same workspace lock before it makes a container (stockade-docker's g8_a_workspace_inside_a_held_one_is_refused_before_any_container)",
            )],
            _ => &[Denied, Contained],
        };
        (Expectations { process, wasm, docker }, Skip(why), setup)
    }

    const NO_INITIALIZER: &str =
        "a native program has no pre-initializer: its start-up is part of its run, under the same limits";
    const NO_LIMITS: Comparison = Skip("wrappers without limits would let it harm the host");

    /// A grants attack: the comparison wrappers have no broker.
    const fn grants(process: E, wasm: E, docker: E) -> Spec {
        (Expectations { process, wasm, docker }, Skip("the wrappers have no grants broker"), Setup::Grants)
    }
    /// A network attack: the run has a network grant, which the comparison wrappers lack;
    /// a wasm guest has no sockets to attack it with (its grant is the host call `fetch`).
    const fn net() -> Spec {
        (
            Expectations {
                process: &[Denied],
                wasm: &[NotApplicable(
                    "a wasm guest has no sockets (WASI sockets are off); its network grant is the host call fetch, a client of the same proxy these rows attack (stockade-cli's g9_the_wasm_tier_s_fetch_*)",
                )],
                docker: &[Denied],
            },
            Skip("the wrappers have no network grant"),
            Setup::Net,
        )
    }
    pub const net_direct_egress: Spec = net();
    pub const net_decided_is_sent: Spec = net();
    pub const net_dns_exfil: Spec = net();
    pub const net_proxy_to_host_loopback: Spec = net();
    pub const net_rebind: Spec = net();
    pub const net_sni_mismatch: Spec = net();
    pub const net_smuggle: Spec = net();
    const NO_DAEMON: E = &[NotApplicable("a wasm guest is a call inside the host; nothing of it outlives the run")];
    const OWN_SESSION: E =
        &[NotApplicable("a wasm guest's host calls reach only its own run's session: there is no socket to find")];

    // Why an attack has no wasm variant: the guest can only call the WASI imports the host
    // links, and WASI preview 1 has none of these.
    const NO_SYSCALLS: E = &[NotApplicable("no system calls: the guest can call only the WASI imports the host links")];
    const NO_PROCESSES: E = &[NotApplicable("WASI cannot create processes")];
    const NO_PROCESS_ACCESS: E = &[NotApplicable("WASI has no signals, ptrace or access to other processes")];
    const NO_PROTECTED_PATHS: E = &[NotApplicable(
        "the wasm tier refuses a read-write workspace that holds protected paths (this one holds .git and .bashrc): it cannot keep them read-only inside a writable preopen",
    )];

    pub const env_hostname: Spec = e(&[Denied], &[NotApplicable("WASI has no hostname call")], &[Denied], Run);
    pub const env_inherited_secret: Spec = e(&[Denied], &[Denied], &[Contained], Run);
    pub const fs_cgroupfs: Spec = e(&[Denied], &[Denied], &[Denied], Run);
    pub const fs_disk_fill: Spec = e(&[Denied, Contained, Killed], &[Denied], &[Denied], NO_LIMITS);
    pub const fs_host_layout: Spec = e(&[Denied, Contained], &[Denied, Contained], &[Contained], Run);
    pub const fs_kernel_knobs: Spec =
        e(&[Denied], &[Denied], &[Denied], Skip("wrappers that keep host root can rewrite the host's kernel knobs"));
    pub const fs_proc_environ: Spec = e(&[Denied, Contained], &[Denied], &[Contained], Run);
    pub const fs_read_home_secrets: Spec = e(&[Denied], &[Denied], &[Denied], Run);
    pub const fs_read_shadow: Spec = e(&[Denied], &[Denied], &[Denied], Run);
    pub const fs_setuid: Spec =
        e(&[Denied, Contained], &[NotApplicable("WASI has no permission bits or set-user-ID")], &[Denied], Run);
    pub const fs_special_files: Spec = e(&[Denied, Contained], &[Denied], &[Contained], Run);
    pub const fs_symlink_out: Spec = e(&[Denied, Contained], &[Denied], &[Contained], Run);
    pub const fs_write_outside: Spec = e(&[Denied, Contained], &[Denied], &[Contained], Run);
    pub const fs_persist_protected: Spec = special(
        &[Denied, Contained],
        NO_PROTECTED_PATHS,
        Setup::RwWorkspace,
        "needs a read-write workspace with protected paths",
    );
    pub const fs_plant_absent: Spec = special(
        &[Denied, Contained],
        NO_PROTECTED_PATHS,
        Setup::RwWorkspace,
        "needs a read-write workspace with protected paths",
    );
    pub const net_unix_workspace: Spec = special(
        &[Denied],
        NO_PROTECTED_PATHS,
        Setup::RwWorkspace,
        "needs a read-write workspace with a host daemon's socket in it",
    );
    pub const fs_swap_protected: Spec = special(
        &[Denied, Contained],
        NO_PROTECTED_PATHS,
        Setup::RwWorkspace,
        "needs a read-write workspace with protected paths",
    );
    pub const fs_race_workspace_swap: Spec = special(
        &[Denied, Contained],
        NO_PROTECTED_PATHS,
        Setup::TwoRuns,
        "needs two stockade runs of one workspace at once",
    );
    pub const wasm_preinit_bomb: Spec = special(
        &[NotApplicable(NO_INITIALIZER)],
        &[Killed],
        Setup::WasmInitializer,
        "a wasm module's pre-initializer; the wrappers run native programs",
    );
    pub const kernel_bpf: Spec = e(&[Denied], NO_SYSCALLS, &[Denied], Run);
    pub const kernel_clone3: Spec = e(&[Denied], NO_SYSCALLS, &[Denied], Run);
    pub const kernel_io_uring: Spec = e(&[Denied], NO_SYSCALLS, &[Denied], Run);
    pub const kernel_keyctl: Spec = e(&[Denied], NO_SYSCALLS, &[Denied], Run);
    pub const kernel_mount: Spec = e(&[Denied], NO_SYSCALLS, &[Denied], Run);
    pub const kernel_open_by_handle: Spec = e(&[Denied], NO_SYSCALLS, &[Denied], Run);
    pub const kernel_perf: Spec = e(&[Denied], NO_SYSCALLS, &[Denied], Run);
    pub const kernel_personality: Spec = e(&[Denied], NO_SYSCALLS, &[Denied], Run);
    pub const kernel_tiocsti: Spec = e(&[Denied], NO_SYSCALLS, &[Denied], Run);
    pub const kernel_userfaultfd: Spec = e(&[Denied], NO_SYSCALLS, &[Denied], Run);
    pub const kernel_userns: Spec = e(&[Denied], NO_SYSCALLS, &[Denied], Run);
    pub const kernel_second_thread: Spec = e(&[Denied], NO_SYSCALLS, &[Denied], Run);
    pub const fs_truncate_readonly: Spec = e(&[Denied], &[Denied], &[Denied], Run);
    pub const proc_pipe_grandchild: Spec = e(&[Contained], NO_PROCESSES, &[Contained], Run);
    pub const mem_core_dump: Spec = e(
        &[Killed],
        &[NotApplicable("a trap ends a call inside the host; there is no process to dump")],
        &[Killed],
        Run,
    );
    pub const net_shell_devtcp: Spec =
        e(&[Denied], &[NotApplicable("there is no shell in a WASI guest")], &[Denied], Run);
    pub const grant_after_deadline: Spec = grants(&[Denied, Contained], NO_DAEMON, &[Denied, Contained]);
    pub const grant_flood: Spec = grants(&[Denied], &[Denied], &[Denied]);
    pub const grant_key_search: Spec = grants(&[Denied], &[Denied], &[Denied]);
    pub const grant_model: Spec = grants(
        &[Denied],
        &[NotApplicable(
            "the wasm guest reaches a model grant only as the call model({...}), through the same validator (stockade-cli's grants tests); WASI has no socket to attack",
        )],
        &[Denied],
    );
    pub const grant_lying_length: Spec = grants(&[Denied], &[Denied], &[Denied]);
    pub const grant_other_run: Spec = grants(&[Denied], OWN_SESSION, &[Denied]);
    pub const grant_ungranted: Spec = grants(&[Denied], &[Denied], &[Denied]);
    pub const ipc_sysv_shm: Spec = e(&[Denied], &[NotApplicable("WASI has no IPC")], &[Denied], Run);
    pub const mem_bomb: Spec = e(&[Killed], &[Killed], &[Killed], NO_LIMITS);
    pub const net_raw_packet: Spec = e(&[Denied], &[Denied], &[Denied], Run);
    pub const net_metadata_service: Spec = e(&[Denied], &[Denied], &[Denied], Run);
    pub const net_tcp_loopback: Spec = e(&[Denied], &[Denied], &[Denied], Run);
    pub const net_udp_loopback: Spec = e(&[Denied], &[Denied], &[Contained], Run);
    pub const net_unix_abstract: Spec = e(&[Denied], &[Denied], &[Denied], Run);
    pub const net_unix_pathname: Spec = e(&[Denied], &[Denied], &[Denied], Run);
    pub const proc_fd_exhaustion: Spec = e(&[Denied], &[Killed], &[Denied], Run);
    pub const proc_fork_bomb: Spec = e(&[Killed, Denied], NO_PROCESSES, &[Denied], NO_LIMITS);
    pub const proc_inherited_fds: Spec = e(&[Denied], &[Denied], &[Denied], Run);
    pub const proc_output_flood: Spec = e(&[Killed], &[Killed], &[Killed], Run);
    pub const proc_outlive_supervisor: Spec = special(
        &[Killed],
        &[NotApplicable("the guest is a call inside the host process and cannot outlive it")],
        Setup::KillSupervisor,
        "needs a stand-in supervisor process that the harness can kill",
    );
    pub const proc_ptrace_host: Spec = e(&[Denied], NO_PROCESS_ACCESS, &[Denied], Run);
    pub const proc_setsid_daemon: Spec = e(&[Contained], NO_PROCESSES, &[Contained], Run);
    pub const proc_signal_host: Spec = e(&[Denied, Contained], NO_PROCESS_ACCESS, &[Denied], Run);
    pub const proc_vm_read: Spec = e(&[Denied], NO_PROCESS_ACCESS, &[Denied], Run);
    pub const time_cpu_spin: Spec = e(&[Killed], &[Killed], &[Killed], Run);
    pub const time_sleep: Spec = e(&[Killed], &[Killed], &[Killed], Run);
}

macro_rules! entry {
    ($name:ident) => {
        Entry { name: stringify!($name), expect: expect::$name.0, comparison: expect::$name.1, setup: expect::$name.2 }
    };
}

/// Every attack with its expectations, in name order.
pub const ATTACKS: &[Entry] = &foreach_attack!(entry);
