//! Chat validator: arbitrary bytes must never panic, and anything accepted re-validates
//! after a round trip through its wire form.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stockade_protocol::chat::{ChatRequest, ChatResponse};

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = ChatRequest::parse(data) {
        let again = serde_json::to_vec(&req).map(|b| ChatRequest::parse(&b).is_ok());
        assert!(matches!(again, Ok(true)));
    }
    if let Ok(resp) = ChatResponse::parse(data) {
        assert!(resp.validate().is_ok());
    }
});
