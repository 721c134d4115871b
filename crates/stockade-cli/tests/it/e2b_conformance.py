"""E2B features the SDK's own suite exercises, through the official SDK (PyPI `e2b`, pinned),
against `stockade serve --listen`: our own checks, one JSON line each, judged (and, where
the host can tell, checked from the host) by tests/it/e2b.rs.

Run with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set; argv[1] names the part.
"""

import gzip
import io
import json
import os
import sys

from e2b import Sandbox, SandboxException, TimeoutException


def say(check, **seen):
    print(json.dumps({"check": check, **seen}), flush=True)


def kind(e):
    return type(e).__name__


def files_checks():
    sbx = Sandbox.create(timeout=120)
    say("created", id=sbx.sandbox_id)

    # envd removes what is there, and nothing is nothing to remove.
    try:
        sbx.files.remove("never-made.txt")
        say("remove_missing", raised=None)
    except Exception as e:  # noqa: BLE001 - the class is what is judged
        say("remove_missing", raised=kind(e), message=str(e)[:200])

    # gzip on the way in: a streamed octet-stream upload, and one read back plain.
    text = "gzip through stockade. " * 5000
    sbx.files.write("gz.txt", io.BytesIO(text.encode()), use_octet_stream=True, gzip=True)
    say("gzip_streamed", same=sbx.files.read("gz.txt") == text)
    sbx.files.write("gz-small.txt", "small and gzipped", gzip=True)
    say("gzip_small", read=sbx.files.read("gz-small.txt", gzip=True))

    # A decompression bomb: 64 MiB of zeros in about 64 KiB, over the server's upload cap.
    bomb = gzip.compress(b"\0" * (64 << 20), compresslevel=9)
    try:
        import httpx  # the SDK's own HTTP client

        url = f"{os.environ['E2B_SANDBOX_URL']}/files"
        r = httpx.post(
            url,
            params={"path": "/home/user/bomb.bin"},
            content=bomb,
            headers={
                "Content-Type": "application/octet-stream",
                "Content-Encoding": "gzip",
                "E2b-Sandbox-Id": sbx.sandbox_id,
                "X-Access-Token": sbx._envd_access_token or "",
            },
            timeout=60,
        )
        say("gzip_bomb", status=r.status_code, body=r.text[:200], exists=sbx.files.exists("bomb.bin"), compressed=len(bomb))
    except Exception as e:  # noqa: BLE001
        say("gzip_bomb", raised=kind(e), message=str(e)[:300])

    # Metadata: kept as user.e2b.* attributes, returned on write, stat, list and rename, and
    # cleared by an overwrite without it.
    meta = {"author": "stockade", "purpose": "conformance"}
    info = sbx.files.write("meta.txt", "with metadata", metadata=meta)
    stat = sbx.files.get_info("meta.txt")
    listed = [e.metadata for e in sbx.files.list(".") if e.name == "meta.txt"]
    say("metadata", written=info.metadata, stat=stat.metadata, listed=listed[0] if listed else None,
        path=info.path)
    moved = sbx.files.rename("meta.txt", "meta-moved.txt")
    say("metadata_renamed", metadata=moved.metadata)
    sbx.files.write("meta-moved.txt", "no metadata now")
    say("metadata_cleared", metadata=sbx.files.get_info("meta-moved.txt").metadata)
    # One the guest set itself on a file of its own.
    sbx.files.write("guest-set.txt", "x")
    sbx.commands.run("python3 -c \"import os; os.setxattr('/home/user/guest-set.txt', 'user.e2b.by', b'guest')\"")
    say("metadata_guest", metadata=sbx.files.get_info("guest-set.txt").metadata)
    bad = None
    try:
        sbx.files.write("bad-meta.txt", "x", metadata={"good": "bad\nvalue"})
    except Exception as e:  # noqa: BLE001
        bad = kind(e)
    say("metadata_invalid", raised=bad, exists=sbx.files.exists("bad-meta.txt"))

    # A symlink's info is its target's (envd's): followed within the home, through a chain;
    # one that dangles or leaves the home stays a link, its target as it reads.
    sbx.files.make_dir("links/sub")
    sbx.files.write("links/sub/t.txt", "target")
    sbx.commands.run("cd /home/user/links && ln -s sub/t.txt rel && ln -s rel chain && ln -s gone dangling"
                     " && ln -s /etc/passwd outside && ln -s ../links/sub updir")
    info = {n: sbx.files.get_info(f"links/{n}") for n in ["rel", "chain", "dangling", "outside", "updir"]}
    say("symlinks", **{n: [i.type.value if i.type else None, i.symlink_target] for n, i in info.items()})

    # Signed URLs: the access token signs them (SHA-256, as the SDK computes it), a request
    # carries nothing else, an expired or altered one is refused.
    import urllib.error
    import urllib.request

    def fetch(url, data=None):
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=30) as r:
                return r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    sbx.files.write("signed.txt", "signed content")
    say("signed", plain=fetch(sbx.download_url("signed.txt", "user")),
        expiring=fetch(sbx.download_url("signed.txt", "user", 120)),
        expired=fetch(sbx.download_url("signed.txt", "user", use_signature_expiration=-120)),
        altered=fetch(sbx.download_url("signed.txt", "user").replace("signature=v1_", "signature=v1_A")),
        other_path=fetch(sbx.download_url("signed.txt", "user").replace("path=signed.txt", "path=.bashrc")))
    boundary = "stockadeboundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"up.txt\"\r\n\r\n"
            f"uploaded by url\r\n--{boundary}--\r\n").encode()
    up = urllib.request.Request(sbx.upload_url("up.txt", "user"), data=body,
                                headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    try:
        with urllib.request.urlopen(up, timeout=30) as r:
            status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
    say("signed_upload", status=status, read=sbx.files.read("up.txt"))

    # A kill returns once the process is gone (reaped: `kill -0` no longer finds it), even
    # one that takes a while to die (it has 256 MiB to give back).
    import time

    from e2b import CommandExitException

    big = sbx.commands.run("python3 -c \"b = b'x' * (256 << 20); open('/home/user/held', 'w').close(); "
                           "import time; time.sleep(600)\"", background=True)
    for _ in range(1200):
        if sbx.files.exists("held"):
            break
        time.sleep(0.05)
    killed = sbx.commands.kill(big.pid)
    try:
        sbx.commands.run(f"kill -0 {big.pid}")
        alive = True
    except CommandExitException:
        alive = False
    say("kill_reaps", held=sbx.files.exists("held"), killed=killed, alive_after=alive)

    # A command running when its sandbox is killed: the SDK tells the sandbox is gone.
    cmd = sbx.commands.run("sleep 600", background=True)
    sbx.kill()
    try:
        cmd.wait()
        say("killed_under_command", raised=None)
    except TimeoutException as e:
        say("killed_under_command", raised=kind(e), message=str(e)[:300])
    except SandboxException as e:
        say("killed_under_command", raised=kind(e), message=str(e)[:300])


def metrics_checks():
    import time

    sbx = Sandbox.create(timeout=120)
    # 64 MiB held, 8 MiB on the home's disk, and a CPU kept busy.
    sbx.commands.run("python3 -c 'import time; b = bytearray(64 << 20); b[::4096] = b\"x\" * (len(b) // 4096); time.sleep(600)'",
                     background=True)
    sbx.commands.run("head -c 8388608 /dev/urandom > /home/user/disk.bin")
    sbx.commands.run("sh -c 'while :; do :; done'", background=True)
    seen = None
    for _ in range(120):
        ms = sbx.get_metrics()
        if ms and ms[-1].mem_used >= 64 << 20 and ms[-1].cpu_used_pct > 5 and len(ms) >= 2:
            seen = ms[-1]
            break
        time.sleep(0.5)
    last = seen or (sbx.get_metrics() or [None])[-1]
    say("metrics", found=seen is not None,
        mem_used=getattr(last, "mem_used", None), mem_total=getattr(last, "mem_total", None),
        cpu_pct=getattr(last, "cpu_used_pct", None), cpu_count=getattr(last, "cpu_count", None),
        disk_used=getattr(last, "disk_used", None), disk_total=getattr(last, "disk_total", None))
    import datetime

    past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=2)
    say("metrics_past", count=len(sbx.get_metrics(start=past, end=past + datetime.timedelta(minutes=30))))
    sbx.kill()


