//! stockade's servers: what a long-lived, multi-tenant owner of sandboxes serves.
//!
//! [`e2b`] is E2B's API over the runtime's sessions (`stockade serve --listen`): the
//! control plane, and each sandbox's envd (processes and the filesystem), so the official
//! E2B SDKs drive stockade unmodified. [`owner`] is the session owner behind `stockade
//! serve`'s unix socket, which `stockade session` drives. It sits above `stockade-runtime`
//! and beside `stockade-agent`, and holds no agent code.
//!
//! # Position in the stack
//! Above `stockade-runtime` (whose sessions are the sandboxes) and `stockade-protocol` (whose
//! `e2b` module holds the wire types and codecs), beside `stockade-agent`; the CLI's
//! `stockade serve` is on top. It owns hyper's server role (the agent owns the client's).
//!
//! # Threat model
//! Trusted: the host user who runs the server and writes its templates. Attacker-controlled:
//! every byte a client sends (it may hold the API key, one sandbox's token, or nothing), its
//! pace (a client may read slowly, never, or flood), and everything the code inside a
//! sandbox does. One tenant's fault must stay that tenant's: see [`e2b`]'s guarantees.
//!
//! # Guarantees
//! [`e2b`]'s, each pinned by the CLI's `g11_*` tests, which drive the real binary with the
//! official E2B SDK (PyPI `e2b`, pinned) and hostile raw clients; [`owner`]'s, pinned by
//! the CLI's `g10_*` session tests. Its own tests (`cargo test -p stockade-serve`) start
//! an in-process server on 127.0.0.1:0 over process sessions, with this crate alone: the API
//! key opens the control plane and nothing else does, and a sandbox's token opens that
//! sandbox alone (red with the key and token checks made to pass anything).
//!
//! # Non-guarantees
//! The sandboxes are the runtime's sessions: their isolation is the tiers' (see
//! `stockade-runtime` and `stockade-process`).
//!
//! # Failure behaviour
//! A client's bad request is one typed HTTP or Connect error and loses nothing; a sandbox
//! that misbehaves is that sandbox's outcome; a server that cannot enforce what a template
//! asks (a home's size without root) refuses the create, naming the mechanism.
//!
//! # Unsafe
//! None: `#![forbid(unsafe_code)]`.
//!
//! # Ambient authority
//! [`e2b::E2bServer::serve`] and [`owner::Owner::serve`] accept on the listeners they are
//! given; [`owner::bind_ambient`] and [`owner::private_dir_ambient`] make a socket and its
//! directory by path; a template's snapshot
//! directory and `serve.toml`'s files are read by path ([`e2b::E2bConfig::from_toml`],
//! [`e2b::Tls::from_pem`] take the texts).
//!
//! # Feature flags
//! `tls` (default): HTTPS off loopback (tokio-rustls with ring). Without it the server
//! refuses a certificate.
//!
//! # Invariants
//! Stated as absences: no agent code, no policy decision of its own (a sandbox's network is
//! the runtime's grant), no unbounded queue, no blocking call on an async worker.

#![forbid(unsafe_code)]

pub mod e2b;
pub mod owner;
