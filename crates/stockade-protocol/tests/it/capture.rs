//! Capture: G3 (bounded, draining, fail-fast).

use std::io::{self, Read};

use proptest::prelude::*;
use stockade_protocol::capture::{CAPTURE_BUF_LEN, CaptureMode, Flow, capture, capture_async};

use crate::alloc_count::peak_during;

/// A reader that hands out `chunk`-sized pieces of a deterministic pattern forever and
/// counts how many bytes it handed out.
struct Endless {
    handed_out: u64,
}

impl Read for Endless {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        buf.fill(b'y');
        self.handed_out += buf.len() as u64;
        Ok(buf.len())
    }
}

/// Fails after `ok` bytes.
struct Broken {
    ok: usize,
}

impl Read for Broken {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.ok == 0 {
            return Err(io::Error::other("pipe broke"));
        }
        let n = buf.len().min(self.ok).min(7);
        buf[..n].fill(b'z');
        self.ok -= n;
        Ok(n)
    }
}

fn check(stream: &[u8], limit: usize, mode: CaptureMode, expect_kept: &[u8], expect_seen: u64, expect_flow: Flow) {
    let end = capture(&mut &stream[..], limit, mode).unwrap();
    assert_eq!(end.captured.bytes, expect_kept);
    assert_eq!(end.captured.seen, expect_seen);
    assert_eq!(end.captured.truncated, expect_seen > expect_kept.len() as u64);
    assert_eq!(end.flow, expect_flow);
}

#[test]
fn g3_drain_keeps_the_prefix_and_counts_everything() {
    check(b"hello world", 5, CaptureMode::Drain, b"hello", 11, Flow::Continue);
    check(b"hello", 5, CaptureMode::Drain, b"hello", 5, Flow::Continue);
    check(b"", 5, CaptureMode::Drain, b"", 0, Flow::Continue);
    check(b"abc", 0, CaptureMode::Drain, b"", 3, Flow::Continue);
}

#[test]
fn g3_fail_fast_reports_over_budget_at_the_first_byte_over() {
    check(b"hello", 5, CaptureMode::FailFast, b"hello", 5, Flow::Continue);
    check(b"hello!", 5, CaptureMode::FailFast, b"hello", 6, Flow::OverBudget);
}

#[test]
fn g3_fail_fast_stops_reading_an_endless_stream() {
    let mut src = Endless { handed_out: 0 };
    let end = capture(&mut src, 1000, CaptureMode::FailFast).unwrap();
    assert_eq!(end.flow, Flow::OverBudget);
    assert_eq!(end.captured.bytes.len(), 1000);
    assert!(end.captured.truncated);
    assert!(src.handed_out <= CAPTURE_BUF_LEN as u64, "kept reading: {} bytes after a 1000-byte limit", src.handed_out);
}

#[test]
fn g3_memory_is_constant_on_a_long_stream() {
    const LIMIT: usize = 4096;
    let stream_len: u64 = 64 << 20;
    let mut src = io::repeat(b'x').take(stream_len);
    let (end, peak) = peak_during(|| capture(&mut src, LIMIT, CaptureMode::Drain).unwrap());
    assert_eq!(end.captured.seen, stream_len);
    assert_eq!(end.captured.bytes.len(), LIMIT);
    assert!(peak <= LIMIT * 2 + CAPTURE_BUF_LEN + 1024, "peak {peak} bytes on a 64 MiB stream");
}

#[test]
fn g3_io_error_keeps_what_was_captured() {
    let err = capture(&mut Broken { ok: 20 }, 10, CaptureMode::Drain).unwrap_err();
    assert_eq!(err.captured.bytes, b"zzzzzzzzzz");
    assert_eq!(err.captured.seen, 20);
    assert_eq!(err.source.to_string(), "pipe broke");
}

#[test]
fn g3_drain_never_blocks_the_writer() {
    // The pipe holds 1 KiB; the writer sends 1 MiB. If the capture stopped reading at its
    // limit, the writer would block forever and the join would hang.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (mut tx, mut rx) = tokio::io::duplex(1024);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let chunk = vec![b'w'; 4096];
            for _ in 0..256 {
                tx.write_all(&chunk).await.unwrap();
            }
        });
        let end = capture_async(&mut rx, 100, CaptureMode::Drain).await.unwrap();
        writer.await.unwrap();
        assert_eq!(end.captured.seen, 1 << 20);
        assert_eq!(end.captured.bytes.len(), 100);
        assert_eq!(end.flow, Flow::Continue);
    });
}

#[test]
fn g3_async_fail_fast_signals_over_budget() {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async {
        let data = vec![b'a'; 10_000];
        let end = capture_async(&mut &data[..], 10, CaptureMode::FailFast).await.unwrap();
        assert_eq!(end.flow, Flow::OverBudget);
        assert_eq!(end.captured.bytes, b"aaaaaaaaaa");
    });
}

proptest! {
    #[test]
    fn g3_kept_bytes_are_the_prefix_and_never_exceed_the_limit(
        stream in proptest::collection::vec(any::<u8>(), 0..2000),
        limit in 0usize..3000,
        fail_fast in any::<bool>(),
    ) {
        let mode = if fail_fast { CaptureMode::FailFast } else { CaptureMode::Drain };
        let end = capture(&mut &stream[..], limit, mode).unwrap();
        let kept = &end.captured.bytes;
        prop_assert!(kept.len() <= limit);
        prop_assert_eq!(&kept[..], &stream[..kept.len()]);
        prop_assert_eq!(kept.len(), stream.len().min(limit));
        prop_assert_eq!(end.captured.truncated, stream.len() > limit);
        prop_assert_eq!(end.flow == Flow::OverBudget, fail_fast && stream.len() > limit);
        if !fail_fast {
            prop_assert_eq!(end.captured.seen, stream.len() as u64);
        }
    }
}
