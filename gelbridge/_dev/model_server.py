"""Local HTTP server speaking the real wire formats of the major model providers.

Used by tests, benchmarks and `gelbridge demo` as the "local model endpoint". One server
serves every provider route; what the "model" answers is a provider-neutral FIFO script
of `Turn`s and failure items (see `_wire_common`), rendered per provider by the pure
`_wire_*` modules. With an empty script it is a deterministic echo model, or whatever
its `responder` answers (`responder(Mode.TOOLS)`: the tool mode of `gelbridge dev model`).

Routes (any path prefix is accepted where noted, for OpenAI-compatible hosts):
  POST .../chat/completions                       OpenAI Chat Completions (SSE when stream)
  POST .../responses                              OpenAI Responses (typed SSE events when stream)
  POST .../v1/messages                            Anthropic Messages (SSE when stream)
  POST /{v1,v1beta,v1alpha}/models/{m}:generateContent          Gemini
  POST /{v1,v1beta,v1alpha}/models/{m}:streamGenerateContent    Gemini (?alt=sse or JSON array)
  POST /api/chat                                  Ollama (NDJSON unless "stream": false)
  GET  /api/tags, /api/version, /; POST /api/show Ollama discovery
  GET  .../models, .../models/{m}                 OpenAI (and DeepSeek, OpenRouter) model list and model
  GET  .../v1/models, .../v1/models/{m}           Anthropic (with anthropic-version or x-api-key)
  GET  /{v1,v1beta,v1alpha}/models[/{m}]          Gemini (v1: with x-goog-api-key or ?key=)
  GET  .../key                                    OpenRouter's key check

`models` names what the listings offer and the lookups find; None (the default): the
echo model answers any id, so every lookup finds it and the listings name `echo`.
Given, a chat request for another model gets the provider's 404 too. Every route answers
a wrong key with the provider's own 401 shape (OpenAI ``invalid_api_key``, Anthropic
``authentication_error``, Google ``UNAUTHENTICATED``, OpenRouter's ``{"code": 401}``).

The server is a stdlib `ThreadingHTTPServer` running in a background thread (one
thread per client connection, HTTP/1.1 keep-alive), so it works from synchronous tests
and from asyncio code in the same process alike.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import ModuleType
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from gelbridge._dev import (
    _wire_anthropic,
    _wire_gemini,
    _wire_ollama,
    _wire_openai,
    _wire_openai_responses,
    _wire_openrouter,
)
from gelbridge._dev._prompt_cache import CacheUse, PromptCache
from gelbridge._dev._tool_mode import Mode, tool_turn
from gelbridge._dev._wire_common import (
    Citation,
    CutStream,
    Delay,
    Fail,
    Item,
    MalformedBody,
    MidStreamError,
    Script,
    ToolCall,
    Turn,
    WireContext,
    echo_turn,
    last_user_text,
    prompt_text,
)

__all__ = [
    "Citation",
    "CutStream",
    "Delay",
    "Fail",
    "Item",
    "MalformedBody",
    "MidStreamError",
    "Mode",
    "ModelServer",
    "RecordedRequest",
    "Script",
    "ToolCall",
    "Turn",
    "last_user_text",
    "responder",
]

_SECRET_HEADERS = frozenset({"authorization", "x-api-key", "x-goog-api-key", "api-key"})
_REDACTED = "<redacted>"
_GEMINI_PATH = re.compile(
    r"^/(?:v1|v1beta|v1alpha)/((?:models|tunedModels)/[^:]+):(generateContent|streamGenerateContent)$"
)
_GEMINI_MODELS = re.compile(r"^/(v1|v1beta|v1alpha)/models(?:/([^:/]+))?$")
_ANTHROPIC_MODELS = re.compile(r"^(.*?)/v1/models(?:/(.+))?$")
_OPENAI_MODELS = re.compile(r"^(.*?)/models(?:/(.+))?$")


@dataclass(frozen=True)
class RecordedRequest:
    """What an adapter sent. Auth header values and `?key=` are replaced by "<redacted>"."""

    provider: str  # "openai" | "anthropic" | "gemini" | "ollama" | "other"
    method: str
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]  # lower-case names
    body: Any  # parsed JSON, or the raw text when it was not JSON, or None
    stream: bool = False
    received_at: float = field(default=0.0, compare=False)


Responder = Callable[[RecordedRequest], Item]

def responder(mode: Mode, chunk_delay: float = 0.0) -> Responder:
    """The answer of ``mode`` to every request, streamed with ``chunk_delay`` seconds
    between frames."""
    make = tool_turn if Mode(mode) is Mode.TOOLS else echo_turn

    def answer(req: RecordedRequest) -> Item:
        return replace(make(req.body), chunk_delay=chunk_delay)

    return answer


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    owner: ModelServer


class ModelServer:
    """Scripted multi-provider model endpoint on 127.0.0.1.

    Args:
      host, port: bind address; port 0 picks a free port (see `.url` after `start()`).
      api_key: when set, every provider route requires it in that provider's auth header
        (Bearer / x-api-key / x-goog-api-key or ?key=) and answers 401 otherwise.
      script: initial FIFO items (more via `enqueue`).
      chunk_size: default characters per streamed fragment (Turn.chunk_size overrides).
      responder: builds the answer when the script is empty (default: echo model).
      openai_reasoning_field: how OpenAI-format answers carry `Turn.reasoning`:
        "reasoning_content" (DeepSeek), "reasoning" (OpenRouter/vLLM style),
        "think_tags" (inline `<think>...</think>` in content) or "omit".
      gemini_call_ids: include `id` in Gemini functionCall parts.
      reasoning_details: OpenAI-format answers also carry OpenRouter's `reasoning_details`
        (a reasoning.text entry with `Turn.reasoning_signature`, a reasoning.encrypted
        one with `Turn.redacted_reasoning`; streamed in pieces by index).
      record_requests: keep every request in `.requests` (turn off for long benchmarks).
      models: the model ids this server offers (listings, lookups and chat); None: any.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        script: Script = (),
        chunk_size: int = 16,
        responder: Responder | None = None,
        openai_reasoning_field: str = "reasoning_content",
        gemini_call_ids: bool = True,
        reasoning_details: bool = False,
        record_requests: bool = True,
        models: Sequence[str] | None = None,
    ) -> None:
        if chunk_size < 1:
            raise ValueError("chunk_size must be at least 1")
        self.host = host
        self._port = port
        self.api_key = api_key
        self.chunk_size = chunk_size
        self.responder = responder
        self.openai_reasoning_field = openai_reasoning_field
        self.prompt_cache = PromptCache()  # the providers' caching rules over what this server saw
        self.gemini_call_ids = gemini_call_ids
        self.reasoning_details = reasoning_details
        self.record_requests = record_requests
        self.models = tuple(models) if models is not None else None
        self._lock = threading.Lock()
        self._queue: deque[Item] = deque(script)
        self._requests: list[RecordedRequest] = []
        self._discovery: list[RecordedRequest] = []
        self._seq = 0
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: dict[socket.socket, threading.Thread] = {}

    # ------------------------------------------------------------ lifecycle

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("ModelServer is not started; call start() first")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """Base URL without trailing slash, e.g. http://127.0.0.1:54321."""
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        """Started and serving (its thread alive)."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> ModelServer:
        if self._httpd is not None:
            return self
        self._stopping.clear()
        httpd = _HTTPServer((self.host, self._port), _Handler)
        httpd.owner = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
            name=f"model-server:{self.port}", daemon=True,
        )
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving; open connections are shut down. Bounded by `timeout` seconds."""
        httpd, thread = self._httpd, self._thread
        if httpd is None:
            return
        deadline = time.monotonic() + timeout
        self._stopping.set()  # wakes Delay/chunk_delay waits
        httpd.shutdown()
        with self._lock:
            conns = dict(self._connections)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        httpd.server_close()
        for t in [thread, *conns.values()]:
            if t is not None and t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))
        self._httpd = None
        self._thread = None

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> ModelServer:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)

    # ------------------------------------------------------------ scripting

    def enqueue(self, *items: Item) -> ModelServer:
        """Append answers to the FIFO script (shared by all routes)."""
        for item in items:
            if not isinstance(item, (Turn, Fail, MalformedBody, CutStream, MidStreamError, Delay)):
                raise TypeError(f"not a script item: {item!r}")
        with self._lock:
            self._queue.extend(items)
        return self

    @property
    def pending(self) -> int:
        """Number of scripted items not yet served."""
        with self._lock:
            return len(self._queue)

    @property
    def requests(self) -> list[RecordedRequest]:
        """Snapshot of every model call received so far (and calls to no route), oldest
        first; the discovery requests (listings, lookups, key checks) are in :attr:`discovery`."""
        with self._lock:
            return list(self._requests)

    @property
    def discovery(self) -> list[RecordedRequest]:
        """Snapshot of the discovery requests (what ``gelbridge check`` asks: model listings
        and lookups, OpenRouter's key check, Ollama's ``/api/show``), oldest first."""
        with self._lock:
            return list(self._discovery)

    def clear(self) -> None:
        """Forget recorded requests and pending script items."""
        with self._lock:
            self._requests.clear()
            self._discovery.clear()
            self._queue.clear()

    # ------------------------------------------------------------ internals used by the handler

    def _next_seq(self) -> int:
        with self._lock:
            self._seq += 1
            return self._seq

    def _record(self, req: RecordedRequest, *, discovery: bool = False) -> None:
        if self.record_requests:
            with self._lock:
                (self._discovery if discovery else self._requests).append(req)

    def _next_item(self, req: RecordedRequest) -> Item:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        if self.responder is not None:
            return self.responder(req)
        return echo_turn(req.body)

    def offers(self, model: str, *, ollama: bool = False) -> bool:
        """Whether ``model`` is one this server serves (Ollama: ``llama3`` is ``llama3:latest``)."""
        if self.models is None:
            return True
        if ollama:
            return _wire_ollama.full_name(model) in {_wire_ollama.full_name(m) for m in self.models}
        return model in self.models

    def listed(self, default: str = "echo") -> list[str]:
        """The ids the listings name."""
        return list(self.models) if self.models is not None else [default]

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._connections[conn] = threading.current_thread()
            else:
                self._connections.pop(conn, None)


