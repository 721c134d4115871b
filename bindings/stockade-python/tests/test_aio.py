"""`stockade.aio`, the asyncio forms, as a user meets them (pytest, against the built wheel).
Ordering is by events, never by sleeps."""

import asyncio
import threading

import pytest

import stockade
import stockade.aio


def test_an_awaited_run_returns_the_verified_value_and_raises_the_same_refusals():
    async def main():
        r = await stockade.aio.run(["python3", "-c", "print(6*7)"], timeout=10)
        assert r.value == "42\n"
        with pytest.raises(stockade.NonZeroExit):
            await stockade.aio.run(["sh", "-c", "exit 3"], timeout=10)
        r = await stockade.aio.run_code("print(1+2)", language="python", timeout=10)
        assert r.value == "3\n"

    asyncio.run(main())


def test_runs_awaited_together_run_at_once_and_the_loop_goes_on():
    # A's guest calls a host function that waits until B, started after A on the same loop,
    # has finished. If the loop (or the GIL) were held while A's sandbox ran, B could never
    # run and A would reach its own deadline: a Timeout, not this value.
    b_done = threading.Event()

    def gate():
        return "opened" if b_done.wait(60) else "timed out"

    policy = 'version = 1\ndefault = "deny"\n[[rule]]\nid = "gate"\ntool = "gate"\neffect = "allow"\n'
    order = []

    async def a():
        r = await stockade.aio.run_code("console.log(gate())", language="javascript", timeout=90,
                                        grants={"gate": stockade.function(gate, {"type": "object"})},
                                        grant_policy=policy)
        order.append("a")
        return r.value.strip()

    async def b():
        await asyncio.sleep(0)  # yield, so A is started first
        r = await stockade.aio.run(["true"], timeout=30)
        order.append("b")
        b_done.set()
        return r

    async def main():
        return await asyncio.gather(a(), b())

    a_value, _ = asyncio.run(main())
    assert a_value == "opened" and order == ["b", "a"]


def test_runs_hold_none_of_the_loops_default_executor():
    # The loop's default executor runs the host's own blocking calls (loop.getaddrinfo,
    # asyncio.to_thread). Here it has one thread. The guest's host function waits until
    # the host has used that executor; a run held on it would leave the host's call
    # waiting for the run, and the run's call would fail at the grant's call timeout.
    went = threading.Event()
    entered = None

    def gate():
        loop.call_soon_threadsafe(entered.set)
        return "went" if went.wait(60) else "stalled"

    policy = 'version = 1\ndefault = "deny"\n[[rule]]\nid = "gate"\ntool = "gate"\neffect = "allow"\n'

    async def main():
        nonlocal entered, loop
        loop = asyncio.get_running_loop()
        entered = asyncio.Event()
        from concurrent.futures import ThreadPoolExecutor
        loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
        run = asyncio.ensure_future(stockade.aio.run_code(
            "console.log(gate())", language="javascript", timeout=90,
            grants={"gate": stockade.function(gate, {"type": "object"})}, grant_policy=policy))
        await entered.wait()
        assert await loop.run_in_executor(None, lambda: 42) == 42
        went.set()
        return (await run).value.strip()

    loop = None
    assert asyncio.run(main()) == "went"


def test_an_async_host_function_runs_on_the_awaiting_callers_loop():
    # The coroutine waits on an asyncio.Event of the caller's loop, which the caller sets
    # once the call has arrived: it could only be woken on that loop.
    policy = 'version = 1\ndefault = "deny"\n[[rule]]\nid = "l"\ntool = "lookup"\neffect = "allow"\n'

    async def main():
        arrived, released = asyncio.Event(), asyncio.Event()
        caller = asyncio.get_running_loop()

        async def lookup(sku: int):
            assert asyncio.get_running_loop() is caller
            arrived.set()
            await released.wait()
            return sku * 10

        run = asyncio.ensure_future(stockade.aio.run_code(
            "console.log(lookup(7))", language="javascript", timeout=60, grants={"lookup": lookup},
            grant_policy=policy))
        # Until the call arrives, or the run ends without it (a failure, not a hang).
        await asyncio.wait({run, asyncio.ensure_future(arrived.wait())}, return_when=asyncio.FIRST_COMPLETED)
        released.set()
        return (await run).value

    assert asyncio.run(main()) == "70\n"

    # A synchronous run awaits it on a loop of its own.
    async def double(n: int):
        await asyncio.sleep(0)
        return n * 2

    r = stockade.run_code("console.log(double(21))", language="javascript", grants={"double": double},
                          grant_policy=policy.replace("lookup", "double"))
    assert r.value == "42\n"


def test_an_async_session_ends_on_leaving_the_block_also_on_an_exception():
    async def main():
        async with stockade.aio.Session(memory="256M") as s:
            await s.write("notes.txt", "kept")
            assert await s.read("notes.txt") == b"kept"
            r = await s.exec(["sh", "-c", "cat notes.txt; echo; echo $((6*7))"])
            assert r.exit_code == 0 and r.stdout == b"kept\n42\n"
            kept = s
        with pytest.raises(stockade.Refusal):
            await kept.exec(["true"])
        with pytest.raises(RuntimeError):
            async with stockade.aio.Session(memory="256M") as s:
                inner = s
                raise RuntimeError("the block failed")
        with pytest.raises(stockade.Refusal):
            await inner.exec(["true"])

    asyncio.run(main())
