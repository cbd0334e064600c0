"""Adapter cost, side by side, in one run: medians and p90 per request and per chunk.

    .venv/bin/python scripts/bench_adapters.py [--n 300] [--rounds 40] [--requests 200]

(a) per request, no network: Lux request (~20 messages) → adapter input → Lua
    transform_request → provider body (``provider_body``, as ``ModelClient.prepare``);
    provider response body → Lua transform_response → Lux response. For every built-in
    adapter in adapters/ and for the ADAPTER.md ("completion") path
    (tests/adapters/scripts/openai_md.lua). One sample per request; the two sides are
    also reported apart (the "adapter_req"/"adapter_resp" steps of bench_core.py).
(b) per stream chunk, end to end as ``ModelClient`` does it: ``StreamSession.chunk``
    (pinned runtime + state table) → orjson decode of the returned events → typed
    events (``LuxEventDecoder``/``CompletionChunkDecoder``) → ``StreamAccumulator.feed``.
    The chunks are whole realistic streams (~250 frames from the local model server's
    wire renderers: OpenAI chat.completion.chunk, Anthropic content_block_delta and
    friends, Gemini SSE with one text part, Ollama NDJSON lines); every chunk is one
    sample, ``--rounds`` streams per adapter.
(c) one non-stream request to the local ModelServer: ModelClient vs a direct httpx POST
    of the same provider body vs LiteLLM acompletion (when litellm is importable).

Adapters are interleaved round by round, so background load hits all of them alike;
the load average is printed before and after (medians on a busy 2-core machine run
~1.5-2x the quiet numbers). Targets: < 0.5 ms adapter work per request, < 20 µs per chunk.
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

from gelbridge._adapters.client import ModelClient, _skipped_frame, provider_body
from gelbridge._adapters.contract import (
    LUX_FORMAT,
    CompletionChunkDecoder,
    LuxEventDecoder,
    completion_response_to_lux,
    loads_json,
    lux_response_from_adapter,
)
from gelbridge._adapters.registry import AdapterRegistry, builtin_adapters_dir
from gelbridge._config import Settings
from gelbridge._dev import _wire_anthropic, _wire_gemini, _wire_ollama, _wire_openai, _wire_openai_responses
from gelbridge._dev._wire_common import ToolCall, Turn, WireContext
from gelbridge._dev.model_server import ModelServer
from gelbridge._transport import NDJSONDecoder, SSEDecoder
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

ROOT = Path(__file__).resolve().parents[1]
TEST_SCRIPTS = ROOT / "tests" / "adapters" / "scripts"
WIRE = {"openai": _wire_openai, "deepseek": _wire_openai, "openai-compatible": _wire_openai,
        "openai_md": _wire_openai, "anthropic": _wire_anthropic, "gemini": _wire_gemini, "ollama": _wire_ollama,
        "openai-responses": _wire_openai_responses, "openrouter": _wire_openai}


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


def p90_us(samples: list[float]) -> float:
    xs = sorted(samples)
    return xs[min(len(xs) - 1, int(len(xs) * 0.9))] * 1e6


class RequestBench:
    """One adapter's per-request samples (both directions, host conversion included)."""

    def __init__(self, adapter: Any, provider: str) -> None:
        self.adapter = adapter
        self.provider = provider
        self.raw = orjson.dumps(WIRE[adapter.name].render(TURN, ctx())).decode()
        self.req = request("m", provider)
        self.lux = adapter.format == LUX_FORMAT
        self.samples: list[float] = []
        self.req_side: list[float] = []
        self.resp_side: list[float] = []

    def run(self, n: int) -> None:
        adapter, provider, raw, req = self.adapter, self.provider, self.raw, self.req
        to_lux = lux_response_from_adapter if self.lux else completion_response_to_lux
        perf = time.perf_counter
        for _ in range(n):
            t0 = perf()
            provider_body(adapter, req, provider=provider, model="m")  # what ModelClient.prepare runs
            t1 = perf()
            out = loads_json(adapter.transform_response(raw), "transform_response")
            to_lux(out, provider=provider, model="m")
            t2 = perf()
            self.samples.append(t2 - t0)
            self.req_side.append(t1 - t0)
            self.resp_side.append(t2 - t1)


def payloads(name: str) -> list[str]:
    wire = WIRE[name]
    turn = Turn(text="word " * 400, chunk_size=8)
    frames = b"".join(wire.render_stream(turn, ctx(), sse=True) if wire is _wire_gemini
                      else wire.render_stream(turn, ctx()))
    if wire is _wire_ollama:
        return NDJSONDecoder().feed(frames)
    dec = SSEDecoder()
    return [e.data for e in dec.feed(frames) + dec.close() if e.data and e.data != "[DONE]"]


