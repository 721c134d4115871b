//! G11: how the helper starts. This test process is multi-threaded, so here a fork launch
//! must refuse (or fall back to executing the helper binary); the fork launch itself is
//! exercised from single-threaded processes by the `stockade` CLI's tests and by every
//! process-tier row of `cargo xtask escape`.

use stockade_process::{Helper, ProcessTier, RunError};
use stockade_protocol::Status;

use crate::support::*;

#[test]
fn g11_fork_launch_refuses_a_multi_threaded_process() {
    require!("g11_fork_launch_refuses_a_multi_threaded_process");
    let tier = ProcessTier::new(Helper::fork());
    let err = block_on(tier.run(&sh("echo never"))).expect_err("a fork from a multi-threaded process must be refused");
    match err {
        RunError::Misconfigured(m) => assert!(m.contains("single-threaded") && m.contains("threads"), "{m}"),
        other => panic!("expected Misconfigured, got {other:?}"),
    }
}

#[test]
fn g11_prefer_fork_executes_the_helper_when_threaded() {
    require!("g11_prefer_fork_executes_the_helper_when_threaded");
    let helper = Helper::at(env!("CARGO_BIN_EXE_stockade-process-helper")).prefer_fork();
    assert_eq!(helper.path(), Some(std::path::Path::new(env!("CARGO_BIN_EXE_stockade-process-helper"))));
    let r = block_on(ProcessTier::new(helper).run(&sh("echo via-exec"))).unwrap();
    assert_eq!((stdout(&r).as_str(), &r.status), ("via-exec\n", &Status::Exited { code: 0 }), "{r:#?}");
}
