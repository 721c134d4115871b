"""stockade's code-interpreter server, for E2B's code-interpreter SDK.

It runs inside the sandbox, as the sandbox's user and under its confinement (stockade starts
it as a background command of the sandbox; it is never a host process), listens on
127.0.0.1:49999 of the sandbox's own loopback, which `stockade serve` forwards to, and
answers the SDK:

- `POST /execute` {code, context_id, language, env_vars}: the output as NDJSON lines, as it
  comes (stdout, stderr, result, error, number_of_executions).
- `POST /contexts` {language, cwd}, `GET /contexts`, `DELETE /contexts/ID`,
  `POST /contexts/ID/restart`.

Python runs in an IPython kernel (Debian's ipykernel through jupyter_client), so state, the
last expression's value, `display()`, magics and tracebacks are IPython's; a matplotlib
figure comes with its chart data (kernel_charts.py, run in each kernel). bash runs in one
persistent bash process per context (its variables and working directory kept). A client
that goes away (the SDK's timeout) interrupts its execution; the context's state is kept.
Bounds: a request body of 1 MiB, 16 MiB of output per execution (then it is interrupted),
16 contexts, 8 connections served at once (on threads started with the server, so a
sandbox at its process limit is still answered).

Written for stockade; it shares no code with E2B's own server.
"""

import asyncio
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = 49999
HOME = os.environ.get("HOME") or "/home/user"
MAX_BODY = 1 << 20
MAX_OUTPUT = 16 << 20
MAX_CONTEXTS = 16
MAX_REQUESTS = 8
# The kernels debugger (debugpy) warns on stderr about frozen modules without this.
os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
# Debian's matplotlib reads /etc/matplotlibrc, which the sandbox's view has not; its copy
# under /usr is the same file.
for _rc in ("/etc/matplotlibrc", "/usr/share/matplotlib/mpl-data/matplotlibrc"):
    if os.path.isfile(_rc):
        os.environ.setdefault("MATPLOTLIBRC", _rc)
        break
LANGUAGES = {
    "python": "python",
    "python3": "python",
    "bash": "bash",
    "sh": "bash",
    "javascript": "javascript",
    "js": "javascript",
}
MIME = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    # A figure's data, from the formatter kernel_charts.py registers in each Python kernel.
    "application/vnd.stockade.chart+json": "chart",
}
# kernel_charts.py's source (the server's first argument), run once in each Python kernel.
KERNEL_SETUP = sys.argv[1] if len(sys.argv) > 1 else ""


class Refused(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def result_line(data, main):
    out = {"type": "result", "is_main_result": main}
    extra = {}
    for mime, value in data.items():
        key = MIME.get(mime)
        if key:
            out[key] = value
        else:
            extra[mime] = value
    if extra:
        out["extra"] = extra
    return out


class PythonContext:
    language = "python"

    def __init__(self, cwd):
        self.cwd = cwd
        self.start()

    def start(self):
        from jupyter_client.manager import KernelManager

        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(cwd=self.cwd)
        self.kc = self.km.blocking_client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        if KERNEL_SETUP:
            self.quiet(KERNEL_SETUP)

    def stop(self):
        try:
            self.kc.stop_channels()
        finally:
            self.km.shutdown_kernel(now=True)

    def restart(self):
        self.stop()
        self.start()

    def quiet(self, code):
        """Runs `code` without history or output, waiting for it."""
        msg_id = self.kc.execute(code, silent=True, store_history=False, allow_stdin=False)
        self.wait_idle(msg_id, lambda _line: None, lambda: False)

    def wait_idle(self, msg_id, emit, cancelled):
        interrupted = False
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.1)
            except queue.Empty:
                if not self.km.is_alive():
                    emit({"type": "error", "name": "KernelDied",
                          "value": "the kernel died (its memory or process limit, or the code ended it)",
                          "traceback": ""})
                    self.restart()
                    return False
                if not interrupted and cancelled():
                    self.km.interrupt_kernel()
                    interrupted = True
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "status" and content.get("execution_state") == "idle":
                return True
            if not interrupted and cancelled():
                self.km.interrupt_kernel()
                interrupted = True
            if kind == "stream":
                emit({"type": content["name"], "text": content["text"], "timestamp": time.time_ns()})
            elif kind == "execute_result":
                emit(result_line(content.get("data", {}), True))
            elif kind == "display_data":
                emit(result_line(content.get("data", {}), False))
            elif kind == "error":
                emit({"type": "error", "name": content.get("ename", ""), "value": content.get("evalue", ""),
                      "traceback": "\n".join(content.get("traceback", []))})

    def run(self, code, envs, emit, cancelled):
        if envs:
            keys = json.dumps(sorted(envs))
            self.quiet(f"import os as _stk_os\n_stk_saved = {{k: _stk_os.environ.get(k) for k in {keys}}}\n"
                       f"_stk_os.environ.update({json.dumps(envs)})")
        try:
            msg_id = self.kc.execute(code, store_history=True, allow_stdin=False, stop_on_error=True)
            if self.wait_idle(msg_id, emit, cancelled):
                try:
                    reply = self.kc.get_shell_msg(timeout=10)
                    while reply.get("parent_header", {}).get("msg_id") != msg_id:
                        reply = self.kc.get_shell_msg(timeout=10)
                    count = reply["content"].get("execution_count")
                    if count is not None:
                        emit({"type": "number_of_executions", "execution_count": count})
                except queue.Empty:
                    pass
        finally:
            if envs and self.km.is_alive():
                self.quiet("for _k, _v in _stk_saved.items():\n"
                           "    _stk_os.environ.pop(_k, None) if _v is None else _stk_os.environ.__setitem__(_k, _v)")


