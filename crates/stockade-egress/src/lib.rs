//! Policed network egress: a forward proxy, served on a run's own loopback, through which a
//! sandbox reaches the network one decided connection at a time.
//!
//! A sandbox has no route out. A network grant gives it one door: a listener on the run's
//! loopback (the process tier's, or the docker tier's holder namespace) that speaks the
//! three proxy protocols clients honour from the environment (`HTTP_PROXY`, `HTTPS_PROXY`,
//! `ALL_PROXY`, see [`proxy_env`]):
//!
//! - `CONNECT host:port` (HTTPS and any TLS): decided on the name, then the guest's TLS
//!   ClientHello is read and its SNI must be that name, before anything reaches upstream;
//! - HTTP in absolute form (`GET http://host/path`): one request per connection, decided
//!   with its method and path, its `Host` equal to the target, its framing unambiguous; an
//!   `https://` URL in absolute form (busybox wget asks so) the same, with the proxy as the
//!   TLS client, verifying the upstream against the host's roots;
//! - SOCKS5 with a name (`socks5h://`): decided like CONNECT.
//!
//! A guest without sockets (the wasm tier's JavaScript `fetch`) gets [`Egress::fetch`]: the
//! host makes the request as a client of the same proxy, over an in-memory stream, so it is
//! decided, checked, bounded and recorded by the same code.
//!
//! Every connection is a `net.connect` call to a [`stockade_policy`] policy ([`NetPolicy`]):
//! the same engine, rules, limits and load-time examples as every tool call. `--allow-net`
//! entries ([`NetRule`]) are a policy written for the user. Names are resolved on the host,
//! after the decision, and the proxy connects to exactly the address it checked.
//!
//! # Position in the stack
//! Depends on: `stockade-policy`, `stockade-protocol`, and for [`NetSecret`] rustls (ring),
//! rcgen (the per-run CA) and rustls-native-certs (the host's roots). Used by: `stockade-runtime` (the
//! network grant). Beside the tiers: it isolates nothing; it decides and carries what a
//! tier's guest may send out of the one door the tier leaves.
//! API boundary: yes; [`NetPolicy`], [`NetRule`], [`Resolve`], [`NetLimits`], [`NetScope`],
//! [`NetGrant`] and the per-run [`Egress`] it starts.
//!
//! # Threat model
//! Trusted: the host program, the policy and its author, the host's resolver (for names the
//! policy allowed) and the upstreams the policy names.
//! Attacker-controlled: every byte the guest sends to the proxy: request heads, names,
//! ports, TLS ClientHellos, SOCKS frames, bodies, and their timing and number.
//! Out of scope: what an allowed upstream does with what it is sent (exfiltration to an
//! allowed host is the grant's own residual); timing channels.
//!
//! # Guarantees
//! G1. No connection to a host the policy did not allow: every CONNECT, SOCKS5 request and
//!     plain HTTP request is decided before any upstream is resolved or reached; a plain
//!     request's `Host` must equal its target, and each connection carries one request
//!     (the proxy answers `Connection: close`), so no request rides on another's decision.
//!     What is decided is what is sent: a path is decoded and normalised before the
//!     decision (percent-encoded unreserved characters, dot segments), the normal form goes
//!     upstream, and what servers read in more than one way (an encoded `/`, `\` or NUL, a
//!     raw `\`, `..;`) is refused. A differential test puts a corpus of tricky paths through
//!     curl (as written and as it normalises) and Python's `http.client` to Python's own
//!     `http.server` behind a `/pub`-only rule: every file the server resolves lies under
//!     `pub/`, and a canary outside it reaches no client.
//!     (pinned by: tests/it/proxy.rs::g1_*, tests/it/path_differential.rs::g1_*, src/http.rs,
//!     src/fuzzing.rs)
//! G2. No DNS from the sandbox: names are resolved here, only for allowed connections (the
//!     sandbox has no resolver of its own; its tier gives it no route).
//!     (pinned by: tests/it/proxy.rs::g2_*)
//! G3. No way back in: a name that resolves to a loopback, private, link-local, CGNAT,
//!     multicast, unspecified, documentation, ULA or IPv4-mapped address is refused
//!     ([`reachable`]), unless the grant names that address literally or [`Resolve`] points
//!     the name there (curl's `--resolve`); the proxy connects to the address it checked.
//!     An address literal the guest names is held to the same check unless the rule that
//!     allowed it names that address ([`NetPolicy::names_literally`]): a rule for any host
//!     on a port, or for hosts by pattern, does not open the host's loopback or LAN. An IPv4
//!     address carried in IPv6 (mapped, `::ffff:a.b.c.d`, or compatible, `::a.b.c.d`) is
//!     that IPv4 address to every rule and check, so an IPv6 rule names no IPv4 host.
//!     (pinned by: tests/it/proxy.rs::g3_*, src/addr.rs)
//! G4. What goes inside a tunnel to a name is TLS for that name: the ClientHello's SNI must
//!     equal the decided host, and a tunnel to a name without SNI is refused, before the
//!     upstream is connected. Past the ClientHello the record layer is followed both ways
//!     until each side's first application data: nothing more of the guest's goes upstream
//!     until the upstream has answered with a ServerHello, and a byte that is not a TLS
//!     record either way ends the tunnel (`not-tls`), so a non-TLS service allowed by name
//!     receives a ClientHello and nothing else.
//!     (pinned by: tests/it/proxy.rs::g4_*, src/tls.rs)
//! G5. Request smuggling is refused: a head over [`NetLimits`]' size, both `Content-Length`
//!     and `Transfer-Encoding`, a `Transfer-Encoding` other than `chunked`, differing
//!     `Content-Length`s, or an upgrade; a body is forwarded by its own framing, no byte
//!     past it. A chunked body is parsed strictly and forwarded in its canonical form:
//!     lines end in CRLF only, a chunk size is 1 to 16 hex digits (sent as `{size:x}`,
//!     extensions dropped), sizes are checked arithmetic, and trailer fields are checked,
//!     bounded by the head limit, counted and re-serialised (framing, routing and
//!     authentication fields refused). The fuzz target `proxy_request` checks every input
//!     against a strict reader of its own: what is forwarded is one request with the decided
//!     method, `Host` and canonical path, a canonical body, and nothing after it.
//!     (pinned by: tests/it/proxy.rs::g5_*, src/http.rs, src/fuzzing.rs)
//! G6. Bounded per run: connections in all and at once, bytes each way (trailers included),
//!     idle time per read and one total time per connection, from its accept, over every
//!     phase (heads, ClientHello, bodies, relay), head sizes, and per rule: a policy rule's `limits.max_calls` counts
//!     its connections and `limits.max_bytes` its bytes (both ways, all its connections);
//!     a guest past a bound is cut off and the cut recorded. Every byte that goes up is
//!     counted, each chunk's own CRLF included. A body is reserved before it is announced:
//!     a chunk, or a `Content-Length` body, that does not fit in what the run and the rule
//!     may still send is refused before its size goes upstream (a sized request gets 413).
//!     (pinned by: tests/it/proxy.rs::g6_*, src/fuzzing.rs)
//! G7. Every connection is on the record ([`Egress::record_into`]): host, port, scheme,
//!     the address used, the decision and its rule, bytes each way, duration, and why the
//!     proxy cut it.
//!     (pinned by: tests/it/proxy.rs::g7_*)
//! G8. A credential for one host never enters the sandbox ([`NetSecret`],
//!     [`NetGrant::secrets`]): the guest holds a per-run placeholder; for that host only,
//!     the proxy ends the guest's TLS with a certificate from a per-run CA (generated per
//!     run, name-constrained to the secret hosts, its key never leaving this process),
//!     replaces the placeholder in the one named header of each request, and sends it on
//!     over TLS verified against the host's roots; an upstream that does not verify gets
//!     nothing past a ClientHello, and a placeholder sent anywhere else stays one (end to
//!     end with curl and Python in stockade-cli's `g9_a_net_secret_*`). The value never
//!     comes back in: a secret host takes only GET, HEAD, POST, PUT, PATCH and DELETE (no
//!     TRACE, no CONNECT), is asked for `Accept-Encoding: identity`, and every response head
//!     and body relayed from it has the value masked as it streams (a compressed response
//!     is refused, since it could not be scrubbed); `fetch` takes the same path. A header
//!     secret ([`NetSecret::set_header`], E2B's `network.rules` transforms) gives the guest
//!     nothing: the proxy sets its header on every request to its host, dropping whatever
//!     the guest sent under that name, and masks its value the same way; a secret cannot
//!     set a header the request is decided or framed by.
//!     (pinned by: tests/it/proxy.rs::g8_*, src/secret.rs, src/http.rs, and stockade-cli's
//!     `g9_a_secret_host_is_a_closed_door_*` and `g11_e2b_network_rules_*`)
//! G9. [`Egress::fetch`] has no path to the network of its own: it is a client of the same
//!     proxy, so a fetch is decided, checked and recorded as a connection is, and a refusal
//!     is the proxy's own reply (`Proxy-Status: stockade`), never an upstream's.
//!     (pinned by: tests/it/proxy.rs::g9_*)
//! G10. A scope only narrows ([`NetScope`], [`NetGrant::scope`]): a connection the policy
//!     allowed goes on only if its name matches an allow entry, or neither its name nor any
//!     address it is connected at matches a deny entry (allow wins, as E2B's `allowOut`
//!     over `denyOut`); the addresses checked are the ones connected to. Its holder may
//!     replace the lists at any time, and each connection decided after sees the new ones.
//!     (pinned by: tests/it/proxy.rs::g10_*, src/scope.rs)
//!
//! # Non-guarantees
//! Domain fronting past the SNI (an HTTP `Host` inside the tunnel that differs) and
//! Encrypted ClientHello's outer name are not seen: the decision is on the name the tunnel
//! was opened for. Exfiltration to an allowed host is allowed. A client that ignores the
//! proxy variables reaches nothing (its tier gives it no route), rather than the network.
//!
//! # Failure behaviour
//! A bad request gets an HTTP or SOCKS error reply and one record; nothing the guest sends
//! panics the proxy or affects another connection or run.
//!
//! # Unsafe
//! None: `#![forbid(unsafe_code)]`.
//!
//! # Ambient authority
//! Resolves names with the host's resolver and opens TCP connections to the addresses it
//! allowed; with secrets, reads the host's TLS roots (`SSL_CERT_FILE`, `SSL_CERT_DIR` and
//! the system store, as rustls-native-certs does) and the OS's randomness; nothing else.
//!
//! # Feature flags
//! `fuzzing` (off): the hidden `fuzzing` module, the proxy's readers driven in memory with
//! the properties each keeps, for `fuzz/fuzz_targets/{proxy_request,proxy_relay,
//! fetch_response}.rs`. It adds no dependency and no behaviour.
//!
//! # Invariants
//! Stated as absences: resolves no name and opens no upstream before the policy allowed the
//! connection; never connects to an address it did not check; holds no state beyond one
//! run's [`Egress`]; writes no file; never writes a secret's value anywhere but into the
//! named header of a request to its own host, inside TLS.

#![forbid(unsafe_code)]

mod addr;
mod fetch;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod http;
mod policy;
mod proxy;
mod scope;
mod secret;
mod socks;
mod tls;

pub use addr::reachable;
pub use fetch::{FetchError, MAX_FETCH_BODY, MAX_FETCH_RESPONSE};
pub use policy::{NET_TOOL, NetPolicy, NetPolicyError, NetRule, Resolve};
pub use proxy::{Egress, Kind, NetGrant, NetLimits, OnRefused, Prefixed, classify, denied_line, proxy_env};
pub use scope::{NetScope, ScopeRules};
pub use secret::{CA_ENV, NetSecret, SECRET_ENV_PREFIX};
