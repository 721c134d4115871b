//! envd's processes: the `process.Process` Connect service (start, connect, list, input,
//! signals), its streams bounded by [`STREAM_QUEUE`] events.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request, Response, StatusCode};
use stockade_protocol::e2b::{self as wire, Code, Codec, ConnectError, ProcessEvent, Shape};
use stockade_runtime::protocol::{RunError, Status};
use stockade_runtime::session::{Background, Chunk, Session, StartOptions, exec_job};

#[allow(clippy::wildcard_imports, reason = "the server's own items")]
use super::*;

/// A runtime error as a Connect error.
pub(crate) fn run_code(e: &RunError) -> ConnectError {
    let code = match e {
        RunError::Busy(_) => Code::ResourceExhausted,
        RunError::Unsupported { .. } => Code::Unimplemented,
        // The session, or the process, ended since the call looked it up.
        RunError::Ended(_) => Code::NotFound,
        RunError::Misconfigured(_) => Code::FailedPrecondition,
        _ => Code::Internal,
    };
    ConnectError::new(code, e.to_string())
}

/// The running process a selector names (a pid, or the tag of a running one): `not_found`
/// for one the sandbox never started through the API or one that has ended, as envd says.
pub(crate) fn running_exec(s: &Session, sel: &wire::ProcessSelector) -> Result<Arc<Background>, ConnectError> {
    let found = match sel {
        wire::ProcessSelector::Pid(p) => s.find(*p).ok(),
        wire::ProcessSelector::Tag(t) => {
            s.background().into_iter().find(|x| x.running() && x.tag() == Some(t.as_str()))
        }
    };
    found.filter(|x| x.running()).ok_or_else(|| {
        let which = match sel {
            wire::ProcessSelector::Pid(p) => format!("pid {p}"),
            wire::ProcessSelector::Tag(t) => format!("tag {t:?}"),
        };
        ConnectError::new(Code::NotFound, format!("no running process has {which}"))
    })
}

/// How many events of a process stream wait for a slow client (each at most one read of
/// the guest's output, 64 KiB, encoded): with the exec's own bound
/// ([`stockade_runtime::session::LIVE_BYTES`]), what one stream holds of the owner's memory.
pub const STREAM_QUEUE: usize = 16;

/// Longest a `SendSignal` of SIGKILL waits for its process to be reaped before it answers.
pub(crate) const KILL_WAIT: Duration = Duration::from_secs(5);

pub(crate) fn pty_size(s: wire::PtySize) -> Result<(u16, u16), ConnectError> {
    let bad = || {
        ConnectError::new(
            Code::InvalidArgument,
            format!("pty size {}x{}: rows and cols must be 1 to 1000", s.rows, s.cols),
        )
    };
    let rows = u16::try_from(s.rows).ok().filter(|r| (1..=1000).contains(r)).ok_or_else(bad)?;
    let cols = u16::try_from(s.cols).ok().filter(|c| (1..=1000).contains(c)).ok_or_else(bad)?;
    Ok((rows, cols))
}

/// How a run's end reads as envd's end event; a deadline is the stream's error.
pub(crate) fn end_event(status: &Status) -> Result<ProcessEvent, ConnectError> {
    let killed = |error: &str| ProcessEvent::End {
        exit_code: -1,
        exited: false,
        status: "signal: killed".into(),
        error: Some(error.to_owned()),
    };
    Ok(match status {
        Status::Exited { code } => {
            ProcessEvent::End { exit_code: *code, exited: true, status: format!("exit status {code}"), error: None }
        }
        Status::Signaled { signal } => ProcessEvent::End {
            exit_code: -1,
            exited: false,
            status: format!("signal: {}", signal_name(*signal)),
            error: None,
        },
        Status::TimedOut | Status::CpuLimit => {
            return Err(ConnectError::new(Code::DeadlineExceeded, "the command's timeout passed and it was killed"));
        }
        Status::OutOfMemory => killed("out of memory: the sandbox's memory limit was reached"),
        Status::OutputLimit { stream } => killed(&format!("its {stream:?} went over its output budget")),
        Status::FailedToStart { reason } => {
            return Err(ConnectError::new(Code::InvalidArgument, format!("the command could not start: {reason}")));
        }
        other => killed(&format!("{other:?}")),
    })
}

