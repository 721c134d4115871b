"""Drives `stockade mcp` with the official MCP Python SDK's client (PyPI `mcp`, pinned by
`cargo xtask llm --mcp`), and prints one JSON line per step for tests/it/mcp.rs to judge.

usage: STOCKADE_MCP_MARKER=SECONDS mcp_client.py STOCKADE POLICY_FILE

The marker (the cancelled run's `sleep` argument) comes in the environment, so that only
the run's own process shows it in its command line.

Before the cancelled run's client gives up it prints {"step": "cancelled"} and waits for a
line on stdin: the Rust test checks from the host that no process of that run is left.
"""

import json
import os
import sys

import anyio
from mcp import Client, StdioServerParameters

STOCKADE, POLICY, MARKER = sys.argv[1], sys.argv[2], os.environ["STOCKADE_MCP_MARKER"]


def emit(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


def outcome(result):
    s = result.structured_content or {}
    text = "".join(getattr(c, "text", "") for c in result.content)
    return {
        "is_error": bool(result.is_error),
        "status": s.get("status"),
        "exit_code": s.get("exit_code"),
        "stdout": s.get("stdout"),
        "reason": s.get("reason"),
        "tier": s.get("tier"),
        "enforcement": s.get("enforcement"),
        "text": text,
    }


def server(*extra):
    return StdioServerParameters(command=STOCKADE, args=["mcp", *extra])


async def modern():
    async with Client(server(), mode="auto") as client:
        emit("connected", version=client.protocol_version, name=client.server_info.name if client.server_info else None)
        tools = await client.list_tools()
        emit(
            "tools",
            names=[t.name for t in tools.tools],
            languages=[t.input_schema["properties"]["language"]["enum"] for t in tools.tools if t.name == "run_code"],
        )
        listed = [t for t in tools.tools if t.name == "run_code"]
        if listed and "javascript" in listed[0].input_schema["properties"]["language"]["enum"]:
            r = await client.call_tool("run_code", {"language": "javascript", "code": "console.log(6 * 7)"})
            emit("javascript", **outcome(r))
        else:
            emit("javascript", skipped="javascript is not listed (no QuickJS guest: cargo xtask guests)")
        r = await client.call_tool("run_code", {"language": "python", "code": "print(sum(range(10)))"})
        emit("python", **outcome(r))
        r = await client.call_tool("run_code", {"language": "sh", "code": "sleep 10", "timeout_ms": 500})
        emit("timeout", **outcome(r))
        r = await client.call_tool("run_code", {"language": "python", "code": "print('x' * 10_000_000)"})
        emit("flood", **outcome(r))
        r = await client.call_tool("run_code", {"language": "sh", "code": "true", "timeout_ms": 10_000_000})
        emit("over_cap", **outcome(r))
        progress = []

        async def on_progress(p, total, message):
            progress.append(p)

        r = await client.call_tool(
            "run_code", {"language": "sh", "code": "sleep 2.5; echo done", "timeout_ms": 10_000}, progress_callback=on_progress
        )
        emit("progress", notifications=len(progress), **outcome(r))

        results = {}

        async def one(i):
            r = await client.call_tool("run_code", {"language": "python", "code": f"print({i} * {i})"})
            results[i] = outcome(r)

        async with anyio.create_task_group() as tg:
            for i in range(16):
                tg.start_soon(one, i)
        emit("concurrent", results={str(k): v for k, v in results.items()})

        with anyio.move_on_after(1.5):
            await client.call_tool("run_code", {"language": "sh", "code": f"exec sleep {MARKER}", "timeout_ms": 40_000})
        emit("cancelled")
        await anyio.to_thread.run_sync(sys.stdin.readline)
        r = await client.call_tool("run_code", {"language": "sh", "code": "echo after"})
        emit("after_cancel", **outcome(r))


async def legacy():
    async with Client(server("--policy", POLICY), mode="legacy") as client:
        emit("legacy", version=client.protocol_version)
        r = await client.call_tool("run_code", {"language": "python", "code": "print('allowed')"})
        emit("policy_allowed", **outcome(r))
        r = await client.call_tool("run_code", {"language": "sh", "code": "echo never"})
        emit("policy_denied", **outcome(r))


async def main():
    await modern()
    await legacy()
    emit("done")


anyio.run(main)
