"""The Python package's side of `cargo xtask bench bindings`: a wasm run_code of
console.log(1) and one authorize, N times each (after 20 unmeasured), as the Rust baseline
makes them; prints each call's microseconds as JSON."""

import json
import sys
import time

import stockade

n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
TOML = ('version = 1\ndefault = "deny"\n[[rule]]\nid = "allies"\ntool = "send_raven"\neffect = "allow"\n'
        'args.to = { one_of = ["riverhold", "highcliff"] }\n')
TOOLS = {"send_raven": {"type": "object", "properties": {"to": {"type": "string"}, "text": {"type": "string"}},
                        "required": ["to", "text"]}}
policy = stockade.Policy.from_toml(TOML, TOOLS)
args = {"to": "riverhold", "text": "all quiet"}
run_us, authorize_us = [], []
for i in range(n + 20):
    t = time.perf_counter()
    r = stockade.run_code("console.log(1)", language="javascript")
    took = time.perf_counter() - t
    assert r.value == "1\n"
    t = time.perf_counter()
    d = policy.authorize("send_raven", args)
    took_auth = time.perf_counter() - t
    assert isinstance(d, stockade.Allow)
    if i >= 20:
        run_us.append(took * 1e6)
        authorize_us.append(took_auth * 1e6)
print(json.dumps({"run_us": run_us, "authorize_us": authorize_us}))
