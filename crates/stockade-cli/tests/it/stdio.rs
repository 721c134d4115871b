//! G5: `stockade run` keeps the shell's habits (bwrap, `docker run`, `timeout(1)`): the
//! CLI's stdin is streamed to the program, its stderr is shown as it runs, and its own exit
//! code comes back. Each check drives the real binary with a real program inside.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::cli::{check, ready};

/// `stockade run ARGS` with `input` piped to its stdin (written from a thread, so a large
/// input streams while the output is read).
fn piped(args: &[&str], input: Vec<u8>) -> (i32, Vec<u8>, String) {
    let _runs = crate::cli::shared();
    let mut child = Command::new(env!("CARGO_BIN_EXE_stockade"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let o = child.wait_with_output().unwrap();
    writer.join().unwrap();
    (o.status.code().unwrap_or(-1), o.stdout, String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn g5_piped_stdin_reaches_the_program_streamed_and_intact() {
    if !ready() {
        return;
    }
    let (code, out, err) = piped(&["run", "--", "cat"], b"hi\n".to_vec());
    assert_eq!((code, out.as_slice()), (0, &b"hi\n"[..]), "{err}");
    // 100 MiB: more than the job's 16 MiB of stdin bytes and than the 1 MiB output budget
    // would hold, so it can only arrive streamed. The program hashes what it read.
    let big: Vec<u8> = (0..100u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let want = {
        let mut sha = Command::new("sha256sum").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        sha.stdin.take().unwrap().write_all(&big).unwrap();
        String::from_utf8(sha.wait_with_output().unwrap().stdout).unwrap()
    };
    let (code, out, err) = piped(&["run", "--timeout", "60s", "--", "sha256sum"], big);
    assert_eq!(code, 0, "{err}");
    assert_eq!(String::from_utf8(out).unwrap(), want);
    // tar c | stockade run -- tar t, as the issue reported it.
    let dir = std::env::temp_dir().join(format!("stockade-cli-tar-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/a.txt"), "a").unwrap();
    let tar = Command::new("tar").arg("c").arg("-C").arg(&dir).arg("sub").output().unwrap().stdout;
    let (code, out, err) = piped(&["run", "--", "tar", "t"], tar);
    assert_eq!((code, String::from_utf8(out).unwrap().as_str()), (0, "sub/\nsub/a.txt\n"), "{err}");
    // --stdin FILE streams a file; --no-stdin gives /dev/null even with a pipe.
    std::fs::write(dir.join("in.txt"), "from a file\n").unwrap();
    let file = dir.join("in.txt");
    let (code, out, err) = piped(&["run", "--stdin", file.to_str().unwrap(), "--", "cat"], b"ignored".to_vec());
    assert_eq!((code, out.as_slice()), (0, &b"from a file\n"[..]), "{err}");
    let (code, out, _) = piped(&["run", "--no-stdin", "--", "cat"], b"dropped".to_vec());
    assert_eq!((code, out.as_slice()), (0, &b""[..]));
    // A missing --stdin file is a clear error naming it, before anything runs.
    let (code, _, err) = check(&["run", "--stdin", "/nonexistent/in.txt", "--", "cat"]);
    assert_eq!(code, 125);
    assert!(err.contains("--stdin /nonexistent/in.txt: No such file or directory"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn g5_a_program_that_ignores_stdin_ends_even_if_the_pipe_stays_open() {
    if !ready() {
        return;
    }
    // `sleep 30 | stockade run -- true`: the pipe is never closed while stockade runs.
    let mut feeder = Command::new("sleep").arg("30").stdout(Stdio::piped()).spawn().unwrap();
    let t0 = std::time::Instant::now();
    let _runs = crate::cli::shared();
    let o = Command::new(env!("CARGO_BIN_EXE_stockade"))
        .args(["run", "--", "true"])
        .stdin(feeder.stdout.take().unwrap())
        .output()
        .unwrap();
    let took = t0.elapsed();
    let _ = feeder.kill();
    let _ = feeder.wait();
    assert_eq!(o.status.code(), Some(0));
    assert!(took < std::time::Duration::from_secs(10), "stockade waited for its stdin: {took:?}");
}

#[test]
fn g5_stderr_is_shown_as_it_runs_and_the_refusal_is_one_line() {
    if !ready() {
        return;
    }
    let (code, out, err) = check(&["run", "--", "sh", "-c", "echo 'it'\\''s an error' >&2; echo out"]);
    assert_eq!((code, out.as_str(), err.as_str()), (0, "out\n", "it's an error\n"));
    // A refused run: the program's stderr (real newlines, no escapes), then one line.
    let (code, out, err) = check(&["run", "--", "sh", "-c", "printf 'line 1\\nline 2\\n' >&2; exit 3"]);
    assert_eq!((code, out.as_str()), (3, ""));
    assert_eq!(err, "line 1\nline 2\nstockade: refused: exited with code 3\n");
    // --quiet hides it; the refusal line then quotes its start.
    let (code, _, err) = check(&["run", "--quiet", "--", "sh", "-c", "echo oops >&2; exit 3"]);
    assert_eq!(code, 3);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("stockade: refused: exited with code 3; stderr: oops"), "{err}");
    // Into a pipe the bytes pass unchanged, control sequences included.
    let (_, _, err) = check(&["run", "--", "sh", "-c", "printf '\\033[2J\\033]52;c;aGk=\\007' >&2"]);
    assert_eq!(err, "\x1b[2J\x1b]52;c;aGk=\x07");
}

#[test]
fn g5_stderr_arrives_while_the_program_still_runs() {
    if !ready() {
        return;
    }
    let _runs = crate::cli::shared();
    let mut child = Command::new(env!("CARGO_BIN_EXE_stockade"))
        .args(["run", "--timeout", "20s", "--", "sh", "-c", "echo early >&2; sleep 3; echo late >&2"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let t0 = std::time::Instant::now();
    let mut first = [0u8; 6];
    std::io::Read::read_exact(&mut stderr, &mut first).unwrap();
    let took = t0.elapsed();
    assert_eq!(&first, b"early\n");
    assert!(took < std::time::Duration::from_secs(2), "stderr was held until the end: {took:?}");
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

/// hold-the-line, finding 10: the verified stdout reached a terminal raw, so a program could
/// write the user's clipboard (OSC 52) or the window title once its run was verified. On a
/// terminal (util-linux `script` makes one) they are shown as text, as stderr's are; `--raw`
/// passes them; into a pipe they pass unchanged (above).
#[test]
fn g5_control_sequences_in_the_verified_stdout_are_shown_as_text_on_a_terminal() {
    if !ready() {
        return;
    }
    let _runs = crate::cli::shared();
    let bin = env!("CARGO_BIN_EXE_stockade");
    let on_terminal = |flags: &str| {
        let inner = format!("{bin} run {flags} -- printf 'ok\\033]52;c;aGk=\\007\\033]0;title\\007'");
        let o = Command::new("script").args(["-qc", &inner, "/dev/null"]).stdin(Stdio::null()).output();
        match o {
            Ok(o) => Some(o.stdout),
            Err(e) => {
                assert!(std::env::var_os("STOCKADE_REQUIRE_ALL").is_none(), "no `script`: {e}");
                eprintln!("SKIPPED: no `script` ({e})");
                None
            }
        }
    };
    let Some(shown) = on_terminal("") else { return };
    let shown = String::from_utf8_lossy(&shown).into_owned();
    assert!(shown.contains("ok^[]52;c;aGk=^G^[]0;title^G"), "{shown:?}");
    assert!(!shown.contains('\x1b'), "an escape reached the terminal: {shown:?}");
    let raw = on_terminal("--raw").unwrap_or_default();
    assert!(raw.windows(5).any(|w| w == b"\x1b]52;"), "{:?}", String::from_utf8_lossy(&raw));
}
