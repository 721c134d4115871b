//! `stockade serve` (the owner of live sessions, on a unix socket only its user can open) and
//! `stockade session ...` (its client).
//!
//! The shape follows `docker exec`: `session create` prints an id, `session exec ID -- CMD`
//! runs one command with the shell's habits (stdin piped, stderr shown, the exit status passed
//! through), `session cp SRC DST` copies with `ID:PATH` naming the session's side, and `ls`
//! and `kill` manage them. Sessions die with the owner: `serve` ends every one on SIGTERM or
//! SIGINT, and a SIGKILLed owner's sandboxes die with it (parent-death signals); what it left
//! on disk is removed by the next owner or `stockade gc`.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use stockade_agent::config::{parse_duration, parse_size};
use stockade_runtime::protocol::session::{
    ExecInfo, MAX_FILE_BYTES, SESSION_CODEC, SessionCall, SessionInfo, SessionProcessInfo, SessionReply,
};
use stockade_runtime::protocol::{Access, Busy, Limits, LiveIo, RunError, Workspace};
use stockade_runtime::session::{FilesError, SessionProfile, Sessions, exec_job};
use tokio::net::{UnixListener, UnixStream};

/// `stockade serve`.
#[derive(clap::Args, Debug)]
pub(crate) struct ServeArgs {
    /// The socket to listen on (default: `serve/serve.sock` in stockade's state directory).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Most live sessions.
    #[arg(long, default_value_t = stockade_runtime::session::DEFAULT_MAX_SESSIONS)]
    max_sessions: usize,
    /// Start the owner in the background, print its pid once it listens, and return (its log
    /// is `serve.log` beside the socket; `kill PID` ends it and its sessions).
    #[arg(long)]
    detach: bool,
    /// Also speak E2B's API on this address (loopback only), so the E2B SDKs drive the
    /// sessions: `E2B_API_URL=http://ADDR E2B_SANDBOX_URL=http://ADDR`.
    #[arg(long, requires = "api_key_env")]
    listen: Option<std::net::SocketAddr>,
    /// The environment variable holding the API key E2B clients present.
    #[arg(long, requires = "listen")]
    api_key_env: Option<String>,
    /// Templates and bounds for the E2B face (`serve.toml`); without it, one `base`
    /// template: the process tier, no network.
    #[arg(long, requires = "listen")]
    config: Option<PathBuf>,
    /// Serve the E2B face over HTTPS with this certificate chain (PEM); needed off loopback.
    #[arg(long, requires_all = ["listen", "tls_key"])]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

/// The E2B face's configuration, from `--api-key-env` and `--config`.
fn e2b_config(args: &ServeArgs) -> Result<Option<(std::net::SocketAddr, stockade_serve::e2b::E2bConfig)>> {
    let (Some(addr), Some(var)) = (args.listen, args.api_key_env.as_deref()) else { return Ok(None) };
    if !addr.ip().is_loopback() && args.tls_cert.is_none() {
        bail!("--listen {addr}: not a loopback address; serving beyond this host needs --tls-cert and --tls-key");
    }
    let key = std::env::var(var).map_err(|_| anyhow!("--api-key-env {var}: the variable is not set"))?;
    if key.len() < 16 {
        bail!("--api-key-env {var}: the key is shorter than 16 characters");
    }
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            stockade_serve::e2b::E2bConfig::from_toml(key, &text).map_err(|e| anyhow!("{}: {e}", path.display()))?
        }
        None => stockade_serve::e2b::E2bConfig::new(key),
    };
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        let read = |p: &PathBuf| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
        let tls = stockade_serve::e2b::Tls::from_pem(&read(cert)?, &read(key)?)
            .map_err(|e| anyhow!("--tls-cert {} --tls-key {}: {e}", cert.display(), key.display()))?;
        config.tls = Some(tls);
    }
    Ok(Some((addr, config)))
}

