#!/usr/bin/env python3
"""send_raven(to, text): a raven flies; it is recorded as one JSON line in $STEWARD_RAVENS
(default: ../ravens.jsonl). That file is the side effect tests judge."""
import fcntl
import json
import os

from common import EXAMPLE, arguments, fail, log

args = arguments()
log("send_raven", args)
to, text = args.get("to"), args.get("text")
if not isinstance(to, str) or not isinstance(text, str):
    fail("send_raven needs to and text, both strings")
path = os.environ.get("STEWARD_RAVENS") or os.path.join(EXAMPLE, "ravens.jsonl")
with open(path, "a", encoding="utf-8") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.write(json.dumps({"to": to, "text": text}) + "\n")
print(f"A raven flew to {to}.")
