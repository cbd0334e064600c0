"""Measure the Lux IR hot paths: build+serialise a 20-message request, feed deltas.

Run: .venv/bin/python scripts/bench_lux.py
"""

from __future__ import annotations

import json
import timeit

from gelbridge.lux import (
    BlockDelta,
    BlockStart,
    LuxRequest,
    Message,
    Options,
    ProviderData,
    ReasoningConfig,
    StreamAccumulator,
    Text,
    TextDelta,
    Thinking,
    Tool,
    ToolResult,
    ToolUse,
    event_from_json,
)


def build_request() -> LuxRequest:
    conv = []
    for i in range(10):
        conv.append(Message("user", [Text(f"question number {i} about the thread")]))
        if i % 3 == 2:
            conv.append(Message("assistant", [
                Thinking("let me look that up", signature="sig" * 20,
                         provider_data=ProviderData("anthropic", "claude-x", {})),
                ToolUse(f"call_{i}", "search", '{"q": "x"}')]))
            conv.append(Message("tool", [ToolResult(f"call_{i}", [Text("result text")])]))
        else:
            conv.append(Message("assistant", [Text(f"answer number {i}, with some words")]))
    return LuxRequest(
        model="claude-x", conversation=conv[:20], options=Options(stream=True, max_output_tokens=1024),
        instructions=[Text("You are a helpful assistant.")],
        tools=[Tool("search", {"type": "object", "properties": {"q": {"type": "string"}}})],
        reasoning=ReasoningConfig(True, effort="medium"),
    )


def per_call_us(fn, n: int) -> float:
    best = min(timeit.repeat(fn, number=n, repeat=5))
    return best / n * 1e6


def main() -> None:
    req = build_request()
    wire = req.to_json()
    print(f"request: {len(req.conversation)} items, {len(json.dumps(wire))} bytes of JSON")
    print(f"build                    {per_call_us(build_request, 2000):8.1f} us")
    print(f"to_json                  {per_call_us(req.to_json, 2000):8.1f} us")
    print(f"build + to_json          {per_call_us(lambda: build_request().to_json(), 2000):8.1f} us")
    print(f"build + to_json + dumps  {per_call_us(lambda: json.dumps(build_request().to_json()), 2000):8.1f} us")
    print(f"from_json                {per_call_us(lambda: LuxRequest.from_json(wire), 2000):8.1f} us")

    acc = StreamAccumulator()
    acc.feed(BlockStart(0, "text"))
    ev = BlockDelta(0, TextDelta("hello "))
    print(f"feed(text delta)         {per_call_us(lambda: acc.feed(ev), 200000) * 1000:8.0f} ns")
    raw = {"event": "block_delta", "index": 0, "delta": {"type": "text", "text": "hello "}}
    print(f"event_from_json + feed   {per_call_us(lambda: acc.feed(event_from_json(raw)), 200000) * 1000:8.0f} ns")
    acc2 = StreamAccumulator()
    acc2.feed(BlockStart(0, "text"))
    for _ in range(500):
        acc2.feed(ev)
    print(f"result() after 500 deltas{per_call_us(acc2.result, 5000):8.1f} us")


if __name__ == "__main__":
    main()
