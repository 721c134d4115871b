//! The host-side world the attacks reach for, and the checks that decide every verdict.

use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Random hex from the OS.
fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut buf);
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Everything the harness set up, and what it must find unchanged afterwards.
pub struct World {
    /// The scratch root: `/tmp/stockade-escape-<pid>`.
    pub root: PathBuf,
    /// The fake home with canary secrets.
    pub home: PathBuf,
    /// A fake shadow file.
    pub shadow: PathBuf,
    /// Canary strings that must never appear in a run's output.
    pub canaries: Vec<(String, String)>,
    bashrc: String,
    tcp: TcpListener,
    udp: UdpSocket,
    unix: UnixListener,
    unix_path: PathBuf,
    abstract_name: String,
    abstract_sock: UnixListener,
    victim: Child,
    core_pattern: String,
    hostname: String,
    host_shadow_line: Option<String>,
    shm: Option<(String, String)>,
    metadata: Metadata,
}

/// The address of the stand-in metadata service (link-local, as on real clouds).
pub const METADATA_ADDR: &str = "169.254.169.254";
const METADATA_HOST_SIDE: &str = "169.254.169.253";

/// A network namespace the harness creates, holding the stand-in metadata address on a veth,
/// with a /32 host route to it: traffic from the host's network namespace for that address
/// can only ever reach this namespace, never a real network.
pub struct Metadata {
    ns: String,
    host_if: String,
    listener: Child,
    log: PathBuf,
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let st = Command::new("ip").args(args).stdout(Stdio::null()).stderr(Stdio::null()).status()?;
    if !st.success() {
        anyhow::bail!("ip {} failed", args.join(" "));
    }
    Ok(())
}

impl Metadata {
    fn new(root: &Path) -> anyhow::Result<Self> {
        Self::reap_stale();
        let tag = std::process::id() % 100_000;
        let ns = format!("stockade-md-{tag}");
        let (host_if, ns_if) = (format!("stkmd{tag}h"), format!("stkmd{tag}n"));
        let r = Self::setup(root, &ns, &host_if, &ns_if);
        if r.is_err() {
            // Leave nothing behind when setup fails half way.
            let _ = ip(&["route", "del", &format!("{METADATA_ADDR}/32"), "dev", &host_if]);
            let _ = ip(&["link", "del", &host_if]);
            let _ = ip(&["netns", "del", &ns]);
        }
        r
    }

