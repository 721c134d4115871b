"""Shared by the steward's tools: read the call's arguments, log the run."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.dirname(HERE)


def arguments():
    """The call's arguments: one JSON object on stdin."""
    args = json.load(sys.stdin)
    if not isinstance(args, dict):
        fail("the arguments must be a JSON object")
    return args


def log(tool, args):
    """Appends one line to $STEWARD_LOG, if set: what ran, with what."""
    path = os.environ.get("STEWARD_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"tool": tool, "args": args}, sort_keys=True) + "\n")


def fail(message, code=1):
    print(message, file=sys.stderr)
    sys.exit(code)
