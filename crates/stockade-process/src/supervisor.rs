//! The supervisor: spawns the helper, feeds stdin, captures output under budget, enforces
//! the deadline, and turns what happened into a [`Report`].

use std::io::{BufRead, BufReader, Read};
use std::os::fd::AsRawFd;
use std::process::Stdio;
use std::time::{Duration, Instant};

use stockade_protocol::capture::{CaptureMode, Flow, capture_async};
use stockade_protocol::{Captured, Enforced, Job, JobKind, Mechanism, Report, Status, Stream};
use tokio::io::AsyncWriteExt;

use crate::cgroup::Cgroup;
use crate::spec::{MAX_REPORT_LINE, MAX_REPORT_LINES, Msg, SPEC_VAR, Spec, SpecLimits};
use crate::sys::fs as sysfs;
use crate::{LaunchError, ProcessTier};

/// How long output may keep draining after the run's processes are gone: 2 s.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

enum End {
    Exited,
    Deadline,
    Output(Stream),
}

pub(crate) async fn run(tier: &ProcessTier, job: &Job) -> Result<Report, LaunchError> {
    let JobKind::Command { program, args } = job.kind() else {
        return Err(LaunchError::Misconfigured("the process tier runs only command jobs".into()));
    };
    let limits = job.limits();
    let workspace = match job.workspace() {
        Some(ws) => {
            let meta = std::fs::metadata(ws.path())
                .map_err(|e| LaunchError::Misconfigured(format!("workspace {}: {e}", ws.path().display())))?;
            if !meta.is_dir() {
                return Err(LaunchError::Misconfigured(format!(
                    "workspace {} is not a directory",
                    ws.path().display()
                )));
            }
            Some((ws.path().to_path_buf(), ws.access() == stockade_protocol::Access::ReadWrite))
        }
        None => None,
    };
    let processes = u64::from(limits.processes());
    let cgroup = if tier.cgroups {
        Cgroup::create(tier.cgroup_v2_dir.as_deref(), limits.memory_bytes(), processes)
    } else {
        None
    };
    let (status_r, status_w) = sysfs::pipe().map_err(|e| LaunchError::Internal(format!("status pipe: {e}")))?;
    let spec = Spec {
        program: program.clone(),
        args: args.clone(),
        env: job.env().iter().map(|v| (v.key().to_owned(), v.value().to_owned())).collect(),
        workspace,
        status_fd: status_w.as_raw_fd(),
        supervisor_pid: std::process::id() as i32,
        cgroup_procs: cgroup.as_ref().map(Cgroup::procs_files).unwrap_or_default(),
        rlimit_memory: cgroup.is_none(),
        rlimit_processes: cgroup.is_none(),
        limits: SpecLimits {
            cpu_secs: limits.cpu().as_secs().max(1) + u64::from(limits.cpu().subsec_nanos() > 0),
            memory_bytes: limits.memory_bytes(),
            processes,
            open_files: u64::from(limits.open_files()),
            file_size_bytes: limits.file_size_bytes(),
            tmpfs_bytes: tier.tmpfs_bytes,
        },
        hard: !tier.best_effort,
        landlock_abi: tier.landlock_abi,
    };
    let spec_json = serde_json::to_string(&spec).map_err(|e| LaunchError::Internal(e.to_string()))?;

    let mut cmd = tokio::process::Command::new(&tier.helper);
    cmd.env_clear()
        .env(SPEC_VAR, spec_json)
        .stdin(if job.stdin().is_empty() { Stdio::null() } else { Stdio::piped() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    sysfs::keep_on_exec(&mut cmd, status_w.as_raw_fd());
    let start = Instant::now();
    let spawned = cmd.spawn();
    drop(status_w);
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            if let Some(cg) = &cgroup {
                cg.remove();
            }
            return Err(LaunchError::Misconfigured(format!("spawning the helper {}: {e}", tier.helper.display())));
        }
    };

    let status_task = tokio::task::spawn_blocking(move || read_messages(status_r));
    if let Some(mut stdin) = child.stdin.take() {
        let bytes = job.stdin().to_vec();
        tokio::spawn(async move {
            // A guest that exits without reading its stdin closes the pipe: not an error.
            let _ = stdin.write_all(&bytes).await;
        });
    }
    let (Some(mut out), Some(mut err)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(LaunchError::Internal("helper pipes missing".into()));
    };
    let out_limit = usize::try_from(limits.stdout_bytes()).unwrap_or(usize::MAX);
    let err_limit = usize::try_from(limits.stderr_bytes()).unwrap_or(usize::MAX);
    let mut out_task = tokio::spawn(async move { capture_async(&mut out, out_limit, CaptureMode::FailFast).await });
    let mut err_task = tokio::spawn(async move { capture_async(&mut err, err_limit, CaptureMode::FailFast).await });

    let deadline = tokio::time::sleep(limits.wall());
    tokio::pin!(deadline);
    let mut out_done = None;
    let mut err_done = None;
    let end = loop {
        tokio::select! {
            _ = child.wait() => break End::Exited,
            () = &mut deadline => break End::Deadline,
            r = &mut out_task, if out_done.is_none() => {
                let r = r.map_err(|e| LaunchError::Internal(e.to_string()))?;
                let over = matches!(&r, Ok(end) if end.flow == Flow::OverBudget);
                out_done = Some(r);
                if over { break End::Output(Stream::Stdout); }
            }
            r = &mut err_task, if err_done.is_none() => {
                let r = r.map_err(|e| LaunchError::Internal(e.to_string()))?;
                let over = matches!(&r, Ok(end) if end.flow == Flow::OverBudget);
                err_done = Some(r);
                if over { break End::Output(Stream::Stderr); }
            }
        }
    };
    if !matches!(end, End::Exited) {
        let _ = child.start_kill();
        if let Some(cg) = &cgroup {
            cg.kill_all();
        }
    }
    let _ = child.wait().await;
    let wall = start.elapsed();
    let stdout = finish(out_done, &mut out_task).await;
    let stderr = finish(err_done, &mut err_task).await;
    let msgs = status_task.await.unwrap_or_default();
    let usage = cgroup.as_ref().map(Cgroup::usage);
    if let Some(cg) = &cgroup {
        cg.remove();
    }

    let mut report = Report::new(Status::TimedOut, wall).with_output(stdout, stderr);
    report = report.with_enforced(Enforced::new(
        Mechanism::Deadline,
        format!("{:?} wall clock; the whole pid namespace dies with it", limits.wall()),
    ));
    report = report.with_enforced(Enforced::new(
        Mechanism::OutputBudget,
        format!(
            "stdout {} bytes, stderr {} bytes; the run is killed at the first byte over",
            limits.stdout_bytes(),
            limits.stderr_bytes()
        ),
    ));
    if let Some(cg) = &cgroup {
        report = report.with_enforced(Enforced::new(Mechanism::Cgroup, cg.detail(limits.memory_bytes(), processes)));
    }
    let mut exit = None;
    let mut failure = None;
    for msg in msgs {
        match msg {
            Msg::Enforced { mechanism, detail } => report = report.with_enforced(Enforced::new(mechanism, detail)),
            Msg::Missing { mechanism, reason } => {
                report =
                    report.with_enforced(Enforced::new(Mechanism::Rlimits, format!("MISSING {mechanism}: {reason}")));
            }
            Msg::Error { stage, unsupported, message } => {
                failure.get_or_insert((stage, unsupported, message));
            }
            Msg::Exit { code, signal, cpu_us, max_rss } => exit = Some((code, signal, cpu_us, max_rss)),
        }
    }
    if let Some((stage, unsupported, message)) = failure {
        if unsupported && !tier.best_effort {
            return Err(LaunchError::Unsupported { mechanism: stage, reason: message });
        }
        report.status = Status::failed_to_start(format!("{stage}: {message}"));
        return Ok(report);
    }
    if let Some((_, _, cpu_us, max_rss)) = exit {
        report = report.with_cpu(Duration::from_micros(cpu_us));
        report = report.with_peak_memory(max_rss);
    }
    if let Some(peak) = usage.as_ref().and_then(|u| u.peak_bytes) {
        report.peak_memory_bytes = Some(peak);
    }
    report.status = match (end, exit) {
        (End::Deadline, _) => Status::TimedOut,
        (End::Output(stream), _) => Status::OutputLimit { stream },
        _ if usage.as_ref().is_some_and(|u| u.oom_killed) => Status::OutOfMemory,
        (End::Exited, Some((_, Some(sig), cpu_us, _)))
            if sig == libc::SIGXCPU || (sig == libc::SIGKILL && cpu_us >= limits.cpu().as_micros() as u64) =>
        {
            Status::CpuLimit
        }
        (End::Exited, Some((_, Some(signal), _, _))) => Status::Signaled { signal },
        (End::Exited, Some((Some(code), None, _, _))) => Status::Exited { code },
        (End::Exited, _) => Status::failed_to_start("the sandbox ended before reporting the guest's exit"),
    };
    Ok(report)
}

async fn finish(
    done: Option<Result<stockade_protocol::CaptureEnd, stockade_protocol::CaptureError>>,
    task: &mut tokio::task::JoinHandle<Result<stockade_protocol::CaptureEnd, stockade_protocol::CaptureError>>,
) -> Captured {
    let r = match done {
        Some(r) => r,
        None => match tokio::time::timeout(DRAIN_GRACE, &mut *task).await {
            Ok(Ok(r)) => r,
            _ => {
                task.abort();
                return Captured::default();
            }
        },
    };
    match r {
        Ok(end) => end.captured,
        Err(e) => e.captured,
    }
}

/// Reads the helper's report lines, bounded in count and length.
fn read_messages(pipe: std::fs::File) -> Vec<Msg> {
    let mut out = Vec::new();
    let mut reader = BufReader::new(pipe.take((MAX_REPORT_LINE * MAX_REPORT_LINES) as u64));
    let mut line = Vec::new();
    while out.len() < MAX_REPORT_LINES {
        line.clear();
        match reader.by_ref().take(MAX_REPORT_LINE as u64).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                if let Ok(msg) = serde_json::from_slice::<Msg>(&line) {
                    out.push(msg);
                }
            }
        }
    }
    out
}
