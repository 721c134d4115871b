//! verify(): G1, G2, G3, G4, G5, G6, G8.

use std::cell::Cell;
use std::time::Duration;

use proptest::prelude::*;
use serde::Deserialize;
use static_assertions::assert_not_impl_any;
use stockade_protocol::{Captured, Enforced, Mechanism, Report, Status, Stream};
use stockade_verify::{
    Budget, Contract, MAX_DIAGNOSTIC_BYTES, MAX_EXCERPT_BYTES, Outcome, Refusal, Verified, accept_any, verify,
};

assert_not_impl_any!(Verified<u32>: Default, Clone, From<u32>, serde::de::DeserializeOwned, std::ops::Deref, std::ops::DerefMut, AsMut<u32>);
assert_not_impl_any!(Budget: Default);

const DEADLINE: Duration = Duration::from_secs(2);
const BUDGET: u64 = 64;

#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Answer {
    n: u32,
}

fn contract() -> Contract<Answer> {
    Contract::json(Budget::new(DEADLINE, BUDGET), |a: &Answer| {
        if a.n == 42 { Ok(()) } else { Err(format!("expected 42, got {}", a.n)) }
    })
}

fn with_status(mut report: Report, status: Status) -> Report {
    report.status = status;
    report
}

fn exited(code: i32, stdout: &[u8]) -> Report {
    Report::new(Status::Exited { code }, Duration::from_millis(30))
        .with_output(Captured::new(stdout.to_vec(), stdout.len() as u64), Captured::new(b"warning: x".to_vec(), 10))
}

/// Verifies `report` against the standard contract and describes the result in one word.
fn check(report: Report) -> String {
    check_with(report, &contract())
}

fn check_with<T: std::fmt::Debug>(report: Report, c: &Contract<T>) -> String {
    match verify(report, c) {
        Outcome::Verified(v) => format!("verified {:?}", v.value()),
        Outcome::Refused(r) => format!("{} {}", r.exit_code(), r.message()),
    }
}

