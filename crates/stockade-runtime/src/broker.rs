//! The broker: one session per run, serving the run's grants over the broker wire protocol
//! (`stockade_protocol::broker`), on a unix socket in a per-run directory (process and
//! docker tiers) or through in-process calls (the wasm tier's `host.call`).
//!
//! Order of operations for each call: bound the frame (before allocating), parse it
//! strictly, count it, resolve the grant, check the arguments against its schema and ask
//! the policy (the arguments' source is `sandbox`), run the function under the per-call
//! deadline and the concurrency bound, cap the reply, record the call, answer.

use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;
use stockade_policy::allow::{
    Approval, Decision, Gate, Permit, Policy, RefusalKind, Refused, Registry, Source, ToolCall,
};
use stockade_protocol::broker::{BrokerFrame, GRANTS_SOCKET, LIST_GRANT, ReplyBody, ReplyCode, ReplyError};
use stockade_protocol::{DecodeError, FrameCodec, GrantCall, GrantOutcome, GrantsReport};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::grants::{CallEvent, Grants, ModelRun};

/// The guest client, built by the build script (empty where no static C toolchain exists).
const CLIENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/stockade-call"));

/// The uid and gid the process tier and the docker tier give a guest when stockade runs as
/// root (a root owner's process session gives its guest one of its own instead); the
/// grants directory is shared with that group only.
pub(crate) const NOBODY: u32 = 65534;

/// A session ended for good: the reason, for the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ended(pub(crate) String);

struct State {
    /// The grants policy and this run's ledger: every function call passes through it.
    gate: Gate,
    report: GrantsReport,
    calls: u64,
    // Function calls decided so far (the bound `max_function_calls`).
    functions: u64,
    /// Allowed calls not yet ended, by a number of the run's own: closed as `cancelled`
    /// if the run ends under them.
    open: std::collections::BTreeMap<u64, Open>,
    next_open: u64,
    /// Relayed provenance, when the grants ask for it.
    witness: Option<crate::relayed::Witness>,
}

/// An allowed call that is running.
struct Open {
    grant: String,
    rule: String,
    args: String,
    start: Instant,
}

/// What [`Session::dispatch`] learnt of a function call for its record: its canonical
/// arguments, and its number among the open calls once it was allowed.
#[derive(Default)]
struct Seen {
    args: Option<String>,
    open: Option<u64>,
}

/// One run's broker session. Shared by every connection (and every `host.call`) of the run.
pub(crate) struct Session {
    grants: Arc<Grants>,
    start: Instant,
    state: Mutex<State>,
    slots: Semaphore,
    closed: AtomicBool,
    ended: watch::Sender<Option<String>>,
    /// The model grant's placeholder and token count (set by the broker), from which a call
    /// to [`crate::MODEL_GRANT`] builds its [`ModelRun`].
    model: std::sync::OnceLock<(Arc<str>, Arc<std::sync::atomic::AtomicU64>, Arc<std::sync::atomic::AtomicU64>)>,
    /// The run's network proxy, through which a call to [`crate::FETCH_GRANT`] goes.
    egress: std::sync::OnceLock<crate::net::Egress>,
    /// Held while the grants' approver is asked: one question at a time.
    asking: tokio::sync::Mutex<()>,
}

fn reply(id: u64, body: ReplyBody) -> Vec<u8> {
    BrokerFrame::Reply { id, body }.to_bytes()
}

fn error(code: ReplyCode, message: impl Into<String>) -> ReplyBody {
    ReplyBody::Error(ReplyError::new(code, message))
}

/// The run's gate: as having read untrusted data from the start if the grants say an
/// earlier turn did ([`Grants::already_read_untrusted`]).
fn gate_for(grants: &Grants, policy: Arc<Policy>) -> Gate {
    let mut gate = Gate::new(policy);
    if grants.read_untrusted {
        gate.set_read_untrusted();
    }
    gate
}

