//! E2B's control plane: create, list, get, kill, timeout, pause and resume, connect, and
//! filesystem snapshots, authenticated by the API key.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use hyper::{Request, Response, StatusCode};
use stockade_protocol::e2b::{self as wire};
use stockade_runtime::protocol::RunError;
use stockade_runtime::session::SessionProfile;

#[allow(clippy::wildcard_imports, reason = "the server's own items")]
use super::*;

/// One filesystem snapshot: its archive, the template it is made on, and who it came from.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Snapshot {
    id: String,
    names: Vec<String>,
    template: String,
    sandbox: String,
    made: u64,
}

/// A snapshot's name: 1 to 64 letters, digits, `-`, `_` or `.`.
pub(crate) fn snapshot_name(name: &str) -> Result<(), String> {
    let ok = (1..=64).contains(&name.len()) && name.bytes().all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(&c));
    if ok { Ok(()) } else { Err(format!("snapshot name {name:?}: 1 to 64 letters, digits, '-', '_' or '.'")) }
}

/// The snapshots a server's directory holds: each record whose archive is beside it (the
/// directory is made, and kept 0700, first). What cannot be read is skipped.
pub(crate) fn load_snapshots(dir: &Path) -> Vec<Snapshot> {
    use std::os::unix::fs::PermissionsExt;
    if std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)))
        .is_err()
    {
        return Vec::new();
    }
    let mut out: Vec<Snapshot> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| {
            let text = std::fs::read(e.path()).ok().filter(|t| t.len() <= wire::MAX_API_BYTES)?;
            let s: Snapshot = serde_json::from_slice(&text).ok()?;
            let stem_ok = e.path().file_stem().is_some_and(|f| *f == *s.id);
            (stem_ok && dir.join(format!("{}.tar", s.id)).is_file()).then_some(s)
        })
        .collect();
    out.sort_by(|a, b| (a.made, &a.id).cmp(&(b.made, &b.id)));
    out
}

/// Writes a snapshot's record beside its archive (a new file, mode 0600).
pub(crate) fn save_snapshot(dir: &Path, s: &Snapshot) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dir.join(format!("{}.json", s.id)))?;
    f.write_all(&serde_json::to_vec(s).map_err(std::io::Error::other)?)
}

impl E2bServer {
    pub(crate) fn detail(&self, id: &str, b: &Sandbox) -> wire::SandboxDetail {
        wire::SandboxDetail {
            template_id: b.template.clone(),
            sandbox_id: id.to_owned(),
            client_id: "stockade".into(),
            started_at: wire::rfc3339(secs(b.started)),
            end_at: wire::rfc3339(secs(b.end().1)),
            cpu_count: 1,
            memory_mb: b.memory_mb,
            disk_size_mb: b.disk_mb,
            state: if b.session.paused() { "paused".into() } else { "running".into() },
            envd_version: wire::ENVD_VERSION.into(),
            metadata: b.metadata.clone(),
        }
    }

    pub(crate) fn created(&self, id: &str, b: &Sandbox) -> wire::SandboxCreated {
        wire::SandboxCreated {
            template_id: b.template.clone(),
            sandbox_id: id.to_owned(),
            client_id: "stockade".into(),
            envd_version: wire::ENVD_VERSION.into(),
            envd_access_token: b.token.clone(),
            traffic_access_token: b.traffic.clone(),
        }
    }

    pub(crate) fn list(&self, req: &Request<hyper::body::Incoming>) -> Response<Body> {
        let q = query(req);
        let states: Option<Vec<String>> = q.get("state").map(|s| s.split(',').map(str::to_owned).collect());
        let wanted: Vec<(String, String)> =
            q.get("metadata").map(|m| form_urlencoded::parse(m.as_bytes()).into_owned().collect()).unwrap_or_default();
        let all: Vec<(String, Arc<Sandbox>)> = self.boxes().iter().map(|(k, v)| (k.clone(), Arc::clone(v))).collect();
        let out: Vec<(String, wire::SandboxDetail)> = all
            .iter()
            .map(|(id, b)| (page_key(b.started, id), self.detail(id, b)))
            .filter(|(_, d)| states.as_ref().is_none_or(|s| s.contains(&d.state)))
            .filter(|(_, d)| wanted.iter().all(|(k, v)| d.metadata.get(k) == Some(v)))
            .collect();
        page(&q, out)
    }

