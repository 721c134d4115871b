//! `cargo xtask image serve` and `cargo xtask deploy`: `stockade serve` as a container image,
//! run with the least privilege it needs, and the Kubernetes manifests (docs/deploy.md).
//!
//! The image is a Debian minbase root made by `debootstrap` from the mirror apt uses, with
//! what the `base` and `code-interpreter-v1` templates need, then `docker import`ed with the
//! `stockade` binary: nothing is pulled. The root is kept under `~/.cache/stockade/images`
//! (outside the clone and the build directory) and made again only when its package list
//! changes; the import is skipped when the image already holds this binary and root.
//!
//! `deploy` (a CI step) checks the manifests offline, builds the image from the debug binary
//! the tests built, starts it under the local engine with exactly [`run_args`], reads the
//! container's capabilities, seccomp mode and no_new_privs from the host's `/proc`, drives it
//! with the official E2B SDK (`deploy/test/e2b_container.py`), and runs the escape matrix's
//! process column inside a container with the same settings. It also runs a session in a
//! user namespace of 65,536 ids, as a Kubernetes pod with `hostUsers: false` is, and checks
//! from the host that its guest's uid is one of that range's.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::{llm, run};

/// The image `cargo xtask image serve` builds.
pub(crate) const SERVE_IMAGE: &str = "stockade-serve:local";

/// The Debian release of the image's root: the host's, so the binary built here runs there.
const SUITE: &str = "bookworm";

/// What the image holds besides Debian's minbase: the templates' programs (python3 and
/// `python`, pip, git, curl, the code interpreter's IPython kernel and matplotlib), and
/// `ip` for the escape harness's stand-in metadata service.
const PACKAGES: &[&str] = &[
    "ca-certificates",
    "python3",
    "python-is-python3",
    "python3-pip",
    "python3-ipykernel",
    "python3-jupyter-client",
    "python3-matplotlib",
    "git",
    "curl",
    "iproute2",
];

/// The capabilities `stockade serve` keeps in its container (every other one is dropped):
/// SYS_ADMIN for the tmpfs of each session's disk limit (and the entrypoint's cgroup
/// remount), SETUID and SETGID to map each session's guest to a host id of its own, CHOWN to
/// give a grants directory (the network grant's among them) to the guest's group, and
/// SYS_PTRACE to take a grant's loopback listener from the helper (`pidfd_getfd`; the
/// profile still refuses `ptrace` itself), and KILL to end a sandbox's processes (another
/// uid's). Each was found by dropping it and seeing what fails (docs/deploy.md).
pub(crate) const CAPS: &[&str] = &["CHOWN", "KILL", "SETGID", "SETUID", "SYS_ADMIN", "SYS_PTRACE"];

/// The pinned validator of the Kubernetes manifests and its schema library.
const VALIDATOR: &[&str] = &["kubernetes-validate==1.37.0", "jsonschema==4.26.0", "PyYAML==6.0.4"];

/// Where the image's root is kept between runs.
fn cache() -> PathBuf {
    PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache/stockade/images")
}

/// The least privilege `stockade serve` runs with in a container: every capability dropped
/// but [`CAPS`], no privilege gained through exec, stockade's own seccomp profile, `/proc`
/// and `/sys` unmasked (so a sandbox's own pid namespace can mount its procfs), no AppArmor
/// profile (Docker's default one refuses every mount), a private cgroup namespace (so the
/// entrypoint can hand stockade the container's own subtree), and a read-only root with the
/// state directory, `/run` (the guest id claims) and `/tmp` writable.
pub(crate) fn run_args(root: &Path) -> Vec<String> {
    let mut args = vec!["--cap-drop".to_owned(), "ALL".to_owned()];
    for cap in CAPS {
        args.extend(["--cap-add".to_owned(), (*cap).to_owned()]);
    }
    let profile = root.join("deploy/seccomp/stockade-serve.json");
    args.extend([
        "--security-opt".to_owned(),
        "no-new-privileges".to_owned(),
        "--security-opt".to_owned(),
        format!("seccomp={}", profile.display()),
        "--security-opt".to_owned(),
        "systempaths=unconfined".to_owned(),
        "--security-opt".to_owned(),
        "apparmor=unconfined".to_owned(),
        "--cgroupns".to_owned(),
        "private".to_owned(),
        "--read-only".to_owned(),
        "--tmpfs".to_owned(),
        // exec: a grant's client (`stockade-call`) runs from its grants directory under /tmp.
        "/tmp:mode=1777,size=64m,exec".to_owned(),
        "--tmpfs".to_owned(),
        "/run:mode=0755,size=16m".to_owned(),
        "--tmpfs".to_owned(),
        "/var/lib/stockade:mode=0700,size=4g".to_owned(),
    ]);
    args
}