impl Session {
    pub(crate) fn new(grants: Arc<Grants>) -> Arc<Self> {
        let policy = grants.policy.clone().unwrap_or_else(|| Arc::new(Policy::deny_all(Registry::new())));
        let slots = Semaphore::new(grants.limits.concurrency.max(1));
        let gate = gate_for(&grants, policy);
        let witness = grants.relayed.as_ref().map(|t| crate::relayed::Witness::new(t.to_vec()));
        Arc::new(Self {
            grants,
            start: Instant::now(),
            state: Mutex::new(State {
                gate,
                report: GrantsReport::default(),
                calls: 0,
                functions: 0,
                open: std::collections::BTreeMap::new(),
                next_open: 0,
                witness,
            }),
            slots,
            closed: AtomicBool::new(false),
            ended: watch::channel(None).0,
            model: std::sync::OnceLock::new(),
            egress: std::sync::OnceLock::new(),
            asking: tokio::sync::Mutex::new(()),
        })
    }

    /// The model grant's per-run state, shared with the broker's [`ModelRun`].
    pub(crate) fn set_model(&self, run: &ModelRun) {
        let _ = self.model.set((run.placeholder.clone(), run.tokens.clone(), run.requests.clone()));
    }

    /// The run's proxy, for [`crate::FETCH_GRANT`].
    pub(crate) fn set_egress(&self, egress: crate::net::Egress) {
        let _ = self.egress.set(egress);
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ends the session for good (a protocol error or a flood): every connection closes and
    /// every later call fails. The first reason is kept.
    pub(crate) fn end(&self, reason: impl Into<String>) {
        let reason = reason.into();
        self.ended.send_if_modified(|r| {
            if r.is_none() {
                *r = Some(reason);
                true
            } else {
                false
            }
        });
    }

    fn ended_reason(&self) -> Option<String> {
        self.ended.borrow().clone()
    }

    /// A receiver that changes when the session ends.
    pub(crate) fn watch_end(&self) -> watch::Receiver<Option<String>> {
        self.ended.subscribe()
    }

    /// The run is over: later calls are refused, and a call still running is recorded as
    /// `cancelled` (the run's end aborts it). Returns what the broker saw.
    pub(crate) fn close(&self) -> GrantsReport {
        let mut report = {
            let mut st = self.state();
            // Under the record's lock, so a call ends either before (its own record) or
            // after (cancelled here), never in neither.
            self.closed.store(true, Ordering::SeqCst);
            for (_, open) in std::mem::take(&mut st.open) {
                let call = GrantCall::new(&open.grant, GrantOutcome::Failed, &open.rule, (0, 0), open.start.elapsed())
                    .with_args(open.args)
                    .failed_after("cancelled");
                self.notify(CallEvent::Ended { call: &call, ran: true });
                st.report.record(call);
            }
            let mut report = std::mem::take(&mut st.report);
            report.read_untrusted = st.gate.has_read_untrusted();
            report
        };
        report.session_ended = self.ended_reason();
        report.model_tokens = self.model.get().map_or(0, |(_, tokens, _)| tokens.load(Ordering::SeqCst));
        report
    }

    fn notify(&self, event: CallEvent<'_>) {
        if let Some(observer) = &self.grants.observer {
            observer(event);
        }
    }

    pub(crate) fn witness_request(&self, messages: &[stockade_protocol::chat::ChatMessage]) {
        let mut st = self.state();
        if st.witness.as_mut().is_some_and(|w| w.request(messages)) {
            st.gate.set_read_untrusted();
        }
    }

    pub(crate) fn witness_response(&self, text: Option<&str>, calls: Vec<(String, Value)>) {
        if let Some(w) = self.state().witness.as_mut() {
            w.response(text, calls);
        }
    }

    /// An allowed call starts: it is open until its record, and the observer hears of it.
    fn open_call(&self, grant: &str, rule: &str, args: &str) -> Option<u64> {
        let mut st = self.state();
        if self.closed.load(Ordering::SeqCst) {
            return None;
        }
        let n = st.next_open;
        st.next_open += 1;
        let args = GrantCall::new(grant, GrantOutcome::Ok, rule, (0, 0), Duration::ZERO).with_args(args.to_owned());
        let args = args.args.unwrap_or_default();
        self.notify(CallEvent::Allowed { grant, rule, args: &args });
        st.open.insert(n, Open { grant: grant.to_owned(), rule: rule.to_owned(), args, start: Instant::now() });
        Some(n)
    }

    /// Ends the session with `reason` and returns it as the session's end.
    fn fail(&self, reason: String) -> Ended {
        self.end(reason.clone());
        Ended(reason)
    }

    /// Counts one call against the run's bound; past it, the session ends (`Err`: why).
    fn count_call(&self) -> Result<(), String> {
        let calls = {
            let mut st = self.state();
            st.calls += 1;
            st.calls
        };
        let max = u64::from(self.grants.limits.max_calls);
        if calls > max {
            let reason = format!("more than {max} grant calls");
            self.end(reason.clone());
            return Err(reason);
        }
        Ok(())
    }

    /// Counts a request that arrived outside the frame protocol (the model socket).
    pub(crate) fn begin_external(&self) -> Result<(), String> {
        if self.closed.load(Ordering::SeqCst) {
            return Err("the run has ended".into());
        }
        if let Some(reason) = self.ended_reason() {
            return Err(format!("the broker session has ended: {reason}"));
        }
        self.count_call()
    }

    /// Records one call; nothing is recorded once the run's report has been taken.
    pub(crate) fn record(
        &self,
        grant: &str,
        outcome: GrantOutcome,
        rule: &str,
        bytes: (u64, u64),
        duration: std::time::Duration,
    ) {
        self.record_call(GrantCall::new(grant, outcome, rule, bytes, duration), None);
    }

    /// Records a call that ended (closing it if it was `open`), unless the run's end
    /// already closed it.
    fn record_call(&self, call: GrantCall, open: Option<u64>) {
        let mut st = self.state();
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        if let Some(n) = open {
            st.open.remove(&n);
        }
        self.notify(CallEvent::Ended { call: &call, ran: open.is_some() });
        st.report.record(call);
    }

    /// Handles one call frame's payload and returns the reply's payload, or ends the
    /// session (`Err`) when the payload breaks the protocol or the run's call bound.
    pub(crate) async fn handle(self: &Arc<Self>, payload: &[u8]) -> Result<Vec<u8>, Ended> {
        let t0 = Instant::now();
        if let Some(reason) = self.ended_reason() {
            return Err(Ended(reason));
        }
        let limit = self.grants.limits.max_call_bytes as usize;
        if payload.len() > limit {
            return Err(self.fail(format!("a call of {} bytes is over the maximum of {limit}", payload.len())));
        }
        let (id, grant, args) = match BrokerFrame::parse(payload) {
            Ok(BrokerFrame::Call { id, grant, args }) => (id, grant, args),
            Ok(_) => return Err(self.fail("the guest sent a frame that is not a call".to_owned())),
            Err(e) => return Err(self.fail(format!("malformed call frame: {e}"))),
        };
        let name = grant.as_str();
        if self.closed.load(Ordering::SeqCst) {
            return Ok(reply(id, error(ReplyCode::Refused, "the run has ended")));
        }
        if let Err(reason) = self.count_call() {
            self.record(name, GrantOutcome::Refused, "max-calls", (payload.len() as u64, 0), t0.elapsed());
            return Err(Ended(reason));
        }
        // A function call's arguments go in the record as the policy sees them.
        let mut seen = Seen::default();
        let (outcome, rule, body) = self.dispatch(name, args, &mut seen).await;
        let mut out = reply(id, body);
        // A reply over the bound fails the call, and the record keeps the rule that allowed
        // it (the call may have run): the failure is said beside it.
        let mut too_large = false;
        if out.len() > self.grants.limits.max_reply_bytes as usize {
            let msg = format!(
                "the result of {} bytes is over the maximum of {}",
                out.len(),
                self.grants.limits.max_reply_bytes
            );
            out = reply(id, error(ReplyCode::TooLarge, msg));
            too_large = true;
        }
        let mut call = GrantCall::new(name, outcome, &rule, (payload.len() as u64, out.len() as u64), t0.elapsed());
        if too_large {
            call = call.failed_after("reply-too-large");
        }
        let call = match seen.args {
            Some(args) => call.with_args(args),
            None => call,
        };
        self.record_call(call, seen.open);
        Ok(out)
    }

    /// Runs one call; a function call's canonical arguments, and its open number once
    /// allowed, are put in `seen`.
    async fn dispatch(self: &Arc<Self>, name: &str, args: Value, seen: &mut Seen) -> (GrantOutcome, String, ReplyBody) {
        if name == LIST_GRANT {
            let mut manifest = self.grants.manifest();
            // A guest without an environment (wasm) finds its secrets' placeholders here.
            if let Some(egress) = self.egress.get() {
                let secrets = crate::net::manifest_secrets(egress);
                manifest["secrets"] = Value::Object(secrets);
            }
            return (GrantOutcome::Ok, "manifest".into(), ReplyBody::Result(manifest));
        }
        if let (crate::MODEL_GRANT, Some(service), Some((placeholder, tokens, requests))) =
            (name, &self.grants.model, self.model.get())
        {
            // The model grant as a call: the same service, validation and token budget as
            // its socket, bounded by the run's concurrency and recorded here.
            let run = ModelRun {
                placeholder: placeholder.clone(),
                session: self.clone(),
                tokens: tokens.clone(),
                requests: requests.clone(),
            };
            let _slot = self.slots.acquire().await;
            return match service.complete(args, run).await {
                Ok(v) => (GrantOutcome::Ok, "model-call".into(), ReplyBody::Result(v)),
                Err(message) => (GrantOutcome::Failed, "model-call".into(), error(ReplyCode::Failed, message)),
            };
        }
        if let (crate::FETCH_GRANT, Some(egress)) = (name, self.egress.get()) {
            // fetch() for a guest without sockets: a client of the run's own proxy, so the
            // connection is decided and recorded there; bounded by the run's concurrency.
            let _slot = self.slots.acquire().await;
            return crate::net::fetch(egress, &args).await;
        }
        if let Some(value) = self.grants.data.get(name) {
            return (GrantOutcome::Ok, "data-grant".into(), ReplyBody::Result(value.clone()));
        }
        let Some(function) = self.grants.functions.get(name) else {
            let body = error(ReplyCode::Denied, format!("this run has no grant named {name:?}"));
            return (GrantOutcome::Denied, "unknown-grant".into(), body);
        };
        // The arguments' source: the sandbox's, unless the host relayed the model's call.
        let call = match self.state().witness.as_mut() {
            Some(w) => w.call(name, &args),
            None => ToolCall::from_json(name, &args, &Source::Sandbox),
        };
        let Some(call) = call else {
            let body = error(ReplyCode::BadArgs, "a function grant takes its arguments as one JSON object");
            return (GrantOutcome::Denied, "bad-args".into(), body);
        };
        // The whole schema first (what the server itself would refuse never reaches it):
        // the policy then decides on arguments that are what the tool takes.
        if let Err(why) = function.check_args(&args) {
            seen.args = Some(call.canonical_args());
            let body = error(ReplyCode::BadArgs, format!("the arguments do not follow {name}'s schema: {why}"));
            // The rule the policy's own argument check records.
            return (GrantOutcome::Denied, "bad-argument".into(), body);
        }
        seen.args = Some(call.canonical_args());
        let max = u64::from(self.grants.limits.max_function_calls);
        let over = {
            let mut st = self.state();
            st.functions += 1;
            st.functions > max
        };
        if over {
            let body = error(ReplyCode::Refused, format!("this run's {max} function calls are spent"));
            return (GrantOutcome::Refused, "max-function-calls".into(), body);
        }
        let now = self.start.elapsed();
        let decided = self.state().gate.decide_unattended(&call, now);
        let decided = match (decided, &self.grants.approver) {
            (Err(refused), Some(approver)) if refused.kind == RefusalKind::NeedsApproval => {
                self.ask(approver.as_ref(), &call).await
            }
            (decided, _) => decided,
        };
        let permit = match decided {
            Ok(permit) => permit,
            Err(refused) => {
                let (code, msg) = match refused.kind {
                    RefusalKind::NeedsApproval if self.grants.approver.is_some() => {
                        (ReplyCode::Denied, format!("rule `{}` asks for approval, and it was not given", refused.rule))
                    }
                    RefusalKind::NeedsApproval => (
                        ReplyCode::Denied,
                        format!("rule `{}` asks for approval, and a sandbox call has no one to ask", refused.rule),
                    ),
                    RefusalKind::BadArguments => (ReplyCode::BadArgs, refused.reason),
                    _ => (ReplyCode::Denied, refused.reason),
                };
                return (GrantOutcome::Denied, refused.rule, error(code, msg));
            }
        };
        let rule = permit.rule().to_owned();
        seen.open = self.open_call(name, &rule, seen.args.as_deref().unwrap_or_default());
        let timeout = self.grants.limits.call_timeout;
        let run = async {
            let _slot = self.slots.acquire().await;
            function.handler.call(permit).await
        };
        let result = tokio::time::timeout(timeout, run).await;
        // A failure's message carries the tool's words as a result does (an MCP server's
        // JSON-RPC error quoting a page): either way, untrusted text was read.
        let untrusted = function.spec.has_untrusted_output();
        if untrusted && result.is_ok() {
            self.state().gate.set_read_untrusted();
        }
        if let (Some(w), Ok(output)) = (self.state().witness.as_mut(), &result) {
            match output {
                Ok(value) => w.output(name, untrusted, value),
                Err(message) => w.output(name, untrusted, &Value::String(message.clone())),
            }
        }
        match result {
            Ok(Ok(value)) => (GrantOutcome::Ok, rule, ReplyBody::Result(value)),
            Ok(Err(message)) => (GrantOutcome::Failed, rule, error(ReplyCode::Failed, message)),
            Err(_) => (
                GrantOutcome::Failed,
                rule,
                error(ReplyCode::Failed, format!("timed out after {} ms", timeout.as_millis())),
            ),
        }
    }
}

impl Session {
    /// A call the policy marks `ask`, put to the grants' approver (one question at a time);
    /// approved, it is decided again with that single-use approval, so every other rule
    /// (limits, the ledger) still holds; not approved, it stays refused as needing approval.
    async fn ask(&self, approver: &dyn crate::GrantApprover, call: &ToolCall) -> Result<Permit, Refused> {
        let _one = self.asking.lock().await;
        // Decided again now: a call allowed meanwhile may have changed the ledger.
        let (rule, reason, key) = match self.state().gate.decide(call, self.start.elapsed()) {
            Decision::Ask { rule, reason, approval_key } => (rule, reason, approval_key),
            Decision::Allow(permit) => return Ok(permit),
            Decision::Deny { rule, reason } => return Err(Refused { kind: RefusalKind::Denied, rule, reason }),
        };
        if !approver.approve(call, &rule, &reason).await {
            return Err(Refused { kind: RefusalKind::NeedsApproval, rule, reason });
        }
        match self.state().gate.decide_approved(call, self.start.elapsed(), Approval::grant(key)) {
            Decision::Allow(permit) => Ok(permit),
            Decision::Ask { rule, reason, .. } => Err(Refused { kind: RefusalKind::NeedsApproval, rule, reason }),
            Decision::Deny { rule, reason } => Err(Refused { kind: RefusalKind::Denied, rule, reason }),
        }
    }
}

/// A per-run grants directory on the host: the broker's socket, the client, the data. It is
/// removed when dropped. Only the run's guest user (and the invoking user) can enter it.
#[derive(Debug)]
pub(crate) struct GrantsDir {
    path: PathBuf,
}

impl Drop for GrantsDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// `bytes` random bytes from the OS RNG, as lowercase hex.
pub(crate) fn random_hex(bytes: usize) -> io::Result<String> {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// The grants directories under `parent` whose broker is gone: named as a run's broker names
/// them, at least `min_age` old (so that one being made is never taken), and whose socket
/// is not bound in this network namespace (`stockade_sys::proc::unix_socket_paths`: read,
/// never connected to, so a live broker sees nothing). What a SIGKILLed supervisor or
/// session owner left; `stockade gc` removes them.
#[must_use]
pub fn stale_grants_dirs(parent: &Path, min_age: std::time::Duration) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(parent) else { return Vec::new() };
    let bound = stockade_sys::proc::unix_socket_paths();
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("stockade-g-"))
        .filter(|e| {
            e.metadata().is_ok_and(|m| {
                m.is_dir() && m.modified().ok().and_then(|t| t.elapsed().ok()).is_some_and(|age| age >= min_age)
            })
        })
        .map(|e| e.path())
        .filter(|dir| !bound.contains(&dir.join(GRANTS_SOCKET)))
        .collect()
}

