#!/usr/bin/env python3
"""read_scroll(name): prints the delivery NAME from $STEWARD_SCROLLS (default: ../scrolls)."""
import os
import re

from common import EXAMPLE, arguments, fail, log

args = arguments()
log("read_scroll", args)
name = args.get("name", "")
if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9_-]{1,64}", name):
    fail("a delivery's name is 1 to 64 of a-z, 0-9, _ and -")
base = os.environ.get("STEWARD_SCROLLS") or os.path.join(EXAMPLE, "scrolls")
try:
    with open(os.path.join(base, name + ".txt"), encoding="utf-8") as f:
        print(f.read(), end="")
except FileNotFoundError:
    known = sorted(n[:-4] for n in os.listdir(base) if n.endswith(".txt"))
    fail(f"no delivery named {name}; today's deliveries are: {', '.join(known)}")