class ProcessKernel:
    """A kernel that is one process of its own session (bash, Node): stopped with all it
    started, restarted as new."""

    def stop(self):
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.wait()

    def restart(self):
        self.stop()
        self.start()


class BashContext(ProcessKernel):
    language = "bash"

    def __init__(self, cwd):
        self.cwd = cwd
        self.count = 0
        self.start()

    def start(self):
        self.p = subprocess.Popen(["bash", "--noprofile", "--norc"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=self.cwd,
                                  start_new_session=True)

    def interrupt(self):
        """SIGINT to what bash runs (bash itself keeps its state)."""
        try:
            with open(f"/proc/{self.p.pid}/task/{self.p.pid}/children") as f:
                for pid in f.read().split():
                    os.kill(int(pid), signal.SIGINT)
        except OSError:
            pass

    def run(self, code, envs, emit, cancelled):
        marker = "__stockade_end_" + uuid.uuid4().hex
        exports = "".join(f"export {k}={json.dumps(v)}\n" for k, v in (envs or {}).items())
        script = (f"{exports}{code}\n_stk_rc=$?\nprintf '\\n{marker} %d\\n' \"$_stk_rc\"\n"
                  f"printf '\\n{marker}\\n' >&2\n")
        self.p.stdin.write(script.encode())
        self.p.stdin.flush()
        streams = {self.p.stdout.fileno(): "stdout", self.p.stderr.fileno(): "stderr"}
        pending = {fd: b"" for fd in streams}
        done, interrupted = set(), False
        while len(done) < 2:
            if self.p.poll() is not None:
                emit({"type": "error", "name": "KernelDied", "value": "bash ended", "traceback": ""})
                self.start()
                return
            if not interrupted and cancelled():
                self.interrupt()
                interrupted = True
            ready, _, _ = select.select([fd for fd in streams if fd not in done], [], [], 0.1)
            for fd in ready:
                chunk = os.read(fd, 65536)
                pending[fd] += chunk
                text = pending[fd]
                end = text.find(("\n" + marker).encode())
                if end >= 0:
                    body, done_fd = text[:end], True
                else:
                    keep = len(marker) + 16
                    body, done_fd = text[:-keep] if len(text) > keep else b"", False
                    pending[fd] = text[len(body):]
                if body:
                    emit({"type": streams[fd], "text": body.decode(errors="replace"), "timestamp": time.time_ns()})
                if done_fd:
                    done.add(fd)
        self.count += 1
        emit({"type": "number_of_executions", "execution_count": self.count})
        if envs:
            unset = "".join(f"unset {k}\n" for k in envs)
            self.p.stdin.write(unset.encode())
            self.p.stdin.flush()


# The JavaScript kernel: one Node process per context, evaluating each request in one
# persistent `vm` context (its `let`, `const`, `var` and functions kept), console output and
# the last value told as JSON lines on stdout, a SIGINT interrupting the running code.
NODE_DRIVER = r"""
const vm = require("vm"), util = require("util"), fs = require("fs"), readline = require("readline");
const say = (o) => fs.writeSync(1, JSON.stringify(o) + "\n");
const out = (type) => (...a) => say({type, text: util.format(...a) + "\n", timestamp: Date.now() * 1e6});
const sandbox = {console: {log: out("stdout"), info: out("stdout"), debug: out("stdout"),
                           error: out("stderr"), warn: out("stderr")},
                 require, process, Buffer, setTimeout, clearTimeout, setInterval, clearInterval};
sandbox.globalThis = sandbox;
const ctx = vm.createContext(sandbox);
let count = 0;
process.on("SIGINT", () => {});
readline.createInterface({input: process.stdin}).on("line", async (line) => {
  const req = JSON.parse(line);
  try {
    let value = vm.runInContext(req.code, ctx, {breakOnSigint: true, filename: "<cell>"});
    if (value && typeof value.then === "function") value = await value;
    if (value !== undefined) say({type: "result", is_main_result: true, text: util.inspect(value)});
  } catch (e) {
    // An error of the context's own realm is not an `Error` of this one: read its fields.
    const isErr = e !== null && typeof e === "object" && "message" in e;
    say({type: "error", name: isErr ? String(e.name || "Error") : "Error", value: isErr ? String(e.message) : String(e),
         traceback: isErr ? String(e.stack || "") : ""});
  }
  say({type: "number_of_executions", execution_count: ++count});
  say({type: "done"});
});
"""


class JsContext(ProcessKernel):
    language = "javascript"

    def __init__(self, cwd):
        self.cwd = cwd
        self.start()

    def start(self):
        self.p = subprocess.Popen(["node", "-e", NODE_DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, cwd=self.cwd, start_new_session=True)

    def run(self, code, envs, emit, cancelled):
        setup = "".join(f"process.env[{json.dumps(k)}] = {json.dumps(v)};\n" for k, v in (envs or {}).items())
        self.p.stdin.write((json.dumps({"code": setup + code}) + "\n").encode())
        self.p.stdin.flush()
        fd, pending, interrupted = self.p.stdout.fileno(), b"", False
        while True:
            if self.p.poll() is not None:
                emit({"type": "error", "name": "KernelDied", "value": "node ended", "traceback": ""})
                self.start()
                return
            if not interrupted and cancelled():
                os.kill(self.p.pid, signal.SIGINT)
                interrupted = True
            ready, _, _ = select.select([fd], [], [], 0.1)
            if not ready:
                continue
            pending += os.read(fd, 65536)
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                line = json.loads(raw)
                if line.get("type") == "done":
                    if envs:
                        unset = "".join(f"delete process.env[{json.dumps(k)}];\n" for k in envs)
                        self.p.stdin.write((json.dumps({"code": unset + "undefined"}) + "\n").encode())
                        self.p.stdin.flush()
                        self.drain()
                    return
                emit(line)

    def drain(self):
        """Reads one quiet request's lines, to its end."""
        pending = b""
        while b'"done"' not in pending:
            pending += os.read(self.p.stdout.fileno(), 65536)


class Contexts:
    def __init__(self):
        self.lock = threading.Lock()
        self.all = {}
        self.defaults = {}

    def make(self, language, cwd):
        kind = LANGUAGES.get((language or "python").lower())
        if kind is None:
            raise Refused(400, f"language {language!r} is not offered by this sandbox (python, bash and javascript are)")
        cwd = cwd or HOME
        if not os.path.isdir(cwd):
            raise Refused(400, f"cwd {cwd!r} is not a directory")
        with self.lock:
            if len(self.all) >= MAX_CONTEXTS:
                raise Refused(429, f"at most {MAX_CONTEXTS} contexts; remove one first")
        ctx = {"python": PythonContext, "bash": BashContext, "javascript": JsContext}[kind](cwd)
        ctx.id = str(uuid.uuid4())
        ctx.busy = threading.Lock()
        with self.lock:
            self.all[ctx.id] = ctx
        return ctx

    def default(self, language):
        kind = LANGUAGES.get((language or "python").lower())
        if kind is None:
            raise Refused(400, f"language {language!r} is not offered by this sandbox (python, bash and javascript are)")
        with self.lock:
            ctx = self.defaults.get(kind)
            if ctx is not None and ctx.id in self.all:
                return ctx
        ctx = self.make(kind, HOME)
        with self.lock:
            self.defaults[kind] = ctx
        return ctx

    def get(self, context_id):
        with self.lock:
            ctx = self.all.get(context_id)
        if ctx is None:
            raise Refused(404, f"context {context_id!r} not found")
        return ctx

    def remove(self, context_id):
        ctx = self.get(context_id)
        with self.lock:
            self.all.pop(context_id, None)
        ctx.stop()


CONTEXTS = Contexts()


def describe(ctx):
    return {"id": ctx.id, "language": ctx.language, "cwd": ctx.cwd}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, value=None):
        body = b"" if value is None else json.dumps(value).encode()
        self.send_response(status)
        if value is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            raise Refused(413, f"a request body of at most {MAX_BODY} bytes")
        raw = self.rfile.read(n) if n else b"{}"
        try:
            value = json.loads(raw or b"{}")
        except ValueError as e:
            raise Refused(400, f"the body is not JSON: {e}") from None
        if not isinstance(value, dict):
            raise Refused(400, "the body is not a JSON object")
        return value

    def handle_one(self, method):
        try:
            self.route(method)
        except Refused as e:
            self.answer(e.status, {"error": str(e)})
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as e:  # noqa: BLE001 - a failure is said, in one line, not a closed connection
            try:
                self.answer(500, {"error": f"{type(e).__name__}: {e}"})
            except OSError:
                pass

    def route(self, method):
        path = self.path.split("?", 1)[0].rstrip("/")
        parts = path.strip("/").split("/")
        if method == "GET" and path == "/health":
            return self.answer(200, {"status": "ok"})
        if method == "POST" and path == "/execute":
            return self.execute(self.body())
        if parts[0] == "contexts":
            if method == "GET" and len(parts) == 1:
                with CONTEXTS.lock:
                    return self.answer(200, [describe(c) for c in CONTEXTS.all.values()])
            if method == "POST" and len(parts) == 1:
                b = self.body()
                return self.answer(200, describe(CONTEXTS.make(b.get("language"), b.get("cwd"))))
            if method == "DELETE" and len(parts) == 2:
                CONTEXTS.remove(parts[1])
                return self.answer(204)
            if method == "POST" and len(parts) == 3 and parts[2] == "restart":
                ctx = CONTEXTS.get(parts[1])
                with ctx.busy:
                    ctx.restart()
                return self.answer(204)
        raise Refused(404, f"{method} {path}: no such route")

    def gone(self):
        """Whether the client has closed its connection (a read says so, without waiting)."""
        try:
            ready, _, _ = select.select([self.connection], [], [], 0)
            return bool(ready) and self.connection.recv(1, socket_peek()) == b""
        except OSError:
            return True

    def execute(self, b):
        code = b.get("code")
        if not isinstance(code, str):
            raise Refused(400, "code: a string")
        envs = b.get("env_vars") or {}
        if not isinstance(envs, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in envs.items()):
            raise Refused(400, "env_vars: an object of strings")
        if b.get("context_id") and b.get("language"):
            raise Refused(400, "context_id or language, not both")
        ctx = CONTEXTS.get(b["context_id"]) if b.get("context_id") else CONTEXTS.default(b.get("language"))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        state = {"sent": 0, "broken": False, "over": False}

        def emit(line):
            if state["broken"] or state["over"]:
                return
            data = (json.dumps(line) + "\n").encode()
            if state["sent"] + len(data) > MAX_OUTPUT:
                state["over"] = True
                left = MAX_OUTPUT - state["sent"]
                notice = {"type": "stderr", "timestamp": time.time_ns(),
                          "text": f"[stockade: the output passed {MAX_OUTPUT} bytes; the rest is cut and the execution interrupted]\n"}
                lines = [notice]
                if line.get("type") in ("stdout", "stderr") and left > 4096:
                    lines.insert(0, {**line, "text": line["text"][: left - 4096]})
                data = "".join(json.dumps(x) + "\n" for x in lines).encode()
            state["sent"] += len(data)
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            except OSError:
                state["broken"] = True

        with ctx.busy:
            ctx.run(code, envs, emit, lambda: state["broken"] or state["over"] or self.gone())
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            pass

    def do_GET(self):
        self.handle_one("GET")

    def do_POST(self):
        self.handle_one("POST")

    def do_DELETE(self):
        self.handle_one("DELETE")


def socket_peek():
    import socket

    return socket.MSG_PEEK | socket.MSG_DONTWAIT


class PooledServer(ThreadingHTTPServer):
    """Serves each connection on one of MAX_REQUESTS threads started before the first
    request, so a sandbox at its process limit (a fork bomb's) is still answered: no
    request needs a new thread. A connection waits for a free thread."""

    def __init__(self, address, handler):
        super().__init__(address, handler)
        self.pending = queue.Queue(maxsize=MAX_REQUESTS)
        for _ in range(MAX_REQUESTS):
            threading.Thread(target=self.work, daemon=True).start()

    def process_request(self, request, client_address):
        try:
            self.pending.put_nowait((request, client_address))
        except queue.Full:
            self.shutdown_request(request)

    def work(self):
        while True:
            request, client_address = self.pending.get()
            # Each connection gets an event loop of its own, as a thread of its own would:
            # jupyter_client's blocking calls run on the thread's loop, and one a previous
            # connection left closed would fail the next.
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                self.finish_request(request, client_address)
            except Exception:  # noqa: BLE001 - one connection's failure is its own
                pass
            finally:
                self.shutdown_request(request)
                asyncio.set_event_loop(None)
                loop.close()


def main():
    CONTEXTS.default("python")
    server = PooledServer(("127.0.0.1", PORT), Handler)
    print(f"stockade code interpreter on 127.0.0.1:{PORT}", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
