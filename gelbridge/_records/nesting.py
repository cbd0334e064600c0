"""The nesting limit: how deep objects and arrays may nest in anything gelbridge reads.

The atproto data model sets no depth limit and the reference PDS stores records nested
thousands of levels deep, but every recursive step in Python (our walkers, pydantic's
validators, the JSON and CBOR decoders) ends in ``RecursionError`` somewhere past ~1,000
levels, and no lexicon needs more than a handful. So gelbridge rejects values nested
deeper than :data:`MAX_DEPTH` levels, checked **before** anything recursive touches them:

- a record (:func:`check_value`: also rejects strings that are not valid Unicode, as the
  atproto data model does) is malformed → ``RecordError`` (``bad_record``);
- JSON from outside (PDS responses, Jetstream events, record files, keyrings) is decoded
  by :func:`loads`, which never raises ``RecursionError``: subtrees deeper than the limit
  are cut to an empty array one level below it, so the rest of a page still decodes and
  the record holding them fails :func:`check_value` on its own;
- CBOR (firehose blocks, CAR files): ``libipld`` raises ``RecursionError`` past ~1,000
  levels; callers treat that block as undecodable.

Depth counts containers: ``{}`` is depth 1, ``{"a": []}`` depth 2, a scalar depth 0.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gelbridge._errors import RecordError
from gelbridge._records.constants import MAX_DEPTH as MAX_DEPTH
from gelbridge._records.text import LONE_SURROGATE

_STRUCTURE = re.compile(rb'["\[\]{}]')


def depth_exceeds(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether containers nest deeper than ``limit`` in ``value`` (iterative: any depth)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, d = stack.pop()
        t = type(v)
        if t is dict:
            items = v.values()
        elif t is list or t is tuple:
            items = v
        else:
            continue
        if d > limit:
            return True
        for x in items:
            tx = type(x)
            if tx is dict or tx is list or tx is tuple:
                stack.append((x, d + 1))
    return False


def _bad_string(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, d = stack.pop()
        t = type(v)
        if t is str:
            if not v.isascii():
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:
                    return True
        elif t is dict:
            if d >= limit:
                continue  # depth is reported first
            for k, x in v.items():
                stack.append((k, d))
                stack.append((x, d + 1))
        elif t is list or t is tuple:
            if d < limit:
                stack.extend((x, d + 1) for x in v)
    return False


def check_value(value: Any, what: str, limit: int = MAX_DEPTH) -> None:
    """Raise ``RecordError`` if ``value`` nests deeper than ``limit`` or holds a string
    that is not valid Unicode (a lone surrogate: JSON can spell one, UTF-8 cannot)."""
    if depth_exceeds(value, limit):
        raise RecordError(f"{what} is nested deeper than {limit} levels (gelbridge's limit)")
    if _bad_string(value, limit):
        raise RecordError(f"{what} holds {LONE_SURROGATE}")


def may_exceed(encoded: bytes | bytearray | str, limit: int = MAX_DEPTH) -> bool:
    """Cheap pre-check on a JSON text: False means it surely nests at most ``limit``
    levels (it has no more opening brackets than that)."""
    if isinstance(encoded, str):
        return encoded.count("{") + encoded.count("[") > limit
    return encoded.count(b"{") + encoded.count(b"[") > limit


def cap_depth(data: bytes, limit: int = MAX_DEPTH) -> bytes:
    """``data`` (JSON text) with every array or object that starts deeper than
    ``limit + 1`` levels replaced by ``[]``; strings are left alone. The result nests at
    most ``limit + 1`` levels, so a value cut here still fails :func:`check_value`."""
    out: list[bytes] = []
    depth = 0
    pos = 0
    skip_from: int | None = None  # depth at which a cut subtree started
    in_string = False
    for m in _STRUCTURE.finditer(data):
        c = m.group()
        i = m.start()
        if in_string:
            if c == b'"' and not _is_escaped(data, i):
                in_string = False
            continue
        if c == b'"':
            in_string = True
        elif c == b"[" or c == b"{":
            depth += 1
            if skip_from is None and depth > limit + 1:
                skip_from = depth
                out.append(data[pos:i])
                out.append(b"[]")
        else:
            if skip_from is not None and depth == skip_from:
                skip_from = None
                pos = i + 1
            depth -= 1
    if skip_from is not None:
        return data  # unbalanced: let the decoder say what is wrong
    out.append(data[pos:])
    return b"".join(out)


def _is_escaped(data: bytes, i: int) -> bool:
    """Whether the byte at ``i`` is escaped (preceded by an odd run of backslashes)."""
    n = 0
    j = i - 1
    while j >= 0 and data[j] == 0x5C:
        n += 1
        j -= 1
    return n % 2 == 1


def loads(data: bytes | bytearray | str) -> Any:
    """``json.loads`` that never raises ``RecursionError``: JSON nested past what the
    decoder can take has its deep subtrees cut (:func:`cap_depth`) and is decoded again.
    Raises ``ValueError`` (``json.JSONDecodeError``) for text that is not JSON."""
    try:
        return json.loads(data)
    except RecursionError:
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
        capped = cap_depth(raw)
        try:
            return json.loads(capped)
        except RecursionError:  # unbalanced text the cut could not shorten
            raise ValueError("JSON nested too deep to decode") from None


CUT = "…(nested too deep)"


def cut(value: Any, limit: int = MAX_DEPTH) -> Any:
    """A copy of ``value`` with every container deeper than ``limit`` levels replaced by
    :data:`CUT` (iterative: any depth). For showing a malformed value, never for data."""
    if not depth_exceeds(value, limit):
        return value
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any, int]] = [(value, root, 0, 1)]  # (value, parent, key, depth)
    while stack:
        v, parent, key, d = stack.pop()
        t = type(v)
        if t is dict or t is list or t is tuple:
            if d > limit:
                parent[key] = CUT
                continue
            if t is dict:
                copy: Any = {}
                for k, x in v.items():
                    copy[k] = None
                    stack.append((x, copy, k, d + 1))
            else:
                copy = [None] * len(v)
                for i, x in enumerate(v):
                    stack.append((x, copy, i, d + 1))
            parent[key] = copy
        else:
            parent[key] = v
    return root[0]
