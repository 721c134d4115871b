//! The network grant's proxy reading a guest's plain-HTTP request: its head, then its body
//! by its framing (the chunked codec, trailers and all), into what goes upstream. Arbitrary
//! bytes must never panic; what is forwarded must be one request a strict reader sees with
//! the decided method, host and path, a canonical body with nothing after it, and every byte
//! charged (`stockade_egress::fuzzing::check_request`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| stockade_egress::fuzzing::check_request(data));
