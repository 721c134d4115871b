#!/usr/bin/env python3
"""read_ledger(page): prints one page of the keep's private ledger."""
import json
import os

from common import EXAMPLE, arguments, fail, log

args = arguments()
log("read_ledger", args)
page = args.get("page")
with open(os.path.join(EXAMPLE, "ledger.json"), encoding="utf-8") as f:
    pages = json.load(f)
if not isinstance(page, int) or not 1 <= page <= len(pages):
    fail(f"the ledger has pages 1 to {len(pages)}")
print(json.dumps(pages[page - 1]))
