#![allow(missing_docs, reason = "criterion_main generates an undocumented main")]
//! Protocol throughput: bounded capture of a 1 GiB stream, and 1 KiB frame encode plus
//! decode, each next to a bare baseline measured in the same run.
//!
//! Run with `cargo xtask bench protocol` (or `cargo bench -p stockade-protocol`).

use std::hint::black_box;
use std::io::{self, Cursor, Read, Write};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use stockade_protocol::capture::{CAPTURE_BUF_LEN, CaptureMode, capture};
use stockade_protocol::frame::FrameCodec;

const STREAM: u64 = 1 << 30;
const FRAMES: usize = 1000;

/// Writes `STREAM` bytes into an OS pipe from another thread and hands back the read end.
fn pipe_stream() -> (io::PipeReader, std::thread::JoinHandle<()>) {
    let (reader, mut writer) = io::pipe().unwrap_or_else(|e| panic!("pipe: {e}"));
    let feeder = std::thread::spawn(move || {
        let chunk = vec![b'x'; 1 << 16];
        let mut left = STREAM;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            if writer.write_all(&chunk[..n]).is_err() {
                return;
            }
            left -= n as u64;
        }
    });
    (reader, feeder)
}

/// Reads `r` to its end into a reused buffer, discarding everything: the bare baseline.
fn bare_drain(r: &mut impl Read) -> u64 {
    let mut buf = vec![0u8; CAPTURE_BUF_LEN];
    let mut total = 0;
    while let Ok(n @ 1..) = r.read(&mut buf) {
        total += black_box(&buf[..n]).len() as u64;
    }
    total
}

fn capture_bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("capture_1gib");
    g.sample_size(10).throughput(Throughput::Bytes(STREAM));
    g.bench_function("baseline_bare_read_from_pipe", |b| {
        b.iter(|| {
            let (mut r, feeder) = pipe_stream();
            let n = bare_drain(&mut r);
            feeder.join().ok();
            n
        });
    });
    g.bench_function("capture_drain_limit_1mib_from_pipe", |b| {
        b.iter(|| {
            let (mut r, feeder) = pipe_stream();
            let end = capture(&mut r, 1 << 20, CaptureMode::Drain).map(|e| e.captured.seen);
            feeder.join().ok();
            black_box(end)
        });
    });
    g.bench_function("capture_drain_limit_1mib_in_memory", |b| {
        b.iter(|| {
            let end = capture(&mut io::repeat(b'x').take(STREAM), 1 << 20, CaptureMode::Drain);
            black_box(end.map(|e| e.captured.seen))
        });
    });
    g.finish();
}

fn frame_bench(c: &mut Criterion) {
    let codec = FrameCodec::default();
    let payload = vec![0xA5u8; 1024];
    let mut g = c.benchmark_group("frames_1kib");
    g.throughput(Throughput::Elements(FRAMES as u64));
    g.bench_function("baseline_copy_in_and_out", |b| {
        let mut wire = Vec::with_capacity(FRAMES * 1028);
        b.iter(|| {
            wire.clear();
            for _ in 0..FRAMES {
                wire.extend_from_slice(&(payload.len() as u32).to_be_bytes());
                wire.extend_from_slice(&payload);
            }
            let mut out = 0usize;
            for chunk in wire.chunks(1028) {
                out += black_box(chunk[4..].to_vec()).len();
            }
            out
        });
    });
    g.bench_function("encode_then_read_frame", |b| {
        let mut wire = Vec::with_capacity(FRAMES * 1028);
        b.iter(|| {
            wire.clear();
            for _ in 0..FRAMES {
                codec.write_frame(&mut wire, &payload).ok();
            }
            let mut r = Cursor::new(&wire);
            let mut out = 0usize;
            while let Ok(Some(frame)) = codec.read_frame(&mut r) {
                out += black_box(frame).len();
            }
            out
        });
    });
    g.finish();
}

criterion_group!(benches, capture_bench, frame_bench);
criterion_main!(benches);