/// `stockade session ...`.
#[derive(clap::Subcommand, Debug)]
pub(crate) enum SessionCommand {
    /// Make a session and print its id.
    Create {
        /// The session's memory (e.g. 512M, 2G).
        #[arg(long)]
        memory: Option<String>,
        /// The session's processes.
        #[arg(long)]
        pids: Option<u32>,
        /// A host directory at /workspace: PATH (read-write) or PATH:ro.
        #[arg(long)]
        workspace: Option<String>,
        /// End the session after this long without a call (e.g. 300s, 10m).
        #[arg(long, value_parser = parse_duration)]
        idle_timeout: Option<Duration>,
        /// End the session this long after it was made (e.g. 1h).
        #[arg(long, value_parser = parse_duration)]
        max_lifetime: Option<Duration>,
        /// Start the session's home with the files of a snapshot (`session snapshot`).
        #[arg(long)]
        from: Option<PathBuf>,
        /// The tier: process (default) or docker (one hardened container of --image; its
        /// home a volume of its own, its files moved through the engine).
        #[arg(long, default_value = "process", value_parser = ["process", "docker"])]
        tier: String,
        /// The docker tier's image (local; never pulled).
        #[arg(long, default_value = stockade_runtime::docker::spec::DEFAULT_IMAGE)]
        image: String,
        /// Let every exec reach HOST[:PORT] through the session's egress proxy (repeatable),
        /// as `stockade run --allow-net`; nothing else is reachable.
        #[arg(long = "allow-net", value_name = "HOST[:PORT]")]
        allow_net: Vec<String>,
        /// Pin NAME:PORT to IP for the network grant (repeatable), as `stockade run
        /// --net-resolve`.
        #[arg(long = "net-resolve", value_name = "NAME:PORT:IP")]
        net_resolve: Vec<String>,
        /// KEY=VALUE for every exec of the session, unless the exec sets KEY (repeatable).
        #[arg(long, short = 'e')]
        env: Vec<String>,
        /// The size of the session's home (e.g. 64M): a write past it fails with "No space
        /// left on device". The process tier makes it a tmpfs (memory-backed, as root only);
        /// the docker tier sizes the home volume (default 512M).
        #[arg(long, value_name = "SIZE")]
        disk: Option<String>,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Run a command in a session: stdin piped (unless a terminal), stdout and stderr shown as
    /// they come, the exit status passed through.
    Exec {
        /// The session.
        id: String,
        /// Working directory in the session (default /home/user).
        #[arg(long, short = 'w')]
        workdir: Option<String>,
        /// KEY=VALUE for this exec's environment (repeatable).
        #[arg(long, short = 'e')]
        env: Vec<String>,
        /// Wall-clock deadline, and the CPU time the exec may use (e.g. 30s, 1h; default 10m,
        /// or 24h with --detach: the session's own lifetime ends it first).
        #[arg(long, value_parser = parse_duration)]
        timeout: Option<Duration>,
        /// Run it in the background and print its pid (`session attach`, `input`, `signal`
        /// and `jobs` take it), as `docker exec -d`.
        #[arg(long, short = 'd')]
        detach: bool,
        /// Keep its stdin open: in the foreground, ours is streamed to it as it comes (as
        /// `docker exec -i`); with --detach, `session input` writes it (else it reads
        /// /dev/null).
        #[arg(long, short = 'i')]
        interactive: bool,
        /// Give it a pseudo-terminal (ROWSxCOLS, default this terminal's size or 24x80). In
        /// the foreground (`-it`, as `docker exec -it`), this terminal goes raw, each
        /// keystroke goes to it and its size follows ours; with --detach, `session resize`
        /// changes it.
        #[arg(long, short = 't', num_args = 0..=1, default_missing_value = "")]
        tty: Option<String>,
        #[command(flatten)]
        socket: SocketArg,
        /// The command.
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
    /// Stream a background exec's output as it comes (`--replay`: what it wrote before, its
    /// latest 1 MiB, first), then pass its exit status through. Ctrl-C leaves it running.
    Attach {
        /// The session.
        id: String,
        /// The exec's pid (`session exec -d` printed it).
        pid: u32,
        /// Show its earlier output first.
        #[arg(long)]
        replay: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Copy this command's stdin to a background exec's stdin (started with -i or -t), then
    /// close it (unless --keep-open).
    Input {
        /// The session.
        id: String,
        /// The exec's pid.
        pid: u32,
        /// Leave its stdin open at the end of ours.
        #[arg(long)]
        keep_open: bool,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Send a signal (default TERM) to a background exec's process group.
    Signal {
        /// The session.
        id: String,
        /// The exec's pid.
        pid: u32,
        /// The signal: a name (TERM, SIGKILL, INT, HUP, ...) or a number.
        #[arg(default_value = "TERM")]
        signal: String,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Set a background exec's terminal size.
    Resize {
        /// The session.
        id: String,
        /// The exec's pid.
        pid: u32,
        /// ROWSxCOLS, e.g. 40x120.
        size: String,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// List a session's background execs (running and ended) with their pids.
    Jobs {
        /// The session.
        id: String,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// List the live sessions.
    Ls {
        #[command(flatten)]
        socket: SocketArg,
    },
    /// List a session's processes (init aside), with their pids inside the session.
    Ps {
        /// The session.
        id: String,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Write a session's filesystem-only snapshot (its home: files, directories and symlinks)
    /// to a new tar file; `session create --from FILE` starts a session with those files.
    Snapshot {
        /// The session.
        id: String,
        /// The file to write (it must not exist).
        file: PathBuf,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Pause a session: every process frozen (no CPU), no exec until it resumes, its execs'
    /// deadlines stopped.
    Pause {
        /// The session.
        id: String,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Resume a paused session.
    Resume {
        /// The session.
        id: String,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// End a session: every process, its cgroup and its home.
    Kill {
        /// The session.
        id: String,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Copy a file into or out of a session: `cp LOCAL ID:PATH` or `cp ID:PATH LOCAL`
    /// (`-` for stdin or stdout).
    Cp {
        /// Source.
        src: String,
        /// Destination.
        dst: String,
        #[command(flatten)]
        socket: SocketArg,
    },
}

#[derive(clap::Args, Debug)]
pub(crate) struct SocketArg {
    /// The owner's socket (default: `serve/serve.sock` in stockade's state directory).
    #[arg(long)]
    socket: Option<PathBuf>,
}

/// The size (rows, columns) of the terminal our stdout or stdin is, if either is one.
fn our_terminal_size() -> Option<(u16, u16)> {
    use std::os::fd::AsFd;
    stockade_runtime::process::terminal_size(std::io::stdout().as_fd())
        .or_else(|| stockade_runtime::process::terminal_size(std::io::stdin().as_fd()))
}

/// Writes our stdin to background exec `pid` as it comes, until end of file (or a read
/// error, which is returned), then closes its stdin if `close` is set.
fn send_stdin(socket: &SocketArg, id: &str, pid: u32, close: bool) -> Result<()> {
    let mut buf = vec![0u8; 64 << 10];
    let mut stdin = std::io::stdin().lock();
    let read = loop {
        let n = match stdin.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) => n,
            Err(e) => break Err(e),
        };
        let data = buf[..n].to_vec();
        expect_ok(call(socket, &SessionCall::Input { id: id.to_owned(), pid, data, close: false })?)?;
    };
    if close {
        expect_ok(call(socket, &SessionCall::Input { id: id.to_owned(), pid, data: Vec::new(), close: true })?)?;
    }
    Ok(read?)
}

/// `session exec -i`/`-it` in the foreground, as `docker exec -it`, once exec `pid` has
/// started in the background with its stdin open (and a terminal, `with_pty`): our stdin is
/// streamed to it as it comes (this terminal raw, with a terminal on both ends), its size
/// follows ours when `follow` is set, and its output is attached (from its first byte) until
/// it ends, whose status is passed through.
fn foreground(socket: SocketArg, id: String, pid: u32, with_pty: bool, follow: bool) -> Result<ExitCode> {
    let raw = if with_pty && std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        use std::os::fd::AsFd;
        Some(
            stockade_runtime::process::RawTerminal::enter(std::io::stdin().as_fd())
                .context("putting this terminal in raw mode")?,
        )
    } else {
        None
    };
    let (socket_in, id_in) = (SocketArg { socket: socket.socket.clone() }, id.clone());
    // An exec that ended answers with an error, which ends the sending: nothing to report.
    std::thread::spawn(move || send_stdin(&socket_in, &id_in, pid, true));
    if with_pty && follow {
        let (socket_sz, id_sz) = (SocketArg { socket: socket.socket.clone() }, id.clone());
        std::thread::spawn(move || {
            let mut last = our_terminal_size();
            loop {
                std::thread::sleep(Duration::from_millis(250));
                let now = our_terminal_size();
                if let (true, Some((rows, cols))) = (now != last, now) {
                    let resize = SessionCall::Resize { id: id_sz.clone(), pid, rows, cols };
                    if !call(&socket_sz, &resize).is_ok_and(|r| expect_ok(r).is_ok()) {
                        return;
                    }
                    last = now;
                }
            }
        });
    }
    let reply = call(&socket, &SessionCall::Attach { id, pid, replay: true });
    drop(raw);
    let SessionReply::Ran(report) = expect_ok(reply?)? else { bail!("unexpected reply") };
    exit_status(*report)
}

fn default_socket() -> Result<PathBuf> {
    stockade_runtime::process::state_dir()
        .map(|d| d.join("serve").join("serve.sock"))
        .ok_or_else(|| anyhow!("no state directory: set STOCKADE_STATE_DIR, XDG_STATE_HOME or HOME, or pass --socket"))
}

/// `stockade serve`: owns sessions until SIGTERM or SIGINT.
pub(crate) fn serve(args: ServeArgs) -> Result<ExitCode> {
    let socket = match args.socket.clone() {
        Some(s) => s,
        None => default_socket()?,
    };
    let state = stockade_runtime::process::state_dir()
        .ok_or_else(|| anyhow!("no state directory: set STOCKADE_STATE_DIR, XDG_STATE_HOME or HOME"))?;
    let e2b = e2b_config(&args)?;
    if args.detach {
        let mut extra: Vec<std::ffi::OsString> = Vec::new();
        if let (Some(addr), Some(var)) = (args.listen, &args.api_key_env) {
            extra.extend(["--listen".into(), addr.to_string().into(), "--api-key-env".into(), var.into()]);
        }
        for (flag, file) in [("--config", &args.config), ("--tls-cert", &args.tls_cert), ("--tls-key", &args.tls_key)] {
            if let Some(f) = file {
                extra.extend([flag.into(), std::fs::canonicalize(f)?.into_os_string()]);
            }
        }
        return detach(&socket, args.max_sessions, &extra);
    }
    let _lifeline = lifeline();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let served = rt.block_on(async move {
        let tier = stockade_runtime::process::ProcessTier::new(crate::tiers::helper()?);
        let sessions = Arc::new(Sessions::new(tier, &state, args.max_sessions)?);
        let _e2b = match e2b {
            Some((addr, mut config)) => {
                // Snapshots outlive their sandbox and this server, as E2B's do.
                config.snapshots = Some(state.join("e2b-snapshots"));
                let tcp = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("--listen {addr}"))?;
                let scheme = if config.tls.is_some() { "https" } else { "http" };
                let _ = writeln!(std::io::stderr(), "stockade serve: E2B API on {scheme}://{}", tcp.local_addr()?);
                let server = stockade_serve::e2b::E2bServer::new(Arc::clone(&sessions), config);
                Some(AbortOnDrop(tokio::spawn(server.serve(tcp))))
            }
            None => None,
        };
        let listener = bind(&socket)?;
        let _ = writeln!(std::io::stderr(), "stockade serve: listening on {}", socket.display());
        let reaper = {
            let sessions = Arc::clone(&sessions);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                loop {
                    tick.tick().await;
                    for (id, why) in sessions.reap_expired().await {
                        let _ = writeln!(std::io::stderr(), "stockade serve: session {id} ended ({why:?} timeout)");
                    }
                }
            })
        };
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    if let Ok((conn, _)) = accepted {
                        let sessions = Arc::clone(&sessions);
                        tokio::spawn(async move { let _ = connection(conn, &sessions).await; });
                    }
                }
                _ = term.recv() => break,
                _ = tokio::signal::ctrl_c() => break,
            }
        }
        reaper.abort();
        let _ = std::fs::remove_file(&socket);
        // Bounded, whatever the clients do: what is not ended by then ends with this
        // process (every sandbox has a parent-death signal; a docker one, the lifeline).
        if tokio::time::timeout(SHUTDOWN_WITHIN, sessions.kill_all()).await.is_err() {
            let _ = writeln!(
                std::io::stderr(),
                "stockade serve: sessions did not all end within {SHUTDOWN_WITHIN:?}; they end with this process"
            );
        }
        Ok(ExitCode::SUCCESS)
    });
    // A blocking call still running (a client's files call) does not hold the exit.
    rt.shutdown_timeout(Duration::from_secs(2));
    served
}

/// How long `serve` waits for its sessions to end on SIGTERM or SIGINT.
const SHUTDOWN_WITHIN: Duration = Duration::from_secs(10);

/// Starts this owner's lifeline (`stockade docker lifeline`, in a process group of its own, so
/// a terminal's ^C reaches only the owner) and returns the pipe end it reads: held for the
/// owner's life, closed by the kernel when the owner exits, however it exits. Then the
/// lifeline removes what the engine still runs for this owner: a session container that was
/// paused when its owner was SIGKILLed, whose frozen keeper cannot stop it. `None` (and one
/// line on stderr) if it cannot be started; a running session container still stops with its
/// owner without it.
fn lifeline() -> Option<std::process::ChildStdin> {
    use std::os::unix::process::CommandExt;
    let owner = stockade_runtime::docker::spec::owner()?;
    let started = std::process::Command::new(std::env::current_exe().ok()?)
        .args(["docker", "lifeline", "--owner", owner])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn();
    match started {
        Ok(mut child) => child.stdin.take(),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "stockade serve: no lifeline for docker sessions: {e}");
            None
        }
    }
}

/// A task that ends when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The socket's directory: made mode 0700 if it is missing, else required to be this user's
/// alone. Never loosened or tightened here: a directory another user can enter (or one not
/// ours) could let them reach the socket, or be theirs to swap.
fn private_dir(socket: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let dir = socket.parent().ok_or_else(|| anyhow!("socket {} has no directory", socket.display()))?;
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display())),
        Err(e) => Err(e).with_context(|| format!("the socket's directory {}", dir.display())),
        Ok(m) if m.uid() != my_uid() || m.mode() & 0o077 != 0 => bail!(
            "the socket's directory {} must be yours alone (mode 0700); pass --socket in a private directory",
            dir.display()
        ),
        Ok(_) => Ok(()),
    }
}

