"""Prompt caching through ModelClient: Anthropic breakpoints make each turn read the
previous turn's prefix (by the documented rules the local server applies); OpenAI's
adapters send the conversation's stable prompt_cache_key; the operator's switch turns
both off."""

from __future__ import annotations

import json

import pytest

from gelbridge._dev.model_server import Turn
from gelbridge.lux import LuxRequest, Message, Options, Text, Tool
from testkit import builtin_harness as harness

LONG = "Answer as the operator's long style guide says. " * 140  # ~1,700 tokens: over the minimum
TOOLS = [Tool("lookup", {"type": "object", "properties": {"q": {"type": "string"}}}, "Look it up")]
KEY = "gb-0123456789abcdef0123456789abcdef"


def request(model: str, conv: list[Message], *, stream: bool) -> LuxRequest:
    return LuxRequest(model=model, instructions=[Text(LONG)], conversation=list(conv),
                      options=Options(stream=stream), tools=TOOLS, metadata={"cache_key": KEY})


@pytest.fixture(params=[False, True], ids=["plain", "stream"])
def stream(request: pytest.FixtureRequest) -> bool:
    return request.param


async def test_anthropic_second_turn_reads_the_first_turns_prefix(server, stream):
    conv = [Message("user", [Text("first question")])]
    server.enqueue(Turn(text="first answer"))
    first = await harness.complete(server, "anthropic", request("claude-sonnet-4-6", conv, stream=stream),
                                   stream=stream)
    u1 = first.response.usage
    assert u1.cached_tokens == 0 and u1.cache_creation_tokens == u1.prompt_tokens  # all written
    conv += [first.response.message, Message("user", [Text("second question")])]
    server.enqueue(Turn(text="second answer"))
    second = await harness.complete(server, "anthropic", request("claude-sonnet-4-6", conv, stream=stream),
                                    stream=stream)
    body = server.requests[-1].body
    marked = [b.get("cache_control") for b in body["tools"] + body["system"]]
    assert marked == [{"type": "ephemeral"}, {"type": "ephemeral"}]
    ends = [m["content"][-1].get("cache_control") for m in body["messages"]]
    assert ends == [{"type": "ephemeral"}, None, {"type": "ephemeral"}]  # the previous and this request's end
    u2 = second.response.usage
    assert u2.cached_tokens == u1.prompt_tokens  # the first turn's whole prompt is a cache hit
    assert u2.cached_tokens / u2.prompt_tokens > 0.8


async def test_anthropic_without_prompt_cache_sends_no_breakpoint(server):
    conv = [Message("user", [Text("q")])]
    res = await harness.complete(server, "anthropic", request("claude-sonnet-4-6", conv, stream=False),
                                 stream=False, prompt_cache=False)
    assert "cache_control" not in json.dumps(server.requests[-1].body)
    assert not res.response.usage.cached_tokens


@pytest.mark.parametrize("name", ["openai-responses", "openai"])
async def test_openai_adapters_send_the_conversations_cache_key(server, name):
    conv = [Message("user", [Text("q")])]
    await harness.complete(server, name, request("gpt-5", conv, stream=False), stream=False, prompt_cache=True)
    assert server.requests[-1].body["prompt_cache_key"] == KEY
    await harness.complete(server, name, request("gpt-5", conv, stream=False), stream=False, prompt_cache=False)
    assert "prompt_cache_key" not in server.requests[-1].body


async def test_openai_on_another_host_sends_no_cache_key_unless_asked(server):
    """auto: an OpenAI-compatible host may refuse the unknown parameter."""
    conv = [Message("user", [Text("q")])]
    await harness.complete(server, "openai", request("gpt-5", conv, stream=False), stream=False)
    assert "prompt_cache_key" not in server.requests[-1].body
    await harness.complete(server, "deepseek", request("deepseek-chat", conv, stream=False), stream=False,
                           prompt_cache=True)
    assert "prompt_cache_key" not in server.requests[-1].body  # DeepSeek caches by prefix alone


async def test_openrouter_sends_the_conversations_key_as_its_session_id(server):
    """OpenRouter's chat API keeps a conversation on one upstream's cache by ``session_id``
    (its prompt-caching guide); it documents no prompt_cache_key there."""
    conv = [Message("user", [Text("q")])]
    for stream in (False, True):
        await harness.complete(server, "openrouter", request("openai/gpt-5", conv, stream=stream), stream=stream,
                               prompt_cache=True)
        body = server.requests[-1].body
        assert body["session_id"] == KEY and "prompt_cache_key" not in body
    await harness.complete(server, "openrouter", request("openai/gpt-5", conv, stream=False), stream=False,
                           prompt_cache=False)
    assert "session_id" not in server.requests[-1].body


@pytest.mark.parametrize(("adapter", "base_url", "sends"), [
    ("openai", "https://api.openai.com/v1", True),
    ("openai-responses", "https://api.openai.com/v1", True),
    ("openai-responses", "https://example-gateway.test/v1", False),
    ("openrouter", "https://openrouter.ai/api/v1", True),
    ("openrouter", "https://example-gateway.test/api/v1", False),
    ("anthropic", "https://example-gateway.test", True),
])
def test_by_default_the_key_goes_to_the_host_that_documents_it(adapter, base_url, sends):
    """docs/adapters.md, "Prompt caching": unset, it is on, and the key goes only to
    api.openai.com (openai, openai-responses) and openrouter.ai (openrouter)."""
    from gelbridge._config import ProviderConfig

    assert ProviderConfig(adapter=adapter, base_url=base_url).caches_prompts() is sends
