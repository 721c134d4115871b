"""The official E2B SDKs (PyPI `e2b`, `e2b-code-interpreter`, pinned) against `stockade serve`
in its container (`cargo xtask deploy`), from the host.

Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY; MARK (a unique `sleep` argument the
caller looks for in the host's /proc); PORTS ("PA,PB": the caller's two listeners, which the
`net` template's grant names a.test and b.test). Prints one JSON line per check,
{"check": NAME, ...what it saw}; the caller judges them, and judges from the host what it can
(the listeners' counts, the sandbox's processes).

For `cargo xtask bench deploy`: `bench N` prints each of N `commands.run("true")` round trips
(ms), `create N` each of N `Sandbox.create()` + `kill()`, and `hold N` makes N sandboxes,
prints "ready", and kills them when its standard input closes.
"""

import json
import os
import sys
import time

from e2b import Sandbox
from e2b_code_interpreter import Sandbox as Interpreter


def say(check, **seen):
    print(json.dumps({"check": check, **seen}), flush=True)


def checks():
    mark = os.environ["MARK"]
    sbx = Sandbox.create("base", timeout=300)
    r = sbx.commands.run("echo hello; whoami; grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status")
    say("run", exit_code=r.exit_code, stdout=r.stdout)
    r = sbx.commands.run("python3 -c 'print(6*7)'; git --version >/dev/null && echo git")
    say("programs", stdout=r.stdout)
    sbx.files.write("/home/user/notes.txt", "kept in the container\n")
    say("files", read=sbx.files.read("/home/user/notes.txt"), listed=[e.name for e in sbx.files.list("/home/user")])
    sbx.commands.run(f"sleep {mark}", background=True)
    say("background", id=sbx.sandbox_id)
    sbx.kill()
    say("killed", running=sbx.is_running())

    pa, pb = os.environ["PORTS"].split(",")
    net = Sandbox.create("net", timeout=300, network={"allow_out": ["a.test"], "deny_out": ["0.0.0.0/0"]})
    cmd = "curl -s -o /dev/null -w '%{{http_code}}' --max-time 20 http://{}/"
    say("egress", codes=[net.commands.run(cmd.format(h), timeout=60).stdout for h in (f"a.test:{pa}", f"b.test:{pb}")])
    net.kill()

    ci = Interpreter.create(timeout=300)
    ex = ci.run_code("import sys; 6 * 7")
    say("interpreter", text=ex.text, error=str(ex.error) if ex.error else None)
    ci.kill()


def timed(n, call):
    took = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        took.append((time.perf_counter() - start) * 1000)
    return took


def bench(n):
    sbx = Sandbox.create("base", timeout=600)
    sbx.commands.run("true")
    say("run_true", ms=timed(n, lambda: sbx.commands.run("true")))
    sbx.kill()


def create(n):
    say("create_kill", ms=timed(n, lambda: Sandbox.create("base", timeout=60).kill()))


def hold(n):
    held = [Sandbox.create("base", timeout=600) for _ in range(n)]
    for s in held:
        s.commands.run("true")
    say("held", n=len(held))
    sys.stdin.read()
    for s in held:
        s.kill()


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "checks"
    if mode == "checks":
        checks()
    else:
        {"bench": bench, "create": create, "hold": hold}[mode](int(sys.argv[2]))
    sys.stdout.flush()
    os._exit(0)
