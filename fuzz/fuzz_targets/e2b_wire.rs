//! E2B's envd wire: arbitrary bytes, in an envelope or not, read in both Connect codecs as
//! every request stockade offers, must never panic; whatever the binary codec decodes
//! encodes back to a message that decodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stockade_protocol::e2b::{self, Codec, proto};

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let method = &e2b::METHODS[usize::from(pick) % e2b::METHODS.len()];
    let message = e2b::single_envelope(rest).unwrap_or(rest);
    if let Ok(value) = proto::decode(message, method.request) {
        let again = proto::encode(&value, method.request).expect("a decoded message encodes");
        assert_eq!(proto::decode(&again, method.request).expect("its encoding decodes"), value);
    }
    let _ = proto::decode(message, method.response);
    for codec in [Codec::Json, Codec::Proto] {
        let _ = codec.decode::<e2b::StartRequest>(message, &proto::START_REQUEST);
        let _ = codec.decode::<e2b::StreamInputRequest>(message, &proto::STREAM_INPUT_REQUEST);
        let _ = codec.decode::<e2b::SendSignalRequest>(message, &proto::SEND_SIGNAL_REQUEST);
    }
});
