//! What a caller demands of a run before it trusts the output.

use std::fmt;
use std::time::Duration;

use serde::de::DeserializeOwned;
use stockade_protocol::Mechanism;
use stockade_protocol::json::{JsonLimits, MAX_JSON_DEPTH, parse_untrusted};

/// A deadline and an output budget. Both are required; there is no default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    deadline: Duration,
    max_output: u64,
}

impl Budget {
    /// A run must finish within `deadline` and write at most `max_output` bytes to stdout.
    #[must_use]
    pub const fn new(deadline: Duration, max_output: u64) -> Self {
        Self { deadline, max_output }
    }

    /// The wall-clock deadline.
    #[must_use]
    pub const fn deadline(&self) -> Duration {
        self.deadline
    }

    /// The stdout budget in bytes.
    #[must_use]
    pub const fn max_output(&self) -> u64 {
        self.max_output
    }
}

type ParseFn<T> = fn(&[u8], u64) -> Result<T, String>;
type AssertFn<T> = Box<dyn Fn(&T) -> Result<(), String> + Send + Sync>;

/// The caller's demands: a [`Budget`], a parser from stdout to `T`, an assertion on `T`,
/// the exit code to expect (0), and the enforcement mechanisms that must have been active
/// (none unless [`require`](Self::require)d).
pub struct Contract<T> {
    budget: Budget,
    parse: ParseFn<T>,
    assertion: AssertFn<T>,
    expected_exit: i32,
    required: Vec<Mechanism>,
    no_denied_grants: bool,
}

impl<T> fmt::Debug for Contract<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Contract")
            .field("budget", &self.budget)
            .field("expected_exit", &self.expected_exit)
            .field("required", &self.required)
            .field("no_denied_grants", &self.no_denied_grants)
            .finish_non_exhaustive()
    }
}

/// An assertion that accepts every value. Its name is the warning: the contract then
/// checks only the deadline, the budget, the exit code and the parse.
pub fn accept_any<T>(_: &T) -> Result<(), String> {
    Ok(())
}

fn parse_json<T: DeserializeOwned>(bytes: &[u8], max: u64) -> Result<T, String> {
    let max = usize::try_from(max).unwrap_or(usize::MAX);
    parse_untrusted(bytes, JsonLimits::new(max, MAX_JSON_DEPTH)).map_err(|e| e.to_string())
}

fn parse_text(bytes: &[u8], _: u64) -> Result<String, String> {
    String::from_utf8(bytes.to_vec()).map_err(|e| format!("stdout is not utf-8: {}", e.utf8_error()))
}

fn parse_bytes(bytes: &[u8], _: u64) -> Result<Vec<u8>, String> {
    Ok(bytes.to_vec())
}

impl<T> Contract<T> {
    fn with_parser(
        budget: Budget,
        parse: ParseFn<T>,
        assertion: impl Fn(&T) -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        Self {
            budget,
            parse,
            assertion: Box::new(assertion),
            expected_exit: 0,
            required: Vec::new(),
            no_denied_grants: false,
        }
    }

    /// Requires that the report lists `mechanism` as enforced.
    #[must_use]
    pub fn require(mut self, mechanism: Mechanism) -> Self {
        if !self.required.contains(&mechanism) {
            self.required.push(mechanism);
        }
        self
    }

    /// Refuses a run in which the broker denied any grant call, or ended the broker
    /// session early (a malformed frame, a flood): [`crate::Refusal::GrantDenied`].
    #[must_use]
    pub fn no_denied_grants(mut self) -> Self {
        self.no_denied_grants = true;
        self
    }

    /// Whether a denied grant call refuses the run.
    #[must_use]
    pub fn denies_on_denied_grants(&self) -> bool {
        self.no_denied_grants
    }

    /// Expects exit code `code` instead of 0.
    #[must_use]
    pub fn expect_exit(mut self, code: i32) -> Self {
        self.expected_exit = code;
        self
    }

    /// The budget.
    #[must_use]
    pub fn budget(&self) -> Budget {
        self.budget
    }

    /// The exit code a run must end with.
    #[must_use]
    pub fn expected_exit(&self) -> i32 {
        self.expected_exit
    }

    /// The mechanisms a report must list.
    #[must_use]
    pub fn required(&self) -> &[Mechanism] {
        &self.required
    }

    pub(crate) fn parse(&self, bytes: &[u8]) -> Result<T, String> {
        (self.parse)(bytes, self.budget.max_output)
    }

    pub(crate) fn assertion(&self, value: &T) -> Result<(), String> {
        (self.assertion)(value)
    }
}

impl<T: DeserializeOwned> Contract<T> {
    /// Stdout must be one JSON document of type `T` (unknown keys as `T`'s serde attributes
    /// say; nesting at most 64 levels) that passes `assertion`.
    pub fn json(budget: Budget, assertion: impl Fn(&T) -> Result<(), String> + Send + Sync + 'static) -> Self {
        Self::with_parser(budget, parse_json::<T>, assertion)
    }
}

impl Contract<String> {
    /// Stdout must be UTF-8 text that passes `assertion`.
    pub fn text(budget: Budget, assertion: impl Fn(&String) -> Result<(), String> + Send + Sync + 'static) -> Self {
        Self::with_parser(budget, parse_text, assertion)
    }
}

impl Contract<Vec<u8>> {
    /// Stdout is taken as raw bytes that must pass `assertion`.
    pub fn bytes(budget: Budget, assertion: impl Fn(&Vec<u8>) -> Result<(), String> + Send + Sync + 'static) -> Self {
        Self::with_parser(budget, parse_bytes, assertion)
    }
}
