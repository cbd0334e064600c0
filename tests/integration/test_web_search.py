"""Provider-native web search on the real PDS: when a turn's tools name ``web_search``,
OpenAI Responses, Anthropic and Gemini get their own search tool (the operator's options
applied), the provider runs it (no approval, nothing run here), and the pages the answer
cites end the reply as ``sourcePart``s, each once; a provider without native search is
not offered it, and the operator's log says why."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from gelbridge._dev.model_server import Citation, ModelServer, Turn
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._records import SourcePart, TextPart, new_tid
from gelbridge._sealing import Keyring

from .conftest import App, make_settings, running_worker, text_of

pytestmark = [pytest.mark.pds, pytest.mark.timeout(180)]

PAGES = [Citation("https://en.wikipedia.org/wiki/Paris", "Paris - Wikipedia", "Paris is the capital"),
         Citation("https://www.britannica.com/place/Paris", "Paris | Britannica"),
         Citation("https://en.wikipedia.org/wiki/Paris", "Paris - Wikipedia", "cited twice")]
ANSWER = Turn(text="Paris is the capital of France.", searches=["capital of france"], citations=PAGES,
              chunk_size=6)
PROVIDERS = {  # name: (adapter, base path, model, how the request names the search tool)
    "openai-responses": ("openai-responses", "/v1", "gpt-5", {"type": "web_search"}),
    "anthropic": ("anthropic", "", "claude-sonnet-4-6",
                  {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}),
    # Gemini 3: Google Search next to function tools (Gemini 2 takes one or the other)
    "gemini": ("gemini", "/v1beta", "gemini-3-pro-preview", {"googleSearch": {}}),
}


def settings_for(dev_pds: DevPds, account: AccountInfo, tmp_path: Path, server: ModelServer, name: str,
                 adapter: str, path: str, model: str) -> Any:
    return make_settings(
        dev_pds.pds_url, account, tmp_path / "state", server.url,
        defaults={"model": {"provider": name, "id": model}, "tools": ["web_search", "current_time"]},
        providers={name: {"adapter": adapter, "base_url": server.url + path, "max_retries": 0}},
        tools={"web_search": {"max_uses": 2}},
    )


@pytest.mark.parametrize("name", list(PROVIDERS))
async def test_web_search_ends_the_reply_with_its_sources(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path, name: str,
) -> None:
    adapter, path, model, tool = PROVIDERS[name]
    settings = settings_for(dev_pds, pds_account, tmp_path, model_server, name, adapter, path, model)
    async with running_worker(settings, pds_account, keyring[0]) as worker:
        model_server.enqueue(ANSWER)
        k = await app.send("what is the capital of france?", conversation=new_tid())
        rec, content = await app.wait_status(f"{k}.r0", "complete")
        await worker.wait_idle(10)
        assert await worker.store.unfinished_claims(app.did) == []  # no approval asked: the provider ran it
    assert content is not None and text_of(content) == ANSWER.text
    assert [type(p) for p in content.parts] == [TextPart, SourcePart, SourcePart]  # each page once
    assert [(p.url, p.title) for p in content.parts[1:]] == [
        ("https://en.wikipedia.org/wiki/Paris", "Paris - Wikipedia"),
        ("https://www.britannica.com/place/Paris", "Paris | Britannica")]
    assert rec.finish_reason == "stop"
    body = model_server.requests[-1].body
    sent = [t for t in body["tools"] if "functionDeclarations" not in t]
    search = [{k: v for k, v in t.items() if k != "cache_control"} for t in sent
              if t.get("type") in ("web_search", "web_search_20250305") or "googleSearch" in t]
    assert search == [tool]
    assert "current_time" in json.dumps(body["tools"])  # function tools go alongside


async def test_a_provider_without_native_search_is_not_offered_it_and_the_log_says_why(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    settings = settings_for(dev_pds, pds_account, tmp_path, model_server, "chat", "openai", "/v1", "gpt-4.1")
    caplog.set_level(logging.INFO, logger="gelbridge.adapters.client")
    async with running_worker(settings, pds_account, keyring[0]) as worker:
        model_server.enqueue(Turn(text="I cannot search from here."))
        k = await app.send("search the web for me", conversation=new_tid())
        _, content = await app.wait_status(f"{k}.r0", "complete")
        await worker.wait_idle(10)
    assert [type(p) for p in content.parts] == [TextPart]
    tools = model_server.requests[-1].body["tools"]
    assert [t["function"]["name"] for t in tools] == ["current_time"]
    lines = [r.getMessage() for r in caplog.records if "web_search is not offered" in r.getMessage()]
    assert lines == ["provider 'chat': web_search is not offered (adapter 'openai' has no native web_search; "
                     "openai-responses, anthropic and gemini have)"]
    assert "search the web" not in caplog.text  # the log names settings, never content