/// The `docker run` line docs/deploy.md shows (and a test checks it shows): [`run_args`]
/// with the profile's path as it is in the repository.
pub(crate) fn run_line() -> String {
    let args = run_args(Path::new("."));
    let mut line = String::from("docker run -d --name stockade-serve");
    let mut it = args.iter().peekable();
    while let Some(flag) = it.next() {
        line.push_str(&format!(" \\\n  {flag}"));
        if let Some(value) = it.next_if(|v| !v.starts_with("--")) {
            line.push_str(&format!(" {value}"));
        }
    }
    line.replace("seccomp=./deploy", "seccomp=deploy")
}

/// `cargo xtask image serve [--debug]` (and `image serve-root`, the root alone, which CI
/// starts in the background while it builds).
pub(crate) fn image(root: &Path, target: &Path, args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("serve") => {
            build_image(root, target, args.iter().any(|a| a == "--debug"))?;
            println!(
                "run it with the least privilege it needs (docs/deploy.md), from the repository's root:\n{} \\\n  {SERVE_IMAGE} serve --listen ...",
                run_line()
            );
            Ok(())
        }
        Some("serve-root") => rootfs().map(drop),
        _ => bail!("usage: cargo xtask image serve [--debug]"),
    }
}

/// Starts `cargo xtask image serve-root` in the background (debootstrap and apt take minutes
/// of network and disk, little CPU, so CI builds meanwhile); its log is beside the root.
pub(crate) fn rootfs_in_background() -> Result<std::process::Child> {
    fs::create_dir_all(cache())?;
    let log = fs::File::create(cache().join("serve-root.log"))?;
    Ok(crate::cargo(&["xtask", "image", "serve-root"]).stdout(log.try_clone()?).stderr(log).spawn()?)
}

