"""One sandboxed Lua runtime that runs one adapter script.

The Lua side lives in ``lua/sandbox.lua`` (limits, wrappers, removal of unsafe
globals), ``lua/json.lua`` (the JSON bridge) and ``lua/luxkit.lua`` (the read-only
helper library every script gets as ``luxkit``). This module picks the engine,
creates the runtime so that no Python object is reachable from Lua, and turns the
prelude's status codes into typed errors.

Engines: LuaJIT 2.1 (default when lupa ships it) with the JIT left on for the
host's own Lua (JSON, wrappers) and switched off, per function prototype, for
everything an adapter script defines, so the instruction-count hook fires in every
loop a script writes; or PUC Lua 5.4. Measured numbers: ``scripts/bench_lua_host.py``.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, Protocol

from gelbridge._errors import AdapterError, AdapterLoadError, SandboxViolation

Engine = Literal["auto", "luajit", "lua54"]

_LUA_DIR = Path(__file__).with_name("lua")
_ENGINE_MODULES = {"luajit": "lupa.luajit21", "lua54": "lupa.lua54"}

# Instructions between two hook calls. Each hook call reads the clock (a call
# into Python), so this trades overhead (~1 us per call) against reaction time.
HOOK_EVERY = 10_000
# Bytes of Lua memory kept free beyond a value's own size before it is pushed into a
# runtime: what the push itself may allocate on top (string header, string table and
# stack growth). Pushing happens outside any protected call, where running out of
# memory is a PANIC that aborts the process, so it must never fail (see `_room_for`).
PUSH_HEADROOM = 1024 * 1024
# Lua pattern matching steps per second assumed when refusing a pattern whose
# worst case would not fit in the remaining time (conservative for a slow core).
PATTERN_STEPS_PER_SECOND = 20_000_000


@dataclass(frozen=True)
class SandboxLimits:
    """Per-adapter limits. Every call gets the full time and instruction budget."""

    time_limit: float = 2.0
    """Wall-clock seconds per call (checked in the instruction hook)."""
    max_memory: int = 64 * 1024 * 1024
    """Bytes the whole Lua state may allocate."""
    max_instructions: int = 200_000_000
    """Lua VM instructions per call (host JSON code compiled by LuaJIT is not counted)."""
    max_string: int = 16 * 1024 * 1024
    """Largest string ``string.rep`` may build."""
    max_script_bytes: int = 1024 * 1024
    """Largest adapter file the registry loads."""
    pool_size: int = 4
    """Runtimes per adapter (concurrent calls beyond this wait for a free one)."""
    streams_per_runtime: int = 32
    """Streams whose ``state`` tables share one runtime (and its memory limit)."""
    engine: Engine = "auto"


class HostServices(Protocol):
    """What a runtime's ``log`` and ``http_*`` globals call (see ``script_services.py``)."""

    def log(self, level: bytes, message: bytes) -> None: ...

    def http(
        self, method: bytes, url: bytes, body: bytes | None, deadline: float
    ) -> tuple[bool, bytes, int | None]: ...


@cache
def _lua_source(name: str) -> bytes:
    return (_LUA_DIR / name).read_bytes()


def available_engines() -> list[str]:
    """The lupa engines importable here, fastest first."""
    found = []
    for name, mod in _ENGINE_MODULES.items():
        try:
            importlib.import_module(mod)
        except ImportError:
            continue
        found.append(name)
    return found


def resolve_engine(engine: Engine) -> str:
    """``auto`` → LuaJIT if available, else Lua 5.4."""
    engines = available_engines()
    if engine == "auto":
        if not engines:
            raise AdapterError("lupa has neither LuaJIT nor Lua 5.4 here; reinstall lupa")
        return engines[0]
    if engine not in engines:
        raise AdapterError(
            f"Lua engine {engine!r} is not available in this lupa build; "
            f"use one of {engines} or 'auto'"
        )
    return engine


