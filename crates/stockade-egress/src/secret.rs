//! Credentials the sandbox never holds (G8): `--net-secret HOST=ENVVAR[:HEADER]`.
//!
//! The guest gets a per-run placeholder in `$ENVVAR` and `$STOCKADE_SECRET_<ENVVAR>`. For
//! `HOST` only, the proxy ends the guest's TLS with a certificate from a per-run CA (its key
//! never leaves this process; its certificate is the one thing the guest is given to trust,
//! beside the host's roots), reads each request, puts the real value where the placeholder
//! is in the one named header, and sends the request on over a second TLS connection that
//! verifies the upstream against the host's roots. The CA is name-constrained to the secret
//! hosts, so even its key could sign for nothing else.
//!
//! A header secret ([`NetSecret::set_header`], E2B's per-host `transform` rules) has no
//! placeholder: the proxy sets the header to the value on every request to the host,
//! whatever the guest sent in it, and the guest is given nothing. One host may have several
//! secrets, each in a header of its own. Every value is scrubbed from what comes back.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::policy::NetPolicyError;

/// The variables that point a guest's clients at the run's CA bundle (the host's roots and
/// the per-run CA): OpenSSL and Python's ssl, requests, Node, pip, git and curl.
pub const CA_ENV: [&str; 6] =
    ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "PIP_CERT", "GIT_SSL_CAINFO", "CURL_CA_BUNDLE"];

/// The prefix of the variable that holds a secret's placeholder: `STOCKADE_SECRET_<ENVVAR>`.
pub const SECRET_ENV_PREFIX: &str = "STOCKADE_SECRET_";

/// One credential for one host: the upstream gets `value` in `header`. The guest holds a
/// placeholder in `$env` ([`NetSecret::new`]), or nothing ([`NetSecret::set_header`]). Its
/// `Debug` never shows the value.
#[derive(Clone)]
pub struct NetSecret {
    host: String,
    env: Option<String>,
    header: String,
    value: Arc<str>,
}

impl std::fmt::Debug for NetSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetSecret")
            .field("host", &self.host)
            .field("env", &self.env)
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

impl NetSecret {
    /// Parses `HOST=ENVVAR[:HEADER]` (the header is `Authorization` unless named) and reads
    /// the value with `lookup` (the host's environment, for the CLI).
    pub fn parse(spec: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<Self, NetPolicyError> {
        let bad = |reason: &str| NetPolicyError::Secret { entry: spec.to_owned(), reason: reason.to_owned() };
        let (host, rest) = spec.split_once('=').ok_or_else(|| bad("the form is HOST=ENVVAR[:HEADER]"))?;
        let (env, header) = rest.split_once(':').unwrap_or((rest, "Authorization"));
        let value = lookup(env).ok_or_else(|| bad(&format!("${env} is not set in stockade's environment")))?;
        Self::new(host, env, header, &value).map_err(|reason| bad(&reason))
    }

    /// A secret for `host` (a DNS name), placed in the guest as `$env`, given to the
    /// upstream in `header`.
    pub fn new(host: &str, env: &str, header: &str, value: &str) -> Result<Self, String> {
        let env_ok = |s: &str| {
            !s.is_empty()
                && !s.starts_with(|c: char| c.is_ascii_digit())
                && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        };
        if !env_ok(env) {
            return Err(format!("{env:?} is not an environment variable's name"));
        }
        Ok(Self { env: Some(env.to_owned()), ..Self::set_header(host, header, value)? })
    }

    /// A secret the guest is given nothing of: every request to `host` (a DNS name) goes
    /// upstream with `header` set to `value`, in place of any the guest sent.
    pub fn set_header(host: &str, header: &str, value: &str) -> Result<Self, String> {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        match stockade_policy::allow::HostPattern::parse(&host) {
            Ok(stockade_policy::allow::HostPattern::Name(_)) => {}
            _ => return Err(format!("{host:?} is not a DNS name (a secret is for one named host)")),
        }
        if header.is_empty() || !header.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err(format!("{header:?} is not a header name"));
        }
        let header = header.to_ascii_lowercase();
        if crate::http::proxy_owned(&header) {
            return Err(format!("{header:?} decides or frames the request; a secret cannot set it"));
        }
        if value.is_empty() || value.bytes().any(|b| b < 0x20 || b == 0x7f) {
            return Err("the value is empty or holds control characters, which no header may carry".into());
        }
        Ok(Self { host, env: None, header, value: Arc::from(value) })
    }

    /// The host.
    #[must_use]
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The variable the guest finds the placeholder in; `None` for a header secret.
    #[must_use]
    pub fn env(&self) -> Option<&str> {
        self.env.as_deref()
    }

    /// The header the value goes in, in lower case.
    #[must_use]
    pub fn header(&self) -> &str {
        &self.header
    }

