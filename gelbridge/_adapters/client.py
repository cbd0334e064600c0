"""``ModelClient``: one Lux IR request → provider over HTTP through a Lua adapter → Lux IR response.

One ``AdapterRegistry`` and one ``ProviderTransport`` per provider, created once and
reused for every call (connection pooling; scripts are loaded once). Lua calls are
synchronous CPU work of about 10 µs per chunk, so they run inline on the event loop;
only very large bodies (≥ ``THREAD_THRESHOLD_BYTES``) go to a worker thread, where
the hop (~50–100 µs) is cheaper than blocking the loop.

Errors (all ``GelbridgeError``; ``kind`` is the reply's ``error.kind``):

- ``ConfigError``: unknown provider (names the known ones), model not in ``models``,
  API key variable not set.
- ``ProviderError`` (from ``transport``): HTTP errors (401 authentication, 429
  rate_limit — retried by the transport, honouring Retry-After —, 5xx server_error),
  unreachable host, timeouts, a non-JSON 2xx body (server_error), an error event
  inside a stream, and a stream cut or ended without any usable event.
- ``AdapterError``: the script failed, hit a sandbox limit, or returned something
  that is not the format it declared.

A failure after a stream started carries what arrived: ``err.partial`` (a
``LuxResponse``, finish reason ``error``) and ``err.diagnostics``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson

from gelbridge import _tracing as tracing
from gelbridge._adapters.contract import (
    LUX_FORMAT,
    CompletionChunkDecoder,
    LuxEventDecoder,
    completion_response_to_lux,
    loads_json,
    lux_request_for_adapter,
    lux_response_from_adapter,
    lux_to_completion_request,
)
from gelbridge._adapters.host import Adapter
from gelbridge._adapters.ids import ToolCallIdMap, ToolCallIdRule
from gelbridge._adapters.sandbox import TextPiece
from gelbridge._errors import (
    AdapterError,
    ConfigError,
    GelbridgeError,
    ProviderError,
    ProviderFault,
    RequestTooLargeError,
    known_code,
)
from gelbridge._transport import (
    ProviderTransport,
    TransportPool,
    TransportTiming,
    auth_headers,
    default_auth_style,
    host_port,
)
from gelbridge.lux import (
    ConversionStatus,
    Converted,
    Diagnostic,
    ErrorEvent,
    LuxError,
    LuxRequest,
    LuxResponse,
    StreamAccumulator,
    StreamEvent,
    ToolKind,
    normalize_error_kind,
    strip_foreign_provider_data,
)

if TYPE_CHECKING:
    from gelbridge._adapters.registry import AdapterRegistry
    from gelbridge._config import ProviderConfig, Settings

log = logging.getLogger("gelbridge.adapters.client")

THREAD_THRESHOLD_BYTES = 1024 * 1024
"""Bodies at least this large are transformed in a worker thread (see module doc)."""


@dataclass(slots=True)
class ModelTiming:
    """Milliseconds: ``adapter_ms`` = Lua + format conversion + accumulation (the
    host's own work), ``ttfb_ms`` = request start → first body byte (includes retries),
    ``total_ms`` = the whole ``complete`` call. ``chunks`` = stream frames received."""

    adapter_ms: float = 0.0
    ttfb_ms: float | None = None
    total_ms: float = 0.0
    chunks: int = 0
    attempts: int = 0
    retry_wait_ms: float = 0.0


@dataclass(slots=True)
class ModelResult:
    """What one model call produced."""

    response: LuxResponse
    diagnostics: list[Diagnostic]
    timing: ModelTiming
    provider: str = ""
    model: str = ""
    streamed: bool = False


@dataclass(slots=True)
class PreparedRequest:
    """The provider request an adapter built (no network)."""

    body: str
    url: str
    path: str
    headers: dict[str, str]
    stream: bool
    framing: str
    diagnostics: list[Diagnostic] = field(default_factory=list)


def _attach(err: GelbridgeError, acc: StreamAccumulator, diags: list[Diagnostic],
            kind: str | None = None) -> GelbridgeError:
    """Put the partial response on ``err`` (finish reason ``error``)."""
    if acc.error is None:
        acc.feed(ErrorEvent(LuxError(kind or err.kind or "server_error", str(err)[:300])))
    err.partial = acc.result()
    err.diagnostics = diags + acc.diagnostics
    return err


def convert_request(adapter: Adapter, request: LuxRequest, *, provider: str, model: str,
                    id_rule: ToolCallIdRule | None = None) -> Converted[dict[str, Any]]:
    """Lux IR request → what ``adapter.transform_request`` receives (its declared format).

    ``id_rule``: the provider's tool-call id rule (``[providers.<name>] tool_call_id``);
    None uses the adapter's declared ``tool_call_id``."""
    ids = ToolCallIdMap(id_rule if id_rule is not None else adapter.options.tool_call_id)
    if adapter.format == LUX_FORMAT:
        return lux_request_for_adapter(request, provider=provider, model=model, id_map=ids)
    return lux_to_completion_request(request, provider=provider, model=model, id_map=ids)


def shaped_for(request: LuxRequest, adapter: Adapter, cfg: ProviderConfig | None,
               diags: list[Diagnostic]) -> tuple[LuxRequest, list[str]]:
    """The request as this provider's adapter is to get it (the one rule for the model
    client and ``gelbridge convert --to``): prompt caching marked off where the operator,
    or the auto rule, says (``metadata.prompt_cache``), and provider-run tools
    (``web_search``) only where the adapter declares them in ``native_tools``; elsewhere
    such a tool is not offered, with a diagnostic. Returns the kinds it dropped."""
    if cfg is not None and not cfg.caches_prompts():
        request = replace(request, metadata={**(request.metadata or {}), "prompt_cache": "off"})
    dropped: list[str] = []
    if request.tools and any(t.kind != ToolKind.FUNCTION for t in request.tools):
        kept = []
        for t in request.tools:
            if t.kind == ToolKind.FUNCTION or t.kind in adapter.options.native_tools:
                kept.append(t)
                continue
            dropped.append(t.kind)
            diags.append(Diagnostic(f"tools.{t.name}", ConversionStatus.UNSUPPORTED,
                                    f"adapter {adapter.name!r} has no native {t.kind}; not offered"))
        request = replace(request, tools=kept or None)
    return request, dropped


def provider_body(adapter: Adapter, request: LuxRequest, *, provider: str, model: str,
                  id_rule: ToolCallIdRule | None = None, max_bytes: int | None = None) -> Converted[str]:
    """The HTTP body ``adapter`` would send for ``request`` (runs the script; no network).

    ``max_bytes``: the largest request the script is given (``[thread] max_request_bytes``);
    a larger one raises ``RequestTooLargeError`` before any Lua runs."""
    conv = convert_request(adapter, request, provider=provider, model=model, id_rule=id_rule)
    # orjson's UTF-8 bytes go to Lua as they are (no str round trip of ~10 KB)
    raw = orjson.dumps(conv.value)
    if max_bytes is not None and len(raw) > max_bytes:
        raise RequestTooLargeError.of(max_bytes)
    return Converted(adapter.transform_request(raw), conv.diagnostics)


class ModelClient:
    """Calls models through adapters. Reuse one per process; ``async with`` or ``aclose()``.

    ``settings``: the ``[providers]`` and ``[adapters]`` sections are used.
    ``registry``/``transports``: shared instances (default: loaded from ``settings``).
    A ``TransportPool`` passed in should come from ``ModelClient.transport_pool`` (no
    auth in its client defaults): the client adds the auth header per request in the
    adapter's style. ``env``: where API keys are read (default ``os.environ``).
    """

    def __init__(self, settings: Settings, *, registry: AdapterRegistry | None = None,
                 transports: TransportPool | None = None, env: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        if registry is None:
            from gelbridge._adapters.registry import registry_from_settings

            registry = registry_from_settings(settings)
        self.registry = registry
        self._own_transports = transports is None
        self.transports = transports if transports is not None else self.transport_pool(settings)
        self._env = env
        self._auth: dict[str, dict[str, str]] = {}
        self._keys: dict[str, str | None] = {}
        self._id_rules: dict[str, ToolCallIdRule | None] = {}
        for name, cfg in settings.providers.items():  # a bad rule is a config error at start
            self._id_rules[name] = provider_id_rule(name, cfg)
        self._closed = False
        self._told: set[tuple[str, str]] = set()  # (provider, tool kind) not offered, already logged

    @staticmethod
    def transport_pool(settings: Settings, **kwargs: Any) -> TransportPool:
        """A ``TransportPool`` for ``settings.providers`` without auth headers (the
        client adds them per request, in the style the adapter declares)."""
        keyless = {name: cfg.model_copy(update={"api_key_env": None})
                   for name, cfg in settings.providers.items()}
        return TransportPool(keyless, **kwargs)

    async def aclose(self) -> None:
        self._closed = True
        if self._own_transports:
            await self.transports.aclose()

    async def __aenter__(self) -> ModelClient:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    # -- lookups ----------------------------------------------------------------------

    def provider_config(self, provider: str) -> ProviderConfig:
        cfg = self.settings.providers.get(provider)
        if cfg is None:
            known = ", ".join(sorted(self.settings.providers)) or "none"
            raise ConfigError(f"unknown provider {provider!r} (configured: {known}); "
                              f"add a [providers.{provider}] section to the config file")
        return cfg

    def adapter_for(self, provider: str) -> Adapter:
        cfg = self.provider_config(provider)
        if cfg.adapter not in self.registry:
            known = ", ".join(self.registry.names()) or "none"
            raise ConfigError(f"provider {provider!r} uses adapter {cfg.adapter!r}, which is not loaded "
                              f"(loaded: {known}); check the adapter name or [adapters] dirs")
        return self.registry.get(cfg.adapter)

    def _api_key(self, provider: str, cfg: ProviderConfig) -> str | None:
        if provider in self._keys:
            return self._keys[provider]
        key: str | None = None
        if cfg.api_key_env:
            env = os.environ if self._env is None else self._env
            key = env.get(cfg.api_key_env) or None
            if key is None:
                raise ConfigError(f"provider {provider!r}: environment variable {cfg.api_key_env} "
                                  "is not set; export the API key in it")
        self._keys[provider] = key
        return key

    def _auth_headers(self, provider: str, cfg: ProviderConfig, adapter: Adapter) -> dict[str, str]:
        got = self._auth.get(provider)
        if got is None:
            got = provider_auth(adapter, cfg, self._api_key(provider, cfg))
            self._auth[provider] = got
        return got

    # -- the call ---------------------------------------------------------------------

    def prepare(self, request: LuxRequest, *, provider: str, stream: bool | None = None) -> PreparedRequest:
        """Everything up to the HTTP call: config checks, conversion, the script's
        ``transform_request``, URL and headers. Raises ConfigError/AdapterError."""
        cfg = self.provider_config(provider)
        model = request.model
        if cfg.models is not None and model not in cfg.models:
            raise ConfigError(f"model {model!r} is not allowed for provider {provider!r} "
                              f"(models: {', '.join(cfg.models) or 'none'}); add it to models or pick another")
        adapter = self.adapter_for(provider)
        diags: list[Diagnostic] = []
        request, dropped = shaped_for(request, adapter, cfg, diags)
        for kind in dropped:
            if (provider, kind) not in self._told:
                self._told.add((provider, kind))
                log.info("provider %r: %s is not offered (adapter %r has no native %s; "
                         "openai-responses, anthropic and gemini have)", provider, kind, adapter.name, kind)
        want = request.options.stream if stream is None else stream
        if want and not adapter.has_stream_transform:
            diags.append(Diagnostic("options.stream", ConversionStatus.DEGRADED,
                                    f"adapter {adapter.name!r} has no transform_stream_chunk; not streamed"))
            want = False
        if request.options.stream != want:
            request = replace(request, options=replace(request.options, stream=want))
        conv = provider_body(adapter, request, provider=provider, model=model,
                             id_rule=self._id_rules.get(provider),
                             max_bytes=self.settings.thread.max_request_bytes)
        diags += conv.diagnostics
        transport = self.transports.get(provider)
        path = adapter.path_for(model, want)
        url = transport.url(path, model=model)
        headers = dict(adapter.headers)
        if adapter.has_build_headers:
            meta: dict[str, Any] = {"url": url, "method": "POST", "body": conv.value,
                                    "timestamp": int(time.time()), "source": {"name": provider},
                                    "model": model, "stream": want}
            if cfg.pass_api_key_to_script:
                meta["api_key"] = self._api_key(provider, cfg) or ""
            dynamic = adapter.build_headers(meta)
            if dynamic is not None:
                headers = dynamic
        headers.update(self._auth_headers(provider, cfg, adapter))
        return PreparedRequest(conv.value, url, path, headers, want, adapter.options.stream_format, diags)

    async def complete(
        self,
        request: LuxRequest,
        *,
        provider: str,
        stream: bool | None = None,
        on_event: Callable[[StreamEvent], None] | None = None,
    ) -> ModelResult:
        """Send ``request`` to ``provider`` (a ``[providers]`` key) and return the response.

        ``stream``: override ``request.options.stream``. ``on_event``: called with
        every Lux stream event as it arrives (streaming only; keep it cheap).
        Cancel the task to stop: the HTTP stream is closed.
        """
        if self._closed:
            raise RuntimeError("ModelClient is closed")
        adapter = self.adapter_for(provider)
        transport = self.transports.get(provider)  # created once (TLS setup is not adapter work)
        t_start = time.perf_counter()
        timing = ModelTiming()
        if len(request.conversation) > 0 and _approx_large(request):
            prep = await asyncio.to_thread(self.prepare, request, provider=provider, stream=stream)
        else:
            prep = self.prepare(request, provider=provider, stream=stream)
        timing.adapter_ms += (time.perf_counter() - t_start) * 1000
        model = request.model
        with tracing.span(f"chat {model}", lambda: self._span_attributes(provider, model, prep), client=True) as sp:
            try:
                try:
                    resp, diags = await self._call(adapter, transport, prep, provider, model, timing, on_event)
                except ProviderError as e:
                    retry = self._without_refused_state(request, adapter, e, provider=provider, stream=stream)
                    if retry is None:
                        raise
                    prep = retry
                    resp, diags = await self._call(adapter, transport, prep, provider, model, timing, on_event)
            finally:
                timing.total_ms = (time.perf_counter() - t_start) * 1000
            if sp is not None:
                _span_response(sp, resp)
        return ModelResult(resp, prep.diagnostics + diags, timing, provider, model, prep.stream)

    async def _call(self, adapter: Adapter, transport: ProviderTransport, prep: PreparedRequest, provider: str,
                    model: str, timing: ModelTiming, on_event: Callable[[StreamEvent], None] | None,
                    ) -> tuple[LuxResponse, list[Diagnostic]]:
        if prep.stream:
            return await self._stream(adapter, transport, prep, provider, model, timing, on_event)
        return await self._once(adapter, transport, prep, provider, model, timing)

    def _without_refused_state(self, request: LuxRequest, adapter: Adapter, error: ProviderError, *,
                               provider: str, stream: bool | None) -> PreparedRequest | None:
        """The request prepared again without any provider_data, when the provider
        refused the opaque state sent back (a code the adapter declares in
        ``provider_state_errors``, e.g. OpenAI's ``invalid_encrypted_content``) and
        nothing was streamed yet; None when that does not apply (then the error stands).
        Called once per model call: the second answer is final."""
        code = error.provider_code
        if code is None or code not in adapter.options.provider_state_errors:
            return None
        partial = getattr(error, "partial", None)
        if partial is not None and any(c.message.content for c in partial.choices):
            return None  # something was already shown: not silently replaced
        # no provider is named "": every block's provider data counts as foreign and goes
        stripped, removed = strip_foreign_provider_data(request, "", "")
        if not removed:
            return None
        prep = self.prepare(stripped, provider=provider, stream=stream)
        prep.diagnostics.insert(0, Diagnostic(
            "provider_data", ConversionStatus.DEGRADED,
            f"the provider refused the reasoning state of earlier turns ({code[:60]}); "
            f"sent again without it ({len(removed)} block(s))"))
        return prep

    def _span_attributes(self, provider: str, model: str, prep: PreparedRequest) -> dict[str, Any]:
        """The GenAI semantic conventions' request attributes (no content)."""
        cfg = self.settings.providers.get(provider)
        adapter = cfg.adapter if cfg is not None else provider
        url = urlsplit(prep.url)
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": tracing.GENAI_PROVIDERS.get(adapter, adapter),
            "gen_ai.request.model": model, "gelbridge.provider": provider, "gelbridge.stream": prep.stream,
            "server.address": url.hostname or "",
        }
        if url.port:
            attrs["server.port"] = url.port
        return attrs

    async def _once(self, adapter: Adapter, transport: ProviderTransport, prep: PreparedRequest,
                    provider: str, model: str, timing: ModelTiming) -> tuple[LuxResponse, list[Diagnostic]]:
        tt = TransportTiming()
        try:
            raw = await transport.post_json(prep.url, prep.body.encode(), prep.headers, timing=tt,
                                            error_hook=_error_hook(adapter))
        finally:
            _copy_timing(tt, timing)
        t0 = time.perf_counter()
        text = raw.decode("utf-8", "replace")
        if len(raw) >= THREAD_THRESHOLD_BYTES:
            out = await asyncio.to_thread(adapter.transform_response, text)
        else:
            out = adapter.transform_response(text)
        obj = loads_json(out, f"adapter {adapter.name!r}: transform_response")
        if adapter.format == LUX_FORMAT:
            conv = lux_response_from_adapter(obj, provider=provider, model=model)
        else:
            conv = completion_response_to_lux(obj, provider=provider, model=model)
        timing.adapter_ms += (time.perf_counter() - t0) * 1000
        resp = conv.value
        if resp.error is not None:
            err = ProviderError(f"provider reported an error: {resp.error.message[:300]}",
                                kind=normalize_error_kind(str(resp.error.kind)),
                                fault=_fault("error_reply", provider, prep, resp.error))
            err.partial = resp
            err.diagnostics = list(conv.diagnostics)
            raise err
        return resp, conv.diagnostics

    async def _stream(self, adapter: Adapter, transport: ProviderTransport, prep: PreparedRequest,
                      provider: str, model: str, timing: ModelTiming,
                      on_event: Callable[[StreamEvent], None] | None) -> tuple[LuxResponse, list[Diagnostic]]:
        acc = StreamAccumulator(provider=provider, model=model)
        lux = adapter.format == LUX_FORMAT
        decoder: CompletionChunkDecoder | LuxEventDecoder = (
            LuxEventDecoder(provider=provider, model=model) if lux
            else CompletionChunkDecoder(provider=provider, model=model))
        piece = decoder.piece if isinstance(decoder, LuxEventDecoder) else _no_pieces
        diags: list[Diagnostic] = []
        feed = acc.feed
        perf = time.perf_counter
        adapter_s = 0.0
        n = 0
        skipped_bad = 0
        what = f"adapter {adapter.name!r}: transform_stream_chunk"
        session = adapter.stream_session()
        chunk = session.chunk
        s = transport.stream(prep.url, prep.body.encode(), prep.headers, prep.framing,  # type: ignore[arg-type]
                             error_hook=_error_hook(adapter))
        try:
            async with s:
                async for data in s:
                    n += 1
                    t0 = perf()
                    try:
                        out = chunk(data)
                        if isinstance(out, tuple):  # one text delta, from a Lux session only
                            events = piece(out)
                        elif out:
                            events = decoder.decode(loads_json(out, what))
                        else:
                            skipped_bad += _skipped_frame(data, diags)
                            adapter_s += perf() - t0
                            continue
                    except AdapterError as e:
                        raise _attach(e, acc, diags + decoder.diagnostics, "adapter_error") from None
                    for ev in events:
                        feed(ev)
                    adapter_s += perf() - t0
                    if on_event is not None:
                        for ev in events:
                            on_event(ev)
                    if acc.error is not None:
                        err = ProviderError(f"the provider reported an error mid-stream: "
                                            f"{acc.error.message[:300]}",
                                            kind=normalize_error_kind(str(acc.error.kind)),
                                            fault=_fault("error_event", provider, prep, acc.error))
                        raise _attach(err, acc, diags + decoder.diagnostics)
        except ProviderError as e:
            e.fault = (e.fault or ProviderFault("error_event")).at(host=host_port(prep.url), provider=provider)
            if getattr(e, "partial", None) is None:
                _attach(e, acc, diags + decoder.diagnostics)
            raise
        except asyncio.CancelledError:
            raise
        finally:
            session.close()
            _copy_timing(s.timing, timing)
            timing.chunks = n
            timing.adapter_ms += adapter_s * 1000
        t0 = perf()
        events_seen = decoder.events_out
        if not s.saw_done and not decoder.done and decoder.finish_reason is None:
            if skipped_bad or events_seen == 0:
                err = ProviderError(
                    f"the stream from {provider!r} ended without any event the adapter understood"
                    f"{' after a malformed frame' if skipped_bad else ''}; check the adapter and base_url",
                    kind="server_error", fault=_fault("no_events", provider, prep))
                raise _attach(err, acc, diags + decoder.diagnostics)
            diags.append(Diagnostic("stream", ConversionStatus.DEGRADED,
                                    "stream ended without [DONE], done or a finish reason; kept as complete"))
        for ev in decoder.finish():
            feed(ev)
            if on_event is not None:
                on_event(ev)
        resp = acc.result()
        timing.adapter_ms += (perf() - t0) * 1000
        return resp, diags + decoder.diagnostics + acc.diagnostics


def _fault(what: str, provider: str, prep: PreparedRequest, error: LuxError | None = None) -> ProviderFault:
    """The fault of an error the provider reported inside a 2xx answer (or a stream that
    said nothing): its code only when a known one, else its Lux kind."""
    code = None
    if error is not None:
        code = known_code(error.provider_code) or known_code(str(error.kind))
    return ProviderFault(what, host=host_port(prep.url), provider=provider, code=code)


def _no_pieces(piece: TextPiece) -> list[StreamEvent]:
    raise AssertionError("a completion-format stream session returns text only")


def provider_auth(adapter: Adapter, cfg: ProviderConfig, key: str | None) -> dict[str, str]:
    """The header carrying ``key`` in the style the adapter declares (``adapter.auth``),
    else the one its name implies (``transport.default_auth_style``); empty without a key."""
    style = adapter.options.auth or default_auth_style(cfg.adapter)
    return auth_headers(style, key)  # type: ignore[arg-type]  # load_adapter checked it is an AuthStyle


def provider_id_rule(provider: str, cfg: ProviderConfig) -> ToolCallIdRule | None:
    """The ``tool_call_id`` rule of ``[providers.<provider>]`` (None: use the adapter's);
    raises ``ConfigError`` naming the section when it is malformed."""
    raw = cfg.tool_call_id
    if raw is None:
        return None
    from gelbridge._errors import AdapterLoadError

    try:
        rule = ToolCallIdRule.from_script(raw.model_dump(exclude_none=True),
                                          f"[providers.{provider}] tool_call_id")
    except AdapterLoadError as e:
        raise ConfigError(str(e).replace("adapter.tool_call_id", "tool_call_id")) from None
    if rule is None or rule == ToolCallIdRule():
        raise ConfigError(f"[providers.{provider}] tool_call_id: give pattern, max_length or exact_length "
                          "(or leave the key out to use the adapter's rule)")
    return rule


def _approx_large(request: LuxRequest) -> bool:
    """Cheap guess whether the request holds a large inline media block."""
    from gelbridge.lux import Media, Message

    total = 0
    for item in request.conversation:
        if type(item) is Message:
            for b in item.content:
                if type(b) is Media:
                    total += len(b.source.data)
    return total >= THREAD_THRESHOLD_BYTES


def _copy_timing(tt: TransportTiming, timing: ModelTiming) -> None:
    timing.ttfb_ms = None if tt.ttfb is None else tt.ttfb * 1000
    timing.attempts = tt.attempts
    timing.retry_wait_ms = tt.retry_wait * 1000


def _skipped_frame(data: str, diags: list[Diagnostic]) -> int:
    """A frame the script skipped (``""``). ADAPTER.md says ``""`` means skip, so it is
    skipped (the Go host ran its OpenAI parser instead). Two host checks keep that
    from hiding failures: a frame that is not JSON is counted (returns 1), and a
    provider error object (``{"error": ...}``, Anthropic ``{"type": "error"}``) raises."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        d = Diagnostic("stream", ConversionStatus.INVALID, "a stream frame was not valid JSON; skipped")
        if d not in diags:
            diags.append(d)
        return 1
    if isinstance(obj, dict) and (obj.get("type") == "error" or isinstance(obj.get("error"), (dict, str))):
        e = obj.get("error")
        msg = e.get("message") if isinstance(e, dict) else e
        code = (e.get("type") or e.get("code") or e.get("status")) if isinstance(e, dict) else None
        kind = normalize_error_kind(str(code)) if code is not None else "server_error"
        if kind not in ("rate_limit", "invalid_request", "authentication", "server_error", "content_filter"):
            kind = "server_error"
        raise ProviderError(f"the provider sent an error event mid-stream"
                            f"{': ' + msg[:300] if isinstance(msg, str) else ''}", kind=kind,
                            fault=ProviderFault("error_event", code=kind))
    return 0


def _error_hook(adapter: Adapter) -> Callable[[int, bytes], dict[str, str] | None] | None:
    """The adapter's ``transform_error`` for the transport, when it defines one."""
    return adapter.transform_error if adapter.has_transform_error else None


def _span_response(sp: Any, resp: LuxResponse) -> None:
    """The GenAI response attributes: model, id, finish reasons, token counts."""
    sp.set_attribute("gen_ai.response.model", resp.model or "")
    if resp.id:
        sp.set_attribute("gen_ai.response.id", resp.id)
    sp.set_attribute("gen_ai.response.finish_reasons", [str(c.finish_reason) for c in resp.choices])
    u = resp.usage
    if u is not None:
        sp.set_attribute("gen_ai.usage.input_tokens", u.prompt_tokens)
        sp.set_attribute("gen_ai.usage.output_tokens", u.completion_tokens)
        if u.cached_tokens is not None:
            sp.set_attribute("gen_ai.usage.cache_read.input_tokens", u.cached_tokens)
        if u.reasoning_tokens is not None:
            sp.set_attribute("gelbridge.usage.reasoning_tokens", u.reasoning_tokens)
    if resp.error is not None:
        tracing.failed(sp, resp.error.kind)


__all__ = ["ModelClient", "ModelResult", "ModelTiming", "PreparedRequest", "THREAD_THRESHOLD_BYTES",
           "convert_request", "provider_auth", "provider_body", "provider_id_rule"]
