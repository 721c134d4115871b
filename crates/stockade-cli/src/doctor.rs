//! `stockade doctor`, `stockade gc` and `stockade docker gc`: what this host can enforce,
//! and what killed runs left.

use std::io::Write;

use anyhow::{Result, bail};
use stockade_runtime::{docker, wasm};

use crate::process;

/// The docker tier: a reachable engine (API negotiated) and the default image.
fn docker_status() -> Result<String, String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async {
        let tier = docker::DockerTier::connect().await.map_err(|e| e.to_string())?;
        let image = docker::spec::DEFAULT_IMAGE;
        if tier.has_image(image).await {
            let gvisor = if tier.clone().runtime("runsc").await.is_ok() { "registered" } else { "not registered" };
            let remap = if tier.userns_remap().await.unwrap_or(false) { "on" } else { "off" };
            Ok(format!("engine reachable; image {image} present; gVisor runtime runsc {gvisor}; userns-remap {remap}"))
        } else {
            Err(format!("engine reachable, but image {image} is missing: cargo xtask images"))
        }
    })
}

pub(crate) fn docker_gc(all: bool) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let removed = rt.block_on(async { docker::DockerTier::connect().await?.gc(all).await })?;
    println!("removed {removed} stockade container(s)");
    Ok(())
}