def host_freezer(mark):
    """From the host: the freezer state of the process running `sleep MARK`."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:2] != [b"sleep", mark.encode()]:
                    continue
            with open(f"/proc/{pid}/cgroup") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if "freezer" in controllers.split(","):
                with open(f"/sys/fs/cgroup/freezer{path}/freezer.state") as f:
                    return f.read().strip()
            if controllers == "":
                with open(f"/sys/fs/cgroup{path}/cgroup.freeze") as f:
                    return "FROZEN" if f.read().strip() == "1" else "THAWED"
    return None


def wait_state(sbx, want):
    import time

    for _ in range(240):
        if sbx.get_info().state.value == want:
            return True
        time.sleep(0.25)
    return False


def lifecycle_checks(mark):
    # Auto-pause at the timeout: frozen (judged from the host's cgroup), not running, its
    # envd silent, until a connect resumes it.
    sbx = Sandbox.create(timeout=3, lifecycle={"on_timeout": "pause", "auto_resume": False})
    sbx.commands.run(f"sleep {mark}", background=True)
    paused = wait_state(sbx, "paused")
    frozen = host_freezer(mark)
    running = sbx.is_running()
    try:
        sbx.files.read(".bashrc")
        read = None
    except Exception as e:  # noqa: BLE001
        read = kind(e)
    sbx.connect()
    say("auto_pause", paused=paused, frozen=frozen, running=running, read=read,
        state_after=sbx.get_info().state.value, running_after=sbx.is_running(), thawed=host_freezer(mark))
    # A connect never shortens a running sandbox's time.
    sbx.set_timeout(300)
    before = Sandbox.get_info(sbx.sandbox_id).end_at
    Sandbox.connect(sbx.sandbox_id, timeout=10)
    say("connect_keeps_time", same=Sandbox.get_info(sbx.sandbox_id).end_at == before)
    sbx.kill()
    # Auto-resume: an envd call wakes it.
    sbx = Sandbox.create(timeout=3, lifecycle={"on_timeout": "pause", "auto_resume": True})
    sbx.files.write("woken.txt", "awake")
    paused = wait_state(sbx, "paused")
    say("auto_resume", paused=paused, read=sbx.files.read("woken.txt"), state=sbx.get_info().state.value)
    sbx.kill()


def watch_checks(canary):
    from e2b import FileNotFoundException, FilesystemEventType

    sbx = Sandbox.create(timeout=120)
    sbx.files.make_dir("w/sub")
    h = sbx.files.watch_dir("w", recursive=True, include_entry=True)
    sbx.files.write("w/api.txt", "by the files API")
    sbx.commands.run("echo guest > /home/user/w/sub/guest.txt; mkdir /home/user/w/new; echo x > /home/user/w/new/in-new.txt")
    sbx.commands.run("chmod 600 /home/user/w/api.txt; rm /home/user/w/sub/guest.txt")
    events = [(e.name, e.type.value, e.entry.path if e.entry else None) for e in h.get_new_events()]
    say("watch_events", events=events)

    # A symlink the guest points at a host directory is never watched through: not as the
    # watched path, and not under a recursive watch (a host write there is not seen).
    sbx.commands.run(f"ln -s {canary} /home/user/w/link; ln -s {canary} /home/user/link")
    try:
        sbx.files.watch_dir("link")
        linked = None
    except Exception as e:  # noqa: BLE001
        linked = kind(e)
    h.get_new_events()
    with open(os.path.join(canary, "host-write.txt"), "w") as f:
        f.write("host")
    sbx.commands.run("true")
    leaked = [e.name for e in h.get_new_events() if "host-write" in e.name]
    say("watch_links", linked=linked, leaked=leaked)

    try:
        sbx.files.watch_dir("never-made")
        missing = None
    except FileNotFoundException as e:
        missing = kind(e)
    extra, refused = [], None
    try:
        for _ in range(8):
            extra.append(sbx.files.watch_dir("w"))
    except SandboxException as e:
        refused = kind(e) + ": " + str(e)[:120]
    say("watch_bounds", missing=missing, made=len(extra), refused=refused)
    h.stop()
    try:
        h.get_new_events()
        after_stop = None
    except SandboxException as e:
        after_stop = kind(e)
    say("watch_stopped", after_stop=after_stop)
    sbx.kill()


def inotify_count(pid):
    """The inotify instances the server process holds, read from the host's /proc."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:inotify"
        except OSError:
            pass
    return n


