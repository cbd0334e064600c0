"""OpenAI Responses on the real PDS: a two-turn conversation with a tool call keeps the
model's encrypted reasoning (stored sealed in the reply, sent back in its original place,
without item ids), never shows it to another provider, and survives a provider that
refuses it (``invalid_encrypted_content``: sent again once without it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gelbridge._dev.model_server import Fail, ModelServer, ToolCall, Turn
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._mapping import prompt_cache_key
from gelbridge._records import ReasoningPart, TextPart, ToolCallPart, ToolResultPart, new_tid
from gelbridge._sealing import Keyring

from .conftest import App, make_settings, running_worker, text_of

pytestmark = [pytest.mark.pds, pytest.mark.timeout(180)]

ENC_A, ENC_B = "gAAAAA-first-step-reasoning", "gAAAAA-second-step-reasoning"


def settings_for(dev_pds: DevPds, account: AccountInfo, tmp_path: Path, server: ModelServer) -> Any:
    return make_settings(
        dev_pds.pds_url, account, tmp_path / "state", server.url,
        defaults={"model": {"provider": "oai", "id": "gpt-5"}, "tools": ["current_time"]},
        providers={"oai": {"adapter": "openai-responses", "base_url": server.url + "/v1", "max_retries": 0,
                           "prompt_cache": True},  # auto sends the key only to api.openai.com
                   "chat": {"adapter": "openai", "base_url": server.url + "/v1", "max_retries": 0}},
    )


def responses_bodies(server: ModelServer) -> list[dict[str, Any]]:
    return [r.body for r in server.requests if r.path.endswith("/responses")]


async def test_reasoning_items_go_back_in_order_to_the_same_model_only(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    """The worker streams (the non-streamed path is covered at the adapter level)."""
    settings = settings_for(dev_pds, pds_account, tmp_path, model_server)
    conv = new_tid()
    async with running_worker(settings, pds_account, keyring[0]):
        # turn 1: reasoning → a tool call (auto-run) → reasoning → the answer
        model_server.enqueue(
            Turn(reasoning="Need the time first.", reasoning_signature=ENC_A,
                 tool_calls=[ToolCall("current_time", {}, id="call_t1")], chunk_size=4),
            Turn(reasoning="Now answer.", reasoning_signature=ENC_B, text="It is late.", chunk_size=4),
        )
        k0 = await app.send("what time is it?", conversation=conv)
        r0, c0 = await app.wait_status(f"{k0}.r0", "complete")
        assert [type(p) for p in c0.parts] == [ReasoningPart, ToolCallPart, ToolResultPart, ReasoningPart, TextPart]
        assert text_of(c0) == "It is late." and r0.finish_reason == "stop"
        assert ENC_A in (c0.parts[0].provider_data or "") and ENC_B in (c0.parts[3].provider_data or "")
        assert r0.model is not None and (r0.model.provider, r0.model.id) == ("oai", "gpt-5")

        first, second = responses_bodies(model_server)
        for body in (first, second):
            assert body["store"] is False and body["include"] == ["reasoning.encrypted_content"]
            assert body["stream"] is True
        assert [i.get("type", "message") for i in second["input"]] == [
            "message", "reasoning", "function_call", "function_call_output"]
        reasoning = second["input"][1]
        assert reasoning == {"type": "reasoning", "encrypted_content": ENC_A,
                             "summary": [{"type": "summary_text", "text": "Need the time first."}]}
        assert second["input"][2]["call_id"] == second["input"][3]["call_id"] == "call_t1"

        # turn 2 in the same conversation: both reasoning items, each before what it led to
        model_server.enqueue(Turn(text="You are welcome."))
        k1 = await app.send("thanks", conversation=conv, parent=f"{k0}.r0")
        await app.wait_status(f"{k1}.r0", "complete")
        third = responses_bodies(model_server)[2]
        kinds = [(i.get("type", "message"), i.get("role")) for i in third["input"]]
        assert kinds == [("message", "user"), ("reasoning", None), ("function_call", None),
                         ("function_call_output", None), ("reasoning", None), ("message", "assistant"),
                         ("message", "user")]
        assert [i["encrypted_content"] for i in third["input"] if i.get("type") == "reasoning"] == [ENC_A, ENC_B]
        assert all("id" not in i for i in third["input"])  # store = false: no item ids
        # one prompt-cache key for the conversation, derived from no content
        # keyed with the conversation's sealing key: not computable from the public names alone
        secret = keyring[0][keyring[1]]
        keys = {b["prompt_cache_key"] for b in responses_bodies(model_server)}
        assert keys == {prompt_cache_key(secret, app.did, conv)}
        assert keys != {prompt_cache_key(secret, app.did, new_tid())} and keys != {prompt_cache_key(b"", app.did, conv)}

        # the same thread sent to another provider (Chat Completions): no reasoning state
        model_server.enqueue(Turn(text="From elsewhere."))
        k2 = await app.send("and again", conversation=conv, parent=f"{k1}.r0",
                            generation={"attempt": 0, "model": {"provider": "chat", "id": "gpt-4.1"}})
        await app.wait_status(f"{k2}.r0", "complete")
        chat = [r.body for r in model_server.requests if r.path.endswith("/chat/completions")]
        assert len(chat) == 1
        sent = json.dumps(chat[0])
        assert ENC_A not in sent and ENC_B not in sent and "Need the time first." not in sent


async def test_refused_reasoning_is_dropped_and_the_request_sent_once_more(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    settings = settings_for(dev_pds, pds_account, tmp_path, model_server)
    conv = new_tid()
    async with running_worker(settings, pds_account, keyring[0]) as worker:
        model_server.enqueue(Turn(reasoning="Think.", reasoning_signature=ENC_A, text="First answer."))
        k0 = await app.send("hello", conversation=conv)
        await app.wait_status(f"{k0}.r0", "complete")
        # the key behind the gateway changed: the provider cannot decrypt the old reasoning
        model_server.enqueue(Fail(400, "The encrypted content could not be verified.",
                                  code="invalid_encrypted_content"),
                             Turn(text="Second answer."))
        k1 = await app.send("more", conversation=conv, parent=f"{k0}.r0")
        r1, c1 = await app.wait_status(f"{k1}.r0", "complete")
        assert text_of(c1) == "Second answer."
        refused, retried = responses_bodies(model_server)[1:]
        assert [i["encrypted_content"] for i in refused["input"] if i.get("type") == "reasoning"] == [ENC_A]
        assert not [i for i in retried["input"] if i.get("type") == "reasoning"]
        assert [i.get("role") for i in retried["input"]] == ["user", "assistant", "user"]
        await worker.wait_idle(10)
    report = worker.reports[-1]
    assert any(d.field == "provider_data" and "invalid_encrypted_content" in (d.detail or "")
               for d in report.diagnostics)
