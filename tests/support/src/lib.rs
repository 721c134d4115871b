//! Test fixtures shared by the crates' tests: a deterministic OpenAI-compatible mock of
//! `POST /v1/chat/completions`, listening on 127.0.0.1 only, that plays scripted replies and
//! records every request it received (headers and body), so tests judge by what the server saw.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

/// The throwaway CA the test server's certificate is signed by (see `fixtures/README.md`).
pub const TEST_CA_PEM: &[u8] = include_bytes!("../fixtures/test-ca.pem");
/// The test server's certificate, for 127.0.0.1 and localhost.
pub const TEST_CERT_PEM: &[u8] = include_bytes!("../fixtures/test-cert.pem");
/// Its private key (public on purpose: only tests trust the certificate).
pub const TEST_KEY_PEM: &[u8] = include_bytes!("../fixtures/test-key.pem");

/// Largest request the mock reads: 16 MiB.
const MAX_REQUEST: usize = 16 << 20;

/// One scripted reply.
#[derive(Debug, Clone)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
    /// Wait this long before answering.
    pub delay: Duration,
    /// Close the connection instead of answering.
    pub hang_up: bool,
    /// Announce this content-length instead of the body's (to send a truncated body).
    pub claimed_len: Option<usize>,
    /// After the body, keep the connection open this long before closing it (a stall).
    pub stall: Duration,
}

impl Reply {
    /// 200 with this JSON body.
    #[must_use]
    pub fn json(v: &Value) -> Self {
        Self::raw(200, v.to_string().into_bytes())
    }

    /// `status` with these bytes.
    #[must_use]
    pub fn raw(status: u16, body: Vec<u8>) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body,
            delay: Duration::ZERO,
            hang_up: false,
            claimed_len: None,
            stall: Duration::ZERO,
        }
    }

    /// A completion whose message is `text` with no calls.
    #[must_use]
    pub fn text(text: &str) -> Self {
        Self::json(&completion(json!({"role": "assistant", "content": text}), "stop"))
    }

    /// A completion calling `calls` (name, arguments as a JSON value or a raw string).
    #[must_use]
    pub fn calls(calls: &[(&str, Value)]) -> Self {
        let calls: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(i, (name, args))| {
                let arguments = match args {
                    Value::String(s) => Value::String(s.clone()),
                    other => Value::String(other.to_string()),
                };
                json!({"id": format!("call_{i}"), "type": "function", "function": {"name": name, "arguments": arguments}})
            })
            .collect();
        Self::json(&completion(json!({"role": "assistant", "content": null, "tool_calls": calls}), "tool_calls"))
    }

    /// A streamed answer: each chunk as one `data:` event, then `[DONE]` if `done`.
    #[must_use]
    pub fn sse(chunks: &[Value], done: bool) -> Self {
        let mut body = String::new();
        for c in chunks {
            body.push_str(&format!("data: {c}\n\n"));
        }
        if done {
            body.push_str("data: [DONE]\n\n");
        }
        Self::raw(200, body.into_bytes()).header("content-type", "text/event-stream")
    }

    /// Sends the body, then stalls for `d` with the connection open and more bytes promised.
    #[must_use]
    pub fn stalled(mut self, d: Duration) -> Self {
        self.claimed_len = Some(self.body.len() + 1);
        self.stall = d;
        self
    }

    /// Adds a header.
    #[must_use]
    pub fn header(mut self, k: &str, v: &str) -> Self {
        self.headers.push((k.to_owned(), v.to_owned()));
        self
    }

    /// Waits before answering.
    #[must_use]
    pub fn delayed(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }

    /// Closes the connection without answering.
    #[must_use]
    pub fn hang_up() -> Self {
        Self { hang_up: true, ..Self::raw(0, Vec::new()) }
    }
}

/// A chat.completion body around one choice.
#[must_use]
pub fn completion(message: Value, finish_reason: &str) -> Value {
    json!({
        "id": "chatcmpl-mock", "object": "chat.completion", "created": 1, "model": "mock",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    })
}

/// A request the mock received.
#[derive(Debug, Clone)]
pub struct Received {
    /// `POST /v1/chat/completions`, as sent.
    pub request_line: String,
    /// Headers, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body, parsed (Null if it was not JSON).
    pub body: Value,
}

impl Received {
    /// A header's value.
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The request's tool messages, in order: (`tool_call_id`, content).
    ///
    /// # Panics
    /// If the body has no `messages` array, or a tool message lacks either field.
    #[must_use]
    #[allow(clippy::expect_used, reason = "a test fixture: a malformed request fails the test that reads it")]
    pub fn tool_messages(&self) -> Vec<(String, String)> {
        self.body["messages"]
            .as_array()
            .expect("a chat request has messages")
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| {
                let field = |k: &str| m[k].as_str().expect("a tool message's field").to_owned();
                (field("tool_call_id"), field("content"))
            })
            .collect()
    }
}

