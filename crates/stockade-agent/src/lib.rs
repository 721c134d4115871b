//! An agent loop over any OpenAI-compatible chat-completions endpoint that MARKs every
//! untrusted output, ALLOWs every tool call in plain code before it runs, and isolates the
//! code the model writes in a tier.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use stockade_agent::{Agent, Endpoint, FnTool, ToolDef, ToolOutput, Trust};
//!
//! let endpoint = Endpoint::new("http://127.0.0.1:8080/v1", "smollm2")?;
//! let scroll = FnTool::new(
//!     ToolDef::new("read_scroll", "Reads a delivery.", serde_json::json!({
//!         "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]
//!     }), Trust::Untrusted),
//!     |args| ToolOutput::Text(format!("scroll {}", args["name"])),
//! );
//! let agent = Agent::builder(endpoint)
//!     .tool(Arc::new(scroll))
//!     .system_prompt("You are the steward of Fort Milonga.")
//!     .policy_toml("version = 1\ndefault = \"deny\"\n")?
//!     .build()?;
//! let answer = agent.run("Three deliveries reached the gate today.").await?;
//! println!("{}", answer.text);
//! # Ok(()) }
//! ```
//!
//! The loop is a sans-IO step machine ([`AgentRun`]: [`Step::CallModel`],
//! [`Step::CallTools`], [`Step::Done`]) driven by [`Agent::run`]; tests drive the machine
//! with no network. Every call the model proposes is decoded by
//! `stockade_protocol::completion`, given a fresh host id, checked, authorised by
//! [`stockade_policy::allow::Policy::authorize`] and only then dispatched with the
//! [`Permit`](stockade_policy::allow::Permit) that `authorize` minted. Each result (an
//! output, a denial, an error) goes back to the model as that call's result.
//!
//! # Position in the stack
//! Depends on: `stockade-protocol`, `stockade-policy`, `stockade-runtime`
//! (tiers by feature). Used by: `stockade-cli` (`stockade agent`).
//! API boundary: yes; users hold [`Agent`], [`Endpoint`], [`Tool`], [`Answer`] and [`AgentError`].
//! It owns the HTTP client (hyper 1 with hyper-util's client); no other crate may.
//!
//! # Threat model
//! Trusted: the host program, the user's prompt, the configuration and policy, the tools'
//! own code (a command tool is the user's program), the tiers.
//! Attacker-controlled: everything the model sends (text, tool names, arguments, ids,
//! counts, sizes, timing), because prompt injection reaches the model through untrusted tool
//! outputs; everything an untrusted tool returns; the endpoint's bytes and status codes.
//! Out of scope: the model's own text (it is shown, not acted on); what a permitted tool does
//! with its permitted arguments; whether the model heeds the marks.
//!
//! # Guarantees
//! G1. No tool runs without the `Permit` that `Policy::authorize` minted for exactly that
//!     call: `Tool::call` takes the permit by value and reads its arguments only from it, and
//!     the loop dispatches a permit to the tool its own call names.
//!     (pinned by: tests/ui/fail/call_without_permit.rs, tests/ui/fail/retarget_permit.rs, tests/it/loop_.rs::g1_*)
//! G2. Every output of an untrusted tool enters the history marked with its provenance (JSON
//!     field by field; error excerpts and run_code's output and refusals included), and the
//!     system prompt carries MARK's sentence.
//!     (pinned by: tests/it/loop_.rs::g2_*)
//! G3. A per-call failure (an unknown tool, including names that differ by case or a Unicode
//!     lookalike; arguments that are not one bounded JSON object; a schema violation; a policy
//!     denial; an approval not given; a tool error or timeout; a call cut by the token limit)
//!     goes back to the model as that call's result, with nothing run, and the run goes on.
//!     (pinned by: tests/it/hostile.rs::g3_*)
//! G4. Once untrusted output was read, an argument value equal to an earlier untrusted output,
//!     or a substring of one of at least 8 characters, carries `Source::Tool(name)`, so rules
//!     with `source = "trusted"` do not allow it; the session's read-untrusted flag is set by
//!     the first untrusted output.
//!     (pinned by: tests/it/hostile.rs::g4_*)
//! G5. Only infrastructure failures and spent budgets end a run, with a typed [`AgentError`]:
//!     `max_turns` ("no answer after N turns"), tool calls, tokens, the run's wall time, the
//!     conversation's length, the same call denied [`MAX_REPEATED_DENIALS`] times in a row; at
//!     most [`MAX_CALLS_PER_TURN`] calls of one turn run, with bounded parallelism, and
//!     results are appended in the model's order.
//!     (pinned by: tests/it/loop_.rs::g5_*, tests/it/hostile.rs::g5_*)
//! G6. The endpoint client caps the response body before parsing it, bounds connect, request
//!     and run time, follows no redirect, takes no proxy from the environment, retries with
//!     jittered backoff on connection errors and 5xx (429 only with a `Retry-After` inside
//!     the deadline), and validates every request with protocol's chat validator first; a
//!     streamed answer is never retried once it began, and ends at an idle timeout separate
//!     from the deadline.
//!     (pinned by: tests/it/endpoint.rs::g6_*)
//! G7. The API key is read from the environment variable the user names and sent only as the
//!     `Authorization` header of requests to the configured origin, over https only after the
//!     server's certificate verified; it is never in `Debug`, an error or the trace.
//!     (pinned by: tests/it/endpoint.rs::g7_*)
//! G8. An `ask` decision with no approver is a denial that says approval was needed; an
//!     approval is single-use and bound to the exact call (tool and canonical arguments).
//!     (pinned by: tests/it/loop_.rs::g8_*)
//! G9. `run_code` runs the model's code in a tier through `Sandbox::run` with a contract
//!     (deadline, output budget); a refusal (timeout, output too large, out of memory,
//!     non-zero exit with a bounded stderr excerpt) is the tool's result, never a loop error.
//!     (pinned by: tests/it/run_code.rs::g9_*)
//! G10. [`ModelProxy`], a run's model grant, answers only the run's placeholder key; every
//!     request passes protocol's strict chat validator (no image, audio or file URLs, no
//!     provider-native tools, no non-local `$ref`, bounded size and depth) and names the
//!     configured model or none; it is rebuilt from the validated fields and sent to the one
//!     configured upstream with the real key added last; the answer is rebuilt from the
//!     decoded completion with the real key scrubbed (a streamed answer is relayed as
//!     server-sent events while it arrives, held back by at most the key's length so a key
//!     split across pieces is scrubbed too); a run's tokens are bounded.
//!     (pinned by: tests/it/proxy.rs::g10_*)
//! G11. A confined agent ([`ConfinedAgent`]) runs the whole loop inside a tier. Inside,
//!     [`serve_turn`] reaches each tool only as a call to its grant through the run's
//!     broker (an MCP tool `desk.file_ticket` offered to the model as `desk__file_ticket`),
//!     marks an untrusted tool's answer, takes a broker's refusal as the call's result, and
//!     ends every turn in one [`Reply`](stockade_protocol::turn::Reply), never a crash. On
//!     the host, the model is the run's model grant ([`ModelProxy`], the key never inside),
//!     every tool is a function grant decided by the host's policy, the loop's program is a
//!     copy in the run (with [`ConfinedBuilder::image`], an image job in the docker tier,
//!     with the loader and libraries it links: `Grants::program_linked`), the reply passes `stockade_verify` and
//!     `stockade_protocol::turn::Reply::parse`, and the trace is written from the broker's
//!     own record as it happens (the grants' observer), outside every mount; the host
//!     judges each call's arguments by relayed provenance (the runtime's G16) and owns the
//!     budgets. [`ConfinedAgent::run_until`] and [`Agent::run_until`] stop a run from
//!     outside, cancelling and closing in the trace every call it cut short.
//!     (pinned by: tests/it/confine.rs::g11_*)
//!     End to end, with a real tier and a hostile loop, `stockade agent --confine`'s G13.
//! G12. A [`Channel`] keeps one conversation's history (at most
//!     [`MAX_HISTORY`](stockade_protocol::turn::MAX_HISTORY) entries, the oldest dropped
//!     first; written whole to a new file, mode 0600, renamed over the old) and one
//!     workspace under `ROOT/channels/NAME`; its name cannot leave or hide in `channels/`,
//!     and the path rule is checked in code on every open and write: the workspace a real
//!     directory, the state file, resolved, never under the workspace, resolved, and never
//!     read through a symlink. A reset removes the history and the workspace's contents.
//!     [`Channel::share_workspace`] gives the workspace directory (never a symlink) to a
//!     container's user only while the channel's own directory is its owner's alone.
//!     (pinned by: tests/it/confine.rs::g12_*)
//!
//! # Non-guarantees
//! The model's own text is not checked: an answer can be wrong or injected. MARK is hygiene,
//! not a boundary; ALLOW is the boundary. The provenance heuristic (G4) sees only verbatim
//! copies: a value the model paraphrased, re-encoded, translated or assembled from pieces
//! shorter than 8 characters is not traced, and a user-typed value that also appears in an
//! untrusted output is treated as untrusted. A command tool runs unconfined with the user's
//! privileges (its environment is cleared but for `PATH` and the variables the config names)
//! unless its config confines it; its timeout kills the process it started, not that
//! process's own children. A confined agent's loop can ask for anything its grants name, as
//! often as the broker's bounds allow, and its answer is its own words; every argument it
//! sends carries the source `sandbox`, so a rule with `source = "trusted"` never matches a
//! confined call (the host cannot check the loop's account of where a value came from), and
//! a rule that asks is put to the host's approver ([`ConfinedBuilder::approver`]; without
//! one, it is a denial). Its trace records each call's tool, decision and rule,
//! and a function call's canonical arguments cut at 512 bytes (the broker's record).
//!
//! # Failure behaviour
//! Fails closed: an unknown tool, an unparseable argument or any policy error runs nothing.
//! Never panics on model, endpoint or tool output.
//!
//! # Unsafe
//! None: `#![forbid(unsafe_code)]`.
//!
//! # Ambient authority
//! [`Endpoint`] opens TCP connections to the one configured origin. [`ApiKey::from_env_ambient`]
//! reads one environment variable. [`CommandTool`] starts the configured program.
//! [`Trace::create_ambient`] creates the trace file. [`AgentConfig::load_ambient`] reads the
//! config and policy files; [`config::McpGrantConfig::command_ambient`] reads the variables a
//! `[[grant.mcp]]` server is given. `run_code` runs in the sandboxes it is given. [`ModelProxy`]
//! serves the connections the runtime hands it and sends requests through its [`Endpoint`].
//! [`ConfinedAgent`] copies its loop's program into each run; [`Channel`] creates, reads and
//! writes its directory under the root it is given; [`serve_turn_ambient`] reads
//! `OPENAI_BASE_URL`, `OPENAI_API_KEY` and `STOCKADE_BROKER` and connects to them.
//!
//! # Feature flags
//! `process` (default): `run_code` for python and sh in the process tier. `tls` (default):
//! https endpoints (rustls with ring; the OS trust store plus `Endpoint::with_root_pem`).
//! `wasm`: `run_code` for javascript in the wasm tier. `docker`: `run_code` in a container.
//! Each adds a tier or a transport and never changes a default.
//!
//! # Invariants
//! Stated as absences: no constructor of `Permit` or `Verified`; no tool call without a
//! decision; no raw untrusted output in the history; no retry once a response was used; no
//! HTTP client outside this crate, and no HTTP server but the model proxy (hyper's owners
//! are this crate and `stockade-serve`, which holds E2B's API, STYLE §2.5).

