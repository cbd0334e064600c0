"""Sandbox cases that end the process on a host that pushes values into Lua unchecked
(lupa pushes a call's arguments outside any protected call: a Lua memory error there is
``PANIC: unprotected error in call to Lua API (not enough memory)`` and the process
aborts). Each runs in a child process (``testkit.child``): ``python -c "from
testkit.sandbox_child import main; main()" CASE ENGINE`` reports one JSON object per
step, ``{"step", "ok"}`` (the call's result) or ``{"step", "error", "limit", "message"}``
(a gelbridge error), then ``{"done": true}``.
"""

from __future__ import annotations

import sys
import tempfile
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gelbridge._adapters.host import Adapter, load_adapter
from gelbridge._adapters.sandbox import LuaSandbox, SandboxLimits
from gelbridge._adapters.script_services import AdapterServices
from gelbridge._errors import GelbridgeError

MiB = 1024 * 1024
CASES: dict[str, Callable[[str], None]] = {}


def report(value: Any) -> None:
    import json

    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


def step(name: str, fn: Callable[[], Any]) -> Any:
    """Run one call and report how it ended; gelbridge errors are an outcome, not a failure."""
    try:
        out = fn()
    except GelbridgeError as e:
        report({"step": name, "error": type(e).__name__, "limit": getattr(e, "limit", None),
                "message": str(e)[:400]})
        return None
    report({"step": name, "ok": out if isinstance(out, (str, int, float, bool)) or out is None else repr(out)[:200]})
    return out


def adapter(engine: str, body: str, *, stream: str = "return ''", extra: str = "",
            allow_hosts: list[str] | None = None, **limits: Any) -> Adapter:
    """A script whose transform_request(raw) runs ``body`` and whose
    transform_stream_chunk(data, state) runs ``stream``."""
    path = Path(tempfile.mkdtemp()) / "t.lua"
    path.write_text(
        "local adapter = { name = 't' }\n" + extra
        + "function adapter.transform_request(raw)\n" + body + "\nend\n"
        + "function adapter.transform_response(raw) return raw end\n"
        + "function adapter.transform_stream_chunk(data, state)\n" + stream + "\nend\n"
        + "return adapter\n")
    return load_adapter(path, limits=SandboxLimits(engine=engine, **limits), allow_hosts={"t": allow_hosts or []})


def case(fn: Callable[[str], None]) -> Callable[[str], None]:
    CASES[fn.__name__] = fn
    return fn


@case
def oversized_requests(engine: str) -> None:
    """Requests at and past max_string, and one that fits max_string but not the memory."""
    a = adapter(engine, "return tostring(#raw)")
    step("100 MiB", lambda: a.transform_request(b"x" * (100 * MiB)))
    step("70 MiB", lambda: a.transform_request(b"x" * (70 * MiB)))
    step("max_string", lambda: a.transform_request(b"x" * (16 * MiB)))
    step("max_string + 1", lambda: a.transform_request(b"x" * (16 * MiB + 1)))
    step("small after", lambda: a.transform_request(b"abc"))
    small = adapter(engine, "return tostring(#raw)", max_memory=16 * MiB)
    step("15 MiB into 16 MiB", lambda: small.transform_request(b"x" * (15 * MiB)))
    step("small after memory", lambda: small.transform_request(b"abcd"))


@case
def big_stream_events(engine: str) -> None:
    """Many 11 MiB stream events, each leaving garbage as large as itself: the garbage of
    the earlier ones must not make the next push fail (LuaJIT has no emergency GC)."""
    a = adapter(engine, "return raw", stream="state.n = (state.n or 0) + 1\n"
                "local copy = data:sub(2) .. '!'\nreturn tostring(state.n) .. ':' .. tostring(#copy)")
    with a.stream_session() as s:
        for i in range(12):
            event = f"{i:08d}" + "y" * (11 * MiB)  # distinct texts: LuaJIT interns equal strings as one
            if step(f"event {i}", lambda: s.chunk(event)) is None:
                break
    with a.stream_session() as s:
        step("next stream", lambda: s.chunk("small"))