impl GrantsDir {
    /// Creates the directory under `parent` (mode 0700, or root:`guest_gid` 0750 when
    /// running as root, so the guest, 65534 or a session's own id, can enter it and no other
    /// user can), writes the client and the data grants, and binds the listening socket.
    pub(crate) fn create(
        parent: &Path,
        grants: &Grants,
        guest_gid: u32,
    ) -> io::Result<(Self, UnixListener, Option<UnixListener>)> {
        // 96 bits: the name is not the protection (the directory's mode is), and a short name
        // leaves room under the 108-byte limit of a socket path.
        let path = parent.join(format!("stockade-g-{}", random_hex(12)?));
        let socket_len = path.join(GRANTS_SOCKET).as_os_str().len();
        if socket_len >= 108 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the socket path would be {socket_len} bytes, over the 107 a unix socket path may have: choose a shorter grants directory"
                ),
            ));
        }
        // Made 0700 (a umask can only take bits away) and opened up to its final mode only
        // once everything inside exists: while it is filled, no other user can enter it, so
        // none can plant a symlink in `data/` or `bin/` for a write to follow, whatever the
        // process's umask. Each file is created new (`O_EXCL`, so never through a symlink),
        // owner-only until it is shared.
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        let dir = Self { path };
        // The owner of a directory this process just created is its effective uid.
        let root = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&dir.path)?) == 0;
        let share = |p: &Path, mode: u32| -> io::Result<()> {
            if root {
                chown(p, Some(0), Some(guest_gid))?;
            }
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        };
        let new_dir = |p: &Path| std::fs::DirBuilder::new().mode(0o700).create(p);
        let new_file = |p: &Path, bytes: &[u8]| -> io::Result<()> {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            // `create_new` is `O_CREAT | O_EXCL`: a name that exists, a symlink included, fails.
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(p)?;
            f.write_all(bytes)
        };
        if !CLIENT.is_empty() || !grants.programs.is_empty() {
            let bin = dir.path.join("bin");
            new_dir(&bin)?;
            if !CLIENT.is_empty() {
                let client = bin.join("stockade-call");
                new_file(&client, CLIENT)?;
                share(&client, 0o750)?;
            }
            for (name, source) in &grants.programs {
                let target = bin.join(name);
                copy_program(source, &target)
                    .map_err(|e| io::Error::new(e.kind(), format!("copying the program {}: {e}", source.display())))?;
                share(&target, 0o750)?;
            }
            share(&bin, 0o750)?;
        }
        if !grants.libraries.is_empty() {
            let lib = dir.path.join("lib");
            new_dir(&lib)?;
            for (name, source) in &grants.libraries {
                let target = lib.join(name);
                copy_program(source, &target)
                    .map_err(|e| io::Error::new(e.kind(), format!("copying the library {}: {e}", source.display())))?;
                share(&target, 0o750)?;
            }
            share(&lib, 0o750)?;
        }
        let data = dir.path.join("data");
        new_dir(&data)?;
        for (name, value) in &grants.data {
            let file = data.join(format!("{name}.json"));
            new_file(&file, &serde_json::to_vec(value).unwrap_or_default())?;
            share(&file, 0o640)?;
        }
        share(&data, 0o750)?;
        let socket = dir.path.join(GRANTS_SOCKET);
        let listener = UnixListener::bind(&socket)?;
        share(&socket, 0o660)?;
        let model = match grants.model {
            Some(_) => {
                let socket = dir.path.join(MODEL_SOCKET);
                let l = UnixListener::bind(&socket)?;
                share(&socket, 0o660)?;
                Some(l)
            }
            None => None,
        };
        // Last: the directory itself, to its final mode.
        share(&dir.path, if root { 0o750 } else { 0o700 })?;
        Ok((dir, listener, model))
    }

    /// The directory.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

