//! G1's differential test for paths: a path rule decides on the path the upstream serves,
//! whoever spells the URL and whichever client sends it.
//!
//! The upstream is a real server, Python's `http.server`, serving a directory on
//! 127.0.0.20 with `pub/` inside and a canary file outside it. The proxy allows `/pub` only.
//! A corpus of tricky paths (encoded dot segments, encoded slashes and backslashes, double
//! encodings, path parameters, case, non-ASCII) goes through the proxy three ways: curl with
//! `--path-as-is` (the bytes as written), curl as it normalises by default, and Python's
//! `http.client` (what the SDKs send). The verdict is the host's: the server logs the file
//! each request resolves to, and every one of them must lie under `pub/`, and the canary's
//! text must come back to no client. Positive controls (a `/pub` file by every client) keep
//! the test from passing on a proxy that refuses everything.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use stockade_egress::{NetGrant, Resolve};

use crate::proxy::{proxy, pub_only};

/// Paths two readers have been known to read differently, and plain ones.
const CORPUS: &[&str] = &[
    "/pub/a.txt",
    "/pub/%61.txt",
    "/pub/./a.txt",
    "/pub/x/../a.txt",
    "/pub/../secret.txt",
    "/pub/%2e%2e/secret.txt",
    "/pub/%2E%2E/secret.txt",
    "/pub/.%2e/secret.txt",
    "/pub/%2e./secret.txt",
    "/pub/..%2fsecret.txt",
    "/pub%2f..%2fsecret.txt",
    "/pub/%2e%2e%2fsecret.txt",
    "/pub/%252e%252e/secret.txt",
    "/pub/..;/secret.txt",
    "/pub/..%3b/secret.txt",
    "/pub/..\\secret.txt",
    "/pub/%5c..%5csecret.txt",
    "/pub/..%5csecret.txt",
    "/pub//../secret.txt",
    "/pub/x/../../secret.txt",
    "/pub/x/%2e%2e/%2e%2e/secret.txt",
    "/pub/.../secret.txt",
    "/pub/%00/../secret.txt",
    "/pub/a.txt%00",
    "/PUB/../secret.txt",
    "/%70ub/../secret.txt",
    "/pubx/../secret.txt",
    "/secret.txt",
    "/./secret.txt",
    "//secret.txt",
    "/pub/a.txt?/../../secret.txt",
    "/pub/%c0%ae%c0%ae/secret.txt",
    "/pub/%u002e%u002e/secret.txt",
    "/pub/\u{ff0e}\u{ff0e}/secret.txt",
];

/// The text of the file outside `/pub`.
const CANARY: &str = "CANARY-path-differential-7f3a";

/// The server: Python's `http.server` over `root`, each request's resolved file (relative
/// to `root`) appended to `log`; prints its port.
const SERVER: &str = r#"
import functools, http.server, os, sys
root, log = sys.argv[1], open(sys.argv[2], "a")
class H(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a): pass
    def send_head(self):
        log.write(os.path.relpath(self.translate_path(self.path), root) + "\n"); log.flush()
        return super().send_head()
s = http.server.ThreadingHTTPServer(("127.0.0.20", 0), functools.partial(H, directory=root))
print(s.server_address[1], flush=True)
s.serve_forever()
"#;

/// The client: Python's `http.client` through the proxy, each target as written; prints
/// each response's body (or the error) as one JSON line.
const CLIENT: &str = r#"
import http.client, json, sys
proxy, host = int(sys.argv[1]), sys.argv[2]
for target in json.load(sys.stdin):
    try:
        c = http.client.HTTPConnection("127.0.0.1", proxy, timeout=30)
        c.request("GET", "http://" + host + target, headers={"Host": host})
        print(json.dumps(c.getresponse().read().decode("utf-8", "replace")), flush=True)
    except Exception as e:
        print(json.dumps("error: " + repr(e)), flush=True)
"#;

/// A server process this test started, ended by its PID when the test ends.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn curl(proxy: u16, url: &str, as_is: bool) -> String {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "--max-time", "30", "--noproxy", "", "-x", &format!("http://127.0.0.1:{proxy}")]);
    if as_is {
        cmd.arg("--path-as-is");
    }
    let out = cmd.arg(url).output().expect("curl runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn python_client(proxy: u16, host: &str) -> Vec<String> {
    let mut child = Command::new("python3")
        .args(["-c", CLIENT, &proxy.to_string(), host])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let targets = serde_json::to_vec(CORPUS).unwrap();
    child.stdin.take().unwrap().write_all(&targets).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g1_a_path_rule_and_the_server_read_every_spelling_alike_for_curl_and_python() {
    let dir = tempfile_dir();
    std::fs::create_dir_all(dir.join("root/pub")).unwrap();
    std::fs::write(dir.join("root/pub/a.txt"), "public-a").unwrap();
    std::fs::write(dir.join("root/secret.txt"), CANARY).unwrap();
    let log = dir.join("served.log");
    let mut child = Command::new("python3")
        .args(["-c", SERVER])
        .arg(dir.join("root"))
        .arg(&log)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    let _server = Server(child);
    let port: u16 = first.trim().parse().expect("the server's port");
    let e = NetGrant::new(pub_only(port))
        .resolve(Resolve::new().entry(&format!("api.test:{port}:127.0.0.20")).unwrap())
        .start();
    let p = proxy(e.clone()).await.port();
    let host = format!("api.test:{port}");

    let answers = tokio::task::spawn_blocking(move || {
        let mut answers = Vec::new();
        for path in CORPUS {
            let url = format!("http://{host}{path}");
            answers.push((format!("curl --path-as-is {path}"), curl(p, &url, true)));
            answers.push((format!("curl {path}"), curl(p, &url, false)));
        }
        for (path, body) in CORPUS.iter().zip(python_client(p, &host)) {
            answers.push((format!("python {path}"), body));
        }
        answers
    })
    .await
    .unwrap();

    // The canary comes back to no client.
    let leaked: Vec<&String> = answers.iter().filter(|(_, body)| body.contains(CANARY)).map(|(who, _)| who).collect();
    assert!(leaked.is_empty(), "the file outside /pub was served to: {leaked:?}");
    // Each client got the /pub file, and its spellings that stay inside /pub.
    for who in ["curl --path-as-is /pub/a.txt", "curl /pub/a.txt", "python /pub/a.txt", "python /pub/%61.txt"] {
        let body = answers.iter().find(|(w, _)| w == who).map(|(_, b)| b.as_str());
        assert_eq!(body, Some("public-a"), "{who}");
    }
    // The server's own reading of every request that reached it lies under pub/.
    let served = std::fs::read_to_string(&log).unwrap();
    let outside: Vec<&str> = served.lines().filter(|f| *f != "pub" && !f.starts_with("pub/")).collect();
    assert!(outside.is_empty(), "the server resolved requests outside pub/: {outside:?}");
    assert!(served.lines().count() >= 4, "{served}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh directory under the system's temporary directory.
fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("stockade-path-diff-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
