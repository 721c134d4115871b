"""Starts `stockade` as a child subreaper (PR_SET_CHILD_SUBREAPER), so that any process of
stockade's that outlives it is reparented here rather than to the machine's PID 1, and
prints, after each case, the processes left as this script's children: alive or zombie.

Usage: subreaper.py STOCKADE. Prints one JSON object: {case: [leftover, ...]}. Every wait
is for an event (a process's exit, a line on a pipe), never a sleep."""
import ctypes
import json
import os
import signal
import subprocess
import sys

PR_SET_CHILD_SUBREAPER = 36
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
    sys.exit(f"prctl: {os.strerror(ctypes.get_errno())}")
stockade = sys.argv[1]
me = os.getpid()


def children():
    """This process's children, from /proc: (pid, name, state)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        if int(ppid) == me:
            found.append({"pid": int(entry), "name": name, "state": state})
    return found


def run(*args, **kw):
    return subprocess.Popen([stockade, "run", *args], stdin=subprocess.DEVNULL, **kw)


def left(case, procs):
    # Every stockade started here is reaped first: then whatever it left has been
    # reparented here already (the kernel does it before the exit can be waited for).
    codes = [p.wait() for p in procs]
    report[case] = {"codes": codes, "left": children()}
    # Reap what was left, so the next case starts clean.
    for c in report[case]["left"]:
        try:
            os.kill(c["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(c["pid"], 0)
        except ChildProcessError:
            pass


report = {}
left("verified", [run("--", "/bin/true", stdout=subprocess.DEVNULL)])
left("refused", [run("--", "sh", "-c", "exit 3", stdout=subprocess.DEVNULL)])
left("timeout", [run("--timeout", "1s", "--", "sleep", "30", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)])
# Stopped by SIGTERM once the guest has said (on its live stderr) that it runs.
p = run("--", "sh", "-c", "echo up >&2; exec sleep 30", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
line = p.stderr.readline()
p.send_signal(signal.SIGTERM)
p.stderr.read()
report["up"] = line.decode()
left("sigterm", [p])
# A burst: 48 runs, 8 at a time.
burst = []
for _ in range(6):
    batch = [run("--", "/bin/true", stdout=subprocess.DEVNULL) for _ in range(8)]
    burst.extend(batch)
    for b in batch:
        b.wait()
left("burst", burst)
print(json.dumps(report))
