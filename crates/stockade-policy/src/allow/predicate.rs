//! Argument predicates. Each is total, pure and linear in the size of the value it reads.

use std::cell::RefCell;
use std::cmp::Ordering;
use std::sync::Arc;

use regex::Regex;
use serde_json::Value;

use super::Source;
use super::registry::ArgType;

/// Largest compiled regex program: 1 MiB. Bounds the cost of loading a hostile policy.
pub const MAX_REGEX_SIZE: usize = 1 << 20;

/// Which sources a `source` predicate accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SourceReq {
    /// The user or the host's configuration.
    Trusted,
    /// Only the user.
    User,
    /// Only the host's configuration.
    Config,
}

impl SourceReq {
    fn accepts(self, source: &Source) -> bool {
        match self {
            Self::Trusted => matches!(source, Source::User | Source::Config),
            Self::User => matches!(source, Source::User),
            Self::Config => matches!(source, Source::Config),
        }
    }
}

/// A condition on one argument value.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Predicate {
    /// Equal to this JSON value.
    Const(Value),
    /// Equal to one of these JSON values.
    OneOf(Vec<Value>),
    /// A number within the inclusive bounds, compared exactly (an integer is never rounded
    /// to a float first: 2^53 + 1 is over a maximum of 2^53).
    Range {
        /// Lower bound, if any.
        min: Option<Bound>,
        /// Upper bound, if any.
        max: Option<Bound>,
    },
    /// A string of at most this many characters, or an array of at most this many items.
    MaxLen(usize),
    /// A string matching this regex in full (it is anchored as `^(?:…)$`). A policy shares
    /// one compiled regex among all rules with the same pattern.
    Pattern(Arc<Regex>),
    /// An absolute path that, after lexical normalisation (`.` and `..` resolved without
    /// touching the filesystem), lies inside this normalised prefix.
    PathPrefix(Vec<String>),
    /// An `http` or `https` URL whose host is one of these (a `*.` entry also allows its
    /// subdomains), read so that curl, Python and a browser read the same host; a URL they
    /// could read differently (userinfo, a backslash, a control byte, an encoded or
    /// normalised host, an odd port) matches nothing.
    UrlHost(Vec<String>),
    /// A network host (a DNS name or an IP literal, as a connection names it) that one of
    /// these patterns matches: see [`HostPattern`].
    Hosts(Vec<HostPattern>),
    /// The argument came from an accepted source.
    Source(SourceReq),
}

impl Predicate {
    /// An anchored regex predicate; fails on an invalid or oversized pattern.
    pub fn pattern(pattern: &str) -> Result<Self, regex::Error> {
        regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
            .size_limit(MAX_REGEX_SIZE)
            .dfa_size_limit(MAX_REGEX_SIZE)
            .build()
            .map(|re| Self::Pattern(Arc::new(re)))
    }

    /// A path-prefix predicate; `None` if `prefix` is not an absolute path that normalises
    /// without escaping `/`.
    #[must_use]
    pub fn path_prefix(prefix: &str) -> Option<Self> {
        normalise_path(prefix).map(Self::PathPrefix)
    }

    /// A URL-host predicate; hosts are compared in lower case.
    #[must_use]
    pub fn url_hosts<I: IntoIterator<Item = S>, S: Into<String>>(hosts: I) -> Self {
        Self::UrlHost(hosts.into_iter().map(|h| h.into().to_ascii_lowercase()).collect())
    }

    /// A network-host predicate; `Err` names the first entry that is not a [`HostPattern`].
    pub fn hosts<'a, I: IntoIterator<Item = &'a str>>(patterns: I) -> Result<Self, String> {
        patterns.into_iter().map(HostPattern::parse).collect::<Result<_, _>>().map(Self::Hosts)
    }

    /// True if `value` (from `source`) satisfies the predicate.
    pub(crate) fn holds(&self, value: &Value, source: &Source) -> bool {
        self.holds_memo(value, source, &Memo::default())
    }

