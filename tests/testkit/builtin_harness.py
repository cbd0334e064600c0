"""Drive the built-in Lux-native adapters for tests: the real path, nothing faked.

``complete`` runs ``gelbridge._adapters.client.ModelClient`` (registry of the repo's
``adapters/``, the Lua sandbox, ``ProviderTransport`` over httpx) against a
``ModelServer`` on 127.0.0.1, with retries off so error tests see the first answer.
``chunks`` feeds raw provider payloads straight into a script through the host's
``StreamSession`` (same Lua, same per-stream state table) and parses the output with
``event_from_json`` — for stream shapes the local server does not produce.
"""

from __future__ import annotations

import json
from typing import Any

from gelbridge._adapters.client import ModelClient, ModelResult
from gelbridge._adapters.host import Adapter
from gelbridge._adapters.registry import AdapterRegistry, builtin_adapters_dir
from gelbridge._config import ProviderConfig, Settings
from gelbridge.lux import LuxRequest, LuxResponse, StreamAccumulator, event_from_json

NAMES = ("openai", "anthropic", "gemini", "ollama", "deepseek", "openai-responses", "openrouter")
API_KEY = "test-key"
# the path each provider's base_url carries in front of the adapter's endpoint
BASE_PATH = {"openai": "/v1", "deepseek": "", "anthropic": "", "gemini": "/v1beta", "ollama": "",
             "openai-responses": "/v1", "openrouter": "/api/v1"}

_registry: AdapterRegistry | None = None


def registry() -> AdapterRegistry:
    """The built-in adapters, loaded once per test session."""
    global _registry
    if _registry is None:
        _registry = AdapterRegistry.load(builtin_adapters_dir())
        failed = [e for e in _registry.entries() if e.status == "failed"]
        assert not failed, failed
    return _registry


def adapter(name: str) -> Adapter:
    return registry().get(name)


def settings(server: Any, name: str, **provider: Any) -> Settings:
    return Settings(providers={name: ProviderConfig(
        adapter=name, base_url=server.url + BASE_PATH[name],
        api_key_env=None if name == "ollama" else "GB_TEST_KEY", max_retries=0, read_timeout=10.0, **provider)})


async def complete(server: Any, name: str, req: LuxRequest, *, stream: bool, **provider: Any) -> ModelResult:
    """One model call through ModelClient (raises ProviderError like production);
    ``provider``: more ``[providers.<name>]`` keys."""
    async with ModelClient(settings(server, name, **provider), registry=registry(),
                           env={"GB_TEST_KEY": API_KEY}) as client:
        return await client.complete(req, provider=name, stream=stream)


def chunks(name: str, payloads: list[str], *, model: str = "m") -> tuple[list[dict[str, Any]], LuxResponse]:
    """Feed payloads to one stream session; return the events and the folded response."""
    acc = StreamAccumulator(provider=name, model=model)
    events: list[dict[str, Any]] = []
    with adapter(name).stream_session() as s:
        for p in payloads:
            out = s.chunk(p)
            if not out:
                continue
            v = json.loads(out)
            for e in v if isinstance(v, list) else [v]:
                d = e.get("delta") or {}
                if d.get("type") == "provider_data":  # the host fills the tag
                    d["provider_data"].update(provider=name, model=model)
                events.append(e)
                acc.feed(event_from_json(e))
    return events, acc.result()


def response(name: str, raw: str) -> dict[str, Any]:
    """``transform_response`` output as a dict."""
    return json.loads(adapter(name).transform_response(raw))
