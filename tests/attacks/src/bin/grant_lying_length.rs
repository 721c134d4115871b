//! Announce a 4 GiB frame and send a few bytes, then try to keep calling on a fresh
//! connection. Grants row (issue 12): the broker must refuse at the length prefix and end the
//! run's session; no later call may run.
use std::io::Write;

use stockade_attacks::*;

fn main() {
    let mut s = match broker(None) {
        Ok(s) => s,
        Err(e) => return report("connect", Err::<(), _>(e)),
    };
    let _ = s.write_all(&u32::MAX.to_be_bytes());
    let _ = s.write_all(br#"{"type":"call""#);
    report_grant("lying_length", grant_call(&mut s, "log", r#"{"msg":"ok-after-lie"}"#));
    report_grant(
        "call_after_lie",
        broker(None).and_then(|mut t| grant_call(&mut t, "log", r#"{"msg":"ok-after-lie"}"#)),
    );
}