async def until(what, check, within=60):
    """Waits for `check()` to hold (an event the server makes happen), failing after `within` s."""
    import asyncio

    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while not check():
        if loop.time() > end:
            raise AssertionError(f"{what}: not within {within} s")
        await asyncio.sleep(0.05)


async def watch_stream_checks(mark):
    """The async SDK's `watch_dir`: envd's streamed WatchDir."""
    import asyncio

    from e2b import AsyncSandbox, FileNotFoundException, SandboxException

    canary, pid = mark.rsplit(":", 1)
    pid = int(pid)
    base = inotify_count(pid)
    sbx = await AsyncSandbox.create(timeout=120)
    await sbx.files.make_dir("w/sub")
    got, exits = [], []
    last = asyncio.Event()

    def on_event(e):
        got.append((e.name, e.type.value, e.entry.path if e.entry else None))
        if (e.name, e.type.value) == ("sub/guest.txt", "remove"):
            last.set()

    def on_exit(err):
        exits.append(kind(err) if err else None)

    h = await sbx.files.watch_dir("w", on_event, on_exit=on_exit, recursive=True, include_entry=True, timeout=0)
    await sbx.files.write("w/api.txt", "by the files API")
    await sbx.commands.run("echo guest > /home/user/w/sub/guest.txt; mkdir /home/user/w/new; echo x > /home/user/w/new/in-new.txt")
    await sbx.commands.run("chmod 600 /home/user/w/api.txt; rm /home/user/w/sub/guest.txt")
    await asyncio.wait_for(last.wait(), 60)
    events_fds = inotify_count(pid) - base
    say("stream_events", events=got, inotify=events_fds)

    # A symlink to a host directory is not watched through; a host write there is not told.
    await sbx.commands.run(f"ln -s {canary} /home/user/w/link; ln -s {canary} /home/user/link")
    try:
        await sbx.files.watch_dir("link", on_event)
        linked = None
    except Exception as e:  # noqa: BLE001
        linked = kind(e)
    with open(os.path.join(canary, "host-write.txt"), "w") as f:
        f.write("host")
    await sbx.files.write("w/after-host.txt", "x")
    await until("the write after the host's", lambda: any(n == "after-host.txt" for n, _, _ in got))
    leaked = [n for n, _, _ in got if "host-write" in n]
    try:
        await sbx.files.watch_dir("never-made", on_event)
        missing = None
    except FileNotFoundException as e:
        missing = kind(e)
    say("stream_links", linked=linked, leaked=leaked, missing=missing)

    # Four watchers a sandbox, streamed ones counted with polled ones.
    more, refused = [], None
    try:
        for _ in range(8):
            more.append(await sbx.files.watch_dir("w", on_event, on_exit=on_exit, timeout=0))
    except SandboxException as e:
        refused = kind(e) + ": " + str(e)[:120]
    # Descriptors for one watch (the server reads a watch through a second descriptor).
    each = events_fds
    held = (inotify_count(pid) - base) // each
    # A stopped stream gives its watch back: the server's inotify descriptors say so.
    await h.stop()
    await until("the stopped stream's inotify instance closed", lambda: inotify_count(pid) - base == (held - 1) * each)
    say("stream_bounds", made=len(more), refused=refused, held=held, exits=list(exits))

    # A stream's deadline (the SDK's `timeout`) ends it with an error.
    exits.clear()
    await more.pop().stop()
    await until("the second stop", lambda: inotify_count(pid) - base == (held - 2) * each)
    await sbx.files.watch_dir("w", on_event, on_exit=on_exit, timeout=1)
    await until("the timed stream's end", lambda: len(exits) == 2)
    timed_out = exits[-1]
    # Killed under its streams: each ends with an error, and every watch is closed.
    exits.clear()
    await sbx.kill()
    await until("the streams' ends", lambda: len(exits) == len(more))
    await until("every inotify instance closed", lambda: inotify_count(pid) == base)
    say("stream_ends", timed_out=timed_out, killed=list(exits))


