#!/usr/bin/env python3
"""The README's granted host function: reads its arguments, {"a": A, "b": B}, as JSON on
stdin (already checked against add.json and allowed by grants.toml) and prints A + B."""

import json
import sys

args = json.load(sys.stdin)
print(args["a"] + args["b"])
