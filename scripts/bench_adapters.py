"""Adapter cost, side by side, in one run (medians).

    .venv/bin/python scripts/bench_adapters.py [--n 300] [--requests 200]

(a) per request, no network: Lux request (~20 messages) → adapter input → Lua
    transform_request → provider body; provider response body → Lua transform_response
    → Lux response. For every built-in adapter in adapters/ and for the ADAPTER.md
    ("completion") path (tests/adapters/scripts/openai_md.lua).
(b) per stream chunk: transform_stream_chunk (pinned runtime) + decode + accumulator feed.
(c) one non-stream request to the local ModelServer: ModelClient vs a direct httpx POST
    of the same provider body vs LiteLLM acompletion (when litellm is importable).

Targets: < 0.5 ms adapter work per request, < 20 µs per chunk.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from gelbridge.adapters.client import ModelClient, convert_request
from gelbridge.adapters.contract import (
    LUX_FORMAT,
    CompletionChunkDecoder,
    LuxEventDecoder,
    completion_response_to_lux,
    loads_json,
    lux_response_from_adapter,
)
from gelbridge.adapters.registry import AdapterRegistry, builtin_adapters_dir
from gelbridge.config import Settings
from gelbridge.dev import _wire_anthropic, _wire_gemini, _wire_ollama, _wire_openai
from gelbridge.dev._wire_common import ToolCall, Turn, WireContext
from gelbridge.dev.model_server import ModelServer
from gelbridge.lux import (
    LuxRequest,
    Message,
    Options,
    ProviderData,
    StreamAccumulator,
    Text,
    Thinking,
    Tool,
    ToolResult,
    ToolUse,
)
from gelbridge.transport import NDJSONDecoder, SSEDecoder

ROOT = Path(__file__).resolve().parents[1]
TEST_SCRIPTS = ROOT / "tests" / "adapters" / "scripts"
WIRE = {"openai": _wire_openai, "deepseek": _wire_openai, "openai-compatible": _wire_openai,
        "openai_md": _wire_openai, "anthropic": _wire_anthropic, "gemini": _wire_gemini, "ollama": _wire_ollama}


def request(model: str, provider: str) -> LuxRequest:
    """~20 conversation items: text turns, thinking with provider data, two tool rounds."""
    conv: list[Any] = []
    for i in range(6):
        conv.append(Message("user", [Text(f"Question {i}: " + "what about the weather and the news? " * 4)]))
        conv.append(Message("assistant", [Text(f"Answer {i}: " + "it is sunny, nothing new. " * 6)]))
    conv.append(Message("user", [Text("Check Oslo and Bergen, please.")]))
    conv.append(Message("assistant", [
        Thinking("Two cities: call the tool twice.", signature="sig-abc",
                 provider_data=ProviderData(provider, model, {"signature": "sig-abc"})),
        ToolUse("call_1", "weather", '{"city":"Oslo"}'), ToolUse("call_2", "weather", '{"city":"Bergen"}')]))
    conv.append(Message("tool", [ToolResult("call_1", [Text("Oslo: 12°C, rain")])]))
    conv.append(Message("tool", [ToolResult("call_2", [Text("Bergen: 9°C, rain")])]))
    conv.append(Message("assistant", [Text("Rain in both: Oslo 12°C, Bergen 9°C.")]))
    conv.append(Message("user", [Text("And tomorrow?")]))
    return LuxRequest(model=model, conversation=conv, options=Options(stream=False, max_output_tokens=1024),
                      instructions=[Text("You are a concise assistant.")],
                      tools=[Tool("weather", {"type": "object", "properties": {"city": {"type": "string"}},
                                              "required": ["city"]}, "Current weather")])


TURN = Turn(text="Tomorrow: Oslo 14°C and cloudy, Bergen 11°C with showers.", reasoning="Use the forecast.",
            tool_calls=[ToolCall("weather", {"city": "Oslo", "day": "tomorrow"})], usage=(420, 60, 10))


def ctx(chunk_size: int = 8) -> WireContext:
    return WireContext(model="m", seq=1, created=0, prompt_text="x" * 400, chunk_size=chunk_size)


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def bench_request(adapter: Any, provider: str, n: int) -> float:
    wire = WIRE[adapter.name]
    raw = orjson.dumps(wire.render(TURN, ctx())).decode()
    req = request("m", provider)
    lux = adapter.format == LUX_FORMAT
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        conv = convert_request(adapter, req, provider=provider, model="m")
        adapter.transform_request(orjson.dumps(conv.value).decode())
        out = loads_json(adapter.transform_response(raw), "transform_response")
        (lux_response_from_adapter if lux else completion_response_to_lux)(out, provider=provider, model="m")
        samples.append(time.perf_counter() - t0)
    return median_us(samples)


def payloads(name: str) -> list[str]:
    wire = WIRE[name]
    turn = Turn(text="word " * 400, chunk_size=8)
    frames = b"".join(wire.render_stream(turn, ctx(), sse=True) if wire is _wire_gemini
                      else wire.render_stream(turn, ctx()))
    if wire is _wire_ollama:
        return NDJSONDecoder().feed(frames)
    dec = SSEDecoder()
    return [e.data for e in dec.feed(frames) + dec.close() if e.data and e.data != "[DONE]"]


def bench_chunks(adapter: Any, provider: str, rounds: int = 5) -> float:
    data = payloads(adapter.name)
    per_chunk = []
    for _ in range(rounds):
        acc = StreamAccumulator(provider=provider, model="m")
        dec = (LuxEventDecoder if adapter.format == LUX_FORMAT else CompletionChunkDecoder)(provider=provider,
                                                                                            model="m")
        with adapter.stream_session() as s:
            t0 = time.perf_counter()
            for d in data:
                out = s.chunk(d)
                if out:
                    for ev in dec.decode(loads_json(out, "chunk")):
                        acc.feed(ev)
            per_chunk.append((time.perf_counter() - t0) / len(data))
    return median_us(per_chunk)


async def bench_http(n: int, registry: AdapterRegistry) -> dict[str, float]:
    out: dict[str, float] = {}
    with ModelServer(record_requests=False) as srv:
        settings = Settings.model_validate({"providers": {"local": {"adapter": "openai", "base_url": srv.url + "/v1"}}})
        req = LuxRequest(model="m", conversation=[Message("user", [Text("hello there")])], options=Options(stream=False))
        async with ModelClient(settings, registry=registry) as client:
            prep = client.prepare(req, provider="local", stream=False)
            for _ in range(20):
                await client.complete(req, provider="local", stream=False)
            s, inner = [], []
            for _ in range(n):
                t0 = time.perf_counter()
                res = await client.complete(req, provider="local", stream=False)
                s.append(time.perf_counter() - t0)
                inner.append(res.timing.adapter_ms / 1000)
            out["ModelClient.complete"] = median_us(s)
            out["  of which adapter work"] = median_us(inner)
        async with httpx.AsyncClient() as hc:
            body = prep.body.encode()
            for _ in range(20):
                (await hc.post(prep.url, content=body, headers={"content-type": "application/json"})).json()
            s = []
            for _ in range(n):
                t0 = time.perf_counter()
                (await hc.post(prep.url, content=body, headers={"content-type": "application/json"})).json()
                s.append(time.perf_counter() - t0)
            out["httpx POST (same body)"] = median_us(s)
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch at import
        try:
            import litellm  # noqa: PLC0415
        except ImportError:
            out["litellm"] = float("nan")
            return out
        litellm.suppress_debug_info = True
        msgs = [{"role": "user", "content": "hello there"}]
        kw = dict(model="openai/m", api_base=srv.url + "/v1", api_key="sk-bench", messages=msgs, max_retries=0)
        for _ in range(10):
            await litellm.acompletion(**kw)
        s = []
        for _ in range(n):
            t0 = time.perf_counter()
            await litellm.acompletion(**kw)
            s.append(time.perf_counter() - t0)
        out["litellm.acompletion"] = median_us(s)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300, help="iterations per adapter for (a)")
    ap.add_argument("--requests", type=int, default=200, help="HTTP requests per client for (c)")
    args = ap.parse_args()
    registry = AdapterRegistry.load(builtin_adapters_dir(), [TEST_SCRIPTS])
    names = [n for n in registry.names() if n in WIRE]
    from gelbridge.adapters.sandbox import resolve_engine

    print(f"adapters: {', '.join(names)} (Lua engine: {resolve_engine('auto')})")
    print(f"{'adapter':<24}{'format':<12}{'per request (a)':>18}{'per chunk (b)':>16}")
    for name in names:
        a = registry.get(name)
        provider = name
        req_us = bench_request(a, provider, args.n)
        chunk_us = bench_chunks(a, provider)
        label = name + (" (ADAPTER.md)" if name == "openai_md" else "")
        print(f"{label:<24}{a.format:<12}{req_us / 1000:>15.3f} ms{chunk_us:>13.2f} µs")
    print("targets: < 0.5 ms per request, < 20 µs per chunk")
    print()
    res = asyncio.run(bench_http(args.requests, registry))
    print("(c) one non-stream request to the local ModelServer (median, loopback):")
    for k, v in res.items():
        print(f"  {k:<28}{'not installed' if v != v else f'{v / 1000:8.3f} ms'}")


if __name__ == "__main__":
    main()
