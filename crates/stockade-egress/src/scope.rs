//! A run's scope: allow and deny lists laid over a grant's policy, which the grant's owner
//! may replace while the run goes on (E2B's `allowOut`, `denyOut` and `update_network`).
//!
//! The policy decides first; a scope can only narrow what it allows, never widen it. Within
//! the policy's yes, a connection is in scope if its target matches an `allow` entry, or
//! matches no `deny` entry: allow wins over deny, as E2B's firewall has it. Entries are
//! names (`example.org`), subdomains (`*.example.org`), addresses and blocks
//! (`198.51.100.0/24`); `0.0.0.0/0` (E2B's `ALL_TRAFFIC`) is every address of both families.
//! A name is judged as the guest named it; an address (a literal the guest named, or each
//! address a name resolves to) against the blocks, so `deny = ["8.8.8.0/24"]` holds for a
//! name that resolves there too.

use std::net::IpAddr;
use std::sync::{Arc, PoisonError, RwLock};

use stockade_policy::allow::HostPattern;

use crate::policy::NetPolicyError;

/// The lists a scope holds: what it allows and what it denies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScopeRules {
    allow: Vec<HostPattern>,
    deny: Vec<HostPattern>,
}

/// Where a name stands in a scope before it is resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameScope {
    /// An `allow` entry names it: every address it resolves to is in scope.
    Allowed,
    /// A `deny` entry names it (and no `allow` entry does).
    Denied,
    /// Neither: its addresses are judged one by one.
    ByAddress,
}

impl ScopeRules {
    /// The lists, each entry parsed (one bad entry fails the whole, naming it).
    pub fn parse(allow: &[String], deny: &[String]) -> Result<Self, NetPolicyError> {
        let parse = |entries: &[String], list: &str| -> Result<Vec<HostPattern>, NetPolicyError> {
            let mut out = Vec::new();
            for e in entries {
                let bad = |reason: String| NetPolicyError::Rule { entry: format!("{list} {e}"), reason };
                if e == "0.0.0.0/0" || e == "ALL_TRAFFIC" {
                    out.push(HostPattern::Block(IpAddr::from([0, 0, 0, 0]), 0));
                    out.push(HostPattern::Block(IpAddr::from([0u16; 8]), 0));
                } else {
                    out.push(HostPattern::parse(e).map_err(bad)?);
                }
            }
            Ok(out)
        };
        Ok(Self { allow: parse(allow, "allow")?, deny: parse(deny, "deny")? })
    }

    /// True if nothing is denied: an allow list alone narrows nothing, so everything the
    /// policy allows is in scope.
    #[must_use]
    pub fn is_open(&self) -> bool {
        self.deny.is_empty()
    }

    pub(crate) fn name(&self, host: &str) -> NameScope {
        let text = host.trim_start_matches('[').trim_end_matches(']');
        if text.parse::<IpAddr>().is_ok() {
            return NameScope::ByAddress;
        }
        if self.allow.iter().any(|p| p.matches(text)) {
            NameScope::Allowed
        } else if self
            .deny
            .iter()
            .any(|p| matches!(p, HostPattern::Name(_) | HostPattern::Subdomains(_)) && p.matches(text))
        {
            NameScope::Denied
        } else {
            NameScope::ByAddress
        }
    }

    pub(crate) fn address(&self, ip: IpAddr) -> bool {
        let text = ip.to_string();
        let blocks =
            |list: &[HostPattern]| list.iter().any(|p| matches!(p, HostPattern::Block(..)) && p.matches(&text));
        blocks(&self.allow) || !blocks(&self.deny)
    }
}

/// A run's scope, shared between the run's proxy and whoever may replace it. A clone is the
/// same scope; [`NetScope::set`] takes effect for every connection decided after it (one
/// already open goes on).
#[derive(Debug, Clone, Default)]
pub struct NetScope(Arc<RwLock<Arc<ScopeRules>>>);

impl NetScope {
    /// A scope holding `rules`.
    #[must_use]
    pub fn new(rules: ScopeRules) -> Self {
        Self(Arc::new(RwLock::new(Arc::new(rules))))
    }

    /// Replaces the rules, all at once.
    pub fn set(&self, rules: ScopeRules) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(rules);
    }

    /// The rules now.
    #[must_use]
    pub fn rules(&self) -> Arc<ScopeRules> {
        self.0.read().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;

    fn rules(allow: &[&str], deny: &[&str]) -> ScopeRules {
        let own = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        ScopeRules::parse(&own(allow), &own(deny)).unwrap()
    }

    #[test]
    fn allow_wins_over_deny_and_all_traffic_is_both_families() {
        let r = rules(&["api.example.org", "198.51.100.7"], &["0.0.0.0/0"]);
        assert_eq!(r.name("api.example.org"), NameScope::Allowed);
        assert_eq!(r.name("other.example.org"), NameScope::ByAddress);
        assert!(r.address("198.51.100.7".parse().unwrap()));
        assert!(!r.address("198.51.100.8".parse().unwrap()));
        assert!(!r.address("2001:db8::1".parse().unwrap()), "ALL_TRAFFIC holds IPv6 too");
    }

    #[test]
    fn a_deny_block_holds_for_the_addresses_a_name_resolves_to() {
        let r = rules(&[], &["203.0.113.0/24", "blocked.example"]);
        assert_eq!(r.name("fine.example"), NameScope::ByAddress);
        assert!(!r.address("203.0.113.9".parse().unwrap()));
        assert!(r.address("192.0.2.1".parse().unwrap()));
        assert_eq!(r.name("blocked.example"), NameScope::Denied);
        assert!(rules(&[], &[]).is_open());
    }

    #[test]
    fn a_bad_entry_is_named() {
        let e = ScopeRules::parse(&[], &["10.0.0.0/99".to_owned()]).unwrap_err();
        assert!(e.to_string().contains("deny 10.0.0.0/99"), "{e}");
    }

    #[test]
    fn a_set_is_seen_by_every_clone() {
        let scope = NetScope::new(rules(&[], &[]));
        let seen = scope.clone();
        scope.set(rules(&[], &["0.0.0.0/0"]));
        assert!(!seen.rules().address("192.0.2.1".parse().unwrap()));
    }
}
