//! A sandbox's metrics (`GET /sandboxes/{id}/metrics`): a sample of its session's usage
//! ([`Session::usage`]: its cgroup's memory and CPU time, its home's filesystem) every
//! [`SAMPLE_EVERY`], taken by the server's reaper off the async workers, the latest
//! [`MAX_SAMPLES`] kept: a bounded history per sandbox, gone with it.

use std::collections::VecDeque;

use stockade_protocol::e2b as wire;

#[allow(clippy::wildcard_imports, reason = "the server's own items")]
use super::*;

/// How often a sandbox's usage is sampled (E2B's collection interval).
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// Most samples a sandbox keeps: an hour of them.
pub(crate) const MAX_SAMPLES: usize = 720;

/// One sample.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    unix: i64,
    cpu_pct: f64,
    usage: stockade_runtime::session::Usage,
}

/// A sandbox's samples, and when the last was taken (with the CPU time then).
#[derive(Debug, Default)]
pub(crate) struct MetricLog {
    samples: VecDeque<Sample>,
    last: Option<(Instant, u64)>,
    taking: bool,
}

/// The host's CPUs, which a sandbox may use all of.
fn cpu_count() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX))
}

fn unix_now() -> i64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(0))
}

impl MetricLog {
    /// Whether a sample is due ([`SAMPLE_EVERY`] after the last, or after the sandbox was
    /// made; always, with `now_anyway`) and none is being taken; if so, it is claimed. A
    /// sandbox that lives less than [`SAMPLE_EVERY`] costs its owner no sample unless one is
    /// asked for.
    fn claim(&mut self, now: Instant, started: Instant, now_anyway: bool) -> bool {
        let since = self.last.map_or(started, |(at, _)| at);
        let due = !self.taking && (now_anyway || now.duration_since(since) >= SAMPLE_EVERY);
        self.taking |= due;
        due
    }

    /// Adds a sample: its CPU share is the CPU time since the last sample (or since the
    /// sandbox started) over the wall time between, across every CPU.
    fn push(&mut self, usage: Option<stockade_runtime::session::Usage>, now: Instant, started: Instant) {
        self.taking = false;
        let Some(usage) = usage else { return };
        let (since, cpu_before) = self.last.unwrap_or((started, 0));
        let wall = now.duration_since(since).as_nanos().max(1) as f64 * f64::from(cpu_count());
        let cpu_pct = (usage.cpu_ns.saturating_sub(cpu_before) as f64 / wall * 100.0).clamp(0.0, 100.0);
        self.last = Some((now, usage.cpu_ns));
        if self.samples.len() >= MAX_SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back(Sample { unix: unix_now(), cpu_pct, usage });
    }
}

fn sample_json(s: &Sample) -> serde_json::Value {
    let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    serde_json::json!({
        "timestamp": wire::rfc3339(s.unix),
        "timestampUnix": s.unix,
        "cpuCount": cpu_count(),
        "cpuUsedPct": (s.cpu_pct * 100.0).round() / 100.0,
        "memUsed": i(s.usage.memory_bytes),
        "memTotal": i(s.usage.memory_limit),
        "memCache": i(s.usage.memory_cache),
        "diskUsed": i(s.usage.disk_used),
        "diskTotal": i(s.usage.disk_total),
    })
}

impl Sandbox {
    /// Takes a sample if one is due (or, `now_anyway`, if none is being taken).
    pub(crate) async fn sample(&self, started: Instant, now_anyway: bool) {
        let now = Instant::now();
        if !self.metrics().claim(now, started, now_anyway) {
            return;
        }
        let usage = self.session.usage().await;
        self.metrics().push(usage, now, started);
    }

    pub(crate) fn metrics(&self) -> std::sync::MutexGuard<'_, MetricLog> {
        self.metrics.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl E2bServer {
    /// `GET /sandboxes/{id}/metrics?start=&end=`: the samples between `start` and `end`
    /// (unix seconds; the sandbox's whole life by default), a first one taken now if it
    /// has none yet.
    pub(crate) async fn metrics(&self, id: &str, req: &Request<hyper::body::Incoming>) -> Response<Body> {
        let Some(b) = self.sandbox(id) else {
            return api_error(StatusCode::NOT_FOUND, &format!("sandbox {id} not found"));
        };
        let q = query(req);
        let bound = |k: &str| q.get(k).map(|v| v.parse::<i64>().map_err(|_| format!("{k}: not a unix time")));
        let (start, end) = match (bound("start").transpose(), bound("end").transpose()) {
            (Ok(s), Ok(e)) => (s.unwrap_or(i64::MIN), e.unwrap_or(i64::MAX)),
            (Err(e), _) | (_, Err(e)) => return api_error(StatusCode::BAD_REQUEST, &e),
        };
        if b.metrics().samples.is_empty() {
            b.sample(b.made, true).await;
        }
        let out: Vec<serde_json::Value> =
            b.metrics().samples.iter().filter(|s| (start..=end).contains(&s.unix)).map(sample_json).collect();
        json(StatusCode::OK, &out)
    }
}
