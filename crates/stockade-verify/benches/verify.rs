#![allow(missing_docs, reason = "criterion_main generates an undocumented main")]
//! The cost of `verify` on a small JSON answer, next to a bare `serde_json::from_slice` of the
//! same bytes measured in the same run.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use serde::Deserialize;
use stockade_protocol::{Captured, Report, Status};
use stockade_verify::{Budget, Contract, verify};

#[derive(Debug, Deserialize)]
struct Answer {
    n: u32,
    label: String,
}

fn bench(c: &mut Criterion) {
    let stdout = br#"{"n":42,"label":"the answer to everything"}"#.to_vec();
    let report = Report::new(Status::Exited { code: 0 }, Duration::from_millis(3))
        .with_output(Captured::new(stdout.clone(), stdout.len() as u64), Captured::default());
    let contract = Contract::json(Budget::new(Duration::from_secs(1), 1 << 20), |a: &Answer| {
        if a.n == 42 && !a.label.is_empty() { Ok(()) } else { Err("wrong".into()) }
    });
    let mut g = c.benchmark_group("verify_small_json");
    g.bench_function("baseline_serde_json_from_slice", |b| {
        b.iter(|| black_box(serde_json::from_slice::<Answer>(black_box(&stdout)).map(|a| a.n)));
    });
    g.bench_function("verify", |b| {
        b.iter(|| black_box(verify(black_box(report.clone()), &contract).is_verified()));
    });
    g.bench_function("reference_report_clone", |b| {
        b.iter(|| black_box(black_box(&report).clone()));
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