    /// The real value: for the proxy's side only.
    pub(crate) fn value(&self) -> &str {
        &self.value
    }
}

/// One secret host's per-run state: the certificate the guest is shown, and each secret
/// with its placeholder (none for a header secret).
pub(crate) struct Target {
    pub(crate) host: String,
    pub(crate) secrets: Vec<(NetSecret, Option<String>)>,
    pub(crate) server: Arc<rustls::ServerConfig>,
}

impl Target {
    /// What a request to this host gets: each placeholder replaced in its secret's header,
    /// each header secret set.
    pub(crate) fn inject(&self) -> Vec<crate::http::Inject<'_>> {
        self.secrets
            .iter()
            .map(|(secret, placeholder)| crate::http::Inject {
                header: secret.header(),
                placeholder: placeholder.as_deref().map(str::as_bytes),
                value: secret.value().as_bytes(),
            })
            .collect()
    }

    /// The headers the secrets go in, for the record: `a,b`.
    pub(crate) fn headers(&self) -> String {
        self.secrets.iter().map(|(s, _)| s.header()).collect::<Vec<_>>().join(",")
    }

    /// A scrubber of every value this host's secrets hold.
    pub(crate) fn scrub(&self) -> Scrub {
        Scrub::new(self.secrets.iter().map(|(s, _)| s.value().as_bytes()).collect())
    }
}

/// A run's interception: the CA, and each secret host's server configuration.
pub(crate) struct Intercept {
    pub(crate) ca_pem: String,
    pub(crate) targets: Vec<Target>,
}

impl Intercept {
    /// Makes the per-run CA (name-constrained to the hosts of `secrets`), one certificate
    /// per host, and a placeholder per secret that has a variable.
    pub(crate) fn start(secrets: &[NetSecret]) -> Result<Self, String> {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, GeneralSubtree, IsCa, Issuer,
            KeyPair, KeyUsagePurpose, NameConstraints,
        };
        let e = |e: rcgen::Error| format!("making the per-run CA: {e}");
        let hosts: std::collections::BTreeSet<String> = secrets.iter().map(|s| s.host.clone()).collect();
        let ca_key = KeyPair::generate().map_err(e)?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(e)?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.distinguished_name.push(DnType::CommonName, "stockade per-run CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        ca.name_constraints = Some(NameConstraints {
            permitted_subtrees: hosts.iter().map(|h| GeneralSubtree::DnsName(h.clone())).collect(),
            excluded_subtrees: Vec::new(),
        });
        let ca_cert = ca.self_signed(&ca_key).map_err(e)?;
        let issuer = Issuer::new(ca, ca_key);
        let mut targets = Vec::new();
        for host in hosts {
            let key = KeyPair::generate().map_err(e)?;
            let mut leaf = CertificateParams::new(vec![host.clone()]).map_err(e)?;
            leaf.distinguished_name.push(DnType::CommonName, host.clone());
            leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            let cert = leaf.signed_by(&key, &issuer).map_err(e)?;
            let chain = vec![cert.der().clone(), CertificateDer::from(ca_cert.der().to_vec())];
            let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
            let mut server = rustls::ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_no_client_auth()
                .with_single_cert(chain, key)
                .map_err(|e| format!("the per-run certificate for {host}: {e}"))?;
            server.alpn_protocols = vec![b"http/1.1".to_vec()];
            let mut mine = Vec::new();
            for secret in secrets.iter().filter(|s| s.host == host) {
                let placeholder = match secret.env {
                    Some(_) => Some(format!("stockade-secret-{}", random_hex(16)?)),
                    None => None,
                };
                mine.push((secret.clone(), placeholder));
            }
            targets.push(Target { host, secrets: mine, server: Arc::new(server) });
        }
        Ok(Self { ca_pem: ca_cert.pem(), targets })
    }

    /// The target for `host`, if it has a secret.
    pub(crate) fn target(&self, host: &str) -> Option<&Target> {
        self.targets.iter().find(|t| t.host == host)
    }
}

/// A TLS client over the host's roots (as `rustls-native-certs` finds them, `SSL_CERT_FILE`
/// and `SSL_CERT_DIR` included) and `extra` (PEM certificates), speaking HTTP/1.1: the proxy
/// verifies secret hosts' upstreams with it, and a fetch its far end.
pub(crate) fn client_config(extra: Option<&str>) -> Result<Arc<rustls::ClientConfig>, String> {
    use rustls::pki_types::pem::PemObject;
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if let Some(pem) = extra {
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            roots.add(cert.map_err(|e| format!("the run's CA: {e}"))?).map_err(|e| format!("the run's CA: {e}"))?;
        }
    }
    if added == 0 && extra.is_none() {
        let errors: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
        return Err(format!("the host has no TLS roots to verify an upstream with ({})", errors.join("; ")));
    }
    let mut client = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(client))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// `bytes` random bytes from the OS, in hex.