    /// `POST /sandboxes/{id}/snapshots`: a filesystem-only snapshot of the sandbox's home,
    /// kept under [`E2bConfig::snapshots`] until deleted; `Sandbox.create(snapshot_id)` (or
    /// its name) makes a sandbox of the same template whose home starts as this one's is now.
    pub(crate) async fn snapshot(&self, id: &str, req: Request<hyper::body::Incoming>) -> Response<Body> {
        let (b, r) = match self.sandbox_request::<wire::SnapshotRequest>(id, req).await {
            Ok(x) => x,
            Err(response) => return response,
        };
        if r.memory != Some(false) {
            return api_error(
                StatusCode::BAD_REQUEST,
                "a full snapshot (memory and running processes): stockade takes filesystem-only snapshots; pass mode=\"filesystem\"",
            );
        }
        let Some(dir) = self.config.snapshots.clone() else {
            return api_error(
                StatusCode::NOT_IMPLEMENTED,
                "this server keeps no snapshots (it has no snapshot directory)",
            );
        };
        if let Some(name) = &r.name {
            if let Err(e) = snapshot_name(name) {
                return api_error(StatusCode::BAD_REQUEST, &e);
            }
            if self.config.templates.contains_key(name) {
                return api_error(StatusCode::CONFLICT, &format!("snapshot name {name:?}: a template has that name"));
            }
        }
        if self.snapshots().len() >= self.config.limits.max_snapshots {
            return api_error(
                StatusCode::TOO_MANY_REQUESTS,
                &format!("{} snapshots are kept, the most this server keeps", self.config.limits.max_snapshots),
            );
        }
        let mut raw = [0u8; 8];
        if getrandom::fill(&mut raw).is_err() {
            return api_error(StatusCode::INTERNAL_SERVER_ERROR, "no randomness for the snapshot's id");
        }
        let snap = Snapshot {
            id: format!("snapshot-{}", raw.iter().map(|b| format!("{b:02x}")).collect::<String>()),
            names: r.name.into_iter().collect(),
            template: b.template.clone(),
            sandbox: id.to_owned(),
            made: u64::try_from(secs(SystemTime::now())).unwrap_or(0),
        };
        let archive = dir.join(format!("{}.tar", snap.id));
        if let Err(e) = b.session.snapshot(&archive).await {
            let _ = std::fs::remove_file(&archive);
            return api_error(StatusCode::INTERNAL_SERVER_ERROR, &format!("snapshot of sandbox {id}: {e}"));
        }
        if let Err(e) = save_snapshot(&dir, &snap) {
            let _ = std::fs::remove_file(&archive);
            return api_error(StatusCode::INTERNAL_SERVER_ERROR, &format!("recording snapshot {}: {e}", snap.id));
        }
        let out = wire::SnapshotInfo { snapshot_id: snap.id.clone(), names: snap.names.clone() };
        self.snapshots().push(snap);
        json(StatusCode::CREATED, &out)
    }

    /// `GET /snapshots`: the snapshots kept, oldest first, by source sandbox (`sandboxID`)
    /// or `name` if asked, a page at a time.
    pub(crate) fn list_snapshots(&self, req: &Request<hyper::body::Incoming>) -> Response<Body> {
        let q = query(req);
        let out: Vec<(String, wire::SnapshotInfo)> = self
            .snapshots()
            .iter()
            .filter(|s| q.get("sandboxID").is_none_or(|id| *id == s.sandbox))
            .filter(|s| q.get("name").is_none_or(|n| s.names.contains(n)))
            .map(|s| {
                let key = page_key(SystemTime::UNIX_EPOCH + Duration::from_secs(s.made), &s.id);
                (key, wire::SnapshotInfo { snapshot_id: s.id.clone(), names: s.names.clone() })
            })
            .collect();
        page(&q, out)
    }