    /// [`holds`](Self::holds), reusing parsed URLs and normalised paths from `memo`.
    pub(crate) fn holds_memo<'v>(&self, value: &'v Value, source: &Source, memo: &Memo<'v>) -> bool {
        match self {
            Self::Const(c) => value == c,
            Self::OneOf(set) => set.contains(value),
            Self::Range { min, max } => match value {
                Value::Number(n) => {
                    min.is_none_or(|m| m.cmp_number(n).is_some_and(Ordering::is_le))
                        && max.is_none_or(|m| m.cmp_number(n).is_some_and(Ordering::is_ge))
                }
                _ => false,
            },
            Self::MaxLen(n) => match value {
                Value::String(s) => s.chars().count() <= *n,
                Value::Array(a) => a.len() <= *n,
                _ => false,
            },
            Self::Pattern(re) => memo.pattern(re, value),
            Self::PathPrefix(prefix) => {
                memo.path(value, |p| p.len() >= prefix.len() && p.iter().zip(prefix).all(|(a, b)| *a == b.as_str()))
            }
            Self::UrlHost(hosts) => memo.host(value, |h| host_allowed(h, hosts)),
            Self::Hosts(patterns) => value.as_str().is_some_and(|h| HostPattern::any_matches(patterns, h)),
            Self::Source(req) => req.accepts(source),
        }
    }

    /// True if the predicate can apply to an argument of type `ty`.
    pub(crate) fn fits(&self, ty: &ArgType) -> bool {
        match self {
            Self::Const(v) => super::registry::check_value(ty, v, "").is_ok(),
            Self::OneOf(vs) => vs.iter().all(|v| super::registry::check_value(ty, v, "").is_ok()),
            Self::Range { .. } => matches!(ty, ArgType::Integer | ArgType::Number),
            Self::MaxLen(_) => matches!(ty, ArgType::String | ArgType::Array(_)),
            Self::Pattern(_) | Self::PathPrefix(_) | Self::UrlHost(_) | Self::Hosts(_) => {
                matches!(ty, ArgType::String)
            }
            Self::Source(_) => true,
        }
    }

    /// The finite set of values this predicate allows, if it has one.
    pub(crate) fn candidates(&self) -> Option<&[Value]> {
        match self {
            Self::Const(v) => Some(std::slice::from_ref(v)),
            Self::OneOf(vs) => Some(vs),
            _ => None,
        }
    }

    /// True if no value can satisfy the predicate on its own.
    pub(crate) fn is_empty(&self) -> bool {
        match self {
            Self::OneOf(vs) => vs.is_empty(),
            Self::Range { min: Some(lo), max: Some(hi) } => lo.cmp_bound(*hi) == Some(Ordering::Greater),
            Self::UrlHost(hosts) => hosts.is_empty(),
            Self::Hosts(patterns) => patterns.is_empty(),
            _ => false,
        }
    }
}

/// A bound of [`Predicate::Range`], kept as the policy wrote it: an integer exactly, a
/// float as a float (never NaN: the document refuses it).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Bound {
    /// An integer bound.
    Int(i64),
    /// A floating-point bound.
    Float(f64),
}

impl From<i64> for Bound {
    fn from(n: i64) -> Self {
        Self::Int(n)
    }
}

impl From<f64> for Bound {
    fn from(n: f64) -> Self {
        Self::Float(n)
    }
}

/// A number read exactly: a JSON integer (as `i64` or `u64`) widened, never rounded.
#[derive(Clone, Copy)]
enum Exact {
    Int(i128),
    Float(f64),
}

impl Exact {
    fn of(n: &serde_json::Number) -> Option<Self> {
        match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Some(Self::Int(i128::from(i))),
            (None, Some(u), _) => Some(Self::Int(i128::from(u))),
            (None, None, Some(f)) if f.is_finite() => Some(Self::Float(f)),
            _ => None,
        }
    }

    /// `self` against `other`, exactly; `None` only for a NaN.
    fn cmp(self, other: Self) -> Option<Ordering> {
        match (self, other) {
            (Self::Int(a), Self::Int(b)) => Some(a.cmp(&b)),
            (Self::Float(a), Self::Float(b)) => a.partial_cmp(&b),
            (Self::Int(a), Self::Float(b)) => int_cmp_float(a, b),
            (Self::Float(a), Self::Int(b)) => int_cmp_float(b, a).map(Ordering::reverse),
        }
    }
}

/// An integer against a float, exactly: the float's floor is an integer (exact in `i128`
/// for any float below 2^127 in magnitude), and its fraction breaks a tie.
fn int_cmp_float(i: i128, f: f64) -> Option<Ordering> {
    const TWO_127: f64 = 170_141_183_460_469_231_731_687_303_715_884_105_728.0;
    if f.is_nan() {
        return None;
    }
    if f >= TWO_127 {
        return Some(Ordering::Less);
    }
    if f < -TWO_127 {
        return Some(Ordering::Greater);
    }
    let floor = f.floor();
    // In range and integral, so the conversion is exact.
    #[allow(clippy::cast_possible_truncation, reason = "floor is integral and within i128's range")]
    let whole = floor as i128;
    Some(match i.cmp(&whole) {
        Ordering::Equal if f > floor => Ordering::Less,
        other => other,
    })
}