/// Copies the regular file `source` to the new file `target` (`O_EXCL`, owner-only until it
/// is shared): a copy, never a link, so the guest's view cannot reach the host's file and
/// sharing the copy changes nothing of the original.
fn copy_program(source: &Path, target: &Path) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut from = std::fs::File::open(source)?;
    if !from.metadata()?.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
    }
    let mut to = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o700).open(target)?;
    // A file-to-file copy: the kernel's copy_file_range where the filesystem has it.
    io::copy(&mut from, &mut to)?;
    Ok(())
}

/// The model socket's file name inside a run's grants directory.
pub(crate) const MODEL_SOCKET: &str = "model.sock";

/// The port of the run's loopback listener, in the run's own network namespace: the model
/// grant (`OPENAI_BASE_URL=http://127.0.0.1:8765/v1`) and the network grant's proxy
/// (`HTTP_PROXY=http://127.0.0.1:8765`). The namespace is the run's own, so the port collides
/// with nothing of the host's.
pub(crate) const LOOPBACK_PORT: u16 = 8765;

/// A listener the broker serves: the unix sockets of a grants directory, or the loopback
/// listener of a run's network namespace.
pub(crate) trait Listen: Send {
    type Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static;
    fn accept_one(&self) -> impl std::future::Future<Output = io::Result<Self::Stream>> + Send;
}