#: which wire answers each discovery route (``_discovery_route``)
_DISCOVERY_WIRES: dict[str, ModuleType] = {
    "openai": _wire_openai, "anthropic": _wire_anthropic, "gemini": _wire_gemini, "ollama": _wire_ollama,
    "openrouter": _wire_openrouter,
}


def _discovery_route(path: str, headers: Mapping[str, str], query: Mapping[str, str]) -> tuple[str, str, str | None] | None:
    """``(provider, what, model id)`` of a GET discovery route (``what``: root, version,
    list, get or key), or None (404). The same path may be two providers' (``/v1/models``:
    OpenAI, Anthropic and Gemini v1): the headers tell them apart, as each provider's own
    SDK sends them."""
    from urllib.parse import unquote

    if path in ("/", "/api/version"):
        return "ollama", "root" if path == "/" else "version", None
    if path == "/api/tags":
        return "ollama", "list", None
    tell: dict[str, Callable[[re.Match[str]], bool]] = {  # whose route it is, when the path matches
        "gemini": lambda m: m.group(1) != "v1" or "x-goog-api-key" in headers or "key" in query,
        "anthropic": lambda m: "anthropic-version" in headers or "x-api-key" in headers,
        "openai": lambda m: not path.startswith(("/v1beta/", "/v1alpha/")),
    }
    routes: tuple[tuple[str, re.Pattern[str]], ...] = (
        ("gemini", _GEMINI_MODELS), ("anthropic", _ANTHROPIC_MODELS), ("openai", _OPENAI_MODELS))
    for provider, pattern in routes:
        found = pattern.match(path)
        if found and tell[provider](found):
            model = found.group(2)
            return provider, "get" if model else "list", unquote(model) if model else None
    if path.endswith("/key"):
        return "openrouter", "key", None
    return None


