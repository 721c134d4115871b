//! Untrusted JSON: G4 (caps checked before parsing).

use serde_json::Value;
use stockade_protocol::json::{JsonError, JsonLimits, nesting_depth, parse_untrusted};

use crate::alloc_count::peak_during;

#[test]
fn g4_over_the_byte_cap_is_refused_before_parsing() {
    let doc = format!("\"{}\"", "a".repeat(100));
    let (result, peak) = peak_during(|| parse_untrusted::<Value>(doc.as_bytes(), JsonLimits::new(50, 8)));
    assert!(matches!(result, Err(JsonError::TooLarge { len: 102, max: 50, .. })));
    assert!(peak < 256, "refusal allocated {peak} bytes");
}

#[test]
fn g4_over_the_depth_cap_is_refused_without_recursion() {
    // A million nested arrays would overflow a recursive parser's stack.
    let doc = "[".repeat(1_000_000);
    let result = parse_untrusted::<Value>(doc.as_bytes(), JsonLimits::new(2 << 20, 64));
    assert!(matches!(result, Err(JsonError::TooDeep { max: 64, .. })));
    let ok = format!("{}{}", "[".repeat(64), "]".repeat(64));
    assert!(parse_untrusted::<Value>(ok.as_bytes(), JsonLimits::new(1024, 64)).is_ok());
    let deep = format!("{}{}", "[".repeat(65), "]".repeat(65));
    assert!(matches!(
        parse_untrusted::<Value>(deep.as_bytes(), JsonLimits::new(1024, 64)),
        Err(JsonError::TooDeep { .. })
    ));
}

#[test]
fn g4_brackets_inside_strings_do_not_count() {
    assert_eq!(nesting_depth(br#"{"a":"[[[[{{{{\"[[["}"#), 1);
    assert_eq!(nesting_depth(br#"["\\", [1]]"#), 2);
}

#[test]
fn syntax_and_schema_errors_are_told_apart() {
    let limits = JsonLimits::default();
    assert!(matches!(parse_untrusted::<Value>(b"{", limits), Err(JsonError::Syntax { line: 1, .. })));
    assert!(matches!(parse_untrusted::<u8>(b"\"x\"", limits), Err(JsonError::Schema { .. })));
    assert!(matches!(parse_untrusted::<u8>(b"300", limits), Err(JsonError::Schema { .. })));
}