/// `stockade docker lifeline --owner LABEL`, which `stockade serve` starts with a pipe as its
/// stdin and holds the other end of: when the owner exits, however it exits (SIGKILL
/// included), the pipe ends; once the owner is gone (a zombie counts), the engine's
/// containers of owners that are gone are removed (`DockerTier::gc`), this owner's among
/// them. A SIGKILLed owner's running session container stops by itself (its keeper's stdin
/// closes with the owner's attachment), but a paused one's keeper is frozen and cannot see
/// that: this removes it. Without an engine there is nothing to do.
pub(crate) fn docker_lifeline(owner: &str) -> Result<()> {
    use std::io::Read;
    let mut sink = [0u8; 64];
    let mut stdin = std::io::stdin().lock();
    loop {
        match stdin.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !docker::spec::owner_gone(owner) {
        if std::time::Instant::now() > deadline {
            bail!("the owner {owner} has not exited 30 s after its lifeline ended");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // Connecting reaps what is expired or orphaned.
    let _ = rt.block_on(docker::DockerTier::connect());
    Ok(())
}

pub(crate) fn gc() -> Result<()> {
    let sweeps = process::finish_killed_sweeps();
    let failed = sweeps
        .iter()
        .filter(|f| matches!(f, process::FinishedSweep::Swept { swept, .. } if !swept.errors.is_empty()))
        .count();
    for done in &sweeps {
        println!("{done}");
    }
    let removed = process::reap_stale_cgroups(None);
    let left = process::stale_cgroups(None);
    println!("removed {} stale cgroup(s) of killed supervisors", removed.len());
    // What a killed `stockade serve` left of its sessions: their homes (their processes
    // died with it).
    if let Some(state) = process::state_dir() {
        let stale = stockade_runtime::session::stale_homes(&state.join("sessions"));
        let gone = stale.iter().filter(|d| stockade_runtime::session::remove_stale_home(d).is_ok()).count();
        println!("removed the session homes of {gone} killed session owner(s)");
        for d in stale.iter().filter(|d| d.exists()) {
            println!("could not remove {}", d.display());
        }
    }
    // The grants directories of killed supervisors and owners (their sockets unbound).
    let grants = stockade_runtime::stale_grants_dirs(&std::env::temp_dir(), std::time::Duration::from_secs(60));
    let gone = grants.iter().filter(|d| std::fs::remove_dir_all(d).is_ok()).count();
    println!("removed {gone} grants director(ies) of killed runs and session owners");
    for dir in &left {
        println!("could not remove {}", dir.display());
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    match rt.block_on(async { docker::DockerTier::connect().await?.gc(false).await }) {
        Ok(n) => println!("removed {n} expired stockade container(s)"),
        Err(e) => println!("docker: not checked ({e})"),
    }
    if !left.is_empty() {
        bail!("{} stale cgroup(s) could not be removed", left.len());
    }
    if failed > 0 {
        bail!("{failed} killed run(s) could not be swept entirely (each line above names what stays)");
    }
    Ok(())
}

/// Whether a run's grants broker can listen where the runtime puts it (a fresh directory
/// under the temporary directory, with a unix socket), and how each tier reaches a model.
fn broker_status() -> Result<String, String> {
    let parent = std::env::temp_dir();
    let dir = parent.join(format!("stockade-doctor-{}", std::process::id()));
    let tried =
        std::fs::create_dir(&dir).and_then(|()| std::os::unix::net::UnixListener::bind(dir.join("grants.sock")));
    let _ = std::fs::remove_dir_all(&dir);
    match tried {
        Ok(_) => Ok(format!(
            "grants directories under {}; a model grant answers on model.sock and OPENAI_BASE_URL (process; docker as root), model() (wasm)",
            parent.display()
        )),
        Err(e) => Err(format!("cannot listen on a unix socket under {}: {e}", parent.display())),
    }
}

/// The opt-in Python guest: whether this build has it and whether it is installed.
fn python_status() -> Result<String, String> {
    let path = wasm::guests::dir().map(|d| d.join(wasm::guests::PYTHON_DIR).join(wasm::guests::PYTHON_FILE));
    let installed = path.as_ref().is_some_and(|p| p.is_file());
    match (cfg!(feature = "python"), installed) {
        (true, true) => Ok(format!("CPython guest at {}", path.unwrap_or_default().display())),
        (true, false) => Err("not installed: cargo xtask guests --python".into()),
        (false, true) => Err("installed, but this stockade was built without --features python".into()),
        (false, false) => Err("opt-in: build with --features python, then cargo xtask guests --python".into()),
    }
}

/// The process tier, tried: a real run of `/bin/true`. The probes read what the kernel
/// offers, not what this process may use of it: in a container whose seccomp profile refuses
/// `unshare` (Docker's default), or without a capability a root supervisor needs, every probe
/// said yes and every run failed. Without a cgroup: a run's cgroup is made after the stale
/// ones of killed supervisors are reaped, and doctor reports those, it does not remove them
/// (the `cgroups` row's probe checks the controllers).
fn process_trial() -> Result<String, String> {
    use stockade_runtime::protocol::{Job, Status};
    let tier = crate::tiers::process_tier().map_err(|e| e.to_string())?.without_cgroups();
    let sandbox = stockade_runtime::Sandbox::builder().tier(tier).build().map_err(|e| e.to_string())?;
    let job = Job::command("/bin/true", Vec::<String>::new()).map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    match rt.block_on(sandbox.report(stockade_runtime::RunRequest::new(&job))) {
        Ok(r) if r.status == (Status::Exited { code: 0 }) => {
            Ok(format!("a run of /bin/true: exited 0, {} mechanisms reported in force", r.enforcement.len()))
        }
        Ok(r) => Err(format!("a run of /bin/true ended {:?}", r.status)),
        Err(e) => Err(format!("a run of /bin/true: {e}")),
    }
}

pub(crate) fn doctor(json: bool) -> Result<()> {
    let stale = process::stale_cgroups(None);
    let stale_detail = match stale.len() {
        0 => "none left by killed supervisors".to_owned(),
        n => format!(
            "{n} left by killed supervisors (the next run removes them, or `stockade gc`): {}",
            stale.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(" ")
        ),
    };
    let p = process::probe();
    let trial = process_trial();
    let broker = broker_status();
    let docker = docker_status();
    let wasm_engine = wasm::WasmTier::new().map_err(|e| e.to_string()).map(|t| match t.cache_dir() {
        Some(dir) => format!("wasmtime 48 engine ready; compiled modules cached in {}", dir.display()),
        None => "wasmtime 48 engine ready; no usable cache directory (modules compile on every start)".into(),
    });
    let python = python_status();
    let js_guest =
        wasm::guests::javascript().map(|p| format!("QuickJS-ng at {}", p.display())).map_err(|e| e.to_string());
    let rows: Vec<(&str, bool, String)> = vec![
        ("landlock", p.landlock_abi >= 6, format!("abi {}", p.landlock_abi)),
        ("seccomp", p.seccomp, if p.seccomp { "filters available".into() } else { "not available".into() }),
        (
            "user namespaces",
            p.user_namespaces.is_ok(),
            p.user_namespaces.clone().err().unwrap_or_else(|| "available".into()),
        ),
        ("cgroups", p.cgroups.is_ok(), p.cgroups.clone().unwrap_or_else(|e| e)),
        ("process run", trial.is_ok(), trial.clone().unwrap_or_else(|e| e)),
        ("stale cgroups", stale.is_empty(), stale_detail),
        ("grants broker", broker.is_ok(), broker.clone().unwrap_or_else(|e| e)),
        (
            "unix sockets",
            true,
            format!(
                "landlock abi {} cannot restrict connecting to a pathname socket (a later ABI can): sockets in a granted workspace are covered when the run starts",
                p.landlock_abi
            ),
        ),
        ("docker tier", docker.is_ok(), docker.clone().unwrap_or_else(|e| e)),
        ("wasm tier", wasm_engine.is_ok(), wasm_engine.clone().unwrap_or_else(|e| e)),
        ("wasm js guest", js_guest.is_ok(), js_guest.unwrap_or_else(|e| e)),
        ("wasm python", python.is_ok(), python.unwrap_or_else(|e| e)),
    ];
    let process_ready = p.landlock_abi >= 6 && p.seccomp && p.user_namespaces.is_ok() && trial.is_ok();
    let wasm_ready = wasm_engine.is_ok();
    let docker_ready = docker.is_ok();
    let mut out = std::io::stdout().lock();
    if json {
        let value = serde_json::json!({
            "process_tier": process_ready,
            "wasm_tier": wasm_ready,
            "docker_tier": docker_ready,
            "checks": rows.iter().map(|(name, ok, detail)| serde_json::json!({"name": name, "ok": ok, "detail": detail})).collect::<Vec<_>>(),
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&value)?)?;
    } else {
        writeln!(out, "{:<16} {:<4} detail", "check", "ok")?;
        for (name, ok, detail) in &rows {
            writeln!(out, "{name:<16} {:<4} {detail}", if *ok { "yes" } else { "no" })?;
        }
        writeln!(
            out,
            "\nprocess tier: {}",
            if process_ready { "ready (every mechanism enforced)" } else { "NOT ready: runs fail closed" }
        )?;
        writeln!(out, "wasm tier:    {}", if wasm_ready { "ready" } else { "NOT ready" })?;
        writeln!(out, "docker tier:  {}", if docker_ready { "ready" } else { "NOT ready" })?;
    }
    Ok(())
}
