//! Schemas: G2 (no panic), G5 (unknown keys and bounds), G7 (round trip), G8 (limits).

use std::time::Duration;

use proptest::prelude::*;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use stockade_protocol::chat::{ChatRequest, ChatResponse};
use stockade_protocol::job::{MAX_ENV_VARS, MAX_STDIN_BYTES};
use stockade_protocol::limits::{MAX_DURATION, MAX_OUTPUT_BYTES};
use stockade_protocol::{
    Access, BrokerFrame, Captured, Enforced, GrantName, Job, JobError, JsonLimits, Limits, LimitsError, Mechanism,
    ReplyBody, ReplyCode, ReplyError, Report, Status, Stream, parse_untrusted,
};

fn parse<T: DeserializeOwned>(v: Value) -> Result<T, String> {
    parse_untrusted(v.to_string().as_bytes(), JsonLimits::default()).map_err(|e| e.to_string())
}

fn sample_job() -> Job {
    Job::command("python3", ["-c", "print(6*7)"])
        .unwrap()
        .with_stdin(b"in".to_vec())
        .unwrap()
        .with_env("LANG", "C.UTF-8")
        .unwrap()
        .with_workspace("/srv/ws", Access::ReadOnly)
        .unwrap()
        .with_limits(Limits::new().with_wall(Duration::from_secs(2)).unwrap())
}

fn sample_report() -> Report {
    Report::new(Status::Exited { code: 0 }, Duration::from_micros(1234))
        .with_output(Captured::new(b"42\n".to_vec(), 3), Captured::new(vec![0xff, 0xfe], 9))
        .with_cpu(Duration::from_micros(800))
        .with_peak_memory(1 << 20)
        .with_enforced(Enforced::new(Mechanism::Landlock, "abi 7"))
        .with_enforced(Enforced::new(Mechanism::Seccomp, ""))
}

#[test]
fn g7_job_encoding_is_stable_and_round_trips() {
    let job = sample_job();
    let text = serde_json::to_string(&job).unwrap();
    assert_eq!(
        text,
        r#"{"kind":{"command":{"program":"python3","args":["-c","print(6*7)"]}},"stdin":"in","env":[{"key":"LANG","value":"C.UTF-8"}],"workspace":{"path":"/srv/ws","access":"read_only"},"limits":{"wall_ms":2000,"cpu_ms":10000,"memory_bytes":536870912,"processes":64,"open_files":256,"file_size_bytes":67108864,"stdout_bytes":1048576,"stderr_bytes":262144}}"#
    );
    let back: Job = parse_untrusted(text.as_bytes(), JsonLimits::default()).unwrap();
    assert_eq!(back, job);
}

