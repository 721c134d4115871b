//! Frames: G1 (bounded allocation), G2 (no panic), G7 (round trip).

use std::io::Cursor;

use proptest::prelude::*;
use stockade_protocol::frame::{DecodeError, EncodeError, FrameCodec, HEADER_LEN, READ_CHUNK};

use crate::alloc_count::peak_during;

/// Slack for the decoder's own small allocations (none today, but error values may box).
const SLACK: usize = 512;

fn header(len: u32) -> Vec<u8> {
    len.to_be_bytes().to_vec()
}

#[test]
fn g1_oversized_length_is_refused_before_allocating() {
    let codec = FrameCodec::new(1 << 20);
    let mut input = Cursor::new(header(u32::MAX));
    let (result, peak) = peak_during(|| codec.read_frame(&mut input));
    match result {
        Err(DecodeError::TooLarge { len, max, .. }) => {
            assert_eq!((len, max), (u32::MAX, 1 << 20));
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert!(peak <= SLACK, "refusal allocated {peak} bytes");
}

#[test]
fn g1_lying_length_costs_at_most_one_chunk() {
    let codec = FrameCodec::new(u32::MAX);
    let mut bytes = header(u32::MAX - 1);
    bytes.extend_from_slice(b"only ten b");
    let mut input = Cursor::new(bytes);
    let (result, peak) = peak_during(|| codec.read_frame(&mut input));
    match result {
        Err(DecodeError::Truncated { expected, got, .. }) => {
            assert_eq!((expected, got), ((u32::MAX - 1) as usize, 10));
        }
        other => panic!("expected Truncated, got {other:?}"),
    }
    assert!(peak <= READ_CHUNK + SLACK, "a 10-byte body cost {peak} bytes");
}

#[test]
fn g1_payload_allocation_is_exact_for_an_honest_frame() {
    let codec = FrameCodec::new(1 << 20);
    let payload = vec![7u8; 300_000];
    let mut buf = Vec::new();
    codec.write_frame(&mut buf, &payload).unwrap();
    let mut input = Cursor::new(buf);
    let (frame, peak) = peak_during(|| codec.read_frame(&mut input).unwrap().unwrap());
    assert_eq!(frame, payload);
    assert!(peak <= payload.len() + SLACK, "300 kB frame cost {peak} bytes");
}

#[test]
fn g1_decode_slice_refuses_as_soon_as_the_header_is_complete() {
    let codec = FrameCodec::new(16);
    assert!(matches!(codec.decode_slice(&header(17)), Err(DecodeError::TooLarge { len: 17, max: 16, .. })));
    assert!(matches!(codec.decode_slice(&header(16)[..3]), Ok(None)));
    assert!(matches!(codec.decode_slice(&header(16)), Ok(None)));
}

#[test]
fn truncated_header_and_clean_end_are_told_apart() {
    let codec = FrameCodec::default();
    assert!(matches!(codec.read_frame(&mut Cursor::new(Vec::new())), Ok(None)));
    assert!(matches!(
        codec.read_frame(&mut Cursor::new(vec![0, 0])),
        Err(DecodeError::Truncated { expected: HEADER_LEN, got: 2, .. })
    ));
}

#[test]
fn oversized_payload_is_not_written() {
    let codec = FrameCodec::new(4);
    let mut out = Vec::new();
    assert!(matches!(codec.write_frame(&mut out, b"12345"), Err(EncodeError::TooLarge { len: 5, max: 4, .. })));
    assert!(matches!(codec.encode_into(b"12345", &mut out), Err(EncodeError::TooLarge { .. })));
    assert!(out.is_empty(), "a refused frame wrote {} bytes", out.len());
}

#[test]
fn g1_async_decoder_refuses_and_bounds_like_the_sync_one() {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async {
        let codec = FrameCodec::new(1024);
        let mut input: &[u8] = &header(1025);
        assert!(matches!(
            codec.read_frame_async(&mut input).await,
            Err(DecodeError::TooLarge { len: 1025, max: 1024, .. })
        ));
        let mut bytes = header(1000);
        bytes.extend_from_slice(&[1; 10]);
        let mut input: &[u8] = &bytes;
        assert!(matches!(
            codec.read_frame_async(&mut input).await,
            Err(DecodeError::Truncated { expected: 1000, got: 10, .. })
        ));
    });
}

proptest! {
    #[test]
    fn g1_decoder_never_allocates_past_its_bound(input in proptest::collection::vec(any::<u8>(), 0..4096), max in 0u32..2048) {
        let codec = FrameCodec::new(max);
        let mut cursor = Cursor::new(input);
        let (_, peak) = peak_during(|| {
            while let Ok(Some(_)) = codec.read_frame(&mut cursor) {}
        });
        prop_assert!(peak <= max as usize + SLACK, "peak {} for max {}", peak, max);
    }

    #[test]
    fn g2_arbitrary_bytes_never_panic(input in proptest::collection::vec(any::<u8>(), 0..1024)) {
        let codec = FrameCodec::new(64);
        let mut cursor = Cursor::new(input.clone());
        while let Ok(Some(_)) = codec.read_frame(&mut cursor) {}
        let mut rest = &input[..];
        while let Ok(Some((_, used))) = codec.decode_slice(rest) {
            rest = &rest[used..];
        }
    }

    #[test]
    fn g7_frames_round_trip(payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..8)) {
        let codec = FrameCodec::new(300);
        let mut wire = Vec::new();
        for p in &payloads {
            codec.write_frame(&mut wire, p).unwrap();
        }
        let mut sliced = Vec::new();
        for p in &payloads {
            codec.encode_into(p, &mut sliced).unwrap();
        }
        prop_assert_eq!(&wire, &sliced);

        let mut cursor = Cursor::new(wire.clone());
        let mut back = Vec::new();
        while let Some(frame) = codec.read_frame(&mut cursor).unwrap() {
            back.push(frame);
        }
        prop_assert_eq!(&back, &payloads);

        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let back_async = rt.block_on(async {
            let mut input: &[u8] = &wire;
            let mut out = Vec::new();
            while let Some(frame) = codec.read_frame_async(&mut input).await.unwrap() {
                out.push(frame);
            }
            out
        });
        prop_assert_eq!(&back_async, &payloads);
    }
}

#[tokio::test]
async fn read_line_reads_lines_under_the_bound_and_drops_a_longer_one_whole() {
    use stockade_protocol::frame::{Line, read_line};
    let data: &[u8] = b"{\"a\":1}\n\nxxxxxxxxxxxxxxxxxxxx\nafter\nlast";
    let mut r = tokio::io::BufReader::with_capacity(4, data);
    assert_eq!(read_line(&mut r, 16).await.unwrap(), Line::Text(b"{\"a\":1}".to_vec()));
    assert_eq!(read_line(&mut r, 16).await.unwrap(), Line::Text(Vec::new()));
    assert_eq!(read_line(&mut r, 16).await.unwrap(), Line::TooLong(20));
    assert_eq!(read_line(&mut r, 16).await.unwrap(), Line::Text(b"after".to_vec()));
    assert_eq!(read_line(&mut r, 16).await.unwrap(), Line::Text(b"last".to_vec()));
    assert_eq!(read_line(&mut r, 16).await.unwrap(), Line::Eof);
}