    /// `DELETE /templates/{id}`: a snapshot, its archive and its record.
    pub(crate) fn delete_snapshot(&self, id: &str) -> Response<Body> {
        if self.config.templates.contains_key(id) {
            return api_error(
                StatusCode::BAD_REQUEST,
                &format!("template {id:?} is this server's configuration (--config), not a snapshot"),
            );
        }
        let removed = {
            let mut all = self.snapshots();
            all.iter().position(|s| s.id == id).map(|i| all.remove(i))
        };
        match (removed, &self.config.snapshots) {
            (Some(s), Some(dir)) => {
                let _ = std::fs::remove_file(dir.join(format!("{}.tar", s.id)));
                let _ = std::fs::remove_file(dir.join(format!("{}.json", s.id)));
                no_content()
            }
            _ => api_error(StatusCode::NOT_FOUND, &format!("snapshot {id} not found")),
        }
    }

    /// A template by name, or a snapshot by id or name (the newest of that name): the
    /// template's name and the archive a new home starts from.
    pub(crate) fn resolve_template(&self, name: &str) -> Option<(String, Option<PathBuf>)> {
        if self.config.templates.contains_key(name) {
            return Some((name.to_owned(), None));
        }
        let dir = self.config.snapshots.as_ref()?;
        let all = self.snapshots();
        let s = all
            .iter()
            .find(|s| s.id == name)
            .or_else(|| all.iter().rev().find(|s| s.names.iter().any(|n| n == name)))?;
        Some((s.template.clone(), Some(dir.join(format!("{}.tar", s.id)))))
    }

