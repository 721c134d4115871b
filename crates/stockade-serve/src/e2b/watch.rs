//! envd's directory watch over the files API's [`Watch`] (inotify on the sandbox's home, on
//! the host), in both of envd's forms:
//! - polled (`CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`; the sync SDKs'): each
//!   watcher has a task that waits for its inotify descriptor to be readable and reads it on
//!   the blocking pool, so a recursive watch adds a new directory as soon as it appears; a
//!   `GetWatcherEvents` reads once more before it answers, so what a call made before it is
//!   there;
//! - streamed (`WatchDir`; the async SDKs'): a start event once the watch is set, then each
//!   event as the kernel reports it, and a keepalive each `Keepalive-Ping-Interval` while
//!   nothing happens. A slow client holds the stream's task at its send, the kernel queues
//!   meanwhile, and a watch that falls behind ends the stream with an error: the server
//!   holds [`STREAM_QUEUE`] events, not the backlog. It ends at its `Connect-Timeout-Ms`
//!   (deadline exceeded), when the client goes, or with its sandbox (unavailable).
//!
//! Bounded: [`MAX_WATCHERS_PER_SANDBOX`] of either kind per sandbox, reserved before the
//! watch is made, and [`MAX_WATCHERS`] in all (an inotify instance each, under the owner's
//! per-user limit), each holding at most `MAX_EVENTS` events. Watchers end with their
//! sandbox. A docker sandbox's home is watched through its container's init
//! ([`Session::watch_files`](stockade_runtime::session::Session::watch_files)).

use stockade_protocol::e2b::{self as wire, Code, Codec, ConnectError};
use stockade_runtime::process::watch::{EventKind, Watch, WatchEvent};

#[allow(clippy::wildcard_imports, reason = "the server's own items")]
use super::*;

/// Most watchers one sandbox keeps.
pub(crate) const MAX_WATCHERS_PER_SANDBOX: usize = 4;

/// Most watchers the server keeps in all (each an inotify instance of the owner's user,
/// whose default limit is 128).
pub(crate) const MAX_WATCHERS: usize = 96;

/// One watcher: its watch, the guest path it watches, what ends it, and its places (in
/// its sandbox's and in the server's).
pub(crate) struct Watcher {
    watch: Arc<Mutex<Watch>>,
    base: String,
    include_entry: bool,
    ender: Ender,
    _places: Places,
}

/// What a dropped watcher ends: a polled one's reading task, aborted; a stream's task, which
/// sees its `stop` sender gone and ends the stream with an error.
enum Ender {
    Task(tokio::task::JoinHandle<()>),
    Stream(#[allow(dead_code, reason = "held to be dropped")] tokio::sync::oneshot::Sender<()>),
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if let Ender::Task(task) = &self.ender {
            task.abort();
        }
    }
}

/// A watcher's place among its sandbox's and among the server's, taken before its watch is
/// made.
struct Places(#[allow(dead_code, reason = "held")] [tokio::sync::OwnedSemaphorePermit; 2]);

/// A watch made for a request, not yet kept.
struct Made {
    watch: Arc<Mutex<Watch>>,
    fd: std::os::fd::OwnedFd,
    base: String,
    places: Places,
}

fn event_type(k: EventKind) -> &'static str {
    match k {
        EventKind::Create => "EVENT_TYPE_CREATE",
        EventKind::Write => "EVENT_TYPE_WRITE",
        EventKind::Remove => "EVENT_TYPE_REMOVE",
        EventKind::Rename => "EVENT_TYPE_RENAME",
        EventKind::Chmod => "EVENT_TYPE_CHMOD",
    }
}

/// Reads what the kernel queued into the watch, on the blocking pool.
async fn process(watch: &Arc<Mutex<Watch>>) -> Result<(), String> {
    let w = Arc::clone(watch);
    tokio::task::spawn_blocking(move || w.lock().unwrap_or_else(PoisonError::into_inner).process())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}

/// The watcher's task: reads the watch each time its descriptor is readable, until it
/// fails (then `GetWatcherEvents` says why) or the watcher is dropped.
async fn drive(watch: Arc<Mutex<Watch>>, fd: std::os::fd::OwnedFd) {
    let Ok(afd) = stockade_runtime::process::async_readable(fd) else { return };
    while read_more(&afd, &watch).await.is_ok() {}
}

/// Waits until the kernel has queued something for the watch, then reads it into the watch:
/// what both kinds of watcher do each time their descriptor wakes them.
async fn read_more(
    afd: &tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
    watch: &Arc<Mutex<Watch>>,
) -> Result<(), ConnectError> {
    let mut ready = afd
        .readable()
        .await
        .map_err(|_| ConnectError::new(Code::Internal, "the watch's descriptor could not be polled"))?;
    let done = process(watch).await;
    ready.clear_ready();
    done.map_err(|why| ConnectError::new(Code::ResourceExhausted, format!("the watch ended: {why}")))
}