fn random_hex(bytes: usize) -> Result<String, String> {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b).map_err(|e| format!("getrandom: {e}"))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Masks secrets' values out of bytes that arrive in pieces (a response from a secret
/// host, G8): every occurrence becomes as many mask bytes, so lengths, and with them a
/// response's framing, are unchanged. The last `longest - 1` bytes wait for the next piece,
/// so a value split across two pieces is masked too; [`Scrub::finish`] gives them up.
pub(crate) struct Scrub {
    values: Vec<Vec<u8>>,
    mask: u8,
    pending: Vec<u8>,
}

impl Scrub {
    /// A scrubber of `values` (empty ones are ignored).
    pub(crate) fn new(values: Vec<&[u8]>) -> Self {
        let values: Vec<Vec<u8>> = values.into_iter().filter(|v| !v.is_empty()).map(<[u8]>::to_vec).collect();
        // A mask byte no value holds, so a mask can never be part of a value.
        let mask = *b"*#~X0".iter().find(|b| !values.iter().any(|v| v.contains(b))).unwrap_or(&b'*');
        Self { values, mask, pending: Vec::new() }
    }

    /// Takes `bytes`; returns what may go on, masked.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Vec<u8> {
        self.pending.extend_from_slice(bytes);
        let mut i = 0;
        while i < self.pending.len() {
            let rest = &self.pending[i..];
            match self.values.iter().find(|v| rest.starts_with(v)).map(Vec::len) {
                Some(n) => {
                    self.pending[i..i + n].fill(self.mask);
                    i += n;
                }
                None => i += 1,
            }
        }
        let longest = self.values.iter().map(Vec::len).max().unwrap_or(0);
        let keep = longest.saturating_sub(1).min(self.pending.len());
        let out = self.pending.len() - keep;
        self.pending.drain(..out).collect()
    }

    /// The bytes still held back (none can hold a whole value).
    pub(crate) fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::Scrub;

    #[test]
    fn a_value_is_masked_wherever_the_pieces_split_it() {
        let text = b"echo: Bearer s3cr3t-token; again s3cr3t-token.";
        for split in 0..text.len() {
            let mut s = Scrub::new(vec![b"s3cr3t-token"]);
            let mut out = s.feed(&text[..split]);
            out.extend(s.feed(&text[split..]));
            out.extend(s.finish());
            assert_eq!(out.len(), text.len(), "split at {split}");
            assert!(!out.windows(12).any(|w| w == b"s3cr3t-token"), "split at {split}: {out:?}");
            assert!(out.starts_with(b"echo: Bearer ") && out.ends_with(b"."), "split at {split}");
        }
        // One byte at a time.
        let mut s = Scrub::new(vec![b"s3cr3t-token"]);
        let mut out: Vec<u8> = text.iter().flat_map(|b| s.feed(&[*b])).collect();
        out.extend(s.finish());
        assert!(!out.windows(12).any(|w| w == b"s3cr3t-token"));
    }

    #[test]
    fn several_values_are_masked_wherever_the_pieces_split_them() {
        let text = b"a=first-value-1; b=second-2; a again first-value-1.";
        for split in 0..text.len() {
            let mut s = Scrub::new(vec![b"first-value-1", b"second-2", b""]);
            let mut out = s.feed(&text[..split]);
            out.extend(s.feed(&text[split..]));
            out.extend(s.finish());
            assert_eq!(out.len(), text.len(), "split at {split}");
            let out = String::from_utf8(out).unwrap();
            assert!(!out.contains("first-value-1") && !out.contains("second-2"), "split at {split}: {out}");
            assert!(out.starts_with("a=") && out.contains("; b=") && out.ends_with('.'), "split at {split}: {out}");
        }
    }

    #[test]
    fn a_header_secret_cannot_set_what_frames_or_decides_a_request() {
        use super::NetSecret;
        for h in ["Host", "content-length", "Transfer-Encoding", "Connection", "Proxy-Authorization", "Accept-Encoding"]
        {
            let e = NetSecret::set_header("api.test", h, "v").unwrap_err();
            assert!(e.contains("frames the request"), "{h}: {e}");
        }
        for (host, h, v) in [("10.0.0.1", "X-A", "v"), ("api.test", "X A", "v"), ("api.test", "X-A", "a\nb")] {
            assert!(NetSecret::set_header(host, h, v).is_err(), "{host} {h} {v:?}");
        }
        let s = NetSecret::set_header("API.test.", "X-Token", "v").unwrap();
        assert_eq!((s.host(), s.header(), s.env()), ("api.test", "x-token", None));
    }
}