impl Listen for UnixListener {
    type Stream = UnixStream;
    async fn accept_one(&self) -> io::Result<UnixStream> {
        self.accept().await.map(|(s, _)| s)
    }
}

impl Listen for tokio::net::TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn accept_one(&self) -> io::Result<tokio::net::TcpStream> {
        let (s, _) = self.accept().await?;
        let _ = s.set_nodelay(true);
        Ok(s)
    }
}

/// Serves the model grant's connections on `listener` until the session ends or the task
/// is aborted.
pub(crate) async fn serve_model<L: Listen>(listener: L, session: Arc<Session>, run: crate::grants::ModelRun) {
    let Some(service) = session.grants.model.clone() else { return };
    accept(listener, &session, 0, |stream| service.serve(Box::new(stream), run.clone())).await;
}

/// Serves the run's loopback listener until the session ends: each connection goes, by its
/// first bytes, to the network grant's proxy or to the model grant (`net::route`).
pub(crate) async fn serve_loopback(
    listener: tokio::net::TcpListener,
    session: Arc<Session>,
    run: crate::grants::ModelRun,
    egress: Option<crate::net::Egress>,
) {
    let model = session.grants.model.clone();
    // The network grant's proxy bounds its own connections (and records what it refuses).
    let proxied = session.grants.net.as_ref().map_or(0, crate::net::max_connections);
    accept(listener, &session, proxied, move |stream| {
        crate::net::route(stream, model.clone(), run.clone(), egress.clone())
    })
    .await;
}

