//! Every command in README.md runs as written: each `sh` block, continuation lines joined,
//! with `cargo run --release -p stockade-cli --` standing for the binary under test, run by
//! `sh -eu` from the repository's root. A block this file does not know fails the test, so a
//! new README example comes with its check; a block that needs what this run lacks is
//! skipped by name.

use std::path::{Path, PathBuf};

use crate::cli::{ready, tier_ready};

/// What the README writes for the binary.
const CARGO_RUN: &str = "cargo run --release -p stockade-cli --";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// The README's `sh` blocks, each a script with its continuation lines joined.
fn blocks() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```sh") => current = Some(String::new()),
            (Some(_), "```") => blocks.push(current.take().unwrap().replace("\\\n", "")),
            (Some(b), l) => {
                b.push_str(l);
                b.push('\n');
            }
            (None, _) => {}
        }
    }
    assert!(current.is_none(), "an unclosed code block in README.md");
    blocks
}

/// Runs `block` as written, with the binary under test, `TMPDIR` in `scratch` (so
/// `mktemp -d` leaves nothing behind) and `env`: (exit code, stdout, stderr).
fn run(block: &str, scratch: &Path, env: &[(&str, &str)]) -> (i32, String, String) {
    let _runs = crate::cli::shared();
    let bin = env!("CARGO_BIN_EXE_stockade");
    assert!(!bin.contains('\''), "{bin}");
    let script = block.replace(CARGO_RUN, &format!("'{bin}'"));
    let out = std::process::Command::new("sh")
        .args(["-euc", &script])
        .current_dir(root())
        .env("TMPDIR", scratch)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("stockade-cli-readme-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn wasm_js_ready() -> bool {
    tier_ready("wasm", |v| {
        let guest = v["checks"].as_array().unwrap().iter().find(|c| c["name"] == "wasm js guest").unwrap();
        guest["ok"].as_bool().unwrap() && v["wasm_tier"].as_bool().unwrap()
    })
}

#[test]
fn readme_commands_run_as_written() {
    let dir = scratch("blocks");
    let blocks = blocks();
    assert!(blocks.len() >= 5, "README.md lost its examples: {blocks:?}");
    for block in &blocks {
        let first = block.lines().next().unwrap_or_default();
        if block.contains("python3 -c 'print(6*7)'") {
            if ready() {
                assert_eq!(run(block, &dir, &[]), (0, "42\n".into(), String::new()), "{block}");
            }
        } else if block.contains("git init -q /workspace") {
            if ready() {
                let (code, out, err) = run(block, &dir, &[]);
                assert_eq!((code, out.as_str()), (0, ".\n..\n.git\n"), "{block}{err}");
                // git's own config and hooks were planted where they were absent: swept, and said.
                assert!(err.starts_with("stockade: removed from the workspace what the program created"), "{err}");
                let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
                assert_eq!(left.len(), 1, "one mktemp -d workspace: {left:?}");
            }
        } else if block.starts_with("cd examples/grants\n") {
            if wasm_js_ready() {
                assert_eq!(run(block, &dir, &[]), (0, "4\n".into(), String::new()), "{block}");
            }
        } else if block.contains("run --allow-net pypi.org") {
            // As written, but pypi.org and files.pythonhosted.org are the local stand-in:
            // tests send nothing past loopback.
            if ready()
                && let Some(index) = crate::net::PypiStandin::start()
            {
                let block =
                    block.replace(" run --allow-net pypi.org", &format!(" run {} --allow-net pypi.org", index.flags()));
                let (code, out, err) = run(&block, &dir, &[]);
                assert_eq!(code, 0, "{block}{out}{err}{}", index.requests());
                assert!(out.contains("Successfully installed requests-99.0.0"), "{out}");
            }
        } else if block.contains(" serve --detach --listen 127.0.0.1:3000") {
            if ready()
                && let Some(python) = crate::cli::installed("STOCKADE_E2B_PYTHON")
            {
                // As written, but for a free port and the pinned SDK's interpreter.
                let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
                let block = block
                    .replace("127.0.0.1:3000", &format!("127.0.0.1:{port}"))
                    .replace(" python3 examples/", &format!(" {python} examples/"));
                let state = dir.join("state-e2b");
                let (code, out, err) = run(&block, &dir, &[("STOCKADE_STATE_DIR", state.to_str().unwrap())]);
                assert_eq!((code, out.as_str()), (0, "{\"total\": 42}\n"), "{block}{err}");
            }
        } else if block.contains(" serve --detach") {
            if ready() {
                // The owner's socket and state in the scratch directory, not the user's.
                let state = dir.join("state");
                let (code, out, err) = run(block, &dir, &[("STOCKADE_STATE_DIR", state.to_str().unwrap())]);
                // The file, then the same file served by the session's own background server.
                assert_eq!((code, out.as_str()), (0, "kept\nkept\n"), "{block}{err}");
                // The block ends its owner: no socket answers, and no session is left.
                let socket = state.join("serve/serve.sock");
                let start = std::time::Instant::now();
                while socket.exists() {
                    assert!(start.elapsed() < std::time::Duration::from_secs(10), "the owner did not end");
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
        } else if block.contains(" agent --config examples/steward/agent.toml") {
            eprintln!("SKIPPED README block {first:?}: it needs a model; readme_real_model_steward_block runs it");
        } else if block.starts_with("cargo xtask image serve") {
            // The deploy step (`cargo xtask deploy`) runs this image with the settings
            // docs/deploy.md shows (an xtask test checks that page): here, the README's line
            // must ask for the same capabilities and security options.
            let deploy = std::fs::read_to_string(root().join("docs/deploy.md")).unwrap();
            let opts = |text: &str| -> std::collections::BTreeSet<String> {
                let words: Vec<&str> = text.split_whitespace().filter(|w| *w != "\\").collect();
                words
                    .windows(2)
                    .filter(|w| {
                        w[0] == "--cap-add" || w[0] == "--cap-drop" || w[0] == "--security-opt" || w[0] == "--cgroupns"
                    })
                    .map(|w| format!("{} {}", w[0], w[1]))
                    .collect()
            };
            let shown = deploy.split("```sh").nth(2).and_then(|b| b.split("```").next()).unwrap_or_default();
            assert!(shown.contains("docker run -d --name stockade-serve"), "docs/deploy.md's run line moved");
            assert_eq!(opts(block), opts(shown), "README.md's docker run line and docs/deploy.md's differ");
            eprintln!(
                "SKIPPED running README block {first:?}: cargo xtask deploy runs the image (its settings checked above)"
            );
        } else if block.trim() == "cargo xtask ci" {
            eprintln!("SKIPPED README block {first:?}: it is this CI run itself");
        } else if block.trim()
            == "cargo test -p stockade-protocol -p stockade-policy -p stockade-verify -p stockade-egress"
        {
            eprintln!("SKIPPED README block {first:?}: a subset of this CI run");
        } else {
            panic!("README.md has a command this test does not check; add its expected output here:\n{block}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The README's agent command, as written but for the base URL, against the real local model
/// (`cargo xtask llm --test` runs the `real_model` tests): it ends with an answer or a typed
/// error, and no raven flies to anyone but the allies, whatever the model proposed. The ravens'
/// log is the host's (`STEWARD_RAVENS`, outside the checkout).
#[test]
fn readme_real_model_steward_block() {
    let Some((url, _model)) = crate::cli::llm_url() else { return };
    if !ready() {
        return;
    }
    let block = blocks().into_iter().find(|b| b.contains(" agent --config examples/steward/agent.toml")).unwrap();
    let written = "--base-url http://127.0.0.1:8080/v1";
    assert!(block.contains(written), "{block}");
    let block = block.replace(written, &format!("--base-url {url}"));
    let dir = scratch("steward");
    let ravens = dir.join("ravens.jsonl");
    let (code, out, err) = run(&block, &dir, &[("STEWARD_RAVENS", ravens.to_str().unwrap())]);
    eprintln!("README steward: exit {code}\nstdout: {out}\nstderr: {err}");
    assert!([0, 3, 4].contains(&code), "an answer (0) or a typed error (3, 4), not {code}: {err}");
    assert!(code != 0 || !out.trim().is_empty(), "an answer with no text");
    for line in std::fs::read_to_string(&ravens).unwrap_or_default().lines() {
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(r["to"] == "riverhold" || r["to"] == "highcliff", "a forbidden raven flew: {r}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
