"""A git server over HTTPS on 127.0.0.10 (`git http-backend`, the smart protocol, behind
Python's http.server with a test certificate for git.test): serves one repository,
`repo.git`, with one commit, and logs every request line.

argv: DIR (where it writes cert.pem, key.pem, the repository and requests.log). Prints the
port once it listens.
"""

import http.server
import os
import ssl
import subprocess
import sys

d = sys.argv[1]
subprocess.run(
    ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
     "-subj", "/CN=git.test", "-addext", "subjectAltName=DNS:git.test",
     "-keyout", f"{d}/key.pem", "-out", f"{d}/cert.pem"],
    check=True, stderr=subprocess.DEVNULL)
work = f"{d}/work"
env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
           GIT_COMMITTER_EMAIL="t@t", GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_SYSTEM="/dev/null")
subprocess.run(["git", "init", "-q", "-b", "main", work], check=True, env=env)
with open(f"{work}/README", "w") as f:
    f.write("cloned through the proxy\n")
subprocess.run(["git", "-C", work, "add", "README"], check=True, env=env)
subprocess.run(["git", "-C", work, "commit", "-q", "-m", "the one commit"], check=True, env=env)
subprocess.run(["git", "clone", "-q", "--bare", work, f"{d}/repo.git"], check=True, env=env)
log = open(f"{d}/requests.log", "a", buffering=1)


class Backend(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def run(self):
        path, _, query = self.path.partition("?")
        log.write(f"{self.headers.get('Host', '')} {self.command} {path}\n")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        cgi = dict(env, GIT_PROJECT_ROOT=d, GIT_HTTP_EXPORT_ALL="1", PATH_INFO=path,
                   QUERY_STRING=query, REQUEST_METHOD=self.command,
                   CONTENT_TYPE=self.headers.get("Content-Type", ""),
                   CONTENT_LENGTH=str(len(body)), REMOTE_ADDR="127.0.0.1")
        if self.headers.get("Content-Encoding"):
            cgi["HTTP_CONTENT_ENCODING"] = self.headers["Content-Encoding"]
        if self.headers.get("Git-Protocol"):
            cgi["GIT_PROTOCOL"] = self.headers["Git-Protocol"]
        out = subprocess.run(["git", "http-backend"], input=body, capture_output=True, env=cgi).stdout
        head, _, payload = out.partition(b"\r\n\r\n")
        status = 200
        headers = []
        for line in head.split(b"\r\n"):
            k, _, v = line.decode().partition(":")
            if k.lower() == "status":
                status = int(v.strip().split()[0])
            elif k:
                headers.append((k, v.strip()))
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = run
    do_POST = run

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.10", 0), Backend)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(f"{d}/cert.pem", f"{d}/key.pem")
server.socket = ctx.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
