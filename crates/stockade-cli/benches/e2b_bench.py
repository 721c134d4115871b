"""`cargo xtask bench serve`: the official E2B SDK against `stockade serve --listen`, beside
`docker exec` and `docker run --rm` of the same work, in one run.

argv: RUNS IMAGE. E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY name the server. Prints one
JSON object of samples in microseconds: run_true, create_kill, docker_exec, docker_run.
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

print(json.dumps({"run_true": run_true, "create_kill": create_kill_us, "docker_exec": docker_exec, "docker_run": docker_run}))
