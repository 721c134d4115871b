//! `serve.toml`: templates, limits and the TLS identity of an E2B server.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use stockade_protocol::e2b::{self as wire};
use stockade_runtime::protocol::Limits;
use stockade_runtime::session::SessionTier;

/// Bounds of one server.
#[derive(Debug, Clone)]
pub struct E2bLimits {
    /// Most live sandboxes.
    pub max_sandboxes: usize,
    /// Most open connections.
    pub max_connections: usize,
    /// Most streams (Start, Connect) at once.
    pub max_streams: usize,
    /// Largest upload or download through `/files`.
    pub max_upload: u64,
    /// Most snapshots kept (each at most [`stockade_runtime::session::MAX_SNAPSHOT_BYTES`]).
    pub max_snapshots: usize,
}

impl Default for E2bLimits {
    fn default() -> Self {
        Self { max_sandboxes: 64, max_connections: 1024, max_streams: 256, max_upload: 256 << 20, max_snapshots: 64 }
    }
}

/// A template: what a sandbox made from it is.
#[derive(Debug, Clone)]
pub struct Template {
    /// The tier.
    pub tier: SessionTier,
    /// Memory and processes for the whole sandbox.
    pub limits: Limits,
    /// The longest timeout a sandbox may ask for.
    pub max_timeout: Duration,
    /// Hosts the sandbox may reach (`--allow-net` entries); empty: no network.
    pub allow_net: Vec<String>,
    /// Names pinned to addresses (`--net-resolve` entries).
    pub net_resolve: Vec<String>,
    /// Its environment.
    pub env: Vec<(String, String)>,
    /// The size of its home, in bytes ([`DEFAULT_DISK`] unless `disk` says otherwise):
    /// untrusted code fills at most this much of the host. Where the host cannot enforce it
    /// (a process-tier home is a tmpfs only root mounts), a create fails and says so.
    pub disk: u64,
    /// Its sandboxes run E2B's code-interpreter server (`code_interpreter`): stateful
    /// kernels the code-interpreter SDK drives on port 49999. Process tier only.
    pub code_interpreter: bool,
}

/// The code-interpreter SDK's default template.
pub(crate) const CODE_INTERPRETER_TEMPLATE: &str = "code-interpreter-v1";

/// A template's home size when its `disk` is not set: 1 GiB.
pub const DEFAULT_DISK: u64 = 1 << 30;

impl Default for Template {
    fn default() -> Self {
        Self {
            tier: SessionTier::Process,
            limits: Limits::default(),
            max_timeout: Duration::from_secs(3600),
            allow_net: Vec::new(),
            net_resolve: Vec::new(),
            env: Vec::new(),
            disk: DEFAULT_DISK,
            code_interpreter: false,
        }
    }
}

/// The server's configuration: its key, templates (`base` is the SDK's default), bounds and
/// TLS.
#[derive(Debug, Clone)]
pub struct E2bConfig {
    /// The API key clients present (`X-API-Key`).
    pub api_key: String,
    /// Templates by name.
    pub templates: BTreeMap<String, Template>,
    /// Bounds.
    pub limits: E2bLimits,
    /// Serve HTTPS with this certificate and key ([`Tls::from_pem`]); without it, plain HTTP.
    pub tls: Option<Tls>,
    /// Where filesystem snapshots are kept (made 0700; each snapshot a 0600 archive and a
    /// record beside it), so that they outlive their sandbox and the server; without it,
    /// snapshots are refused.
    pub snapshots: Option<PathBuf>,
}

/// A server certificate chain and key for HTTPS (rustls with ring; HTTP/1.1 by ALPN).
#[derive(Clone)]
pub struct Tls(#[cfg(feature = "tls")] pub(crate) Arc<rustls::ServerConfig>, #[cfg(not(feature = "tls"))] ());

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls(..)")
    }
}

impl Tls {
    /// The chain (leaf first) and private key, both PEM.
    pub fn from_pem(chain: &[u8], key: &[u8]) -> Result<Self, String> {
        #[cfg(feature = "tls")]
        {
            use rustls::pki_types::pem::PemObject as _;
            use rustls::pki_types::{CertificateDer, PrivateKeyDer};
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain)
                .collect::<Result<_, _>>()
                .map_err(|e| format!("the certificate file: {e}"))?;
            if certs.is_empty() {
                return Err("the certificate file holds no certificate".into());
            }
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("the key file: {e}"))?;
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut config = rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .map_err(|e| format!("the certificate and key: {e}"))?;
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(Self(Arc::new(config)))
        }
        #[cfg(not(feature = "tls"))]
        {
            let _ = (chain, key);
            Err("this build has no TLS (the `tls` feature)".into())
        }
    }
}