pub(crate) fn signal_name(n: i32) -> &'static str {
    match n {
        1 => "hangup",
        2 => "interrupt",
        9 => "killed",
        13 => "broken pipe",
        15 => "terminated",
        _ => "signal",
    }
}

/// `StreamInput`: a client stream of envelopes, the first naming the process, each later one
/// input for it, written in order as each arrives (one message at most 1 MiB; the whole
/// stream within `deadline`).
pub(crate) async fn stream_input(
    s: &Session,
    codec: Codec,
    request: &'static wire::proto::Message,
    mut body: hyper::body::Incoming,
    deadline: Duration,
) -> Result<(), ConnectError> {
    let until = tokio::time::Instant::now() + deadline;
    let mut buf = bytes::BytesMut::new();
    let mut pid: Option<u32> = None;
    let mut ended = false;
    loop {
        // Every whole envelope in the buffer, in order.
        while buf.len() >= 5 {
            let flags = buf[0];
            let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            if len > wire::MAX_RPC_BYTES {
                return Err(ConnectError::new(
                    Code::ResourceExhausted,
                    format!("a {len}-byte message is over the limit"),
                ));
            }
            if buf.len() < 5 + len {
                break;
            }
            let frame = buf.split_to(5 + len);
            if flags & wire::FLAG_END_STREAM != 0 {
                return Ok(());
            }
            let msg: wire::StreamInputRequest = codec.decode(wire::single_envelope(&frame)?, request)?;
            match (msg, pid) {
                (wire::StreamInputRequest::Start { process }, None) => {
                    pid = Some(running_exec(s, &process)?.pid());
                }
                (wire::StreamInputRequest::Start { .. }, Some(_)) => {
                    return Err(ConnectError::new(Code::InvalidArgument, "a second start message"));
                }
                (_, None) => return Err(ConnectError::new(Code::InvalidArgument, "the first message must be start")),
                (wire::StreamInputRequest::Data { input }, Some(p)) => {
                    let bytes = match input {
                        wire::ProcessInput::Stdin(b) | wire::ProcessInput::Pty(b) => b,
                    };
                    s.send_stdin(p, &bytes).await.map_err(|e| run_code(&e))?;
                }
                (wire::StreamInputRequest::KeepAlive {}, Some(_)) => {}
            }
        }
        if ended {
            return if buf.is_empty() {
                Ok(())
            } else {
                Err(ConnectError::new(Code::InvalidArgument, "the stream ends mid-message"))
            };
        }
        match tokio::time::timeout_at(until, body.frame()).await {
            Err(_) => return Err(ConnectError::new(Code::DeadlineExceeded, "the input stream's deadline passed")),
            Ok(None) => ended = true,
            Ok(Some(Err(e))) => {
                return Err(ConnectError::new(Code::Canceled, format!("reading the input stream: {e}")));
            }
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    buf.extend_from_slice(&data);
                }
            }
        }
    }
}

/// A streaming call's error: HTTP 200 and an end-of-stream envelope holding it.
pub(crate) fn stream_error(codec: Codec, e: &ConnectError) -> Response<Body> {
    whole(StatusCode::OK, codec.content_type(true), wire::end_stream(Some(e)))
}

/// One request message and the call it came with, read in that call's codec.
pub(crate) struct Message<'a> {
    pub(crate) codec: Codec,
    pub(crate) method: &'static wire::Method,
    pub(crate) bytes: &'a [u8],
}

impl Message<'_> {
    pub(crate) fn read<T: serde::de::DeserializeOwned>(&self) -> Result<T, ConnectError> {
        self.codec.decode(self.bytes, self.method.request)
    }
}