@case
def stream_state_fills_memory(engine: str) -> None:
    """A stream whose state keeps every event: once the next event cannot fit, that event is
    refused (the runtime stays sound); a new stream works once the old one is closed."""
    a = adapter(engine, "return raw", stream="state[#state + 1] = data\nreturn tostring(#state)",
                max_memory=32 * MiB, streams_per_runtime=1)
    with a.stream_session() as s:
        for i in range(10):
            event = f"{i:08d}" + "z" * (5 * MiB)
            if step(f"event {i}", lambda: s.chunk(event)) is None:
                break
    with a.stream_session() as s:
        step("next stream", lambda: s.chunk("small"))


@case
def hook_inputs(engine: str) -> None:
    """build_headers, transform_error and build_url with inputs past max_string."""
    extra = ("function adapter.build_headers(meta) return { n = tostring(#meta.body) } end\n"
             "function adapter.transform_error(status, body) return { message = tostring(#body) } end\n"
             "function adapter.build_url(model, stream) return '/m/' .. #model end\n")
    a = adapter(engine, "return raw", extra=extra)
    huge = "h" * (70 * MiB)
    step("headers", lambda: a.build_headers({"body": huge}))
    step("error", lambda: a.transform_error(500, huge.encode()))
    step("url", lambda: a.url("http://x", huge))
    step("headers after", lambda: a.build_headers({"body": "small"}))
    step("url after", lambda: a.url("http://x", "m"))


class _Big(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        body = b"b" * (MiB - 64)
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


@case
def http_body_near_full(engine: str) -> None:
    """http_get's body arrives while the call's own tables fill the memory: it is refused
    with a Lua error the script sees, never pushed past the limit."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Big)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/big"
    body = f"""
    if raw == 'ok' then return 'fine' end
    local keep, limit = {{}}, {16 * MiB - 300 * 1024} / 1024
    local i = 0
    while collectgarbage('count') < limit do i = i + 1; keep[i] = ('k'):rep(1000) .. i end
    local got = http_get('{url}')
    return 'got ' .. #got .. ' with ' .. i
    """
    a = adapter(engine, body, allow_hosts=[f"127.0.0.1:{srv.server_address[1]}"], max_memory=16 * MiB,
                max_string=1 << 30)
    step("near full", lambda: a.transform_request(b"go"))
    step("small after", lambda: a.transform_request(b"ok"))
    srv.shutdown()


@case
def http_answer_at_the_memory_limit(engine: str) -> None:
    """An http answer, an error message too, arriving with all but a few hundred bytes of
    the memory taken: a push that failed there jumped out of the callback holding the GIL,
    and the whole process hung. Each step fills the memory to ``left`` bytes first."""
    script = rb"""
    local keep = {}
    return {
      transform_response = function(s) return s end,
      transform_request = function(arg)
        local free, left = arg:match("(%d+) (%d+)")
        local limit = collectgarbage("count") * 1024 + tonumber(free)
        local size, i = 1048576, 0
        while size >= 64 do
          if collectgarbage("count") * 1024 + size * 2 + 8192 < limit then
            i = i + 1
            keep[i] = string.rep("a", size - 12) .. string.format("%012d", i)
          else
            size = math.floor(size / 2)
          end
        end
        keep[0] = "x"
        keep[-1] = string.rep("b", limit - collectgarbage("count") * 1024 - tonumber(left) - 25)
        local ok, err = pcall(http_get, "http://127.0.0.1:9/")
        return tostring(ok) .. " " .. tostring(err):sub(1, 40)
      end,
    }
    """
    for left in range(0, 400, 8):
        sb = LuaSandbox("t", SandboxLimits(engine=engine, max_memory=8 * MiB), AdapterServices("t"))  # type: ignore[arg-type]
        sb.load_script(script, "t.lua")
        free = sb.limits.max_memory - sb.memory_used() - 200  # in lupa's count, which is what the limit is on
        step(f"left {left}", lambda sb=sb, free=free, left=left: sb.call_string("transform_request", f"{free} {left}"))


def main() -> None:
    name, engine = sys.argv[1], sys.argv[2]
    CASES[name](engine)
    report({"done": True})
