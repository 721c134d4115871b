"""`cargo xtask bench serve`: the official E2B SDK against `stockade serve --listen`, beside
`docker exec` and `docker run --rm` of the same work, in one run.

argv: RUNS IMAGE. E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY name the server. Prints one
JSON object of samples in microseconds: run_true, create_kill, docker_exec, docker_run, and
run_code (the code-interpreter SDK's `run_code("1+1")`) beside bare_kernel (the same
execute on a local IPython kernel through jupyter_client, no sandbox, no HTTP).
"""

import json
import subprocess
import sys
import time

from e2b import Sandbox

runs, image = int(sys.argv[1]), sys.argv[2]


def timed(f, n):
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


sbx = Sandbox.create(timeout=600)
for _ in range(20):
    sbx.commands.run("true")
# The SDK runs every command as `/bin/bash -l -c CMD`: the login shell is part of the work.
run_true = timed(lambda: sbx.commands.run("true"), runs)
sbx.kill()


def create_kill():
    Sandbox.create(timeout=60).kill()


create_kill()
create_kill_us = timed(create_kill, max(runs // 5, 20))

docker_exec, docker_run = [], []
try:
    cid = subprocess.run(
        ["docker", "run", "-d", "--rm", "--network=none", image, "sleep", "600"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    try:
        docker_exec = timed(
            lambda: subprocess.run(["docker", "exec", cid, "/bin/sh", "-c", "true"], check=True), max(runs // 5, 20)
        )
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
    docker_run = timed(
        lambda: subprocess.run(["docker", "run", "--rm", "--network=none", image, "true"], check=True),
        max(runs // 10, 10),
    )
except (OSError, subprocess.CalledProcessError) as e:
    print(f"docker baselines skipped: {e}", file=sys.stderr)

BARE_KERNEL = """
import json, sys, time
from jupyter_client.manager import start_new_kernel
km, kc = start_new_kernel(kernel_name="python3")
def once():
    msg_id = kc.execute("1+1")
    while True:
        m = kc.get_iopub_msg(timeout=30)
        if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
            return
for _ in range(20):
    once()
out = []
for _ in range(int(sys.argv[1])):
    t0 = time.perf_counter()
    once()
    out.append((time.perf_counter() - t0) * 1e6)
kc.stop_channels()
km.shutdown_kernel(now=True)
print(json.dumps(out))
"""

run_code, bare_kernel = [], []
try:
    from e2b_code_interpreter import Sandbox as Interpreter

    ci = Interpreter.create(timeout=600)
    for _ in range(20):
        ci.run_code("1+1")
    run_code = timed(lambda: ci.run_code("1+1"), runs)
    ci.kill()
    bare = subprocess.run(["/usr/bin/python3", "-c", BARE_KERNEL, str(runs)], check=True, capture_output=True, text=True)
    bare_kernel = json.loads(bare.stdout)
except (ImportError, OSError, subprocess.CalledProcessError) as e:
    print(f"code-interpreter rows skipped: {e}", file=sys.stderr)

print(json.dumps({"run_true": run_true, "create_kill": create_kill_us, "docker_exec": docker_exec, "docker_run": docker_run,
                  "run_code": run_code, "bare_kernel": bare_kernel}))
