// The intended use compiles, so the fail cases cannot pass because everything broke.
use std::time::Duration;
use stockade_protocol::{Captured, Report, Status};
use stockade_verify::{Budget, Contract, Outcome, Refusal, verify};

fn main() {
    let report = Report::new(Status::Exited { code: 0 }, Duration::from_millis(1))
        .with_output(Captured::new(b"42".to_vec(), 2), Captured::default());
    let contract = Contract::json(Budget::new(Duration::from_secs(1), 100), |n: &u32| {
        if *n == 42 { Ok(()) } else { Err("not 42".into()) }
    });
    let v = match verify(report, &contract) {
        Outcome::Verified(v) => v,
        Outcome::Refused(r) => {
            let code = match r {
                Refusal::Timeout { .. } => r.exit_code(),
                _ => r.exit_code(),
            };
            std::process::exit(i32::from(code));
        }
    };
    let n: &u32 = v.value();
    assert_eq!(*n, 42);
    assert_eq!(v.report().stdout.seen, 2);
    let _owned: u32 = v.into_inner();
}