class ChunkBench:
    """One adapter's per-chunk samples over whole streams, timed like ``ModelClient._stream``."""

    def __init__(self, adapter: Any, provider: str) -> None:
        self.adapter = adapter
        self.provider = provider
        self.data = payloads(adapter.name)
        self.samples: list[float] = []
        self.events = 0

    def run_stream(self) -> None:
        adapter, provider = self.adapter, self.provider
        acc = StreamAccumulator(provider=provider, model="m")
        dec = (LuxEventDecoder if adapter.format == LUX_FORMAT else CompletionChunkDecoder)(provider=provider,
                                                                                            model="m")
        feed, decode, perf, samples = acc.feed, dec.decode, time.perf_counter, self.samples
        diags: list[Any] = []
        with adapter.stream_session() as s:
            chunk = s.chunk
            for d in self.data:
                t0 = perf()
                out = chunk(d)
                if isinstance(out, tuple):  # a text delta luxkit encoded (ModelClient._stream)
                    for ev in dec.piece(out):  # type: ignore[union-attr]
                        feed(ev)
                elif out:
                    for ev in decode(loads_json(out, "chunk")):
                        feed(ev)
                else:
                    _skipped_frame(d, diags)
                samples.append(perf() - t0)
        for ev in dec.finish():
            feed(ev)
        acc.result()
        self.events = dec.events_out


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
            out["ModelClient: of which adapter work"] = median_us(inner)
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
    ap.add_argument("--n", type=int, default=300, help="requests per adapter for (a)")
    ap.add_argument("--rounds", type=int, default=40, help="whole streams per adapter for (b)")
    ap.add_argument("--requests", type=int, default=200, help="HTTP requests per client for (c)")
    args = ap.parse_args()
    registry = AdapterRegistry.load(builtin_adapters_dir(), [TEST_SCRIPTS])
    names = [n for n in registry.names() if n in WIRE]
    from gelbridge._adapters.sandbox import resolve_engine

    load0 = os.getloadavg()
    reqs = {n: RequestBench(registry.get(n), n) for n in names}
    chunks = {n: ChunkBench(registry.get(n), n) for n in names}
    for b in reqs.values():  # warm-up: JIT traces, pools, caches
        b.run(20)
        b.samples.clear()
        b.req_side.clear()
        b.resp_side.clear()
    for b in chunks.values():
        b.run_stream()
        b.samples.clear()
    step = max(1, args.n // 10)
    for done in range(0, args.n, step):
        for b in reqs.values():
            b.run(min(step, args.n - done))
    for _ in range(args.rounds):
        for b in chunks.values():
            b.run_stream()
    load1 = os.getloadavg()

    print(f"Lua engine: {resolve_engine('auto')}; load average {load0[0]:.2f} before, {load1[0]:.2f} after "
          f"({os.cpu_count()} CPUs)")
    print(f"(a) {args.n} requests per adapter; (b) {args.rounds} streams per adapter, every chunk one sample")
    print()
    print("| adapter | format | request median | request p90 | chunk median | chunk p90 | chunks/stream |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in names:
        r, c = reqs[name], chunks[name]
        label = name + (" (ADAPTER.md)" if name == "openai_md" else "")
        print(f"| {label} | {r.adapter.format} | {median_us(r.samples) / 1000:.3f} ms | {p90_us(r.samples) / 1000:.3f} ms "
              f"| {median_us(c.samples):.1f} µs | {p90_us(c.samples):.1f} µs | {len(c.data)} |")
    print()
    print("targets: < 0.5 ms per request, < 20 µs per chunk (medians)")
    print()
    print("(a) split: request side = provider_body (Lux → adapter input, transform_request);")
    print("    response side = transform_response + JSON decode + Lux response (medians)")
    print()
    print("| adapter | request side | response side |")
    print("|---|---:|---:|")
    for name in names:
        r = reqs[name]
        print(f"| {name} | {median_us(r.req_side):.1f} µs | {median_us(r.resp_side):.1f} µs |")
    print()
    res = asyncio.run(bench_http(args.requests, registry))
    print("(c) one non-stream request to the local ModelServer (median, loopback):")
    print()
    print("| client | median |")
    print("|---|---:|")
    for k, v in res.items():
        print(f"| {k.strip()} | {'not installed' if v != v else f'{v / 1000:.3f} ms'} |")


if __name__ == "__main__":
    main()
