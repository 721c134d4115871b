//! Call history for stateful limits. The caller owns it, records each executed permit, and
//! passes it to `authorize` by reference, so the decision itself stays pure.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use super::Permit;

/// Timestamps kept per tool: 4096, the largest `max_calls` a limit may name; older calls
/// still count towards totals. Bounds the ledger's memory whatever the session does.
pub const MAX_LEDGER_WINDOW: usize = super::MAX_LIMIT_CALLS as usize;

#[derive(Debug, Clone, Default)]
struct History {
    total: u64,
    recent: VecDeque<Duration>,
}

/// Per-tool call counts and recent call times for one session.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    tools: BTreeMap<String, History>,
}

impl Ledger {
    /// An empty ledger.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that the call named by `permit` was executed at `now`.
    pub fn record(&mut self, permit: &Permit, now: Duration) {
        let h = self.tools.entry(permit.call().tool().to_owned()).or_default();
        h.total += 1;
        if h.recent.len() == MAX_LEDGER_WINDOW {
            h.recent.pop_front();
        }
        h.recent.push_back(now);
    }

    /// Total calls of `tool` recorded so far.
    #[must_use]
    pub fn calls(&self, tool: &str) -> u64 {
        self.tools.get(tool).map_or(0, |h| h.total)
    }

    /// How many call times are kept for `tool` (at most [`MAX_LEDGER_WINDOW`]).
    #[must_use]
    pub fn kept_times(&self, tool: &str) -> usize {
        self.tools.get(tool).map_or(0, |h| h.recent.len())
    }

    /// Calls of tools for which `tool` holds: in total, or within `per` before `now`.
    pub(crate) fn count(&self, tool: impl Fn(&str) -> bool, per: Option<Duration>, now: Duration) -> u64 {
        self.tools
            .iter()
            .filter(|(name, _)| tool(name))
            .map(|(_, h)| match per {
                None => h.total,
                Some(window) => {
                    // The window is (now - per, now]; before `per` has passed, every call is in it.
                    match now.checked_sub(window) {
                        Some(since) => h.recent.iter().rev().take_while(|t| **t > since).count() as u64,
                        None => h.recent.len() as u64,
                    }
                }
            })
            .sum()
    }
}