/// `serve --detach`: this binary again as the owner, in a session of its own with its stdio
/// away from the caller's terminal, then its pid once its socket answers.
fn detach(socket: &Path, max_sessions: usize, extra: &[std::ffi::OsString]) -> Result<ExitCode> {
    use std::os::unix::process::CommandExt;
    private_dir(socket)?;
    let log_path = socket.with_file_name("serve.log");
    let log = std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .arg("serve")
        .arg("--socket")
        .arg(socket)
        .arg("--max-sessions")
        .arg(max_sessions.to_string())
        .args(extra)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("starting the session owner")?;
    let start = std::time::Instant::now();
    loop {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            println!("{}", child.id());
            return Ok(ExitCode::SUCCESS);
        }
        if let Some(status) = child.try_wait()? {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            bail!("the session owner exited ({status}): {}", log.lines().last().unwrap_or("no log"));
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            bail!("the session owner did not listen on {} within 20 s", socket.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Listens on `socket`, in a directory only this user can enter, the socket itself mode
/// 0600; an old socket that no owner answers is replaced, a live one is not.
fn bind(socket: &Path) -> Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    private_dir(socket)?;
    if socket.exists() {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            bail!("another `stockade serve` already listens on {}", socket.display());
        }
        std::fs::remove_file(socket).with_context(|| format!("removing the stale socket {}", socket.display()))?;
    }
    let listener = UnixListener::bind(socket).with_context(|| format!("listening on {}", socket.display()))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// One connection: one call, one reply. A peer of another uid is refused (the socket's mode
/// already keeps it out; this holds even if someone loosened it).
async fn connection(mut conn: UnixStream, sessions: &Sessions) -> Result<()> {
    let me = my_uid();
    if conn.peer_cred().map(|c| c.uid()).ok() != Some(me) {
        return Ok(());
    }
    let Some(frame) = SESSION_CODEC.read_frame_async(&mut conn).await? else { return Ok(()) };
    let reply = match stockade_runtime::protocol::parse_untrusted::<SessionCall>(
        &frame,
        stockade_runtime::protocol::JsonLimits::new(frame.len(), 16),
    ) {
        Ok(call @ SessionCall::Exec { .. }) => exec_streamed(call, sessions, &mut conn).await,
        Ok(SessionCall::Attach { id, pid, replay }) => attach(&id, pid, replay, sessions, &mut conn).await,
        Ok(call) => handle(call, sessions).await,
        Err(e) => error("invalid", format!("malformed call: {e}")),
    };
    let bytes = serde_json::to_vec(&reply)?;
    SESSION_CODEC.write_frame_async(&mut conn, &bytes).await?;
    Ok(())
}

/// A live copy of one of an exec's streams, as frames for the client: each write is a
/// chunk sent on. The exec's output budget bounds what can queue.
struct Tee {
    tx: tokio::sync::mpsc::UnboundedSender<SessionReply>,
    stdout: bool,
}

impl std::io::Write for Tee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let chunk = if self.stdout { SessionReply::Stdout(buf.to_vec()) } else { SessionReply::Stderr(buf.to_vec()) };
        // A client that hung up is no reason to stop the exec.
        let _ = self.tx.send(chunk);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An exec whose stdout and stderr go to the client as they come (`Stdout` and `Stderr`
/// frames), then its report; returns the last reply for the caller to send.
async fn exec_streamed(call: SessionCall, sessions: &Sessions, conn: &mut UnixStream) -> SessionReply {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let io = LiveIo {
        stdout: Some(Box::new(Tee { tx: tx.clone(), stdout: true })),
        stderr: Some(Box::new(Tee { tx, stdout: false })),
        ..LiveIo::default()
    };
    let exec = handle_exec(call, sessions, io);
    tokio::pin!(exec);
    let mut gone = false;
    let reply = loop {
        tokio::select! {
            reply = &mut exec => break reply,
            Some(chunk) = rx.recv() => gone = gone || !send(conn, &chunk).await,
        }
    };
    while let Ok(chunk) = rx.try_recv() {
        gone = gone || !send(conn, &chunk).await;
    }
    reply
}

/// Writes one reply frame; `false` if the client is gone.
async fn send(w: &mut (impl tokio::io::AsyncWrite + Unpin), reply: &SessionReply) -> bool {
    match serde_json::to_vec(reply) {
        Ok(bytes) => SESSION_CODEC.write_frame_async(w, &bytes).await.is_ok(),
        Err(_) => true,
    }
}

/// A background exec's output, as frames for the client (what it wrote before first, if
/// `replay`), then its end; returns the last reply for the caller to send. A client that
/// hangs up ends the attach, not the exec.
async fn attach(id: &str, pid: u32, replay: bool, sessions: &Sessions, conn: &mut UnixStream) -> SessionReply {
    use stockade_runtime::session::Chunk;
    use tokio::io::AsyncReadExt;
    let Some(session) = sessions.get(id) else { return missing(id) };
    let exec = match session.find(pid) {
        Ok(b) => b,
        Err(e) => return error("not_found", e.to_string()),
    };
    let (history, mut live) = exec.attach();
    let (mut rd, mut wr) = conn.split();
    let frame = |c: Chunk| match c {
        Chunk::Stdout(b) => SessionReply::Stdout(b),
        Chunk::Stderr(b) => SessionReply::Stderr(b),
    };
    for c in history.into_iter().filter(|_| replay) {
        if !send(&mut wr, &frame(c)).await {
            return SessionReply::Done;
        }
    }
    let end = exec.wait();
    tokio::pin!(end);
    let mut probe = [0u8; 1];
    loop {
        tokio::select! {
            result = &mut end => {
                // Its output was all pushed before its end was: what is queued is the rest.
                while let Some(c) = live.try_recv() {
                    if !send(&mut wr, &frame(c)).await {
                        return SessionReply::Done;
                    }
                }
                return match result {
                    Ok(report) => SessionReply::Ran(Box::new(report)),
                    Err(e) => run_error(&e),
                };
            }
            // A slow client holds this at `send`, and the exec's output waits for it.
            c = live.recv() => {
                if !send(&mut wr, &frame(c)).await {
                    return SessionReply::Done;
                }
            }
            // The client sends nothing after its call: a read that ends means it hung up.
            _ = rd.read(&mut probe) => return SessionReply::Done,
        }
    }
}

fn my_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(u32::MAX)
}

fn error(kind: &str, message: impl Into<String>) -> SessionReply {
    SessionReply::Error { kind: kind.into(), message: message.into() }
}

fn missing(id: &str) -> SessionReply {
    error("not_found", format!("no session {id} (`stockade session ls` lists them)"))
}

fn run_error(e: &RunError) -> SessionReply {
    let kind = match e {
        RunError::Misconfigured(_) => "invalid",
        RunError::Ended(_) => "not_found",
        RunError::Unsupported { .. } => "unsupported",
        RunError::Busy(_) | RunError::Exhausted(_) => "busy",
        _ => "internal",
    };
    error(kind, e.to_string())
}

fn files_error(e: &FilesError) -> SessionReply {
    let kind = match e {
        FilesError::NotFound(_) => "not_found",
        FilesError::Invalid { .. } | FilesError::TooLarge { .. } => "invalid",
        FilesError::Denied { .. } => "denied",
        _ => "internal",
    };
    error(kind, e.to_string())
}

/// One exec, with `io` as its live stdio.
async fn handle_exec(call: SessionCall, sessions: &Sessions, io: LiveIo) -> SessionReply {
    let SessionCall::Exec { id, argv, env, cwd, stdin, timeout_ms } = call else {
        return error("invalid", "not an exec");
    };
    let Some(session) = sessions.get(&id) else { return missing(&id) };
    let job = match exec_job(&argv, env, stdin, timeout_ms.map(Duration::from_millis)) {
        Ok(j) => j,
        Err(e) => return error("invalid", e.to_string()),
    };
    match session.exec(&job, cwd.as_deref(), io).await {
        Ok(report) => SessionReply::Ran(Box::new(report)),
        Err(e) => run_error(&e),
    }
}

async fn handle(call: SessionCall, sessions: &Sessions) -> SessionReply {
    match call {
        SessionCall::Create {
            memory_bytes,
            processes,
            workspace,
            idle_timeout_secs,
            max_lifetime_secs,
            from_snapshot,
            docker_image,
            allow_net,
            net_resolve,
            env,
            disk_bytes,
        } => {
            let mut profile = SessionProfile { env, home_bytes: disk_bytes, ..SessionProfile::default() };
            match crate::run::net_grant_from(None, &allow_net, &net_resolve) {
                Ok(Some(net)) => profile.grants = Some(Arc::new(stockade_runtime::Grants::new().net(net))),
                Ok(None) => {}
                Err(e) => return error("invalid", e.to_string()),
            }
            if let Some(image) = docker_image {
                profile.tier = stockade_runtime::session::SessionTier::Docker { image };
            }
            let mut limits = Limits::default();
            if let Some(m) = memory_bytes {
                limits = match limits.with_memory(m) {
                    Ok(l) => l,
                    Err(e) => return error("invalid", e.to_string()),
                };
            }
            if let Some(p) = processes {
                limits = match limits.with_processes(p) {
                    Ok(l) => l,
                    Err(e) => return error("invalid", e.to_string()),
                };
            }
            profile.limits = limits;
            if let Some((path, writable)) = workspace {
                let access = if writable { Access::ReadWrite } else { Access::ReadOnly };
                // Held for the session's life: another holder refuses it rather than waits.
                profile.workspace = match Workspace::new(path, access, Busy::Refuse) {
                    Ok(w) => Some(w),
                    Err(e) => return error("invalid", e.to_string()),
                };
            }
            if let Some(s) = idle_timeout_secs {
                profile.idle_timeout = Duration::from_secs(s);
            }
            if let Some(s) = max_lifetime_secs {
                profile.max_lifetime = Duration::from_secs(s);
            }
            profile.from_snapshot = from_snapshot.map(PathBuf::from);
            match sessions.create(profile).await {
                Ok(s) => SessionReply::Created { id: s.id().to_owned() },
                Err(e) => run_error(&e),
            }
        }
        call @ SessionCall::Exec { .. } => handle_exec(call, sessions, LiveIo::default()).await,
        SessionCall::List => SessionReply::Sessions(
            sessions
                .list()
                .iter()
                .map(|s| {
                    let (age, idle) = s.age();
                    SessionInfo {
                        id: s.id().to_owned(),
                        age_secs: age.as_secs(),
                        idle_secs: idle.as_secs(),
                        paused: s.paused(),
                    }
                })
                .collect(),
        ),
        SessionCall::Start { id, argv, env, cwd, timeout_ms, pty, stdin, tag } => {
            let Some(session) = sessions.get(&id) else { return missing(&id) };
            let job = match exec_job(&argv, env, Vec::new(), timeout_ms.map(Duration::from_millis)) {
                Ok(j) => j,
                Err(e) => return error("invalid", e.to_string()),
            };
            let opts = stockade_runtime::session::StartOptions { pty, stdin, tag };
            match session.start(job, cwd, opts).await {
                Ok(b) => SessionReply::Started { pid: b.pid() },
                Err(e) => run_error(&e),
            }
        }
        SessionCall::Input { id, pid, data, close } => {
            let Some(session) = sessions.get(&id) else { return missing(&id) };
            let mut r = Ok(());
            if !data.is_empty() {
                r = session.send_stdin(pid, &data).await;
            }
            if close && r.is_ok() {
                r = session.close_stdin(pid).await;
            }
            match r {
                Ok(()) => SessionReply::Done,
                Err(e) => run_error(&e),
            }
        }
        SessionCall::Signal { id, pid, signal } => {
            let Some(session) = sessions.get(&id) else { return missing(&id) };
            if !(1..=64).contains(&signal) {
                return error("invalid", format!("signal {signal}: not a signal number (1-64)"));
            }
            match session.signal(pid, signal).await {
                Ok(()) => SessionReply::Done,
                Err(e) => run_error(&e),
            }
        }
        SessionCall::Resize { id, pid, rows, cols } => {
            let Some(session) = sessions.get(&id) else { return missing(&id) };
            match session.resize(pid, rows, cols).await {
                Ok(()) => SessionReply::Done,
                Err(e) => run_error(&e),
            }
        }
        SessionCall::Jobs { id } => {
            let Some(session) = sessions.get(&id) else { return missing(&id) };
            SessionReply::Execs(
                session
                    .background()
                    .iter()
                    .map(|b| ExecInfo {
                        pid: b.pid(),
                        argv: b.argv().to_vec(),
                        tag: b.tag().map(str::to_owned),
                        cwd: b.cwd().map(str::to_owned),
                        pty: b.has_pty(),
                        running: b.running(),
                    })
                    .collect(),
            )
        }
        SessionCall::Ps { id } => {
            let Some(session) = sessions.get(&id) else { return missing(&id) };
            SessionReply::Processes(
                session
                    .processes()
                    .await
                    .into_iter()
                    .map(|p| SessionProcessInfo { pid: p.pid, cmd: p.cmdline })
                    .collect(),
            )
        }
        SessionCall::Snapshot { id, path } => {
            let Some(session) = sessions.get(&id) else { return missing(&id) };
            if !Path::new(&path).is_absolute() {
                return error("invalid", format!("snapshot file {path}: not an absolute path"));
            }
            match session.snapshot(Path::new(&path)).await {
                Ok(_) => SessionReply::Done,
                Err(e) => run_error(&e),
            }
        }
        SessionCall::Pause { id } => {
            let Some(session) = sessions.get(&id) else { return missing(&id) };
            match session.pause().await {
                Ok(()) => SessionReply::Done,
                Err(e) => run_error(&e),
            }
        }
        SessionCall::Resume { id } => {
            let Some(session) = sessions.get(&id) else { return missing(&id) };
            match session.resume().await {
                Ok(()) => SessionReply::Done,
                Err(e) => run_error(&e),
            }
        }
        SessionCall::Kill { id } => match sessions.kill(&id).await {
            Some(_) => SessionReply::Done,
            None => missing(&id),
        },
        SessionCall::Read { id, path } => {
            let Some(session) = sessions.get(&id) else { return missing(&id) };
            match session.read(&path, MAX_FILE_BYTES).await {
                Ok(bytes) => SessionReply::Data(bytes),
                Err(e) => files_error(&e),
            }
        }
        SessionCall::Write { id, path, data } => {
            let Some(session) = sessions.get(&id) else { return missing(&id) };
            match session.write(&path, &data, MAX_FILE_BYTES).await {
                Ok(_) => SessionReply::Done,
                Err(e) => files_error(&e),
            }
        }
        _ => error("invalid", "unknown call"),
    }
}

/// Sends one call to the owner and returns its reply; an owner that is not there is named
/// with how to start one.
fn call(socket: &SocketArg, call: &SessionCall) -> Result<SessionReply> {
    let path = match &socket.socket {
        Some(s) => s.clone(),
        None => default_socket()?,
    };
    let mut conn = std::os::unix::net::UnixStream::connect(&path)
        .map_err(|e| anyhow!("no session owner at {} ({e}); start one with `stockade serve`", path.display()))?;
    SESSION_CODEC.write_frame(&mut conn, &serde_json::to_vec(call)?)?;
    // An exec's output comes as it is written, a chunk a frame, before its report.
    loop {
        let frame =
            SESSION_CODEC.read_frame(&mut conn)?.ok_or_else(|| anyhow!("the session owner closed the connection"))?;
        match serde_json::from_slice(&frame).context("the session owner's reply")? {
            // On a terminal, the guest's control sequences are shown as text (as `stockade
            // run` shows them); into a pipe or a file the bytes pass unchanged.
            SessionReply::Stdout(bytes) => shown(&mut std::io::stdout().lock(), &bytes)?,
            SessionReply::Stderr(bytes) => shown(&mut std::io::stderr().lock(), &bytes)?,
            reply => return Ok(reply),
        }
    }
}

/// Writes the guest's `bytes` to `w`, neutralised when `w` is a terminal.
fn shown(w: &mut (impl Write + std::io::IsTerminal), bytes: &[u8]) -> std::io::Result<()> {
    if w.is_terminal() {
        let mut out = Vec::with_capacity(bytes.len());
        crate::term::neutralise(bytes, false, &mut out);
        w.write_all(&out)?;
    } else {
        w.write_all(bytes)?;
    }
    w.flush()
}

fn expect_ok(reply: SessionReply) -> Result<SessionReply> {
    match reply {
        SessionReply::Error { message, .. } => bail!("{message}"),
        other => Ok(other),
    }
}

/// An exec's exit status passed through, as `stockade run` passes a run's: its own code, or
/// 128+N for signal N, or stockade's code (and one line) for a deadline or a budget.
fn exit_status(report: stockade_runtime::protocol::Report) -> Result<ExitCode> {
    let budget = stockade_runtime::verify::Budget::new(stockade_runtime::protocol::limits::MAX_DURATION, u64::MAX);
    let contract =
        stockade_runtime::verify::Contract::bytes(budget, stockade_runtime::verify::accept_any).expect_exit(0);
    match stockade_runtime::verify::verify(report, &contract).into_result() {
        Ok(_) => Ok(ExitCode::SUCCESS),
        Err(refusal) => {
            if !matches!(refusal, stockade_runtime::verify::Refusal::NonZeroExit { .. }) {
                writeln!(std::io::stderr(), "stockade: {}", refusal.message())?;
            }
            Ok(ExitCode::from(refusal.exit_code()))
        }
    }
}

fn parse_env(env: &[String]) -> Result<Vec<(String, String)>> {
    env.iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| anyhow!("--env {kv}: not KEY=VALUE"))
        })
        .collect()
}

