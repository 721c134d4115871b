//! The broker's frames, as a guest sends them: a stream of arbitrary bytes cut into
//! length-prefixed frames (a length over the maximum is refused before anything is
//! allocated), each payload parsed as a `BrokerFrame`. Nothing may panic; a frame that parses
//! serialises back to the same frame; grant names and reply messages stay within their bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stockade_protocol::FrameCodec;
use stockade_protocol::broker::{BrokerFrame, MAX_BROKER_MESSAGE_LEN, MAX_GRANT_NAME_LEN, ReplyBody};

fuzz_target!(|data: &[u8]| {
    let codec = FrameCodec::new(64 << 10);
    let mut rest = data;
    for _ in 0..64 {
        let Ok(Some((payload, used))) = codec.decode_slice(rest) else { break };
        check(payload);
        rest = &rest[used..];
    }
    check(data);
});

fn check(payload: &[u8]) {
    let Ok(frame) = BrokerFrame::parse(payload) else { return };
    match &frame {
        BrokerFrame::Call { grant, .. } => assert!(grant.as_str().len() <= MAX_GRANT_NAME_LEN),
        BrokerFrame::Reply { body: ReplyBody::Error(e), .. } => assert!(e.message.len() <= MAX_BROKER_MESSAGE_LEN),
        _ => {}
    }
    let again = BrokerFrame::parse(&frame.to_bytes()).expect("a parsed frame serialises to a frame that parses");
    assert_eq!(again, frame);
}
