"""Text that is safe to show on a terminal: the one place every command's output goes
through (reply text, tool calls waiting for approval, model ids, error messages, JSON).

Reply text, tool names and inputs, a reply's ``error.message``, model ids: all of it can
come from a model or from anyone who can write the account's records. Printed raw, an
``ESC`` starts a control sequence the terminal obeys (clear the screen, move the cursor
over the line being approved, set the window title, write the clipboard with OSC 52,
hide a link behind OSC 8), and the bidi controls reorder what is shown ("Trojan
source"). So every character a terminal could interpret, or that hides or reorders
text, is shown visibly instead:

- C0 controls as their Control Pictures (``ESC`` → ``␛``, ``BEL`` → ``␇``, ``CR`` → ``␍``),
  ``DEL`` as ``␡``;
- C1 controls (U+0080–U+009F: ``U+009B`` is CSI to many terminals), the format
  characters (bidi embeddings, overrides and isolates, zero-width spaces, marks, the BOM,
  tag characters: Unicode category Cf), lone surrogates, U+2028 and U+2029 as
  ``<U+XXXX>``.

:func:`safe_text` is for multi-line text (a reply): it keeps ``\\n`` and ``\\t`` (they
move to the next line or tab stop, nothing more), and ZWNJ/ZWJ (U+200C, U+200D), which
join emoji and letters. :func:`safe_line` is for one-line fields (a tool name or input, an
id, an error message): those are shown too, so no field can start a line of its own.
Both work on each character alone, with no state: text streamed in pieces is made safe
piece by piece, however the pieces split an escape sequence.

:func:`safe_json` is JSON with those characters as ``\\uXXXX`` escapes: still valid JSON,
parsed back to the same value.
"""

from __future__ import annotations

import json
import logging
import re
from typing import IO, Any

#: Everything that is shown visibly in any text: C0 but TAB and LF, DEL, C1, Cf (but
#: ZWNJ and ZWJ), the surrogates, LINE and PARAGRAPH SEPARATOR. The categories Cc, Cf,
#: Cs, Zl and Zp of Unicode 15.1 (tests/test_terminal.py checks it against unicodedata).
_C0 = "\x00-\x08\x0b-\x1f"
_OTHERS = (
    "\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e"
    "\u200b\u200e\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0001\U000e0020-\U000e007f"
)
_ALWAYS = _C0 + _OTHERS
#: Kept in multi-line text, shown in a one-line field.
_TEXT_ONLY = "\t\n\u200c\u200d"

_UNSAFE_TEXT = re.compile(f"[{_ALWAYS}]")
_UNSAFE_LINE = re.compile(f"[{_ALWAYS}{_TEXT_ONLY}]")
#: What JSON text holds raw that a terminal could interpret: json.dumps escapes C0
#: itself (a raw LF or space in its output is the layout, never data).
_UNSAFE_JSON = re.compile(f"[{_OTHERS}\u200c\u200d]")


def visible(ch: str) -> str:
    """The visible form of one character :func:`safe_line` replaces."""
    c = ord(ch)
    if c < 0x20:
        return chr(0x2400 + c)
    if c == 0x7F:
        return "\u2421"
    return f"<U+{c:04X}>"


def _shown(m: re.Match[str]) -> str:
    return visible(m.group())


def safe_text(text: str) -> str:
    """``text`` (many lines) with every character a terminal could interpret shown
    visibly; newlines, tabs and the emoji joiners kept."""
    return _UNSAFE_TEXT.sub(_shown, text)


def safe_line(text: str) -> str:
    """``text`` as one line: :func:`safe_text`, and newlines, tabs and the joiners shown
    too (``\\n`` → ``␊``)."""
    return _UNSAFE_LINE.sub(_shown, text)


def _json_escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    if c > 0xFFFF:  # as a UTF-16 surrogate pair, like json.dumps(ensure_ascii=True)
        c -= 0x10000
        return f"\\u{0xD800 + (c >> 10):04x}\\u{0xDC00 + (c & 0x3FF):04x}"
    return f"\\u{c:04x}"


def safe_json(doc: Any, *, indent: int | None = 2) -> str:
    """``doc`` as JSON text (non-ASCII kept as it is) with every character a terminal
    could interpret, and every lone surrogate, as a ``\\uXXXX`` escape."""
    return _UNSAFE_JSON.sub(_json_escape, json.dumps(doc, indent=indent, ensure_ascii=False))


class SafeStream:
    """A text stream (a :class:`~gelbridge._seams.Printer`) that writes what it is given
    through :func:`safe_text` to ``stream``: the lines ``gelbridge run`` prints."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, s: str, /) -> int:
        self._stream.write(safe_text(s))
        return len(s)

    def flush(self) -> None:
        self._stream.flush()


class SafeFormatter(logging.Formatter):
    """A log line (and its traceback) through :func:`safe_text`."""

    def format(self, record: logging.LogRecord) -> str:
        return safe_text(super().format(record))
