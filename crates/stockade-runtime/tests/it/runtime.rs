//! The runtime composes tiers and verification: G1-G3, with a scripted tier, so these tests
//! need no kernel features (the process tier has its own tests).

use std::time::Duration;

use async_trait::async_trait;
use stockade_protocol::{Captured, Job, Report, Status};
use stockade_runtime::{BuildError, RunError, Sandbox, Tier};
use stockade_verify::{Budget, Contract, Outcome, Refusal};

#[derive(Debug)]
struct Scripted(Result<Report, &'static str>);

#[async_trait]
impl Tier for Scripted {
    fn name(&self) -> &'static str {
        "scripted"
    }
    async fn run(&self, _job: &Job) -> Result<Report, RunError> {
        match &self.0 {
            Ok(r) => Ok(r.clone()),
            Err(m) => Err(RunError::Unsupported { mechanism: (*m).to_owned(), reason: "scripted".into() }),
        }
    }
}

fn report(status: Status, out: &[u8]) -> Report {
    Report::new(status, Duration::from_millis(5))
        .with_output(Captured::new(out.to_vec(), out.len() as u64), Captured::default())
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().build().unwrap()
}

fn contract() -> Contract<u32> {
    Contract::json(
        Budget::new(Duration::from_secs(1), 64),
        |n: &u32| if *n == 42 { Ok(()) } else { Err("not 42".into()) },
    )
}

#[test]
fn g1_outcomes_come_from_verify() {
    let job = Job::command("x", Vec::<String>::new()).unwrap();
    let ok = Sandbox::builder().tier(Scripted(Ok(report(Status::Exited { code: 0 }, b"42")))).build().unwrap();
    let Outcome::Verified(v) = rt().block_on(ok.run(&job, &contract())).unwrap() else { panic!() };
    assert_eq!(*v.value(), 42);
    let bad = Sandbox::builder().tier(Scripted(Ok(report(Status::TimedOut, b"42")))).build().unwrap();
    let Outcome::Refused(r) = rt().block_on(bad.run(&job, &contract())).unwrap() else { panic!() };
    assert!(matches!(r, Refusal::Timeout { .. }));
    assert_eq!(r.exit_code(), 124);
}

#[test]
fn g2_unsupported_is_an_error_not_a_weaker_run() {
    let job = Job::command("x", Vec::<String>::new()).unwrap();
    let s = Sandbox::builder().tier(Scripted(Err("landlock"))).build().unwrap();
    let err = rt().block_on(s.run(&job, &contract())).unwrap_err();
    assert!(matches!(err, RunError::Unsupported { ref mechanism, .. } if mechanism == "landlock"), "{err}");
}

#[test]
fn g3_the_tier_is_chosen_explicitly_and_is_object_safe() {
    assert!(matches!(Sandbox::builder().build(), Err(BuildError::NoTier)));
    let boxed: Box<dyn Tier> = Box::new(Scripted(Err("x")));
    let s = Sandbox::builder().boxed_tier(boxed).build().unwrap();
    assert_eq!(s.tier_name(), "scripted");
    #[cfg(feature = "process")]
    {
        let p = stockade_runtime::process::ProcessTier::new(stockade_runtime::process::Helper::at("/nonexistent"));
        assert_eq!(Sandbox::builder().tier(p).build().unwrap().tier_name(), "process");
    }
}

#[cfg(feature = "wasm")]
#[test]
fn g1_the_wasm_tier_runs_and_verifies_through_the_sandbox() {
    // (module (func (export "_start"))): exits 0 with no output.
    const EMPTY: &[u8] =
        b"\0asm\x01\0\0\0\x01\x04\x01\x60\0\0\x03\x02\x01\0\x07\x0a\x01\x06_start\0\0\x0a\x04\x01\x02\0\x0b";
    let dir = std::env::temp_dir().join(format!("stockade-runtime-wasm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let module = dir.join("empty.wasm");
    std::fs::write(&module, EMPTY).unwrap();
    let tier = stockade_runtime::wasm::WasmTier::builder().cache_dir(dir.join("cache")).build().unwrap();
    let s = Sandbox::builder().tier(tier).build().unwrap();
    assert_eq!(s.tier_name(), "wasm");
    let job = Job::wasm(&module, "_start", Vec::<String>::new()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let c = Contract::text(Budget::new(Duration::from_secs(5), 64), |s: &String| {
        if s.is_empty() { Ok(()) } else { Err(format!("unexpected output {s:?}")) }
    })
    .require(stockade_protocol::Mechanism::WasmFuel);
    let Outcome::Verified(v) = rt.block_on(s.run(&job, &c)).unwrap() else { panic!() };
    assert!(v.value().is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}