/// The network a sandbox gets: the template's hosts (its grant), and the request's
/// `allowOut`/`denyOut` as the grant's scope, which narrows it and never widens it (and
/// `update_network` replaces); none unless the template grants some.
pub(crate) fn net_grant(
    t: &Template,
    new: &wire::NewSandbox,
) -> Result<Option<(stockade_runtime::egress::NetGrant, stockade_runtime::egress::NetScope)>, String> {
    use stockade_runtime::egress;
    let net = new.network.clone().unwrap_or_default();
    if let Some(k) = net.other.keys().next() {
        return Err(format!("network.{k}: stockade does not offer it"));
    }
    if net.allow_public_traffic == Some(true) {
        return Err("network.allowPublicTraffic: a stockade sandbox's ports take its traffic token".into());
    }
    if let Some(mask) = &net.mask_request_host {
        super::ports::check_mask(mask).map_err(|e| format!("network.maskRequestHost {mask:?}: {e}"))?;
    }
    let rules = scope_rules(&net.allow_out, &net.deny_out, new.allow_internet_access)?;
    let secrets = header_rules(&net.rules)?;
    if t.allow_net.is_empty() {
        return match (net.allow_out.first(), net.rules.keys().next()) {
            (Some(h), _) => Err(format!("network.allowOut {h:?}: this template grants no network")),
            (None, Some(h)) => Err(format!("network.rules {h:?}: this template grants no network")),
            (None, None) => Ok(None),
        };
    }
    let policy = egress::NetPolicy::allow_entries(&t.allow_net).map_err(|e| e.to_string())?;
    let resolve = egress::Resolve::entries(&t.net_resolve).map_err(|e| e.to_string())?;
    let scope = egress::NetScope::new(rules);
    let mut grant = egress::NetGrant::new(policy).resolve(resolve).scope(scope.clone());
    if !secrets.is_empty() {
        grant = grant.secrets(secrets).map_err(|e| format!("network.rules: {e}"))?;
    }
    Ok(Some((grant, scope)))
}

/// The most headers a sandbox's `network.rules` may set, over all its hosts.
const MAX_RULE_HEADERS: usize = 64;

/// A request's per-host `rules` as header secrets: each `transform`'s headers are set on
/// every HTTPS request to its host, by the proxy, and the sandbox is given none of their
/// values (which are scrubbed from what comes back). Within a host's list a later rule's
/// header replaces an earlier one's. A host must be a DNS name: the proxy ends the
/// sandbox's TLS for it with a certificate of the per-sandbox CA, name-constrained to those
/// hosts.
pub(crate) fn header_rules(
    rules: &BTreeMap<String, Vec<wire::NetworkRule>>,
) -> Result<Vec<stockade_runtime::egress::NetSecret>, String> {
    let mut set: BTreeMap<(String, String), (String, String)> = BTreeMap::new();
    for (host, list) in rules {
        for header in list.iter().filter_map(|r| r.transform.as_ref()).flat_map(|t| &t.headers) {
            let key = (host.clone(), header.0.to_ascii_lowercase());
            set.insert(key, (header.0.clone(), header.1.clone()));
        }
    }
    if set.len() > MAX_RULE_HEADERS {
        return Err(format!(
            "network.rules: {} headers, more than the {MAX_RULE_HEADERS} a sandbox may set",
            set.len()
        ));
    }
    set.into_iter()
        .map(|((host, _), (name, value))| {
            stockade_runtime::egress::NetSecret::set_header(&host, &name, &value)
                .map_err(|e| format!("network.rules {host:?} header {name:?}: {e}"))
        })
        .collect()
}

/// A request's egress lists as a scope (E2B's semantics: allow wins over deny, `0.0.0.0/0`
/// is all traffic, and `allow_internet_access = false` denies it all).
pub(crate) fn scope_rules(
    allow_out: &[String],
    deny_out: &[String],
    internet: Option<bool>,
) -> Result<stockade_runtime::egress::ScopeRules, String> {
    let mut deny = deny_out.to_vec();
    if internet == Some(false) {
        deny.push("0.0.0.0/0".into());
    }
    stockade_runtime::egress::ScopeRules::parse(allow_out, &deny)
        .map_err(|e| format!("network: {}", e.to_string().trim_start_matches("--allow-net ")))
}