impl E2bServer {
    /// An envd call: the sandbox by `E2b-Sandbox-Id`, its token, then the service.
    pub(crate) async fn envd(self: &Arc<Self>, req: Request<hyper::body::Incoming>, path: &str) -> Response<Body> {
        let rpc = path != "/files" && path != "/envs";
        let fail = |e: ConnectError| {
            if rpc {
                rpc_error(&e)
            } else {
                api_error(StatusCode::from_u16(e.code.http_status()).unwrap_or(StatusCode::BAD_REQUEST), &e.message)
            }
        };
        let id = header(req.headers(), "e2b-sandbox-id").unwrap_or_default().to_owned();
        let signed = path == "/files" && query(&req).contains_key("signature");
        let b = if signed {
            // A signed URL (`download_url`, `upload_url`) carries no header: the signature
            // names its sandbox, and is its only credential.
            match self.signed_sandbox(&req, &id) {
                Ok(b) => b,
                Err(r) => return *r,
            }
        } else {
            let Some(b) = self.sandbox(&id) else { return not_running(&id) };
            let token = header(req.headers(), "x-access-token").unwrap_or_default();
            if !constant_eq(token, &b.token) {
                return fail(ConnectError::new(
                    Code::Unauthenticated,
                    "a missing or wrong access token (X-Access-Token)",
                ));
            }
            b
        };
        if !b.awake().await {
            return not_running(&id);
        }
        if let Err(e) = check_user(basic_user(req.headers()).as_deref()) {
            return fail(e);
        }
        match path {
            "/files" => self.files(&b, req).await,
            "/envs" => json(StatusCode::OK, &b.env),
            _ => self.rpc(b, req, path).await,
        }
    }

