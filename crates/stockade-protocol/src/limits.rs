//! Resource limits for one run. Every limit has a safe default and a hard ceiling; there is
//! no "unlimited" value.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Default wall-clock deadline: 10 s.
pub const DEFAULT_WALL: Duration = Duration::from_secs(10);
/// Default CPU time: 10 s.
pub const DEFAULT_CPU: Duration = Duration::from_secs(10);
/// Default memory: 512 MiB.
pub const DEFAULT_MEMORY_BYTES: u64 = 512 << 20;
/// Default number of processes (or threads) the run may have at once: 64.
pub const DEFAULT_PROCESSES: u32 = 64;
/// Default number of open files per process: 256.
pub const DEFAULT_OPEN_FILES: u32 = 256;
/// Default largest file the run may write: 64 MiB.
pub const DEFAULT_FILE_SIZE_BYTES: u64 = 64 << 20;
/// Default stdout budget: 1 MiB.
pub const DEFAULT_STDOUT_BYTES: u64 = 1 << 20;
/// Default stderr budget: 256 KiB.
pub const DEFAULT_STDERR_BYTES: u64 = 256 << 10;

/// Longest deadline (wall or CPU) a job may ask for: 24 h.
///
/// A job is a bounded piece of work; anything longer is a service, not a sandboxed call.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);
/// Most memory a job may ask for: 64 GiB.
pub const MAX_MEMORY_BYTES: u64 = 64 << 30;
/// Most processes a job may ask for: 4096.
///
/// The pid space is shared with the host; a larger tree is a fork bomb by another name.
pub const MAX_PROCESSES: u32 = 4096;
/// Most open files per process a job may ask for: 65536.
pub const MAX_OPEN_FILES: u32 = 65536;
/// Largest file size a job may ask for: 64 GiB.
pub const MAX_FILE_SIZE_BYTES: u64 = 64 << 30;
/// Largest stdout or stderr budget a job may ask for: 256 MiB.
///
/// The captured prefix is held in host memory, so this bounds what one run costs the host.
pub const MAX_OUTPUT_BYTES: u64 = 256 << 20;

/// The limits of one run. Construct with [`Limits::new`] (every default listed there) and
/// adjust with the `with_*` methods, each of which checks its range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "LimitsWire", into = "LimitsWire")]
pub struct Limits {
    wall: Duration,
    cpu: Duration,
    memory_bytes: u64,
    processes: u32,
    open_files: u32,
    file_size_bytes: u64,
    stdout_bytes: u64,
    stderr_bytes: u64,
}

/// A limit was out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("limit `{name}` is {value}, outside 1..={max}")]
#[non_exhaustive]
pub struct LimitsError {
    /// The limit's field name.
    pub name: &'static str,
    /// The value asked for (durations in milliseconds).
    pub value: u128,
    /// The ceiling (durations in milliseconds).
    pub max: u128,
}

fn check(name: &'static str, value: u128, max: u128) -> Result<(), LimitsError> {
    if value == 0 || value > max {
        return Err(LimitsError { name, value, max });
    }
    Ok(())
}