type Responder = dyn Fn(usize, &Received) -> Reply + Send + Sync;

/// The mock server. It stops when dropped.
pub struct MockLlm {
    addr: SocketAddr,
    tls: bool,
    received: Arc<Mutex<Vec<Received>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MockLlm {
    /// Plays `script` in order; after it, every request gets 500 "script exhausted".
    pub fn script(script: Vec<Reply>) -> io::Result<Self> {
        Self::start(move |n, _| script.get(n).cloned().unwrap_or_else(|| Reply::raw(500, b"script exhausted".to_vec())))
    }

    /// Answers request `n` (0-based) with `f(n, request)`.
    pub fn start(f: impl Fn(usize, &Received) -> Reply + Send + Sync + 'static) -> io::Result<Self> {
        Self::serve(f, None)
    }

    /// Plays `script` over TLS with [`TEST_CERT_PEM`], signed by [`TEST_CA_PEM`] (the URL is `https://127.0.0.1:PORT/v1`).
    pub fn script_tls(script: Vec<Reply>) -> io::Result<Self> {
        let config = tls_config()?;
        Self::serve(
            move |n, _| script.get(n).cloned().unwrap_or_else(|| Reply::raw(500, b"script exhausted".to_vec())),
            Some(config),
        )
    }

    fn serve(
        f: impl Fn(usize, &Received) -> Reply + Send + Sync + 'static,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> io::Result<Self> {
        let is_tls = tls.is_some();
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let received = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let rec = received.clone();
        let f: Arc<Responder> = Arc::new(f);
        let thread = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            rt.block_on(async move {
                let Ok(listener) = TcpListener::from_std(listener) else { return };
                let serve = async {
                    loop {
                        let Ok((stream, _)) = listener.accept().await else { continue };
                        // As real servers do: the head and the body go out as two writes,
                        // and Nagle would hold the body for the client's delayed ACK (40 ms)
                        // on a kept-alive connection.
                        let _ = stream.set_nodelay(true);
                        let (rec, f, tls) = (rec.clone(), f.clone(), tls.clone());
                        tokio::spawn(async move {
                            match tls {
                                None => {
                                    let _ = serve_conn(stream, rec, f).await;
                                }
                                Some(config) => {
                                    // A client that rejects the certificate ends here, before any request.
                                    if let Ok(tls) = tokio_rustls::TlsAcceptor::from(config).accept(stream).await {
                                        let _ = serve_conn(tls, rec, f).await;
                                    }
                                }
                            }
                        });
                    }
                };
                tokio::select! {
                    () = serve => {}
                    _ = stopped => {}
                }
            });
        });
        Ok(Self { addr, tls: is_tls, received, stop: Some(stop), thread: Some(thread) })
    }

    /// The base URL (`http://127.0.0.1:PORT/v1`).
    #[must_use]
    pub fn url(&self) -> String {
        format!("{}://{}/v1", if self.tls { "https" } else { "http" }, self.addr)
    }

    /// Every request so far.
    #[must_use]
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl Drop for MockLlm {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn tls_config() -> io::Result<Arc<rustls::ServerConfig>> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(TEST_CERT_PEM).collect::<Result<_, _>>().map_err(io::Error::other)?;
    let key = PrivateKeyDer::from_pem_slice(TEST_KEY_PEM).map_err(io::Error::other)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(io::Error::other)?;
    Ok(Arc::new(config))
}