def _int(text: str | None, default: int) -> int:
    return int(text) if text is not None and text.isdigit() else default


def _redact(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: (_REDACTED if k in _SECRET_HEADERS else v) for k, v in headers.items()}


class _Handler(BaseHTTPRequestHandler):
    _headers_buffer: list[bytes]  # BaseHTTPRequestHandler's own (sent in one write below)
    protocol_version = "HTTP/1.1"
    server_version = "gelbridge-model-server/1"
    disable_nagle_algorithm = True
    timeout = 60  # idle keep-alive connections end after this many seconds
    server: _HTTPServer

    # -- connection bookkeeping so stop() can unblock idle keep-alive threads
    def setup(self) -> None:
        super().setup()
        self.server.owner._track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.owner._track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # quiet: request bodies may hold plaintext

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except (TimeoutError, BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # ------------------------------------------------------------ request parsing

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _headers(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.headers.items()}

    # ------------------------------------------------------------ GET routes

    def do_HEAD(self) -> None:
        self._send_bytes(200, b"", "text/plain; charset=utf-8")

    def do_GET(self) -> None:
        owner = self.server.owner
        url = urlsplit(self.path)
        path, query, headers = url.path, self._query(url.query), self._headers()
        safe_query = {k: (_REDACTED if k == "key" else v) for k, v in query.items()}
        req = RecordedRequest("other", "GET", path, safe_query, _redact(headers), None, received_at=time.time())
        route = _discovery_route(path, headers, query)
        if route is None:
            owner._record(req, discovery=True)
            self._send_json(404, {"error": {"message": f"no route for GET {path}", "code": 404}})
            return
        provider, what, model = route
        owner._record(replace(req, provider=provider), discovery=True)
        if what == "root":
            self._send_bytes(200, b"Ollama is running", "text/plain; charset=utf-8")
            return
        wire = _DISCOVERY_WIRES[provider]
        if owner.api_key and not wire.auth_ok(headers, query, owner.api_key):
            self._send_json(401, wire.error_body(401, self._auth_message(wire)))
            return
        if wire is _wire_anthropic and not headers.get("anthropic-version"):
            self._send_json(400, wire.error_body(400, "anthropic-version: header is required"))
            return
        status, answer = self._discovery_answer(provider, what, model, query)
        self._send_json(status, answer)

    def _discovery_answer(self, provider: str, what: str, model: str | None,
                          query: Mapping[str, str]) -> tuple[int, Any]:
        owner = self.server.owner
        if what == "key":
            return 200, _wire_openrouter.key_info()
        if what == "version":
            return 200, {"version": _wire_ollama.VERSION}
        if provider == "ollama":
            return 200, _wire_ollama.tags(owner.listed("echo:latest"))
        wire = _DISCOVERY_WIRES[provider]
        if model is not None:
            found = owner.offers(model)
            return (200, wire.model_info(model)) if found else (404, wire.model_not_found(model))
        if wire is _wire_anthropic:
            return 200, wire.model_list(owner.listed(), _int(query.get("limit"), 20))
        if wire is _wire_gemini:
            return 200, wire.model_list(owner.listed(), _int(query.get("pageSize"), 50), query.get("pageToken", ""))
        return 200, _wire_openai.model_list(owner.listed())

    # ------------------------------------------------------------ POST routes

    @staticmethod
    def _query(qs: str) -> dict[str, str]:
        return dict(parse_qsl(qs, keep_blank_values=True))

    def do_POST(self) -> None:
        owner = self.server.owner
        url = urlsplit(self.path)
        path, query, headers = url.path, self._query(url.query), self._headers()
        raw = self._read_body()
        try:
            body: Any = json.loads(raw) if raw else None
            bad_json = not isinstance(body, dict)
        except (ValueError, UnicodeDecodeError):
            body, bad_json = raw.decode("utf-8", "replace"), True
        safe_query = {k: (_REDACTED if k == "key" else v) for k, v in query.items()}

        wire: ModuleType
        model = body.get("model") if isinstance(body, dict) else None
        if path == "/api/show":
            self._show(path, safe_query, headers, body, str(model or ""))
            return
        gemini = _GEMINI_PATH.match(path)
        sse = True
        if gemini:
            wire, model = _wire_gemini, gemini.group(1).split("/", 1)[1]
            stream = gemini.group(2) == "streamGenerateContent"
            sse = query.get("alt") == "sse"
        elif _wire_openai.matches(path):
            wire = _wire_openai
            stream = not bad_json and _wire_openai.wants_stream(body)
        elif _wire_openai_responses.matches(path):
            wire = _wire_openai_responses
            stream = not bad_json and _wire_openai_responses.wants_stream(body)
        elif _wire_anthropic.matches(path):
            wire = _wire_anthropic
            stream = not bad_json and _wire_anthropic.wants_stream(body)
        elif path == "/api/chat":
            wire = _wire_ollama
            stream = bad_json or _wire_ollama.wants_stream(body)
        else:
            owner._record(RecordedRequest("other", "POST", path, safe_query, _redact(headers), body,
                                          received_at=time.time()))
            self._send_json(404, {"error": {"message": f"no route for POST {path}", "code": 404}})
            return

        req = RecordedRequest(wire.PROVIDER, "POST", path, safe_query, _redact(headers), body, stream,
                              received_at=time.time())
        owner._record(req)
        seq = owner._next_seq()
        extra = self._id_headers(wire, seq)

        if owner.api_key and not wire.auth_ok(headers, query, owner.api_key):
            self._send_json(401, wire.error_body(401, self._auth_message(wire)), extra)
            return
        if wire is _wire_anthropic and not headers.get("anthropic-version"):
            self._send_json(400, wire.error_body(400, "anthropic-version: header is required"), extra)
            return
        if bad_json:
            self._send_json(400, wire.error_body(400, "request body is not a JSON object"), extra)
            return
        if not owner.offers(str(model or ""), ollama=wire is _wire_ollama):
            missing = (_wire_openai.model_not_found(str(model)) if wire is _wire_openai_responses
                       else wire.model_not_found(str(model)))
            self._send_json(404, missing, extra)
            return

        item = owner._next_item(req)
        while isinstance(item, Delay):
            if owner._stopping.wait(item.seconds):
                self.close_connection = True
                return
            item = item.then if item.then is not None else echo_turn(body)

        use = self._cache_use(wire, str(model or ""), body)
        ctx = WireContext(
            model=str(model or "echo"),
            seq=seq,
            created=int(time.time()),
            prompt_text=prompt_text(body),
            chunk_size=owner.chunk_size,
            include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
            openai_reasoning_field=owner.openai_reasoning_field,
            gemini_call_ids=owner.gemini_call_ids,
            reasoning_details=owner.reasoning_details,
            encrypted_reasoning=_wire_openai_responses.ENCRYPTED_INCLUDE in (body.get("include") or ()),
            request_tools=tuple(body.get("tools") or ()) if isinstance(body.get("tools"), list) else (),
            prompt_tokens=use.prompt_tokens if use is not None else None,
            cached_tokens=use.read if use is not None else 0,
            cache_write_tokens=use.written if use is not None else 0,
        )
        self._serve_item(wire, item, ctx, body, stream, sse, extra)

    def _show(self, path: str, query: Mapping[str, str], headers: Mapping[str, str], body: Any, model: str) -> None:
        """Ollama's ``POST /api/show``: the model's details, or its 404 when it is not pulled."""
        owner = self.server.owner
        owner._record(RecordedRequest("ollama", "POST", path, query, _redact(headers), body, received_at=time.time()),
                      discovery=True)
        if owner.api_key and not _wire_ollama.auth_ok(headers, query, owner.api_key):
            self._send_json(401, _wire_ollama.error_body(401, "unauthorized"))
        elif not model:
            self._send_json(400, _wire_ollama.error_body(400, "model is required"))
        elif not owner.offers(model, ollama=True):
            self._send_json(404, _wire_ollama.model_not_found(model))
        else:
            self._send_json(200, _wire_ollama.show(model))

    def _cache_use(self, wire: ModuleType, model: str, body: dict[str, Any]) -> CacheUse | None:
        cache = self.server.owner.prompt_cache
        if wire is _wire_anthropic:
            return cache.anthropic(body, time.monotonic())
        if wire is _wire_openai or wire is _wire_openai_responses:
            return cache.openai(body)
        if wire is _wire_gemini:
            return cache.gemini(model, body)
        return None

    @staticmethod
    def _auth_message(wire: ModuleType) -> str:
        return {
            _wire_openai: "Incorrect API key provided. Set the key the local model server was started with.",
            _wire_openai_responses: "Incorrect API key provided. Set the key the local model server was started "
                                    "with.",
            _wire_anthropic: "invalid x-api-key",
            _wire_gemini: "API key not valid. Please pass a valid API key.",
            _wire_openrouter: "User not found.",
        }.get(wire, "unauthorized")

    @staticmethod
    def _id_headers(wire: ModuleType, seq: int) -> dict[str, str]:
        if wire is _wire_anthropic:
            return {"request-id": f"req_{seq:06d}"}
        if wire is _wire_openai or wire is _wire_openai_responses:
            return {"x-request-id": f"req_{seq:06d}"}
        return {}

    def _serve_item(self, wire: ModuleType, item: Item, ctx: WireContext, body: dict[str, Any],
                    stream: bool, sse: bool, extra: dict[str, str]) -> None:
        if isinstance(item, Fail) or (isinstance(item, MidStreamError) and not stream):
            status = item.status
            headers = dict(extra)
            retry_after = getattr(item, "retry_after", None)
            if retry_after is not None:
                headers["Retry-After"] = f"{retry_after:g}"
                headers["retry-after-ms"] = str(int(retry_after * 1000))
            code = getattr(item, "code", None)
            error = wire.error_body(status, item.message, code) if code else wire.error_body(status, item.message)
            if wire is _wire_anthropic and "request-id" in extra:
                error["request_id"] = extra["request-id"]
            self._send_json(status, error, headers)
            return
        if isinstance(item, MalformedBody):
            if stream:
                self._send_stream(self._stream_type(wire, sse), [wire.malformed_frame(item.body)], 0.0, extra)
            else:
                self._send_bytes(200, item.body.encode(), "application/json", extra)
            return
        if isinstance(item, Turn):
            turn = item
        elif isinstance(item, (CutStream, MidStreamError)):
            turn = item.turn or echo_turn(body)
        else:  # a Delay was unwrapped before: nothing else reaches here
            turn = echo_turn(body)
        if not stream:
            payload = json.dumps(wire.render(turn, ctx), ensure_ascii=False).encode()
            if isinstance(item, CutStream):
                self._send_cut_body(payload, extra)
            else:
                self._send_bytes(200, payload, "application/json", extra)
            return
        frames = wire.render_stream(turn, ctx, sse=sse) if wire is _wire_gemini else wire.render_stream(turn, ctx)
        if isinstance(item, CutStream):
            self._send_stream(self._stream_type(wire, sse), frames[: item.after_chunks], turn.chunk_delay, extra,
                              cut=True)
        elif isinstance(item, MidStreamError):
            frames = frames[: item.after_chunks] + [wire.stream_error_frame(item.status, item.message)]
            self._send_stream(self._stream_type(wire, sse), frames, turn.chunk_delay, extra)
        else:
            self._send_stream(self._stream_type(wire, sse), frames, turn.chunk_delay, extra)

    @staticmethod
    def _stream_type(wire: ModuleType, sse: bool) -> str:
        if wire is _wire_gemini and not sse:
            return _wire_gemini.ARRAY_CONTENT_TYPE
        return str(wire.STREAM_CONTENT_TYPE)

    # ------------------------------------------------------------ response writing

    def _start(self, status: int, content_type: str, headers: Mapping[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for k, v in headers.items():
            self.send_header(k, v)

    def _send_bytes(self, status: int, payload: bytes, content_type: str,
                    headers: Mapping[str, str] | None = None) -> None:
        self._start(status, content_type, headers or {})
        self.send_header("Content-Length", str(len(payload)))
        # headers and body in one send: halves syscalls per answer (matters in benchmarks)
        self._headers_buffer.append(b"\r\n")
        if self.command != "HEAD":
            self._headers_buffer.append(payload)
        self.flush_headers()

    def _send_json(self, status: int, obj: Any, headers: Mapping[str, str] | None = None) -> None:
        self._send_bytes(status, json.dumps(obj, ensure_ascii=False).encode(), "application/json", headers)

    def _send_cut_body(self, payload: bytes, headers: Mapping[str, str]) -> None:
        """Announce the full length, send half, drop the connection."""
        self._start(200, "application/json", headers)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload[: len(payload) // 2])
        self._drop()

    def _send_stream(self, content_type: str, frames: Iterable[bytes], delay: float,
                     headers: Mapping[str, str], *, cut: bool = False) -> None:
        """Chunked transfer encoding, one HTTP chunk per frame; `cut` drops the
        connection instead of sending the terminating chunk."""
        stopping = self.server.owner._stopping
        self._start(200, content_type, headers)
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i, frame in enumerate(frames):
            if i and delay > 0 and stopping.wait(delay):
                cut = True
                break
            self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
        if cut:
            self._drop()
        else:
            self.wfile.write(b"0\r\n\r\n")

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
