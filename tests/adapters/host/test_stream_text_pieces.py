"""A chunk whose result is exactly the text ``luxkit.text_delta_json`` built comes back
as the delta it encodes (``TextPiece``), skipping the JSON: the events must be the very
ones decoding that JSON gives, for any text, and only that exact text is taken."""

from __future__ import annotations

from collections.abc import Callable

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gelbridge._adapters.contract import LuxEventDecoder
from gelbridge._adapters.host import Adapter, load_adapter
from gelbridge._adapters.sandbox import SandboxLimits
from gelbridge.lux import BlockDelta, StreamEvent, TextDelta

MakeAdapter = Callable[..., Adapter]  # the conftest's make_adapter fixture

# data "<type>|<index>|<text>" becomes one delta; "\\xNN" in the text is the raw byte NN
# (so invalid UTF-8 reaches the encoder); "keep:" notes a text and returns it a chunk
# later, after text_delta_json has built another one.
LUX_DELTAS = """
adapter.format = "lux-ir-v1"
local function raw_bytes(s)
  return (s:gsub("\\\\x(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end
local function delta(data)
  local t, i, text = data:match("^(%a+)|(%d+)|(.*)$")
  return luxkit.text_delta_json({ event = "block_delta", index = tonumber(i),
                                  delta = { type = t, text = raw_bytes(text) } })
end
function adapter.transform_stream_chunk(data, state)
  if data:sub(1, 5) == "keep:" then
    state.kept = delta(data:sub(6))
    return '{"event":"done"}'
  end
  if data == "kept" then
    delta("text|9|something else")
    return state.kept
  end
  if data == "copy" then  -- the same content built apart from luxkit
    return '{"delta":{"text":"hi","type":"text"},"event":"block_delta","index":0}'
  end
  return delta(data)
end
"""

TRICKY = ["", "plain", 'quote " and \\ backslash', "new\nline\ttab\r", "\x00\x01\x1f\x7f",
          "\u2028\u2029", "é ü 漢字 🙂", "\\xff\\xfe bad", "cut \\xe2\\x82", "</script>"]


def _both(a: Adapter, chunks: list[str]) -> tuple[list[list[StreamEvent]], list[list[StreamEvent]]]:
    """The events of each chunk through the session (pieces taken) and through the
    same script's JSON (decoded as ever)."""
    session = a.stream_session()
    plain = session._host.rt.open_stream("transform_stream_chunk", typed=False)  # type: ignore[union-attr]
    fast, slow = LuxEventDecoder(provider="p", model="m"), LuxEventDecoder(provider="p", model="m")
    got: list[list[StreamEvent]] = []
    want: list[list[StreamEvent]] = []
    for c in chunks:
        out = session.chunk(c)
        got.append(fast.piece(out) if isinstance(out, tuple) else fast.decode(orjson.loads(out)))
        text = plain(c)
        assert isinstance(text, str)
        want.append(slow.decode(orjson.loads(text)))
    session.close()
    assert fast.events_out == slow.events_out
    return got, want


def test_pieces_are_the_events_their_json_encodes(make_adapter: MakeAdapter) -> None:
    a = make_adapter("return raw", extra=LUX_DELTAS)
    chunks = [f"{t}|{i}|{text}" for i, text in enumerate(TRICKY) for t in ("text", "thinking")]
    session = a.stream_session()
    assert all(isinstance(session.chunk(c), tuple) for c in chunks)  # the fast path is taken
    session.close()
    got, want = _both(a, chunks)
    assert got == want
    assert want[14] == [BlockDelta(7, TextDelta("\ufffd\ufffd bad"))]  # invalid UTF-8 replaced alike


def test_only_the_exact_text_luxkit_built_last_is_taken(make_adapter: MakeAdapter) -> None:
    a = make_adapter("return raw", extra=LUX_DELTAS)
    session = a.stream_session()
    session.chunk("keep:text|3|first")
    kept = session.chunk("kept")  # luxkit built another text since: this one goes as JSON
    assert isinstance(kept, str)
    copy = session.chunk("copy")  # not built by luxkit at all
    assert isinstance(copy, str)
    session.close()
    got, want = _both(a, ["keep:text|3|first", "kept", "copy", "text|1|x"])
    assert got == want
    assert got[1] == [BlockDelta(3, TextDelta("first"))]


