//! Every way a run ends is a report with its own status (G7).

use stockade_protocol::{Job, Status};

use crate::support::{run, wasi_module, wat_job};

#[test]
fn g7_exit_codes_from_proc_exit_and_from_a_returned_i32() {
    let exit3 = wasi_module(r#"(func (export "_start") (call $proc_exit (i32.const 3)))"#);
    assert_eq!(run(&wat_job(&exit3, "_start")).status, Status::Exited { code: 3 });
    let exit0 = wasi_module(r#"(func (export "_start") (call $proc_exit (i32.const 0)) unreachable)"#);
    assert_eq!(run(&wat_job(&exit0, "_start")).status, Status::Exited { code: 0 });
    let ret = r#"(module (func (export "run") (result i32) (i32.const 7)))"#;
    assert_eq!(run(&wat_job(ret, "run")).status, Status::Exited { code: 7 });
    let unit = r#"(module (func (export "_start")))"#;
    assert_eq!(run(&wat_job(unit, "_start")).status, Status::Exited { code: 0 });
}

#[test]
fn g7_traps_are_their_own_status() {
    let report = run(&wat_job(r#"(module (func (export "_start") unreachable))"#, "_start"));
    assert!(matches!(&report.status, Status::Trapped { trap } if trap.contains("unreachable")), "{report:?}");
    let recurse = r#"(module (func $f (export "_start") (call $f)))"#;
    let report = run(&wat_job(recurse, "_start"));
    assert!(matches!(&report.status, Status::Trapped { trap } if trap.contains("stack")), "{report:?}");
    let oob = r#"(module (memory 1) (func (export "_start") (drop (i32.load (i32.const 70000)))))"#;
    let report = run(&wat_job(oob, "_start"));
    assert!(matches!(&report.status, Status::Trapped { trap } if trap.contains("out of bounds")), "{report:?}");
}

#[test]
fn g7_a_module_that_cannot_run_fails_to_start() {
    let starts = |job: &Job, needle: &str| {
        let report = run(job);
        assert!(
            matches!(&report.status, Status::FailedToStart { reason } if reason.contains(needle)),
            "{needle}: {report:?}"
        );
    };
    let dir = crate::limits::tempdir("g7");
    let garbage = dir.join("garbage.wasm");
    std::fs::write(&garbage, b"\0asm\x01\0\0\0garbage").unwrap();
    starts(&Job::wasm(&garbage, "_start", Vec::<String>::new()).unwrap(), "invalid module");
    // A parser's message is one line (wasmparser pretty-prints the magic numbers it wanted).
    let text = dir.join("text.wasm");
    std::fs::write(&text, b"not wasm at all").unwrap();
    starts(&Job::wasm(&text, "_start", Vec::<String>::new()).unwrap(), "magic header not detected");
    let Status::FailedToStart { reason } = run(&Job::wasm(&text, "_start", Vec::<String>::new()).unwrap()).status
    else {
        unreachable!("checked above")
    };
    assert!(!reason.contains('\n') && reason.contains("expected=[0x0, 0x61, 0x73, 0x6d,]"), "{reason}");
    starts(&Job::wasm(dir.join("missing.wasm"), "_start", Vec::<String>::new()).unwrap(), "cannot read module");
    starts(&wat_job(r#"(module (func (export "_start")))"#, "main"), "no exported function `main`");
    starts(&wat_job(r#"(module (func (export "f") (param i32)))"#, "f"), "no exported function `f`");
    let import = r#"(module (import "host" "secret" (func)) (func (export "_start")))"#;
    starts(&wat_job(import, "_start"), "cannot link");
}

#[test]
fn g7_verification_refuses_each_bad_ending_with_its_code() {
    use stockade_verify::{Budget, Contract, Outcome, accept_any, verify};
    let contract = Contract::text(Budget::new(std::time::Duration::from_secs(10), 1 << 20), accept_any);
    let code = |wat: &str| match verify(run(&wat_job(wat, "_start")), &contract) {
        Outcome::Refused(r) => r.exit_code(),
        Outcome::Verified(_) => 0,
    };
    assert_eq!(code(r#"(module (func (export "_start") unreachable))"#), 117);
    assert_eq!(
        code(
            r#"(module (memory 1) (func (export "_start") (loop $l (br_if $l (i32.ne (memory.grow (i32.const 1)) (i32.const -1)))) unreachable))"#
        ),
        119
    );
    assert_eq!(code(r#"(module (func (export "_start")))"#), 0);
}

#[test]
fn g8_a_cache_directory_that_cannot_be_made_costs_a_compile_never_a_run() {
    // Its parent is a regular file: the directory can never exist.
    let file = std::env::temp_dir().join(format!("stockade-wasm-not-a-dir-{}", std::process::id()));
    std::fs::write(&file, "a file").unwrap();
    let tier = stockade_wasm::WasmTier::builder().cache_dir(file.join("cache")).build().unwrap();
    assert_eq!(tier.cache_dir(), None, "an unusable cache directory must be reported as no cache");
    let exit0 = wasi_module(r#"(func (export "_start") (call $proc_exit (i32.const 0)) unreachable)"#);
    for _ in 0..2 {
        let r = crate::support::block_on(tier.run(&wat_job(&exit0, "_start"))).unwrap();
        assert_eq!(r.status, Status::Exited { code: 0 }, "{r:?}");
    }
    std::fs::remove_file(&file).unwrap();
}