/// `ROWSxCOLS`, each 1..=u16::MAX.
fn parse_size_rc(s: &str) -> Result<(u16, u16)> {
    let bad = || anyhow!("terminal size {s:?}: not ROWSxCOLS (e.g. 24x80)");
    let (r, c) = s.split_once(['x', 'X']).ok_or_else(bad)?;
    let (r, c): (u16, u16) = (r.parse().map_err(|_| bad())?, c.parse().map_err(|_| bad())?);
    if r == 0 || c == 0 {
        return Err(bad());
    }
    Ok((r, c))
}

/// A signal by name (`TERM`, `SIGTERM`, any case) or number (1-64), as `kill(1)` takes it.
fn parse_signal(s: &str) -> Result<i32> {
    const NAMES: [(&str, i32); 16] = [
        ("HUP", 1),
        ("INT", 2),
        ("QUIT", 3),
        ("ILL", 4),
        ("TRAP", 5),
        ("ABRT", 6),
        ("BUS", 7),
        ("FPE", 8),
        ("KILL", 9),
        ("USR1", 10),
        ("SEGV", 11),
        ("USR2", 12),
        ("PIPE", 13),
        ("ALRM", 14),
        ("TERM", 15),
        ("CONT", 18),
    ];
    if let Ok(n) = s.parse::<i32>() {
        return if (1..=64).contains(&n) { Ok(n) } else { bail!("signal {n}: not a signal number (1-64)") };
    }
    let upper = s.to_ascii_uppercase();
    let name = upper.strip_prefix("SIG").unwrap_or(&upper);
    match name {
        "STOP" => Ok(19),
        "TSTP" => Ok(20),
        "WINCH" => Ok(28),
        _ => NAMES.iter().find(|(n, _)| *n == name).map(|(_, v)| *v).ok_or_else(|| anyhow!("signal {s:?}: unknown")),
    }
}