    /// Removes what a killed harness left: a `stockade-md-TAG` namespace with no process
    /// in it (its listener is gone), with its veth and route.
    fn reap_stale() {
        let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else { return };
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some(ns) = line.split_whitespace().next().filter(|n| n.starts_with("stockade-md-")) else { continue };
            let pids = Command::new("ip").args(["netns", "pids", ns]).output().map(|o| o.stdout).unwrap_or_default();
            if !String::from_utf8_lossy(&pids).trim().is_empty() {
                continue;
            }
            let host_if = format!("stkmd{}h", ns.trim_start_matches("stockade-md-"));
            let _ = ip(&["route", "del", &format!("{METADATA_ADDR}/32"), "dev", &host_if]);
            let _ = ip(&["link", "del", &host_if]);
            let _ = ip(&["netns", "del", ns]);
        }
    }

    fn setup(root: &Path, ns: &str, host_if: &str, ns_if: &str) -> anyhow::Result<Self> {
        let (ns, host_if, ns_if) = (ns.to_owned(), host_if.to_owned(), ns_if.to_owned());
        let _ = ip(&["netns", "del", &ns]);
        ip(&["netns", "add", &ns])?;
        ip(&["link", "add", &host_if, "type", "veth", "peer", "name", &ns_if])?;
        ip(&["link", "set", &ns_if, "netns", &ns])?;
        ip(&["addr", "add", &format!("{METADATA_HOST_SIDE}/32"), "dev", &host_if])?;
        ip(&["link", "set", &host_if, "up"])?;
        ip(&["route", "add", &format!("{METADATA_ADDR}/32"), "dev", &host_if, "src", METADATA_HOST_SIDE])?;
        ip(&["netns", "exec", &ns, "ip", "addr", "add", &format!("{METADATA_ADDR}/32"), "dev", &ns_if])?;
        ip(&["netns", "exec", &ns, "ip", "link", "set", &ns_if, "up"])?;
        ip(&["netns", "exec", &ns, "ip", "link", "set", "lo", "up"])?;
        ip(&["netns", "exec", &ns, "ip", "route", "add", &format!("{METADATA_HOST_SIDE}/32"), "dev", &ns_if])?;
        let log = root.join("metadata.log");
        std::fs::write(&log, "")?;
        let listener = Command::new("ip")
            .args(["netns", "exec", &ns])
            .arg(std::env::current_exe()?)
            .arg("--listen-metadata")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let md = Self { ns, host_if, listener, log };
        md.self_test()?;
        Ok(md)
    }

    /// Proves the oracle works: a connection from the host's own network namespace must
    /// land in the harness's listener (never anywhere else). Then clears the log.
    fn self_test(&self) -> anyhow::Result<()> {
        let addr: std::net::SocketAddr = format!("{METADATA_ADDR}:80").parse()?;
        for _ in 0..100 {
            if std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(200)).is_ok() {
                for _ in 0..100 {
                    if self.touched() {
                        std::fs::write(&self.log, "")?;
                        return Ok(());
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        anyhow::bail!("the stand-in metadata service at {METADATA_ADDR} did not come up in its namespace")
    }

    fn touched(&self) -> bool {
        std::fs::read_to_string(&self.log).is_ok_and(|s| !s.is_empty())
    }
}

impl Drop for Metadata {
    fn drop(&mut self) {
        let _ = self.listener.kill();
        let _ = self.listener.wait();
        let _ = ip(&["route", "del", &format!("{METADATA_ADDR}/32"), "dev", &self.host_if]);
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = ip(&["netns", "del", &self.ns]);
    }
}

/// The stand-in metadata service: runs inside the harness's namespace, records every
/// connection in `log`. Started by the harness as `--listen-metadata LOG`.
pub fn listen_metadata(log: &Path) -> anyhow::Result<()> {
    let listener = TcpListener::bind(format!("{METADATA_ADDR}:80"))?;
    for conn in listener.incoming() {
        let peer = conn.map(|c| c.peer_addr().map(|a| a.to_string()).unwrap_or_default()).unwrap_or_default();
        let mut f = std::fs::OpenOptions::new().append(true).open(log)?;
        std::io::Write::write_all(&mut f, format!("connection from {peer}\n").as_bytes())?;
    }
    Ok(())
}

/// A System V shared memory segment made with `ipcmk`: (key, id).
fn make_shm() -> Option<(String, String)> {
    let out = Command::new("ipcmk").args(["-M", "4096"]).output().ok()?;
    let id = String::from_utf8_lossy(&out.stdout).rsplit(' ').next()?.trim().to_owned();
    let table = std::fs::read_to_string("/proc/sysvipc/shm").ok()?;
    let key = table.lines().find_map(|l| {
        let cols: Vec<&str> = l.split_whitespace().collect();
        (cols.get(1) == Some(&id.as_str())).then(|| cols[0].to_owned())
    })?;
    Some((key, id))
}

/// The (lpid, nattch) of a shm segment: who last attached, and how many are attached.
fn shm_use(id: &str) -> Option<(String, String)> {
    let table = std::fs::read_to_string("/proc/sysvipc/shm").ok()?;
    table.lines().find_map(|l| {
        let cols: Vec<&str> = l.split_whitespace().collect();
        (cols.get(1) == Some(&id))
            .then(|| (cols.get(5).copied().unwrap_or("").to_owned(), cols.get(6).copied().unwrap_or("").to_owned()))
    })
}

/// Names of the `key=value` arguments every attack gets.
pub struct Targets {
    /// `key=value` strings.
    pub args: Vec<String>,
    /// A marker unique to this attack run (for processes and cgroup names).
    pub marker: String,
}

impl World {
    /// Builds the world under `/tmp`. `supervisor_secret` is a value in the harness's own
    /// environment that must not leak.
    pub fn new(supervisor_secret: &str) -> anyhow::Result<Self> {
        let root = std::env::temp_dir().join(format!("stockade-escape-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let home = root.join("home");
        std::fs::create_dir_all(home.join(".ssh"))?;
        std::fs::create_dir_all(home.join(".aws"))?;
        std::fs::create_dir_all(home.join(".config/gh"))?;
        let mut canaries = vec![("supervisor environment".to_owned(), supervisor_secret.to_owned())];
        for (file, what) in
            [(".ssh/id_rsa", "ssh key"), (".aws/credentials", "aws credentials"), (".config/gh/hosts.yml", "gh token")]
        {
            let secret = format!("CANARY-{}", random_hex(12));
            std::fs::write(home.join(file), &secret)?;
            canaries.push((what.to_owned(), secret));
        }
        let bashrc = format!("# CANARY-{}\n", random_hex(8));
        std::fs::write(home.join(".bashrc"), &bashrc)?;
        let shadow = root.join("shadow");
        let shadow_secret = format!("root:$6$CANARY-{}:19000:0:99999:7:::", random_hex(12));
        std::fs::write(&shadow, &shadow_secret)?;
        canaries.push(("fake shadow".to_owned(), shadow_secret));
        let victim_secret = format!("CANARY-{}", random_hex(12));
        let victim = Command::new("/usr/bin/sleep")
            .arg("3600")
            .env_clear()
            .env("VICTIM_SECRET", &victim_secret)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        canaries.push(("host process environment".to_owned(), victim_secret));
        let tcp = TcpListener::bind("127.0.0.1:0")?;
        tcp.set_nonblocking(true)?;
        let udp = UdpSocket::bind("127.0.0.1:0")?;
        udp.set_nonblocking(true)?;
        let unix_path = home.join("docker.sock");
        let unix = UnixListener::bind(&unix_path)?;
        unix.set_nonblocking(true)?;
        let abstract_name = format!("stockade-escape-{}", random_hex(6));
        let abstract_sock = UnixListener::bind_addr(&SocketAddr::from_abstract_name(abstract_name.as_bytes())?)?;
        abstract_sock.set_nonblocking(true)?;
        let host_shadow_line =
            std::fs::read_to_string("/etc/shadow").ok().and_then(|s| s.lines().next().map(str::to_owned));
        let shm = make_shm();
        let metadata = match Metadata::new(&root) {
            Ok(m) => m,
            Err(e) => {
                if let Some((_, id)) = &shm {
                    let _ = Command::new("ipcrm").args(["-m", id]).status();
                }
                let _ = std::fs::remove_dir_all(&root);
                let mut victim = victim;
                let _ = victim.kill();
                let _ = victim.wait();
                return Err(e);
            }
        };
        Ok(Self {
            shm,
            metadata,
            core_pattern: std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap_or_default(),
            hostname: std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default(),
            root,
            home,
            shadow,
            canaries,
            bashrc,
            tcp,
            udp,
            unix,
            unix_path,
            abstract_name,
            abstract_sock,
            victim,
            host_shadow_line,
        })
    }

    /// The arguments for one attack run.
    #[must_use]
    pub fn targets(&self, attack: &str) -> Targets {
        // A number (the setsid attack sleeps for it) that no other process has in its argv.
        let n = u64::from_str_radix(&random_hex(6), 16).unwrap_or(0);
        let marker = format!("{}{}.{:06}", 7000 + attack.len(), n % 100_000, n % 999_983);
        Targets {
            args: vec![
                format!("home={}", self.home.display()),
                format!("shadow={}", self.shadow.display()),
                format!("tcp={}", self.tcp.local_addr().map(|a| a.port()).unwrap_or(0)),
                format!("udp={}", self.udp.local_addr().map(|a| a.port()).unwrap_or(0)),
                format!("unix={}", self.unix_path.display()),
                format!("abstract={}", self.abstract_name),
                format!("pid={}", self.victim.id()),
                format!("marker={marker}"),
                format!("metadata={METADATA_ADDR}:80"),
                format!("shm_key={}", self.shm.as_ref().map_or(0, |(k, _)| k.parse::<i64>().unwrap_or(0))),
            ],
            marker,
        }
    }

    /// Checks the world after a run; returns the first escape found, as evidence.
    pub fn check(&mut self, output: &[u8], marker: &str) -> Option<String> {
        let text = String::from_utf8_lossy(output);
        for (what, secret) in &self.canaries {
            if text.contains(secret.as_str()) {
                return Some(format!("the {what} canary appeared in the output"));
            }
        }
        if let Some(line) = &self.host_shadow_line
            && !line.is_empty()
            && text.contains(line.as_str())
        {
            return Some("the host's /etc/shadow appeared in the output".into());
        }
        if std::fs::read_to_string(self.home.join(".bashrc")).ok().as_deref() != Some(self.bashrc.as_str()) {
            return Some("~/.bashrc was modified".into());
        }
        if self.home.join("pwned").exists() {
            return Some("a file appeared in the home directory".into());
        }
        if self.tcp.accept().is_ok() {
            return Some("the host's TCP listener on 127.0.0.1 accepted a connection".into());
        }
        let mut buf = [0u8; 64];
        if self.udp.recv_from(&mut buf).is_ok() {
            return Some("the host's UDP listener on 127.0.0.1 received a datagram".into());
        }
        if self.unix.accept().is_ok() {
            return Some("the docker.sock stand-in accepted a connection".into());
        }
        if self.abstract_sock.accept().is_ok() {
            return Some("the abstract unix socket accepted a connection".into());
        }
        match self.victim.try_wait() {
            Ok(None) => {}
            _ => return Some("the host process was killed".into()),
        }
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.victim.id())).unwrap_or_default();
        if status.lines().any(|l| l.starts_with("TracerPid:") && l.split_whitespace().nth(1) != Some("0")) {
            return Some("the host process is being traced".into());
        }
        if std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap_or_default() != self.core_pattern {
            // Put the host back before reporting.
            let _ = std::fs::write("/proc/sys/kernel/core_pattern", self.core_pattern.trim_end());
            return Some("the host's core_pattern changed".into());
        }
        if std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default() != self.hostname {
            let _ = std::fs::write("/proc/sys/kernel/hostname", self.hostname.trim_end());
            return Some("the host's hostname changed".into());
        }
        if Path::new("/sys/fs/cgroup/pids").join(marker).exists()
            || Path::new("/sys/fs/cgroup/memory").join(marker).exists()
        {
            return Some("a cgroup appeared on the host".into());
        }
        if self.metadata.touched() {
            // Consume the evidence, as accept() does for the other listeners.
            let _ = std::fs::write(&self.metadata.log, "");
            return Some(format!("the stand-in metadata service at {METADATA_ADDR} was reached"));
        }
        if let Some((_, id)) = &self.shm
            && shm_use(id).is_some_and(|(lpid, nattch)| lpid != "0" || nattch != "0")
        {
            return Some("the host's System V shared memory segment was attached".into());
        }
        let survivors = pids_with(marker);
        if !survivors.is_empty() {
            return Some(format!("processes of the run outlived it: {survivors:?}"));
        }
        None
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = self.victim.kill();
        let _ = self.victim.wait();
        if let Some((_, id)) = &self.shm {
            let _ = Command::new("ipcrm").args(["-m", id]).status();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Host pids whose command line contains `marker`, right now.
#[must_use]
pub fn pids_now(marker: &str) -> Vec<u32> {
    stockade_test_support::host_pids(|cmd| {
        // The stand-in supervisor's own argv carries the marker too; only the attack counts.
        let cmd = String::from_utf8_lossy(cmd);
        cmd.contains(marker) && !cmd.contains("--supervise-one")
    })
}

/// Host pids whose command line contains `marker`, after giving dying processes a moment.
#[must_use]
pub fn pids_with(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for _ in 0..25 {
        found = pids_now(marker);
        if found.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    found
}