impl Bound {
    fn exact(self) -> Exact {
        match self {
            Self::Int(i) => Exact::Int(i128::from(i)),
            Self::Float(f) => Exact::Float(f),
        }
    }

    /// The bound against the number `n`: `Less` when the bound is below it.
    fn cmp_number(self, n: &serde_json::Number) -> Option<Ordering> {
        self.exact().cmp(Exact::of(n)?)
    }

    fn cmp_bound(self, other: Self) -> Option<Ordering> {
        self.exact().cmp(other.exact())
    }
}

/// Derived values by argument value (compared by address).
type Cache<'v, T> = RefCell<Vec<(&'v Value, Option<T>)>>;

/// Per-decision cache of derived values (parsed URL hosts, normalised paths), keyed by the
/// address of the argument value, so each is computed once however many rules read it.
#[derive(Default)]
pub(crate) struct Memo<'v> {
    hosts: Cache<'v, String>,
    paths: Cache<'v, Vec<&'v str>>,
    patterns: RefCell<Vec<(*const Regex, &'v Value, bool)>>,
}

impl<'v> Memo<'v> {
    fn cached<T>(
        cache: &Cache<'v, T>,
        value: &'v Value,
        derive: impl FnOnce(&'v str) -> Option<T>,
        test: impl FnOnce(&T) -> bool,
    ) -> bool {
        let mut cache = cache.borrow_mut();
        let i = match cache.iter().position(|(v, _)| std::ptr::eq(*v, value)) {
            Some(i) => i,
            None => {
                cache.push((value, value.as_str().and_then(derive)));
                cache.len() - 1
            }
        };
        cache[i].1.as_ref().is_some_and(test)
    }

    fn pattern(&self, re: &Arc<Regex>, value: &'v Value) -> bool {
        let key = Arc::as_ptr(re);
        let mut cache = self.patterns.borrow_mut();
        if let Some((_, _, hit)) = cache.iter().find(|(r, v, _)| std::ptr::eq(*r, key) && std::ptr::eq(*v, value)) {
            return *hit;
        }
        let hit = value.as_str().is_some_and(|s| re.is_match(s));
        cache.push((key, value, hit));
        hit
    }

    fn host(&self, value: &'v Value, test: impl FnOnce(&str) -> bool) -> bool {
        Self::cached(&self.hosts, value, url_host, |h| test(h))
    }

    fn path(&self, value: &'v Value, test: impl FnOnce(&[&str]) -> bool) -> bool {
        Self::cached(&self.paths, value, normalise_components, |p| test(p))
    }
}

/// Lexically normalises an absolute POSIX path into its components. Returns `None` for a
/// relative path, a NUL byte, or a `..` that would climb above `/`.
#[must_use]
pub fn normalise_path(path: &str) -> Option<Vec<String>> {
    normalise_components(path).map(|parts| parts.into_iter().map(str::to_owned).collect())
}

fn normalise_components(path: &str) -> Option<Vec<&str>> {
    if !path.starts_with('/') || path.contains('\0') {
        return None;
    }
    let mut parts = Vec::new();
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            s => parts.push(s),
        }
    }
    Some(parts)
}

/// The lower-case host of an `http`/`https` URL, read so that every client that fetches it
/// reads the same host (curl, Python's `urlsplit`, browsers' WHATWG parse), or `None`.
/// Refused, since readers differ on them: any byte that is a control, a space, a backslash
/// or not ASCII (WHATWG drops tabs and newlines and reads `\` as `/`; curl does not);
/// anything but `scheme://` at the start; userinfo (`user@`, which a `\` can hide from one
/// reader and not another); a `%` in the authority (WHATWG decodes a host; others do not);
/// a port that is not 1 to 5 digits without a leading zero. Last, the WHATWG parse's host
/// must be the authority's own, so no reader normalises one into another (`0x7f.1`).
fn url_host(s: &str) -> Option<String> {
    if s.bytes().any(|b| b <= b' ' || b == 0x7f || b == b'\\' || !b.is_ascii()) {
        return None;
    }
    let (scheme, rest) = s.split_once("://")?;
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return None;
    }
    let authority = rest.split(['/', '?', '#']).next()?;
    if authority.contains(['@', '%']) {
        return None;
    }
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (h, after) = v6.split_once(']')?;
            (format!("[{h}]"), after.strip_prefix(':'))
        }
        None => match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (authority.to_owned(), None),
        },
    };
    if let Some(p) = port {
        let canonical = !p.is_empty() && p.len() <= 5 && !p.starts_with('0') && p.bytes().all(|b| b.is_ascii_digit());
        if !canonical || p.parse::<u16>().is_err() {
            return None;
        }
    }
    let url = url::Url::parse(s).ok()?;
    let parsed = url.host_str()?.trim_end_matches('.').to_ascii_lowercase();
    (parsed == host.trim_end_matches('.').to_ascii_lowercase()).then_some(parsed)
}

