//! Bounded framing, bounded output capture and strict message schemas: the bytes that cross
//! stockade's trust boundaries, and nothing else.
//!
//! # Position in the stack
//! Depends on: no workspace crate. Used by: `stockade-verify`, every tier crate,
//! `stockade-runtime`, `stockade-agent`.
//! API boundary: yes; users build [`Job`]s and read [`Report`]s (or the [`RunError`] every
//! tier returns when a run could not happen), tiers and brokers use the codecs.
//!
//! # Threat model
//! Trusted: the host program that calls this crate.
//! Attacker-controlled: every byte handed to a decoder (frame headers and payloads, JSON
//! documents, chat traffic from a model or an endpoint), and the length and pacing of every
//! stream handed to a capture.
//! Out of scope: what the decoded values mean (that is policy and verify), and the transport
//! itself (this crate never opens a file or a socket).
//!
//! # Guarantees
//! G1. A frame decoder checks the announced length against its maximum before it allocates,
//!     and its buffer grows only as bytes arrive, so one frame never costs more than
//!     `min(max, received + READ_CHUNK)` bytes.
//!     (pinned by: tests/it/frame.rs::g1_*)
//! G2. No decoder panics on arbitrary input: frames, untrusted JSON and every schema return a
//!     value or a typed error.
//!     (pinned by: tests/it/frame.rs::g2_*, tests/it/schema.rs::g2_*, tests/it/e2b.rs::g2_*)
//! G3. A capture holds at most `limit` bytes plus one [`CAPTURE_BUF_LEN`] buffer however long
//!     the stream; in drain mode it reads to the end of the stream, and in fail-fast mode it
//!     stops at the first byte over the limit and says so.
//!     (pinned by: tests/it/capture.rs::g3_*)
//! G4. Untrusted JSON over its byte cap or its depth cap is refused before serde parses it.
//!     (pinned by: tests/it/json.rs::g4_*)
//! G5. Every schema read from an untrusted sender rejects unknown keys and out-of-bound
//!     counts, sizes and strings (the Python guest's `door` frames are read as that
//!     guest's own host reads them, ignoring unknown keys, under the same JSON caps).
//!     (pinned by: tests/it/schema.rs::g5_*, tests/it/e2b.rs::g5_*, src/door.rs)
//! G6. The chat validator enforces roles, at most [`chat::MAX_MESSAGES`] messages,
//!     [`chat::MAX_TOOL_CALLS`] calls per message and [`chat::MAX_TOOLS`] tools, unique tool
//!     names matching `^[a-zA-Z0-9_-]{1,64}$`, 1..=128-character call ids, and only local
//!     `#...` targets for `$ref`, `$id` and `$dynamicRef` in every schema position (tools and
//!     `json_schema` answer formats). It accepts the Chat Completions surface real clients
//!     send (the `developer` role, text parts, every `tool_choice` form, streaming, sampling
//!     and answer-format fields, each bounded, no `model` and `tools: null` as llama.cpp's
//!     tests send, the local servers' `top_k`, `min_p`, `typical_p` and `repeat_penalty`,
//!     assistant `reasoning_content`/`reasoning` up to 256 KiB, a tool-level `strict`, any
//!     `$schema` string), drops the billing, storage and caching fields, `$schema` and the
//!     reasoning from the rebuilt request and moves a tool-level `strict` into its function;
//!     it refuses image, audio and file parts, audio output, provider-native and legacy
//!     function tools, and a tool message without a `tool_call_id` (a `name` alone cannot
//!     say which of two calls of one tool it answers).
//!     (pinned by: tests/it/chat.rs::g6_*)
//! G7. Encoding then decoding gives back the same value, for frames and every schema; a
//!     number parses to the correctly rounded `f64`, so its text, written back, parses to the
//!     same number; and no object key is special (serde_json's `raw_value` feature, which
//!     makes one so in every `Value`, is not enabled).
//!     (pinned by: tests/it/frame.rs::g7_*, tests/it/schema.rs::g7_*, tests/it/e2b.rs::g7_*)
//! G8. [`Limits`] has no unlimited value: every limit has a default and a ceiling, and a zero
//!     or over-ceiling value is refused, in code and on the wire.
//!     (pinned by: tests/it/schema.rs::g8_*)
//! G9. The completion decoder accepts what real servers vary in (null, empty or absent
//!     content, arguments as a string or an object, missing or repeated call ids,
//!     `finish_reason` disagreeing with `tool_calls`, unknown fields), and refuses, for that
//!     call alone, arguments that are not one JSON object within
//!     [`completion::MAX_ARGUMENT_BYTES`] and [`completion::MAX_ARGUMENT_DEPTH`] or that repeat
//!     a key; an empty `choices`, an `error` body or a truncated body is a typed error.
//!     Streamed completions assemble under the same rules (tool-call deltas by index, a
//!     missing index tolerated on a single call), with every line capped before it is
//!     buffered whole and a stream that ends early refused.
//!     (pinned by: tests/it/completion.rs::g9_*)
//! G10. [`check_dedicated`] is the one rule for which host directories a tier may grant: it
//!     refuses `/`, the system trees (logs, spools and caches among them) and everything under
//!     them, the shared directories and home directories themselves, a home's hidden
//!     directories (`~/.ssh`, `~/.cache`) and everything under them, the caller's own
//!     protected directories, every ancestor of these, and any path that is not absolute and
//!     resolved; a directory inside `/tmp` or a home directory passes. Every message is one line naming the path.
//!     (pinned by: tests/it/dedicated.rs::g10_*)
//! G11. [`is_protected`] is the one rule for which paths of a read-write workspace the guest
//!     may not create or change: every [`PROTECTED_PATHS`] entry and what is under it, and
//!     under `.git` everything but the closed [`GIT_WRITABLE`] list and lock files, so a new
//!     name git would follow (`.git/commondir`) is protected without being listed.
//!     (pinned by: tests/it/protected.rs::g11_*)
//! G12. [`turn::Reply::parse`], the host's reading of a confined agent's answer, accepts
//!     exactly `{"ok":bool,"text":string}` with the text at most [`turn::MAX_TURN_TEXT`]
//!     bytes, and [`turn::Turn::parse`] refuses unknown keys, a tool named twice or outside
//!     the grant-name rule, a tool whose parameters are not an object schema, and every count
//!     and size over its bound; a turn written by [`turn::Turn::to_bytes`] parses back equal.
//!     (pinned by: tests/it/turn.rs::g12_*)
//!
//! # Non-guarantees
//! This crate isolates nothing and decides nothing: a well-formed [`Job`] may still be
//! dangerous, and a well-formed [`Report`] proves nothing until `stockade-verify` says so.
//! Frames carry no authentication; whoever holds the pipe speaks.
//!
//! # Failure behaviour
//! Every decoder returns a typed error; a capture that hits an I/O error returns what it
//! captured so far inside the error. Nothing panics on input.
//!
//! # Unsafe
//! None: `#![forbid(unsafe_code)]`.
//!
//! # Ambient authority
//! None. The crate performs no filesystem, network, process, environment or clock access;
//! it works only on the readers, writers and buffers it is handed.
//!
//! # Feature flags
//! Default off, each a wire a layer above speaks: `openai` (the modules `chat`,
//! `completion` and a confined agent's `turn`), `e2b` (`e2b`), `session` (the session
//! owner's calls, `session`) and `door` (the wasm tier's Python door, `door`). A crate that takes only
//! frames, jobs and reports compiles none of them; a feature adds a wire and never changes
//! another.
//!
//! # Invariants
//! Stated as absences: performs no I/O of its own; never allocates more than a codec's
//! maximum per frame; holds no global state; knows no tier's mechanics, no policy and no proofs.

