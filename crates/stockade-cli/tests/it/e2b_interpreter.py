"""E2B's code-interpreter SDK (PyPI `e2b-code-interpreter`, pinned) against `stockade serve`'s
`code-interpreter-v1` template: our own checks, one JSON line each, judged (and checked from
the host where it can be) by tests/it/e2b.rs.
"""

import json
import os
import sys

from e2b_code_interpreter import Sandbox


def say(check, **seen):
    print(json.dumps({"check": check, **seen}), flush=True)


def kind(e):
    return type(e).__name__


def host_kernels():
    """From the host: every IPython kernel process, its uid and whether its pid namespace is
    the host's."""
    host_ns = os.stat("/proc/self/ns/pid").st_ino
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"ipykernel_launcher" not in f.read():
                    continue
            with open(f"/proc/{pid}/status") as f:
                uid = next(int(l.split()[1]) for l in f if l.startswith("Uid:"))
            out.append({"uid": uid, "host_ns": os.stat(f"/proc/{pid}/ns/pid").st_ino == host_ns})
        except (OSError, StopIteration):
            continue
    return out


def main():
    sbx = Sandbox.create(timeout=300)
    say("created", id=sbx.sandbox_id)

    # State across calls, the last expression's value, and the execution count.
    first = sbx.run_code("x = 41\nprint('set')")
    second = sbx.run_code("x + 1")
    say("state", first_stdout=first.logs.stdout, value=second.text, count=second.execution_count)

    # Callbacks, in the order the output came.
    seen = []
    sbx.run_code(
        "import sys\nprint('out one')\nprint('err one', file=sys.stderr)\ndisplay('shown')\n'last'",
        on_stdout=lambda m: seen.append(["stdout", m.line]),
        on_stderr=lambda m: seen.append(["stderr", m.line]),
        on_result=lambda r: seen.append(["result", r.text]),
    )
    say("callbacks", seen=seen)

    # An error: its name, value and traceback, and on_error.
    errors = []
    e = sbx.run_code("def f():\n    return 1 / 0\nf()", on_error=errors.append)
    import re

    plain = re.sub(r"\x1b\[[0-9;]*m", "", e.error.traceback)
    say("error", name=e.error.name, value=e.error.value, has_frame="return 1 / 0" in plain, called=len(errors))

    # Charts: a matplotlib figure comes back as a PNG and as data (a line chart; a figure of
    # two axes as a superchart of a bar chart and a box plot).
    c = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 1, 9], label='v')\nplt.title('t')\n"
                     "plt.xlabel('time (s)')\nplt.show()")
    shown = next((r for r in c.results if r.png), None)
    png = shown.png if shown else None
    line = shown.chart if shown else None
    two = sbx.run_code("import matplotlib.pyplot as plt\nfig, (a, b) = plt.subplots(1, 2)\na.bar(['x', 'y'], [3, 5])\n"
                       "b.boxplot([[1, 2, 3, 4, 50]], labels=['p'])\nfig.suptitle('two')\nplt.show()")
    sup = next((r.chart for r in two.results if r.chart), None)
    say("chart", png_magic=png[:8] if png else None, png_len=len(png or ""), error=str(c.error)[:200] if c.error else None,
        line=[type(line).__name__, line.title, line.x_label, line.x_unit, [[e.label, e.points] for e in line.elements]]
        if line else None,
        superchart=[type(sup).__name__, sup.title, [[type(p).__name__, p.to_dict()["elements"]] for p in sup.elements]]
        if sup else None)

    # Per-call environment variables, gone after the call.
    env_in = sbx.run_code("import os\nos.environ.get('STK_VAR')", envs={"STK_VAR": "per-call"})
    env_after = sbx.run_code("import os\nos.environ.get('STK_VAR')")
    say("envs", during=env_in.text, after=env_after.text)

    # A timeout interrupts the kernel and keeps its state.
    try:
        sbx.run_code("import time\nwhile True:\n    time.sleep(0.05)", timeout=3)
        timed = None
    except Exception as err:  # noqa: BLE001
        timed = kind(err)
    kept = sbx.run_code("x")
    say("timeout", raised=timed, kept=kept.text)

    # Contexts: bash keeps its state; contexts are apart; listed; removed.
    bash = sbx.create_code_context(language="bash")
    sbx.run_code("COUNT=7; cd /tmp", context=bash)
    b2 = sbx.run_code("echo $COUNT $(pwd)", context=bash)
    py2 = sbx.create_code_context(language="python")
    apart = sbx.run_code("'x' in globals()", context=py2)
    listed = sorted(c.language for c in sbx.list_code_contexts())
    sbx.remove_code_context(py2)
    after_remove = sorted(c.language for c in sbx.list_code_contexts())
    try:
        sbx.run_code("1", language="cobol")  # not offered
        unknown = None
    except Exception as err:  # noqa: BLE001
        unknown = kind(err)
    say("contexts", bash=b2.logs.stdout, apart=apart.text, listed=listed, after_remove=after_remove, unknown=unknown)

    # JavaScript (Node, one persistent `vm` context): state kept, console output, errors,
    # per-call envs, and an interrupt that keeps the state.
    js1 = sbx.run_code("let a = 40; const inc = (x) => x + 1; console.log('js', [1, 2]); a", language="javascript")
    js2 = sbx.run_code("inc(a + 1)", language="javascript")
    js_env = sbx.run_code("process.env.STK_JS", language="javascript", envs={"STK_JS": "set"})
    js_env_after = sbx.run_code("process.env.STK_JS", language="javascript")
    js_err = sbx.run_code("null.x", language="javascript")
    try:
        sbx.run_code("while (true) {}", language="javascript", timeout=3)
        js_timed = None
    except Exception as err:  # noqa: BLE001
        js_timed = kind(err)
    js_kept = sbx.run_code("a", language="javascript")
    say("javascript", first=[js1.logs.stdout, js1.text], second=js2.text, env=[js_env.text, js_env_after.text],
        error=[js_err.error.name, js_err.error.value] if js_err.error else None, timed=js_timed, kept=js_kept.text)

    # Restarting a context clears it, and is told as done.
    sbx.run_code("y = 5", context=bash)
    default = [c for c in sbx.list_code_contexts() if c.language == "python"][0]
    sbx.restart_code_context(default)
    gone = sbx.run_code("'x' in globals()")
    say("restart", cleared=gone.text)

    # A kernel that dies is reported, and a new one answers the next call (its state gone).
    sbx.run_code("z = 1")
    died = sbx.run_code("import os\nos._exit(1)", timeout=60)
    next_call = sbx.run_code("'z' in globals()", timeout=60)
    say("kernel_died", error=died.error.name if died.error else None, next=next_call.text)

    # Hostile code: a flood of output is cut at the server's bound; a fork bomb stays inside
    # the sandbox's process limit, and the kernel (or its replacement) answers after.
    flood = sbx.run_code("import sys\nfor _ in range(400):\n    sys.stdout.write('y' * 100000 + '\\n')", timeout=120)
    flood_bytes = sum(len(s) for s in flood.logs.stdout)
    cut = any("stockade: the output passed" in s for s in flood.logs.stderr)
    bomb = sbx.run_code("import os\nfor _ in range(100000):\n    try:\n        os.fork()\n    except OSError:\n        break",
                        timeout=60)
    after_bomb = sbx.run_code("21 * 2", timeout=60)
    say("hostile", flood_bytes=flood_bytes, cut=cut, bomb_error=bomb.error.name if bomb.error else None,
        after_bomb=after_bomb.text)

    say("kernels_from_host", kernels=host_kernels())
    sbx.kill()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)
