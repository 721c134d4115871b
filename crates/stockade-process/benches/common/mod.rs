//! What the process tier's benches share.

/// Spawns `program` with `args` from this program (`tokio::process`, stdin closed, stdout and
/// stderr read to their end), as a baseline spawn; panics unless it exits 0.
pub(crate) async fn spawn(program: &str, args: &[&str]) {
    let status = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .output()
        .await
        .unwrap()
        .status;
    assert!(status.success(), "{program}: {status}");
}