impl E2bServer {
    /// `CreateWatcher`, `GetWatcherEvents` and `RemoveWatcher`.
    pub(crate) async fn watcher(&self, b: &Sandbox, msg: Message<'_>) -> Result<serde_json::Value, ConnectError> {
        match msg.method.path {
            "/filesystem.Filesystem/CreateWatcher" => {
                let r: wire::CreateWatcherRequest = msg.read()?;
                let id = self.create_watcher(b, &r).await?;
                Ok(serde_json::json!({ "watcherId": id }))
            }
            "/filesystem.Filesystem/GetWatcherEvents" => {
                let r: wire::WatcherRequest = msg.read()?;
                let events = self.watcher_events(b, &r.watcher_id).await?;
                Ok(serde_json::json!({ "events": events }))
            }
            _ => {
                let r: wire::WatcherRequest = msg.read()?;
                match b.watchers().remove(&r.watcher_id) {
                    Some(_) => Ok(serde_json::json!({})),
                    None => Err(ConnectError::new(Code::NotFound, format!("watcher {:?} not found", r.watcher_id))),
                }
            }
        }
    }

    /// A watch of `r.path` for `b`, its places taken first.
    async fn make_watch(&self, b: &Sandbox, r: &wire::CreateWatcherRequest) -> Result<Made, ConnectError> {
        let Ok(mine) = Arc::clone(&b.watch_places).try_acquire_owned() else {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!("a sandbox keeps at most {MAX_WATCHERS_PER_SANDBOX} watchers; remove one first"),
            ));
        };
        let Ok(server) = Arc::clone(&self.watch_slots).try_acquire_owned() else {
            return Err(ConnectError::new(Code::ResourceExhausted, "the server's watchers are all in use"));
        };
        let Some(files) = b.session.watch_files().await else {
            return Err(ConnectError::new(
                Code::Unavailable,
                "the sandbox's files cannot be watched from this host (its container is not running, or its engine is remote)",
            ));
        };
        let base = guest_path(&r.path);
        let (at, recursive) = (base.clone(), r.recursive);
        let made = tokio::task::spawn_blocking(move || files.watch(&at, recursive)).await;
        let watch = made.map_err(|e| ConnectError::new(Code::Internal, e.to_string()))?.map_err(|e| files_code(&e))?;
        let fd = watch.fd().try_clone_to_owned().map_err(|e| ConnectError::new(Code::Internal, e.to_string()))?;
        Ok(Made { watch: Arc::new(Mutex::new(watch)), fd, base, places: Places([mine, server]) })
    }

    async fn create_watcher(&self, b: &Sandbox, r: &wire::CreateWatcherRequest) -> Result<String, ConnectError> {
        let m = self.make_watch(b, r).await?;
        let task = tokio::spawn(drive(Arc::clone(&m.watch), m.fd));
        let id = random_id().map_err(|e| ConnectError::new(Code::Internal, e))?;
        let w = Watcher {
            watch: m.watch,
            base: m.base,
            include_entry: r.include_entry,
            ender: Ender::Task(task),
            _places: m.places,
        };
        b.watchers().insert(id.clone(), Arc::new(w));
        Ok(id)
    }

    async fn watcher_events(&self, b: &Sandbox, id: &str) -> Result<Vec<serde_json::Value>, ConnectError> {
        let Some(w) = b.watchers().get(id).cloned() else {
            return Err(ConnectError::new(Code::NotFound, format!("watcher {id:?} not found")));
        };
        if let Err(why) = process(&w.watch).await {
            b.watchers().remove(id);
            return Err(ConnectError::new(Code::ResourceExhausted, format!("the watcher ended: {why}")));
        }
        let events = w.watch.lock().unwrap_or_else(PoisonError::into_inner).take();
        let mut out = Vec::with_capacity(events.len());
        for ev in events {
            out.push(event_json(&b.session, &w.base, w.include_entry, ev).await);
        }
        Ok(out)
    }

    /// `WatchDir`: the watch is made (or refused) before the stream starts; then its task
    /// sends the start event and what follows ([`pump`]).
    pub(crate) async fn watch_stream(
        &self,
        b: &Arc<Sandbox>,
        msg: Message<'_>,
        call: Streamed,
    ) -> Result<Response<Body>, ConnectError> {
        let tick = call.tick();
        let Streamed { deadline, permit, .. } = call;
        let r: wire::CreateWatcherRequest = msg.read()?;
        let m = self.make_watch(b, &r).await?;
        let id = random_id().map_err(|e| ConnectError::new(Code::Internal, e))?;
        let (stop_tx, stop) = tokio::sync::oneshot::channel();
        let stream = Stream {
            sandbox: Arc::downgrade(b),
            session: Arc::clone(&b.session),
            id: id.clone(),
            watch: Arc::clone(&m.watch),
            base: m.base.clone(),
            include_entry: r.include_entry,
            until: deadline.map(|d| tokio::time::Instant::now() + d),
            tick,
        };
        let w = Watcher {
            watch: m.watch,
            base: m.base,
            include_entry: r.include_entry,
            ender: Ender::Stream(stop_tx),
            _places: m.places,
        };
        b.watchers().insert(id, Arc::new(w));
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(STREAM_QUEUE);
        tokio::spawn(pump(stream, m.fd, stop, tx, msg.codec, permit));
        Ok(stream_response(msg.codec, rx))
    }
}

