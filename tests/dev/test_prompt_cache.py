"""The local server's prompt cache follows each provider's documented rules, so what the
tests and ``bench_cache.py`` report is what the provider would bill."""

from __future__ import annotations

from typing import Any

import anthropic
import openai

from gelbridge._dev._prompt_cache import ANTHROPIC_TTL, PromptCache
from gelbridge._dev.model_server import ModelServer, Turn

LONG = "The operator's instructions, long enough to be cached. " * 120  # ~1,700 tokens
EPHEMERAL = {"type": "ephemeral"}


def anthropic_body(*texts: str, marks: tuple[int, ...] = (-1,), system: str = LONG) -> dict[str, Any]:
    """A conversation of alternating user/assistant texts, breakpoints on the given messages."""
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": [{"type": "text", "text": t}]}
                for i, t in enumerate(texts)]
    for m in marks:
        messages[m]["content"][-1]["cache_control"] = EPHEMERAL
    return {"model": "claude-sonnet-4-6", "system": [{"type": "text", "text": system, "cache_control": EPHEMERAL}],
            "messages": messages}


def test_anthropic_writes_at_breakpoints_and_reads_the_previous_turns_prefix() -> None:
    cache = PromptCache()
    first = cache.anthropic(anthropic_body("q1"), now=0)
    assert first is not None and first.read == 0 and first.written == first.prompt_tokens
    second = cache.anthropic(anthropic_body("q1", "a1", "q2", marks=(0, 2)), now=1)
    assert second is not None and second.read == first.prompt_tokens  # the whole first prompt
    assert second.written == second.prompt_tokens - first.prompt_tokens


def test_anthropic_caches_nothing_without_breakpoints_or_below_the_minimum() -> None:
    cache = PromptCache()
    body = anthropic_body("q1", marks=())
    body["system"][0].pop("cache_control")
    assert cache.anthropic(body, now=0).written == 0
    assert cache.anthropic(body, now=1).read == 0  # nothing was written
    assert cache.anthropic(anthropic_body("q1", system="short"), now=2) is None  # under 1,024 tokens
    haiku = {**anthropic_body("q1", system=LONG[: len(LONG) // 2 + 900]), "model": "claude-haiku-4-5"}
    assert cache.anthropic(haiku, now=3) is None  # Haiku's minimum is 2,048


def test_anthropic_lookback_is_20_blocks_and_entries_expire() -> None:
    cache = PromptCache()
    first = cache.anthropic(anthropic_body("q1"), now=0)
    turns = ["q1"] + [f"t{i}" for i in range(24)]
    far = cache.anthropic(anthropic_body(*turns, marks=(-1,)), now=1)  # 24 blocks past the cached q1
    assert far is not None and 0 < far.read < first.prompt_tokens  # only the system breakpoint's prefix
    near = cache.anthropic(anthropic_body(*turns[:15], marks=(-1,)), now=2)  # q1 within 20 blocks
    assert near is not None and near.read == first.prompt_tokens
    cache2 = PromptCache()
    cache2.anthropic(anthropic_body("q1"), now=0)
    assert cache2.anthropic(anthropic_body("q1", "a1", "q2"), now=ANTHROPIC_TTL + 1).read == 0  # expired


def test_openai_caches_prefixes_automatically_in_128_token_steps_per_route() -> None:
    cache = PromptCache()
    body = {"model": "gpt-5", "messages": [{"role": "system", "content": LONG}, {"role": "user", "content": "q1"}]}
    assert cache.openai(body).read == 0
    longer = {**body, "messages": body["messages"] + [{"role": "assistant", "content": "a1"},
                                                      {"role": "user", "content": "q2"}]}
    use = cache.openai(longer)
    assert use.read > 1024 and use.read % 128 == 0 and use.read <= use.prompt_tokens
    other_route = {**longer, "prompt_cache_key": "gb-elsewhere"}
    assert cache.openai(other_route).read == 0
    assert cache.openai({"model": "gpt-5", "messages": [{"role": "user", "content": "short"}]}) is None


def test_the_official_sdks_read_the_cache_usage() -> None:
    with ModelServer(api_key="k") as server:
        client = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)
        for body in (anthropic_body("q1"), anthropic_body("q1", "a1", "q2", marks=(0, 2))):
            server.enqueue(Turn(text="a1"))
            r = client.messages.create(max_tokens=100, **body)
        assert r.usage.cache_read_input_tokens > 1024 and r.usage.cache_creation_input_tokens > 0
        assert r.usage.input_tokens == 0  # everything before the last breakpoint was read or written

        oai = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
        messages = [{"role": "system", "content": LONG}, {"role": "user", "content": "q1"}]
        for extra in ([], [{"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]):
            c = oai.chat.completions.create(model="gpt-5", messages=messages + extra, prompt_cache_key="gb-1")
        assert c.usage.prompt_tokens_details.cached_tokens > 1024
        inputs = [{"role": "user", "content": LONG}]
        for extra in ([], [{"role": "user", "content": "more"}]):
            rr = oai.responses.create(model="gpt-5", input=inputs + extra, prompt_cache_key="gb-2")
        assert rr.usage.input_tokens_details.cached_tokens > 1024
