"""stockade from Python: run untrusted code confined, and gate an agent's tool calls.

    import stockade
    r = stockade.run(["python3", "-c", "print(6*7)"], timeout=5, memory="256M")
    r.value                                    # '42\\n': a Verified value, or an exception
    stockade.run_code("console.log(1+2)", language="javascript")     # the wasm tier
    policy = stockade.Policy.from_file("steward.toml", tools={"send_raven": {...}})
    policy.authorize("send_raven", {"to": "eastwatch", "text": "..."})  # Allow / Ask / Deny
    stockade.mark(scroll_text, source="read_scroll")                  # a Marked block

Everything is stockade's own crates (`stockade._native`, pyo3): this layer only turns
Python values into JSON and refusals into exceptions. A refusal is never a value: a run
returns a `Verified` or raises a `Refusal` (`Timeout`, `OutputTooLarge`, `OutOfMemory`,
`NonZeroExit`, `AssertionFailed`, ...), which carries the run's report. The GIL is released
while a sandbox runs, so threads run sandboxes at once; `stockade.aio` has the same calls for
asyncio, awaited.
"""

import asyncio
import contextvars
import inspect
import json
import os
import pathlib

from . import _native

__all__ = [
    "Allow", "Ask", "Deny", "Marked", "Policy", "Refusal", "Session", "Verified",
    "function", "mark", "run", "run_code", "system_prompt",
]

_HELPER = pathlib.Path(__file__).with_name("stockade-process-helper")
if _HELPER.is_file() and not os.environ.get("STOCKADE_HELPER"):
    _native.set_helper(str(_HELPER))


class Refusal(Exception):
    """A run's output is not trusted (or the run could not happen): `kind`, `message`, and
    `report` (the run's report as a dict, when it ran)."""

    kind = "Refusal"

    def __init__(self, message, report=None):
        super().__init__(message)
        self.message = message
        self.report = report


_KINDS = {}
for _kind in _native.refusal_kinds():
    _KINDS[_kind] = type(_kind, (Refusal,), {"kind": _kind, "__module__": __name__})
    globals()[_kind] = _KINDS[_kind]
    __all__.append(_kind)
# Bad options are a ValueError as well as a refusal.
InvalidOptions = _KINDS["InvalidOptions"] = type("InvalidOptions", (Refusal, ValueError), {"kind": "InvalidOptions",
                                                                                         "__module__": __name__})


def _raised(err):
    kind, message, report = err.args
    cls = _KINDS.get(kind, Refusal)
    return cls(message, json.loads(report) if report else None)


class Verified:
    """A verified run's value, read-only: `value` (str, bytes or the parsed JSON), and the
    run's `report` (a dict)."""

    __slots__ = ("_value", "_report", "_report_json")

    def __init__(self, value, report_json):
        object.__setattr__(self, "_value", value)
        object.__setattr__(self, "_report", None)
        object.__setattr__(self, "_report_json", report_json)

    def __setattr__(self, name, value):
        raise AttributeError("a Verified value is read-only")

    @property
    def value(self):
        return self._value

    @property
    def report(self):
        """The run's report (parsed on first use)."""
        if self._report is None:
            object.__setattr__(self, "_report", json.loads(self._report_json))
        return self._report

    def __repr__(self):
        return f"Verified({self._value!r})"


_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}


def function(fn, schema=None, description=None):
    """A host function grant: `fn` is called with the arguments a guest's call carried (as
    keyword arguments), only when the grant policy allows that call. Without `schema`, it is
    made from `fn`'s annotated parameters (int, float, str, bool, list, dict). `fn` may be
    `async def`: the guest's call waits for it, run on the awaiting caller's event loop
    (`stockade.aio`), or on an event loop of its own for a synchronous run."""
    if schema is None:
        props, required = {}, []
        for p in inspect.signature(fn).parameters.values():
            ty = _TYPES.get(p.annotation)
            if ty is None:
                raise InvalidOptions(f"grant {fn.__name__}: annotate {p.name} (int, float, str, bool, list, dict) "
                                     "or give a schema")
            props[p.name] = {"type": ty}
            if p.default is inspect.Parameter.empty:
                required.append(p.name)
        schema = {"type": "object", "properties": props, "required": required, "additionalProperties": False}
    return _Function(fn, schema, description or (fn.__doc__ or "").strip() or None)


# The event loop of the call awaiting this run (`stockade.aio` sets it), where an `async`
# host function runs; None for a synchronous run.
_CALLER_LOOP = contextvars.ContextVar("stockade_caller_loop", default=None)


async def _awaited(awaitable):
    return await awaitable


