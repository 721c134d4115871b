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
use stockade_runtime::protocol::session::{MAX_FILE_BYTES, SESSION_CODEC, SessionCall, SessionReply};
use stockade_runtime::session::Sessions;

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
    /// End every session id with `-SUFFIX` (a DNS label, such as the pod's name), so that a
    /// router sends each request to the owner that holds its session (docs/deploy.md).
    #[arg(long, value_parser = id_suffix)]
    id_suffix: Option<String>,
}

/// `--id-suffix`, checked before anything starts.
fn id_suffix(s: &str) -> Result<String, String> {
    if stockade_runtime::session::is_id_suffix(s) {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "not a DNS label of lowercase letters, digits and inner '-', at most {} characters",
            stockade_runtime::session::MAX_ID_SUFFIX
        ))
    }
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
        if let Some(suffix) = &args.id_suffix {
            extra.extend(["--id-suffix".into(), suffix.into()]);
        }
        return detach(&socket, args.max_sessions, &extra);
    }
    let _lifeline = lifeline();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let served = rt.block_on(async move {
        let tier = crate::tiers::process_tier()?;
        let mut sessions = Sessions::new(tier, &state, args.max_sessions)?;
        if let Some(suffix) = &args.id_suffix {
            sessions = sessions.id_suffix(suffix).map_err(|e| anyhow!("--id-suffix: {e}"))?;
        }
        let sessions = Arc::new(sessions);
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
        let listener = stockade_serve::owner::bind_ambient(&socket)?;
        let _ = writeln!(std::io::stderr(), "stockade serve: listening on {}", socket.display());
        // A guest makes these at will, on the owner's async workers: never a blocking write.
        let shown: stockade_runtime::egress::OnRefused = Arc::new(|c| {
            crate::term::log_line(format!("stockade: {}", stockade_runtime::egress::denied_line(c)));
        });
        let owner = Arc::new(stockade_serve::owner::Owner::new(Arc::clone(&sessions)).on_refused(shown));
        let _owner = AbortOnDrop(tokio::spawn(owner.serve(listener)));
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
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
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

/// `serve --detach`: this binary again as the owner, in a session of its own with its stdio
/// away from the caller's terminal, then its pid once its socket answers.
fn detach(socket: &Path, max_sessions: usize, extra: &[std::ffi::OsString]) -> Result<ExitCode> {
    use std::os::unix::process::CommandExt;
    stockade_serve::owner::private_dir_ambient(socket)?;
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
        cmd @ SessionCommand::Create { .. } => create(cmd),
        cmd @ SessionCommand::Exec { .. } if started(&cmd) => exec_started(cmd),
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
        cmd @ SessionCommand::Exec { .. } => exec_whole(cmd),
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
        SessionCommand::Cp { src, dst, socket } => cp(&src, &dst, &socket),
    }
}

/// An exec that is started and followed (`-d`, `-i`, `-t`) rather than run whole.
fn started(cmd: &SessionCommand) -> bool {
    matches!(cmd, SessionCommand::Exec { detach, interactive, tty, .. } if *detach || *interactive || tty.is_some())
}

/// `session create`: the call from the flags (paths resolved here), and the new id.
fn create(cmd: SessionCommand) -> Result<ExitCode> {
    let SessionCommand::Create {
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
    } = cmd
    else {
        bail!("not a create")
    };
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
            disk_bytes: disk.as_deref().map(|d| parse_size(d).map_err(|e| anyhow!("--disk {d}: {e}"))).transpose()?,
        },
    )?;
    match expect_ok(reply)? {
        SessionReply::Created { id } => println!("{id}"),
        other => bail!("unexpected reply: {other:?}"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `session exec -d`, `-i` or `-t`: started in the background, then (without `-d`) followed
/// in the foreground with our stdin streamed to it.
fn exec_started(cmd: SessionCommand) -> Result<ExitCode> {
    let SessionCommand::Exec { id, workdir, env, timeout, detach, interactive, tty, socket, argv } = cmd else {
        bail!("not an exec")
    };
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

/// `session exec`: our stdin (not a terminal) sent whole, the output shown as it comes.
fn exec_whole(cmd: SessionCommand) -> Result<ExitCode> {
    let SessionCommand::Exec { id, workdir, env, timeout, socket, argv, .. } = cmd else { bail!("not an exec") };
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

/// `session cp`: one side is the session's (`ID:/absolute/path`), the other a host file or `-`.
fn cp(src: &str, dst: &str, socket: &SocketArg) -> Result<ExitCode> {
    let side = |s: &str| {
        s.split_once(':')
            .filter(|(id, p)| !id.is_empty() && p.starts_with('/'))
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
    };
    match (side(src), side(dst)) {
        (None, Some((id, path))) => {
            let mut data = Vec::new();
            if src == "-" {
                std::io::stdin().take(MAX_FILE_BYTES + 1).read_to_end(&mut data)?;
            } else {
                std::fs::File::open(src)
                    .with_context(|| src.to_owned())?
                    .take(MAX_FILE_BYTES + 1)
                    .read_to_end(&mut data)?;
            }
            if data.len() as u64 > MAX_FILE_BYTES {
                bail!("{src} is over {MAX_FILE_BYTES} bytes, the most one copy moves");
            }
            expect_ok(call(socket, &SessionCall::Write { id, path, data })?)?;
        }
        (Some((id, path)), None) => {
            let SessionReply::Data(bytes) = expect_ok(call(socket, &SessionCall::Read { id, path })?)? else {
                bail!("unexpected reply")
            };
            if dst == "-" {
                std::io::stdout().write_all(&bytes)?;
            } else {
                std::fs::write(dst, bytes).with_context(|| dst.to_owned())?;
            }
        }
        _ => bail!("one side of `session cp` is the session's: ID:/absolute/path"),
    }
    Ok(ExitCode::SUCCESS)
}
