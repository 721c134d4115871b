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
        metadata: std::collections::BTreeMap::new(),
    };
    let v = serde_json::to_value(&entry).unwrap();
    assert_eq!(
        (v["type"].as_str(), v["size"].as_str(), v["modifiedTime"].as_str()),
        (Some("FILE_TYPE_FILE"), Some("5"), Some("1970-01-01T00:00:00Z"))
    );
}

// ---- the binary codec ----

use e2b::Codec;
use e2b::proto::{self, EVENT_RESPONSE, LIST_DIR_RESPONSE, START_REQUEST};

#[test]
fn g7_the_binary_codec_writes_protobufs_bytes_and_reads_them_back() {
    // Bytes worked out by hand from the protobuf encoding spec: StartRequest{process:
    // ProcessConfig{cmd:"ls", args:["-l"], envs:{"A":"1"}}, stdin:false}.
    let start = serde_json::json!({"process": {"cmd": "ls", "args": ["-l"], "envs": {"A": "1"}}, "stdin": false});
    let bytes = [
        0x0a, 0x10, // field 1 (process), 16 bytes
        0x0a, 0x02, b'l', b's', // cmd
        0x12, 0x02, b'-', b'l', // args
        0x1a, 0x06, 0x0a, 0x01, b'A', 0x12, 0x01, b'1', // envs entry
        0x20, 0x00, // stdin = false (explicit presence)
    ];
    assert_eq!(proto::encode(&start, &START_REQUEST).unwrap(), bytes);
    assert_eq!(proto::decode(&bytes, &START_REQUEST).unwrap(), start);
    let r: StartRequest = Codec::Proto.decode(&bytes, &START_REQUEST).unwrap();
    assert_eq!((r.process.unwrap().envs["A"].as_str(), r.stdin), ("1", Some(false)));

    // sint32 is zigzag: exit code -1 is 0x01, 3 is 0x06; bytes are raw on the wire.
    let end = ProcessEvent::End { exit_code: -1, exited: false, status: "signal: killed".into(), error: None };
    let wire = Codec::Proto.encode(&end.to_json(), &EVENT_RESPONSE).unwrap();
    assert_eq!(&wire[..8], [0x0a, 0x16, 0x1a, 0x14, 0x08, 0x01, 0x10, 0x00]);
    assert_eq!(proto::decode(&wire, &EVENT_RESPONSE).unwrap(), end.to_json());
    let out = Codec::Proto.encode(&ProcessEvent::Stdout(vec![0, 0xff]).to_json(), &EVENT_RESPONSE).unwrap();
    assert_eq!(out, [0x0a, 0x06, 0x12, 0x04, 0x0a, 0x02, 0x00, 0xff]);

    // An EntryInfo: int64 size from its JSON string, the enum by number, the time as a
    // google.protobuf.Timestamp, all read back as proto3 JSON writes them.
    let entry = serde_json::json!({"entries": [{
        "name": "a", "type": "FILE_TYPE_DIRECTORY", "path": "/home/user/a", "size": "5000000000",
        "mode": 493, "permissions": "drwxr-xr-x", "owner": "user", "group": "user",
        "modifiedTime": "2026-12-05T06:00:00.500Z",
    }]});
    let wire = Codec::Proto.encode(&entry, &LIST_DIR_RESPONSE).unwrap();
    assert_eq!(proto::decode(&wire, &LIST_DIR_RESPONSE).unwrap(), entry);
    assert_eq!(e2b::parse_rfc3339("2026-12-05T06:00:00Z"), Some((1_796_450_400, 0)));
    assert_eq!(e2b::parse_rfc3339("2000-02-29T00:00:00.000000001Z"), Some((951_782_400, 1)));
    for secs in [0, 951_782_400, 1_796_450_400, -86_401, 253_402_300_799] {
        assert_eq!(e2b::parse_rfc3339(&e2b::rfc3339(secs)), Some((secs, 0)), "{secs}");
    }
    for bad in ["2026-12-05 06:00:00Z", "2026-13-05T06:00:00Z", "2026-12-05T06:00:00", "2026-12-05T06:00:00.Z"] {
        assert_eq!(e2b::parse_rfc3339(bad), None, "{bad}");
    }
    // A response key the schema lacks is an error, not a silently dropped field.
    let e = Codec::Proto.encode(&serde_json::json!({"event": {"start": {"pid": 1, "x": 2}}}), &EVENT_RESPONSE);
    assert!(e.unwrap_err().message.contains("no field \"x\""));
}

