"""`cargo xtask bench mcp`: `run_code` javascript through the official MCP Python SDK's
client (PyPI `mcp`) against `stockade mcp`, timed by the client.

usage: mcp_client_bench.py STOCKADE RUNS

Prints one JSON object: the client-observed latency of each call and the run's own wall time
as the server measured it (`structuredContent.wall_us`), in microseconds.
"""

import json
import sys
import time

import anyio
from mcp import Client, StdioServerParameters

STOCKADE, RUNS = sys.argv[1], int(sys.argv[2])
ARGS = {"language": "javascript", "code": "console.log(1 + 2)"}


async def main():
    async with Client(StdioServerParameters(command=STOCKADE, args=["mcp", "--languages", "javascript"]), mode="auto") as c:
        for _ in range(20):
            await c.call_tool("run_code", ARGS)
        calls, walls = [], []
        for _ in range(RUNS):
            start = time.perf_counter()
            r = await c.call_tool("run_code", ARGS)
            calls.append((time.perf_counter() - start) * 1e6)
            assert not r.is_error and r.structured_content["stdout"] == "3\n", r
            walls.append(r.structured_content["wall_us"])
    print(json.dumps({"call_us": calls, "wall_us": walls}))


anyio.run(main)