impl Limits {
    /// The default limits: wall 10 s, CPU 10 s, memory 512 MiB, 64 processes, 256 open files,
    /// files up to 64 MiB, stdout 1 MiB, stderr 256 KiB.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            wall: DEFAULT_WALL,
            cpu: DEFAULT_CPU,
            memory_bytes: DEFAULT_MEMORY_BYTES,
            processes: DEFAULT_PROCESSES,
            open_files: DEFAULT_OPEN_FILES,
            file_size_bytes: DEFAULT_FILE_SIZE_BYTES,
            stdout_bytes: DEFAULT_STDOUT_BYTES,
            stderr_bytes: DEFAULT_STDERR_BYTES,
        }
    }

    /// Sets the wall-clock deadline (1 ms ..= [`MAX_DURATION`]).
    pub fn with_wall(mut self, wall: Duration) -> Result<Self, LimitsError> {
        check("wall", wall.as_millis(), MAX_DURATION.as_millis())?;
        self.wall = wall;
        Ok(self)
    }

    /// Sets the CPU-time limit (1 ms ..= [`MAX_DURATION`]).
    pub fn with_cpu(mut self, cpu: Duration) -> Result<Self, LimitsError> {
        check("cpu", cpu.as_millis(), MAX_DURATION.as_millis())?;
        self.cpu = cpu;
        Ok(self)
    }

    /// Sets the memory limit in bytes (1 ..= [`MAX_MEMORY_BYTES`]).
    pub fn with_memory(mut self, bytes: u64) -> Result<Self, LimitsError> {
        check("memory_bytes", bytes.into(), MAX_MEMORY_BYTES.into())?;
        self.memory_bytes = bytes;
        Ok(self)
    }

    /// Sets the process limit (1 ..= [`MAX_PROCESSES`]).
    pub fn with_processes(mut self, n: u32) -> Result<Self, LimitsError> {
        check("processes", n.into(), MAX_PROCESSES.into())?;
        self.processes = n;
        Ok(self)
    }

    /// Sets the open-file limit (1 ..= [`MAX_OPEN_FILES`]).
    pub fn with_open_files(mut self, n: u32) -> Result<Self, LimitsError> {
        check("open_files", n.into(), MAX_OPEN_FILES.into())?;
        self.open_files = n;
        Ok(self)
    }

    /// Sets the largest file the run may write (1 ..= [`MAX_FILE_SIZE_BYTES`]).
    pub fn with_file_size(mut self, bytes: u64) -> Result<Self, LimitsError> {
        check("file_size_bytes", bytes.into(), MAX_FILE_SIZE_BYTES.into())?;
        self.file_size_bytes = bytes;
        Ok(self)
    }

    /// Sets the stdout budget (1 ..= [`MAX_OUTPUT_BYTES`]).
    pub fn with_stdout(mut self, bytes: u64) -> Result<Self, LimitsError> {
        check("stdout_bytes", bytes.into(), MAX_OUTPUT_BYTES.into())?;
        self.stdout_bytes = bytes;
        Ok(self)
    }

    /// Sets the stderr budget (1 ..= [`MAX_OUTPUT_BYTES`]).
    pub fn with_stderr(mut self, bytes: u64) -> Result<Self, LimitsError> {
        check("stderr_bytes", bytes.into(), MAX_OUTPUT_BYTES.into())?;
        self.stderr_bytes = bytes;
        Ok(self)
    }

    /// The wall-clock deadline.
    #[must_use]
    pub const fn wall(&self) -> Duration {
        self.wall
    }
    /// The CPU-time limit.
    #[must_use]
    pub const fn cpu(&self) -> Duration {
        self.cpu
    }
    /// The memory limit in bytes.
    #[must_use]
    pub const fn memory_bytes(&self) -> u64 {
        self.memory_bytes
    }
    /// The process limit.
    #[must_use]
    pub const fn processes(&self) -> u32 {
        self.processes
    }
    /// The open-file limit.
    #[must_use]
    pub const fn open_files(&self) -> u32 {
        self.open_files
    }
    /// The file-size limit in bytes.
    #[must_use]
    pub const fn file_size_bytes(&self) -> u64 {
        self.file_size_bytes
    }
    /// The stdout budget in bytes.
    #[must_use]
    pub const fn stdout_bytes(&self) -> u64 {
        self.stdout_bytes
    }
    /// The stderr budget in bytes.
    #[must_use]
    pub const fn stderr_bytes(&self) -> u64 {
        self.stderr_bytes
    }
}

impl Default for Limits {
    /// The same as [`Limits::new`]: every limit at its documented, bounded default.
    fn default() -> Self {
        Self::new()
    }
}

/// The wire form of [`Limits`]: milliseconds for durations, and any missing field takes its default.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct LimitsWire {
    wall_ms: u64,
    cpu_ms: u64,
    memory_bytes: u64,
    processes: u32,
    open_files: u32,
    file_size_bytes: u64,
    stdout_bytes: u64,
    stderr_bytes: u64,
}

impl Default for LimitsWire {
    fn default() -> Self {
        Limits::new().into()
    }
}

impl From<Limits> for LimitsWire {
    fn from(l: Limits) -> Self {
        Self {
            wall_ms: millis(l.wall),
            cpu_ms: millis(l.cpu),
            memory_bytes: l.memory_bytes,
            processes: l.processes,
            open_files: l.open_files,
            file_size_bytes: l.file_size_bytes,
            stdout_bytes: l.stdout_bytes,
            stderr_bytes: l.stderr_bytes,
        }
    }
}

impl TryFrom<LimitsWire> for Limits {
    type Error = LimitsError;
    fn try_from(w: LimitsWire) -> Result<Self, LimitsError> {
        Limits::new()
            .with_wall(Duration::from_millis(w.wall_ms))?
            .with_cpu(Duration::from_millis(w.cpu_ms))?
            .with_memory(w.memory_bytes)?
            .with_processes(w.processes)?
            .with_open_files(w.open_files)?
            .with_file_size(w.file_size_bytes)?
            .with_stdout(w.stdout_bytes)?
            .with_stderr(w.stderr_bytes)
    }
}

/// Milliseconds of a duration that is at most [`MAX_DURATION`], saturating otherwise.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Parses a duration a person wrote (a flag, a config file): `500ms`, `2s`, `1.5m`, `1h` (a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.find(|c: char| !c.is_ascii_digit() && c != '.').map_or((s, "s"), |i| s.split_at(i));
    let n: f64 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" | "" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("invalid duration unit in {s:?} (use ms, s, m or h)")),
    };
    if !(secs.is_finite() && secs > 0.0 && secs <= 7.0 * 86400.0) {
        return Err(format!("duration {s:?} must be positive and at most a week"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses a size a person wrote: `512`, `64K`, `256M`, `1G` (also `KiB`, `MB`...).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let (num, unit) = s.find(|c: char| !c.is_ascii_digit()).map_or((s, ""), |i| s.split_at(i));
    let n: u64 = num.parse().map_err(|_| format!("invalid size {s:?}"))?;
    let mult: u64 = match unit.to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return Err(format!("invalid size unit in {s:?} (use K, M or G)")),
    };
    n.checked_mul(mult).filter(|v| *v > 0).ok_or_else(|| format!("size {s:?} out of range"))
}