def test_adapter_md_scripts_get_their_text_unchanged(make_adapter: MakeAdapter) -> None:
    """A completion-format script's result is never taken for a Lux delta."""
    a = make_adapter("return raw", extra=LUX_DELTAS.replace('adapter.format = "lux-ir-v1"', ""))
    session = a.stream_session()
    out = session.chunk("text|0|hello")
    session.close()
    assert out == '{"delta":{"text":"hello","type":"text"},"event":"block_delta","index":0}'


@pytest.fixture(scope="module")
def pieces_adapter(tmp_path_factory: pytest.TempPathFactory) -> Adapter:
    path = tmp_path_factory.mktemp("pieces") / "pieces.lua"
    path.write_text('local adapter = { name = "pieces" }\n' + LUX_DELTAS
                    + "function adapter.transform_request(raw) return raw end\n"
                    + "function adapter.transform_response(raw) return raw end\nreturn adapter\n")
    return load_adapter(path, limits=SandboxLimits(), allow_hosts={})


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["text", "thinking"]), st.integers(0, 2**31 - 1),
                          st.text(max_size=40)), min_size=1, max_size=6))
def test_any_text_round_trips_like_its_json(pieces_adapter: Adapter, deltas: list[tuple[str, int, str]]) -> None:
    got, want = _both(pieces_adapter, [f"{t}|{i}|{text}" for t, i, text in deltas])
    assert got == want


def _openai_events(chunks: list[dict[str, object]]) -> list[StreamEvent]:
    from gelbridge._adapters.registry import registry_from_settings
    from gelbridge._config import Settings

    a = registry_from_settings(Settings()).get("openai")
    session, dec = a.stream_session(), LuxEventDecoder(provider="p", model="m")
    events: list[StreamEvent] = []
    for c in chunks:
        out = session.chunk(orjson.dumps(c).decode())
        events += dec.piece(out) if isinstance(out, tuple) else dec.decode(orjson.loads(out)) if out else []
    session.close()
    return events


@pytest.mark.parametrize("tail", [
    {"finish_reason": "stop"},
    {"delta_extra": {"refusal": "no"}},
    {"delta_extra": {"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "f", "arguments": "{}"}}]}},
    {"usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}},
    {"x_groq": {"usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}},
])
def test_a_content_chunk_that_carries_more_keeps_every_event(tail: dict[str, object]) -> None:
    """The built-in OpenAI family takes the one-delta fast path only when nothing else
    in the chunk adds an event."""
    def chunk(content: str, **more: object) -> dict[str, object]:
        delta: dict[str, object] = {"content": content, **more.pop("delta_extra", {})}  # type: ignore[dict-item]
        body: dict[str, object] = {"id": "c1", "model": "m", "choices": [
            {"index": 0, "delta": delta, "finish_reason": more.pop("finish_reason", None)}]}
        return {**body, **more}

    events = _openai_events([chunk("Hel"), chunk("lo"), chunk("!", **tail)])
    kinds = [type(e).__name__ for e in events]
    assert [e for e in events if isinstance(e, BlockDelta) and isinstance(e.delta, TextDelta)] == [
        BlockDelta(0, TextDelta("Hel")), BlockDelta(0, TextDelta("lo")), BlockDelta(0, TextDelta("!"))]
    expected = {"finish_reason": "FinishEvent", "delta_extra": "BlockStart", "usage": "UsageEvent",
                "x_groq": "UsageEvent"}[next(iter(tail))]
    assert kinds.count(expected) >= (2 if expected == "BlockStart" else 1), kinds


def test_a_float_index_comes_back_an_integer(make_adapter: MakeAdapter) -> None:
    """Lua 5.4 keeps 3.0 a float; the JSON says 3, so the piece says 3 too."""
    a = make_adapter("return raw", extra="""
adapter.format = "lux-ir-v1"
function adapter.transform_stream_chunk(data, state)
  return luxkit.text_delta_json({ event = "block_delta", index = 3.0, delta = { type = "text", text = data } })
end
""")
    session = a.stream_session()
    out = session.chunk("x")
    session.close()
    assert out == ("text", 3, "x") and type(out[1]) is int
