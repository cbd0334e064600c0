"""``[providers.<name>] tool_call_id`` overrides the adapter's id rule (OpenAI-compatible hosts differ)."""

from __future__ import annotations

import re

import pytest

from gelbridge._adapters.client import ModelClient
from gelbridge._adapters.registry import AdapterRegistry, builtin_adapters_dir
from gelbridge._adapters.sandbox import SandboxLimits
from gelbridge._dev.model_server import ModelServer, ToolCall, Turn
from gelbridge._errors import ConfigError
from gelbridge.lux import LuxRequest, Message, Options, Text, ToolResult, ToolUse
from testkit.adapter_helpers import settings_for


@pytest.fixture(scope="module")
def builtins() -> AdapterRegistry:
    return AdapterRegistry.load(builtin_adapters_dir(), limits=SandboxLimits(pool_size=1))


def mistral(url: str, **rule: object) -> dict[str, object]:
    return {"adapter": "openai", "base_url": url + "/v1", "api_key_env": "K", "tool_call_id": rule}


def plain_openai(url: str) -> dict[str, object]:
    return {"adapter": "openai", "base_url": url + "/v1", "api_key_env": "K"}


@pytest.mark.parametrize("stream", [True, False])
async def test_mistral_style_provider_sends_nine_alphanumeric_ids_and_keeps_pairs(
        builtins: AdapterRegistry, stream: bool) -> None:
    with ModelServer(api_key="sk-test", chunk_size=4) as srv:
        settings = settings_for(mistral=mistral(srv.url, exact_length=9), openai=plain_openai(srv.url))
        async with ModelClient(settings, registry=builtins, env={"K": "sk-test"}) as client:
            first = LuxRequest(model="mistral-large", options=Options(stream=stream),
                               conversation=[Message("user", [Text("weather in Oslo and Bergen?")])])
            srv.enqueue(Turn(text="", tool_calls=[ToolCall("weather", {"city": "Oslo"}, id="call_Oslo.weather-0001"),
                                                  ToolCall("weather", {"city": "Bergen"}, id="call_Bergen.weather-0002")]))
            res = await client.complete(first, provider="mistral")
            calls = [b for b in res.response.message.content if isinstance(b, ToolUse)]
            assert [c.id for c in calls] == ["call_Oslo.weather-0001", "call_Bergen.weather-0002"]  # stored as sent

            second = LuxRequest(model="mistral-large", options=Options(stream=stream), conversation=[
                *first.conversation,
                Message("assistant", calls),
                Message("tool", [ToolResult(calls[0].id, [Text("12°C")])]),
                Message("tool", [ToolResult(calls[1].id, [Text("9°C")])]),
            ])
            for provider in ("mistral", "openai"):
                srv.enqueue(Turn(text="Oslo 12°C, Bergen 9°C."))
                await client.complete(second, provider=provider)
                msgs = srv.requests[-1].body["messages"]
                sent_calls = [tc["id"] for m in msgs for tc in m.get("tool_calls") or []]
                sent_results = [m["tool_call_id"] for m in msgs if m["role"] == "tool"]
                assert sent_calls == sent_results and len(set(sent_calls)) == 2  # paired, distinct, in order
                if provider == "mistral":
                    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in sent_calls), sent_calls
                else:  # the adapter's rule (^[a-zA-Z0-9_-]+$, at most 40): '.' is not allowed there
                    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,40}", i) for i in sent_calls), sent_calls
                    assert sent_calls[0] != calls[0].id and sent_calls[0].startswith("call_Oslo_weather")


@pytest.mark.parametrize("rule, words", [
    ({"exact_length": 0}, "exact_length"),
    ({"pattern": "(["}, "regular expression"),
    ({"max_length": 5}, "exact_length instead"),
    ({}, "give pattern, max_length or exact_length"),
])
def test_malformed_provider_rule_is_a_config_error_at_start(builtins: AdapterRegistry, rule: dict[str, object],
                                                            words: str) -> None:
    with pytest.raises(ConfigError) as info:
        ModelClient(settings_for(m=mistral("http://127.0.0.1:9", **rule)), registry=builtins, env={"K": "x"})
    assert "[providers.m] tool_call_id" in str(info.value) and words in str(info.value)


def test_unknown_rule_key_is_refused_by_the_config() -> None:
    with pytest.raises(Exception) as info:
        settings_for(m=mistral("http://127.0.0.1:9", exact_len=9))
    assert "exact_len" in str(info.value)
