//! [`Gate`]: the one way from a proposed call to a permit. Every caller that runs calls (the
//! agent's loop, a sandbox's grants broker, `stockade mcp`) goes through it, so deciding and
//! counting cannot drift apart.

use std::sync::Arc;
use std::time::Duration;

use super::{Approval, Context, Decision, Ledger, Permit, Policy, ToolCall};

/// The built-in rules that refuse a call's arguments (not the call itself): a caller may
/// answer them as an argument error rather than a denial.
const ARGUMENT_RULES: &[&str] = &["bad-argument", "unknown-argument"];

/// A policy with the ledger of one session: [`decide`](Self::decide) authorises a call and,
/// when it is allowed, records the permit in the ledger in the same step, before the caller
/// can run it. A caller therefore cannot run a permit the ledger did not count, nor count a
/// call that was not allowed. Pure, like [`Policy::authorize`]: the caller passes the time.
#[derive(Debug, Clone)]
pub struct Gate {
    policy: Arc<Policy>,
    ledger: Ledger,
    read_untrusted: bool,
}

/// Why a call made with no one to ask ([`Gate::decide_unattended`]) does not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RefusalKind {
    /// The arguments are not the tool's (an unknown, mistyped or missing argument).
    BadArguments,
    /// A rule, or the default, denies the call.
    Denied,
    /// A rule asks for a human's approval, and no one can give it here.
    NeedsApproval,
}

/// A call [`Gate::decide_unattended`] refused: the rule that decided, why, and which kind of
/// refusal it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The kind.
    pub kind: RefusalKind,
    /// The rule that decided.
    pub rule: String,
    /// Why, in words that can be shown to the caller.
    pub reason: String,
}

impl Gate {
    /// A gate over `policy`, with an empty ledger.
    #[must_use]
    pub fn new(policy: impl Into<Arc<Policy>>) -> Self {
        Self { policy: policy.into(), ledger: Ledger::new(), read_untrusted: false }
    }

    /// The policy.
    #[must_use]
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The calls allowed so far.
    #[must_use]
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Marks the session as having read untrusted output (rules with `when_read_untrusted`
    /// then apply) from now on.
    pub fn set_read_untrusted(&mut self) {
        self.read_untrusted = true;
    }

    /// Whether the session has read untrusted output.
    #[must_use]
    pub fn has_read_untrusted(&self) -> bool {
        self.read_untrusted
    }

    /// Decides `call` at `now` (the session's clock); an allow is recorded in the ledger.
    pub fn decide(&mut self, call: &ToolCall, now: Duration) -> Decision {
        self.record(call, now, None)
    }

    /// Like [`decide`](Self::decide), with a human's single-use `approval` for exactly this
    /// call (see [`Policy::authorize_approved`]).
    pub fn decide_approved(&mut self, call: &ToolCall, now: Duration, approval: Approval) -> Decision {
        self.record(call, now, Some(approval))
    }

    /// For a caller no human answers (a sandbox's broker, an MCP client): the permit, or why
    /// not, with an `ask` refused as [`RefusalKind::NeedsApproval`].
    pub fn decide_unattended(&mut self, call: &ToolCall, now: Duration) -> Result<Permit, Refused> {
        match self.decide(call, now) {
            Decision::Allow(permit) => Ok(permit),
            Decision::Ask { rule, reason, .. } => Err(Refused { kind: RefusalKind::NeedsApproval, rule, reason }),
            Decision::Deny { rule, reason } => {
                let kind = if ARGUMENT_RULES.contains(&rule.as_str()) {
                    RefusalKind::BadArguments
                } else {
                    RefusalKind::Denied
                };
                Err(Refused { kind, rule, reason })
            }
        }
    }

    fn record(&mut self, call: &ToolCall, now: Duration, approval: Option<Approval>) -> Decision {
        let ctx = Context::new(&self.ledger, now).read_untrusted(self.read_untrusted);
        let decision = match approval {
            Some(a) => self.policy.authorize_approved(call, &ctx, a),
            None => self.policy.authorize(call, &ctx),
        };
        if let Decision::Allow(permit) = &decision {
            self.ledger.record(permit, now);
        }
        decision
    }
}
