//! envd's filesystem: the `filesystem.Filesystem` Connect service and `/files` downloads and
//! uploads (streamed through bounded pipes, or held whole under [`MAX_TRANSFERS`]).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::header::{CONTENT_TYPE, HeaderMap};
use hyper::{Method, Request, Response, StatusCode};
use stockade_protocol::e2b::{self as wire, Code, ConnectError};
use stockade_runtime::session::{FilesError, Kind, Metadata, Session};

#[allow(clippy::wildcard_imports, reason = "the server's own items")]
use super::*;

/// A files error as a Connect error.
pub(crate) fn files_code(e: &FilesError) -> ConnectError {
    let code = match e {
        FilesError::NotFound(_) => Code::NotFound,
        FilesError::Invalid { .. } => Code::InvalidArgument,
        FilesError::Denied { .. } => Code::PermissionDenied,
        FilesError::TooLarge { .. } => Code::ResourceExhausted,
        FilesError::Io { source, .. } if source.kind() == std::io::ErrorKind::AlreadyExists => Code::AlreadyExists,
        FilesError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotADirectory => Code::InvalidArgument,
        _ => Code::Internal,
    };
    ConnectError::new(code, e.to_string())
}

/// The guest's path for a request's: relative paths are under the home, `~` is the home.
pub(crate) fn guest_path(p: &str) -> String {
    if p.is_empty() || p == "~" {
        HOME.to_owned()
    } else if let Some(rest) = p.strip_prefix("~/") {
        format!("{HOME}/{rest}")
    } else if p.starts_with('/') {
        p.to_owned()
    } else {
        format!("{HOME}/{p}")
    }
}

/// The user a request names (`Authorization: Basic base64(user:)` or `?username=`): only
/// the sandbox's one user is accepted.
pub(crate) fn check_user(name: Option<&str>) -> Result<(), ConnectError> {
    match name {
        None | Some("" | USER) => Ok(()),
        Some(other) => Err(ConnectError::new(
            Code::InvalidArgument,
            format!("user {other:?}: a stockade sandbox runs everything as its one unprivileged user ({USER:?})"),
        )),
    }
}

pub(crate) fn basic_user(h: &HeaderMap) -> Option<String> {
    let v = header(h, "authorization")?.strip_prefix("Basic ")?;
    let raw = base64::engine::general_purpose::STANDARD.decode(v.trim()).ok()?;
    let text = String::from_utf8(raw).ok()?;
    Some(text.split_once(':').map_or(text.clone(), |(u, _)| u.to_owned()))
}

/// A `/files` call's refusal: the files API's error with its Connect code's HTTP status.
pub(crate) fn files_error(e: &FilesError) -> Response<Body> {
    let c = files_code(e);
    api_error(StatusCode::from_u16(c.code.http_status()).unwrap_or(StatusCode::BAD_REQUEST), &c.message)
}

/// A `/files` call that found no transfer slot within [`TRANSFER_WAIT`].
pub(crate) fn transfers_busy() -> Response<Body> {
    api_error(StatusCode::TOO_MANY_REQUESTS, "too many file transfers are in flight; try again")
}

/// `/files`' answer for one file written.
pub(crate) fn written(path: &str, metadata: &Metadata) -> serde_json::Value {
    let name = path.rsplit('/').next().unwrap_or_default();
    let mut v = serde_json::json!({ "name": name, "type": "file", "path": path });
    if !metadata.is_empty() {
        v["metadata"] = serde_json::json!(metadata);
    }
    v
}

/// An upload's metadata: its `X-Metadata-KEY: VALUE` headers, each key an HTTP token
/// (lowercased, as envd keeps it) and each value printable ASCII, as E2B's SDKs send them.
pub(crate) fn upload_metadata(h: &HeaderMap) -> Result<Metadata, String> {
    let mut out = Metadata::new();
    for (name, value) in h {
        let Some(key) = name.as_str().strip_prefix("x-metadata-") else { continue };
        let token = |c: u8| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c);
        if key.is_empty() || !key.bytes().all(token) {
            return Err(format!("metadata key {key:?}: not an HTTP token"));
        }
        let v = value.to_str().ok().filter(|v| v.bytes().all(|c| (0x20..=0x7e).contains(&c)));
        let Some(v) = v else { return Err(format!("metadata value of {key:?}: not printable ASCII")) };
        if out.insert(key.to_owned(), v.to_owned()).is_some() {
            return Err(format!("metadata key {key:?} given twice"));
        }
    }
    Ok(out)
}

