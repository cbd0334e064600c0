"""SSE and NDJSON framing: WHATWG event-stream rules and split-invariance."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gelbridge._errors import ProviderError
from gelbridge._transport import NDJSONDecoder, SSEDecoder, SSEEvent


def decode_sse(*chunks: bytes) -> list[SSEEvent]:
    d = SSEDecoder()
    out: list[SSEEvent] = []
    for c in chunks:
        out += d.feed(c)
    return out + d.close()


def decode_nd(*chunks: bytes, max_line_bytes: int = 1024 * 1024) -> list[str]:
    d = NDJSONDecoder(max_line_bytes=max_line_bytes)
    out: list[str] = []
    for c in chunks:
        out += d.feed(c)
    return out + d.close()


# --- SSE ------------------------------------------------------------------------------


def test_openai_style_stream_gives_one_event_per_data_block() -> None:
    body = b'data: {"a":1}\n\ndata: {"b":2}\n\ndata: [DONE]\n\n'
    assert [e.data for e in decode_sse(body)] == ['{"a":1}', '{"b":2}', "[DONE]"]


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_every_line_ending_works(eol: bytes) -> None:
    body = b"event: ping" + eol + b"data: x" + eol + b"data: y" + eol + eol + b"data: z" + eol + eol
    assert decode_sse(body) == [SSEEvent("ping", "x\ny", None), SSEEvent(None, "z", None)]


def test_crlf_split_between_reads_is_one_line_end() -> None:
    d = SSEDecoder()
    assert d.feed(b"data: a\r") == []
    assert d.feed(b"\n\r") == [SSEEvent(None, "a", None)]
    assert d.feed(b"\ndata: b\r\n\r\n") == [SSEEvent(None, "b", None)]
    assert d.close() == []


def test_lone_cr_at_read_end_followed_by_data_is_a_line_end() -> None:
    d = SSEDecoder()
    assert d.feed(b"data: a\r") == []
    assert d.feed(b"\rdata: b\r\r") == [SSEEvent(None, "a", None), SSEEvent(None, "b", None)]


def test_comments_and_keepalives_are_ignored() -> None:
    body = b": keep-alive\n\n: OPENROUTER PROCESSING\n\ndata: x\n: inside an event\n\n"
    assert decode_sse(body) == [SSEEvent(None, "x", None)]


def test_one_optional_space_after_colon_is_removed_only_once() -> None:
    assert decode_sse(b"data:x\n\ndata:  y\n\n") == [SSEEvent(None, "x", None), SSEEvent(None, " y", None)]


def test_field_without_colon_and_empty_data_give_empty_string() -> None:
    # "data" alone and "data:" both append an empty line; the spec dispatches "".
    assert decode_sse(b"data\n\ndata:\n\n") == [SSEEvent(None, "", None), SSEEvent(None, "", None)]
    assert decode_sse(b"data\ndata\n\n") == [SSEEvent(None, "\n", None)]


def test_blank_lines_without_data_dispatch_nothing_and_reset_event_name() -> None:
    assert decode_sse(b"event: a\n\n\n\ndata: x\n\n") == [SSEEvent(None, "x", None)]


def test_retry_and_unknown_fields_are_ignored() -> None:
    assert decode_sse(b"retry: 1000\nfoo: bar\ndata: x\n\n") == [SSEEvent(None, "x", None)]


def test_id_persists_like_last_event_id_and_nul_ids_are_ignored() -> None:
    body = b"id: 1\ndata: a\n\ndata: b\n\nid: 2\x00\ndata: c\n\nid\ndata: d\n\n"
    assert [e.id for e in decode_sse(body)] == ["1", "1", "1", ""]


def test_anthropic_named_events() -> None:
    body = (b"event: message_start\ndata: {\"type\":\"message_start\"}\n\n"
            b"event: ping\ndata: {\"type\": \"ping\"}\n\n")
    assert [e.event for e in decode_sse(body)] == ["message_start", "ping"]


def test_bom_at_start_is_dropped_even_when_split() -> None:
    assert decode_sse(b"\xef\xbb", b"\xbfdata: x\n\n") == [SSEEvent(None, "x", None)]
    # a BOM later in the stream is content
    assert decode_sse(b"data: \xef\xbb\xbfx\n\n") == [SSEEvent(None, "\ufeffx", None)]


def test_utf8_split_across_reads() -> None:
    raw = "data: héllo 🎉\n\n".encode()
    i = raw.index("🎉".encode()) + 2
    assert decode_sse(raw[:i], raw[i:]) == [SSEEvent(None, "héllo 🎉", None)]


def test_invalid_utf8_becomes_replacement_character() -> None:
    assert decode_sse(b"data: a\xffb\n\n") == [SSEEvent(None, "a\ufffdb", None)]


def test_unicode_line_separators_inside_json_do_not_split_lines() -> None:
    text = 'data: {"t":"a\u2028b\x0bc\x1cd"}\n\n'
    assert decode_sse(text.encode()) == [SSEEvent(None, text[6:-2], None)]


def test_close_dispatches_a_final_event_without_blank_line() -> None:
    assert decode_sse(b"data: a\n\ndata: last") == [SSEEvent(None, "a", None), SSEEvent(None, "last", None)]
    assert decode_sse(b"data: last\n") == [SSEEvent(None, "last", None)]
    assert decode_sse(b"data: last\r") == [SSEEvent(None, "last", None)]
    assert decode_sse(b": only a comment") == []


def test_done_is_just_data() -> None:
    assert decode_sse(b"data: [DONE]\n\ndata: after\n\n") == [
        SSEEvent(None, "[DONE]", None), SSEEvent(None, "after", None)]


def test_overlong_line_is_an_error() -> None:
    d = SSEDecoder(max_line_chars=100)
    with pytest.raises(ProviderError, match="longer than 100"):
        d.feed(b"data: " + b"x" * 200)


def test_a_line_of_several_mib_in_many_reads_is_one_event_and_over_16_mib_one_error() -> None:
    """Providers send one long line for a big event (a Responses ``response.completed`` with
    thousands of citations): the default bound (16 MiB) takes it, read in pieces; past it,
    one clear error that names the bound and the fault's fixed detail."""
    MiB = 1024 * 1024
    for decoder, head in ((SSEDecoder(), b"data: "), (NDJSONDecoder(), b"")):
        body = head + b'{"x":"' + b"y" * (5 * MiB) + b'"}\n\n'
        got: list[object] = []
        for i in range(0, len(body), 65536):
            got += decoder.feed(body[i:i + 65536])
        got += decoder.close()
        assert len(got) == 1 and len(got[0].data if isinstance(got[0], SSEEvent) else got[0]) == 5 * MiB + 8
    for decoder, head in ((SSEDecoder(), b"data: "), (NDJSONDecoder(), b"")):
        piece = b"z" * 65536
        with pytest.raises(ProviderError, match="longer than 16 MiB") as exc:
            decoder.feed(head)
            for _ in range(16 * 16 + 1):
                decoder.feed(piece)
        assert exc.value.status == 200 and exc.value.fault.detail == "LINE_TOO_LONG"