def _answer(value, loop):
    """A host function's value, an awaitable one awaited: on `loop` (the awaiting caller's,
    which is free while its run is awaited), else on an event loop of its own in this thread
    (the runtime's blocking thread, which runs no other loop)."""
    if not inspect.isawaitable(value):
        return value
    if loop is not None:
        return asyncio.run_coroutine_threadsafe(_awaited(value), loop).result()
    return asyncio.run(_awaited(value))


class _Function:
    __slots__ = ("fn", "schema", "description")

    def __init__(self, fn, schema, description):
        self.fn, self.schema, self.description = fn, schema, description

    def native(self):
        fn, loop = self.fn, _CALLER_LOOP.get()

        def call(args_json):
            return json.dumps(_answer(fn(**json.loads(args_json)), loop))

        return (call, json.dumps(self.schema), self.description)


def _grants(grants):
    data, functions = {}, {}
    for name, g in (grants or {}).items():
        if isinstance(g, _Function):
            functions[name] = g.native()
        elif callable(g):
            functions[name] = function(g).native()
        else:
            data[name] = g
    return data, functions


def _policy_text(policy):
    if policy is None:
        return None
    if isinstance(policy, os.PathLike) or (isinstance(policy, str) and "\n" not in policy and policy.endswith(".toml")):
        return pathlib.Path(policy).read_text()
    return policy


def _run(options, stdin, grants, grant_policy, check):
    data, functions = _grants(grants)
    if data:
        options["data"] = data
    text = _policy_text(grant_policy)
    if text is not None:
        options["grant_policy"] = text
    native_check = None
    if check is not None:
        def native_check(kind, value):
            v = json.loads(value) if kind == "json" else value
            try:
                ok = check(v)
            except AssertionError as e:
                return str(e) or "the assertion failed"
            except Exception as e:  # noqa: BLE001 - any failure of the check rejects the value
                return f"{type(e).__name__}: {e}"
            return None if ok is None or ok is True else "the check returned " + repr(ok)
    if isinstance(stdin, str):
        stdin = stdin.encode()
    try:
        kind, value, report = _native.run(json.dumps({k: v for k, v in options.items() if v is not None}), stdin,
                                          functions or None, native_check)
    except _native.NativeRefusal as e:
        raise _raised(e) from None
    return Verified(json.loads(value) if kind == "json" else value, report)


def run(argv, *, timeout=10, cpu=None, memory="512M", max_output="1M", output="text", expect_exit=0, env=None,
        stdin=None, allow_net=None, net_resolve=None, grants=None, grant_policy=None, strict_grants=False, check=None):
    """Runs `argv` in the process tier and returns a `Verified`, or raises a `Refusal`.
    `output`: "text", "json" or "bytes"; `check(value)` may reject the value (raise, or
    return False); `grants`: name to data or to a host function (see `function`), whose
    every call `grant_policy` (TOML text or a .toml path) decides."""
    options = dict(argv=list(argv), timeout=timeout, cpu=cpu, memory=memory, max_output=max_output, output=output,
                   expect_exit=expect_exit, env=env, allow_net=allow_net, net_resolve=net_resolve,
                   strict_grants=strict_grants)
    return _run(options, stdin, grants, grant_policy, check)


def run_code(code, *, language="python", timeout=10, cpu=None, memory="512M", max_output="1M", output="text",
             env=None, stdin=None, allow_net=None, net_resolve=None, grants=None, grant_policy=None,
             strict_grants=False, check=None):
    """Runs `code`: `javascript` in the wasm tier (QuickJS), `python` and `sh` in the process
    tier. Returns a `Verified`, or raises a `Refusal`; the options are `run`'s."""
    options = dict(code=code, language=language, timeout=timeout, cpu=cpu, memory=memory, max_output=max_output,
                   output=output, env=env, allow_net=allow_net, net_resolve=net_resolve, strict_grants=strict_grants)
    return _run(options, stdin, grants, grant_policy, check)


class _Decision:
    effect = ""

    def __init__(self, rule, reason=None, permit=None):
        self.rule, self.reason, self.permit = rule, reason, permit

    def __bool__(self):
        return self.effect == "allow"

    def __repr__(self):
        why = f", reason={self.reason!r}" if self.reason else ""
        return f"{type(self).__name__}(rule={self.rule!r}{why})"


class Allow(_Decision):
    """The call may run: `permit` holds exactly the call that was allowed."""

    effect = "allow"


class Ask(_Decision):
    """A human must approve the call first (`reason` says why)."""

    effect = "ask"


class Deny(_Decision):
    """The call must not run (`rule` decided, `reason` says why)."""

    effect = "deny"


