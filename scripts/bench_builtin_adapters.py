"""Cost of the built-in adapters inside the Lua host (no network).

Per adapter: ``transform_request`` of a 20-message Lux request (the host's input
conversion excluded: the script gets the JSON text), ``transform_response`` of a
typical answer, and ``StreamSession.chunk`` of one text-delta payload.

This is the Lua side only (sandbox entry + script + host JSON), the same chunk over
and over; ``best`` is the fastest of 5 batches (close to the unloaded cost), ``median``
the median batch. The end-to-end per-chunk cost as ``ModelClient`` pays it (plus
orjson decode, typed events, accumulator) over whole realistic streams, medians and
p90, is ``scripts/bench_adapters.py``: use that one for the project targets.
Run: .venv/bin/python scripts/bench_builtin_adapters.py [auto|luajit|lua54]
"""

from __future__ import annotations

import json
import sys
import time

from gelbridge._adapters import SandboxLimits
from gelbridge._adapters.registry import AdapterRegistry, builtin_adapters_dir
from gelbridge.lux import LuxRequest, Message, Options, ProviderData, Text, Thinking, Tool, ToolResult, ToolUse

N = 2000


def request(name: str) -> str:
    conv = []
    for i in range(5):
        conv += [Message("user", [Text(f"question {i} " + "lorem ipsum dolor sit amet " * 12)]),
                 Message("assistant", [Thinking("reasoning " * 20, signature="sig" * 20,
                                                provider_data=ProviderData(name, "m", {"signature": "sig" * 20})),
                                       ToolUse(f"call_{i}", "lookup", '{"q":"x","n":3}')]),
                 Message("tool", [ToolResult(f"call_{i}", [Text("result " * 30)])]),
                 Message("assistant", [Text("answer " * 40)])]
    req = LuxRequest(model="m", instructions=[Text("You are helpful.")], conversation=conv,
                     options=Options(stream=True, max_output_tokens=1000),
                     tools=[Tool("lookup", {"type": "object", "properties": {"q": {"type": "string"}}})])
    return json.dumps(req.to_json())


CHUNK = {
    "openai": '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hello th"},"logprobs":null,"finish_reason":null}]}',
    "anthropic": '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello th"}}',
    "gemini": '{"candidates":[{"content":{"parts":[{"text":"Hello th"}],"role":"model"},"index":0}],"modelVersion":"m","responseId":"r1"}',
    "ollama": '{"model":"m","created_at":"2025-01-01T00:00:00Z","message":{"role":"assistant","content":"Hello th"},"done":false}',
}
CHUNK["deepseek"] = CHUNK["openai"]
ANTHROPIC_START = '{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}'


def best(fn, n: int) -> tuple[float, float]:
    """(fastest, median) per-call time over 5 batches of ``n`` calls."""
    out = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t) / n)
    return min(out), sorted(out)[2]


def main() -> None:
    engine = sys.argv[1] if len(sys.argv) > 1 else "auto"
    reg = AdapterRegistry.load(builtin_adapters_dir(), limits=SandboxLimits(engine=engine))  # type: ignore[arg-type]
    print(f"{'adapter':10} {'engine':7} {'request best/median':>22} {'chunk best/median (Lua only)':>30}")
    for name in ("openai", "deepseek", "anthropic", "gemini", "ollama"):
        a = reg.get(name)
        raw = request(name)
        for _ in range(100):  # warm-up: JIT traces of the host JSON code, pooled runtime
            a.transform_request(raw)
        t_req = best(lambda: a.transform_request(raw), 200)
        with a.stream_session() as s:
            s.chunk(CHUNK[name])
            if name == "anthropic":
                s.chunk(ANTHROPIC_START)
            t_chunk = best(lambda: s.chunk(CHUNK[name]), N)
            engine = s._rt.engine  # noqa: SLF001 - report which Lua ran
        print(f"{name:10} {engine:7} {t_req[0] * 1e3:9.3f} /{t_req[1] * 1e3:6.3f} ms "
              f"{t_chunk[0] * 1e6:16.1f} /{t_chunk[1] * 1e6:5.1f} µs   ({len(raw)} B request)")


if __name__ == "__main__":
    main()
