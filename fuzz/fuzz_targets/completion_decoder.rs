//! The agent's completion decoder, whole and streamed: arbitrary bytes must never panic; every
//! accepted call's arguments are one object within the caps; the stream assembler gives the
//! same text however the bytes are split.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stockade_protocol::completion::{MAX_ARGUMENT_BYTES, MAX_DECODED_CALLS, StreamAssembler, decode_completion};

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = decode_completion(data) {
        assert!(c.calls.len() <= MAX_DECODED_CALLS);
        for call in &c.calls {
            if let Ok(args) = &call.arguments {
                assert!(serde_json::to_vec(args).map(|v| v.len() <= 2 * MAX_ARGUMENT_BYTES).unwrap_or(false));
            }
        }
    }
    let split = data.first().map_or(1, |b| usize::from(*b % 16) + 1);
    let (mut whole, mut pieces) = (StreamAssembler::new(), StreamAssembler::new());
    let a = whole.push(data).map(|t| t.concat());
    let mut b = Ok(String::new());
    for chunk in data.chunks(split) {
        match (pieces.push(chunk), &mut b) {
            (Ok(t), Ok(acc)) => acc.push_str(&t.concat()),
            (Err(e), _) => {
                b = Err(e);
                break;
            }
            _ => {}
        }
    }
    if let (Ok(a), Ok(b)) = (&a, &b) {
        assert_eq!(a, b);
        let _ = (whole.finish(), pieces.finish());
    }
});