/// One event as envd tells it, with its entry when asked for and still there.
async fn event_json(session: &Session, base: &str, include_entry: bool, ev: WatchEvent) -> serde_json::Value {
    let mut v = serde_json::json!({ "name": ev.name, "type": event_type(ev.kind) });
    if include_entry && !matches!(ev.kind, EventKind::Remove | EventKind::Rename) {
        let path = format!("{}/{}", base.trim_end_matches('/'), ev.name);
        if let Ok(e) = session.stat(&path).await {
            v["entry"] = serde_json::json!(entry_info(&e));
        }
    }
    v
}

/// What a streamed watch's task holds: never its sandbox (a weak reference, to leave its
/// place when the stream ends), so a killed sandbox's watchers are dropped and its streams
/// told.
struct Stream {
    sandbox: std::sync::Weak<Sandbox>,
    session: Arc<Session>,
    id: String,
    watch: Arc<Mutex<Watch>>,
    base: String,
    include_entry: bool,
    until: Option<tokio::time::Instant>,
    tick: Duration,
}

impl Drop for Stream {
    fn drop(&mut self) {
        // However the stream ended, its watcher leaves its sandbox (closing its inotify
        // instance once this task's share of the watch is gone too) and gives back its places.
        if let Some(b) = self.sandbox.upgrade() {
            b.watchers().remove(&self.id);
        }
    }
}

/// A streamed watch's task: the start event, then [`events`], until the client goes, the
/// deadline passes, the watch fails (it fell behind), or its sandbox ends. The deadline and
/// the sandbox's end are each one wait over everything, a send to a client that does not
/// read included; the last envelope is never waited for (a client that does not read then
/// sees its stream cut).
async fn pump(
    s: Stream,
    fd: std::os::fd::OwnedFd,
    stop: tokio::sync::oneshot::Receiver<()>,
    tx: tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
    codec: Codec,
    _permit: tokio::sync::OwnedSemaphorePermit,
) {
    let until = async {
        match s.until {
            Some(t) => tokio::time::sleep_until(t).await,
            None => std::future::pending().await,
        }
    };
    let ended = tokio::select! {
        e = events(&s, fd, &tx, codec) => e,
        () = until => Some(ConnectError::new(Code::DeadlineExceeded, "the watch's deadline passed")),
        _ = stop => Some(ConnectError::new(Code::Unavailable, "the sandbox ended")),
    };
    if let Some(e) = ended {
        let _ = tx.try_send(Ok(Bytes::from(wire::end_stream(Some(&e)))));
    }
}

/// The start event, then each event as it is read and a keepalive each `tick` while nothing
/// happens; `None` once the client has gone, or the error that ends the stream.
async fn events(
    s: &Stream,
    fd: std::os::fd::OwnedFd,
    tx: &tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
    codec: Codec,
) -> Option<ConnectError> {
    let send = |v: serde_json::Value| async move {
        match codec.encode(&v, &wire::proto::WATCH_DIR_RESPONSE) {
            Ok(b) => tx.send(Ok(Bytes::from(wire::envelope(0, &b)))).await.is_ok().then_some(()).ok_or(None),
            Err(e) => Err(Some(e)),
        }
    };
    let Ok(afd) = stockade_runtime::process::async_readable(fd) else {
        return Some(ConnectError::new(Code::Internal, "the watch's descriptor could not be polled"));
    };
    if let Err(e) = send(serde_json::json!({ "start": {} })).await {
        return e;
    }
    loop {
        tokio::select! {
            read = read_more(&afd, &s.watch) => {
                if let Err(e) = read {
                    return Some(e);
                }
                let events = s.watch.lock().unwrap_or_else(PoisonError::into_inner).take();
                for ev in events {
                    let v = event_json(&s.session, &s.base, s.include_entry, ev).await;
                    if let Err(e) = send(serde_json::json!({ "filesystem": v })).await {
                        return e;
                    }
                }
            }
            () = tokio::time::sleep(s.tick) => {
                if let Err(e) = send(serde_json::json!({ "keepalive": {} })).await {
                    return e;
                }
            }
            () = tx.closed() => return None,
        }
    }
}

/// 16 random bytes as hex.
fn random_id() -> Result<String, String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness for a watcher id: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
