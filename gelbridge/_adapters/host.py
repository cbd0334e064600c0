"""``Adapter``: one loaded adapter script and its pool of sandboxed runtimes.

Each call borrows a runtime from the adapter's own pool (never shared with another
adapter), so concurrent calls from different threads run in parallel (lupa releases
the GIL while Lua runs). A runtime that hit a limit is thrown away and replaced.
Scripts must be stateless between calls, except within one stream: a
``StreamSession`` keeps one ``state`` table (the second argument of
``transform_stream_chunk``) for all chunks of a stream, in a runtime it shares with up
to ``streams_per_runtime`` other streams of the same adapter (a stream lasts tens of
seconds: a runtime each would mean a thousand Lua states for a thousand streams, each
cold in the CPU's caches and compiling its own traces; ``scripts/bench_scale.py``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from gelbridge._adapters.ids import ToolCallIdRule
from gelbridge._adapters.sandbox import LuaSandbox, SandboxLimits, TextPiece
from gelbridge._adapters.script_services import AdapterServices
from gelbridge._errors import AdapterError

DEFAULT_ENDPOINT = "/chat/completions"
POOL_WAIT_SECONDS = 30.0


class _StreamHost:
    """A runtime that holds the ``state`` tables of several streams (lupa runs one call
    into a runtime at a time)."""

    __slots__ = ("rt", "sessions")

    def __init__(self, rt: LuaSandbox) -> None:
        self.rt = rt
        self.sessions = 0


class _RuntimePool:
    """Up to ``size`` runtimes, each running the same script; created on demand.

    The idle runtimes are a plain list: ``list.pop``/``list.append`` are atomic
    under the GIL, so the common case (a runtime is idle) takes no lock, which
    matters at ~2 µs per Lua call. The condition variable is touched only when a
    caller has to wait for a runtime.
    """

    def __init__(self, name: str, source: bytes, chunkname: str, limits: SandboxLimits,
                 services: AdapterServices, first: LuaSandbox) -> None:
        self._name = name
        self._source = source
        self._chunkname = chunkname
        self._limits = limits
        self._services = services
        self._idle: list[LuaSandbox] = [first]
        self._created = 1
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self._waiters = 0
        self._hosts: list[_StreamHost] = []  # the stream runtimes, fullest first
        self.stream_runtimes_created = 0

    def _new(self) -> LuaSandbox:
        rt = LuaSandbox(self._name, self._limits, self._services)
        rt.load_script(self._source, self._chunkname)
        return rt

    def call(self, fname: str, arg: str | bytes) -> str:
        """``adapter.<fname>(arg)`` on an idle runtime (the hot path of every request)."""
        try:
            rt = self._idle.pop()
        except IndexError:
            rt = self._acquire()
        try:
            return rt.call_string(fname, arg)
        finally:
            self._release(rt)

    @contextmanager
    def runtime(self) -> Iterator[LuaSandbox]:
        rt = self._acquire()
        try:
            yield rt
        finally:
            self._release(rt)

    def _acquire(self) -> LuaSandbox:
        # A broken runtime is dropped on release without waking waiters, so a waiter
        # re-checks whether it may grow the pool every short interval (bounded overall).
        deadline = time.monotonic() + POOL_WAIT_SECONDS
        while True:
            try:
                return self._idle.pop()
            except IndexError:
                pass
            with self._lock:
                grow = self._created < self._limits.pool_size
                if grow:
                    self._created += 1
            if grow:
                try:
                    return self._new()
                except BaseException:
                    with self._lock:
                        self._created -= 1
                    raise
            left = deadline - time.monotonic()
            if left <= 0:
                raise AdapterError(
                    f"adapter {self._name!r}: all {self._limits.pool_size} runtimes stayed busy for "
                    f"{POOL_WAIT_SECONDS:g} s; raise [adapters] pool_size or check the script for slow calls"
                )
            with self._freed:
                self._waiters += 1
                try:
                    # Re-checked under the lock: a release between the pop above and
                    # here notifies only once we wait (it needs the lock to notify).
                    if not self._idle:
                        self._freed.wait(timeout=min(0.05, left))
                finally:
                    self._waiters -= 1

    def _release(self, rt: LuaSandbox) -> None:
        if rt.broken:
            with self._lock:
                self._created -= 1
            return
        self._idle.append(rt)
        if self._waiters:
            with self._freed:
                self._freed.notify()

    def enter_stream(self) -> _StreamHost:
        """A stream runtime with room for one more stream (a new one when all are full).

        Stream runtimes are apart from the call pool: a stream holds its place between
        chunks while the event loop serves other calls, so streams never make an ordinary
        call wait. Never blocks beyond making one runtime."""
        cap = self._limits.streams_per_runtime
        with self._lock:
            for host in self._hosts:
                if host.sessions < cap and not host.rt.broken:
                    host.sessions += 1
                    return host
        host = _StreamHost(self._new())
        host.sessions = 1
        with self._lock:
            self._hosts.append(host)
            self.stream_runtimes_created += 1
        return host

    def leave_stream(self, host: _StreamHost) -> None:
        """One stream ended: a broken runtime, or an empty one beside another, goes."""
        with self._lock:
            host.sessions -= 1
            if host.rt.broken or (host.sessions == 0 and len(self._hosts) > 1):
                try:
                    self._hosts.remove(host)
                except ValueError:
                    pass


AUTH_STYLES = ("bearer", "x-api-key", "x-goog-api-key", "none")
FORMATS = ("completion", "lux-ir-v1")
STREAM_FORMATS = ("sse", "ndjson")


@dataclass(frozen=True)
class AdapterOptions:
    """Optional metadata fields beyond ADAPTER.md (all additive; defaults shown)."""

    format: str = "completion"
    """``completion`` (ADAPTER.md) or ``lux-ir-v1`` (Lux IR in and out)."""
    stream_endpoint: str | None = None
    """Path for streaming requests (default: ``endpoint``)."""
    stream_format: str = "sse"
    """``sse`` or ``ndjson`` (Ollama's native API)."""
    auth: str | None = None
    """bearer | x-api-key | x-goog-api-key | none; None: by adapter name (transport)."""
    tool_call_id: ToolCallIdRule | None = None
    """Which tool-call ids the provider accepts; others are mapped (``_adapters/ids.py``)."""
    native_tools: frozenset[str] = frozenset()
    """Lux tool kinds the provider runs itself that the script can send (``web_search``)."""
    provider_state_errors: frozenset[str] = frozenset()
    """Provider error codes meaning "the opaque state (provider_data) you sent back is not
    valid here": the client sends the request once more without any provider_data."""
    probe: str | Literal[False] | None = None
    """What ``gelbridge check`` asks the provider (``_adapters/probe.py``): a path GET
    (relative to base_url) that answers 2xx for a valid key, False for nothing, None:
    the built-in family's probe for a built-in name, else a plain reach of base_url."""


class StreamSession:
    """One ``state`` table for a whole stream, in a runtime shared with other streams.

    ``chunk(data)`` calls ``transform_stream_chunk(data, state)``: ADAPTER.md scripts
    ignore the second argument, ``lux-ir-v1`` scripts keep per-stream state in it. It
    returns the script's JSON text ("" for no event) or, for Lux output, the one text
    delta that text encodes (``TextPiece``, ``LuaSandbox.open_stream``); it is the
    sandbox's closure itself, with no method frame around it (it runs once a chunk). A
    sandbox limit that any stream on the runtime hits ends the runtime, and with it the
    streams on it (each with a clear error; ``streams_per_runtime = 1`` isolates every
    stream). Not thread-safe (one stream = one consumer). ``close()`` leaves the runtime.
    """

    __slots__ = ("_adapter", "_pool", "_host", "chunk")

    def __init__(self, adapter: Adapter) -> None:
        if not adapter.has_stream_transform:
            raise AdapterError(f"adapter {adapter.name!r} has no transform_stream_chunk")
        self._adapter = adapter
        self._pool = adapter._pool
        host = self._pool.enter_stream()
        self._host: _StreamHost | None = host
        try:
            # The sandbox's closure itself (no method frame around it): once per chunk.
            self.chunk: Callable[[str], str | TextPiece] = host.rt.open_stream(
                "transform_stream_chunk", typed=adapter.format == "lux-ir-v1")
        except BaseException:
            self._host = None
            self._pool.leave_stream(host)
            raise

    def _closed(self, data: str) -> str | TextPiece:
        raise AdapterError(f"adapter {self._adapter.name!r}: stream session already closed")

    def close(self) -> None:
        host, self._host = self._host, None
        if host is not None:
            self.chunk = self._closed  # the state table goes with the runtime's next cycle
            self._pool.leave_stream(host)

    def __enter__(self) -> StreamSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Adapter:
    """A loaded adapter: metadata plus the ADAPTER.md string-in/string-out calls."""

    def __init__(self, *, name: str, version: str, endpoint: str, headers: dict[str, str],
                 source: Path, functions: Mapping[str, bool], pool: _RuntimePool,
                 options: AdapterOptions | None = None) -> None:
        self.name = name
        self.version = version
        self.endpoint = endpoint
        self.headers = headers
        self.source = source
        self._functions = dict(functions)
        self._pool = pool
        self.options = options or AdapterOptions()

    @property
    def format(self) -> str:
        """``completion`` (ADAPTER.md) or ``lux-ir-v1``."""
        return self.options.format

    def path_for(self, model: str, stream: bool) -> str:
        """The request path (``{model}`` not yet replaced): ``build_url(model, stream)``
        if the script defines it and returns a string, else ``stream_endpoint`` for
        streams (when set), else ``endpoint``. Must start with ``/``."""
        path: str | None = None
        if self.has_build_url:
            with self._pool.runtime() as rt:
                path = rt.call_url(model, stream)
        if path is None:
            path = (self.options.stream_endpoint if stream and self.options.stream_endpoint
                    else self.endpoint) or DEFAULT_ENDPOINT
        if not path.startswith("/"):
            raise AdapterError(
                f"adapter {self.name!r}: the endpoint {path[:80]!r} must be a path starting with '/'"
            )
        return path

    def stream_session(self) -> StreamSession:
        """A fresh ``state`` table for a whole stream, in a shared stream runtime (close it!)."""
        return StreamSession(self)

    def __repr__(self) -> str:
        return f"Adapter({self.name!r}, version={self.version!r}, source={str(self.source)!r})"

    @property
    def has_stream_transform(self) -> bool:
        return self._functions.get("transform_stream_chunk", False)

    @property
    def has_build_headers(self) -> bool:
        return self._functions.get("build_headers", False)

    @property
    def has_build_url(self) -> bool:
        return self._functions.get("build_url", False)

    @property
    def has_transform_error(self) -> bool:
        return self._functions.get("transform_error", False)

    def transform_error(self, status: int, body: bytes) -> dict[str, str] | None:
        """The optional ``transform_error(status, body)`` hook: what a provider's error
        answer means (``kind``, ``message``, ``code``, each optional), or None when the
        hook is absent or returns nil: the host's own parsing of common error shapes
        then applies (``transport.error_from_response``)."""
        if not self.has_transform_error:
            return None
        with self._pool.runtime() as rt:
            out = rt.call_error(status, body)
        return None if out is None else {str(k): str(v) for k, v in json.loads(out).items()}

    def transform_request(self, request_json: str | bytes) -> str:
        """CompletionRequest JSON (text, or UTF-8 bytes) → the provider's request body."""
        return self._pool.call("transform_request", request_json)

    def transform_response(self, raw: str | bytes) -> str:
        """Provider response body (text, or UTF-8 bytes) → CompletionResponse JSON."""
        return self._pool.call("transform_response", raw)

    def transform_stream_chunk(self, raw_line: str) -> str:
        """One SSE ``data:`` payload → StreamChunk JSON, or ``""`` (see ADAPTER.md)."""
        if not self.has_stream_transform:
            raise AdapterError(f"adapter {self.name!r} has no transform_stream_chunk")
        return self._pool.call("transform_stream_chunk", raw_line)

    def build_headers(self, meta: Mapping[str, Any]) -> dict[str, str] | None:
        """Dynamic headers from the optional ``build_headers(meta)`` hook.

        ``meta`` is passed as a table (typically url, method, body, timestamp,
        source={name}); the caller leaves out ``api_key`` unless the provider sets
        ``pass_api_key_to_script``. Returns None when the hook is absent or returns
        nil: the caller then uses the static ``headers``.
        """
        if not self.has_build_headers:
            return None
        with self._pool.runtime() as rt:
            out = rt.call_headers(json.dumps(dict(meta), ensure_ascii=False))
        return None if out is None else {str(k): str(v) for k, v in json.loads(out).items()}

    def url(self, base_url: str, model: str, stream: bool = False) -> str:
        """Full request URL: ``base_url`` (trailing ``/`` removed) + the path.

        The path comes from ``build_url(model, stream)`` when the script defines it
        and returns a string, else from ``endpoint`` (default ``/chat/completions``).
        ``{model}`` in either is replaced by the URL-quoted model id. The path must
        start with ``/`` (a query string is allowed): an adapter cannot send the
        request, and the key, to another host.
        """
        path = self.path_for(model, stream).replace("{model}", quote(model, safe=""))
        return base_url.rstrip("/") + path


def load_adapter(path: Path, *, limits: SandboxLimits, allow_hosts: Mapping[str, list[str]]) -> Adapter:
    """Read, run and check one script (raises ``AdapterLoadError``/``SandboxViolation``).

    ``allow_hosts`` maps adapter names to the hosts their ``http_*`` may reach.
    """
    from gelbridge._errors import AdapterLoadError

    try:
        size = path.stat().st_size
        if size > limits.max_script_bytes:
            raise AdapterLoadError(
                f"{path}: {size} bytes is larger than the {limits.max_script_bytes}-byte script limit"
            )
        source = path.read_bytes()
    except OSError as e:
        raise AdapterLoadError(f"{path}: cannot read: {e.strerror}") from None
    chunkname = path.name
    services = AdapterServices(path.stem)
    first = LuaSandbox(path.stem, limits, services)
    meta = first.load_script(source, chunkname)
    name = meta.get("name") or path.stem
    # The name is known only after the script ran: bind logging and http to it now.
    services.rebind(name, allow_hosts.get(name, ()))
    first.adapter = name
    options = _read_options(source, chunkname, limits, services, f"{path.name}")
    pool = _RuntimePool(name, source, chunkname, limits, services, first)
    return Adapter(
        name=name,
        version=str(meta.get("version") or ""),
        endpoint=str(meta.get("endpoint") or DEFAULT_ENDPOINT),
        headers=dict(meta.get("headers") or {}),
        source=path,
        functions=meta.get("functions") or {},
        pool=pool,
        options=options,
    )


# The sandbox reports only name/version/endpoint/headers/functions. The optional
# fields are read once at load time in a throw-away runtime that runs the script
# wrapped so that its table gains one extra function returning them as JSON; the
# pooled runtimes run the script unchanged. Line numbers are kept (same first line).
_META_HEAD = "local __gelbridge_a = (function(...) "
_META_TAIL = """
end)(...)
if type(__gelbridge_a) == "table" then
  local a = __gelbridge_a
  local ok, s = pcall(json.encode, json.object({ format = a.format, stream_endpoint = a.stream_endpoint,
    stream_format = a.stream_format, auth = a.auth, tool_call_id = a.tool_call_id,
    provider_state_errors = a.provider_state_errors, native_tools = a.native_tools, probe = a.probe }))
  rawset(a, "__gelbridge_meta", function() if ok then return s end return "!" .. tostring(s) end)
end
return __gelbridge_a
"""
_META_KEYS = ("format", "stream_endpoint", "stream_format", "auth", "tool_call_id", "provider_state_errors",
              "native_tools", "probe")


def _read_options(source: bytes, chunkname: str, limits: SandboxLimits, services: AdapterServices,
                  where: str) -> AdapterOptions:
    from gelbridge._errors import AdapterLoadError

    if not any(k.encode() in source for k in _META_KEYS):
        return AdapterOptions()  # none of the optional fields is mentioned: defaults
    rt = LuaSandbox(services.adapter, limits, services)
    rt.load_script(_META_HEAD.encode() + source + _META_TAIL.encode(), chunkname)
    raw = rt.call_string("__gelbridge_meta", "")
    if raw.startswith("!"):
        raise AdapterLoadError(f"{where}: optional adapter fields cannot be read: {raw[1:200]}")
    meta = json.loads(raw) if raw else {}
    if not isinstance(meta, dict):
        meta = {}
    fmt = meta.get("format") or "completion"
    if fmt not in FORMATS:
        raise AdapterLoadError(f"{where}: adapter.format must be one of {list(FORMATS)}, not {str(fmt)[:40]!r}")
    se = meta.get("stream_endpoint")
    if se is not None and (not isinstance(se, str) or not se.startswith("/")):
        raise AdapterLoadError(f"{where}: adapter.stream_endpoint must be a path starting with '/'")
    sf = meta.get("stream_format") or "sse"
    if sf not in STREAM_FORMATS:
        raise AdapterLoadError(f"{where}: adapter.stream_format must be 'sse' or 'ndjson'")
    auth = meta.get("auth")
    if auth is not None and auth not in AUTH_STYLES:
        raise AdapterLoadError(f"{where}: adapter.auth must be one of {list(AUTH_STYLES)}")
    rule = ToolCallIdRule.from_script(meta.get("tool_call_id"), where)
    codes = meta.get("provider_state_errors")
    if codes is None or codes == {}:  # an empty Lua table reads as an empty object
        codes = []
    if not isinstance(codes, list) or not all(isinstance(c, str) and 0 < len(c) <= 100 for c in codes):
        raise AdapterLoadError(f"{where}: adapter.provider_state_errors must be a list of error code strings")
    native = meta.get("native_tools")
    if native is None or native == {}:
        native = []
    if not isinstance(native, list) or not all(isinstance(c, str) and c in NATIVE_TOOL_KINDS for c in native):
        raise AdapterLoadError(f"{where}: adapter.native_tools must be a list of {sorted(NATIVE_TOOL_KINDS)}")
    probe = meta.get("probe")
    if probe is not None and probe is not False and not (isinstance(probe, str) and probe.startswith("/")):
        raise AdapterLoadError(f"{where}: adapter.probe must be a path starting with '/' (a GET that needs the "
                               "key), or false for none")
    return AdapterOptions(format=fmt, stream_endpoint=se, stream_format=sf, auth=auth, tool_call_id=rule,
                          provider_state_errors=frozenset(codes), native_tools=frozenset(native), probe=probe)


#: the Lux tool kinds an adapter may declare in ``native_tools``
NATIVE_TOOL_KINDS = frozenset({"web_search"})