async fn serve_conn<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    rec: Arc<Mutex<Vec<Received>>>,
    f: Arc<Responder>,
) -> io::Result<()> {
    let mut buf = Vec::new();
    loop {
        let head_end = loop {
            if let Some(i) = find(&buf, b"\r\n\r\n") {
                break i;
            }
            if buf.len() > MAX_REQUEST {
                return Ok(());
            }
            let mut chunk = [0u8; 8192];
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        let request_line = lines.next().unwrap_or_default().to_owned();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let len: usize =
            headers.iter().find(|(k, _)| k == "content-length").and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
        let body_start = head_end + 4;
        while buf.len() < body_start + len.min(MAX_REQUEST) {
            let mut chunk = [0u8; 65536];
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let body_end = body_start + len.min(MAX_REQUEST);
        let body = serde_json::from_slice(&buf[body_start..body_end]).unwrap_or(Value::Null);
        buf.drain(..body_end);
        let received = Received { request_line, headers, body };
        let n = {
            let Ok(mut r) = rec.lock() else { return Ok(()) };
            r.push(received.clone());
            r.len() - 1
        };
        let reply = f(n, &received);
        if !reply.delay.is_zero() {
            tokio::time::sleep(reply.delay).await;
        }
        if reply.hang_up {
            return Ok(());
        }
        let mut out = format!(
            "HTTP/1.1 {} Mock\r\ncontent-length: {}\r\n",
            reply.status,
            reply.claimed_len.unwrap_or(reply.body.len())
        );
        if !reply.headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("content-type")) {
            out.push_str("content-type: application/json\r\n");
        }
        for (k, v) in &reply.headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        out.push_str("\r\n");
        stream.write_all(out.as_bytes()).await?;
        stream.write_all(&reply.body).await?;
        stream.flush().await?;
        if !reply.stall.is_zero() {
            tokio::time::sleep(reply.stall).await;
        }
        if reply.claimed_len.is_some() {
            return Ok(());
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Waits until `f` holds, checking every 20 ms, and fails the test naming `what` if it does
/// not within `within`.
pub fn eventually(within: std::time::Duration, what: &str, f: impl Fn() -> bool) {
    let start = std::time::Instant::now();
    while !f() {
        assert!(start.elapsed() < within, "{what}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Whether `pid` is a live process on the host: in `/proc`, and not a zombie.
#[must_use]
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
}

/// Host pids (the host's view of `/proc`, never a guest's word) whose command line, its
/// arguments NUL-separated as the kernel stores them, satisfies `matches`; this process is
/// never among them.
#[must_use]
pub fn host_pids(matches: impl Fn(&[u8]) -> bool) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            matches(&cmd).then_some(pid)
        })
        .filter(|pid| *pid != std::process::id())
        .collect()
}

/// Scans the whole readable memory of process `pid` (its `/proc/PID/maps` and `mem`, as
/// the host sees them) for `needle`: the first mapping that holds it, and how many bytes
/// were scanned. A mapping that cannot be read (gone, `[vvar]`) is skipped.
#[must_use]
pub fn memory_holds(pid: u32, needle: &[u8]) -> (Option<String>, usize) {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else { return (None, 0) };
    let Ok(mut mem) = std::fs::File::open(format!("/proc/{pid}/mem")) else { return (None, 0) };
    let mut scanned = 0usize;
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else { continue };
        if !perms.starts_with('r') || line.ends_with("[vvar]") || line.ends_with("[vsyscall]") {
            continue;
        }
        let Some((lo, hi)) = range.split_once('-') else { continue };
        let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) else { continue };
        let Ok(len) = usize::try_from(hi - lo) else { continue };
        let mut buf = vec![0u8; len];
        if mem.seek(SeekFrom::Start(lo)).is_ok() && mem.read_exact(&mut buf).is_ok() {
            scanned += buf.len();
            if find(&buf, needle).is_some() {
                return (Some(line.to_owned()), scanned);
            }
        }
    }
    (None, scanned)
}

/// The parent of process `pid` as the host sees it (`PPid` in `/proc/PID/status`), if it
/// is still there.
#[must_use]
pub fn parent_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("PPid:"))?.trim().parse().ok()
}

/// Every live process on the host with its parent, `(pid, ppid)`, from `/proc`.
fn parents() -> Vec<(u32, u32)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, parent_of(pid)?)))
        .collect()
}

/// The live children of process `pid`, from the host's `/proc`, in pid order.
#[must_use]
pub fn children(pid: u32) -> Vec<u32> {
    let mut found: Vec<u32> = parents().into_iter().filter(|(_, pp)| *pp == pid).map(|(p, _)| p).collect();
    found.sort_unstable();
    found
}

/// Every live descendant of process `root`, from the host's `/proc` (each process's `PPid`),
/// parents before their children; `root` itself is not among them.
#[must_use]
pub fn descendants(root: u32) -> Vec<u32> {
    let parents = parents();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(parents.iter().filter(|(_, pp)| *pp == parent).map(|(pid, _)| *pid));
        i += 1;
    }
    found.remove(0);
    found
}

/// A tmpfs mounted for a test's life (a full-filesystem fault), unmounted on drop.
#[derive(Debug)]
pub struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs with `options` (e.g. `size=64k,mode=0755`) at `dir`. Mounting needs
    /// root: without it `test` is SKIPPED (`None`), or fails under `STOCKADE_REQUIRE_ALL`.
    #[must_use]
    pub fn mount(dir: &std::path::Path, options: &str, test: &str) -> Option<Self> {
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Some(Self(dir.to_path_buf()));
        }
        assert!(
            std::env::var_os("STOCKADE_REQUIRE_ALL").is_none(),
            "{test}: mounting a tmpfs at {} for the fault needs root",
            dir.display()
        );
        eprintln!("SKIPPED {test}: cannot mount a tmpfs (not root)");
        None
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// The TLS ClientHello builders, from the attack programs (which send them at the proxy
/// from inside a sandbox): one place for the bytes, dependency-free.
pub use stockade_attacks::net::{tls_client_hello, tls_sni_extension};

/// The mount points at or under `dir` (resolved, where it exists) in this process's mount
/// table (`/proc/self/mountinfo`, its fifth field), as the host sees them.
#[must_use]
pub fn mounts_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(std::path::PathBuf::from)
        .filter(|p| p.starts_with(&dir))
        .collect()
}