/// An upload's `Content-Encoding`: `true` for gzip, `false` for none or `identity`; any
/// other is refused.
pub(crate) fn upload_gzip(h: &HeaderMap) -> Result<bool, String> {
    match header(h, "content-encoding").map(str::trim) {
        None | Some("") => Ok(false),
        Some(e) if e.eq_ignore_ascii_case("identity") => Ok(false),
        Some(e) if e.eq_ignore_ascii_case("gzip") => Ok(true),
        Some(other) => Err(format!("content encoding {other:?}: only gzip and identity are accepted")),
    }
}

/// A gzip body read whole, inflated to at most `max` bytes: a body that inflates past it
/// (a decompression bomb) is refused once `max + 1` bytes have come out, never held whole.
pub(crate) fn gunzip_within(body: &[u8], max: u64, path: &str) -> Result<Bytes, FilesError> {
    use std::io::Read as _;
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(body)
        .take(max.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| gzip_error(path, &e))?;
    if out.len() as u64 > max {
        return Err(FilesError::TooLarge { path: path.to_owned(), limit: max });
    }
    Ok(Bytes::from(out))
}

fn gzip_error(path: &str, e: &std::io::Error) -> FilesError {
    FilesError::Invalid { path: path.to_owned(), why: format!("the gzip body: {e}") }
}

/// Most streamed `/files` transfers at once (each holds at most four 64 KiB pieces, and an
/// upload a blocking thread, for at most 10 minutes); more wait for one to end.
pub const MAX_STREAMED: usize = 64;

/// How long a transfer waits for a slot before it is refused (429).
pub(crate) const TRANSFER_WAIT: Duration = Duration::from_secs(60);

/// How many pieces of a streamed transfer wait between the network and the disk.
pub(crate) const PIPE_PIECES: usize = 4;

/// Most bytes one piece of a streamed download holds.
pub(crate) const PIPE_PIECE_BYTES: usize = 64 << 10;

/// A download of an open file, `len` bytes long, streamed through a bounded channel: each
/// piece is read on a blocking thread and handed on asynchronously, so a slow client holds
/// at most [`PIPE_PIECES`] pieces in memory and no thread while it waits, and the whole
/// transfer must end within [`TRANSFER_WITHIN`]. A file the guest shortened meanwhile, or a
/// transfer past its time, ends the response early with an error (the connection is closed,
/// so the client sees a short body against its `Content-Length`). `permit` is held until
/// the transfer ends.
pub(crate) fn stream_file(file: std::fs::File, len: u64, permit: tokio::sync::OwnedSemaphorePermit) -> Response<Body> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(PIPE_PIECES);
    tokio::spawn(async move {
        let _permit = permit;
        let until = tokio::time::Instant::now() + TRANSFER_WITHIN;
        let mut src = Some(file);
        let mut left = len;
        while left > 0 {
            let want = PIPE_PIECE_BYTES.min(usize::try_from(left).unwrap_or(PIPE_PIECE_BYTES));
            let Some(mut f) = src.take() else { return };
            let read = tokio::task::spawn_blocking(move || {
                use std::io::Read as _;
                let mut buf = vec![0u8; want];
                let n = f.read(&mut buf);
                (f, n.map(|n| Bytes::from(buf).slice(..n)))
            })
            .await;
            let piece = match read {
                Ok((f, Ok(b))) if !b.is_empty() => {
                    src = Some(f);
                    left -= b.len() as u64;
                    Ok(b)
                }
                Ok((_, Ok(_))) => Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the file shrank")),
                Ok((_, Err(e))) => Err(e),
                Err(e) => Err(std::io::Error::other(e)),
            };
            let failed = piece.is_err();
            match tokio::time::timeout_at(until, tx.send(piece)).await {
                Ok(Ok(())) if !failed => {}
                Ok(_) => return,
                Err(_) => {
                    let late = std::io::Error::new(std::io::ErrorKind::TimedOut, "the download's time passed");
                    let _ = tx.try_send(Err(late));
                    return;
                }
            }
        }
    });
    let mut r = Response::new(PipeBody(rx).boxed());
    r.headers_mut().insert(CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/octet-stream"));
    r.headers_mut().insert(hyper::header::CONTENT_LENGTH, hyper::header::HeaderValue::from(len));
    r
}

