"""What an agent's code-interpreter tool does with E2B's SDK, here against `stockade serve`:
upload data, run the model's code on it, read the result back. E2B_API_URL,
E2B_SANDBOX_URL and E2B_API_KEY name the server."""

from e2b import Sandbox

code = "import csv, json; rows = list(csv.DictReader(open('sales.csv'))); print(json.dumps({'total': sum(int(r['amount']) for r in rows)}))"

with Sandbox.create(timeout=60) as sbx:
    sbx.files.write("sales.csv", "region,amount\nnorth,40\nsouth,2\n")
    run = sbx.commands.run(f"python3 -c \"{code}\"")
    print(run.stdout, end="")
