//! envd's polled directory watch (`CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`) over
//! the files API's [`Watch`] (inotify on the sandbox's home, on the host). Each watcher has
//! a task that waits for its inotify descriptor to be readable and reads it on the blocking
//! pool, so a recursive watch adds a new directory as soon as it appears; a
//! `GetWatcherEvents` reads once more before it answers, so what a call made before it is
//! there. Bounded: [`MAX_WATCHERS_PER_SANDBOX`] per sandbox and [`MAX_WATCHERS`] in all (an
//! inotify instance each, under the owner's per-user limit), each holding at most
//! `MAX_EVENTS` events; a watcher that falls behind ends with an error. Watchers end with
//! their sandbox. The docker tier has none (its files are in its container).

use stockade_protocol::e2b::{self as wire, Code, ConnectError};
use stockade_runtime::process::watch::{EventKind, Watch};

#[allow(clippy::wildcard_imports, reason = "the server's own items")]
use super::*;

/// Most watchers one sandbox keeps.
pub(crate) const MAX_WATCHERS_PER_SANDBOX: usize = 4;

/// Most watchers the server keeps in all (each an inotify instance of the owner's user,
/// whose default limit is 128).
pub(crate) const MAX_WATCHERS: usize = 96;

/// One watcher: its watch, the guest path it watches, and the task that reads it.
pub(crate) struct Watcher {
    watch: Arc<Mutex<Watch>>,
    base: String,
    include_entry: bool,
    task: tokio::task::JoinHandle<()>,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
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
    loop {
        let Ok(mut ready) = afd.readable().await else { return };
        let done = process(&watch).await;
        ready.clear_ready();
        if done.is_err() {
            return;
        }
    }
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

    async fn create_watcher(&self, b: &Sandbox, r: &wire::CreateWatcherRequest) -> Result<String, ConnectError> {
        let Some(files) = b.session.files().cloned() else {
            return Err(ConnectError::new(
                Code::Unimplemented,
                "a directory watch is offered for process-tier sandboxes (a docker sandbox's files are in its container)",
            ));
        };
        if b.watchers().len() >= MAX_WATCHERS_PER_SANDBOX {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!("a sandbox keeps at most {MAX_WATCHERS_PER_SANDBOX} watchers; remove one first"),
            ));
        }
        let Ok(slot) = Arc::clone(&self.watch_slots).try_acquire_owned() else {
            return Err(ConnectError::new(Code::ResourceExhausted, "the server's watchers are all in use"));
        };
        let base = guest_path(&r.path);
        let (at, recursive) = (base.clone(), r.recursive);
        let made = tokio::task::spawn_blocking(move || files.watch(&at, recursive)).await;
        let watch = made.map_err(|e| ConnectError::new(Code::Internal, e.to_string()))?.map_err(|e| files_code(&e))?;
        let fd = watch.fd().try_clone_to_owned().map_err(|e| ConnectError::new(Code::Internal, e.to_string()))?;
        let watch = Arc::new(Mutex::new(watch));
        let task = tokio::spawn(drive(Arc::clone(&watch), fd));
        let id = random_id().map_err(|e| ConnectError::new(Code::Internal, e))?;
        let w = Watcher { watch, base, include_entry: r.include_entry, task, _slot: slot };
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
            let mut v = serde_json::json!({ "name": ev.name, "type": event_type(ev.kind) });
            if w.include_entry && !matches!(ev.kind, EventKind::Remove | EventKind::Rename) {
                let path = format!("{}/{}", w.base.trim_end_matches('/'), ev.name);
                if let Ok(e) = b.session.stat(&path).await {
                    v["entry"] = serde_json::json!(entry_info(&e));
                }
            }
            out.push(v);
        }
        Ok(out)
    }
}

/// 16 random bytes as hex.
fn random_id() -> Result<String, String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness for a watcher id: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