#![forbid(unsafe_code)]
// The header's guarantees link into each wire's module, which a build without that wire's
// feature leaves out: the links resolve in a build with every feature (docs.rs's, below).
#![cfg_attr(
    not(all(feature = "openai", feature = "e2b", feature = "session", feature = "door")),
    allow(rustdoc::broken_intra_doc_links, reason = "they resolve in a build with every wire")
)]

pub mod broker;
mod bytes_repr;
pub mod capture;
#[cfg(feature = "openai")]
pub mod chat;
#[cfg(feature = "openai")]
pub mod completion;
pub mod dedicated;
#[cfg(feature = "door")]
pub mod door;
#[cfg(feature = "e2b")]
pub mod e2b;
pub mod error;
pub mod frame;
pub mod job;
pub mod json;
pub mod limits;
pub mod report;
#[cfg(feature = "session")]
pub mod session;
#[cfg(feature = "openai")]
pub mod turn;

pub use broker::{BrokerFrame, GrantName, ReplyBody, ReplyCode, ReplyError};
pub use capture::{BoundedSink, CAPTURE_BUF_LEN, CaptureEnd, CaptureError, CaptureMode, Captured, Flow, LiveIo, Pace};
pub use dedicated::{NotDedicated, check_dedicated};
pub use error::RunError;
pub use frame::{DecodeError, EncodeError, FrameCodec, MAX_FRAME_LEN};
pub use job::{
    Access, Busy, EnvVar, GIT_WRITABLE, Job, JobError, JobKind, PINNED_DIRS, PROTECTED_PATHS, Workspace, git_writable,
    is_protected,
};
pub use json::{JsonError, JsonLimits, parse_untrusted};
pub use limits::{Limits, LimitsError};
pub use report::{
    Enforced, GrantCall, GrantOutcome, GrantsReport, MAX_GRANT_ARGS_LEN, MAX_GRANT_RECORDS, Mechanism, NetConnection,
    NetDecision, Report, Status, Stream,
};
