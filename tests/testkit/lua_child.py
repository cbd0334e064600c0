"""Run adapter calls near the sandbox's limits in a child process; print one JSON line per case.

A limit that escapes the sandbox is not an exception but a Lua PANIC, which aborts the
whole process: that can only be seen from outside it. ``python -m tests.testkit.lua_child
ENGINE`` runs every case of ``cases()`` on one engine and prints ``{"case": name, "outcome":
...}`` for each (``ok``, ``violation:<limit>`` or ``error:<class>``), then ``{"done": n}``;
the parent checks the exit code and that every case reported.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from gelbridge._adapters.host import Adapter, load_adapter
from gelbridge._adapters.sandbox import SandboxLimits
from gelbridge._errors import GelbridgeError, SandboxViolation

MIB = 1024 * 1024
MEMORY = 32 * MIB
STRING = 16 * MIB  # the default

SCRIPT = """
local adapter = { name = "fuzz" }
kept = {}
function adapter.transform_request(raw)
  if raw:sub(1, 5) == "keep:" then            -- keep live data: memory stays near the limit
    for _ = 1, tonumber(raw:sub(6)) do kept[#kept + 1] = string.rep("k", 1048576 - 64) .. #kept end
    return "kept"
  elseif raw:sub(1, 4) == "rep:" then
    return string.rep("r", tonumber(raw:sub(5)))
  elseif raw:sub(1, 5) == "json:" then
    return json.encode(json.decode(raw:sub(6)))
  elseif raw == "drop" then
    kept = {}
    return "dropped"
  end
  return tostring(#raw)                        -- garbage: the argument itself
end
function adapter.transform_response(raw) return raw .. raw end
function adapter.transform_stream_chunk(data, state)
  state.n = (state.n or 0) + 1
  state.last = data .. ""                       -- one more copy, garbage by the next chunk
  return ""
end
function adapter.transform_error(status, body) return { kind = "server_error", message = tostring(#body) } end
function adapter.build_headers(meta) return { ["x-n"] = tostring(#meta.body) } end
return adapter
"""


def _outcome(fn: Callable[[], object]) -> str:
    try:
        fn()
    except SandboxViolation as e:
        return f"violation:{e.limit}"
    except GelbridgeError as e:
        return f"error:{type(e).__name__}"
    return "ok"


def cases(a: Adapter) -> Iterator[tuple[str, Callable[[], object]]]:
    """(name, call) for every entry into Lua, with inputs around each limit."""
    for label, size in [("1MiB", MIB), ("quarter", MEMORY // 4), ("string-1", STRING - 1), ("string", STRING),
                        ("string+1", STRING + 1), ("memory", MEMORY), ("double", 2 * MEMORY)]:
        yield f"request:{label}", lambda size=size: a.transform_request(b"x" * size)
        yield f"response:{label}", lambda size=size: a.transform_response(b"y" * size)
    for n in range(12):  # the garbage of earlier chunks in the way of the next push
        yield f"stream-garbage:{n}", lambda: _stream(a, [b"z" * (MEMORY // 5)] * 3)
    yield "keep:half", lambda: a.transform_request(f"keep:{MEMORY // MIB // 2}")
    yield "request-after-keep:16", lambda: a.transform_request(b"x" * 16)
    yield "request-after-keep:half-1MiB", lambda: a.transform_request(b"x" * (MEMORY // 2 - MIB))  # no room
    yield "request-after-refusal:16", lambda: a.transform_request(b"x" * 16)  # a fresh runtime took over
    yield "stream:quarter", lambda: _stream(a, [b"s" * (MEMORY // 4)])
    yield "error-body:string+1", lambda: a.transform_error(500, b"e" * (STRING + 1))
    yield "error-body:quarter", lambda: a.transform_error(500, b"e" * (MEMORY // 4))
    yield "headers:string+1", lambda: a.build_headers({"body": "h" * (STRING + 1)})
    for label, n in [("max-1", STRING - 1), ("max", STRING), ("max+1", STRING + 1)]:
        yield f"string.rep:{label}", lambda n=n: a.transform_request(f"rep:{n}")
    yield "json:deep", lambda: a.transform_request("json:" + "[" * 200_000 + "]" * 200_000)
    yield "json:deep-objects", lambda: a.transform_request("json:" + '{"a":' * 100_000 + "1" + "}" * 100_000)
    yield "json:many-keys", lambda: a.transform_request(
        "json:{" + ",".join(f'"k{i}":{i}' for i in range(300_000)) + "}")
    yield "json:huge-numbers", lambda: a.transform_request("json:[1e309,-1e309,123456789012345678901234567890,-0]")
    yield "json:invalid-utf8", lambda: a.transform_request(b'json:["\xff\xfe\xc0\x80"]')
    yield "bytes:invalid-utf8", lambda: a.transform_request(b"\xff" * 1000)
    yield "after-all", lambda: _expect(a.transform_request("abc"), "3")


def _stream(a: Adapter, chunks: list[bytes]) -> None:
    with a.stream_session() as s:
        for c in chunks:
            s.chunk(c.decode())


def _expect(got: object, want: object) -> None:
    if got != want:
        raise AssertionError(f"{got!r} != {want!r}")


def main(engine: str) -> int:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "fuzz.lua"
        path.write_text(SCRIPT)
        limits = SandboxLimits(engine=engine, max_memory=MEMORY, max_string=STRING, time_limit=5.0,  # type: ignore[arg-type]
                               pool_size=1)
        a = load_adapter(path, limits=limits, allow_hosts={})
        n = 0
        for name, call in cases(a):
            print(json.dumps({"case": name, "outcome": _outcome(call)}), flush=True)
            n += 1
        print(json.dumps({"done": n}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