#[test]
fn g1_a_clean_run_is_verified_and_keeps_its_report() {
    let report = exited(0, br#"{"n":42}"#);
    let Outcome::Verified(v) = verify(report.clone(), &contract()) else { panic!("refused a clean run") };
    assert_eq!(v.value(), &Answer { n: 42 });
    assert_eq!(v.report(), &report);
    assert_eq!(v.into_inner(), Answer { n: 42 });
}

#[test]
fn g1_text_and_bytes_contracts() {
    let text =
        Contract::text(
            Budget::new(DEADLINE, BUDGET),
            |s: &String| {
                if s.trim() == "42" { Ok(()) } else { Err("not 42".into()) }
            },
        );
    assert_eq!(check_with(exited(0, b"42\n"), &text), r#"verified "42\n""#);
    assert!(check_with(exited(0, b"\xff\xfe"), &text).starts_with("122 malformed output: stdout is not utf-8"));
    let bytes = Contract::bytes(Budget::new(DEADLINE, BUDGET), accept_any);
    assert_eq!(check_with(exited(0, b"\xff"), &bytes), "verified [255]");
}

#[test]
fn g1_required_mechanisms_must_be_listed() {
    let c = contract().require(Mechanism::Seccomp).require(Mechanism::Landlock);
    let report = exited(0, br#"{"n":42}"#).with_enforced(Enforced::new(Mechanism::Seccomp, ""));
    assert_eq!(check_with(report.clone(), &c), "118 enforcement missing: Landlock was required but not active");
    let report = report.with_enforced(Enforced::new(Mechanism::Landlock, "abi 7"));
    assert_eq!(check_with(report, &c), "verified Answer { n: 42 }");
}

#[test]
fn g1_expected_exit_code_is_the_contract_s() {
    let c = contract().expect_exit(3);
    assert_eq!(check_with(exited(3, br#"{"n":42}"#), &c), "verified Answer { n: 42 }");
    assert!(check_with(exited(0, br#"{"n":42}"#), &c).starts_with("1 exited with code 0"));
}

#[test]
fn g2_each_failure_has_its_refusal() {
    let ok = br#"{"n":42}"#;
    let with_status = |status| with_status(exited(0, ok), status);
    let cases: Vec<(Report, &str)> = vec![
        (with_status(Status::failed_to_start("no such file: py")), "126 failed to start: no such file: py"),
        (with_status(Status::TimedOut), "124 timed out: ran 30ms, deadline 2s"),
        (with_status(Status::CpuLimit), "120 cpu time limit reached"),
        (with_status(Status::OutOfMemory), "119 out of memory"),
        (
            with_status(Status::OutputLimit { stream: Stream::Stderr }),
            "123 output too large: Stderr wrote 10 bytes, budget 64",
        ),
        (with_status(Status::Signaled { signal: 9 }), "137 killed by signal 9"),
        (
            with_status(Status::trapped("wasm trap: unreachable\n\x1b[31m")),
            "117 guest trapped: wasm trap: unreachable\\n\\u{1b}[31m",
        ),
        (exited(2, ok), "2 exited with code 2; stderr: warning: x"),
        (
            exited(0, b"{\"n\":"),
            "122 malformed output: invalid json at line 1 column 5: EOF while parsing a value at line 1 column 5",
        ),
        (
            exited(0, br#"{"n":42,"extra":1}"#),
            "122 malformed output: json does not match the schema at line 1 column 15: unknown field `extra`, expected `n` at line 1 column 15",
        ),
        (exited(0, br#"{"n":41}"#), "121 assertion failed: expected 42, got 41"),
    ];
    for (report, want) in cases {
        assert_eq!(check(report), want);
    }
}

#[test]
fn g2_checks_run_in_the_documented_order() {
    // A run that timed out *and* exited non-zero *and* printed garbage is a timeout.
    let report = with_status(exited(1, b"garbage"), Status::TimedOut);
    assert!(check(report).starts_with("124"));
    // Missing enforcement outranks everything after it.
    let c = contract().require(Mechanism::Seccomp);
    assert!(check_with(with_status(exited(0, b""), Status::OutOfMemory), &c).starts_with("118"));
    // A run that never started is reported as such even if nothing was enforced.
    assert!(check_with(Report::new(Status::failed_to_start("x"), Duration::ZERO), &c).starts_with("126"));
}

#[test]
fn g3_the_deadline_is_checked_against_the_reported_wall_time() {
    let mut report = exited(0, br#"{"n":42}"#);
    report.wall = DEADLINE + Duration::from_millis(1);
    assert_eq!(check(report), "124 timed out: ran 2.001s, deadline 2s");
}

#[test]
fn g3_output_counts_are_rechecked() {
    // Over budget although the tier did not flag it.
    let big = format!(r#"{{"n":42{}}}"#, " ".repeat(BUDGET as usize));
    assert!(check(exited(0, big.as_bytes())).starts_with("123 output too large: Stdout wrote 72 bytes, budget 64"));
    // Truncated stdout is never verified, even if the prefix parses.
    let mut report = exited(0, br#"{"n":42}"#);
    report.stdout = Captured::new(br#"{"n":42}"#.to_vec(), 9);
    assert!(check(report).starts_with("123"));
    // Contradictory counts: more bytes kept than seen, or a truncated flag that lies.
    let mut report = exited(0, br#"{"n":42}"#);
    report.stdout.seen = 1;
    assert!(check(report).starts_with("125 verification error: inconsistent report"));
    let mut report = exited(0, br#"{"n":42}"#);
    report.stderr.truncated = true;
    assert!(check(report).starts_with("125"));
}

#[test]
fn g4_debug_redacts_the_value() {
    let Outcome::Verified(v) = verify(exited(0, br#"{"n":42}"#), &contract()) else { panic!() };
    let shown = format!("{v:?}");
    assert!(shown.contains("<redacted>") && !shown.contains("42"), "{shown}");
}

#[test]
fn g5_a_rejected_value_is_only_a_bounded_diagnostic() {
    let c = Contract::<Vec<u8>>::bytes(Budget::new(DEADLINE, 1 << 20), |_| Err("never".into()));
    let big = vec![b'a'; 100_000];
    let Outcome::Refused(Refusal::AssertionFailed { reason, rejected, .. }) = verify(exited(0, &big), &c) else {
        panic!("expected an assertion failure")
    };
    assert_eq!(reason, "never");
    assert!(rejected.diagnostic().starts_with("[97, 97"));
    assert!(rejected.diagnostic().len() <= MAX_DIAGNOSTIC_BYTES);
}

#[test]
fn g6_exit_codes_are_stable() {
    let codes: Vec<u8> = [
        Status::failed_to_start("x"),
        Status::TimedOut,
        Status::CpuLimit,
        Status::OutOfMemory,
        Status::OutputLimit { stream: Stream::Stdout },
        Status::Signaled { signal: 15 },
        Status::Signaled { signal: 0 },
        Status::Signaled { signal: 1000 },
        Status::Exited { code: 7 },
        Status::trapped("wasm trap: unreachable"),
    ]
    .into_iter()
    .map(|status| match verify(with_status(exited(0, b""), status), &contract()) {
        Outcome::Refused(r) => r.exit_code(),
        Outcome::Verified(_) => 0,
    })
    .collect();
    assert_eq!(codes, [126, 124, 120, 119, 123, 143, 255, 255, 7, 117]);
    assert!(check(exited(0, b"[")).starts_with("122"));
    assert!(check(exited(0, br#"{"n":1}"#)).starts_with("121"));
    let c = contract().require(Mechanism::Cgroup);
    assert!(check_with(exited(0, b""), &c).starts_with("118"));
}

#[test]
fn g6_guest_bytes_in_messages_are_escaped_and_bounded() {
    let mut report = exited(1, b"");
    let evil = format!("\x1b]0;pwned\x07line1\nline2\r{}", "x".repeat(5000));
    report.stderr = Captured::new(evil.clone().into_bytes(), evil.len() as u64);
    let Outcome::Refused(r) = verify(report, &contract()) else { panic!() };
    let msg = r.message();
    assert!(!msg.chars().any(char::is_control), "{msg:?}");
    assert!(msg.contains(r"\u{1b}]0;pwned\u{7}line1\nline2\r"), "{msg}");
    assert!(msg.len() < MAX_EXCERPT_BYTES + 200, "{} bytes", msg.len());
    // Text from a parser that quotes the guest is escaped too.
    let msg = check(exited(0, b"{\"n\":\"\x1b[31m\"}"));
    assert!(!msg.chars().any(char::is_control), "{msg:?}");
}

#[test]
fn interior_mutability_is_a_documented_non_guarantee() {
    // Pinned so that the docs' warning stays true: a Cell inside T can change after the check.
    let c = Contract::json(
        Budget::new(DEADLINE, BUDGET),
        |v: &Cell<u32>| {
            if v.get() == 42 { Ok(()) } else { Err("no".into()) }
        },
    );
    let Outcome::Verified(v) = verify(exited(0, b"42"), &c) else { panic!() };
    v.value().set(7);
    assert_eq!(v.value().get(), 7);
}

fn arb_status() -> impl Strategy<Value = Status> {
    prop_oneof![
        any::<i32>().prop_map(|code| Status::Exited { code }),
        any::<i32>().prop_map(|signal| Status::Signaled { signal }),
        Just(Status::TimedOut),
        Just(Status::OutOfMemory),
        Just(Status::CpuLimit),
        Just(Status::OutputLimit { stream: Stream::Stdout }),
        ".{0,40}".prop_map(Status::failed_to_start),
    ]
}

fn arb_captured() -> impl Strategy<Value = Captured> {
    (proptest::collection::vec(any::<u8>(), 0..100), any::<u64>(), any::<bool>()).prop_map(|(bytes, seen, t)| {
        let mut c = Captured::new(bytes, seen);
        if t {
            c.truncated = !c.truncated;
        }
        c
    })
}

proptest! {
    #[test]
    fn g8_verify_never_panics(status in arb_status(), wall in any::<u64>(), out in arb_captured(), err in arb_captured()) {
        let report = Report::new(status, Duration::from_nanos(wall)).with_output(out, err);
        let _ = check(report.clone());
        let _ = check_with(report, &Contract::text(Budget::new(DEADLINE, 0), accept_any));
    }

    #[test]
    fn g1_anything_verified_passed_every_check(status in arb_status(), wall_ms in 0u64..4000, out in arb_captured()) {
        let report = Report::new(status.clone(), Duration::from_millis(wall_ms)).with_output(out.clone(), Captured::default());
        if let Outcome::Verified(v) = verify(report, &contract()) {
            prop_assert_eq!(status, Status::Exited { code: 0 });
            prop_assert!(Duration::from_millis(wall_ms) <= DEADLINE);
            prop_assert!(!out.truncated && out.seen <= BUDGET && out.seen == out.bytes.len() as u64);
            prop_assert_eq!(v.value().n, 42);
        }
    }
}

#[test]
fn g2_a_denied_grant_call_refuses_only_a_contract_that_forbids_it() {
    use stockade_protocol::{GrantCall, GrantOutcome, GrantsReport};
    let mut grants = GrantsReport::default();
    grants.record(GrantCall::new("add", GrantOutcome::Ok, "adders", (40, 30), Duration::from_micros(20)));
    grants.record(GrantCall::new("send", GrantOutcome::Denied, "default-deny", (40, 30), Duration::from_micros(20)));
    let report = exited(0, br#"{"n":42}"#).with_grants(grants.clone());
    // Without the requirement, a denial is the guest's business.
    assert_eq!(check(report.clone()), "verified Answer { n: 42 }");
    let strict = contract().no_denied_grants();
    let refused = check_with(report, &strict);
    assert!(
        refused.starts_with("116 grant denied: 1 of 2 calls denied; first: send by rule default-deny"),
        "{refused}"
    );
    // A broker session ended early (a flood, a malformed frame) is refused too.
    let mut ended = GrantsReport::default();
    ended.session_ended = Some("more than 1024 grant calls".into());
    let refused = check_with(exited(0, br#"{"n":42}"#).with_grants(ended), &strict);
    assert!(refused.starts_with("116 grant denied: the broker session ended: more than 1024"), "{refused}");
    // A clean broker record passes.
    let mut clean = GrantsReport::default();
    clean.record(GrantCall::new("add", GrantOutcome::Ok, "adders", (1, 1), Duration::ZERO));
    assert_eq!(check_with(exited(0, br#"{"n":42}"#).with_grants(clean), &strict), "verified Answer { n: 42 }");
    // It ranks after a failed start and missing enforcement, before the timeout.
    let timed_out = with_status(exited(0, b""), Status::TimedOut).with_grants(grants);
    assert!(check_with(timed_out, &strict).starts_with("116"));
}