    pub(crate) async fn rpc(
        self: &Arc<Self>,
        b: Arc<Sandbox>,
        req: Request<hyper::body::Incoming>,
        path: &str,
    ) -> Response<Body> {
        if req.method() != Method::POST {
            return rpc_error(&ConnectError::new(Code::Unimplemented, format!("{path}: Connect calls are POST")));
        }
        let Some(method) = wire::find_method(path) else {
            return rpc_error(&ConnectError::new(Code::Unimplemented, format!("{path}: no such method")));
        };
        let streaming = method.shape.streaming();
        let ct = header(req.headers(), "content-type").unwrap_or_default().to_owned();
        let Some(codec) = Codec::from_content_type(&ct, streaming) else {
            let mut r = rpc_error(&ConnectError::new(
                Code::Unimplemented,
                format!(
                    "content type {ct:?}: this call takes Connect's JSON or binary codec ({} or {})",
                    Codec::Json.content_type(streaming),
                    Codec::Proto.content_type(streaming)
                ),
            ));
            *r.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
            return r;
        };
        let deadline = header(req.headers(), "connect-timeout-ms")
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|ms| *ms > 0)
            .map(Duration::from_millis);
        let keepalive = header(req.headers(), "keepalive-ping-interval")
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|s| *s > 0)
            .map(Duration::from_secs);
        if method.shape == Shape::ClientStream {
            let within = deadline.unwrap_or(Duration::from_secs(3600));
            let input = stream_input(&b.session, codec, method.request, req.into_body(), within);
            return match input.await.and_then(|()| codec.encode(&serde_json::json!({}), method.response)) {
                Ok(reply) => {
                    let mut out = wire::envelope(0, &reply);
                    out.extend(wire::end_stream(None));
                    whole(StatusCode::OK, codec.content_type(true), out)
                }
                Err(e) => stream_error(codec, &e),
            };
        }
        let body = match read_body(req.into_body(), wire::MAX_RPC_BYTES + 5).await {
            Ok(b) => b,
            Err(e) => return rpc_error(&ConnectError::new(Code::ResourceExhausted, e)),
        };
        if streaming {
            let bytes = match wire::single_envelope(&body) {
                Ok(m) => m,
                Err(e) => return stream_error(codec, &e),
            };
            let Ok(permit) = Arc::clone(&self.streams).try_acquire_owned() else {
                return stream_error(codec, &ConnectError::new(Code::ResourceExhausted, "too many streams are open"));
            };
            let msg = Message { codec, method, bytes };
            return match self.stream(&b, msg, Streamed { deadline, keepalive, permit }).await {
                Ok(r) => r,
                Err(e) => stream_error(codec, &e),
            };
        }
        let msg = Message { codec, method, bytes: &body };
        match self.unary(&b, msg).await.and_then(|v| codec.encode(&v, method.response)) {
            Ok(reply) => whole(StatusCode::OK, codec.content_type(false), reply),
            Err(e) => rpc_error(&e),
        }
    }

    pub(crate) async fn unary(&self, b: &Sandbox, msg: Message<'_>) -> Result<serde_json::Value, ConnectError> {
        let s = &b.session;
        let pid_of = |sel: &wire::ProcessSelector| running_exec(s, sel).map(|x| x.pid());
        let empty = serde_json::json!({});
        match msg.method.path {
            "/process.Process/List" => {
                let _: wire::Empty = msg.read()?;
                let processes = s
                    .background()
                    .iter()
                    .filter(|x| x.running())
                    .map(|x| {
                        let (cmd, args) = x
                            .argv()
                            .split_first()
                            .map_or((String::new(), Vec::new()), |(c, a)| (c.clone(), a.to_vec()));
                        wire::ProcessInfo {
                            config: wire::ProcessConfig {
                                cmd,
                                args,
                                envs: BTreeMap::new(),
                                cwd: x.cwd().map(str::to_owned),
                            },
                            pid: x.pid(),
                            tag: x.tag().map(str::to_owned),
                        }
                    })
                    .collect();
                Ok(serde_json::to_value(wire::ListResponse { processes }).unwrap_or(empty))
            }
            "/process.Process/SendInput" => {
                let r: wire::SendInputRequest = msg.read()?;
                let pid = pid_of(&r.process)?;
                let bytes = match r.input {
                    wire::ProcessInput::Stdin(b) | wire::ProcessInput::Pty(b) => b,
                };
                s.send_stdin(pid, &bytes).await.map_err(|e| run_code(&e))?;
                Ok(empty)
            }
            "/process.Process/CloseStdin" => {
                let r: wire::ProcessRequest = msg.read()?;
                let pid = pid_of(&r.process)?;
                s.close_stdin(pid).await.map_err(|e| run_code(&e))?;
                Ok(empty)
            }
            "/process.Process/SendSignal" => {
                let r: wire::SendSignalRequest = msg.read()?;
                let x = running_exec(s, &r.process)?;
                s.signal(x.pid(), r.signal.number()).await.map_err(|e| run_code(&e))?;
                if matches!(r.signal, wire::Signal::Kill) {
                    // A kill answers once the process is gone, reaped (a `kill -0` after it
                    // finds nothing), or after KILL_WAIT if it is slow to die.
                    let _ = tokio::time::timeout(KILL_WAIT, x.wait()).await;
                }
                Ok(empty)
            }
            "/process.Process/Update" => {
                let r: wire::UpdateRequest = msg.read()?;
                let pid = pid_of(&r.process)?;
                if let Some(size) = r.pty.and_then(|p| p.size) {
                    let (rows, cols) = pty_size(size)?;
                    s.resize(pid, rows, cols).await.map_err(|e| run_code(&e))?;
                }
                Ok(empty)
            }
            "/filesystem.Filesystem/CreateWatcher"
            | "/filesystem.Filesystem/GetWatcherEvents"
            | "/filesystem.Filesystem/RemoveWatcher" => self.watcher(b, msg).await,
            p if p.starts_with("/filesystem.Filesystem/") => self.filesystem(s, msg).await,
            other => Err(ConnectError::new(Code::Unimplemented, format!("{other}: no such method"))),
        }
    }

    /// Start or Connect: a stream of the process's events; or `WatchDir`'s, of a directory's.
    pub(crate) async fn stream(
        self: &Arc<Self>,
        b: &Arc<Sandbox>,
        msg: Message<'_>,
        call: Streamed,
    ) -> Result<Response<Body>, ConnectError> {
        if msg.method.path == "/filesystem.Filesystem/WatchDir" {
            return self.watch_stream(b, msg, call).await;
        }
        let tick = call.tick();
        let Streamed { deadline, permit, .. } = call;
        let s = Arc::clone(&b.session);
        let handle = if msg.method.path == "/process.Process/Start" {
            let r: wire::StartRequest = msg.read()?;
            let cfg = r.process.unwrap_or_default();
            if cfg.cmd.is_empty() {
                return Err(ConnectError::new(Code::InvalidArgument, "process.cmd: empty"));
            }
            // The deadline ends the process (E2B's command timeout); without one, the
            // sandbox's own end does.
            let wall = deadline.unwrap_or(stockade_runtime::protocol::limits::MAX_DURATION);
            let argv: Vec<String> = std::iter::once(cfg.cmd.clone()).chain(cfg.args.iter().cloned()).collect();
            let job = exec_job(&argv, cfg.envs.clone(), Vec::new(), Some(wall))
                .map_err(|e| ConnectError::new(Code::InvalidArgument, e.to_string()))?;
            let pty = match r.pty {
                Some(p) => Some(pty_size(p.size.unwrap_or(wire::PtySize { cols: 80, rows: 24 }))?),
                None => None,
            };
            let opts = StartOptions { pty, stdin: r.stdin.unwrap_or(true), tag: r.tag };
            let cwd = Some(cfg.cwd.as_deref().map_or_else(|| HOME.to_owned(), guest_path));
            s.start(job, cwd, opts).await.map_err(|e| run_code(&e))?
        } else {
            let r: wire::ProcessRequest = msg.read()?;
            running_exec(&s, &r.process)?
        };
        // Bounded: a slow client holds the stream task at `send`, which stops taking the
        // exec's output, which stops its reading (the guest waits on its write).
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(STREAM_QUEUE);
        let (codec, response) = (msg.codec, msg.method.response);
        let encode = move |ev: &ProcessEvent| match codec.encode(&ev.to_json(), response) {
            Ok(bytes) => (Bytes::from(wire::envelope(0, &bytes)), true),
            Err(e) => (Bytes::from(wire::end_stream(Some(&e))), false),
        };
        let pty = handle.has_pty();
        let to_event = move |c: Chunk| match c {
            Chunk::Stdout(b) if pty => ProcessEvent::Pty(b),
            Chunk::Stdout(b) => ProcessEvent::Stdout(b),
            Chunk::Stderr(b) => ProcessEvent::Stderr(b),
        };
        let session = Arc::clone(&s);
        tokio::spawn(async move {
            let _permit = permit;
            let send = |ev: ProcessEvent| {
                let (bytes, ok) = encode(&ev);
                let tx = &tx;
                async move { tx.send(Ok(bytes)).await.is_ok() && ok }
            };
            let end_with = |e: Option<ConnectError>| {
                let tx = &tx;
                async move {
                    let _ = tx.send(Ok(Bytes::from(wire::end_stream(e.as_ref())))).await;
                }
            };
            // Connect announces the pid too, as envd does.
            if !send(ProcessEvent::Start { pid: handle.pid() }).await {
                return;
            }
            let (history, mut live) = handle.attach();
            for c in history {
                if !send(to_event(c)).await {
                    return;
                }
            }
            let end = handle.wait();
            tokio::pin!(end);
            let result = loop {
                tokio::select! {
                    result = &mut end => {
                        // Its output was all pushed before its end was: what is queued is the rest.
                        while let Some(c) = live.try_recv() {
                            if !send(to_event(c)).await {
                                return;
                            }
                        }
                        break result;
                    }
                    c = live.recv() => if !send(to_event(c)).await { return },
                    () = tokio::time::sleep(tick) => if !send(ProcessEvent::KeepAlive).await { return },
                    () = tx.closed() => return,
                }
            };
            if session.ended() {
                // Killed under the stream: envd's connection ends so, and the SDK's health
                // probe then tells the sandbox is gone.
                let gone = ConnectError::new(Code::Unavailable, "the sandbox ended before the stream completed");
                return end_with(Some(gone)).await;
            }
            match result.map_err(|e| run_code(&e)).and_then(|report| end_event(&report.status)) {
                Ok(ev) => {
                    if send(ev).await {
                        end_with(None).await;
                    }
                }
                Err(e) => end_with(Some(e)).await,
            }
        });
        Ok(stream_response(codec, rx))
    }
}

/// A streaming call's own: its deadline (`Connect-Timeout-Ms`), its keepalive interval
/// (`Keepalive-Ping-Interval`), and its place among the server's streams.
pub(crate) struct Streamed {
    pub(crate) deadline: Option<Duration>,
    pub(crate) keepalive: Option<Duration>,
    pub(crate) permit: tokio::sync::OwnedSemaphorePermit,
}

impl Streamed {
    /// How often an idle stream sends a keepalive: as the client asked, else hourly.
    pub(crate) fn tick(&self) -> Duration {
        self.keepalive.unwrap_or(Duration::from_secs(3600))
    }
}

/// A streaming call's response: what its task queues on `rx`, in `codec`'s streaming type.
pub(crate) fn stream_response(
    codec: Codec,
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
) -> Response<Body> {
    let mut r = Response::new(PipeBody(rx).boxed());
    if let Ok(v) = codec.content_type(true).parse() {
        r.headers_mut().insert(CONTENT_TYPE, v);
    }
    r
}