/// Serves `session`'s frame protocol on `listener` until the session ends or the task is
/// aborted.
pub(crate) async fn serve(listener: UnixListener, session: Arc<Session>) {
    let codec = FrameCodec::new(session.grants.limits.max_call_bytes);
    let s = session.clone();
    accept(listener, &session, 0, move |stream| {
        let session = s.clone();
        async move { connection(stream, &session, codec).await }
    })
    .await;
}

/// Accepts connections on `listener` and serves each with `serve` until the session ends;
/// connections beyond the run's bound (plus `extra`, for a listener that also serves the
/// network grant's proxy) are closed at once (the session goes on), and every connection
/// still open is dropped when the session ends.
async fn accept<L, F, Fut>(listener: L, session: &Session, extra: usize, serve: F)
where
    L: Listen,
    F: Fn(L::Stream) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(session.grants.limits.max_connections.max(1).saturating_add(extra)));
    let mut ended = session.watch_end();
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = ended.changed() => break,
            accepted = listener.accept_one() => {
                let Ok(stream) = accepted else { continue };
                let Ok(slot) = slots.clone().try_acquire_owned() else { continue };
                let conn = serve(stream);
                conns.spawn(async move {
                    conn.await;
                    drop(slot);
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.abort_all();
}

async fn connection(mut stream: UnixStream, session: &Arc<Session>, codec: FrameCodec) {
    let mut ended = session.watch_end();
    let reply_codec = FrameCodec::new(session.grants.limits.max_reply_bytes.max(1 << 10));
    loop {
        let frame = tokio::select! {
            _ = ended.changed() => return,
            f = codec.read_frame_async(&mut stream) => f,
        };
        let payload = match frame {
            Ok(Some(p)) => p,
            Ok(None) => return,
            Err(DecodeError::TooLarge { len, max, .. }) => {
                return session.end(format!("a frame announced {len} bytes, over the maximum of {max}"));
            }
            Err(DecodeError::Truncated { expected, got, .. }) => {
                return session.end(format!("a frame was cut short after {got} of {expected} bytes"));
            }
            Err(_) => return,
        };
        let Ok(out) = session.handle(&payload).await else { return };
        if reply_codec.write_frame_async(&mut stream, &out).await.is_err() {
            return;
        }
    }
}
