//! A private docker engine that a test may crash and restart: the machine's engine is
//! never restarted, because that would stop every container on it, not only the tests'.
//!
//! It is Debian's `dockerd`, started by the test in a network namespace of its own (so its
//! `--bridge=none` touches no interface of the host's), with its own configuration file,
//! data root, exec root, socket and pidfile, so its managed containerd, images, containers,
//! volumes and mounts are its own too. The test loads the test image into it from the
//! machine's engine. Everything it started is ended by PID when it is dropped, and its
//! directory is unmounted and removed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bollard::query_parameters::ListContainersOptionsBuilder;

use crate::docker::{containers_on, volumes_on};

pub(crate) struct PrivateEngine {
    dir: PathBuf,
    dockerd: Option<Child>,
}

/// How a test stops the private engine.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Stop {
    /// SIGTERM: a restart by a service manager (the engine stops its containers, then exits).
    Term,
    /// SIGKILL: a crash (the containers go on under their shims, and the managed
    /// containerd with them, until the engine is back).
    Kill,
}

impl PrivateEngine {
    /// Starts one with `image` loaded, or says why it cannot (no `dockerd`, no `unshare`,
    /// not root, no machine engine to take the image from).
    pub(crate) fn start(image: &str) -> Result<Self, String> {
        for tool in ["dockerd", "unshare", "docker"] {
            let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output();
            if !found.is_ok_and(|o| o.status.success()) {
                return Err(format!("no {tool} on PATH"));
            }
        }
        let dir = std::env::temp_dir().join(format!("stockade-engine-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        std::fs::write(dir.join("daemon.json"), "{}\n").map_err(|e| e.to_string())?;
        let mut engine = Self { dir, dockerd: None };
        engine.up()?;
        let load = format!("docker save {image} | DOCKER_HOST={} docker load -q", shell_quote(&engine.host()));
        let out = Command::new("sh").args(["-c", &load]).output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("loading {image}: {}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(engine)
    }

    /// The engine's address, for `DockerTier::connect_to`.
    pub(crate) fn host(&self) -> String {
        format!("unix://{}", self.dir.join("docker.sock").display())
    }

    /// Starts dockerd (again) and waits until it answers. A dockerd that exits while it
    /// starts is started again, twice at most, as its service manager would: under load
    /// its managed containerd can miss dockerd's own 15 s start timeout.
    pub(crate) fn up(&mut self) -> Result<(), String> {
        let mut failed = Vec::new();
        for _ in 0..3 {
            match self.up_once() {
                Ok(()) => return Ok(()),
                Err(e) => {
                    eprintln!("the private engine did not start, starting it again: {e}");
                    failed.push(e);
                }
            }
        }
        Err(failed.join("\n---\n"))
    }

    fn up_once(&mut self) -> Result<(), String> {
        let d = &self.dir;
        // A crashed dockerd's managed containerd dies with it (its parent-death signal) and
        // is reparented to this machine's init, which may reap it late. Until then its pid
        // is still in use, and a new dockerd that finds it in the pidfile takes it for a
        // live containerd, waits for its socket and gives up. A service manager's restart
        // (systemd reaps at once) does not meet this; wait for the reaping.
        let pidfile = std::fs::read_to_string(d.join("exec/containerd/containerd.pid")).unwrap_or_default();
        if let Ok(pid) = pidfile.trim().parse::<u32>() {
            let started = Instant::now();
            while zombie(pid) && started.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // What the engine will find of its managed containerd (a diagnosis when it fails).
        let before = match pidfile.trim().parse::<u32>() {
            Ok(pid) if Path::new(&format!("/proc/{pid}")).exists() => format!("containerd.pid names live pid {pid}"),
            Ok(pid) => format!("containerd.pid names gone pid {pid}"),
            Err(_) => "no containerd.pid".to_owned(),
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("dockerd.log"))
            .map_err(|e| e.to_string())?;
        let child = Command::new("unshare")
            .args(["--net", "--", "dockerd", "--iptables=false", "--ip6tables=false", "--ip-forward=false"])
            .args(["--ip-masq=false", "--bridge=none"])
            .arg("--config-file")
            .arg(d.join("daemon.json"))
            .arg("--data-root")
            .arg(d.join("data"))
            .arg("--exec-root")
            .arg(d.join("exec"))
            .arg("--pidfile")
            .arg(d.join("docker.pid"))
            .arg("-H")
            .arg(self.host())
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("unshare --net dockerd: {e}"))?;
        self.dockerd = Some(child);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(60) {
            let ping = Command::new("docker").args(["-H", &self.host(), "version"]).output();
            if ping.is_ok_and(|o| o.status.success()) {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = self.dockerd.as_mut().map(Child::try_wait) {
                self.dockerd = None;
                return Err(format!(
                    "dockerd exited ({status}) after {:?} ({before} at its start): {}",
                    started.elapsed(),
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("dockerd did not answer within 60 s: {}", self.log_tail()))
    }

    /// Stops dockerd (the process this started, by PID) and reaps it.
    pub(crate) fn stop(&mut self, how: Stop) {
        let Some(mut child) = self.dockerd.take() else { return };
        let signal = match how {
            Stop::Term => "-TERM",
            Stop::Kill => "-KILL",
        };
        let _ = Command::new("kill").args([signal, &child.id().to_string()]).status();
        let _ = child.wait();
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("dockerd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Processes the engine started (its containerd, the shims) that are still alive:
    /// every one names this engine's directory on its command line.
    pub(crate) fn processes(&self) -> Vec<u32> {
        let mark = self.dir.to_string_lossy().into_owned();
        stockade_test_support::host_pids(|cmd| String::from_utf8_lossy(cmd).contains(&mark))
    }

    /// A client of the private engine.
    fn client(&self) -> bollard::Docker {
        let path = self.dir.join("docker.sock");
        bollard::Docker::connect_with_unix(&path.to_string_lossy(), 30, bollard::API_DEFAULT_VERSION).unwrap()
    }

    /// Stockade containers and volumes of this test process on the private engine, counted
    /// through its own socket.
    pub(crate) async fn counts(&self) -> (usize, usize) {
        let docker = self.client();
        let pid = std::process::id();
        (containers_on(&docker, pid, false).await, volumes_on(&docker, pid).await)
    }

    /// [`PrivateEngine::counts`] once they are `want`, or after 10 s (background removals
    /// and a pool's replacement take a moment).
    pub(crate) async fn counts_settle(&self, want: (usize, usize)) -> (usize, usize) {
        let mut counts = self.counts().await;
        for _ in 0..50 {
            if counts == want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            counts = self.counts().await;
        }
        counts
    }

    /// How many containers of this engine run a process whose command line contains
    /// `command` (the host's view, through the engine's `top`).
    pub(crate) async fn running(&self, command: &str) -> usize {
        let docker = self.client();
        let opts = ListContainersOptionsBuilder::default().build();
        let mut count = 0;
        for c in docker.list_containers(Some(opts)).await.unwrap_or_default() {
            let Some(id) = c.id else { continue };
            let Ok(top) = docker.top_processes(&id, None::<bollard::query_parameters::TopOptions>).await else {
                continue;
            };
            if top.processes.unwrap_or_default().iter().any(|p| p.last().is_some_and(|c| c.contains(command))) {
                count += 1;
            }
        }
        count
    }
}

impl Drop for PrivateEngine {
    fn drop(&mut self) {
        // A graceful stop first: the engine stops its containers and its containerd.
        self.stop(Stop::Term);
        let started = Instant::now();
        while !self.processes().is_empty() && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(100));
        }
        // What is left (after a crash, say) was started by this engine: ended by PID.
        for pid in self.processes() {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
        unmount_under(&self.dir);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether process `pid` has exited and waits to be reaped.
fn zombie(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command's closing parenthesis.
    stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
}

/// Unmounts every mount at or below `dir`, deepest first.
fn unmount_under(dir: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return };
    let prefix = dir.to_string_lossy().into_owned();
    let mut points: Vec<&str> =
        info.lines().filter_map(|l| l.split(' ').nth(4)).filter(|p| p.starts_with(&prefix)).collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = Command::new("umount").args(["-l", p]).status();
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