/// An `application/octet-stream` upload written as it arrives, through the session's
/// descriptor-held files API, on a blocking thread fed by a bounded channel: the body is
/// never held whole. Over `max`, or cut short, or late past [`TRANSFER_WITHIN`], nothing is
/// written (the files API writes a new file and renames it over the name only at the end).
pub(crate) async fn stream_upload(
    session: Arc<Session>,
    path: String,
    mut body: hyper::body::Incoming,
    max: u64,
    gzip: bool,
    metadata: Metadata,
) -> Result<(), FilesError> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Piece>(PIPE_PIECES);
    let at = path.clone();
    let writer = tokio::task::spawn_blocking(move || {
        let files =
            session.files().ok_or_else(|| FilesError::Invalid { path: at.clone(), why: "the sandbox ended".into() })?;
        let pipe = PipeReader { rx, piece: Bytes::new(), ended: false };
        if !gzip {
            return files.write_with(&at, &mut { pipe }, max, &metadata).map(drop);
        }
        // Inflated as it is written: the cap counts the inflated bytes, so a bomb stops at it.
        let mut inflated = GzipReader(flate2::read::MultiGzDecoder::new(pipe));
        match files.write_with(&at, &mut inflated, max, &metadata) {
            Err(FilesError::Io { source, .. }) if source.kind() == std::io::ErrorKind::InvalidData => {
                Err(gzip_error(&at, &source))
            }
            other => other.map(drop),
        }
    });
    let until = tokio::time::Instant::now() + TRANSFER_WITHIN;
    let end = loop {
        match tokio::time::timeout_at(until, body.frame()).await {
            Err(_) => break Piece::Fail(format!("the body did not arrive within {TRANSFER_WITHIN:?}")),
            Ok(None) => break Piece::End,
            Ok(Some(Err(e))) => break Piece::Fail(format!("reading the body: {e}")),
            Ok(Some(Ok(frame))) => {
                // A writer that stopped (over the cap, a failed write) has said why.
                if let Ok(data) = frame.into_data()
                    && tx.send(Piece::Data(data)).await.is_err()
                {
                    break Piece::End;
                }
            }
        }
    };
    let _ = tx.send(end).await;
    drop(tx);
    writer.await.unwrap_or_else(|e| Err(FilesError::Invalid { path, why: format!("the upload's writer: {e}") }))
}

/// A gzip stream whose format errors read as `InvalidData` (the client's fault), apart from
/// the pipe's own.
struct GzipReader(flate2::read::MultiGzDecoder<PipeReader>);

impl std::io::Read for GzipReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData => {
                std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
            }
            _ => e,
        })
    }
}

/// One piece of a streamed upload, or how it ended.
pub(crate) enum Piece {
    Data(Bytes),
    End,
    Fail(String),
}

/// The blocking side of a streamed upload: the body's pieces as a [`std::io::Read`]. A
/// stream that ends without [`Piece::End`] is an error, so a cut-off upload is never taken
/// for a whole one.
pub(crate) struct PipeReader {
    rx: tokio::sync::mpsc::Receiver<Piece>,
    piece: Bytes,
    ended: bool,
}

impl std::io::Read for PipeReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.piece.is_empty() {
            if self.ended {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Piece::Data(b)) => self.piece = b,
                Some(Piece::End) => self.ended = true,
                Some(Piece::Fail(why)) => return Err(std::io::Error::other(why)),
                None => return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the upload ended early")),
            }
        }
        let n = buf.len().min(self.piece.len());
        buf[..n].copy_from_slice(&self.piece.split_to(n));
        Ok(n)
    }
}

