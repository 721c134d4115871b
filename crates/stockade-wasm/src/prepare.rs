//! Pre-initialization (wasmtime-wizer): a module that exports `wizer-initialize` is run once
//! up to the end of that function and snapshotted, so every run starts from the
//! initialized state (for QuickJS: a ready runtime and context, 4x faster starts).
//!
//! The initializer is guest code and runs under the same walls as the run that asked for it:
//! no ambient authority (an empty WASI context), and that job's fuel, memory and wall clock
//! ([`InitBudget`]), the wall clock enforced both by epoch checks while wasm runs and by a
//! timeout around the whole initialization, so a blocking host call (a WASI sleep) is cut
//! too. It holds no lock of the tier while it runs.

use std::time::{Duration, Instant};

use wasmtime::{Linker, Module, Store, StoreLimitsBuilder, UpdateDeadline};
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wizer::{InstanceState, SnapshotVal, ValType, Wizer};

use crate::engine::MAX_LINEAR_MEMORY;

/// The export that marks a module for pre-initialization.
pub(crate) const INIT_EXPORT: &str = "wizer-initialize";

/// What an initializer may use: the run's own budgets, never more.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InitBudget {
    pub(crate) fuel: u64,
    pub(crate) memory_bytes: u64,
    pub(crate) wall: Duration,
}

impl InitBudget {
    /// For a module warmed before any job (`WasmTier::warm`, the guests stockade builds
    /// itself): the tier's ceilings.
    pub(crate) const WARM: Self =
        Self { fuel: 40_000_000_000, memory_bytes: MAX_LINEAR_MEMORY, wall: Duration::from_secs(60) };
}

struct InitHost {
    wasi: WasiP1Ctx,
    limits: wasmtime::StoreLimits,
}

/// Whether `module` asks to be pre-initialized.
pub(crate) fn wants_init(module: &Module) -> bool {
    matches!(module.get_export(INIT_EXPORT), Some(wasmtime::ExternType::Func(f)) if f.params().len() == 0 && f.results().len() == 0)
}

/// Runs the initializer of `wasm` and returns the snapshotted module's bytes.
pub(crate) async fn preinitialize(
    engine: &wasmtime::Engine,
    wasm: &[u8],
    budget: InitBudget,
) -> wasmtime::Result<Vec<u8>> {
    match tokio::time::timeout(budget.wall, initialize(engine, wasm, budget)).await {
        Ok(r) => r,
        Err(_) => wasmtime::bail!("the initializer ran past the run's {:?} deadline", budget.wall),
    }
}

async fn initialize(engine: &wasmtime::Engine, wasm: &[u8], budget: InitBudget) -> wasmtime::Result<Vec<u8>> {
    let wizer = Wizer::new();
    let (cx, instrumented) = wizer.instrument(wasm)?;
    let module = Module::new(engine, &instrumented)?;
    let mut linker: Linker<InitHost> = Linker::new(engine);
    wasmtime_wasi::p1::add_to_linker_async(&mut linker, |h: &mut InitHost| &mut h.wasi)?;
    // Pre-initialization has no grants: the door answers "no host calls" (-1).
    linker.func_wrap("host", "call", |_: i32, _: i32, _: i32, _: i32| -> i32 { -1 })?;
    linker.func_wrap("host", "reply", |_: i32, _: i32| -> i32 { -2 })?;
    let memory = usize::try_from(budget.memory_bytes.min(MAX_LINEAR_MEMORY)).unwrap_or(usize::MAX);
    let limits = StoreLimitsBuilder::new().memory_size(memory).instances(1).build();
    let mut store = Store::new(engine, InitHost { wasi: WasiCtxBuilder::new().build_p1(), limits });
    store.limiter(|h| &mut h.limits);
    store.set_fuel(budget.fuel)?;
    let deadline = Instant::now() + budget.wall;
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |_| {
        Ok(if Instant::now() >= deadline { UpdateDeadline::Interrupt } else { UpdateDeadline::Yield(1) })
    });
    let instance = linker.instantiate_async(&mut store, &module).await?;
    if let Some(init) = instance.get_func(&mut store, "_initialize") {
        init.typed::<(), ()>(&store)?.call_async(&mut store, ()).await?;
    }
    instance.get_typed_func::<(), ()>(&mut store, INIT_EXPORT)?.call_async(&mut store, ()).await?;
    let mut state = Snapshot { store: &mut store, instance, failed: None };
    let bytes = wizer.snapshot(&cx, &mut state).await?;
    match state.failed {
        Some(what) => wasmtime::bail!("cannot snapshot {what}"),
        None => Ok(bytes),
    }
}

/// Reads globals and memories for the snapshot without panicking on a missing export.
struct Snapshot<'a> {
    store: &'a mut Store<InitHost>,
    instance: wasmtime::Instance,
    failed: Option<String>,
}

impl InstanceState for Snapshot<'_> {
    async fn global_get(&mut self, name: &str, _: ValType) -> SnapshotVal {
        let value = self.instance.get_global(&mut *self.store, name).map(|g| g.get(&mut *self.store));
        match value {
            Some(wasmtime::Val::I32(x)) => SnapshotVal::I32(x),
            Some(wasmtime::Val::I64(x)) => SnapshotVal::I64(x),
            Some(wasmtime::Val::F32(x)) => SnapshotVal::F32(x),
            Some(wasmtime::Val::F64(x)) => SnapshotVal::F64(x),
            Some(wasmtime::Val::V128(x)) => SnapshotVal::V128(x.as_u128()),
            _ => {
                self.failed = Some(format!("global {name}"));
                SnapshotVal::I32(0)
            }
        }
    }

    async fn memory_contents(&mut self, name: &str, contents: impl FnOnce(&[u8]) + Send) {
        match self.instance.get_memory(&mut *self.store, name) {
            Some(memory) => contents(memory.data(&*self.store)),
            None => {
                self.failed = Some(format!("memory {name}"));
                contents(&[]);
            }
        }
    }
}