/// Waits for [`rootfs_in_background`]; its log if it failed (the deploy step then says why).
pub(crate) fn wait_rootfs(mut child: std::process::Child) -> Result<()> {
    if !child.wait()?.success() {
        let log = fs::read_to_string(cache().join("serve-root.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        bail!("building the image's root failed:\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
    }
    Ok(())
}

/// The mirror apt uses for Debian's main archive (the first `deb.debian.org`-style source
/// in apt's lists), so that debootstrap needs nothing apt does not.
fn mirror() -> Result<String> {
    let mut texts = vec![fs::read_to_string("/etc/apt/sources.list").unwrap_or_default()];
    for e in fs::read_dir("/etc/apt/sources.list.d").into_iter().flatten().flatten() {
        texts.push(fs::read_to_string(e.path()).unwrap_or_default());
    }
    for text in &texts {
        for line in text.lines().map(str::trim) {
            let url = line.strip_prefix("URIs:").map(str::trim).or_else(|| {
                line.strip_prefix("deb ").and_then(|r| r.split_whitespace().find(|w| w.starts_with("http")))
            });
            if let Some(url) = url.filter(|u| u.trim_end_matches('/').ends_with("/debian")) {
                return Ok(url.to_owned());
            }
        }
    }
    bail!("no Debian mirror in /etc/apt/sources.list or sources.list.d (a URIs or deb line ending in /debian)")
}

/// The image's root filesystem: made once per package list (about three minutes), kept.
fn rootfs() -> Result<PathBuf> {
    let dir = cache().join("serve-rootfs");
    let stamp = format!("{SUITE} {}\n", PACKAGES.join(" "));
    if fs::read_to_string(dir.join(".stockade-packages")).is_ok_and(|s| s == stamp) {
        return Ok(dir);
    }
    if Command::new("debootstrap").arg("--version").output().is_err() {
        eprintln!("image: installing debootstrap");
        run(Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends", "debootstrap"])
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    }
    let fresh = cache().join("serve-rootfs.new");
    let _ = fs::remove_dir_all(&fresh);
    fs::create_dir_all(cache())?;
    let mirror = mirror()?;
    run(Command::new("debootstrap").args(["--variant=minbase", SUITE]).arg(&fresh).arg(&mirror))?;
    // debootstrap resolves no virtual packages, so the rest goes through apt in the new root,
    // without documentation, manual pages or translations.
    fs::copy("/etc/resolv.conf", fresh.join("etc/resolv.conf")).context("copying /etc/resolv.conf")?;
    fs::write(
        fresh.join("etc/dpkg/dpkg.cfg.d/stockade-slim"),
        "path-exclude=/usr/share/doc/*\npath-include=/usr/share/doc/*/copyright\n\
         path-exclude=/usr/share/man/*\npath-exclude=/usr/share/locale/*\npath-exclude=/usr/share/info/*\n",
    )?;
    run(Command::new("chroot")
        .arg(&fresh)
        .args(["apt-get", "install", "-y", "-q", "--no-install-recommends"])
        .args(PACKAGES)
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    run(Command::new("chroot").arg(&fresh).args(["apt-get", "clean"]))?;
    for d in ["var/lib/apt/lists", "var/cache/apt", "var/log"] {
        let p = fresh.join(d);
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p)?;
    }
    fs::write(fresh.join("etc/resolv.conf"), "")?;
    fs::create_dir_all(fresh.join("var/lib/stockade"))?;
    fs::create_dir_all(fresh.join("etc/stockade"))?;
    fs::write(fresh.join(".stockade-packages"), &stamp)?;
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&fresh, &dir)?;
    Ok(dir)
}

/// Builds [`SERVE_IMAGE`] from the root and the `stockade` binary (release, or the debug
/// build with `debug`); returns the binary it holds.
pub(crate) fn build_image(root: &Path, target: &Path, debug: bool) -> Result<PathBuf> {
    let profile = if debug { "dev" } else { "release" };
    // `--workspace` unifies features as the test step does, so CI reuses the binary its tests built.
    run(&mut crate::cargo(&["build", "--profile", profile, "--workspace", "--bin", "stockade"]))?;
    let binary = target.join(if debug { "debug" } else { "release" }).join("stockade");
    let rootfs = rootfs()?;
    let bin_dir = rootfs.join("usr/local/bin");
    fs::create_dir_all(&bin_dir)?;
    let dest = bin_dir.join("stockade");
    let bytes = fs::read(&binary).with_context(|| format!("reading {}", binary.display()))?;
    let stamp = fs::read_to_string(rootfs.join(".stockade-packages"))?;
    let entry = fs::read(root.join("deploy/image/stockade-entrypoint"))?;
    let content = format!("{:016x}", fnv(&[bytes.as_slice(), stamp.as_bytes(), entry.as_slice()]));
    if image_label(SERVE_IMAGE).as_deref() == Some(content.as_str()) {
        eprintln!("image: {SERVE_IMAGE} already holds this binary and root ({content})");
        return Ok(binary);
    }
    fs::write(&dest, &bytes)?;
    let entrypoint = bin_dir.join("stockade-entrypoint");
    fs::copy(root.join("deploy/image/stockade-entrypoint"), &entrypoint)?;
    use std::os::unix::fs::PermissionsExt;
    for f in [&dest, &entrypoint] {
        fs::set_permissions(f, fs::Permissions::from_mode(0o755))?;
    }
    let mut tar = Command::new("tar")
        .args(["--numeric-owner", "--exclude=./.stockade-packages", "-C"])
        .arg(&rootfs)
        .args(["-c", "."])
        .stdout(Stdio::piped())
        .spawn()
        .context("spawning tar")?;
    let stdout = tar.stdout.take().context("tar's output")?;
    let changes = [
        "ENTRYPOINT [\"/usr/local/bin/stockade-entrypoint\"]".to_owned(),
        "CMD [\"serve\", \"--help\"]".to_owned(),
        "ENV STOCKADE_STATE_DIR=/var/lib/stockade".to_owned(),
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
        "EXPOSE 49983".to_owned(),
        format!("LABEL org.stockade.content={content}"),
    ];
    let mut import = Command::new("docker");
    import.arg("import");
    for c in &changes {
        import.args(["--change", c]);
    }
    import.args(["-", SERVE_IMAGE]).stdin(stdout);
    run(&mut import)?;
    if !tar.wait()?.success() {
        bail!("tar of {} failed", rootfs.display());
    }
    eprintln!("image: built {SERVE_IMAGE} ({content})");
    Ok(binary)
}

/// FNV-1a over the parts: a content stamp, not a security hash (it decides only whether to
/// import again).
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

fn image_label(image: &str) -> Option<String> {
    let out = Command::new("docker")
        .args(["image", "inspect", "--format", "{{index .Config.Labels \"org.stockade.content\"}}", image])
        .output()
        .ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The manifests, offline: every file under deploy/kubernetes valid, every fixture under
/// its testdata refused, and the serve containers' security settings those of [`run_args`].
pub(crate) fn validate(root: &Path) -> Result<()> {
    let python = llm::pinned_venv("deploy-venv", VALIDATOR)?;
    let dir = root.join("deploy/kubernetes");
    let script = dir.join("validate.py");
    let yaml = |d: &Path| -> Result<Vec<PathBuf>> {
        let mut files: Vec<PathBuf> = fs::read_dir(d)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        files.sort();
        Ok(files)
    };
    run(Command::new(&python).arg(&script).args(yaml(&dir)?))?;
    run(Command::new(&python).arg(&script).arg("--expect-invalid").args(yaml(&dir.join("testdata"))?))?;
    for file in yaml(&dir)? {
        let text = fs::read_to_string(&file)?;
        if !text.contains("image: stockade-serve:local") {
            continue;
        }
        let caps = format!("add: [{}]", CAPS.join(", "));
        for want in [
            caps.as_str(),
            "drop: [ALL]",
            "localhostProfile: stockade-serve.json",
            "allowPrivilegeEscalation: false",
            "procMount: Unmasked",
        ] {
            if !text.contains(want) {
                bail!(
                    "{}: the serve container's security context lacks `{want}` (xtask/src/deploy.rs run_args)",
                    file.display()
                );
            }
        }
    }
    println!("deploy: the manifests validate, and every invalid fixture is refused");
    Ok(())
}

/// A listener on `ip` that answers every request 204 and counts them (the grant's upstreams,
/// judged from the host).
fn counting_listener(ip: &str) -> Result<(u16, std::sync::Arc<std::sync::atomic::AtomicUsize>)> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind((ip, 0)).with_context(|| format!("listening on {ip}"))?;
    let port = listener.local_addr()?.port();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = std::sync::Arc::clone(&count);
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            if conn.read(&mut buf).is_ok_and(|n| n > 0) {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = conn.write_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n");
            }
        }
    });
    Ok((port, count))
}

