//! What a network grant allows: a [`stockade_policy`] policy over one tool, [`NET_TOOL`].

use std::net::IpAddr;
use std::sync::Arc;

use serde_json::json;
use stockade_policy::allow::{ArgType, Effect, HostPattern, Policy, Predicate, Registry, Rule, ToolPattern, ToolSpec};

/// The tool every connection is a call to. Its arguments: `host` (the name or address
/// literal the guest asked for), `port`, `scheme` (`https` for a CONNECT tunnel, `http` for
/// one plain request, `socks` for a SOCKS5 connection) and, for `http`, `method` and `path`.
pub const NET_TOOL: &str = "net.connect";

/// A network policy is not what it should be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NetPolicyError {
    /// An `--allow-net` entry is none of the forms.
    #[error("--allow-net {entry:?}: {reason}")]
    Rule {
        /// The entry.
        entry: String,
        /// Why.
        reason: String,
    },
    /// A `--net-resolve` entry is not `HOST:PORT:ADDRESS`.
    #[error("--net-resolve {entry:?}: {reason}")]
    Resolve {
        /// The entry.
        entry: String,
        /// Why.
        reason: String,
    },
    /// A `--net-secret` entry is not `HOST=ENVVAR[:HEADER]`, or its value is unusable.
    #[error("--net-secret {entry:?}: {reason}")]
    Secret {
        /// The entry.
        entry: String,
        /// Why.
        reason: String,
    },
    /// The policy file does not load (the policy engine's own one-line error).
    #[error("{0}")]
    Policy(String),
}

/// One `--allow-net` entry: a host pattern and the ports it opens.
///
/// - `example.org`: that name, ports 80 and 443;
/// - `example.org:8443`: that name, that port;
/// - `*.example.org` (optionally `:PORT`): its subdomains only, never the bare domain;
/// - `192.0.2.7`, `[2001:db8::1]:8443`, `198.51.100.0/24`: address literals the guest names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetRule {
    entry: String,
    host: HostPattern,
    ports: Vec<u16>,
}

impl NetRule {
    /// Parses one entry.
    pub fn parse(entry: &str) -> Result<Self, NetPolicyError> {
        let bad = |reason: String| NetPolicyError::Rule { entry: entry.to_owned(), reason };
        let (host, port) = split_port(entry).map_err(|r| bad(r.to_owned()))?;
        let host = HostPattern::parse(host).map_err(bad)?;
        let ports = match port {
            Some(p) => vec![p],
            None => vec![80, 443],
        };
        Ok(Self { entry: entry.to_owned(), host, ports })
    }

    /// The entry as the user wrote it.
    #[must_use]
    pub fn entry(&self) -> &str {
        &self.entry
    }

    /// The rule's id: `allow-net-` and the entry, spelled in a rule id's characters
    /// (`api.github.com:8443` is `allow-net-api.github.com-8443`, `*.` is `star.`).
    #[must_use]
    pub fn rule_id(&self) -> String {
        let mut id = String::from("allow-net-");
        for c in self.entry.chars() {
            match c {
                '*' => id.push_str("star"),
                ':' | '/' => id.push('-'),
                '[' | ']' => {}
                c if c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-' => id.push(c),
                _ => id.push('_'),
            }
        }
        id.truncate(64);
        id
    }

