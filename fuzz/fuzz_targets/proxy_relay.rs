//! What the proxy relays back and watches: a response head rewritten to close, the TLS
//! record watch fed in two pieces and whole, and a secret's scrubber over arbitrary pieces.
//! Never a panic; the rewritten head reads back as one head; the watch's reading does not
//! depend on how the bytes arrive; the secret never comes through
//! (`stockade_egress::fuzzing::{check_relay, check_scrub}`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use stockade_egress::fuzzing::{check_relay, check_scrub};

fuzz_target!(|data: &[u8]| {
    let Some((&cut, rest)) = data.split_first() else { return };
    check_relay(rest, usize::from(cut));
    // The first bytes name the secret (1 to 16 of them), the next few cut the rest.
    let n = usize::from(cut % 16) + 1;
    if rest.len() > n + 4 {
        let (secret, rest) = rest.split_at(n);
        let (cuts, text) = rest.split_at(4);
        check_scrub(secret, text, cuts);
    }
});