    pub(crate) async fn create(self: &Arc<Self>, req: Request<hyper::body::Incoming>) -> Response<Body> {
        let body = match read_body(req.into_body(), wire::MAX_API_BYTES).await {
            Ok(b) => b,
            Err(e) => return api_error(StatusCode::BAD_REQUEST, &e),
        };
        let new: wire::NewSandbox = match wire::parse_api(&body) {
            Ok(n) => n,
            Err(e) => return api_error(StatusCode::BAD_REQUEST, &format!("the sandbox request: {e}")),
        };
        let resolved = self.resolve_template(&new.template_id);
        let Some((template_name, template, from_snapshot)) =
            resolved.and_then(|(n, from)| self.config.templates.get(&n).map(|t| (n, t, from)))
        else {
            let names: Vec<&str> = self.config.templates.keys().map(String::as_str).collect();
            return api_error(
                StatusCode::NOT_FOUND,
                &format!(
                    "template {:?} not found (this server has: {}, and the snapshots GET /snapshots lists)",
                    new.template_id,
                    names.join(", ")
                ),
            );
        };
        let refused = |what: &str| api_error(StatusCode::BAD_REQUEST, &format!("{what}: stockade does not offer it"));
        // Auto-pause is the freezer at the timeout, with memory kept; a filesystem-only one
        // (its processes dropped and the sandbox cold-booted on resume) is not offered.
        if new.auto_pause == Some(true) && new.auto_pause_memory == Some(false) {
            return refused("autoPauseMemory false (a filesystem-only pause)");
        }
        let auto_resume = match &new.auto_resume {
            None => false,
            Some(v) => match v.get("enabled").and_then(serde_json::Value::as_bool) {
                Some(on) if v.as_object().is_some_and(|o| o.len() == 1) => on,
                _ => return api_error(StatusCode::BAD_REQUEST, "autoResume: expected {\"enabled\": true|false}"),
            },
        };
        // The SDK starts an MCP gateway as root in the sandbox once it is made; a stockade
        // sandbox has no root, so the create is refused before any sandbox exists.
        if new.mcp.as_ref().is_some_and(|v| !v.is_null()) {
            return refused("mcp (its gateway runs as root, which a stockade sandbox has not)");
        }
        if new.iam.is_some() {
            return refused("iam");
        }
        if new.volume_mounts.as_ref().is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty())) {
            return refused("volumeMounts");
        }
        let timeout = new.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS);
        if timeout == 0 || Duration::from_secs(timeout) > template.max_timeout {
            return api_error(
                StatusCode::BAD_REQUEST,
                &format!("timeout {timeout}s: must be 1 to {}s for this template", template.max_timeout.as_secs()),
            );
        }
        // The place is reserved before any work, and kept by the sandbox, or given back
        // (dropped) on any failure below.
        let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() else {
            return api_error(
                StatusCode::TOO_MANY_REQUESTS,
                &format!("{} sandboxes are live, the most this server keeps", self.config.limits.max_sandboxes),
            );
        };
        let (grant, scope) = match net_grant(template, &new) {
            Ok(Some((g, s))) => (Some(g), Some(s)),
            Ok(None) => (None, None),
            Err(e) => return api_error(StatusCode::BAD_REQUEST, &e),
        };
        let mask_host = new.network.as_ref().and_then(|n| n.mask_request_host.clone());
        let mut env = template.env.clone();
        env.extend(new.env_vars.iter().map(|(k, v)| (k.clone(), v.clone())));
        let profile = SessionProfile {
            tier: template.tier.clone(),
            limits: template.limits,
            // The sandbox's own timeout ends it (the reaper); these are the template's cap.
            idle_timeout: template.max_timeout,
            max_lifetime: template.max_timeout,
            grants: grant.map(|g| Arc::new(stockade_runtime::Grants::new().net(g))),
            env,
            from_snapshot,
            home_bytes: Some(template.disk),
            ..SessionProfile::default()
        };
        let session = match self.sessions.create(profile).await {
            Ok(s) => s,
            Err(e) => {
                let status = match e {
                    RunError::Busy(_) => StatusCode::TOO_MANY_REQUESTS,
                    RunError::Unsupported { .. } | RunError::Misconfigured(_) => StatusCode::BAD_REQUEST,
                    _ => StatusCode::INTERNAL_SERVER_ERROR,
                };
                return api_error(status, &format!("creating the sandbox: {e}"));
            }
        };
        let id = session.id().to_owned();
        let (mut token, mut traffic) = ([0u8; 32], [0u8; 32]);
        if getrandom::fill(&mut token).and_then(|()| getrandom::fill(&mut traffic)).is_err() {
            let _ = self.sessions.kill(&id).await;
            return api_error(StatusCode::INTERNAL_SERVER_ERROR, "no randomness for the access tokens");
        }
        let now = (Instant::now(), SystemTime::now());
        let b = Arc::new(Sandbox {
            session,
            token: token.iter().map(|b| format!("{b:02x}")).collect(),
            traffic: traffic.iter().map(|b| format!("{b:02x}")).collect(),
            template: template_name,
            metadata: new.metadata,
            env: new.env_vars,
            started: now.1,
            memory_mb: template.limits.memory_bytes() >> 20,
            disk_mb: template.disk >> 20,
            end: Mutex::new(now),
            auto_pause: new.auto_pause == Some(true),
            auto_resume,
            made: now.0,
            metrics: Mutex::default(),
            watchers: Mutex::default(),
            watch_places: Arc::new(tokio::sync::Semaphore::new(watch::MAX_WATCHERS_PER_SANDBOX)),
            scope,
            mask_host,
            _slot: slot,
        });
        if template.code_interpreter
            && let Err(e) = code_interpreter::start(&b.session).await
        {
            drop(b);
            let _ = self.sessions.kill(&id).await;
            return api_error(StatusCode::INTERNAL_SERVER_ERROR, &format!("the sandbox's code interpreter: {e}"));
        }
        b.set_timeout(timeout);
        let out = self.created(&id, &b);
        self.boxes().insert(id, b);
        json(StatusCode::CREATED, &out)
    }

    /// `PUT /sandboxes/{id}/network`: the sandbox's egress lists, replaced all at once, for
    /// every connection decided after (one already open goes on). They narrow its
    /// template's grant, as at create; a sandbox whose template grants no network can be
    /// given none.
    pub(crate) async fn update_network(&self, id: &str, req: Request<hyper::body::Incoming>) -> Response<Body> {
        let (b, mut update) = match self.sandbox_request::<wire::NetworkUpdate>(id, req).await {
            Ok(x) => x,
            Err(response) => return response,
        };
        // An empty `rules` asks for no header rule, which changes nothing here.
        let empty = |r: &serde_json::Value| r.is_null() || r.as_object().is_some_and(serde_json::Map::is_empty);
        if update.other.remove("rules").is_some_and(|r| !empty(&r)) {
            let why = "network.rules: a sandbox's header rules are set when it is made (its proxy's certificate authority is constrained to their hosts then)";
            return api_error(StatusCode::BAD_REQUEST, why);
        }
        if let Some(k) = update.other.keys().next() {
            return api_error(StatusCode::BAD_REQUEST, &format!("network.{k}: stockade does not offer it"));
        }
        let rules = match scope_rules(&update.allow_out, &update.deny_out, update.allow_internet_access) {
            Ok(r) => r,
            Err(e) => return api_error(StatusCode::BAD_REQUEST, &e),
        };
        match (&b.scope, update.allow_out.first()) {
            (Some(scope), _) => scope.set(rules),
            (None, Some(h)) => {
                return api_error(
                    StatusCode::BAD_REQUEST,
                    &format!("network.allowOut {h:?}: sandbox {id}'s template grants no network"),
                );
            }
            (None, None) => {}
        }
        no_content()
    }

    /// A control-plane call on one sandbox: the sandbox, and its body (empty: the default).
    pub(crate) async fn sandbox_request<T: serde::de::DeserializeOwned + Default>(
        &self,
        id: &str,
        req: Request<hyper::body::Incoming>,
    ) -> Result<(Arc<Sandbox>, T), Response<Body>> {
        let Some(b) = self.sandbox(id) else {
            return Err(api_error(StatusCode::NOT_FOUND, &format!("sandbox {id} not found")));
        };
        let body = read_body(req.into_body(), wire::MAX_API_BYTES)
            .await
            .map_err(|e| api_error(StatusCode::BAD_REQUEST, &e))?;
        if body.is_empty() {
            return Ok((b, T::default()));
        }
        let t = wire::parse_api(&body).map_err(|e| api_error(StatusCode::BAD_REQUEST, &format!("the request: {e}")))?;
        Ok((b, t))
    }

    pub(crate) async fn lifecycle(&self, id: &str, op: &str, req: Request<hyper::body::Incoming>) -> Response<Body> {
        let (b, t) = match self.sandbox_request::<wire::TimeoutRequest>(id, req).await {
            Ok(x) => x,
            Err(response) => return response,
        };
        let max = self.config.templates.get(&b.template).map_or(Duration::from_secs(3600), |t| t.max_timeout);
        // 0 ends it now (`set_timeout(0)`), for the timeout calls only.
        if let Some(s) = t.timeout
            && ((s == 0 && !matches!(op, "timeout" | "refreshes")) || Duration::from_secs(s) > max)
        {
            return api_error(StatusCode::BAD_REQUEST, &format!("timeout {s}s: must be 1 to {}s", max.as_secs()));
        }
        match op {
            "timeout" | "refreshes" => {
                if let Some(s) = t.timeout {
                    b.set_timeout(s);
                }
                no_content()
            }
            "pause" => {
                if b.session.paused() {
                    return api_error(StatusCode::CONFLICT, &format!("sandbox {id} is already paused"));
                }
                match b.session.pause().await {
                    Ok(()) => no_content(),
                    Err(e) => api_error(StatusCode::INTERNAL_SERVER_ERROR, &format!("pausing sandbox {id}: {e}")),
                }
            }
            _ => {
                let was_paused = b.session.paused();
                if was_paused && let Err(e) = b.session.resume().await {
                    return api_error(StatusCode::INTERNAL_SERVER_ERROR, &format!("resuming sandbox {id}: {e}"));
                }
                // A resumed sandbox gets the timeout (or the default, if its time had run
                // out while paused); a running one's is only ever extended by a connect,
                // never shortened (E2B's).
                match (t.timeout, was_paused) {
                    (Some(s), true) => b.set_timeout(s),
                    (None, true) => b.extend_timeout(DEFAULT_TIMEOUT_SECS),
                    (Some(s), false) => b.extend_timeout(s),
                    (None, false) => {}
                }
                let status = if was_paused { StatusCode::CREATED } else { StatusCode::OK };
                json(status, &self.created(id, &b))
            }
        }
    }
}