/// A response body fed by a bounded channel; an error ends it short.
pub(crate) struct PipeBody(pub(crate) tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl hyper::body::Body for PipeBody {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, std::io::Error>>> {
        self.0.poll_recv(cx).map(|o| o.map(|r| r.map(hyper::body::Frame::data)))
    }
}

/// The parts of a `multipart/form-data` body: each part's file name, if it has one, and its
/// bytes.
pub(crate) fn multipart(ct: &str, body: &Bytes) -> Result<Vec<(Option<String>, Bytes)>, String> {
    let boundary = ct
        .split(';')
        .filter_map(|p| p.trim().strip_prefix("boundary="))
        .next()
        .map(|b| b.trim_matches('"').to_owned())
        .filter(|b| !b.is_empty() && b.len() <= 70)
        .ok_or("no boundary")?;
    let delim = format!("--{boundary}");
    let find = |hay: &[u8], from: usize, needle: &[u8]| -> Option<usize> {
        hay.get(from..)?.windows(needle.len()).position(|w| w == needle).map(|i| i + from)
    };
    let mut at = find(body, 0, delim.as_bytes()).ok_or("no first boundary")? + delim.len();
    let mut parts = Vec::new();
    loop {
        if body.get(at..at + 2) == Some(b"--") {
            return Ok(parts);
        }
        if body.get(at..at + 2) != Some(b"\r\n") {
            return Err("a boundary line does not end in CRLF".into());
        }
        at += 2;
        let head_end = find(body, at, b"\r\n\r\n").ok_or("a part's headers do not end")?;
        let head = std::str::from_utf8(&body[at..head_end]).map_err(|_| "a part's headers are not UTF-8")?;
        let name = head
            .lines()
            .filter(|l| l.to_ascii_lowercase().starts_with("content-disposition:"))
            .flat_map(|l| l.split(';').map(str::trim).collect::<Vec<_>>())
            .find_map(|p| p.strip_prefix("filename=").map(|f| f.trim_matches('"').to_owned()));
        let data_start = head_end + 4;
        let end_marker = format!("\r\n{delim}");
        let data_end = find(body, data_start, end_marker.as_bytes()).ok_or("a part does not end")?;
        parts.push((name, body.slice(data_start..data_end)));
        if parts.len() > 1024 {
            return Err("more than 1,024 parts".into());
        }
        at = data_end + end_marker.len();
    }
}

/// Most symlinks one `ListDir` follows (the rest are told as links, their targets as they
/// read).
const MAX_FOLLOWED_IN_LIST: usize = 256;

/// Most links followed to reach a symlink's target, as the kernel's own limit.
const MAX_LINK_HOPS: usize = 40;

/// The guest path a symlink at `path` whose text is `link` names: relative to the link's
/// directory, `.` and `..` resolved by name (as the guest's kernel would in the same tree).
pub(crate) fn link_target(path: &str, link: &str) -> String {
    let mut parts: Vec<&str> = if link.starts_with('/') {
        Vec::new()
    } else {
        path.trim_end_matches('/').rsplit_once('/').map_or(Vec::new(), |(dir, _)| dir.split('/').collect())
    };
    for c in link.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    let joined: Vec<&str> = parts.into_iter().filter(|p| !p.is_empty()).collect();
    format!("/{}", joined.join("/"))
}

/// An entry as envd tells it: a symlink has its target's kind and the target's path, found by
/// following it (through the files API, within the served directories, at most
/// [`MAX_LINK_HOPS`] links); one whose target is gone or outside stays a symlink.
pub(crate) async fn followed(s: &Session, e: &stockade_runtime::session::Entry) -> wire::EntryInfo {
    let mut info = entry_info(e);
    let Some(mut link) = e.link.clone() else { return info };
    let mut at = e.path.clone();
    for _ in 0..MAX_LINK_HOPS {
        let target = link_target(&at, &link);
        info.symlink_target = Some(target.clone());
        match s.stat(&target).await {
            Ok(t) if t.kind == Kind::Symlink => {
                let Some(next) = t.link else { break };
                (at, link) = (target, next);
            }
            Ok(t) => {
                let kind = entry_info(&t).kind;
                info.kind = kind;
                info.permissions = wire::permissions(kind, info.mode);
                break;
            }
            Err(_) => break,
        }
    }
    info
}

pub(crate) fn entry_info(e: &stockade_runtime::session::Entry) -> wire::EntryInfo {
    let kind = match e.kind {
        Kind::File => wire::FileType::File,
        Kind::Dir => wire::FileType::Directory,
        Kind::Symlink => wire::FileType::Symlink,
        _ => wire::FileType::Unspecified,
    };
    wire::EntryInfo {
        name: e.path.rsplit('/').next().unwrap_or_default().to_owned(),
        kind,
        path: e.path.clone(),
        size: i64::try_from(e.size).unwrap_or(i64::MAX),
        mode: e.mode,
        permissions: wire::permissions(kind, e.mode),
        owner: USER.into(),
        group: USER.into(),
        modified_time: wire::rfc3339(e.modified),
        symlink_target: e.link.as_deref().map(|l| link_target(&e.path, l)),
        metadata: e.metadata.clone(),
    }
}

/// A signed `/files` URL's signature, as E2B's SDKs make it for `download_url` and
/// `upload_url`: `v1_` and the unpadded base64 of SHA-256 over
/// `path:operation:user:token[:expiration]`, the sandbox's access token its secret.
pub(crate) fn file_signature(path: &str, operation: &str, user: &str, token: &str, expiration: Option<i64>) -> String {
    use sha2::Digest as _;
    let raw = match expiration {
        Some(e) => format!("{path}:{operation}:{user}:{token}:{e}"),
        None => format!("{path}:{operation}:{user}:{token}"),
    };
    let digest = sha2::Sha256::digest(raw.as_bytes());
    format!("v1_{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest))
}

impl E2bServer {
    /// The sandbox a signed `/files` URL is for: the one whose access token makes its
    /// signature (compared in constant time against each live sandbox's, or against the
    /// one `E2b-Sandbox-Id` names), within its expiration if it has one. 401 otherwise.
    pub(crate) fn signed_sandbox(
        &self,
        req: &Request<hyper::body::Incoming>,
        id: &str,
    ) -> Result<Arc<Sandbox>, Box<Response<Body>>> {
        let unauthorized = |m: &str| Box::new(api_error(StatusCode::UNAUTHORIZED, m));
        let q = query(req);
        let operation = if req.method() == Method::POST { "write" } else { "read" };
        let (path, user) = (q.get("path").map_or("", String::as_str), q.get("username").map_or("", String::as_str));
        let given = q.get("signature").map_or("", String::as_str);
        let expiration = match q.get("signature_expiration") {
            None => None,
            Some(e) => Some(e.parse::<i64>().map_err(|_| unauthorized("signature_expiration: not a number"))?),
        };
        if let Some(e) = expiration {
            let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
            if i64::try_from(now).unwrap_or(i64::MAX) > e {
                return Err(unauthorized("signature is already expired"));
            }
        }
        let candidates: Vec<Arc<Sandbox>> = match id {
            "" => self.boxes().values().cloned().collect(),
            id => self.sandbox(id).into_iter().collect(),
        };
        // Every candidate is compared, found or not: the time taken says nothing of which.
        let mut found = None;
        for b in candidates {
            if constant_eq(given, &file_signature(path, operation, user, &b.token, expiration)) {
                found = Some(b);
            }
        }
        found.ok_or_else(|| unauthorized("invalid signature"))
    }
}

/// Most `/files` transfers held whole in memory at once (multipart uploads, and a docker
/// sandbox's files), so the server holds at most this many times [`E2bLimits::max_upload`];
/// more wait for one to end. Streamed transfers do not count.
pub const MAX_TRANSFERS: usize = 4;

impl E2bServer {
    pub(crate) async fn filesystem(&self, s: &Session, msg: Message<'_>) -> Result<serde_json::Value, ConnectError> {
        let fail = |e: FilesError| files_code(&e);
        let entry = |e: &stockade_runtime::session::Entry| serde_json::json!({ "entry": entry_info(e) });
        match msg.method.path {
            "/filesystem.Filesystem/Stat" => {
                let r: wire::PathRequest = msg.read()?;
                let e = s.stat(&guest_path(&r.path)).await.map_err(fail)?;
                Ok(serde_json::json!({ "entry": followed(s, &e).await }))
            }
            "/filesystem.Filesystem/MakeDir" => {
                let r: wire::PathRequest = msg.read()?;
                let p = guest_path(&r.path);
                if !s.mkdir(&p).await.map_err(fail)? {
                    return Err(ConnectError::new(Code::AlreadyExists, format!("{p}: the directory exists")));
                }
                Ok(entry(&s.stat(&p).await.map_err(fail)?))
            }
            "/filesystem.Filesystem/Move" => {
                let r: wire::MoveRequest = msg.read()?;
                let (from, to) = (guest_path(&r.source), guest_path(&r.destination));
                s.rename(&from, &to).await.map_err(fail)?;
                Ok(entry(&s.stat(&to).await.map_err(fail)?))
            }
            "/filesystem.Filesystem/ListDir" => {
                let r: wire::ListDirRequest = msg.read()?;
                let p = guest_path(&r.path);
                let depth = usize::try_from(r.depth.max(1)).unwrap_or(1);
                let mut entries = Vec::new();
                let mut followed_left = MAX_FOLLOWED_IN_LIST;
                for e in s.list(&p, depth).await.map_err(fail)? {
                    if e.kind == Kind::Symlink && followed_left > 0 {
                        followed_left -= 1;
                        entries.push(followed(s, &e).await);
                    } else {
                        entries.push(entry_info(&e));
                    }
                }
                Ok(serde_json::json!({ "entries": entries }))
            }
            "/filesystem.Filesystem/Remove" => {
                let r: wire::PathRequest = msg.read()?;
                // As envd's (`os.RemoveAll`): nothing there is nothing to remove.
                match s.remove(&guest_path(&r.path)).await {
                    Ok(()) | Err(FilesError::NotFound(_)) => Ok(serde_json::json!({})),
                    Err(e) => Err(fail(e)),
                }
            }
            other => Err(ConnectError::new(Code::Unimplemented, format!("{other}: no such method"))),
        }
    }

    /// A slot for a streamed transfer, waiting at most [`TRANSFER_WAIT`] for one.
    pub(crate) async fn streamed_permit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        tokio::time::timeout(TRANSFER_WAIT, Arc::clone(&self.streamed).acquire_owned()).await.ok()?.ok()
    }

    /// `/files`: GET downloads, POST uploads (octet-stream or multipart).
    pub(crate) async fn files(&self, b: &Sandbox, req: Request<hyper::body::Incoming>) -> Response<Body> {
        let q = query(&req);
        if let Err(e) = check_user(q.get("username").map(String::as_str)) {
            return api_error(StatusCode::UNAUTHORIZED, &e.message);
        }
        let path = q.get("path").map(|p| guest_path(p));
        match *req.method() {
            Method::GET => match path {
                Some(path) => self.download(b, &path).await,
                None => api_error(StatusCode::BAD_REQUEST, "a download needs ?path="),
            },
            Method::POST => self.upload(b, req, path).await,
            _ => api_error(StatusCode::METHOD_NOT_ALLOWED, "/files takes GET or POST"),
        }
    }

    /// A download: a process-tier file streams from its descriptor; a docker one comes whole.
    pub(crate) async fn download(&self, b: &Sandbox, path: &str) -> Response<Body> {
        let max = self.config.limits.max_upload;
        if let Some(files) = b.session.files() {
            let Some(permit) = self.streamed_permit().await else { return transfers_busy() };
            // The open is the guest's to slow (its path, its filesystem): off the workers.
            let (files, at) = (Arc::clone(files), path.to_owned());
            let opened = tokio::task::spawn_blocking(move || files.open(&at, max)).await;
            return match opened {
                Ok(Ok((file, len))) => stream_file(file, len, permit),
                Ok(Err(e)) => files_error(&e),
                Err(e) => api_error(StatusCode::INTERNAL_SERVER_ERROR, &format!("opening {path}: {e}")),
            };
        }
        let Ok(Ok(_transfer)) = tokio::time::timeout(TRANSFER_WAIT, self.transfers.acquire()).await else {
            return transfers_busy();
        };
        match b.session.read(path, max).await {
            Ok(bytes) => whole(StatusCode::OK, "application/octet-stream", bytes),
            Err(e) => files_error(&e),
        }
    }

    /// An upload: an octet-stream body to a process-tier sandbox streams to its file; a
    /// multipart body, or any to a docker sandbox, is read whole first.
    pub(crate) async fn upload(
        &self,
        b: &Sandbox,
        req: Request<hyper::body::Incoming>,
        path: Option<String>,
    ) -> Response<Body> {
        let max = self.config.limits.max_upload;
        let ct = header(req.headers(), "content-type").unwrap_or_default().to_owned();
        let gzip = match upload_gzip(req.headers()) {
            Ok(g) => g,
            Err(e) => return api_error(StatusCode::UNSUPPORTED_MEDIA_TYPE, &e),
        };
        let metadata = match upload_metadata(req.headers()) {
            Ok(m) => m,
            Err(e) => return api_error(StatusCode::BAD_REQUEST, &e),
        };
        let multipart_body = ct.starts_with("multipart/form-data");
        if !multipart_body && b.session.files().is_some() {
            let Some(p) = path else { return api_error(StatusCode::BAD_REQUEST, "an upload needs ?path=") };
            let Some(_permit) = self.streamed_permit().await else { return transfers_busy() };
            let body = req.into_body();
            return match stream_upload(Arc::clone(&b.session), p.clone(), body, max, gzip, metadata.clone()).await {
                Ok(()) => json(StatusCode::OK, &[written(&p, &metadata)]),
                Err(e) => files_error(&e),
            };
        }
        let Ok(Ok(_transfer)) = tokio::time::timeout(TRANSFER_WAIT, self.transfers.acquire()).await else {
            return transfers_busy();
        };
        let cap = usize::try_from(max).unwrap_or(usize::MAX).saturating_add(64 << 10);
        let body = match read_body_within(req.into_body(), cap, TRANSFER_WITHIN).await {
            Ok(b) => b,
            Err(e) => return api_error(StatusCode::PAYLOAD_TOO_LARGE, &e),
        };
        let body = match gzip {
            true => match gunzip_within(&body, max, path.as_deref().unwrap_or("the upload")) {
                Ok(b) => b,
                Err(e) => return files_error(&e),
            },
            false => body,
        };
        let uploads: Vec<(String, Bytes)> = if multipart_body {
            let parts = match multipart(&ct, &body) {
                Ok(parts) => parts,
                Err(e) => return api_error(StatusCode::BAD_REQUEST, &format!("the multipart body: {e}")),
            };
            // One part goes to `?path=`; several, each to its own file name.
            let single = parts.len() == 1;
            let mut out = Vec::new();
            for (name, data) in parts {
                let p = match (&path, name) {
                    (Some(p), _) if single => p.clone(),
                    (_, Some(n)) => guest_path(&n),
                    (Some(p), None) => p.clone(),
                    (None, None) => {
                        return api_error(StatusCode::BAD_REQUEST, "a part has no file name and no ?path= was given");
                    }
                };
                out.push((p, data));
            }
            out
        } else {
            let Some(p) = path else { return api_error(StatusCode::BAD_REQUEST, "an upload needs ?path=") };
            vec![(p, body)]
        };
        let mut done = Vec::new();
        for (p, data) in uploads {
            if let Err(e) = b.session.write_with(&p, &data, max, metadata.clone()).await {
                return files_error(&e);
            }
            done.push(written(&p, &metadata));
        }
        json(StatusCode::OK, &done)
    }
}

#[cfg(test)]
mod tests {
    use super::link_target;

    #[test]
    fn a_link_names_its_target_as_the_guest_s_kernel_would() {
        assert_eq!(link_target("/home/user/a/l", "t.txt"), "/home/user/a/t.txt");
        assert_eq!(link_target("/home/user/a/l", "../b/./t"), "/home/user/b/t");
        assert_eq!(link_target("/home/user/a/l", "/etc/passwd"), "/etc/passwd");
        assert_eq!(link_target("/home/user/l", "../../../../.."), "/");
        assert_eq!(link_target("/home/user/l", "x//y/"), "/home/user/x/y");
    }
}