class Policy:
    """ALLOW: a policy (stockade's TOML) over the host's tools, with one gate deciding each
    call. `tools` maps each tool's name to the JSON Schema of its arguments (add
    `"x-untrusted-output": True` where the tool's output is untrusted)."""

    def __init__(self, native):
        self._native = native

    @classmethod
    def from_toml(cls, text, tools):
        try:
            return cls(_native.Policy.from_toml(text, json.dumps(tools)))
        except _native.NativeRefusal as e:
            raise _raised(e) from None

    @classmethod
    def from_file(cls, path, tools):
        return cls.from_toml(pathlib.Path(path).read_text(), tools)

    def authorize(self, tool, args, source="user"):
        """`Allow`, `Ask` or `Deny` for one call; an allow is counted in the gate's ledger.
        `source`: where the arguments came from (`user`, `config`, `sandbox`, `tool:NAME`)."""
        try:
            d = json.loads(self._native.authorize(tool, json.dumps(args), source))
        except _native.NativeRefusal as e:
            raise _raised(e) from None
        if d["effect"] == "allow":
            return Allow(d["rule"], permit=d["permit"])
        return (Ask if d["effect"] == "ask" else Deny)(d["rule"], d["reason"])

    def read_untrusted(self):
        """The loop has read untrusted output: rules with `when_read_untrusted` apply now."""
        self._native.set_read_untrusted()

    @property
    def has_read_untrusted(self):
        return self._native.has_read_untrusted()

    def untrusted_output(self, tool):
        return self._native.untrusted_output(tool)


class Marked(str):
    """A marked block (the text to put in the prompt), with its parts: `header`, `open`,
    `body`, `close`, `nonce`."""

    def __new__(cls, parts):
        self = super().__new__(cls, parts["text"])
        self.header, self.open, self.body = parts["header"], parts["open"], parts["body"]
        self.close, self.nonce = parts["close"], parts["nonce"]
        return self


def mark(text, source, call_id="call", *, datamark=False):
    """MARK: untrusted `text` (a str, or any JSON value) from `source`, wrapped in a block
    that no text inside can close. Put `system_prompt()` in the system prompt."""
    is_json = not isinstance(text, str)
    try:
        parts = _native.mark(json.dumps(text) if is_json else text, source, call_id, is_json, datamark)
    except _native.NativeRefusal as e:
        raise _raised(e) from None
    return Marked(json.loads(parts))


def system_prompt(*, datamark=False):
    """The sentence that tells the model what a marked block is."""
    return _native.system_prompt(datamark)


class ExecResult:
    """One session exec: `exit_code` (None if killed), `signal`, `timed_out`, `stdout`,
    `stderr` (bytes, the guest's), and `report`."""

    __slots__ = ("exit_code", "signal", "timed_out", "stdout", "stderr", "report")

    def __init__(self, summary, stdout, stderr):
        self.exit_code, self.signal = summary["exit_code"], summary["signal"]
        self.timed_out, self.report = summary["timed_out"], summary["report"]
        self.stdout, self.stderr = stdout, stderr

    def __repr__(self):
        return f"ExecResult(exit_code={self.exit_code!r}, stdout={self.stdout[:60]!r})"


class Session:
    """A confined sandbox that lives across execs (`stockade session`'s): `exec`, `write`,
    `read`, `pause`, `resume`, `kill`. A context manager: it ends on exit, also on an
    exception."""

    def __init__(self, *, memory="512M", disk=None, idle_timeout=300, lifetime=3600, env=None, allow_net=None,
                 net_resolve=None):
        options = dict(memory=memory, disk=disk, idle_timeout=idle_timeout, lifetime=lifetime, env=env,
                       allow_net=allow_net, net_resolve=net_resolve)
        try:
            self._native = _native.Session.create(json.dumps({k: v for k, v in options.items() if v is not None}))
        except _native.NativeRefusal as e:
            raise _raised(e) from None
        self._killed = False

    @property
    def id(self):
        return self._native.id

    def _call(self, name, *args, **kwargs):
        try:
            return getattr(self._native, name)(*args, **kwargs)
        except _native.NativeRefusal as e:
            raise _raised(e) from None

    def exec(self, argv, *, stdin=None, timeout=60, cwd=None):
        if isinstance(stdin, str):
            stdin = stdin.encode()
        summary, out, err = self._call("exec", list(argv), stdin, timeout, cwd)
        return ExecResult(json.loads(summary), out, err)

    def write(self, path, data):
        self._call("write", path, data.encode() if isinstance(data, str) else bytes(data))

    def read(self, path):
        return self._call("read", path)

    def pause(self):
        self._call("pause")

    def resume(self):
        self._call("resume")

    def kill(self):
        if not self._killed:
            self._killed = True
            self._call("kill")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
        return False