    fn rule(&self) -> Rule {
        let ports = self.ports.iter().map(|p| json!(p)).collect();
        Rule::new(self.rule_id(), ToolPattern::parse(NET_TOOL), Effect::Allow)
            .arg("host", Predicate::Hosts(vec![self.host.clone()]))
            .arg("port", Predicate::OneOf(ports))
    }
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`, a bare IPv6 address or a CIDR block.
fn split_port(entry: &str) -> Result<(&str, Option<u16>), &'static str> {
    let port = |p: &str| p.parse::<u16>().ok().filter(|p| *p != 0).ok_or("the port is not 1 to 65535");
    if let Some(rest) = entry.strip_prefix('[') {
        let (addr, after) = rest.split_once(']').ok_or("an IPv6 literal in brackets needs its `]`")?;
        return match after {
            "" => Ok((addr, None)),
            p => Ok((addr, Some(port(p.strip_prefix(':').ok_or("after `]` comes `:PORT`")?)?))),
        };
    }
    if entry.parse::<IpAddr>().is_ok() || entry.contains('/') {
        return Ok((entry, None));
    }
    match entry.rsplit_once(':') {
        Some((host, p)) => Ok((host, Some(port(p)?))),
        None => Ok((entry, None)),
    }
}

/// `--net-resolve HOST:PORT:ADDRESS` entries: the one way to point a name at an address the
/// grant would otherwise refuse (a test server on 127.0.0.2, a service on the LAN).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolve {
    entries: Vec<(String, u16, IpAddr)>,
}

impl Resolve {
    /// No overrides: every name goes to the host's resolver.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one `HOST:PORT:ADDRESS` entry (an IPv6 address may be in brackets).
    pub fn entry(mut self, entry: &str) -> Result<Self, NetPolicyError> {
        let bad = |reason: &str| NetPolicyError::Resolve { entry: entry.to_owned(), reason: reason.to_owned() };
        let mut parts = entry.splitn(3, ':');
        let (Some(host), Some(port), Some(addr)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad("the form is HOST:PORT:ADDRESS"));
        };
        let port = port.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| bad("the port is not 1 to 65535"))?;
        let addr = addr
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .map_err(|_| bad("the address is not an IPv4 or IPv6 address"))?;
        if HostPattern::parse(host).is_err() || host.starts_with("*.") {
            return Err(bad("the host is not a DNS name"));
        }
        self.entries.push((host.trim_end_matches('.').to_ascii_lowercase(), port, addr));
        Ok(self)
    }

    /// Every `HOST:PORT:ADDRESS` entry of a list (`--net-resolve` given again and again).
    pub fn entries(entries: &[String]) -> Result<Self, NetPolicyError> {
        entries.iter().try_fold(Self::new(), |r, e| r.entry(e))
    }

    /// The address `host:port` is pointed at, if an entry names it.
    #[must_use]
    pub fn lookup(&self, host: &str, port: u16) -> Option<IpAddr> {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.entries.iter().find(|(h, p, _)| *h == host && *p == port).map(|(_, _, a)| *a)
    }
}

/// The policy every connection of a run is decided by.
#[derive(Debug, Clone)]
pub struct NetPolicy {
    policy: Arc<Policy>,
}

impl NetPolicy {
    /// The registry a network policy is written against: [`NET_TOOL`] and its arguments.
    #[must_use]
    pub fn registry() -> Registry {
        Registry::new().with(
            ToolSpec::new(NET_TOOL)
                .metered()
                .arg("host", ArgType::String, true)
                .arg("port", ArgType::Integer, true)
                .arg("scheme", ArgType::String, true)
                .arg("method", ArgType::String, false)
                .arg("path", ArgType::String, false),
        )
    }

    /// A policy that allows exactly these `--allow-net` entries (and denies the rest).
    pub fn allow(rules: &[NetRule]) -> Result<Self, NetPolicyError> {
        let mut seen = std::collections::BTreeSet::new();
        let rules = rules.iter().filter(|r| seen.insert(r.rule_id())).map(NetRule::rule).collect();
        let policy = Policy::new(Self::registry(), rules, None).map_err(|e| NetPolicyError::Policy(e.to_string()))?;
        Ok(Self { policy: Arc::new(policy) })
    }

    /// A policy that allows exactly these `--allow-net` entries, as written (each parsed by
    /// [`NetRule::parse`]).
    pub fn allow_entries(entries: &[String]) -> Result<Self, NetPolicyError> {
        Self::allow(&entries.iter().map(|e| NetRule::parse(e)).collect::<Result<Vec<_>, _>>()?)
    }

    /// A policy file (`--net-policy`): rules over [`NET_TOOL`], with limits and examples.
    pub fn from_toml(text: &str) -> Result<Self, NetPolicyError> {
        let policy = Policy::from_toml(text, &Self::registry()).map_err(|e| NetPolicyError::Policy(e.to_string()))?;
        Ok(Self { policy: Arc::new(policy) })
    }

    /// The policy.
    #[must_use]
    pub fn policy(&self) -> &Arc<Policy> {
        &self.policy
    }

    /// True if the rule `rule` names the address `ip` literally in its `host` predicate: a
    /// `hosts` block that holds it, or a `const`/`one_of` string that is it. A connection to
    /// an address literal that is no public address ([`crate::reachable`]) needs this: a
    /// rule that allows any host on a port, or matches hosts by regex, does not open the
    /// host's own loopback or LAN (G3).
    #[must_use]
    pub fn names_literally(&self, rule: &str, ip: IpAddr) -> bool {
        let is_ip = |v: &serde_json::Value| {
            v.as_str().and_then(|s| s.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().ok()) == Some(ip)
        };
        let text = ip.to_string();
        self.policy.rules().filter(|r| r.id() == rule).flat_map(|r| r.predicates_on("host")).any(|p| match p {
            Predicate::Hosts(patterns) => {
                patterns.iter().any(|h| matches!(h, HostPattern::Block(..)) && h.matches(&text))
            }
            Predicate::Const(v) => is_ip(v),
            Predicate::OneOf(vs) => vs.iter().any(is_ip),
            _ => false,
        })
    }
}
