"""Drive a built-in Lux-native adapter end to end: real Lua host, real HTTP.

The script runs in the gelbridge Lua sandbox (``load_adapter``). The committed host
passes no per-stream ``state`` table yet, so the harness loads the script inside a
small Lua wrapper that keeps one state table per stream (reset by ``begin_stream``)
and exposes the contract metadata (format, stream_endpoint, stream_format, auth,
tool_call_id) through the ``build_headers`` hook. Requests go through
``gelbridge.transport.ProviderTransport`` (httpx, no retries) to a ``ModelServer``;
stream events are parsed with ``event_from_json`` and folded by ``StreamAccumulator``.
Like the host, the harness strips provider_data of other providers/models before
``transform_request`` and fills in provider/model on what the script returns.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gelbridge.adapters import SandboxLimits, load_adapter
from gelbridge.adapters.host import Adapter
from gelbridge.lux import (
    LuxRequest,
    LuxResponse,
    StreamAccumulator,
    event_from_json,
    strip_foreign_provider_data,
)
from gelbridge.transport import ProviderTransport, RetryPolicy, auth_headers, join_url

BUILTIN_DIR = Path(__file__).resolve().parents[3] / "adapters"
NAMES = ("openai", "anthropic", "gemini", "ollama", "deepseek")
API_KEY = "test-key"
# the path each adapter's base_url carries (the server's routes)
BASE_PATH = {"openai": "/v1", "deepseek": "", "anthropic": "", "gemini": "/v1beta", "ollama": ""}

_RESET = "__harness_begin_stream__"
_WRAP_HEAD = "local __a = (function() "
_WRAP_TAIL = """
end)()
local __state = {}
local W = { name = __a.name, version = __a.version, endpoint = __a.endpoint, headers = __a.headers }
function W.transform_request(s) return __a.transform_request(s) end
function W.transform_response(s) return __a.transform_response(s) end
function W.transform_stream_chunk(s)
  if s == "%s" then __state = {}; return "" end
  return __a.transform_stream_chunk(s, __state)
end
function W.build_headers(meta)
  return { meta = json.encode({ format = __a.format, stream_endpoint = __a.stream_endpoint or false,
    stream_format = __a.stream_format or "sse", auth = __a.auth or "bearer",
    tool_call_id = __a.tool_call_id or false }) }
end
return W
""" % _RESET

_tmp = Path(tempfile.mkdtemp(prefix="gelbridge-builtin-"))
_cache: dict[str, "Loaded"] = {}


@dataclass
class Loaded:
    name: str
    adapter: Adapter
    meta: dict[str, Any]

    @property
    def endpoint(self) -> str:
        return self.adapter.endpoint

    def transform_request(self, req: LuxRequest) -> dict[str, Any]:
        """Strip foreign provider data (as the host does), then transform."""
        clean, _ = strip_foreign_provider_data(req, self.name, req.model)
        return json.loads(self.adapter.transform_request(json.dumps(clean.to_json())))

    def transform_response(self, raw: str, model: str = "") -> LuxResponse:
        out = json.loads(self.adapter.transform_response(raw))
        _fill_provider_data(out, self.name, out.get("model") or model)
        return LuxResponse.from_json(out)

    def begin_stream(self) -> None:
        self.adapter.transform_stream_chunk(_RESET)

    def chunk(self, data: str, model: str = "") -> list[dict[str, Any]]:
        """Events for one payload (always a list)."""
        out = self.adapter.transform_stream_chunk(data)
        if out == "":
            return []
        v = json.loads(out)
        events = v if isinstance(v, list) else [v]
        for e in events:
            d = e.get("delta") if e.get("event") == "block_delta" else None
            if d and d.get("type") == "provider_data":
                pd = d["provider_data"]
                pd["provider"] = pd.get("provider") or self.name
                pd["model"] = pd.get("model") or model
        return events


def _fill_provider_data(resp: dict[str, Any], provider: str, model: str) -> None:
    for ch in resp.get("choices", []):
        for b in ch.get("message", {}).get("content", []):
            pd = b.get("provider_data")
            if isinstance(pd, dict):
                pd["provider"] = pd.get("provider") or provider
                pd["model"] = pd.get("model") or model


def load(name: str) -> Loaded:
    """The built-in adapter ``name`` in a single-runtime sandbox (cached per session)."""
    if name in _cache:
        return _cache[name]
    src = (BUILTIN_DIR / f"{name}.lua").read_text()
    path = _tmp / f"{name}.lua"
    path.write_text(_WRAP_HEAD + src + _WRAP_TAIL)
    ad = load_adapter(path, limits=SandboxLimits(pool_size=1), allow_hosts={})
    meta = json.loads((ad.build_headers({}) or {})["meta"])
    loaded = Loaded(name, ad, meta)
    _cache[name] = loaded
    return loaded


@dataclass
class Result:
    response: LuxResponse
    events: list[dict[str, Any]] = field(default_factory=list)
    diagnostics: list[Any] = field(default_factory=list)
    payloads: list[str] = field(default_factory=list)


def base_url(server: Any, name: str) -> str:
    return server.url + BASE_PATH[name]


async def complete(server: Any, name: str, req: LuxRequest, *, stream: bool | None = None,
                   api_key: str | None = API_KEY) -> Result:
    """One call: transform, POST (or stream), transform back. Provider errors raise
    ``ProviderError`` from the transport, as in production."""
    ad = load(name)
    if stream is not None and stream != req.options.stream:
        req.options.stream = stream
    stream = req.options.stream
    body = json.dumps(ad.transform_request(req)).encode()
    ep = ad.meta.get("stream_endpoint") if stream else None
    url = join_url(base_url(server, name), ep or ad.endpoint, model=req.model)
    headers = {**auth_headers(ad.meta["auth"], api_key), **ad.adapter.headers}
    async with ProviderTransport(name, base_url(server, name), headers=headers,
                                 retry=RetryPolicy(max_retries=0), read_timeout=10.0) as tr:
        if not stream:
            raw = await tr.post_json(url, body)
            return Result(ad.transform_response(raw.decode(), req.model))
        acc = StreamAccumulator(provider=name)
        events: list[dict[str, Any]] = []
        payloads: list[str] = []
        ad.begin_stream()
        async with tr.stream(url, body, framing=ad.meta["stream_format"]) as s:
            async for payload in s:
                payloads.append(payload)
                for e in ad.chunk(payload, req.model):
                    events.append(e)
                    acc.feed(event_from_json(e))
        return Result(acc.result(), events, acc.diagnostics, payloads)
