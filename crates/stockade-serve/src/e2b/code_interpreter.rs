//! The `code-interpreter-v1` template's server (E2B's code-interpreter SDK): our own Python
//! server (`code_interpreter.py`), started at create as a background command of the sandbox
//! itself, so it and every kernel it starts run as the sandbox's user, under its
//! confinement, on its own loopback; the SDK reaches it on port 49999 through `ports`. The
//! create answers once the server accepts connections, or fails, saying why.

use stockade_runtime::session::{Chunk, StartOptions, exec_job};

#[allow(clippy::wildcard_imports, reason = "the server's own items")]
use super::*;

/// The server, run by the sandbox's `python3`.
const SERVER: &str = include_str!("code_interpreter.py");

/// What each of its Python kernels runs first: chart data for matplotlib figures (the server's
/// first argument).
const KERNEL_CHARTS: &str = include_str!("kernel_charts.py");

/// Its port on the sandbox's loopback (the SDK's `JUPYTER_PORT`).
pub(crate) const PORT: u16 = 49999;

/// How long the server has to start (its first Python kernel with it).
const START_WITHIN: Duration = Duration::from_secs(60);

/// Starts the server in `session` and waits until it accepts connections.
pub(crate) async fn start(session: &Arc<Session>) -> Result<(), String> {
    let argv = ["python3".to_owned(), "-c".to_owned(), SERVER.to_owned(), KERNEL_CHARTS.to_owned()];
    let job = exec_job(&argv, Vec::new(), Vec::new(), Some(stockade_runtime::protocol::limits::MAX_DURATION))
        .map_err(|e| e.to_string())?;
    let opts = StartOptions { pty: None, stdin: false, tag: Some("code-interpreter".into()) };
    let server = session.start(job, Some(HOME.to_owned()), opts).await.map_err(|e| e.to_string())?;
    let until = tokio::time::Instant::now() + START_WITHIN;
    loop {
        if session.connect(PORT).await.is_ok() {
            return Ok(());
        }
        if !server.running() {
            let (said, _) = server.attach();
            let stderr: Vec<u8> = said
                .into_iter()
                .filter_map(|c| match c {
                    Chunk::Stderr(b) => Some(b),
                    Chunk::Stdout(_) => None,
                })
                .flatten()
                .collect();
            let tail = String::from_utf8_lossy(&stderr[stderr.len().saturating_sub(400)..]).into_owned();
            return Err(format!("it ended: {}", tail.trim()));
        }
        if tokio::time::Instant::now() >= until {
            return Err(format!("it did not listen within {START_WITHIN:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