ECHO_SERVER = """
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", 8000), H).serve_forever()
"""


def ports_checks():
    import time

    import httpx

    sbx = Sandbox.create(timeout=120)
    sbx.files.write("echo.py", ECHO_SERVER)
    # `python`, as E2B's base template has it (not only `python3`).
    sbx.commands.run("python /home/user/echo.py", background=True)
    url = os.environ["E2B_SANDBOX_URL"]
    tok = sbx.traffic_access_token
    hdr = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8000", "E2B-Traffic-Access-Token": tok}
    r = None
    for _ in range(240):
        r = httpx.get(f"{url}/some/path?q=1", headers=hdr, timeout=30)
        if r.status_code != 502:
            break
        time.sleep(0.25)
    seen = r.json() if r.status_code == 200 else {}
    say("port", status=r.status_code, path=seen.get("path"), headers=seen.get("headers"), token=tok,
        envd_token=sbx._envd_access_token)
    by_host = httpx.get(f"{url}/by-host", headers={"Host": f"8000-{sbx.sandbox_id}.localhost",
                                                   "E2B-Traffic-Access-Token": tok}, timeout=30)
    say("port_by_host", status=by_host.status_code, path=by_host.json().get("path") if by_host.status_code == 200 else None)
    anon = httpx.get(f"{url}/x", headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8000"}, timeout=30)
    closed = httpx.get(f"{url}/x", headers={**hdr, "E2b-Sandbox-Port": "8001"}, timeout=30)
    say("port_refusals", anon=anon.status_code, closed=closed.status_code, closed_body=closed.text[:200])
    # The guest's server is on the sandbox's loopback, not the host's.
    try:
        host = httpx.get("http://127.0.0.1:8000/some/path", timeout=5).text[:100]
    except Exception as e:  # noqa: BLE001
        host = kind(e)
    say("port_host_loopback", seen=host)
    sbx.kill()

    # maskRequestHost: the guest's server sees the mask as the Host, the port in it.
    masked = Sandbox.create(timeout=120, network={"mask_request_host": "${PORT}-masked.example"})
    masked.files.write("echo.py", ECHO_SERVER)
    masked.commands.run("python3 /home/user/echo.py", background=True)
    mhdr = {"E2b-Sandbox-Id": masked.sandbox_id, "E2b-Sandbox-Port": "8000",
            "E2B-Traffic-Access-Token": masked.traffic_access_token}
    for _ in range(240):
        r = httpx.get(f"{url}/masked", headers=mhdr, timeout=30)
        if r.status_code != 502:
            break
        time.sleep(0.25)
    host_seen = {k.lower(): v for k, v in r.json().get("headers", {}).items()}.get("host") if r.status_code == 200 else None
    say("port_masked", status=r.status_code, host=host_seen)
    masked.kill()


def network_checks(ports):
    """allowOut, denyOut and update_network against the `net` template, whose grant names
    a.test and b.test (two listeners of the test, on 127.0.0.3 and 127.0.0.4)."""
    pa, pb = ports.split(",")

    def codes(sbx):
        cmd = "curl -s -o /dev/null -w '%{{http_code}}' --max-time 20 http://{}/"
        return [sbx.commands.run(cmd.format(h), timeout=60).stdout for h in (f"a.test:{pa}", f"b.test:{pb}")]

    sbx = Sandbox.create("net", timeout=120, network={"deny_out": ["127.0.0.4/32"]})
    say("net_create_deny_block", codes=codes(sbx))
    sbx.update_network({"allow_out": ["b.test"], "deny_out": ["0.0.0.0/0"]})
    say("net_update_only_b", codes=codes(sbx))
    sbx.update_network({})
    say("net_update_cleared", codes=codes(sbx))
    sbx.kill()
    closed = Sandbox.create("net", timeout=120, allow_internet_access=False)
    say("net_no_internet", codes=codes(closed))
    closed.update_network({"allow_out": ["a.test"], "deny_out": ["0.0.0.0/0"]})
    say("net_then_a", codes=codes(closed))
    closed.kill()
    refusals = {}
    for name, make in [
        ("public", lambda: Sandbox.create("net", timeout=60, network={"allow_public_traffic": True})),
        ("bad_block", lambda: Sandbox.create("net", timeout=60, network={"deny_out": ["10.0.0.0/99"]})),
        ("rules", lambda: Sandbox.create("net", timeout=60, network={"rules": {"10.0.0.0/8": [{"transform": {"headers": {"X": "1"}}}]}})),
    ]:
        try:
            make().kill()
            refusals[name] = None
        except Exception as e:  # noqa: BLE001 - the message is what is judged
            refusals[name] = str(e)[:200]
    base = Sandbox.create(timeout=60)
    try:
        base.update_network({"allow_out": ["a.test"]})
        refusals["no_grant"] = None
    except Exception as e:  # noqa: BLE001
        refusals["no_grant"] = str(e)[:200]
    base.kill()
    say("net_refusals", **refusals)


def rules_checks(mark):
    """network.rules against the `net` template, whose grant names api.test (the test's TLS
    echo upstream): the rules' headers reach it, and nothing of their values comes back."""
    port, token, auth = mark.split(",")
    rules = {
        "api.test": [
            {"transform": {"headers": {"X-Test-Token": "replaced-later", "Authorization": "Bearer " + auth}}},
            {"transform": {"headers": {"x-test-token": token}}},
        ]
    }
    sbx = Sandbox.create("net", timeout=120, network={"rules": rules})
    cmd = f"curl -sS -i --max-time 20 -H 'X-Test-Token: guest-made' https://api.test:{port}/echo"
    out = sbx.commands.run(cmd, timeout=60).stdout
    env = sbx.commands.run("env; cat /proc/self/environ", timeout=60).stdout
    try:
        sbx.update_network({"rules": {"api.test": [{"transform": {"headers": {"X-Other": "1"}}}]}})
        update = None
    except Exception as e:  # noqa: BLE001 - the message is what is judged
        update = str(e)[:300]
    try:
        sbx.update_network({"allow_out": ["api.test"], "rules": {}})
        empty = None
    except Exception as e:  # noqa: BLE001
        empty = str(e)[:300]
    sbx.kill()
    say("rules", out=out, env=env, update=update, empty_update=empty)


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "files"
    if which == "files":
        files_checks()
    if which == "metrics":
        metrics_checks()
    if which == "ports":
        ports_checks()
    if which == "network":
        network_checks(os.environ["MARK"])
    if which == "rules":
        rules_checks(os.environ["MARK"])
    if which == "watch":
        watch_checks(os.environ["MARK"])
    if which == "watch_stream":
        import asyncio

        asyncio.run(watch_stream_checks(os.environ["MARK"]))
    if which == "lifecycle":
        lifecycle_checks(os.environ.get("MARK", "600"))
    sys.stdout.flush()
    os._exit(0)
