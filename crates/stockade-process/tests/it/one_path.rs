//! G21: one guest-start path for a run and a session's exec. Each step of the guest's start
//! is made to fail in turn (`ProcessTier::fail_guest_step`), and the run's outcome and the
//! exec's must be the same failure, named by the same step.

use stockade_process::{ExecOptions, ProcessTier, RunError, SessionConfig};
use stockade_protocol::{Job, Limits, LiveIo, Mechanism, Report, Status};

use crate::support::*;

/// The steps of a guest's start, by number, and the stage each is reported under.
const STEPS: [(u8, &str); 11] = [
    (1, "guest"),
    (2, "setsid"),
    (3, "terminal"),
    (4, "capabilities"),
    (5, "capabilities"),
    (6, "no_new_privs"),
    (7, "rlimits"),
    (8, "guest"),
    (9, "fds"),
    (10, "signals"),
    (11, "exec"),
];

/// How a start ended, as one line: the typed error, or the report's status.
fn outcome(r: Result<Report, RunError>) -> String {
    match r {
        Ok(report) => format!("{:?}", report.status),
        Err(e) => format!("error: {e}"),
    }
}

/// A run of `job` in `tier`, and an exec of it in a session of `tier` (with a terminal when
/// `tty`), as their outcomes.
async fn both(tier: ProcessTier, job: &Job, tty: bool) -> (Result<Report, RunError>, Result<Report, RunError>) {
    let run = if tty { tier.clone().tty().run(job).await } else { tier.run(job).await };
    let session = tier.session(SessionConfig { limits: Limits::default(), ..SessionConfig::default() }).await.unwrap();
    let opts = ExecOptions { pty: tty.then_some((24, 80)), ..ExecOptions::default() };
    let exec = session.exec_with(job, None, LiveIo::default(), opts).await;
    session.kill().await;
    (run, exec)
}

#[test]
fn g21_every_step_of_a_guest_s_start_fails_the_same_in_a_run_and_in_a_session() {
    if !available("g21_every_step_of_a_guest_s_start_fails_the_same_in_a_run_and_in_a_session") {
        return;
    }
    let _g = shared();
    let job = Job::command("/bin/true", Vec::<String>::new()).unwrap();
    block_on(async {
        for (step, stage) in STEPS {
            let (run, exec) = both(tier().fail_guest_step(step), &job, step == 3).await;
            let (run, exec) = (outcome(run), outcome(exec));
            assert_eq!(run, exec, "step {step}: a run and a session's exec failed differently");
            assert!(
                run.contains(&format!("{stage}: ")) || run.contains(&format!("({stage})")),
                "step {step}: not reported as {stage}: {run}"
            );
            assert!(!run.contains("Exited"), "step {step}: the guest ran: {run}");
        }
        // And with no step failed, both run the guest.
        let (run, exec) = both(tier(), &job, false).await;
        assert_eq!(run.unwrap().status, Status::Exited { code: 0 });
        assert_eq!(exec.unwrap().status, Status::Exited { code: 0 });
    });
}

#[test]
fn g21_a_run_and_a_session_s_exec_report_the_same_enforcement_for_the_same_limits() {
    if !available("g21_a_run_and_a_session_s_exec_report_the_same_enforcement_for_the_same_limits") {
        return;
    }
    let _g = shared();
    let job = Job::command("/bin/true", Vec::<String>::new()).unwrap();
    block_on(async {
        let (run, exec) = both(tier(), &job, false).await;
        let (run, exec) = (run.unwrap(), exec.unwrap());
        let mechanisms = |r: &Report| -> Vec<Mechanism> {
            let mut m: Vec<Mechanism> = r.enforcement.iter().map(|e| e.mechanism).collect();
            m.sort_by_key(|m| format!("{m:?}"));
            m.dedup();
            m
        };
        assert_eq!(mechanisms(&run), mechanisms(&exec), "run: {:#?}\nexec: {:#?}", run.enforcement, exec.enforcement);
        // The guest's own lines say the same, but for whose init built the domain and filters.
        let guest_line = |r: &Report, m: Mechanism| -> String {
            r.enforcement.iter().find(|e| e.mechanism == m).map(|e| e.detail.clone()).unwrap_or_default()
        };
        for m in [Mechanism::CapabilitiesDropped, Mechanism::NoNewPrivs, Mechanism::Rlimits] {
            assert_eq!(guest_line(&run, m), guest_line(&exec, m), "{m:?}");
        }
        // The filters are the same; the landlock domain the same ABI and enforcement (a
        // session leaves TCP free on its own loopback, G17).
        let (r, e) = (guest_line(&run, Mechanism::Seccomp), guest_line(&exec, Mechanism::Seccomp));
        assert_eq!(r.split("; ").next(), e.split("; ").next(), "seccomp: {r} / {e}");
        let (r, e) = (guest_line(&run, Mechanism::Landlock), guest_line(&exec, Mechanism::Landlock));
        assert_eq!(r.split(':').next(), e.split(':').next(), "landlock: {r} / {e}");
        assert!(r.contains("FullyEnforced"), "{r}");
    });
}
