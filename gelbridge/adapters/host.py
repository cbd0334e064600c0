"""``Adapter``: one loaded adapter script and its pool of sandboxed runtimes.

Each call borrows a runtime from the adapter's own pool (never shared with another
adapter), so concurrent calls from different threads run in parallel (lupa releases
the GIL while Lua runs). A runtime that hit a limit is thrown away and replaced.
Scripts must be stateless between calls: consecutive calls, even chunks of one
stream, may run in different runtimes.
"""

from __future__ import annotations

import json
import queue
import threading
from contextlib import contextmanager
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from gelbridge.adapters.hostapi import AdapterServices
from gelbridge.adapters.sandbox import LuaSandbox, SandboxLimits
from gelbridge.errors import AdapterError

DEFAULT_ENDPOINT = "/chat/completions"
POOL_WAIT_SECONDS = 30.0


class _RuntimePool:
    """Up to ``size`` runtimes, each running the same script; created on demand."""

    def __init__(self, name: str, source: bytes, chunkname: str, limits: SandboxLimits,
                 services: AdapterServices, first: LuaSandbox) -> None:
        self._name = name
        self._source = source
        self._chunkname = chunkname
        self._limits = limits
        self._services = services
        self._idle: queue.LifoQueue[LuaSandbox] = queue.LifoQueue()
        self._idle.put(first)
        self._created = 1
        self._lock = threading.Lock()

    def _new(self) -> LuaSandbox:
        rt = LuaSandbox(self._name, self._limits, self._services)
        rt.load_script(self._source, self._chunkname)
        return rt

    @contextmanager
    def runtime(self) -> Iterator[LuaSandbox]:
        rt = self._acquire()
        try:
            yield rt
        finally:
            self._release(rt)

    def _acquire(self) -> LuaSandbox:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
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
        try:
            return self._idle.get(timeout=POOL_WAIT_SECONDS)
        except queue.Empty:
            raise AdapterError(
                f"adapter {self._name!r}: all {self._limits.pool_size} runtimes stayed busy for "
                f"{POOL_WAIT_SECONDS:g} s; raise [adapters] pool_size or check the script for slow calls"
            ) from None

    def _release(self, rt: LuaSandbox) -> None:
        if rt.broken:
            with self._lock:
                self._created -= 1
            return
        self._idle.put(rt)


class Adapter:
    """A loaded adapter: metadata plus the ADAPTER.md string-in/string-out calls."""

    def __init__(self, *, name: str, version: str, endpoint: str, headers: dict[str, str],
                 source: Path, functions: Mapping[str, bool], pool: _RuntimePool) -> None:
        self.name = name
        self.version = version
        self.endpoint = endpoint
        self.headers = headers
        self.source = source
        self._functions = dict(functions)
        self._pool = pool

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

    def transform_request(self, request_json: str) -> str:
        """CompletionRequest JSON → the provider's request body."""
        with self._pool.runtime() as rt:
            return rt.call_string("transform_request", request_json)

    def transform_response(self, raw: str) -> str:
        """Provider response body → CompletionResponse JSON."""
        with self._pool.runtime() as rt:
            return rt.call_string("transform_response", raw)

    def transform_stream_chunk(self, raw_line: str) -> str:
        """One SSE ``data:`` payload → StreamChunk JSON, or ``""`` (see ADAPTER.md)."""
        if not self.has_stream_transform:
            raise AdapterError(f"adapter {self.name!r} has no transform_stream_chunk")
        with self._pool.runtime() as rt:
            return rt.call_string("transform_stream_chunk", raw_line)

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
        path: str | None = None
        if self.has_build_url:
            with self._pool.runtime() as rt:
                path = rt.call_url(model, stream)
        if path is None:
            path = self.endpoint or DEFAULT_ENDPOINT
        path = path.replace("{model}", quote(model, safe=""))
        if not path.startswith("/"):
            raise AdapterError(
                f"adapter {self.name!r}: the endpoint {path[:80]!r} must be a path starting with '/'"
            )
        return base_url.rstrip("/") + path


def load_adapter(path: Path, *, limits: SandboxLimits, allow_hosts: Mapping[str, list[str]]) -> Adapter:
    """Read, run and check one script (raises ``AdapterLoadError``/``SandboxViolation``).

    ``allow_hosts`` maps adapter names to the hosts their ``http_*`` may reach.
    """
    from gelbridge.errors import AdapterLoadError

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
    pool = _RuntimePool(name, source, chunkname, limits, services, first)
    return Adapter(
        name=name,
        version=str(meta.get("version") or ""),
        endpoint=str(meta.get("endpoint") or DEFAULT_ENDPOINT),
        headers=dict(meta.get("headers") or {}),
        source=path,
        functions=meta.get("functions") or {},
        pool=pool,
    )