def test_overlong_event_is_an_error() -> None:
    d = SSEDecoder(max_event_chars=100)
    with pytest.raises(ProviderError, match="larger than 100"):
        d.feed(b"data: " + b"x" * 60 + b"\ndata: " + b"y" * 60 + b"\n")


# property tests -----------------------------------------------------------------------

_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=30)
_name = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e, blacklist_characters=":"),
                min_size=1, max_size=8)
_event = st.tuples(st.one_of(st.none(), _name), st.lists(_text, min_size=1, max_size=3),
                   st.one_of(st.none(), _text.filter(lambda s: "\x00" not in s)))
_eol = st.sampled_from(["\n", "\r\n", "\r"])


@st.composite
def sse_streams(draw: st.DrawFn) -> tuple[bytes, list[SSEEvent]]:
    events = draw(st.lists(_event, max_size=6))
    eol = draw(_eol)  # one per stream: "\r" then "\n" would be a single CRLF line end
    out, expected, last_id = [], [], None
    if draw(st.booleans()):
        out.append("\ufeff")
    for name, lines, eid in events:
        if draw(st.booleans()):
            out.append(":" + draw(_text) + eol)
        if name is not None:
            out.append(f"event: {name}{eol}")
        for line in lines:
            sep = draw(st.sampled_from([": ", ":"]))
            if sep == ":" and line.startswith(" "):
                sep = ": "
            out.append(f"data{sep}{line}{eol}")
        if eid is not None:
            out.append(f"id: {eid}{eol}")
            last_id = eid
        if draw(st.booleans()):
            out.append(f"retry: 5{eol}")
        out.append(eol)
        expected.append(SSEEvent(name, "\n".join(lines), last_id))
    return "".join(out).encode(), expected


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, prev = [], 0
    for p in points + [len(data)]:
        pieces.append(data[prev:p])
        prev = p
    return pieces


@settings(max_examples=300, deadline=None)
@given(sse_streams(), st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_sse_any_split_gives_the_same_events(stream: tuple[bytes, list[SSEEvent]], cuts: list[int]) -> None:
    data, expected = stream
    assert decode_sse(data) == expected
    assert decode_sse(*_split(data, cuts)) == expected


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_sse_arbitrary_bytes_split_invariant(data: bytes, cuts: list[int]) -> None:
    whole = decode_sse(data)
    assert decode_sse(*_split(data, cuts)) == whole
    assert decode_sse(*[data[i:i + 1] for i in range(len(data))]) == whole


# --- NDJSON -----------------------------------------------------------------------------


def test_ollama_lines_with_blank_lines_skipped() -> None:
    body = b'{"message":{"content":"a"},"done":false}\n\n  \n{"done":true}\n'
    assert decode_nd(body) == ['{"message":{"content":"a"},"done":false}', '{"done":true}']


def test_partial_line_waits_for_more_data_or_close() -> None:
    d = NDJSONDecoder()
    assert d.feed(b'{"a":') == []
    assert d.feed(b'1}\n{"b"') == ['{"a":1}']
    assert d.close() == ['{"b"']


def test_crlf_and_bom_are_removed() -> None:
    assert decode_nd(b'\xef\xbb\xbf{"a":1}\r\n{"b":2}\r\n') == ['{"a":1}', '{"b":2}']


def test_overlong_ndjson_line_is_an_error_even_without_newline() -> None:
    with pytest.raises(ProviderError, match="longer than 10 bytes"):
        NDJSONDecoder(max_line_bytes=10).feed(b"x" * 11)
    with pytest.raises(ProviderError, match="longer than 10 bytes"):
        NDJSONDecoder(max_line_bytes=10).feed(b"y" * 11 + b"\n")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"), max_size=20), max_size=8),
       st.lists(st.integers(min_value=0, max_value=10_000), max_size=12), st.booleans())
def test_ndjson_any_split_gives_the_same_lines(lines: list[str], cuts: list[int], trailing: bool) -> None:
    data = "\n".join(lines).encode() + (b"\n" if trailing else b"")
    expected = [ln.lstrip("\ufeff") if i == 0 else ln for i, ln in enumerate(lines)]
    expected = [ln for ln in expected if ln and not ln.isspace()]
    assert decode_nd(data) == expected
    assert decode_nd(*_split(data, cuts)) == expected