#![forbid(unsafe_code)]

mod agent;
mod channel;
mod command;
pub mod config;
mod confine;
mod endpoint;
mod machine;
mod proxy;
mod run_code;
mod secret;
mod tool;
mod trace;

pub use agent::{Agent, AgentBuilder, ApprovalRequest, Approver, BuildError, NoApprover, TextSink};
pub use channel::{Channel, ChannelError};
pub use command::{CommandTool, MAX_STDERR_EXCERPT};
pub use config::AgentConfig;
pub use confine::{ConfinedAgent, ConfinedBuilder, LOOP_PROGRAM, serve_turn, serve_turn_ambient};
pub use endpoint::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_REQUEST_TIMEOUT, DEFAULT_RETRIES,
    DEFAULT_STREAM_IDLE_TIMEOUT, Endpoint, EndpointError, Exchange,
};
pub use machine::{
    Action, AgentError, AgentRun, Answer, Dispatch, MAX_CALLS_PER_TURN, MAX_REPEATED_DENIALS, MAX_TAINT_BYTES,
    MIN_TAINT_CHARS, Profile, RunLimits, Step, ToolContent,
};
pub use proxy::{DEFAULT_RUN_TOKENS, MAX_PROXY_BODY, ModelProxy};
pub use run_code::{Language, MAX_CODE_BYTES, RunCode, Runner};
pub use secret::{ApiKey, KeyError};
pub use tool::{FnTool, Tool, ToolBox, ToolDef, ToolOutput, Trust, tool_grant};
pub use trace::{Observer, Trace};

pub use stockade_policy as policy;
pub use stockade_protocol as protocol;
pub use stockade_runtime as runtime;
