"""Terminal-safe text: every character a terminal could interpret, or that hides or
reorders text, is shown visibly; the rest is kept; splitting the text anywhere changes
nothing; JSON stays JSON and parses back to the same value."""

from __future__ import annotations

import io
import json
import logging
import sys
import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from gelbridge._terminal import SafeFormatter, SafeStream, safe_json, safe_line, safe_text, visible

#: The Unicode categories a terminal interprets or that do not show: controls, format
#: characters (bidi, zero-width, tags), surrogates, line and paragraph separators.
HIDDEN = {"Cc", "Cf", "Cs", "Zl", "Zp"}
#: Format characters since Unicode 15.0 (Egyptian hieroglyph format controls): still
#: unassigned in Python 3.11's Unicode 14, shown all the same
NEWER = {chr(c) for c in range(0x13439, 0x13440)}
KEPT_IN_TEXT = {"\t", "\n", "\u200c", "\u200d"}
EVERY_CHARACTER = "".join(chr(c) for c in range(sys.maxunicode + 1))


def hidden(ch: str) -> bool:
    return unicodedata.category(ch) in HIDDEN or ch in NEWER


HIDDEN_CHARACTERS = {ch for ch in EVERY_CHARACTER if hidden(ch)}


def test_every_code_point_of_a_hidden_category_is_shown_and_every_other_kept() -> None:
    shown = {ord(ch): visible(ch) for ch in HIDDEN_CHARACTERS}
    assert safe_line(EVERY_CHARACTER) == EVERY_CHARACTER.translate(shown)
    for ch in KEPT_IN_TEXT:
        del shown[ord(ch)]
    assert safe_text(EVERY_CHARACTER) == EVERY_CHARACTER.translate(shown)
    # what is shown instead is itself plain: nothing hidden is left
    assert not set(safe_line(EVERY_CHARACTER)) & HIDDEN_CHARACTERS
    assert set(safe_text(EVERY_CHARACTER)) & HIDDEN_CHARACTERS == KEPT_IN_TEXT
    assert {unicodedata.category(ch) for ch in NEWER} <= {"Cf", "Cn"}


def test_the_visible_forms() -> None:
    assert safe_text("a\x1b]0;owned\x07b\x1b[2J") == "a␛]0;owned␇b␛[2J"
    assert safe_text("\x9b31m\x9d52;c;eA==\x9c") == "<U+009B>31m<U+009D>52;c;eA==<U+009C>"
    assert safe_text("line\r\x08\x7f\x00") == "line␍␈␡␀"
    assert safe_text("abc\u202edef\u2066\u2069\u200b\ufeff\u2028") == (
        "abc<U+202E>def<U+2066><U+2069><U+200B><U+FEFF><U+2028>")
    assert safe_text("tags \U000e0041\U000e007f") == "tags <U+E0041><U+E007F>"
    assert safe_text("lone \ud800") == "lone <U+D800>"
    # a reply keeps its lines, tabs, emoji and scripts; a one-line field shows them
    family, persian = "👨\u200d👩\u200d👧 ❤️", "می\u200cخواهم"
    assert safe_text(f"one\n\ttwo {family} {persian}") == f"one\n\ttwo {family} {persian}"
    assert safe_line("one\n\ttwo\u200d") == "one␊␉two<U+200D>"
    assert safe_line("plain ascii, äöü, 日本語, ‏") == "plain ascii, äöü, 日本語, <U+200F>"


HOSTILE = st.text(st.sampled_from(["\x1b", "[", "]", "\x07", "\x9b", "\x9d", "\x9c", "0", "2", "J", ";", "8",
                                   "\u202e", "\u2066", "\u200d", "\r", "\n", "a", "é", "👩", "\U000e0041"]),
                  max_size=60)


@given(HOSTILE, st.lists(st.integers(0, 60), max_size=8))
def test_text_streamed_in_pieces_is_made_safe_the_same_however_it_is_split(text: str, cuts: list[int]) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    shown = "".join(safe_text(p) for p in pieces)
    assert shown == safe_text(text)
    assert not set(shown) & {"\x1b", "\x07", "\x9b", "\x9d", "\x9c", "\r", "\u202e", "\u2066", "\U000e0041"}


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@given(JSON_VALUES)
def test_json_is_still_json_with_every_hidden_character_escaped(doc: object) -> None:
    for indent in (2, None):
        text = safe_json(doc, indent=indent)
        assert json.loads(text) == doc
        assert not set(text) & HIDDEN_CHARACTERS - {"\n"}


def test_json_escapes_what_json_dumps_leaves_raw_and_keeps_the_rest() -> None:
    doc = {"t": "\x7f\x9b\u202e\u200d\U000e0041\ud800 é 日本 👩", "k\x1b": 1}
    text = safe_json(doc, indent=None)
    assert text == ('{"t": "\\u007f\\u009b\\u202e\\u200d\\udb40\\udc41\\ud800 é 日本 👩", "k\\u001b": 1}')
    assert json.loads(text) == doc


def test_the_stream_and_the_log_formatter_pass_everything_through_safe_text() -> None:
    out = io.StringIO()
    stream = SafeStream(out)
    assert stream.write("ready\x1b]0;x\x07\n") == len("ready\x1b]0;x\x07\n")
    stream.flush()
    assert out.getvalue() == "ready␛]0;x␇\n"
    rec = logging.LogRecord("gelbridge", logging.WARNING, "", 0, "handle %s", ("a\x1b[2Jb",), None)
    assert SafeFormatter("%(levelname)s %(message)s").format(rec) == "WARNING handle a␛[2Jb"
