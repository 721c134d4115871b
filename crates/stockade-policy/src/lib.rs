//! MARK untrusted text before a model reads it, and ALLOW tool calls by plain-code rules.
//!
//! An agent reads text that outsiders wrote and calls tools that change the world. This
//! crate holds the two controls for that:
//!
//! - [`mark`]: every piece of outside text becomes a [`mark::Marked`] block with a per-call
//!   random nonce and total escaping, so no content can close the block or forge structure.
//!   **MARK is hygiene, not a boundary**: measured defences show that delimiting alone barely
//!   lowers attack success (AgentDojo: 47.7% → 41.7% on GPT-4o), and adaptive attacks beat
//!   static prompt defences most of the time.
//! - [`allow`]: [`allow::Policy::authorize`] decides every tool call in plain code, with no
//!   model in the way, denying by default. **ALLOW is the boundary**: deterministic control
//!   of tool calls is what brings attack success near zero (AgentDojo `tool_filter` 6.8%,
//!   Progent 41.2% → 2.2%). See `../shared/research/agent-policy.md`.
//!
//! # Policy documents
//!
//! ```toml
//! version = 1
//! default = "deny"                      # the only default there is
//! session = { max_calls = 100 }         # optional: calls per session (per_secs makes it a window)
//!
//! [[rule]]
//! id = "ravens-to-allies"
//! tool = "send_raven"                   # a tool name, or a prefix ending in `*`
//! effect = "allow"                      # allow | ask | deny; deny beats ask beats allow
//! args.to = { one_of = ["riverhold", "highcliff"], source = "trusted" }
//! args.body = { max_len = 2000 }
//! when = { session_read_untrusted = false }
//! limits = { max_calls = 5, per_secs = 60 }
//! examples.allow = [{ to = "riverhold", body = "hi" }]
//! examples.deny = [{ to = "eastwatch", body = "hi" }, { to = "riverhold", body = "hi", _source = { to = "tool:read_scroll" } }]
//! ```
//!
//! Argument predicates (all must hold; the key may be a dotted path into an object):
//! `const`, `one_of`, `minimum`/`maximum` (compared exactly: an integer is never rounded to a float, so
//! 2^53 + 1 is over a maximum of 2^53), `max_len`, `pattern` (anchored, linear-time),
//! `path_prefix` (checked lexically after normalisation), `url_hosts` (checked on the parsed
//! URL; `*.example.org` allows subdomains), `hosts` (a network host as a connection names
//! it: `example.org`, `*.example.org` for its subdomains only, an address or a CIDR block
//! matched against address literals; see [`allow::HostPattern`]) and `source` (`trusted`,
//! `user`, `config`).
//! `limits` may also name `max_bytes` (alone or beside `max_calls`) on a rule whose tools
//! are all metered ([`allow::ToolSpec::metered`]): a byte budget, both ways, over every call
//! the rule allows in a session, which the tool's caller counts and enforces (the network
//! grant's `net.connect`); on any other tool it does not load.
//! Examples run when the policy loads; `_source`, `_session` and `_tool` set provenance,
//! session facts and the tool. `policies/steward.toml` is a worked example.
//!
//! # Position in the stack
//! Depends on: no workspace crate. Used by: `stockade-runtime` (grants), `stockade-agent`.
//! API boundary: yes; users hold [`mark::Untrusted`], [`mark::Marked`], [`allow::Policy`],
//! [`allow::Gate`], [`allow::Decision`] and [`allow::Permit`].
//!
//! # Threat model
//! Trusted: the host program, the policy author, the tool registry.
//! Attacker-controlled: all text marked untrusted (tool output, documents, web pages), and
//! everything the model proposes: tool names, argument values and their shapes.
//! Out of scope: whether the model heeds the marks; what a permitted tool does once it runs
//! (that is the tiers' job); the host's own taint tracking when it assigns [`allow::Source`]s.
//!
//! # Guarantees
//! G1. A marked body contains no `<` or `>`, and every `&` in it starts one of our entities,
//!     whatever the untrusted text was; so no tag, closing delimiter or `<|…|>` template token
//!     can form inside it.
//!     (pinned by: tests/it/mark.rs::g1_*)
//! G2. Each block's delimiters carry a fresh 128-bit nonce from the OS RNG, which occurs in
//!     neither the body nor the provenance header.
//!     (pinned by: tests/it/mark.rs::g2_*)
//! G3. Marking loses nothing: unmarking gives back the NFC form of the text (for JSON, of every
//!     string field and key), in delimit and datamark mode.
//!     (pinned by: tests/it/mark.rs::g3_*)
//! G4. Invisible and direction-changing characters (Unicode tag characters, bidi controls,
//!     zero-width and other format characters, private-use characters) and the fullwidth and
//!     small forms of `<`, `>`, `&`, `[` appear only as visible `\u{…}` escapes, and
//!     bracket-style template tokens such as `[INST]` lose their `[`.
//!     (pinned by: tests/it/mark.rs::g4_*)
//! G5. `Untrusted<T>` has no `Display`, `Deref` or accessor for its text: the only way into a
//!     prompt is `mark` or `mark_json`.
//!     (pinned by: tests/it/mark.rs::g5_*, tests/ui/fail/untrusted_display.rs)
//! G6. `authorize` denies by default, and denies an unknown tool, an unknown argument, and a
//!     mistyped or missing argument before any rule is consulted.
//!     (pinned by: tests/it/allow.rs::g6_*)
//! G7. A matching deny rule beats a matching ask rule, which beats a matching allow rule, and
//!     every decision names the rule that decided it.
//!     (pinned by: tests/it/allow.rs::g7_*)
//! G8. Adding a deny rule never turns a denial into an allow, and removing an allow rule never
//!     turns a denial into an allow.
//!     (pinned by: tests/it/allow.rs::g8_*)
//! G9. Only `authorize` mints a `Permit`; it cannot be built, cloned or deserialized outside
//!     this crate, and it names one exact call.
//!     (pinned by: tests/it/allow.rs::g9_*, tests/ui/fail/forge_permit.rs, tests/ui/fail/clone_permit.rs)
//! G10. An approval binds to the SHA-256 of the tool and its canonical arguments, is used up
//!     when presented, and never overrides a denial.
//!     (pinned by: tests/it/allow.rs::g10_*)
//! G11. `path_prefix` is decided lexically after normalisation, so `..` tricks fail without
//!     touching the filesystem; `url_hosts` is decided on the parsed URL, never on the raw
//!     string, and only on a URL every reader reads alike: one with userinfo, a backslash, a
//!     control byte or space, an encoded or normalised host or an odd port matches nothing,
//!     and for every URL it allows, curl and Python read the same host (a differential test
//!     over a corpus of tricky spellings); `hosts` never matches a name against an address
//!     block, nor a `*.` entry against its bare domain; `pattern` is anchored.
//!     (pinned by: tests/it/allow.rs::g11_*, tests/it/url_differential.rs::g11_*)
//! G12. Loading a policy rejects unknown tools and arguments, mistyped values, invalid
//!     regexes and rules that can never match, naming the line and column, and runs every
//!     rule's examples; the shipped steward policy loads.
//!     (pinned by: tests/it/document.rs::g12_*)
//! G13. Call limits are decided from the caller-owned `Ledger`, whose memory is bounded per tool.
//!     (pinned by: tests/it/allow.rs::g13_*)
//! G14. [`allow::Gate`] is the one way from a call to a permit for the crates above: it
//!     records every allowed call in its ledger before the permit leaves it, records nothing
//!     else, and refuses an `ask` it has no one to put to ([`allow::Gate::decide_unattended`]),
//!     telling an argument error from a denial by kind, not by the caller reading rule names.
//!     (pinned by: tests/it/allow.rs::g14_*)
//!
//! # Non-guarantees
//! MARK does not make a model obey: it is hygiene, and must never be the only control before
//! a side effect. ALLOW decides on the values it is shown: `path_prefix` cannot see symlinks
//! (the tier's filesystem view must), and provenance is only as good as the host's tracking.
//!
//! # Failure behaviour
//! Fails closed: unknown or malformed calls are denied, invalid policies do not load, and
//! `mark` returns an error rather than an unmarked text. Never panics on attacker input.
//!
//! # Unsafe
//! None: `#![forbid(unsafe_code)]`.
//!
//! # Ambient authority
//! One: `mark` reads the OS random number generator (`getrandom(2)`) for nonces and
//! datamarks. No filesystem, network, process, environment or clock access: `authorize`
//! takes the time from its caller.
//!
//! # Feature flags
//! None.
//!
//! # Invariants
//! Stated as absences: `authorize` performs no I/O and keeps no state; no public constructor
//! of `Permit`; no depth of recursion on attacker input beyond the JSON value given.

#![forbid(unsafe_code)]

pub mod allow;
pub mod mark;
pub mod taint;
