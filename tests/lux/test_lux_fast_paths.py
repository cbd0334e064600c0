"""The one-pass paths give exactly what the general code gives.

``to_json``/``request_json`` write the common blocks inline, ``strip_foreign_provider_data``
returns the request untouched after one scan when nothing is foreign, and
``read_plain_response`` reads the usual response shape directly. Each is checked
against the general path on generated values.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gelbridge.lux import (
    Converted,
    LuxRequest,
    Message,
    Options,
    ProviderData,
    Text,
    Thinking,
    ToolResult,
    ToolUse,
    decode_response,
    strip_foreign_provider_data,
)
from gelbridge.lux import _models as models
from gelbridge.lux import _provider_data as provider_data
from gelbridge.lux._models import read_plain_response, request_json
from testkit import lux_strategies as S


def generic_request_json(req: LuxRequest) -> dict:
    """The per-class ``to_json`` methods composed, without the inline fast path."""

    def block(c):
        if isinstance(c, Thinking):
            p = {"text": c.text, "redacted": c.redacted}
            if c.signature is not None:
                p["signature"] = c.signature
            if c.summary is not None:
                p["summary"] = [block(x) for x in c.summary]
            out = {"type": "thinking", "thinking": p}
            if c.provider_data is not None:
                out["provider_data"] = c.provider_data.to_json()
            return out
        if isinstance(c, ToolResult):
            return {"type": "tool_result", "tool_result": {
                "tool_use_id": c.tool_use_id, "content": [block(x) for x in c.content], "is_error": c.is_error}}
        return c.to_json()

    out = {"schema_version": req.schema_version, "model": req.model}
    if req.instructions is not None:
        out["instructions"] = [block(c) for c in req.instructions]
    conv = []
    for item in req.conversation:
        if isinstance(item, Message):
            m = {"role": item.role, "content": [block(c) for c in item.content]}
            if item.phase is not None:
                m["phase"] = item.phase
            conv.append({"type": "message", "message": m})
        else:
            conv.append(item.to_json())
    out["conversation"] = conv
    rest = {k: v for k, v in req.to_json().items() if k not in ("schema_version", "model", "instructions",
                                                                  "conversation")}
    out.update(rest)
    return out


@settings(max_examples=300, deadline=None)
@given(S.requests())
def test_to_json_matches_the_per_class_serialisers(req):
    wire = req.to_json()
    assert wire == generic_request_json(req)
    assert list(wire) == list(generic_request_json(req))  # same key order on the wire


@settings(max_examples=200, deadline=None)
@given(S.requests(), st.sampled_from(["other-model", None]))
def test_request_json_maps_ids_like_a_mapped_copy(req, model):
    seen: list[str] = []

    def map_id(cid: str) -> str:
        seen.append(cid)
        return "z" + cid[::-1]

    got = request_json(req, model=model, map_id=map_id)
    # the copy map_tool_call_ids would make: top-level blocks of conversation messages only
    conv = []
    for item in req.conversation:
        if isinstance(item, Message):
            item = replace(item, content=[
                replace(b, id="z" + b.id[::-1]) if type(b) is ToolUse
                else replace(b, tool_use_id="z" + b.tool_use_id[::-1]) if type(b) is ToolResult else b
                for b in item.content])
        conv.append(item)
    want = replace(req, conversation=conv, model=req.model if model is None else model).to_json()
    assert got == want
    expected_order = [b.id if type(b) is ToolUse else b.tool_use_id
                      for item in req.conversation if isinstance(item, Message)
                      for b in item.content if type(b) in (ToolUse, ToolResult)]
    assert seen == expected_order


# --- strip_foreign_provider_data: the scan agrees with the full walk --------------------

tag = st.none() | st.builds(ProviderData, st.sampled_from(["p", "q"]), st.sampled_from(["m", "n"]),
                            st.just({"k": 1}))
plain_text = st.builds(Text, st.text(max_size=4), st.none(), tag)
think = st.builds(Thinking, st.text(max_size=4), st.booleans(), st.none() | st.just("sig"),
                  st.none() | st.lists(plain_text, max_size=2), tag)
use = st.builds(ToolUse, st.sampled_from(["c1", "c2"]), st.just("f"), st.just("{}"), tag)
result = st.builds(ToolResult, st.sampled_from(["c1", "c2"]), st.lists(plain_text, max_size=2), st.booleans())
block = st.one_of(plain_text, think, use, result)
strip_requests = st.builds(
    LuxRequest, st.just("m"),
    st.lists(st.builds(Message, st.sampled_from(["user", "assistant", "tool"]), st.lists(block, max_size=4)),
             max_size=4),
    st.just(Options(stream=False)), st.none() | st.lists(st.one_of(plain_text, think), max_size=2))


@settings(max_examples=400, deadline=None)
@given(strip_requests)
def test_strip_scan_agrees_with_the_full_walk(req):
    fast = strip_foreign_provider_data(req, "p", "m")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(provider_data, "_any_foreign_request", lambda *a: True)
        full = strip_foreign_provider_data(req, "p", "m")
    assert fast == full
    if not full[1]:
        assert fast[0] is req  # nothing foreign: the request itself, no copy


@settings(max_examples=400, deadline=None)
@given(strip_requests)
def test_writer_owner_check_is_never_laxer_than_stripping(req):
    checked = request_json(req, owner=("p", "m"))
    stripped, diags = strip_foreign_provider_data(req, "p", "m")
    if checked is not None:  # nothing foreign: stripping would change nothing
        assert stripped is req and diags == []
        assert checked == req.to_json()
    if diags:
        assert checked is None


# --- read_plain_response: same value as the full reader, or None ------------------------


def full_decode(obj):
    d = models._Decoder()
    return Converted(d.response(obj), d.diags)


@settings(max_examples=400, deadline=None)
@given(S.responses())
def test_plain_response_reader_matches_the_full_reader(resp):
    obj = json.loads(json.dumps(resp.to_json()))
    plain = read_plain_response(copy.deepcopy(obj))
    full = full_decode(copy.deepcopy(obj))
    if plain is not None:
        assert full.diagnostics == []
        assert plain == full.value
    assert decode_response(obj) == full


PLAIN = {"schema_version": "v1", "id": "r", "model": "m", "choices": [{"index": 0, "finish_reason": "stop",
         "message": {"role": "assistant", "content": [
             {"type": "thinking", "thinking": {"text": "t", "redacted": False}},
             {"type": "text", "text": "hi"},
             {"type": "tool_use", "tool_use": {"id": "c", "name": "f", "arguments": {"a": 1}}}]}}],
         "usage": {"prompt_tokens": 3, "completion_tokens": 4}}


def test_plain_reader_reads_the_usual_answer():
    r = read_plain_response(copy.deepcopy(PLAIN))
    assert r is not None and r == full_decode(copy.deepcopy(PLAIN)).value
    assert r.usage.total_tokens == 7 and r.message.content[2].arguments == '{"a":1}'


@pytest.mark.parametrize("change", [
    lambda o: o.update(schema_version="v2"),
    lambda o: o["usage"].update(prompt_tokens=1.0),
    lambda o: o["usage"].update(prompt_tokens=True),
    lambda o: o["choices"][0]["message"]["content"].append({"type": "image"}),
    lambda o: o["choices"][0]["message"]["content"][1].update(annotations=[]),
    lambda o: o["choices"][0]["message"].update(content="text"),
    lambda o: o["choices"][0]["message"].update(reasoning={"text": "r"}),
    lambda o: o["choices"][0].update(finish_reason=None),
    lambda o: o["choices"][0]["message"]["content"][0]["thinking"].update(signature=5),
    lambda o: o["choices"][0]["message"]["content"][1].update(provider_data={"provider": "p", "model": "m",
                                                                             "data": None}),
    lambda o: o.update(error={"kind": "server_error", "message": "x"}),
])
def test_anything_unusual_goes_to_the_full_reader(change):
    obj = copy.deepcopy(PLAIN)
    change(obj)
    assert read_plain_response(obj) is None