#[test]
fn g7_report_encoding_keeps_every_byte() {
    let report = sample_report();
    let text = serde_json::to_string(&report).unwrap();
    assert!(text.contains(r#""stdout":{"bytes":"42\n","seen":3,"truncated":false}"#), "{text}");
    assert!(text.contains(r#""stderr":{"bytes":[255,254],"seen":9,"truncated":true}"#), "{text}");
    let back: Report = parse_untrusted(text.as_bytes(), JsonLimits::default()).unwrap();
    assert_eq!(back, report);
    for status in [
        Status::Signaled { signal: 9 },
        Status::TimedOut,
        Status::OutputLimit { stream: Stream::Stderr },
        Status::OutOfMemory,
        Status::CpuLimit,
        Status::failed_to_start("no such file"),
    ] {
        let r = Report::new(status, Duration::ZERO);
        let back: Report = parse_untrusted(serde_json::to_vec(&r).unwrap().as_slice(), JsonLimits::default()).unwrap();
        assert_eq!(back, r);
    }
}

#[test]
fn g7_broker_frames_round_trip_and_read_plainly() {
    let call = BrokerFrame::Call { id: 7, grant: GrantName::new("fs.read").unwrap(), args: json!({"path": "a"}) };
    assert_eq!(
        String::from_utf8(call.to_bytes()).unwrap(),
        r#"{"type":"call","id":7,"grant":"fs.read","args":{"path":"a"}}"#
    );
    let ok = BrokerFrame::Reply { id: 7, body: ReplyBody::Result(Value::Null) };
    assert_eq!(String::from_utf8(ok.to_bytes()).unwrap(), r#"{"type":"reply","id":7,"result":null}"#);
    let err = BrokerFrame::Reply { id: 8, body: ReplyBody::Error(ReplyError::new(ReplyCode::Denied, "no")) };
    for frame in [call, ok, err] {
        assert_eq!(BrokerFrame::parse(&frame.to_bytes()).unwrap(), frame);
    }
}

#[test]
fn g7_a_number_a_guest_sends_parses_exactly_so_its_text_round_trips() {
    // Found by the broker_frame fuzzer: without a correctly rounded float parser, the text
    // below parsed one ULP off, so the frame written back parsed to another number (what a
    // policy authorised and what a host function then read could differ at a bound).
    for text in ["9.9775777777777e+28", "9.977577777777701e+28", "7.777777777577758e+50", "2.2250738585072011e-308"] {
        let frame =
            BrokerFrame::parse(format!(r#"{{"type":"call","id":9,"grant":"call","args":[{text}]}}"#).as_bytes())
                .unwrap();
        let BrokerFrame::Call { args, .. } = &frame else { panic!("{frame:?}") };
        let want: f64 = text.parse().unwrap();
        assert_eq!(args[0].as_f64().map(f64::to_bits), Some(want.to_bits()), "{text} parsed to {:?}", args[0]);
        assert_eq!(BrokerFrame::parse(&frame.to_bytes()).unwrap(), frame, "{text}");
    }
}

#[test]
fn g7_an_object_whose_first_key_is_serde_jsons_raw_value_token_is_an_ordinary_object() {
    // Found by the broker_frame fuzzer: with serde_json's `raw_value` feature on anywhere in
    // the program, a `Value` reads an object whose first key is this token as the JSON text
    // its value holds. A frame with the token second parsed, and written back (a `Map` sorts
    // its keys, so the token came first) did not parse; with the token first, a string became
    // the document it spelled, so what the guest wrote and what the policy saw differed.
    const TOKEN: &str = "$serde_json::private::RawValue";
    for args in [format!(r#"{{"a":1,"{TOKEN}":2}}"#), format!(r#"{{"{TOKEN}":"[1,2]"}}"#)] {
        let text = format!(r#"{{"type":"call","id":2,"grant":"add","args":{args}}}"#);
        let frame = BrokerFrame::parse(text.as_bytes()).unwrap();
        let BrokerFrame::Call { args: parsed, .. } = &frame else { panic!("{frame:?}") };
        assert_eq!(parsed, &serde_json::from_str::<Value>(&args).unwrap(), "{args}");
        assert!(parsed.get(TOKEN).is_some(), "{args} parsed to {parsed}");
        assert_eq!(BrokerFrame::parse(&frame.to_bytes()).unwrap(), frame, "{args}");
    }
    let reply = format!(r#"{{"type":"reply","id":1,"result":{{"{TOKEN}":"{{}}"}}}}"#);
    let frame = BrokerFrame::parse(reply.as_bytes()).unwrap();
    assert_eq!(serde_json::from_slice::<Value>(&frame.to_bytes()).unwrap()["result"][TOKEN], "{}");
}

#[test]
fn g5_unknown_keys_are_refused_everywhere() {
    let job = serde_json::to_value(sample_job()).unwrap();
    let report = serde_json::to_value(sample_report()).unwrap();
    let mut cases: Vec<(&str, Value)> = Vec::new();
    let mut with = |name, mut v: Value, pointer: &str| {
        v.pointer_mut(pointer).unwrap().as_object_mut().unwrap().insert("sneaky".into(), json!(1));
        cases.push((name, v));
    };
    with("job", job.clone(), "");
    with("job.kind.command", job.clone(), "/kind/command");
    with("job.limits", job.clone(), "/limits");
    with("job.env[0]", job.clone(), "/env/0");
    with("job.workspace", job, "/workspace");
    with("report", report.clone(), "");
    with("report.status", report.clone(), "/status");
    with("report.stdout", report.clone(), "/stdout");
    with("report.enforcement[0]", report, "/enforcement/0");
    for (name, v) in cases {
        let refused = if name.starts_with("job") { parse::<Job>(v).is_err() } else { parse::<Report>(v).is_err() };
        assert!(refused, "{name} accepted an unknown key");
    }
    assert!(BrokerFrame::parse(br#"{"type":"call","id":1,"grant":"g","args":{},"x":1}"#).is_err());
    assert!(BrokerFrame::parse(br#"{"type":"reply","id":1,"result":1,"x":1}"#).is_err());
    assert!(BrokerFrame::parse(br#"{"type":"reply","id":1,"error":{"code":"denied","message":"m","x":1}}"#).is_err());
}

#[test]
fn g5_broker_replies_carry_exactly_one_body_and_bounded_names() {
    assert!(BrokerFrame::parse(br#"{"type":"reply","id":1}"#).is_err());
    assert!(
        BrokerFrame::parse(br#"{"type":"reply","id":1,"result":1,"error":{"code":"denied","message":"m"}}"#).is_err()
    );
    assert!(matches!(
        BrokerFrame::parse(br#"{"type":"reply","id":1,"result":null}"#),
        Ok(BrokerFrame::Reply { body: ReplyBody::Result(Value::Null), .. })
    ));
    let long = format!(r#"{{"type":"reply","id":1,"error":{{"code":"denied","message":"{}"}}}}"#, "m".repeat(5000));
    assert!(BrokerFrame::parse(long.as_bytes()).is_err());
    for bad in ["", "a b", "../x", &"g".repeat(65), "naïve"] {
        assert!(GrantName::new(bad).is_err(), "{bad:?} accepted");
        let doc = format!(r#"{{"type":"call","id":1,"grant":{},"args":null}}"#, json!(bad));
        assert!(BrokerFrame::parse(doc.as_bytes()).is_err(), "{bad:?} parsed");
    }
}

#[test]
fn g5_job_strings_counts_and_sizes_are_checked() {
    let check = |r: Result<Job, JobError>, want: &str| {
        let e = r.expect_err(want);
        assert!(e.to_string().contains(want), "{e} does not mention {want}");
    };
    check(Job::command("", Vec::<String>::new()), "program is empty");
    check(Job::command("sh", ["a\0b"]), "args contains a NUL");
    check(Job::image("img", ["x\0"]), "command contains a NUL");
    check(Job::wasm("/m.wasm", "", Vec::<String>::new()), "entry is empty");
    let job = || Job::command("sh", Vec::<String>::new()).unwrap();
    check(job().with_env("A=B", "x"), "contains '='");
    check(job().with_env("", "x"), "env key is empty");
    check(job().with_env("A", "x\0"), "env value contains a NUL");
    check(job().with_env("A", "1").unwrap().with_env("A", "2"), "granted twice");
    check(job().with_stdin(vec![0; MAX_STDIN_BYTES + 1]), "more than the maximum");
    check(job().with_workspace("rel/dir", Access::ReadWrite), "not absolute");
    let mut many = job();
    for i in 0..MAX_ENV_VARS {
        many = many.with_env(format!("V{i}"), "x").unwrap();
    }
    check(many.with_env("ONE_MORE", "x"), "more than the maximum");
    // The same checks run on the wire.
    let doc = json!({"kind": {"command": {"program": "sh", "args": []}}, "env": [{"key": "A=B", "value": ""}]});
    assert!(parse::<Job>(doc).unwrap_err().contains("contains '='"));
    let doc = json!({"kind": {"command": {"program": "", "args": []}}});
    assert!(parse::<Job>(doc).is_err());
    let doc = json!({"kind": {"shell": {"script": "rm -rf /"}}});
    assert!(parse::<Job>(doc).is_err());
}

#[test]
fn g8_limits_have_no_unlimited_value() {
    let expect_err = |r: Result<Limits, LimitsError>, name: &str| {
        let e = r.expect_err(name);
        assert_eq!(e.name, name);
    };
    let l = Limits::new();
    expect_err(l.with_wall(Duration::ZERO), "wall");
    expect_err(l.with_wall(MAX_DURATION + Duration::from_secs(1)), "wall");
    expect_err(l.with_cpu(Duration::from_micros(10)), "cpu");
    expect_err(l.with_memory(0), "memory_bytes");
    expect_err(l.with_processes(0), "processes");
    expect_err(l.with_processes(u32::MAX), "processes");
    expect_err(l.with_open_files(0), "open_files");
    expect_err(l.with_file_size(u64::MAX), "file_size_bytes");
    expect_err(l.with_stdout(0), "stdout_bytes");
    expect_err(l.with_stderr(MAX_OUTPUT_BYTES + 1), "stderr_bytes");
    // Defaults are the documented ones.
    assert_eq!(l.wall(), Duration::from_secs(10));
    assert_eq!(l.stdout_bytes(), 1 << 20);
    assert_eq!(Limits::default(), l);
    // On the wire: a missing field takes its default, a zero or huge one is refused.
    assert_eq!(parse::<Limits>(json!({})).unwrap(), l);
    assert_eq!(parse::<Limits>(json!({"wall_ms": 1500})).unwrap().wall(), Duration::from_millis(1500));
    assert!(parse::<Limits>(json!({"wall_ms": 0})).unwrap_err().contains("wall"));
    assert!(parse::<Limits>(json!({"stdout_bytes": u64::MAX})).is_err());
    assert!(parse::<Limits>(json!({"unlimited": true})).is_err());
}

#[test]
fn failure_reasons_are_bounded() {
    let long = "é".repeat(10_000);
    let Status::FailedToStart { reason } = Status::failed_to_start(long) else { unreachable!() };
    assert!(reason.len() <= stockade_protocol::report::MAX_REASON_BYTES);
    assert!(reason.chars().all(|c| c == 'é'));
}

fn arb_job() -> impl Strategy<Value = Job> {
    let s = "[a-zA-Z0-9 ./_-]{0,12}";
    (
        "[a-z]{1,8}",
        proptest::collection::vec(s, 0..4),
        proptest::collection::vec(any::<u8>(), 0..64),
        proptest::collection::btree_map("[A-Z_]{1,8}", s, 0..4),
        proptest::option::of(("/[a-z]{1,8}", any::<bool>())),
        1u64..100_000,
    )
        .prop_map(|(program, args, stdin, env, ws, wall_ms)| {
            let mut job = Job::command(program, args).unwrap().with_stdin(stdin).unwrap();
            for (k, v) in env {
                job = job.with_env(k, v).unwrap();
            }
            if let Some((path, rw)) = ws {
                job = job.with_workspace(path, if rw { Access::ReadWrite } else { Access::ReadOnly }).unwrap();
            }
            job.with_limits(Limits::new().with_wall(Duration::from_millis(wall_ms)).unwrap())
        })
}

proptest! {
    #[test]
    fn g7_jobs_round_trip(job in arb_job()) {
        let bytes = serde_json::to_vec(&job).unwrap();
        let back: Job = parse_untrusted(&bytes, JsonLimits::default()).unwrap();
        prop_assert_eq!(back, job);
    }

    #[test]
    fn g7_captured_bytes_round_trip(bytes in proptest::collection::vec(any::<u8>(), 0..64), extra in 0u64..10) {
        let c = Captured::new(bytes.clone(), bytes.len() as u64 + extra);
        let back: Captured = parse_untrusted(&serde_json::to_vec(&c).unwrap(), JsonLimits::default()).unwrap();
        prop_assert_eq!(back, c);
    }

    #[test]
    fn g2_schemas_never_panic_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let l = JsonLimits::default();
        let _ = parse_untrusted::<Job>(&bytes, l);
        let _ = parse_untrusted::<Report>(&bytes, l);
        let _ = parse_untrusted::<Limits>(&bytes, l);
        let _ = BrokerFrame::parse(&bytes);
        let _ = ChatRequest::parse(&bytes);
        let _ = ChatResponse::parse(&bytes);
    }

    #[test]
    fn g2_schemas_never_panic_on_json_shaped_input(s in r#"[{}\[\]":,a-z0-9 ]{0,200}"#) {
        let l = JsonLimits::default();
        let _ = parse_untrusted::<Job>(s.as_bytes(), l);
        let _ = parse_untrusted::<Report>(s.as_bytes(), l);
        let _ = BrokerFrame::parse(s.as_bytes());
        let _ = ChatRequest::parse(s.as_bytes());
    }
}
