//! E2B's wire (`stockade_protocol::e2b`): envelopes, the JSON codec's messages as the SDKs
//! send them, and refusals by name.

use stockade_protocol::e2b::{self, Code, ProcessEvent, ProcessInput, ProcessSelector, StartRequest};

#[test]
fn g2_envelopes_refuse_what_is_not_one_whole_message() {
    let one = e2b::envelope(0, b"{}");
    assert_eq!(e2b::single_envelope(&one).unwrap(), b"{}");
    assert!(e2b::single_envelope(&one[..3]).unwrap_err().message.contains("prefix"));
    assert!(e2b::single_envelope(&one[..6]).unwrap_err().message.contains("truncated"));
    let mut two = one.clone();
    two.extend(&one);
    assert!(e2b::single_envelope(&two).unwrap_err().message.contains("more than one"));
    assert_eq!(e2b::single_envelope(&e2b::envelope(1, b"x")).unwrap_err().code, Code::Unimplemented);
    // An announced length over the cap is refused before anything is read.
    assert_eq!(e2b::single_envelope(&[0, 0xff, 0xff, 0xff, 0xff]).unwrap_err().code, Code::ResourceExhausted);
    let end = e2b::end_stream(None);
    assert_eq!((end[0], &end[5..]), (e2b::FLAG_END_STREAM, &b"{}"[..]));
}

#[test]
fn g5_requests_parse_as_the_sdk_sends_them_and_unknown_keys_are_named() {
    let start: StartRequest = e2b::parse(
        br#"{"process":{"cmd":"/bin/bash","args":["-l","-c","true"],"envs":{"A":"1"},"cwd":"/home/user"},"stdin":false,"pty":{"size":{"cols":80,"rows":24}}}"#,
    )
    .unwrap();
    let p = start.process.unwrap();
    assert_eq!((p.cmd.as_str(), p.args.len(), p.envs["A"].as_str()), ("/bin/bash", 3, "1"));
    assert_eq!(start.pty.unwrap().size.unwrap().rows, 24);
    let input: e2b::SendInputRequest = e2b::parse(br#"{"process":{"pid":7},"input":{"stdin":"aGk="}}"#).unwrap();
    assert_eq!(input.process, ProcessSelector::Pid(7));
    assert_eq!(input.input, ProcessInput::Stdin(b"hi".to_vec()));
    let sig: e2b::SendSignalRequest = e2b::parse(br#"{"process":{"tag":"t"},"signal":"SIGNAL_SIGKILL"}"#).unwrap();
    assert_eq!(sig.signal.number(), 9);
    let e = e2b::parse::<e2b::SendSignalRequest>(br#"{"process":{"pid":1},"signal":"SIGNAL_SIGSTOP"}"#).unwrap_err();
    assert!(e.message.contains("SIGNAL_SIGSTOP"), "{e}");
    let e = e2b::parse::<e2b::PathRequest>(br#"{"path":"/x","sneaky":true}"#).unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument);
    assert!(e.message.contains("sneaky"), "{e}");
    let e = e2b::parse_api::<e2b::NewSandbox>(br#"{"templateID":"base","extra":1}"#).unwrap_err();
    assert!(e.to_string().contains("extra"), "{e}");
    // The SDK's own create body, with its snake-case network switch.
    let new: e2b::NewSandbox = e2b::parse_api(
        br#"{"templateID":"base","timeout":300,"autoPause":false,"metadata":{},"envVars":{"K":"v"},"allow_internet_access":true}"#,
    )
    .unwrap();
    assert_eq!((new.timeout, new.allow_internet_access), (Some(300), Some(true)));
}

#[test]
fn g7_events_and_entries_read_as_proto3_json() {
    let v = ProcessEvent::Stdout(b"hi".to_vec()).to_json();
    assert_eq!(v, serde_json::json!({"event": {"data": {"stdout": "aGk="}}}));
    let end = ProcessEvent::End { exit_code: 3, exited: true, status: "exit status 3".into(), error: None }.to_json();
    assert_eq!(end, serde_json::json!({"event": {"end": {"exitCode": 3, "exited": true, "status": "exit status 3"}}}));
    assert_eq!(e2b::rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(e2b::rfc3339(1_796_450_400), "2026-12-05T06:00:00Z");
    assert_eq!(e2b::rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(e2b::permissions(e2b::FileType::Directory, 0o755), "drwxr-xr-x");
    let entry = e2b::EntryInfo {
        name: "a".into(),
        kind: e2b::FileType::File,
        path: "/home/user/a".into(),
        size: 5,
        mode: 0o644,
        permissions: "-rw-r--r--".into(),
        owner: "user".into(),
        group: "user".into(),
        modified_time: e2b::rfc3339(0),
        symlink_target: None,
    };
    let v = serde_json::to_value(&entry).unwrap();
    assert_eq!(
        (v["type"].as_str(), v["size"].as_str(), v["modifiedTime"].as_str()),
        (Some("FILE_TYPE_FILE"), Some("5"), Some("1970-01-01T00:00:00Z"))
    );
}
