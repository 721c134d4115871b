//! `fetch`'s reading of an upstream's answer (the wasm tier's JavaScript `fetch` goes
//! through it): status, headers and a de-chunked body. Arbitrary bytes, huge chunk sizes
//! among them, must never panic (`stockade_egress::fuzzing::check_fetch`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| stockade_egress::fuzzing::check_fetch(data));
