"""strip_foreign_provider_data: opaque state goes back only to its producer (PROTOCOL.md §5)."""

from __future__ import annotations

from hypothesis import given, settings

from gelbridge.lux import (
    ConversionStatus,
    LuxRequest,
    Message,
    Options,
    ProviderData,
    Text,
    Thinking,
    ToolResult,
    ToolUse,
    strip_foreign_provider_data,
)
from testkit import lux_strategies as S

ANTH = ProviderData("anthropic", "claude-x", {"signature": "sig"})
ANTH_OTHER_MODEL = ProviderData("anthropic", "claude-y", {"signature": "sig2"})
GEM = ProviderData("gemini", "gemini-x", {"thoughtSignature": "ts"})


def request():
    return LuxRequest("claude-x", [
        Message("user", [Text("hi")]),
        Message("assistant", [
            Thinking("visible", signature="sig", provider_data=ANTH),
            Thinking("", redacted=True, provider_data=ProviderData("anthropic", "claude-x", {"redacted_data": "d"})),
            Text("answer", provider_data=GEM),
            ToolUse("c1", "f", "{}", GEM),
        ]),
        Message("tool", [ToolResult("c1", [Text("r", provider_data=GEM)])]),
        Message("assistant", [
            Thinking("other model", signature="sig2", provider_data=ANTH_OTHER_MODEL),
            Thinking("", signature="bare-sig"),
            Thinking("plain"),
        ]),
    ], Options(stream=True))


def test_same_provider_and_model_keeps_its_own_state_and_drops_the_rest():
    req = request()
    out, diags = strip_foreign_provider_data(req, "anthropic", "claude-x")
    a1, a2 = out.conversation[1].content, out.conversation[3].content
    assert a1 == [Thinking("visible", signature="sig", provider_data=ANTH),
                  Thinking("", redacted=True, provider_data=ProviderData("anthropic", "claude-x", {"redacted_data": "d"})),
                  Text("answer"), ToolUse("c1", "f", "{}")]
    assert out.conversation[2].content == [ToolResult("c1", [Text("r")])]
    # another model of the same provider is foreign; bare signatures are foreign
    assert a2 == [Thinking("other model"), Thinking("plain")]
    assert [d.field for d in diags] == [
        "conversation[1].message.content[2].provider_data",
        "conversation[1].message.content[3].provider_data",
        "conversation[2].message.content[0].tool_result.content[0].provider_data",
        "conversation[3].message.content[0]",
        "conversation[3].message.content[1]",
    ]
    assert all(d.status is ConversionStatus.DEGRADED for d in diags)


def test_another_provider_loses_redacted_thinking_instead_of_getting_it_as_text():
    out, diags = strip_foreign_provider_data(request(), "gemini", "gemini-x")
    a1 = out.conversation[1].content
    assert a1 == [Thinking("visible"), Text("answer", provider_data=GEM), ToolUse("c1", "f", "{}", GEM)]
    assert "conversation[1].message.content[1]" in [d.field for d in diags]
    assert not any("visible" in str(d) or "answer" in str(d) for d in diags)


def test_the_input_request_is_not_modified():
    req = request()
    before = req.to_json()
    strip_foreign_provider_data(req, "openai", "gpt-x")
    assert req.to_json() == before


def test_instructions_are_stripped_too():
    req = LuxRequest("m", [], Options(stream=False), instructions=[Text("sys", provider_data=GEM)])
    out, diags = strip_foreign_provider_data(req, "openai", "gpt-x")
    assert out.instructions == [Text("sys")] and len(diags) == 1


@settings(max_examples=60, deadline=None)
@given(S.requests())
def test_after_stripping_only_the_targets_state_remains(req):
    out, diags = strip_foreign_provider_data(req, "p", "m")
    pds = []

    def walk(blocks):
        for b in blocks:
            if getattr(b, "provider_data", None) is not None:
                pds.append(b.provider_data)
            if isinstance(b, Thinking):
                assert b.signature is None or b.provider_data is not None
                assert not b.redacted or b.provider_data is not None
            if isinstance(b, ToolResult):
                walk(b.content)

    for item in out.conversation:
        if isinstance(item, Message):
            walk(item.content)
    assert all(pd.owned_by("p", "m") for pd in pds)
    again, diags2 = strip_foreign_provider_data(out, "p", "m")
    assert again == out and diags2 == []
