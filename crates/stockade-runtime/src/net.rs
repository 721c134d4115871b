//! The network grant's seam. With the `net` feature, the network grant is
//! `stockade-egress`'s proxy (`Grants::net`). Without it, this build
//! compiles no proxy, no TLS and no DNS: [`Egress`] and [`NetGrant`] are types with no
//! values, so a grant cannot hold one, and every path that would serve one is dead by type,
//! not by a flag read at run time. The runtime's other modules name only this one, never
//! `stockade_egress`.

use std::sync::Arc;

use serde_json::Value;
use stockade_protocol::{GrantOutcome, ReplyBody};

#[cfg(feature = "net")]
pub(crate) use stockade_egress::{CA_ENV, Egress, NetGrant};

/// The loopback's connections go, by their first bytes, to the proxy or the model grant.
type Model = Option<Arc<dyn crate::ModelService>>;

#[cfg(feature = "net")]
fn error(code: stockade_protocol::ReplyCode, message: String) -> ReplyBody {
    ReplyBody::Error(stockade_protocol::ReplyError::new(code, message))
}

/// The proxy's variables for a guest whose proxy listens on `port`.
#[cfg(feature = "net")]
pub(crate) fn proxy_env(port: u16) -> Vec<(String, String)> {
    stockade_egress::proxy_env(port)
}

/// The most connections the proxy serves at once (and one to refuse with).
#[cfg(feature = "net")]
pub(crate) fn max_connections(net: &NetGrant) -> usize {
    net.net_limits().max_concurrent.saturating_add(1)
}

/// The secrets' placeholders a guest without an environment (wasm) finds in the manifest.
#[cfg(feature = "net")]
pub(crate) fn manifest_secrets(egress: &Egress) -> serde_json::Map<String, Value> {
    egress
        .secret_env()
        .into_iter()
        .filter(|(k, _)| !k.starts_with(stockade_egress::SECRET_ENV_PREFIX))
        .map(|(k, v)| (k, Value::String(v)))
        .collect()
}

/// `fetch()` for a guest without sockets, as a grant call's outcome, kind and reply: a
/// client of the run's own proxy, so the connection is decided and recorded there.
#[cfg(feature = "net")]
pub(crate) async fn fetch(egress: &Egress, args: &Value) -> (GrantOutcome, String, ReplyBody) {
    use stockade_egress::FetchError;
    use stockade_protocol::ReplyCode;
    let (outcome, body) = match egress.fetch(args).await {
        Ok(v) => (GrantOutcome::Ok, ReplyBody::Result(v)),
        Err(e @ FetchError::BadRequest(_)) => (GrantOutcome::Denied, error(ReplyCode::BadArgs, e.to_string())),
        Err(e @ FetchError::Refused(_)) => (GrantOutcome::Denied, error(ReplyCode::Denied, e.to_string())),
        Err(e) => (GrantOutcome::Failed, error(ReplyCode::Failed, e.to_string())),
    };
    (outcome, "fetch".into(), body)
}

/// Serves one loopback connection: by its first bytes ([`first_bytes`]), to the proxy (a
/// CONNECT, an absolute-form URL, SOCKS5) or to the model grant (origin-form HTTP); a
/// connection neither grant takes is closed.
#[cfg(feature = "net")]
pub(crate) async fn route(
    stream: tokio::net::TcpStream,
    model: Model,
    run: crate::grants::ModelRun,
    egress: Option<Egress>,
) {
    let Some((kind, stream)) = first_bytes(stream).await else { return };
    match (kind, model, egress) {
        (stockade_egress::Kind::Proxy, _, Some(egress)) => egress.serve(stream).await,
        (stockade_egress::Kind::Origin, Some(model), _) => model.serve(Box::new(stream), run).await,
        (_, _, Some(egress)) => egress.serve(stream).await,
        _ => {}
    }
}

/// Reads a loopback connection's first bytes, enough to tell a proxy request from the model
/// grant's origin-form HTTP, within one deadline for the whole wait
/// ([`LOOPBACK_FIRST_BYTES`]), and hands the connection on with them put back. `None`: the
/// peer closed (its exec ended), the deadline passed, or 32 bytes did not tell.
#[cfg(feature = "net")]
async fn first_bytes<S: tokio::io::AsyncRead + Unpin>(
    mut stream: S,
) -> Option<(stockade_egress::Kind, stockade_egress::Prefixed<S>)> {
    use tokio::io::AsyncReadExt as _;
    let until = tokio::time::Instant::now() + LOOPBACK_FIRST_BYTES;
    let mut prefix = [0u8; 32];
    let mut have = 0;
    loop {
        match tokio::time::timeout_at(until, stream.read(&mut prefix[have..])).await {
            Ok(Ok(n)) if n > 0 => have += n,
            _ => return None,
        }
        match stockade_egress::classify(&prefix[..have]) {
            stockade_egress::Kind::NeedMore if have < prefix.len() => {}
            stockade_egress::Kind::NeedMore => return None,
            kind => return Some((kind, stockade_egress::Prefixed::new(prefix[..have].to_vec(), stream))),
        }
    }
}

/// How long the loopback waits for a connection's first bytes, in all.
#[cfg(feature = "net")]
const LOOPBACK_FIRST_BYTES: std::time::Duration = std::time::Duration::from_secs(30);

#[cfg(not(feature = "net"))]
pub(crate) use without::*;

/// This build's network grant when it has none: types without values.
#[cfg(not(feature = "net"))]
mod without {
    use super::{GrantOutcome, Model, ReplyBody, Value};

    /// No proxy: this build has no `net` feature.
    #[derive(Debug, Clone)]
    pub(crate) enum Egress {}

    /// No network grant: this build has no `net` feature.
    #[derive(Debug, Clone)]
    pub(crate) enum NetGrant {}

    pub(crate) const CA_ENV: &[&str] = &[];

    impl NetGrant {
        pub(crate) fn start(&self) -> Egress {
            match *self {}
        }
    }

    impl Egress {
        pub(crate) fn ca_pem(&self) -> Option<&str> {
            match *self {}
        }
        pub(crate) fn secret_env(&self) -> Vec<(String, String)> {
            match *self {}
        }
        #[cfg_attr(not(feature = "process"), allow(dead_code, reason = "sessions are the process tier's"))]
        pub(crate) fn renew(&self) {
            match *self {}
        }
        pub(crate) fn record_into(&self, _: &mut stockade_protocol::GrantsReport) {
            match *self {}
        }
    }

    pub(crate) fn proxy_env(_: u16) -> Vec<(String, String)> {
        Vec::new()
    }

    pub(crate) fn max_connections(net: &NetGrant) -> usize {
        match *net {}
    }

    pub(crate) fn manifest_secrets(egress: &Egress) -> serde_json::Map<String, Value> {
        match *egress {}
    }

    pub(crate) async fn fetch(egress: &Egress, _: &Value) -> (GrantOutcome, String, ReplyBody) {
        match *egress {}
    }

    /// With no proxy, every loopback connection is the model grant's.
    pub(crate) async fn route(
        stream: tokio::net::TcpStream,
        model: Model,
        run: crate::grants::ModelRun,
        _: Option<Egress>,
    ) {
        if let Some(model) = model {
            model.serve(Box::new(stream), run).await;
        }
    }
}