/// `stockade session ...`.
pub(crate) fn session(cmd: SessionCommand) -> Result<ExitCode> {
    match cmd {
        SessionCommand::Create {
            memory,
            pids,
            workspace,
            idle_timeout,
            max_lifetime,
            from,
            tier,
            image,
            allow_net,
            net_resolve,
            env,
            disk,
            socket,
        } => {
            // Checked here too, so that a typo is this command's one line.
            crate::run::net_grant_from(None, &allow_net, &net_resolve)?;
            let from_snapshot = from
                .map(|f| std::fs::canonicalize(&f).with_context(|| format!("snapshot {}", f.display())))
                .transpose()?
                .map(|p| p.to_string_lossy().into_owned());
            let memory_bytes =
                memory.as_deref().map(|m| parse_size(m).map_err(|e| anyhow!("--memory {m}: {e}"))).transpose()?;
            let workspace = match workspace {
                None => None,
                Some(w) => {
                    let (path, writable) = match w.strip_suffix(":ro") {
                        Some(p) => (p.to_owned(), false),
                        None => (w.strip_suffix(":rw").unwrap_or(&w).to_owned(), true),
                    };
                    let resolved = std::fs::canonicalize(&path).with_context(|| format!("workspace {path}"))?;
                    Some((resolved.to_string_lossy().into_owned(), writable))
                }
            };
            let reply = call(
                &socket,
                &SessionCall::Create {
                    memory_bytes,
                    processes: pids,
                    workspace,
                    idle_timeout_secs: idle_timeout.map(|d| d.as_secs().max(1)),
                    max_lifetime_secs: max_lifetime.map(|d| d.as_secs().max(1)),
                    from_snapshot,
                    docker_image: (tier == "docker").then_some(image),
                    allow_net,
                    net_resolve,
                    env: parse_env(&env)?,
                    disk_bytes: disk
                        .as_deref()
                        .map(|d| parse_size(d).map_err(|e| anyhow!("--disk {d}: {e}")))
                        .transpose()?,
                },
            )?;
            match expect_ok(reply)? {
                SessionReply::Created { id } => println!("{id}"),
                other => bail!("unexpected reply: {other:?}"),
            }
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Exec { id, workdir, env, timeout, detach, interactive, tty, socket, argv }
            if detach || interactive || tty.is_some() =>
        {
            let pty = match tty.as_deref() {
                None => None,
                Some("") => Some(our_terminal_size().unwrap_or((24, 80))),
                Some(size) => Some(parse_size_rc(size)?),
            };
            let timeout = timeout.unwrap_or(Duration::from_secs(24 * 60 * 60));
            let start = SessionCall::Start {
                id: id.clone(),
                argv,
                env: parse_env(&env)?,
                cwd: workdir,
                timeout_ms: Some(timeout.as_millis() as u64),
                pty,
                // In the foreground, our stdin is streamed to it.
                stdin: interactive || !detach,
                tag: None,
            };
            let SessionReply::Started { pid } = expect_ok(call(&socket, &start)?)? else { bail!("unexpected reply") };
            if !detach {
                return foreground(socket, id, pid, pty.is_some(), tty.as_deref() == Some(""));
            }
            println!("{pid}");
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Attach { id, pid, replay, socket } => {
            let SessionReply::Ran(report) = expect_ok(call(&socket, &SessionCall::Attach { id, pid, replay })?)? else {
                bail!("unexpected reply")
            };
            exit_status(*report)
        }
        SessionCommand::Input { id, pid, keep_open, socket } => {
            send_stdin(&socket, &id, pid, !keep_open)?;
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Signal { id, pid, signal, socket } => {
            let signal = parse_signal(&signal)?;
            expect_ok(call(&socket, &SessionCall::Signal { id, pid, signal })?)?;
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Resize { id, pid, size, socket } => {
            let (rows, cols) = parse_size_rc(&size)?;
            expect_ok(call(&socket, &SessionCall::Resize { id, pid, rows, cols })?)?;
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Jobs { id, socket } => {
            let SessionReply::Execs(list) = expect_ok(call(&socket, &SessionCall::Jobs { id })?)? else {
                bail!("unexpected reply")
            };
            println!("{:>7}  {:<7}  CMD", "PID", "STATE");
            for e in list {
                let state = if e.running { "running" } else { "ended" };
                let mut cmd = Vec::new();
                crate::term::neutralise(e.argv.join(" ").as_bytes(), false, &mut cmd);
                println!("{:>7}  {state:<7}  {}", e.pid, String::from_utf8_lossy(&cmd));
            }
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Exec { id, workdir, env, timeout, socket, argv, .. } => {
            let timeout = timeout.unwrap_or(Duration::from_secs(600));
            let mut stdin = Vec::new();
            if !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
                std::io::stdin().take(MAX_FILE_BYTES + 1).read_to_end(&mut stdin)?;
                if stdin.len() as u64 > MAX_FILE_BYTES {
                    bail!("stdin is over {MAX_FILE_BYTES} bytes, the most one exec takes");
                }
            }
            let env = parse_env(&env)?;
            let reply = call(
                &socket,
                &SessionCall::Exec { id, argv, env, cwd: workdir, stdin, timeout_ms: Some(timeout.as_millis() as u64) },
            )?;
            // Its stdout and stderr were shown as they came.
            let SessionReply::Ran(report) = expect_ok(reply)? else { bail!("unexpected reply") };
            exit_status(*report)
        }
        SessionCommand::Ls { socket } => {
            let SessionReply::Sessions(list) = expect_ok(call(&socket, &SessionCall::List)?)? else {
                bail!("unexpected reply")
            };
            println!("{:<32}  {:>8}  {:>8}  STATE", "ID", "AGE", "IDLE");
            for s in list {
                let state = if s.paused { "paused" } else { "running" };
                println!("{:<32}  {:>7}s  {:>7}s  {state}", s.id, s.age_secs, s.idle_secs);
            }
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Kill { id, socket } => {
            expect_ok(call(&socket, &SessionCall::Kill { id })?)?;
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Ps { id, socket } => {
            let SessionReply::Processes(list) = expect_ok(call(&socket, &SessionCall::Ps { id })?)? else {
                bail!("unexpected reply")
            };
            println!("{:>7}  CMD", "PID");
            for p in list {
                let mut cmd = Vec::new();
                crate::term::neutralise(p.cmd.as_bytes(), false, &mut cmd);
                println!("{:>7}  {}", p.pid, String::from_utf8_lossy(&cmd));
            }
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Snapshot { id, file, socket } => {
            let parent = file.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            let dir = std::fs::canonicalize(parent).with_context(|| format!("snapshot file {}", file.display()))?;
            let name = file.file_name().ok_or_else(|| anyhow!("snapshot file {}: no file name", file.display()))?;
            let path = dir.join(name).to_string_lossy().into_owned();
            expect_ok(call(&socket, &SessionCall::Snapshot { id, path })?)?;
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Pause { id, socket } => {
            expect_ok(call(&socket, &SessionCall::Pause { id })?)?;
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Resume { id, socket } => {
            expect_ok(call(&socket, &SessionCall::Resume { id })?)?;
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Cp { src, dst, socket } => {
            let side = |s: &str| {
                s.split_once(':')
                    .filter(|(id, p)| !id.is_empty() && p.starts_with('/'))
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
            };
            match (side(&src), side(&dst)) {
                (None, Some((id, path))) => {
                    let mut data = Vec::new();
                    if src == "-" {
                        std::io::stdin().take(MAX_FILE_BYTES + 1).read_to_end(&mut data)?;
                    } else {
                        std::fs::File::open(&src)
                            .with_context(|| src.clone())?
                            .take(MAX_FILE_BYTES + 1)
                            .read_to_end(&mut data)?;
                    }
                    if data.len() as u64 > MAX_FILE_BYTES {
                        bail!("{src} is over {MAX_FILE_BYTES} bytes, the most one copy moves");
                    }
                    expect_ok(call(&socket, &SessionCall::Write { id, path, data })?)?;
                }
                (Some((id, path)), None) => {
                    let SessionReply::Data(bytes) = expect_ok(call(&socket, &SessionCall::Read { id, path })?)? else {
                        bail!("unexpected reply")
                    };
                    if dst == "-" {
                        std::io::stdout().write_all(&bytes)?;
                    } else {
                        std::fs::write(&dst, bytes).with_context(|| dst.clone())?;
                    }
                }
                _ => bail!("one side of `session cp` is the session's: ID:/absolute/path"),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