/// `serve.toml`, as written.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConfigFile {
    #[serde(default)]
    limits: Option<LimitsFile>,
    #[serde(default)]
    template: BTreeMap<String, TemplateFile>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LimitsFile {
    max_sandboxes: Option<usize>,
    max_connections: Option<usize>,
    max_streams: Option<usize>,
    max_upload: Option<String>,
    max_snapshots: Option<usize>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TemplateFile {
    #[serde(default)]
    tier: Option<String>,
    image: Option<String>,
    memory: Option<String>,
    pids: Option<u32>,
    max_timeout: Option<String>,
    #[serde(default)]
    allow_net: Vec<String>,
    #[serde(default)]
    net_resolve: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    disk: Option<String>,
    #[serde(default)]
    code_interpreter: bool,
}

impl E2bConfig {
    /// A configuration with the `base` template (the process tier, no network) and
    /// `code-interpreter-v1` (the same, with the code interpreter).
    #[must_use]
    pub fn new(api_key: String) -> Self {
        let interpreter = Template { code_interpreter: true, ..Template::default() };
        Self {
            api_key,
            templates: BTreeMap::from([
                ("base".to_owned(), Template::default()),
                (CODE_INTERPRETER_TEMPLATE.to_owned(), interpreter),
            ]),
            limits: E2bLimits::default(),
            tls: None,
            snapshots: None,
        }
    }

    /// Reads `serve.toml`: `[limits]` and `[template.NAME]` tables (`tier`, `image`,
    /// `memory`, `pids`, `disk`, `max_timeout`, `allow_net`, `net_resolve`, `env`,
    /// `code_interpreter`). Without a `base` or `code-interpreter-v1` template, each is the
    /// default one.
    pub fn from_toml(api_key: String, text: &str) -> Result<Self, String> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| e.message().to_owned())?;
        let mut config = Self::new(api_key);
        if let Some(l) = file.limits {
            let d = E2bLimits::default();
            config.limits = E2bLimits {
                max_sandboxes: l.max_sandboxes.unwrap_or(d.max_sandboxes),
                max_connections: l.max_connections.unwrap_or(d.max_connections),
                max_streams: l.max_streams.unwrap_or(d.max_streams),
                max_upload: match l.max_upload {
                    Some(s) => {
                        stockade_protocol::limits::parse_size(&s).map_err(|e| format!("limits.max_upload: {e}"))?
                    }
                    None => d.max_upload,
                },
                max_snapshots: l.max_snapshots.unwrap_or(d.max_snapshots),
            };
        }
        for (name, t) in file.template {
            let at = |what: &str, e: &dyn std::fmt::Display| format!("template.{name}.{what}: {e}");
            let tier = match (t.tier.as_deref(), t.image) {
                (None | Some("process"), None) => SessionTier::Process,
                (Some("docker"), Some(image)) => SessionTier::Docker { image },
                (Some("docker"), None) => return Err(at("image", &"a docker template names its image")),
                (None | Some("process"), Some(_)) => return Err(at("image", &"only a docker template has an image")),
                (Some(other), _) => return Err(at("tier", &format!("{other:?} is not process or docker"))),
            };
            let mut limits = Limits::default();
            if let Some(m) = &t.memory {
                let bytes = stockade_protocol::limits::parse_size(m).map_err(|e| at("memory", &e))?;
                limits = limits.with_memory(bytes).map_err(|e| at("memory", &e))?;
            }
            if let Some(p) = t.pids {
                limits = limits.with_processes(p).map_err(|e| at("pids", &e))?;
            }
            let max_timeout = match &t.max_timeout {
                Some(d) => stockade_protocol::limits::parse_duration(d).map_err(|e| at("max_timeout", &e))?,
                None => Template::default().max_timeout,
            };
            if max_timeout.is_zero() || max_timeout > stockade_runtime::protocol::limits::MAX_DURATION {
                return Err(at("max_timeout", &"must be more than 0 and at most 24h"));
            }
            let disk = match &t.disk {
                Some(d) => stockade_protocol::limits::parse_size(d).map_err(|e| at("disk", &e))?,
                None => DEFAULT_DISK,
            };
            if disk < 1 << 20 {
                return Err(at("disk", &"must be at least 1M"));
            }
            if t.code_interpreter && tier != SessionTier::Process {
                return Err(at("code_interpreter", &"the code interpreter runs in the process tier"));
            }
            let template = Template {
                code_interpreter: t.code_interpreter,
                tier,
                limits,
                max_timeout,
                allow_net: t.allow_net,
                net_resolve: t.net_resolve,
                env: t.env.into_iter().collect(),
                disk,
            };
            // Checked now, so that a typo is the server's first line, not a sandbox's error.
            net_grant(&template, &wire::NewSandbox::default()).map_err(|e| at("allow_net", &e))?;
            config.templates.insert(name, template);
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use std::collections::BTreeMap;

    use stockade_protocol::e2b::{NetworkRule, NetworkTransform};

    fn rule(headers: &[(&str, &str)]) -> NetworkRule {
        let headers = headers.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        NetworkRule { transform: Some(NetworkTransform { headers }) }
    }

    #[test]
    fn header_rules_take_the_later_header_and_refuse_what_no_proxy_could_set() {
        let rules =
            BTreeMap::from([("API.test".to_owned(), vec![rule(&[("X-A", "first")]), rule(&[("x-a", "second")])])]);
        let secrets = super::header_rules(&rules).unwrap();
        assert_eq!(secrets.len(), 1);
        assert_eq!((secrets[0].host(), secrets[0].header(), secrets[0].env()), ("api.test", "x-a", None));
        let refused = |rules: BTreeMap<String, Vec<NetworkRule>>| super::header_rules(&rules).unwrap_err();
        let e = refused(BTreeMap::from([("10.0.0.1".to_owned(), vec![rule(&[("X", "1")])])]));
        assert!(e.contains("network.rules \"10.0.0.1\"") && e.contains("not a DNS name"), "{e}");
        let e = refused(BTreeMap::from([("a.test".to_owned(), vec![rule(&[("Host", "evil.test")])])]));
        assert!(e.contains("frames the request"), "{e}");
        let many: Vec<(String, String)> = (0..65).map(|i| (format!("X-{i}"), "v".to_owned())).collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let e = refused(BTreeMap::from([("a.test".to_owned(), vec![rule(&many)])]));
        assert!(e.contains("65 headers"), "{e}");
    }
}
