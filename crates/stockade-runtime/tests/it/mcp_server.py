# A raw MCP server over stdio (the standard library only), for deterministic tests of
# stockade-runtime's MCP client: two pages of tools, requests of its own to the client, a
# call it never answers, a crash, an oversized message. It appends what it receives to
# $MCP_LOG, so the test judges from the host what reached the server.
import json
import os
import subprocess
import sys

mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
log = os.environ.get("MCP_LOG")


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def record(line):
    if log:
        with open(log, "a") as f:
            f.write(line + "\n")


def result(i, value):
    send({"jsonrpc": "2.0", "id": i, "result": value})


print("raw server starting", file=sys.stderr, flush=True)
if mode == "exit":
    print("no config file, giving up", file=sys.stderr, flush=True)
    sys.exit(7)
if mode == "helper":
    helper = subprocess.Popen(["sleep", "300"])
    record(f"helper {helper.pid}")
    record(f"server {os.getpid()}")

obj = {"type": "object", "properties": {}}
tools = [
    {"name": "echo", "description": "Echoes its text.",
     "inputSchema": {"type": "object", "properties": {"text": {"type": "string"},
                     "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}},
                     "required": ["text"]}},
    {"name": "slow", "inputSchema": obj},
    {"name": "die", "inputSchema": obj},
    {"name": "bad name!", "inputSchema": obj},
    {"name": "loose", "inputSchema": {"type": "object", "properties": {"x": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}}},
    {"name": "huge", "inputSchema": obj},
]

for line in sys.stdin:
    message = json.loads(line)
    method, i = message.get("method"), message.get("id")
    if method is None:
        record(f"answer {i} {json.dumps(message.get('result', message.get('error')), sort_keys=True)}")
        continue
    record(f"{method} {json.dumps(message.get('params', {}), sort_keys=True)}")
    if mode == "mute":
        continue
    if method == "initialize":
        version = "2023-01-01" if mode == "old" else "2025-06-18"
        result(i, {"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": {"name": "raw", "version": "1"}})
    elif method == "tools/list" and mode == "many":
        result(i, {"tools": [{"name": f"t{n}", "inputSchema": obj} for n in range(120)]})
    elif method == "tools/list":
        if (message.get("params") or {}).get("cursor") is None:
            result(i, {"tools": tools[:3], "nextCursor": "page-2"})
        else:
            result(i, {"tools": tools[3:]})
            send({"jsonrpc": "2.0", "id": "s1", "method": "roots/list"})
            send({"jsonrpc": "2.0", "id": "s2", "method": "ping"})
            send({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "hi"}})
    elif method == "tools/call":
        name, args = message["params"]["name"], message["params"].get("arguments", {})
        if name == "echo":
            result(i, {"content": [{"type": "text", "text": args["text"]}], "isError": args["text"] == "err",
                       "_meta": {"x": 1}})
        elif name == "slow":
            pass  # never answered: the client's deadline cancels it
        elif name == "die":
            print("dying words", file=sys.stderr, flush=True)
            sys.exit(3)
        elif name == "huge":
            result(i, {"content": [{"type": "text", "text": "x" * (5 << 20)}]})
