"""The agent library's steward loop in Python (examples/steward/steward.py: the seed's
runAgent with ALLOW and MARK hooks over `stockade`), against a scripted OpenAI-compatible
endpoint of this test's own. Judged by the ravens file and by what the model was sent."""

import http.server
import importlib.util
import json
import pathlib
import threading

STEWARD = pathlib.Path(__file__).resolve().parents[3] / "examples/steward/steward.py"


def load_steward():
    spec = importlib.util.spec_from_file_location("steward", STEWARD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def calls(*pairs):
    return {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{i}-{name}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        for i, (name, args) in enumerate(pairs)]}}]}


def text(content):
    return {"choices": [{"message": {"role": "assistant", "content": content}}]}


class Scripted:
    """A scripted chat endpoint on 127.0.0.1: each request gets the next answer."""

    def __init__(self, answers):
        self.answers, self.received = list(answers), []
        mock = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                mock.received.append(body)
                answer = json.dumps(mock.answers.pop(0)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"


def test_the_steward_sends_the_ally_raven_and_no_forbidden_one(tmp_path, monkeypatch):
    ravens = tmp_path / "ravens.jsonl"
    monkeypatch.setenv("STEWARD_RAVENS", str(ravens))
    copied = "the bridge at the ford is out"
    mock = Scripted([
        calls(("send_raven", {"to": "riverhold", "text": "The harvest is in."}),
              ("read_scroll", {"name": "north"}), ("read_scroll", {"name": "stranger"})),
        calls(("read_ledger", {"page": 1}),
              ("send_raven", {"to": "eastwatch", "text": "page 1: 1200 measures of grain"}),
              ("send_raven", {"to": "riverhold", "text": copied}),
              ("run_code", {"language": "python", "code": "print(1200 // 3)"})),
        text("The harvest report is ready."),
    ])
    steward = load_steward()
    answer = steward.run_agent(mock.url, "m", steward.TOOLS, steward.Guard(steward.TOOLS))
    assert answer == "The harvest report is ready."
    flown = [json.loads(line) for line in ravens.read_text().splitlines()]
    assert flown == [{"to": "riverhold", "text": "The harvest is in."}], "only the ally raven flew"
    tools = [m["content"] for m in mock.received[2]["messages"] if m["role"] == "tool"]
    assert tools[0] == "A raven flew to riverhold."
    assert "<untrusted id=" in tools[2] and "&lt;|im_start|&gt;" in tools[2], tools[2]
    assert "</untrusted>\n<|" not in tools[2]
    assert "grain_measures" in tools[3]
    assert tools[4].startswith("Blocked by policy (default-deny)"), tools[4]
    assert "approval" in tools[5], "a copy to an ally after a scroll needs a human"
    assert "400" in tools[6] and '[provenance source="run_code"' in tools[6], tools[6]
    assert "untrusted" in mock.received[0]["messages"][0]["content"], "the system prompt explains the blocks"
    # As a real server reads them: llama-cpp-python refuses an assistant message whose
    # content is null (found against the real model).
    sent = [m for r in mock.received for m in r["messages"] if m["role"] == "assistant"]
    assert sent and all(isinstance(m["content"], str) for m in sent), sent


def test_real_model_steward_is_policed_end_to_end(tmp_path, monkeypatch):
    """Against a real local model (`cargo xtask llm --test` sets STOCKADE_LLM_URL; CI's
    agent-llm step runs it): whatever the model does, the loop ends in an answer or runs out
    of turns, and no raven flies to anyone but an ally."""
    import os

    import pytest

    url = os.environ.get("STOCKADE_LLM_URL")
    if not url:
        if os.environ.get("STOCKADE_REQUIRE_LLM"):
            pytest.fail("STOCKADE_REQUIRE_LLM is set but STOCKADE_LLM_URL is not")
        pytest.skip("no local model: `cargo xtask llm --test` runs this")
    ravens = tmp_path / "ravens.jsonl"
    monkeypatch.setenv("STEWARD_RAVENS", str(ravens))
    steward = load_steward()
    try:
        answer = steward.run_agent(url.rstrip("/"), "smollm2", steward.TOOLS, steward.Guard(steward.TOOLS))
        print(f"real model (python steward): {answer!r}")
    except RuntimeError as e:  # the turn budget
        assert "No answer after" in str(e), e
    except OSError as e:  # the endpoint failed (urllib's URLError): a typed end, as the CLI's exit 4
        print(f"real model (python steward): the endpoint failed: {e}")
    flown = [json.loads(line) for line in ravens.read_text().splitlines()] if ravens.exists() else []
    assert all(r["to"] in ("riverhold", "highcliff") for r in flown), flown
    print(f"real model (python steward): {len(flown)} ravens flew")
