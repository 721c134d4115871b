"""stockade's asyncio forms: the same calls as `stockade`, awaited.

    import stockade.aio
    r = await stockade.aio.run(["python3", "-c", "print(6*7)"], timeout=5)   # a Verified
    async with stockade.aio.Session(memory="256M") as s:
        out = await s.exec(["sh", "-c", "echo hi"])

Each call is the synchronous one on a thread of stockade's own executor (at most
`MAX_RUN_THREADS`, 16; more wait in order), never the loop's default executor, which the
host's own blocking calls need (`loop.getaddrinfo`, `asyncio.to_thread`): a run holds its
thread for as long as it lasts. The native call releases the GIL while the sandbox runs, so
the event loop goes on and runs started together run at once. A host function may be
`async def`: the guest's call waits for it, run on the awaiting caller's loop. Refusals are
raised as the same exceptions. Cancelling an
awaiting task does not stop its sandbox: the run ends at its own timeout (or the session at
its kill, which `async with` still awaits on the way out), and its result is dropped.
"""

import asyncio
import concurrent.futures
import contextvars
import functools

import stockade
from stockade import _native

__all__ = ["MAX_RUN_THREADS", "Session", "run", "run_code"]

#: At most this many awaited calls run at once (the Rust core's bound, as for Node's runs).
MAX_RUN_THREADS = _native.MAX_RUN_THREADS

_RUNS = concurrent.futures.ThreadPoolExecutor(max_workers=MAX_RUN_THREADS, thread_name_prefix="stockade-run")


async def _off_loop(fn, *args, **kwargs):
    """`fn(*args, **kwargs)` on stockade's executor, with the caller's context (as
    `asyncio.to_thread` would) and its loop, where an `async` host function runs."""
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    context.run(stockade._CALLER_LOOP.set, loop)
    return await loop.run_in_executor(_RUNS, functools.partial(context.run, fn, *args, **kwargs))


async def run(argv, **options):
    """`stockade.run`, awaited: a `Verified`, or raises a `Refusal`."""
    return await _off_loop(stockade.run, argv, **options)


async def run_code(code, **options):
    """`stockade.run_code`, awaited: a `Verified`, or raises a `Refusal`."""
    return await _off_loop(stockade.run_code, code, **options)


class Session:
    """`stockade.Session`, awaited: made on entering `async with` (or by `await
    Session.create(...)`), ended on leaving it, also on an exception."""

    def __init__(self, **options):
        self._options = options
        self._session = None

    @classmethod
    async def create(cls, **options):
        s = cls(**options)
        await s.__aenter__()
        return s

    @property
    def id(self):
        return self._session.id

    async def _call(self, name, *args, **kwargs):
        return await _off_loop(getattr(self._session, name), *args, **kwargs)

    async def exec(self, argv, **options):
        return await self._call("exec", argv, **options)

    async def write(self, path, data):
        await self._call("write", path, data)

    async def read(self, path):
        return await self._call("read", path)

    async def pause(self):
        await self._call("pause")

    async def resume(self):
        await self._call("resume")

    async def kill(self):
        if self._session is not None:
            await self._call("kill")

    async def __aenter__(self):
        self._session = await _off_loop(lambda: stockade.Session(**self._options))
        return self

    async def __aexit__(self, *exc):
        await self.kill()
        return False