#[test]
fn g2_the_binary_codec_refuses_malformed_messages_by_name() {
    let refuse = |bytes: &[u8], says: &str| {
        let e = Codec::Proto.decode::<StartRequest>(bytes, &START_REQUEST).unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument, "{e}");
        assert!(e.message.contains(says), "{bytes:?}: {e}");
    };
    refuse(&[0x28, 0x01], "process.StartRequest: unknown field 5");
    refuse(&[0x0a, 0x02, 0x0a], "process.StartRequest.process: a 2-byte length with 1 bytes left");
    refuse(&[0x0a, 0x02, 0x0a, 0x09], "process.ProcessConfig.cmd: a 9-byte length");
    refuse(&[0x18, 0x01], "process.StartRequest.tag: varint wire type where length-delimited");
    refuse(&[0x1a, 0x01, 0xc3], "process.StartRequest.tag: a string that is not UTF-8");
    refuse(&[0x20, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f], "varint over 64 bits");
    refuse(&[0x20, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01], "varint over");
    refuse(&[0x0b, 0x0c], "group wire type");
    // The schema's own refusals still apply after decoding: a signal outside the two.
    let e = Codec::Proto
        .decode::<e2b::SendSignalRequest>(&[0x0a, 0x02, 0x08, 0x07, 0x10, 0x13], &proto::SEND_SIGNAL_REQUEST)
        .unwrap_err();
    assert!(e.message.contains("signal 19: not 15 or 9"), "{e}");
    // Over the field budget: one request cannot grow without bound in memory.
    let many: Vec<u8> = std::iter::repeat_n([0x1a, 0x00], proto::MAX_FIELDS + 2).flatten().collect();
    let e = Codec::Proto.decode::<StartRequest>(&many, &START_REQUEST).unwrap_err();
    assert!(e.message.contains("more than 65536 fields"), "{e}");
    // Over the message cap, before anything is decoded.
    let e = Codec::Proto.decode::<e2b::Empty>(&vec![0; e2b::MAX_RPC_BYTES + 1], &proto::EMPTY).unwrap_err();
    assert_eq!(e.code, Code::ResourceExhausted, "{e}");
}

#[test]
fn g2_content_types_name_the_codec() {
    assert_eq!(Codec::from_content_type("application/proto", false), Some(Codec::Proto));
    assert_eq!(Codec::from_content_type("application/connect+proto", true), Some(Codec::Proto));
    assert_eq!(Codec::from_content_type("application/json; charset=utf-8", false), Some(Codec::Json));
    assert_eq!(Codec::from_content_type("application/connect+json", false), None);
    assert_eq!(Codec::from_content_type("application/proto", true), None);
    assert_eq!(Codec::from_content_type("text/plain", false), None);
    assert!(e2b::find_method("/process.Process/Start").unwrap().shape.streaming());
    assert!(e2b::find_method("/filesystem.Filesystem/WatchDir").unwrap().shape.streaming());
}

#[test]
fn g2_a_watch_stream_s_empty_events_keep_their_presence_in_the_binary_codec() {
    // `WatchDirResponse`'s start and keepalive are empty messages: what tells them is the
    // field being there, so each is its tag and a zero length, and reads back as itself.
    for (event, bytes) in [("start", [0x0a, 0x00]), ("keepalive", [0x1a, 0x00])] {
        let v = serde_json::json!({ event: {} });
        assert_eq!(proto::encode(&v, &proto::WATCH_DIR_RESPONSE).unwrap(), bytes, "{event}");
        assert_eq!(proto::decode(&bytes, &proto::WATCH_DIR_RESPONSE).unwrap(), v, "{event}");
    }
}

proptest::proptest! {
    #[test]
    fn g2_no_bytes_make_the_binary_codec_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
        for m in &e2b::METHODS {
            let _ = proto::decode(&bytes, m.request);
            let _ = proto::decode(&bytes, m.response);
        }
    }

    #[test]
    fn g7_what_decodes_encodes_back_to_the_same_value(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
        for m in &e2b::METHODS {
            if let Ok(v) = proto::decode(&bytes, m.request) {
                let again = proto::encode(&v, m.request).unwrap();
                proptest::prop_assert_eq!(proto::decode(&again, m.request).unwrap(), v);
            }
        }
    }
}
