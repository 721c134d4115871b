"""A PEP 503 package index over HTTPS on 127.0.0.9:443, standing in for pypi.org and
files.pythonhosted.org (the test points both names here with --net-resolve): it serves one
real wheel, `requests` 99.0.0 (no dependencies), and logs every request line.

argv: DIR (where it writes cert.pem, key.pem, the wheel and requests.log). Prints "ready" once
it listens.
"""

import base64
import hashlib
import http.server
import io
import os
import ssl
import subprocess
import sys
import zipfile

d = sys.argv[1]
subprocess.run(
    ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
     "-subj", "/CN=pypi.org",
     "-addext", "subjectAltName=DNS:pypi.org,DNS:files.pythonhosted.org",
     "-keyout", f"{d}/key.pem", "-out", f"{d}/cert.pem"],
    check=True, stderr=subprocess.DEVNULL)

NAME = "requests-99.0.0-py3-none-any.whl"
files = {
    "requests/__init__.py": b"__version__ = '99.0.0'\nSTANDIN = 'stockade test index'\n",
    "requests-99.0.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: requests\nVersion: 99.0.0\n",
    "requests-99.0.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: stockade-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
for path, data in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append(f"{path},sha256={digest},{len(data)}")
record.append("requests-99.0.0.dist-info/RECORD,,")
files["requests-99.0.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
buf = io.BytesIO()
with zipfile.ZipFile(buf, "w") as z:
    for path, data in files.items():
        z.writestr(path, data)
wheel = buf.getvalue()
sha = hashlib.sha256(wheel).hexdigest()
log = open(f"{d}/requests.log", "a", buffering=1)


class Index(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        host = self.headers.get("Host", "")
        log.write(f"{host} {self.command} {self.path}\n")
        if host == "pypi.org" and self.path.rstrip("/") == "/simple/requests":
            body = (f'<!DOCTYPE html><html><body><a href="https://files.pythonhosted.org/packages/{NAME}'
                    f'#sha256={sha}">{NAME}</a></body></html>').encode()
            kind = "text/html"
        elif host == "files.pythonhosted.org" and self.path == f"/packages/{NAME}":
            body, kind = wheel, "application/octet-stream"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.9", 443), Index)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(f"{d}/cert.pem", f"{d}/key.pem")
server.socket = ctx.wrap_socket(server.socket, server_side=True)
print("ready", flush=True)
server.serve_forever()
