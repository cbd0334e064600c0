"""Benchmark the adapter host: identity adapter on a ~9 KB request, and per stream chunk.

Usage: .venv/bin/python scripts/bench_lua_host.py [--rounds N]
Reports the median and 10th percentile per call (the machine may be shared: p10
is closer to the unloaded cost) for every available engine, plus the Python-side
JSON alternatives that the pure-Lua bridge was chosen over.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from gelbridge._adapters.host import load_adapter
from gelbridge._adapters.sandbox import SandboxLimits, available_engines

ROOT = Path(__file__).resolve().parent.parent
IDENTITY = ROOT / "tests" / "adapters" / "host" / "scripts" / "identity.lua"


def request_9kb() -> str:
    msgs: list[dict] = [{"role": "system", "content": "You are a helpful assistant. " * 4}]
    for i in range(19):
        msgs.append({
            "role": "user" if i % 2 == 0 else "assistant",
            "content": (f"Message {i} with some text é ü 你好 \"quoted\"\n " * 5),
        })
    req = {
        "model": "gpt-4o", "messages": msgs, "temperature": 0.7, "max_tokens": 4096, "stream": True,
        "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": "Get the weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": []}}}],
        "tool_choice": "auto", "disable_thinking": False,
    }
    text = json.dumps(req, ensure_ascii=False)
    while len(text.encode()) < 9000:
        msgs.append({"role": "user", "content": "more padding text " * 10})
        text = json.dumps(req, ensure_ascii=False)
    return text


CHUNK = json.dumps({
    "id": "chatcmpl-abc123", "object": "chat.completion.chunk", "created": 1700000000,
    "model": "gpt-4o-2024-08-06", "system_fingerprint": "fp_1234",
    "choices": [{"index": 0, "delta": {"content": "Hello"}, "logprobs": None, "finish_reason": None}],
})


def measure(fn: Callable[[], object], rounds: int) -> tuple[float, float]:
    for _ in range(min(200, rounds)):
        fn()
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    samples.sort()
    return statistics.median(samples) * 1e6, samples[len(samples) // 10] * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3000)
    args = ap.parse_args()
    req = request_9kb()
    print(f"request {len(req.encode())} B, chunk {len(CHUNK)} B, rounds {args.rounds}")
    for engine in available_engines():
        a = load_adapter(IDENTITY, limits=SandboxLimits(engine=engine), allow_hosts={})  # type: ignore[arg-type]
        assert json.loads(a.transform_request(req)) == json.loads(req)
        med, p10 = measure(lambda: a.transform_request(req), args.rounds)
        print(f"{engine:7s} identity 9 KB request : median {med:7.1f} us   p10 {p10:7.1f} us")
        med, p10 = measure(lambda: a.transform_stream_chunk(CHUNK), args.rounds * 5)
        print(f"{engine:7s} stream chunk ~200 B   : median {med:7.1f} us   p10 {p10:7.1f} us")
    # The alternative: Python-side JSON with lupa conversions (no array markers even).
    import lupa.lua54 as lua54

    rt = lua54.LuaRuntime(register_eval=False, register_builtins=False)
    med, p10 = measure(lambda: rt.table_from(json.loads(req), recursive=True), args.rounds // 3)
    print(f"python-side decode (json.loads + table_from) : median {med:7.1f} us   p10 {p10:7.1f} us")
    table = rt.table_from(json.loads(req), recursive=True)

    def walk(o: object) -> object:
        if lua54.lua_type(o) == "table":
            items = list(o.items())  # type: ignore[attr-defined]
            if items and all(isinstance(k, int) for k, _ in items):
                return [walk(v) for _, v in sorted(items)]
            return {k: walk(v) for k, v in items}
        return o

    med, p10 = measure(lambda: json.dumps(walk(table)), args.rounds // 3)
    print(f"python-side encode (walk Lua table + dumps)  : median {med:7.1f} us   p10 {p10:7.1f} us")


if __name__ == "__main__":
    main()
