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
# Lua pattern matching steps per second assumed when refusing a pattern whose
# worst case would not fit in the remaining time (conservative for a slow core).
PATTERN_STEPS_PER_SECOND = 20_000_000
# lupa pushes a call's arguments (and a Python callback's results) onto the Lua stack
# outside any protected call: a memory error there is a Lua PANIC that aborts the whole
# process. So every value is measured before it goes in (``LuaSandbox._room``): it must
# fit in ``max_string`` and, with this much to spare, in the memory left. The spare
# covers what Lua allocates around the push (the string's header, a stack slot, a GC
# step). LuaJIT interns every string, long ones too, and may double its string table
# for the new one: there the half of the memory in use is kept spare on top (8-byte
# slots, at most two per string of >= 32 bytes). Lua 5.4 interns only short strings.
PUSH_HEADROOM = 1024 * 1024
MIN_MEMORY = 4 * 1024 * 1024
_INTERN_SHARE = {"luajit": 1, "lua54": 64}  # spare = used >> share (64: none)
# Values at least this large are pushed after a full collection: LuaJIT has no
# emergency collection, so the garbage of earlier calls (a stream's earlier events)
# would otherwise count against the memory the call needs.
COLLECT_BEFORE = 1024 * 1024


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
    """Largest string ``string.rep`` may build, and largest value the host passes into Lua
    (a request, a stream event, a response body)."""
    max_script_bytes: int = 1024 * 1024
    """Largest adapter file the registry loads."""
    pool_size: int = 4
    """Runtimes per adapter (concurrent calls beyond this wait for a free one)."""
    streams_per_runtime: int = 32
    """Streams whose ``state`` tables share one runtime (and its memory limit)."""
    engine: Engine = "auto"

    def __post_init__(self) -> None:
        # Smaller, the prelude itself runs out of memory while lupa loads it, outside a
        # protected call: a PANIC. (0 would mean no limit at all to lupa.)
        if self.max_memory < MIN_MEMORY:
            raise AdapterError(f"the sandbox memory limit must be at least {MIN_MEMORY // (1024 * 1024)} MB "
                               f"(got {self.max_memory} bytes); raise [adapters] memory_limit_mb")


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
        self._used: Callable[[], int] = rt.get_memory_used
        self._share = _INTERN_SHARE[self.engine]
        # `python` exists even without eval/builtins; the prelude deletes it too.
        rt.execute(b"python = nil")
        try:
            self._load, self._invoke, self._open_stream, self._collect = rt.execute(
                _lua_source("sandbox.lua"),
                _lua_source("json.lua"),
                _lua_source("luxkit.lua"),
                time.monotonic,
                services.log,
                self._bounded_http(services.http),
                HOOK_EVERY,
                limits.max_string,
                PATTERN_STEPS_PER_SECOND,
            )
        except self._lua_error as e:  # a bug in the prelude (or a memory limit too small for it)
            raise AdapterError(f"adapter {adapter!r}: the Lua sandbox failed to start: {_text(e)[:300]}") from None

    # ------------------------------------------------------------------ helpers

    def _budget(self) -> tuple[float, float]:
        return (
            time.monotonic() + self.limits.time_limit,
            float(self.limits.max_instructions // HOOK_EVERY),
        )

    def _violation(self, limit: str, what: str) -> SandboxViolation:
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

    def _fits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more can be pushed into Lua now, with the spare it needs."""
        used = self._used()
        return used + (used >> self._share) + nbytes + PUSH_HEADROOM <= self.limits.max_memory

    def _room(self, nbytes: int, what: str) -> None:
        """Make sure a value of ``nbytes`` can go into Lua, or refuse it (``SandboxViolation``
        with ``limit`` string_size or memory; nothing ran, the runtime stays usable).

        A large value first gets a full collection (in a protected call), so that it
        gets memory the garbage of earlier calls holds."""
        if nbytes > self.limits.max_string:
            raise self._refused("string_size", what)
        if nbytes < COLLECT_BEFORE and self._fits(nbytes):
            return
        try:
            self._collect()
        except self._lua_error as e:
            raise self._host_failed(what, e) from None
        if not self._fits(nbytes):
            # What the script keeps alive fills the runtime: no later call could run (and
            # free it) either, so the pool replaces it; the value may fit in a fresh one.
            self.broken = True
            raise self._refused("memory", what)

    def _refused(self, limit: str, what: str) -> SandboxViolation:
        if limit == "memory":
            why = (f"does not fit in the sandbox memory limit ({self._limit_text('memory')}, "
                   f"{self._used() // (1024 * 1024)} MB of it in use); raise [adapters] memory_limit_mb")
        else:
            why = f"is larger than the sandbox passes to a script ({self._limit_text(limit)})"
        err = SandboxViolation(f"adapter {self.adapter!r}: the input of {what} {why}; the script did not run")
        err.adapter = self.adapter
        err.limit = limit
        return err

    def _bounded_http(self, http: Callable[[bytes, bytes, bytes | None, float], tuple[bool, bytes, int | None]]
                      ) -> Callable[[bytes, bytes, bytes | None, float], tuple[bool, bytes | None, int | None]]:
        """``http`` whose answer (a body or an error message) goes into Lua only when it fits:
        lupa pushes a callback's results outside any protected call, and a memory error
        there jumps out of the callback with the GIL held (the process hangs). What does
        not fit comes back as ``(False, None, None)``, which needs no Lua memory; the
        prelude raises its own, preallocated, error for it."""

        def bounded(method: bytes, url: bytes, body: bytes | None, deadline: float
                    ) -> tuple[bool, bytes | None, int | None]:
            ok, data, status = http(method, url, body, deadline)
            if len(data) > self.limits.max_string or not self._fits(len(data)):
                return False, None, None
            return ok, data, status

        return bounded

    def _run(self, fn: Callable[..., Any], what: str, *args: Any) -> tuple[str, Any]:
        self._room(sum(len(a) for a in args if type(a) is bytes), what)
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
        self._room(len(arg), fname)
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
        self._room(0, fname)
        step = self._open_stream(fname.encode(), typed)
        if step is None:
            raise AdapterError(f"adapter {self.adapter!r} has no function {fname}")
        time_limit = self.limits.time_limit
        budget = float(self.limits.max_instructions // HOOK_EVERY)
        monotonic, memory_error, lua_error = time.monotonic, self._memory_error, self._lua_error
        used, share, spare = self._used, self._share, self.limits.max_memory - PUSH_HEADROOM

        def chunk(data: str) -> str | TextPiece:
            if self.broken:
                raise AdapterError(f"adapter {self.adapter!r}: the Lua runtime of this stream was reset after "
                                   "a stream on it hit a sandbox limit; the stream cannot go on")
            raw = data.encode("utf-8", "replace")
            n, u = len(raw), used()
            if n >= COLLECT_BEFORE or u + (u >> share) + n > spare:  # the rule of _fits, inline: once a chunk
                self._room(n, fname)
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
        dl, budget = self._budget()
        status, value = self._run(
            self._invoke, "build_headers", b"headers", b"build_headers", dl, budget,
            meta_json.encode("utf-8", "replace"), None,
        )
        return self._result("build_headers", status, value, allow_nil=True, expect="a table")

    def call_error(self, status: int, body: bytes) -> str | None:
        """Call ``adapter.transform_error(status, body)``; a JSON object text or None."""
        dl, budget = self._budget()
        status_, value = self._run(
            self._invoke, "transform_error", b"error", b"transform_error", dl, budget, status, body,
        )
        return self._result("transform_error", status_, value, allow_nil=True, expect="a table")

    def call_url(self, model: str, stream: bool) -> str | None:
        """Call ``adapter.build_url(model, stream)``; returns a string or None."""
        dl, budget = self._budget()
        status, value = self._run(
            self._invoke, "build_url", b"url", b"build_url", dl, budget, model.encode(), stream
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