/// A container of [`SERVE_IMAGE`], removed (by its id) when dropped.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.0]).stdout(Stdio::null()).status();
    }
}

impl Container {
    /// `docker run -d` with [`run_args`], host networking (CI's engine may have no bridge; the
    /// server listens on loopback) and `extra` before the image, `cmd` after it.
    fn start(root: &Path, extra: &[String], cmd: &[String]) -> Result<Self> {
        let out = Command::new("docker")
            .args(["run", "-d", "--network", "host"])
            .args(run_args(root))
            .args(extra)
            .arg(SERVE_IMAGE)
            .args(cmd)
            .output()
            .context("docker run")?;
        if !out.status.success() {
            bail!("docker run failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(Self(String::from_utf8_lossy(&out.stdout).trim().to_owned()))
    }

    /// The container's first process, as the host sees it.
    fn host_pid(&self) -> Result<u32> {
        let out = Command::new("docker").args(["inspect", "--format", "{{.State.Pid}}", &self.0]).output()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().context("the container's pid")
    }

    /// Waits for the server's "E2B API on URL" line in the container's log (one deadline
    /// for the whole wait); the URL.
    fn api_url(&self) -> Result<String> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        loop {
            let out = Command::new("docker").args(["logs", &self.0]).output()?;
            let log = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
            if let Some(url) = log.lines().find_map(|l| l.strip_prefix("stockade serve: E2B API on ")) {
                return Ok(url.trim().to_owned());
            }
            let running =
                Command::new("docker").args(["inspect", "--format", "{{.State.Running}}", &self.0]).output()?;
            if String::from_utf8_lossy(&running.stdout).trim() != "true" || std::time::Instant::now() > deadline {
                bail!("the containerised server never listened; its log:\n{log}");
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

/// The capability mask of [`CAPS`], as `/proc/PID/status` prints `CapEff`.
fn caps_mask() -> u64 {
    let bit = |c: &str| match c {
        "CHOWN" => 0,
        "KILL" => 5,
        "SETGID" => 6,
        "SETUID" => 7,
        "SYS_PTRACE" => 19,
        "SYS_ADMIN" => 21,
        other => panic!("no bit for {other}"),
    };
    CAPS.iter().fold(0, |m, c| m | (1u64 << bit(c)))
}

/// What the host sees of the container's first process: its effective capabilities, seccomp
/// mode and no_new_privs, which must be exactly the least privilege.
fn check_confinement(pid: u32) -> Result<()> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(str::trim).unwrap_or("").to_owned();
    let eff = u64::from_str_radix(&field("CapEff:"), 16).context("CapEff")?;
    let want = caps_mask();
    if eff != want || field("Seccomp:") != "2" || field("NoNewPrivs:") != "1" {
        bail!(
            "the container's process {pid} has CapEff {eff:016x} (want {want:016x}), Seccomp {}, NoNewPrivs {} (want 2 and 1)",
            field("Seccomp:"),
            field("NoNewPrivs:")
        );
    }
    println!(
        "deploy: from the host, the server runs with CapEff {eff:016x} ({}), a seccomp filter and no_new_privs",
        CAPS.join(" ")
    );
    Ok(())
}

/// Host processes whose command line holds `marker`.
fn with_marker(marker: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let cmd = fs::read(e.path().join("cmdline")).unwrap_or_default();
        if cmd.windows(marker.len()).any(|w| w == marker.as_bytes()) {
            pids.push(pid);
        }
    }
    pids
}

const KEY: &str = "deploy-test-key-0123456789";

/// `cargo xtask deploy`: the manifests, the image, the SDK against the container, and the
/// escape matrix's process column inside one.
pub(crate) fn run_all(root: &Path, target: &Path) -> Result<()> {
    validate(root)?;
    let binary = build_image(root, target, true)?;
    userns_pod(&binary)?;
    sdk_against_container(root)?;
    escape_in_container(root)
}

/// The official E2B SDK drives the containerised server from the host.
fn sdk_against_container(root: &Path) -> Result<()> {
    let python = llm::install_e2b_sdk()?;
    let (pa, a) = counting_listener("127.0.0.3")?;
    let (pb, b) = counting_listener("127.0.0.4")?;
    let conf_dir = std::env::temp_dir().join(format!("stockade-deploy-{}", std::process::id()));
    let _ = fs::remove_dir_all(&conf_dir);
    fs::create_dir_all(&conf_dir)?;
    fs::write(
        conf_dir.join("serve.toml"),
        format!(
            "[template.net]\nallow_net = [\"a.test:{pa}\", \"b.test:{pb}\"]\n\
             net_resolve = [\"a.test:{pa}:127.0.0.3\", \"b.test:{pb}:127.0.0.4\"]\n"
        ),
    )?;
    let extra = [
        "-v".to_owned(),
        format!("{}:/etc/stockade:ro", conf_dir.display()),
        "-e".to_owned(),
        format!("E2B_API_KEY={KEY}"),
    ];
    // The id suffix a StatefulSet's pod would pass (`--id-suffix $(POD_NAME)`, owners.yaml).
    let cmd: Vec<String> = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--api-key-env",
        "E2B_API_KEY",
        "--config",
        "/etc/stockade/serve.toml",
        "--id-suffix",
        "stockade-0",
    ]
    .map(str::to_owned)
    .to_vec();
    let container = Container::start(root, &extra, &cmd)?;
    let url = container.api_url()?;
    check_confinement(container.host_pid()?)?;
    let mark = format!("{}", 700_000 + std::process::id() % 100_000);
    let out = Command::new(&python)
        .arg(root.join("deploy/test/e2b_container.py"))
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("E2B_API_KEY", KEY)
        .env("MARK", &mark)
        .env("PORTS", format!("{pa},{pb}"))
        .stderr(Stdio::inherit())
        .output()
        .context("running deploy/test/e2b_container.py")?;
    let _ = fs::remove_dir_all(&conf_dir);
    let text = String::from_utf8_lossy(&out.stdout);
    let mut seen = std::collections::HashMap::new();
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("a line of the SDK's: {line}"))?;
        seen.insert(v["check"].as_str().unwrap_or_default().to_owned(), v);
    }
    let get = |k: &str| seen.get(k).cloned().unwrap_or(serde_json::Value::Null);
    let mut failures = Vec::new();
    let mut expect = |ok: bool, what: &str, v: serde_json::Value| {
        if ok {
            println!("deploy: ok   {what}");
        } else {
            failures.push(format!("{what}: {v}"));
        }
    };
    let run = get("run");
    let stdout = run["stdout"].as_str().unwrap_or_default();
    expect(
        run["exit_code"] == 0
            && stdout.starts_with("hello\nuser\n")
            && stdout.contains("Seccomp:\t2")
            && stdout.contains("NoNewPrivs:\t1"),
        "a command runs as `user`, under the sandbox's own seccomp filter and no_new_privs",
        run.clone(),
    );
    let programs = get("programs");
    expect(programs["stdout"] == "42\ngit\n", "python3 and git in the image", programs);
    let files = get("files");
    expect(files["read"] == "kept in the container\n", "files written and read back", files);
    let background = get("background");
    expect(
        background["id"].as_str().is_some_and(|id| id.ends_with("-stockade-0") && id.len() == 32 + "-stockade-0".len()),
        "the sandbox id names its pod (--id-suffix), and the SDK reaches it by that id",
        background,
    );
    let killed = get("killed");
    expect(
        killed["running"] == false && with_marker(&format!("sleep {mark}")).is_empty(),
        "kill leaves no process of the sandbox on the host",
        killed,
    );
    let egress = get("egress");
    let taken = |n: &std::sync::Arc<std::sync::atomic::AtomicUsize>| n.load(std::sync::atomic::Ordering::SeqCst);
    expect(
        egress["codes"] == serde_json::json!(["204", "403"]) && (taken(&a), taken(&b)) == (1, 0),
        "allow_out reaches a.test and not b.test (judged by the listeners)",
        egress,
    );
    let interpreter = get("interpreter");
    expect(interpreter["text"] == "42", "the code interpreter runs a cell", interpreter);
    if !out.status.success() || !failures.is_empty() {
        bail!("the E2B SDK against the container: {} (exit {})", failures.join("; "), out.status);
    }
    Ok(())
}

