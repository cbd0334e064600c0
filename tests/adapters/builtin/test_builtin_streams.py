"""Stream shapes the local server does not produce, fed straight into the real scripts."""

from __future__ import annotations

import json
import re

from gelbridge.lux import Text, Thinking, ToolUse
from testkit import builtin_harness as harness


def oa(delta, finish=None, **extra):
    return json.dumps({"id": "c1", "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                       **extra})


def test_openai_parallel_calls_that_reuse_index_zero():
    payloads = [oa({"role": "assistant", "content": ""}),
                oa({"tool_calls": [{"index": 0, "id": "A", "function": {"name": "f", "arguments": '{"a"'}}]}),
                oa({"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}),
                oa({"tool_calls": [{"index": 0, "id": "B", "function": {"name": "g", "arguments": ""}}]}),
                oa({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
                oa({}, "tool_calls"), json.dumps({"id": "c1", "choices": [], "usage": {
                    "prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}})]
    events, resp = harness.chunks("openai", payloads)
    calls = [b for b in resp.message.content if isinstance(b, ToolUse)]
    assert [(c.id, c.name, c.arguments) for c in calls] == [("A", "f", '{"a":1}'), ("B", "g", "{}")]
    starts = [e["index"] for e in events if e["event"] == "block_start"]
    assert len(starts) == len(set(starts)) == 2
    assert resp.usage.total_tokens == 7 and resp.choices[0].finish_reason == "tool_calls"


def test_openai_call_without_id_is_left_for_the_host_to_name():
    """No id from the provider: the adapter makes none up from the response id (which a
    gateway may leave empty or repeat: ``call__0`` in every conversation); the host names
    the call after the reply key (``mapping.CallIds``)."""
    payloads = [oa({"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "{}"}}]}), oa({}, "tool_calls")]
    _, r1 = harness.chunks("openai", payloads)
    assert r1.message.content[0].id == ""


def test_openai_error_frame_and_bad_frame():
    events, resp = harness.chunks("openai", [oa({"content": "hi"}), json.dumps(
        {"error": {"message": "quota", "type": "insufficient_quota", "code": "insufficient_quota"}})])
    assert resp.error.kind == "server_error" and resp.error.provider_code == "insufficient_quota"
    for name in harness.NAMES:
        events, resp = harness.chunks(name, ["{not json"])
        assert events[-1]["event"] == "error" and resp.choices[0].finish_reason == "error", name


def test_gemini_text_chunks_append_and_signature_splits_parts():
    def g(parts, finish=None):
        c = {"content": {"role": "model", "parts": parts}}
        if finish:
            c["finishReason"] = finish
        return json.dumps({"candidates": [c], "responseId": "r1", "modelVersion": "gemini-x"})
    events, resp = harness.chunks("gemini", [
        g([{"text": "Hel"}]), g([{"text": "lo", "thoughtSignature": "S1"}]), g([{"text": " again"}]),
        g([{"text": "", "thoughtSignature": "S2"}], "STOP")])
    texts = [(b.text, b.provider_data.data if b.provider_data else None) for b in resp.message.content]
    assert texts == [("Hello", {"thoughtSignature": "S1"}), (" again", {"thoughtSignature": "S2"})]
    assert resp.choices[0].finish_reason == "stop" and events[-1] == {"event": "done"}


def test_gemini_calls_without_ids_are_named_by_the_host_after_the_reply_key():
    """Gemini gives no call ids (and a gateway may give no response id): the adapter
    leaves them empty and the host derives them from the reply key, so two conversations
    never share an id like ``call__0``."""
    from gelbridge._mapping import CallIds, response_to_parts
    from gelbridge.lux import LuxResponse

    def g(rid):
        return json.dumps({"responseId": rid, "candidates": [{"finishReason": "STOP", "content": {"parts": [
            {"functionCall": {"name": "f"}}, {"functionCall": {"name": "f", "args": {"a": 1}}}]}}]})
    r1 = harness.response("gemini", g(""))
    _, r2 = harness.chunks("gemini", [g("")])
    ids1 = [b["tool_use"]["id"] for b in r1["choices"][0]["message"]["content"]]
    ids2 = [b.id for b in r2.message.content]
    assert ids1 == ids2 == ["", ""]
    named = {rk: [p.call_id for p in response_to_parts(
        r2, provider="g", model="m", needs_approval=lambda _n: False, call_ids=CallIds(rk)).parts]
        for rk in ("3mconvA.r0", "3mconvB.r0")}
    assert named == {"3mconvA.r0": ["call_3mconvA_r0_0", "call_3mconvA_r0_1"],
                     "3mconvB.r0": ["call_3mconvB_r0_0", "call_3mconvB_r0_1"]}
    assert all(re.fullmatch(r"[\w-]+", i) for ids in named.values() for i in ids)
    assert isinstance(r2, LuxResponse)
    assert r1["choices"][0]["finish_reason"] == "tool_calls"
    assert r1["choices"][0]["message"]["content"][0]["tool_use"]["arguments"] == "{}"


def test_gemini_blocked_prompt_is_safety():
    r = harness.response("gemini", json.dumps({"promptFeedback": {"blockReason": "SAFETY"}}))
    assert r["choices"][0]["finish_reason"] == "safety" and "error" not in r


def test_anthropic_ignores_ping_and_server_tool_blocks_and_maps_errors():
    ev = [{"type": "message_start", "message": {"id": "m1", "model": "c", "usage": {
        "input_tokens": 5, "cache_read_input_tokens": 10, "output_tokens": 1}}},
          {"type": "ping"},
          {"type": "content_block_start", "index": 0, "content_block": {"type": "server_tool_use", "id": "s"}},
          {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "{}"}},
          {"type": "content_block_stop", "index": 0},
          {"type": "content_block_start", "index": 1, "content_block": {"type": "thinking", "thinking": ""}},
          {"type": "content_block_delta", "index": 1, "delta": {"type": "signature_delta", "signature": "SIG"}},
          {"type": "content_block_stop", "index": 1},
          {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}]
    events, resp = harness.chunks("anthropic", [json.dumps(e) for e in ev])
    (th,) = resp.message.content
    assert isinstance(th, Thinking) and th.text == "" and th.signature == "SIG"  # signature-only block kept
    assert resp.usage.prompt_tokens == 15 and resp.usage.cached_tokens == 10
    assert (resp.error.kind, resp.error.provider_code) == ("server_error", "overloaded_error")


def test_error_bodies_with_status_200():
    cases = {"openai": {"error": {"message": "bad", "type": "invalid_request_error"}},
             "anthropic": {"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}},
             "gemini": {"error": {"code": 403, "message": "no", "status": "PERMISSION_DENIED"}},
             "ollama": {"error": "model not found"}}
    kinds = {"openai": "invalid_request", "anthropic": "rate_limit", "gemini": "authentication",
             "ollama": "server_error"}
    for name, body in cases.items():
        r = harness.response(name, json.dumps(body))
        assert (r["choices"][0]["finish_reason"], r["error"]["kind"]) == ("error", kinds[name]), name


def test_ollama_stream_without_tool_ids():
    lines = [json.dumps({"model": "q", "created_at": "2025-01-01T00:00:00.5Z", "message": {
        "role": "assistant", "content": "", "thinking": "hm"}, "done": False}),
        json.dumps({"model": "q", "created_at": "2025-01-01T00:00:00.6Z", "message": {"role": "assistant", "content": "",
                    "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}, "done": False}),
        json.dumps({"model": "q", "created_at": "x", "message": {"role": "assistant", "content": ""}, "done": True,
                    "done_reason": "stop", "prompt_eval_count": 3, "eval_count": 2})]
    _, resp = harness.chunks("ollama", lines)
    th, call = resp.message.content
    assert isinstance(th, Thinking) and (call.name, call.arguments) == ("f", "{}") and call.id == ""
    assert resp.choices[0].finish_reason == "tool_calls" and resp.usage.total_tokens == 5
    assert not any(isinstance(b, Text) for b in resp.message.content)