fn host_allowed(host: &str, allowed: &[String]) -> bool {
    allowed.iter().any(|a| match a.strip_prefix("*.") {
        Some(base) => is_subdomain(host, base),
        None => host == a,
    })
}

/// True if `host` is a subdomain of `base` (never `base` itself).
fn is_subdomain(host: &str, base: &str) -> bool {
    host.len() > base.len() + 1 && host.ends_with(base) && host[..host.len() - base.len()].ends_with('.')
}

/// One entry of a `hosts` predicate, matched against the host a connection names.
///
/// - `example.org`: that name only (compared in lower case, a trailing dot ignored);
/// - `*.example.org`: its subdomains only, never `example.org` itself (list it too for both);
/// - `192.0.2.7`, `2001:db8::1`: that address only, when the connection names it literally;
/// - `192.0.2.0/24`, `2001:db8::/32`: an address literal inside the block.
///
/// A name never matches an address pattern: what a name resolves to is the resolver's to
/// say, decided after this (a name is matched on the name).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HostPattern {
    /// A DNS name, exactly.
    Name(String),
    /// A DNS name's subdomains (the base, without `*.`).
    Subdomains(String),
    /// An address block (an address is a block of its full length).
    Block(std::net::IpAddr, u8),
}

impl HostPattern {
    /// Parses one entry; the error says why it is none of the forms.
    pub fn parse(entry: &str) -> Result<Self, String> {
        let bad = |why: &str| Err(format!("{entry:?} is not a host pattern: {why}"));
        if let Some((addr, len)) = entry.split_once('/') {
            let Ok(addr) = addr.parse::<std::net::IpAddr>() else { return bad("a block is ADDRESS/LENGTH") };
            let max = if addr.is_ipv4() { 32 } else { 128 };
            return match len.parse::<u8>() {
                Ok(len) if len <= max => Ok(Self::Block(addr, len)),
                _ => bad("the block's length is out of range"),
            };
        }
        if let Ok(addr) = entry.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>() {
            return Ok(Self::Block(addr, if addr.is_ipv4() { 32 } else { 128 }));
        }
        let (wild, name) = match entry.strip_prefix("*.") {
            Some(base) => (true, base),
            None => (false, entry),
        };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let label_ok = |l: &str| {
            !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
            return bad(
                "a name is dot-separated labels of letters, digits, `-` and `_` (a `*.` prefix for subdomains)",
            );
        }
        Ok(if wild { Self::Subdomains(name) } else { Self::Name(name) })
    }

    /// True if this pattern matches `host` (a name or an address literal, IPv6 with or
    /// without brackets).
    #[must_use]
    pub fn matches(&self, host: &str) -> bool {
        Self::any_matches(std::slice::from_ref(self), host)
    }

    fn any_matches(patterns: &[Self], host: &str) -> bool {
        let literal = host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>().ok();
        let name = host.trim_end_matches('.').to_ascii_lowercase();
        patterns.iter().any(|p| match (p, literal) {
            (Self::Block(block, len), Some(addr)) => in_block(addr, *block, *len),
            (Self::Name(n), None) => *n == name,
            (Self::Subdomains(base), None) => is_subdomain(&name, base),
            _ => false,
        })
    }
}

/// True if `addr` lies in `block/len` (an IPv4-mapped IPv6 address is never an IPv4 one).
fn in_block(addr: std::net::IpAddr, block: std::net::IpAddr, len: u8) -> bool {
    use std::net::IpAddr;
    match (addr, block) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            u32::from(a) & mask == u32::from(b) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            u128::from(a) & mask == u128::from(b) & mask
        }
        _ => false,
    }
}