/// The escape matrix's process column, run inside a container with [`run_args`]: the harness
/// and the attacks mounted read-only, in a network namespace of the container's own. Added
/// for the harness alone: NET_ADMIN and NET_BIND_SERVICE (its stand-in metadata service's
/// veth, and port 80), and a tmpfs for its world (canaries, workspaces, the attacks' copies).
fn escape_in_container(root: &Path) -> Result<()> {
    let (harness, attacks, wasm) = crate::build_escape()?;
    let mount = |host: &Path, inside: &str| ["-v".to_owned(), format!("{}:{inside}:ro", host.display())];
    let mut extra: Vec<String> = [
        "--cap-add",
        "NET_ADMIN",
        "--cap-add",
        "NET_BIND_SERVICE",
        "--tmpfs",
        "/escape-world:mode=1777,size=1g,exec",
        "-e",
        "TMPDIR=/escape-world",
    ]
    .map(str::to_owned)
    .to_vec();
    extra.extend(mount(&harness, "/escape/stockade-escape"));
    extra.extend(mount(&attacks, "/escape/attacks"));
    extra.extend(mount(wasm.parent().context("the wasm attacks' directory")?, "/escape/wasm"));
    let args: Vec<String> = [
        "/escape/stockade-escape",
        "--attacks",
        "/escape/attacks",
        "--wasm-attacks",
        "/escape/wasm/attacks.wasm",
        "--tier",
        "process",
        "--require",
        "process",
    ]
    .map(str::to_owned)
    .to_vec();
    let mut cmd = Command::new("docker");
    cmd.args(["run", "--rm", "--network", "none"]).args(run_args(root)).args(&extra).arg(SERVE_IMAGE).args(&args);
    run(&mut cmd).context("the escape matrix's process column inside the container")
}

