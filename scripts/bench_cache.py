"""Prompt caching: the share of a conversation's input tokens billed as cache reads.

A 20-turn conversation (a ~1,500-token system prompt, three tools, ~150-token questions
and ~250-token answers; turns 5, 10 and 15 call a tool first, so they take two model
calls) goes through each provider's built-in adapter (``ModelClient``, the real Lua
scripts) to the local model server, which applies the provider's documented caching
rules (``gelbridge/_dev/_prompt_cache.py``: Anthropic's explicit breakpoints with their
20-block lookback, OpenAI's automatic prefix cache in 128-token steps per
``prompt_cache_key`` route, Gemini's implicit cache). Side by side in one run: with
gelbridge's caching on (the default) and off (``[providers.x] prompt_cache = false``).

Reported per provider: the share of input tokens read from the cache over turns 3-20
(target: at least 80 % for Anthropic), the lowest share of any of those turns, and the
tokens written to the cache (Anthropic bills those at 1.25x).

Run: ``.venv/bin/python scripts/bench_cache.py [--turns=20]``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys

from gelbridge._adapters.client import ModelClient
from gelbridge._adapters.registry import AdapterRegistry, builtin_adapters_dir
from gelbridge._config import ProviderConfig, Settings
from gelbridge._dev.model_server import ModelServer, ToolCall, Turn
from gelbridge.lux import LuxRequest, Message, Options, Text, Tool, ToolResult, ToolUse

SYSTEM = ("You are the support assistant of a small bookshop. Answer in plain words, cite the shelf, "
          "never invent stock levels, and ask before ordering anything. ") * 38  # ~1,500 tokens
TOOLS = [
    Tool("stock", {"type": "object", "properties": {"isbn": {"type": "string"}}, "required": ["isbn"]},
         "How many copies of a book are on the shelves"),
    Tool("order", {"type": "object", "properties": {"isbn": {"type": "string"}, "copies": {"type": "integer"}}},
         "Order copies of a book from the distributor"),
    Tool("hours", {"type": "object", "properties": {}}, "Opening hours"),
]
PROVIDERS = {  # name: (adapter, base path, model)
    "anthropic": ("anthropic", "", "claude-sonnet-4-6"),
    "openai-responses": ("openai-responses", "/v1", "gpt-5"),
    "openai": ("openai", "/v1", "gpt-5"),
    "gemini": ("gemini", "/v1beta", "gemini-2.5-flash"),
}
CACHE_KEY = "gb-bench0000000000000000000000000000"


def question(n: int) -> str:
    return f"Question {n}: " + "is the second volume of that series in stock, and when do you open? " * 8


def answer(n: int) -> str:
    return f"Answer {n}: " + "the second volume is on shelf C, two copies; we open at nine. " * 16


async def conversation(server: ModelServer, registry: AdapterRegistry, name: str, *, cache: bool,
                       turns: int) -> list[tuple[int, int, int]]:
    """(input tokens, read from cache, written to cache) per turn, summed over its calls."""
    adapter, path, model = PROVIDERS[name]
    settings = Settings(providers={name: ProviderConfig(adapter=adapter, base_url=server.url + path,
                                                        max_retries=0, prompt_cache=cache)})
    conv: list[Message] = []
    out = []
    async with ModelClient(settings, registry=registry) as client:
        for n in range(1, turns + 1):
            conv.append(Message("user", [Text(question(n))]))
            steps = [Turn(tool_calls=[ToolCall("stock", {"isbn": f"978-{n:04d}"}, id=f"call_{n}")]),
                     Turn(text=answer(n))] if n % 5 == 0 else [Turn(text=answer(n))]
            server.enqueue(*steps)
            total = [0, 0, 0]
            for _ in steps:
                req = LuxRequest(model=model, instructions=[Text(SYSTEM)], conversation=list(conv),
                                 options=Options(stream=True), tools=TOOLS,
                                 metadata={"cache_key": CACHE_KEY + name})
                res = await client.complete(req, provider=name)
                u = res.response.usage
                assert u is not None
                total[0] += u.prompt_tokens
                total[1] += u.cached_tokens or 0
                total[2] += u.cache_creation_tokens or 0
                msg = res.response.message
                conv.append(msg)
                calls = [b for b in msg.content if isinstance(b, ToolUse)]
                if calls:
                    conv.append(Message("tool", [ToolResult(c.id, [Text("2 copies on shelf C")]) for c in calls]))
            out.append((total[0], total[1], total[2]))
    return out


async def main(turns: int) -> None:
    registry = AdapterRegistry.load(builtin_adapters_dir())
    print(f"{turns}-turn conversation per provider (turns 5, 10, 15 call a tool first); "
          "input tokens read from the cache over turns 3..N")
    print(f"  {'provider':<18}{'caching':<9}{'read share':>11}{'lowest turn':>13}{'written':>9}{'input':>9}")
    for name in PROVIDERS:
        for cache in (True, False):
            with ModelServer(chunk_size=64) as server:  # a fresh provider cache per run
                rows = await conversation(server, registry, name, cache=cache, turns=turns)
            later = rows[2:]
            inp = sum(r[0] for r in later)
            read = sum(r[1] for r in later)
            lowest = min(r[1] / r[0] for r in later) if later else 0.0
            written = sum(r[2] for r in rows)
            flag = "on" if cache else "off"
            print(f"  {name:<18}{flag:<9}{read / inp:>10.1%}{lowest:>13.1%}{written:>9}{inp:>9}")
    print("OpenAI and Gemini cache prefixes by themselves: the switch changes only prompt_cache_key, which\n"
          "routes one conversation's requests to the same cache machine when many conversations share a\n"
          "prefix (not modelled here: one conversation at a time). Medians of the per-turn shares, caching on:")
    for name in ("anthropic", "openai-responses"):
        with ModelServer(chunk_size=64) as server:
            rows = await conversation(server, registry, name, cache=True, turns=turns)
        print(f"  {name:<18}{statistics.median(r[1] / r[0] for r in rows[2:]):.1%}")


if __name__ == "__main__":
    n = 20
    for arg in sys.argv[1:]:
        if arg.startswith("--turns="):
            n = int(arg.split("=", 1)[1])
    asyncio.run(main(n))