def _lupa(engine: str) -> ModuleType:
    return importlib.import_module(_ENGINE_MODULES[engine])


def _refuse_attribute(obj: object, name: object, is_setting: bool) -> str:
    raise AttributeError("Python attributes are not accessible from adapter scripts")


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


_PIECES = {b"text": "text", b"thinking": "thinking"}  # the statuses of a TextPiece result
TextPiece = tuple[str, int, str]
"""One plain text or thinking delta of a stream as ``luxkit`` encoded it: ``(type,
index, text)`` for the event ``{"event": "block_delta", "index": index, "delta":
{"type": type, "text": text}}``, type "text" or "thinking"."""


class LuaSandbox:
    """A fresh Lua state with the sandbox prelude; runs one adapter script.

    Not thread-safe: the pool in ``host.py`` hands each runtime to one thread at a
    time. After a limit violation ``broken`` is set and the pool replaces the
    runtime (LuaJIT may stay out of memory after a memory bomb).
    """

    def __init__(self, adapter: str, limits: SandboxLimits, services: HostServices) -> None:
        self.adapter = adapter
        self.limits = limits
        self.engine = resolve_engine(limits.engine)
        self.broken = False
        lupa = _lupa(self.engine)
        self._memory_error: type[BaseException] = lupa.LuaMemoryError
        self._lua_error: type[BaseException] = lupa.LuaError
        rt = lupa.LuaRuntime(
            register_eval=False,
            register_builtins=False,
            attribute_filter=_refuse_attribute,
            unpack_returned_tuples=True,
            encoding=None,
            max_memory=limits.max_memory,
        )
        self._rt = rt
        # `python` exists even without eval/builtins; the prelude deletes it too.
        rt.execute(b"python = nil")
        try:
            self._load, self._invoke, self._open_stream = rt.execute(
                _lua_source("sandbox.lua"),
                _lua_source("json.lua"),
                _lua_source("luxkit.lua"),
                time.monotonic,
                services.log,
                services.http,
                HOOK_EVERY,
                limits.max_string,
                PATTERN_STEPS_PER_SECOND,
            )
        except self._lua_error as e:  # a bug in the prelude, not in a script
            raise AdapterError(f"adapter {adapter!r}: the Lua sandbox failed to start: {e}") from None

    # ------------------------------------------------------------------ helpers

    def _budget(self) -> tuple[float, float]:
        return (
            time.monotonic() + self.limits.time_limit,
            float(self.limits.max_instructions // HOOK_EVERY),
        )

    def _violation(self, limit: str, what: str, *, broken: bool = True) -> SandboxViolation:
        if broken:
            self.broken = True
        err = SandboxViolation(
            f"adapter {self.adapter!r}: {what} exceeded the sandbox {limit} limit "
            f"({self._limit_text(limit)}); fix the script or raise the limit in [adapters]"
        )
        err.adapter = self.adapter
        err.limit = limit
        return err

    def _limit_text(self, limit: str) -> str:
        lim = self.limits
        return {
            "time": f"{lim.time_limit:g} s wall clock per call",
            "instructions": f"{lim.max_instructions} instructions per call",
            "memory": f"{lim.max_memory // (1024 * 1024)} MB",
            "pattern": "string pattern too costly for its subject within the time limit",
            "string_size": f"strings up to {lim.max_string} bytes",
        }.get(limit, limit)

    def _room_for(self, size: int, what: str) -> None:
        """Refuse, before it is pushed, a value the runtime has no memory for.

        Lua arguments are pushed outside a protected call: a push that runs out of memory
        is a PANIC that aborts the whole process (every account on it), not a Lua error.
        So the room is checked first, with one full collection when the garbage of earlier
        calls is in the way. The runtime stays usable: nothing was pushed."""
        rt, limit = self._rt, self.limits.max_memory
        if rt.get_memory_used() + size + PUSH_HEADROOM <= limit:
            return
        rt.gccollect()
        if rt.get_memory_used() + size + PUSH_HEADROOM > limit:
            raise self._violation("memory", f"{what} (its input of {size} bytes)", broken=False)

    def _run(self, fn: Callable[..., Any], what: str, *args: Any) -> tuple[str, Any]:
        try:
            status, value = fn(*args)
        except self._memory_error:
            raise self._violation("memory", what) from None
        except self._lua_error as e:
            raise self._host_failed(what, e) from None
        status = _text(status)
        if status == "violation":
            raise self._violation(_text(value), what)
        return status, value

    # ------------------------------------------------------------------- public

    def load_script(self, source: bytes, chunkname: str) -> dict[str, Any]:
        """Run the script; return its metadata (name, version, endpoint, headers, functions).

        Raises ``AdapterLoadError`` with ``file:line: message`` for syntax and runtime
        errors and contract problems, ``SandboxViolation`` for limits.
        """
        import json

        self._room_for(len(source), "loading the script")
        dl, budget = self._budget()
        status, value = self._run(
            self._load, "loading the script", source, b"@" + chunkname.encode(), dl, budget
        )
        if status != "ok":
            msg = _text(value)[:500]
            if not msg.startswith(chunkname + ":"):
                msg = f"{chunkname}: {msg}"
            raise AdapterLoadError(msg)
        meta: dict[str, Any] = json.loads(_text(value))
        return meta

    def call_string(self, fname: str, arg: str | bytes) -> str:
        """Call ``adapter.<fname>(arg)``; the script must return a string.

        ``arg`` may be UTF-8 bytes already (e.g. from ``orjson.dumps``): passed as is."""
        if type(arg) is not bytes:
            arg = arg.encode("utf-8", "replace")  # type: ignore[union-attr]
        return self._call_text(b"string", fname, fname.encode(), arg, None)

    def _call_text(self, kind: bytes, fname: str, fname_b: bytes, arg: bytes, state: Any) -> str:
        """One Lua entry with a fresh time and instruction budget; the script's string.

        The per-call Python work is kept to the minimum (it runs once per stream chunk):
        the success case is decided on the raw bytes."""
        lim = self.limits
        self._room_for(len(arg), fname)
        try:
            status, value = self._invoke(kind, fname_b, time.monotonic() + lim.time_limit,
                                         float(lim.max_instructions // HOOK_EVERY), arg, state)
        except self._memory_error:
            raise self._violation("memory", fname) from None
        except self._lua_error as e:
            raise self._host_failed(fname, e) from None
        if status == b"ok" and type(value) is bytes:
            return value.decode("utf-8", "replace")
        return self._not_ok(fname, status, value)

    def _host_failed(self, fname: str, e: BaseException) -> AdapterError:
        """A Lua error out of the prelude itself (scripts' errors are caught inside): the
        runtime is not to be trusted any more."""
        self.broken = True
        return AdapterError(f"adapter {self.adapter!r}: {fname} failed in the host: {_text(e)[:300]}")

    def _not_ok(self, fname: str, status: bytes, value: Any) -> str:
        """A string call's result other than a string: the matching error, raised."""
        st = _text(status)
        if st == "violation":
            raise self._violation(_text(value), fname)
        return self._result(fname, st, value)  # type: ignore[return-value]

    def open_stream(self, fname: str, *, typed: bool = False) -> Callable[[str], str | TextPiece]:
        """``adapter.<fname>(data, state)`` for the chunks of one stream, with one
        ``state`` table (held in Lua) for the stream's life; the same limits and errors
        as ``call_string``. Not locked: lupa serialises the calls into one runtime.

        The result is the script's JSON text, or (``typed``, for Lux event output) a
        ``TextPiece`` when the script returned exactly the text ``luxkit`` built for one
        plain text or thinking delta (the bulk of every built-in adapter's stream): what
        that JSON encodes, without copying and decoding it. Once the runtime is broken (a
        limit hit by any stream on it), every call refuses. This is the hot path of
        streaming, once per chunk: one Python frame and a three-argument Lua entry
        (``scripts/bench_scale.py``)."""
        step = self._open_stream(fname.encode(), typed)
        if step is None:
            raise AdapterError(f"adapter {self.adapter!r} has no function {fname}")
        time_limit = self.limits.time_limit
        budget = float(self.limits.max_instructions // HOOK_EVERY)
        monotonic, memory_error, lua_error = time.monotonic, self._memory_error, self._lua_error
        used, room = self._rt.get_memory_used, self.limits.max_memory - PUSH_HEADROOM

        def chunk(data: str) -> str | TextPiece:
            if self.broken:
                raise AdapterError(f"adapter {self.adapter!r}: the Lua runtime of this stream was reset after "
                                   "a stream on it hit a sandbox limit; the stream cannot go on")
            raw = data.encode("utf-8", "replace")
            if used() + len(raw) > room:
                self._room_for(len(raw), fname)
            try:
                out = step(monotonic() + time_limit, budget, raw)
            except memory_error:
                raise self._violation("memory", fname) from None
            except lua_error as e:
                raise self._host_failed(fname, e) from None
            status = out[0]
            kind = _PIECES.get(status)
            if kind is not None:
                return (kind, int(out[1]), out[2].decode("utf-8", "replace"))  # Lua 5.4: 3.0 stays a float
            value = out[1]
            if status == b"ok" and type(value) is bytes:
                return value.decode("utf-8", "replace")
            return self._not_ok(fname, status, value)

        return chunk

    def call_headers(self, meta_json: str) -> str | None:
        """Call ``adapter.build_headers(meta)``; returns a JSON object text or None."""
        meta = meta_json.encode("utf-8", "replace")
        self._room_for(len(meta), "build_headers")
        dl, budget = self._budget()
        status, value = self._run(
            self._invoke, "build_headers", b"headers", b"build_headers", dl, budget,
            meta, None,
        )
        return self._result("build_headers", status, value, allow_nil=True, expect="a table")

    def call_error(self, status: int, body: bytes) -> str | None:
        """Call ``adapter.transform_error(status, body)``; a JSON object text or None."""
        self._room_for(len(body), "transform_error")
        dl, budget = self._budget()
        status_, value = self._run(
            self._invoke, "transform_error", b"error", b"transform_error", dl, budget, status, body,
        )
        return self._result("transform_error", status_, value, allow_nil=True, expect="a table")

    def call_url(self, model: str, stream: bool) -> str | None:
        """Call ``adapter.build_url(model, stream)``; returns a string or None."""
        model_b = model.encode("utf-8", "replace")
        self._room_for(len(model_b), "build_url")
        dl, budget = self._budget()
        status, value = self._run(
            self._invoke, "build_url", b"url", b"build_url", dl, budget, model_b, stream
        )
        return self._result("build_url", status, value, allow_nil=True)

    def _result(
        self, fname: str, status: str, value: Any, *, allow_nil: bool = False, expect: str = "a string"
    ) -> str | None:
        if status == "ok":
            if value is None:
                if allow_nil:
                    return None
                raise AdapterError(f"adapter {self.adapter!r}: {fname} returned nil; it must return {expect}")
            return _text(value)
        if status == "type":
            raise AdapterError(
                f"adapter {self.adapter!r}: {fname} returned {_text(value)}; it must return {expect}"
            )
        if status == "missing":
            raise AdapterError(f"adapter {self.adapter!r} has no function {fname}")
        raise AdapterError(f"adapter {self.adapter!r}: {fname} failed: {_text(value)[:500]}")

    def memory_used(self) -> int:
        """Bytes currently allocated by this Lua state."""
        return int(self._rt.get_memory_used() or 0)