/// A host `stockade serve --listen 127.0.0.1:0` of `binary` with API key `key`, on a fresh
/// state directory `state` (its socket in a directory serve makes itself, 0700): (the child,
/// its URL). The caller ends it by its pid (SIGTERM ends its sandboxes).
pub(crate) fn host_server(binary: &Path, state: &Path, key: &str) -> Result<(std::process::Child, String)> {
    use std::io::BufRead as _;
    let _ = fs::remove_dir_all(state);
    fs::create_dir_all(state)?;
    let mut child = Command::new(binary)
        .args(["serve", "--socket"])
        .arg(state.join("run/serve.sock"))
        .args(["--listen", "127.0.0.1:0", "--api-key-env", "E2B_API_KEY"])
        .env("E2B_API_KEY", key)
        .env("STOCKADE_STATE_DIR", state)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let stderr = child.stderr.take().context("serve's stderr")?;
    let mut lines = std::io::BufReader::new(stderr).lines();
    let url = loop {
        let Some(line) = lines.next() else { bail!("stockade serve exited before it listened") };
        if let Some(u) = line?.strip_prefix("stockade serve: E2B API on ") {
            break u.trim().to_owned();
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    Ok((child, url))
}

/// Runs one mode of the SDK script against `url`; its JSON line's `ms` samples.
fn sdk_samples(python: &Path, root: &Path, url: &str, mode: &str, n: usize) -> Result<Vec<f64>> {
    let out = Command::new(python)
        .arg(root.join("deploy/test/e2b_container.py"))
        .args([mode, &n.to_string()])
        .env("E2B_API_URL", url)
        .env("E2B_SANDBOX_URL", url)
        .env("E2B_API_KEY", KEY)
        .output()?;
    if !out.status.success() {
        bail!("the SDK's {mode} against {url} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok(v["ms"].as_array().context("samples")?.iter().filter_map(serde_json::Value::as_f64).collect())
}

fn p50(v: Vec<f64>) -> f64 {
    crate::bench::median_of(v).unwrap_or(f64::NAN)
}

/// The container's memory use as its cgroup counts it (cgroup v1 or v2), in bytes.
fn container_memory(id: &str) -> Result<u64> {
    for path in [
        format!("/sys/fs/cgroup/memory/docker/{id}/memory.usage_in_bytes"),
        format!("/sys/fs/cgroup/system.slice/docker-{id}.scope/memory.current"),
    ] {
        if let Ok(text) = fs::read_to_string(&path) {
            return text.trim().parse().context("a memory counter");
        }
    }
    bail!("no memory counter for container {id} under /sys/fs/cgroup")
}

/// `cargo xtask bench deploy`: what the container costs, against the same release binary on
/// the host in the same run: the SDK's `commands.run("true")` and `create`+`kill` p50 (three
/// alternating rounds each), memory per held sandbox (the container's cgroup, 8 held), and
/// a container's start to its first answer (a pod's floor, before scheduling and pulls).
pub(crate) fn bench(root: &Path, target: &Path) -> Result<String> {
    let binary = build_image(root, target, false)?;
    let python = llm::install_e2b_sdk()?;
    let state = target.join("bench-deploy-state");
    let (mut host, host_url) = host_server(&binary, &state, KEY)?;
    let cmd: Vec<String> =
        ["serve", "--listen", "127.0.0.1:0", "--api-key-env", "E2B_API_KEY"].map(str::to_owned).to_vec();
    let env = ["-e".to_owned(), format!("E2B_API_KEY={KEY}")];
    let measured = (|| -> Result<String> {
        let mut starts = Vec::new();
        for _ in 0..5 {
            let t = std::time::Instant::now();
            let c = Container::start(root, &env, &cmd)?;
            c.api_url()?;
            starts.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let container = Container::start(root, &env, &cmd)?;
        let url = container.api_url()?;
        let (mut run_h, mut run_c, mut create_h, mut create_c) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..3 {
            run_h.extend(sdk_samples(&python, root, &host_url, "bench", 100)?);
            run_c.extend(sdk_samples(&python, root, &url, "bench", 100)?);
            create_h.extend(sdk_samples(&python, root, &host_url, "create", 10)?);
            create_c.extend(sdk_samples(&python, root, &url, "create", 10)?);
        }
        let idle = container_memory(&container.0)?;
        let held = 8;
        let mut holder = Command::new(&python)
            .arg(root.join("deploy/test/e2b_container.py"))
            .args(["hold", &held.to_string()])
            .env("E2B_API_URL", &url)
            .env("E2B_SANDBOX_URL", &url)
            .env("E2B_API_KEY", KEY)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        {
            use std::io::BufRead as _;
            let out = holder.stdout.take().context("the holder's output")?;
            let mut first = String::new();
            std::io::BufReader::new(out).read_line(&mut first)?;
            if !first.contains("held") {
                bail!("the holder made no sandboxes: {first}");
            }
        }
        let busy = container_memory(&container.0)?;
        drop(holder.stdin.take());
        holder.wait()?;
        let per = busy.saturating_sub(idle) as f64 / f64::from(held) / 1_048_576.0;
        let (rh, rc, ch, cc) = (p50(run_h), p50(run_c), p50(create_h), p50(create_c));
        let mut t = String::from(
            "| what | in the container | on the host (same run) | container / host |\n|---|---|---|---|\n",
        );
        t.push_str(&format!("| SDK `commands.run(\"true\")` p50 | {rc:.2} ms | {rh:.2} ms | {:.2}x |\n", rc / rh));
        t.push_str(&format!("| SDK `Sandbox.create()` + `kill()` p50 | {cc:.1} ms | {ch:.1} ms | {:.2}x |\n", cc / ch));
        t.push_str(&format!(
            "| memory per live sandbox (the container's cgroup, {held} held) | {per:.1} MiB | | |\n| an idle server's memory (the container's cgroup) | {:.1} MiB | | |\n",
            idle as f64 / 1_048_576.0
        ));
        t.push_str(&format!(
            "| `docker run` to the E2B API answering, p50 of 5 (a pod's floor) | {:.0} ms | | |\n",
            p50(starts)
        ));
        Ok(t)
    })();
    let _ = Command::new("kill").arg(host.id().to_string()).status();
    let _ = host.wait();
    let _ = fs::remove_dir_all(&state);
    measured
}

/// The host range the user-namespaced owner maps ids 0..65536 to (as a kubelet gives a pod
/// with `hostUsers: false` a range of its own).
const POD_RANGE: u32 = 3_145_728;

/// A Kubernetes pod with `hostUsers: false`, as far as one host can show it: `stockade serve`
/// as root of a user namespace that maps 65,536 ids (`unshare --map-users`), with a mount
/// namespace, `/run` and its state on tmpfs of its own. A session made there (with a disk
/// and memory limit) runs a command, and the host's `/proc` shows that command's uid is one
/// of the pod's range, in the upper half stockade takes for its guests, and not the owner's.
fn userns_pod(binary: &Path) -> Result<()> {
    use std::io::{BufRead as _, Write as _};
    let dir = std::env::temp_dir().join(format!("stockade-userns-pod-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("state"))?;
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
    // The pod's root must reach the binary: a copy beside the state, not under /root.
    fs::copy(binary, dir.join("stockade"))?;
    let mark = format!("{}", 800_000 + std::process::id() % 100_000);
    let script = format!(
        "set -e; mount -t tmpfs run /run; mount -t tmpfs state {d}/state; export STOCKADE_STATE_DIR={d}/state; \
         S={d}/stockade; P=$($S serve --detach); ID=$($S session create --memory 128M --disk 32M); \
         $S session exec -d $ID -- sleep {mark} >/dev/null; echo ready; read _; $S session kill $ID; kill $P",
        d = dir.display()
    );
    // util-linux's unshare maps through shadow's newuidmap, which maps only what
    // /etc/subuid and /etc/subgid give the caller (.ci/run adds root's).
    let entry = format!("root:{POD_RANGE}:65536");
    for file in ["/etc/subuid", "/etc/subgid"] {
        if !fs::read_to_string(file).unwrap_or_default().lines().any(|l| l.trim() == entry) {
            bail!("{file} lacks `{entry}`, the pod's range for newuidmap (.ci/run adds it; uidmap must be installed)");
        }
    }
    let map = format!("{POD_RANGE},0,65536");
    let mut child = Command::new("unshare")
        .args(["--user", "--map-users", &map, "--map-groups", &map, "--setuid", "0", "--setgid", "0"])
        .args(["--mount", "--propagation", "private", "--fork", "--", "sh", "-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("unshare (util-linux 2.38 or later, for --map-users, with uidmap's newuidmap)")?;
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().context("the pod's output")?).read_line(&mut first)?;
    // `sleep` itself (its argv is NUL-separated), not the script that names it.
    let guests = with_marker(&format!("sleep\0{mark}"));
    let uids: Vec<u32> = guests
        .iter()
        .filter_map(|pid| {
            let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            status.lines().find_map(|l| l.strip_prefix("Uid:"))?.split_whitespace().next()?.parse().ok()
        })
        .collect();
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(b"done\n");
    }
    let status = child.wait()?;
    let _ = fs::remove_dir_all(&dir);
    let (low, high) = (POD_RANGE + 32767, POD_RANGE + 65534);
    if first.trim() != "ready" || uids.is_empty() || !uids.iter().all(|u| (low..high).contains(u)) || !status.success()
    {
        bail!(
            "a session in a 65,536-id user namespace: said {first:?}, its command's host uids {uids:?} (want each in {low}..{high}), exit {status}"
        );
    }
    println!(
        "deploy: ok   in a pod-like user namespace of 65,536 ids, a session's guest runs as host uid {uids:?}, in the pod's upper half"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;

    #[test]
    fn the_deploy_page_shows_the_run_line_the_test_uses() {
        let doc = fs::read_to_string(crate::root().join("docs/deploy.md")).unwrap();
        let line = run_line();
        assert!(doc.contains(&format!("{line} \\\n")), "docs/deploy.md does not show:\n{line}");
        assert!(line.contains("--cap-add SYS_ADMIN") && line.contains("seccomp=deploy/seccomp/stockade-serve.json"));
    }

    #[test]
    fn the_caps_mask_is_what_proc_prints_for_them() {
        // CAP_CHOWN 0, CAP_KILL 5, CAP_SETGID 6, CAP_SETUID 7, CAP_SYS_PTRACE 19, CAP_SYS_ADMIN 21.
        assert_eq!(caps_mask(), 0x2800e1);
    }

    #[test]
    fn the_content_stamp_changes_with_any_part() {
        assert_ne!(fnv(&[b"a", b"b"]), fnv(&[b"a", b"c"]));
        assert_eq!(fnv(&[b"ab"]), fnv(&[b"a", b"b"]));
    }
}
