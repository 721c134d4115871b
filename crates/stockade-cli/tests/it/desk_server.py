# A host MCP server written with the pinned MCP Python SDK (MCPServer, FastMCP's 2.x name),
# granted to a sandbox by `stockade run --grant-mcp desk=...`. Every tool appends what it
# did to $DESK_LOG first, so the host judges what ran from this log, never the guest's word.
import os
import sys

from mcp.server.mcpserver import MCPServer

desk = MCPServer("desk")


def record(line):
    with open(os.environ["DESK_LOG"], "a") as f:
        f.write(line + "\n")


@desk.tool()
def write_note(text: str, title: str | None = None) -> str:
    """Writes a note on the desk."""
    record(f"write_note {title or '-'} {text}")
    # A server that logs its arguments logs the sandbox's words.
    print("DESK-NOTE " + text, file=sys.stderr, flush=True)
    return "noted: " + text


@desk.tool()
def burn(text: str) -> str:
    """Burns a note (the policy never allows it)."""
    record("burn " + text)
    return "burnt"


@desk.tool()
def fail(why: str) -> str:
    """Always fails."""
    record("fail " + why)
    raise ValueError(why)


@desk.tool()
def crash() -> str:
    """Ends the server."""
    record("crash")
    print("DESK-DYING-WORDS", file=sys.stderr, flush=True)
    os._exit(3)


if __name__ == "__main__":
    with open(os.environ["DESK_PID"], "w") as f:
        f.write(str(os.getpid()))
    print("DESK-STDERR-CANARY", file=sys.stderr, flush=True)
    desk.run()
