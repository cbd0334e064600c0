"""Which text gelbridge keeps: the one rule for strings of a record that leave the record.

A record's unsealed fields reach the state store (a message's ``conversation`` is in its
claim and its tool journal rows), log lines and the reply records gelbridge writes. Two
kinds of string cannot go there:

- a **lone surrogate** (``\\ud800``): JSON can spell one and Python decodes it, but UTF-8
  cannot encode it, so SQLite, psycopg, a log stream and the PDS client would all raise.
  No string of a record may hold one (:func:`gelbridge._records.nesting.check_value`);
- **NUL** (U+0000): valid Unicode, and the PDS stores it, but PostgreSQL ``text`` refuses
  it (SQLite would keep it; both backends must take the same records). No field may
  hold one (:func:`check_fields`) but the ``parts`` of a plain ``content`` or
  ``instructions`` (sealed parts are inside the ciphertext, out of sight here): their
  text only goes to the model and back into content, never into a state row, and a
  model's answer holding NUL must not make its own thread unreadable.

Everything else the atproto data model allows (noncharacters such as U+FFFE, control
characters, any script) is kept as it is; terminals and logs show it escaped
(``gelbridge._terminal``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gelbridge._errors import RecordError
from gelbridge._records.constants import MAX_DEPTH

NUL = "\x00"
LONE_SURROGATE = "a string that is not valid Unicode (a lone surrogate)"
NUL_CHARACTER = "a NUL character (U+0000), which gelbridge cannot store"

#: Fields that hold content: the ``parts`` of a plainContent there may hold NUL.
CONTENT_FIELDS = frozenset({"content", "instructions"})

_NAME = re.compile(r"[A-Za-z$][A-Za-z0-9_$]{0,63}")


def text_problem(s: str) -> str | None:
    """What makes ``s`` impossible to keep (``LONE_SURROGATE``, ``NUL_CHARACTER``), or None."""
    if NUL in s:
        return NUL_CHARACTER
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            return LONE_SURROGATE
    return None


def is_storable(s: object) -> bool:
    """True for a string gelbridge can keep anywhere (state row, log line, record)."""
    return isinstance(s, str) and text_problem(s) is None


def field_problem(value: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(field, problem)`` of the first string (key or value) of ``value`` that holds NUL
    or a lone surrogate, leaving out the ``parts`` of :data:`CONTENT_FIELDS`; None if
    there is none. ``field`` is the top-level field it is in (a name that is not a plain
    identifier is not quoted). Iterative; containers nested deeper than the nesting limit
    are not entered (that limit is checked on its own)."""
    for top, v in value.items():
        where = top if isinstance(top, str) and _NAME.fullmatch(top) else "(a field name)"
        if top in CONTENT_FIELDS and type(v) is dict:
            v = {k: x for k, x in v.items() if k != "parts"}  # the parts are content
        stack: list[tuple[Any, int]] = [(top, 0), (v, 1)]
        while stack:
            x, depth = stack.pop()
            t = type(x)
            if t is str:
                problem = text_problem(x)
                if problem is not None:
                    return where, problem
            elif depth > MAX_DEPTH:
                continue
            elif t is dict:
                for k, y in x.items():
                    stack.append((k, depth))
                    stack.append((y, depth + 1))
            elif t is list or t is tuple:
                stack.extend((y, depth + 1) for y in x)
    return None


def check_fields(value: Mapping[str, Any], what: str) -> None:
    """Raise ``RecordError`` (naming the field, never its text) if a string of ``value``
    holds NUL or a lone surrogate (:func:`field_problem`)."""
    found = field_problem(value)
    if found is not None:
        where, problem = found
        raise RecordError(f"{what}: field {where} holds {problem}")
