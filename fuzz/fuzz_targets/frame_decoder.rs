//! Frame decoder: arbitrary bytes must never panic, and a frame is never longer than the
//! codec's maximum.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stockade_protocol::frame::FrameCodec;

fuzz_target!(|data: &[u8]| {
    let Some((&max, rest)) = data.split_first() else { return };
    let codec = FrameCodec::new(u32::from(max) * 16);
    let mut cursor = std::io::Cursor::new(rest);
    while let Ok(Some(frame)) = codec.read_frame(&mut cursor) {
        assert!(frame.len() <= codec.max_len() as usize);
    }
    let mut slice = rest;
    while let Ok(Some((payload, used))) = codec.decode_slice(slice) {
        assert!(payload.len() <= codec.max_len() as usize);
        slice = &slice[used..];
    }
});
