#![allow(missing_docs, reason = "criterion_main generates an undocumented main")]
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a benchmark fails loudly on broken setup")]
//! The wasm tier in process: a trivial module (target: p50 at most 10 µs) and the
//! JavaScript guest running `console.log(1+2)` (target: p50 at most 0.3 ms), next to a bare
//! wasmtime baseline measured in the same run: the same engine configuration (pooling
//! allocator, fuel, epochs), a fresh `Store`, `InstancePre::instantiate_async` and one
//! `call_async`, with no WASI context, no budgets and no report.

use std::path::PathBuf;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use stockade_protocol::Job;
use stockade_wasm::WasmTier;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, Linker, Module, PoolingAllocationConfig, Store};

const TRIVIAL: &str = r#"(module (memory 1) (func (export "run") (result i32) (i32.const 0)))"#;

fn bare_engine() -> Engine {
    let mut pool = PoolingAllocationConfig::default();
    pool.total_core_instances(16).total_memories(32).total_tables(128).total_stacks(16);
    let mut c = Config::new();
    c.consume_fuel(true).epoch_interruption(true).allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&c).unwrap()
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-wasm");
    std::fs::create_dir_all(&dir).unwrap();
    let trivial = dir.join("trivial.wasm");
    std::fs::write(&trivial, wat::parse_str(TRIVIAL).unwrap()).unwrap();
    let tier = WasmTier::builder().cache_dir(dir.join("cache")).build().unwrap();

    let mut g = c.benchmark_group("wasm_in_process");
    g.measurement_time(Duration::from_secs(5));

    // Baseline: bare wasmtime with the same configuration.
    let engine = bare_engine();
    let module = Module::new(&engine, wat::parse_str(TRIVIAL).unwrap()).unwrap();
    let pre = Linker::<()>::new(&engine).instantiate_pre(&module).unwrap();
    g.bench_function("baseline_bare_wasmtime_trivial", |b| {
        b.iter(|| {
            rt.block_on(async {
                let mut store = Store::new(&engine, ());
                store.set_fuel(1_000_000).unwrap();
                store.set_epoch_deadline(1_000);
                let i = pre.instantiate_async(&mut store).await.unwrap();
                i.get_typed_func::<(), i32>(&mut store, "run").unwrap().call_async(&mut store, ()).await.unwrap()
            })
        });
    });

    let job = Job::wasm(&trivial, "run", Vec::<String>::new()).unwrap();
    rt.block_on(tier.run(&job)).unwrap();
    g.bench_function("stockade_trivial", |b| b.iter(|| rt.block_on(tier.run(&job)).unwrap()));

    match stockade_wasm::javascript_job("console.log(1+2)") {
        Ok(js) => {
            let first = rt.block_on(tier.run(&js)).unwrap();
            assert_eq!(first.stdout.bytes, b"3\n", "{first:?}");
            g.bench_function("stockade_js_console_log", |b| b.iter(|| rt.block_on(tier.run(&js)).unwrap()));
        }
        Err(e) => eprintln!("SKIPPED stockade_js_console_log: {e}"),
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
